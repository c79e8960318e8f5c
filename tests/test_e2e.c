/* End-to-end: the real bin/nas on real trials (processes), SQLite storage in a temporary
 * folder. What a user sees: budgets kept exactly, parallelism never exceeded, every way a
 * trial can end recorded, a bad spec writing nothing, Ctrl-C then resume, and a front
 * that matches one computed here independently. */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "common/common.h"
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
      "    crash) echo dying >&2; kill -SEGV $$;;\n"
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
      /* A failure quotes the last line of stderr.log, where the trial said why. */
      if (strcmp(mode, "fail") == 0 && !strstr(error, "status 3: \"broken\" (last line of "))
        fail_msg("fail's error: %s", error);
      if (strcmp(mode, "silent") == 0) assert_non_null(strstr(error, "without reporting"));
      if (strcmp(mode, "crash") == 0 && !strstr(error, "signal 11 (Segmentation fault): \"dying\""))
        fail_msg("crash's error: %s", error);
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
  wait_until_n_running(f, "timing", 2); /* a fixed 0.4 s could pass before any launch under load */
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
  /* Once more: nothing is left to run, and resume says so and how to run more. */
  assert_int_equal(nas(f, &out, "resume", "timing", "--no-progress"), 0);
  if (!strstr(out, "timing: its budget of 6 trials (budget.trials) is spent; nothing to run"))
    fail_msg("a resume with no budget left said: %s", out);
  free(out);
  free(spec);
}

/* A second Ctrl-C stops the running trials; they count in the budget, so `nas retry` by
 * number is their way back into the queue (--failed leaves them: they did not fail). */
static void trials_a_second_interrupt_stopped_are_retried_by_number(void **state) {
  fixture *f = *state;
  char *spec = timing_spec(f, 3, 2, "30"), *out;
  pid_t pid = start_nas_run(f, spec);
  wait_until_n_running(f, "timing", 2);
  kill(pid, SIGINT);
  wait_until_n_running(f, "timing", 2); /* still running: the first signal only drains */
  kill(pid, SIGINT);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  json_t *rows = trials_json(f, "timing");
  assert_int_equal(count_status(rows, "stopped"), 2);
  json_decref(rows);
  int rc = nas(f, &out, "retry", "timing", "--failed");
  if (rc != 0) fail_msg("nas retry --failed failed (%d): %s", rc, out);
  assert_non_null(strstr(out, "no failed or timed-out trial"));
  free(out);
  char *both[] = {(char *)test_nas_bin(), "retry", "timing", "0", "1", "--storage", f->db, NULL};
  rc = test_run(f->dir, both, &out);
  if (rc != 0) fail_msg("nas retry timing 0 1 failed (%d): %s", rc, out);
  assert_non_null(strstr(out, "trial 1 queued again (was stopped"));
  free(out);
  rows = trials_json(f, "timing");
  assert_int_equal(count_status(rows, "queued"), 2);
  json_decref(rows);
  free(spec);
}

/* Trials the wall time (or a second Ctrl-C) cut short count in the budget: the run names
 * them and the `nas retry` that runs them again. */
static void trials_cut_short_are_named_with_their_retry(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "cut.yaml",
                          "name: cut\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sleep, '30']}\n"
                          "budget: {trials: 3, parallel: 2, wall_time: 1s}\n"
                          "runner: {type: local, kill_grace: 1}\n");
  char *out, *retry = nas_asprintf("'nas retry cut 0 1 --storage sqlite:%s/nas.db'", f->dir);
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 0);
  if (!strstr(out, "cut: trials 0 and 1 were stopped part way and count in budget.trials") ||
      !strstr(out, retry))
    fail_msg("the run said: %s", out);
  free(out), free(retry), free(spec);
}

/* Every one of the n trials of experiment name completed with y = z = its parameter x. */
static void assert_trials_reported_x_as_y_and_z(fixture *f, const char *name, size_t n) {
  json_t *rows = trials_json(f, name);
  assert_int_equal(json_array_size(rows), n);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    assert_string_equal(json_string_value(json_object_get(row, "status")), "completed");
    assert_true(num(row, "y") == num(row, "x"));
    assert_true(num(row, "z") == num(row, "x"));
  }
  json_decref(rows);
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
  assert_trials_reported_x_as_y_and_z(f, "report", 3);
  free(spec);
}

