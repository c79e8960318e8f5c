/* Tests of the `gp` optimizer (optimizer/gp_optimizer.c) through the optimizer interface:
 * options, the initial design, determinism, batches, taken points, mixed and conditional
 * spaces, constraints, many objectives, and a smoke run against random search. */
#include <math.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>

#include "optimizer/optimizer.h"
#include "tests/testutil.h"

/* ---- a small experiment loop ---------------------------------------------------------- */

typedef void (*problem_fn)(const json_t *params, double *objectives, double *constraints);

typedef struct {
  spec *s;
  optimizer *opt;
  size_t n;
  json_t *params[64];
  double obj[64][5], con[64][1];
} experiment;

static void start(experiment *e, const char *yaml) {
  memset(e, 0, sizeof *e);
  nas_err err = {{0}};
  if (spec_parse(yaml, "<test>", "/tmp", &e->s, &err) < 0) fail_msg("spec: %s", err.msg);
  if (optimizer_create(e->s, &e->opt, &err) < 0) fail_msg("optimizer: %s", err.msg);
}

static void finish(experiment *e) {
  for (size_t i = 0; i < e->n; i++) json_decref(e->params[i]);
  optimizer_free(e->opt);
  spec_free(e->s);
}

static void observations(const experiment *e, observation *obs) {
  for (size_t i = 0; i < e->n; i++)
    obs[i] = (observation){e->params[i], e->obj[i], e->con[i], NULL};
}

/* Asks for q suggestions given everything observed so far (nothing pending). */
static void suggest(experiment *e, size_t q, json_t **out) {
  observation obs[64];
  observations(e, obs);
  nas_err err = {{0}};
  if (optimizer_suggest(e->opt, obs, e->n, NULL, 0, q, (int)e->n, out, NULL, &err) < 0)
    fail_msg("suggest: %s", err.msg);
}

/* Runs batches of q until `budget` evaluations. */
static void run(experiment *e, problem_fn f, size_t budget, size_t q) {
  while (e->n < budget) {
    json_t *out[64];
    size_t k = budget - e->n < q ? budget - e->n : q;
    suggest(e, k, out);
    for (size_t i = 0; i < k; i++) {
      nas_err err = {{0}};
      if (spec_check_params(e->s, out[i], &err) < 0) fail_msg("invalid suggestion: %s", err.msg);
      f(out[i], e->obj[e->n], e->con[e->n]);
      e->params[e->n++] = out[i];
    }
  }
}

static double param(const json_t *params, const char *name) {
  return json_number_value(json_object_get(params, name));
}

/* BoTorch's BraninCurrin on [0,1]² (both minimised). */
static void branin_currin(const json_t *p, double *obj, double *con) {
  (void)con;
  double x0 = param(p, "x0"), x1 = param(p, "x1");
  double u = 15 * x0 - 5, v = 15 * x1;
  double t = v - 5.1 / (4 * M_PI * M_PI) * u * u + 5 / M_PI * u - 6;
  obj[0] = t * t + 10 * (1 - 1 / (8 * M_PI)) * cos(u) + 10;
  double factor = 1 - exp(-1 / (2 * x1));
  obj[1] = factor * (2300 * pow(x0, 3) + 1900 * x0 * x0 + 2092 * x0 + 60) /
           (100 * pow(x0, 3) + 500 * x0 * x0 + 4 * x0 + 20);
}

static const char *branin_currin_yaml(const char *type, long seed, const char *extra) {
  static char text[1024];
  snprintf(text, sizeof text,
           "name: bc\nseed: %ld\n"
           "parameters:\n  x0: {type: float, low: 0, high: 1}\n"
           "  x1: {type: float, low: 0, high: 1}\n"
           "objectives:\n  - {name: branin, goal: minimize}\n  - {name: currin, goal: minimize}\n"
           "trial: {command: [x]}\nbudget: {trials: 20}\n"
           "optimizer: {type: %s%s}\n",
           seed, type, extra);
  return text;
}

static double front_hypervolume(const experiment *e, const double *ref) {
  double Y[64 * 2];
  for (size_t i = 0; i < e->n; i++) memcpy(Y + 2 * i, e->obj[i], 2 * sizeof(double));
  return pareto_hypervolume(Y, e->n, 2, ref);
}

/* ---- options ---------------------------------------------------------------------------- */

