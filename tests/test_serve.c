/* End-to-end tests of `nas serve`: the real server on 127.0.0.1 and a random port, asked
 * with the curl program. Every endpoint answers what the CLI shows; specs posted as YAML
 * are checked like files; ask/tell drives an experiment over HTTP and from the shell;
 * tokens decide who may read and write; bad requests get the right status and a message;
 * --threads is checked. (PostgreSQL's default thread count: test_e2e_postgres.) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "tests/e2e.h"
#include "tests/serve.h"

/* Four quick trials of two objectives, each with an intermediate value. */
static const char quick_spec[] =
    "name: quick\n"
    "parameters: {x: {type: float, low: 0, high: 1}}\n"
    "objectives: [{name: y, goal: minimize}, {name: z, goal: minimize}]\n"
    "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}, \\\"step\\\": 1}}\"; echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": 1}}\"; echo out; echo err >&2']}\n"
    "optimizer: {type: sobol}\n"
    "budget: {trials: 4, parallel: 2}\n";

/* For ask and tell: no trial section is needed. */
static const char asked_spec[] =
    "name: asked\n"
    "parameters: {x: {type: float, low: 0, high: 1}}\n"
    "objectives: [{name: loss, goal: minimize}]\n"
    "optimizer: {type: sobol}\n"
    "budget: {trials: 3}\n";

static void start_or_fail(test_server *srv, fixture *f, const char *const *extra) {
  if (!test_server_start(srv, f->dir, f->db, extra)) {
    char *text = NULL;
    nas_err ignored;
    nas_read_file(srv->log, &text, NULL, &ignored);
    fail_msg("nas serve did not start: %s", text ? text : "(no log)");
  }
}

static json_t *get_ok(const test_server *srv, const char *path) {
  int code;
  json_t *reply = test_http(srv, "GET", path, NULL, NULL, &code);
  if (code != 200) fail_msg("GET %s: %d %s", path, code, json_dumps(reply, 0));
  return reply;
}

static void expect_status(const test_server *srv, const char *method, const char *path,
                          const char *body, const char *token, int want, const char *in_error) {
  int code;
  json_t *reply = test_http(srv, method, path, body, token, &code);
  const char *error = json_string_value(json_object_get(reply, "error"));
  if (code != want || (in_error && (!error || !strstr(error, in_error))))
    fail_msg("%s %s: wanted %d with '%s', got %d: %s", method, path, want,
             in_error ? in_error : "", code, json_dumps(reply, 0));
  json_decref(reply);
}

static void every_read_endpoint_answers_what_the_cli_shows(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "quick.yaml", quick_spec), *out;
  run_spec(f, spec);
  test_server srv;
  start_or_fail(&srv, f, NULL);
  json_t *list = get_ok(&srv, "/api/v1/experiments");
  json_t *exp = json_array_get(json_object_get(list, "experiments"), 0);
  assert_string_equal(json_string_value(json_object_get(exp, "name")), "quick");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(exp, "counts"), "completed")), 4);
  assert_string_equal(json_string_value(json_object_get(json_object_get(exp, "scheduler"), "state")), "none");
  json_decref(list);
  /* The front is the very answer of `nas pareto --format json`. */
  assert_int_equal(nas(f, &out, "pareto", "quick", "--format=json"), 0);
  json_t *cli = json_loads(out, 0, NULL), *http = get_ok(&srv, "/api/v1/experiments/quick/pareto");
  free(out);
  assert_true(json_equal(cli, http));
  json_decref(cli), json_decref(http);
  /* The summaries are the very answers of `nas status --format json` (it printed its table's
   * rows, with other names: "experiment", "state", "created", "scheduler": "none"). */
  const char *summaries[][2] = {{NULL, "/api/v1/experiments"}, {"quick", "/api/v1/experiments/quick"}};
  for (size_t k = 0; k < 2; k++) {
    assert_int_equal(nas(f, &out, "status", summaries[k][0], "--format=json"), 0);
    cli = json_loads(out, 0, NULL), http = get_ok(&srv, summaries[k][1]);
    if (!json_equal(cli, http)) fail_msg("nas status: %s\nGET %s: %s", out, summaries[k][1], json_dumps(http, 0));
    free(out);
    json_decref(cli), json_decref(http);
  }
  json_t *page = get_ok(&srv, "/api/v1/experiments/quick/trials?status=completed&offset=1&limit=2");
  assert_int_equal(json_integer_value(json_object_get(page, "total")), 4);
  assert_int_equal(json_array_size(json_object_get(page, "trials")), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(page, "trials"), 0), "number")), 1);
  json_decref(page);
  json_t *one = get_ok(&srv, "/api/v1/experiments/quick/trials/0");
  assert_true(json_is_real(json_object_get(json_object_get(one, "params"), "x")));
  assert_int_equal(json_array_size(json_object_get(json_object_get(one, "intermediate"), "y")), 1);
  assert_string_equal(json_string_value(json_object_get(one, "stdout_tail")) + strlen(json_string_value(json_object_get(one, "stdout_tail"))) - 4, "out\n");
  assert_string_equal(json_string_value(json_object_get(one, "stderr_tail")), "err\n");
  json_decref(one);
  expect_status(&srv, "GET", "/api/v1/experiments/nope", NULL, NULL, 404, "no experiment 'nope'");
  expect_status(&srv, "GET", "/api/v1/experiments/quick/trials/99", NULL, NULL, 404, "no trial 99");
  expect_status(&srv, "GET", "/api/v1/experiments/..%2F..%2Fetc/trials", NULL, NULL, 404, NULL);
  /* An escaped NUL is no end of the path (it was: this answered quick's summary, and the
   * log showed a path that was not asked for), nor of a query argument. */
  expect_status(&srv, "GET", "/api/v1/experiments/quick%00xyz/pareto", NULL, NULL, 404, NULL);
  expect_status(&srv, "GET", "/api/v1/experiments/quick/trials?status=completed%00x", NULL, NULL, 400, NULL);
  expect_status(&srv, "GET", "/api/v1/experiments/quick/trials?status=lost", NULL, NULL, 400, "not a trial status");
  /* Numbers are digits only: not trial " 1" nor "+1", nor ?limit=+2. */
  expect_status(&srv, "GET", "/api/v1/experiments/quick/trials/%201", NULL, NULL, 404, "not a trial number");
  expect_status(&srv, "GET", "/api/v1/experiments/quick/trials/+1", NULL, NULL, 404, "not a trial number");
  expect_status(&srv, "GET", "/api/v1/experiments/quick/trials?limit=%2B2", NULL, NULL, 400, "not a count");
  assert_int_equal(test_server_stop(&srv), 0);
  free(spec);
}

