/* optimizer/gp_fit.c: fitting a GP's hyperparameters by maximum a posteriori (see gp.h).
 *
 * The objective is the log marginal likelihood of the standardised outcomes plus the log
 * densities of the priors (gp.h), with its analytic gradient:
 *   log p(y|θ) = −½ rᵀα − ½ log|K| − (n/2) log 2π,  r = y − c,  α = K⁻¹r,
 *   K = s·(k(X, X) + r I) (known noise: its variance on those diagonal entries instead),
 *   ∂/∂θ_i = ½ tr((ααᵀ − K⁻¹) ∂K/∂θ_i),  ∂/∂c = Σ α.
 * It is maximised by NLopt's bound-constrained L-BFGS from the prior's mode, from
 * `restarts` further starts drawn around it and from the mode with the noise at its floor
 * (low_noise_start); the best θ ever evaluated wins, so a start that stops early
 * (round-off, evaluation limit) still contributes what it found. With worst_mean the
 * constant mean is held at the largest standardised outcome measured in units of the
 * prior's standard deviation √s, c = worst·√s (held_mean), and the lengthscales, the noise
 * and s move, unless the data reject that mean (held_mean_rejected): then the fit with the
 * mean free stands.
 *
 * Each evaluation's O(n²d) parts, the pairs' distances and the lengthscale gradient, are
 * BLAS-3 products over the inputs scaled by the lengthscales (kernel_and_slopes,
 * lengthscale_gradient) rather than sums over pairs and dimensions: in wide spaces (20-60
 * parameters, a cube of 65 dimensions with categoricals) those sums were most of a fit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_cblas.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_linalg.h>
#include <gsl/gsl_randist.h>
#include <nlopt.h>

#include "optimizer/gp.h"

static const double SQRT2 = 1.41421356237309504880;
static const double SQRT3 = 1.73205080756887729353;
static const double LOG_2PI = 1.83787706640934548356;
static const double MIN_LENGTHSCALE = 0.025, MAX_LENGTHSCALE = 1e3;
static const double MIN_NOISE = 1e-5, MAX_NOISE = 10.0;
static const double NOISE_PRIOR_LOC = -4.0, NOISE_PRIOR_SCALE = 1.0;
static const double MIN_OUTPUTSCALE = 1e-3, MAX_OUTPUTSCALE = 1e4;
static const double OUTPUTSCALE_PRIOR_SHAPE = 2.0, OUTPUTSCALE_PRIOR_RATE = 0.15;
static const double MEAN_BOUND = 10.0;
/* Half the (1 − 10⁻⁴) quantile of χ² with one degree of freedom: held_mean_rejected's
 * likelihood-ratio test (one parameter, the mean, freed) at 1% over the hundred or so tests
 * a run makes (every objective at every suggestion; Bonferroni). */
static const double HELD_MEAN_REJECT_HALF_CHI2 = 15.137 / 2;

static double lengthscale_prior_loc(size_t d) { return SQRT2 + 0.5 * log((double)d); }

/* log LogNormal(v; loc, scale) at log v = u, and its derivative in u. The density is the
 * one of v itself (with its −log v term), as gpytorch evaluates priors: this is what makes
 * BoTorch's MAP lengthscales sit near exp(loc − scale²) rather than exp(loc). */
static double log_lognormal(double u, double loc, double scale, double *d_du) {
  double z = (u - loc) / scale;
  if (d_du) *d_du = -1.0 - z / scale;
  return -u - log(scale) - 0.5 * LOG_2PI - 0.5 * z * z;
}

/* log Gamma(v; shape, rate) at log v = u, up to a constant (0 at v = 1), and its derivative
 * in u: the density of v itself (no Jacobian of the log), as gpytorch evaluates priors. */
static double log_gamma_density(double u, double shape, double rate, double *d_du) {
  if (d_du) *d_du = (shape - 1.0) - rate * exp(u);
  return (shape - 1.0) * u - rate * (exp(u) - 1.0);
}

