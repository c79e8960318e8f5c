/* Tests for spec/: loading experiment specs, their error messages (file:line:col and
 * text), parameter activity and checks, command rendering, value text and spec diffs. */
#include <float.h>
#include <glob.h>
#include <math.h>
#include <sys/stat.h>

#include "scheduler/scheduler.h"
#include "spec/spec.h"
#include "tests/testutil.h"

#define DIR "/tmp/nas-spec-dir"
/* The pieces of a minimal valid spec, one line each unless noted. */
#define NAME "name: t\n"
#define PARAMS_X "parameters:\n  x: {type: float, low: 0, high: 1}\n" /* 2 lines */
#define OBJECTIVES "objectives:\n  - {name: f, goal: minimize}\n"     /* 2 lines */
#define TRIAL "trial:\n  command: [run, \"{x}\"]\n"                   /* 2 lines */
#define BUDGET "budget: {trials: 5}\n"
#define TRIAL_RUN "trial:\n  command: [run]\n" /* 2 lines, no placeholder */
#define AFTER_PARAMS OBJECTIVES TRIAL_RUN BUDGET
#define MINIMAL NAME PARAMS_X OBJECTIVES TRIAL BUDGET

static const char full_example[] =
    "name: quickstart               # required\n"
    "storage: sqlite:runs.db\n"
    "seed: 7\n"
    "parameters:\n"
    "  x1: {type: float, low: 0, high: 1}\n"
    "  lr: {type: float, low: 1e-4, high: 0.1, log: true}\n"
    "  layers: {type: int, low: 1, high: 4}\n"
    "  width: {type: int, low: 16, high: 256, step: 16}\n"
    "  width3: {type: int, low: 8, high: 256, log: true, when: \"layers >= 3\"}\n"
    "  opt: {type: categorical, choices: [sgd, adam, adamw]}\n"
    "  momentum: {type: float, low: 0, high: 0.99, when: {param: opt, in: [sgd]}}\n"
    "  use_bn: {type: categorical, choices: [true, false]}\n"
    "  epochs: 5\n"
    "objectives:\n"
    "  - {name: f1, goal: minimize, threshold: 300}\n"
    "  - {name: accuracy, goal: maximize, noise: 0.004}\n"
    "constraints:\n"
    "  - \"latency_ms <= 5\"\n"
    "  - \"accuracy >= 0.5\"\n"
    "trial:\n"
    "  command: [python3, train.py, \"--lr={lr}\", \"--layers={layers}\"]\n"
    "  workdir: .\n"
    "  env: {OMP_NUM_THREADS: \"1\", MODE: fast}\n"
    "  timeout: 10m\n"
    "budget: {trials: 20, parallel: 4, wall_time: 2h}\n"
    "runner: {type: local}\n"
    "optimizer: {type: gp, n_initial: 8}\n";

static spec *load_ok(const char *yaml) {
  spec *s = NULL;
  nas_err err = {{0}};
  int rc = spec_parse(yaml, "t.yaml", DIR, &s, &err);
  if (rc) print_message("unexpected error: %s\n", err.msg);
  assert_int_equal(rc, NAS_OK);
  assert_non_null(s);
  return s;
}

/* Loading yaml fails with a message that starts with `where` ("t.yaml:3:28: ") and holds
 * `fragment`; nothing is returned (and ASan checks nothing leaked). */
static void expect_error(const char *yaml, const char *where, const char *fragment) {
  spec *s = (spec *)&s;
  nas_err err = {{0}};
  int rc = spec_parse(yaml, "t.yaml", DIR, &s, &err);
  if (rc == NAS_OK) spec_free(s);
  if (rc == NAS_OK || strncmp(err.msg, where, strlen(where)) != 0 || !strstr(err.msg, fragment))
    print_message("expected %s...%s\n     got %s\n", where, fragment,
                  rc == NAS_OK ? "(loaded)" : err.msg);
  assert_int_not_equal(rc, NAS_OK);
  assert_null(s);
  assert_int_equal(strncmp(err.msg, where, strlen(where)), 0);
  assert_non_null(strstr(err.msg, fragment));
}

/* n copies of unit, joined by between; owned. */
static char *repeated(const char *unit, size_t n, const char *between) {
  size_t unit_len = strlen(unit), between_len = strlen(between);
  char *text = malloc(n * (unit_len + between_len) + 1), *end = text;
  assert_non_null(text);
  for (size_t i = 0; i < n; i++) {
    if (i) end = stpcpy(end, between);
    end = stpcpy(end, unit);
  }
  *end = '\0';
  return text;
}

static json_t *json(const char *text) {
  json_error_t error;
  json_t *value = json_loads(text, JSON_DECODE_ANY, &error);
  assert_non_null(value);
  return value;
}

/* ---- what a valid spec loads as ---- */

static void full_example_loads_every_field(void **state) {
  (void)state;
  spec *s = load_ok(full_example);
  assert_string_equal(s->name, "quickstart");
  assert_string_equal(s->storage, "sqlite:runs.db");
  assert_int_equal(s->seed, 7);
  assert_string_equal(s->path, "<string>");
  assert_string_equal(s->text, full_example);
  assert_int_equal(s->n_params, 9);

  const param_spec *p = s->params;
  assert_string_equal(p[0].name, "x1");
  assert_int_equal(p[0].kind, PARAM_FLOAT);
  assert_true(p[0].low == 0 && p[0].high == 1 && !p[0].log && p[0].step == 0);
  assert_int_equal(p[0].line, 5);
  assert_true(p[1].log && p[1].low == 1e-4 && p[1].high == 0.1);
  assert_int_equal(p[2].kind, PARAM_INT);
  assert_true(p[3].step == 16 && p[3].low == 16 && p[3].high == 256);
  assert_true(p[4].conditional && p[4].log);
  assert_int_equal(p[4].cond.parent, 2);
  assert_int_equal(p[4].cond.op, COND_GE);
  assert_int_equal(json_integer_value(json_array_get(p[4].cond.values, 0)), 3);
  assert_int_equal(p[5].kind, PARAM_CATEGORICAL);
  assert_int_equal(json_array_size(p[5].choices), 3);
  assert_string_equal(json_string_value(json_array_get(p[5].choices, 2)), "adamw");
  assert_true(p[6].conditional);
  assert_int_equal(p[6].cond.parent, 5);
  assert_int_equal(p[6].cond.op, COND_IN);
  assert_string_equal(json_string_value(json_array_get(p[6].cond.values, 0)), "sgd");
  assert_true(json_is_true(json_array_get(p[7].choices, 0)));
  assert_true(json_is_false(json_array_get(p[7].choices, 1)));
  assert_int_equal(p[8].kind, PARAM_FIXED);
  assert_true(json_is_integer(p[8].fixed));
  assert_int_equal(json_integer_value(p[8].fixed), 5);
  assert_false(p[8].conditional);

  assert_int_equal(s->n_objectives, 2);
  assert_string_equal(s->objectives[0].name, "f1");
  assert_int_equal(s->objectives[0].goal, GOAL_MINIMIZE);
  assert_true(s->objectives[0].has_threshold && s->objectives[0].threshold == 300);
  assert_int_equal(s->objectives[1].goal, GOAL_MAXIMIZE);
  assert_false(s->objectives[1].has_threshold);
  assert_false(s->objectives[0].has_noise);
  assert_true(s->objectives[1].has_noise && s->objectives[1].noise == 0.004);
  assert_int_equal(s->n_constraints, 2);
  assert_string_equal(s->constraints[0].metric, "latency_ms");
  assert_int_equal(s->constraints[0].op, CONSTRAINT_LE);
  assert_true(s->constraints[0].bound == 5);
  assert_int_equal(s->constraints[1].op, CONSTRAINT_GE);
  assert_true(s->constraints[1].bound == 0.5);

  assert_int_equal(s->trial.argc, 4);
  assert_string_equal(s->trial.argv[2], "--lr={lr}");
  assert_null(s->trial.argv[4]);
  assert_string_equal(s->trial.workdir, DIR);
  assert_int_equal(s->trial.n_env, 2);
  assert_string_equal(s->trial.env[0], "OMP_NUM_THREADS=1");
  assert_string_equal(s->trial.env[1], "MODE=fast");
  assert_null(s->trial.env[2]);
  assert_true(s->trial.timeout_s == 600);
  assert_int_equal(s->budget.max_trials, 20);
  assert_int_equal(s->budget.parallel, 4);
  assert_true(s->budget.max_wall_s == 7200);
  assert_string_equal(s->runner.type, "local");
  assert_int_equal(json_object_size(s->runner.options), 0);
  assert_string_equal(s->optimizer.type, "gp");
  assert_int_equal(json_object_size(s->optimizer.options), 1);
  assert_int_equal(json_integer_value(json_object_get(s->optimizer.options, "n_initial")), 8);
  spec_free(s);
}

static void minimal_spec_gets_defaults(void **state) {
  (void)state;
  spec *s = load_ok(MINIMAL);
  assert_string_equal(s->storage, "sqlite:nas.db");
  assert_int_equal(s->seed, 0);
  assert_int_equal(s->n_constraints, 0);
  assert_string_equal(s->trial.workdir, DIR);
  assert_int_equal(s->trial.n_env, 0);
  assert_true(s->trial.timeout_s == 0);
  assert_int_equal(s->budget.parallel, 1);
  assert_true(s->budget.max_wall_s == 0);
  assert_string_equal(s->runner.type, "local");
  assert_true(json_is_object(s->runner.options) && json_object_size(s->runner.options) == 0);
  assert_string_equal(s->optimizer.type, "gp");
  assert_true(json_is_object(s->optimizer.options));
  spec_free(s);
}

static void optional_keys_without_value_take_defaults(void **state) {
  (void)state;
  spec *s = load_ok(NAME "seed:\nstorage: ~\nconstraints:\nrunner:\n" PARAMS_X AFTER_PARAMS);
  assert_int_equal(s->seed, 0);
  assert_string_equal(s->storage, "sqlite:nas.db");
  assert_int_equal(s->n_constraints, 0);
  assert_string_equal(s->runner.type, "local");
  spec_free(s);
}

static void scalars_are_typed_as_users_expect(void **state) {
  (void)state;
  spec *s = load_ok(NAME
                    "parameters:\n"
                    "  c: {type: categorical, choices: [1, 2.5, \"3\", true, abc, 1e-4, "
                    "'false', -7, +.5, 1_000]}\n" AFTER_PARAMS);
  const json_t *c = s->params[0].choices;
  assert_true(json_is_integer(json_array_get(c, 0)));
  assert_true(json_is_real(json_array_get(c, 1)));
  assert_true(json_is_string(json_array_get(c, 2)));
  assert_true(json_is_true(json_array_get(c, 3)));
  assert_string_equal(json_string_value(json_array_get(c, 4)), "abc");
  assert_true(json_real_value(json_array_get(c, 5)) == 1e-4);
  assert_string_equal(json_string_value(json_array_get(c, 6)), "false");
  assert_int_equal(json_integer_value(json_array_get(c, 7)), -7);
  assert_true(json_real_value(json_array_get(c, 8)) == 0.5);
  assert_string_equal(json_string_value(json_array_get(c, 9)), "1_000");
  spec_free(s);
}

static void every_parameter_type_loads(void **state) {
  (void)state;
  spec *s = load_ok(NAME
                    "parameters:\n"
                    "  fl: {type: float, low: -1.5, high: 2.5, step: 0.5}\n"
                    "  i: {type: int, low: -3, high: 9, step: 3}\n"
                    "  il: {type: int, low: 1, high: 1024, log: true}\n"
                    "  c: {type: categorical, choices: [a, 2]}\n"
                    "  fx: {type: fixed, value: hello}\n"
                    "  fs: 'quoted'\n"
                    "  fb: true\n"
                    "  fr: 0.25\n" AFTER_PARAMS);
  assert_int_equal(s->n_params, 8);
  assert_true(s->params[0].step == 0.5 && s->params[0].low == -1.5);
  assert_true(s->params[1].kind == PARAM_INT && s->params[1].step == 3);
  assert_true(s->params[2].log);
  assert_string_equal(json_string_value(s->params[4].fixed), "hello");
  assert_string_equal(json_string_value(s->params[5].fixed), "quoted");
  assert_true(json_is_true(s->params[6].fixed));
  assert_true(json_real_value(s->params[7].fixed) == 0.25);
  for (int i = 4; i < 8; i++) assert_int_equal(s->params[i].kind, PARAM_FIXED);
  spec_free(s);
}

static void float_step_tolerates_rounding(void **state) {
  (void)state;
  spec *s = load_ok(
      NAME "parameters:\n  x: {type: float, low: 0.1, high: 0.7, step: 0.1}\n" AFTER_PARAMS);
  assert_true(s->params[0].step == 0.1);
  spec_free(s);
}

static void conditions_load_in_both_syntaxes(void **state) {
  (void)state;
  spec *s = load_ok(
      NAME
      "parameters:\n"
      "  x: {type: float, low: 0, high: 1}\n"
      "  opt: {type: categorical, choices: [sgd, adam, adamw]}\n"
      "  a: {type: float, low: 0, high: 1, when: \"opt != sgd\"}\n"
      "  b: {type: float, low: 0, high: 1, when: \"x<0.5\"}\n"
      "  c: {type: float, low: 0, high: 1, when: {param: opt, equals: adam}}\n"
      "  d: {type: float, low: 0, high: 1, when: \"opt == 'adamw'\"}\n"
      "  e: {type: float, low: 0, high: 1, when: \"  x   <=   1  \"}\n"
      "  g: {type: float, low: 0, high: 1, when: \"x > 0\"}\n"
      "  h: {type: float, low: 0, high: 1, when: {param: opt, in: [sgd, adam]}}\n" AFTER_PARAMS);
  const param_spec *p = s->params;
  assert_int_equal(p[2].cond.op, COND_NE);
  assert_int_equal(p[2].cond.parent, 1);
  assert_int_equal(p[3].cond.op, COND_LT);
  assert_true(json_real_value(json_array_get(p[3].cond.values, 0)) == 0.5);
  assert_int_equal(p[4].cond.op, COND_EQ);
  assert_string_equal(json_string_value(json_array_get(p[4].cond.values, 0)), "adam");
  assert_string_equal(json_string_value(json_array_get(p[5].cond.values, 0)), "adamw");
  assert_int_equal(p[6].cond.op, COND_LE);
  assert_int_equal(json_integer_value(json_array_get(p[6].cond.values, 0)), 1);
  assert_int_equal(p[7].cond.op, COND_GT);
  assert_int_equal(p[8].cond.op, COND_IN);
  assert_int_equal(json_array_size(p[8].cond.values), 2);
  spec_free(s);
}

static void durations_accept_numbers_and_suffixes(void **state) {
  (void)state;
  const char *texts[] = {"90", "\"90s\"", "10m", "1.5h", "2d", "0.5", "'45'", "36525d"};
  const double seconds[] = {90, 90, 600, 5400, 172800, 0.5, 45, 36525 * 86400.0};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    char *yaml = nas_asprintf(NAME PARAMS_X OBJECTIVES TRIAL "  timeout: %s\n" BUDGET, texts[i]);
    spec *s = load_ok(yaml);
    assert_true(s->trial.timeout_s == seconds[i]);
    spec_free(s);
    free(yaml);
  }
}

static void workdir_is_resolved_against_the_spec_folder(void **state) {
  (void)state;
  spec *s = load_ok(NAME PARAMS_X OBJECTIVES TRIAL "  workdir: sub/../runs\n" BUDGET);
  assert_string_equal(s->trial.workdir, DIR "/runs");
  spec_free(s);
  s = load_ok(NAME PARAMS_X OBJECTIVES TRIAL "  workdir: /srv/work/\n" BUDGET);
  assert_string_equal(s->trial.workdir, "/srv/work");
  spec_free(s);
}