static void posted_spec_is_checked_like_a_file_and_bad_ones_store_nothing(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments", "name: bad\nparameters: {x: {type: floaty}}\n",
                NULL, 400, "request.yaml:2:");
  json_t *list = get_ok(&srv, "/api/v1/experiments");
  assert_int_equal(json_array_size(json_object_get(list, "experiments")), 0);
  json_decref(list);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, 201, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, 200, NULL);
  char *other = strdup(asked_spec);
  memcpy(strstr(other, "type: sobol"), "type: gp   ", 11);
  expect_status(&srv, "POST", "/api/v1/experiments", other, NULL, 409, "different spec");
  /* A password in the spec's storage line is never shown. */
  char *with_password = nas_asprintf("storage: postgresql://nas:s3cret-pw@127.0.0.1:1/db\n%s",
                                     strstr(asked_spec, "name: asked") + 0);
  memcpy(strstr(with_password, "name: asked"), "name: other", 11);
  expect_status(&srv, "POST", "/api/v1/experiments", with_password, NULL, 201, NULL);
  json_t *shown = get_ok(&srv, "/api/v1/experiments/other");
  assert_null(strstr(json_string_value(json_object_get(shown, "spec")), "s3cret-pw"));
  assert_non_null(strstr(json_string_value(json_object_get(shown, "spec")), "nas:***@"));
  json_decref(shown);
  free(with_password);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/stop", NULL, NULL, 200, NULL);
  json_t *one = get_ok(&srv, "/api/v1/experiments/asked");
  assert_string_equal(json_string_value(json_object_get(one, "status")), "stopped");
  json_decref(one);
  free(other);
  assert_int_equal(test_server_stop(&srv), 0);
}

/* A spec posted to the server is the server's folder's (docs/api.md): it is stored as the
 * file NAME.yaml there, so its relative paths (a command ./t.sh, the trials' working
 * folder) are that folder's for whoever runs it later, from wherever. */
static void posted_spec_keeps_the_servers_folder_for_a_later_resume(void **state) {
  fixture *f = *state;
  char *script = test_write(f->dir, "t.sh", "#!/bin/sh\necho 'nas-metric {\"y\": 1}'\n");
  chmod(script, 0755);
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments",
                "name: rel\n"
                "parameters: {x: {type: float, low: 0, high: 1}}\n"
                "objectives: [{name: y, goal: minimize}]\n"
                "trial: {command: [./t.sh]}\n"
                "budget: {trials: 1}\n",
                NULL, 201, NULL);
  json_t *one = get_ok(&srv, "/api/v1/experiments/rel");
  char *want = nas_asprintf("%s/rel.yaml", f->dir);
  assert_string_equal(json_string_value(json_object_get(one, "spec_path")), want);
  json_decref(one);
  assert_int_equal(test_server_stop(&srv), 0);
  char *elsewhere = nas_asprintf("%s/elsewhere", f->dir), *out;
  assert_int_equal(mkdir(elsewhere, 0755), 0);
  const char *resume[] = {test_nas_bin(), "resume", "rel", "--no-progress", "--storage", f->db, NULL};
  int rc = test_run(elsewhere, (char *const *)resume, &out);
  if (rc != 0) fail_msg("nas resume from another folder exited %d: %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, "rel");
  assert_int_equal(count_status(rows, "completed"), 1);
  json_decref(rows);
  free(elsewhere), free(want), free(script);
}

/* A trial may put anything in its run folder: a model.json that is a FIFO is no model
 * description, and reading the trial does not wait on it (a request thread waited for
 * ever, for a writer that never came). */
static void trial_whose_model_json_is_a_fifo_is_read_without_waiting(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "fifo.yaml",
                          "name: fifo\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'touch \"$NAS_RUN_DIR/weights.nasw\"; "
                          "mkfifo \"$NAS_RUN_DIR/model.json\"; echo \"nas-metric {{\\\"y\\\": 1}}\"']}\n"
                          "budget: {trials: 1}\n");
  run_spec(f, spec);
  test_server srv;
  start_or_fail(&srv, f, NULL);
  char *url = nas_asprintf("http://127.0.0.1:%d/api/v1/experiments/fifo/trials/0", srv.port), *out;
  const char *argv[] = {"curl", "-s", "-S", "-m", "10", url, NULL};
  int rc = test_run(NULL, (char *const *)argv, &out);
  if (rc != 0) fail_msg("GET %s: curl exited %d (a request that waits for ever?): %s", url, rc, out);
  json_t *one = json_loads(out, 0, NULL);
  const json_t *model = json_object_get(one, "model");
  assert_non_null(strstr(json_string_value(json_object_get(model, "weights")), "weights.nasw"));
  assert_true(json_is_null(json_object_get(model, "about")));
  json_decref(one);
  free(out), free(url), free(spec);
  assert_int_equal(test_server_stop(&srv), 0);
}

/* A stored spec that no longer loads (another version of nas wrote it, or the storage RPC
 * did) is one experiment's problem: the list still shows every other experiment, and that
 * one with its name, status and why. */
