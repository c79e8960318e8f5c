/* End-to-end tests of the http storage backend (storage/http.c) against a real `nas serve`
 * on 127.0.0.1: every client command through --storage http:// and NAS_STORAGE, built-in
 * trials reporting through the server, many clients at once, a server killed with -9 and
 * restarted under load (each report stored exactly once), tokens, unknown experiments,
 * copy, rename and delete, a server out of reach, and a nas run that loses its server (it
 * names the trials it leaves running). (tests/test_storage.c also runs the whole shared
 * storage suite through a server.) */
#include <inttypes.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include "storage/storage.h"
#include "tests/e2e.h"
#include "tests/pgserver.h"
#include "tests/serve.h"

static const char asked_spec[] =
    "name: asked\n"
    "parameters: {x: {type: float, low: 0, high: 1}}\n"
    "objectives: [{name: loss, goal: minimize}]\n"
    "trial: {command: [echo, unused]}\n"
    "optimizer: {type: sobol}\n"
    "budget: {trials: 3}\n";

/* Clients of the load tests, and the reports each makes (one observation per request).
 * Each report is one SQLite commit with its fsync behind the server, some 500 a second on
 * a small shared machine: 200 reports a client keep the test near 15 s (`make bench-serve`
 * runs 32 clients of 500). */
enum { LOAD_CLIENTS = 32, LOAD_REPORTS = 200, KILL_REPORTS = 150 };

static void start_or_fail(test_server *srv, const char *dir, const char *db, const char *listen,
                          const char *const *extra) {
  if (!test_server_start_on(srv, dir, db, listen, extra)) {
    char *text = NULL;
    nas_err ignored;
    nas_read_file(srv->log, &text, NULL, &ignored);
    fail_msg("nas serve did not start: %s", text ? text : "(no log)");
  }
}

static char *server_url(const test_server *srv) {
  return nas_asprintf("http://127.0.0.1:%d", srv->port);
}

static storage *open_or_fail(const char *url) {
  storage *st = NULL;
  nas_err err = {{0}};
  if (storage_open(url, &st, &err) != NAS_OK) fail_msg("open %s: %s", url, err.msg);
  return st;
}

/* `nas ARGV…` in the fixture's folder (ARGV NULL-terminated); the exit status. */
static int nas_argv(fixture *f, char **out, const char *const *args) {
  const char *argv[16] = {test_nas_bin()};
  size_t n = 1;
  while (args[n - 1] && n < 15) argv[n] = args[n - 1], n++;
  argv[n] = NULL;
  return test_run(f->dir, (char *const *)argv, out);
}

static void assert_contains(const char *text, const char *part) {
  if (!text) fail_msg("nothing to look for \"%s\" in", part);
  if (!strstr(text, part)) fail_msg("\"%s\" does not contain \"%s\"", text, part);
}

/* The id of trial `number` of experiment `name`. */
static int64_t trial_id_of(storage *st, const char *name, int number) {
  experiment_row exp;
  trial_row *rows;
  size_t n;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, name, &exp, &err), NAS_OK);
  assert_int_equal(storage_trial_list(st, exp.id, &rows, &n, &err), NAS_OK);
  int64_t id = -1;
  for (size_t i = 0; i < n; i++)
    if (rows[i].number == number) id = rows[i].id;
  trial_rows_free(rows, n);
  experiment_row_clear(&exp);
  assert_true(id >= 0);
  return id;
}

/* ---- client commands ------------------------------------------------------------------------- */

/* What `nas CMD NAME` prints with the storage at url. */
static char *shown_by(fixture *f, const char *cmd, const char *name, const char *url) {
  char *out;
  const char *args[] = {cmd, name, "--storage", url, NULL};
  if (!name) args[1] = "--storage", args[2] = url, args[3] = NULL;
  int rc = nas_argv(f, &out, args);
  if (rc != 0) fail_msg("nas %s exited %d: %s", cmd, rc, out);
  return out;
}

static void every_client_command_works_through_the_server(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv), *spec = test_write(f->dir, "asked.yaml", asked_spec), *out;
  const char *create[] = {"create", spec, "--storage", url, NULL};
  assert_int_equal(nas_argv(f, &out, create), 0);
  free(out);
  const char *ask[] = {"ask", "asked", "-n", "2", "--storage", url, NULL};
  if (nas_argv(f, &out, ask) != 0) fail_msg("nas ask: %s", out);
  free(out);
  const char *tell[] = {"tell", "asked", "0", "--complete", "loss=0.25", "--storage", url, NULL};
  if (nas_argv(f, &out, tell) != 0) fail_msg("nas tell: %s", out);
  free(out);
  /* A trial's own `nas report`, finding the storage in NAS_STORAGE. */
  storage *st = open_or_fail(url);
  char id[32];
  snprintf(id, sizeof id, "%" PRId64, trial_id_of(st, "asked", 1));
  storage_close(st);
  setenv("NAS_STORAGE", url, 1);
  setenv("NAS_TRIAL_ID", id, 1);
  const char *report[] = {"report", "loss=0.5", "--step", "3", NULL};
  int rc = nas_argv(f, &out, report);
  unsetenv("NAS_STORAGE");
  unsetenv("NAS_TRIAL_ID");
  if (rc != 0) fail_msg("nas report: %s", out);
  free(out);
  /* Every read command shows the same through the server as on the database itself. */
  const char *const reads[][2] = {{"status", NULL}, {"trials", "asked"}, {"pareto", "asked"}};
  for (size_t i = 0; i < sizeof reads / sizeof *reads; i++) {
    char *direct = shown_by(f, reads[i][0], reads[i][1], f->db);
    char *served = shown_by(f, reads[i][0], reads[i][1], url);
    assert_string_equal(served, direct);
    free(direct), free(served);
  }
  json_t *rows = trials_json(f, "asked");
  assert_int_equal(count_status(rows, "completed"), 1);
  assert_int_equal(count_status(rows, "running"), 1);
  json_decref(rows);
  assert_int_equal(test_server_stop(&srv), 0);
  free(url), free(spec);
}