static void spec_load_keeps_exact_text_and_absolute_path(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *text = "# my experiment\n" MINIMAL "# trailing comment\n";
  char *path = test_write(dir, "exp.yaml", text);
  spec *s = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_load(path, &s, &err), NAS_OK);
  assert_string_equal(s->text, text);
  assert_string_equal(s->path, path);
  assert_string_equal(s->trial.workdir, dir);
  spec_free(s);

  char *bad = test_write(dir, "bad.yaml", NAME "sed: 3\n");
  assert_int_equal(spec_load(bad, &s, &err), NAS_ERR);
  assert_null(s);
  char *where = nas_asprintf("%s:2:1: spec: unknown key 'sed'; did you mean 'seed'?", bad);
  assert_string_equal(err.msg, where);
  free(where);

  char *missing = nas_asprintf("%s/none.yaml", dir);
  assert_int_equal(spec_load(missing, &s, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "none.yaml"));
  free(missing);
  free(bad);
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* A NUL byte in a spec file (a binary file given by mistake) is placed as every other
 * mistake is, by line and column (characters, as libyaml counts them); it was named by the
 * file alone. */
static void a_nul_byte_in_a_spec_file_is_placed_by_line_and_column(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *path = nas_asprintf("%s/binary.yaml", dir);
  static const char text[] = "name: a\nseed: \xc3\xa9\0\n";
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
  assert_int_equal(fclose(f), 0);
  spec *s = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_load(path, &s, &err), NAS_ERR);
  assert_null(s);
  char *want = nas_asprintf("%s:2:8: holds a NUL byte; a spec is a text file", path);
  assert_string_equal(err.msg, want);
  free(want), free(path);
  test_rmtree(dir);
  free(dir);
}

/* ---- errors: YAML and structure ---- */

static void yaml_syntax_errors_have_line_and_column(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  x: {type: float, low: 0\n" AFTER_PARAMS,
               "t.yaml:4:", "YAML syntax error");
  expect_error(NAME "seed: 1\n\tbad: 2\n", "t.yaml:3:1: ", "YAML does not allow tabs");
  expect_error(NAME "a: b: c\n", "t.yaml:2:5: ", "mapping values are not allowed");
}

static void empty_and_odd_documents_are_errors(void **state) {
  (void)state;
  expect_error("", "t.yaml:1:1: ", "the file is empty");
  expect_error("# only a comment\n", "t.yaml:1:1: ", "the file is empty");
  expect_error("- a\n- b\n", "t.yaml:1:1: ", "spec: expected a mapping, got a list");
  expect_error(MINIMAL "---\nname: u\n", "t.yaml:9:1: ", "only one YAML document");
}

static void unknown_keys_suggest_the_nearest(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, hihg: 1}\n" AFTER_PARAMS,
               "t.yaml:3:28: ", "parameters.x: unknown key 'hihg'; did you mean 'high'?");
  expect_error(NAME PARAMS_X "objectivs:\n",
               "t.yaml:4:1: ", "spec: unknown key 'objectivs'; did you mean 'objectives'?");
  expect_error(NAME "colour: red\n", "t.yaml:2:1: ",
               "spec: unknown key 'colour' (known keys: name, storage, seed, parameters,");
  expect_error(MINIMAL "trial2: {}\n", "t.yaml:9:1: ", "did you mean 'trial'?");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  timout: 5\n" BUDGET,
               "t.yaml:8:3: ", "trial: unknown key 'timout'; did you mean 'timeout'?");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: 5, paralel: 2}\n",
               "t.yaml:8:21: ", "budget: unknown key 'paralel'; did you mean 'parallel'?");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: f, gaol: minimize}\n" TRIAL BUDGET,
               "t.yaml:5:15: ", "objectives[0]: unknown key 'gaol'; did you mean 'goal'?");
}

static void keys_of_another_parameter_type_are_named(void **state) {
  (void)state;
  expect_error(NAME
               "parameters:\n  x: {type: float, low: 0, high: 1, choices: [a, b]}\n" AFTER_PARAMS,
               "t.yaml:3:37: ", "parameters.x: 'choices' does not apply to a float parameter");
  expect_error(NAME "parameters:\n  x: {type: categorical, choices: [a, b], low: 1}\n" AFTER_PARAMS,
               "t.yaml:3:43: ", "'low' does not apply to a categorical parameter");
}

static void missing_required_keys_are_named(void **state) {
  (void)state;
  expect_error(PARAMS_X AFTER_PARAMS, "t.yaml:1:1: ", "spec: missing required key 'name'");
  expect_error(NAME AFTER_PARAMS, "t.yaml:1:1: ", "spec: missing required key 'parameters'");
  expect_error(NAME PARAMS_X TRIAL BUDGET, "t.yaml:1:1: ", "missing required key 'objectives'");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL, "t.yaml:1:1: ", "missing required key 'budget'");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0}\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "parameters.x: missing required key 'high'");
  expect_error(NAME "parameters:\n  x: {low: 0, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "parameters.x: missing required key 'type'");
  expect_error(NAME "parameters:\n  x: {tpye: int, low: 0, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:7: ", "parameters.x: unknown key 'tpye'; did you mean 'type'?");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {parallel: 2}\n",
               "t.yaml:8:9: ", "budget: missing required key 'trials'");
  expect_error(NAME PARAMS_X "objectives:\n  - {goal: minimize}\n" TRIAL BUDGET,
               "t.yaml:5:5: ", "objectives[0]: missing required key 'name'");
  expect_error("name:\n" PARAMS_X AFTER_PARAMS, "t.yaml:1:1: ", "spec: 'name' has no value");
}

/* storage: only a string is a storage URL: a number, true/false or a list is refused when
 * the spec loads, where it stands (it was refused only once the storage was opened, and not
 * at all when --storage said another). */
static void a_storage_that_is_no_string_is_refused_at_load(void **state) {
  (void)state;
  expect_error(NAME "storage: 3\n" PARAMS_X AFTER_PARAMS, "t.yaml:2:10: ",
               "storage: expected a storage URL");
  expect_error(NAME "storage: true\n" PARAMS_X AFTER_PARAMS, "t.yaml:2:10: ", "got 'true'");
  expect_error(NAME "storage: [a]\n" PARAMS_X AFTER_PARAMS, "t.yaml:2:10: ", "got a list");
  spec *s = load_ok(NAME "storage: \"3\"\n" PARAMS_X AFTER_PARAMS); /* quoted: a string */
  assert_string_equal(s->storage, "3");
  spec_free(s);
}

/* For ask and tell: no trial section, or one with limits only, runs nothing. */
static void trial_section_may_run_nothing(void **state) {
  (void)state;
  spec *s = load_ok(NAME PARAMS_X OBJECTIVES BUDGET);
  assert_false(spec_trial_runs(s));
  assert_int_equal(s->trial.max_attempts, 3);
  spec_free(s);
  s = load_ok(NAME PARAMS_X OBJECTIVES "trial: {heartbeat_timeout: 5m, max_attempts: 2}\n" BUDGET);
  assert_false(spec_trial_runs(s));
  assert_true(s->trial.heartbeat_timeout_s == 300);
  assert_int_equal(s->trial.max_attempts, 2);
  spec_free(s);
  s = load_ok(NAME PARAMS_X OBJECTIVES TRIAL BUDGET);
  assert_true(spec_trial_runs(s));
  spec_free(s);
}

static void duplicate_keys_are_errors(void **state) {
  (void)state;
  expect_error(NAME "name: u\n",
               "t.yaml:2:1: ", "duplicate key 'name' (first at line 1, column 1)");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: 1}\n  x: 3\n" AFTER_PARAMS,
               "t.yaml:4:3: ", "duplicate key 'x' (first at line 3, column 3)");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, low: 1}\n" AFTER_PARAMS,
               "t.yaml:3:28: ", "duplicate key 'low' (first at line 3, column 20)");
}

static void wrong_types_say_what_was_expected(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  x: {type: float, low: abc, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:25: ", "parameters.x.low: expected a number, got 'abc'");
  expect_error(NAME "parameters:\n  x: {type: float, low: \"0.5\", high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:25: ",
               "expected a number (write it without quotes), got the quoted "
               "string \"0.5\"");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: [1]}\n" AFTER_PARAMS,
               "t.yaml:3:34: ", "parameters.x.high: expected a number, got a list");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: 1, log: yes}\n" AFTER_PARAMS,
               "t.yaml:3:42: ", "parameters.x.log: expected true or false, got 'yes'");
  expect_error(NAME "seed: 1.5\n" PARAMS_X AFTER_PARAMS,
               "t.yaml:2:7: ", "seed: expected an integer, got '1.5'");
  expect_error(NAME "seed: -1\n" PARAMS_X AFTER_PARAMS, "t.yaml:2:7: ", "seed: must be 0 or more");
  expect_error(NAME "parameters: [x]\n" AFTER_PARAMS,
               "t.yaml:2:13: ", "parameters: expected a mapping, got a list");
  expect_error(NAME "parameters:\n  x: [1, 2]\n" AFTER_PARAMS, "t.yaml:3:6: ",
               "parameters.x: expected a mapping such as {type: float, low: 0, high: 1}");
  expect_error(NAME "parameters:\n  x:\n" AFTER_PARAMS,
               "t.yaml:3:5: ", "parameters.x: expected a mapping");
  expect_error(NAME "parameters: {}\n" AFTER_PARAMS,
               "t.yaml:2:13: ", "at least one parameter is needed");
}

static void names_must_be_well_formed(void **state) {
  (void)state;
  expect_error("name: my exp\n" PARAMS_X AFTER_PARAMS,
               "t.yaml:1:7: ", "name: 'my exp' is not an experiment name: a letter or digit");
  expect_error(NAME "parameters:\n  2x: 3\n" AFTER_PARAMS,
               "t.yaml:3:3: ", "parameters: '2x' is not a parameter name");
  expect_error(NAME "parameters:\n  x: {type: flaot, low: 0, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:13: ", "parameters.x.type: unknown type 'flaot'; did you mean 'float'?");
  expect_error(NAME "parameters:\n  x: {type: real, low: 0, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:13: ", "unknown type 'real' (float, int, categorical or fixed)");
}

/* Names that would leave runs/ (trial N of '..' wrote into the spec's folder), read as an
 * option, or make every run folder path too long. */
static void experiment_names_follow_the_documented_pattern(void **state) {
  (void)state;
  const char *bad[] = {"..", ".", "--help", "-x", "_x", ".hidden", "a/b", "a b"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *yaml = nas_asprintf("name: '%s'\n" PARAMS_X AFTER_PARAMS, bad[i]);
    char *what = nas_asprintf("name: '%s' is not an experiment name", bad[i]);
    expect_error(yaml, "t.yaml:1:7: ", what);
    free(what);
    free(yaml);
  }
  char *long_name = repeated("n", 65, "");
  char *yaml = nas_asprintf("name: %s\n" PARAMS_X AFTER_PARAMS, long_name);
  expect_error(yaml, "t.yaml:1:7: ", "at most 64 characters");
  free(yaml);
  long_name[64] = '\0';
  const char *good[] = {"a", "7", "fashion-nas-3obj", "v1.2_run-3", long_name};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    yaml = nas_asprintf("name: %s\n" PARAMS_X AFTER_PARAMS, good[i]);
    spec *s = load_ok(yaml);
    assert_string_equal(s->name, good[i]);
    spec_free(s);
    free(yaml);
  }
  free(long_name);
}

/* Each runner hands parameter values to the trial as NAS_PARAM_<NAME>; two names that map
 * to one variable would give the trial one of the two values, depending on the order. */
static void parameters_sharing_an_environment_variable_are_refused(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  a.b: 1\n  x: 2\n  a-b: 3\n" AFTER_PARAMS, "t.yaml:5:3: ",
               "parameters: 'a-b' and 'a.b' (line 3, column 3) would both be the environment "
               "variable NAS_PARAM_A_B; rename one");
  expect_error(NAME "parameters:\n  lr: 1\n  LR: 2\n" AFTER_PARAMS, "t.yaml:4:3: ",
               "'LR' and 'lr' (line 3, column 3)");
  expect_error(NAME "parameters:\n  a_b: 1\n  a.b: 2\n" AFTER_PARAMS, "t.yaml:4:3: ",
               "NAS_PARAM_A_B");
  char *env = spec_param_env_name("drop-out.rate2");
  assert_string_equal(env, "NAS_PARAM_DROP_OUT_RATE2");
  free(env);
}

/* ---- errors: parameter definitions ---- */

static void bounds_must_be_ordered(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  x: {type: float, low: 1, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:34: ", "parameters.x: high (1) must be above low (1)");
  expect_error(NAME "parameters:\n  x: {type: int, low: 5, high: -2}\n" AFTER_PARAMS,
               "t.yaml:3:32: ", "high (-2) must be above low (5)");
}

static void log_needs_positive_low(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: 1, log: true}\n" AFTER_PARAMS,
               "t.yaml:3:25: ", "parameters.x: log: true needs low above 0, got 0");
  expect_error(NAME "parameters:\n  x: {type: int, low: -1, high: 8, log: true}\n" AFTER_PARAMS,
               "t.yaml:3:23: ", "needs low above 0, got -1");
}

static void int_bounds_must_be_integers(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  n: {type: int, low: 1, high: 4.5}\n" AFTER_PARAMS,
               "t.yaml:3:32: ", "parameters.n.high: expected an integer, got '4.5'");
  expect_error(NAME "parameters:\n  n: {type: int, low: 1.0, high: 4}\n" AFTER_PARAMS,
               "t.yaml:3:23: ", "parameters.n.low: expected an integer, got '1.0'");
  expect_error(NAME "parameters:\n  n: {type: int, low: 1, high: 4, step: 0.5}\n" AFTER_PARAMS,
               "t.yaml:3:41: ", "parameters.n.step: expected an integer");
  expect_error(NAME "parameters:\n  n: {type: int, low: 0, high: 90071992547409930}\n" AFTER_PARAMS,
               "t.yaml:3:32: ", "must be within +-2^53");
}

static void steps_must_be_positive_and_divide_the_range(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: 1, step: 0}\n" AFTER_PARAMS,
               "t.yaml:3:43: ", "parameters.x.step: must be above 0, got 0");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: 1, step: 0.3}\n" AFTER_PARAMS,
               "t.yaml:3:43: ", "parameters.x.step: high - low (1) is not a multiple of step 0.3");
  expect_error(NAME "parameters:\n  n: {type: int, low: 16, high: 250, step: 16}\n" AFTER_PARAMS,
               "t.yaml:3:44: ", "high - low (234) is not a multiple of step 16");
  expect_error(
      NAME "parameters:\n  x: {type: float, low: 1, high: 8, log: true, step: 1}\n" AFTER_PARAMS,
      "t.yaml:3:54: ", "step cannot be combined with log: true");
}

/* What loads can be searched: a discrete range of more steps than the optimizer tells apart
 * (2^52), or a float range wider than the largest double, failed only at the first
 * suggestion, without a place (or gave only its two ends). */
static void ranges_the_optimizer_cannot_search_are_refused(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  n: {type: int, low: 0, high: 4503599627370496}\n" AFTER_PARAMS,
               "t.yaml:3:32: ",
               "parameters.n: high - low spans 4503599627370496 steps of 1; at most "
               "4503599627370495 (2^52 - 1) can be searched");
  expect_error(NAME "parameters:\n  x: {type: float, low: 0, high: 1, step: 1e-17}\n" AFTER_PARAMS,
               "t.yaml:3:43: ", "parameters.x: high - low spans 1e+17 steps of 1e-17");
  expect_error(NAME "parameters:\n  x: {type: float, low: -1e308, high: 1e308}\n" AFTER_PARAMS,
               "t.yaml:3:39: ",
               "parameters.x: the range is too wide: high - low must be at most 1.797");
  spec *s = load_ok(NAME "parameters:\n  n: {type: int, low: 1, high: 4503599627370496}\n"
                         "  x: {type: float, low: -1e307, high: 1e308}\n"
                         "  y: {type: float, low: 1e-300, high: 1e300, log: true}\n" AFTER_PARAMS);
  spec_free(s);
}

