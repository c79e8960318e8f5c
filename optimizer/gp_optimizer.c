/* optimizer/gp_optimizer.c: the `gp` optimizer (the default): multi-objective Bayesian
 * optimisation over Gaussian processes.
 *
 * A call to suggest:
 *  1. encodes the observations and pending trials into the unit cube;
 *  2. while fewer than n_initial trials exist (default max(5, 2·d), d the number of
 *     searched parameters, but at most a fifth of the trials the budget is expected to
 *     allow, never under 5: initial_design_size) or fewer than two observations have
 *     every objective, trial k
 *     gets point k of the randomised Sobol design, as the sobol optimizer would give it;
 *  3. otherwise fits one GP per objective (minimisation convention) and per constraint
 *     (its slack, ≤ 0 when feasible) on the observations that report it (constant mean
 *     held at the worst value seen from three cube dimensions on unless the data reject
 *     it, see worst_mean_min_dims),
 *     then picks the n suggestions one after the other (sequential greedy), each
 *     maximising an acquisition that treats the pending trials and the earlier picks as
 *     pending, i.e. samples their outcomes jointly with the candidate's: qLogNEHVI for 1–4
 *     objectives (for one, noisy EI; analytic LogEI when nothing is pending), qLogNParEGO
 *     with a random Chebyshev weighting per pick beyond; an inferred reference point is
 *     recomputed for each pick with the pending points at their posterior means,
 *     pushed out by a step per pending point (pick_reference) and out to where posterior
 *     draws at the front's neighbours say the front reaches (reach_reference); a drawn
 *     point that reaches far past the front is picked as it is (reach_far_margins);
 *     with the option
 *     `reference: follow` each candidate is measured against the reference its own
 *     observation would give (make_mc);
 *  4. never returns an observed, pending or already suggested assignment (taken.h).
 * Everything random comes from streams of (spec.seed, trial number), so the same spec,
 * observations, pending trials and first_number give the same suggestions. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>

#include "optimizer/acq_optimize.h"
#include "optimizer/acquisition.h"
#include "optimizer/backend.h"
#include "optimizer/design.h"
#include "optimizer/gp.h"
#include "optimizer/options.h"
#include "optimizer/taken.h"

/* Streams of (spec.seed, ·) this file draws from: a purpose tag above the trial number,
 * far from the streams taken.c uses (number | attempt << 32). */
static const uint64_t STREAM_FIT = UINT64_C(0x6770100000000000);
static const uint64_t STREAM_MC = UINT64_C(0x6770200000000000);
static const uint64_t STREAM_RAW = UINT64_C(0x6770300000000000);
static const uint64_t STREAM_WEIGHTS = UINT64_C(0x6770400000000000);
static const uint64_t STREAM_REACH = UINT64_C(0x6770500000000000);

enum { max_hvi_objectives = 4 };

/* Per pending point (a running trial or an earlier pick of this call), the inferred
 * reference of a pick reaches at least this share of the observed range beyond the
 * reference of the observations alone: a quarter of pareto_reference_point's 10% margin. A
 * sequence of single suggestions extends a front by about that much per step or more
 * (ZDT1 q = 1: 0.045 per step against a margin of 0.097), and the posterior means alone
 * rarely move the reference, see pick_reference. Chosen on the benchmark (10 seeds, gp,
 * q = 4, log10 HV gap at 50): ZDT1 0.37 without, 0.24 with 0.015, 0.10 with 0.025, −0.81
 * with 0.05; 0.025 leaves BraninCurrin and DTLZ2 within noise (0.16 → 0.20, −1.18 →
 * −1.14, −0.49 → −0.47), a full margin (0.1) did not (0.30, −1.03, −0.34). */
static const double PENDING_REFERENCE_STEP = 0.025;

/* The objective GPs' constant mean: fitted, or held at the worst observed value
 * (gp_fit_options). By default the worst from this many cube dimensions on: on the 6-d
 * benchmark problems it keeps the first suggestions off the cube's corners (DTLZ2 M = 2, 10
 * seeds: −1.25 against −1.09 at q = 1, −1.19 against −0.76 at q = 4), while in 2-d the
 * design already covers the square and a fitted mean explores better (BraninCurrin, 30
 * seeds: 0.13 against 0.34). Constraint slacks always get a fitted mean: held at the worst
 * slack, the model calls every unexplored region infeasible, which hides feasible pieces
 * away from the data (C2-DTLZ2, whose feasible front is three arcs, 10 seeds: −1.74 ± 0.07
 * fitted against −1.63 ± 0.23 worst; −1.65 against −1.45 with thresholds). */
enum { worst_mean_min_dims = 3 };
typedef enum { MEAN_AUTO, MEAN_FITTED, MEAN_WORST } mean_rule;

typedef struct {
  const space *sp;    /* borrowed */
  gp_kernel kernel;
  mean_rule mean;
  bool follow_reference; /* option reference: follow (see make_mc) */
  size_t n_initial;   /* 0: max(5, 2·d), within a fifth of trials_expected */
  size_t trials_expected; /* optimizer_set_trials_expected's; 0: no telling */
  size_t raw_samples; /* acquisition raw samples */
  size_t restarts;    /* acquisition local optimisations */
  size_t mc_samples;  /* MC samples of the noisy acquisitions */
  size_t max_baseline; /* observations kept in the noisy baseline (default_max_baseline) */
  int fit_restarts;   /* extra hyperparameter starts per GP */
  optimizer_cancel cancel; /* the caller's watch; reset at the start of each suggest */
} gp_state;

/* ---- options --------------------------------------------------------------------------- */

static const char *const known_options[] = {"kernel",       "mean",       "reference",
                                            "n_initial",    "raw_samples", "restarts",
                                            "mc_samples",   "fit_restarts", "max_baseline",
                                            NULL};

/* The most of each count option. One suggestion's work grows with raw_samples × mc_samples
 * and restarts × mc_samples (the acquisition's evaluations), with fit_restarts (GP fits) and
 * with max_baseline (the noisy baseline's boxes); the caps keep even all of them at once
 * to seconds where the defaults take a fraction of one. n_initial costs nothing per
 * suggestion (design points). docs/spec.md lists them. */
static const struct {
  const char *key;
  long min, max;
} count_limits[] = {{"n_initial", 1, 1000000}, {"raw_samples", 1, 8192}, {"restarts", 1, 64},
                    {"mc_samples", 1, 1024},   {"max_baseline", 1, 256}, {"fit_restarts", 0, 16}};

