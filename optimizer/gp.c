/* optimizer/gp.c: the GP model of one outcome: its factorisation, its posterior at a point
 * (mean, variance, covariance with a baseline, and their gradients in x) (see gp.h).
 *
 * Invariants of a gp: it holds the unit-variance model of the standardised outcomes divided
 * by √s (s the outputscale, gp.h): y, noise, mean and scale in those model units; L is the
 * lower Cholesky factor of K + N + jitter I over the n training inputs (N diagonal: each
 * point's known noise variance, else the fitted one), kept transposed (Lt), kinv its
 * inverse (both triangles, exactly symmetric) and alpha = kinv (y − mean), all at the
 * stored θ; shift and scale are fixed when the GP is made. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_cblas.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_linalg.h>

#include "optimizer/gp.h"
#include "optimizer/small_blas.h"

struct gp {
  gp_kernel kernel;
  size_t n, d;
  double *X;       /* n×d training inputs */
  double *Xt;      /* d×n: X transposed (for gp_kernel_column) */
  double *y;       /* n outcomes, model units */
  double shift;    /* raw = shift + scale · model units */
  double scale;    /* the outcomes' sd times √s */
  double *theta;   /* GP_THETA_LEN(d) */
  double *inv_ls2; /* d: 1/ℓ_k² */
  double noise;    /* fitted noise variance, model units */
  double mean;     /* constant mean, model units */
  double *known;   /* n known noise variances, model units (NaN: the fitted one), or NULL */
  double *Lt;      /* n×n: Lᵀ, L the lower Cholesky factor of K + N + jitter I */
  double *kinv;    /* n×n: (K + N + jitter I)^-1 */
  double *alpha;   /* n: kinv (y − mean) */
};

/* Largest relative jitter tried; beyond it the matrix is treated as broken. */
static const double MAX_JITTER = 1e-3;

int gp_cholesky(double *A, size_t n, double *jitter, nas_err *err) {
  double *orig = malloc(n * n * sizeof *orig);
  if (!orig) return nas_errf(err, "gp: out of memory for a %zux%zu factorisation", n, n);
  int rc = gp_cholesky_with(A, n, orig, jitter, err);
  free(orig);
  return rc;
}

int gp_cholesky_with(double *A, size_t n, double *orig, double *jitter, nas_err *err) {
  gsl_set_error_handler_off(); /* GSL's default handler aborts the process on EDOM */
  memcpy(orig, A, n * n * sizeof *orig);
  double mean_diag = 0;
  for (size_t i = 0; i < n; i++) mean_diag += orig[i * n + i] / (double)n;
  if (!isfinite(mean_diag)) /* GSL's factorisation would take NaNs for a factor */
    return nas_errf(err, "gp: %zux%zu covariance matrix has a diagonal that is not finite", n, n);
  gsl_matrix_view view = gsl_matrix_view_array(A, n, n);
  for (double rel = 0; rel <= MAX_JITTER; rel = rel == 0 ? 1e-9 : rel * 10) {
    if (rel > 0) memcpy(A, orig, n * n * sizeof *orig);
    double add = rel > 0 ? rel * mean_diag : 0;
    for (size_t i = 0; i < n; i++) A[i * n + i] += add;
    if (gsl_linalg_cholesky_decomp1(&view.matrix) == GSL_SUCCESS) {
      for (size_t i = 0; i < n; i++) memset(A + i * n + i + 1, 0, (n - i - 1) * sizeof *A);
      if (jitter) *jitter = add;
      return NAS_OK;
    }
  }
  return nas_errf(err, "gp: %zux%zu covariance matrix is not positive definite even with "
                  "jitter %g times its mean diagonal", n, n, MAX_JITTER);
}

/* Half of y − mean: finite even where the difference is not (readings near ±1.7e308), and
 * exactly half of it wherever it is. */
static double half_deviation(double y, double mean) { return 0.5 * y - 0.5 * mean; }

/* The standard deviation of values so far apart (beyond about 1e154, e.g. a diverged loss)
 * that their squared deviations overflow: summed in units of the largest deviation, and at
 * most the largest double. */
