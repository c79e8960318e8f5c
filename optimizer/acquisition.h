/* optimizer/acquisition.h: acquisition functions over fitted GPs (internal to optimizer/).
 *
 * Every acquisition is computed in log space (Ament et al. 2023, "Unexpected Improvements
 * to Expected Improvement") so that its value and gradient stay informative where the
 * improvement it measures is astronomically small:
 *  - logei: analytic LogEI for one objective, improvement over a noise-aware incumbent (the
 *    best posterior mean among the given points), times the probability of feasibility;
 *  - mc_acq: Monte Carlo over the joint posterior of a baseline (observed points that may be
 *    optimal, pending trials, earlier picks of the batch) and the candidate, with fixed base
 *    samples, of either the hypervolume improvement over each sample's front (qLogNEHVI for
 *    2–4 objectives) or the improvement of a Chebyshev scalarisation (qParEGO, any number);
 *    feasibility enters each sample through a fat-tailed sigmoid of the constraint slacks.
 *
 * Units: objectives are modelled in the minimisation convention, constraints as slacks
 * (feasible when ≤ 0), each GP on its own standardised scale; the MC sample of objective j
 * is expressed as (y_j − ref_j)/scale_j, so that the reference point sits at 0 and the
 * smoothing temperatures are relative to each outcome's spread. */
#ifndef NAS_OPTIMIZER_ACQUISITION_H
#define NAS_OPTIMIZER_ACQUISITION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "optimizer/boxes.h"
#include "optimizer/gp.h"

/* An acquisition's log value at x (the GPs' input dimension), with its gradient into grad
 * when grad is not NULL. Not thread safe: the context holds scratch space. */
typedef double (*acq_fn)(void *ctx, const double *x, double *grad);

/* The GPs an acquisition reads, and what each models (all borrowed; they outlive it). */
typedef struct {
  size_t n_obj, n_con;
  gp *const *obj;               /* n_obj objectives, minimisation convention */
  gp *const *con;               /* n_con constraint slacks */
  const char *const *obj_names; /* n_obj: each objective's metric, for messages */
  const char *const *con_names; /* n_con: the metric each constraint bounds, likewise */
} acq_models;

/* ---- scalar pieces (logei.c) ---------------------------------------------------------- */

/* log h(z) with h(z) = φ(z) + zΦ(z), so that EI = σ h((best − μ)/σ); accurate for every
 * finite z (continued fraction for the Mills ratio in the far left tail). *slope receives
 * d log h/dz when slope is not NULL. */
double acq_log_h(double z, double *slope);
/* log Φ(z), same accuracy; *slope = d log Φ/dz. */
double acq_log_ndtr(double z, double *slope);
/* log of the fat-tailed sigmoid s(x) = (1 + x/√(1 + x²))/2 (tail 1/(4x²)); *slope = d/dx. */
double acq_log_fat_sigmoid(double x, double *slope);

/* ---- analytic LogEI (logei.c) --------------------------------------------------------- */

typedef struct logei logei;

/* LogEI of models->obj[0] (n_obj must be 1) with the incumbent taken as the lowest
 * posterior mean among the n points Xinc (n×d) whose constraints are feasible in posterior
 * mean; with none such, the acquisition is the log probability of feasibility alone. */
int logei_create(const acq_models *models, const double *Xinc, size_t n, logei **out,
                 nas_err *err);
double logei_eval(void *ctx, const double *x, double *grad);
void logei_free(logei *a);

/* ---- Monte Carlo acquisitions (acquisition.c) ------------------------------------------ */

typedef enum {
  MC_HVI,    /* qLogNEHVI: log expected hypervolume improvement (2–4 objectives) */
  MC_PAREGO, /* qLogNParEGO: log expected improvement of a Chebyshev scalarisation */
} mc_utility;