/* Runs `nas ARGV…` and fails the test with its output unless it exits 0. */
static void nas_argv_ok(fixture *f, const char *const *args) {
  char *out;
  if (nas_argv(f, &out, args) != 0) fail_msg("nas %s: %s", args[0], out);
  free(out);
}

/* The trials of experiment `name` in the database itself; NAS_ENOTFOUND when it is gone. */
static int stored_trials(fixture *f, const char *name, size_t *n) {
  storage *st = open_or_fail(f->db);
  experiment_row exp;
  trial_row *rows = NULL;
  nas_err err;
  *n = 0;
  int rc = storage_experiment_get(st, name, &exp, &err);
  if (rc == NAS_OK) assert_int_equal(storage_trial_list(st, exp.id, &rows, n, &err), NAS_OK);
  if (rc == NAS_OK) experiment_row_clear(&exp);
  trial_rows_free(rows, *n);
  storage_close(st);
  return rc;
}

static void copy_rename_and_delete_work_through_the_server(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv), *spec = test_write(f->dir, "asked.yaml", asked_spec);
  nas_argv_ok(f, (const char *[]){"create", spec, "--storage", url, NULL});
  nas_argv_ok(f, (const char *[]){"ask", "asked", "-n", "2", "--storage", url, NULL});
  for (int i = 0; i < 2; i++)
    nas_argv_ok(f, (const char *[]){"tell", "asked", i ? "1" : "0", "--complete", "loss=0.5",
                                    "--storage", url, NULL});
  nas_argv_ok(f, (const char *[]){"copy", "asked", "copied", "--storage", url, NULL});
  nas_argv_ok(f, (const char *[]){"rename", "copied", "renamed", "--storage", url, NULL});
  size_t n;
  assert_int_equal(stored_trials(f, "copied", &n), NAS_ENOTFOUND);
  assert_int_equal(stored_trials(f, "renamed", &n), NAS_OK);
  assert_int_equal(n, 2);
  json_t *rows = trials_json(f, "renamed");
  assert_int_equal(count_status(rows, "completed"), 2);
  json_decref(rows);
  nas_argv_ok(f, (const char *[]){"delete", "renamed", "--yes", "--storage", url, NULL});
  assert_int_equal(stored_trials(f, "renamed", &n), NAS_ENOTFOUND);
  assert_int_equal(stored_trials(f, "asked", &n), NAS_OK);
  assert_int_equal(n, 2);
  assert_int_equal(test_server_stop(&srv), 0);
  free(url), free(spec);
}

/* ---- built-in trials --------------------------------------------------------------------------- */

/* Copies the digits data next to a built-in spec of `trials` trials; the spec's path. */
static char *digits_spec(fixture *f, int trials) {
  const char *data = getenv("NAS_DATA_DIR");
  char *from = nas_asprintf("%s/digits.csv.gz", data ? data : "tests/data");
  char *copy[] = {"cp", from, f->dir, NULL};
  assert_int_equal(test_run(NULL, copy, NULL), 0);
  free(from);
  char *text = nas_asprintf("name: digits\n"
                            "parameters:\n  width: {type: int, low: 8, high: 16}\n"
                            "objectives: [{name: accuracy, goal: maximize}]\n"
                            "trial:\n  builtin: {model: mlp, dataset: ./digits.csv.gz, epochs: 1,"
                            " limit_train: 200}\n"
                            "budget: {trials: %d}\n", trials);
  char *spec = test_write(f->dir, "digits.yaml", text);
  free(text);
  return spec;
}

/* Observations of experiment `name` named metric at step, read from the database itself. */
static size_t stored_count(fixture *f, const char *name, const char *metric, int64_t step) {
  storage *st = open_or_fail(f->db);
  experiment_row exp;
  metric_row *rows;
  size_t n, count = 0;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, name, &exp, &err), NAS_OK);
  assert_int_equal(storage_metrics_list(st, exp.id, &rows, &n, &err), NAS_OK);
  for (size_t i = 0; i < n; i++) count += strcmp(rows[i].name, metric) == 0 && rows[i].step == step;
  metric_rows_free(rows, n);
  experiment_row_clear(&exp);
  storage_close(st);
  return count;
}

/* `nas run` with its storage behind the server: the scheduler, and the workers it starts
 * with NAS_STORAGE set to the server's URL, all go through it. */
static void nas_run_and_its_builtin_workers_report_through_the_server(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv), *spec = digits_spec(f, 2), *out;
  const char *run[] = {"run", spec, "--no-progress", "--storage", url, NULL};
  if (nas_argv(f, &out, run) != 0) fail_msg("nas run: %s", out);
  free(out);
  json_t *rows = trials_json(f, "digits");
  assert_int_equal(count_status(rows, "completed"), 2);
  json_decref(rows);
  assert_int_equal(stored_count(f, "digits", "accuracy", METRIC_FINAL), 2);
  assert_int_equal(test_server_stop(&srv), 0);
  free(url), free(spec);
}

/* Observations in the backlog of backlog_is_stored_once_through_the_server: some 5 MiB as
 * one report, more than the 4 MiB a request may hold. */
enum { BACKLOG_OBS = 120000 };

/* Whether experiment `name` in storage db holds metric `metric` at each step 0..n-1
 * exactly once. */
static bool each_step_stored_once(const char *db, const char *name, const char *metric,
                                  size_t n) {
  storage *st = open_or_fail(db);
  experiment_row exp;
  metric_row *rows;
  size_t n_rows, found = 0;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, name, &exp, &err), NAS_OK);
  assert_int_equal(storage_metrics_list(st, exp.id, &rows, &n_rows, &err), NAS_OK);
  unsigned char *seen = calloc(n, 1);
  assert_non_null(seen);
  bool once = true;
  for (size_t i = 0; i < n_rows; i++) {
    if (strcmp(rows[i].name, metric) != 0) continue;
    found++;
    once &= rows[i].step >= 0 && (size_t)rows[i].step < n && !seen[rows[i].step]++;
  }
  free(seen);
  metric_rows_free(rows, n_rows);
  experiment_row_clear(&exp);
  storage_close(st);
  return once && found == n;
}

