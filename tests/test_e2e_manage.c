/* End-to-end: managing whole experiments with the real bin/nas — delete (asking first,
 * removing only its own run folder), rename (its stored spec and run folder follow), copy
 * (to the same storage or another), known configurations first (`enqueue:` and `nas
 * enqueue`) and warm start from earlier experiments. SQLite storage in a temporary folder. */
#include <jansson.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "tests/e2e.h"

/* A spec named `name` whose trial reports y = x, with `extra` appended (more parameters
 * first: extra_params goes under parameters). Returns the owned path. */
static char *spec_named(fixture *f, const char *name, const char *extra_params, int trials,
                        const char *extra) {
  char *file = nas_asprintf("%s.yaml", name);
  char *text = nas_asprintf("name: %s\n"
                            "parameters:\n"
                            "  x: {type: float, low: 0, high: 1}\n"
                            "  c: {type: categorical, choices: [8, 16]}\n"
                            "%s"
                            "objectives: [{name: y, goal: minimize}]\n"
                            "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                            "budget: {trials: %d}\n"
                            "%s",
                            name, extra_params, trials, extra);
  char *path = test_write(f->dir, file, text);
  free(file);
  free(text);
  return path;
}

static void run_ok(fixture *f, const char *spec) {
  char *out;
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run %s failed (%d): %s", spec, rc, out);
  free(out);
}

static bool exists(fixture *f, const char *rel) {
  char *path = nas_asprintf("%s/%s", f->dir, rel);
  struct stat st;
  bool found = lstat(path, &st) == 0;
  free(path);
  return found;
}

/* Runs `nas ARGS… --storage DB` with stdin from /dev/null (no terminal); returns the exit
 * status and *out its output. */
static int nas_no_tty(fixture *f, char **out, const char *args) {
  char *script = nas_asprintf("exec \"$0\" %s --storage \"$1\" </dev/null", args);
  char *argv[] = {"/bin/sh", "-c", script, (char *)test_nas_bin(), f->db, NULL};
  int rc = test_run(f->dir, argv, out);
  free(script);
  return rc;
}

static void assert_contains(const char *text, const char *part) {
  if (!strstr(text, part)) fail_msg("\"%s\" does not contain \"%s\"", text, part);
}

/* ---- delete ------------------------------------------------------------------------------ */

static void delete_asks_first_and_removes_only_its_own_run_folder(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 2, ""), *b = spec_named(f, "b", "", 2, ""), *out;
  run_ok(f, a);
  run_ok(f, b);
  assert_int_equal(nas_no_tty(f, &out, "delete a"), 1);
  assert_contains(out, "no terminal to ask on; give --yes");
  free(out);
  json_decref(trials_json(f, "a")); /* still there */
  assert_int_equal(nas_no_tty(f, &out, "delete a --yes --runs"), 0);
  assert_contains(out, "runs/a");
  free(out);
  assert_false(exists(f, "runs/a"));
  assert_true(exists(f, "runs/b/0"));
  assert_int_equal(nas(f, &out, "trials", "a", NULL), 1);
  assert_contains(out, "no experiment 'a'");
  free(out);
  json_t *rows = trials_json(f, "b");
  assert_int_equal(count_status(rows, "completed"), 2);
  json_decref(rows);
  run_ok(f, a); /* the name is free again, and starts from trial 0 */
  rows = trials_json(f, "a");
  assert_int_equal(json_array_size(rows), 2);
  json_decref(rows);
  free(a);
  free(b);
}

static void delete_runs_never_follows_a_link(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 1, ""), *out;
  run_ok(f, a);
  char *link = nas_asprintf("%s/runs/a", f->dir), *target = nas_asprintf("%s/elsewhere", f->dir);
  assert_int_equal(mkdir(target, 0700), 0);
  free(test_write(f->dir, "elsewhere/keep", "precious"));
  test_rmtree(link);
  assert_int_equal(symlink(target, link), 0);
  assert_int_equal(nas_no_tty(f, &out, "delete a --yes --runs"), 1);
  assert_contains(out, "not a folder");
  free(out);
  assert_true(exists(f, "elsewhere/keep"));
  assert_true(exists(f, "runs/a"));
  free(link);
  free(target);
  free(a);
}