static void expect_spec_error(const char *yaml, const char *needle) {
  spec *s;
  optimizer *opt = NULL;
  nas_err err = {{0}};
  if (spec_parse(yaml, "<test>", "/tmp", &s, &err) < 0) fail_msg("spec: %s", err.msg);
  assert_int_equal(optimizer_create(s, &opt, &err), NAS_ERR);
  assert_null(opt);
  if (!strstr(err.msg, needle)) fail_msg("'%s' does not mention '%s'", err.msg, needle);
  spec_free(s);
}

static void unknown_or_invalid_options_are_rejected(void **state) {
  (void)state;
  expect_spec_error(branin_currin_yaml("gp", 0, ", restart: 3"), "did you mean 'restarts'");
  expect_spec_error(branin_currin_yaml("gp", 0, ", kernel: cubic"), "kernel");
  expect_spec_error(branin_currin_yaml("gp", 0, ", n_initial: 0"), "n_initial");
  expect_spec_error(branin_currin_yaml("gp", 0, ", mc_samples: many"), "mc_samples");
  expect_spec_error(branin_currin_yaml("gp", 0, ", mean: best"), "mean");
  expect_spec_error(branin_currin_yaml("gp", 0, ", reference: moving"), "'reference'");
}

/* Counts past these made one suggestion take minutes (raw_samples: 1000000); the caps are
 * in docs/spec.md. */
static void counts_that_would_make_a_suggestion_slow_are_capped(void **state) {
  (void)state;
  expect_spec_error(branin_currin_yaml("gp", 0, ", raw_samples: 8193"), "from 1 to 8192");
  expect_spec_error(branin_currin_yaml("gp", 0, ", restarts: 65"), "from 1 to 64");
  expect_spec_error(branin_currin_yaml("gp", 0, ", mc_samples: 1025"), "from 1 to 1024");
  expect_spec_error(branin_currin_yaml("gp", 0, ", max_baseline: 257"), "from 1 to 256");
  expect_spec_error(branin_currin_yaml("gp", 0, ", fit_restarts: 17"), "from 0 to 16");
  spec *s;
  optimizer *opt = NULL;
  nas_err err = {{0}};
  const char *at_caps = branin_currin_yaml("gp", 0, ", raw_samples: 8192, restarts: 64, "
                                           "mc_samples: 1024, max_baseline: 256, fit_restarts: 16");
  assert_int_equal(spec_parse(at_caps, "<test>", "/tmp", &s, &err), NAS_OK);
  assert_int_equal(optimizer_create(s, &opt, &err), NAS_OK);
  optimizer_free(opt);
  spec_free(s);
}

/* The check sched_check_spec runs before anything is stored: optimizer_create's errors
 * without a search space. */
static void options_are_validated_without_a_space(void **state) {
  (void)state;
  nas_err err = {{0}};
  json_t *bad = json_pack("{si}", "n_initial", -3), *none = json_object();
  assert_int_equal(optimizer_validate_options("gp", bad, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "optimizer gp: option 'n_initial' must be an integer"));
  assert_int_equal(optimizer_validate_options("random", bad, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "it takes no options"));
  assert_int_equal(optimizer_validate_options("gp", none, &err), NAS_OK);
  assert_int_equal(optimizer_validate_options("sobol", none, &err), NAS_OK);
  json_decref(bad);
  json_decref(none);
}

static void gp_is_the_default_optimizer(void **state) {
  (void)state;
  experiment e;
  start(&e, "name: d\nparameters: {x: {type: float, low: 0, high: 1}}\n"
            "objectives: [{name: y, goal: minimize}]\ntrial: {command: [x]}\n"
            "budget: {trials: 5}\n");
  assert_string_equal(e.s->optimizer.type, "gp");
  finish(&e);
}

/* ---- behaviour -------------------------------------------------------------------------- */

/* The first n_initial trials are the sobol optimizer's points. */
static void initial_design_is_the_sobol_design(void **state) {
  (void)state;
  experiment g, s;
  start(&g, branin_currin_yaml("gp", 3, ", n_initial: 4"));
  start(&s, branin_currin_yaml("sobol", 3, ""));
  run(&g, branin_currin, 4, 4);
  run(&s, branin_currin, 4, 4);
  for (size_t i = 0; i < 4; i++) assert_true(json_equal(g.params[i], s.params[i]));
  finish(&g);
  finish(&s);
}