void gp_theta_bounds(size_t d, double *lower, double *upper) {
  for (size_t k = 0; k < d; k++) {
    lower[k] = log(MIN_LENGTHSCALE);
    upper[k] = log(MAX_LENGTHSCALE);
  }
  lower[GP_THETA_NOISE(d)] = log(MIN_NOISE);
  upper[GP_THETA_NOISE(d)] = log(MAX_NOISE);
  lower[GP_THETA_MEAN(d)] = -MEAN_BOUND;
  upper[GP_THETA_MEAN(d)] = MEAN_BOUND;
  lower[GP_THETA_SCALE(d)] = log(MIN_OUTPUTSCALE);
  upper[GP_THETA_SCALE(d)] = log(MAX_OUTPUTSCALE);
}

/* The noise prior's mode, as θ's noise entry (log noise/s) at a log outputscale. */
static double noise_mode_at(double log_outputscale) {
  return NOISE_PRIOR_LOC - NOISE_PRIOR_SCALE * NOISE_PRIOR_SCALE - log_outputscale;
}

void gp_theta_prior_mode(size_t d, double *theta) {
  for (size_t k = 0; k < d; k++) theta[k] = lengthscale_prior_loc(d) - SQRT3 * SQRT3;
  theta[GP_THETA_MEAN(d)] = 0.0;
  theta[GP_THETA_SCALE(d)] = log((OUTPUTSCALE_PRIOR_SHAPE - 1.0) / OUTPUTSCALE_PRIOR_RATE);
  theta[GP_THETA_NOISE(d)] = noise_mode_at(theta[GP_THETA_SCALE(d)]);
}

double gp_log_prior(size_t d, const double *theta, double *grad) {
  double du, lp = log_gamma_density(theta[GP_THETA_SCALE(d)], OUTPUTSCALE_PRIOR_SHAPE,
                                    OUTPUTSCALE_PRIOR_RATE, &du);
  if (grad) grad[GP_THETA_SCALE(d)] += du;
  for (size_t k = 0; k < d; k++) {
    lp += log_lognormal(theta[k], lengthscale_prior_loc(d), SQRT3, &du);
    if (grad) grad[k] += du;
  }
  size_t in = GP_THETA_NOISE(d), is = GP_THETA_SCALE(d); /* the noise is e^(θ_in + θ_is) */
  lp += log_lognormal(theta[in] + theta[is], NOISE_PRIOR_LOC, NOISE_PRIOR_SCALE, &du);
  if (grad) {
    grad[in] += du;
    grad[is] += du;
  }
  return lp;
}

typedef struct {
  double *K, *G, *alpha;
  double *copy; /* n×n room for gp_cholesky_with */
  double *Xc;   /* n×d: the inputs less their column means (distances are the same) */
  double *Xs;   /* n×d: Xc over the lengthscales; then M·Xc (lengthscale_gradient) */
  double *q;    /* n: squared norms of Xs's rows; then M's row sums */
} lml_work;

/* The lda of an n×d row-major matrix for BLAS (at least 1). */
static int lda_of(size_t d) { return d > 0 ? (int)d : 1; }

/* K = s·k(X, X) (with noise on the diagonal, gp_noise_at) and the slopes G_ij = s·g(r²_ij)
 * of its entries (G's diagonal 0). The scaled squared distances come from one BLAS-3
 * product: with s_i = x_i/ℓ (centred), r²_ij = |s_i|² + |s_j|² − 2 s_i·s_j, where summing
 * Σ_k (x_ik − x_jk)²/ℓ_k² pair by pair costs n²d/2 scalar operations per evaluation of the
 * log posterior (in a 65-d space most of a fit's time). Round-off can leave the distance of
 * two very close points slightly negative: clamped at 0. */