/* A trial's log holds more observations than one request can carry (a backlog, as after
 * the scheduler was down): the scheduler stores it in reports of bounded size, each with
 * its own log offset, so every line gets through and none is counted twice. */
static void log_backlog_larger_than_a_request_is_stored_once(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *script = nas_asprintf("awk 'BEGIN { for (i = 0; i < %d; i++) "
                              "printf \"nas-metric {\\\"m\\\": 1, \\\"step\\\": %%d}\\n\", i }'\n"
                              "sleep 1\n"
                              "echo 'nas-metric {\"loss\": 0.5}'\n", BACKLOG_OBS);
  char *script_path = test_write(f->dir, "backlog.sh", script);
  char *text = nas_asprintf("name: backlog\n"
                            "parameters: {x: {type: float, low: 0, high: 1}}\n"
                            "objectives: [{name: loss, goal: minimize}]\n"
                            "trial: {command: [sh, '%s']}\n"
                            "optimizer: {type: sobol}\n"
                            "budget: {trials: 1}\n", script_path);
  char *spec = test_write(f->dir, "backlog.yaml", text);
  char *url = server_url(&srv), *out;
  const char *run[] = {"run", spec, "--no-progress", "--storage", url, NULL};
  if (nas_argv(f, &out, run) != 0) fail_msg("nas run: %s", out);
  free(out);
  json_t *rows = trials_json(f, "backlog");
  assert_int_equal(count_status(rows, "completed"), 1);
  json_decref(rows);
  assert_true(each_step_stored_once(f->db, "backlog", "m", BACKLOG_OBS));
  assert_int_equal(test_server_stop(&srv), 0);
  free(url), free(spec), free(text), free(script_path), free(script);
}

/* `nas copy --storage-to http://…` of an experiment with more observations than one
 * request can carry: stored report by report, every one once, and the copy gets the
 * status of the experiment copied once it is whole. */
static void copy_of_more_observations_than_a_request_holds_gets_through(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec);
  nas_argv_ok(f, (const char *[]){"create", spec, "--storage", f->db, NULL});
  nas_argv_ok(f, (const char *[]){"ask", "asked", "--storage", f->db, NULL});
  nas_argv_ok(f, (const char *[]){"tell", "asked", "0", "--complete", "loss=0.5", "--storage",
                                  f->db, NULL});
  storage *st = open_or_fail(f->db);
  metric_obs *obs = malloc(BACKLOG_OBS * sizeof *obs);
  assert_non_null(obs);
  for (int i = 0; i < BACKLOG_OBS; i++) obs[i] = (metric_obs){"m", i, 1, 1};
  nas_err err;
  assert_int_equal(storage_metrics_add(st, trial_id_of(st, "asked", 0), obs, BACKLOG_OBS, -1, &err),
                   NAS_OK);
  free(obs);
  storage_close(st);
  char *to_db = nas_asprintf("sqlite:%s/to.db", f->dir);
  test_server srv;
  start_or_fail(&srv, f->dir, to_db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv);
  nas_argv_ok(f, (const char *[]){"copy", "asked", "copied", "--storage", f->db, "--storage-to",
                                  url, NULL});
  assert_int_equal(test_server_stop(&srv), 0);
  assert_true(each_step_stored_once(to_db, "copied", "m", BACKLOG_OBS));
  storage *from = open_or_fail(f->db), *to = open_or_fail(to_db);
  experiment_row original, copy;
  assert_int_equal(storage_experiment_get(from, "asked", &original, &err), NAS_OK);
  assert_int_equal(storage_experiment_get(to, "copied", &copy, &err), NAS_OK);
  assert_string_equal(copy.status, original.status);
  experiment_row_clear(&original), experiment_row_clear(&copy);
  storage_close(from), storage_close(to);
  free(url), free(to_db), free(spec);
}

/* Trials of copy_of_more_trials_than_a_request_holds_gets_through: some 7 MiB as one
 * request, more than the 4 MiB a request may hold. */
enum { MANY_TRIALS = 20000 };

/* Stores MANY_TRIALS completed trials, each with a final "loss", in experiment `name` of db. */
static void store_many_trials(const char *db, const char *name) {
  storage *st = open_or_fail(db);
  experiment_row exp;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, name, &exp, &err), NAS_OK);
  trial_row *trials = calloc(MANY_TRIALS, sizeof *trials);
  assert_non_null(trials);
  for (int i = 0; i < MANY_TRIALS; i++)
    trials[i] = (trial_row){.number = i, .status = TRIAL_COMPLETED, .params_json = "{\"x\":0.5}",
                            .attempts = 1, .created_at = 1e9 + i, .started_at = 1e9 + i,
                            .finished_at = 2e9 + i, .job_id = "job", .has_exit_code = true};
  assert_int_equal(storage_trials_import(st, exp.id, trials, MANY_TRIALS, &err), NAS_OK);
  free(trials);
  for (int number = 0; number < MANY_TRIALS; number += MANY_TRIALS / 4) {
    metric_obs loss = {"loss", METRIC_FINAL, number, 1};
    assert_int_equal(storage_metrics_add(st, trial_id_of(st, name, number), &loss, 1, -1, &err),
                     NAS_OK);
  }
  experiment_row_clear(&exp);
  storage_close(st);
}

/* Whether experiment `name` of db has the status, trials and metrics store_many_trials gave. */
static void assert_many_trials(const char *db, const char *name, const char *status) {
  storage *st = open_or_fail(db);
  experiment_row exp;
  trial_row *rows;
  metric_row *metrics;
  size_t n;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, name, &exp, &err), NAS_OK);
  assert_string_equal(exp.status, status);
  assert_int_equal(storage_trial_list(st, exp.id, &rows, &n, &err), NAS_OK);
  assert_int_equal(n, MANY_TRIALS);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(rows[i].number, (int)i);
    assert_int_equal(rows[i].status, TRIAL_COMPLETED);
    assert_true(rows[i].finished_at == 2e9 + (double)i);
  }
  trial_rows_free(rows, n);
  assert_int_equal(storage_metrics_list(st, exp.id, &metrics, &n, &err), NAS_OK);
  assert_int_equal(n, 4);
  metric_rows_free(metrics, n);
  experiment_row_clear(&exp);
  storage_close(st);
}

