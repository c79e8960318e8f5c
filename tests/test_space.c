/* Tests of the search-space encoding (optimizer/space.c): layout of the cube, exact round
 * trips of every kind of parameter (log floats and ints, steps, choices, conditionals,
 * fixed values), idempotent snapping, pinned inactive parameters, uniform designs. */
#include "tests/testutil.h"

#include <gsl/gsl_rng.h>
#include <math.h>

#include "optimizer/design.h"
#include "optimizer/optimizer.h"

/* Every kind of parameter: log float, float, float across zero, int, log int, stepped int,
 * stepped float, categoricals (strings, bools, mixed numbers), conditionals (chained, on a
 * categorical, on an int), fixed values (one conditional). */
static const char *const mixed_yaml =
    "name: mixed\n"
    "seed: 7\n"
    "parameters:\n"
    "  lr: {type: float, low: 1.0e-5, high: 0.1, log: true}\n"
    "  dropout: {type: float, low: 0, high: 0.5}\n"
    "  shift: {type: float, low: -3, high: 5}\n"
    "  layers: {type: int, low: 1, high: 8}\n"
    "  width: {type: int, low: 16, high: 1024, log: true}\n"
    "  batch: {type: int, low: 16, high: 256, step: 16}\n"
    "  momentum: {type: float, low: 0.1, high: 1.0, step: 0.1}\n"
    "  opt: {type: categorical, choices: [sgd, adam, adamw]}\n"
    "  beta2: {type: float, low: 0.9, high: 0.9999, when: {param: opt, in: [adam, adamw]}}\n"
    "  nesterov: {type: categorical, choices: [true, false], when: \"opt == sgd\"}\n"
    "  act: {type: categorical, choices: [1, 2.5, relu]}\n"
    "  extra: {type: int, low: 8, high: 64, when: \"layers >= 3\"}\n"
    "  deep: {type: float, low: 0, high: 1, when: \"extra > 32\"}\n"
    "  seed_fixed: {type: fixed, value: 42}\n"
    "  tag: {type: fixed, value: big, when: \"layers > 4\"}\n"
    "objectives:\n"
    "  - {name: loss, goal: minimize}\n"
    "trial:\n"
    "  command: [train]\n"
    "budget:\n"
    "  trials: 10\n";

typedef struct {
  spec *s;
  space *sp;
  size_t dim;
} fixture;

static fixture load(const char *yaml) {
  fixture f = {0};
  nas_err err = {{0}};
  if (spec_parse(yaml, "<test>", "/tmp", &f.s, &err) < 0) fail_msg("spec: %s", err.msg);
  if (space_create(f.s, &f.sp, &err) < 0) fail_msg("space: %s", err.msg);
  f.dim = space_ndim(f.sp);
  return f;
}

static void unload(fixture *f) {
  space_free(f->sp);
  spec_free(f->s);
}

static json_t *decode(const fixture *f, const double *x) {
  json_t *params;
  nas_err err = {{0}};
  if (space_decode(f->sp, x, &params, &err) < 0) fail_msg("decode: %s", err.msg);
  return params;
}

static void encode(const fixture *f, const json_t *params, double *x) {
  nas_err err = {{0}};
  if (space_encode(f->sp, params, x, &err) < 0) fail_msg("encode: %s", err.msg);
}

static json_t *parse_json(const char *text) {
  json_error_t jerr;
  json_t *v = json_loads(text, 0, &jerr);
  if (!v) fail_msg("bad JSON in test: %s", jerr.text);
  return v;
}

