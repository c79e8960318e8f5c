/* End-to-end recovery and stopping: the real bin/nas with real trial processes. A lost
 * trial is retried, a silent one is retried then failed, too many failures stop the run,
 * `nas stop` works from another process, early stopping ends bad trials, and a scheduler
 * killed with -9 at random moments resumes to exactly its budget with nothing run twice,
 * Hyperband's rungs included, and Hyperband goes on past a rung whose trials mostly failed.
 * `nas resume` runs the rest beside a trial handed out by `nas ask`. */
#include <dirent.h>
#include <sys/stat.h>

#include "common/common.h"
#include "tests/e2e.h"

static void run_ok(fixture *f, const char *spec) {
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  free(out);
}

static void lost_trial_is_retried_and_completes(void **state) {
  fixture *f = *state;
  /* The first attempt kills its own monitor (the process nas watches it through). */
  char *spec = test_write(f->dir, "lost.yaml",
                          "name: lost\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'if [ $NAS_ATTEMPT = 1 ]; then kill -9 $PPID; sleep 5; fi;"
                          " echo \"nas-metric {{\\\"y\\\": {x}}}\"']\n"
                          "  max_attempts: 2\n"
                          "budget: {trials: 1}\n");
  run_ok(f, spec);
  json_t *rows = trials_json(f, "lost");
  assert_int_equal(json_array_size(rows), 1);
  assert_string_equal(json_string_value(json_object_get(row_of(rows, 0), "status")), "completed");
  char *second;
  assert_true(asprintf(&second, "%s/runs/lost/0.2/stdout.log", f->dir) > 0);
  struct stat sb;
  assert_int_equal(stat(second, &sb), 0); /* the retry ran in its own folder */
  free(second);
  json_decref(rows);
  free(spec);
}

static void silent_trial_is_retried_then_failed(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "silent.yaml",
                          "name: silent\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sleep, '30'], heartbeat_timeout: 1s, max_attempts: 2}\n"
                          "budget: {trials: 1}\n"
                          "runner: {type: local, kill_grace: 1}\n");
  double start = nas_now();
  run_ok(f, spec);
  assert_true(nas_now() - start < 15);
  json_t *rows = trials_json(f, "silent");
  const json_t *row = row_of(rows, 0);
  assert_string_equal(json_string_value(json_object_get(row, "status")), "failed");
  const char *error = json_string_value(json_object_get(row, "error"));
  assert_non_null(strstr(error, "no output nor heartbeat"));
  assert_non_null(strstr(error, "each of its 2 attempts"));
  json_decref(rows);
  free(spec);
}

static void too_many_failures_stop_the_run_with_status_4(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "failing.yaml",
                          "name: failing\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo typo >&2; exit 2']}\n"
                          "budget: {trials: 40, parallel: 2}\n");
  char *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 4);
  assert_non_null(strstr(out, "max_failure_rate"));
  free(out);
  json_t *rows = trials_json(f, "failing");
  assert_true(json_array_size(rows) >= 5 && json_array_size(rows) <= 8);
  assert_int_equal(count_status(rows, "failed"), json_array_size(rows));
  json_decref(rows);
  free(spec);
}

/* The stop names the last failure even when the trial that tips the rate over completed:
 * four failures, then a completed trial, make 4 of 5 ended. */
static void the_failure_rate_stop_names_the_last_failure(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "tipped.yaml",
                          "name: tipped\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'if [ $NAS_TRIAL_NUMBER -lt 4 ]; then"
                          " echo \"bad input $NAS_TRIAL_NUMBER\" >&2; exit 2; fi;"
                          " echo \"nas-metric {{\\\"y\\\": {x}}}\"']\n"
                          "budget: {trials: 20, parallel: 1, max_failure_rate: 0.5}\n");
  char *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 4);
  if (!strstr(out, "launching no more (last error: trial 3: exited with status 2: \"bad input 3\""))
    fail_msg("the stop does not name trial 3's error: %s", out);
  free(out);
  json_t *rows = trials_json(f, "tipped");
  assert_int_equal(json_array_size(rows), 5);
  assert_string_equal(json_string_value(json_object_get(row_of(rows, 4), "status")), "completed");
  json_decref(rows);
  free(spec);
}