/* After `nas delete` without --runs, an experiment of the same name run again uses the old
 * trial folders: a trial that reports nothing must not be judged on the lines the deleted
 * trial left in its stdout.log. */
static void trial_after_delete_keeping_runs_is_judged_on_its_own_output(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 1, ""), *out;
  run_ok(f, a);
  assert_int_equal(nas_no_tty(f, &out, "delete a --yes"), 0);
  free(out);
  assert_true(exists(f, "runs/a/0/stdout.log"));
  char *silent = test_write(f->dir, "silent.yaml",
                            "name: a\n"
                            "parameters: {x: {type: float, low: 0, high: 1}}\n"
                            "objectives: [{name: y, goal: minimize}]\n"
                            "trial: {command: [sh, -c, 'echo quiet']}\n"
                            "budget: {trials: 1}\n");
  run_ok(f, silent);
  json_t *rows = trials_json(f, "a");
  const json_t *row = row_of(rows, 0);
  assert_string_equal(json_string_value(json_object_get(row, "status")), "failed");
  assert_contains(json_string_value(json_object_get(row, "error")), "without reporting");
  json_decref(rows);
  char *log = nas_asprintf("%s/runs/a/0/stdout.log", f->dir), *text = NULL;
  assert_int_equal(nas_read_file(log, &text, NULL, NULL), NAS_OK);
  assert_string_equal(text, "quiet\n");
  free(text);
  free(log);
  free(silent);
  free(a);
}

/* Writes a lease of experiment `name` held by this (live) process, as a running scheduler
 * would hold it. */
static void hold_lease(fixture *f, const char *name) {
  char *path = nas_asprintf("%s/nas.db", f->dir), host[256] = "";
  gethostname(host, sizeof host - 1);
  char *sql = nas_asprintf("INSERT INTO scheduler_leases (experiment_id, token, host, pid,"
                           " started_at, heartbeat_at) SELECT id, 'test', '%s', %d, %f, %f"
                           " FROM experiments WHERE name = '%s'",
                           host, (int)getpid(), nas_now(), nas_now(), name);
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  free(sql);
  free(path);
}

static void delete_and_rename_are_refused_while_a_scheduler_runs(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 1, ""), *out;
  run_ok(f, a);
  hold_lease(f, "a");
  assert_int_equal(nas_no_tty(f, &out, "delete a --yes"), 1);
  assert_contains(out, "while its scheduler runs");
  free(out);
  assert_int_equal(nas_no_tty(f, &out, "rename a a2"), 1);
  assert_contains(out, "stop it first");
  free(out);
  json_decref(trials_json(f, "a"));
  assert_true(exists(f, "runs/a/0"));
  free(a);
}

/* ---- rename and copy --------------------------------------------------------------------- */

static void renamed_experiment_continues_from_a_spec_with_the_new_name(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 2, ""), *taken = spec_named(f, "t", "", 1, ""), *out;
  run_ok(f, a);
  run_ok(f, taken);
  assert_int_equal(nas_no_tty(f, &out, "rename a t"), 1);
  /* named as the user named them; it said "rename experiment 1 to 't'" (the storage id) */
  assert_contains(out, "cannot rename 'a' to 't': an experiment named 't' exists already");
  free(out);
  assert_int_equal(nas_no_tty(f, &out, "rename a ../up"), 1);
  assert_contains(out, "not an experiment name");
  free(out);
  assert_true(exists(f, "runs/a/0"));
  assert_int_equal(nas_no_tty(f, &out, "rename a a2"), 0);
  free(out);
  assert_false(exists(f, "runs/a"));
  assert_true(exists(f, "runs/a2/1"));
  char *a2 = spec_named(f, "a2", "", 3, ""); /* the same spec, renamed, one more trial */
  run_ok(f, a2);
  json_t *rows = trials_json(f, "a2");
  assert_int_equal(json_array_size(rows), 3);
  json_decref(rows);
  assert_true(exists(f, "runs/a2/2"));
  free(a);
  free(a2);
  free(taken);
}

/* A rename whose storage write fails after the run folder moved puts the folder back; when
 * that fails too (runs/<old> made meanwhile), it was silent: the error now says where the
 * folder is and that storage keeps the old name. Played with the database's write lock
 * held (the rename waits its busy timeout out, then fails) and runs/a made meanwhile. */