static void kernel_and_slopes(gp_kernel kind, size_t n, size_t d, const double *inv_ls,
                              const double *known, double noise, double outputscale,
                              lml_work *w) {
  double *K = w->K, *G = w->G, *q = w->q;
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < d; k++) w->Xs[i * d + k] = w->Xc[i * d + k] * inv_ls[k];
  cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)n, (int)d, 1.0, w->Xs, lda_of(d),
              0.0, K, (int)n);
  for (size_t i = 0; i < n; i++) q[i] = K[i * n + i];
  for (size_t i = 0; i < n; i++) {
    K[i * n + i] = outputscale + gp_noise_at(known, i, noise);
    G[i * n + i] = 0.0;
    for (size_t j = 0; j < i; j++) {
      double r2 = fmax(q[i] + q[j] - 2.0 * K[i * n + j], 0.0);
      K[i * n + j] = outputscale * gp_kernel_eval(kind, r2, &G[i * n + j]);
      G[i * n + j] *= outputscale;
      K[j * n + i] = K[i * n + j];
    }
  }
}

/* ∂/∂log ℓ_k = ½ Σ_ij M_ij Δ²_ijk/ℓ_k² with M = W∘G (W = ααᵀ − K⁻¹, passed as kinv and
 * alpha; M's diagonal is 0), which expands to (Σ_i m_i x_ik² − Σ_i x_ik (M X)_ik)/ℓ_k², m_i
 * M's row sums: one BLAS-3 product (dsymm) where summing the pairs costs n²d/2. G's lower
 * triangle becomes M. */
static void lengthscale_gradient(size_t n, size_t d, const double *inv_ls, const double *kinv,
                                 const double *alpha, lml_work *w, double *grad) {
  double *M = w->G, *m = w->q, *MX = w->Xs;
  for (size_t i = 0; i < n; i++) m[i] = 0.0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < i; j++) {
      M[i * n + j] *= alpha[i] * alpha[j] - kinv[i * n + j];
      m[i] += M[i * n + j];
      m[j] += M[i * n + j];
    }
  cblas_dsymm(CblasRowMajor, CblasLeft, CblasLower, (int)n, (int)d, 1.0, M, (int)n, w->Xc,
              lda_of(d), 0.0, MX, lda_of(d));
  for (size_t k = 0; k < d; k++) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
      double x = w->Xc[i * d + k];
      sum += x * (m[i] * x - MX[i * d + k]);
    }
    grad[k] = sum * inv_ls[k] * inv_ls[k];
  }
}

/* The kernel's part of ∂/∂log s: ½ Σ_ij W_ij s·k_ij (s on the diagonal), W = ααᵀ − K⁻¹;
 * w->K holds K⁻¹, w->copy K itself. */
static double outputscale_gradient(size_t n, double outputscale, const lml_work *w) {
  double grad = 0;
  for (size_t i = 0; i < n; i++) {
    grad += 0.5 * outputscale * (w->alpha[i] * w->alpha[i] - w->K[i * n + i]);
    for (size_t j = 0; j < i; j++)
      grad += (w->alpha[i] * w->alpha[j] - w->K[i * n + j]) * w->copy[i * n + j];
  }
  return grad;
}

