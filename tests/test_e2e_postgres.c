/* End-to-end on PostgreSQL: every command of the real bin/nas against a throwaway server
 * this test starts (tests/pgserver.h) — run with trials reporting through stdout and
 * `nas report`, a built-in trial through `nas worker`, then trials, pareto, status, stop
 * and resume — with a password in the URL that must never be printed. */
#include <libpq-fe.h>

#include "tests/e2e.h"
#include "tests/pgserver.h"

typedef struct {
  pgserver srv;
  bool up;
} group;

static int group_setup(void **state) {
  group *g = calloc(1, sizeof *g);
  char why[512];
  g->up = pgserver_start(&g->srv, why, sizeof why) == 0;
  if (!g->up) {
    fprintf(stderr, "\n*** POSTGRESQL NOT STARTED: %s\n*** These tests %s.\n\n", why,
            pgserver_required() ? "FAIL (CI=true)" : "are SKIPPED");
    if (pgserver_required()) return -1;
  }
  *state = g;
  return 0;
}

static int group_teardown(void **state) {
  group *g = *state;
  if (g->up) pgserver_stop(&g->srv);
  free(g);
  return 0;
}

static void every_command_works_on_postgresql(void **state) {
  group *g = *state;
  if (!g->up) skip();
  fixture *f;
  setup((void **)&f);
  free(f->db);
  f->db = pgserver_url(&g->srv, "postgres", "s3cret-pw");
  char *spec = test_write(
      f->dir, "pg.yaml",
      "name: pg\n"
      "parameters:\n"
      "  x: {type: float, low: 0, high: 1}\n"
      "  how: {type: categorical, choices: [stdout, report]}\n"
      "objectives: [{name: y, goal: minimize}, {name: z, goal: maximize}]\n"
      "trial:\n"
      "  command: [sh, -c, 'if [ {how} = stdout ]; then echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": {x}}}\";"
      " else \"$NAS_BIN\" report y={x} z={x}; fi']\n"
      "budget: {trials: 6, parallel: 3}\n");
  setenv("NAS_BIN", test_nas_bin(), 1);
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  assert_null(strstr(out, "s3cret-pw"));
  free(out);
  json_t *rows = trials_json(f, "pg");
  assert_int_equal(json_array_size(rows), 6);
  assert_int_equal(count_status(rows, "completed"), 6);
  json_decref(rows);
  assert_int_equal(nas(f, &out, "pareto", "pg", "--format=json"), 0);
  assert_non_null(strstr(out, "\"hypervolume\""));
  free(out);
  assert_int_equal(nas(f, &out, "status", "pg", NULL), 0);
  assert_non_null(strstr(out, "finished"));
  assert_null(strstr(out, "s3cret-pw"));
  free(out);
  /* A built-in trial: the scheduler starts `nas worker`, which stores its own metrics. */
  char *builtin = test_write(f->dir, "builtin.yaml",
                             "name: pgbuiltin\n"
                             "parameters: {width: {type: int, low: 8, high: 16}}\n"
                             "objectives: [{name: accuracy, goal: maximize}, {name: params, goal: minimize}]\n"
                             "trial: {builtin: {model: mlp, dataset: digits, epochs: 1, layers: 1}}\n"
                             "budget: {trials: 1}\n");
  rc = nas(f, &out, "run", builtin, "--no-progress");
  if (rc != 0) fail_msg("built-in run exited %d: %s", rc, out);
  free(out);
  rows = trials_json(f, "pgbuiltin");
  assert_int_equal(count_status(rows, "completed"), 1);
  assert_true(num(json_array_get(rows, 0), "latency_ms_p50") > 0);
  json_decref(rows);
  /* stop and resume: a stopped experiment continues to its budget. */
  assert_int_equal(nas(f, &out, "stop", "pg", NULL), 0);
  free(out);
  assert_int_equal(nas(f, &out, "resume", "pg", "--no-progress"), 0);
  free(out);
  free(spec), free(builtin);
  teardown((void **)&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_command_works_on_postgresql),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
