/* End-to-end: what a faulty trial can do to nas, and what it must not. The real bin/nas
 * with real trial processes and SQLite storage in a temporary folder. A trial's files are
 * untrusted input (a bad one fails that trial with the reason, never the scheduler), a
 * truncated log loses no metric, old failures do not stop a resumed run and can be
 * retried, early stopping judges what is reported per step, and a built-in trial whose
 * dataset or device is missing is refused before anything is stored. */
#include <sys/stat.h>

#include "common/common.h"
#include "tests/e2e.h"

static const char *text_of(const json_t *row, const char *key) {
  const char *text = json_string_value(json_object_get(row, key));
  if (!text) fail_msg("no %s in trial %lld", key, (long long)json_integer_value(json_object_get(row, "trial")));
  return text;
}

/* Trial 0 writes a malformed exit.json while it runs (the runner's own replaces it), 1 makes
 * exit.json a folder (so nothing can record its end), 2 and 3 put a folder and a FIFO in
 * place of stdout.log before printing their metric. The run goes on; each trial ends
 * with what its files allow. */
static void malformed_run_folder_files_fail_only_their_trial(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "files.yaml",
                          "name: files\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'd=$NAS_RUN_DIR; case $NAS_TRIAL_NUMBER in\n"
                          "    0) printf \"garbage{{\" > $d/exit.json;;\n"
                          "    1) mkdir $d/exit.json;;\n"
                          "    2) rm $d/stdout.log; mkdir $d/stdout.log;;\n"
                          "    3) rm $d/stdout.log; mkfifo $d/stdout.log;;\n"
                          "  esac; sleep 0.6; echo \"nas-metric {{\\\"y\\\": 1}}\"']\n"
                          "budget: {trials: 4, parallel: 2, max_failure_rate: 1}\n"
                          "optimizer: {type: random}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  assert_non_null(strstr(out, "cannot read its log"));
  free(out);
  json_t *rows = trials_json(f, "files");
  assert_int_equal(json_array_size(rows), 4);
  assert_string_equal(text_of(row_of(rows, 0), "status"), "completed");
  assert_true(num(row_of(rows, 0), "y") == 1);
  assert_string_equal(text_of(row_of(rows, 1), "status"), "failed");
  assert_non_null(strstr(text_of(row_of(rows, 1), "error"), "exit.json is not a regular file"));
  for (int t = 2; t <= 3; t++) {
    assert_string_equal(text_of(row_of(rows, t), "status"), "failed");
    const char *error = text_of(row_of(rows, t), "error");
    assert_non_null(strstr(error, "its log could not be read"));
    assert_non_null(strstr(error, "not a regular file"));
  }
  json_decref(rows);
  free(spec);
}

/* The trial reports at step 1, waits to be read, cuts its log and reports its final value
 * in fewer bytes than were read before the cut. */
static void truncated_log_loses_no_metric_and_is_warned(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "cut.yaml",
                          "name: cut\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'printf \"%0300d\\n\" 0;"
                          " echo \"nas-metric {{\\\"z\\\": 1, \\\"step\\\": 1}}\"; sleep 1;"
                          " : > $NAS_RUN_DIR/stdout.log; echo \"nas-metric {{\\\"y\\\": 2}}\"']\n"
                          "budget: {trials: 1}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  assert_non_null(strstr(out, "truncated its log"));
  free(out);
  json_t *rows = trials_json(f, "cut");
  assert_string_equal(text_of(row_of(rows, 0), "status"), "completed");
  assert_true(num(row_of(rows, 0), "y") == 2);
  assert_true(num(row_of(rows, 0), "z") == 1); /* read before the cut, kept */
  json_decref(rows);
  free(spec);
}

/* Every malformed metric line is counted in the warning: the first one is named with its
 * byte offset and what is wrong, and the others of the same look are counted after it (the
 * warning used to name the first alone, as if it were the only one). */
static void malformed_metric_lines_are_warned_with_their_count(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "bad.yaml",
                          "name: bad\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [printf, 'nas-metric {{\"y\": NaN}}\\nnas-metric [1]\\n"
                          "nas-metric {{}}\\nnas-metric {{\"y\": 2}}\\n']\n"
                          "budget: {trials: 1}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  if (!strstr(out, "stdout.log, byte 0: metric \"y\" is NaN, not a finite number (and 2 more "
                   "malformed metric lines)"))
    fail_msg("no count of the malformed lines in: %s", out);
  free(out);
  json_t *rows = trials_json(f, "bad");
  assert_true(num(row_of(rows, 0), "y") == 2);
  json_decref(rows);
  free(spec);
}

/* A trial that reported its objective only as NaN (a diverged run) fails for the malformed
 * line, not with a hint to print the line it printed. */
