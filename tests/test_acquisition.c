/* Tests of the acquisition functions (optimizer/boxes.c, logei.c, acquisition.c): box
 * decompositions against brute-force hypervolume, log-space values against their plain
 * counterparts, analytic gradients against central finite differences. */
#include <float.h>
#include <math.h>

#include <gsl/gsl_rng.h>

#include "optimizer/acquisition.h"
#include "tests/testutil.h"

/* ---- brute force ---------------------------------------------------------------------- */

/* Hypervolume of the k points P (k×m) below ref by the grid of all their coordinates: a
 * cell counts when its lower corner is dominated by some point. O(k^(m+1)), tiny k only. */
static double brute_hv(const double *P, size_t k, size_t m, const double *ref) {
  double grid[4][16];
  size_t len[4], cell[4] = {0};
  for (size_t j = 0; j < m; j++) {
    len[j] = 0;
    grid[j][len[j]++] = ref[j];
    for (size_t i = 0; i < k; i++)
      if (P[i * m + j] < ref[j]) grid[j][len[j]++] = P[i * m + j];
    for (size_t a = 1; a < len[j]; a++) /* insertion sort */
      for (size_t b = a; b > 0 && grid[j][b - 1] > grid[j][b]; b--) {
        double t = grid[j][b];
        grid[j][b] = grid[j][b - 1];
        grid[j][b - 1] = t;
      }
  }
  double total = 0;
  for (;;) {
    bool inside = true;
    double vol = 1, corner[4];
    for (size_t j = 0; j < m; j++) {
      inside = inside && cell[j] + 1 < len[j];
      if (!inside) break;
      corner[j] = grid[j][cell[j]];
      vol *= grid[j][cell[j] + 1] - grid[j][cell[j]];
    }
    if (inside) {
      bool dominated = false;
      for (size_t i = 0; i < k && !dominated; i++) {
        bool all = true;
        for (size_t j = 0; j < m; j++) all = all && P[i * m + j] <= corner[j];
        dominated = all;
      }
      if (dominated) total += vol;
    }
    size_t j = 0;
    while (j < m && ++cell[j] >= len[j]) cell[j++] = 0;
    if (j == m) break;
  }
  return total;
}

static double brute_hvi(const double *P, size_t k, size_t m, const double *ref, const double *y) {
  double Q[16 * 4];
  memcpy(Q, P, k * m * sizeof *P);
  memcpy(Q + k * m, y, m * sizeof *y);
  return brute_hv(Q, k + 1, m, ref) - brute_hv(P, k, m, ref);
}

/* A front-like set: points near the simplex Σ x = 1 (some dominated) in [0,1]^m. */
static void random_points(gsl_rng *rng, double *P, size_t k, size_t m) {
  for (size_t i = 0; i < k; i++) {
    double sum = 0;
    for (size_t j = 0; j < m; j++) sum += (P[i * m + j] = 0.05 + gsl_rng_uniform(rng));
    for (size_t j = 0; j < m; j++) P[i * m + j] = P[i * m + j] / sum + 0.2 * gsl_rng_uniform(rng);
  }
}

/* ---- box decompositions --------------------------------------------------------------- */

static void box_hvi_equals_brute_force_hypervolume_improvement(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  nas_err err;
  for (size_t m = 1; m <= 4; m++)
    for (int trial = 0; trial < 12; trial++) {
      size_t k = (size_t)trial % (m == 4 ? 7 : 10);
      double P[16 * 4], ref[4], y[4];
      random_points(rng, P, k, m);
      for (size_t j = 0; j < m; j++) ref[j] = 1.1;
      box_list boxes = {0};
      assert_int_equal(box_decompose(P, k, m, ref, &boxes, &err), NAS_OK);
      for (int t = 0; t < 20; t++) {
        for (size_t j = 0; j < m; j++) y[j] = 1.2 * gsl_rng_uniform(rng);
        double expect = brute_hvi(P, k, m, ref, y);
        assert_near(box_hvi(&boxes, 0, boxes.n, y), expect, 1e-12);
      }
      box_list_clear(&boxes);
    }
  gsl_rng_free(rng);
}

/* Below everything, HVI is the box [y, ref] minus the front's hypervolume. */
static void boxes_cover_the_non_dominated_region_exactly(void **state) {
  (void)state;
  double P[3 * 3] = {0.2, 0.5, 0.6, 0.5, 0.2, 0.4, 0.4, 0.4, 0.1}, ref[3] = {1, 1, 1};
  double y[3] = {0, 0, 0};
  box_list boxes = {0};
  nas_err err;
  assert_int_equal(box_decompose(P, 3, 3, ref, &boxes, &err), NAS_OK);
  assert_near(box_hvi(&boxes, 0, boxes.n, y), 1.0 - brute_hv(P, 3, 3, ref), 1e-12);
  box_list_clear(&boxes);
}