static void experiment_list_names_one_whose_spec_no_longer_loads_beside_the_others(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, 201, NULL);
  expect_status(&srv, "POST", "/api/v1/storage/experiment_create",
                "{\"name\": \"broken\", \"spec_text\": \"name: broken\\nfoo: 1\\n\", "
                "\"spec_path\": \"/nowhere/broken.yaml\", \"run_root\": \"/nowhere\"}",
                NULL, 200, NULL);
  json_t *list = get_ok(&srv, "/api/v1/experiments");
  const json_t *all = json_object_get(list, "experiments");
  assert_int_equal(json_array_size(all), 2);
  const json_t *good = json_array_get(all, 0), *broken = json_array_get(all, 1);
  assert_string_equal(json_string_value(json_object_get(good, "name")), "asked");
  assert_null(json_object_get(good, "error"));
  assert_string_equal(json_string_value(json_object_get(broken, "name")), "broken");
  assert_string_equal(json_string_value(json_object_get(broken, "status")), "running");
  assert_non_null(strstr(json_string_value(json_object_get(broken, "error")), "unknown key 'foo'"));
  /* `nas status --format json` lists it alike. */
  json_t *cli = nas_json(f, (char *[]){"status", "--format", "json", "--storage", f->db, NULL});
  assert_true(json_equal(cli, list));
  json_decref(cli);
  json_decref(list);
  expect_status(&srv, "GET", "/api/v1/experiments/broken", NULL, NULL, 500, "no longer loads");
  assert_int_equal(test_server_stop(&srv), 0);
}

/* A Slack webhook's URL is its secret: anyone who may read the experiment (a read token,
 * the dashboard) sees the spec with each webhook's URL cut after its host. */
static void webhook_urls_in_a_served_spec_show_only_their_host(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments",
                "name: hooked\n"
                "parameters: {x: {type: float, low: 0, high: 1}}\n"
                "objectives: [{name: loss, goal: minimize}]\n"
                "notify:\n"
                "  - {url: 'https://hooks.example.com/services/T0/B0/s3cr3t', format: slack}\n"
                "  - url: http://127.0.0.1:9/hook?token=s3cr3t\n"
                "budget: {trials: 3}\n",
                NULL, 201, NULL);
  json_t *one = get_ok(&srv, "/api/v1/experiments/hooked");
  const char *text = json_string_value(json_object_get(one, "spec"));
  assert_non_null(text);
  if (strstr(text, "s3cr3t")) fail_msg("the served spec holds a webhook's secret: %s", text);
  assert_non_null(strstr(text, "url: 'https://hooks.example.com/…'"));
  assert_non_null(strstr(text, "url: http://127.0.0.1:9/…"));
  json_decref(one);
  assert_int_equal(test_server_stop(&srv), 0);
}

static void ask_report_complete_and_fail_drive_an_experiment_over_http(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, 201, NULL);
  int code;
  json_t *asked = test_http(&srv, "POST", "/api/v1/experiments/asked/ask", "{\"n\": 2, \"worker\": \"gpu-7\"}", NULL, &code);
  assert_int_equal(code, 200);
  json_t *trials = json_object_get(asked, "trials");
  assert_int_equal(json_array_size(trials), 2);
  assert_true(json_is_real(json_object_get(json_object_get(json_array_get(trials, 0), "params"), "x")));
  json_decref(asked);
  json_t *reply = test_http(&srv, "POST", "/api/v1/experiments/asked/trials/0/report",
                            "{\"metrics\": {\"loss\": 0.5}, \"step\": 1}", NULL, &code);
  assert_int_equal(code, 200);
  assert_true(json_is_false(json_object_get(reply, "stop")));
  json_decref(reply);
  /* a step as a metric line's: below 2^53, with the same message */
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/0/report",
                "{\"metrics\": {\"loss\": 0.5}, \"step\": 9007199254740992}", NULL, 422,
                "\"step\" must be a whole number from 0 to 2^53 - 1 (9007199254740991)");
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/0/complete", "{\"metrics\": {\"loss\": 0.25}}", NULL, 200, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/1/complete", "{}", NULL, 422, "has not reported objective 'loss'");
  /* refused whole: sending the full set again stores "acc" once */
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/1/complete", "{\"metrics\": {\"acc\": 0.9}}", NULL, 422, "nothing was stored");
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/0/report", "{\"metrics\": {\"loss\": 9}}", NULL, 409, "is completed, not running");
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/1/fail", "{\"error\": \"out of memory on the GPU\"}", NULL, 200, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/1/report", "{\"metrics\": {\"loss\": \"high\"}}", NULL, 422, "not a number");
  /* the checks of a metric line: a standard error is never negative */
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/1/report", "{\"metrics\": {\"loss_sem\": -0.1}}", NULL, 422, "loss_sem");
  expect_status(&srv, "POST", "/api/v1/experiments/asked/trials/7/heartbeat", NULL, NULL, 404, "no trial 7");
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "{\"n\": 0}", NULL, 422, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "{\"n\": 5}", NULL, 200, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", NULL, NULL, 409, "spent its budget");
  json_t *one = get_ok(&srv, "/api/v1/experiments/asked/trials/1");
  assert_string_equal(json_string_value(json_object_get(one, "error")), "out of memory on the GPU");
  assert_string_equal(json_string_value(json_object_get(one, "job_id")), "ask:gpu-7");
  assert_null(json_object_get(json_object_get(one, "metrics"), "acc"));
  json_decref(one);
  assert_int_equal(test_server_stop(&srv), 0);
}

/* The attempt of trial 0 the ask answered with. */
static json_int_t asked_attempt(const test_server *srv) {
  int code;
  json_t *asked = test_http(srv, "POST", "/api/v1/experiments/silent/ask", "{}", NULL, &code);
  assert_int_equal(code, 200);
  json_t *trial = json_array_get(json_object_get(asked, "trials"), 0);
  assert_int_equal(json_integer_value(json_object_get(trial, "number")), 0);
  json_int_t attempt = json_integer_value(json_object_get(trial, "attempt"));
  json_decref(asked);
  return attempt;
}

/* An asker whose trial went silent and was handed out again told it complete afterwards:
 * the trial's new attempt ended completed with the old attempt's values (and its reports
 * and heartbeats went into the new attempt's learning curve and kept it alive). The ask
 * answers each trial's attempt; a report, heartbeat, complete or fail naming one the trial
 * no longer runs is a 409 naming both, and stores nothing; without one (older clients) it
 * tells whichever runs. */
static void a_tell_of_an_attempt_handed_out_again_is_refused(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments",
                "name: silent\n"
                "parameters: {x: {type: float, low: 0, high: 1}}\n"
                "objectives: [{name: loss, goal: minimize}]\n"
                "trial: {heartbeat_timeout: 0.2, max_attempts: 3}\n"
                "budget: {trials: 1}\n", NULL, 201, NULL);
  assert_int_equal(asked_attempt(&srv), 1);
  usleep(400 * 1000); /* silent past heartbeat_timeout: the next ask hands it out again */
  assert_int_equal(asked_attempt(&srv), 2);
  const char *trial0 = "/api/v1/experiments/silent/trials/0";
  char *complete = nas_asprintf("%s/complete", trial0), *fail = nas_asprintf("%s/fail", trial0);
  char *report = nas_asprintf("%s/report", trial0), *heartbeat = nas_asprintf("%s/heartbeat", trial0);
  expect_status(&srv, "POST", report, "{\"metrics\": {\"loss\": 5}, \"step\": 0, \"attempt\": 1}", NULL,
                409, "trial 0 of 'silent' runs attempt 2, not attempt 1");
  expect_status(&srv, "POST", heartbeat, "{\"attempt\": 1}", NULL, 409, "runs attempt 2, not attempt 1");
  expect_status(&srv, "POST", heartbeat, "{\"attempt\": -1}", NULL, 422, "\"attempt\" must be an integer >= 1");
  expect_status(&srv, "POST", complete, "{\"metrics\": {\"loss\": 1}, \"attempt\": 1}", NULL, 409,
                "trial 0 of 'silent' runs attempt 2, not attempt 1");
  expect_status(&srv, "POST", fail, "{\"attempt\": 1}", NULL, 409, "runs attempt 2, not attempt 1");
  expect_status(&srv, "POST", fail, "{\"attempt\": 3}", NULL, 409, "not attempt 3, which was never handed out");
  expect_status(&srv, "POST", complete, "{\"attempt\": 0}", NULL, 422, "\"attempt\" must be an integer >= 1");
  expect_status(&srv, "POST", fail, "{\"attempt\": \"2\"}", NULL, 422, "\"attempt\" must be an integer >= 1");
  json_t *trial = get_ok(&srv, trial0);
  assert_string_equal(json_string_value(json_object_get(trial, "status")), "running");
  assert_null(json_object_get(json_object_get(trial, "metrics"), "loss")); /* nothing stored */
  assert_true(json_is_null(json_object_get(trial, "heartbeat_at"))); /* nor kept alive */
  json_decref(trial);
  expect_status(&srv, "POST", heartbeat, "{\"attempt\": 2}", NULL, 200, NULL);
  expect_status(&srv, "POST", report, "{\"metrics\": {\"loss\": 3}, \"step\": 0, \"attempt\": 2}", NULL, 200, NULL);
  expect_status(&srv, "POST", complete, "{\"metrics\": {\"loss\": 2}, \"attempt\": 2}", NULL, 200, NULL);
  trial = get_ok(&srv, trial0);
  assert_string_equal(json_string_value(json_object_get(trial, "status")), "completed");
  assert_true(json_number_value(json_object_get(json_object_get(trial, "metrics"), "loss")) == 2);
  json_decref(trial);
  free(complete), free(fail), free(report), free(heartbeat);
  assert_int_equal(test_server_stop(&srv), 0);
}