/* A trial calls `nas` by name, and "$NAS_BIN", whatever PATH and NAS_BIN nas was started
 * with: the runner puts the running binary's folder first on the trial's PATH and sets
 * NAS_BIN to it. */
static void trials_find_the_running_nas_by_name_and_nas_bin(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "find.yaml",
                          "name: find\n"
                          "parameters:\n"
                          "  x: {type: int, low: 1, high: 9}\n"
                          "objectives: [{name: y, goal: maximize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'nas report z={x} && \"$NAS_BIN\" report y={x}']\n"
                          "budget: {trials: 2, parallel: 2}\n"
                          "optimizer: {type: random}\n");
  char *bin = realpath(test_nas_bin(), NULL), *old_path = strdup(getenv("PATH"));
  assert_non_null(bin);
  setenv("PATH", "/usr/bin:/bin", 1);
  setenv("NAS_BIN", "/nonexistent/nas", 1);
  char *argv[] = {bin, "run", spec, "--storage", f->db, "--no-progress", NULL}, *out;
  int rc = test_run(f->dir, argv, &out);
  setenv("PATH", old_path, 1);
  setenv("NAS_BIN", bin, 1);
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  assert_trials_reported_x_as_y_and_z(f, "find", 2);
  free(spec), free(bin), free(old_path);
}

/* `parallel: 4` on two GPUs, one per trial: nas runs two trials at a time, so none waits
 * for a device, and each sees one device of its own (a made-up list: no GPU needed). */
static void gpus_cap_parallel_and_each_trial_sees_its_own(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "gpus.yaml",
                          "name: gpus\n"
                          "parameters:\n"
                          "  x: {type: int, low: 1, high: 9}\n"
                          "objectives: [{name: y, goal: maximize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'sleep 0.3; nas report y=$CUDA_VISIBLE_DEVICES']\n"
                          "budget: {trials: 4, parallel: 4}\n"
                          "optimizer: {type: random}\n"
                          "runner: {type: local, gpus: [5, 6]}\n");
  char *tmpdir = getenv("TMPDIR") ? strdup(getenv("TMPDIR")) : NULL, *out;
  setenv("TMPDIR", f->dir, 1); /* the GPU lock files */
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (tmpdir) setenv("TMPDIR", tmpdir, 1);
  else unsetenv("TMPDIR");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "gpus");
  assert_int_equal(count_status(rows, "completed"), 4);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) assert_true(num(row, "y") == 5 || num(row, "y") == 6);
  json_decref(rows);
  char *waited = NULL;
  assert_true(asprintf(&waited, "grep -rl waiting %s/runs/gpus", f->dir) > 0);
  char *grep[] = {"sh", "-c", waited, NULL};
  assert_int_equal(test_run(NULL, grep, NULL), 1); /* no trial's stderr.log says it waited */
  free(waited), free(tmpdir), free(spec);
}