static double sd_of_far_apart(const double *y, size_t n, double mean) {
  double largest = 0, ss = 0; /* in halves */
  for (size_t i = 0; i < n; i++) largest = fmax(largest, fabs(half_deviation(y[i], mean)));
  for (size_t i = 0; i < n; i++) {
    double unit = half_deviation(y[i], mean) / largest;
    ss += unit * unit;
  }
  return fmin(2 * (largest * sqrt(ss / (double)(n - 1))), DBL_MAX);
}

void gp_standardise(const double *y, size_t n, double *ystd, double *shift, double *scale) {
  double mean = 0, ss = 0;
  for (size_t i = 0; i < n; i++) mean += y[i] / (double)n;
  for (size_t i = 0; i < n; i++) ss += (y[i] - mean) * (y[i] - mean);
  double sd = n > 1 ? sqrt(ss / (double)(n - 1)) : 0;
  bool far_apart = !isfinite(sd);
  if (far_apart) sd = sd_of_far_apart(y, n, mean);
  *shift = mean;
  *scale = sd > 1e-8 * fmax(1.0, fabs(mean)) ? sd : 1.0; /* constant outcomes: unit scale */
  for (size_t i = 0; i < n; i++)
    ystd[i] = far_apart ? half_deviation(y[i], *shift) / (0.5 * *scale) : (y[i] - *shift) / *scale;
}

static gp *gp_alloc(gp_kernel kind, size_t n, size_t d) {
  gp *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->kernel = kind;
  g->n = n;
  g->d = d;
  g->X = malloc(n * d * sizeof *g->X);
  g->Xt = malloc(n * d * sizeof *g->Xt);
  g->y = malloc(n * sizeof *g->y);
  g->theta = malloc(GP_THETA_LEN(d) * sizeof *g->theta);
  g->inv_ls2 = malloc(d * sizeof *g->inv_ls2);
  g->Lt = malloc(n * n * sizeof *g->Lt);
  g->kinv = malloc(n * n * sizeof *g->kinv);
  g->alpha = malloc(n * sizeof *g->alpha);
  if (!g->X || !g->Xt || !g->y || !g->theta || !g->inv_ls2 || !g->Lt || !g->kinv || !g->alpha) {
    gp_free(g);
    return NULL;
  }
  return g;
}

void gp_free(gp *g) {
  if (!g) return;
  free(g->X);
  free(g->Xt);
  free(g->y);
  free(g->theta);
  free(g->inv_ls2);
  free(g->Lt);
  free(g->kinv);
  free(g->alpha);
  free(g->known);
  free(g);
}

/* θ, and the noise and mean in model units; the standardised outcomes (g->y) and their sd
 * (g->scale) into model units. */
static void set_theta(gp *g, const double *theta) {
  size_t d = g->d;
  memcpy(g->theta, theta, GP_THETA_LEN(d) * sizeof *theta);
  for (size_t k = 0; k < d; k++) g->inv_ls2[k] = exp(-2.0 * theta[k]);
  double root = sqrt(exp(theta[GP_THETA_SCALE(d)]));
  g->noise = exp(theta[GP_THETA_NOISE(d)]); /* θ's noise entry is already noise/s */
  g->mean = theta[GP_THETA_MEAN(d)] / root;
  g->scale *= root;
  for (size_t i = 0; i < g->n; i++) g->y[i] /= root;
}

/* kinv and alpha from the factor L (in g->Lt, not yet transposed), then Lt = Lᵀ. */
static int finish_factor(gp *g, nas_err *err) {
  size_t n = g->n;
  memcpy(g->kinv, g->Lt, n * n * sizeof *g->kinv);
  for (size_t i = 0; i < n; i++) /* L's upper part is zero */
    for (size_t j = 0; j < i; j++) {
      g->Lt[j * n + i] = g->Lt[i * n + j];
      g->Lt[i * n + j] = 0.0;
    }
  gsl_matrix_view kinv = gsl_matrix_view_array(g->kinv, n, n);
  if (gsl_linalg_cholesky_invert(&kinv.matrix) != GSL_SUCCESS)
    return nas_errf(err, "gp: cannot invert the %zux%zu kernel matrix", n, n);
  for (size_t i = 0; i < n; i++) /* both triangles, for the full-matrix products */
    for (size_t j = 0; j < i; j++) g->kinv[j * n + i] = g->kinv[i * n + j];
  double c = g->mean;
  double *resid = malloc(n * sizeof *resid);
  if (!resid) return nas_errf(err, "gp: out of memory");
  for (size_t i = 0; i < n; i++) resid[i] = g->y[i] - c;
  cblas_dsymv(CblasRowMajor, CblasLower, (int)n, 1.0, g->kinv, (int)n, resid, 1, 0.0, g->alpha,
              1);
  free(resid);
  return NAS_OK;
}

