/* End-to-end: what a faulty trial can do to nas, and what it must not. The real bin/nas
 * with real trial processes and SQLite storage in a temporary folder. A trial's files are
 * untrusted input (a bad one fails that trial with the reason, never the scheduler), a
 * truncated log loses no metric, old failures do not stop a resumed run and can be
 * retried, early stopping judges what is reported per step, and a built-in trial whose
 * dataset or device is missing is refused before anything is stored. */
#include <sys/stat.h>

#include "common/common.h"
#include "tests/e2e.h"

/* The row of trial `number` in `nas trials` JSON. */
static const json_t *row_of(const json_t *rows, json_int_t number) {
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row)
    if (json_integer_value(json_object_get(row, "trial")) == number) return row;
  fail_msg("no trial %lld", (long long)number);
  return NULL;
}

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

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(malformed_run_folder_files_fail_only_their_trial),
      T(truncated_log_loses_no_metric_and_is_warned),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