/* Six parameters (a default design of 2·6 = 12 points), two objectives. */
static const char *six_dims_yaml(const char *extra) {
  static char text[1024];
  snprintf(text, sizeof text,
           "name: six\nseed: 2\nparameters:\n"
           "  a: {type: float, low: 0, high: 1}\n  b: {type: float, low: 0, high: 1}\n"
           "  c: {type: float, low: 0, high: 1}\n  d: {type: float, low: 0, high: 1}\n"
           "  e: {type: float, low: 0, high: 1}\n  f: {type: float, low: 0, high: 1}\n"
           "objectives:\n  - {name: sum, goal: minimize}\n  - {name: rest, goal: minimize}\n"
           "trial: {command: [x]}\nbudget: {trials: 30}\n"
           "optimizer: {type: gp, raw_samples: 64, restarts: 2%s}\n",
           extra);
  return text;
}

static void sum_and_rest(const json_t *p, double *obj, double *con) {
  (void)con;
  const char *names[] = {"a", "b", "c", "d", "e", "f"};
  obj[0] = obj[1] = 0;
  for (int i = 0; i < 6; i++) {
    double x = param(p, names[i]);
    obj[0] += x;
    obj[1] += (1 - x) * (1 - x);
  }
}

/* Whether the next suggestion after e's observations is still a design point (it aims at
 * no reference point) given the trials expected. */
static bool next_is_design_point(experiment *e, size_t trials_expected) {
  observation obs[64];
  observations(e, obs);
  json_t *out[1];
  double ref[2];
  nas_err err = {{0}};
  optimizer_set_trials_expected(e->opt, trials_expected);
  if (optimizer_suggest(e->opt, obs, e->n, NULL, 0, 1, (int)e->n, out, ref, &err) < 0)
    fail_msg("suggest: %s", err.msg);
  json_decref(out[0]);
  return isnan(ref[0]);
}

/* With few trials to come the default design takes a fifth of them (never under 5), not
 * 2·d: 30 expected with six parameters, 6 design points instead of 12; with no telling,
 * or many trials expected, 12; an explicit n_initial is kept whatever is expected. */
static void initial_design_takes_at_most_a_fifth_of_the_expected_trials(void **state) {
  (void)state;
  experiment e, given;
  start(&e, six_dims_yaml(""));
  start(&given, six_dims_yaml(", n_initial: 10"));
  run(&e, sum_and_rest, 6, 6);
  run(&given, sum_and_rest, 6, 6);
  assert_false(next_is_design_point(&e, 30));
  assert_true(next_is_design_point(&e, 0));
  assert_true(next_is_design_point(&e, 1000));
  assert_true(next_is_design_point(&e, 60));  /* a fifth is 12: the default */
  assert_false(next_is_design_point(&e, 10)); /* never under 5: 5 */
  assert_true(next_is_design_point(&given, 30));
  finish(&e);
  finish(&given);
}

static void expect_same_runs(const char *options) {
  experiment a, b;
  const char *yaml = branin_currin_yaml("gp", 5, options);
  start(&a, yaml);
  start(&b, yaml);
  run(&a, branin_currin, 9, 3);
  run(&b, branin_currin, 9, 3);
  for (size_t i = 0; i < 9; i++) assert_true(json_equal(a.params[i], b.params[i]));
  finish(&a);
  finish(&b);
}

/* Both constant means (2-d defaults to the fitted one), batches with moving references,
 * references that follow the candidate. */
static void same_seed_and_data_give_the_same_suggestions(void **state) {
  (void)state;
  expect_same_runs(", raw_samples: 64, restarts: 2");
  expect_same_runs(", raw_samples: 64, restarts: 2, mean: worst");
  expect_same_runs(", raw_samples: 64, restarts: 2, reference: follow");
}

/* After a Sobol start, a batch of four holds four different points that are not all in
 * one spot. */
static void batch_points_are_distinct_and_spread(void **state) {
  (void)state;
  experiment e;
  start(&e, branin_currin_yaml("gp", 1, ", raw_samples: 128, restarts: 4"));
  run(&e, branin_currin, 10, 10);
  json_t *out[4];
  suggest(&e, 4, out);
  double widest = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < i; j++) {
      double dx = param(out[i], "x0") - param(out[j], "x0");
      double dy = param(out[i], "x1") - param(out[j], "x1");
      assert_true(hypot(dx, dy) > 1e-3);
      widest = fmax(widest, hypot(dx, dy));
    }
  assert_true(widest > 0.05);
  for (int i = 0; i < 4; i++) json_decref(out[i]);
  finish(&e);
}