/* Trials whose jobs cannot even start (here their run folder cannot be made: a file holds
 * its place) count as failures too: the run stops at the failure rate instead of failing
 * the whole budget and calling that finished. */
static void trials_that_cannot_start_stop_the_run_at_max_failure_rate(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "unstartable.yaml",
                          "name: unstartable\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [true]}\n"
                          "budget: {trials: 20, parallel: 1, max_failure_rate: 0.5}\n");
  char *runs = nas_asprintf("%s/runs", f->dir);
  assert_int_equal(mkdir(runs, 0700), 0);
  free(runs);
  free(test_write(f->dir, "runs/unstartable", "not a folder"));
  char *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 4);
  assert_non_null(strstr(out, "max_failure_rate"));
  assert_non_null(strstr(out, "too many trials failed"));
  free(out);
  json_t *rows = trials_json(f, "unstartable");
  assert_int_equal(json_array_size(rows), 5); /* judged from 5 ended trials on */
  assert_int_equal(count_status(rows, "failed"), 5);
  json_decref(rows);
  free(spec);
}

/* `nas create SPEC`, then `nas ask NAME`: trial 0 is handed out. */
static void create_and_ask_one(fixture *f, const char *spec, const char *name) {
  nas_ok(f, "create", spec, NULL);
  nas_ok(f, "ask", name, NULL);
}

/* A trial handed out by `nas ask` is no job of the runner's: `nas resume` of an experiment
 * whose spec has a command counts it in the budget and runs the rest, leaving it running
 * for its asker to tell. */
static void resume_runs_the_rest_beside_a_trial_handed_out_by_ask(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "mixed.yaml",
                          "name: mixed\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": 1}}\"']}\n"
                          "budget: {trials: 3}\n");
  create_and_ask_one(f, spec, "mixed");
  char *out;
  int rc = nas(f, &out, "resume", "mixed", "--no-progress");
  if (rc != 0) fail_msg("nas resume exited %d: %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "mixed");
  assert_int_equal(json_array_size(rows), 3);
  assert_string_equal(json_string_value(json_object_get(row_of(rows, 0), "status")), "running");
  assert_int_equal(count_status(rows, "completed"), 2);
  json_decref(rows);
  free(spec);
}

/* An ask for more trials than a finite space has left hands out those it has (it failed
 * whole, "search space exhausted", and handed out none), and the next ask says exhausted. */
static void ask_for_more_than_a_finite_space_has_hands_out_what_is_left(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "grid.yaml",
                          "name: grid\n"
                          "parameters:\n"
                          "  a: {type: categorical, choices: [p, q]}\n"
                          "  b: {type: int, low: 1, high: 2}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "budget: {trials: 10}\n");
  create_and_ask_one(f, spec, "grid");
  char *argv[] = {(char *)test_nas_bin(), "ask", "grid", "-n", "6", "--format=json",
                  "--storage", f->db, NULL};
  char *out;
  int rc = test_run(f->dir, argv, &out);
  if (rc != 0) fail_msg("nas ask -n 6 exited %d: %s", rc, out);
  json_t *asked = json_loads(out, 0, NULL);
  assert_int_equal(json_array_size(asked), 3);
  json_decref(asked);
  free(out);
  assert_int_equal(nas(f, &out, "ask", "grid", NULL), 1);
  assert_non_null(strstr(out, "exhausted"));
  free(out);
  json_t *rows = trials_json(f, "grid");
  assert_int_equal(count_status(rows, "running"), 4);
  json_decref(rows);
  free(spec);
}

/* `nas stop` asks runners to stop their jobs; a trial handed out by `nas ask` has none (its
 * job id is the asker's name), so it is left to its asker, without an error about it. */
static void nas_stop_leaves_a_trial_handed_out_by_ask_to_its_asker(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml",
                          "name: asked\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "budget: {trials: 3}\n");
  create_and_ask_one(f, spec, "asked");
  char *out;
  assert_int_equal(nas(f, &out, "stop", "asked", NULL), 0);
  if (strstr(out, "handle")) fail_msg("nas stop said: %s", out);
  assert_non_null(strstr(out, "'nas ask' hands out no more trials (those handed out may still be told)"));
  free(out);
  json_t *rows = trials_json(f, "asked");
  assert_string_equal(json_string_value(json_object_get(row_of(rows, 0), "status")), "running");
  json_decref(rows);
  free(spec);
}