static void rename_whose_folder_cannot_be_put_back_says_where_it_is(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 1, ""), *path = nas_asprintf("%s/nas.db", f->dir);
  run_ok(f, a);
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  int report[2];
  assert_int_equal(pipe(report), 0);
  fflush(NULL);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    char *out = NULL;
    int rc = nas_no_tty(f, &out, "rename a a2");
    dprintf(report[1], "%d %s", rc, out ? out : "");
    _exit(0);
  }
  close(report[1]);
  for (int i = 0; i < 500 && !exists(f, "runs/a2"); i++) nas_sleep_ms(10);
  assert_true(exists(f, "runs/a2"));
  char *old = nas_asprintf("%s/runs/a", f->dir);
  assert_int_equal(mkdir(old, 0755), 0);
  char said[4096] = "";
  ssize_t n, got = 0;
  while ((n = read(report[0], said + got, sizeof said - 1 - (size_t)got)) > 0) got += n;
  said[got] = '\0';
  close(report[0]);
  assert_int_equal(waitpid(child, NULL, 0), child);
  sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(db);
  assert_int_equal(atoi(said), 1);
  assert_contains(said, "could not be put back");
  assert_contains(said, "runs/a2 while the experiment is still named 'a'");
  assert_true(exists(f, "runs/a2/0"));
  json_decref(trials_json(f, "a"));
  free(old), free(path), free(a);
}

static void copy_keeps_trials_and_metrics_in_the_same_or_another_storage(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 3, ""), *out;
  run_ok(f, a);
  assert_int_equal(nas_no_tty(f, &out, "copy a b"), 0);
  free(out);
  char *other = nas_asprintf("copy a a --storage-to sqlite:%s/other.db", f->dir);
  assert_int_equal(nas_no_tty(f, &out, other), 0);
  free(out);
  json_t *src = trials_json(f, "a"), *copy = trials_json(f, "b");
  char *db = f->db;
  f->db = nas_asprintf("sqlite:%s/other.db", f->dir);
  json_t *far = trials_json(f, "a");
  free(f->db);
  f->db = db;
  for (json_int_t i = 0; i < 3; i++) {
    assert_true(num(row_of(src, i), "y") == num(row_of(copy, i), "y"));
    assert_true(num(row_of(src, i), "x") == num(row_of(far, i), "x"));
    assert_true(num(row_of(src, i), "y") == num(row_of(far, i), "y"));
  }
  json_decref(src);
  json_decref(copy);
  json_decref(far);
  assert_int_equal(nas_no_tty(f, &out, "copy a b"), 1); /* b is taken */
  assert_contains(out, "exists already");
  free(out);
  free(other);
  free(a);
}

/* ---- known configurations and warm start ------------------------------------------------ */

static void enqueued_configurations_run_first_once_and_count_in_the_budget(void **state) {
  fixture *f = *state;
  char *a = spec_named(f, "a", "", 3, "enqueue:\n  - {x: 0.25, c: 16}\n"), *out;
  run_ok(f, a);
  json_t *rows = trials_json(f, "a");
  assert_int_equal(json_array_size(rows), 3);
  assert_true(num(row_of(rows, 0), "x") == 0.25);
  assert_true(num(row_of(rows, 0), "c") == 16);
  json_decref(rows);
  assert_int_equal(nas_no_tty(f, &out, "enqueue a x=2 c=8"), 1);
  assert_contains(out, "parameter 'x': 2 is outside [0, 1]");
  free(out);
  assert_int_equal(nas_no_tty(f, &out, "enqueue a x=0.5 cc=8"), 1);
  assert_contains(out, "did you mean 'c'");
  free(out);
  assert_int_equal(nas_no_tty(f, &out, "enqueue a x=0.75 c=8"), 0);
  assert_contains(out, "trial 3 of a queued");
  free(out);
  /* A configuration tried before is queued all the same (to measure it again), with a word
   * on which trial had it: an enqueue that repeats one by mistake said nothing. */
  assert_int_equal(nas_no_tty(f, &out, "enqueue a x=0.25 c=16"), 0);
  assert_contains(out, "trial 4 of a queued");
  assert_contains(out, "(trial 0, completed, has the same parameters: this trial runs them again)");
  free(out);
  nas_ok(f, "resume", "a", "--no-progress");
  rows = trials_json(f, "a");
  assert_int_equal(json_array_size(rows), 5); /* the spec's enqueue is not queued again */
  assert_true(num(row_of(rows, 3), "x") == 0.75);
  assert_int_equal(count_status(rows, "completed"), 5);
  json_decref(rows);
  free(a);
}

