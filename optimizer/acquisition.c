/* optimizer/acquisition.c: the Monte Carlo acquisitions qLogNEHVI and qLogNParEGO, the
 * pruning of their baseline, the bounded trade-off that lets an extension of a front move
 * an inferred reference, and joint posterior draws (see acquisition.h).
 *
 * Joint sampling with fixed base samples. Per outcome o, the baseline's posterior
 * N(μ_B, Σ_B) is factorised once, Σ_B = L Lᵀ, and sample s of the baseline is
 * f_B = μ_B + L z_B[s]. For a candidate x with cross covariance Σ_Bx, l = L⁻¹Σ_Bx and
 * σ_r² = σ_x² − lᵀl, sample s of f(x) conditional on the baseline's is
 *   f_x[s] = μ_x + lᵀ z_B[s] + σ_r z_x[s],
 * exactly the joint posterior, at O(nb²) per candidate. The base samples z_B (pseudo-random)
 * and z_x (randomised Sobol through the normal quantile) are drawn once from the seed, so
 * the acquisition is a smooth, deterministic function of x that L-BFGS can climb.
 *
 * Per sample, the utility is log HVI over the disjoint boxes of that sample's non-dominated
 * region (computed once at creation from the feasible baseline values), or the log of the
 * smoothed improvement of a Chebyshev scalarisation over the sample's best baseline value;
 * constraints add log s(−slack/η) with a fat-tailed sigmoid s. The acquisition is the log of
 * the mean over samples of exp(utility). Gradients flow back through f_x[s] analytically. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_cblas.h>
#include <gsl/gsl_cdf.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>

#include "optimizer/acquisition.h"
#include "optimizer/design.h"
#include "optimizer/optimizer.h"
#include "optimizer/small_blas.h"

static const double TAU_RELU = 1e-6;   /* smoothing of max(0, ·), standardised units */
static const double ETA_CON = 1e-3;    /* smoothing of the feasibility indicator */
static const double PAREGO_RHO = 0.05; /* weight of the linear part of the scalarisation */
static const double MIN_VAR = 1e-12;
static const double BASE_JITTER = 1e-10; /* added to baseline covariances (round-off) */
static const double MAX_BASE_JITTER = 1e-4; /* the most covariance_factor adds */
static const size_t DEFAULT_SAMPLES = 64;
/* An extension of a front moves an inferred reference only where its trade-off is bounded
 * (Geoffrion's proper Pareto optimality, acq_trade_off_bounded): what it loses beyond the
 * front's nadir in one objective, per extent of the front in that objective, at most this
 * many times what it gains beyond the front's best in another, per extent there. */
static const double MAX_TRADE_OFF = 10;

struct mc_acq {
  acq_models models;
  mc_utility utility;
  size_t n_obj, K, nb, N, d; /* K outcomes: objectives then constraints */
  gp_baseline *base;         /* K */
  double *L;                 /* K·nb·nb: Cholesky factors of the baseline covariances */
  double *Zb;                /* K·N·nb: Zb[(o·N + s)·nb + i] */
  double *zx;                /* K·N: zx[o·N + s] */
  double *offset;            /* K: sample value = posterior value + offset */
  double *scal;              /* n_obj: ParEGO weights with the normalisation folded in */
  double *margin;            /* n_obj: mc_options' margin in standardised units (0: fixed) */
  double *floor;             /* n_obj: mc_options' floor in sample units (-inf: none) */
  box_list boxes;            /* MC_HVI: all samples' boxes */
  size_t *box_first, *box_count; /* N */
  double *low, *high;        /* N·n_obj: each sample's front's best and worst values */
  double *best;              /* MC_PAREGO: N best scalarised baseline values (≤ 0) */
  /* scratch for one evaluation */
  double *work;              /* K·work_len: each outcome's gp_predict work (gp_cov_b_vjp) */
  size_t work_len;
  double *dvar;              /* d */
  double *l;                 /* K·nb: L⁻¹Σ_Bx */
  double *mean, *dmean;      /* K, K·d */
  double *sd, *dsd;          /* K, K·d: residual standard deviation σ_r, its gradient
                              * through σ_x² alone (backpropagate adds the part through l) */
  double *l_coef;            /* K: ∂σ_r/∂l = l_coef·l, l_coef = −1/σ_r (0 where σ_r is
                              * floored) */
  double *vjp;               /* max(n) + nb: gp_cov_b_vjp's scratch */
  double *F, *G;             /* N·K: sample values F[s·K + o] and ∂acq/∂F */
  double *u;                 /* N: per-sample utilities */
  double *tmp;               /* max(nb, 1) */
};

