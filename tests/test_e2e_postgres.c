/* End-to-end on PostgreSQL: every command of the real bin/nas against a throwaway server
 * this test starts (tests/pgserver.h) — run with trials reporting through stdout and
 * `nas report`, a built-in trial through `nas worker`, then trials, pareto, status, stop
 * and resume, export and import between it and SQLite — with a password in the URL that
 * must never be printed; and `nas serve` in front of it keeping as many reports in flight
 * as it has request threads. */
#include <dirent.h>
#include <inttypes.h>
#include <libpq-fe.h>

#include "common/common.h"
#include "storage/storage.h"

#include "tests/dashboard.h"
#include "tests/e2e.h"
#include "tests/pgserver.h"
#include "tests/serve.h"

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
  /* The URL with its password in the environment, where others cannot read it. */
  free(f->db);
  f->db = NULL;
  char *url = pgserver_url(&g->srv, "postgres", "s3cret-pw");
  setenv("NAS_STORAGE", url, 1);
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
  nas_ok(f, "stop", "pg", NULL);
  nas_ok(f, "resume", "pg", "--no-progress");
  unsetenv("NAS_STORAGE");
  free(spec), free(builtin), free(url);
  teardown((void **)&f);
}

/* `nas trials NAME --format json` in the storage at url (NULL: $NAS_STORAGE), parsed. */
static json_t *trials_at(fixture *f, const char *name, const char *url) {
  char *argv[] = {(char *)test_nas_bin(), "trials", (char *)name, "--format", "json",
                  url ? "--storage" : NULL, (char *)url, NULL};
  char *out;
  assert_int_equal(test_run(f->dir, argv, &out), 0);
  json_t *rows = json_loads(out, 0, NULL);
  free(out);
  assert_non_null(rows);
  return rows;
}

/* An experiment exported from PostgreSQL imports into SQLite, and back into PostgreSQL
 * under another name, with the same trials. */
static void export_from_postgresql_imports_into_sqlite_and_back(void **state) {
  group *g = *state;
  if (!g->up) skip();
  fixture *f;
  setup((void **)&f);
  char *url = pgserver_url(&g->srv, "postgres", "s3cret-pw"), *sqlite = f->db;
  f->db = NULL;
  setenv("NAS_STORAGE", url, 1);
  char *spec = test_write(f->dir, "pgtrip.yaml",
                          "name: pgtrip\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}, {name: z, goal: maximize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"step\\\": 1, \\\"y\\\": 9}}\"; "
                          "echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": {x}}}\"']}\n"
                          "budget: {trials: 4}\n"
                          "optimizer: {type: random}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  free(out);
  char *export[] = {(char *)test_nas_bin(), "export", "pgtrip", "--with", "curves", NULL};
  assert_int_equal(test_run(f->dir, export, &out), 0);
  assert_null(strstr(out, "s3cret-pw"));
  free(test_write(f->dir, "pgtrip.json", out));
  free(out);
  char *to_sqlite[] = {(char *)test_nas_bin(), "import", "pgtrip.json", "--storage", sqlite, NULL};
  char *to_pg[] = {(char *)test_nas_bin(), "import", "pgtrip.json", "--name", "pgtrip2", NULL};
  assert_int_equal(test_run(f->dir, to_sqlite, &out), 0);
  free(out);
  assert_int_equal(test_run(f->dir, to_pg, &out), 0);
  free(out);
  json_t *original = trials_at(f, "pgtrip", NULL), *in_sqlite = trials_at(f, "pgtrip", sqlite);
  json_t *back = trials_at(f, "pgtrip2", NULL);
  assert_int_equal(json_array_size(original), 4);
  assert_true(json_equal(original, in_sqlite));
  assert_true(json_equal(original, back));
  json_decref(original), json_decref(in_sqlite), json_decref(back);
  unsetenv("NAS_STORAGE");
  f->db = sqlite;
  free(spec), free(url);
  teardown((void **)&f);
}