/* `nas tell` is for trials handed out by `nas ask`: one that `nas run` runs is refused,
 * and the run goes on to judge it by its own job (a trial completed under it made the run
 * fail with "it is completed, not running" once its job ended). */
static void nas_tell_refuses_a_trial_that_nas_run_runs(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "told.yaml",
                          "name: told\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'sleep 2; echo \"nas-metric {{\\\"y\\\": 1}}\"']}\n"
                          "budget: {trials: 1}\n");
  pid_t pid = start_nas_run(f, spec);
  bool running = false;
  for (double until = nas_now() + 10; !running && nas_now() < until; nas_sleep(0.05)) {
    char *out = NULL;
    int rc = nas(f, &out, "trials", "told", "--format=json");
    json_t *rows = rc == 0 ? json_loads(out, 0, NULL) : NULL;
    const char *status = json_string_value(json_object_get(json_array_get(rows, 0), "status"));
    running = status && strcmp(status, "running") == 0;
    json_decref(rows);
    free(out);
  }
  assert_true(running);
  char *argv[] = {(char *)test_nas_bin(), "tell", "told", "0", "--complete", "y=5", "--storage",
                  f->db, NULL};
  char *out;
  assert_int_not_equal(test_run(f->dir, argv, &out), 0);
  if (!strstr(out, "not handed out by ask")) fail_msg("nas tell said: %s", out);
  free(out);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  json_t *rows = trials_json(f, "told");
  assert_string_equal(json_string_value(json_object_get(row_of(rows, 0), "status")), "completed");
  assert_true(num(row_of(rows, 0), "y") == 1);
  json_decref(rows);
  free(spec);
}

static void nas_stop_from_another_process_stops_the_run(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "long.yaml",
                          "name: long\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sleep, '30']}\n"
                          "budget: {trials: 10, parallel: 2}\n"
                          "runner: {type: local, kill_grace: 1}\n");
  pid_t pid = start_nas_run(f, spec);
  nas_sleep_ms(1000);
  double start = nas_now();
  nas_ok(f, "stop", "long", NULL);
  int status;
  waitpid(pid, &status, 0);
  assert_true(nas_now() - start < 10);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 3);
  json_t *rows = trials_json(f, "long");
  assert_int_equal(json_array_size(rows), 2);
  assert_int_equal(count_status(rows, "stopped"), 2);
  json_decref(rows);
  free(spec);
}

/* Starts `nas run` of experiment name, four trials of command two at a time (3 s of grace
 * after TERM), once two run; *spec gets the spec's path (owned). Returns the run's pid. */
static pid_t start_two_running(fixture *f, const char *name, const char *command, char **spec) {
  char *file = nas_asprintf("%s.yaml", name);
  char *text = nas_asprintf("name: %s\n"
                            "parameters: {x: {type: float, low: 0, high: 1}}\n"
                            "objectives: [{name: y, goal: minimize}]\n"
                            "trial: {command: %s}\n"
                            "budget: {trials: 4, parallel: 2}\n"
                            "runner: {type: local, kill_grace: 3}\n",
                            name, command);
  *spec = test_write(f->dir, file, text);
  free(file), free(text);
  pid_t pid = start_nas_run(f, *spec);
  wait_until_n_running(f, name, 2);
  return pid;
}

/* `nas stop` of an experiment whose scheduler was killed stops its trials and records them
 * stopped itself: no scheduler is left to, and `nas resume` would launch more. */