static void assert_json_equal(const json_t *a, const json_t *b) {
  if (json_equal(a, b)) return;
  char *ta = json_dumps(a, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  char *tb = json_dumps(b, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  fail_msg("%s\n!=\n%s", ta, tb);
}

static void assert_same_point(const double *a, const double *b, size_t dim) {
  for (size_t d = 0; d < dim; d++)
    if (a[d] != b[d]) fail_msg("dimension %zu: %.17g != %.17g", d, a[d], b[d]);
}

/* A random point of the cube, sometimes outside it or on its faces. */
static void random_point(gsl_rng *rng, double *x, size_t dim) {
  for (size_t d = 0; d < dim; d++) {
    double r = gsl_rng_uniform(rng);
    x[d] = r < 0.05 ? 0.0 : r < 0.1 ? 1.0 : r < 0.12 ? -0.3 : r < 0.14 ? 1.7 : gsl_rng_uniform(rng);
  }
}

static void layout_gives_each_kind_its_dimensions(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  /* 7 numeric + opt 3 + beta2 1 + nesterov 2 + act 3 + extra 1 + deep 1; fixed: none */
  assert_int_equal(f.dim, 7 + 3 + 1 + 2 + 3 + 1 + 1);
  assert_int_equal(space_uniform_dims(f.sp), 13);
  const space_dim *d = space_dims(f.sp);
  assert_int_equal(d[0].kind, DIM_CONTINUOUS); /* lr */
  assert_int_equal(d[3].kind, DIM_DISCRETE);   /* layers */
  assert_int_equal(d[3].n_levels, 8);
  assert_int_equal(d[4].kind, DIM_DISCRETE); /* width: every integer of [16, 1024] */
  assert_int_equal(d[4].n_levels, 1009);
  assert_int_equal(d[5].n_levels, 16);       /* batch 16..256 by 16 */
  assert_int_equal(d[6].kind, DIM_DISCRETE); /* momentum 0.1..1 by 0.1 */
  assert_int_equal(d[6].n_levels, 10);
  for (size_t k = 7; k < 10; k++) {
    assert_int_equal(d[k].kind, DIM_ONEHOT);
    assert_int_equal(d[k].group_start, 7);
    assert_int_equal(d[k].n_levels, 3);
    assert_int_equal(d[k].param, 7);
  }
  assert_int_equal(d[10].param, 8); /* beta2 */
  assert_ptr_equal(space_spec(f.sp), f.s);
  unload(&f);
}

static void decoded_assignments_are_valid_and_round_trip_exactly(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double x[64], x1[64], x2[64];
  nas_err err = {{0}};
  for (int t = 0; t < 3000; t++) {
    random_point(rng, x, f.dim);
    json_t *p = decode(&f, x);
    if (spec_check_params(f.s, p, &err) < 0) fail_msg("invalid assignment: %s", err.msg);
    encode(&f, p, x1);
    json_t *q = decode(&f, x1);
    assert_json_equal(p, q);
    /* Types survive too: json_equal tells 3 from 3.0. */
    assert_true(json_is_integer(json_object_get(q, "layers")));
    assert_true(json_is_real(json_object_get(q, "lr")));
    assert_true(json_is_real(json_object_get(q, "momentum")));
    encode(&f, q, x2);
    assert_same_point(x1, x2, f.dim);
    json_decref(p);
    json_decref(q);
  }
  gsl_rng_free(rng);
  unload(&f);
}

static void snap_is_idempotent(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  gsl_rng_set(rng, 3);
  double x[64], once[64];
  nas_err err = {{0}};
  for (int t = 0; t < 3000; t++) {
    random_point(rng, x, f.dim);
    assert_int_equal(space_snap(f.sp, x, &err), 0);
    memcpy(once, x, sizeof once);
    assert_int_equal(space_snap(f.sp, x, &err), 0);
    assert_same_point(once, x, f.dim);
    for (size_t d = 0; d < f.dim; d++) assert_true(x[d] >= 0 && x[d] <= 1);
  }
  gsl_rng_free(rng);
  unload(&f);
}

/* Every kind of parameter again (other ranges), with no conditions: space_snap_near's own
 * path. */
static const char *const unconditional_yaml =
    "name: plain\n"
    "seed: 3\n"
    "parameters:\n"
    "  wd: {type: float, low: 1.0e-6, high: 0.01, log: true}\n"
    "  momentum: {type: float, low: 0.5, high: 0.99}\n"
    "  bias: {type: float, low: -1, high: 1}\n"
    "  depth: {type: int, low: 2, high: 12}\n"
    "  units: {type: int, low: 8, high: 512, log: true}\n"
    "  batch: {type: int, low: 32, high: 512, step: 32}\n"
    "  warmup: {type: float, low: 0, high: 0.3, step: 0.05}\n"
    "  act: {type: categorical, choices: [relu, gelu, silu, 2]}\n"
    "  norm: {type: categorical, choices: [true, false]}\n"
    "  tag: {type: fixed, value: plain}\n"
    "objectives:\n"
    "  - {name: err, goal: minimize}\n"
    "trial: {command: [train]}\n"
    "budget: {trials: 20}\n";

/* A snapped point with one coordinate (or one-hot group) moved, as the local search and
 * the reach make neighbours: space_snap_near gives exactly space_snap's point. */
static void snap_near_gives_the_whole_snap(void **state) {
  (void)state;
  const char *yamls[] = {unconditional_yaml, mixed_yaml};
  for (size_t y = 0; y < 2; y++) {
    fixture f = load(yamls[y]);
    const space_dim *dims = space_dims(f.sp);
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(rng, 11);
    double ref[64], near[64], whole[64];
    nas_err err = {{0}};
    for (int t = 0; t < 3000; t++) {
      random_point(rng, ref, f.dim);
      assert_int_equal(space_snap(f.sp, ref, &err), 0);
      memcpy(near, ref, sizeof near);
      size_t d = gsl_rng_uniform_int(rng, f.dim);
      if (dims[d].kind == DIM_ONEHOT) { /* another choice */
        memset(near + dims[d].group_start, 0, dims[d].n_levels * sizeof *near);
        near[dims[d].group_start + gsl_rng_uniform_int(rng, dims[d].n_levels)] = 1.0;
      } else {
        near[d] = gsl_rng_uniform(rng);
      }
      memcpy(whole, near, sizeof whole);
      assert_int_equal(space_snap(f.sp, whole, &err), 0);
      assert_int_equal(space_snap_near(f.sp, ref, near, &err), 0);
      assert_same_point(whole, near, f.dim);
    }
    gsl_rng_free(rng);
    unload(&f);
  }
}

static void range_ends_round_trip_exactly(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  const char *ends[] = {
      "{\"lr\": 1e-5, \"dropout\": 0.0, \"shift\": -3.0, \"layers\": 1, \"width\": 16,"
      " \"batch\": 16, \"momentum\": 0.1, \"opt\": \"sgd\", \"nesterov\": true, \"act\": 1,"
      " \"seed_fixed\": 42}",
      "{\"lr\": 0.1, \"dropout\": 0.5, \"shift\": 5.0, \"layers\": 8, \"width\": 1024,"
      " \"batch\": 256, \"momentum\": 1.0, \"opt\": \"adam\", \"beta2\": 0.9999, \"act\": \"relu\","
      " \"extra\": 64, \"deep\": 1.0, \"seed_fixed\": 42, \"tag\": \"big\"}",
  };
  double x[64];
  for (size_t e = 0; e < 2; e++) {
    json_t *p = parse_json(ends[e]);
    encode(&f, p, x);
    for (size_t d = 0; d < 7; d++) assert_true(x[d] == (double)e); /* numeric dims at 0 or 1 */
    json_t *q = decode(&f, x);
    assert_json_equal(p, q);
    json_decref(p);
    json_decref(q);
  }
  /* Just inside the ends is not the end. */
  json_t *p = parse_json(
      "{\"lr\": 0.09999999999999999, \"dropout\": 0.0, \"shift\": -2.9999999999999996,"
      " \"layers\": 1, \"width\": 16, \"batch\": 16, \"momentum\": 0.1,"
      " \"opt\": \"sgd\", \"nesterov\": true, \"act\": 1, \"seed_fixed\": 42}");
  encode(&f, p, x);
  assert_true(x[0] < 1 && x[2] > 0);
  json_decref(p);
  unload(&f);
}

/* Every integer of a log int and of a stepped int, and decimal steps, come back exactly. */
static void integers_and_steps_round_trip(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  double x[64];
  json_t *p = parse_json(
      "{\"lr\": 0.001, \"dropout\": 0.25, \"shift\": 0.0, \"layers\": 1,"
      " \"width\": 16, \"batch\": 16, \"momentum\": 0.1, \"opt\": \"sgd\","
      " \"nesterov\": false, \"act\": 2.5, \"seed_fixed\": 42}");
  for (int w = 16; w <= 1024; w++) {
    json_object_set_new(p, "width", json_integer(w));
    json_object_set_new(p, "batch", json_integer(16 * (1 + w % 16)));
    json_object_set_new(p, "layers", json_integer(1 + w % 2));
    encode(&f, p, x);
    json_t *q = decode(&f, x);
    assert_json_equal(p, q);
    json_decref(q);
  }
  const double decimals[] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  for (size_t k = 0; k < 10; k++) {
    json_object_set_new(p, "momentum", json_real(decimals[k]));
    encode(&f, p, x);
    assert_true(fabs(x[6] - (double)k / 9) < 1e-15); /* levels evenly spaced */
    json_t *q = decode(&f, x);
    assert_true(json_real_value(json_object_get(q, "momentum")) == decimals[k]);
    json_decref(q);
  }
  json_decref(p);
  unload(&f);
}

static void log_int_sits_at_its_log_position_and_rounds_in_value_space(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  double x[64];
  json_t *p = parse_json(
      "{\"lr\": 0.001, \"dropout\": 0.25, \"shift\": 0.0, \"layers\": 1,"
      " \"width\": 128, \"batch\": 16, \"momentum\": 0.1, \"opt\": \"sgd\","
      " \"nesterov\": false, \"act\": 2.5, \"seed_fixed\": 42}");
  encode(&f, p, x);
  assert_true(fabs(x[4] - log(128.0 / 16) / log(1024.0 / 16)) < 1e-15);
  /* The position of 100.4 lies between those of 100 and 101: rounds to 100 in value. */
  x[4] = log(100.4 / 16) / log(64.0);
  json_t *q = decode(&f, x);
  assert_int_equal(json_integer_value(json_object_get(q, "width")), 100);
  json_decref(q);
  x[4] = log(100.6 / 16) / log(64.0);
  q = decode(&f, x);
  assert_int_equal(json_integer_value(json_object_get(q, "width")), 101);
  json_decref(q);
  /* Continuous log float: the middle position is the geometric middle. */
  x[0] = 0.5;
  q = decode(&f, x);
  assert_true(fabs(json_real_value(json_object_get(q, "lr")) - 1e-3) < 1e-15);
  json_decref(q);
  json_decref(p);
  unload(&f);
}

/* Floats a user writes come back as the smallest double with the same position: the value
 * itself wherever positions tell doubles apart (dropout in [0, 0.5]), a neighbour within the
 * encoding's resolution elsewhere, and the result is stable. */
/* Where log levels are dense (values past 1e14), exp(log(v)) misses v by more than half a
 * level: decoding the position of a level must still give that level, or snapping moves a
 * suggestion off the value it encodes. */
static void dense_log_ints_decode_to_the_level_they_encode(void **state) {
  (void)state;
  fixture f = load("name: d\nparameters:\n"
                   "  n: {type: int, low: 1, high: 4503599627370000, log: true}\n"
                   "objectives: [{name: f, goal: minimize}]\nbudget: {trials: 3}\n");
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  gsl_rng_set(rng, 3);
  for (int i = 0; i < 20000; i++) {
    double x = gsl_rng_uniform(rng), again;
    json_t *params = decode(&f, &x);
    encode(&f, params, &again);
    json_t *back = decode(&f, &again);
    assert_json_equal(params, back);
    json_decref(params);
    json_decref(back);
  }
  gsl_rng_free(rng);
  unload(&f);
}

static void written_floats_come_back_within_resolution(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double x[64], again[64];
  json_t *p = parse_json(
      "{\"layers\": 1, \"width\": 16, \"batch\": 16, \"momentum\": 0.1,"
      " \"opt\": \"sgd\", \"nesterov\": false, \"act\": 2.5, \"seed_fixed\": 42}");
  for (int t = 0; t < 3000; t++) {
    double lr = exp(log(1e-5) + gsl_rng_uniform(rng) * log(1e4));
    double dropout = 0.5 * gsl_rng_uniform(rng), shift = -3 + 8 * gsl_rng_uniform(rng);
    json_object_set_new(p, "lr", json_real(lr));
    json_object_set_new(p, "dropout", json_real(dropout));
    json_object_set_new(p, "shift", json_real(shift));
    encode(&f, p, x);
    json_t *q = decode(&f, x);
    assert_true(json_real_value(json_object_get(q, "dropout")) == dropout);
    assert_true(fabs(json_real_value(json_object_get(q, "lr")) - lr) <= 8e-16 * lr * log(1e4));
    assert_true(fabs(json_real_value(json_object_get(q, "shift")) - shift) <= 8 * 0x1p-52);
    encode(&f, q, again);
    assert_same_point(x, again, f.dim);
    json_decref(q);
  }
  json_decref(p);
  gsl_rng_free(rng);
  unload(&f);
}

/* Decimals as people write them (up to 10 significant digits here) come back exactly. */
static void written_decimals_round_trip_exactly(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double x[64];
  json_t *p = parse_json(
      "{\"layers\": 1, \"width\": 16, \"batch\": 16, \"momentum\": 0.1,"
      " \"opt\": \"sgd\", \"nesterov\": false, \"act\": 2.5, \"seed_fixed\": 42}");
  const char *names[] = {"lr", "dropout", "shift"};
  for (int t = 0; t < 3000; t++) {
    double raw[3] = {exp(log(1e-5) + gsl_rng_uniform(rng) * log(1e4)), 0.5 * gsl_rng_uniform(rng),
                     -3 + 8 * gsl_rng_uniform(rng)};
    for (int k = 0; k < 3; k++) {
      char text[40];
      snprintf(text, sizeof text, "%.*g", 1 + (int)gsl_rng_uniform_int(rng, 10), raw[k]);
      double v = strtod(text, NULL);
      json_object_set_new(p, names[k], json_real(v < 1e-5 && k == 0 ? 1e-5 : v));
    }
    if (t == 0) json_object_set_new(p, "shift", json_real(0.0));
    encode(&f, p, x);
    json_t *q = decode(&f, x);
    assert_json_equal(p, q);
    json_decref(q);
  }
  json_decref(p);
  gsl_rng_free(rng);
  unload(&f);
}

static void categorical_decodes_to_argmax_with_ties_to_the_first(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  double x[64] = {0};
  x[7] = 0.3, x[8] = 0.3, x[9] = 0.1;    /* opt: tie between sgd and adam */
  x[13] = 0.2, x[14] = 0.9, x[15] = 0.9; /* act: tie between 2.5 and relu */
  json_t *q = decode(&f, x);
  assert_string_equal(json_string_value(json_object_get(q, "opt")), "sgd");
  assert_true(json_is_real(json_object_get(q, "act")));
  assert_true(json_real_value(json_object_get(q, "act")) == 2.5);
  json_decref(q);
  x[13] = 1;
  q = decode(&f, x);
  assert_true(json_is_integer(json_object_get(q, "act")));
  json_decref(q);
  /* A number written as 1.0 is the choice 1. */
  json_t *p = parse_json(
      "{\"lr\": 0.001, \"dropout\": 0.25, \"shift\": 0.0, \"layers\": 1,"
      " \"width\": 16, \"batch\": 16, \"momentum\": 0.1, \"opt\": \"adamw\","
      " \"beta2\": 0.95, \"act\": 1.0, \"seed_fixed\": 42}");
  encode(&f, p, x);
  assert_true(x[7] == 0 && x[8] == 0 && x[9] == 1);
  assert_true(x[13] == 1 && x[14] == 0 && x[15] == 0);
  json_decref(p);
  unload(&f);
}

static void inactive_parameters_are_pinned_and_left_out(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  double x[64];
  json_t *p = parse_json(
      "{\"lr\": 0.001, \"dropout\": 0.25, \"shift\": 0.0, \"layers\": 2,"
      " \"width\": 16, \"batch\": 16, \"momentum\": 0.1, \"opt\": \"sgd\","
      " \"nesterov\": true, \"act\": 2.5, \"seed_fixed\": 42}");
  encode(&f, p, x);
  assert_true(x[10] == 0.5);                 /* beta2: opt is sgd */
  assert_true(x[11] == 1 && x[12] == 0);     /* nesterov active */
  assert_true(x[16] == 0.5 && x[17] == 0.5); /* extra, deep: layers < 3 */
  json_decref(p);
  p = parse_json(
      "{\"lr\": 0.001, \"dropout\": 0.25, \"shift\": 0.0, \"layers\": 3,"
      " \"width\": 16, \"batch\": 16, \"momentum\": 0.1, \"opt\": \"adam\","
      " \"beta2\": 0.99, \"act\": 2.5, \"extra\": 20, \"seed_fixed\": 42}");
  encode(&f, p, x);
  assert_true(x[11] == 0 && x[12] == 0); /* nesterov inactive: all zero */
  assert_true(x[17] == 0.5);             /* deep: extra <= 32 (chained condition) */
  /* Whatever inactive dimensions hold, decode leaves them out. */
  x[11] = 0.9, x[17] = 0.1;
  json_t *q = decode(&f, x);
  assert_json_equal(p, q);
  assert_null(json_object_get(q, "nesterov"));
  assert_null(json_object_get(q, "tag"));
  json_decref(q);
  json_decref(p);
  unload(&f);
}

static void fixed_values_are_always_decoded_with_their_type(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  double x[64];
  for (size_t d = 0; d < f.dim; d++) x[d] = 0.5;
  x[3] = 1.0; /* layers 8: tag active */
  json_t *q = decode(&f, x);
  assert_true(json_is_integer(json_object_get(q, "seed_fixed")));
  assert_int_equal(json_integer_value(json_object_get(q, "seed_fixed")), 42);
  assert_string_equal(json_string_value(json_object_get(q, "tag")), "big");
  json_decref(q);
  unload(&f);
}

static void encode_rejects_what_is_not_an_assignment(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  double x[64];
  struct {
    const char *json, *needle;
  } cases[] = {
      {"{\"lr\": 0.5}", "'lr': 0.5 is outside"},
      {"{\"lr\": 0.01, \"dropout\": \"x\"}", "'dropout': expected a number"},
      {"{\"lr\": 0.01, \"dropout\": 0.1}", "'shift' is missing"},
      {"{\"lr\": 0.01, \"dropout\": 0.1, \"shift\": 1, \"layers\": 2.5}",
       "'layers': 2.5 is not an integer"},
      {"{\"lr\": 0.01, \"dropout\": 0.1, \"shift\": 1, \"layers\": 2, \"width\": 16,"
       " \"batch\": 16, \"momentum\": 0.1, \"opt\": \"rmsprop\"}",
       "'opt': \"rmsprop\" is not one of its choices"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    json_t *p = parse_json(cases[c].json);
    nas_err err = {{0}};
    assert_int_equal(space_encode(f.sp, p, x, &err), NAS_ERR);
    if (!strstr(err.msg, cases[c].needle)) fail_msg("'%s' lacks '%s'", err.msg, cases[c].needle);
    json_decref(p);
  }
  nas_err err = {{0}};
  for (size_t d = 0; d < f.dim; d++) x[d] = 0.5;
  x[2] = NAN;
  json_t *q = NULL;
  assert_int_equal(space_decode(f.sp, x, &q, &err), NAS_ERR);
  assert_null(q);
  unload(&f);
}

/* space_from_uniform: uniform coordinates give every choice and every integer (ends
 * included) the same chance. */
static void uniform_coordinates_give_uniform_levels(void **state) {
  (void)state;
  fixture f = load(mixed_yaml);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double u[16], x[64];
  int layers[9] = {0}, opt[3] = {0};
  const int n = 12000;
  for (int t = 0; t < n; t++) {
    for (size_t j = 0; j < space_uniform_dims(f.sp); j++) u[j] = gsl_rng_uniform(rng);
    space_from_uniform(f.sp, u, x);
    json_t *q = decode(&f, x);
    layers[json_integer_value(json_object_get(q, "layers"))]++;
    const char *o = json_string_value(json_object_get(q, "opt"));
    opt[strcmp(o, "sgd") == 0 ? 0 : strcmp(o, "adam") == 0 ? 1 : 2]++;
    json_decref(q);
  }
  for (int k = 1; k <= 8; k++) assert_true(abs(layers[k] - n / 8) < 200); /* ~5 sigma */
  for (int k = 0; k < 3; k++) assert_true(abs(opt[k] - n / 3) < 260);
  /* space_from_levels puts each level exactly where encode does. */
  size_t levels[13] = {0, 0, 0, 7, 1008, 15, 9, 2, 0, 1, 2, 56, 0};
  space_from_levels(f.sp, levels, x);
  json_t *q = decode(&f, x);
  assert_int_equal(json_integer_value(json_object_get(q, "layers")), 8);
  assert_int_equal(json_integer_value(json_object_get(q, "width")), 1024);
  assert_int_equal(json_integer_value(json_object_get(q, "batch")), 256);
  assert_int_equal(json_integer_value(json_object_get(q, "extra")), 64);
  assert_string_equal(json_string_value(json_object_get(q, "opt")), "adamw");
  json_decref(q);
  gsl_rng_free(rng);
  unload(&f);
}

/* The widest ranges a spec allows make a space whose values round-trip: an int range of
 * 2^52 - 1 steps, a stepped float as fine. */
static void widest_ranges_a_spec_allows_make_a_space(void **state) {
  (void)state;
  fixture f = load("name: w\nparameters:\n"
                   "  n: {type: int, low: 1, high: 4503599627370496}\n"
                   "  x: {type: float, low: 0, high: 4503599627370495e-15, step: 1e-15}\n"
                   "objectives: [{name: f, goal: minimize}]\nbudget: {trials: 3}\n");
  assert_int_equal(f.dim, 2);
  double x[2] = {0.3, 0.7}, again[2];
  json_t *params = decode(&f, x);
  encode(&f, params, again);
  json_t *back = decode(&f, again);
  assert_json_equal(params, back);
  json_decref(params);
  json_decref(back);
  unload(&f);
}

/* A bound written -0.0 is 0: the ends decode to 0.0, never -0.0 (a trial got "-0" on its
 * command line). */
static void negative_zero_bounds_decode_as_zero(void **state) {
  (void)state;
  fixture f = load("name: z\nparameters:\n"
                   "  x: {type: float, low: -0.0, high: 1}\n"
                   "  y: {type: float, low: -1, high: -0.0}\n"
                   "objectives: [{name: f, goal: minimize}]\nbudget: {trials: 3}\n");
  double x[2] = {0, 1};
  json_t *params = decode(&f, x);
  assert_false(signbit(json_real_value(json_object_get(params, "x"))));
  assert_false(signbit(json_real_value(json_object_get(params, "y"))));
  json_decref(params);
  unload(&f);
}

static void space_of_fixed_values_has_no_dimensions(void **state) {
  (void)state;
  fixture f = load(
      "name: fixed\nparameters:\n  a: {type: fixed, value: 1.5}\n"
      "  b: {type: fixed, value: \"x\"}\n"
      "objectives:\n  - {name: loss, goal: minimize}\ntrial:\n  command: [x]\nbudget:\n  trials: "
      "1\n");
  assert_int_equal(f.dim, 0);
  json_t *q = decode(&f, NULL);
  json_t *want = parse_json("{\"a\": 1.5, \"b\": \"x\"}");
  assert_json_equal(want, q);
  json_decref(want);
  json_decref(q);
  unload(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(layout_gives_each_kind_its_dimensions),
      cmocka_unit_test(decoded_assignments_are_valid_and_round_trip_exactly),
      cmocka_unit_test(snap_is_idempotent),
      cmocka_unit_test(snap_near_gives_the_whole_snap),
      cmocka_unit_test(range_ends_round_trip_exactly),
      cmocka_unit_test(integers_and_steps_round_trip),
      cmocka_unit_test(log_int_sits_at_its_log_position_and_rounds_in_value_space),
      cmocka_unit_test(dense_log_ints_decode_to_the_level_they_encode),
      cmocka_unit_test(written_floats_come_back_within_resolution),
      cmocka_unit_test(written_decimals_round_trip_exactly),
      cmocka_unit_test(categorical_decodes_to_argmax_with_ties_to_the_first),
      cmocka_unit_test(inactive_parameters_are_pinned_and_left_out),
      cmocka_unit_test(fixed_values_are_always_decoded_with_their_type),
      cmocka_unit_test(encode_rejects_what_is_not_an_assignment),
      cmocka_unit_test(uniform_coordinates_give_uniform_levels),
      cmocka_unit_test(widest_ranges_a_spec_allows_make_a_space),
      cmocka_unit_test(negative_zero_bounds_decode_as_zero),
      cmocka_unit_test(space_of_fixed_values_has_no_dimensions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