static void count_objective(const json_t *p, double *obj, double *con) {
  (void)con;
  obj[0] = param(p, "a") + (strcmp(json_string_value(json_object_get(p, "b")), "x") == 0);
}

/* Six assignments, five observed: the suggestion is the sixth, whatever the model says. */
static void taken_assignments_are_never_proposed(void **state) {
  (void)state;
  experiment e;
  start(&e, "name: f\nparameters:\n  a: {type: int, low: 0, high: 2}\n"
            "  b: {type: categorical, choices: [x, y]}\nobjectives: [{name: c, goal: minimize}]\n"
            "trial: {command: [x]}\nbudget: {trials: 6}\noptimizer: {type: gp, n_initial: 2}\n");
  const char *seen[5] = {"{\"a\":0,\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{\"a\":2,\"b\":\"x\"}",
                         "{\"a\":1,\"b\":\"y\"}", "{\"a\":2,\"b\":\"y\"}"};
  for (int i = 0; i < 5; i++) {
    e.params[e.n] = json_loads(seen[i], 0, NULL);
    count_objective(e.params[e.n], e.obj[e.n], e.con[e.n]);
    e.n++;
  }
  json_t *out[1];
  suggest(&e, 1, out);
  json_t *want = json_loads("{\"a\":0,\"b\":\"y\"}", 0, NULL);
  assert_true(json_equal(out[0], want));
  json_decref(want);
  json_decref(out[0]);
  finish(&e);
}

/* Pending assignments are avoided and steer the batch away from themselves. */
static void pending_trials_are_not_proposed_again(void **state) {
  (void)state;
  experiment e;
  start(&e, branin_currin_yaml("gp", 2, ", raw_samples: 128, restarts: 3"));
  run(&e, branin_currin, 8, 8);
  json_t *first[1], *second[1];
  suggest(&e, 1, first);
  observation obs[64];
  observations(&e, obs);
  nas_err err = {{0}};
  const json_t *pending[1] = {first[0]};
  if (optimizer_suggest(e.opt, obs, e.n, pending, 1, 1, (int)e.n + 1, second, NULL, &err) < 0)
    fail_msg("suggest: %s", err.msg);
  assert_false(json_equal(first[0], second[0]));
  json_decref(first[0]);
  json_decref(second[0]);
  finish(&e);
}

static void mixed_problem(const json_t *p, double *obj, double *con) {
  (void)con;
  double lr = param(p, "lr"), layers = param(p, "layers");
  const json_t *w3 = json_object_get(p, "width3");
  bool sgd = strcmp(json_string_value(json_object_get(p, "opt")), "sgd") == 0;
  obj[0] = pow(log10(lr) + 2.5, 2) + (sgd ? 0.5 - param(p, "momentum") * 0.4 : 0.2) - 0.1 * layers;
  obj[1] = layers + (w3 ? json_integer_value(w3) / 64.0 : 0);
}

/* Mixed and conditional parameters: every suggestion is a valid assignment. */
static void mixed_conditional_space_gives_valid_assignments(void **state) {
  (void)state;
  experiment e;
  start(&e, "name: m\nseed: 4\nparameters:\n"
            "  lr: {type: float, low: 1.0e-4, high: 0.1, log: true}\n"
            "  layers: {type: int, low: 1, high: 4}\n"
            "  width3: {type: int, low: 8, high: 256, log: true, when: \"layers >= 3\"}\n"
            "  opt: {type: categorical, choices: [sgd, adam]}\n"
            "  momentum: {type: float, low: 0, high: 0.99, when: {param: opt, in: [sgd]}}\n"
            "objectives: [{name: loss, goal: minimize}, {name: size, goal: minimize}]\n"
            "trial: {command: [x]}\nbudget: {trials: 14}\n"
            "optimizer: {type: gp, n_initial: 6, raw_samples: 64, restarts: 2}\n");
  run(&e, mixed_problem, 14, 2); /* run() checks every suggestion with spec_check_params */
  finish(&e);
}

static void parabola(const json_t *p, double *obj, double *con) {
  double x = param(p, "x");
  obj[0] = (x - 0.3) * (x - 0.3);
  con[0] = x;
}

/* One objective and a constraint: LogEI with feasibility finds the constrained optimum
 * x = 0.6 of (x − 0.3)² subject to x ≥ 0.6. */
