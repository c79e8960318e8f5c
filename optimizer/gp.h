/* optimizer/gp.h: exact Gaussian-process regression of one outcome over the unit cube
 * (internal to optimizer/; used by the acquisition functions and the gp backend).
 *
 * Model: outcome = shift + sd · (c + f(x) + ε), where shift/sd standardise the observed
 * values (mean 0, sample variance 1), c is a constant mean, f ~ GP(0, s·k) with an ARD
 * kernel k of unit variance (RBF or Matérn-5/2) and an outputscale s, and ε ~ N(0, noise),
 * or, at an observation whose noise is known (a reported standard error, a declared noise),
 * N(0, its variance) (fixed, heteroskedastic noise: BoTorch's FixedNoiseGP). θ and the fit
 * work on the standardised scale. A gp keeps the model as the unit-variance GP of the
 * standardised outcomes divided by √s (noise/s, mean c/√s), so its "model units", in which
 * gp_predict and gp_baseline_make answer, are sd·√s (gp_scale).
 *
 * Hyperparameters θ (GP_THETA_LEN(d) values): log lengthscales (d), log(noise/s), constant
 * mean, log outputscale. They are fitted by maximum a posteriori with the priors of
 * BoTorch's current defaults (Hvarfner et al. 2024): lengthscale ~ LogNormal(√2 + log(d)/2,
 * √3), lengthscale ≥ 0.025, noise ~ LogNormal(−4, 1), noise ≥ 1e-5·s (a floor on the
 * noise-to-signal ratio: with the floor on the noise alone, a smooth 2-d function seen at 100
 * points fitted s = 37 and the posterior covariance of the acquisition's baseline could not
 * be factorised even with jitter; BoTorch's 1e-4, a noise sd of 1% of the prior's, smoothed
 * noise-free objectives over differences of 0.1% of their spread, which decide where a narrow
 * minimum is pinned: DTLZ7's far tip, bench/RESULTS.md, issue 22's fourteenth round), and
 * the outputscale prior of its earlier ScaleKernel,
 * s ~ Gamma(2, rate 0.15), 10⁻³ ≤ s ≤ 10⁴. Hvarfner et al. hold s = 1 on standardised outcomes; a fitted s (its prior's mode 6.7: a function that
 * may range wider than the data seen so far) did better on noisy BraninCurrin (log10 HV gap
 * 0.43 against 0.53 over 30 seeds; noise-free BraninCurrin unchanged). Where the mean is
 * held at the worst value (gp_fit_options.worst_mean) it is held in units of √s, so that s
 * does not change how far above the data the prior puts unexplored regions (bench/RESULTS.md,
 * issue 22's eleventh and thirteenth rounds). */
#ifndef NAS_OPTIMIZER_GP_H
#define NAS_OPTIMIZER_GP_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#include <gsl/gsl_rng.h>

#include "common/common.h"
#include "optimizer/backend.h"

typedef enum { GP_KERNEL_RBF, GP_KERNEL_MATERN52 } gp_kernel;

#define GP_THETA_LEN(d) ((d) + 3)
#define GP_THETA_NOISE(d) (d)
#define GP_THETA_MEAN(d) ((d) + 1)
#define GP_THETA_SCALE(d) ((d) + 2)

/* ---- kernels (gp_kernel.c) ---------------------------------------------------------------
 * A kernel is a function of the scaled squared distance r² = Σ_k (a_k − b_k)²/ℓ_k².
 * gp_kernel_eval returns k(r²) and, when slope is not NULL, g(r²) = −2 dk/d(r²), so that
 * ∂k/∂a_k = −g·(a_k − b_k)/ℓ_k² and ∂k/∂log ℓ_k = g·(a_k − b_k)²/ℓ_k² (finite at r = 0). */
double gp_kernel_eval(gp_kernel kind, double r2, double *slope);
/* K[i·n + j] = k(X_i, X_j) for the n×d rows of X, Xt the same transposed (d×n) (full
 * symmetric matrix). */