static void categorical_needs_distinct_scalar_choices(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [a]}\n" AFTER_PARAMS,
               "t.yaml:3:35: ", "parameters.c.choices: needs at least 2 choices");
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [a, b, a]}\n" AFTER_PARAMS,
               "t.yaml:3:42: ", "parameters.c.choices: 'a' appears twice");
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [1, 1.0]}\n" AFTER_PARAMS,
               "t.yaml:3:39: ", "1.0 is the same choice as 1 (numbers compare by value)");
  /* 1 and '1' differ in NAS_PARAMS, but {c} and NAS_PARAM_C give a trial the same text
   * for both: two configurations the trial cannot tell apart, each burning a trial. */
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [1, '1']}\n" AFTER_PARAMS,
               "t.yaml:3:39: ", "parameters.c.choices: '1' is written to the trial as 1 is ('1'");
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [a, \"true\", true]}\n" AFTER_PARAMS,
               "t.yaml:3:47: ", "true is written to the trial as 'true' is");
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [a, [b]]}\n" AFTER_PARAMS,
               "t.yaml:3:39: ", "expected a string, number or bool, got a list");
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: [a, ~]}\n" AFTER_PARAMS,
               "t.yaml:3:39: ", "got nothing");
  expect_error(NAME "parameters:\n  c: {type: categorical, choices: a}\n" AFTER_PARAMS,
               "t.yaml:3:35: ", "parameters.c.choices: expected a list, got 'a'");
  expect_error(NAME "parameters:\n  c: {type: fixed}\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "parameters.c: missing required key 'value'");
}

/* ---- errors: conditions ---- */

#define COND_PARAMS                       \
  "parameters:\n"                         \
  "  x: {type: float, low: 0, high: 1}\n" \
  "  opt: {type: categorical, choices: [sgd, adam]}\n" /* line 4 */

static void condition_parents_must_exist_earlier(void **state) {
  (void)state;
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"otp == sgd\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "parameters.m.when: unknown parameter 'otp'; did you mean 'opt'?");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: {param: late, equals: 1}}\n"
               "  late: {type: int, low: 0, high: 3}\n" AFTER_PARAMS,
               "t.yaml:5:51: ",
               "'late' is declared after 'm'; a condition can only use parameters declared "
               "before it");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"m > 0\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "a parameter cannot depend on itself");
}

static void condition_values_must_be_possible(void **state) {
  (void)state;
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"opt == rmsprop\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ",
               "parameters.m.when: 'opt' can never hold that: 'rmsprop' is not one of ['sgd', "
               "'adam']");
  expect_error(
      NAME COND_PARAMS
      "  m: {type: float, low: 0, high: 1, when: {param: opt, in: [sgd, rms]}}\n" AFTER_PARAMS,
      "t.yaml:5:60: ", "'rms' is not one of");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"opt < adam\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ",
               "'<' compares a categorical parameter ('opt'); only float and int parameters");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"x >= 2\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "2 is outside the range of 'x' [0, 1]");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"x >= big\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "'x' can only be compared with a number");
  expect_error(NAME
               "parameters:\n  n: {type: int, low: 1, high: 4}\n"
               "  m: {type: float, low: 0, high: 1, when: \"n == 2.5\"}\n" AFTER_PARAMS,
               "t.yaml:4:43: ", "'n' can never hold that: expected an integer, got 2.5");
}

/* A condition no value of its parent satisfies would leave its parameter inactive in every
 * trial (a `<` for a `>` loaded silently): refused like a value the parent cannot take. */
static void conditions_that_never_hold_are_refused(void **state) {
  (void)state;
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"x < 0\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "parameters.m.when: 'x < 0' never holds: 'x' is at least 0");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"x > 1\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "parameters.m.when: 'x > 1' never holds: 'x' is at most 1");
  expect_error(NAME "parameters:\n  e: 5\n"
               "  m: {type: float, low: 0, high: 1, when: \"e != 5\"}\n" AFTER_PARAMS,
               "t.yaml:4:43: ", "parameters.m.when: 'e != 5' never holds: 'e' is fixed at 5");
  spec *s = load_ok(NAME COND_PARAMS
                    "  m: {type: float, low: 0, high: 1, when: \"x <= 0\"}\n"
                    "  k: {type: float, low: 0, high: 1, when: \"x >= 1\"}\n" AFTER_PARAMS);
  spec_free(s);
}

static void condition_syntax_errors_are_explained(void **state) {
  (void)state;
  expect_error(
      NAME COND_PARAMS "  m: {type: float, low: 0, high: 1, when: \"x >=\"}\n" AFTER_PARAMS,
      "t.yaml:5:43: ", "parameters.m.when: 'x >=' is not a condition; write \"PARAM OP VALUE\"");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: \"x = 1\"}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "is not a condition");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: {param: opt, in: [sgd], equals: "
               "sgd}}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "needs exactly one of 'in' (a list) and 'equals'");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: {param: opt}}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "needs exactly one of 'in'");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: {param: opt, in: []}}\n" AFTER_PARAMS,
               "t.yaml:5:60: ", "parameters.m.when.in: needs at least one value");
  expect_error(NAME COND_PARAMS
               "  m: {type: float, low: 0, high: 1, when: {parm: opt, in: [sgd]}}\n" AFTER_PARAMS,
               "t.yaml:5:44: ", "parameters.m.when: unknown key 'parm'; did you mean 'param'?");
  expect_error(NAME COND_PARAMS "  m: {type: float, low: 0, high: 1, when: [x]}\n" AFTER_PARAMS,
               "t.yaml:5:43: ", "parameters.m.when: expected a condition such as");
}

/* ---- errors: objectives, constraints, trial, budget, plug-ins ---- */

static void objectives_are_checked(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X "objectives: []\n" TRIAL BUDGET,
               "t.yaml:4:13: ", "objectives: at least one objective is needed");
  expect_error(NAME PARAMS_X "objectives: {name: f}\n" TRIAL BUDGET,
               "t.yaml:4:13: ", "objectives: expected a list, got a mapping");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: f, goal: minimise}\n" TRIAL BUDGET,
               "t.yaml:5:21: ",
               "objectives[0].goal: 'minimise' is not a goal; did you mean "
               "'minimize'?");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: f, goal: best}\n" TRIAL BUDGET,
               "t.yaml:5:21: ", "'best' is not a goal (minimize or maximize)");
  expect_error(NAME PARAMS_X
               "objectives:\n  - {name: f, goal: minimize}\n"
               "  - {name: f, goal: maximize}\n" TRIAL BUDGET,
               "t.yaml:6:5: ", "objectives[1]: objective 'f' appears twice");
  expect_error(NAME PARAMS_X
               "objectives:\n  - {name: f, goal: minimize, threshold: high}\n" TRIAL BUDGET,
               "t.yaml:5:42: ", "objectives[0].threshold: expected a number");
  expect_error(NAME PARAMS_X
               "objectives:\n  - {name: f, goal: minimize, noise: -0.1}\n" TRIAL BUDGET,
               "t.yaml:5:38: ", "objectives[0].noise: must be a standard deviation");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: 1f, goal: minimize}\n" TRIAL BUDGET,
               "t.yaml:5:12: ", "objectives[0].name: '1f' is not a metric name");
}

/* Trial listings (nas trials/pareto/ask, and their JSON: one flat object per trial) hold the
 * parameters, the metrics and their own columns side by side, so no two may share a name;
 * and "step" is the metric lines' own key. */
static void names_that_listings_or_metric_lines_hold_already_are_refused(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  trial: {type: float, low: 0, high: 1}\n" AFTER_PARAMS,
               "t.yaml:3:3: ",
               "parameters: 'trial' is a column of the trial listings (trial, attempt, status, "
               "rung, reference, error, timings); give the parameter another name");
  /* nas ask prints the attempt it hands out beside the parameters */
  expect_error(NAME "parameters:\n  attempt: {type: int, low: 1, high: 3}\n" AFTER_PARAMS,
               "t.yaml:3:3: ", "parameters: 'attempt' is a column of the trial listings");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: error, goal: minimize}\n" TRIAL BUDGET,
               "t.yaml:5:5: ", "objectives[0]: 'error' is a column of the trial listings");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: step, goal: minimize}\n" TRIAL BUDGET,
               "t.yaml:5:5: ",
               "objectives[0]: 'step' is the key that gives a metric line's step");
  expect_error(NAME PARAMS_X "objectives:\n  - {name: x, goal: minimize}\n" TRIAL BUDGET,
               "t.yaml:5:5: ",
               "objectives[0]: 'x' is also a parameter's name, and trial listings show both in "
               "one row; give them different names");
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints:\n  - \"x <= 5\"\n", "t.yaml:10:5: ",
               "constraints[0]: 'x' is also a parameter's name");
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints:\n  - \"status >= 1\"\n",
               "t.yaml:10:5: ", "constraints[0]: 'status' is a column of the trial listings");
  spec *s = load_ok(NAME "parameters:\n  trials: {type: float, low: 0, high: 1}\n"
                    "objectives:\n  - {name: error_rate, goal: minimize}\n" TRIAL_RUN BUDGET
                    "constraints:\n  - \"f <= 5\"\n");
  spec_free(s);
}

static void constraints_need_metric_op_number(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints:\n  - \"latency_ms < 5\"\n", "t.yaml:10:5: ",
               "constraints[0]: 'latency_ms < 5' is not a constraint; write "
               "\"metric <= number\" or \"metric >= number\"");
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints:\n  - ok >= 1\n  - \"lat <= fast\"\n",
               "t.yaml:11:5: ", "constraints[1]: 'lat <= fast' is not a constraint");
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints:\n  - \"<= 5\"\n",
               "t.yaml:10:5: ", "is not a constraint");
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints:\n  - \"9lat <= 5\"\n",
               "t.yaml:10:5: ", "'9lat' is not a metric name");
  expect_error(NAME PARAMS_X AFTER_PARAMS "constraints: \"lat <= 5\"\n",
               "t.yaml:9:14: ", "constraints: expected a list");
}

static void trial_command_must_be_a_list(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: python3 train.py\n" BUDGET,
               "t.yaml:7:12: ", "trial.command: write the command as a list of arguments");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: []\n" BUDGET,
               "t.yaml:7:12: ", "trial.command: needs at least the program to run");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [\"\", a]\n" BUDGET,
               "t.yaml:7:13: ", "trial.command[0]: the program to run is empty");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run, {a: b}]\n" BUDGET,
               "t.yaml:7:18: ", "trial.command[1]: expected a string, got a mapping");
}

static void placeholders_must_name_parameters(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run, \"--x={xx}\"]\n" BUDGET,
               "t.yaml:7:18: ", "trial.command[1]: unknown placeholder {xx}; did you mean 'x'?");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run, \"{width}\"]\n" BUDGET,
               "t.yaml:7:18: ", "unknown placeholder {width} (no parameter has that name");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run, \"{x\"]\n" BUDGET,
               "t.yaml:7:18: ", "trial.command[1]: '{' without a closing '}'");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run, \"x}\"]\n" BUDGET,
               "t.yaml:7:18: ", "'}' without an opening '{'");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run, \"{}\"]\n" BUDGET,
               "t.yaml:7:18: ", "empty placeholder {}");
}

static void trial_env_workdir_timeout_are_checked(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  env: {1BAD: x}\n" BUDGET,
               "t.yaml:8:9: ", "trial.env: '1BAD' is not an environment variable name");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  env: {A: [1]}\n" BUDGET,
               "t.yaml:8:12: ", "trial.env.A: expected a string, got a list");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  env: [A=1]\n" BUDGET,
               "t.yaml:8:8: ", "trial.env: expected a mapping, got a list");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  timeout: 10 minutes\n" BUDGET,
               "t.yaml:8:12: ", "trial.timeout: expected a duration such as 90, \"90s\"");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  timeout: 0\n" BUDGET,
               "t.yaml:8:12: ", "trial.timeout: must be more than 0 seconds");
  /* seconds past what a timer's time_t holds would make the local monitor spin */
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  timeout: 1e19\n" BUDGET,
               "t.yaml:8:12: ", "trial.timeout: must be at most 100 years");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  heartbeat_timeout: 36526d\n" BUDGET,
               "t.yaml:8:22: ", "trial.heartbeat_timeout: must be at most 100 years");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  workdir: [a]\n" BUDGET,
               "t.yaml:8:12: ", "trial.workdir: expected a string");
}

/* A duration whose seconds overflow to infinity is too long; it was said to be too short
 * ("must be more than 0 seconds"). */
static void durations_past_the_largest_double_are_too_long(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "  timeout: 1e308d\n" BUDGET,
               "t.yaml:8:12: ", "trial.timeout: must be at most 100 years");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: 5, wall_time: 1e400}\n",
               "t.yaml:8:32: ", "budget.wall_time: must be at most 100 years");
}

static void budget_is_checked(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: 0}\n",
               "t.yaml:8:18: ", "budget.trials: must be between 1 and");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: many}\n",
               "t.yaml:8:18: ", "budget.trials: expected an integer, got 'many'");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: 3, parallel: 0}\n",
               "t.yaml:8:31: ", "budget.parallel: must be between 1 and");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: 3, wall_time: soon}\n",
               "t.yaml:8:32: ", "budget.wall_time: expected a duration");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL "budget: 10\n",
               "t.yaml:8:9: ", "budget: expected a mapping, got '10'");
}

static void plugin_types_are_checked(void **state) {
  (void)state;
  expect_error(MINIMAL "runner: {type: slrum}\n",
               "t.yaml:9:16: ", "runner.type: unknown type 'slrum'; did you mean 'slurm'?");
  expect_error(MINIMAL "optimizer: {type: bayes}\n",
               "t.yaml:9:19: ", "optimizer.type: unknown type 'bayes'");
  expect_error(MINIMAL "optimizer: [gp]\n", "t.yaml:9:12: ", "optimizer: expected a mapping");
  expect_error(MINIMAL "optimizer: &a {type: gp, loop: *a}\n",
               "t.yaml:9:32: ", "the alias '*a' names no complete node before it");
  spec *s = load_ok(MINIMAL "runner: {type: slurm, partition: gpu, nodes: [1, 2]}\n");
  assert_string_equal(s->runner.type, "slurm");
  assert_string_equal(json_string_value(json_object_get(s->runner.options, "partition")), "gpu");
  assert_int_equal(json_array_size(json_object_get(s->runner.options, "nodes")), 2);
  assert_null(json_object_get(s->runner.options, "type"));
  assert_string_equal(json_string_value(json_object_get(s->runner.where, "partition")),
                      "t.yaml:9:34");
  assert_string_equal(json_string_value(json_object_get(s->runner.where, "nodes")),
                      "t.yaml:9:46");
  assert_null(json_object_get(s->runner.where, "type"));
  assert_int_equal(json_object_size(s->optimizer.where), 0);
  spec_free(s);
}

/* ---- tags and limits ---- */

static void standard_tags_are_honoured(void **state) {
  (void)state;
  spec *s = load_ok(NAME "parameters:\n  a: !!str 7\n  b: !!int '8'\n  c: !!float 2.5\n"
                    "  d: !!bool 'true'\n  e: ! 9\n"
                    "  g: !!map {type: categorical, choices: !!seq [!!str 1, 2]}\n" AFTER_PARAMS);
  assert_string_equal(json_string_value(s->params[0].fixed), "7");
  assert_true(json_is_integer(s->params[1].fixed));
  assert_int_equal(json_integer_value(s->params[1].fixed), 8);
  assert_true(json_is_real(s->params[2].fixed));
  assert_true(json_is_true(s->params[3].fixed));
  assert_string_equal(json_string_value(s->params[4].fixed), "9");
  assert_int_equal(json_array_size(s->params[5].choices), 2);
  assert_string_equal(json_string_value(json_array_get(s->params[5].choices, 0)), "1");
  spec_free(s);
}