static void constrained_single_objective_finds_the_feasible_optimum(void **state) {
  (void)state;
  experiment e;
  start(&e, "name: c\nseed: 2\nparameters: {x: {type: float, low: 0, high: 1}}\n"
            "objectives: [{name: y, goal: minimize}]\nconstraints: [\"x_copy >= 0.6\"]\n"
            "trial: {command: [x]}\nbudget: {trials: 14}\n"
            "optimizer: {type: gp, n_initial: 5, raw_samples: 64, restarts: 2}\n");
  run(&e, parabola, 14, 1);
  double best = HUGE_VAL;
  for (size_t i = 0; i < e.n; i++)
    if (e.con[i][0] >= 0.6) best = fmin(best, e.obj[i][0]);
  assert_true(best < 0.09 + 0.01); /* (0.6 − 0.3)² = 0.09 */
  finish(&e);
}

static void spread(const json_t *p, double *obj, double *con) {
  (void)con;
  double a = param(p, "a"), b = param(p, "b"), c = param(p, "c");
  double v[5] = {a + c, 1 - a + b, b * a, (1 - b) * c, 1 - c};
  memcpy(obj, v, sizeof v);
}

/* One objective: a batch of four, picked over GPs conditioned on fantasies at the earlier
 * picks, holds four different points. */
static void single_objective_batch_is_distinct(void **state) {
  (void)state;
  experiment e;
  start(&e, "name: s\nseed: 3\nparameters: {x: {type: float, low: 0, high: 1}, "
            "y: {type: float, low: 0, high: 1}}\nobjectives: [{name: v, goal: minimize}]\n"
            "trial: {command: [x]}\nbudget: {trials: 12}\n"
            "optimizer: {type: gp, n_initial: 6, raw_samples: 64, restarts: 2}\n");
  run(&e, parabola, 8, 8);
  json_t *out[4];
  suggest(&e, 4, out);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < i; j++) {
      double dx = param(out[i], "x") - param(out[j], "x");
      double dy = param(out[i], "y") - param(out[j], "y");
      assert_true(hypot(dx, dy) > 1e-3);
    }
  for (int i = 0; i < 4; i++) json_decref(out[i]);
  finish(&e);
}

/* Three objectives go through the box decomposition, five through ParEGO. */
static void three_and_five_objectives_run(void **state) {
  (void)state;
  for (int m = 3; m <= 5; m += 2) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "name: many\nparameters:\n  a: {type: float, low: 0, high: 1}\n"
             "  b: {type: float, low: 0, high: 1}\n  c: {type: float, low: 0, high: 1}\n"
             "objectives:\n  - {name: o0, goal: minimize}\n  - {name: o1, goal: minimize}\n"
             "  - {name: o2, goal: maximize}\n%s"
             "trial: {command: [x]}\nbudget: {trials: 10}\n"
             "optimizer: {type: gp, n_initial: 6, raw_samples: 64, restarts: 2}\n",
             m == 5 ? "  - {name: o3, goal: minimize}\n  - {name: o4, goal: minimize}\n" : "");
    experiment e;
    start(&e, yaml);
    run(&e, spread, 10, 2);
    finish(&e);
  }
}

/* Each suggestion reports the reference point its hypervolume improvement aimed at: none
 * for the initial design; for the first pick of a batch at least the one `nas pareto` infers
 * from the observations (further out where the front's reach says so); the batch's later
 * picks further out (pushed for the pending picks). */
static void suggestions_report_the_reference_point_they_aimed_at(void **state) {
  (void)state;
  experiment e;
  start(&e, branin_currin_yaml("gp", 1, ", raw_samples: 64, restarts: 2"));
  json_t *out[3];
  double refs[3 * 2];
  nas_err err = {{0}};
  assert_int_equal(optimizer_suggest(e.opt, NULL, 0, NULL, 0, 1, 0, out, refs, &err), NAS_OK);
  assert_true(isnan(refs[0]) && isnan(refs[1]));
  json_decref(out[0]);
  run(&e, branin_currin, 10, 10);
  observation obs[64];
  observations(&e, obs);
  assert_int_equal(optimizer_suggest(e.opt, obs, e.n, NULL, 0, 3, (int)e.n, out, refs, &err),
                   NAS_OK);
  double Y[64 * 2], inferred[2];
  for (size_t i = 0; i < e.n; i++) memcpy(Y + 2 * i, e.obj[i], sizeof inferred);
  pareto_reference_point(e.s, Y, e.n, inferred);
  assert_true(refs[0] >= inferred[0] && refs[1] >= inferred[1]);
  for (int i = 1; i < 3; i++)
    for (int j = 0; j < 2; j++) assert_true(refs[2 * i + j] > inferred[j]);
  for (int i = 0; i < 3; i++) json_decref(out[i]);
  finish(&e);
}