static void shell_loop_drives_ask_and_tell_without_a_server(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec), *out;
  nas_ok(f, "create", spec, NULL);
  for (int i = 0; i < 3; i++) {
    const char *ask[] = {test_nas_bin(), "ask", "asked", "--format", "json", "--storage", f->db, NULL};
    assert_int_equal(test_run(f->dir, (char *const *)ask, &out), 0);
    json_t *rows = json_loads(out, 0, NULL);
    free(out);
    assert_int_equal(json_array_size(rows), 1);
    char number[16], attempt[16], metric[64];
    snprintf(number, sizeof number, "%lld", (long long)json_integer_value(json_object_get(json_array_get(rows, 0), "trial")));
    snprintf(attempt, sizeof attempt, "%lld", (long long)json_integer_value(json_object_get(json_array_get(rows, 0), "attempt")));
    snprintf(metric, sizeof metric, "loss=%g", json_number_value(json_object_get(json_array_get(rows, 0), "x")));
    json_decref(rows);
    const char *tell[] = {test_nas_bin(), "tell", "asked", number, "--attempt", attempt, "--complete", metric, "--storage", f->db, NULL};
    assert_int_equal(test_run(f->dir, (char *const *)tell, &out), 0);
    free(out);
  }
  assert_int_equal(nas(f, &out, "ask", "asked", NULL), 1);
  assert_non_null(strstr(out, "spent its budget"));
  free(out);
  json_t *rows = trials_json(f, "asked");
  assert_int_equal(count_status(rows, "completed"), 3);
  json_decref(rows);
  free(spec);
}

static void spec_without_a_trial_section_is_for_ask_and_tell_only(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec), *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 1);
  assert_non_null(strstr(out, "nothing for 'nas run' to launch"));
  free(out);
  assert_int_equal(nas(f, &out, "status", NULL, NULL), 1); /* nothing was stored: no database */
  free(out);
  nas_ok(f, "create", spec, NULL);
  assert_int_equal(nas(f, &out, "resume", "asked", "--no-progress"), 1);
  assert_non_null(strstr(out, "nothing for 'nas run' to launch"));
  /* named by the experiment: the stored spec has no file (it said "<string>: …") */
  assert_non_null(strstr(out, "nas: experiment 'asked': the spec's trial section runs nothing"));
  free(out);
  free(spec);
}

/* An ask-and-tell experiment stopped goes on once its spec is stored again (`nas create`,
 * POST /experiments): it could never hand out a trial again, and `nas stop` pointed at
 * `nas resume`, which refuses a spec that runs nothing. */