/* `nas copy` into a `nas serve`, and out of it, of an experiment with more trials than one
 * request can carry: the trials go a share at a time under a name that says the copy is
 * incomplete, and the copy has its name, every trial and its status once whole. */
static void copy_of_more_trials_than_a_request_holds_gets_through(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec);
  nas_argv_ok(f, (const char *[]){"create", spec, "--storage", f->db, NULL});
  store_many_trials(f->db, "asked");
  char *to_db = nas_asprintf("sqlite:%s/to.db", f->dir), *out;
  char *back_db = nas_asprintf("sqlite:%s/back.db", f->dir);
  test_server srv;
  start_or_fail(&srv, f->dir, to_db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv);
  nas_argv_ok(f, (const char *[]){"copy", "asked", "copied", "--storage", f->db, "--storage-to",
                                  url, NULL});
  nas_argv_ok(f, (const char *[]){"copy", "copied", "again", "--storage", url, NULL});
  nas_argv_ok(f, (const char *[]){"copy", "again", "back", "--storage", url, "--storage-to",
                                  back_db, NULL});
  const char *taken[] = {"copy", "asked", "again", "--storage", f->db, "--storage-to", url, NULL};
  assert_int_not_equal(nas_argv(f, &out, taken), 0);
  assert_contains(out, "exists already");
  free(out);
  char *list = shown_by(f, "status", NULL, url);
  assert_null(strstr(list, "incomplete"));
  free(list);
  assert_int_equal(test_server_stop(&srv), 0);
  assert_many_trials(to_db, "copied", "running");
  assert_many_trials(to_db, "again", "running");
  assert_many_trials(back_db, "back", "running");
  free(url), free(to_db), free(back_db), free(spec);
}

/* A `nas copy` into a `nas serve` that fails part way (here a trial with parameters of
 * 5 MiB, more than any request holds, after one of 1 MiB that went through) leaves what
 * it stored under a name that says the copy is incomplete, stopped, and never under the
 * copy's name; the error says which and what to do. */
static void copy_failing_part_way_is_left_under_a_name_that_says_so(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "asked.yaml", asked_spec);
  nas_argv_ok(f, (const char *[]){"create", spec, "--storage", f->db, NULL});
  size_t sizes[] = {1 << 20, 10, 5 << 20};
  trial_row trials[3];
  for (int i = 0; i < 3; i++) {
    char *pad = malloc(sizes[i] + 1);
    assert_non_null(pad);
    memset(pad, 'a', sizes[i]);
    pad[sizes[i]] = '\0';
    trials[i] = (trial_row){.number = i, .status = TRIAL_QUEUED,
                            .params_json = nas_asprintf("{\"x\":0.5,\"pad\":\"%s\"}", pad)};
    free(pad);
  }
  storage *st = open_or_fail(f->db);
  experiment_row exp;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, "asked", &exp, &err), NAS_OK);
  assert_int_equal(storage_trials_import(st, exp.id, trials, 3, &err), NAS_OK);
  experiment_row_clear(&exp);
  storage_close(st);
  for (int i = 0; i < 3; i++) free(trials[i].params_json);
  char *to_db = nas_asprintf("sqlite:%s/to.db", f->dir), *out;
  test_server srv;
  start_or_fail(&srv, f->dir, to_db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv);
  const char *copy[] = {"copy", "asked", "copied", "--storage", f->db, "--storage-to", url, NULL};
  assert_int_not_equal(nas_argv(f, &out, copy), 0);
  assert_contains(out, "copy 'copied' is incomplete, stored as experiment 'copied.incomplete'");
  assert_contains(out, "stored 1 of 3 trials");
  free(out);
  assert_int_equal(test_server_stop(&srv), 0);
  storage *to = open_or_fail(to_db);
  assert_int_equal(storage_experiment_get(to, "copied", &exp, &err), NAS_ENOTFOUND);
  assert_int_equal(storage_experiment_get(to, "copied.incomplete", &exp, &err), NAS_OK);
  assert_string_equal(exp.status, "stopped");
  experiment_row_clear(&exp);
  storage_close(to);
  free(url), free(to_db), free(spec);
}

/* A worker started by hand on another machine's trial: `nas worker --storage http://…`. */
static void worker_started_by_hand_reports_through_the_server(void **state) {
  fixture *f = *state;
  char *spec = digits_spec(f, 1), *out;
  nas_ok(f, "create", spec, NULL);
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv);
  const char *ask[] = {"ask", "digits", "--storage", url, NULL};
  if (nas_argv(f, &out, ask) != 0) fail_msg("nas ask: %s", out);
  free(out);
  storage *st = open_or_fail(url);
  char id[32];
  snprintf(id, sizeof id, "%" PRId64, trial_id_of(st, "digits", 0));
  storage_close(st);
  const char *worker[] = {"worker", "--trial", id, "--storage", url, "--run-dir", f->dir, NULL};
  if (nas_argv(f, &out, worker) != 0) fail_msg("nas worker: %s", out);
  free(out);
  assert_int_equal(stored_count(f, "digits", "accuracy", METRIC_FINAL), 1);
  assert_int_equal(stored_count(f, "digits", "accuracy", 1), 1); /* after its one epoch */
  assert_int_equal(test_server_stop(&srv), 0);
  free(url), free(spec);
}

/* ---- many clients, and a server that dies ---------------------------------------------------- */

typedef struct {
  const char *url;
  const int64_t *trial_ids; /* one running trial per client */
  int reports;
  bool odd_clients_bad;     /* odd clients report to a trial that does not exist */
} load_args;

/* A trial id no test makes. */
#define MISSING_TRIAL 999999

/* Client `index`: `reports` reports of one observation each, value index * 100000 + i; a
 * bad client's reports must each fail as not found. */