static void log_hvi_equals_log_of_hvi_where_hvi_is_not_tiny(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double P[8 * 3], ref[3] = {1.1, 1.1, 1.1}, y[3];
  random_points(rng, P, 8, 3);
  box_list boxes = {0};
  nas_err err;
  assert_int_equal(box_decompose(P, 8, 3, ref, &boxes, &err), NAS_OK);
  int checked = 0;
  for (int t = 0; t < 200; t++) {
    for (size_t j = 0; j < 3; j++) y[j] = gsl_rng_uniform(rng);
    double hvi = box_hvi(&boxes, 0, boxes.n, y);
    if (hvi < 1e-3) continue;
    assert_near(box_log_hvi(&boxes, 0, boxes.n, y, 1e-6, NULL), log(hvi), 1e-4);
    checked++;
  }
  assert_true(checked > 20);
  box_list_clear(&boxes);
  gsl_rng_free(rng);
}

/* Where y improves nothing the exact HVI is 0 everywhere around it; the smoothed log HVI
 * stays finite and still rises as y moves towards the front. */
static void log_hvi_rises_towards_the_front_where_hvi_is_zero(void **state) {
  (void)state;
  double P[2 * 2] = {0.2, 0.6, 0.6, 0.2}, ref[2] = {1, 1};
  box_list boxes = {0};
  nas_err err;
  assert_int_equal(box_decompose(P, 2, 2, ref, &boxes, &err), NAS_OK);
  double previous = -HUGE_VAL;
  for (double t = 3.0; t >= 0.7; t -= 0.1) {
    double y[2] = {t, t}, grad[2];
    assert_near(box_hvi(&boxes, 0, boxes.n, y), 0.0, 0.0);
    double v = box_log_hvi(&boxes, 0, boxes.n, y, 1e-6, grad);
    assert_true(isfinite(v) && v > previous);
    assert_true(grad[0] < 0 && grad[1] < 0);
    previous = v;
  }
  box_list_clear(&boxes);
}

static void log_hvi_gradient_matches_finite_differences(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double P[6 * 3], ref[3] = {1.1, 1.1, 1.1};
  random_points(rng, P, 6, 3);
  box_list boxes = {0};
  nas_err err;
  assert_int_equal(box_decompose(P, 6, 3, ref, &boxes, &err), NAS_OK);
  for (int t = 0; t < 20; t++) {
    double y[3], grad[3], tau = 1e-2;
    for (size_t j = 0; j < 3; j++) y[j] = 1.5 * gsl_rng_uniform(rng);
    box_log_hvi(&boxes, 0, boxes.n, y, tau, grad);
    for (size_t j = 0; j < 3; j++) {
      double h = 1e-6, save = y[j];
      y[j] = save + h;
      double up = box_log_hvi(&boxes, 0, boxes.n, y, tau, NULL);
      y[j] = save - h;
      double down = box_log_hvi(&boxes, 0, boxes.n, y, tau, NULL);
      y[j] = save;
      assert_near(grad[j], (up - down) / (2 * h), 1e-4 * fmax(1, fabs(grad[j])));
    }
  }
  box_list_clear(&boxes);
  gsl_rng_free(rng);
}

/* Boxes built against a far reference and clipped to a nearer one give the HVI against the
 * nearer one: the cap of an inferred reference that follows the candidate. */
static void capped_log_hvi_equals_log_of_hvi_against_the_cap(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double P[8 * 3], far[3] = {HUGE_VAL, HUGE_VAL, 1.1}, y[3], upper[3];
  bool moves[3] = {false, false, false};
  random_points(rng, P, 8, 3);
  box_list boxes = {0};
  nas_err err;
  assert_int_equal(box_decompose(P, 8, 3, far, &boxes, &err), NAS_OK);
  int checked = 0;
  for (int t = 0; t < 200; t++) {
    for (size_t j = 0; j < 3; j++) y[j] = 1.3 * gsl_rng_uniform(rng);
    upper[0] = 0.9 + 0.5 * gsl_rng_uniform(rng);
    upper[1] = 0.9 + 0.5 * gsl_rng_uniform(rng);
    upper[2] = 1.1;
    box_cap cap = {.upper = upper, .moves = moves};
    double hvi = brute_hvi(P, 8, 3, upper, y);
    if (hvi < 1e-3) continue;
    assert_near(box_log_hvi_capped(&boxes, 0, boxes.n, y, &cap, 1e-6, NULL), log(hvi),
                1e-4);
    checked++;
  }
  assert_true(checked > 20);
  box_list_clear(&boxes);
  gsl_rng_free(rng);
}