static void a_stopped_ask_and_tell_experiment_is_opened_again_by_create(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec), *out;
  nas_ok(f, "create", spec, NULL);
  assert_int_equal(nas(f, &out, "stop", "asked", NULL), 0);
  if (strstr(out, "nas resume") || !strstr(out, "'nas create ")) fail_msg("stop said: %s", out);
  free(out);
  assert_int_equal(nas(f, &out, "ask", "asked", NULL), 1);
  /* it said only "is stopped; nothing is handed out", not what opens it again */
  char *said = nas_asprintf("experiment 'asked' is stopped; nothing is handed out until its "
                            "spec is stored again, which opens it ('nas create %s', or POST "
                            "/api/v1/experiments)", spec);
  if (!strstr(out, said)) fail_msg("ask said: %s", out);
  free(said);
  free(out);
  nas_ok(f, "create", spec, NULL);
  nas_ok(f, "ask", "asked", NULL);

  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/stop", NULL, NULL, 200, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "{}", NULL, 409, "is stopped");
  int code;
  json_t *summary = test_http(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, &code);
  assert_int_equal(code, 200);
  assert_string_equal(json_string_value(json_object_get(summary, "status")), "running");
  json_decref(summary);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "{}", NULL, 200, NULL);
  assert_int_equal(test_server_stop(&srv), 0);
  free(spec);
}

/* Trials queued again (`nas retry`) or by hand (`nas enqueue`) in an ask-and-tell
 * experiment are handed out by the next ask, as the hints now say: they named `nas resume`,
 * which refuses a spec that runs nothing. */
static void queued_trials_of_an_ask_and_tell_experiment_are_hinted_to_nas_ask(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec), *out;
  nas_ok(f, "create", spec, NULL);
  nas_ok(f, "ask", "asked", NULL);
  char *fail[] = {(char *)test_nas_bin(), "tell", "asked", "0", "--fail", "broke", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, fail, &out), 0);
  free(out);
  char *retry[] = {(char *)test_nas_bin(), "retry", "asked", "--failed", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, retry, &out), 0);
  if (!strstr(out, "run them with: nas ask asked") || strstr(out, "nas resume")) fail_msg("retry said: %s", out);
  free(out);
  char *enqueue[] = {(char *)test_nas_bin(), "enqueue", "asked", "x=0.5", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, enqueue, &out), 0);
  if (!strstr(out, "run it with: nas ask asked") || strstr(out, "nas resume")) fail_msg("enqueue said: %s", out);
  free(out);
  char *ask[] = {(char *)test_nas_bin(), "ask", "asked", "-n", "2", "--format", "csv", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, ask, &out), 0);
  assert_non_null(strstr(out, "\n0,2,")); /* the retried trial, its second attempt, */
  assert_non_null(strstr(out, "\n1,1,0.5\n")); /* and the one enqueued */
  free(out);
  free(spec);
}

/* `nas create` stores the experiment where the spec's storage: says, as `nas run` does,
 * unless --storage or NAS_STORAGE says otherwise. */
static void create_stores_where_the_spec_storage_section_says(void **state) {
  fixture *f = *state;
  char *text = nas_asprintf("storage: sqlite:elsewhere.db\n%s", asked_spec);
  char *spec = test_write(f->dir, "asked.yaml", text), *out;
  const char *create[] = {test_nas_bin(), "create", spec, NULL};
  assert_int_equal(test_run(f->dir, (char *const *)create, &out), 0);
  free(out);
  char *db = nas_asprintf("%s/elsewhere.db", f->dir), *absent = nas_asprintf("%s/nas.db", f->dir);
  assert_int_equal(access(db, F_OK), 0);
  assert_int_equal(access(absent, F_OK), -1);
  const char *ask[] = {test_nas_bin(), "ask", "asked", "--storage", "sqlite:elsewhere.db", NULL};
  assert_int_equal(test_run(f->dir, (char *const *)ask, &out), 0);
  free(out);
  free(db), free(absent), free(spec), free(text);
}

static void tokens_decide_who_may_read_and_write(void **state) {
  fixture *f = *state;
  const char *reader = "r0000000000000000000000000000000000000001";
  const char *writer = "w0000000000000000000000000000000000000002";
  char *text = nas_asprintf("# tokens\nread %s\nwrite %s\n", reader, writer);
  char *tokens = test_write(f->dir, "tokens", text);
  chmod(tokens, 0644);
  const char *extra[] = {"--token-file", tokens, NULL};
  test_server srv;
  assert_false(test_server_start(&srv, f->dir, f->db, extra));
  free(srv.log);
  chmod(tokens, 0600);
  start_or_fail(&srv, f, extra);
  expect_status(&srv, "GET", "/api/v1/experiments", NULL, NULL, 401, "Authorization");
  expect_status(&srv, "GET", "/api/v1/experiments", NULL, "wrong", 401, "not valid");
  expect_status(&srv, "GET", "/api/v1/experiments", NULL, reader, 200, NULL);
  /* The scheme is case-insensitive, as HTTP says of every authentication scheme. */
  char *lower = nas_asprintf("Authorization: bearer  %s", reader);
  int code;
  json_decref(test_http_with(&srv, "GET", "/api/v1/experiments", NULL, (const char *const[]){lower, NULL}, &code));
  assert_int_equal(code, 200);
  free(lower);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, reader, 403, "only read");
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, writer, 201, NULL);
  char *path = strdup(srv.log);
  assert_int_equal(test_server_stop(&srv), 0);
  /* No token ever reaches the log. */
  char *log = NULL;
  nas_err ignored;
  assert_int_equal(nas_read_file(path, &log, NULL, &ignored), NAS_OK);
  assert_null(strstr(log, reader));
  assert_null(strstr(log, writer));
  free(log), free(path), free(text), free(tokens);
}

static void malformed_and_oversized_requests_get_clear_errors(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, 201, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "{bad", NULL, 400, "not JSON");
  /* a body cut short is wrong where it ends, just past its last character */
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "{\"n\": 2,\n", NULL, 400,
                "at line 2 column 1");
  expect_status(&srv, "POST", "/api/v1/experiments/asked/ask", "[1]", NULL, 400, "JSON object");
  expect_status(&srv, "DELETE", "/api/v1/experiments", NULL, NULL, 405, "not allowed");
  expect_status(&srv, "GET", "/api/v2/anything", NULL, NULL, 404, "no such endpoint");
  char *big = malloc(5u << 20);
  memset(big, 'a', (5u << 20) - 1);
  big[(5u << 20) - 1] = '\0';
  char *file = test_write(f->dir, "big.json", big);
  char *at_file = nas_asprintf("@%s", file);
  expect_status(&srv, "POST", "/api/v1/experiments", at_file, NULL, 413, "larger than");
  free(big), free(file), free(at_file);
  assert_int_equal(test_server_stop(&srv), 0);
}