static int load_client(const load_args *a, int index, nas_err *err) {
  storage *st = NULL;
  int rc = storage_open(a->url, &st, err);
  bool bad = a->odd_clients_bad && index % 2 == 1;
  for (int i = 0; rc == NAS_OK && i < a->reports; i++) {
    metric_obs obs = {"loss", i, index * 100000.0 + i, nas_now()};
    rc = storage_metrics_add(st, bad ? MISSING_TRIAL : a->trial_ids[index], &obs, 1, -1, err);
    if (bad) rc = rc == NAS_ENOTFOUND ? NAS_OK : nas_errf(err, "report %d to no trial: %d", i, rc);
  }
  storage_close(st);
  return rc;
}

static void start_clients(const load_args *a, pid_t *pids) {
  fflush(NULL);
  for (int c = 0; c < LOAD_CLIENTS; c++) {
    pids[c] = fork();
    assert_true(pids[c] >= 0);
    if (pids[c] == 0) {
      nas_err err = {{0}};
      int rc = load_client(a, c, &err);
      if (rc != NAS_OK) fprintf(stderr, "client %d: %s\n", c, err.msg);
      _exit(rc == NAS_OK ? 0 : 1);
    }
  }
}

static void wait_clients(const pid_t *pids) {
  int failures = 0;
  for (int c = 0; c < LOAD_CLIENTS; c++) {
    int status = 0;
    assert_int_equal(waitpid(pids[c], &status, 0), pids[c]);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  assert_int_equal(failures, 0);
}

/* An experiment "load" with one running trial per client, made on the database itself. */
static void make_load_trials(fixture *f, int64_t *trial_ids) {
  storage *st = open_or_fail(f->db);
  nas_err err;
  int64_t exp;
  assert_int_equal(storage_experiment_create(st, "load", "name: load\n", "/load.yaml", "/runs",
                                             &exp, &err), NAS_OK);
  for (int c = 0; c < LOAD_CLIENTS; c++) {
    trial_row t;
    assert_int_equal(storage_trial_create(st, exp, "{}", NULL, &t, &err), NAS_OK);
    assert_int_equal(storage_trial_start(st, t.id, "load", &err), NAS_OK);
    trial_ids[c] = t.id;
    trial_row_clear(&t);
  }
  storage_close(st);
}

/* Every (good) client's reports are stored, each exactly once. */
static void assert_each_report_once(fixture *f, const int64_t *trial_ids, int reports,
                                    bool odd_clients_bad) {
  storage *st = open_or_fail(f->db);
  experiment_row exp;
  metric_row *rows;
  size_t n;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, "load", &exp, &err), NAS_OK);
  assert_int_equal(storage_metrics_list(st, exp.id, &rows, &n, &err), NAS_OK);
  char *seen = calloc((size_t)LOAD_CLIENTS * (size_t)reports, 1);
  for (size_t i = 0; i < n; i++) {
    int c = (int)(rows[i].value / 100000.0), k = (int)(rows[i].value - c * 100000.0);
    assert_true(c >= 0 && c < LOAD_CLIENTS && k >= 0 && k < reports);
    assert_false(odd_clients_bad && c % 2 == 1);
    assert_int_equal(rows[i].trial_id, trial_ids[c]);
    if (seen[c * reports + k]++) fail_msg("report %d of client %d is stored twice", k, c);
  }
  assert_int_equal(n, (size_t)(odd_clients_bad ? LOAD_CLIENTS / 2 : LOAD_CLIENTS) * (size_t)reports);
  free(seen);
  metric_rows_free(rows, n);
  experiment_row_clear(&exp);
  storage_close(st);
}

/* Stops the server and reads its last line, "N writes committed in M transactions": at
 * least min_writes writes, never more commits than writes, and, when more_than > 0, more
 * than more_than writes a commit on average: writes made concurrently were grouped. */
static void stop_asserting_writes_were_grouped(test_server *srv, unsigned long min_writes,
                                               unsigned long more_than) {
  unsigned long writes = 0, commits = 0;
  test_server_stop_reading_commits(srv, &writes, &commits);
  assert_true(writes >= min_writes);
  if (commits > writes || (more_than && writes <= more_than * commits))
    fail_msg("%lu writes took %lu commits: not more than %lu a commit", writes, commits, more_than);
}

/* 32 clients make `reports` reports each through a fresh server (odd ones to no trial
 * when odd_clients_bad; with `--threads threads` unless 0); each good report is stored
 * once, and on SQLite the server grouped them: several to a commit, or more than
 * `threads`. */
static void load_through_a_server(fixture *f, int reports, bool odd_clients_bad, unsigned threads) {
  int64_t trial_ids[LOAD_CLIENTS];
  make_load_trials(f, trial_ids);
  test_server srv;
  char threads_arg[16];
  snprintf(threads_arg, sizeof threads_arg, "%u", threads);
  const char *const threads_args[] = {"--threads", threads_arg, NULL};
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", threads ? threads_args : NULL);
  char *url = server_url(&srv);
  load_args a = {url, trial_ids, reports, odd_clients_bad};
  pid_t pids[LOAD_CLIENTS];
  start_clients(&a, pids);
  wait_clients(pids);
  /* Grouping is asserted for good reports only: what a failing write in a group does is
   * pinned by test_storage's group tests. */
  if (strncmp(f->db, "sqlite:", strlen("sqlite:")) == 0)
    stop_asserting_writes_were_grouped(&srv, (unsigned long)(LOAD_CLIENTS * reports),
                                       odd_clients_bad ? 0 : threads ? threads : 1);
  else /* PostgreSQL: each request thread commits its own writes (serve/server.c) */
    assert_int_equal(test_server_stop(&srv), 0);
  assert_each_report_once(f, trial_ids, reports, odd_clients_bad);
  free(url);
}

static void thirty_two_clients_reporting_at_once_lose_and_double_nothing(void **state) {
  load_through_a_server(*state, LOAD_REPORTS, false, 0);
}

/* A request waiting for its group commit is suspended and holds no request thread, so
 * even one request thread serving all 32 clients groups their writes: it reads the next
 * client's report while a group commits. (libmicrohttpd ties each connection to the
 * thread that accepted it, and a burst of connections can all land on one: when that
 * thread committed each write itself whenever no group ran, a clean-clone CI saw 3200
 * writes in 3200 commits; with one thread that was so every time.) */