static void other_tags_and_mistyped_values_are_refused(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  a: !!python/object:os.system {x: 1}\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "the YAML tag '!!python/object:os.system' is not supported");
  expect_error(NAME "parameters:\n  a: !!set {x, y}\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "the YAML tag '!!set' is not supported");
  expect_error(NAME "parameters:\n  a: !custom 3\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "the YAML tag '!custom' is not supported");
  expect_error(NAME "parameters:\n  a: !!binary aGk=\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "the YAML tag '!!binary' is not supported");
  expect_error(NAME "parameters:\n  a: !!int abc\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "'!!int' needs an integer, got 'abc'");
  expect_error(NAME "parameters:\n  a: !!float 1e\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "'!!float' needs a decimal number, got '1e'");
  expect_error(NAME "parameters:\n  a: !!bool yes\n" AFTER_PARAMS,
               "t.yaml:3:6: ", "'!!bool' needs true or false, got 'yes'");
}

/* A standard tag on the wrong kind of node is named as such (it read "the YAML tag '!!str'
 * is not supported; a spec takes only !!str, ..."). */
static void standard_tags_in_the_wrong_place_say_where_they_belong(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  a: !!str {x: 1}\n" AFTER_PARAMS, "t.yaml:3:6: ",
               "the YAML tag '!!str' cannot tag a mapping: !!str, !!int, !!float, !!bool and "
               "!!null tag single values, !!seq lists, !!map mappings");
  expect_error(NAME "parameters:\n  a: !!map [1, 2]\n" AFTER_PARAMS, "t.yaml:3:6: ",
               "the YAML tag '!!map' cannot tag a list");
  expect_error(NAME "parameters:\n  a: !!seq 3\n" AFTER_PARAMS, "t.yaml:3:6: ",
               "the YAML tag '!!seq' cannot tag a single value");
}

/* A double-quoted "\0" puts a NUL inside a value, which every reader of C strings cuts
 * short there: `name: "a\0b"` was stored as 'a', a command "echo\0rm" ran echo. */
static void values_holding_a_nul_character_are_refused(void **state) {
  (void)state;
  expect_error("name: \"t\\0x\"\n" PARAMS_X AFTER_PARAMS, "t.yaml:1:7: ",
               "holds a NUL character (\\0), which a spec cannot pass on");
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [\"echo\\0rm\"]\n" BUDGET,
               "t.yaml:7:13: ", "holds a NUL character");
  expect_error(NAME "parameters:\n  \"x\\0y\": 1\n" AFTER_PARAMS, "t.yaml:3:3: ",
               "holds a NUL character");
}

static void nesting_past_the_limit_is_refused_at_once(void **state) {
  (void)state;
  char *open = repeated("[", 100000, ""), *close = repeated("]", 100000, "");
  char *yaml = nas_asprintf(MINIMAL "optimizer: {type: gp, deep: %s%s}\n", open, close);
  expect_error(yaml, "t.yaml:9:91: ", "nested more than 64 levels deep");
  free(yaml);
  free(open);
  free(close);
  open = repeated("[", 62, "");
  close = repeated("]", 62, "");
  yaml = nas_asprintf(MINIMAL "optimizer: {type: gp, deep: %s%s}\n", open, close);
  spec_free(load_ok(yaml)); /* 64 levels with the root and the optimizer */
  free(yaml);
  free(open);
  free(close);
}

static void lists_and_mappings_past_the_entry_limit_are_refused(void **state) {
  (void)state;
  char *many = malloc(1001 * 8), *end = many;
  for (int i = 0; i < 1001; i++) end += sprintf(end, "%s%d", i ? ", " : "", i);
  char *yaml = nas_asprintf(NAME "parameters:\n  c: {type: categorical, choices: [%s]}\n"
                            AFTER_PARAMS, many);
  expect_error(yaml, "t.yaml:3:35: ", "this list has more than 1000 entries");
  free(yaml);
  many[strlen(many) - strlen(", 1000")] = '\0';
  yaml = nas_asprintf(NAME "parameters:\n  c: {type: categorical, choices: [%s]}\n" AFTER_PARAMS,
                      many);
  spec *s = load_ok(yaml);
  assert_int_equal(json_array_size(s->params[0].choices), 1000);
  spec_free(s);
  free(yaml);
  free(many);
}

static void aliases_past_the_value_limit_are_refused(void **state) {
  (void)state;
  /* Each level names the previous one ten times: a5 stands for a million values. */
  expect_error(MINIMAL "runner:\n  type: local\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
               "  a1: &a1 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]\n"
               "  a2: &a2 [*a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1]\n"
               "  a3: &a3 [*a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2]\n"
               "  a4: &a4 [*a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3]\n"
               "  a5: [*a4, *a4, *a4, *a4, *a4, *a4, *a4, *a4, *a4, *a4]\n",
               "t.yaml:15:", "the file holds more than 100000 values");
  char *anchors = malloc(101 * 24), *end = anchors;
  for (int i = 0; i < 101; i++) end += sprintf(end, "%s&a%d %d", i ? ", " : "", i, i);
  char *yaml = nas_asprintf(MINIMAL "runner: {type: local, many: [%s]}\n", anchors);
  expect_error(yaml, "t.yaml:9:", "more than 100 anchors");
  free(yaml);
  free(anchors);
  expect_error(MINIMAL "runner: {type: local, a: &x 1, b: &x 2}\n",
               "t.yaml:9:", "the anchor '&x' is defined twice (first at line 9, column");
  expect_error(MINIMAL "runner: {type: local, b: *x, a: &x 1}\n",
               "t.yaml:9:", "the alias '*x' names no complete node before it");
  spec *s = load_ok(MINIMAL "runner: {type: local, a: &x [1, 2], b: *x}\n");
  assert_int_equal(json_array_size(json_object_get(s->runner.options, "b")), 2);
  spec_free(s);
}

static void text_over_a_mebibyte_is_refused(void **state) {
  (void)state;
  size_t room = SPEC_MAX_BYTES - strlen(MINIMAL "#\n");
  char *pad = repeated("x", room, "");
  char *yaml = nas_asprintf(MINIMAL "#%s\n", pad);
  assert_int_equal(strlen(yaml), SPEC_MAX_BYTES);
  spec_free(load_ok(yaml));
  free(yaml);
  yaml = nas_asprintf(MINIMAL "#%sx\n", pad);
  expect_error(yaml, "t.yaml: ", "larger than 1048576 bytes (1 MiB)");
  char *dir = test_tmpdir(), *path = test_write(dir, "big.yaml", yaml);
  spec *s = (spec *)&s;
  nas_err err = {{0}};
  assert_int_equal(spec_load(path, &s, &err), NAS_ERR);
  assert_null(s);
  assert_non_null(strstr(err.msg, "big.yaml: larger than 1048576 bytes"));
  free(path);
  test_rmtree(dir);
  free(dir);
  free(yaml);
  free(pad);
}

static void devices_pipes_and_folders_are_not_read(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *fifo = nas_asprintf("%s/fifo.yaml", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  const char *paths[] = {"/dev/zero", fifo, dir};
  for (size_t i = 0; i < 3; i++) {
    spec *s = (spec *)&s;
    nas_err err = {{0}};
    assert_int_equal(spec_load(paths[i], &s, &err), NAS_ERR);
    assert_null(s);
    char *want = nas_asprintf("%s: not a regular file", paths[i]);
    assert_string_equal(strstr(err.msg, want) ? want : err.msg, want);
    free(want);
  }
  free(fifo);
  test_rmtree(dir);
  free(dir);
}

/* ---- parameters at run time ---- */

static const char chain_spec[] = NAME
    "parameters:\n"
    "  layers: {type: int, low: 1, high: 4}\n"
    "  width3: {type: int, low: 8, high: 256, log: true, when: \"layers >= 3\"}\n"
    "  opt: {type: categorical, choices: [sgd, adam, adamw]}\n"
    "  momentum: {type: float, low: 0, high: 0.99, when: {param: opt, in: [sgd]}}\n"
    "  nesterov: {type: categorical, choices: [true, false], when: \"momentum > 0.5\"}\n"
    "  lr: {type: float, low: 0.001, high: 0.1, step: 0.001}\n"
    "  epochs: 5\n" AFTER_PARAMS;

static void comparison_condition_decides_activity(void **state) {
  (void)state;
  spec *s = load_ok(chain_spec);
  json_t *params = json("{\"layers\": 3}");
  assert_true(spec_param_active(s, 1, params));
  json_object_set_new(params, "layers", json_integer(2));
  assert_false(spec_param_active(s, 1, params));
  json_object_del(params, "layers");
  assert_false(spec_param_active(s, 1, params)); /* parent not decided yet */
  assert_true(spec_param_active(s, 0, params));
  json_decref(params);
  spec_free(s);
}

static void conditions_chain_through_inactive_parents(void **state) {
  (void)state;
  spec *s = load_ok(chain_spec);
  json_t *params = json("{\"opt\": \"sgd\", \"momentum\": 0.9}");
  assert_true(spec_param_active(s, 3, params));
  assert_true(spec_param_active(s, 4, params));
  json_object_set_new(params, "momentum", json_real(0.2));
  assert_false(spec_param_active(s, 4, params));
  /* A stale momentum does not make nesterov active once opt turns momentum off. */
  json_object_set_new(params, "opt", json_string("adam"));
  json_object_set_new(params, "momentum", json_real(0.9));
  assert_false(spec_param_active(s, 3, params));
  assert_false(spec_param_active(s, 4, params));
  json_decref(params);
  spec_free(s);
}

static void check_params_accepts_valid_assignments(void **state) {
  (void)state;
  spec *s = load_ok(chain_spec);
  nas_err err = {{0}};
  json_t *a = json(
      "{\"layers\": 4, \"width3\": 64, \"opt\": \"sgd\", \"momentum\": 0.9, "
      "\"nesterov\": true, \"lr\": 0.037, \"epochs\": 5}");
  assert_int_equal(spec_check_params(s, a, &err), NAS_OK);
  json_decref(a);
  a = json("{\"layers\": 1, \"opt\": \"adam\", \"lr\": 0.1, \"epochs\": 5.0}");
  assert_int_equal(spec_check_params(s, a, &err), NAS_OK);
  json_decref(a);
  spec_free(s);
}

static void expect_rejected(const spec *s, const char *params, const char *fragment) {
  nas_err err = {{0}};
  json_t *a = json(params);
  int rc = spec_check_params(s, a, &err);
  if (rc == NAS_OK || !strstr(err.msg, fragment))
    print_message("expected ...%s\n     got %s\n", fragment, rc ? err.msg : "(accepted)");
  assert_int_equal(rc, NAS_ERR);
  assert_non_null(strstr(err.msg, fragment));
  json_decref(a);
}

static void check_params_rejects_invalid_assignments(void **state) {
  (void)state;
  spec *s = load_ok(chain_spec);
#define OK_TAIL "\"opt\": \"adam\", \"lr\": 0.01, \"epochs\": 5"
  expect_rejected(s, "[1]", "expected a JSON object");
  expect_rejected(s, "{\"layers\": 2, " OK_TAIL ", \"depth\": 1}", "unknown parameter 'depth'");
  expect_rejected(s, "{" OK_TAIL "}", "parameter 'layers' is missing");
  expect_rejected(s, "{\"layers\": 3, " OK_TAIL "}", "parameter 'width3' is missing");
  expect_rejected(s, "{\"layers\": 2, \"width3\": 16, " OK_TAIL "}",
                  "parameter 'width3' is inactive (its condition layers >= 3 does not hold)");
  expect_rejected(s, "{\"layers\": 5, " OK_TAIL "}", "parameter 'layers': 5 is outside [1, 4]");
  expect_rejected(s, "{\"layers\": 2.0, " OK_TAIL "}",
                  "parameter 'layers': expected an integer, got 2.0");
  expect_rejected(s, "{\"layers\": \"2\", " OK_TAIL "}", "expected an integer, got '2'");
  expect_rejected(s, "{\"layers\": 2, \"opt\": \"rmsprop\", \"lr\": 0.01, \"epochs\": 5}",
                  "parameter 'opt': 'rmsprop' is not one of ['sgd', 'adam', 'adamw']");
  expect_rejected(s, "{\"layers\": 2, \"opt\": \"adam\", \"lr\": 0.0105, \"epochs\": 5}",
                  "parameter 'lr': 0.0105 is not on the grid 0.001 + k * 0.001");
  expect_rejected(s, "{\"layers\": 2, \"opt\": \"adam\", \"lr\": 0.2, \"epochs\": 5}",
                  "0.2 is outside [0.001, 0.1]");
  expect_rejected(s, "{\"layers\": 2, \"opt\": \"adam\", \"lr\": 0.01, \"epochs\": 6}",
                  "parameter 'epochs': the value is fixed at 5, got 6");
  expect_rejected(s, "{\"layers\": 2, \"opt\": \"adam\", \"lr\": 0.01}",
                  "parameter 'epochs' is missing");
  expect_rejected(s,
                  "{\"layers\": 2, \"opt\": \"sgd\", \"momentum\": 0.9, \"nesterov\": 1, "
                  "\"lr\": 0.01, \"epochs\": 5}",
                  "parameter 'nesterov': 1 is not one of [true, false]");
#undef OK_TAIL
  spec_free(s);
}

static void param_index_finds_by_exact_name(void **state) {
  (void)state;
  spec *s = load_ok(chain_spec);
  assert_int_equal(spec_param_index(s, "layers"), 0);
  assert_int_equal(spec_param_index(s, "epochs"), 6);
  assert_int_equal(spec_param_index(s, "epoch"), -1);
  assert_int_equal(spec_param_index(s, "epochss"), -1);
  spec_free(s);
}

static void names_with_dots_and_dashes_work_everywhere(void **state) {
  (void)state;
  spec *s = load_ok(
      NAME
      "parameters:\n"
      "  weight-decay: {type: float, low: 0, high: 0.1}\n"
      "  opt.beta1: {type: float, low: 0.5, high: 0.99, when: \"weight-decay>=0.01\"}\n" OBJECTIVES
      "trial:\n  command: [run, \"--wd={weight-decay}\", \"--b1={opt.beta1}\"]\n" BUDGET);
  json_t *params = json("{\"weight-decay\": 0.05, \"opt.beta1\": 0.9}");
  nas_err err = {{0}};
  assert_int_equal(spec_check_params(s, params, &err), NAS_OK);
  char **argv;
  assert_int_equal(spec_render_argv(s, params, &argv, &err), NAS_OK);
  assert_string_equal(argv[1], "--wd=0.05");
  assert_string_equal(argv[2], "--b1=0.9");
  spec_argv_free(argv);
  json_decref(params);
  spec_free(s);
}

static void int_conditions_compare_numbers_by_value(void **state) {
  (void)state;
  spec *s =
      load_ok(NAME
              "parameters:\n"
              "  n: {type: int, low: 1, high: 4}\n"
              "  m: {type: float, low: 0, high: 1, when: {param: n, in: [2, 4]}}\n" AFTER_PARAMS);
  json_t *params = json("{\"n\": 4.0}");
  assert_true(spec_param_active(s, 1, params));
  json_object_set_new(params, "n", json_integer(3));
  assert_false(spec_param_active(s, 1, params));
  json_decref(params);
  spec_free(s);
}

/* Numbers compare by value also where a condition is written: `n == 4.0` on an int parent
 * is `n == 4` (it was refused as "expected an integer, got 4"). */
static void int_condition_values_may_be_written_as_whole_reals(void **state) {
  (void)state;
  spec *s = load_ok(NAME
                    "parameters:\n"
                    "  n: {type: int, low: 1, high: 4}\n"
                    "  m: {type: float, low: 0, high: 1, when: \"n == 4.0\"}\n"
                    "  k: {type: float, low: 0, high: 1, when: {param: n, in: [2.0, 3]}}\n"
                    AFTER_PARAMS);
  json_t *params = json("{\"n\": 4}");
  assert_true(spec_param_active(s, 1, params));
  assert_false(spec_param_active(s, 2, params));
  json_object_set_new(params, "n", json_integer(2));
  assert_false(spec_param_active(s, 1, params));
  assert_true(spec_param_active(s, 2, params));
  json_decref(params);
  spec_free(s);
}

static void parse_without_a_name_reports_string(void **state) {
  (void)state;
  spec *s = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_parse("name: [\n", NULL, NULL, &s, &err), NAS_ERR);
  assert_int_equal(strncmp(err.msg, "<string>:2:1: YAML syntax error", 31), 0);
  assert_int_equal(spec_parse(MINIMAL, NULL, NULL, &s, &err), NAS_OK);
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_string_equal(s->trial.workdir, cwd);
  assert_string_equal(s->path, "<string>");
  spec_free(s);
}

/* ---- rendering and value text ---- */

static void render_argv_substitutes_values(void **state) {
  (void)state;
  spec *s = load_ok(NAME
                    "parameters:\n"
                    "  lr: {type: float, low: 1e-5, high: 1}\n"
                    "  n: {type: int, low: 1, high: 4}\n"
                    "  opt: {type: categorical, choices: [sgd, adam]}\n"
                    "  bn: {type: categorical, choices: [true, false]}\n"
                    "  m: {type: float, low: 0, high: 1, when: \"opt == sgd\"}\n"
                    "  tag: run 1\n" OBJECTIVES
                    "trial:\n  command: [python3, \"--lr={lr}\", \"--n={n}\", \"{opt}\", "
                    "\"--bn={bn}\", \"--m={m}\", \"{{lr}}={lr}\", \"}}{{\", \"{tag}\"]\n" BUDGET);
  json_t *params = json(
      "{\"lr\": 0.1, \"n\": 3, \"opt\": \"adam\", \"bn\": false, "
      "\"tag\": \"run 1\"}");
  char **argv = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_render_argv(s, params, &argv, &err), NAS_OK);
  const char *want[] = {"python3", "--lr=0.1", "--n=3", "adam",  "--bn=false",
                        "--m=",    "{lr}=0.1", "}{",    "run 1", NULL};
  for (size_t i = 0; want[i]; i++) assert_string_equal(argv[i], want[i]);
  assert_null(argv[9]);
  spec_argv_free(argv);

  json_object_set_new(params, "opt", json_string("sgd"));
  json_object_set_new(params, "m", json_real(1e-7 * 3));
  assert_int_equal(spec_render_argv(s, params, &argv, &err), NAS_OK);
  assert_string_equal(argv[5], "--m=3e-07");
  spec_argv_free(argv);

  json_object_del(params, "n");
  argv = (char **)&argv;
  assert_int_equal(spec_render_argv(s, params, &argv, &err), NAS_ERR);
  assert_null(argv);
  assert_string_equal(err.msg, "parameter 'n' has no value");
  json_decref(params);
  spec_free(s);
}

static void expect_text(json_t *value, const char *want) {
  char *text = spec_value_text(value);
  assert_string_equal(text, want);
  free(text);
  json_decref(value);
}

static void value_text_is_shortest_exact(void **state) {
  (void)state;
  expect_text(json_real(0.1), "0.1");
  expect_text(json_real(0.1 + 0.2), "0.30000000000000004");
  expect_text(json_real(1.0 / 3), "0.3333333333333333");
  expect_text(json_real(1e-4), "0.0001");
  expect_text(json_real(5.0), "5");
  expect_text(json_real(-2.5), "-2.5");
  expect_text(json_real(1e21), "1e+21");
  expect_text(json_real(3600.0), "3600");
  expect_text(json_real(1.5e15), "1500000000000000");
  expect_text(json_real(1e16), "1e+16");
  expect_text(json_real(1e-5), "1e-05");
  expect_text(json_real(0.00012), "0.00012");
  expect_text(json_real(123456789.0), "123456789");
  expect_text(json_real(DBL_MAX), "1.7976931348623157e+308");
  expect_text(json_real(5e-324), "5e-324");
  expect_text(json_integer(9007199254740993LL), "9007199254740993");
  expect_text(json_integer(-42), "-42");
  expect_text(json_true(), "true");
  expect_text(json_false(), "false");
  expect_text(json_string("a b{c}"), "a b{c}");
  expect_text(json_null(), "null");
}

static void value_text_reads_back_exactly(void **state) {
  (void)state;
  /* A deterministic spread of doubles across magnitudes, including awkward mantissas. */
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < 20000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double mantissa = (double)(x >> 11) / 9007199254740992.0;
    double v = ldexp(mantissa, (int)(x % 200) - 100) * ((x & 1) ? -1 : 1);
    json_t *real = json_real(v);
    char *text = spec_value_text(real);
    assert_true(strtod(text, NULL) == v);
    assert_true(strlen(text) <= 24);
    free(text);
    json_decref(real);
  }
}

/* ---- diff ---- */


static void retries_heartbeats_and_stopping_rules_load(void **state) {
  (void)state;
  spec *s = load_ok(NAME PARAMS_X OBJECTIVES
                    "trial:\n  command: [run]\n  max_attempts: 5\n  heartbeat_timeout: 30s\n"
                    "budget:\n  trials: 9\n  max_failure_rate: 0.25\n"
                    "  patience: {trials: 10, min_improvement: 0.01}\n");
  assert_int_equal(s->trial.max_attempts, 5);
  assert_true(s->trial.heartbeat_timeout_s == 30);
  assert_true(s->budget.max_failure_rate == 0.25);
  assert_int_equal(s->budget.patience_trials, 10);
  assert_true(s->budget.patience_min_improvement == 0.01);
  assert_int_equal(s->early_stopping.rule, EARLY_STOP_NONE);
  spec_free(s);
  s = load_ok(MINIMAL);
  assert_int_equal(s->trial.max_attempts, 3);
  assert_true(s->trial.heartbeat_timeout_s == 0);
  assert_true(s->budget.max_failure_rate == 0.5);
  assert_int_equal(s->budget.patience_trials, 0);
  spec_free(s);
  expect_error(NAME PARAMS_X OBJECTIVES "trial:\n  command: [run]\n  max_attempts: 0\n" BUDGET,
               "t.yaml:8:17: ", "between 1 and 100");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL_RUN "budget: {trials: 2, max_failure_rate: 2}\n",
               "t.yaml:8:39: ", "[0, 1]");
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL_RUN "budget: {trials: 2, patience: {trails: 3}}\n",
               "t.yaml:8:32: ", "did you mean 'trials'");
}