static const gp *outcome(const mc_acq *a, size_t o) {
  return o < a->n_obj ? a->models.obj[o] : a->models.con[o - a->n_obj];
}

/* Prefixes err with what failed for outcome o (objectives, then constraints) of models,
 * named by its metric: "WHAT of objective 'loss'". Returns NAS_ERR. */
static int outcome_failed(const acq_models *models, size_t o, const char *what, nas_err *err) {
  if (o < models->n_obj)
    return nas_err_prefix(err, "%s of objective '%s'", what, models->obj_names[o]);
  return nas_err_prefix(err, "%s of the constraint on '%s'", what,
                        models->con_names[o - models->n_obj]);
}

void mc_acq_free(mc_acq *a) {
  if (!a) return;
  for (size_t o = 0; a->base && o < a->K; o++) gp_baseline_clear(&a->base[o]);
  void *owned[] = {a->base, a->L,    a->Zb,  a->zx, a->offset, a->scal, a->margin, a->floor,
                   a->box_first, a->box_count, a->low, a->high, a->best, a->work, a->dvar, a->l,
                   a->mean, a->dmean, a->sd,  a->dsd, a->l_coef, a->vjp, a->F, a->G, a->u,
                   a->tmp};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) free(owned[i]);
  box_list_clear(&a->boxes);
  free(a);
}

static int alloc_arrays(mc_acq *a) {
  size_t K = a->K, N = a->N, nb = a->nb, d = a->d, work = 0, n_most = 0;
  for (size_t o = 0; o < K; o++) {
    if (gp_work_len(outcome(a, o)) > work) work = gp_work_len(outcome(a, o));
    if (gp_n(outcome(a, o)) > n_most) n_most = gp_n(outcome(a, o));
  }
  a->work_len = work;
  a->base = calloc(K, sizeof *a->base);
  a->L = malloc((K * nb * nb + 1) * sizeof *a->L);
  a->Zb = malloc((K * N * nb + 1) * sizeof *a->Zb);
  a->zx = malloc(K * N * sizeof *a->zx);
  a->offset = malloc(K * sizeof *a->offset);
  a->scal = malloc(a->n_obj * sizeof *a->scal);
  a->margin = malloc(a->n_obj * sizeof *a->margin);
  a->floor = malloc(a->n_obj * sizeof *a->floor);
  a->box_first = malloc(N * sizeof *a->box_first);
  a->box_count = malloc(N * sizeof *a->box_count);
  a->best = malloc(N * sizeof *a->best);
  a->low = malloc(N * a->n_obj * sizeof *a->low);
  a->high = malloc(N * a->n_obj * sizeof *a->high);
  a->work = malloc(K * work * sizeof *a->work);
  a->dvar = malloc(d * sizeof *a->dvar);
  a->l = malloc((K * nb + 1) * sizeof *a->l);
  a->mean = malloc(K * sizeof *a->mean);
  a->dmean = malloc(K * d * sizeof *a->dmean);
  a->sd = malloc(K * sizeof *a->sd);
  a->dsd = malloc(K * d * sizeof *a->dsd);
  a->l_coef = malloc(K * sizeof *a->l_coef);
  a->vjp = malloc((n_most + nb + 1) * sizeof *a->vjp);
  a->F = malloc(N * K * sizeof *a->F);
  a->G = malloc(N * K * sizeof *a->G);
  a->u = malloc(N * sizeof *a->u);
  a->tmp = malloc((nb + 1) * sizeof *a->tmp);
  return a->base && a->L && a->Zb && a->zx && a->offset && a->scal && a->margin && a->floor &&
                 a->box_first &&
                 a->box_count && a->low && a->high && a->best && a->work && a->dvar && a->l &&
                 a->mean && a->dmean && a->sd && a->dsd && a->l_coef && a->vjp && a->F &&
                 a->G && a->u && a->tmp
             ? NAS_OK
             : NAS_ERR;
}

/* Base samples: z_B from the seeded generator, z_x from a randomised Sobol design mapped
 * through the normal quantile (clamped away from 0 and 1). */
static int draw_base_samples(mc_acq *a, uint64_t seed, nas_err *err) {
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double *u = malloc(a->N * a->K * sizeof *u);
  if (!rng || !u) {
    gsl_rng_free(rng);
    free(u);
    return nas_errf(err, "acquisition: out of memory for base samples");
  }
  gsl_rng_set(rng, (unsigned long)seed);
  for (size_t i = 0; i < a->K * a->N * a->nb; i++) a->Zb[i] = gsl_ran_gaussian_ziggurat(rng, 1.0);
  int rc = design_sobol(a->K, (long)(seed & 0x7fffffff), 0, a->N, u, err);
  for (size_t s = 0; rc == NAS_OK && s < a->N; s++)
    for (size_t o = 0; o < a->K; o++)
      a->zx[o * a->N + s] = gsl_cdf_ugaussian_Pinv(fmin(fmax(u[s * a->K + o], 1e-10), 1 - 1e-10));
  gsl_rng_free(rng);
  free(u);
  return rc;
}

