/* Tests of the optimizer interface with the random and sobol types (optimizer/optimizer.c,
 * random.c, sobol.c, taken.c, design.c): determinism per trial number, valid and fresh
 * suggestions, exhausted spaces, options, argument checks, the Sobol design. */
#include "tests/testutil.h"

#include <math.h>

#include "optimizer/design.h"
#include "optimizer/optimizer.h"

static const char *const space_yaml =
    "  lr: {type: float, low: 1.0e-5, high: 0.1, log: true}\n"
    "  layers: {type: int, low: 1, high: 6}\n"
    "  width: {type: int, low: 8, high: 512, log: true}\n"
    "  drop: {type: float, low: 0, high: 0.5, step: 0.05}\n"
    "  opt: {type: categorical, choices: [sgd, adam]}\n"
    "  beta: {type: float, low: 0.9, high: 0.999, when: \"opt == adam\"}\n"
    "  tag: {type: fixed, value: v1}\n";

/* A spec with the given optimizer section, seed and parameters. */
static spec *load(const char *optimizer, long seed, const char *params) {
  char *yaml = NULL;
  assert_true(asprintf(&yaml,
                       "name: t\nseed: %ld\nparameters:\n%s"
                       "objectives:\n  - {name: loss, goal: minimize}\n"
                       "trial:\n  command: [x]\nbudget:\n  trials: 10\n"
                       "optimizer:\n%s",
                       seed, params, optimizer) > 0);
  spec *s;
  nas_err err = {{0}};
  if (spec_parse(yaml, "<test>", "/tmp", &s, &err) < 0) fail_msg("spec: %s", err.msg);
  free(yaml);
  return s;
}

static optimizer *make(const spec *s) {
  optimizer *opt;
  nas_err err = {{0}};
  if (optimizer_create(s, &opt, &err) < 0) fail_msg("optimizer: %s", err.msg);
  return opt;
}

/* n suggestions in one call, with the given pending assignments. */
static void suggest(optimizer *opt, const json_t *const *pending, size_t n_pending, size_t n,
                    int first, json_t **out) {
  nas_err err = {{0}};
  if (optimizer_suggest(opt, NULL, 0, pending, n_pending, n, first, out, NULL, &err) < 0)
    fail_msg("suggest: %s", err.msg);
}

static char *dump(const json_t *v) {
  return json_dumps(v, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17));
}

static void assert_same_json(const json_t *a, const json_t *b) {
  char *ta = dump(a), *tb = dump(b);
  if (strcmp(ta, tb) != 0) fail_msg("%s != %s", ta, tb);
  free(ta);
  free(tb);
}

static void release(json_t **v, size_t n) {
  for (size_t i = 0; i < n; i++) json_decref(v[i]);
}

static const char *const types[] = {"  type: random\n", "  type: sobol\n"};

/* Same seed and numbers give the same JSON, however the calls are batched (as the
 * scheduler does: earlier suggestions are pending in later calls). */
static void suggestions_depend_on_seed_and_number_only(void **state) {
  (void)state;
  for (size_t t = 0; t < 2; t++) {
    spec *s = load(types[t], 11, space_yaml);
    optimizer *a = make(s), *b = make(s);
    enum { n = 24 };
    json_t *batch[n], *single[n], *again[n];
    suggest(a, NULL, 0, n, 5, batch);
    suggest(b, NULL, 0, n, 5, again);
    for (size_t i = 0; i < n; i++)
      suggest(b, (const json_t *const *)single, i, 1, 5 + (int)i, &single[i]);
    for (size_t i = 0; i < n; i++) {
      assert_same_json(batch[i], single[i]);
      assert_same_json(batch[i], again[i]);
    }
    /* Another seed: other suggestions. */
    spec *s2 = load(types[t], 12, space_yaml);
    optimizer *c = make(s2);
    json_t *other[n];
    suggest(c, NULL, 0, n, 5, other);
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += json_equal(other[i], batch[i]);
    assert_true(same < 3);
    release(batch, n);
    release(single, n);
    release(again, n);
    release(other, n);
    optimizer_free(a);
    optimizer_free(b);
    optimizer_free(c);
    spec_free(s);
    spec_free(s2);
  }
}

static void suggestions_are_valid_and_cover_the_space(void **state) {
  (void)state;
  for (size_t t = 0; t < 2; t++) {
    spec *s = load(types[t], 3, space_yaml);
    optimizer *opt = make(s);
    enum { n = 400 };
    json_t *out[n];
    suggest(opt, NULL, 0, n, 0, out);
    int layers[7] = {0}, adam = 0;
    double lr_low = 1, lr_high = 0;
    for (size_t i = 0; i < n; i++) {
      nas_err err = {{0}};
      if (spec_check_params(s, out[i], &err) < 0) fail_msg("%s", err.msg);
      layers[json_integer_value(json_object_get(out[i], "layers"))]++;
      adam += strcmp(json_string_value(json_object_get(out[i], "opt")), "adam") == 0;
      double lr = json_real_value(json_object_get(out[i], "lr"));
      lr_low = fmin(lr_low, lr);
      lr_high = fmax(lr_high, lr);
    }
    for (int k = 1; k <= 6; k++) assert_true(layers[k] > n / 6 - 25 && layers[k] < n / 6 + 25);
    assert_true(adam > n / 2 - 40 && adam < n / 2 + 40);
    assert_true(lr_low < 2e-5 && lr_high > 0.05); /* log scale: both decades' ends reached */
    release(out, n);
    optimizer_free(opt);
    spec_free(s);
  }
}

