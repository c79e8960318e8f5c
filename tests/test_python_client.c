/* End-to-end tests of the Python client (clients/python/nas_client.py) and its example
 * training loop (examples/python/), with the python3 on PATH: the client's own unittest
 * suite against real `nas serve` processes; the example asking a server for trials until
 * the budget is handed out, its curves and final values in storage; and the same example as
 * the trial command of `nas run`. */
#include "tests/e2e.h"
#include "tests/serve.h"

/* Runs argv in dir (NULL: here); fails the test with its output unless it exits 0. */
static void run_ok(const char *dir, const char *const *argv) {
  char *out;
  int rc = test_run(dir, (char *const *)argv, &out);
  if (rc != 0) fail_msg("%s %s exited with %d:\n%s", argv[0], argv[1], rc, out);
  free(out);
}

/* Copies examples/python/name into dir; returns the owned path of the copy. */
static char *copy_example(const char *dir, const char *name) {
  char *from = nas_asprintf("examples/python/%s", name), *text;
  nas_err err;
  if (nas_read_file(from, &text, NULL, &err) != NAS_OK) fail_msg("%s", err.msg);
  char *to = test_write(dir, name, text);
  free(from), free(text);
  return to;
}

static void client_unittests_pass_against_live_servers(void **state) {
  (void)state;
  /* The suite starts servers of its own, in its own folders, from any current folder. */
  char *bin = realpath(test_nas_bin(), NULL);
  assert_non_null(bin);
  setenv("NAS_BIN", bin, 1);
  setenv("PYTHONDONTWRITEBYTECODE", "1", 1);  /* no __pycache__ in the checkout */
  const char *argv[] = {"python3", "-m", "unittest", "discover", "-s", "clients/python", "-v", NULL};
  run_ok(NULL, argv);
  free(bin);
}

/* The length of the val_loss curve of trial number and its last step. */
static size_t curve_of(const test_server *srv, json_int_t number, json_int_t *last_step) {
  char *path = nas_asprintf("/api/v1/experiments/python-example/trials/%lld", (long long)number);
  int code;
  json_t *trial = test_http(srv, "GET", path, NULL, NULL, &code);
  assert_int_equal(code, 200);
  assert_string_equal(json_string_value(json_object_get(trial, "job_id")), "ask:c-test");
  json_t *curve = json_object_get(json_object_get(trial, "intermediate"), "val_loss");
  size_t n = json_array_size(curve);
  assert_true(n > 0);
  *last_step = json_integer_value(json_array_get(json_array_get(curve, n - 1), 0));
  json_decref(trial);
  free(path);
  return n;
}

static void example_loop_asks_the_server_until_the_budget_is_handed_out(void **state) {
  fixture *f = *state;
  test_server srv;
  if (!test_server_start(&srv, f->dir, f->db, NULL)) fail_msg("nas serve did not start (%s)", srv.log);
  char *spec = copy_example(f->dir, "spec.yaml"), *text, *out;
  nas_err err;
  assert_int_equal(nas_read_file(spec, &text, NULL, &err), NAS_OK);
  int code;
  json_decref(test_http(&srv, "POST", "/api/v1/experiments", text, NULL, &code));
  assert_int_equal(code, 201);
  char *loop = realpath("examples/python/train_loop.py", NULL);
  char *url = nas_asprintf("http://127.0.0.1:%d", srv.port);
  /* Two trials, then the rest of the budget from a second run of the loop. */
  const char *two[] = {"python3", loop, "--url", url, "--worker", "c-test", "--trials", "2", NULL};
  run_ok(f->dir, two);
  json_t *rows = trials_json(f, "python-example");
  assert_int_equal(json_array_size(rows), 2);
  json_decref(rows);
  const char *rest[] = {"python3", loop, "--url", url, "--worker", "c-test", NULL};
  run_ok(f->dir, rest);
  rows = trials_json(f, "python-example");
  assert_int_equal(json_array_size(rows), 12);
  size_t completed = count_status(rows, "completed"), stopped = count_status(rows, "stopped");
  assert_int_equal(completed + stopped, 12);
  assert_true(completed > 0 && stopped > 0);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    json_int_t last_step;
    size_t points = curve_of(&srv, json_integer_value(json_object_get(row, "trial")), &last_step);
    const char *status = json_string_value(json_object_get(row, "status"));
    assert_true(num(row, "val_loss") > 0 && num(row, "accuracy") > 0.5);
    if (strcmp(status, "completed") == 0) {
      assert_int_equal(points, 12);
      assert_int_equal(last_step, 12);
    } else {
      /* The loop reported nothing after the step that stopped the trial. */
      char *verdict = nas_asprintf("stopped early at step %lld:", (long long)last_step);
      assert_non_null(strstr(json_string_value(json_object_get(row, "error")), verdict));
      assert_true(points < 12);
      free(verdict);
    }
  }
  json_decref(rows);
  assert_int_equal(nas(f, &out, "ask", "python-example", NULL), 1);
  assert_non_null(strstr(out, "spent its budget"));
  assert_int_equal(test_server_stop(&srv), 0);
  free(out), free(url), free(loop), free(text), free(spec);
}

static void example_loop_runs_as_the_trial_command_of_nas_run(void **state) {
  fixture *f = *state;
  char *spec = copy_example(f->dir, "spec.yaml"), *loop = copy_example(f->dir, "train_loop.py");
  const char *argv[] = {test_nas_bin(), "run", spec, "--storage", f->db, "--no-progress", NULL};
  run_ok(f->dir, argv);
  json_t *rows = trials_json(f, "python-example");
  assert_int_equal(json_array_size(rows), 12);
  assert_int_equal(count_status(rows, "completed") + count_status(rows, "stopped"), 12);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) assert_true(num(row, "val_loss") > 0 && num(row, "accuracy") > 0.5);
  json_decref(rows);
  free(spec), free(loop);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(client_unittests_pass_against_live_servers),
      cmocka_unit_test_setup_teardown(example_loop_asks_the_server_until_the_budget_is_handed_out, setup, teardown),
      cmocka_unit_test_setup_teardown(example_loop_runs_as_the_trial_command_of_nas_run, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