/* The status of `curl -X POST --data-binary @file` and how much of the file it sent. */
static int post_file(const test_server *srv, const char *path, const char *file, long *sent) {
  char *url = nas_asprintf("http://127.0.0.1:%d%s", srv->port, path);
  char *at_file = nas_asprintf("@%s", file);
  const char *argv[] = {"curl", "-s", "-S", "-o", "/dev/null", "-w", "%{http_code} %{size_upload}",
                        "-X", "POST", "--data-binary", at_file, url, NULL};
  char *out;
  assert_int_equal(test_run(NULL, (char *const *)argv, &out), 0);
  int code = 0;
  assert_int_equal(sscanf(out, "%d %ld", &code, sent), 2);
  free(out), free(url), free(at_file);
  return code;
}

/* Tokens sent over plain HTTP can be read on the network: a server with a token file
 * that listens beyond loopback without TLS says so; on loopback it says nothing. */
static void tokens_over_plain_http_beyond_loopback_are_warned_of(void **state) {
  fixture *f = *state;
  char *tokens = test_write(f->dir, "tokens", "write w0000000000000000000000000000000000000002\n");
  chmod(tokens, 0600);
  const char *const extra[] = {"--token-file", tokens, NULL};
  const char *const listens[] = {"0.0.0.0:0", "127.0.0.1:0"};
  for (size_t i = 0; i < 2; i++) {
    test_server srv;
    if (!test_server_start_on(&srv, f->dir, f->db, listens[i], extra))
      fail_msg("nas serve --listen %s did not start", listens[i]);
    char *log = NULL;
    nas_err ignored;
    assert_int_equal(nas_read_file(srv.log, &log, NULL, &ignored), NAS_OK);
    bool warned = strstr(log, "tokens cross the network in clear text") != NULL;
    if (warned != (i == 0)) fail_msg("--listen %s: %s", listens[i], log);
    free(log);
    assert_int_equal(test_server_stop(&srv), 0);
  }
  free(tokens);
}

static void refused_requests_are_answered_before_their_body_is_read(void **state) {
  fixture *f = *state;
  char *tokens = test_write(f->dir, "tokens", "write w0000000000000000000000000000000000000002\n");
  chmod(tokens, 0600);
  test_server srv;
  start_or_fail(&srv, f, (const char *const[]){"--token-file", tokens, NULL});
  char *body = malloc(3u << 20);
  memset(body, 'a', (3u << 20) - 1);
  body[(3u << 20) - 1] = '\0';
  char *file = test_write(f->dir, "body.json", body);
  long sent = -1;
  /* curl waits for "100 Continue" before a large body; a server that reads the body of a
   * client it refuses asks for it. */
  assert_int_equal(post_file(&srv, "/api/v1/experiments/asked/ask", file, &sent), 401);
  assert_int_equal(sent, 0);
  assert_int_equal(test_server_stop(&srv), 0);
  free(body), free(file), free(tokens);
}

static void pages_of_other_sites_cannot_drive_the_api(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  int code;
  /* A form or fetch() on another site, sent by the user's browser. */
  json_t *reply = test_http_with(&srv, "POST", "/api/v1/experiments", asked_spec,
                                 (const char *const[]){"Origin: http://evil.example", NULL}, &code);
  assert_int_equal(code, 403);
  assert_non_null(strstr(json_string_value(json_object_get(reply, "error")), "another site"));
  json_decref(reply);
  /* A page whose own name was made to resolve to 127.0.0.1 (DNS rebinding). */
  char *evil_host = nas_asprintf("Host: evil.example:%d", srv.port);
  reply = test_http_with(&srv, "GET", "/api/v1/experiments", NULL,
                         (const char *const[]){evil_host, NULL}, &code);
  assert_int_equal(code, 403);
  assert_non_null(strstr(json_string_value(json_object_get(reply, "error")), "addressed to"));
  json_decref(reply);
  reply = get_ok(&srv, "/api/v1/experiments");
  assert_int_equal(json_array_size(json_object_get(reply, "experiments")), 0);
  json_decref(reply);
  /* The server's own pages, and loopback names. */
  char *own = nas_asprintf("Origin: http://127.0.0.1:%d", srv.port);
  char *localhost = nas_asprintf("Host: localhost:%d", srv.port);
  char *own_localhost = nas_asprintf("Origin: http://localhost:%d", srv.port);
  reply = test_http_with(&srv, "POST", "/api/v1/experiments", asked_spec,
                         (const char *const[]){own, NULL}, &code);
  assert_int_equal(code, 201);
  json_decref(reply);
  reply = test_http_with(&srv, "GET", "/api/v1/experiments", NULL,
                         (const char *const[]){localhost, own_localhost, NULL}, &code);
  assert_int_equal(code, 200);
  json_decref(reply);
  assert_int_equal(test_server_stop(&srv), 0);
  free(evil_host), free(own), free(localhost), free(own_localhost);
}

/* The status line and headers of `curl -X METHOD` on path (HEAD: `curl -I`). */
static char *headers_of(const test_server *srv, const char *method, const char *path) {
  char *url = nas_asprintf("http://127.0.0.1:%d%s", srv->port, path), *out;
  char *argv[11] = {"curl", "-s", "-S", "-o", "/dev/null", "-D", "-", url, "-X", (char *)method, NULL};
  if (strcmp(method, "HEAD") == 0) argv[8] = "-I", argv[9] = NULL;
  assert_int_equal(test_run(NULL, argv, &out), 0);
  free(url);
  return out;
}

static void answers_are_never_sniffed_or_framed_by_another_site(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  static const char *const paths[] = {"/", "/static/app.js", "/api/v1/experiments", "/api/v1/nothing"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    char *head = headers_of(&srv, "GET", paths[i]);
    if (!strcasestr(head, "X-Content-Type-Options: nosniff") ||
        !strcasestr(head, "X-Frame-Options: DENY") ||
        !strcasestr(head, "Content-Security-Policy: frame-ancestors 'none'"))
      fail_msg("%s: %s", paths[i], head);
    free(head);
  }
  assert_int_equal(test_server_stop(&srv), 0);
}