static int read_count(const json_t *options, const char *key, size_t *out, nas_err *err) {
  const json_t *v = json_object_get(options, key);
  if (!v) return NAS_OK;
  size_t i = 0;
  while (strcmp(count_limits[i].key, key) != 0) i++;
  long min = count_limits[i].min, max = count_limits[i].max;
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    return nas_errf(err, "optimizer gp: option '%s' must be an integer from %ld to %ld", key,
                    min, max);
  *out = (size_t)json_integer_value(v);
  return NAS_OK;
}

/* Option `key`, one of two names: *choice becomes 0 or 1 (untouched when absent). */
static int read_choice(const json_t *options, const char *key, const char *first,
                       const char *second, int *choice, nas_err *err) {
  const json_t *v = json_object_get(options, key);
  if (!v) return NAS_OK;
  const char *name = json_string_value(v);
  if (name && strcmp(name, first) == 0) *choice = 0;
  else if (name && strcmp(name, second) == 0) *choice = 1;
  else return nas_errf(err, "optimizer gp: option '%s' must be \"%s\" or \"%s\"", key, first,
                       second);
  return NAS_OK;
}

static int read_kernel(const json_t *options, gp_kernel *out, nas_err *err) {
  int choice = -1;
  if (read_choice(options, "kernel", "rbf", "matern52", &choice, err) != NAS_OK) return NAS_ERR;
  if (choice >= 0) *out = choice == 0 ? GP_KERNEL_RBF : GP_KERNEL_MATERN52;
  return NAS_OK;
}

static int read_mean(const json_t *options, mean_rule *out, nas_err *err) {
  int choice = -1;
  if (read_choice(options, "mean", "fitted", "worst", &choice, err) != NAS_OK) return NAS_ERR;
  if (choice >= 0) *out = choice == 0 ? MEAN_FITTED : MEAN_WORST;
  return NAS_OK;
}

static int read_reference(const json_t *options, bool *follow, nas_err *err) {
  int choice = -1;
  if (read_choice(options, "reference", "fixed", "follow", &choice, err) != NAS_OK)
    return NAS_ERR;
  if (choice >= 0) *follow = choice == 1;
  return NAS_OK;
}

static int read_options(const json_t *options, gp_state *st, nas_err *err) {
  size_t fit_restarts = 1;
  if (optimizer_check_options("gp", options, known_options, err) != NAS_OK ||
      read_kernel(options, &st->kernel, err) != NAS_OK ||
      read_mean(options, &st->mean, err) != NAS_OK ||
      read_reference(options, &st->follow_reference, err) != NAS_OK ||
      read_count(options, "n_initial", &st->n_initial, err) != NAS_OK ||
      read_count(options, "raw_samples", &st->raw_samples, err) != NAS_OK ||
      read_count(options, "restarts", &st->restarts, err) != NAS_OK ||
      read_count(options, "mc_samples", &st->mc_samples, err) != NAS_OK ||
      read_count(options, "max_baseline", &st->max_baseline, err) != NAS_OK ||
      read_count(options, "fit_restarts", &fit_restarts, err) != NAS_OK)
    return NAS_ERR;
  st->fit_restarts = (int)fit_restarts;
  return NAS_OK;
}

/* The most observations the noisy acquisition's baseline keeps of those that may still be
 * optimal (acq_prune_baseline). An observation left out is one whose value the acquisition
 * no longer knows: a candidate near it is credited with improving the front by what the
 * observation already gave (the hypervolume counts the true values of evaluated points, so
 * evaluating there again gains nothing). Without noise few observations survive the pruning
 * (BraninCurrin, DTLZ2 M = 2: 15-21 at 30 observations), under noise most do (noisy
 * BraninCurrin: 71 of 82), and BoTorch keeps every observation with a positive probability
 * of being optimal. 128 instead of 48, noisy BraninCurrin, 30 seeds, log10 HV gap at 86:
 * `gp` paired −0.029 (standard error 0.013), told the reference −0.028 (0.019), told the
 * noise −0.054 (0.012); bench/RESULTS.md, issue 22's thirteenth round. */
enum { default_max_baseline = 128 };

static int gp_create_state(const space *sp, const json_t *options, void **state, nas_err *err) {
  gp_state *st = malloc(sizeof *st);
  if (!st) return nas_errf(err, "optimizer gp: out of memory");
  *st = (gp_state){.sp = sp,
                   .kernel = GP_KERNEL_MATERN52,
                   .raw_samples = 512,
                   .restarts = 8,
                   .mc_samples = 64,
                   .max_baseline = default_max_baseline};
  if (read_options(options, st, err) != NAS_OK) {
    free(st);
    return NAS_ERR;
  }
  *state = st;
  return NAS_OK;
}

static void gp_free_state(void *state) { free(state); }

/* ---- data ------------------------------------------------------------------------------ */

/* Observations (those that encode in the space) and pending trials in the cube, then the
 * suggestions picked so far in this call, appended to P. */
typedef struct {
  size_t dim, m, c;
  size_t n;   /* observations */
  double *X;  /* n×dim */
  double *Y;  /* n×m objectives, minimisation convention; NaN where missing */
  double *N;  /* n×m known noise variances of the objectives; NaN where unknown */
  double *C;  /* n×c constraint slacks (≤ 0 feasible); NaN where missing */
  size_t np;  /* pending trials and picks */
  double *P;  /* np×dim, room for the call's picks */
} bo_data;

static void data_clear(bo_data *d) {
  free(d->X);
  free(d->Y);
  free(d->N);
  free(d->C);
  free(d->P);
}

static double slack(const constraint_spec *c, double value) {
  return c->op == CONSTRAINT_LE ? value - c->bound : c->bound - value;
}

/* The known noise variance of objective j's reading in o: its reported standard error
 * squared, else the spec's noise squared, else NaN (the GP fits one). A standard error too
 * large to square (above about 1e154) says nothing a fitted noise would not: not given. */
static double known_noise(const spec *s, const observation *o, size_t j) {
  double sem = o->objective_sems ? o->objective_sems[j] : NAN;
  if (isfinite(sem) && sem >= 0 && isfinite(sem * sem)) return sem * sem;
  const objective_spec *obj = &s->objectives[j];
  return obj->has_noise && isfinite(obj->noise * obj->noise) ? obj->noise * obj->noise : NAN;
}