static void stop_after_the_scheduler_died_records_its_trials_stopped(void **state) {
  fixture *f = *state;
  char *spec;
  pid_t pid = start_two_running(
      f, "orphans", "[sh, -c, 'echo \"nas-metric {{\\\"y\\\": 1, \\\"step\\\": 1}}\"; sleep 30']",
      &spec);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  char *out;
  assert_int_equal(nas(f, &out, "stop", "orphans", NULL), 0);
  if (!strstr(out, "recorded how they ended")) fail_msg("nas stop said: %s", out);
  free(out);
  json_t *rows = trials_json(f, "orphans");
  assert_int_equal(json_array_size(rows), 2);
  assert_int_equal(count_status(rows, "stopped"), 2);
  assert_true(num(row_of(rows, 0), "y") == 1); /* what it reported before is kept */
  json_decref(rows);
  assert_int_equal(nas(f, &out, "status", "orphans", "--format=json"), 0);
  json_t *summary = json_loads(out, 0, NULL);
  assert_non_null(summary);
  const char *status = json_string_value(json_object_get(summary, "status"));
  const char *scheduler =
      json_string_value(json_object_get(json_object_get(summary, "scheduler"), "state"));
  if (!status || strcmp(status, "stopped") != 0 || !scheduler || strcmp(scheduler, "none") != 0)
    fail_msg("status after the stop: %s", out);
  json_decref(summary);
  free(out);
  free(spec);
}

/* The trials of a stopped run take their grace period to end, and the run ends after
 * them: `nas stop` says so, and a resume meanwhile is told to wait, not to `nas stop`. */
static void resume_while_a_stopped_run_ends_is_told_to_wait(void **state) {
  fixture *f = *state;
  char *spec;
  pid_t pid = start_two_running(
      f, "slowstop", "[sh, -c, 'trap \"sleep 2; exit 1\" TERM; sleep 30 & wait']", &spec);
  char *out;
  assert_int_equal(nas(f, &out, "stop", "slowstop", NULL), 0);
  if (!strstr(out, "ends once its trials have stopped")) fail_msg("nas stop said: %s", out);
  free(out);
  assert_int_equal(nas(f, &out, "resume", "slowstop", "--no-progress"), 1);
  if (!strstr(out, "is ending after 'nas stop'") || strstr(out, "stop it with"))
    fail_msg("resume beside the stopping run said: %s", out);
  free(out);
  int status;
  waitpid(pid, &status, 0);
  assert_int_equal(WEXITSTATUS(status), 3);
  free(spec);
}

static void early_stopping_ends_bad_trials_and_keeps_good_ones(void **state) {
  fixture *f = *state;
  char *spec = test_write(
      f->dir, "curves.yaml",
      "name: curves\n"
      "seed: 3\n"
      "parameters:\n"
      "  quality: {type: categorical, choices: [good, bad]}\n"
      "  x: {type: float, low: 0, high: 1}\n"
      "objectives: [{name: loss, goal: minimize}]\n"
      "trial:\n"
      "  command: [sh, -c, 'for s in 1 2 3 4 5 6 7 8; do\n"
      "      if [ {quality} = good ]; then v=0.$((9 - s)); else v=5; fi;\n"
      "      echo \"nas-metric {{\\\"loss\\\": $v, \\\"step\\\": $s}}\"; sleep 0.25; done;\n"
      "    echo \"nas-metric {{\\\"loss\\\": $v}}\"']\n"
      "budget: {trials: 10, parallel: 5}\n"
      "optimizer: {type: random}\n"
      "early_stopping: {rule: median, min_steps: 2, min_trials: 2}\n"
      "runner: {type: local, kill_grace: 1}\n");
  run_ok(f, spec);
  json_t *rows = trials_json(f, "curves");
  size_t i, bad_stopped = 0, bad = 0;
  json_t *row;
  json_array_foreach(rows, i, row) {
    const char *quality = json_string_value(json_object_get(row, "quality"));
    const char *status = json_string_value(json_object_get(row, "status"));
    if (strcmp(quality, "good") == 0) {
      assert_string_equal(status, "completed");
    } else {
      bad++;
      bad_stopped += strcmp(status, "stopped") == 0;
    }
  }
  assert_true(bad > 0);
  assert_true(bad_stopped > 0);
  json_decref(rows);
  free(spec);
}

/* Lines starting "nas-metric" in the stdout.log of one run folder. */
static int metric_lines_in(const char *path) {
  FILE *in = fopen(path, "r");
  if (!in) return 0;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, in)) n += strncmp(line, "nas-metric", 10) == 0;
  fclose(in);
  return n;
}