/* HEAD is GET without the body on every GET endpoint (it was 405, so `curl -I` and health
 * checks saw an error), and a 405 names the methods the path takes (Allow, as HTTP says). */
static void head_answers_as_get_and_405_says_what_is_allowed(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "POST", "/api/v1/experiments", asked_spec, NULL, 201, NULL);
  char *head = headers_of(&srv, "HEAD", "/api/v1/experiments/asked");
  if (strncmp(head, "HTTP/1.1 200", 12) != 0 || !strcasestr(head, "Content-Type: application/json"))
    fail_msg("HEAD: %s", head);
  free(head);
  head = headers_of(&srv, "HEAD", "/api/v1/experiments/nope");
  if (strncmp(head, "HTTP/1.1 404", 12) != 0) fail_msg("HEAD of no experiment: %s", head);
  free(head);
  head = headers_of(&srv, "DELETE", "/api/v1/experiments");
  if (strncmp(head, "HTTP/1.1 405", 12) != 0 || !strcasestr(head, "Allow: GET, HEAD, POST\r\n"))
    fail_msg("DELETE: %s", head);
  free(head);
  head = headers_of(&srv, "GET", "/api/v1/experiments/asked/ask");
  if (strncmp(head, "HTTP/1.1 405", 12) != 0 || !strcasestr(head, "Allow: POST\r\n"))
    fail_msg("GET of ask: %s", head);
  free(head);
  assert_int_equal(test_server_stop(&srv), 0);
}

static void a_newline_in_a_path_cannot_forge_a_log_line(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f, NULL);
  expect_status(&srv, "GET", "/api/v1/experiments/x%0AGET%20/forged%20200", NULL, NULL, 404, NULL);
  /* Nor can a control character in the method (an escape sequence for the terminal that
   * shows the log). */
  expect_status(&srv, "G\033[2JET", "/api/v1/experiments", NULL, NULL, 405, NULL);
  char *path = strdup(srv.log);
  assert_int_equal(test_server_stop(&srv), 0);
  char *log = NULL;
  nas_err ignored;
  assert_int_equal(nas_read_file(path, &log, NULL, &ignored), NAS_OK);
  assert_non_null(strstr(log, "/api/v1/experiments/x%0AGET /forged 200 404"));
  assert_null(strstr(log, "\nGET /forged"));
  assert_non_null(strstr(log, "\nG%1B[2JET /api/v1/experiments 405"));
  free(log), free(path);
}

/* The log of a server started with extra arguments, read while it runs. */
static char *log_of_server_with(fixture *f, const char *const *extra) {
  test_server srv;
  start_or_fail(&srv, f, extra);
  char *text = NULL;
  nas_err err;
  assert_int_equal(nas_read_file(srv.log, &text, NULL, &err), NAS_OK);
  assert_int_equal(test_server_stop(&srv), 0);
  return text;
}

static void threads_are_four_on_sqlite_unless_told_and_bad_counts_are_refused(void **state) {
  fixture *f = *state;
  char *log = log_of_server_with(f, NULL);
  assert_non_null(strstr(log, "nas serve: 4 request threads\n"));
  free(log);
  log = log_of_server_with(f, (const char *const[]){"--threads", "7", NULL});
  assert_non_null(strstr(log, "nas serve: 7 request threads\n"));
  free(log);
  static const char *const bad[] = {"0", "65", "-3", "8x", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *argv[] = {test_nas_bin(), "serve", "--threads", bad[i], "--listen", "127.0.0.1:0", NULL};
    char *out = NULL;
    assert_int_equal(test_run(f->dir, (char *const *)argv, &out), 2);
    if (!strstr(out, "--threads wants a count from 1 to 64")) fail_msg("'%s': %s", bad[i], out);
    free(out);
  }
}

/* `nas serve ARGS…` exits 1 within seconds, saying want (the test fails if it hangs). */
static void serve_refuses(fixture *f, const char *const *args, const char *want) {
  const char *argv[16] = {"timeout", "20", test_nas_bin(), "serve", "--listen", "127.0.0.1:0"};
  size_t n = 6;
  while (*args && n < 15) argv[n++] = *args++;
  char *out = NULL;
  int rc = test_run(f->dir, (char *const *)argv, &out);
  if (rc != 1 || !strstr(out, want)) fail_msg("exit %d (want 1), output without '%s': %s", rc, want, out);
  free(out);
}

/* A server that cannot listen (its port taken) says so and nothing else: no summary of
 * writes it never served ("0 writes committed in 0 transactions" came first). */
static void a_port_in_use_is_refused_without_a_summary_of_writes(void **state) {
  fixture *f = *state;
  int taken = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof at;
  assert_true(taken >= 0);
  assert_int_equal(bind(taken, (struct sockaddr *)&at, sizeof at), 0);
  assert_int_equal(listen(taken, 1), 0);
  assert_int_equal(getsockname(taken, (struct sockaddr *)&at, &len), 0);
  char *listen_at = nas_asprintf("127.0.0.1:%d", ntohs(at.sin_port));
  const char *argv[] = {"timeout", "20", test_nas_bin(), "serve", "--listen", listen_at, NULL};
  char *out = NULL;
  int rc = test_run(f->dir, (char *const *)argv, &out);
  close(taken);
  if (rc != 1 || !strstr(out, "cannot listen") || strstr(out, "writes committed"))
    fail_msg("exit %d (want 1): %s", rc, out);
  free(out);
  free(listen_at);
}

/* A port that is no port is refused: getaddrinfo kept the low 16 bits of any number, so
 * --listen 127.0.0.1:99999 listened on port 34463. */
static void a_listen_port_past_65535_is_refused(void **state) {
  fixture *f = *state;
  static const char *const bad[] = {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1",
                                    "127.0.0.1:80x", "127.0.0.1: 80", "127.0.0.1:99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    serve_refuses(f, (const char *const[]){"--listen", bad[i], NULL},
                  "the port must be a number from 0 to 65535");
}