/* ZDT1's and DTLZ7's g (d = 6): 1 + 9/5 Σ x1..x5. */
static double g_of(const json_t *p) {
  double g = 1;
  for (int i = 1; i < 6; i++) {
    char name[16];
    snprintf(name, sizeof name, "x%d", i);
    g += 9.0 / 5 * param(p, name);
  }
  return g;
}

/* ZDT1 (d = 6): f1 = x0, f2 = g (1 − √(x0 / g)); its front is x1..x5 = 0, x0 in [0, 1]. */
static void zdt1(const json_t *p, double *obj, double *con) {
  (void)con;
  double g = g_of(p);
  obj[0] = param(p, "x0");
  obj[1] = g * (1 - sqrt(obj[0] / g));
}

/* DTLZ7 (d = 6, M = 2): f1 = x0, f2 = (1 + g)(2 − x0/(1 + g)(1 + sin 3π x0)) with g as
 * ZDT1's; its front is two pieces on x1..x5 = 0, x0 in [0, 0.25] and [0.63, 0.86], the far
 * one's tip (0.86, 2.31) the least f2. */
static void dtlz7(const json_t *p, double *obj, double *con) {
  (void)con;
  double g_plus_1 = 1 + g_of(p);
  obj[0] = param(p, "x0");
  obj[1] = g_plus_1 * (2 - obj[0] / g_plus_1 * (1 + sin(3 * M_PI * obj[0])));
}

/* One gp suggestion (d = 6, two objectives without thresholds, seed `seed`) after a design
 * of 14 and `n_front` points with x1..x5 = 0 and x0 = 0, step, 2·step…: the reference it
 * aimed at and the one `nas pareto` infers, into refs and inferred, and its x0 into *x0. */
static void suggestion_after_first_points(problem_fn f, long seed, int n_front, double step,
                                          double *refs, double *inferred, double *x0) {
  char yaml[1024];
  snprintf(yaml, sizeof yaml,
           "name: z\nseed: %ld\nparameters:\n  x0: {type: float, low: 0, high: 1}\n"
           "  x1: {type: float, low: 0, high: 1}\n  x2: {type: float, low: 0, high: 1}\n"
           "  x3: {type: float, low: 0, high: 1}\n  x4: {type: float, low: 0, high: 1}\n"
           "  x5: {type: float, low: 0, high: 1}\n"
           "objectives:\n  - {name: f1, goal: minimize}\n  - {name: f2, goal: minimize}\n"
           "trial: {command: [x]}\nbudget: {trials: 30}\n"
           "optimizer: {type: gp, n_initial: 14, raw_samples: 64, restarts: 2}\n",
           seed);
  experiment e;
  start(&e, yaml);
  run(&e, f, 14, 14);
  for (int k = 0; k < n_front; k++) {
    e.params[e.n] = json_pack("{sfsfsfsfsfsf}", "x0", step * k, "x1", 0.0, "x2", 0.0, "x3",
                              0.0, "x4", 0.0, "x5", 0.0);
    f(e.params[e.n], e.obj[e.n], e.con[e.n]);
    e.n++;
  }
  observation obs[64];
  observations(&e, obs);
  json_t *out[1];
  double Y[64 * 2];
  nas_err err = {{0}};
  assert_int_equal(optimizer_suggest(e.opt, obs, e.n, NULL, 0, 1, (int)e.n, out, refs, &err),
                   NAS_OK);
  for (size_t i = 0; i < e.n; i++) memcpy(Y + 2 * i, e.obj[i], 2 * sizeof *Y);
  pareto_reference_point(e.s, Y, e.n, inferred);
  print_message("seed %ld: inferred (%.3f, %.3f), aimed at (%.3f, %.3f)\n", seed, inferred[0],
                inferred[1], refs[0], refs[1]);
  assert_true(refs[0] >= inferred[0] && refs[1] >= inferred[1]);
  *x0 = param(out[0], "x0");
  json_decref(out[0]);
  finish(&e);
}

/* Of seeds 0..seeds−1, how many suggestions after suggestion_after_first_points aim past
 * f1_past in f1, where the inferred reference stays below inferred_below. */