/* Metric lines a trial printed over all its attempts (runs/crash/N, N.2, N.3, …). */
static int metric_lines(const char *dir, long long number) {
  int total = 0;
  for (int attempt = 1; attempt <= 3; attempt++) {
    char *path;
    if (attempt == 1) assert_true(asprintf(&path, "%s/runs/crash/%lld/stdout.log", dir, number) > 0);
    else assert_true(asprintf(&path, "%s/runs/crash/%lld.%d/stdout.log", dir, number, attempt) > 0);
    total += metric_lines_in(path);
    free(path);
  }
  return total;
}

/* From a fresh storage and no run folders: `nas run spec`, killed with -9 after kill_ms,
 * then `nas run` again to the end, which continues the experiment (or starts it, when the
 * kill came before it was even created); `nas resume` is the same loop, tested elsewhere. */
static void run_killed_then_again(fixture *f, const char *spec, long kill_ms, int run) {
  char *db;
  assert_true(asprintf(&db, "%s/nas.db", f->dir) > 0);
  unlink(db);
  free(db);
  test_rmtree_child(f->dir, "runs");
  pid_t pid = start_nas_run(f, spec);
  nas_sleep_ms(kill_ms);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("run %d: second nas run exited %d: %s", run, rc, out);
  free(out);
}

static void kill_9_at_random_moments_then_resume_keeps_the_budget_exactly(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "crash.yaml",
                          "name: crash\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'sleep 0.{x}; echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 6, parallel: 3}\n"
                          "optimizer: {type: random}\n");
  unsigned seed = 20261123;
  for (int run = 0; run < 20; run++) {
    run_killed_then_again(f, spec, 50 + (long)(rand_r(&seed) % 900), run);
    json_t *rows = trials_json(f, "crash");
    assert_int_equal(json_array_size(rows), 6);
    assert_int_equal(count_status(rows, "completed"), 6);
    size_t i, j;
    json_t *a, *b;
    json_array_foreach(rows, i, a) {
      json_array_foreach(rows, j, b) if (i < j) assert_true(num(a, "x") != num(b, "x"));
      assert_true(num(a, "y") == num(a, "x"));
      long long number = (long long)json_integer_value(json_object_get(a, "trial"));
      assert_int_equal(metric_lines(f->dir, number), 1); /* ran once, not twice */
    }
    json_decref(rows);
  }
  free(spec);
}

/* Lines of the file at path (0 when it is missing), each under 64 bytes, into lines[]. */
static size_t read_lines(const char *path, char lines[][64], size_t cap) {
  FILE *in = fopen(path, "r");
  if (!in) return 0;
  size_t n = 0;
  while (n < cap && fgets(lines[n], 64, in)) n++;
  fclose(in);
  return n;
}

/* The spec `name` of random search over x in [0, 1] minimising y, whose trials run script
 * in sh after appending "number first epochs" (NAS_TRIAL_NUMBER, NAS_FIRST_EPOCH,
 * NAS_EPOCHS) to a ledger, *ledger (owned) its path; more: the rest of the spec. */
static char *ledger_spec(fixture *f, const char *name, const char *script, const char *more,
                         char **ledger) {
  char *text, *file;
  assert_true(asprintf(ledger, "%s/ledger", f->dir) > 0);
  assert_true(asprintf(&text,
                       "name: %s\n"
                       "parameters: {x: {type: float, low: 0, high: 1}}\n"
                       "objectives: [{name: y, goal: minimize}]\n"
                       "trial: {command: [sh, -c, 'echo $NAS_TRIAL_NUMBER $NAS_FIRST_EPOCH "
                       "$NAS_EPOCHS >> %s; %s']}\n"
                       "optimizer: {type: random}\n%s",
                       name, *ledger, script, more) > 0);
  assert_true(asprintf(&file, "%s.yaml", name) > 0);
  char *spec = test_write(f->dir, file, text);
  free(file);
  free(text);
  return spec;
}

/* How many of a ledger's lines [from, to) record a run of trial number from epoch first to
 * epochs ("number first epochs"). */