static void early_stopping_loads_with_defaults_and_rungs(void **state) {
  (void)state;
  spec *s = load_ok(MINIMAL "early_stopping: {rule: median}\n");
  assert_int_equal(s->early_stopping.rule, EARLY_STOP_MEDIAN);
  assert_int_equal(s->early_stopping.n_objectives, 1);
  assert_int_equal(s->early_stopping.min_steps, 1);
  assert_int_equal(s->early_stopping.min_trials, 4);
  spec_free(s);
  s = load_ok(MINIMAL "early_stopping: {rule: asha, min_steps: 2, reduction_factor: 2}\n");
  assert_int_equal(s->early_stopping.rule, EARLY_STOP_ASHA);
  assert_true(s->early_stopping.n_rungs > 5);
  assert_int_equal(s->early_stopping.rungs[0], 2);
  assert_int_equal(s->early_stopping.rungs[1], 4);
  assert_int_equal(s->early_stopping.rungs[2], 8);
  spec_free(s);
  s = load_ok(MINIMAL "early_stopping: {rule: asha, rungs: [1, 5, 25], objectives: [f]}\n");
  assert_int_equal(s->early_stopping.n_rungs, 3);
  assert_int_equal(s->early_stopping.rungs[2], 25);
  spec_free(s);
  expect_error(MINIMAL "early_stopping: {rule: medain}\n", "t.yaml:9:24: ", "did you mean 'median'");
  expect_error(MINIMAL "early_stopping: {rule: median, objectives: [g]}\n", "t.yaml:9:45: ",
               "'g' is not an objective");
  expect_error(MINIMAL "early_stopping: {rule: asha, rungs: [3, 2]}\n", "t.yaml:9:41: ",
               "ascending");
  expect_error(MINIMAL "early_stopping: {rule: median, rungs: [3]}\n", "t.yaml:9:39: ",
               "only the asha rule");
}

static void multi_fidelity_loads_with_defaults(void **state) {
  (void)state;
  spec *s = load_ok(MINIMAL);
  assert_int_equal(s->multi_fidelity.kind, MULTI_FIDELITY_NONE);
  spec_free(s);
  s = load_ok(MINIMAL "multi_fidelity: {kind: hyperband, max_epochs: 27}\n");
  assert_int_equal(s->multi_fidelity.kind, MULTI_FIDELITY_HYPERBAND);
  assert_int_equal(s->multi_fidelity.min_epochs, 1);
  assert_int_equal(s->multi_fidelity.max_epochs, 27);
  assert_int_equal(s->multi_fidelity.eta, 3);
  spec_free(s);
  s = load_ok(MINIMAL "multi_fidelity: {kind: hyperband, min_epochs: 2, max_epochs: 8, eta: 2}\n");
  assert_int_equal(s->multi_fidelity.min_epochs, 2);
  assert_int_equal(s->multi_fidelity.eta, 2);
  spec_free(s);
}

static void multi_fidelity_errors_point_at_the_value(void **state) {
  (void)state;
  expect_error(MINIMAL "multi_fidelity: {kind: hyperbnd, max_epochs: 9}\n", "t.yaml:9:24: ",
               "did you mean 'hyperband'");
  expect_error(MINIMAL "multi_fidelity: {kind: hyperband}\n", "t.yaml:9:17: ", "max_epochs");
  expect_error(MINIMAL "multi_fidelity: {kind: hyperband, max_epochs: 0}\n", "t.yaml:9:47: ",
               "between 1 and 100000");
  expect_error(MINIMAL "multi_fidelity: {kind: hyperband, max_epochs: 9, eta: 1}\n",
               "t.yaml:9:55: ", "multi_fidelity.eta: must be between 2 and 100");
  expect_error(MINIMAL "multi_fidelity: {kind: hyperband, max_epochs: 9, eta: 2.5}\n",
               "t.yaml:9:55: ", "multi_fidelity.eta");
  expect_error(MINIMAL "multi_fidelity: {kind: hyperband, min_epochs: 4, max_epochs: 9}\n",
               "t.yaml:9:62: ", "at least min_epochs × eta");
  expect_error(MINIMAL "multi_fidelity: {kind: hyperband, max_epochs: 9, rungs: 3}\n",
               "t.yaml:9:50: ", "rungs");
  expect_error("name: b\n"
               "parameters: {epochs: {type: int, low: 1, high: 9}}\n"
               "objectives: [{name: accuracy, goal: maximize}]\n"
               "trial: {builtin: {model: mlp, dataset: digits}}\n"
               "budget: {trials: 4}\n"
               "multi_fidelity: {kind: hyperband, max_epochs: 9}\n",
               "t.yaml:6:17: ", "'epochs' cannot be a searched parameter");
  expect_error(MINIMAL "early_stopping: {rule: median}\n"
                       "multi_fidelity: {kind: hyperband, max_epochs: 9}\n",
               "t.yaml:10:17: ", "cannot be combined with early_stopping");
}

/* Under multi_fidelity max_epochs takes the place of the built-in epochs setting, so an
 * `epochs:` in the section that differs was silently ignored (one equal to it is fine). */
static void multi_fidelity_refuses_the_builtin_epochs_setting(void **state) {
  (void)state;
  expect_error("name: b\n"
               "parameters: {lr: {type: float, low: 0.001, high: 0.1}}\n"
               "objectives: [{name: accuracy, goal: maximize}]\n"
               "trial: {builtin: {model: mlp, dataset: digits, epochs: 5}}\n"
               "budget: {trials: 4}\n"
               "multi_fidelity: {kind: hyperband, max_epochs: 9}\n",
               "t.yaml:4:56: ",
               "trial.builtin.epochs: multi_fidelity trains each trial up to max_epochs (9), "
               "which takes the place of this setting; remove it or make it 9");
  spec_free(load_ok("name: b\n"
                    "parameters: {lr: {type: float, low: 0.001, high: 0.1}}\n"
                    "objectives: [{name: accuracy, goal: maximize}]\n"
                    "trial: {builtin: {model: mlp, dataset: digits, epochs: 9}}\n"
                    "budget: {trials: 4}\n"
                    "multi_fidelity: {kind: hyperband, max_epochs: 9}\n"));
}

/* spec_diff's text (NULL: the same), failing the test when the comparison fails. */
static char *diff_of(const spec *a, const spec *b) {
  char *diff = NULL;
  nas_err err = {{0}};
  if (spec_diff(a, b, &diff, &err) != NAS_OK) fail_msg("spec_diff: %s", err.msg);
  return diff;
}

/* ---- notify ---- */

#define SLACK_URL "https://hooks.slack.com/services/T000/B000/SECRETTOKEN"

static void notify_loads_with_defaults(void **state) {
  (void)state;
  spec *s = load_ok(MINIMAL "notify:\n"
                            "  - url: " SLACK_URL "\n"
                            "    format: slack\n"
                            "  - {url: \"http://127.0.0.1:8080/hook\", on: [experiment_finished, "
                            "trial_failed]}\n");
  assert_int_equal(s->n_notify, 2);
  assert_string_equal(s->notify[0].url, SLACK_URL);
  assert_int_equal(s->notify[0].events, NOTIFY_ALL_EVENTS);
  assert_int_equal(s->notify[0].format, NOTIFY_SLACK);
  assert_int_equal(s->notify[1].events, NOTIFY_TRIAL_FAILED | NOTIFY_EXPERIMENT_FINISHED);
  assert_int_equal(s->notify[1].format, NOTIFY_JSON);
  spec_free(s);
  s = load_ok(MINIMAL "notify:\n");
  assert_int_equal(s->n_notify, 0);
  spec_free(s);
}

static void notify_mistakes_are_placed_and_never_quote_the_url(void **state) {
  (void)state;
  expect_error(MINIMAL "notify: {url: x}\n", "t.yaml:9:9: ", "notify: expected a list");
  expect_error(MINIMAL "notify:\n  - {on: [trial_failed]}\n", "t.yaml:10:5: ",
               "notify[0]: missing required key 'url'");
  expect_error(MINIMAL "notify:\n  - {url: ftp://h/SECRET}\n", "t.yaml:10:11: ",
               "notify[0].url: must start with http:// or https://");
  expect_error(MINIMAL "notify:\n  - {url: \"https://u:p@/SECRET\"}\n", "t.yaml:10:11: ",
               "notify[0].url: names no host after the scheme");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h/a SECRET\"}\n", "t.yaml:10:11: ",
               "notify[0].url: holds a space or control character");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h\", on: [trial_complete]}\n",
               "t.yaml:10:29: ",
               "notify[0].on: expected trial_completed, trial_failed, front_changed or "
               "experiment_finished, got 'trial_complete'; did you mean 'trial_completed'?");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h\", on: []}\n", "t.yaml:10:28: ",
               "notify[0].on: name at least one event");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h\", on: [trial_failed, trial_failed]}\n",
               "t.yaml:10:43: ", "notify[0].on: 'trial_failed' named twice");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h\", format: xml}\n", "t.yaml:10:32: ",
               "notify[0].format: expected json or slack, got 'xml'");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h\", fromat: slack}\n", "t.yaml:10:24: ",
               "notify[0]: unknown key 'fromat'; did you mean 'format'?");
  expect_error(MINIMAL "notify:\n  - {url: \"https://h\"}\n  - url\n", "t.yaml:11:5: ",
               "notify[1]: expected a mapping, got 'url'");
  char *many = repeated("{url: \"https://h\"}", NOTIFY_MAX_TARGETS + 1, ", ");
  char *text = NULL;
  assert_true(asprintf(&text, MINIMAL "notify: [%s]\n", many) > 0);
  expect_error(text, "t.yaml:9:9: ", "notify: at most 16 webhooks, got 17");
  free(text);
  free(many);
}