/* A posterior covariance of n points (n×n, in place) into its lower Cholesky factor, with
 * BASE_JITTER on the diagonal against round-off. Where points were observed without noise
 * (a standard error of 0) their posterior covariance is zero up to round-off, which can be
 * negative beyond any jitter relative to the matrix's own (near-zero) diagonal: then the
 * jitter grows by 100× up to MAX_BASE_JITTER of the prior variance (1). */
static int covariance_factor(double *cov, size_t n, nas_err *err) {
  if (n == 0) return NAS_OK;
  /* Both copies are made here, so that a failure inside the loop is the matrix's, never
   * memory's: running short must fail the suggestion, not retry with more jitter. */
  double *orig = malloc(n * n * sizeof *orig), *scratch = malloc(n * n * sizeof *scratch);
  int rc = orig && scratch
               ? NAS_ERR
               : nas_errf(err, "acquisition: out of memory for a %zux%zu covariance", n, n);
  if (orig && scratch) memcpy(orig, cov, n * n * sizeof *orig);
  for (double jitter = BASE_JITTER; orig && scratch && rc != NAS_OK && jitter <= MAX_BASE_JITTER;
       jitter *= 100) {
    memcpy(cov, orig, n * n * sizeof *cov);
    for (size_t i = 0; i < n; i++) cov[i * n + i] += jitter;
    rc = gp_cholesky_with(cov, n, scratch, NULL, err);
  }
  free(orig);
  free(scratch);
  return rc;
}

/* Posterior of every outcome at the baseline, and its factor. */
static int make_baselines(mc_acq *a, const double *Xb, nas_err *err) {
  size_t nb = a->nb;
  for (size_t o = 0; o < a->K; o++) {
    if (gp_baseline_make(outcome(a, o), Xb, nb, &a->base[o], err) != NAS_OK) return NAS_ERR;
    double *L = a->L + o * nb * nb;
    memcpy(L, a->base[o].cov, nb * nb * sizeof *L);
    if (covariance_factor(L, nb, err) != NAS_OK)
      return outcome_failed(&a->models, o, "acquisition baseline", err);
  }
  return NAS_OK;
}

static void set_offsets(mc_acq *a, const double *ref) {
  for (size_t o = 0; o < a->K; o++) {
    const gp *g = outcome(a, o);
    double target = o < a->n_obj ? ref[o] : 0.0;
    a->offset[o] = (gp_shift(g) - target) / gp_scale(g);
  }
}

/* mc_options' floors in the samples' units, (y − ref)/scale (-inf where none). */
static void set_floors(mc_acq *a, const mc_options *opt) {
  for (size_t j = 0; j < a->n_obj; j++)
    a->floor[j] = opt->floor && isfinite(opt->floor[j])
                      ? (opt->floor[j] - opt->ref[j]) / gp_scale(a->models.obj[j])
                      : -HUGE_VAL;
}

/* Fb[(s·nb + i)·K + o]: sample s of outcome o at baseline point i. */
static double *baseline_samples(const mc_acq *a) {
  size_t K = a->K, N = a->N, nb = a->nb;
  double *Fb = malloc((N * nb * K + 1) * sizeof *Fb), *row = malloc((nb + 1) * sizeof *row);
  if (!Fb || !row) {
    free(Fb);
    free(row);
    return NULL;
  }
  /* no feasible baseline (nb 0): BLAS refuses its leading dimension 0, on stdout */
  for (size_t o = 0; nb > 0 && o < K; o++)
    for (size_t s = 0; s < N; s++) {
      memcpy(row, a->Zb + (o * N + s) * nb, nb * sizeof *row);
      cblas_dtrmv(CblasRowMajor, CblasLower, CblasNoTrans, CblasNonUnit, (int)nb,
                  a->L + o * nb * nb, (int)nb, row, 1);
      for (size_t i = 0; i < nb; i++)
        Fb[(s * nb + i) * K + o] = a->base[o].mean[i] + a->offset[o] + row[i];
    }
  free(row);
  return Fb;
}