static void groups_hold_more_writes_than_request_threads(void **state) {
  load_through_a_server(*state, LOAD_REPORTS / 2, false, 1);
}

/* Half the clients report to a trial that does not exist while the other half report to
 * theirs, at once: each bad report fails (404) alone, never taking a good one of its group
 * with it. */
static void bad_reports_grouped_with_good_ones_fail_alone(void **state) {
  load_through_a_server(*state, LOAD_REPORTS / 2, true, 0);
}

/* ---- the same loads on PostgreSQL ---------------------------------------------------------- */

/* load_through_a_server on a throwaway PostgreSQL server (skipped when none can start,
 * failed under CI=true): each request thread commits its own writes there. */
static void load_through_a_server_on_postgresql(fixture *f, int reports, bool odd_clients_bad) {
  pgserver pg;
  char why[1024];
  if (pgserver_start(&pg, why, sizeof why) != 0) {
    if (pgserver_required()) fail_msg("CI=true and no PostgreSQL server could start: %s", why);
    fprintf(stderr, "*** POSTGRESQL NOT STARTED: %s; this test is SKIPPED\n", why);
    skip();
  }
  free(f->db);
  f->db = pgserver_url(&pg, "postgres", NULL);
  load_through_a_server(f, reports, odd_clients_bad, 0);
  pgserver_stop(&pg);
}

static void thirty_two_clients_reporting_at_once_on_postgresql_are_stored_once(void **state) {
  load_through_a_server_on_postgresql(*state, LOAD_REPORTS, false);
}

static void bad_reports_among_good_ones_on_postgresql_fail_alone(void **state) {
  load_through_a_server_on_postgresql(*state, LOAD_REPORTS / 2, true);
}

/* Observations stored so far in the trials of "load", read from the database itself. */
static size_t load_stored(fixture *f) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  size_t n = 0;
  if (sqlite3_open(f->db + strlen("sqlite:"), &db) == SQLITE_OK &&
      sqlite3_prepare_v2(db, "SELECT count(*) FROM metrics", -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    n = (size_t)sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return n;
}

/* Killed with SIGKILL while 32 clients report (requests in flight, answers lost, commits
 * half-way), then started again on the same port: the clients retry, and the idempotency
 * keys make every report land exactly once. */
static void server_killed_under_load_and_restarted_stores_every_report_once(void **state) {
  fixture *f = *state;
  int64_t trial_ids[LOAD_CLIENTS];
  make_load_trials(f, trial_ids);
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv), *listen = nas_asprintf("127.0.0.1:%d", srv.port);
  load_args a = {url, trial_ids, KILL_REPORTS, false};
  pid_t pids[LOAD_CLIENTS];
  start_clients(&a, pids);
  for (int i = 0; i < 2000 && load_stored(f) < LOAD_CLIENTS * KILL_REPORTS / 3; i++) nas_sleep(0.01);
  size_t before = load_stored(f);
  assert_true(before < LOAD_CLIENTS * KILL_REPORTS);
  test_server_kill(&srv);
  free(srv.log);
  nas_sleep(0.2); /* the clients find it gone, and retry */
  start_or_fail(&srv, f->dir, f->db, listen, NULL);
  wait_clients(pids);
  assert_int_equal(test_server_stop(&srv), 0);
  assert_each_report_once(f, trial_ids, KILL_REPORTS, false);
  free(url), free(listen);
}

/* ---- tokens, unknown names, a server out of reach ----------------------------------------- */

static void tokens_decide_what_a_storage_client_may_do(void **state) {
  fixture *f = *state;
  const char *reader = "r0000000000000000000000000000000000000001";
  const char *writer = "w0000000000000000000000000000000000000002";
  char *text = nas_asprintf("read %s\nwrite %s\n", reader, writer);
  /* A client's token file as the Python client reads it too: its first line that is
   * neither blank nor a # comment, without the spaces around it. */
  char *mine = nas_asprintf("# the write token of this server\n\n  %s \n", writer);
  char *tokens = test_write(f->dir, "tokens", text), *writer_file = test_write(f->dir, "mine", mine);
  chmod(tokens, 0600);
  const char *extra[] = {"--token-file", tokens, NULL};
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", extra);
  char *url = server_url(&srv);
  storage *st = NULL;
  nas_err err = {{0}};
  unsetenv("NAS_TOKEN");
  assert_int_equal(storage_open(url, &st, &err), NAS_ERR);
  assert_contains(err.msg, url);
  assert_contains(err.msg, "missing 'Authorization");
  /* what a user of the CLI can do about it, who sets no header (it said only the above) */
  assert_contains(err.msg, "nas sends the token in $NAS_TOKEN, else the one in the file $NAS_TOKEN_FILE names");
  setenv("NAS_TOKEN", "w0000000000000000000000000000000000000009", 1);
  assert_int_equal(storage_open(url, &st, &err), NAS_ERR);
  assert_contains(err.msg, "not valid");
  setenv("NAS_TOKEN", reader, 1);
  st = open_or_fail(url);
  experiment_row *rows;
  size_t n;
  int64_t id;
  assert_int_equal(storage_experiment_list(st, &rows, &n, &err), NAS_OK);
  experiment_rows_free(rows, n);
  assert_int_equal(storage_experiment_create(st, "e", "x", "/x", "/r", &id, &err), NAS_ERR);
  assert_contains(err.msg, "only read");
  assert_contains(err.msg, "$NAS_TOKEN_FILE");
  storage_close(st);
  unsetenv("NAS_TOKEN");
  setenv("NAS_TOKEN_FILE", writer_file, 1);
  /* a file of secrets others may read is refused, as the server refuses its own; the
   * client read it without a word */
  chmod(writer_file, 0644);
  assert_int_equal(storage_open(url, &st, &err), NAS_ERR);
  char *said = nas_asprintf("NAS_TOKEN_FILE %s may be read by others (mode 644); make it "
                            "private: chmod 600 %s", writer_file, writer_file);
  assert_contains(err.msg, said);
  free(said);
  chmod(writer_file, 0600);
  st = open_or_fail(url);
  assert_int_equal(storage_experiment_create(st, "e", "x", "/x", "/r", &id, &err), NAS_OK);
  storage_close(st);
  unsetenv("NAS_TOKEN_FILE");
  char *log = strdup(srv.log), *logged = NULL;
  assert_int_equal(test_server_stop(&srv), 0);
  assert_int_equal(nas_read_file(log, &logged, NULL, &err), NAS_OK);
  assert_null(strstr(logged, reader));
  assert_null(strstr(logged, writer));
  free(logged), free(log), free(url), free(text), free(mine), free(tokens), free(writer_file);
}