/* A cap that moves with y (upper_j = y_j + margin) is part of the gradient. */
static void capped_log_hvi_gradient_matches_finite_differences(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double P[6 * 2], far[2] = {HUGE_VAL, HUGE_VAL};
  random_points(rng, P, 6, 2);
  box_list boxes = {0};
  nas_err err;
  assert_int_equal(box_decompose(P, 6, 2, far, &boxes, &err), NAS_OK);
  for (int t = 0; t < 20; t++) {
    double y[2], grad[2], tau = 1e-2, margin = 0.1;
    for (size_t j = 0; j < 2; j++) y[j] = 1.5 * gsl_rng_uniform(rng);
    double upper[2];
    bool moves[2];
    box_cap cap = {.upper = upper, .moves = moves};
    for (size_t j = 0; j < 2; j++) {
      upper[j] = fmax(1.1, y[j] + margin);
      moves[j] = y[j] + margin > 1.1;
    }
    box_log_hvi_capped(&boxes, 0, boxes.n, y, &cap, tau, grad);
    for (size_t j = 0; j < 2; j++) {
      double h = 1e-6, save = y[j], at[2];
      for (int side = 0; side < 2; side++) {
        y[j] = save + (side ? -h : h);
        upper[j] = fmax(1.1, y[j] + margin);
        at[side] = box_log_hvi_capped(&boxes, 0, boxes.n, y, &cap, tau, NULL);
      }
      y[j] = save;
      upper[j] = fmax(1.1, y[j] + margin);
      assert_near(grad[j], (at[0] - at[1]) / (2 * h), 1e-4 * fmax(1, fabs(grad[j])));
    }
  }
  box_list_clear(&boxes);
  gsl_rng_free(rng);
}

/* ---- scalar log-space functions -------------------------------------------------------- */

static long double h_direct(long double z) {
  long double pdf = expl(-0.5L * z * z) / sqrtl(2 * acosl(-1.0L));
  return pdf + z * 0.5L * erfcl(-z / sqrtl(2.0L));
}

static void log_h_equals_log_ei_where_ei_is_not_tiny(void **state) {
  (void)state;
  for (double z = -8; z <= 8; z += 0.125) {
    double slope, value = acq_log_h(z, &slope);
    assert_near(value, (double)logl(h_direct(z)), 1e-9 * fmax(1, fabs(value)));
    /* d log h/dz = Φ(z)/h(z) */
    long double cdf = 0.5L * erfcl(-(long double)z / sqrtl(2.0L));
    assert_near(slope, (double)(cdf / h_direct(z)), 1e-8 * fmax(1, slope));
  }
}

/* Far in the tail EI underflows to 0 but log h stays finite, increasing, and follows its
 * asymptote log φ(z) − 2 log|z|. */
static void log_h_stays_finite_and_monotone_in_the_far_tail(void **state) {
  (void)state;
  double previous = -HUGE_VAL;
  for (double z = -1e4; z <= 0; z = z < -100 ? z / 1.5 : z + 0.25) {
    double v = acq_log_h(z, NULL);
    assert_true(isfinite(v) && v > previous);
    previous = v;
  }
  double z = -1e3;
  assert_near(acq_log_h(z, NULL), -0.5 * z * z - 0.5 * log(2 * M_PI) - 2 * log(-z), 1e-5);
  assert_near(acq_log_ndtr(z, NULL), -0.5 * z * z - 0.5 * log(2 * M_PI) - log(-z), 1e-5);
}

static void log_ndtr_and_fat_sigmoid_slopes_match_finite_differences(void **state) {
  (void)state;
  for (double z = -40; z <= 10; z += 0.37) {
    double h = 1e-6, s1, s2;
    acq_log_ndtr(z, &s1);
    assert_near(s1, (acq_log_ndtr(z + h, NULL) - acq_log_ndtr(z - h, NULL)) / (2 * h),
                1e-5 * fmax(1, fabs(s1)));
    acq_log_fat_sigmoid(z, &s2);
    double fd2 = (acq_log_fat_sigmoid(z + h, NULL) - acq_log_fat_sigmoid(z - h, NULL)) / (2 * h);
    assert_near(s2, fd2, 1e-5 * fmax(1, fabs(s2)));
    /* Below z of about -37.5 erfc's value is subnormal (digits lost, then 0): no reference
     * there; the tail's asymptote is checked above. */
    double cdf = 0.5 * erfc(-z / sqrt(2));
    if (cdf >= DBL_MIN) assert_near(acq_log_ndtr(z, NULL), log(cdf), 1e-9);
  }
}

/* ---- acquisitions over GPs ------------------------------------------------------------ */

enum { N_OBS = 9, D = 2 };

/* GPs with fixed hyperparameters over 9 points: 2 objectives (Branin-like shapes) and 1
 * constraint. */
typedef struct {
  gp *g[3];
  double X[N_OBS * D];
} toy_models;