void gp_kernel_matrix(gp_kernel kind, const double *X, const double *Xt, size_t n, size_t d,
                      const double *inv_ls2, double *K);
/* r2[i] = Σ_k (x_k − X_ik)²/ℓ_k², the terms added in the order of k, for the n points X_i
 * held transposed: coordinate k of point i at Xt[k·ld + i] (ld ≥ n). */
void gp_kernel_r2_column(const double *Xt, size_t ld, size_t n, size_t d,
                         const double *inv_ls2, const double *x, double *r2);
/* k[i] = k(X_i, x) for the n points of Xt (d×n: X transposed); when dk is not NULL,
 * dk[i·d + j] = ∂k[i]/∂x_j. */
void gp_kernel_column(gp_kernel kind, const double *Xt, size_t n, size_t d, const double *inv_ls2,
                   const double *x, double *k, double *dk);
/* Xt (d×n) = X (n×d) transposed. */
void gp_transpose(const double *X, size_t n, size_t d, double *Xt);

/* ---- priors and the fitting objective (gp_fit.c) --------------------------------------- */

/* The box the fit searches θ in, and the prior's mode (the fit's first start). */
void gp_theta_bounds(size_t d, double *lower, double *upper);
void gp_theta_prior_mode(size_t d, double *theta);
/* Log prior density of θ (outputscale, lengthscale and noise priors, flat in the mean); adds
 * its gradient to grad when grad is not NULL. */
double gp_log_prior(size_t d, const double *theta, double *grad);

/* The noise variance on the diagonal at point i: known[i] (in the outcomes' units) where
 * known is not NULL and it is not NaN, else the fitted noise. */
static inline double gp_noise_at(const double *known, size_t i, double fitted) {
  return known && !isnan(known[i]) ? known[i] : fitted;
}
/* Raw noise variances (n) → ones in units of scale (÷ scale²), at least 1e-6; NaN kept. */
void gp_standardise_noise(const double *noise_var, size_t n, double scale, double *out);

/* Log marginal likelihood + log prior of standardised outcomes y (n) at X (n×d) under θ;
 * known (n standardised noise variances, NaN where unknown; or NULL) as gp_noise_at; grad
 * (GP_THETA_LEN(d)) receives its gradient when not NULL. Returns -HUGE_VAL when the kernel
 * matrix cannot be factorised even with the largest jitter. */
double gp_log_posterior(gp_kernel kind, const double *X, const double *y, const double *known,
                        size_t n, size_t d, const double *theta, double *grad, nas_err *err);

typedef struct {
  gp_kernel kernel;
  int restarts;     /* extra L-BFGS starts drawn around the prior's mode (0: the prior's mode
                     * and its low-noise variant only, see gp_fit.c) */
  int max_evals;    /* per start */
  /* Fix the constant mean at the largest standardised outcome, in units of the prior's
   * standard deviation (c = worst·√s, s fitted with it), instead of fitting it: away from
   * the data the model then expects a value as bad as the worst seen (outcomes are minimised),
   * which stops the acquisition from chasing the far corners of a high-dimensional cube
   * only because nothing is known there (De Ath et al. 2021, "What do you mean? The role
   * of the mean function in Bayesian optimisation"). Unless the data reject it: when the
   * best fit with the mean free beats the held one's log posterior beyond a likelihood-ratio
   * test at p < 10⁻⁴, the free fit (s fitted too) stands (gp_fit.c; why the units of √s:
   * set_mean_bounds there). */
  bool worst_mean;
  optimizer_cancel *cancel; /* NULL: never; when it says stop, gp_fit returns NAS_ECANCELED */
  /* NULL, or one known noise variance per observation (raw units², NaN where unknown): used
   * as is instead of the fitted noise at those points. */
  const double *noise_var;
} gp_fit_options;

typedef struct gp gp;

/* Fits a GP to the n observations (X n×d in the unit cube, y raw values, all finite) and
 * factorises it at the fitted θ. rng draws the extra starts. Owned result in *out. */