typedef struct {
  mc_utility utility;
  size_t n_samples;      /* MC samples (default 64 when 0) */
  uint64_t seed;         /* base samples are a function of it */
  const double *ref;     /* n_obj: reference point (raw, minimisation convention) */
  const double *weights; /* MC_PAREGO: n_obj positive weights summing to 1 */
  const double *ideal;   /* MC_PAREGO: n_obj: the scalarisation maps [ideal, ref] to [-1, 0] */
  /* MC_HVI: n_obj (NULL: all 0): where positive, ref[j] is inferred from the data and a
   * candidate's improvement is measured against max(ref[j], y[j] + margin[j]), the
   * reference the data would give once y is observed (raw units) */
  const double *margin;
  /* n_obj (NULL: none): where finite, objective j's floor (raw, acq_front_floors): a
   * candidate's samples below it count as at it */
  const double *floor;
} mc_options;

typedef struct mc_acq mc_acq;

/* Baseline Xb (nb×d, nb may be 0): points whose joint posterior with the candidate is
 * sampled. */
int mc_acq_create(const acq_models *models, const double *Xb, size_t nb, const mc_options *opt,
                  mc_acq **out, nas_err *err);
double mc_acq_eval(void *ctx, const double *x, double *grad);
void mc_acq_free(mc_acq *a);

/* ---- fronts and inferred references (acquisition.c) ------------------------------------ */

/* The least and the largest value of each objective over the front of the k rows Y (k×m;
 * on_front: k entries of scratch); NaN when k is 0. */
void acq_front_bounds(const double *Y, size_t k, size_t m, bool *on_front, double *low,
                      double *high);

/* The floors of the k rows Y (k×m; low as acq_front_bounds computed it, each objective's
 * best value) into floor (m): where two rows that differ both have objective j's best value
 * low[j] (exactly, or within round-off: 8 ε of the objective's observed range above it),
 * that value, else NaN. Distinct configurations share their best value only
 * where no point beats it along a whole face of the front (DTLZ2: with three objectives f3 = 0
 * wherever x0 = 0; with two f2 = 0 wherever x0 = 0, whatever the other parameters, so one
 * front point and trials behind it), i.e. where the objective has reached a bound the models
 * cannot know of: their samples and draws fall below it by their noise, and a hypervolume
 * measured against a distant reference makes that noise look like a gain across the whole
 * face. An objective whose values also repeat exactly elsewhere (between rows that differ)
 * gets none: there ties are its few distinct values (a count, an accuracy over a small
 * validation set, rounded readings), not a bound. NAS_ERR only when out of memory. */
int acq_front_floors(const double *Y, size_t k, size_t m, const double *low, double *floor,
                     nas_err *err);

/* Whether outcome f (m objectives), lying past the front's worst value high[j] in objective
 * j, extends the front at a bounded trade-off (Geoffrion's proper Pareto optimality): its
 * loss past high[j] per the front's extent in j is at most 10 times its best gain past
 * low[k] in another objective k per the extent there (each extent at least margin[·]). An
 * extension that buys a sliver of one objective with much of another does not count. */
bool acq_trade_off_bounded(const double *f, size_t m, size_t j, const double *low,
                           const double *high, const double *margin);

/* n_draws independent joint draws from the posterior of every outcome (objectives, then
 * constraint slacks) at the n points X (n×d), on the outcomes' raw scale, into F (n_draws
 * blocks of n×(n_obj + n_con), draw t in block t); each outcome's posterior is factorised
 * once for all draws. Draw t is a function of seed + t alone, so the first draws do not
 * change with n_draws. */
int acq_posterior_draw(const acq_models *models, const double *X, size_t n, size_t n_draws,
                       uint64_t seed, double *F, nas_err *err);

/* Which of the n points X (n×d) may still be optimal: drops those that another point beats
 * in every objective by more than two posterior standard deviations on each side, and those
 * surely infeasible; keeps at most `cap` (the least dominated in posterior mean). Writes the
 * kept indices, in increasing order, to keep (n entries) and their number to *n_keep. */
int acq_prune_baseline(const acq_models *models, const double *X, size_t n, size_t cap,
                       size_t *keep, size_t *n_keep, nas_err *err);

#endif