static void url_shown_hides_path_query_and_password(void **state) {
  (void)state;
  const char *cases[][2] = {
      {SLACK_URL, "https://hooks.slack.com/…"},
      {"http://user:pw@127.0.0.1:8080/hook?token=x", "http://127.0.0.1:8080/…"},
      {"https://example.com?token=x", "https://example.com/…"},
      {"http://example.com", "http://example.com"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *shown = spec_url_shown(cases[i][0]);
    assert_string_equal(shown, cases[i][1]);
    free(shown);
  }
}

static void diff_shows_notify_changes_without_secrets(void **state) {
  (void)state;
  spec *none = load_ok(MINIMAL);
  spec *a = load_ok(MINIMAL "notify: [{url: \"" SLACK_URL "\", format: slack}]\n");
  spec *b = load_ok(MINIMAL "notify: [{url: \"" SLACK_URL "2\", format: slack}]\n");
  spec *c = load_ok(MINIMAL "notify: [{format: slack, url: \"" SLACK_URL "\"}]\n");
  char *diff = diff_of(none, a);
  assert_string_equal(diff, "notify: [] -> [https://hooks.slack.com/… on [trial_completed, "
                            "trial_failed, front_changed, experiment_finished] slack]\n");
  free(diff);
  diff = diff_of(a, b);
  assert_non_null(diff);
  assert_null(strstr(diff, "SECRET"));
  assert_non_null(strstr(diff, "(a URL changed in its hidden part)\n"));
  free(diff);
  assert_null(diff_of(a, c));
  spec_free(none), spec_free(a), spec_free(b), spec_free(c);
}

static void diff_names_new_fields(void **state) {
  (void)state;
  spec *a = load_ok(MINIMAL), *b = load_ok(NAME PARAMS_X OBJECTIVES TRIAL
                                           "budget: {trials: 5, max_failure_rate: 1}\n"
                                           "early_stopping: {rule: median}\n");
  char *diff = diff_of(a, b);
  assert_non_null(diff);
  assert_non_null(strstr(diff, "budget.max_failure_rate: 0.5 -> 1\n"));
  assert_non_null(strstr(diff, "early_stopping: none -> median on f, min_steps 1, min_trials 4\n"));
  free(diff);
  spec_free(a);
  spec_free(b);
}

static void diff_is_null_for_the_same_content(void **state) {
  (void)state;
  spec *a = load_ok(full_example);
  spec *b = load_ok(
      "# reformatted, same meaning\n"
      "name: \"quickstart\"\n"
      "seed: 7\n"
      "storage: 'sqlite:runs.db'\n"
      "parameters:\n"
      "  x1: {high: 1.0, low: 0, type: float}\n"
      "  lr: {type: float, low: 0.0001, high: 1e-1, log: true}\n"
      "  layers: {type: int, low: 1, high: 4}\n"
      "  width: {type: int, low: 16, high: 256, step: 16}\n"
      "  width3:\n"
      "    type: int\n"
      "    low: 8\n"
      "    high: 256\n"
      "    log: true\n"
      "    when: layers >= 3\n"
      "  opt: {type: categorical, choices: [sgd, adam, adamw]}\n"
      "  momentum: {type: float, low: 0, high: 0.99, when: {in: [sgd], param: opt}}\n"
      "  use_bn: {type: categorical, choices: [true, false]}\n"
      "  epochs: {type: fixed, value: 5}\n"
      "objectives:\n"
      "  - {name: f1, goal: minimize, threshold: 3e2}\n"
      "  - {noise: 4e-3, name: accuracy, goal: maximize}\n"
      "constraints: [\"latency_ms <= 5.0\", \"accuracy >= 0.50\"]\n"
      "trial:\n"
      "  command: [python3, train.py, \"--lr={lr}\", \"--layers={layers}\"]\n"
      "  env: {MODE: fast, OMP_NUM_THREADS: 1}\n"
      "  timeout: 600\n"
      "budget: {trials: 20, parallel: 4, wall_time: 120m}\n"
      "optimizer: {n_initial: 8}\n");
  char *diff = diff_of(a, b);
  if (diff) print_message("unexpected diff:\n%s", diff);
  assert_null(diff);
  spec_free(a);
  spec_free(b);
}

static void diff_lists_each_changed_field(void **state) {
  (void)state;
  spec *a = load_ok(MINIMAL);
  spec *b = load_ok("# same, commented\n" NAME PARAMS_X OBJECTIVES TRIAL BUDGET);
  assert_null(diff_of(a, b));
  spec_free(b);
  b = load_ok(NAME PARAMS_X OBJECTIVES TRIAL "budget: {trials: 30}\n");
  char *diff = diff_of(a, b);
  assert_string_equal(diff, "budget.trials: 5 -> 30\n");
  free(diff);
  spec_free(b);

  b = load_ok(
      "name: t2\nseed: 3\n"
      "parameters:\n"
      "  x: {type: float, low: 0, high: 2, step: 0.5}\n"
      "  y: {type: categorical, choices: [a, \"1\"], when: \"x > 1\"}\n"
      "objectives:\n  - {name: f, goal: maximize, threshold: 0.1}\n"
      "constraints: [\"mem <= 2.5\"]\n"
      "trial:\n  command: [run, \"{x}\"]\n  env: {A: b}\n  timeout: 1h\n"
      "budget: {trials: 5, parallel: 2, wall_time: 90s}\n"
      "runner: {type: slurm, partition: gpu}\n"
      "optimizer: {type: random}\n");
  diff = diff_of(a, b);
  assert_string_equal(diff,
                      "name: t -> t2\n"
                      "seed: 0 -> 3\n"
                      "parameters.x: float [0, 1] -> float [0, 2] step 0.5\n"
                      "parameters.y: added (categorical [\"a\", \"1\"] when x > 1)\n"
                      "objectives: [f minimize] -> [f maximize threshold 0.1]\n"
                      "constraints: [] -> [mem <= 2.5]\n"
                      "trial.env: [] -> [\"A=b\"]\n"
                      "trial.timeout: none -> 3600s\n"
                      "budget.parallel: 1 -> 2\n"
                      "budget.wall_time: none -> 90s\n"
                      "runner.type: local -> slurm\n"
                      "runner.options: {} -> {\"partition\":\"gpu\"}\n"
                      "optimizer.type: gp -> random\n");
  free(diff);
  diff = diff_of(b, a);
  assert_non_null(strstr(diff, "parameters.y: removed (categorical [\"a\", \"1\"] when x > 1)\n"));
  free(diff);
  spec_free(b);
  spec_free(a);
}

/* An objective's noise is part of the model a run fits, so a change of it is a change of
 * the spec like a threshold's (a run would otherwise fit another noise than the stored
 * spec says). */
static void diff_names_a_changed_objective_noise(void **state) {
  (void)state;
  spec *a = load_ok(NAME PARAMS_X "objectives:\n  - {name: f, goal: minimize, noise: 0.1}\n" TRIAL
                        BUDGET);
  spec *b = load_ok(NAME PARAMS_X "objectives:\n  - {name: f, goal: minimize, noise: 0.5}\n" TRIAL
                        BUDGET);
  spec *none = load_ok(MINIMAL);
  char *diff = diff_of(a, b);
  assert_non_null(diff);
  assert_string_equal(diff, "objectives: [f minimize noise 0.1] -> [f minimize noise 0.5]\n");
  free(diff);
  diff = diff_of(a, none);
  assert_non_null(diff);
  assert_string_equal(diff, "objectives: [f minimize noise 0.1] -> [f minimize]\n");
  free(diff);
  spec_free(a);
  spec_free(b);
  spec_free(none);
}

/* -0.0 is another spelling of 0, which a diff does not count ("float [-0, 1] -> float
 * [0, 1]" refused a rerun). */
static void negative_zero_is_zero_in_bounds(void **state) {
  (void)state;
  spec *a = load_ok(NAME "parameters:\n  x: {type: float, low: -0.0, high: 1}\n" AFTER_PARAMS);
  spec *b = load_ok(NAME "parameters:\n  x: {type: float, low: 0, high: 1}\n" AFTER_PARAMS);
  assert_false(signbit(a->params[0].low));
  assert_null(diff_of(a, b));
  spec_free(a);
  spec_free(b);
}

static void diff_reports_parameter_order_and_commands(void **state) {
  (void)state;
  spec *a = load_ok(
      NAME "parameters:\n  x: {type: float, low: 0, high: 1}\n  y: 1\n" OBJECTIVES TRIAL BUDGET);
  spec *b = load_ok(NAME "parameters:\n  y: 1\n  x: {type: float, low: 0, high: 1}\n" OBJECTIVES
                         "trial:\n  command: [run, \"{x}\", \"{y}\"]\n" BUDGET);
  char *diff = diff_of(a, b);
  assert_string_equal(diff,
                      "parameters order: x, y -> y, x\n"
                      "trial.command: [\"run\", \"{x}\"] -> [\"run\", \"{x}\", \"{y}\"]\n");
  free(diff);
  spec_free(a);
  spec_free(b);
}

/* ---- built-in trials ---- */

#define BUILTIN_PARAMS                                                                     \
  "parameters:\n"                                                                          \
  "  layers: {type: int, low: 1, high: 3}\n"                                               \
  "  width3: {type: int, low: 8, high: 64, when: \"layers >= 3\"}\n"                      \
  "  lr: {type: float, low: 1e-4, high: 1e-1, log: true}\n" /* 4 lines */
#define BUILTIN_OBJECTIVES                                                                 \
  "objectives:\n  - {name: accuracy, goal: maximize}\n  - {name: params, goal: minimize}\n"
/* The spec with a trial section of `trial` (starting at line 9). */
#define BUILTIN_SPEC(trial) NAME BUILTIN_PARAMS BUILTIN_OBJECTIVES trial BUDGET

static void builtin_trial_loads_without_a_command(void **state) {
  (void)state;
  spec *s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epochs: 2, "
                                 "optimizer: sgd, lr: 0.05}\n  timeout: 1m\n"));
  const builtin_spec *b = s->trial.builtin;
  assert_non_null(b);
  assert_string_equal(b->model, "mlp");
  assert_string_equal(b->dataset, "digits");
  assert_int_equal(json_object_size(b->settings), 3);
  assert_int_equal(json_integer_value(json_object_get(b->settings, "epochs")), 2);
  assert_string_equal(json_string_value(json_object_get(b->settings, "optimizer")), "sgd");
  assert_int_equal(s->trial.argc, 0);
  assert_null(s->trial.argv[0]);
  assert_true(s->trial.timeout_s == 60);
  spec_free(s);
}

static void builtin_dataset_path_is_made_absolute(void **state) {
  (void)state;
  spec *s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: data/../my.csv.gz}\n"));
  assert_string_equal(s->trial.builtin->dataset, DIR "/my.csv.gz");
  spec_free(s);
  s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: ./fashion}\n"));
  assert_string_equal(s->trial.builtin->dataset, DIR "/fashion");
  spec_free(s);
}

/* Defaults, then the section, then the active parameters of the same names. */
static void builtin_settings_layer_defaults_section_and_parameters(void **state) {
  (void)state;
  spec *s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epochs: 2, "
                                 "lr: 0.5, width: 32}\n"));
  json_t *params = json("{\"layers\": 3, \"width3\": 16, \"lr\": 0.01}"), *all;
  nas_err err;
  assert_int_equal(spec_builtin_settings(s, params, &all, &err), NAS_OK);
  assert_int_equal(json_integer_value(json_object_get(all, "epochs")), 2);     /* section */
  assert_int_equal(json_integer_value(json_object_get(all, "batch_size")), 64); /* default */
  assert_int_equal(json_integer_value(json_object_get(all, "width")), 32);
  assert_int_equal(json_integer_value(json_object_get(all, "width3")), 16);     /* parameter */
  assert_int_equal(json_integer_value(json_object_get(all, "layers")), 3);
  assert_true(json_real_value(json_object_get(all, "lr")) == 0.01); /* parameter over section */
  assert_string_equal(json_string_value(json_object_get(all, "activation")), "relu");
  assert_null(json_object_get(all, "stages")); /* a cnn setting */
  assert_int_equal(json_integer_value(json_object_get(all, "devices")), 1);
  assert_string_equal(json_string_value(json_object_get(all, "sharding")), "full");
  assert_true(json_is_false(json_object_get(all, "checkpoint_activations")));
  json_decref(all);
  json_decref(params);
  /* width3 inactive: the layer takes width. */
  params = json("{\"layers\": 2, \"lr\": 0.01}");
  assert_int_equal(spec_builtin_settings(s, params, &all, &err), NAS_OK);
  assert_null(json_object_get(all, "width3"));
  json_decref(all);
  json_decref(params);
  spec_free(s);
  s = load_ok(MINIMAL);
  assert_int_equal(spec_builtin_settings(s, NULL, &all, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "not a built-in trial"));
  spec_free(s);
}

static void builtin_section_errors_point_at_the_value(void **state) {
  (void)state;
  expect_error(BUILTIN_SPEC("trial:\n  command: [run]\n  builtin: {model: mlp, dataset: digits}\n"),
               "t.yaml:11:12: ", "trial: give either command or builtin, not both");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mpl, dataset: digits}\n"),
               "t.yaml:10:20: ", "unknown model 'mpl'; did you mean 'mlp'?");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp}\n"), "t.yaml:10:12: ",
               "trial.builtin: missing required key 'dataset'");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: fashion_mnist}\n"),
               "t.yaml:10:34: ", "unknown dataset 'fashion_mnist'; did you mean 'fashion-mnist'?");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epoch: 3}\n"),
               "t.yaml:10:42: ", "unknown setting 'epoch'; did you mean 'epochs'?");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, stages: 3}\n"),
               "t.yaml:10:42: ", "'stages' is a setting of cnn, resnet and mobilenet models, not of mlp");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, width9: 3}\n"),
               "t.yaml:10:42: ", "'width9': width goes from width1 to width8");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epochs: 0}\n"),
               "t.yaml:10:50: ", "trial.builtin.epochs: 0 is outside [1, 100000]");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epochs: 2.5}\n"),
               "t.yaml:10:50: ", "trial.builtin.epochs: expected an integer, got 2.5");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, lr: 0}\n"),
               "t.yaml:10:46: ", "trial.builtin.lr: 0 is outside (0, 10]");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: cnn, dataset: digits, norm: layer}\n"),
               "t.yaml:10:48: ", "'layer' is not one of ['none', 'batch']");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, sharding: half}\n"),
               "t.yaml:10:52: ", "'half' is not one of ['full', 'grad_op', 'none']");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: cnn, dataset: digits, "
                            "checkpoint_activations: 1}\n"),
               "t.yaml:10:66: ", "checkpoint_activations: expected true or false, got 1");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: [mlp]\n"), "t.yaml:10:12: ",
               "trial.builtin: expected a mapping, got a list");
}

/* The training recipe and augmentation settings load, searchable, and bad values point at
 * the value. */