static int factorise(gp *g, nas_err *err) {
  size_t n = g->n;
  gp_kernel_matrix(g->kernel, g->X, g->Xt, n, g->d, g->inv_ls2, g->Lt);
  for (size_t i = 0; i < n; i++) g->Lt[i * n + i] += gp_noise_at(g->known, i, g->noise);
  if (gp_cholesky(g->Lt, n, NULL, err) != NAS_OK) return NAS_ERR;
  return finish_factor(g, err);
}

int gp_create(gp_kernel kind, const double *X, const double *y, size_t n, size_t d,
              const double *theta, gp **out, nas_err *err) {
  return gp_create_noisy(kind, X, y, NULL, n, d, theta, out, err);
}

/* Known noise is floored (NaN kept): with none, readings told exact (NAME_sem=0, noise: 0)
 * of a smooth function leave K too ill-conditioned for its posterior covariance. */
static const double MIN_KNOWN_NOISE = 1e-6; /* GPyTorch's min_fixed_noise for doubles */

void gp_standardise_noise(const double *noise_var, size_t n, double scale, double *out) {
  for (size_t i = 0; i < n; i++)
    out[i] = isnan(noise_var[i]) ? NAN : fmax(noise_var[i] / (scale * scale), MIN_KNOWN_NOISE);
}

int gp_create_noisy(gp_kernel kind, const double *X, const double *y, const double *noise_var,
                    size_t n, size_t d, const double *theta, gp **out, nas_err *err) {
  if (n == 0) return nas_errf(err, "gp: no observations to model");
  gp *g = gp_alloc(kind, n, d);
  if (g && noise_var && !(g->known = malloc(n * sizeof *g->known))) {
    gp_free(g);
    g = NULL;
  }
  if (!g) return nas_errf(err, "gp: out of memory for %zu observations", n);
  memcpy(g->X, X, n * d * sizeof *X);
  gp_transpose(X, n, d, g->Xt);
  gp_standardise(y, n, g->y, &g->shift, &g->scale);
  set_theta(g, theta);
  if (noise_var) gp_standardise_noise(noise_var, n, g->scale, g->known);
  if (factorise(g, err) != NAS_OK) {
    gp_free(g);
    return NAS_ERR;
  }
  *out = g;
  return NAS_OK;
}

size_t gp_n(const gp *g) { return g->n; }
size_t gp_dim(const gp *g) { return g->d; }
const double *gp_theta(const gp *g) { return g->theta; }
double gp_shift(const gp *g) { return g->shift; }
double gp_scale(const gp *g) { return g->scale; }

void gp_baseline_clear(gp_baseline *b) {
  free(b->Xt);
  free(b->mean);
  free(b->cov);
  free(b->A);
  memset(b, 0, sizeof *b);
}

/* mean_B = c + K(B,X) alpha; A = K(B,X) kinv; cov_B = K(B,B) − A K(X,B). */
int gp_baseline_make(const gp *g, const double *Xb, size_t nb, gp_baseline *out, nas_err *err) {
  size_t n = g->n, d = g->d;
  memset(out, 0, sizeof *out);
  out->nb = nb;
  out->Xt = malloc((nb * d + 1) * sizeof *out->Xt);
  out->mean = malloc((nb + 1) * sizeof *out->mean);
  out->cov = malloc((nb * nb + 1) * sizeof *out->cov);
  out->A = malloc((nb * n + 1) * sizeof *out->A);
  double *KbX = malloc((nb * n + 1) * sizeof *KbX);
  if (!out->Xt || !out->mean || !out->cov || !out->A || !KbX) {
    free(KbX);
    gp_baseline_clear(out);
    return nas_errf(err, "gp: out of memory for a baseline of %zu points", nb);
  }
  gp_transpose(Xb, nb, d, out->Xt);
  double c = g->mean;
  for (size_t b = 0; b < nb; b++) {
    gp_kernel_column(g->kernel, g->Xt, n, d, g->inv_ls2, Xb + b * d, KbX + b * n, NULL);
    out->mean[b] = c + cblas_ddot((int)n, KbX + b * n, 1, g->alpha, 1);
  }
  if (nb > 0) {
    cblas_dsymm(CblasRowMajor, CblasRight, CblasLower, (int)nb, (int)n, 1.0, g->kinv, (int)n,
                KbX, (int)n, 0.0, out->A, (int)n);
    gp_kernel_matrix(g->kernel, Xb, out->Xt, nb, d, g->inv_ls2, out->cov);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nb, (int)n, -1.0, out->A,
                (int)n, KbX, (int)n, 1.0, out->cov, (int)nb);
  }
  free(KbX);
  return NAS_OK;
}