static void toy_make(toy_models *t, size_t n_gp) {
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  for (size_t i = 0; i < N_OBS * D; i++) t->X[i] = gsl_rng_uniform(rng);
  for (size_t k = 0; k < n_gp; k++) {
    double y[N_OBS], theta[GP_THETA_LEN(D)] = {log(0.3 + 0.1 * k), log(0.5), log(1e-3), 0.05, 0};
    for (size_t i = 0; i < N_OBS; i++) {
      double a = t->X[i * D], b = t->X[i * D + 1];
      y[i] = k == 0 ? a + 0.3 * b * b : k == 1 ? 1 - sqrt(a) + b : a + b - 0.9;
    }
    nas_err err;
    assert_int_equal(gp_create(GP_KERNEL_MATERN52, t->X, y, N_OBS, D, theta, &t->g[k], &err),
                     NAS_OK);
  }
  gsl_rng_free(rng);
}

static void toy_free(toy_models *t, size_t n_gp) {
  for (size_t k = 0; k < n_gp; k++) gp_free(t->g[k]);
}

static void check_gradient(acq_fn f, void *ctx, const double *x0, double tol) {
  double x[D], grad[D];
  memcpy(x, x0, sizeof x);
  double value = f(ctx, x, grad);
  assert_true(isfinite(value));
  for (size_t j = 0; j < D; j++) {
    double h = 1e-6, save = x[j];
    x[j] = save + h;
    double up = f(ctx, x, NULL);
    x[j] = save - h;
    double down = f(ctx, x, NULL);
    x[j] = save;
    assert_near(grad[j], (up - down) / (2 * h), tol * fmax(1, fabs(grad[j])));
  }
}

/* EI = σ h((best − μ)/σ) computed from gp_predict by hand, best the lowest posterior mean. */
static void logei_equals_log_of_expected_improvement(void **state) {
  (void)state;
  toy_models t;
  toy_make(&t, 1);
  acq_models m = {.n_obj = 1, .obj = t.g};
  logei *a;
  nas_err err;
  assert_int_equal(logei_create(&m, t.X, N_OBS, &a, &err), NAS_OK);
  double work[256], best = HUGE_VAL;
  for (size_t i = 0; i < N_OBS; i++) {
    gp_prediction p = {0};
    gp_predict(t.g[0], t.X + i * D, NULL, &p, work);
    best = fmin(best, p.mean);
  }
  double x[D] = {0.02, 0.1};
  gp_prediction p = {0};
  gp_predict(t.g[0], x, NULL, &p, work);
  double sd = sqrt(p.var), ei = sd * (double)h_direct((best - p.mean) / sd);
  assert_true(ei > 1e-6);
  assert_near(logei_eval(a, x, NULL), log(ei), 1e-9);
  logei_free(a);
  toy_free(&t, 1);
}

static void logei_gradient_matches_finite_differences(void **state) {
  (void)state;
  toy_models t;
  toy_make(&t, 3);
  acq_models m = {.n_obj = 1, .n_con = 1, .obj = t.g, .con = t.g + 2};
  logei *a;
  nas_err err;
  assert_int_equal(logei_create(&m, t.X, N_OBS, &a, &err), NAS_OK);
  double xs[3][D] = {{0.3, 0.8}, {0.9, 0.1}, {0.05, 0.5}};
  for (int i = 0; i < 3; i++) check_gradient(logei_eval, a, xs[i], 1e-5);
  logei_free(a);
  toy_free(&t, 3);
}

static void mc_acquisition_gradients_match_finite_differences(void **state) {
  (void)state;
  toy_models t;
  toy_make(&t, 3);
  acq_models m = {.n_obj = 2, .n_con = 1, .obj = t.g, .con = t.g + 2};
  double ref[2] = {1.5, 1.5}, ideal[2] = {0, 0}, weights[2] = {0.3, 0.7};
  double xs[3][D] = {{0.3, 0.8}, {0.9, 0.1}, {0.05, 0.5}};
  double margin[2] = {0.2, 0.3}; /* kind 2: the reference follows the candidate */
  for (int kind = 0; kind < 3; kind++) {
    mc_options opt = {.utility = kind == 1 ? MC_PAREGO : MC_HVI, .n_samples = 32, .seed = 5,
                      .ref = ref, .weights = weights, .ideal = ideal,
                      .margin = kind == 2 ? margin : NULL};
    mc_acq *a;
    nas_err err;
    assert_int_equal(mc_acq_create(&m, t.X, 4, &opt, &a, &err), NAS_OK);
    for (int i = 0; i < 3; i++) check_gradient(mc_acq_eval, a, xs[i], 1e-4);
    mc_acq_free(a);
  }
  toy_free(&t, 3);
}

/* A covariance that cannot be factorised (here a baseline point that is not finite) fails
 * the acquisition and the posterior draw naming the metric of the outcome that failed,
 * an objective's or a constraint's: "outcome 0" says nothing to a person. */