static void builtin_recipe_settings_load_and_bad_values_point_at_the_value(void **state) {
  (void)state;
  spec *s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, schedule: "
                                 "onecycle, warmup: 0.5, label_smoothing: 0.1, nesterov: true, "
                                 "augment_flip: true, augment_crop: 2, data_cache: false}\n"));
  json_t *all = NULL;
  nas_err err;
  assert_int_equal(spec_builtin_settings(s, NULL, &all, &err), NAS_OK);
  assert_string_equal(json_string_value(json_object_get(all, "schedule")), "onecycle");
  assert_true(json_number_value(json_object_get(all, "warmup")) == 0.5);
  assert_true(json_number_value(json_object_get(all, "label_smoothing")) == 0.1);
  assert_true(json_is_true(json_object_get(all, "nesterov")));
  assert_int_equal(json_integer_value(json_object_get(all, "augment_crop")), 2);
  assert_true(json_is_false(json_object_get(all, "data_cache")));
  json_decref(all);
  spec_free(s);
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, "
                            "label_smoothing: 1}\n"),
               "t.yaml:10:59: ", "trial.builtin.label_smoothing: 1 is outside [0, 1)");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, warmup: -1}\n"),
               "t.yaml:10:50: ", "trial.builtin.warmup: -1 is outside [0, 1000]");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: cnn, dataset: digits, augment_crop: 17}\n"),
               "t.yaml:10:56: ", "trial.builtin.augment_crop: 17 is outside [0, 16]");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, schedule: "
                            "one_cycle}\n"),
               "t.yaml:10:52: ", "'one_cycle' is not one of ['constant', 'cosine', 'step', "
                                 "'onecycle']");
  char yaml[1024];
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  augment_flip: {type: int, low: 0, high: 1}\n%s",
           OBJECTIVES "trial:\n  builtin: {model: cnn, dataset: digits}\n" BUDGET);
  expect_error(yaml, "t.yaml:3:3: ", "the setting takes true or false: declare a categorical");
}

/* `pipeline: {stages, chunks, checkpoint}` is the three pipeline_ settings in one mapping;
 * a pipeline and FSDP (devices > 1, sharding) exclude each other. */
/* `pipeline: {stages: 2}` and `pipeline_stages: 4` set one setting twice; one of them was
 * silently dropped. */
static void builtin_setting_given_twice_is_refused(void **state) {
  (void)state;
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, pipeline: "
                            "{stages: 2}, pipeline_stages: 4}\n"),
               "t.yaml:10:65: ",
               "trial.builtin.pipeline_stages: given twice (as pipeline.stages and "
               "pipeline_stages); keep one");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, pipeline_chunks: "
                            "4, pipeline: {chunks: 8}}\n"),
               "t.yaml:10:73: ", "trial.builtin.pipeline_chunks: given twice");
}

static void builtin_pipeline_mapping_sets_the_pipeline_settings(void **state) {
  (void)state;
  spec *s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, pipeline: "
                                 "{stages: 2, chunks: 8, checkpoint: always, balance: time}}\n"));
  json_t *all;
  nas_err err;
  assert_int_equal(spec_builtin_settings(s, NULL, &all, &err), NAS_OK);
  assert_int_equal(json_integer_value(json_object_get(all, "pipeline_stages")), 2);
  assert_int_equal(json_integer_value(json_object_get(all, "pipeline_chunks")), 8);
  assert_string_equal(json_string_value(json_object_get(all, "pipeline_checkpoint")), "always");
  assert_string_equal(json_string_value(json_object_get(all, "pipeline_balance")), "time");
  json_decref(all);
  spec_free(s);
  s = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits}\n"));
  assert_int_equal(spec_builtin_settings(s, NULL, &all, &err), NAS_OK);
  assert_int_equal(json_integer_value(json_object_get(all, "pipeline_stages")), 1); /* off */
  assert_string_equal(json_string_value(json_object_get(all, "pipeline_checkpoint")),
                      "except_last");
  json_decref(all);
  spec_free(s);
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, pipeline: "
                            "{stages: 2, chunk: 4}}\n"),
               "t.yaml:10:64: ", "trial.builtin.pipeline: unknown key 'chunk' (stages, chunks, "
                                 "checkpoint, balance)");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, pipeline: "
                            "{stages: 2, checkpoint: sometimes}}\n"),
               "t.yaml:10:76: ", "'sometimes' is not one of ['except_last', 'always', 'never']");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, pipeline: [2]}\n"),
               "t.yaml:10:52: ", "trial.builtin.pipeline: expected a mapping");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, devices: 2, "
                            "pipeline: {stages: 2}}\n"),
               "t.yaml:10:12: ", "pipeline stages and devices > 1");
  expect_error(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, sharding: full, "
                            "pipeline_stages: 4}\n"),
               "t.yaml:10:12: ", "sharding applies to devices > 1, not to a pipeline");
}

/* Every value a search parameter can take must be a valid value of its setting. */
static void builtin_parameters_must_be_settings_with_valid_values(void **state) {
  (void)state;
  const char *trial = OBJECTIVES "trial:\n  builtin: {model: mlp, dataset: digits}\n" BUDGET;
  char yaml[1024];
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  widht: {type: int, low: 8, high: 64}\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "parameters.widht: a built-in mlp trial has no setting of "
                                     "this name; did you mean 'width'?");
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  lr: {type: float, low: 0, high: 0.1}\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "parameters.lr: not a valid value of the built-in setting: 0 "
                                     "is outside (0, 10]");
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  epochs: {type: float, low: 1, high: 4}\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "the setting takes integers: declare an int parameter");
  snprintf(yaml, sizeof yaml,
           NAME "parameters:\n  activation: {type: categorical, choices: [relu, swish]}\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "'swish' is not one of ['relu', 'gelu', 'tanh', 'sigmoid']");
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  norm: {type: int, low: 0, high: 1}\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "the setting takes words: declare a categorical parameter");
  snprintf(yaml, sizeof yaml,
           NAME "parameters:\n  checkpoint_activations: {type: int, low: 0, high: 1}\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "the setting takes true or false: declare a categorical");
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  batch_size: 0\n%s", trial);
  expect_error(yaml, "t.yaml:3:3: ", "0 is outside [1, 65536]");
  snprintf(yaml, sizeof yaml,
           NAME "parameters:\n  batch_size: {type: categorical, choices: [32, 64]}\n"
                "  dropout: {type: int, low: 0, high: 0}\n%s", trial);
  expect_error(yaml, "t.yaml:4:38: ", "high (0) must be above low (0)");
}

/* resnet and mobilenet: their settings load with defaults per stage; mobilenet's kernel is
 * odd, its activation relu or hardswish; the other families' settings are refused. */
/* BUILTIN_SPEC with parameters that resnet and mobilenet have (the trial again at line 9). */
#define IMAGE_SPEC(trial)                                                                  \
  NAME "parameters:\n  lr: {type: float, low: 1e-4, high: 1e-1, log: true}\n"            \
       "  stages: {type: int, low: 1, high: 3}\n  channels2: {type: int, low: 4, high: 32}\n" \
       BUILTIN_OBJECTIVES trial BUDGET
static void builtin_residual_families_validate_their_settings(void **state) {
  (void)state;
  spec *s = load_ok(IMAGE_SPEC("trial:\n  builtin: {model: mobilenet, dataset: digits, "
                                 "kernel2: 5, se: true, activation: hardswish}\n"));
  json_t *all;
  nas_err err;
  assert_int_equal(spec_builtin_settings(s, NULL, &all, &err), NAS_OK);
  assert_int_equal(json_integer_value(json_object_get(all, "kernel")), 3);
  assert_int_equal(json_integer_value(json_object_get(all, "kernel2")), 5);
  assert_int_equal(json_integer_value(json_object_get(all, "expansion")), 4);
  assert_true(json_is_true(json_object_get(all, "se")));
  assert_null(json_object_get(all, "norm"));
  json_decref(all);
  spec_free(s);
  s = load_ok(IMAGE_SPEC("trial:\n  builtin: {model: resnet, dataset: digits, blocks2: 2}\n"));
  spec_free(s);
  expect_error(IMAGE_SPEC("trial:\n  builtin: {model: mobilenet, dataset: digits, kernel3: 4}\n"),
               "t.yaml:10:57: ", "trial.builtin.kernel3: 4 is even; the setting takes odd numbers");
  expect_error(IMAGE_SPEC("trial:\n  builtin: {model: mobilenet, dataset: digits, "
                            "activation: gelu}\n"),
               "t.yaml:10:60: ", "'gelu' is not one of ['relu', 'hardswish']");
  expect_error(IMAGE_SPEC("trial:\n  builtin: {model: resnet, dataset: digits, se: true}\n"),
               "t.yaml:10:45: ", "'se' is a setting of mobilenet models, not of resnet");
  expect_error(IMAGE_SPEC("trial:\n  builtin: {model: resnet, dataset: digits, kernel: 5}\n"),
               "t.yaml:10:45: ", "'kernel' is a setting of cnn and mobilenet models, not of resnet");
  expect_error(IMAGE_SPEC("trial:\n  builtin: {model: resnt, dataset: digits}\n"),
               "t.yaml:10:20: ", "unknown model 'resnt'; did you mean 'resnet'?");
  const char *trial = OBJECTIVES "trial:\n  builtin: {model: mobilenet, dataset: digits}\n" BUDGET;
  char yaml[1024];
  snprintf(yaml, sizeof yaml, NAME "parameters:\n  kernel1: {type: int, low: 3, high: 5}\n%s",
           trial);
  expect_error(yaml, "t.yaml:3:3: ", "takes odd integers only: declare a categorical parameter");
  snprintf(yaml, sizeof yaml,
           NAME "parameters:\n  kernel1: {type: categorical, choices: [3, 5]}\n"
                "  se2: {type: categorical, choices: [true, false]}\n"
                "  expansion: {type: int, low: 1, high: 6}\n%s",
           trial);
  spec_free(load_ok(yaml));
}

static void diff_reports_builtin_changes(void **state) {
  (void)state;
  spec *a = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epochs: 2}\n"));
  spec *b = load_ok(BUILTIN_SPEC("trial:\n  builtin: {epochs: 2, dataset: digits, model: mlp}\n"));
  assert_null(diff_of(a, b));
  spec_free(b);
  b = load_ok(BUILTIN_SPEC("trial:\n  builtin: {model: mlp, dataset: digits, epochs: 3, lr: 1e-2}\n"));
  char *diff = diff_of(a, b);
  assert_string_equal(diff, "trial.builtin: mlp on \"digits\" {\"epochs\":2} -> "
                            "mlp on \"digits\" {\"epochs\":3,\"lr\":0.01}\n");
  free(diff);
  spec_free(b);
  b = load_ok(NAME "parameters:\n  layers: 2\n" BUILTIN_OBJECTIVES TRIAL_RUN BUDGET);
  diff = diff_of(a, b);
  assert_non_null(strstr(diff, "trial.command: [] -> [\"run\"]\n"
                               "trial.builtin: mlp on \"digits\" {\"epochs\":2} -> none\n"));
  free(diff);
  spec_free(b);
  spec_free(a);
}

/* ---- known configurations: enqueue, nas enqueue, warm_start; renaming ------------------- */

#define PARAMS_KNOWN                                                 \
  "parameters:\n"                                                    \
  "  lr: {type: float, low: 0.001, high: 1}\n"                       \
  "  width: {type: categorical, choices: [32, 64]}\n"                \
  "  opt: {type: categorical, choices: [sgd, adam]}\n"               \
  "  momentum: {type: float, low: 0, high: 1, when: \"opt == sgd\"}\n" \
  "  epochs: 5\n" /* 6 lines */

static void enqueue_section_stores_full_assignments_as_suggestions_are(void **state) {
  (void)state;
  spec *s = load_ok(NAME PARAMS_KNOWN AFTER_PARAMS
                    "enqueue:\n"
                    "  - {lr: 1, width: 64, opt: adam}\n"
                    "  - {lr: 0.01, width: 32, opt: sgd, momentum: 0.9}\n");
  assert_int_equal(json_array_size(s->enqueue), 2);
  json_t *first = json_array_get(s->enqueue, 0);
  assert_true(json_is_real(json_object_get(first, "lr"))); /* 1 read as a float's value */
  assert_true(json_is_integer(json_object_get(first, "width")));
  assert_int_equal(json_integer_value(json_object_get(first, "epochs")), 5);
  assert_null(json_object_get(first, "momentum"));
  assert_int_equal(json_object_size(json_array_get(s->enqueue, 1)), 5);
  spec_free(s);
}

/* A whole real is shown as one where its type is the problem ("expected an integer, got 2"
 * contradicted itself). */
static void an_int_given_as_a_whole_real_is_shown_as_a_real(void **state) {
  (void)state;
  expect_error(NAME "parameters:\n  n: {type: int, low: 0, high: 3}\n" AFTER_PARAMS
               "enqueue: [{n: 2.0}]\n",
               "t.yaml:9:15: ", "enqueue[0]: parameter 'n': expected an integer, got 2.0");
  spec *s = load_ok(NAME "parameters:\n  n: {type: int, low: 0, high: 3}\n"
                         "  c: {type: categorical, choices: [a, b]}\n" AFTER_PARAMS);
  expect_rejected(s, "{\"n\": 1, \"c\": 1e21}", "parameter 'c': 1e+21 is not one of");
  expect_rejected(s, "{\"n\": 1, \"c\": 0.5}", "parameter 'c': 0.5 is not one of");
  char *args[] = {"n=2.0", "c=a"};
  json_t *params = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_assignment_parse(s, args, 2, &params, &err), NAS_ERR);
  assert_string_equal(err.msg, "parameter 'n': expected an integer, got 2.0");
  spec_free(s);
}

static void enqueue_section_errors_point_at_the_assignment(void **state) {
  (void)state;
  const char *head = NAME PARAMS_KNOWN AFTER_PARAMS "enqueue:\n"; /* line 13; the first item 14 */
  char *yaml = nas_asprintf("%s  - {lr: 0.5, widht: 64, opt: adam}\n", head);
  expect_error(yaml, "t.yaml:14:15:", "enqueue[0]: unknown parameter 'widht'; did you mean 'width'?");
  free(yaml);
  yaml = nas_asprintf("%s  - {lr: 0.5, width: 48, opt: adam}\n", head);
  expect_error(yaml, "t.yaml:14:22:", "enqueue[0]: parameter 'width': 48 is not one of");
  free(yaml);
  yaml = nas_asprintf("%s  - {lr: 0.5, width: 64}\n", head);
  expect_error(yaml, "t.yaml:14:5:", "enqueue[0]: parameter 'opt' is missing");
  free(yaml);
  yaml = nas_asprintf("%s  - {lr: 0.5, width: 64, opt: adam, momentum: 0.1}\n", head);
  expect_error(yaml, "t.yaml:14:5:", "'momentum' is inactive");
  free(yaml);
  yaml = nas_asprintf("%s  - {lr: 0.5, width: 64, opt: adam, epochs: 6}\n", head);
  expect_error(yaml, "t.yaml:14:", "fixed at 5");
  free(yaml);
  expect_error(NAME PARAMS_KNOWN AFTER_PARAMS "enqueue: {lr: 0.5}\n", "t.yaml:13:", "enqueue");
}

/* Queued trials always run, so an enqueue list longer than budget.trials ran past the
 * budget (4 trials of a budget of 2) although they count in it. */
static void enqueue_longer_than_the_budget_is_refused(void **state) {
  (void)state;
  expect_error(NAME PARAMS_X OBJECTIVES TRIAL_RUN "budget: {trials: 2}\n"
               "enqueue: [{x: 0.1}, {x: 0.2}, {x: 0.3}]\n",
               "t.yaml:9:10: ",
               "enqueue: 3 assignments, more than budget.trials (2), which they count in; "
               "raise the budget or queue fewer");
  spec_free(load_ok(NAME PARAMS_X OBJECTIVES TRIAL_RUN "budget: {trials: 2}\n"
                    "enqueue: [{x: 0.1}, {x: 0.2}]\n"));
}

