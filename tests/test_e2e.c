/* End-to-end: the real bin/nas on real trials (processes), SQLite storage in a temporary
 * folder. What a user sees: budgets kept exactly, parallelism never exceeded, every way a
 * trial can end recorded, a bad spec writing nothing, Ctrl-C then resume, and a front
 * that matches one computed here independently. */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include "tests/e2e.h"

/* The quickstart example with its command pointed at the built example binary. */
static char *quickstart_spec(fixture *f) {
  FILE *in = fopen("examples/quickstart.yaml", "r");
  assert_non_null(in);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, in);
  fclose(in);
  text[n] = '\0';
  char *at = strstr(text, "../bin/branin_currin");
  assert_non_null(at);
  char *abs_bin = realpath(examples_bin(), NULL);
  assert_non_null(abs_bin);
  char *spec;
  assert_true(asprintf(&spec, "%.*s%s/branin_currin%s", (int)(at - text), text, abs_bin,
                       at + strlen("../bin/branin_currin")) > 0);
  free(abs_bin);
  char *path = test_write(f->dir, "quickstart.yaml", spec);
  free(spec);
  return path;
}


static void quickstart_gives_20_trials_and_the_true_front(void **state) {
  fixture *f = *state;
  char *spec = quickstart_spec(f), *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "quickstart");
  assert_int_equal(json_array_size(rows), 20);
  assert_int_equal(count_status(rows, "completed"), 20);

  /* The front computed here: trials no other trial dominates. */
  size_t n = json_array_size(rows), expected = 0;
  bool *on_front = calloc(n, sizeof *on_front);
  for (size_t i = 0; i < n; i++) {
    double bi = num(json_array_get(rows, i), "branin"), ci = num(json_array_get(rows, i), "currin");
    bool dominated = false;
    for (size_t j = 0; j < n && !dominated; j++) {
      double bj = num(json_array_get(rows, j), "branin"), cj = num(json_array_get(rows, j), "currin");
      dominated = bj <= bi && cj <= ci && (bj < bi || cj < ci);
    }
    on_front[i] = !dominated;
    expected += !dominated;
  }
  assert_int_equal(nas(f, &out, "pareto", "quickstart", "--format=json"), 0);
  json_t *pareto = json_loads(out, 0, NULL);
  free(out);
  assert_non_null(pareto);
  json_t *front = json_object_get(pareto, "front");
  assert_int_equal(json_array_size(front), expected);
  size_t k;
  json_t *row;
  json_array_foreach(front, k, row) {
    json_int_t number = json_integer_value(json_object_get(row, "trial"));
    assert_true(on_front[number]);
  }
  assert_true(json_number_value(json_object_get(pareto, "hypervolume")) > 0);
  /* The reference point each suggestion aimed at is recorded with it: none for the initial
   * design (5 points for 2 dimensions), both objectives for every suggestion after it. */
  json_array_foreach(rows, k, row) {
    json_t *ref = json_object_get(row, "reference");
    if (json_integer_value(json_object_get(row, "trial")) < 5) {
      assert_true(json_is_null(ref));
    } else {
      assert_true(json_is_object(ref));
      assert_true(isfinite(num(ref, "branin")) && isfinite(num(ref, "currin")));
    }
  }
  json_decref(pareto);
  json_decref(rows);
  free(on_front);
  free(spec);
}

/* A spec whose trials record when they ran: start and end times as metrics. */
static char *timing_spec(fixture *f, int trials, int parallel, const char *sleep_s) {
  char *text;
  assert_true(asprintf(&text,
                       "name: timing\n"
                       "parameters:\n"
                       "  x: {type: float, low: 0, high: 1}\n"
                       "objectives: [{name: y, goal: minimize}]\n"
                       "trial:\n"
                       "  command: [sh, -c, 'echo \"nas-metric {{\\\"start\\\": $(date +%%s.%%N)}}\"; "
                       "sleep %s; echo \"nas-metric {{\\\"end\\\": $(date +%%s.%%N), \\\"y\\\": {x}}}\"']\n"
                       "budget: {trials: %d, parallel: %d}\n"
                       "optimizer: {type: random}\n",
                       sleep_s, trials, parallel) > 0);
  char *path = test_write(f->dir, "timing.yaml", text);
  free(text);
  return path;
}