static bool sample_feasible(const mc_acq *a, const double *f) {
  for (size_t o = a->n_obj; o < a->K; o++)
    if (f[o] > 0) return false;
  return true;
}

/* Chebyshev scalarisation of the objective values y (≤ 0 where y dominates the reference
 * point); grad (n_obj) receives ∂/∂y when not NULL. */
static double scalarise(const mc_acq *a, const double *y, double *grad) {
  size_t arg = 0;
  double linear = 0;
  for (size_t j = 0; j < a->n_obj; j++) {
    linear += a->scal[j] * y[j];
    if (a->scal[j] * y[j] > a->scal[arg] * y[arg]) arg = j;
  }
  for (size_t j = 0; grad && j < a->n_obj; j++)
    grad[j] = a->scal[j] * (PAREGO_RHO + (j == arg ? 1.0 : 0.0));
  return a->scal[arg] * y[arg] + PAREGO_RHO * linear;
}

void acq_front_bounds(const double *Y, size_t k, size_t m, bool *on_front, double *low,
                      double *high) {
  pareto_mask(Y, k, m, on_front);
  for (size_t j = 0; j < m; j++) {
    low[j] = k ? HUGE_VAL : NAN;
    high[j] = k ? -HUGE_VAL : NAN;
    for (size_t i = 0; i < k; i++)
      if (on_front[i]) {
        low[j] = fmin(low[j], Y[i * m + j]);
        high[j] = fmax(high[j], Y[i * m + j]);
      }
  }
}

/* Per sample: the boxes of its feasible baseline front (MC_HVI) or its best scalarised
 * value (MC_PAREGO). */
static int summarise_baseline_samples(mc_acq *a, nas_err *err) {
  double *Fb = baseline_samples(a), zero_ref[a->n_obj];
  double *front = malloc((a->nb * a->n_obj + 1) * sizeof *front);
  bool *on_front = malloc(a->nb + 1);
  if (!Fb || !front || !on_front) {
    free(Fb);
    free(front);
    free(on_front);
    return nas_errf(err, "acquisition: out of memory for baseline samples");
  }
  /* the boxes of an inferred coordinate reach out as far as a candidate may move it; the
   * front's bounds are read only where the reference moves (moves_reference) */
  bool moving = false;
  for (size_t j = 0; j < a->n_obj; j++) {
    zero_ref[j] = a->margin[j] > 0 ? HUGE_VAL : 0.0;
    moving = moving || a->margin[j] > 0;
  }
  int rc = NAS_OK;
  for (size_t s = 0; s < a->N && rc == NAS_OK; s++) {
    size_t k = 0;
    a->best[s] = 0; /* the reference point itself */
    for (size_t i = 0; i < a->nb; i++) {
      const double *f = Fb + (s * a->nb + i) * a->K;
      if (!sample_feasible(a, f)) continue;
      memcpy(front + k++ * a->n_obj, f, a->n_obj * sizeof *f);
      if (a->utility == MC_PAREGO) a->best[s] = fmin(a->best[s], scalarise(a, f, NULL));
    }
    if (a->utility != MC_HVI) continue;
    if (moving)
      acq_front_bounds(front, k, a->n_obj, on_front, a->low + s * a->n_obj,
                       a->high + s * a->n_obj);
    a->box_first[s] = a->boxes.n;
    rc = box_decompose(front, k, a->n_obj, zero_ref, &a->boxes, err);
    a->box_count[s] = a->boxes.n - a->box_first[s];
  }
  free(front);
  free(on_front);
  free(Fb);
  return rc;
}

/* mc_options' margins in standardised units; 0 (fixed) where absent, NaN or not positive. */
static void set_margins(mc_acq *a, const mc_options *opt) {
  for (size_t j = 0; j < a->n_obj; j++) {
    double margin = opt->utility == MC_HVI && opt->margin ? opt->margin[j] : 0;
    a->margin[j] = margin > 0 ? margin / gp_scale(a->models.obj[j]) : 0;
  }
}

static void set_scalarisation(mc_acq *a, const mc_options *opt) {
  for (size_t j = 0; j < a->n_obj; j++) {
    double range = opt->utility == MC_PAREGO ? opt->ref[j] - opt->ideal[j] : 0;
    double norm = range > 0 ? gp_scale(a->models.obj[j]) / range : 1.0;
    a->scal[j] = (opt->utility == MC_PAREGO ? opt->weights[j] : 1.0) * norm;
  }
}