static void add_observation(bo_data *d, const spec *s, const observation *o) {
  pareto_objectives_to_min(s, o->objectives, d->Y + d->n * d->m);
  for (size_t j = 0; j < d->m; j++) d->N[d->n * d->m + j] = known_noise(s, o, j);
  for (size_t k = 0; k < d->c; k++)
    d->C[d->n * d->c + k] = slack(&s->constraints[k], o->constraints[k]);
  d->n++;
}

static int data_load(const space *sp, const observation *obs, size_t n_obs,
                     const json_t *const *pending, size_t n_pending, size_t n_picks,
                     bo_data *d, nas_err *err) {
  const spec *s = space_spec(sp);
  *d = (bo_data){.dim = space_ndim(sp), .m = s->n_objectives, .c = s->n_constraints};
  d->X = malloc((n_obs * d->dim + 1) * sizeof *d->X);
  d->Y = malloc((n_obs * d->m + 1) * sizeof *d->Y);
  d->N = malloc((n_obs * d->m + 1) * sizeof *d->N);
  d->C = malloc((n_obs * d->c + 1) * sizeof *d->C);
  d->P = malloc(((n_pending + n_picks) * d->dim + 1) * sizeof *d->P);
  if (!d->X || !d->Y || !d->N || !d->C || !d->P)
    return nas_errf(err, "optimizer gp: out of memory");
  nas_err ignored; /* assignments of an earlier version of the spec: not in this space */
  for (size_t i = 0; i < n_obs; i++)
    if (space_encode(sp, obs[i].params, d->X + d->n * d->dim, &ignored) == NAS_OK)
      add_observation(d, s, &obs[i]);
  for (size_t i = 0; i < n_pending; i++)
    if (space_encode(sp, pending[i], d->P + d->np * d->dim, &ignored) == NAS_OK) d->np++;
  return NAS_OK;
}

/* Whether data_load keeps observation o (its parameters encode in the space). */
static bool obs_encodes(const space *sp, const observation *o) {
  double x[space_ndim(sp) + 1];
  nas_err ignored;
  return space_encode(sp, o->params, x, &ignored) == NAS_OK;
}

static bool row_finite(const double *v, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (!isfinite(v[j])) return false;
  return true;
}

static size_t complete_rows(const bo_data *d) {
  size_t k = 0;
  for (size_t i = 0; i < d->n; i++) k += row_finite(d->Y + i * d->m, d->m);
  return k;
}

/* ---- models ---------------------------------------------------------------------------- */

static bool worst_mean(const gp_state *st) {
  return st->mean == MEAN_WORST ||
         (st->mean == MEAN_AUTO && space_ndim(st->sp) >= worst_mean_min_dims);
}

typedef struct {
  size_t m, c;   /* objectives; constraints with data (the others cannot be modelled) */
  gp **obj;      /* m */
  gp **con;      /* c */
  const char **obj_names; /* m: each objective's metric (borrowed from the spec) */
  const char **con_names; /* c: the metric each modelled constraint bounds, likewise */
  double *ideal; /* m: best observed value per objective */
} bo_models;

static void models_clear(bo_models *md) {
  for (size_t j = 0; md->obj && j < md->m; j++) gp_free(md->obj[j]);
  for (size_t k = 0; md->con && k < md->c; k++) gp_free(md->con[k]);
  free(md->obj);
  free(md->con);
  free(md->obj_names);
  free(md->con_names);
  free(md->ideal);
}

/* What an acquisition reads of md: its first n_obj objectives and every constraint. */
static acq_models acq_models_of(const bo_models *md, size_t n_obj) {
  return (acq_models){.n_obj = n_obj, .n_con = md->c, .obj = md->obj, .con = md->con,
                      .obj_names = md->obj_names, .con_names = md->con_names};
}

/* Fits a GP to column `col` (stride `stride`) of V over the rows where it is finite, with
 * the known noise variances in the same column of noise (NULL: none known); *out stays NULL
 * when no row is finite. The mean rule applies to objectives only: a constraint's slack
 * always gets a fitted mean (see worst_mean_min_dims). */
static int fit_column(gp_state *st, const bo_data *d, const double *V, const double *noise,
                      bool objective, size_t stride, size_t col, gsl_rng *rng, gp **out,
                      nas_err *err) {
  double *X = malloc((d->n * d->dim + 1) * sizeof *X), *y = malloc((d->n + 1) * sizeof *y);
  double *nv = noise ? malloc((d->n + 1) * sizeof *nv) : NULL;
  if (!X || !y || (noise && !nv)) {
    free(X);
    free(y);
    free(nv);
    return nas_errf(err, "optimizer gp: out of memory");
  }
  size_t k = 0;
  bool any_known = false;
  for (size_t i = 0; i < d->n; i++) {
    if (!isfinite(V[i * stride + col])) continue;
    memcpy(X + k * d->dim, d->X + i * d->dim, d->dim * sizeof *X);
    if (nv) any_known |= !isnan(nv[k] = noise[i * stride + col]);
    y[k++] = V[i * stride + col];
  }
  gp_fit_options fo = {.kernel = st->kernel,
                       .restarts = st->fit_restarts,
                       .max_evals = 200,
                       .worst_mean = objective && worst_mean(st),
                       .cancel = &st->cancel,
                       .noise_var = any_known ? nv : NULL};
  *out = NULL;
  int rc = k > 0 ? gp_fit(X, y, k, d->dim, &fo, rng, out, err) : NAS_OK;
  free(X);
  free(y);
  free(nv);
  return rc;
}

static void set_ideal(const bo_data *d, bo_models *md) {
  for (size_t j = 0; j < d->m; j++) {
    md->ideal[j] = HUGE_VAL;
    for (size_t i = 0; i < d->n; i++)
      if (isfinite(d->Y[i * d->m + j])) md->ideal[j] = fmin(md->ideal[j], d->Y[i * d->m + j]);
  }
}

/* Posterior means of every objective at x, raw minimisation convention, into y. */
static void predict_objectives(const bo_models *md, const double *x, double *work, double *y) {
  for (size_t j = 0; j < md->m; j++) {
    gp_prediction p = {0};
    gp_predict(md->obj[j], x, NULL, &p, work);
    y[j] = gp_shift(md->obj[j]) + gp_scale(md->obj[j]) * p.mean;
  }
}

/* Raises the inferred coordinates of ref to at least the reference of the n_obs observed
 * rows plus PENDING_REFERENCE_STEP of their range per pending point. */