/* w holds the inputs (lml_work_alloc). */
static double lml_with_work(gp_kernel kind, const double *y, const double *known, size_t n,
                            size_t d, const double *theta, double *grad, lml_work *w,
                            nas_err *err) {
  double inv_ls[d > 0 ? d : 1];
  for (size_t k = 0; k < d; k++) inv_ls[k] = exp(-theta[k]);
  double noise = exp(theta[GP_THETA_NOISE(d)] + theta[GP_THETA_SCALE(d)]);
  double c = theta[GP_THETA_MEAN(d)], outputscale = exp(theta[GP_THETA_SCALE(d)]);
  kernel_and_slopes(kind, n, d, inv_ls, known, noise, outputscale, w);
  /* w->copy keeps K for the outputscale's gradient */
  if (gp_cholesky_with(w->K, n, w->copy, NULL, err) != NAS_OK) return -HUGE_VAL;
  double logdet = 0;
  for (size_t i = 0; i < n; i++) logdet += 2.0 * log(w->K[i * n + i]);
  for (size_t i = 0; i < n; i++) w->alpha[i] = y[i] - c;
  double quad = 0;
  gsl_vector_view alpha = gsl_vector_view_array(w->alpha, n);
  gsl_matrix_view L = gsl_matrix_view_array(w->K, n, n);
  gsl_linalg_cholesky_svx(&L.matrix, &alpha.vector);
  for (size_t i = 0; i < n; i++) quad += (y[i] - c) * w->alpha[i];
  double value = -0.5 * quad - 0.5 * logdet - 0.5 * (double)n * LOG_2PI;
  if (grad) {
    memset(grad, 0, GP_THETA_LEN(d) * sizeof *grad);
    gsl_linalg_cholesky_invert(&L.matrix); /* w->K now holds K⁻¹ */
    double trace_w = 0, sum_alpha = 0; /* trace over the points with the fitted noise */
    for (size_t i = 0; i < n; i++) {
      if (!known || isnan(known[i])) trace_w += w->alpha[i] * w->alpha[i] - w->K[i * n + i];
      sum_alpha += w->alpha[i];
    }
    lengthscale_gradient(n, d, inv_ls, w->K, w->alpha, w, grad);
    grad[GP_THETA_NOISE(d)] = 0.5 * noise * trace_w;
    grad[GP_THETA_MEAN(d)] = sum_alpha;
    /* s scales the fitted noise too */
    grad[GP_THETA_SCALE(d)] = outputscale_gradient(n, outputscale, w) + grad[GP_THETA_NOISE(d)];
  }
  return value + gp_log_prior(d, theta, grad);
}

/* Scratch for the log posterior at the n×d inputs X (kept centred in it). */
static int lml_work_alloc(const double *X, size_t n, size_t d, lml_work *w) {
  w->K = malloc(n * n * sizeof *w->K);
  w->G = malloc(n * n * sizeof *w->G);
  w->alpha = malloc(n * sizeof *w->alpha);
  w->copy = malloc(n * n * sizeof *w->copy);
  w->Xc = malloc((n * d + 1) * sizeof *w->Xc);
  w->Xs = malloc((n * d + 1) * sizeof *w->Xs);
  w->q = malloc(n * sizeof *w->q);
  if (!w->K || !w->G || !w->alpha || !w->copy || !w->Xc || !w->Xs || !w->q) return NAS_ERR;
  for (size_t k = 0; k < d; k++) {
    double mean = 0;
    for (size_t i = 0; i < n; i++) mean += X[i * d + k] / (double)n;
    for (size_t i = 0; i < n; i++) w->Xc[i * d + k] = X[i * d + k] - mean;
  }
  return NAS_OK;
}

static void lml_work_free(lml_work *w) {
  free(w->K);
  free(w->G);
  free(w->alpha);
  free(w->copy);
  free(w->Xc);
  free(w->Xs);
  free(w->q);
}

double gp_log_posterior(gp_kernel kind, const double *X, const double *y, const double *known,
                        size_t n, size_t d, const double *theta, double *grad, nas_err *err) {
  lml_work w;
  double value = -HUGE_VAL;
  if (lml_work_alloc(X, n, d, &w) == NAS_OK)
    value = lml_with_work(kind, y, known, n, d, theta, grad, &w, err);
  else
    nas_errf(err, "gp: out of memory for %zu observations", n);
  lml_work_free(&w);
  return value;
}