static int seeds_aiming_past(problem_fn f, long seeds, int n_front, double step,
                             double inferred_below, double f1_past) {
  int reached = 0;
  for (long seed = 0; seed < seeds; seed++) {
    double refs[2], inferred[2], x0;
    suggestion_after_first_points(f, seed, n_front, step, refs, inferred, &x0);
    assert_true(inferred[0] < inferred_below);
    reached += refs[0] > f1_past;
  }
  print_message("aimed past f1 = %g in %d of %ld seeds\n", f1_past, reached, seeds);
  return reached;
}

/* Without thresholds, the reference a suggestion aims at reaches past the front found so
 * far where the models expect the front to go on: ZDT1 after its design and eight points on
 * the first third of its front (x0 up to 0.35); the inferred point stops 0.1 past x0 = 0.35,
 * where f2 is still 0.41 of the front's 1, so the rest of the front would be worth nothing.
 * The reach comes from posterior draws per suggestion, so it is asked of most seeds (past
 * 0.6), and no suggestion aims short of the inferred point. */
static void reference_reaches_past_the_front_found_so_far(void **state) {
  (void)state;
  assert_true(seeds_aiming_past(zdt1, 4, 8, 0.05, 0.5, 0.6) >= 3);
}

/* The reach sees a piece of the front the models are confidently wrong about: DTLZ7 after
 * its design and sixteen points on its first piece and just past it (x0 up to 0.30), where
 * f2's GP, fitted mostly to f2's variation with x1..x5, has a long lengthscale along x0 and
 * one posterior draw at the front's neighbours showed the far piece (0.86, 2.31) within
 * the trade-off bound in 1 seed of these 8; the reach's several draws do in most, and the
 * reference then takes in the far piece's f1. */
static void reference_reaches_a_far_piece_of_the_front(void **state) {
  (void)state;
  assert_true(seeds_aiming_past(dtlz7, 8, 16, 0.02, 0.4, 0.86) >= 5);
}

/* Where a posterior draw puts the front far past the piece found (DTLZ7 as above), the
 * suggestion goes there, although the models' posterior as a whole calls such a point
 * dominated and the acquisition picked next to the first piece (x0 up to 0.49) in every
 * seed of these 8. */
static void suggestion_goes_where_a_draw_puts_a_far_piece(void **state) {
  (void)state;
  int far = 0;
  for (long seed = 0; seed < 8; seed++) {
    double refs[2], inferred[2], x0;
    suggestion_after_first_points(dtlz7, seed, 16, 0.02, refs, inferred, &x0);
    print_message("seed %ld: suggested x0 = %.3f\n", seed, x0);
    far += x0 > 0.6;
  }
  print_message("suggested past x0 = 0.6 in %d of 8 seeds\n", far);
  assert_true(far >= 4);
}

/* A reading whose standard error is too large to square (1e200) tells the models nothing,
 * and must not make them NaN: the model's means stay finite and follow the data. */
static void a_standard_error_too_large_to_square_leaves_the_model_finite(void **state) {
  (void)state;
  experiment e;
  start(&e, "name: t\nparameters: {x: {type: float, low: 0, high: 1}}\n"
            "objectives: [{name: y, goal: minimize}]\ntrial: {command: [run]}\n"
            "budget: {trials: 20}\n");
  double sems[8];
  observation obs[8];
  for (size_t i = 0; i < 8; i++) {
    e.params[i] = json_pack("{s:f}", "x", (double)i / 7);
    e.obj[i][0] = (double)i / 7;
    sems[i] = i == 3 ? 1e200 : 0.01;
    obs[i] = (observation){e.params[i], e.obj[i], e.con[i], &sems[i]};
  }
  e.n = 8;
  double means[8];
  nas_err err = {{0}};
  if (optimizer_model_means(e.s, obs, 8, means, &err) != NAS_OK) fail_msg("%s", err.msg);
  for (size_t i = 0; i < 8; i++)
    if (!isfinite(means[i]) || fabs(means[i] - (double)i / 7) > 0.1) fail_msg("mean %zu: %g", i, means[i]);
  finish(&e);
}

/* The first batch of four suggestions (a JSON array, owned) after 60 noisy BraninCurrin
 * readings (the tutorial's noise, sd 15.19 and 0.63, from a seeded generator) at points
 * along the front, from its end of least Currin (0, 1) to that of least Branin
 * (0.124, 0.818), with the gp options `extra`. */