static int runs_in(char lines[][64], size_t from, size_t to, int number, int first, int epochs) {
  char run[64];
  snprintf(run, sizeof run, "%d %d %d\n", number, first, epochs);
  int seen = 0;
  for (size_t i = from; i < to; i++) seen += strcmp(lines[i], run) == 0;
  return seen;
}

/* Hyperband from 1 to 3 epochs, eta 3: trials 0-2 train 1 epoch each, then the best (the
 * lowest y = x) trains on from epoch 1 to 3. Each run of a trial appends "number first
 * epochs" to a ledger. Killed with -9 at random moments and run again, the experiment ends
 * with exactly those four runs: no rung run twice, none skipped, the right trial promoted. */
static void kill_9_between_rungs_then_resume_runs_each_rung_once(void **state) {
  fixture *f = *state;
  char *ledger;
  char *spec = ledger_spec(f, "crash", "sleep 0.3; echo \"nas-metric {{\\\"y\\\": {x}}}\"",
                           "budget: {trials: 3, parallel: 3}\n"
                           "multi_fidelity: {kind: hyperband, min_epochs: 1, "
                           "max_epochs: 3, eta: 3}\n",
                           &ledger);
  unsigned seed = 20261126;
  for (int run = 0; run < 10; run++) {
    unlink(ledger);
    run_killed_then_again(f, spec, 100 + (long)(rand_r(&seed) % 700), run);
    json_t *rows = trials_json(f, "crash");
    assert_int_equal(json_array_size(rows), 3);
    assert_int_equal(count_status(rows, "completed"), 3);
    int best = 0;
    for (int t = 1; t < 3; t++)
      if (num(row_of(rows, t), "x") < num(row_of(rows, best), "x")) best = t;
    char lines[8][64];
    size_t n = read_lines(ledger, lines, 8);
    if (n != 4) fail_msg("run %d: %zu trial runs, not 4", run, n);
    for (int t = 0; t < 3; t++) assert_int_equal(runs_in(lines, 0, n, t, 0, 1), 1);
    assert_int_equal(runs_in(lines, 3, 4, best, 1, 3), 1); /* after all of them, the best */
    json_decref(rows);
  }
  free(spec);
  free(ledger);
}

/* Hyperband from 1 to 8 epochs, eta 2: bracket 3 runs trials 0-7 for 1 epoch and would
 * keep 4 of them for rung 1. Trials 0-2 fail and 3-4 break the constraint, so the three
 * that can go on (5-7) all train on to 2 epochs, and the best of them then to 4: a rung
 * with too few contenders still lets the bracket go on. */
static void rung_with_fewer_contenders_than_its_share_promotes_them_and_goes_on(void **state) {
  fixture *f = *state;
  char *ledger;
  char *spec = ledger_spec(f, "few",
                           "n=$NAS_TRIAL_NUMBER; [ $n -lt 3 ] && exit 1; y={x}; "
                           "[ $n -lt 5 ] && y=2; echo \"nas-metric {{\\\"y\\\": $y}}\"",
                           "constraints: ['y <= 1']\n"
                           "budget: {trials: 8, parallel: 8, max_failure_rate: 1}\n"
                           "multi_fidelity: {kind: hyperband, min_epochs: 1, "
                           "max_epochs: 8, eta: 2}\n",
                           &ledger);
  run_ok(f, spec);
  json_t *rows = trials_json(f, "few");
  assert_int_equal(json_array_size(rows), 8);
  int best = 5;
  for (int t = 6; t < 8; t++)
    if (num(row_of(rows, t), "x") < num(row_of(rows, best), "x")) best = t;
  char lines[16][64];
  size_t n = read_lines(ledger, lines, 16);
  if (n != 12) fail_msg("%zu trial runs, not 8 + 3 + 1", n);
  for (int t = 0; t < 8; t++) assert_int_equal(runs_in(lines, 0, 8, t, 0, 1), 1);
  for (int t = 5; t < 8; t++) /* every contender went on to rung 1 */
    assert_int_equal(runs_in(lines, 8, 11, t, 1, 2), 1);
  assert_int_equal(runs_in(lines, 11, 12, best, 2, 4), 1); /* then the best of them */
  json_decref(rows);
  free(spec);
  free(ledger);
}