/* What NLopt's callback needs, and the best point it has seen. */
typedef struct {
  gp_kernel kind;
  const double *y;
  const double *known; /* standardised known noise variances, or NULL */
  size_t n, d;
  lml_work work;
  double lower_mean, upper_mean; /* bounds of the constant mean (equal when it is held) */
  /* NaN, or the held mean in units of the prior's standard deviation: then full's mean (θ
   * as the log posterior reads it) is held_mean·√s, and NLopt's mean entry stays put. */
  double held_mean;
  double *full;
  double best_value;
  double *best_theta;
  optimizer_cancel *cancel; /* may be NULL */
  nlopt_opt nl;             /* the optimiser running, to stop it when cancelled */
} fit_problem;

static double fit_objective(unsigned len, const double *theta, double *grad, void *data) {
  fit_problem *p = data;
  if (optimizer_cancelled(p->cancel)) {
    nlopt_force_stop(p->nl);
    if (grad) memset(grad, 0, len * sizeof *grad);
    return -1e300;
  }
  size_t full_len = GP_THETA_LEN(p->d), im = GP_THETA_MEAN(p->d), is = GP_THETA_SCALE(p->d);
  double full_grad[full_len];
  memcpy(p->full, theta, len * sizeof *theta);
  bool held = !isnan(p->held_mean);
  if (held) p->full[im] = p->held_mean * exp(0.5 * p->full[is]);
  double value = lml_with_work(p->kind, p->y, p->known, p->n, p->d, p->full,
                               grad ? full_grad : NULL, &p->work, NULL);
  if (!isfinite(value)) {
    if (grad) memset(grad, 0, len * sizeof *grad);
    return -1e300; /* unfactorisable: worse than anything, so the line search backs off */
  }
  if (grad && held) { /* the held mean moves with s: ∂c/∂log s = c/2 */
    full_grad[is] += full_grad[im] * 0.5 * p->full[im];
    full_grad[im] = 0.0;
  }
  if (grad) memcpy(grad, full_grad, len * sizeof *grad);
  if (value > p->best_value) {
    p->best_value = value;
    memcpy(p->best_theta, p->full, full_len * sizeof *theta);
  }
  return value;
}

/* Start number `start`: the prior's mode, then points drawn around it (every entry of θ
 * but the mean); the mean within its bounds. */
static void fit_start(size_t d, int start, gsl_rng *rng, const double *lower,
                      const double *upper, double *theta) {
  gp_theta_prior_mode(d, theta);
  size_t im = GP_THETA_MEAN(d);
  theta[im] = fmin(fmax(theta[im], lower[im]), upper[im]);
  if (start == 0) return;
  for (size_t i = 0; i < GP_THETA_LEN(d); i++) {
    if (i == im) continue;
    theta[i] += gsl_ran_gaussian(rng, 1.0);
    theta[i] = fmin(fmax(theta[i], lower[i]), upper[i]);
  }
}

/* The last start: the prior's mode with the noise at its lower bound. On noise-free data
 * with structure finer than the bulk of the data's variation, the log posterior has two
 * basins: the structure called noise (long lengthscales, noise well above the floor) and
 * the data interpolated (shorter lengthscales, noise at the floor). From the prior's mode
 * (noise e⁻⁵) and the draws around it the climb often ends in the first even where the
 * second is higher: DTLZ7's f2 (30 observations, 12 on the front's subspace) fitted noise
 * 0.005 and lengthscale 5.4 along the front, log posterior −2.6, where noise 3·10⁻⁴ and
 * lengthscale 0.9 reach +0.6; with the front's shape taken for noise (sd 0.4 on a front
 * spanning 2.3 to 4) the model could not find the far piece's tip (bench/RESULTS.md). The
 * start draws nothing from rng, and the best point seen wins, so a fit whose other starts
 * do better is unchanged. */
static void low_noise_start(size_t d, const double *lower, const double *upper,
                            double *theta) {
  fit_start(d, 0, NULL, lower, upper, theta); /* start 0 draws nothing */
  theta[GP_THETA_NOISE(d)] = lower[GP_THETA_NOISE(d)];
}

/* The NLopt runs from each start (fit_start's, then low_noise_start). Out of memory is an
 * error, not a worse fit: a fit must not depend on how much memory there was, or a resumed
 * experiment would not continue as the uninterrupted one. */
