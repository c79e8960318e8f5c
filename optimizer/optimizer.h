/* optimizer: what to try next, and how good the results are.
 *
 * - The search space encoded as a unit cube (space_*): what every model-based method works in.
 * - Optimizers behind one interface (optimizer_*), chosen by the spec's `optimizer: {type}`:
 *   `random` (seeded uniform over the space), `sobol` (scrambled Sobol sequence), `gp`
 *   (multi-objective Bayesian optimisation over Gaussian processes; the default).
 * - Pareto fronts and hypervolumes (pareto_*, hypervolume).
 *
 * Optimizers hold no state between calls: every suggestion is computed from the
 * observations and pending trials handed in, which come from storage. With the same spec,
 * seed, observations and first_number the suggestions are the same, so a resumed
 * experiment continues exactly as an uninterrupted one would. */
#ifndef NAS_OPTIMIZER_H
#define NAS_OPTIMIZER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"
#include "spec/spec.h"

/* ---- search space ↔ unit cube ---------------------------------------------------------
 * Floats and ints map to one dimension each (log scale when `log`), categoricals to one
 * dimension per choice (one-hot), fixed parameters to none. Inactive conditional
 * parameters are pinned to the middle of their range (0 in one-hot). */
typedef enum {
  DIM_CONTINUOUS, /* float without step */
  DIM_DISCRETE,   /* int or stepped float: n_levels values in [0, 1], evenly spaced
                     unless log (a log int's levels sit at their log positions) */
  DIM_ONEHOT,     /* one choice of a categorical: group of n_levels dimensions */
} space_dim_kind;

typedef struct {
  space_dim_kind kind;
  size_t param;        /* index into spec.params */
  size_t n_levels;     /* DIM_DISCRETE: number of values; DIM_ONEHOT: choices in the group */
  size_t group_start;  /* DIM_ONEHOT: first dimension of the group */
} space_dim;

typedef struct space space;

int space_create(const spec *s, space **out, nas_err *err);
void space_free(space *sp);
size_t space_ndim(const space *sp);
const space_dim *space_dims(const space *sp); /* space_ndim entries */
const spec *space_spec(const space *sp);      /* borrowed */
/* params (JSON object, a valid assignment) → x[space_ndim]. */
int space_encode(const space *sp, const json_t *params, double *x, nas_err *err);
/* x (any point of the cube) → the nearest valid assignment (integers and steps rounded,
 * argmax of one-hot groups, inactive parameters left out). Owned JSON object. */
int space_decode(const space *sp, const double *x, json_t **params, nas_err *err);
/* x → encode(decode(x)) in place: the point the assignment really lies at. */
int space_snap(const space *sp, double *x, nas_err *err);
/* The same for an x that differs from ref, a snapped point (space_snap leaves it as it is),
 * in a few coordinates: the result is space_snap's, at the cost of the parameters whose
 * coordinates differ (all of them where the spec has conditions). */
int space_snap_near(const space *sp, const double *ref, double *x, nas_err *err);

/* ---- optimizers ------------------------------------------------------------------------ */

/* A finished trial as the optimizer sees it. Values are the raw reported metrics, in the
 * order of spec.objectives and spec.constraints; NaN where missing. A trial that ended
 * without results (failed, timed out, stopped) comes with every value NaN: its assignment
 * is never proposed again, and the models learn nothing from it. */
typedef struct {
  const json_t *params;       /* borrowed */
  const double *objectives;   /* spec.n_objectives values */
  const double *constraints;  /* spec.n_constraints values */
  /* NULL, or spec.n_objectives standard errors of the objective readings (the trial's
   * NAME_sem metrics; NaN where not reported): the gp optimizer takes them as the known
   * noise of those readings, before the spec's `noise:` and before a fitted noise. */
  const double *objective_sems;
} observation;

typedef struct optimizer optimizer;

/* Creates the optimizer named by s->optimizer.type with its options. s is borrowed and
 * must outlive the optimizer. Unknown types or options are errors. */
int optimizer_create(const spec *s, optimizer **out, nas_err *err);
void optimizer_free(optimizer *opt);
/* Asked now and then while a suggestion computes (at every evaluation of the GP's
 * likelihood and of the acquisition, so at least every few milliseconds): when it answers
 * true, optimizer_suggest gives up and returns NAS_ECANCELED. A suggestion can take
 * minutes with large options; this keeps a signal or `nas stop` answered within a second.
 * The callback should be cheap (it may rate-limit itself with a clock). */