/* Sobol suggestion k is point k of the shifted design, mapped onto the space. */
static void sobol_follows_its_design(void **state) {
  (void)state;
  spec *s = load(types[1], 9,
                 "  x: {type: float, low: 0, high: 1}\n  y: {type: float, low: 0, high: 1}\n");
  optimizer *opt = make(s);
  json_t *out[6];
  suggest(opt, NULL, 0, 6, 10, out);
  double u[12];
  nas_err err;
  assert_int_equal(design_sobol(2, 9, 10, 6, u, &err), 0);
  for (size_t i = 0; i < 6; i++) {
    assert_true(fabs(json_real_value(json_object_get(out[i], "x")) - u[2 * i]) < 1e-15);
    assert_true(fabs(json_real_value(json_object_get(out[i], "y")) - u[2 * i + 1]) < 1e-15);
  }
  release(out, 6);
  optimizer_free(opt);
  spec_free(s);
}

static void design_is_deterministic_and_batch_independent(void **state) {
  (void)state;
  nas_err err;
  for (size_t dim = 1; dim <= 60; dim += 59) { /* Sobol, then the permuted Halton beyond 40 */
    double *all = malloc(64 * dim * sizeof *all), *part = malloc(16 * dim * sizeof *part);
    double *other = malloc(64 * dim * sizeof *other);
    assert_int_equal(design_sobol(dim, 5, 0, 64, all, &err), 0);
    assert_int_equal(design_sobol(dim, 5, 30, 16, part, &err), 0);
    assert_memory_equal(all + 30 * dim, part, 16 * dim * sizeof *part);
    assert_int_equal(design_sobol(dim, 6, 0, 64, other, &err), 0);
    double mean = 0;
    for (size_t i = 0; i < 64 * dim; i++) {
      assert_true(all[i] >= 0 && all[i] < 1);
      assert_true(all[i] != other[i]);
      mean += all[i] / (64.0 * dim);
    }
    assert_true(fabs(mean - 0.5) < 0.02);
    /* Sobol's low discrepancy: every coordinate puts 16 of the 64 points in each quarter,
     * give or take one (GSL starts the net at its second point). Beyond 40 dimensions,
     * Halton's first points in a large base are like a sample without replacement. */
    for (size_t j = 0; j < dim; j++) {
      int quarter[4] = {0};
      for (size_t i = 0; i < 64; i++) quarter[(int)(all[i * dim + j] * 4)]++;
      for (int q = 0; q < 4; q++)
        if (abs(quarter[q] - 16) > (dim <= 40 ? 1 : 9))
          fail_msg("dim %zu coordinate %zu: %d points in quarter %d", dim, j, quarter[q], q);
    }
    free(all);
    free(part);
    free(other);
  }
  assert_int_equal(design_sobol(0, 1, 0, 1, NULL, &err), NAS_ERR);
  assert_true(design_stream_seed(1, 2) != design_stream_seed(1, 3));
  assert_true(design_stream_seed(1, 2) != design_stream_seed(2, 2));
}

/* Pending and observed assignments are never proposed again; a finite space runs out with
 * a message that says so. */
static void finite_space_is_used_up_without_repeats(void **state) {
  (void)state;
  const char *small =
      "  a: {type: int, low: 1, high: 3}\n"
      "  b: {type: categorical, choices: [x, y]}\n"
      "  c: {type: categorical, choices: [p, q], when: \"b == y\"}\n";
  /* a × (b=x | b=y × c) = 3 × 3 = 9 assignments. */
  for (size_t t = 0; t < 2; t++) {
    spec *s = load(types[t], 1, small);
    optimizer *opt = make(s);
    json_t *got[10];
    /* The first two as observations, the rest pending. */
    const double zero = 0;
    observation obs[2];
    nas_err err = {{0}};
    for (size_t i = 0; i < 9; i++) {
      size_t n_obs = i < 2 ? i : 2;
      for (size_t k = 0; k < n_obs; k++) obs[k] = (observation){got[k], &zero, NULL, NULL};
      const json_t *const *pending = (const json_t *const *)got + n_obs;
      if (optimizer_suggest(opt, obs, n_obs, pending, i - n_obs, 1, (int)i, &got[i], NULL, &err) < 0)
        fail_msg("suggestion %zu: %s", i, err.msg);
      for (size_t k = 0; k < i; k++) assert_false(json_equal(got[k], got[i]));
    }
    got[9] = NULL;
    assert_int_equal(
        optimizer_suggest(opt, obs, 2, (const json_t *const *)got + 2, 7, 1, 9, &got[9], NULL, &err),
        NAS_ENOTFOUND);
    assert_null(got[9]);
    if (!strstr(err.msg, "exhausted") || !strstr(err.msg, "all 9"))
      fail_msg("message: %s", err.msg);
    release(got, 9);
    optimizer_free(opt);
    spec_free(s);
  }
}