static void factorisation_failures_name_the_outcomes_metric(void **state) {
  (void)state;
  toy_models t;
  toy_make(&t, 3);
  const char *obj_names[] = {"loss", "latency"}, *con_names[] = {"memory"};
  acq_models m = {.n_obj = 2, .n_con = 1, .obj = t.g, .con = t.g + 2, .obj_names = obj_names,
                  .con_names = con_names};
  double ref[2] = {1.5, 1.5}, ideal[2] = {0, 0}, weights[2] = {0.3, 0.7};
  mc_options opt = {.utility = MC_HVI, .n_samples = 8, .seed = 5, .ref = ref,
                    .weights = weights, .ideal = ideal};
  double Xb[2 * D] = {0.3, 0.8, NAN, 0.5}, F[2 * 3];
  mc_acq *a = NULL;
  nas_err err = {{0}};
  assert_int_equal(mc_acq_create(&m, Xb, 2, &opt, &a, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "acquisition baseline of objective 'loss'"));
  assert_int_equal(acq_posterior_draw(&m, Xb, 2, 1, 7, F, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "posterior draw of objective 'loss'"));
  acq_models constraint_only = {.n_con = 1, .con = t.g + 2, .con_names = con_names};
  assert_int_equal(acq_posterior_draw(&constraint_only, Xb, 2, 1, 7, F, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "posterior draw of the constraint on 'memory'"));
  toy_free(&t, 3);
}

/* Same seed: same value; a candidate at an observed point adds little next to one in an
 * unexplored corner that the models predict to be good. */
static void mc_hvi_is_deterministic_and_prefers_improvement(void **state) {
  (void)state;
  toy_models t;
  toy_make(&t, 2);
  acq_models m = {.n_obj = 2, .obj = t.g};
  double ref[2] = {2.0, 2.0};
  mc_options opt = {.utility = MC_HVI, .n_samples = 64, .seed = 9, .ref = ref};
  mc_acq *a, *b;
  nas_err err;
  assert_int_equal(mc_acq_create(&m, t.X, N_OBS, &opt, &a, &err), NAS_OK);
  assert_int_equal(mc_acq_create(&m, t.X, N_OBS, &opt, &b, &err), NAS_OK);
  double x[D] = {0.4, 0.02};
  assert_near(mc_acq_eval(a, x, NULL), mc_acq_eval(b, x, NULL), 0.0);
  double worst[D] = {1.0, 1.0};
  assert_true(mc_acq_eval(a, worst, NULL) < mc_acq_eval(a, x, NULL) - 1.0);
  assert_true(mc_acq_eval(a, t.X, NULL) < mc_acq_eval(a, x, NULL));
  mc_acq_free(a);
  mc_acq_free(b);
  toy_free(&t, 2);
}

/* Two objectives known almost exactly at five points: a front (0, 1), (0.5, 0.5), (1, 0) as
 * the baseline, and two candidates beyond its nadir in the first objective: one that buys
 * half the front's extent in the second for one extent in the first, one that buys a
 * hundredth for two. */
static const double exact_points[5 * D] = {0.1, 0.1, 0.5, 0.5, 0.9, 0.9, 0.1, 0.9, 0.9, 0.1};

static void exact_models(gp **g) {
  double y[2][5] = {{0, 0.5, 1, 2, 3}, {1, 0.5, 0, -0.5, -0.01}};
  double theta[GP_THETA_LEN(D)] = {log(0.05), log(0.05), log(1e-8), 0, 0};
  nas_err err;
  for (size_t k = 0; k < 2; k++)
    assert_int_equal(gp_create(GP_KERNEL_MATERN52, exact_points, y[k], 5, D, theta, &g[k], &err),
                     NAS_OK);
}

/* Beyond a fixed reference a candidate improves nothing; a reference that follows the
 * candidate (as the data would once it is observed) values one that extends the front, but
 * only at a bounded trade-off (loss per front extent at most MAX_TRADE_OFF times the
 * gain): the candidate trading 1 for 0.5 is valued far above the fixed reference's zero,
 * the one trading 2 for 0.01 exactly as under the fixed reference. */
static void followed_reference_values_extensions_at_a_bounded_trade_off(void **state) {
  (void)state;
  gp *g[2];
  exact_models(g);
  acq_models m = {.n_obj = 2, .obj = g};
  const double *X = exact_points;
  double ref[2] = {1.1, 1.1}, margin[2] = {0.1, 0.1};
  mc_options fixed = {.utility = MC_HVI, .n_samples = 16, .seed = 3, .ref = ref};
  mc_options follow = fixed;
  follow.margin = margin;
  mc_acq *a, *b;
  nas_err err;
  assert_int_equal(mc_acq_create(&m, X, 3, &fixed, &a, &err), NAS_OK);
  assert_int_equal(mc_acq_create(&m, X, 3, &follow, &b, &err), NAS_OK);
  const double *bounded = X + 3 * D, *unbounded = X + 4 * D;
  assert_true(mc_acq_eval(b, bounded, NULL) > mc_acq_eval(a, bounded, NULL) + 5.0);
  assert_true(mc_acq_eval(b, bounded, NULL) > log(1e-3));
  double at_fixed = mc_acq_eval(a, unbounded, NULL);
  assert_near(mc_acq_eval(b, unbounded, NULL), at_fixed, 1e-9 * fabs(at_fixed));
  mc_acq_free(a);
  mc_acq_free(b);
  gp_free(g[0]);
  gp_free(g[1]);
}