/* HTTPS with files that cannot be a certificate and its key is refused at once, saying
 * which file and why: no more than 1 MiB is read (/dev/zero filled the memory), a FIFO
 * without a writer is empty (it waited for ever), a file without a PEM block is named, and
 * a pair that libmicrohttpd cannot use says so (it said "cannot listen: No such file or
 * directory"). A token file that is such a FIFO is empty too. */
static void tls_and_token_files_that_cannot_serve_are_refused_saying_why(void **state) {
  fixture *f = *state;
  char *garbage = test_write(f->dir, "garbage.pem", "not a certificate\n");
  char *bad = test_write(f->dir, "bad.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  char *fifo = nas_asprintf("%s/fifo", f->dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  serve_refuses(f, (const char *const[]){"--tls-cert", "/dev/zero", "--tls-key", garbage, NULL},
                "--tls-cert: /dev/zero: larger than 1048576 bytes");
  serve_refuses(f, (const char *const[]){"--tls-cert", bad, "--tls-key", fifo, NULL},
                "--tls-key: ");
  serve_refuses(f, (const char *const[]){"--tls-cert", garbage, "--tls-key", bad, NULL},
                "holds no PEM block ('-----BEGIN …')");
  serve_refuses(f, (const char *const[]){"--tls-cert", bad, "--tls-key", bad, NULL},
                "cannot serve HTTPS");
  serve_refuses(f, (const char *const[]){"--token-file", fifo, NULL}, "holds no token");
  /* A folder was "may be read by others (mode 755); make it private: chmod 600", and a
   * missing file "cannot be read", without why. */
  char *folder = nas_asprintf("%s/tokens", f->dir), *missing = nas_asprintf("%s/none", f->dir);
  assert_int_equal(mkdir(folder, 0755), 0);
  serve_refuses(f, (const char *const[]){"--token-file", folder, NULL}, "tokens: a folder, not a token file");
  serve_refuses(f, (const char *const[]){"--token-file", missing, NULL}, "none: No such file or directory");
  free(folder), free(missing);
  free(garbage), free(bad), free(fifo);
}

/* Options that cannot serve are refused before the storage is opened: a mistyped --listen
 * or a --tls-cert without its key created an empty nas.db in the folder, and the server
 * said it served this machine with 4 request threads before saying it could not. */
static void options_that_cannot_serve_are_refused_before_storage_is_opened(void **state) {
  fixture *f = *state;
  static const char *const bad[][3] = {
      {"--listen", "localhost8470", "expected HOST:PORT"},
      {"--listen", "127.0.0.1:99999", "the port must be a number"},
      {"--tls-cert", "cert.pem", "--tls-cert and --tls-key go together"}};
  char *db = nas_asprintf("%s/nas.db", f->dir);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *argv[] = {"timeout", "20", test_nas_bin(), "serve", bad[i][0], bad[i][1], NULL};
    char *out = NULL;
    int rc = test_run(f->dir, (char *const *)argv, &out);
    if (rc != 1 || !strstr(out, bad[i][2]) || strstr(out, "request threads") ||
        strstr(out, "serving clients") || access(db, F_OK) == 0)
      fail_msg("%s %s: exit %d (want 1), %s created: %s", bad[i][0], bad[i][1], rc,
               access(db, F_OK) == 0 ? "nas.db" : "nothing", out);
    free(out);
  }
  free(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(every_read_endpoint_answers_what_the_cli_shows, setup, teardown),
      cmocka_unit_test_setup_teardown(posted_spec_is_checked_like_a_file_and_bad_ones_store_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(posted_spec_keeps_the_servers_folder_for_a_later_resume, setup, teardown),
      cmocka_unit_test_setup_teardown(trial_whose_model_json_is_a_fifo_is_read_without_waiting, setup, teardown),
      cmocka_unit_test_setup_teardown(experiment_list_names_one_whose_spec_no_longer_loads_beside_the_others, setup, teardown),
      cmocka_unit_test_setup_teardown(webhook_urls_in_a_served_spec_show_only_their_host, setup, teardown),
      cmocka_unit_test_setup_teardown(ask_report_complete_and_fail_drive_an_experiment_over_http, setup, teardown),
      cmocka_unit_test_setup_teardown(a_tell_of_an_attempt_handed_out_again_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(shell_loop_drives_ask_and_tell_without_a_server, setup, teardown),
      cmocka_unit_test_setup_teardown(spec_without_a_trial_section_is_for_ask_and_tell_only, setup, teardown),
      cmocka_unit_test_setup_teardown(create_stores_where_the_spec_storage_section_says, setup, teardown),
      cmocka_unit_test_setup_teardown(a_stopped_ask_and_tell_experiment_is_opened_again_by_create, setup, teardown),
      cmocka_unit_test_setup_teardown(queued_trials_of_an_ask_and_tell_experiment_are_hinted_to_nas_ask, setup, teardown),
      cmocka_unit_test_setup_teardown(tokens_decide_who_may_read_and_write, setup, teardown),
      cmocka_unit_test_setup_teardown(malformed_and_oversized_requests_get_clear_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(threads_are_four_on_sqlite_unless_told_and_bad_counts_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(tokens_over_plain_http_beyond_loopback_are_warned_of, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(refused_requests_are_answered_before_their_body_is_read, setup, teardown),
      cmocka_unit_test_setup_teardown(pages_of_other_sites_cannot_drive_the_api, setup, teardown),
      cmocka_unit_test_setup_teardown(a_newline_in_a_path_cannot_forge_a_log_line, setup, teardown),
      cmocka_unit_test_setup_teardown(head_answers_as_get_and_405_says_what_is_allowed, setup, teardown),
      cmocka_unit_test_setup_teardown(answers_are_never_sniffed_or_framed_by_another_site, setup, teardown),
      cmocka_unit_test_setup_teardown(a_port_in_use_is_refused_without_a_summary_of_writes, setup, teardown),
      cmocka_unit_test_setup_teardown(a_listen_port_past_65535_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(tls_and_token_files_that_cannot_serve_are_refused_saying_why, setup, teardown),
      cmocka_unit_test_setup_teardown(options_that_cannot_serve_are_refused_before_storage_is_opened, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
