/* Tests of Pareto fronts, non-dominated sorting, hypervolumes and reference points
 * (optimizer/pareto.c, optimizer/hypervolume.c): hand cases, and random sets against brute
 * force (inclusion-exclusion, grids over the union of boxes, peeling fronts one by one). */
#include "tests/testutil.h"

#include <gsl/gsl_rng.h>
#include <float.h>
#include <math.h>

#include "optimizer/optimizer.h"

/* ---- references ------------------------------------------------------------------------ */

static bool ref_dominates(const double *a, const double *b, size_t m) {
  bool all_le = true, some_lt = false;
  for (size_t j = 0; j < m; j++) {
    all_le = all_le && a[j] <= b[j];
    some_lt = some_lt || a[j] < b[j];
  }
  return all_le && some_lt;
}

static bool ref_has_nan(const double *a, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (a[j] != a[j]) return true;
  return false;
}

/* Ranks by peeling: the front of what is left, again and again. */
static void ref_ranks(const double *Y, size_t n, size_t m, int *rank) {
  for (size_t i = 0; i < n; i++) rank[i] = ref_has_nan(Y + i * m, m) ? -1 : -2;
  for (int r = 0;; r++) {
    bool any = false;
    int *now = calloc(n, sizeof *now);
    for (size_t i = 0; i < n; i++) {
      if (rank[i] != -2) continue;
      bool dominated = false;
      for (size_t k = 0; k < n && !dominated; k++)
        dominated = rank[k] == -2 && ref_dominates(Y + k * m, Y + i * m, m);
      now[i] = !dominated;
    }
    for (size_t i = 0; i < n; i++)
      if (now[i]) rank[i] = r, any = true;
    free(now);
    if (!any) break;
  }
}

/* Inclusion-exclusion over all subsets of the points inside ref: exact for small n. */
static double ref_hv_subsets(const double *Y, size_t n, size_t m, const double *ref) {
  double *in = malloc((n * m + 1) * sizeof *in);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool inside = true;
    for (size_t j = 0; j < m; j++) inside = inside && Y[i * m + j] < ref[j];
    if (inside) memcpy(in + k++ * m, Y + i * m, m * sizeof *in);
  }
  double total = 0;
  for (unsigned long mask = 1; mask < (1UL << k); mask++) {
    double vol = 1;
    for (size_t j = 0; j < m; j++) {
      double worst = -INFINITY;
      for (size_t i = 0; i < k; i++)
        if (mask >> i & 1) worst = fmax(worst, in[i * m + j]);
      vol *= ref[j] - worst;
    }
    total += __builtin_popcountl(mask) % 2 ? vol : -vol;
  }
  free(in);
  return total;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sums the cells of the grid made by all coordinates that some point's box covers. */
static double ref_hv_grid(const double *Y, size_t n, size_t m, const double *ref) {
  double *axes[8];
  size_t sizes[8], cells = 1;
  for (size_t j = 0; j < m; j++) {
    axes[j] = malloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) axes[j][i] = fmin(Y[i * m + j], ref[j]);
    axes[j][n] = ref[j];
    qsort(axes[j], n + 1, sizeof(double), cmp_double);
    sizes[j] = n; /* cells between consecutive coordinates */
    cells *= sizes[j];
  }
  double total = 0;
  size_t idx[8] = {0};
  for (size_t c = 0; c < cells; c++) {
    size_t rest = c;
    double corner[8], vol = 1;
    for (size_t j = 0; j < m; j++) {
      idx[j] = rest % sizes[j];
      rest /= sizes[j];
      corner[j] = axes[j][idx[j]];
      vol *= axes[j][idx[j] + 1] - axes[j][idx[j]];
    }
    if (vol == 0) continue;
    for (size_t i = 0; i < n; i++) {
      bool covers = true;
      for (size_t j = 0; j < m && covers; j++)
        covers = Y[i * m + j] <= corner[j] && Y[i * m + j] < ref[j];
      if (covers) {
        total += vol;
        break;
      }
    }
  }
  for (size_t j = 0; j < m; j++) free(axes[j]);
  return total;
}