/* The bound on a trade-off, per extent of the front (low, high) in each objective: with the
 * front spanning [0, 1] in both, a point 1 past the worst first value that gains 0.5 past
 * the best second value extends it properly, one 2 past that gains 0.01 does not; the
 * extents are at least the margins, so a one-point front still has a scale. */
static void trade_off_bound_counts_loss_and_gain_in_front_extents(void **state) {
  (void)state;
  double low[2] = {0, 0}, high[2] = {1, 1}, margin[2] = {0.1, 0.1};
  assert_true(acq_trade_off_bounded((double[]){2, -0.5}, 2, 0, low, high, margin));
  assert_false(acq_trade_off_bounded((double[]){3, -0.01}, 2, 0, low, high, margin));
  assert_false(acq_trade_off_bounded((double[]){2, 0.5}, 2, 0, low, high, margin)); /* no gain */
  double point[2] = {0.5, 0.5}, wide[2] = {1, 1};
  assert_true(acq_trade_off_bounded((double[]){1, 0.4}, 2, 0, point, point, wide));
  assert_false(acq_trade_off_bounded((double[]){2, 0.4}, 2, 0, point, point, wide));
}

/* A front's floor: two distinct front points sharing an objective's best value (a face of a
 * three-objective front) make it one; a single point at it, or the same row twice (one
 * configuration evaluated twice), does not. */
static void front_floors_are_best_values_that_distinct_front_points_share(void **state) {
  (void)state;
  double Y[] = {0, 1.3, 0.2, 0, 0.9, 0.6, 0.5, 0.5, 0.5, 1, 0, 1, 2, 2, 2};
  bool on_front[5];
  double low[3], high[3], floor[3];
  acq_front_bounds(Y, 5, 3, on_front, low, high);
  nas_err err;
  assert_int_equal(acq_front_floors(Y, 5, 3, low, floor, &err), NAS_OK);
  assert_near(floor[0], 0, 0);
  assert_true(isnan(floor[1]));
  assert_true(isnan(floor[2]));
  double twice[] = {0, 1, 0, 1, 1, 0};
  acq_front_bounds(twice, 3, 2, on_front, low, high);
  assert_int_equal(acq_front_floors(twice, 3, 2, low, floor, &err), NAS_OK);
  assert_true(isnan(floor[0]) && isnan(floor[1]));
}

/* With two objectives a face is the front's end: DTLZ2's f2 is 0 wherever x0 = 0, so the
 * front holds one point there, (1.1, 0), and a trial with a worse f1 at the same 0 lies
 * behind it. Two different rows at the best value make it a floor, front or not. */
static void front_floors_count_rows_behind_the_front(void **state) {
  (void)state;
  double Y[] = {1.4, 0, 1.1, 0, 0.5, 0.6, 0, 1.2};
  bool on_front[4];
  double low[2], high[2], floor[2];
  nas_err err;
  acq_front_bounds(Y, 4, 2, on_front, low, high);
  assert_false(on_front[0]);
  assert_int_equal(acq_front_floors(Y, 4, 2, low, floor, &err), NAS_OK);
  assert_true(isnan(floor[0]));
  assert_near(floor[1], 0, 0);
}

/* A bound reached in floating point: DTLZ2's f1 at x0 = 1 is (1 + g)·cos(π/2)·… ≈ 6·10⁻¹⁷
 * times a factor that differs between trials, never 0. Values within round-off of the
 * objective's range above its best tie with it, so that bound is a floor as an exact 0 would
 * be; values merely small (10⁻⁹ of the range apart) are distinct. */
static void front_floors_take_values_within_round_off_of_the_best_as_ties(void **state) {
  (void)state;
  double Y[] = {6.1e-17, 1.2, 1.3e-16, 0.9, 0.5, 0.5, 1.5, 0};
  bool on_front[4];
  double low[2], high[2], floor[2];
  nas_err err;
  acq_front_bounds(Y, 4, 2, on_front, low, high);
  assert_int_equal(acq_front_floors(Y, 4, 2, low, floor, &err), NAS_OK);
  assert_near(floor[0], 6.1e-17, 0);
  assert_true(isnan(floor[1]));
  double small[] = {1e-9, 1.2, 2.5e-9, 0.9, 0.5, 0.5, 1.5, 0};
  acq_front_bounds(small, 4, 2, on_front, low, high);
  assert_int_equal(acq_front_floors(small, 4, 2, low, floor, &err), NAS_OK);
  assert_true(isnan(floor[0]) && isnan(floor[1]));
}