static void push_for_pending(const spec *s, const double *rows, size_t n_obs, size_t n_pending,
                             double *ref) {
  size_t m = s->n_objectives;
  double ref_obs[m];
  pareto_reference_point(s, rows, n_obs, ref_obs);
  for (size_t j = 0; j < m; j++) {
    if (s->objectives[j].has_threshold) continue;
    double low = HUGE_VAL, high = -HUGE_VAL;
    for (size_t i = 0; i < n_obs; i++) {
      low = fmin(low, rows[i * m + j]);
      high = fmax(high, rows[i * m + j]);
    }
    double pushed =
        ref_obs[j] + (double)n_pending * PENDING_REFERENCE_STEP * pareto_range(low, high);
    if (pushed > ref[j]) ref[j] = fmin(pushed, DBL_MAX);
  }
}

/* ---- the front's reach ----------------------------------------------------------------
 * An inferred reference is the observed front's nadir pushed out by a margin, so a
 * candidate beyond it in one objective adds no hypervolume however much it improves
 * another: where the front found first is not the whole front (its ends need many
 * parameters right at once, as on ZDT1 or DTLZ7 in 6-d), the reference shrinks onto it and
 * its ends are never sought. So each pick also asks the models where the front could reach
 * from itself: a few joint posterior draws at the front's neighbours (an observed front
 * point with one numeric parameter moved to a uniform value; reach_draws); a drawn point
 * that beats the front's best value in one objective at a bounded cost in another
 * (acq_trade_off_bounded) moves the inferred reference of the costly objective out to it
 * plus the margin, as if it had been observed. The bound keeps extensions that buy a sliver
 * of one objective with much of another (BraninCurrin's other Branin minima) from widening
 * the reference, and only neighbours are drawn because the largest of many draws over the
 * whole space is an extreme of the model's uncertainty, not a front within reach
 * (BraninCurrin, 10 seeds, log10 HV gap: 0.24 with 256 Sobol points drawn besides, 0.12
 * without, 0.13 with no reach; bench/RESULTS.md, issue 22's sixth round). */

/* Neighbours per observed front point and numeric parameter, and at most this many in all
 * (the draw's cost is cubic in their number). */
enum { reach_moves_per_dim = 2, reach_max_points = 512 };

/* Independent joint draws the reach takes at the neighbours; any of them may move the
 * reference. One draw shows the models' belief about the neighbours once, and where that
 * belief is confidently wrong it rarely shows an extension that is there: DTLZ7's f2
 * varies with x0 by 1.7 under a variation with x1..x5 of 38, so its GP's lengthscale along
 * x0 is 1.1-3.0 (cube units, with the worst-value mean or a fitted one; the far piece's
 * dip is 0.2 wide), and one draw at the neighbours with x0 > 0.6 gave f2 of 3.9-5.1 where
 * the bound needs about 3.1 and the truth is 2.3-3.5. Several draws are the optimism of a
 * lower posterior quantile (the expected least of 16 standard normals is -1.77) at the
 * neighbours only, with the trade-off bound on each drawn point, and share one
 * factorisation. 10 seeds, far tip reached at q = 1 / 4: 7 / 8 of 10 against 3 / 4 with
 * one draw and 5 / 7 with 8, every other row within one standard deviation; 32 and 64
 * draws widened BraninCurrin's reference (0.14, 0.15 against 0.12 over 5 seeds;
 * bench/RESULTS.md, issue 22's eighth round). */
enum { reach_draws = 16 };

/* A drawn point whose costly objective lies this many margins (pareto_reference_margins':
 * a tenth of the observed range each) past the front's worst value, at a bounded trade-off,
 * is picked as it is instead of the acquisition's choice: a plausible model says the front
 * continues far beyond the piece found, while the acquisition, which scores the posterior
 * as a whole, finds the point dominated. DTLZ7's far piece is a dip of f2 0.2 wide in x0 that
 * the f2 GP, its lengthscale along x0 1.1-3.0, predicts 4 where the truth is 2.3; the reach
 * moved the inferred f1 from 0.38 to 1.01 on a draw of 2.2 at x0 = 0.92 and the acquisition
 * still picked at x0 = 0.48, and scoring the drawn points among its raw samples changed
 * nothing (they ranked below points near the found piece). A batch takes at most one such
 * pick, its other picks the acquisition's: one point is enough to learn whether the far
 * piece is there (ZDT1 q = 4: −1.64 against −1.58 with a far pick wherever one was drawn).
 * Not with `reference: follow`, whose acquisition values a point past the reference anyway
 * (ZDT1 q = 1: −1.70 ± 0.20 with the far pick against −1.78 ± 0.02 without).
 * 10 seeds, log10 HV gap at 50, q = 1 / 4: DTLZ7 −1.59 ± 0.17 / −1.56 ± 0.21 (far tip 10 / 10
 * of 10) against −0.56 ± 1.33 / −0.86 ± 1.14 (7 / 8 of 10); at 6 margins 9 / 10 of 10 (std
 * 0.90 at q = 1), at 5 10 / 10 with std 0.50 / 0.34. Fewer margins make more such picks where
 * a wild draw passes the bound: BraninCurrin's Branin drawn below zero early on (0.14 at 4
 * against 0.12 without, 0.16 at 2; bench/RESULTS.md, issue 22's ninth round). */
static const double reach_far_margins = 4;

/* n_front front points (rows of `front`) with one numeric dimension moved to a uniform
 * value, snapped: *n rows, owned. The front is snapped once, so that each neighbour snaps
 * its moved dimension alone (space_snap_near; the same point as snapping it whole). */