static int fit_runs(fit_problem *p, const gp_fit_options *opt, gsl_rng *rng, nas_err *err) {
  size_t full_len = GP_THETA_LEN(p->d);
  double lower[full_len], upper[full_len], theta[full_len], full[full_len];
  gp_theta_bounds(p->d, lower, upper);
  lower[GP_THETA_MEAN(p->d)] = p->lower_mean;
  upper[GP_THETA_MEAN(p->d)] = p->upper_mean;
  p->full = full;
  nlopt_opt nl = nlopt_create(NLOPT_LD_LBFGS, (unsigned)full_len);
  if (!nl) return nas_errf(err, "gp: out of memory fitting %zu observations", p->n);
  int rc = NAS_OK;
  nlopt_set_lower_bounds(nl, lower);
  nlopt_set_upper_bounds(nl, upper);
  p->nl = nl;
  nlopt_set_max_objective(nl, fit_objective, p);
  nlopt_set_maxeval(nl, opt->max_evals > 0 ? opt->max_evals : 200);
  nlopt_set_ftol_rel(nl, 1e-7);
  int last = opt->restarts + 1; /* low_noise_start */
  for (int start = 0; rc == NAS_OK && start <= last && !optimizer_cancelled(p->cancel); start++) {
    if (start <= opt->restarts) fit_start(p->d, start, rng, lower, upper, theta);
    else low_noise_start(p->d, lower, upper, theta);
    memcpy(full, theta, full_len * sizeof *full);
    double value;
    /* Whatever else it returns, best_theta holds the best point seen. */
    nlopt_result result = nlopt_optimize(nl, theta, &value);
    if (result == NLOPT_OUT_OF_MEMORY)
      rc = nas_errf(err, "gp: out of memory fitting %zu observations", p->n);
  }
  nlopt_destroy(nl);
  p->full = NULL;
  return rc;
}

/* The constant mean's bounds, the general box, or with worst_mean the mean held (NLopt's
 * entry closed on the worst outcome, held_mean). The worst outcome is held in units of the
 * prior's standard deviation √s: the prior then puts unexplored regions as many of its
 * standard deviations above the data's mean as the worst value lies sample standard
 * deviations above it, whatever s the fit takes. Held at the worst standardised value
 * itself, a fitted s (2 to 7 on DTLZ2, d = 6, M = 2) brought the held mean within about one
 * prior standard deviation of the data's mean, more optimism about unexplored regions than
 * the rule was measured with (s = 1), and DTLZ2 lost (log10 HV gap over 20 seeds −1.06 /
 * −0.92 against −1.13 / −0.99 at q = 1 / 4); held in units of √s it gains there (−1.18 /
 * −1.07) and on C2-DTLZ2 (d = 4; −1.76 against −1.69 over 30 seeds; bench/RESULTS.md,
 * issue 22's thirteenth round). */
static void set_mean_bounds(fit_problem *p, const double *ystd, bool worst_mean) {
  double lower[GP_THETA_LEN(p->d)], upper[GP_THETA_LEN(p->d)], worst = -HUGE_VAL;
  gp_theta_bounds(p->d, lower, upper);
  p->lower_mean = lower[GP_THETA_MEAN(p->d)];
  p->upper_mean = upper[GP_THETA_MEAN(p->d)];
  p->held_mean = NAN;
  if (!worst_mean) return;
  for (size_t i = 0; i < p->n; i++) worst = fmax(worst, ystd[i]);
  p->held_mean = p->lower_mean = p->upper_mean =
      fmin(fmax(worst, p->lower_mean), p->upper_mean);
}