static json_t *batch_after_noisy_readings(const char *extra) {
  experiment e;
  start(&e, branin_currin_yaml("gp", 3, extra));
  gsl_rng *noise = gsl_rng_alloc(gsl_rng_mt19937);
  assert_non_null(noise);
  gsl_rng_set(noise, 7);
  for (size_t i = 0; i < 60; i++) {
    double t = (double)i / 59, off = 0.02 * (double)(i % 3);
    e.params[i] = json_pack("{s:f, s:f}", "x0", 0.124 * t, "x1", 0.96 - 0.182 * t + off);
    branin_currin(e.params[i], e.obj[i], e.con[i]);
    e.obj[i][0] += gsl_ran_gaussian(noise, 15.19);
    e.obj[i][1] += gsl_ran_gaussian(noise, 0.63);
  }
  gsl_rng_free(noise);
  e.n = 60;
  json_t *out[4];
  suggest(&e, 4, out);
  finish(&e);
  json_t *batch = json_array();
  for (size_t i = 0; i < 4; i++) json_array_append_new(batch, out[i]);
  return batch;
}

/* Under noise most observations may still be optimal, and the noisy acquisition's baseline
 * keeps up to 128 of them by default: a point left out is one whose value the acquisition
 * forgets, so a candidate near it would be credited with what it already gave. Here all 60
 * may be: the default batch is max_baseline 128's, not 48's (the earlier default). */
static void noisy_baseline_keeps_the_points_that_may_be_optimal(void **state) {
  (void)state;
  json_t *by_default = batch_after_noisy_readings("");
  json_t *with_128 = batch_after_noisy_readings(", max_baseline: 128");
  json_t *with_48 = batch_after_noisy_readings(", max_baseline: 48");
  assert_true(json_equal(by_default, with_128));
  assert_false(json_equal(by_default, with_48));
  json_decref(by_default);
  json_decref(with_128);
  json_decref(with_48);
}

/* Over a fixed set of seeds and 20 evaluations, gp's front dominates more hypervolume than
 * random search's on every seed. */
static void gp_beats_random_on_branin_currin(void **state) {
  (void)state;
  const double ref[2] = {18, 6};
  for (long seed = 0; seed < 3; seed++) {
    experiment g, r;
    start(&g, branin_currin_yaml("gp", seed, ", raw_samples: 128, restarts: 4"));
    start(&r, branin_currin_yaml("random", seed, ""));
    run(&g, branin_currin, 20, 1);
    run(&r, branin_currin, 20, 20);
    double hv_gp = front_hypervolume(&g, ref), hv_random = front_hypervolume(&r, ref);
    print_message("seed %ld: hypervolume gp %.3f, random %.3f (max 59.360)\n", seed, hv_gp,
                  hv_random);
    assert_true(hv_gp > hv_random);
    finish(&g);
    finish(&r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(unknown_or_invalid_options_are_rejected),
      cmocka_unit_test(counts_that_would_make_a_suggestion_slow_are_capped),
      cmocka_unit_test(options_are_validated_without_a_space),
      cmocka_unit_test(gp_is_the_default_optimizer),
      cmocka_unit_test(initial_design_is_the_sobol_design),
      cmocka_unit_test(initial_design_takes_at_most_a_fifth_of_the_expected_trials),
      cmocka_unit_test(same_seed_and_data_give_the_same_suggestions),
      cmocka_unit_test(batch_points_are_distinct_and_spread),
      cmocka_unit_test(taken_assignments_are_never_proposed),
      cmocka_unit_test(pending_trials_are_not_proposed_again),
      cmocka_unit_test(mixed_conditional_space_gives_valid_assignments),
      cmocka_unit_test(constrained_single_objective_finds_the_feasible_optimum),
      cmocka_unit_test(single_objective_batch_is_distinct),
      cmocka_unit_test(three_and_five_objectives_run),
      cmocka_unit_test(suggestions_report_the_reference_point_they_aimed_at),
      cmocka_unit_test(reference_reaches_past_the_front_found_so_far),
      cmocka_unit_test(reference_reaches_a_far_piece_of_the_front),
      cmocka_unit_test(suggestion_goes_where_a_draw_puts_a_far_piece),
      cmocka_unit_test(a_standard_error_too_large_to_square_leaves_the_model_finite),
      cmocka_unit_test(noisy_baseline_keeps_the_points_that_may_be_optimal),
      cmocka_unit_test(gp_beats_random_on_branin_currin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