/* The processes of the tree under root, root first (pids read from /proc). */
static size_t process_tree(pid_t root, pid_t *out, size_t cap) {
  size_t n = 0;
  out[n++] = root;
  for (size_t grew = 1; grew;) {
    grew = 0;
    DIR *proc = opendir("/proc");
    assert_non_null(proc);
    for (struct dirent *e; (e = readdir(proc)) && n < cap;) {
      pid_t pid = (pid_t)atoi(e->d_name), ppid = 0;
      char path[64], text[512] = "";
      snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
      FILE *f = pid > 0 ? fopen(path, "r") : NULL;
      if (!f) continue;
      size_t len = fread(text, 1, sizeof text - 1, f);
      fclose(f);
      text[len] = '\0';
      const char *rest = strrchr(text, ')');
      if (!rest || sscanf(rest + 1, " %*c %d", &ppid) != 1) continue;
      bool known = false, parent_known = false;
      for (size_t i = 0; i < n; i++) known |= out[i] == pid, parent_known |= out[i] == ppid;
      if (parent_known && !known) out[n++] = pid, grew = 1;
    }
    closedir(proc);
  }
  return n;
}

/* Whether /proc/PID/cmdline (what ps shows) holds needle. */
static bool cmdline_holds(pid_t pid, const char *needle) {
  char path[64], text[8192];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t len = fread(text, 1, sizeof text, f);
  fclose(f);
  return memmem(text, len, needle, strlen(needle)) != NULL;
}

/* A password given with --storage: ps shows it neither for `nas run` (which masks it in
 * its own arguments, and says so) nor for the monitors it forks nor for the trials. */
static void password_on_the_command_line_shows_in_no_process(void **state) {
  group *g = *state;
  if (!g->up) skip();
  fixture *f;
  setup((void **)&f);
  char *url = pgserver_url(&g->srv, "postgres", "argv-s3cret");
  char *spec = test_write(f->dir, "argv.yaml",
                          "name: argv\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sleep, '60']}\n"
                          "budget: {trials: 2, parallel: 2}\n");
  char *log = NULL;
  assert_true(asprintf(&log, "%s/run.log", f->dir) > 0);
  pid_t run = fork();
  assert_true(run >= 0);
  if (run == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1), dup2(fd, 2);
    execl(test_nas_bin(), test_nas_bin(), "run", spec, "--storage", url, "--no-progress",
          (char *)NULL);
    _exit(127);
  }
  pid_t tree[64];
  size_t n = 0, sleeping = 0;
  for (double until = nas_monotonic() + 30; sleeping < 2; nas_sleep(0.1)) {
    if (nas_monotonic() > until) fail_msg("the trials never started");
    n = process_tree(run, tree, 64);
    sleeping = 0;
    for (size_t i = 1; i < n; i++) sleeping += cmdline_holds(tree[i], "sleep");
  }
  assert_true(n >= 5); /* nas run, two monitors, two trials */
  for (size_t i = 0; i < n; i++)
    if (cmdline_holds(tree[i], "argv-s3cret")) fail_msg("process %d shows the password", tree[i]);
  kill(run, SIGINT), nas_sleep(0.2), kill(run, SIGINT); /* twice: stop the trials */
  int status;
  assert_int_equal(waitpid(run, &status, 0), run);
  char *out = NULL;
  assert_int_equal(nas_read_file(log, &out, NULL, NULL), NAS_OK);
  assert_non_null(strstr(out, "warning: the password in --storage"));
  assert_null(strstr(out, "argv-s3cret"));
  free(out), free(log), free(spec), free(url);
  teardown((void **)&f);
}

/* The dashboard's data from `nas serve` on PostgreSQL agrees with the CLI, and `nas plot`
 * writes its page from PostgreSQL (the browser half runs on SQLite: test_e2e_dashboard). */