int mc_acq_create(const acq_models *models, const double *Xb, size_t nb, const mc_options *opt,
                  mc_acq **out, nas_err *err) {
  if (models->n_obj == 0) return nas_errf(err, "acquisition: no objective to model");
  mc_acq *a = calloc(1, sizeof *a);
  if (!a) return nas_errf(err, "acquisition: out of memory");
  a->models = *models;
  a->utility = opt->utility;
  a->n_obj = models->n_obj;
  a->K = models->n_obj + models->n_con;
  a->nb = nb;
  a->N = opt->n_samples ? opt->n_samples : DEFAULT_SAMPLES;
  a->d = gp_dim(models->obj[0]);
  a->boxes.m = a->n_obj;
  int rc = alloc_arrays(a) == NAS_OK ? NAS_OK : nas_errf(err, "acquisition: out of memory");
  if (rc == NAS_OK) rc = draw_base_samples(a, opt->seed, err);
  if (rc == NAS_OK) rc = make_baselines(a, Xb, err);
  if (rc == NAS_OK) {
    set_offsets(a, opt->ref);
    set_floors(a, opt);
    set_scalarisation(a, opt);
    set_margins(a, opt);
    rc = summarise_baseline_samples(a, err);
  }
  if (rc != NAS_OK) {
    mc_acq_free(a);
    return NAS_ERR;
  }
  *out = a;
  return NAS_OK;
}

/* Outcome o at x: mean, residual sd, l = L⁻¹Σ_Bx, the gradients of the mean and of the sd
 * through σ_x² (the part through l is backpropagate's), then its N samples. */
static void sample_outcome(mc_acq *a, size_t o, const double *x, bool grad) {
  size_t nb = a->nb, d = a->d, N = a->N, K = a->K;
  double *l = a->l + o * nb, *dsd = a->dsd + o * d;
  gp_prediction p = {.dmean = grad ? a->dmean + o * d : NULL,
                     .dvar = grad ? a->dvar : NULL,
                     .cov_b = nb ? l : NULL};
  gp_predict(outcome(a, o), x, &a->base[o], &p, a->work + o * a->work_len);
  const double *L = a->L + o * nb * nb;
  double ll = 0;
  if (nb > 0) {
    sb_lower_solve(nb, 1, L, nb, l, 1);
    ll = sb_dot(nb, l, l);
  }
  double rest = p.var - ll;
  a->sd[o] = sqrt(fmax(rest, MIN_VAR));
  a->mean[o] = p.mean + a->offset[o];
  a->l_coef[o] = rest > MIN_VAR ? -1.0 / a->sd[o] : 0.0;
  for (size_t j = 0; grad && j < d; j++)
    dsd[j] = rest > MIN_VAR ? a->dvar[j] / (2 * a->sd[o]) : 0.0;
  for (size_t s = 0; s < N; s++) a->F[s * K + o] = a->mean[o] + a->sd[o] * a->zx[o * N + s];
  if (nb > 0) sb_mv(N, nb, 1.0, a->Zb + o * N * nb, nb, l, 1.0, a->F + o, K);
  for (size_t s = 0; o < a->n_obj && s < N; s++)
    a->F[s * K + o] = fmax(a->F[s * K + o], a->floor[o]);
}

static bool rows_differ(const double *a, const double *b, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (a[j] != b[j]) return true;
  return false;
}

/* One objective's column of the rows, for qsort_r's comparison of row indices. */
typedef struct {
  const double *Y;
  size_t m, j;
} column_ref;

static int by_column_value(const void *a, const void *b, void *ctx) {
  const column_ref *c = ctx;
  double u = c->Y[*(const size_t *)a * c->m + c->j], v = c->Y[*(const size_t *)b * c->m + c->j];
  return (u > v) - (u < v);
}

/* Whether objective j's value repeats exactly between rows that differ at some value other
 * than best (farther from it than tie, see acq_front_floors): the mark of a metric of few
 * distinct values (a count, an accuracy over a small validation set, rounded readings), whose
 * tie at its best says nothing of a bound. order: k indices of scratch. */
static bool ties_elsewhere(const double *Y, size_t k, size_t m, size_t j, double best,
                           double tie, size_t *order) {
  for (size_t i = 0; i < k; i++) order[i] = i;
  column_ref column = {.Y = Y, .m = m, .j = j};
  qsort_r(order, k, sizeof *order, by_column_value, &column);
  for (size_t i = 1; i < k; i++) {
    const double *before = Y + order[i - 1] * m, *y = Y + order[i] * m;
    if (y[j] == before[j] && y[j] - best > tie && rows_differ(before, y, m)) return true;
  }
  return false;
}