int gp_fit(const double *X, const double *y, size_t n, size_t d, const gp_fit_options *opt,
           gsl_rng *rng, gp **out, nas_err *err);

/* ---- the model (gp.c) ------------------------------------------------------------------ */

/* ystd = (y − shift)/scale with the mean and sample standard deviation of the n values
 * (scale 1 when they are constant or n = 1). */
void gp_standardise(const double *y, size_t n, double *ystd, double *shift, double *scale);
/* A GP with the given hyperparameters (no fitting); y raw values. */
int gp_create(gp_kernel kind, const double *X, const double *y, size_t n, size_t d,
              const double *theta, gp **out, nas_err *err);
/* Same with known noise variances (raw units², NaN where unknown; NULL: none known). */
int gp_create_noisy(gp_kernel kind, const double *X, const double *y, const double *noise_var,
                    size_t n, size_t d, const double *theta, gp **out, nas_err *err);
void gp_free(gp *g);

size_t gp_n(const gp *g);
size_t gp_dim(const gp *g);
const double *gp_theta(const gp *g);
/* raw outcome = shift + scale · value in model units (scale: the outcomes' sd times √s) */
double gp_shift(const gp *g);
double gp_scale(const gp *g);

/* Points whose posterior is evaluated jointly with a candidate x (the baseline of noisy
 * acquisition functions): their posterior mean, covariance and the cross terms needed for
 * cov(f(B), f(x)) in O(nb·n) per candidate. */
typedef struct {
  size_t nb;
  double *Xt;    /* d×nb: the points transposed (owned) */
  double *mean;  /* nb: posterior mean of c + f, model units */
  double *cov;   /* nb×nb: posterior covariance of f */
  double *A;     /* nb×n: K(B, X) (K + noise I)^-1 */
} gp_baseline;

int gp_baseline_make(const gp *g, const double *Xb, size_t nb, gp_baseline *out, nas_err *err);
void gp_baseline_clear(gp_baseline *b);

/* Posterior of c + f(x) in model units (above). The pointers marked "or NULL" select what
 * is computed; work holds gp_work_len(g) doubles. */
typedef struct {
  double mean, var;
  double *dmean;  /* d, or NULL: ∂mean/∂x */
  double *dvar;   /* d, or NULL: ∂var/∂x */
  double *cov_b;  /* nb, or NULL: cov(f(B_i), f(x)) with the baseline */
} gp_prediction;

size_t gp_work_len(const gp *g);
void gp_predict(const gp *g, const double *x, const gp_baseline *b, gp_prediction *p,
                double *work);
/* After gp_predict(g, x, b, p, work) asked for dmean or dvar (work, untouched since, then
 * holds ∂k(X, x)/∂x): grad (d) += Σ_i u[i] ∂cov_b[i]/∂x, the gradient of the cross
 * covariances weighted by u (nb), in O(nb·n + (n + nb)·d) where their Jacobian costs
 * nb·n·d (most of an acquisition gradient in a wide space). scratch: n + nb doubles. */
void gp_cov_b_vjp(const gp *g, const double *x, const gp_baseline *b, const double *u,
                  const double *work, double *scratch, double *grad);

/* Cholesky factorisation with jitter escalation: factorises A (n×n, row-major, symmetric;
 * only the lower triangle is read) in place into its lower factor, adding the smallest
 * jitter from 0, 1e-9, 1e-8, … 1e-3 times the mean diagonal that makes it work. *jitter
 * receives what was added. Returns NAS_ERR when even the largest fails. */
int gp_cholesky(double *A, size_t n, double *jitter, nas_err *err);
/* Same, keeping A's original in copy (n×n) instead of memory of its own, so that it cannot
 * fail for want of memory: its only failure is a matrix beyond the largest jitter. */
int gp_cholesky_with(double *A, size_t n, double *copy, double *jitter, nas_err *err);

#endif