static void dashboard_and_plot_work_on_postgresql(void **state) {
  group *g = *state;
  if (!g->up) skip();
  fixture *f;
  setup((void **)&f);
  free(f->db);
  f->db = pgserver_url(&g->srv, "postgres", NULL); /* trusted: no password to show */
  char *spec = test_write(f->dir, "pgdash.yaml",
                          "name: pgdash\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}, {name: z, goal: maximize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'echo \"nas-metric {{\\\"step\\\": 0, \\\"y\\\": {x}}}\"; "
                          "echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": {x}}}\"']\n"
                          "budget: {trials: 5, parallel: 2}\n"
                          "optimizer: {type: random}\n");
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  free(out);
  assert_int_equal(nas(f, &out, "pareto", "pgdash", "--format=json"), 0);
  json_t *pareto = json_loads(out, 0, NULL);
  free(out);
  test_server srv;
  assert_true(test_server_start(&srv, f->dir, f->db, NULL));
  check_dashboard_api(&srv, "pgdash", pareto, 5, "y");
  assert_int_equal(test_server_stop(&srv), 0);
  char *file = nas_asprintf("%s/pgdash.html", f->dir), *page = NULL;
  char *argv[] = {(char *)test_nas_bin(), "plot", "pgdash", "--storage", f->db, "--out", file, NULL};
  assert_int_equal(test_run(f->dir, argv, NULL), 0);
  assert_int_equal(nas_read_file(file, &page, NULL, NULL), NAS_OK);
  /* the data as a JSON text inside a script string: its quotes escaped */
  assert_non_null(strstr(page, "window.NAS_DATA = JSON.parse(\"{"));
  assert_non_null(strstr(page, "\\\"name\\\":\\\"pgdash\\\""));
  json_decref(pareto);
  free(page), free(file), free(spec);
  teardown((void **)&f);
}

/* Clients reporting at once through the server: more than its 16 default threads. */
enum { HELD_CLIENTS = 20 };

static PGresult *pg_ok(PGconn *pg, const char *sql, ExecStatusType want) {
  PGresult *res = PQexec(pg, sql);
  if (PQresultStatus(res) != want) fail_msg("%s: %s", sql, PQerrorMessage(pg));
  return res;
}

/* The rows of a query whose one parameter is an experiment's name. */
static PGresult *pg_rows_of(PGconn *pg, const char *sql, const char *name) {
  const char *params[] = {name};
  PGresult *res = PQexecParams(pg, sql, 1, NULL, params, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQerrorMessage(pg));
  return res;
}

/* Sessions of the database waiting for a lock. */
static int lock_waiters(PGconn *pg) {
  PGresult *res = pg_ok(pg, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                        PGRES_TUPLES_OK);
  int n = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  return n;
}

/* Experiment `name` with HELD_CLIENTS running trials, made on the database itself. */
static void make_running_trials(const char *url, const char *name, int64_t *trial_ids) {
  storage *st;
  nas_err err;
  int64_t exp;
  assert_int_equal(storage_open(url, &st, &err), NAS_OK);
  assert_int_equal(storage_experiment_create(st, name, "name: held\n", "/held.yaml", "/runs", &exp,
                                             &err), NAS_OK);
  for (int c = 0; c < HELD_CLIENTS; c++) {
    trial_row t;
    assert_int_equal(storage_trial_create(st, exp, "{}", NULL, &t, &err), NAS_OK);
    assert_int_equal(storage_trial_start(st, t.id, "held", &err), NAS_OK);
    trial_ids[c] = t.id;
    trial_row_clear(&t);
  }
  storage_close(st);
}

/* A client process reporting one observation to its trial through the server. */
static pid_t start_reporter(const char *server, int64_t trial_id) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    storage *st = NULL;
    nas_err err;
    metric_obs obs = {"loss", 0, 1.0, nas_now()};
    int rc = storage_open(server, &st, &err);
    if (rc == NAS_OK) rc = storage_metrics_add(st, trial_id, &obs, 1, -1, &err);
    if (rc != NAS_OK) fprintf(stderr, "report to trial %" PRId64 ": %s\n", trial_id, err.msg);
    storage_close(st);
    _exit(rc == NAS_OK ? 0 : 1);
  }
  return pid;
}

/* HELD_CLIENTS clients report at once through `nas serve EXTRA…` on PostgreSQL while the test
 * holds the metrics table locked: exactly `threads` reports wait inside PostgreSQL (one
 * transaction per request thread; the rest wait in the server), and every one is stored
 * once the lock goes. */