static void warm_start_imports_fitting_trials_without_counting_them(void **state) {
  fixture *f = *state;
  char *old = spec_named(f, "old", "", 4, ""), *out;
  run_ok(f, old);
  char *missing = spec_named(f, "m", "", 2, "warm_start: {from: [nope]}\n");
  assert_int_equal(nas(f, &out, "run", missing, "--no-progress"), 1);
  assert_contains(out, "no experiment 'nope'");
  free(out);
  char *next = spec_named(f, "next", "  z: {type: int, low: 1, high: 3}\n", 2,
                          "warm_start: {from: [old], fill: {z: 2}}\n");
  assert_int_equal(nas(f, &out, "run", next, "--no-progress"), 0);
  assert_contains(out, "4 observations imported");
  free(out);
  json_t *rows = trials_json(f, "next");
  assert_int_equal(json_array_size(rows), 2); /* imported ones are not trials */
  json_decref(rows);
  assert_int_equal(nas(f, &out, "pareto", "next", NULL), 0);
  assert_contains(out, "own trials only");
  free(out);
  char *unfit = spec_named(f, "unfit", "  z: {type: int, low: 1, high: 3}\n", 1,
                           "warm_start: {from: [old]}\n"); /* no fill for z: none fit */
  assert_int_equal(nas(f, &out, "run", unfit, "--no-progress"), 0);
  assert_contains(out, "0 observations imported");
  free(out);
  free(old);
  free(missing);
  free(next);
  free(unfit);
}

static void new_commands_have_help_and_bad_usage_exits_2(void **state) {
  fixture *f = *state;
  const char *cmds[] = {"delete", "rename", "copy", "enqueue"};
  char *out;
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char *help[] = {(char *)test_nas_bin(), (char *)cmds[i], "--help", NULL};
    assert_int_equal(test_run(f->dir, help, &out), 0);
    assert_contains(out, "usage: nas");
    free(out);
    char *bare[] = {(char *)test_nas_bin(), (char *)cmds[i], NULL};
    assert_int_equal(test_run(f->dir, bare, &out), 2);
    free(out);
  }
  /* An operand that is no NAME=VALUE is bad usage, as for 'nas tell' and 'nas report': it
   * was exit 1, after opening the storage (which need not exist). */
  const char *shapeless[] = {"lr", "=0.5"};
  for (size_t i = 0; i < sizeof shapeless / sizeof *shapeless; i++) {
    char *argv[] = {(char *)test_nas_bin(), "enqueue", "exp", "x=1", (char *)shapeless[i], NULL};
    int rc = test_run(f->dir, argv, &out);
    char *said = nas_asprintf("nas enqueue: '%s' is not NAME=VALUE", shapeless[i]);
    if (rc != 2 || !strstr(out, said)) fail_msg("exit %d (want 2): %s", rc, out);
    free(said);
    free(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(delete_asks_first_and_removes_only_its_own_run_folder, setup, teardown),
      cmocka_unit_test_setup_teardown(delete_runs_never_follows_a_link, setup, teardown),
      cmocka_unit_test_setup_teardown(trial_after_delete_keeping_runs_is_judged_on_its_own_output, setup, teardown),
      cmocka_unit_test_setup_teardown(delete_and_rename_are_refused_while_a_scheduler_runs, setup, teardown),
      cmocka_unit_test_setup_teardown(renamed_experiment_continues_from_a_spec_with_the_new_name, setup, teardown),
      cmocka_unit_test_setup_teardown(rename_whose_folder_cannot_be_put_back_says_where_it_is,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(copy_keeps_trials_and_metrics_in_the_same_or_another_storage, setup, teardown),
      cmocka_unit_test_setup_teardown(enqueued_configurations_run_first_once_and_count_in_the_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(warm_start_imports_fitting_trials_without_counting_them, setup, teardown),
      cmocka_unit_test_setup_teardown(new_commands_have_help_and_bad_usage_exits_2, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