/* A metric of few distinct values (here objective 0, repeating 0.5 between two different
 * rows off its best) ties at its best by chance, not at a bound: no floor, and a value
 * repeated only by one row observed twice does not count as such a tie. */
static void front_floors_skip_objectives_whose_values_tie_elsewhere(void **state) {
  (void)state;
  double Y[] = {0, 1.3, 0.2, 0, 0.9, 0.6, 0.5, 0.5, 0.5, 0.5, 0.7, 0.4, 2, 2, 2};
  bool on_front[5];
  double low[3], high[3], floor[3];
  nas_err err;
  acq_front_bounds(Y, 5, 3, on_front, low, high);
  assert_int_equal(acq_front_floors(Y, 5, 3, low, floor, &err), NAS_OK);
  assert_true(isnan(floor[0]));
  double repeated[] = {0, 1.3, 0.2, 0, 0.9, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2, 2, 2};
  acq_front_bounds(repeated, 5, 3, on_front, low, high);
  assert_int_equal(acq_front_floors(repeated, 5, 3, low, floor, &err), NAS_OK);
  assert_near(floor[0], 0, 0);
}

/* exact_models' candidate (2, -0.5) improves on the front (0, 1), (0.5, 0.5), (1, 0) only
 * below the second objective's best value 0: against the reference (3, 1.1) it is worth
 * [2, 3] × [-0.5, 0], and nothing once 0 is that objective's floor (its samples held at 0 are
 * dominated by (1, 0)). A floor below every sample changes no value; where it holds some
 * samples, the gradient still matches finite differences. */
static void mc_hvi_counts_no_candidate_sample_below_a_floor(void **state) {
  (void)state;
  gp *g[2];
  exact_models(g);
  acq_models m = {.n_obj = 2, .obj = g};
  const double *X = exact_points;
  double ref[2] = {3, 1.1}, at_best[2] = {NAN, 0}, far_below[2] = {-1e9, -1e9};
  mc_options none = {.utility = MC_HVI, .n_samples = 16, .seed = 3, .ref = ref};
  mc_options floored = none, below = none;
  floored.floor = at_best;
  below.floor = far_below;
  mc_acq *a, *b, *c;
  nas_err err;
  assert_int_equal(mc_acq_create(&m, X, 3, &none, &a, &err), NAS_OK);
  assert_int_equal(mc_acq_create(&m, X, 3, &floored, &b, &err), NAS_OK);
  assert_int_equal(mc_acq_create(&m, X, 3, &below, &c, &err), NAS_OK);
  const double *candidate = X + 3 * D;
  double unfloored = mc_acq_eval(a, candidate, NULL);
  assert_true(unfloored > log(0.1));
  assert_true(mc_acq_eval(b, candidate, NULL) < unfloored - 5.0);
  double between[D] = {0.3, 0.6};
  assert_near(mc_acq_eval(c, between, NULL), mc_acq_eval(a, between, NULL), 0.0);
  mc_acq_free(a);
  mc_acq_free(b);
  mc_acq_free(c);
  gp_free(g[0]);
  gp_free(g[1]);
  toy_models t;
  toy_make(&t, 2);
  acq_models toy = {.n_obj = 2, .obj = t.g};
  double toy_ref[2] = {1.5, 1.5}, toy_floor[2] = {0.3, 0.8};
  mc_options opt = {.utility = MC_HVI, .n_samples = 32, .seed = 5, .ref = toy_ref,
                    .floor = toy_floor};
  assert_int_equal(mc_acq_create(&toy, t.X, 4, &opt, &a, &err), NAS_OK);
  double xs[3][D] = {{0.3, 0.8}, {0.9, 0.1}, {0.05, 0.5}};
  for (int i = 0; i < 3; i++) check_gradient(mc_acq_eval, a, xs[i], 1e-4);
  mc_acq_free(a);
  toy_free(&t, 2);
}

/* The points of the posterior draws' tests: the five exact_models knows, then one far
 * from them. */
static const double draw_points[6 * D] = {0.1, 0.1, 0.5, 0.5, 0.9, 0.9, 0.1, 0.9, 0.9, 0.1, 0.3, 0.7};

/* A joint posterior draw passes through points the models know exactly, varies with the seed
 * where they know little, and is the same for the same seed. */