/* The parameters of every trial, in trial order, as JSON text. */
static char *params_in_order(fixture *f, const char *name) {
  json_t *rows = trials_json(f, name), *params = json_array();
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    json_t *p = json_pack("[O, O]", json_object_get(row, "x1"), json_object_get(row, "x2"));
    json_array_append_new(params, p);
  }
  char *text = json_dumps(params, JSON_COMPACT);
  json_decref(params);
  json_decref(rows);
  return text;
}

/* With one trial at a time the GP's suggestions depend only on what storage holds, so a
 * run killed with -9 and resumed proposes exactly the trials an uninterrupted run does. */
static void suggestions_after_a_crash_are_those_without_it(void **state) {
  fixture *f = *state;
  char *bin = realpath(examples_bin(), NULL), *text;
  assert_non_null(bin);
  const char *templ = "name: %s\n"
                      "seed: 11\n"
                      "parameters: {x1: {type: float, low: 0, high: 1}, x2: {type: float, low: 0, high: 1}}\n"
                      "objectives: [{name: branin, goal: minimize}, {name: currin, goal: minimize}]\n"
                      "trial: {command: [sh, -c, 'sleep 0.1; exec %s/branin_currin --x1={x1} --x2={x2}']}\n"
                      "budget: {trials: 9}\n"
                      "optimizer: {type: gp, n_initial: 4}\n";
  assert_true(asprintf(&text, templ, "same", bin) > 0);
  char *whole = test_write(f->dir, "whole.yaml", text);
  free(text);
  run_ok(f, whole);
  char *expected = params_in_order(f, "same");
  /* The same experiment in a second storage, killed twice along the way. */
  char *second;
  assert_true(asprintf(&second, "sqlite:%s/second.db", f->dir) > 0);
  char *first_db = f->db;
  f->db = second;
  for (int kill_after_ms = 700; kill_after_ms <= 1400; kill_after_ms += 700) {
    pid_t pid = start_nas_run(f, whole);
    nas_sleep_ms(kill_after_ms);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  run_ok(f, whole);
  char *got = params_in_order(f, "same");
  assert_string_equal(got, expected);
  f->db = first_db;
  free(second), free(got), free(expected), free(whole), free(bin);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(lost_trial_is_retried_and_completes, setup, teardown),
      cmocka_unit_test_setup_teardown(silent_trial_is_retried_then_failed, setup, teardown),
      cmocka_unit_test_setup_teardown(too_many_failures_stop_the_run_with_status_4, setup, teardown),
      cmocka_unit_test_setup_teardown(the_failure_rate_stop_names_the_last_failure, setup, teardown),
      cmocka_unit_test_setup_teardown(trials_that_cannot_start_stop_the_run_at_max_failure_rate, setup, teardown),
      cmocka_unit_test_setup_teardown(resume_runs_the_rest_beside_a_trial_handed_out_by_ask, setup, teardown),
      cmocka_unit_test_setup_teardown(ask_for_more_than_a_finite_space_has_hands_out_what_is_left, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(nas_stop_leaves_a_trial_handed_out_by_ask_to_its_asker, setup, teardown),
      cmocka_unit_test_setup_teardown(nas_tell_refuses_a_trial_that_nas_run_runs, setup, teardown),
      cmocka_unit_test_setup_teardown(nas_stop_from_another_process_stops_the_run, setup, teardown),
      cmocka_unit_test_setup_teardown(resume_while_a_stopped_run_ends_is_told_to_wait, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(stop_after_the_scheduler_died_records_its_trials_stopped,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(early_stopping_ends_bad_trials_and_keeps_good_ones, setup, teardown),
      cmocka_unit_test_setup_teardown(kill_9_at_random_moments_then_resume_keeps_the_budget_exactly, setup, teardown),
      cmocka_unit_test_setup_teardown(kill_9_between_rungs_then_resume_runs_each_rung_once, setup, teardown),
      cmocka_unit_test_setup_teardown(
          rung_with_fewer_contenders_than_its_share_promotes_them_and_goes_on, setup, teardown),
      cmocka_unit_test_setup_teardown(suggestions_after_a_crash_are_those_without_it, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