static double *front_neighbours(const space *sp, const double *front, size_t n_front,
                                gsl_rng *rng, size_t *n, nas_err *err) {
  size_t dim = space_ndim(sp), n_numeric = 0;
  const space_dim *dims = space_dims(sp);
  size_t numeric[dim + 1];
  for (size_t j = 0; j < dim; j++)
    if (dims[j].kind != DIM_ONEHOT) numeric[n_numeric++] = j;
  size_t k = n_front * n_numeric * reach_moves_per_dim;
  if (k > reach_max_points) k = reach_max_points;
  double *X = malloc((k * dim + 1) * sizeof *X);
  double *snapped = malloc((n_front * dim + 1) * sizeof *snapped);
  int rc = X && snapped ? NAS_OK : nas_errf(err, "optimizer gp: out of memory");
  if (rc == NAS_OK) memcpy(snapped, front, n_front * dim * sizeof *snapped);
  for (size_t i = 0; rc == NAS_OK && i < n_front; i++) rc = space_snap(sp, snapped + i * dim, err);
  for (size_t i = 0; rc == NAS_OK && i < k; i++) {
    double *x = X + i * dim;
    const double *centre = snapped + gsl_rng_uniform_int(rng, n_front) * dim;
    memcpy(x, centre, dim * sizeof *x);
    x[numeric[gsl_rng_uniform_int(rng, n_numeric)]] = gsl_rng_uniform(rng);
    rc = space_snap_near(sp, centre, x, err);
  }
  free(snapped);
  if (rc != NAS_OK) {
    free(X);
    return NULL;
  }
  *n = k;
  return X;
}

/* The neighbour (row of X) that drew the farthest reach into a new *far (dim values) when
 * it lies reach_far_margins or more past the front; *far untouched otherwise. */
static int keep_far(const double *X, size_t dim, size_t farthest, double reach, double **far,
                    nas_err *err) {
  if (reach < reach_far_margins) return NAS_OK;
  *far = malloc(dim * sizeof **far);
  if (!*far) return nas_errf(err, "optimizer gp: out of memory");
  memcpy(*far, X + farthest * dim, dim * sizeof **far);
  return NAS_OK;
}

/* Moves the inferred coordinates of ref out to the front's reach (see above): low and high
 * are the front's bounds over the complete observations (acq_front_bounds), margin the
 * inferred coordinates' margins. Under the fixed reference, a neighbour whose draw reaches
 * reach_far_margins past the front goes to *far (owned; untouched if none). */
static int reach_reference(const gp_state *st, const bo_data *d, const bo_models *md, int number,
                           const double *front, size_t n_front, const double *low,
                           const double *high, const double *margin, const double *floor,
                           double *ref, double **far, nas_err *err) {
  const spec *s = space_spec(st->sp);
  size_t m = d->m, K = m + md->c, n = 0;
  bool inferred = false;
  for (size_t j = 0; j < m; j++) inferred = inferred || !s->objectives[j].has_threshold;
  if (!inferred || m < 2 || n_front == 0) return NAS_OK;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  if (!rng) return nas_errf(err, "optimizer gp: out of memory");
  uint64_t seed = design_stream_seed(s->seed, STREAM_REACH | (uint64_t)number);
  gsl_rng_set(rng, (unsigned long)seed);
  double *X = front_neighbours(st->sp, front, n_front, rng, &n, err);
  double *F = X ? malloc((reach_draws * n * K + 1) * sizeof *F) : NULL;
  int rc = X ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && !F) rc = nas_errf(err, "optimizer gp: out of memory");
  acq_models models = acq_models_of(md, m);
  if (rc == NAS_OK) rc = acq_posterior_draw(&models, X, n, reach_draws, seed ^ 1, F, err);
  double reach = -HUGE_VAL; /* the farthest, in margins past the front */
  size_t farthest = 0;
  for (size_t i = 0; rc == NAS_OK && i < reach_draws * n; i++) {
    double f[K]; /* the draw, no objective below its floor (none where NaN) */
    for (size_t c = 0; c < K; c++) f[c] = c < m ? fmax(F[i * K + c], floor[c]) : F[i * K + c];
    bool feasible = true;
    for (size_t c = m; c < K; c++) feasible = feasible && f[c] <= 0;
    for (size_t j = 0; feasible && j < m; j++)
      if (!s->objectives[j].has_threshold && f[j] + margin[j] > ref[j] &&
          acq_trade_off_bounded(f, m, j, low, high, margin)) {
        ref[j] = f[j] + margin[j];
        double past = (f[j] - high[j]) / margin[j];
        if (past > reach) {
          reach = past;
          farthest = i % n;
        }
      }
  }
  /* `follow` values a point past the reference already: no far pick there */
  if (rc == NAS_OK && !st->follow_reference) rc = keep_far(X, d->dim, farthest, reach, far, err);
  free(F);
  free(X);
  gsl_rng_free(rng);
  return rc;
}

/* The objectives' floors (acq_front_floors) of the n complete observed rows (low: their
 * front's best values, acq_front_bounds): where several distinct rows share an objective's
 * best value (exactly or within round-off), the objective has reached a bound there, and a
 * model's value below it is its noise. On DTLZ2 with three objectives (a face of the front at
 * each objective's 0) the acquisition's samples and the reach's draws below 0 made gains
 * across a whole face:
 * 100 of 108 picks lay on a face (seeds 0-2, q = 1), 72 outside the benchmark's reference
 * box, and the reach moved the reference out to 1.5-2.0 where the front's nadir is 1
 * (bench/RESULTS.md, issue 22's twelfth round). With two objectives the face is the front's
 * end, one front point and the rows behind it at the same 0 (x0 = 0, any g): 163 of 360
 * picks went to the ends without the floor, 130 with it (48 told the reference; q = 4,
 * seeds 0-9), and the front ended with 9.1 points on average against 11.3 (18.6; issue 22's
 * thirteenth round). A bound met only up to round-off (DTLZ2's f1 is 6e-17·(1 + g)·… at
 * x0 = 1, never 0) had no floor while ties had to be exact: the reach's draws below it moved
 * the other coordinates out by a median 0.2 beyond the front's nadir plus the margin (DTLZ2
 * M = 3, q = 4, 20 seeds: −0.52 with round-off ties against −0.44; sixteenth round). */
static int observed_floors(const double *rows, size_t n, size_t m, const double *low,
                           double *floor, nas_err *err) {
  if (acq_front_floors(rows, n, m, low, floor, err) != NAS_OK)
    return nas_err_prefix(err, "optimizer gp");
  return NAS_OK;
}

/* The reference point of one pick: from the thresholds, else inferred (pareto_reference_point, as
 * `nas pareto` computes it) from the observations that have every objective together with
 * the posterior means of the pending points and earlier picks, i.e. the reference the
 * experiment will infer once they report what the models expect of them, so that a batch
 * moves its reference as a sequence of single suggestions would. The means alone are not
 * enough: a pick that extends the front lies beyond the data, where the mean reverts
 * towards the constant mean, so its predicted value tends to fall just behind the front it
 * was picked to extend (ZDT1 seed 8, q = 4: predicted 0.479 against the front end's 0.474,
 * observed 0.435) and the reference stays put; the later picks then filled in the front
 * instead of extending it. Hence also the step per pending point (push_for_pending). Last,
 * the inferred coordinates move out to the front's reach (reach_reference), which counts no
 * drawn value below an objective's floor (observed_floors, also into floor). */