/* A pending assignment written differently (3.0 for 3, an inactive parameter present) is
 * the same assignment. */
static void pending_matches_by_value_not_by_spelling(void **state) {
  (void)state;
  spec *s = load(types[0], 1, "  a: {type: int, low: 1, high: 2}\n");
  optimizer *opt = make(s);
  json_error_t jerr;
  json_t *pending = json_loads("{\"a\": 1.0}", 0, &jerr);
  json_t *out[1];
  const json_t *const list[] = {pending};
  suggest(opt, list, 1, 1, 0, out);
  assert_int_equal(json_integer_value(json_object_get(out[0], "a")), 2);
  /* Unencodable pending assignments (an older spec) are no obstacle. */
  json_t *stale = json_loads("{\"zzz\": 1}", 0, &jerr);
  const json_t *const stale_list[] = {pending, stale};
  json_decref(out[0]);
  suggest(opt, stale_list, 2, 1, 0, out);
  assert_int_equal(json_integer_value(json_object_get(out[0], "a")), 2);
  json_decref(out[0]);
  json_decref(pending);
  json_decref(stale);
  optimizer_free(opt);
  spec_free(s);
}

static void unknown_options_and_types_are_errors(void **state) {
  (void)state;
  nas_err err = {{0}};
  optimizer *opt = NULL;
  spec *s = load("  type: sobol\n  scramble: true\n", 1, space_yaml);
  assert_int_equal(optimizer_create(s, &opt, &err), NAS_ERR);
  assert_null(opt);
  if (!strstr(err.msg, "sobol") || !strstr(err.msg, "'scramble'")) fail_msg("%s", err.msg);
  spec_free(s);
  s = load("  type: random\n  n_init: 3\n", 1, space_yaml);
  assert_int_equal(optimizer_create(s, &opt, &err), NAS_ERR);
  if (!strstr(err.msg, "random") || !strstr(err.msg, "'n_init'")) fail_msg("%s", err.msg);
  /* A type the spec let through but no backend has (specs can be built by hand too). */
  free(s->optimizer.type);
  s->optimizer.type = strdup("sobl");
  json_object_clear(s->optimizer.options);
  assert_int_equal(optimizer_create(s, &opt, &err), NAS_ERR);
  if (!strstr(err.msg, "'sobl'") || !strstr(err.msg, "did you mean 'sobol'"))
    fail_msg("%s", err.msg);
  spec_free(s);
}

static void bad_arguments_are_errors_and_leave_no_output(void **state) {
  (void)state;
  spec *s = load(types[0], 1, space_yaml);
  optimizer *opt = make(s);
  nas_err err = {{0}};
  json_t *out[2] = {NULL, NULL};
  assert_int_equal(optimizer_suggest(opt, NULL, 0, NULL, 0, 2, -1, out, NULL, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "trial numbers"));
  assert_int_equal(optimizer_suggest(opt, NULL, 1, NULL, 0, 2, 0, out, NULL, &err), NAS_ERR);
  const json_t *const not_object[] = {json_integer(3)};
  assert_int_equal(optimizer_suggest(opt, NULL, 0, not_object, 1, 2, 0, out, NULL, &err), NAS_ERR);
  json_decref((json_t *)not_object[0]);
  assert_null(out[0]);
  assert_int_equal(optimizer_suggest(opt, NULL, 0, NULL, 0, 0, 0, NULL, NULL, &err), 0);
  optimizer_free(opt);
  spec_free(s);
}

static void objectives_to_min_negates_maximised_objectives(void **state) {
  (void)state;
  char *yaml =
      "name: t\nparameters:\n  x: {type: float, low: 0, high: 1}\n"
      "objectives:\n  - {name: acc, goal: maximize}\n  - {name: loss, goal: minimize}\n"
      "  - {name: f1, goal: maximize}\n"
      "trial:\n  command: [x]\nbudget:\n  trials: 1\n";
  spec *s;
  nas_err err;
  assert_int_equal(spec_parse(yaml, "<t>", "/tmp", &s, &err), 0);
  const double raw[] = {0.9, 0.3, -2};
  double min[3];
  pareto_objectives_to_min(s, raw, min);
  assert_true(min[0] == -0.9 && min[1] == 0.3 && min[2] == 2);
  spec_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(suggestions_depend_on_seed_and_number_only),
      cmocka_unit_test(suggestions_are_valid_and_cover_the_space),
      cmocka_unit_test(sobol_follows_its_design),
      cmocka_unit_test(design_is_deterministic_and_batch_independent),
      cmocka_unit_test(finite_space_is_used_up_without_repeats),
      cmocka_unit_test(pending_matches_by_value_not_by_spelling),
      cmocka_unit_test(unknown_options_and_types_are_errors),
      cmocka_unit_test(bad_arguments_are_errors_and_leave_no_output),
      cmocka_unit_test(objectives_to_min_negates_maximised_objectives),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
