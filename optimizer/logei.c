/* optimizer/logei.c: analytic LogEI for one objective with outcome constraints, and the
 * numerically careful scalar functions it and the MC acquisitions share (see
 * acquisition.h).
 *
 * Tails: for z ≤ −5 the formulas h(z) = φ(z) + zΦ(z) and Φ(z) lose every digit to
 * cancellation or underflow, so they go through Laplace's continued fraction of the Mills
 * ratio, R(u) = Φ(−u)/φ(u) = 1/(u + c(u)) with c(u) = 1/(u + 2/(u + 3/(u + …))):
 *   Φ(−u) = φ(u)/(u + c),   h(−u) = φ(u) − uΦ(−u) = φ(u)·c/(u + c),
 * both free of cancellation, and d log h/dz = Φ/h = 1/c, d log Φ/dz = φ/Φ = u + c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/acquisition.h"

static const double LOG_SQRT_2PI = 0.91893853320467274178;
static const double SQRT1_2 = 0.70710678118654752440;
static const double TAIL = -5.0;   /* below it, the continued fraction */
static const double MIN_VAR = 1e-12; /* posterior variances are floored here (standardised) */

/* c(u) = 1/(u + 2/(u + 3/(u + …))), evaluated from its 60th level up: at u ≥ 5 that is
 * far past convergence in double precision. */
static double mills_tail(double u) {
  double t = u;
  for (int j = 60; j >= 2; j--) t = u + j / t;
  return 1.0 / t;
}

double acq_log_h(double z, double *slope) {
  if (z > TAIL) {
    double cdf = 0.5 * erfc(-z * SQRT1_2), pdf = exp(-0.5 * z * z - LOG_SQRT_2PI);
    double h = pdf + z * cdf;
    if (slope) *slope = cdf / h;
    return log(h);
  }
  double u = -z, c = mills_tail(u);
  if (slope) *slope = 1.0 / c;
  return -0.5 * u * u - LOG_SQRT_2PI + log(c) - log(u + c);
}

double acq_log_ndtr(double z, double *slope) {
  if (z > TAIL) {
    double cdf = 0.5 * erfc(-z * SQRT1_2);
    if (slope) *slope = exp(-0.5 * z * z - LOG_SQRT_2PI) / cdf;
    return log(cdf);
  }
  double u = -z, c = mills_tail(u);
  if (slope) *slope = u + c;
  return -0.5 * u * u - LOG_SQRT_2PI - log(u + c);
}

/* For x < 0, s(x) = 1/(2√(1+x²)(√(1+x²) + |x|)) avoids the cancellation in 1 + x/√(1+x²). */
double acq_log_fat_sigmoid(double x, double *slope) {
  double q = sqrt(1.0 + x * x);
  if (x < 0) {
    if (slope) *slope = (q - x) / (q * q);
    return -M_LN2 - log(q) - log(q - x);
  }
  double s = 0.5 * (1.0 + x / q);
  if (slope) *slope = 0.5 / (q * q * q * s);
  return log(s);
}

struct logei {
  acq_models models;
  double best;       /* incumbent, standardised units of the objective's GP */
  bool has_best;     /* false: no feasible incumbent, maximise feasibility only */
  size_t d;
  double *work;      /* largest gp_work_len of the models */
  double *dmean, *dvar;
};

void logei_free(logei *a) {
  if (!a) return;
  free(a->work);
  free(a->dmean);
  free(a->dvar);
  free(a);
}

/* Threshold of constraint GP g on its standardised scale: slack ≤ 0 ⇔ value ≤ −shift/scale. */
static double slack_threshold(const gp *g) { return -gp_shift(g) / gp_scale(g); }

static bool feasible_in_mean(const logei *a, const double *x) {
  for (size_t c = 0; c < a->models.n_con; c++) {
    gp_prediction p = {0};
    gp_predict(a->models.con[c], x, NULL, &p, a->work);
    if (p.mean > slack_threshold(a->models.con[c])) return false;
  }
  return true;
}

static void find_incumbent(logei *a, const double *Xinc, size_t n) {
  a->has_best = false;
  for (size_t i = 0; i < n; i++) {
    const double *x = Xinc + i * a->d;
    if (!feasible_in_mean(a, x)) continue;
    gp_prediction p = {0};
    gp_predict(a->models.obj[0], x, NULL, &p, a->work);
    if (!a->has_best || p.mean < a->best) a->best = p.mean;
    a->has_best = true;
  }
}

int logei_create(const acq_models *models, const double *Xinc, size_t n, logei **out,
                 nas_err *err) {
  if (models->n_obj != 1) return nas_errf(err, "logei: needs exactly one objective");
  logei *a = calloc(1, sizeof *a);
  if (!a) return nas_errf(err, "logei: out of memory");
  a->models = *models;
  a->d = gp_dim(models->obj[0]);
  size_t work = gp_work_len(models->obj[0]);
  for (size_t c = 0; c < models->n_con; c++)
    if (gp_work_len(models->con[c]) > work) work = gp_work_len(models->con[c]);
  a->work = malloc(work * sizeof *a->work);
  a->dmean = malloc(a->d * sizeof *a->dmean);
  a->dvar = malloc(a->d * sizeof *a->dvar);
  if (!a->work || !a->dmean || !a->dvar) {
    logei_free(a);
    return nas_errf(err, "logei: out of memory");
  }
  find_incumbent(a, Xinc, n);
  *out = a;
  return NAS_OK;
}

/* log of a Gaussian tail quantity f((target − μ)/σ) at x, with gradient added into grad:
 * log h for the improvement (plus log σ), log Φ for feasibility. */
static double gaussian_term(logei *a, const gp *g, const double *x, double target, bool ei,
                            double *grad) {
  gp_prediction p = {.dmean = grad ? a->dmean : NULL, .dvar = grad ? a->dvar : NULL};
  gp_predict(g, x, NULL, &p, a->work);
  double var = fmax(p.var, MIN_VAR), sd = sqrt(var);
  double z = (target - p.mean) / sd, slope;
  double value = ei ? acq_log_h(z, &slope) + log(sd) : acq_log_ndtr(z, &slope);
  if (!grad) return value;
  for (size_t j = 0; j < a->d; j++) {
    double dvar = p.var > MIN_VAR ? a->dvar[j] : 0.0;
    double dsd = dvar / (2 * sd);
    double dz = (-a->dmean[j] - z * dsd) / sd;
    grad[j] += slope * dz + (ei ? dsd / sd : 0.0);
  }
  return value;
}

double logei_eval(void *ctx, const double *x, double *grad) {
  logei *a = ctx;
  if (grad) memset(grad, 0, a->d * sizeof *grad);
  double value = 0;
  if (a->has_best) value += gaussian_term(a, a->models.obj[0], x, a->best, true, grad);
  for (size_t c = 0; c < a->models.n_con; c++) {
    const gp *g = a->models.con[c];
    value += gaussian_term(a, g, x, slack_threshold(g), false, grad);
  }
  return value;
}