static int pick_reference(const gp_state *st, const bo_data *d, const bo_models *md, int number,
                          const double *front, size_t n_front, double *ref, double *margin,
                          double *floor, double **far, nas_err *err) {
  const spec *s = space_spec(st->sp);
  size_t work_len = 0;
  for (size_t j = 0; j < md->m; j++)
    if (gp_work_len(md->obj[j]) > work_len) work_len = gp_work_len(md->obj[j]);
  double *rows = malloc(((d->n + d->np) * d->m + 1) * sizeof *rows);
  double *work = malloc((work_len + 1) * sizeof *work);
  bool *on_front = malloc(d->n + 1);
  if (!rows || !work || !on_front) {
    free(rows);
    free(work);
    free(on_front);
    return nas_errf(err, "optimizer gp: out of memory");
  }
  size_t k = 0;
  for (size_t i = 0; i < d->n; i++)
    if (row_finite(d->Y + i * d->m, d->m))
      memcpy(rows + k++ * d->m, d->Y + i * d->m, d->m * sizeof *rows);
  for (size_t i = 0; i < d->np; i++)
    predict_objectives(md, d->P + i * d->dim, work, rows + k++ * d->m);
  pareto_reference_margins(s, rows, k, ref, margin);
  push_for_pending(s, rows, k - d->np, d->np, ref);
  double low[d->m], high[d->m]; /* the observed front's bounds */
  acq_front_bounds(rows, k - d->np, d->m, on_front, low, high);
  int rc = observed_floors(rows, k - d->np, d->m, low, floor, err);
  if (rc == NAS_OK)
    rc = reach_reference(st, d, md, number, front, n_front, low, high, margin, floor, ref, far,
                         err);
  free(rows);
  free(work);
  free(on_front);
  return rc;
}

static int fit_models(gp_state *st, const bo_data *d, int number, bo_models *md,
                      nas_err *err) {
  const spec *s = space_spec(st->sp);
  *md = (bo_models){.m = d->m};
  md->obj = calloc(d->m + 1, sizeof *md->obj);
  md->con = calloc(d->c + 1, sizeof *md->con);
  md->obj_names = calloc(d->m + 1, sizeof *md->obj_names);
  md->con_names = calloc(d->c + 1, sizeof *md->con_names);
  md->ideal = malloc((d->m + 1) * sizeof *md->ideal);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  int rc = md->obj && md->con && md->obj_names && md->con_names && md->ideal && rng
               ? NAS_OK
               : nas_errf(err, "optimizer gp: out of memory");
  if (rng) gsl_rng_set(rng, design_stream_seed(s->seed, STREAM_FIT | (uint64_t)number));
  for (size_t j = 0; rc == NAS_OK && j < d->m; j++) {
    md->obj_names[j] = s->objectives[j].name;
    rc = fit_column(st, d, d->Y, d->N, true, d->m, j, rng, &md->obj[j], err);
    if (rc != NAS_OK) nas_err_prefix(err, "objective '%s'", s->objectives[j].name);
  }
  for (size_t k = 0; rc == NAS_OK && k < d->c; k++) {
    md->con_names[md->c] = s->constraints[k].metric;
    rc = fit_column(st, d, d->C, NULL, false, d->c, k, rng, &md->con[md->c], err);
    if (rc != NAS_OK) nas_err_prefix(err, "constraint on '%s'", s->constraints[k].metric);
    else if (md->con[md->c]) md->c++;
  }
  gsl_rng_free(rng);
  if (rc == NAS_OK) set_ideal(d, md);
  return rc;
}

/* ---- one pick -------------------------------------------------------------------------- */

/* An acquisition ready to optimise, and what it owns. */
typedef struct {
  acq_fn f;
  void *ctx;
  logei *ei;
  mc_acq *mc;
  double *far; /* NULL, or a point to pick as it is (reach_far_margins) */
} bo_acq;

static void acq_clear(bo_acq *a) {
  logei_free(a->ei);
  mc_acq_free(a->mc);
  free(a->far);
}

/* Analytic LogEI (one objective, nothing pending), the incumbent taken among the
 * observations that report the objective. */