/* Values of an objective within this share of its observed range above its best value count
 * as the best: a bound that the objective's computation reaches in floating point lands on it
 * only up to round-off, differently for each trial (DTLZ2's f1 = (1 + g)·cos(x0·π/2)·… is
 * 6·10⁻¹⁷·(1 + g)·… at x0 = 1, where f2 = (1 + g)·cos(x0·π/2)·sin(x1·π/2) is 0 exactly at
 * x1 = 0), so an exact tie would find the bound of one objective and not of the other. A few
 * units of double precision's round-off at the scale of the range, far below any difference
 * a metric reports on purpose. */
static const double ROUND_OFF_TIE = 8 * DBL_EPSILON;

int acq_front_floors(const double *Y, size_t k, size_t m, const double *low, double *floor,
                     nas_err *err) {
  size_t *order = malloc((k + 1) * sizeof *order);
  if (!order) return nas_errf(err, "out of memory");
  for (size_t j = 0; j < m; j++) {
    floor[j] = NAN;
    double highest = low[j];
    for (size_t i = 0; i < k; i++) highest = fmax(highest, Y[i * m + j]);
    double tie = ROUND_OFF_TIE * fmin(highest - low[j], DBL_MAX);
    const double *first = NULL; /* the first row at the best value */
    for (size_t i = 0; i < k && isnan(floor[j]); i++) {
      const double *y = Y + i * m;
      if (!(y[j] - low[j] <= tie)) continue;
      if (!first) first = y;
      else if (rows_differ(first, y, m)) floor[j] = low[j];
    }
    if (!isnan(floor[j]) && ties_elsewhere(Y, k, m, j, low[j], tie, order)) floor[j] = NAN;
  }
  free(order);
  return NAS_OK;
}

bool acq_trade_off_bounded(const double *f, size_t m, size_t j, const double *low,
                           const double *high, const double *margin) {
  double loss = (f[j] - high[j]) / fmax(high[j] - low[j], margin[j]), gain = 0;
  for (size_t k = 0; k < m; k++)
    if (k != j) gain = fmax(gain, (low[k] - f[k]) / fmax(high[k] - low[k], margin[k]));
  return gain > 0 && loss <= MAX_TRADE_OFF * gain;
}

/* Whether sample s's value f, beyond the reference in objective j, moves it: the trade-off
 * against the sample's front is bounded (acq_trade_off_bounded). */
static bool moves_reference(const mc_acq *a, size_t s, const double *f, size_t j) {
  const double *low = a->low + s * a->n_obj, *high = a->high + s * a->n_obj;
  if (!(f[j] + a->margin[j] > 0)) return false;
  if (isnan(low[j])) return true; /* no front yet: any outcome sets the reference */
  return acq_trade_off_bounded(f, a->n_obj, j, low, high, a->margin);
}

/* Utility of sample s from its values F[s·K ..]; ∂u/∂F into G[s·K ..]. */
static double sample_utility(const mc_acq *a, size_t s, bool grad) {
  const double *f = a->F + s * a->K;
  double *g = grad ? a->G + s * a->K : NULL, u, slope;
  if (a->utility == MC_HVI) {
    double upper[a->n_obj];
    bool moves[a->n_obj];
    for (size_t j = 0; j < a->n_obj; j++) { /* the reference once f is observed */
      moves[j] = a->margin[j] > 0 && moves_reference(a, s, f, j);
      upper[j] = moves[j] ? f[j] + a->margin[j] : 0.0;
    }
    box_cap cap = {.upper = upper, .moves = moves};
    u = box_log_hvi_capped(&a->boxes, a->box_first[s], a->box_count[s], f, &cap, TAU_RELU, g);
  } else {
    double t = a->best[s] - scalarise(a, f, g);
    u = log(0.5 * TAU_RELU) + asinh(t / TAU_RELU);
    for (size_t j = 0; g && j < a->n_obj; j++) g[j] *= -1.0 / hypot(TAU_RELU, t);
  }
  for (size_t o = a->n_obj; o < a->K; o++) {
    u += acq_log_fat_sigmoid(-f[o] / ETA_CON, &slope);
    if (g) g[o] = -slope / ETA_CON;
  }
  return u;
}

/* ∂acq/∂x from G = ∂acq/∂F through F[s·K + o] = mean_o + l_oᵀ z_B[s] + σ_r,o z_x[s], with
 * l = L⁻¹Σ_Bx and σ_r² = σ_x² − lᵀl, in reverse: the adjoint of l, r = Σ_s G_s z_B[s] +
 * (Σ_s G_s z_x[s]) ∂σ_r/∂l, becomes the weights u = L⁻ᵀr of the cross covariances' gradient
 * (gp_cov_b_vjp), so l's Jacobian (nb×d, costing nb·n·d per outcome) is never formed. A
 * sample held at its objective's floor does not move with x. */