static void posterior_draw_keeps_known_points_and_varies_elsewhere(void **state) {
  (void)state;
  gp *g[2];
  exact_models(g);
  acq_models m = {.n_obj = 2, .obj = g};
  double y[2][5] = {{0, 0.5, 1, 2, 3}, {1, 0.5, 0, -0.5, -0.01}};
  double F[6 * 2], again[6 * 2], other[6 * 2];
  nas_err err;
  assert_int_equal(acq_posterior_draw(&m, draw_points, 6, 1, 7, F, &err), NAS_OK);
  assert_int_equal(acq_posterior_draw(&m, draw_points, 6, 1, 7, again, &err), NAS_OK);
  assert_int_equal(acq_posterior_draw(&m, draw_points, 6, 1, 8, other, &err), NAS_OK);
  for (size_t i = 0; i < 5; i++)
    for (size_t k = 0; k < 2; k++) assert_near(F[i * 2 + k], y[k][i], 1e-3);
  assert_memory_equal(F, again, sizeof F);
  assert_true(fabs(F[5 * 2] - other[5 * 2]) > 1e-3 || fabs(F[5 * 2 + 1] - other[5 * 2 + 1]) > 1e-3);
  gp_free(g[0]);
  gp_free(g[1]);
}

/* Several draws at once: draw t is the single draw of seed + t (the factorisation shared),
 * so more draws never change the first ones, and the draws differ where the models know
 * little. */
static void posterior_draws_are_each_the_draw_of_their_own_seed(void **state) {
  (void)state;
  gp *g[2];
  exact_models(g);
  acq_models m = {.n_obj = 2, .obj = g};
  double three[3 * 6 * 2], single[6 * 2];
  nas_err err;
  assert_int_equal(acq_posterior_draw(&m, draw_points, 6, 3, 7, three, &err), NAS_OK);
  for (size_t t = 0; t < 3; t++) {
    assert_int_equal(acq_posterior_draw(&m, draw_points, 6, 1, 7 + t, single, &err), NAS_OK);
    for (size_t i = 0; i < 6 * 2; i++) assert_near(three[t * 12 + i], single[i], 1e-9);
  }
  assert_true(fabs(three[5 * 2] - three[12 + 5 * 2]) > 1e-3);
  gp_free(g[0]);
  gp_free(g[1]);
}

/* Points far worse than another in both objectives go; the rest stay. */
static void pruning_drops_surely_dominated_points(void **state) {
  (void)state;
  toy_models t;
  toy_make(&t, 2);
  acq_models m = {.n_obj = 2, .obj = t.g};
  size_t keep[N_OBS], n_keep;
  nas_err err;
  assert_int_equal(acq_prune_baseline(&m, t.X, N_OBS, N_OBS, keep, &n_keep, &err), NAS_OK);
  assert_true(n_keep >= 1 && n_keep < N_OBS);
  size_t capped[N_OBS], n_capped;
  assert_int_equal(acq_prune_baseline(&m, t.X, N_OBS, 2, capped, &n_capped, &err), NAS_OK);
  assert_int_equal(n_capped, n_keep < 2 ? n_keep : 2);
  for (size_t i = 1; i < n_keep; i++) assert_true(keep[i - 1] < keep[i]);
  toy_free(&t, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(box_hvi_equals_brute_force_hypervolume_improvement),
      cmocka_unit_test(capped_log_hvi_equals_log_of_hvi_against_the_cap),
      cmocka_unit_test(capped_log_hvi_gradient_matches_finite_differences),
      cmocka_unit_test(boxes_cover_the_non_dominated_region_exactly),
      cmocka_unit_test(log_hvi_equals_log_of_hvi_where_hvi_is_not_tiny),
      cmocka_unit_test(log_hvi_rises_towards_the_front_where_hvi_is_zero),
      cmocka_unit_test(log_hvi_gradient_matches_finite_differences),
      cmocka_unit_test(log_h_equals_log_ei_where_ei_is_not_tiny),
      cmocka_unit_test(log_h_stays_finite_and_monotone_in_the_far_tail),
      cmocka_unit_test(log_ndtr_and_fat_sigmoid_slopes_match_finite_differences),
      cmocka_unit_test(logei_equals_log_of_expected_improvement),
      cmocka_unit_test(logei_gradient_matches_finite_differences),
      cmocka_unit_test(mc_acquisition_gradients_match_finite_differences),
      cmocka_unit_test(factorisation_failures_name_the_outcomes_metric),
      cmocka_unit_test(mc_hvi_is_deterministic_and_prefers_improvement),
      cmocka_unit_test(followed_reference_values_extensions_at_a_bounded_trade_off),
      cmocka_unit_test(trade_off_bound_counts_loss_and_gain_in_front_extents),
      cmocka_unit_test(front_floors_are_best_values_that_distinct_front_points_share),
      cmocka_unit_test(front_floors_skip_objectives_whose_values_tie_elsewhere),
      cmocka_unit_test(front_floors_take_values_within_round_off_of_the_best_as_ties),
      cmocka_unit_test(front_floors_count_rows_behind_the_front),
      cmocka_unit_test(mc_hvi_counts_no_candidate_sample_below_a_floor),
      cmocka_unit_test(posterior_draw_keeps_known_points_and_varies_elsewhere),
      cmocka_unit_test(posterior_draws_are_each_the_draw_of_their_own_seed),
      cmocka_unit_test(pruning_drops_surely_dominated_points),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