size_t gp_work_len(const gp *g) { return g->n * (g->d + 2); }

/* With k = k(X, x), w = kinv k: mean = c + k·alpha, var = 1 − k·w, and for the baseline
 * cov_b = k(B, x) − A k; gradients follow from dk = ∂k/∂x (kept in work for gp_cov_b_vjp). */
void gp_predict(const gp *g, const double *x, const gp_baseline *b, gp_prediction *p,
                double *work) {
  size_t n = g->n, d = g->d;
  bool grad = p->dmean || p->dvar;
  double *k = work, *w = work + n, *dk = grad ? work + 2 * n : NULL;
  gp_kernel_column(g->kernel, g->Xt, n, d, g->inv_ls2, x, k, dk);
  p->mean = g->mean + sb_dot(n, k, g->alpha);
  if (p->dvar) { /* kᵀK⁻¹k, keeping w = K⁻¹k for the gradient (kinv symmetric: by columns) */
    sb_mtv(n, n, 1.0, g->kinv, n, k, 1, 0.0, w);
    p->var = fmax(1.0 - sb_dot(n, k, w), 0.0);
  } else { /* |L⁻¹k|²: half the flops */
    memcpy(w, k, n * sizeof *w);
    sb_lower_solve_t(n, g->Lt, n, w);
    p->var = fmax(1.0 - sb_dot(n, w, w), 0.0);
  }
  if (p->dmean) sb_mtv(n, d, 1.0, dk, d, g->alpha, 1, 0.0, p->dmean);
  if (p->dvar) sb_mtv(n, d, -2.0, dk, d, w, 1, 0.0, p->dvar);
  if (!b || !p->cov_b || b->nb == 0) return;
  gp_kernel_column(g->kernel, b->Xt, b->nb, d, g->inv_ls2, x, p->cov_b, NULL);
  sb_mv(b->nb, n, -1.0, b->A, n, k, 1.0, p->cov_b, 1);
}

/* Σ_i u_i ∂cov_b[i]/∂x = Σ_i u_i ∂k(B_i, x)/∂x − Σ_p (Aᵀu)_p ∂k(X_p, x)/∂x, the first with
 * ∂k(B_i, x)/∂x_j = −g_i (x_j − B_ij)/ℓ_j² (g_i the kernel's slope, gp.h). */
void gp_cov_b_vjp(const gp *g, const double *x, const gp_baseline *b, const double *u,
                  const double *work, double *scratch, double *grad) {
  size_t n = g->n, d = g->d, nb = b->nb;
  double *At_u = scratch, *coef = scratch + n;
  sb_mtv(nb, n, 1.0, b->A, n, u, 1, 0.0, At_u);
  sb_mtv(n, d, -1.0, work + 2 * n, d, At_u, 1, 1.0, grad);
  gp_kernel_r2_column(b->Xt, nb, nb, d, g->inv_ls2, x, coef);
  for (size_t i = 0; i < nb; i++) {
    double slope;
    gp_kernel_eval(g->kernel, coef[i], &slope);
    coef[i] = u[i] * slope;
  }
  for (size_t j = 0; j < d; j++) {
    double sum = 0;
    for (size_t i = 0; i < nb; i++) sum += coef[i] * (x[j] - b->Xt[j * nb + i]);
    grad[j] -= sum * g->inv_ls2[j];
  }
}