static void unknown_experiments_and_trials_through_the_server_are_not_found(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv), *out;
  storage *st = open_or_fail(url);
  experiment_row exp;
  trial_row t;
  nas_err err;
  assert_int_equal(storage_experiment_get(st, "nope", &exp, &err), NAS_ENOTFOUND);
  char *expect = nas_asprintf("get experiment 'nope': %s: no such experiment", url);
  assert_string_equal(err.msg, expect);
  assert_int_equal(storage_trial_get(st, 99, &t, &err), NAS_ENOTFOUND);
  assert_int_equal(storage_trial_create(st, 99, "{}", NULL, &t, &err), NAS_ENOTFOUND);
  storage_close(st);
  const char *report[] = {"report", "loss=1", "--experiment", "nope", "--trial", "0",
                          "--storage", url, NULL};
  assert_int_equal(nas_argv(f, &out, report), 1);
  assert_contains(out, "nope");
  free(out);
  assert_int_equal(test_server_stop(&srv), 0);
  free(expect), free(url);
}

/* Fails unless text names url exactly once. */
static void assert_url_once(const char *text, const char *url) {
  const char *first = strstr(text, url);
  if (!first || strstr(first + 1, url)) fail_msg("'%s' is not named once in: %s", url, text);
}

static void server_out_of_reach_is_reported_after_the_retry_budget(void **state) {
  (void)state;
  test_server gone = {0};
  fixture *f = *state;
  start_or_fail(&gone, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&gone);
  assert_int_equal(test_server_stop(&gone), 0);
  setenv("NAS_STORAGE_RETRY_S", "0.3", 1);
  storage *st = NULL;
  nas_err err;
  double started = nas_monotonic();
  assert_int_equal(storage_open(url, &st, &err), NAS_ERR);
  double took = nas_monotonic() - started;
  unsetenv("NAS_STORAGE_RETRY_S");
  assert_true(took >= 0.1 && took < 3);
  assert_contains(err.msg, "gave up after 0.3 s");
  assert_url_once(err.msg, url);
  /* the URL was named twice: "storage URL: URL: gave up …" */
  char *want = nas_asprintf("storage %s: gave up after 0.3 s of retries: ", url);
  assert_contains(err.msg, want);
  free(want);
  char *out;
  const char *status[] = {"status", "--storage", url, NULL};
  setenv("NAS_STORAGE_RETRY_S", "0", 1);
  assert_int_equal(nas_argv(f, &out, status), 1);
  unsetenv("NAS_STORAGE_RETRY_S");
  assert_url_once(out, url);
  free(out);
  free(url);
}

/* Starts `nas run spec --storage url` in f->dir with NAS_STORAGE_RETRY_S=retry_s, its output
 * going to log. */
static pid_t run_through(fixture *f, const char *spec, const char *url, const char *retry_s,
                         const char *log) {
  pid_t run = fork();
  assert_true(run >= 0);
  if (run == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || chdir(f->dir) != 0) _exit(126);
    dup2(fd, 1), dup2(fd, 2);
    setenv("NAS_STORAGE_RETRY_S", retry_s, 1);
    execl(test_nas_bin(), test_nas_bin(), "run", spec, "--storage", url, "--no-progress",
          (char *)NULL);
    _exit(127);
  }
  return run;
}

/* Writes f->dir/NAME.yaml: experiment NAME of two trials at once running command (a YAML
 * sequence). The path is owned. */
static char *two_trials_spec(fixture *f, const char *name, const char *command) {
  char *file = nas_asprintf("%s.yaml", name);
  char *text = nas_asprintf("name: %s\n"
                            "parameters: {x: {type: float, low: 0, high: 1}}\n"
                            "objectives: [{name: y, goal: minimize}]\n"
                            "trial: {command: %s}\n"
                            "optimizer: {type: sobol}\n"
                            "budget: {trials: 2, parallel: 2}\n", name, command);
  char *path = test_write(f->dir, file, text);
  free(file), free(text);
  return path;
}

/* Waits for run, which must exit with status want; its output from log (owned), and in
 * *took the seconds since `since` (monotonic). */
static char *ended_run_output(pid_t run, const char *log, int want, double since, double *took) {
  int status = 0;
  assert_int_equal(waitpid(run, &status, 0), run);
  *took = nas_monotonic() - since;
  char *text = NULL;
  nas_err ignored;
  assert_int_equal(nas_read_file(log, &text, NULL, &ignored), NAS_OK);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != want)
    fail_msg("nas run exited %d, not %d: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1, want, text);
  return text;
}

/* A nas run whose server goes away for longer than its retries ends with an error and
 * leaves its trials running: it says so, and names the 'nas resume' that records how they
 * ended, which then takes the lease over and stores both (nothing lost, nothing run twice).
 * Its lease is given up after one try, not after a second retry budget. */