static int make_logei(const bo_data *d, const bo_models *md, bo_acq *a, nas_err *err) {
  double *X = malloc((d->n * d->dim + 1) * sizeof *X);
  if (!X) return nas_errf(err, "optimizer gp: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < d->n; i++)
    if (isfinite(d->Y[i])) memcpy(X + k++ * d->dim, d->X + i * d->dim, d->dim * sizeof *X);
  acq_models m = acq_models_of(md, 1);
  int rc = logei_create(&m, X, k, &a->ei, err);
  free(X);
  a->f = logei_eval;
  a->ctx = a->ei;
  return rc;
}

/* The observations that may still be optimal (pruned), then the pending points. */
static double *mc_baseline(const bo_data *d, const acq_models *m, size_t cap, size_t *nb,
                           nas_err *err) {
  double *obs = malloc((d->n * d->dim + 1) * sizeof *obs);
  size_t *keep = malloc((d->n + 1) * sizeof *keep), n_obs = 0, n_keep = 0;
  double *B = malloc(((d->n + d->np) * d->dim + 1) * sizeof *B);
  int rc = obs && keep && B ? NAS_OK : nas_errf(err, "optimizer gp: out of memory");
  for (size_t i = 0; rc == NAS_OK && i < d->n; i++) /* rows with some objective value */
    for (size_t j = 0; j < d->m; j++)
      if (isfinite(d->Y[i * d->m + j])) {
        memcpy(obs + n_obs++ * d->dim, d->X + i * d->dim, d->dim * sizeof *obs);
        break;
      }
  if (rc == NAS_OK) rc = acq_prune_baseline(m, obs, n_obs, cap, keep, &n_keep, err);
  for (size_t k = 0; rc == NAS_OK && k < n_keep; k++)
    memcpy(B + k * d->dim, obs + keep[k] * d->dim, d->dim * sizeof *B);
  if (rc == NAS_OK) memcpy(B + n_keep * d->dim, d->P, d->np * d->dim * sizeof *B);
  free(obs);
  free(keep);
  if (rc != NAS_OK) {
    free(B);
    return NULL;
  }
  *nb = n_keep + d->np;
  return B;
}

/* Chebyshev weights uniform on the simplex (normalised exponentials). */
static void draw_weights(long seed, int number, size_t m, double *w) {
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double sum = 0;
  if (rng) gsl_rng_set(rng, design_stream_seed(seed, STREAM_WEIGHTS | (uint64_t)number));
  for (size_t j = 0; j < m; j++) sum += (w[j] = rng ? gsl_ran_exponential(rng, 1.0) : 1.0);
  for (size_t j = 0; j < m; j++) w[j] /= sum;
  gsl_rng_free(rng);
}

/* The MC acquisition of one pick; ref_out (NULL: not wanted) gets the reference point its
 * hypervolume improvement is measured against. With `reference: follow`, each inferred
 * coordinate j becomes max(ref_j, y_j + margin_j) for a candidate's outcome y: once y is
 * observed, a y on the front that lies beyond ref_j makes the nadir y_j (a dominated y
 * improves nothing under any reference). So a candidate extending the front past the
 * reference (its ends; a piece of the front beyond the one found first, as on DTLZ7) is
 * valued at about a margin's width times what it extends, where the fixed reference gives it
 * nothing. Not the default: on BraninCurrin it also spends evaluations on such extensions
 * that a tight reference does not reward (bench/RESULTS.md). */
static int make_mc(const gp_state *st, const bo_data *d, const bo_models *md, int number,
                   const double *front, size_t n_front, bo_acq *a, double *ref_out,
                   nas_err *err) {
  const spec *s = space_spec(st->sp);
  acq_models m = acq_models_of(md, md->m);
  size_t nb = 0;
  double weights[md->m], ref[md->m], margin[md->m], floor[md->m];
  if (pick_reference(st, d, md, number, front, n_front, ref, margin, floor, &a->far, err) !=
      NAS_OK)
    return NAS_ERR;
  /* ParEGO's scalarisations ignore the reference point */
  if (ref_out && md->m <= max_hvi_objectives) memcpy(ref_out, ref, md->m * sizeof *ref);
  double *B = mc_baseline(d, &m, st->max_baseline, &nb, err);
  if (!B) return NAS_ERR;
  draw_weights(s->seed, number, md->m, weights);
  mc_options opt = {.utility = md->m <= max_hvi_objectives ? MC_HVI : MC_PAREGO,
                    .n_samples = st->mc_samples,
                    .seed = design_stream_seed(s->seed, STREAM_MC | (uint64_t)number),
                    .ref = ref,
                    .weights = weights,
                    .ideal = md->ideal,
                    .margin = st->follow_reference ? margin : NULL,
                    .floor = floor};
  int rc = mc_acq_create(&m, B, nb, &opt, &a->mc, err);
  free(B);
  a->f = mc_acq_eval;
  a->ctx = a->mc;
  return rc;
}

/* Centres for the raw samples: the observed front (complete rows only); NULL when out of
 * memory (never a front silently left empty: the reach would then see no front). */
static double *front_centres(const bo_data *d, size_t *n) {
  double *Yc = malloc((d->n * d->m + 1) * sizeof *Yc);
  double *Xc = malloc((d->n * d->dim + 1) * sizeof *Xc);
  bool *mask = malloc((d->n + 1) * sizeof *mask);
  size_t k = 0, kept = 0;
  if (Yc && Xc && mask) {
    for (size_t i = 0; i < d->n; i++)
      if (row_finite(d->Y + i * d->m, d->m)) {
        memcpy(Yc + k * d->m, d->Y + i * d->m, d->m * sizeof *Yc);
        memcpy(Xc + k++ * d->dim, d->X + i * d->dim, d->dim * sizeof *Xc);
      }
    pareto_mask(Yc, k, d->m, mask);
    for (size_t i = 0; i < k; i++)
      if (mask[i]) memmove(Xc + kept++ * d->dim, Xc + i * d->dim, d->dim * sizeof *Xc);
  } else {
    free(Xc);
    Xc = NULL;
  }
  free(Yc);
  free(mask);
  *n = kept;
  return Xc;
}

/* The next point x by the acquisition, or the reach's far point (reach_far_margins, only
 * under the fixed reference) when it found one that is free and *far_picked says no earlier
 * pick of the batch was one (it becomes true); ref_out as make_mc's (untouched by LogEI). */
static int pick(gp_state *st, const bo_data *d, const bo_models *md, int number,
                taken_set *taken, bool *far_picked, double *x, double *ref_out, nas_err *err) {
  const spec *s = space_spec(st->sp);
  bo_acq a = {0};
  /* One objective with pending points goes through the MC path too: its one-objective
   * hypervolume improvement is the improvement over the best of each joint sample, i.e.
   * noisy EI that integrates over the pending outcomes (fantasising them at their
   * posterior mean instead let single-objective batches cluster on one spot). */
  size_t n_centres = 0;
  double *centres = front_centres(d, &n_centres);
  int rc = centres ? NAS_OK : nas_errf(err, "optimizer gp: out of memory");
  if (rc == NAS_OK)
    rc = md->m == 1 && d->np == 0
             ? make_logei(d, md, &a, err)
             : make_mc(st, d, md, number, centres, n_centres, &a, ref_out, err);
  uint64_t raw_seed = design_stream_seed(s->seed, STREAM_RAW | (uint64_t)number);
  acq_search search = {.sp = st->sp,
                       .f = a.f,
                       .ctx = a.ctx,
                       .raw_samples = st->raw_samples,
                       .restarts = st->restarts,
                       .max_evals = 100,
                       .seed = (long)(raw_seed >> 1), /* non-negative */
                       .centres = centres,
                       .n_centres = n_centres,
                       .taken = taken,
                       .cancel = &st->cancel};
  double value;
  if (rc == NAS_OK && a.far && !*far_picked && !taken_contains(taken, a.far)) {
    memcpy(x, a.far, d->dim * sizeof *x);
    *far_picked = true;
  } else if (rc == NAS_OK)
    rc = acq_optimize(&search, x, &value, err);
  if (rc == NAS_OK) rc = taken_add(taken, x, err);
  else if (rc == NAS_ENOTFOUND) rc = taken_fresh(taken, s->seed, number, NULL, x, err);
  free(centres);
  acq_clear(&a);
  return rc;
}

/* ---- suggest --------------------------------------------------------------------------- */

/* The default design's least size, and the share of the expected trials it may take. */
enum { initial_design_min = 5, initial_design_budget_share = 5 };

/* The Sobol design's size: n_initial when given; else 2·d, which is what a GP needs to
 * see the space's main directions before it models it, but at most a fifth of the trials
 * the budget allows: with few trials (long trainings against a wall-time budget, a small
 * budget.trials) a design of 2·d can take all of them, and the model is never used. */
static size_t initial_design_size(const gp_state *st) {
  if (st->n_initial) return st->n_initial;
  size_t size = 2 * space_uniform_dims(st->sp);
  size_t share = st->trials_expected / initial_design_budget_share;
  if (st->trials_expected && share < size) size = share;
  return size > initial_design_min ? size : initial_design_min;
}

/* Point `number` of the Sobol design, or a free one near it in its streams. */
static int design_pick(const gp_state *st, int number, taken_set *taken, double *x,
                       nas_err *err) {
  size_t n_u = space_uniform_dims(st->sp);
  double u[n_u + 1];
  long seed = space_spec(st->sp)->seed;
  if (n_u > 0 && design_sobol(n_u, seed, (size_t)number, 1, u, err) != NAS_OK) return NAS_ERR;
  space_from_uniform(st->sp, u, x);
  return taken_fresh(taken, seed, number, x, x, err);
}

static int gp_suggest(void *state, const observation *obs, size_t n_obs,
                      const json_t *const *pending, size_t n_pending, size_t n, int first_number,
                      json_t **out, double *refs, nas_err *err) {
  gp_state *st = state;
  st->cancel.stopped = false;
  bo_data d;
  bo_models md = {0};
  taken_set *taken = NULL;
  bool fitted = false, far_picked = false; /* one far pick per batch (reach_far_margins) */
  int rc = data_load(st->sp, obs, n_obs, pending, n_pending, n, &d, err);
  if (rc == NAS_OK) rc = taken_create(st->sp, obs, n_obs, pending, n_pending, &taken, err);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    int number = first_number + (int)i;
    double *x = d.P + d.np * d.dim;
    bool bo = n_obs + n_pending + i >= initial_design_size(st) && complete_rows(&d) >= 2 &&
              d.dim > 0; /* nothing to model in a space of fixed parameters only */
    if (bo && !fitted) rc = fit_models(st, &d, first_number, &md, err);
    fitted = fitted || bo;
    double *ref = refs && d.m > 1 ? refs + i * d.m : NULL; /* one objective: none */
    if (rc == NAS_OK) rc = bo ? pick(st, &d, &md, number, taken, &far_picked, x, ref, err)
                              : design_pick(st, number, taken, x, err);
    if (rc == NAS_OK) rc = space_decode(st->sp, x, &out[i], err);
    d.np++;
  }
  models_clear(&md);
  taken_free(taken);
  data_clear(&d);
  return rc;
}