typedef struct {
  bool (*cancelled)(void *ctx);
  void *ctx;
} optimizer_watch;

/* Installs the watch for later suggestions (replacing any earlier one). */
void optimizer_set_watch(optimizer *opt, optimizer_watch watch);

/* How many trials the budget is expected to allow in all, those made already included (0:
 * no telling; the default), for the later suggestions: `gp` keeps its default initial
 * design (max(5, 2·d)) to a fifth of them, never under 5, so that a budget of few, long
 * trials is not spent on the design alone. An explicit n_initial is kept as it is. */
void optimizer_set_trials_expected(optimizer *opt, size_t n);

/* Checks options (a JSON object) as optimizer_create would read them for the optimizer
 * type, without a search space: the same errors, nothing made. */
int optimizer_validate_options(const char *type, const json_t *options, nas_err *err);
/* Suggests n assignments (owned JSON objects written to out[0..n-1]) given completed
 * observations and the parameters of pending (queued or running) trials, which it must
 * not propose again. first_number is the trial number the first suggestion will get; it
 * seeds the randomness together with spec.seed. refs (NULL: not wanted) gets n rows of
 * spec.n_objectives values: the reference point each suggestion's hypervolume improvement
 * was measured against (minimisation convention, as pareto_reference_point), NaN where it was
 * measured against none (an initial design point, one objective, another optimizer).
 * Returns NAS_ENOTFOUND when the space has no n assignments left that are neither observed
 * (failed ones included) nor pending (a finite space used up). */
int optimizer_suggest(optimizer *opt, const observation *obs, size_t n_obs,
                      const json_t *const *pending, size_t n_pending, size_t n,
                      int first_number, json_t **out, double *refs, nas_err *err);

/* ---- fronts and hypervolume ------------------------------------------------------------
 * Y is n×m, row-major, every objective to be minimised. */

/* Objective values in the minimisation convention: maximised objectives negated. */
void pareto_objectives_to_min(const spec *s, const double *raw, double *out);
/* on_front[i] = no other row dominates row i (rows with NaN are never on the front). */
void pareto_mask(const double *Y, size_t n, size_t m, bool *on_front);
/* Non-dominated sorting: rank[i] = 0 for the front, 1 for the front of the rest, …;
 * -1 for rows with a NaN. */
int pareto_ranks(const double *Y, size_t n, size_t m, int *rank, nas_err *err);
/* Volume dominated by the rows of Y and bounded by ref (rows not strictly better than
 * ref in every objective add nothing). Exact: O(n log n) for m = 2 and 3, WFG beyond.
 * NaN only when out of memory. */
double pareto_hypervolume(const double *Y, size_t n, size_t m, const double *ref);
/* Reference point (minimisation convention) for an experiment: the objectives'
 * thresholds where given, else inferred from the observed values (the nadir of the
 * front pushed out by 10% of the observed range). Rows with a NaN or an infinity are
 * ignored; with none left, the inferred coordinates are NaN. */
void pareto_reference_point(const spec *s, const double *Y, size_t n, double *ref);
/* high − low of finite values, DBL_MAX where the difference overflows (readings near
 * ±1.7e308), so that references built from it stay finite. */
double pareto_range(double low, double high);
/* pareto_reference_point, and per objective into margin the distance the reference lies
 * beyond the front's nadir: 0 for a threshold, NaN where the coordinate is NaN. */
void pareto_reference_margins(const spec *s, const double *Y, size_t n, double *ref,
                              double *margin);

/* The model's view of the observations (`nas pareto --model`): the posterior mean of every
 * objective at each observation's parameters, as the gp optimizer with s's options (its
 * defaults when s uses another optimizer) models them, known noise included; means gets
 * n_obs × spec.n_objectives raw values, each objective in its own direction, NaN for an
 * observation outside the space or an objective without data. Where readings are noisy
 * these are the estimates to rank by, not the lucky draws. */
int optimizer_model_means(const spec *s, const observation *obs, size_t n_obs, double *means,
                          nas_err *err);

#endif