static void reports_in_flight_are_the_threads(fixture *f, const char *name,
                                              const char *const *extra, int threads) {
  int64_t trial_ids[HELD_CLIENTS];
  make_running_trials(f->db, name, trial_ids);
  test_server srv;
  assert_true(test_server_start(&srv, f->dir, f->db, extra));
  char *log = NULL, *said = nas_asprintf("nas serve: %d request threads\n", threads);
  assert_int_equal(nas_read_file(srv.log, &log, NULL, NULL), NAS_OK);
  if (!strstr(log, said)) fail_msg("no '%s' in the server's log: %s", said, log);
  /* pg holds the locks; watch counts the waiters (outside pg's transaction, whose view
   * of pg_stat_activity is taken once). */
  PGconn *pg = PQconnectdb(f->db), *watch = PQconnectdb(f->db);
  assert_int_equal(PQstatus(pg), CONNECTION_OK);
  assert_int_equal(PQstatus(watch), CONNECTION_OK);
  PQclear(pg_ok(pg, "BEGIN", PGRES_COMMAND_OK));
  /* A report's metrics reference its trial: their insert waits for the trial's row. */
  PGresult *locked = pg_rows_of(pg, "SELECT trials.id FROM trials JOIN experiments"
                                     " ON experiments.id = trials.experiment_id"
                                     " WHERE experiments.name = $1 FOR UPDATE OF trials", name);
  assert_int_equal(PQntuples(locked), HELD_CLIENTS);
  PQclear(locked);
  char *server = nas_asprintf("http://127.0.0.1:%d", srv.port);
  pid_t pids[HELD_CLIENTS];
  /* One client at a time, each waited for inside PostgreSQL while threads are free: a
   * request thread of libmicrohttpd serves the connections it accepted, so clients
   * arriving all at once may pile onto a few threads and leave others idle. */
  for (int c = 0; c < HELD_CLIENTS; c++) {
    pids[c] = start_reporter(server, trial_ids[c]);
    int want = c < threads ? c + 1 : threads;
    for (double waited = 0; lock_waiters(watch) < want && waited < 20; waited += 0.02)
      nas_sleep(0.02);
  }
  nas_sleep(0.5); /* time for any report beyond the threads to reach PostgreSQL too */
  assert_int_equal(lock_waiters(watch), threads);
  PQclear(pg_ok(pg, "COMMIT", PGRES_COMMAND_OK));
  for (int c = 0; c < HELD_CLIENTS; c++) {
    int status = 0;
    assert_int_equal(waitpid(pids[c], &status, 0), pids[c]);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  PGresult *res = pg_rows_of(pg, "SELECT count(*) FROM metrics JOIN trials"
                                 " ON trials.id = metrics.trial_id JOIN experiments"
                                 " ON experiments.id = trials.experiment_id"
                                 " WHERE experiments.name = $1", name);
  assert_int_equal(atoi(PQgetvalue(res, 0, 0)), HELD_CLIENTS);
  PQclear(res);
  PQfinish(pg), PQfinish(watch);
  assert_int_equal(test_server_stop(&srv), 0);
  free(server), free(said), free(log);
}

/* PostgreSQL commits many transactions at once: `nas serve` in front of it serves 16
 * requests at once by default (SQLite's 4: test_serve), or --threads of them. */
static void server_on_postgresql_keeps_a_transaction_in_flight_per_thread(void **state) {
  group *g = *state;
  if (!g->up) skip();
  fixture *f;
  setup((void **)&f);
  free(f->db);
  f->db = pgserver_url(&g->srv, "postgres", NULL);
  reports_in_flight_are_the_threads(f, "held16", NULL, 16);
  reports_in_flight_are_the_threads(f, "held6", (const char *const[]){"--threads", "6", NULL}, 6);
  teardown((void **)&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_command_works_on_postgresql),
      cmocka_unit_test(export_from_postgresql_imports_into_sqlite_and_back),
      cmocka_unit_test(password_on_the_command_line_shows_in_no_process),
      cmocka_unit_test(dashboard_and_plot_work_on_postgresql),
      cmocka_unit_test(server_on_postgresql_keeps_a_transaction_in_flight_per_thread),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