static void changed_spec_is_refused_with_its_differences(void **state) {
  fixture *f = *state;
  char *spec = timing_spec(f, 2, 2, "0"), *out;
  run_spec(f, spec);
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

/* A failed trial's assignment counts as tried: a finite space half of whose assignments
 * fail hands out each assignment once (nas retry is for running one again), and the end
 * says the failed ones are counted. */
static void failed_assignments_are_not_suggested_again(void **state) {
  fixture *f = *state;
  const char *optimizers[] = {"gp", "random", "sobol"};
  for (size_t o = 0; o < sizeof optimizers / sizeof *optimizers; o++) {
    char *text = NULL, *name = NULL;
    assert_true(asprintf(&name, "fails_%s", optimizers[o]) > 0);
    assert_true(asprintf(&text,
                         "name: %s\n"
                         "parameters:\n"
                         "  a: {type: categorical, choices: [p, q]}\n"
                         "  b: {type: categorical, choices: [u, v, w]}\n"
                         "objectives: [{name: y, goal: minimize}]\n"
                         "optimizer: {type: %s}\n"
                         "trial: {command: [sh, -c, 'test {b} = u && exit 1; "
                         "echo \"nas-metric {{\\\"y\\\": 1}}\"']}\n"
                         "budget: {trials: 12, parallel: 1, max_failure_rate: 1}\n",
                         name, optimizers[o]) > 0);
    char *spec = test_write(f->dir, "fails.yaml", text), *out;
    int rc = nas(f, &out, "run", spec, "--no-progress");
    if (rc != 0) fail_msg("%s: nas run failed (%d): %s", name, rc, out);
    if (!strstr(out, "exhausted") || !strstr(out, "failed trials included"))
      fail_msg("%s: no exhausted space counting failed trials: %s", name, out);
    free(out);
    json_t *rows = trials_json(f, name);
    if (json_array_size(rows) != 6)
      fail_msg("%s: %zu trials for 6 assignments", name, json_array_size(rows));
    assert_int_equal(count_status(rows, "failed"), 2);
    assert_int_equal(count_status(rows, "completed"), 4);
    size_t i, j;
    json_t *row, *other;
    json_array_foreach(rows, i, row) json_array_foreach(rows, j, other) if (i < j) {
      bool same = json_equal(json_object_get(row, "a"), json_object_get(other, "a")) &&
                  json_equal(json_object_get(row, "b"), json_object_get(other, "b"));
      if (same) fail_msg("%s: trials %zu and %zu have the same assignment", name, i, j);
    }
    json_decref(rows);
    free(spec), free(text), free(name);
  }
}

static void every_command_has_help_and_bad_usage_exits_2(void **state) {
  fixture *f = *state;
  const char *cmds[] = {"run", "resume", "status", "trials", "pareto", "report", "retry"};
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
  free(test_write(f->dir, "nas.db", "")); /* an empty database: it exists, without experiments */
  assert_int_equal(nas(f, &out, "trials", "nope", NULL), 1);
  assert_non_null(strstr(out, "no experiment 'nope'"));
  free(out);
}

/* Whether text names option "-letter" as a word (not inside "--long" or "a-b"). */
static bool mentions_short_option(const char *text, char letter) {
  for (const char *at = strchr(text, '-'); at; at = strchr(at + 1, '-')) {
    bool starts = at == text || !(isalnum((unsigned char)at[-1]) || at[-1] == '-');
    if (starts && at[1] == letter && !(isalnum((unsigned char)at[2]) || at[2] == '-')) return true;
  }
  return false;
}

/* Every short option a command takes is in its --help (`nas tell -x` was taken as --fail,
 * said nowhere), but -h, which every command takes for --help, and `nas --help` says so.
 * The commands are those `nas --help` lists; a letter is taken unless getopt calls it
 * unknown. */
static void every_short_option_a_command_takes_is_in_its_help(void **state) {
  fixture *f = *state;
  char *top, *help_argv[] = {(char *)test_nas_bin(), "--help", NULL};
  assert_int_equal(test_run(f->dir, help_argv, &top), 0);
  assert_true(mentions_short_option(top, 'h'));
  const char *line = strstr(top, "commands:\n");
  assert_non_null(line);
  int commands = 0;
  for (line = strchr(line, '\n') + 1; strncmp(line, "  ", 2) == 0; line = strchr(line, '\n') + 1) {
    char cmd[32], *help, *out;
    assert_int_equal(sscanf(line, "%31s", cmd), 1);
    char *cmd_help[] = {(char *)test_nas_bin(), cmd, "--help", NULL};
    assert_int_equal(test_run(f->dir, cmd_help, &help), 0);
    for (const char *letters = "abcdefgijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"; *letters; letters++) {
      char option[3] = {'-', *letters, '\0'}, unknown[32];
      char *argv[] = {(char *)test_nas_bin(), cmd, option, NULL};
      test_run(f->dir, argv, &out);
      snprintf(unknown, sizeof unknown, "unknown option '%s'", option);
      if (!strstr(out, unknown) && !mentions_short_option(help, *letters))
        fail_msg("nas %s takes %s, which its --help does not mention: %s", cmd, option, out);
      free(out);
    }
    free(help);
    commands++;
  }
  assert_true(commands >= 20);
  free(top);
}

/* What a command prints that cannot reach stdout (here a full device) fails it, saying
 * so: `nas export EXP > backup.json` on a full disk must not exit 0 with half a file. */
static void output_that_cannot_be_written_fails_the_command(void **state) {
  fixture *f = *state;
  free(test_write(f->dir, "nas.db", "")); /* a database without experiments */
  const char *commands[] = {"\"$0\" status --storage \"$1\" >/dev/full",
                            "\"$0\" status --format json --storage \"$1\" >/dev/full",
                            "\"$0\" --help >/dev/full", "\"$0\" help trials >/dev/full"};
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
    char *out, *argv[] = {"sh", "-c", (char *)commands[i], (char *)test_nas_bin(), f->db, NULL};
    int rc = test_run(f->dir, argv, &out);
    if (rc != 1 || !strstr(out, "nas: cannot write the output to stdout"))
      fail_msg("%s exited %d: %s", commands[i], rc, out);
    free(out);
  }
}