static void backpropagate(mc_acq *a, const double *x, double *grad) {
  size_t N = a->N, K = a->K, nb = a->nb, d = a->d;
  memset(grad, 0, d * sizeof *grad);
  for (size_t s = 0; s < N; s++)
    for (size_t o = 0; o < a->n_obj; o++)
      if (a->F[s * K + o] <= a->floor[o]) a->G[s * K + o] = 0;
  for (size_t o = 0; o < K; o++) {
    double gsum = 0, gz = 0;
    for (size_t s = 0; s < N; s++) {
      gsum += a->G[s * K + o];
      gz += a->G[s * K + o] * a->zx[o * N + s];
    }
    for (size_t j = 0; j < d; j++)
      grad[j] += gsum * a->dmean[o * d + j] + gz * a->dsd[o * d + j];
    if (nb == 0) continue;
    double *r = a->tmp;
    const double *l = a->l + o * nb;
    sb_mtv(N, nb, 1.0, a->Zb + o * N * nb, nb, a->G + o, K, 0.0, r);
    for (size_t i = 0; i < nb; i++) r[i] += gz * a->l_coef[o] * l[i];
    sb_lower_transpose_solve(nb, a->L + o * nb * nb, nb, r);
    gp_cov_b_vjp(outcome(a, o), x, &a->base[o], r, a->work + o * a->work_len, a->vjp, grad);
  }
}

double mc_acq_eval(void *ctx, const double *x, double *grad) {
  mc_acq *a = ctx;
  size_t N = a->N, K = a->K;
  for (size_t o = 0; o < K; o++) sample_outcome(a, o, x, grad != NULL);
  double max = -HUGE_VAL;
  for (size_t s = 0; s < N; s++) {
    a->u[s] = sample_utility(a, s, grad != NULL);
    max = fmax(max, a->u[s]);
  }
  if (!isfinite(max)) {
    if (grad) memset(grad, 0, a->d * sizeof *grad);
    return max;
  }
  double sum = 0;
  for (size_t s = 0; s < N; s++) sum += exp(a->u[s] - max);
  if (grad) {
    for (size_t s = 0; s < N; s++) {
      double w = exp(a->u[s] - max) / sum; /* ∂ logmeanexp/∂u_s */
      for (size_t o = 0; o < K; o++) a->G[s * K + o] *= w;
    }
    backpropagate(a, x, grad);
  }
  return max + log(sum / (double)N);
}

/* ---- a posterior draw ------------------------------------------------------------------ */

/* n_draws generators, draw t's seeded with seed + t. */
static gsl_rng **draw_rngs(size_t n_draws, uint64_t seed) {
  gsl_rng **rngs = calloc(n_draws + 1, sizeof *rngs);
  for (size_t t = 0; rngs && t < n_draws; t++) {
    if (!(rngs[t] = gsl_rng_alloc(gsl_rng_mt19937))) {
      for (size_t u = 0; u < t; u++) gsl_rng_free(rngs[u]);
      free(rngs);
      return NULL;
    }
    gsl_rng_set(rngs[t], (unsigned long)(seed + t));
  }
  return rngs;
}

int acq_posterior_draw(const acq_models *models, const double *X, size_t n, size_t n_draws,
                       uint64_t seed, double *F, nas_err *err) {
  size_t K = models->n_obj + models->n_con;
  gsl_rng **rngs = draw_rngs(n_draws, seed);
  double *Z = malloc((n * n_draws + 1) * sizeof *Z); /* n×n_draws: column t is draw t's */
  int rc = rngs && Z ? NAS_OK : nas_errf(err, "acquisition: out of memory for a posterior draw");
  for (size_t o = 0; rc == NAS_OK && o < K; o++) {
    const gp *g = o < models->n_obj ? models->obj[o] : models->con[o - models->n_obj];
    gp_baseline b;
    rc = gp_baseline_make(g, X, n, &b, err);
    if (rc == NAS_OK && covariance_factor(b.cov, n, err) != NAS_OK)
      rc = outcome_failed(models, o, "posterior draw", err);
    for (size_t t = 0; rc == NAS_OK && t < n_draws; t++)
      for (size_t i = 0; i < n; i++) Z[i * n_draws + t] = gsl_ran_gaussian_ziggurat(rngs[t], 1.0);
    if (rc == NAS_OK && n > 0 && n_draws > 0)
      cblas_dtrmm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, (int)n,
                  (int)n_draws, 1.0, b.cov, (int)n, Z, (int)n_draws);
    for (size_t t = 0; rc == NAS_OK && t < n_draws; t++)
      for (size_t i = 0; i < n; i++)
        F[(t * n + i) * K + o] = gp_shift(g) + gp_scale(g) * (b.mean[i] + Z[i * n_draws + t]);
    gp_baseline_clear(&b);
  }
  for (size_t t = 0; rngs && t < n_draws; t++) gsl_rng_free(rngs[t]);
  free(rngs);
  free(Z);
  return rc;
}