static void parallelism_is_never_exceeded_and_budget_is_exact(void **state) {
  fixture *f = *state;
  char *spec = timing_spec(f, 9, 3, "0.3"), *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "timing");
  assert_int_equal(json_array_size(rows), 9);
  assert_int_equal(count_status(rows, "completed"), 9);
  /* At each trial's start, count the trials whose [start, end] interval covers it. */
  size_t i, j;
  json_t *a, *b;
  int most = 0;
  json_array_foreach(rows, i, a) {
    int overlapping = 0;
    json_array_foreach(rows, j, b)
      overlapping += num(b, "start") <= num(a, "start") && num(a, "start") < num(b, "end");
    if (overlapping > most) most = overlapping;
  }
  assert_true(most <= 3);
  assert_true(most >= 2); /* it did run trials side by side */
  json_decref(rows);
  free(spec);
}

static void every_way_a_trial_ends_is_recorded(void **state) {
  fixture *f = *state;
  char *spec = test_write(
      f->dir, "ends.yaml",
      "name: ends\n"
      "parameters:\n"
      "  mode: {type: categorical, choices: [ok, fail, silent, garbage, slow, crash]}\n"
      "  noise: {type: float, low: 0, high: 1}\n"
      "objectives: [{name: y, goal: minimize}]\n"
      "trial:\n"
      "  command: [sh, -c, 'case {mode} in\n"
      "    ok) echo \"nas-metric {{\\\"y\\\": 1}}\";;\n"
      "    fail) echo broken >&2; exit 3;;\n"
      "    silent) ;;\n"
      "    garbage) head -c 3000 /dev/urandom; echo; echo \"nas-metric {{oops\"; echo \"nas-metric {{\\\"y\\\": 2}}\";;\n"
      "    slow) sleep 30;;\n"
      "    crash) kill -SEGV $$;;\n"
      "  esac']\n"
      "  timeout: 1s\n"
      "budget: {trials: 30, parallel: 6, max_failure_rate: 1}\n"
      "optimizer: {type: random}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "ends");
  assert_int_equal(json_array_size(rows), 30);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    const char *mode = json_string_value(json_object_get(row, "mode"));
    const char *status = json_string_value(json_object_get(row, "status"));
    const char *error = json_string_value(json_object_get(row, "error"));
    if (strcmp(mode, "ok") == 0 || strcmp(mode, "garbage") == 0) {
      assert_string_equal(status, "completed");
      assert_true(num(row, "y") == (mode[0] == 'o' ? 1 : 2));
    } else if (strcmp(mode, "slow") == 0) {
      assert_string_equal(status, "timeout");
    } else {
      assert_string_equal(status, "failed");
      assert_non_null(error);
      if (strcmp(mode, "fail") == 0) assert_non_null(strstr(error, "status 3"));
      if (strcmp(mode, "silent") == 0) assert_non_null(strstr(error, "without reporting"));
      if (strcmp(mode, "crash") == 0) assert_non_null(strstr(error, "signal 11"));
    }
  }
  json_decref(rows);
  free(spec);
}

static void parallel_trials_get_a_share_of_the_cores_as_thread_counts(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "threads.yaml",
                          "name: threads\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: omp, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"omp\\\": "
                          "$OMP_NUM_THREADS, \\\"blas\\\": $OPENBLAS_NUM_THREADS}}\"']}\n"
                          "budget: {trials: 2, parallel: 2}\n");
  unsetenv("OMP_NUM_THREADS");
  unsetenv("OPENBLAS_NUM_THREADS");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  long share = sysconf(_SC_NPROCESSORS_ONLN) / 2;
  json_t *rows = trials_json(f, "threads");
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    assert_true(num(row, "omp") == (share > 0 ? share : 1));
    assert_true(num(row, "blas") == (share > 0 ? share : 1));
  }
  json_decref(rows);
  free(spec);
}