/* The spec's storage line as written, with a password: a new password alone is the same
 * experiment (passwords rotate); any other change to it is refused, and the message shows
 * both lines with their passwords masked. (The storage used is --storage, so the line is
 * never connected to.) */
static void storage_line_password_is_masked_and_may_change_alone(void **state) {
  fixture *f = *state;
  const char *body = "parameters: {x: {type: float, low: 0, high: 1}}\n"
                     "objectives: [{name: y, goal: minimize}]\n"
                     "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                     "budget: {trials: 1}\n";
  const char *lines[] = {"postgresql://nas:old-pw@db.example/nas",
                         "postgresql://nas:new-pw@db.example/nas",
                         "postgresql://nas:new-pw@other.example/nas"};
  int want[] = {0, 0, 1};
  for (size_t i = 0; i < 3; i++) {
    char *text = NULL, *out = NULL;
    assert_true(asprintf(&text, "name: rotate\nstorage: %s\n%s", lines[i], body) > 0);
    char *spec = test_write(f->dir, "rotate.yaml", text);
    int rc = nas(f, &out, "run", spec, "--no-progress");
    if (rc != want[i]) fail_msg("run %zu exited %d: %s", i, rc, out);
    assert_null(strstr(out, "old-pw"));
    assert_null(strstr(out, "new-pw"));
    if (want[i]) assert_non_null(strstr(out, "storage: postgresql://nas:***@db.example/nas -> "
                                             "postgresql://nas:***@other.example/nas"));
    free(text), free(spec), free(out);
  }
}

/* A mistyped path must not become a new, empty database: every command but `nas run`
 * refuses, naming the path and what creates it, and leaves no file behind. */
static void commands_other_than_run_refuse_a_missing_database(void **state) {
  fixture *f = *state;
  char *url = NULL, *path = NULL;
  assert_true(asprintf(&url, "sqlite:%s/typo.db", f->dir) > 0);
  assert_true(asprintf(&path, "%s/typo.db", f->dir) > 0);
  setenv("NAS_TRIAL_ID", "1", 1);
  const char *cmds[][3] = {{"status", NULL, NULL}, {"trials", "e", NULL}, {"pareto", "e", NULL},
                           {"stop", "e", NULL},    {"resume", "e", NULL}, {"report", "y=1", NULL},
                           {"worker", "--trial", "1"}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char *argv[] = {(char *)test_nas_bin(), (char *)cmds[i][0], "--storage", url,
                    (char *)cmds[i][1], (char *)cmds[i][2], NULL};
    char *out = NULL;
    int rc = test_run(f->dir, argv, &out);
    if (rc != 1) fail_msg("nas %s exited %d: %s", cmds[i][0], rc, out);
    assert_non_null(strstr(out, path));
    assert_non_null(strstr(out, "'nas run' creates it"));
    assert_int_equal(access(path, F_OK), -1);
    free(out);
  }
  unsetenv("NAS_TRIAL_ID");
  free(url), free(path);
}

/* The hint a command prints to go on ("'nas resume E --storage URL' continues it", here
 * `nas create`'s for an ask-and-tell experiment) quotes a URL with a quote in it as one shell
 * word: it was printed as '…'…', which a shell reads as something else. */