static void objective_reported_only_malformed_fails_naming_the_line(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "nan.yaml",
                          "name: nan\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [printf, 'nas-metric {{\"y\": NaN}}\\nnas-metric [1]\\n']\n"
                          "budget: {trials: 1}\n");
  nas_ok(f, "run", spec, "--no-progress");
  json_t *rows = trials_json(f, "nan");
  const char *error = text_of(row_of(rows, 0), "error");
  if (!strstr(error, "exited 0 without reporting objective 'y'") ||
      !strstr(error, "2 malformed metric lines were not recorded, the first: ") ||
      !strstr(error, "stdout.log, byte 0: metric \"y\" is NaN, not a finite number"))
    fail_msg("error: %s", error);
  json_decref(rows);
  free(spec);
}

/* Runs `nas ARGS` (no --storage added) in the fixture folder; returns the exit status. */
static int nas_argv(fixture *f, char **out, char *const *args) {
  char *argv[16] = {(char *)test_nas_bin()};
  size_t n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n++] = "--storage", argv[n++] = f->db, argv[n] = NULL;
  return test_run(f->dir, argv, out);
}

/* The trial fails while the file `broken` exists: the first run stops on the failure rate,
 * the fixed trial's resume spends the rest of the budget (old failures do not count in
 * the new run), and `nas retry` queues the failed ones for one more resume that runs them
 * as the same trials: the budget of 10 is kept throughout. */
static void fixed_trial_resumes_past_old_failures_and_retry_reruns_them(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "flaky.yaml",
                          "name: flaky\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'if [ -e broken ]; then exit 3; fi;"
                          " echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 10, parallel: 1}\n"
                          "optimizer: {type: random}\n");
  free(test_write(f->dir, "broken", ""));
  char *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 4);
  free(out);
  json_t *rows = trials_json(f, "flaky");
  assert_int_equal(count_status(rows, "failed"), 5);
  json_decref(rows);
  test_rmtree_child(f->dir, "broken");

  int rc = nas(f, &out, "resume", "flaky", "--no-progress");
  if (rc != 0) fail_msg("resume exited %d: %s", rc, out);
  free(out);
  rows = trials_json(f, "flaky");
  assert_int_equal(json_array_size(rows), 10);
  assert_int_equal(count_status(rows, "completed"), 5);
  json_decref(rows);

  assert_int_equal(nas_argv(f, &out, (char *[]){"retry", "flaky", "7", NULL}), 1);
  assert_non_null(strstr(out, "trial 7 of 'flaky' is completed"));
  free(out);
  assert_int_equal(nas_argv(f, &out, (char *[]){"retry", "flaky", "0", "42", NULL}), 1);
  assert_non_null(strstr(out, "no trial 42"));
  free(out);
  assert_int_equal(nas_argv(f, &out, (char *[]){"retry", "flaky", NULL}), 2);
  free(out);
  assert_int_equal(nas_argv(f, &out, (char *[]){"retry", "flaky", "0", NULL}), 0);
  free(out);
  assert_int_equal(nas_argv(f, &out, (char *[]){"retry", "flaky", "--failed", NULL}), 0);
  assert_non_null(strstr(out, "4 trials queued"));
  free(out);
  rows = trials_json(f, "flaky");
  assert_int_equal(count_status(rows, "queued"), 5);
  json_decref(rows);

  rc = nas(f, &out, "resume", "flaky", "--no-progress");
  if (rc != 0) fail_msg("resume exited %d: %s", rc, out);
  free(out);
  rows = trials_json(f, "flaky");
  assert_int_equal(json_array_size(rows), 10);
  assert_int_equal(count_status(rows, "completed"), 10);
  json_decref(rows);
  char *second;
  assert_true(asprintf(&second, "%s/runs/flaky/0.2/stdout.log", f->dir) > 0);
  struct stat sb;
  assert_int_equal(stat(second, &sb), 0); /* the retry was its second attempt */
  free(second);
  free(spec);
}

/* Command trials that report their objective only at the end: the rule has nothing to
 * judge, and once min_trials trials have completed `nas run` says so. */
static void early_stopping_with_nothing_to_judge_is_warned(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "blind.yaml",
                          "name: blind\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'sleep 0.7; echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 6, parallel: 1}\n"
                          "early_stopping: {rule: median, min_trials: 2}\n"
                          "optimizer: {type: random}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  assert_non_null(strstr(out, "early_stopping can never stop a trial"));
  assert_non_null(strstr(out, "none reported a judged objective with a step"));
  free(out);
  free(spec);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(malformed_run_folder_files_fail_only_their_trial),
      T(truncated_log_loses_no_metric_and_is_warned),
      T(malformed_metric_lines_are_warned_with_their_count),
      T(objective_reported_only_malformed_fails_naming_the_line),
      T(fixed_trial_resumes_past_old_failures_and_retry_reruns_them),
      T(early_stopping_with_nothing_to_judge_is_warned),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