static void assignment_arguments_are_typed_checked_and_completed(void **state) {
  (void)state;
  spec *s = load_ok(NAME PARAMS_KNOWN AFTER_PARAMS);
  char *good[] = {"lr=0.05", "width=64", "opt=sgd", "momentum=0"};
  json_t *params = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_assignment_parse(s, good, 4, &params, &err), NAS_OK);
  assert_int_equal(spec_check_params(s, params, &err), NAS_OK);
  assert_true(json_is_real(json_object_get(params, "momentum")));
  assert_int_equal(json_integer_value(json_object_get(params, "epochs")), 5);
  json_decref(params);
  struct {
    char *args[3];
    const char *fragment;
  } bad[] = {
      {{"lr=0.05", "width=64", "opt=adma"}, "'adma' is not one of"},
      {{"lr=0.5", "width=64", "optt=adam"}, "did you mean 'opt'"},
      {{"lr=", "width=64", "opt=adam"}, "'lr=' has no value"},
      {{"lr", "width=64", "opt=adam"}, "'lr' is not NAME=VALUE"},
      {{"lr=2", "width=64", "opt=adam"}, "2 is outside [0.001, 1]"},
      {{"lr=0.05", "lr=0.06", "opt=adam"}, "'lr' is given twice"},
      {{"lr=0.05", "opt=adam", "width='64'"}, "is not one of"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    params = NULL;
    assert_int_equal(spec_assignment_parse(s, bad[i].args, 3, &params, &err), NAS_ERR);
    if (!strstr(err.msg, bad[i].fragment)) fail_msg("%zu: %s", i, err.msg);
    assert_null(params);
  }
  spec_free(s);
}

static void warm_start_loads_sources_and_checked_fill_values(void **state) {
  (void)state;
  spec *s = load_ok(NAME PARAMS_KNOWN AFTER_PARAMS
                    "warm_start: {from: [old, older], fill: {width: 32}}\n");
  assert_int_equal(s->warm_start.n_from, 2);
  assert_string_equal(s->warm_start.from[1], "older");
  assert_int_equal(json_integer_value(json_object_get(s->warm_start.fill, "width")), 32);
  spec_free(s);
  const char *head = NAME PARAMS_KNOWN AFTER_PARAMS; /* warm_start on line 13 */
  char *yaml = nas_asprintf("%swarm_start: {from: [t]}\n", head);
  expect_error(yaml, "t.yaml:13:", "'t' is this experiment itself");
  free(yaml);
  yaml = nas_asprintf("%swarm_start: {from: [old, old]}\n", head);
  expect_error(yaml, "t.yaml:13:", "'old' is named twice");
  free(yaml);
  yaml = nas_asprintf("%swarm_start: {from: [old], fill: {width: 48}}\n", head);
  expect_error(yaml, "t.yaml:13:", "warm_start.fill: parameter 'width': 48 is not one of");
  free(yaml);
  yaml = nas_asprintf("%swarm_start: {from: [../x]}\n", head);
  expect_error(yaml, "t.yaml:13:", "not an experiment name");
  free(yaml);
  yaml = nas_asprintf("%swarm_start: {fill: {width: 32}}\n", head);
  expect_error(yaml, "t.yaml:13:", "from");
  free(yaml);
}

static void diff_names_enqueue_and_warm_start_changes(void **state) {
  (void)state;
  spec *a = load_ok(NAME PARAMS_X AFTER_PARAMS);
  spec *b = load_ok(NAME PARAMS_X AFTER_PARAMS "enqueue: [{x: 0.5}]\n"
                    "warm_start: {from: [old]}\n");
  char *diff = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_diff(a, b, &diff, &err), NAS_OK);
  assert_non_null(diff);
  assert_non_null(strstr(diff, "enqueue: none -> [{\"x\":0.5}]\n"));
  assert_non_null(strstr(diff, "warm_start: none -> from [\"old\"] fill {}\n"));
  free(diff);
  spec_free(a);
  spec_free(b);
}

static void renamed_text_changes_the_name_and_nothing_else(void **state) {
  (void)state;
  spec *s = load_ok("# the name comes first\nname:  t   # keep this\n" PARAMS_X AFTER_PARAMS);
  char *text = NULL;
  nas_err err = {{0}};
  assert_int_equal(spec_text_renamed(s, "t-2.b", &text, &err), NAS_OK);
  assert_string_equal(text, "# the name comes first\nname:  t-2.b   # keep this\n" PARAMS_X
                            AFTER_PARAMS);
  free(text);
  assert_int_equal(spec_text_renamed(s, "true", &text, &err), NAS_OK);
  assert_non_null(strstr(text, "name:  \"true\"   # keep this\n"));
  free(text);
  assert_int_equal(spec_text_renamed(s, "../up", &text, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "not an experiment name"));
  assert_int_equal(spec_text_renamed(s, "t", &text, &err), NAS_ERR);
  spec_free(s);
  s = load_ok("parameters:\n  x: {type: categorical, choices: [&n t, u]}\nname: *n\n"
              AFTER_PARAMS);
  assert_int_equal(spec_text_renamed(s, "v", &text, &err), NAS_ERR);
  assert_string_equal(err.msg, "experiment 't': cannot change the name in the spec's text "
                               "without changing more (is it an alias? write the name out)");
  spec_free(s);
}

/* Renaming the experiment of yaml to new_name gives the text expected. */
static void assert_renamed(const char *yaml, const char *new_name, const char *expected) {
  spec *s = load_ok(yaml);
  char *text = NULL;
  nas_err err = {{0}};
  if (spec_text_renamed(s, new_name, &text, &err) != NAS_OK) fail_msg("%s", err.msg);
  assert_string_equal(text, expected);
  free(text);
  spec_free(s);
}

/* A name written as a block scalar (`name: >-` and the name on the next line) ends at the
 * start of the next line: the renamed text kept the line break out and joined the next
 * key onto the name's line ("name: uparameters:"), so rename failed with a syntax error. */
static void renamed_text_keeps_the_line_break_after_a_block_scalar_name(void **state) {
  (void)state;
  assert_renamed("name: >-\n  t\n" PARAMS_X AFTER_PARAMS, "u", "name: u\n" PARAMS_X AFTER_PARAMS);
}

/* A file that starts with a UTF-8 byte order mark (as some Windows editors write): the
 * marks of the first line do not count it, so the name was replaced 3 bytes early and
 * rename failed with a YAML syntax error. */
static void renamed_text_skips_a_byte_order_mark(void **state) {
  (void)state;
  assert_renamed("\xEF\xBB\xBFname: t\n" PARAMS_X AFTER_PARAMS, "u",
                 "\xEF\xBB\xBFname: u\n" PARAMS_X AFTER_PARAMS);
}

/* Each ```yaml block of the documentation that is a whole spec (it begins with `name:`)
 * loads and passes the checks of `nas create`, in the repository's README.md and docs/, as
 * every example spec of examples/ does: a reader copies them. Returns the specs checked. */
static size_t documented_specs_in(const char *path) {
  char *text;
  size_t len, checked = 0;
  nas_err err;
  if (nas_read_file(path, &text, &len, &err) != NAS_OK) fail_msg("%s", err.msg);
  static const char open[] = "\n```yaml\n";
  for (char *at = strstr(text, open); at; at = strstr(at, open)) {
    char *block = at + strlen(open), *end = strstr(block, "\n```");
    if (!end) fail_msg("%s: a ```yaml block without its end", path);
    *end = '\0';
    if (strncmp(block, "name:", 5) == 0) {
      int line = 1; /* of the block's first line, so that an error's LINE counts from it */
      for (const char *c = text; c < block; c++) line += *c == '\n';
      char where[256];
      snprintf(where, sizeof where, "%s (the block from line %d)", path, line);
      spec *s;
      if (spec_parse(block, where, ".", &s, &err) != NAS_OK || sched_check_spec(s, &err) != NAS_OK)
        fail_msg("%s", err.msg);
      spec_free(s);
      checked++;
    }
    at = end + 1;
  }
  free(text);
  return checked;
}

static void documented_and_example_specs_load(void **state) {
  (void)state;
  size_t checked = documented_specs_in("README.md");
  glob_t found;
  assert_int_equal(glob("docs/*.md", 0, NULL, &found), 0);
  for (size_t i = 0; i < found.gl_pathc; i++) checked += documented_specs_in(found.gl_pathv[i]);
  globfree(&found);
  assert_true(checked >= 3); /* README's quickstart, docs/spec.md's complete example and its fashion-nas */
  assert_int_equal(glob("examples/*.yaml", 0, NULL, &found), 0);
  assert_int_equal(glob("examples/*/spec.yaml", GLOB_APPEND, NULL, &found), 0);
  assert_true(found.gl_pathc >= 8);
  for (size_t i = 0; i < found.gl_pathc; i++) {
    spec *s;
    nas_err err;
    if (spec_load(found.gl_pathv[i], &s, &err) != NAS_OK || sched_check_spec(s, &err) != NAS_OK)
      fail_msg("%s", err.msg);
    spec_free(s);
  }
  globfree(&found);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(full_example_loads_every_field),
      cmocka_unit_test(retries_heartbeats_and_stopping_rules_load),
      cmocka_unit_test(early_stopping_loads_with_defaults_and_rungs),
      cmocka_unit_test(multi_fidelity_loads_with_defaults),
      cmocka_unit_test(multi_fidelity_errors_point_at_the_value),
      cmocka_unit_test(multi_fidelity_refuses_the_builtin_epochs_setting),
      cmocka_unit_test(diff_names_new_fields),
      cmocka_unit_test(minimal_spec_gets_defaults),
      cmocka_unit_test(optional_keys_without_value_take_defaults),
      cmocka_unit_test(scalars_are_typed_as_users_expect),
      cmocka_unit_test(every_parameter_type_loads),
      cmocka_unit_test(float_step_tolerates_rounding),
      cmocka_unit_test(conditions_load_in_both_syntaxes),
      cmocka_unit_test(durations_accept_numbers_and_suffixes),
      cmocka_unit_test(workdir_is_resolved_against_the_spec_folder),
      cmocka_unit_test(spec_load_keeps_exact_text_and_absolute_path),
      cmocka_unit_test(a_nul_byte_in_a_spec_file_is_placed_by_line_and_column),
      cmocka_unit_test(yaml_syntax_errors_have_line_and_column),
      cmocka_unit_test(empty_and_odd_documents_are_errors),
      cmocka_unit_test(unknown_keys_suggest_the_nearest),
      cmocka_unit_test(keys_of_another_parameter_type_are_named),
      cmocka_unit_test(missing_required_keys_are_named),
      cmocka_unit_test(a_storage_that_is_no_string_is_refused_at_load),
      cmocka_unit_test(trial_section_may_run_nothing),
      cmocka_unit_test(duplicate_keys_are_errors),
      cmocka_unit_test(wrong_types_say_what_was_expected),
      cmocka_unit_test(names_must_be_well_formed),
      cmocka_unit_test(experiment_names_follow_the_documented_pattern),
      cmocka_unit_test(parameters_sharing_an_environment_variable_are_refused),
      cmocka_unit_test(bounds_must_be_ordered),
      cmocka_unit_test(log_needs_positive_low),
      cmocka_unit_test(int_bounds_must_be_integers),
      cmocka_unit_test(steps_must_be_positive_and_divide_the_range),
      cmocka_unit_test(ranges_the_optimizer_cannot_search_are_refused),
      cmocka_unit_test(categorical_needs_distinct_scalar_choices),
      cmocka_unit_test(condition_parents_must_exist_earlier),
      cmocka_unit_test(condition_values_must_be_possible),
      cmocka_unit_test(conditions_that_never_hold_are_refused),
      cmocka_unit_test(condition_syntax_errors_are_explained),
      cmocka_unit_test(objectives_are_checked),
      cmocka_unit_test(names_that_listings_or_metric_lines_hold_already_are_refused),
      cmocka_unit_test(constraints_need_metric_op_number),
      cmocka_unit_test(trial_command_must_be_a_list),
      cmocka_unit_test(placeholders_must_name_parameters),
      cmocka_unit_test(trial_env_workdir_timeout_are_checked),
      cmocka_unit_test(durations_past_the_largest_double_are_too_long),
      cmocka_unit_test(budget_is_checked),
      cmocka_unit_test(plugin_types_are_checked),
      cmocka_unit_test(standard_tags_are_honoured),
      cmocka_unit_test(other_tags_and_mistyped_values_are_refused),
      cmocka_unit_test(standard_tags_in_the_wrong_place_say_where_they_belong),
      cmocka_unit_test(values_holding_a_nul_character_are_refused),
      cmocka_unit_test(nesting_past_the_limit_is_refused_at_once),
      cmocka_unit_test(lists_and_mappings_past_the_entry_limit_are_refused),
      cmocka_unit_test(aliases_past_the_value_limit_are_refused),
      cmocka_unit_test(text_over_a_mebibyte_is_refused),
      cmocka_unit_test(devices_pipes_and_folders_are_not_read),
      cmocka_unit_test(comparison_condition_decides_activity),
      cmocka_unit_test(conditions_chain_through_inactive_parents),
      cmocka_unit_test(check_params_accepts_valid_assignments),
      cmocka_unit_test(check_params_rejects_invalid_assignments),
      cmocka_unit_test(param_index_finds_by_exact_name),
      cmocka_unit_test(names_with_dots_and_dashes_work_everywhere),
      cmocka_unit_test(int_conditions_compare_numbers_by_value),
      cmocka_unit_test(int_condition_values_may_be_written_as_whole_reals),
      cmocka_unit_test(parse_without_a_name_reports_string),
      cmocka_unit_test(render_argv_substitutes_values),
      cmocka_unit_test(value_text_is_shortest_exact),
      cmocka_unit_test(value_text_reads_back_exactly),
      cmocka_unit_test(diff_is_null_for_the_same_content),
      cmocka_unit_test(diff_lists_each_changed_field),
      cmocka_unit_test(diff_reports_parameter_order_and_commands),
      cmocka_unit_test(negative_zero_is_zero_in_bounds),
      cmocka_unit_test(diff_names_a_changed_objective_noise),
      cmocka_unit_test(builtin_trial_loads_without_a_command),
      cmocka_unit_test(builtin_dataset_path_is_made_absolute),
      cmocka_unit_test(builtin_settings_layer_defaults_section_and_parameters),
      cmocka_unit_test(builtin_section_errors_point_at_the_value),
      cmocka_unit_test(builtin_recipe_settings_load_and_bad_values_point_at_the_value),
      cmocka_unit_test(builtin_pipeline_mapping_sets_the_pipeline_settings),
      cmocka_unit_test(builtin_setting_given_twice_is_refused),
      cmocka_unit_test(builtin_parameters_must_be_settings_with_valid_values),
      cmocka_unit_test(builtin_residual_families_validate_their_settings),
      cmocka_unit_test(diff_reports_builtin_changes),
      cmocka_unit_test(enqueue_section_stores_full_assignments_as_suggestions_are),
      cmocka_unit_test(an_int_given_as_a_whole_real_is_shown_as_a_real),
      cmocka_unit_test(enqueue_section_errors_point_at_the_assignment),
      cmocka_unit_test(enqueue_longer_than_the_budget_is_refused),
      cmocka_unit_test(assignment_arguments_are_typed_checked_and_completed),
      cmocka_unit_test(warm_start_loads_sources_and_checked_fill_values),
      cmocka_unit_test(diff_names_enqueue_and_warm_start_changes),
      cmocka_unit_test(renamed_text_changes_the_name_and_nothing_else),
      cmocka_unit_test(renamed_text_keeps_the_line_break_after_a_block_scalar_name),
      cmocka_unit_test(renamed_text_skips_a_byte_order_mark),
      cmocka_unit_test(notify_loads_with_defaults),
      cmocka_unit_test(notify_mistakes_are_placed_and_never_quote_the_url),
      cmocka_unit_test(url_shown_hides_path_query_and_password),
      cmocka_unit_test(diff_shows_notify_changes_without_secrets),
      cmocka_unit_test(documented_and_example_specs_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