/* Random points: integers 0..9 (many ties and duplicates) or reals, sometimes outside ref. */
static void random_points(gsl_rng *rng, double *Y, size_t n, size_t m, bool ties) {
  for (size_t i = 0; i < n * m; i++)
    Y[i] = ties ? (double)gsl_rng_uniform_int(rng, 11) : 11 * gsl_rng_uniform(rng);
}

/* Points on the positive unit sphere: all mutually non-dominated, the hard case. */
static void sphere_points(gsl_rng *rng, double *Y, size_t n, size_t m) {
  for (size_t i = 0; i < n; i++) {
    double norm = 0;
    for (size_t j = 0; j < m; j++) {
      Y[i * m + j] = fabs(gsl_rng_uniform_pos(rng) - 0.5) + 1e-3;
      norm += Y[i * m + j] * Y[i * m + j];
    }
    for (size_t j = 0; j < m; j++) Y[i * m + j] = 1 - Y[i * m + j] / sqrt(norm);
  }
}

static void assert_close(double got, double want) {
  if (!(fabs(got - want) <= 1e-9 * fmax(1.0, fabs(want))))
    fail_msg("got %.17g, want %.17g", got, want);
}

/* ---- fronts ---------------------------------------------------------------------------- */

static void front_keeps_duplicates_and_drops_nan_rows(void **state) {
  (void)state;
  const double Y[] = {
      1,   5,   /* front */
      1,   5,   /* its duplicate: also front */
      2,   2,   /* front */
      2,   3,   /* dominated by (2,2) */
      NAN, 0,   /* NaN: never on the front, dominates nothing */
      5,   1,   /* front */
      0,   NAN, /* NaN */
      6,   1,   /* dominated by (5,1) */
  };
  bool mask[8];
  int rank[8];
  pareto_mask(Y, 8, 2, mask);
  const bool want[] = {true, true, true, false, false, true, false, false};
  for (int i = 0; i < 8; i++) assert_int_equal(mask[i], want[i]);
  nas_err err;
  assert_int_equal(pareto_ranks(Y, 8, 2, rank, &err), 0);
  const int want_rank[] = {0, 0, 0, 1, -1, 0, -1, 1};
  for (int i = 0; i < 8; i++) assert_int_equal(rank[i], want_rank[i]);
}

static void ranks_count_fronts_in_order(void **state) {
  (void)state;
  /* Three nested staircases. */
  const double Y[] = {3, 3, 1, 1, 2, 2, 1, 3, 3, 1, 2, 4, 4, 2, 0, 5};
  int rank[8];
  nas_err err;
  assert_int_equal(pareto_ranks(Y, 8, 2, rank, &err), 0);
  const int want[] = {2, 0, 1, 1, 1, 2, 2, 0};
  for (int i = 0; i < 8; i++) assert_int_equal(rank[i], want[i]);
  assert_int_equal(pareto_ranks(Y, 0, 2, rank, &err), 0);
}

static void masks_and_ranks_match_brute_force(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double Y[300 * 4];
  int rank[300], want[300];
  bool mask[300];
  nas_err err;
  for (int t = 0; t < 60; t++) {
    size_t m = 1 + t % 4, n = 1 + gsl_rng_uniform_int(rng, 300);
    random_points(rng, Y, n, m, t % 2 == 0);
    if (t % 3 == 0) Y[gsl_rng_uniform_int(rng, n * m)] = NAN;
    pareto_mask(Y, n, m, mask);
    assert_int_equal(pareto_ranks(Y, n, m, rank, &err), 0);
    ref_ranks(Y, n, m, want);
    for (size_t i = 0; i < n; i++) {
      assert_int_equal(rank[i], want[i]);
      assert_int_equal(mask[i], want[i] == 0);
    }
  }
  gsl_rng_free(rng);
}

/* Two objectives take a sort and a sweep rather than the pairwise test: the same front on
 * sets full of ties (values from a handful of levels, so equal first values, equal second
 * values and duplicate rows abound), infinities and NaNs. */