/* The fixture's database was not even created. */
static void assert_no_database(fixture *f) {
  char *db;
  assert_true(asprintf(&db, "%s/nas.db", f->dir) > 0);
  struct stat sb;
  assert_int_not_equal(stat(db, &sb), 0);
  free(db);
}

static void bad_spec_writes_nothing(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "bad.yaml",
                          "name: bad\n"
                          "parameters:\n"
                          "  x: {type: float, low: 0, hihg: 1}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [true]}\n"
                          "budget: {trials: 2}\n");
  char *out;
  assert_int_equal(nas(f, &out, "run", spec, NULL), 1);
  assert_non_null(strstr(out, "bad.yaml:3:"));
  assert_non_null(strstr(out, "high"));
  free(out);
  assert_no_database(f);
  free(spec);
}

/* Plug-in options used to be checked only once the experiment was stored, without a
 * place, leaving a name that could not be run again. */
static void bad_plugin_options_are_refused_at_their_place_and_write_nothing(void **state) {
  fixture *f = *state;
  const char *base = "name: opts\n"
                     "parameters: {x: {type: float, low: 0, high: 1}}\n"
                     "objectives: [{name: y, goal: minimize}]\n"
                     "trial: {command: [true]}\n"
                     "budget: {trials: 2}\n";
  const struct {
    const char *section, *where, *words;
  } cases[] = {
      {"optimizer: {type: gp, n_initial: -3}\n", "opts.yaml:6:34: optimizer.n_initial: ",
       "must be an integer from 1 to"},
      {"runner:\n  type: local\n  kill_grace: -1\n", "opts.yaml:8:15: runner.kill_grace: ",
       "expected a non-negative number of seconds"},
      {"runner: {type: slurm, partition: gpu, nodes: [1]}\n", "opts.yaml:6:46: runner.nodes: ",
       "expected a positive integer or a non-empty string"},
      {"optimizer: {type: random, n_initial: 3}\n", "opts.yaml:6:38: optimizer.n_initial: ",
       "unknown option 'n_initial' (it takes no options)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *text, *out;
    assert_true(asprintf(&text, "%s%s", base, cases[i].section) > 0);
    char *spec = test_write(f->dir, "opts.yaml", text);
    assert_int_equal(nas(f, &out, "run", spec, NULL), 1);
    if (!strstr(out, cases[i].where) || !strstr(out, cases[i].words))
      fail_msg("expected %s...%s, got %s", cases[i].where, cases[i].words, out);
    free(out);
    assert_no_database(f);
    free(spec);
    free(text);
  }
}

static void interrupt_lets_running_trials_finish_and_resume_completes(void **state) {
  fixture *f = *state;
  char *spec = timing_spec(f, 6, 2, "0.8"), *out;
  pid_t pid = start_nas_run(f, spec);
  nas_sleep_ms(400);
  kill(pid, SIGINT);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 3);
  json_t *rows = trials_json(f, "timing");
  assert_int_equal(json_array_size(rows), 2);             /* nothing launched after Ctrl-C */
  assert_int_equal(count_status(rows, "completed"), 2);   /* and those running finished */
  json_decref(rows);
  int rc = nas(f, &out, "resume", "timing", "--no-progress");
  if (rc != 0) fail_msg("nas resume failed (%d): %s", rc, out);
  free(out);
  rows = trials_json(f, "timing");
  assert_int_equal(json_array_size(rows), 6);
  assert_int_equal(count_status(rows, "completed"), 6);
  json_decref(rows);
  free(spec);
}