/* fit_runs from the prior's mode, the mean held (worst_mean) or free. */
static int fit_from_mode(fit_problem *p, const gp_fit_options *opt, const double *ystd,
                         bool worst_mean, gsl_rng *rng, nas_err *err) {
  set_mean_bounds(p, ystd, worst_mean);
  gp_theta_prior_mode(p->d, p->best_theta);
  p->best_theta[GP_THETA_MEAN(p->d)] = fmin(fmax(0.0, p->lower_mean), p->upper_mean);
  p->best_value = -HUGE_VAL;
  return fit_runs(p, opt, rng, err);
}

/* Whether the data reject the mean held at the worst value: the best log posterior with the
 * mean free exceeds the held one's by more than the likelihood-ratio test allows. Held far
 * above data that vary on a fine scale (DTLZ7's f2: observations from 2.3 to beyond 30, the
 * tip of its front's far piece a narrow minimum), the fit explains the offset with long
 * lengthscales and the model cannot resolve the tip; there the log posteriors differ by 9
 * to 18 from 35 observations on, on DTLZ2 by 7 at most (bench/RESULTS.md). */
static bool held_mean_rejected(double held_value, double free_value) {
  return free_value - held_value > HELD_MEAN_REJECT_HALF_CHI2;
}

/* The fit under opt's mean rule into p->best_theta. The free fit draws its starts from a
 * copy of rng, so that where the test keeps the held mean, rng (and so every later fit)
 * is where the held fit alone leaves it. */
static int fit_mean_rule(fit_problem *p, const gp_fit_options *opt, const double *ystd,
                         gsl_rng *rng, nas_err *err) {
  gsl_rng *free_rng = opt->worst_mean ? gsl_rng_clone(rng) : NULL;
  if (opt->worst_mean && !free_rng) return nas_errf(err, "gp: out of memory for a fit");
  int rc = fit_from_mode(p, opt, ystd, opt->worst_mean, rng, err);
  size_t len = GP_THETA_LEN(p->d);
  double held_value = p->best_value, held[len];
  memcpy(held, p->best_theta, len * sizeof *held);
  if (rc == NAS_OK && free_rng) rc = fit_from_mode(p, opt, ystd, false, free_rng, err);
  if (rc == NAS_OK && free_rng && !held_mean_rejected(held_value, p->best_value))
    memcpy(p->best_theta, held, len * sizeof *held);
  gsl_rng_free(free_rng);
  return rc;
}

int gp_fit(const double *X, const double *y, size_t n, size_t d, const gp_fit_options *opt,
           gsl_rng *rng, gp **out, nas_err *err) {
  if (n == 0) return nas_errf(err, "gp: no observations to fit");
  size_t len = GP_THETA_LEN(d);
  fit_problem p = {.kind = opt->kernel, .n = n, .d = d, .best_value = -HUGE_VAL,
                   .held_mean = NAN, .cancel = opt->cancel};
  double *ystd = malloc(n * sizeof *ystd);
  double *known = opt->noise_var ? malloc(n * sizeof *known) : NULL;
  p.best_theta = malloc(len * sizeof *p.best_theta);
  int rc = NAS_ERR;
  if (!ystd || (opt->noise_var && !known) || !p.best_theta ||
      lml_work_alloc(X, n, d, &p.work) != NAS_OK) {
    nas_errf(err, "gp: out of memory fitting %zu observations", n);
    goto done;
  }
  double shift, scale; /* the same standardisation gp_create will make */
  gp_standardise(y, n, ystd, &shift, &scale);
  if (known) gp_standardise_noise(opt->noise_var, n, scale, known);
  p.known = known;
  p.y = ystd;
  rc = fit_mean_rule(&p, opt, ystd, rng, err);
  if (rc == NAS_OK && optimizer_cancelled(p.cancel))
    rc = nas_errc(err, NAS_ECANCELED, "gp: fitting given up on request");
  if (rc == NAS_OK)
    rc = gp_create_noisy(opt->kernel, X, y, opt->noise_var, n, d, p.best_theta, out, err);
done:
  lml_work_free(&p.work);
  free(known);
  free(ystd);
  free(p.best_theta);
  return rc;
}