static void front_of_two_objectives_matches_pairwise_test_with_ties(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  const double levels[] = {-INFINITY, -1, 0, 0.5, 1, 2, INFINITY, NAN};
  double Y[400 * 2];
  bool mask[400];
  for (int t = 0; t < 500; t++) {
    size_t n = gsl_rng_uniform_int(rng, 400), n_levels = 2 + t % 7; /* NaN only when t%7 == 6 */
    for (size_t k = 0; k < 2 * n; k++)
      Y[k] = t % 4 == 3 ? gsl_rng_uniform(rng) : levels[gsl_rng_uniform_int(rng, n_levels)];
    pareto_mask(Y, n, 2, mask);
    for (size_t i = 0; i < n; i++) {
      bool dominated = ref_has_nan(Y + 2 * i, 2);
      for (size_t k = 0; k < n && !dominated; k++)
        dominated = !ref_has_nan(Y + 2 * k, 2) && ref_dominates(Y + 2 * k, Y + 2 * i, 2);
      assert_int_equal(mask[i], !dominated);
    }
  }
  gsl_rng_free(rng);
}

/* ---- hypervolume ------------------------------------------------------------------------ */

static void hypervolume_hand_cases(void **state) {
  (void)state;
  const double ref2[] = {4, 4};
  const double one[] = {1, 2};
  assert_close(pareto_hypervolume(one, 1, 2, ref2), 3 * 2);
  const double two[] = {1, 3, 3, 1};
  assert_close(pareto_hypervolume(two, 2, 2, ref2), 3 + 3 - 1);
  /* Points on or beyond ref add nothing; a NaN row neither; duplicates count once. */
  const double outside[] = {1, 3, 3, 1, 4, 0, 0, 5, NAN, 0, 1, 3};
  assert_close(pareto_hypervolume(outside, 6, 2, ref2), 5);
  assert_close(pareto_hypervolume(outside, 0, 2, ref2), 0);
  const double ref1[] = {10};
  const double m1[] = {4, 2, 11, 7};
  assert_close(pareto_hypervolume(m1, 4, 1, ref1), 8);
  /* Three unit-offset cubes in 3-D: union by inclusion-exclusion by hand. */
  const double ref3[] = {2, 2, 2};
  const double cubes[] = {0, 1, 1, 1, 0, 1, 1, 1, 0};
  assert_close(pareto_hypervolume(cubes, 3, 3, ref3), 3 * 2 - 3 * 1 + 1);
  /* A point dominating another makes it irrelevant, in any dimension. */
  const double ref5[] = {1, 1, 1, 1, 1};
  const double nested[] = {0.5, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0, 0};
  assert_close(pareto_hypervolume(nested, 2, 5, ref5), 1);
  const double corner4[] = {0, 0.5, 0.5, 0.5, 0.5, 0, 0.5, 0.5};
  const double ref4[] = {1, 1, 1, 1};
  assert_close(pareto_hypervolume(corner4, 2, 4, ref4), 0.125 * 2 - 0.0625);
}

static void hypervolume_matches_inclusion_exclusion(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double Y[12 * 5], ref[5] = {10, 10, 10, 10, 10};
  for (int t = 0; t < 400; t++) {
    size_t m = 2 + t % 4, n = 1 + gsl_rng_uniform_int(rng, 12);
    random_points(rng, Y, n, m, t % 2 == 0);
    assert_close(pareto_hypervolume(Y, n, m, ref), ref_hv_subsets(Y, n, m, ref));
  }
  gsl_rng_free(rng);
}

static void hypervolume_matches_grid_on_larger_sets(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double Y[120 * 4], ref[4] = {10, 10, 10, 10};
  for (int t = 0; t < 30; t++) {
    size_t m = 2 + t % 3, n = m == 2 ? 120 : m == 3 ? 40 : 14;
    if (t % 2)
      sphere_points(rng, Y, n, m);
    else
      random_points(rng, Y, n, m, t % 4 == 0);
    const double *r = t % 2 ? (const double[]){1, 1, 1, 1} : ref;
    assert_close(pareto_hypervolume(Y, n, m, r), ref_hv_grid(Y, n, m, r));
  }
  gsl_rng_free(rng);
}