static void report_command_stores_metrics_for_the_trial(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "report.yaml",
                          "name: report\n"
                          "parameters:\n"
                          "  x: {type: int, low: 1, high: 9}\n"
                          "objectives: [{name: y, goal: maximize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, '\"$NAS_BIN\" report y={x} z=$NAS_PARAM_X --step 1 && "
                          "\"$NAS_BIN\" report y={x}']\n"
                          "budget: {trials: 3, parallel: 3}\n"
                          "optimizer: {type: random}\n");
  setenv("NAS_BIN", test_nas_bin(), 1);
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "report");
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    assert_string_equal(json_string_value(json_object_get(row, "status")), "completed");
    assert_true(num(row, "y") == num(row, "x"));
    assert_true(num(row, "z") == num(row, "x"));
  }
  json_decref(rows);
  free(spec);
}

static void changed_spec_is_refused_with_its_differences(void **state) {
  fixture *f = *state;
  char *spec = timing_spec(f, 2, 2, "0"), *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 0);
  free(out);
  free(spec);
  spec = test_write(f->dir, "timing.yaml",
                    "name: timing\n"
                    "parameters:\n"
                    "  x: {type: float, low: 0, high: 2}\n"
                    "objectives: [{name: y, goal: minimize}]\n"
                    "trial: {command: [true]}\n"
                    "budget: {trials: 2}\n");
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 1);
  assert_non_null(strstr(out, "different spec"));
  free(out);
  free(spec);
}

static void used_up_finite_space_ends_the_experiment_early(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "finite.yaml",
                          "name: finite\n"
                          "parameters:\n"
                          "  c: {type: categorical, choices: [a, b, c]}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": 1}}\"']}\n"
                          "budget: {trials: 5, parallel: 2}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  assert_non_null(strstr(out, "exhausted"));
  free(out);
  json_t *rows = trials_json(f, "finite");
  assert_int_equal(json_array_size(rows), 3); /* each choice once, none twice */
  assert_int_equal(count_status(rows, "completed"), 3);
  json_decref(rows);
  free(spec);
}

static void every_command_has_help_and_bad_usage_exits_2(void **state) {
  fixture *f = *state;
  const char *cmds[] = {"run", "resume", "status", "trials", "pareto", "report"};
  char *out;
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char *argv[] = {(char *)test_nas_bin(), (char *)cmds[i], "--help", NULL};
    assert_int_equal(test_run(f->dir, argv, &out), 0);
    assert_non_null(strstr(out, "usage: nas"));
    free(out);
  }
  char *bad[] = {(char *)test_nas_bin(), "rnu", NULL};
  assert_int_equal(test_run(f->dir, bad, &out), 2);
  assert_non_null(strstr(out, "did you mean 'run'"));
  free(out);
  char *version[] = {(char *)test_nas_bin(), "--version", NULL};
  assert_int_equal(test_run(f->dir, version, &out), 0);
  free(out);
  assert_int_equal(nas(f, &out, "trials", "nope", NULL), 1);
  assert_non_null(strstr(out, "no experiment 'nope'"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(quickstart_gives_20_trials_and_the_true_front, setup, teardown),
      cmocka_unit_test_setup_teardown(parallelism_is_never_exceeded_and_budget_is_exact, setup, teardown),
      cmocka_unit_test_setup_teardown(every_way_a_trial_ends_is_recorded, setup, teardown),
      cmocka_unit_test_setup_teardown(parallel_trials_get_a_share_of_the_cores_as_thread_counts, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_spec_writes_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_plugin_options_are_refused_at_their_place_and_write_nothing,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(interrupt_lets_running_trials_finish_and_resume_completes, setup, teardown),
      cmocka_unit_test_setup_teardown(report_command_stores_metrics_for_the_trial, setup, teardown),
      cmocka_unit_test_setup_teardown(changed_spec_is_refused_with_its_differences, setup, teardown),
      cmocka_unit_test_setup_teardown(used_up_finite_space_ends_the_experiment_early, setup, teardown),
      cmocka_unit_test_setup_teardown(every_command_has_help_and_bad_usage_exits_2, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