/* ---- the model's view of the observations -------------------------------------------- */

/* The fitted models' posterior means at the observations data_load kept (rows of d) into
 * the matching rows of means (own direction; NaN where an objective has no model). */
static void means_at_rows(const spec *s, const bo_data *d, const bo_models *md,
                          const size_t *row_of, size_t n_obs, double *work, double *means) {
  size_t m = s->n_objectives;
  for (size_t i = 0; i < n_obs; i++)
    for (size_t j = 0; j < m; j++) {
      double *out = means + i * m + j;
      *out = NAN;
      if (row_of[i] == SIZE_MAX || !md->obj[j]) continue;
      gp_prediction p = {0};
      gp_predict(md->obj[j], d->X + row_of[i] * d->dim, NULL, &p, work);
      double v = gp_shift(md->obj[j]) + gp_scale(md->obj[j]) * p.mean;
      *out = s->objectives[j].goal == GOAL_MAXIMIZE ? -v : v;
    }
}

static size_t models_work_len(const bo_models *md) {
  size_t len = 0;
  for (size_t j = 0; j < md->m; j++)
    if (md->obj[j] && gp_work_len(md->obj[j]) > len) len = gp_work_len(md->obj[j]);
  return len;
}

int optimizer_model_means(const spec *s, const observation *obs, size_t n_obs, double *means,
                          nas_err *err) {
  bool own = s->optimizer.type == NULL || strcmp(s->optimizer.type, "gp") == 0;
  json_t *options =
      own && s->optimizer.options ? json_incref(s->optimizer.options) : json_object();
  space *sp = NULL;
  void *state = NULL;
  bo_data d = {0};
  bo_models md = {0};
  size_t *row_of = malloc((n_obs + 1) * sizeof *row_of);
  double *work = NULL;
  int rc = options && row_of ? space_create(s, &sp, err) : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = gp_create_state(sp, options, &state, err);
  if (rc == NAS_OK) rc = data_load(sp, obs, n_obs, NULL, 0, 0, &d, err);
  for (size_t i = 0, row = 0; rc == NAS_OK && i < n_obs; i++) /* as data_load kept them */
    row_of[i] = obs_encodes(sp, &obs[i]) ? row++ : SIZE_MAX;
  if (rc == NAS_OK && d.n > 0 && d.dim > 0) rc = fit_models(state, &d, 0, &md, err);
  if (rc == NAS_OK && md.obj && !(work = malloc((models_work_len(&md) + 1) * sizeof *work)))
    rc = nas_errf(err, "out of memory");
  if (rc == NAS_OK && md.obj) means_at_rows(s, &d, &md, row_of, n_obs, work, means);
  else if (rc == NAS_OK)
    for (size_t i = 0; i < n_obs * s->n_objectives; i++) means[i] = NAN;
  free(work);
  models_clear(&md);
  data_clear(&d);
  if (state) gp_free_state(state);
  space_free(sp);
  free(row_of);
  json_decref(options);
  return rc;
}

static void gp_set_watch(void *state, optimizer_watch watch) {
  gp_state *st = state;
  st->cancel = (optimizer_cancel){.watch = watch};
}

static void gp_set_trials_expected(void *state, size_t n) {
  gp_state *st = state;
  st->trials_expected = n;
}

const optimizer_backend optimizer_gp_backend = {
    .type = "gp",
    .create = gp_create_state,
    .free = gp_free_state,
    .suggest = gp_suggest,
    .set_watch = gp_set_watch,
    .set_trials_expected = gp_set_trials_expected,
};