/* The same set in another order has the same volume; the fronts of 3-D sweeps exercise the
 * ordered set across several 64-bit words. */
static void hypervolume_ignores_row_order(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  enum { n = 700 };
  static double Y[n * 4], Z[n * 4];
  const double ref[] = {1, 1, 1, 1};
  for (size_t m = 2; m <= 4; m++) {
    size_t rows = m == 4 ? 60 : n;
    sphere_points(rng, Y, rows, m);
    for (size_t i = 0; i < rows; i++) memcpy(Z + i * m, Y + (rows - 1 - i) * m, m * sizeof *Y);
    assert_close(pareto_hypervolume(Y, rows, m, ref), pareto_hypervolume(Z, rows, m, ref));
  }
  gsl_rng_free(rng);
}

static double timed_hypervolume(gsl_rng *rng, size_t n, size_t m) {
  double *Y = malloc(n * m * sizeof *Y);
  const double ref[] = {1, 1, 1, 1, 1};
  sphere_points(rng, Y, n, m);
  double start = nas_monotonic();
  double hv = pareto_hypervolume(Y, n, m, ref);
  double seconds = nas_monotonic() - start;
  assert_true(hv > 0 && hv < 1);
  free(Y);
  return seconds;
}

/* All points non-dominated (the hard case): prints the times, bounds them loosely. */
static void hypervolume_is_fast_enough(void **state) {
  (void)state;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double t2 = timed_hypervolume(rng, 1000, 2), t3 = timed_hypervolume(rng, 1000, 3);
  double t3big = timed_hypervolume(rng, 100000, 3), t5 = timed_hypervolume(rng, 100, 5);
  print_message(
      "hypervolume: n=1000 m=2 %.2f ms, n=1000 m=3 %.2f ms, n=100000 m=3 %.1f ms, "
      "n=100 m=5 %.1f ms\n",
      t2 * 1e3, t3 * 1e3, t3big * 1e3, t5 * 1e3);
  assert_true(t2 < 0.1 && t3 < 0.1 && t3big < 2 && t5 < 2);
  gsl_rng_free(rng);
}

/* ---- reference point --------------------------------------------------------------------- */

static spec *two_objectives(const char *objectives) {
  char *yaml = NULL;
  assert_true(asprintf(&yaml,
                       "name: r\nparameters:\n  x: {type: float, low: 0, high: 1}\n"
                       "objectives:\n%s"
                       "trial:\n  command: [x]\nbudget:\n  trials: 1\n",
                       objectives) > 0);
  spec *s;
  nas_err err;
  if (spec_parse(yaml, "<test>", "/tmp", &s, &err) < 0) fail_msg("spec: %s", err.msg);
  free(yaml);
  return s;
}

static void reference_point_uses_thresholds_in_minimisation_terms(void **state) {
  (void)state;
  spec *s = two_objectives(
      "  - {name: loss, goal: minimize, threshold: 2.5}\n"
      "  - {name: acc, goal: maximize, threshold: 0.8}\n");
  const double Y[] = {1, -0.9, 2, -0.95};
  double ref[2];
  pareto_reference_point(s, Y, 2, ref);
  assert_true(ref[0] == 2.5 && ref[1] == -0.8);
  double raw[] = {3, 0.9}, min[2];
  pareto_objectives_to_min(s, raw, min);
  assert_true(min[0] == 3 && min[1] == -0.9);
  spec_free(s);
}