static void a_storage_path_with_a_quote_is_one_shell_word_in_hints(void **state) {
  fixture *f = *state;
  char *url = nas_asprintf("sqlite:%s/it's.db", f->dir), *out = NULL;
  char *spec = test_write(f->dir, "quoted.yaml",
                          "name: quoted\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "budget: {trials: 1}\n");
  char *create[] = {(char *)test_nas_bin(), "create", spec, "--storage", url, NULL};
  assert_int_equal(test_run(f->dir, create, &out), 0);
  free(out);
  char *stop[] = {(char *)test_nas_bin(), "stop", "quoted", "--storage", url, NULL};
  assert_int_equal(test_run(f->dir, stop, &out), 0);
  /* (an ask-and-tell spec: `nas create` of it, not `nas resume`, goes on) */
  char *hint = nas_asprintf("'nas create %s --storage 'sqlite:%s/it'\\''s.db'' opens it again",
                            spec, f->dir);
  if (!strstr(out, hint)) fail_msg("\"%s\" does not contain \"%s\"", out, hint);
  free(hint), free(out), free(spec), free(url);
}

/* `nas report --experiment E --trial N` reaches the trial that listings call N; a finished
 * trial's result stays as the scheduler judged it unless --force says otherwise. */
static void report_by_number_to_a_finished_trial_needs_force(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "done.yaml",
                          "name: done\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": 5}}\"']}\n"
                          "budget: {trials: 1}\n");
  char *out;
  run_spec(f, spec);
  char *report[] = {(char *)test_nas_bin(), "report", "y=7", "--experiment", "done", "--trial",
                    "0", "--storage", f->db, NULL, NULL};
  assert_int_equal(test_run(f->dir, report, &out), 1);
  assert_non_null(strstr(out, "trial 0 of experiment 'done' is completed"));
  assert_non_null(strstr(out, "--force"));
  free(out);
  json_t *rows = trials_json(f, "done");
  assert_true(num(json_array_get(rows, 0), "y") == 5);
  json_decref(rows);
  report[6] = "3";
  assert_int_equal(test_run(f->dir, report, &out), 1);
  assert_non_null(strstr(out, "experiment 'done' has no trial 3"));
  free(out);
  report[6] = "0";
  report[9] = "--force";
  assert_int_equal(test_run(f->dir, report, &out), 0);
  free(out);
  rows = trials_json(f, "done");
  assert_true(num(json_array_get(rows, 0), "y") == 7);
  json_decref(rows);
  free(spec);
}

/* A PostgreSQL server that accepts the connection and never answers (a listening socket
 * nobody accepts on): `nas status` gives up after one connect_timeout (5 s), not after
 * the whole retry budget (30 s). */
static void status_gives_up_on_a_silent_server_after_the_connect_timeout(void **state) {
  fixture *f = *state;
  int silent = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  assert_int_equal(bind(silent, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(silent, 8), 0);
  assert_int_equal(getsockname(silent, (struct sockaddr *)&addr, &len), 0);
  char *url = NULL, *out = NULL;
  assert_true(asprintf(&url, "postgresql://nas@127.0.0.1:%d/nas", ntohs(addr.sin_port)) > 0);
  char *argv[] = {(char *)test_nas_bin(), "status", "--storage", url, NULL};
  unsetenv("NAS_STORAGE_RETRY_S");
  double began = nas_monotonic();
  assert_int_equal(test_run(f->dir, argv, &out), 1);
  double took = nas_monotonic() - began;
  if (took < 4 || took > 12) fail_msg("took %.1f s: %s", took, out);
  assert_non_null(strstr(out, "timeout"));
  close(silent);
  free(url), free(out);
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
      cmocka_unit_test_setup_teardown(trials_cut_short_are_named_with_their_retry, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(trials_a_second_interrupt_stopped_are_retried_by_number, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(report_command_stores_metrics_for_the_trial, setup, teardown),
      cmocka_unit_test_setup_teardown(trials_find_the_running_nas_by_name_and_nas_bin, setup, teardown),
      cmocka_unit_test_setup_teardown(gpus_cap_parallel_and_each_trial_sees_its_own, setup, teardown),
      cmocka_unit_test_setup_teardown(changed_spec_is_refused_with_its_differences, setup, teardown),
      cmocka_unit_test_setup_teardown(used_up_finite_space_ends_the_experiment_early, setup, teardown),
      cmocka_unit_test_setup_teardown(failed_assignments_are_not_suggested_again, setup, teardown),
      cmocka_unit_test_setup_teardown(every_command_has_help_and_bad_usage_exits_2, setup, teardown),
      cmocka_unit_test_setup_teardown(every_short_option_a_command_takes_is_in_its_help, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(output_that_cannot_be_written_fails_the_command, setup, teardown),
      cmocka_unit_test_setup_teardown(storage_line_password_is_masked_and_may_change_alone, setup, teardown),
      cmocka_unit_test_setup_teardown(commands_other_than_run_refuse_a_missing_database, setup, teardown),
      cmocka_unit_test_setup_teardown(a_storage_path_with_a_quote_is_one_shell_word_in_hints, setup, teardown),
      cmocka_unit_test_setup_teardown(report_by_number_to_a_finished_trial_needs_force, setup, teardown),
      cmocka_unit_test_setup_teardown(status_gives_up_on_a_silent_server_after_the_connect_timeout, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