static void run_losing_its_server_names_the_trials_left_running(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv);
  char *spec = two_trials_spec(f, "gone", "[sh, -c, 'sleep 2; "
                                         "echo \"nas-metric {{\\\"y\\\": 1}}\"']");
  char *log = nas_asprintf("%s/run.log", f->dir);
  pid_t run = run_through(f, spec, url, "4", log);
  wait_until_n_running(f, "gone", 2);
  test_server_kill(&srv);
  double killed = nas_monotonic();
  free(srv.log);
  double took;
  char *text = ended_run_output(run, log, 1, killed, &took);
  assert_contains(text, "gave up after 4 s");
  /* one retry budget (3 to 4 s: its waits grow to 1 s), not a second one to release the
   * lease, which expires on its own */
  if (took > 5.5) fail_msg("nas run ended %.1f s after its server: %s", took, text);
  assert_contains(text, "gone: could not release the lease; it expires on its own");
  assert_contains(text, "gone: 2 trials left running, their ends not stored yet");
  char *hint = nas_asprintf("'nas resume gone --storage %s' re-attaches to them", url);
  assert_contains(text, hint);
  nas_ok(f, "resume", "gone", "--no-progress");
  json_t *rows = trials_json(f, "gone");
  assert_int_equal(json_array_size(rows), 2);
  assert_int_equal(count_status(rows, "completed"), 2);
  json_decref(rows);
  free(hint), free(text), free(log), free(spec), free(url);
}

/* Ctrl-C while a run waits through its retries for a server that is gone is heard at once,
 * each press counted: the first says that nothing more launches, the second stops the
 * trials and ends the wait; the lease is then given up after one try (it expires on its
 * own), not after a second retry budget, the run exits as interrupted (3, as docs/cli.md
 * says) and 'nas resume' takes the experiment over. */
static void ctrl_c_while_the_server_is_gone_is_heard_at_once(void **state) {
  fixture *f = *state;
  test_server srv;
  start_or_fail(&srv, f->dir, f->db, "127.0.0.1:0", NULL);
  char *url = server_url(&srv);
  char *spec = two_trials_spec(f, "cut", "[sleep, '60']");
  char *log = nas_asprintf("%s/run.log", f->dir);
  pid_t run = run_through(f, spec, url, "20", log);
  wait_until_n_running(f, "cut", 2);
  test_server_kill(&srv);
  free(srv.log);
  nas_sleep(1); /* the run finds the server gone and retries */
  double pressed = nas_monotonic();
  kill(run, SIGINT);
  nas_sleep(0.3);
  kill(run, SIGINT);
  double took;
  char *text = ended_run_output(run, log, 3, pressed, &took); /* interrupted: it exited 1 */
  if (took > 5) fail_msg("nas run took %.1f s after Ctrl-C: %s", took, text);
  assert_contains(text, "launching no new trials");
  assert_contains(text, "stopping 2 running trials");
  assert_contains(text, "given up on request while the storage was out of reach");
  assert_contains(text, "cut: 2 trials asked to stop, their ends not stored yet");
  assert_contains(text, "cut: could not release the lease; it expires");
  char *hint = nas_asprintf("nas: interrupted; continue with: nas resume cut --storage %s", url);
  assert_contains(text, hint);
  free(hint);
  nas_ok(f, "resume", "cut", "--no-progress");
  json_t *rows = trials_json(f, "cut");
  assert_int_equal(json_array_size(rows), 2);
  assert_int_equal(count_status(rows, "running"), 0);
  json_decref(rows);
  free(text), free(log), free(spec), free(url);
}

static void credentials_in_the_url_are_refused_unshown(void **state) {
  (void)state;
  storage *st = NULL;
  nas_err err;
  assert_int_equal(storage_open("http://me:s3cret@127.0.0.1:1", &st, &err), NAS_ERR);
  assert_contains(err.msg, "NAS_TOKEN");
  assert_null(strstr(err.msg, "s3cret"));
}

/* The dashboard's links carry a token (docs/dashboard.md): one given as a storage URL is
 * refused without showing it. */
static void dashboard_links_given_as_storage_are_refused_without_their_token(void **state) {
  (void)state;
  const char *links[] = {"http://127.0.0.1:1/#token=s3cret-tok",
                         "http://127.0.0.1:1/#/e/exp?token=s3cret-tok"};
  for (size_t i = 0; i < 2; i++) {
    storage *st = NULL;
    nas_err err;
    assert_int_equal(storage_open(links[i], &st, &err), NAS_ERR);
    assert_contains(err.msg, "no query or fragment");
    assert_null(strstr(err.msg, "s3cret-tok"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(every_client_command_works_through_the_server, setup, teardown),
      cmocka_unit_test_setup_teardown(copy_rename_and_delete_work_through_the_server, setup, teardown),
      cmocka_unit_test_setup_teardown(nas_run_and_its_builtin_workers_report_through_the_server, setup, teardown),
      cmocka_unit_test_setup_teardown(worker_started_by_hand_reports_through_the_server, setup, teardown),
      cmocka_unit_test_setup_teardown(log_backlog_larger_than_a_request_is_stored_once, setup, teardown),
      cmocka_unit_test_setup_teardown(copy_of_more_observations_than_a_request_holds_gets_through, setup, teardown),
      cmocka_unit_test_setup_teardown(copy_of_more_trials_than_a_request_holds_gets_through, setup, teardown),
      cmocka_unit_test_setup_teardown(copy_failing_part_way_is_left_under_a_name_that_says_so, setup, teardown),
      cmocka_unit_test_setup_teardown(thirty_two_clients_reporting_at_once_lose_and_double_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(groups_hold_more_writes_than_request_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_reports_grouped_with_good_ones_fail_alone, setup, teardown),
      cmocka_unit_test_setup_teardown(thirty_two_clients_reporting_at_once_on_postgresql_are_stored_once, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_reports_among_good_ones_on_postgresql_fail_alone, setup, teardown),
      cmocka_unit_test_setup_teardown(server_killed_under_load_and_restarted_stores_every_report_once, setup, teardown),
      cmocka_unit_test_setup_teardown(tokens_decide_what_a_storage_client_may_do, setup, teardown),
      cmocka_unit_test_setup_teardown(unknown_experiments_and_trials_through_the_server_are_not_found, setup, teardown),
      cmocka_unit_test_setup_teardown(server_out_of_reach_is_reported_after_the_retry_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(run_losing_its_server_names_the_trials_left_running, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(ctrl_c_while_the_server_is_gone_is_heard_at_once, setup,
                                      teardown),
      cmocka_unit_test(credentials_in_the_url_are_refused_unshown),
      cmocka_unit_test(dashboard_links_given_as_storage_are_refused_without_their_token),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