static void reference_point_pushes_the_nadir_out_by_a_tenth_of_the_range(void **state) {
  (void)state;
  spec *s = two_objectives("  - {name: a, goal: minimize}\n  - {name: b, goal: minimize}\n");
  /* Front: (0, 4), (1, 1), (4, 0); (5, 5) dominated; NaN and inf rows ignored. */
  const double Y[] = {0, 4, 1, 1, 4, 0, 5, 5, NAN, -100, -INFINITY, 3};
  double ref[2];
  pareto_reference_point(s, Y, 6, ref);
  assert_close(ref[0], 4 + 0.1 * 5);
  assert_close(ref[1], 4 + 0.1 * 5);
  /* One distinct value: pushed by 1e-6·(1 + |nadir|). */
  const double same[] = {3, -2, 3, -2};
  pareto_reference_point(s, same, 2, ref);
  assert_close(ref[0], 3 + 4e-6);
  assert_close(ref[1], -2 + 3e-6);
  /* Nothing observed: no reference yet. */
  pareto_reference_point(s, NULL, 0, ref);
  assert_true(isnan(ref[0]) && isnan(ref[1]));
  spec_free(s);
}

/* The margins are the distance of each reference coordinate beyond the front's nadir:
 * a tenth of the observed range, 0 for a threshold. */
static void reference_margins_are_zero_for_thresholds_and_a_tenth_of_the_range(void **state) {
  (void)state;
  spec *s = two_objectives("  - {name: a, goal: minimize}\n"
                           "  - {name: b, goal: maximize, threshold: -1}\n");
  /* (a, −b) rows: front (0, 4), (1, 1), (4, 0); (5, 5) dominated */
  const double Y[] = {0, 4, 1, 1, 4, 0, 5, 5};
  double ref[2], margin[2];
  pareto_reference_margins(s, Y, 4, ref, margin);
  assert_close(ref[0], 4 + 0.5);
  assert_close(margin[0], 0.5);
  assert_true(ref[1] == 1 && margin[1] == 0);
  pareto_reference_margins(s, NULL, 0, ref, margin);
  assert_true(isnan(ref[0]) && isnan(margin[0]));
  spec_free(s);
}

/* Values spanning more than the largest double (±1.7e308) made the range, the margin and
 * the reference inf, which JSON cannot hold: `nas ask` failed with "out of memory". The
 * reference stays finite: the range at most DBL_MAX, the point too. */
static void reference_point_stays_finite_for_values_spanning_more_than_a_double(void **state) {
  (void)state;
  spec *s = two_objectives("  - {name: a, goal: minimize}\n  - {name: b, goal: minimize}\n");
  const double Y[] = {1.7e308, 5, -1.7e308, 0}; /* front: the second row alone */
  double ref[2], margin[2];
  pareto_reference_margins(s, Y, 2, ref, margin);
  assert_close(margin[0], 0.1 * DBL_MAX);
  assert_close(ref[0], -1.7e308 + 0.1 * DBL_MAX);
  const double both[] = {1.7e308, 1, -1.7e308, 2}; /* nadir 1.7e308: no room for the margin */
  pareto_reference_margins(s, both, 2, ref, margin);
  assert_true(ref[0] == DBL_MAX && isfinite(margin[0]));
  spec_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(front_keeps_duplicates_and_drops_nan_rows),
      cmocka_unit_test(ranks_count_fronts_in_order),
      cmocka_unit_test(masks_and_ranks_match_brute_force),
      cmocka_unit_test(front_of_two_objectives_matches_pairwise_test_with_ties),
      cmocka_unit_test(hypervolume_hand_cases),
      cmocka_unit_test(hypervolume_matches_inclusion_exclusion),
      cmocka_unit_test(hypervolume_matches_grid_on_larger_sets),
      cmocka_unit_test(hypervolume_ignores_row_order),
      cmocka_unit_test(hypervolume_is_fast_enough),
      cmocka_unit_test(reference_point_uses_thresholds_in_minimisation_terms),
      cmocka_unit_test(reference_point_pushes_the_nadir_out_by_a_tenth_of_the_range),
      cmocka_unit_test(reference_margins_are_zero_for_thresholds_and_a_tenth_of_the_range),
      cmocka_unit_test(reference_point_stays_finite_for_values_spanning_more_than_a_double),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