/* ---- baseline pruning ------------------------------------------------------------------- */

typedef struct {
  double mean, sd;
} marginal;

static int marginals(const acq_models *m, const double *X, size_t n, marginal *out,
                     nas_err *err) {
  size_t K = m->n_obj + m->n_con, work = 0;
  for (size_t o = 0; o < K; o++) {
    const gp *g = o < m->n_obj ? m->obj[o] : m->con[o - m->n_obj];
    if (gp_work_len(g) > work) work = gp_work_len(g);
  }
  double *w = malloc(work * sizeof *w);
  if (!w) return nas_errf(err, "acquisition: out of memory");
  for (size_t i = 0; i < n; i++)
    for (size_t o = 0; o < K; o++) {
      const gp *g = o < m->n_obj ? m->obj[o] : m->con[o - m->n_obj];
      gp_prediction p = {0};
      gp_predict(g, X + i * gp_dim(g), NULL, &p, w);
      /* slack units for constraints: ≤ 0 feasible */
      out[i * K + o] = (marginal){gp_shift(g) + gp_scale(g) * p.mean, gp_scale(g) * sqrt(p.var)};
    }
  free(w);
  return NAS_OK;
}

/* Whether j beats i in every objective by more than two standard deviations on each side. */
static bool surely_dominates(const marginal *j, const marginal *i, size_t n_obj) {
  for (size_t o = 0; o < n_obj; o++)
    if (!(j[o].mean + 2 * j[o].sd < i[o].mean - 2 * i[o].sd)) return false;
  return true;
}

static bool mean_dominates(const marginal *j, const marginal *i, size_t n_obj) {
  bool strict = false;
  for (size_t o = 0; o < n_obj; o++) {
    if (j[o].mean > i[o].mean) return false;
    strict = strict || j[o].mean < i[o].mean;
  }
  return strict;
}

static bool surely_infeasible(const marginal *i, size_t n_obj, size_t K) {
  for (size_t o = n_obj; o < K; o++)
    if (i[o].mean - 2 * i[o].sd > 0) return true;
  return false;
}

/* Keeps the cap entries of keep[0..kept) dominated by the fewest points in posterior mean
 * (ties to the earlier point), in their order. */
static size_t keep_least_dominated(size_t *keep, size_t kept, const size_t *beaten, size_t cap) {
  if (kept <= cap) return kept;
  size_t limit = 0, at_most = 0, below = 0;
  for (;; limit++) {
    at_most = 0;
    for (size_t r = 0; r < kept; r++) at_most += beaten[keep[r]] <= limit;
    if (at_most >= cap) break;
    below = at_most;
  }
  size_t room = cap - below, w = 0;
  for (size_t r = 0; r < kept; r++) {
    size_t b = beaten[keep[r]];
    if (b < limit || (b == limit && room > 0)) {
      room -= b == limit;
      keep[w++] = keep[r];
    }
  }
  return w;
}

int acq_prune_baseline(const acq_models *models, const double *X, size_t n, size_t cap,
                       size_t *keep, size_t *n_keep, nas_err *err) {
  size_t K = models->n_obj + models->n_con, kept = 0;
  marginal *mg = malloc((n * K + 1) * sizeof *mg);
  size_t *beaten = malloc((n + 1) * sizeof *beaten); /* points dominating it in mean */
  if (!mg || !beaten || marginals(models, X, n, mg, err) != NAS_OK) {
    free(mg);
    free(beaten);
    return nas_errf(err, "acquisition: cannot prune the baseline");
  }
  for (size_t i = 0; i < n; i++) {
    bool drop = surely_infeasible(mg + i * K, models->n_obj, K);
    beaten[i] = 0;
    for (size_t j = 0; j < n && !drop; j++) {
      drop = surely_dominates(mg + j * K, mg + i * K, models->n_obj);
      beaten[i] += mean_dominates(mg + j * K, mg + i * K, models->n_obj);
    }
    if (!drop) keep[kept++] = i;
  }
  kept = keep_least_dominated(keep, kept, beaten, cap);
  free(mg);
  free(beaten);
  *n_keep = kept;
  return NAS_OK;
}
