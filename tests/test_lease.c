/* One scheduler per experiment, and a database that vanishes under a run: the real bin/nas
 * on SQLite and on a throwaway PostgreSQL. Two schedulers of one experiment never run it
 * at once (the second is refused with who holds it, nothing runs twice); a scheduler
 * killed with -9 is taken over at once on its host; a lease that stopped beating is judged
 * dead; `nas status` says whether a scheduler is alive; deleting the SQLite file mid-run
 * stops the run with an error instead of a "completed" that stored nothing. */
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "scheduler/scheduler.h"
#include "tests/e2e.h"
#include "tests/pgserver.h"

/* Four trials of a second each, two at a time: long enough to start a rival meanwhile. */
#define SLOW_SPEC_HEAD                                                                          \
  "name: slow\n"                                                                                \
  "parameters: {x: {type: float, low: 0, high: 1}}\n"                                           \
  "objectives: [{name: y, goal: minimize}]\n"                                                   \
  "trial: {command: [sh, -c, 'sleep 1; echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"              \
  "optimizer: {type: random}\n"
static const char slow_spec[] = SLOW_SPEC_HEAD "budget: {trials: 4, parallel: 2}\n";
/* The same with a larger budget: a change `nas run` stores when it runs the experiment. */
static const char larger_slow_spec[] = SLOW_SPEC_HEAD "budget: {trials: 6, parallel: 2}\n";

/* Starts `nas run SPEC` in the background with its stderr into dir/name; returns its pid. */
static pid_t start_logged(fixture *f, const char *spec, const char *name) {
  char *log = nas_asprintf("%s/%s", f->dir, name);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (chdir(f->dir) != 0 || fd < 0) _exit(126);
    dup2(fd, 1), dup2(fd, 2);
    execl(test_nas_bin(), test_nas_bin(), "run", spec, "--storage", f->db, "--no-progress",
          (char *)NULL);
    _exit(127);
  }
  free(log);
  return pid;
}

static int exit_status(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* `nas status NAME --format json`: the state of the experiment's scheduler. Owned. */
static char *scheduler_state_of(fixture *f, const char *name) {
  char *out;
  assert_int_equal(nas(f, &out, "status", name, "--format=json"), 0);
  json_t *summary = json_loads(out, 0, NULL);
  assert_non_null(summary);
  char *state = strdup(json_string_value(json_object_get(json_object_get(summary, "scheduler"), "state")));
  json_decref(summary);
  free(out);
  return state;
}

/* The scenario the fault was found with, on whatever storage f->db names. */
static void rival_schedulers_never_double_the_budget(fixture *f) {
  char *spec = test_write(f->dir, "slow.yaml", slow_spec);
  pid_t first = start_logged(f, spec, "first.log");
  wait_until_running(f, "slow");
  char *state = scheduler_state_of(f, "slow");
  assert_string_equal(state, "alive");
  free(state);
  char *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 1);
  if (!strstr(out, "is being run by another scheduler") || !strstr(out, "pid"))
    fail_msg("second 'nas run' said: %s", out);
  free(out);
  assert_int_equal(nas(f, &out, "resume", "slow", "--no-progress"), 1);
  assert_non_null(strstr(out, "is being run by another scheduler"));
  free(out);
  /* A refused run with a larger budget stores nothing either: the next resume would
   * otherwise spend the budget of a command that never ran. */
  char *larger = test_write(f->dir, "slow6.yaml", larger_slow_spec);
  assert_int_equal(nas(f, &out, "run", larger, "--no-progress"), 1);
  if (!strstr(out, "is being run by another scheduler")) fail_msg("larger 'nas run' said: %s", out);
  free(out);
  assert_int_equal(exit_status(first), 0);
  assert_int_equal(nas(f, &out, "resume", "slow", "--no-progress"), 0);
  free(out);
  json_t *rows = trials_json(f, "slow");
  assert_int_equal(json_array_size(rows), 4);
  assert_int_equal(count_status(rows, "completed"), 4);
  json_decref(rows);
  free(larger);
  state = scheduler_state_of(f, "slow");
  assert_string_equal(state, "none");
  free(state);
  free(spec);
}

static void second_scheduler_is_refused_on_sqlite(void **state) {
  rival_schedulers_never_double_the_budget(*state);
}

static void second_scheduler_is_refused_on_postgresql(void **state) {
  fixture *f = *state;
  pgserver srv;
  char why[512];
  if (pgserver_start(&srv, why, sizeof why) != 0) {
    if (pgserver_required()) fail_msg("PostgreSQL did not start: %s", why);
    skip();
  }
  char *sqlite_db = f->db;
  f->db = pgserver_url(&srv, "postgres", NULL);
  rival_schedulers_never_double_the_budget(f);
  free(f->db);
  f->db = sqlite_db;
  pgserver_stop(&srv);
}

static void scheduler_killed_with_9_is_taken_over_at_once(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "slow.yaml", slow_spec);
  pid_t first = start_logged(f, spec, "first.log");
  wait_until_running(f, "slow");
  kill(first, SIGKILL);
  waitpid(first, NULL, 0);
  char *state_now = scheduler_state_of(f, "slow");
  assert_string_equal(state_now, "dead");
  free(state_now);
  char *out;
  double start = nas_now();
  int rc = nas(f, &out, "resume", "slow", "--no-progress");
  if (rc != 0) fail_msg("resume exited %d: %s", rc, out);
  assert_non_null(strstr(out, "taking over from a scheduler that is gone"));
  assert_true(nas_now() - start < SCHED_LEASE_TIMEOUT_S);
  free(out);
  json_t *rows = trials_json(f, "slow");
  assert_int_equal(json_array_size(rows), 4);
  assert_int_equal(count_status(rows, "completed"), 4);
  json_decref(rows);
  free(spec);
}

/* A lease held on another host is alive while it beats and dead once it stops. */
static void lease_is_judged_by_its_heartbeat_and_its_pid(void **state) {
  (void)state;
  double now = nas_now();
  storage_lease far = {.token = "t", .host = "some-other-host", .pid = 1,
                       .started_at = now - 100, .heartbeat_at = now - 1};
  assert_false(sched_lease_holder_dead(&far, now));
  far.heartbeat_at = now - SCHED_LEASE_TIMEOUT_S - 1;
  assert_true(sched_lease_holder_dead(&far, now));
  char host[256];
  assert_int_equal(gethostname(host, sizeof host), 0);
  storage_lease here = {.token = "t", .host = host, .pid = getpid(), .started_at = now,
                        .heartbeat_at = now};
  assert_false(sched_lease_holder_dead(&here, now));
  /* A scheduler killed with -9 whose parent does not reap it (a container's first process
   * that is no init, a parent busy elsewhere) stays a zombie: dead all the same. */
  pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  siginfo_t info;
  assert_int_equal(waitid(P_PID, (id_t)zombie, &info, WEXITED | WNOWAIT), 0); /* not reaped */
  here.pid = zombie;
  assert_true(sched_lease_holder_dead(&here, now));
  waitpid(zombie, NULL, 0);
  assert_true(sched_lease_holder_dead(&here, now));
}

/* Storage swaps a lease only for its holder or for the one that replaces a known token. */
static void lease_changes_hands_only_by_compare_and_swap(void **state) {
  fixture *f = *state;
  storage *st;
  nas_err err;
  assert_int_equal(storage_open(f->db, &st, &err), NAS_OK);
  int64_t id;
  assert_int_equal(storage_experiment_create(st, "e", "x", "/x", "/", &id, &err), NAS_OK);
  assert_int_equal(storage_lease_take(st, id, "aaa", "h1", 10, NULL, &err), NAS_OK);
  assert_int_equal(storage_lease_take(st, id, "aaa", "h1", 10, NULL, &err), NAS_OK);
  assert_int_equal(storage_lease_take(st, id, "bbb", "h2", 20, NULL, &err), NAS_EEXIST);
  assert_int_equal(storage_lease_take(st, id, "bbb", "h2", 20, "zzz", &err), NAS_EEXIST);
  assert_int_equal(storage_lease_take(st, id, "bbb", "h2", 20, "aaa", &err), NAS_OK);
  assert_int_equal(storage_lease_renew(st, id, "aaa", &err), NAS_ENOTFOUND);
  assert_int_equal(storage_lease_renew(st, id, "bbb", &err), NAS_OK);
  storage_lease held;
  assert_int_equal(storage_lease_get(st, id, &held, &err), NAS_OK);
  assert_string_equal(held.host, "h2");
  assert_int_equal(held.pid, 20);
  storage_lease_clear(&held);
  assert_int_equal(storage_lease_release(st, id, "aaa", &err), NAS_OK);
  assert_int_equal(storage_lease_get(st, id, &held, &err), NAS_OK);
  storage_lease_clear(&held);
  assert_int_equal(storage_lease_release(st, id, "bbb", &err), NAS_OK);
  assert_int_equal(storage_lease_get(st, id, &held, &err), NAS_ENOTFOUND);
  storage_close(st);
}

/* A changed spec is stored under the lease; an ask holds that lease for an instant, so
 * `nas create` of an ask-and-tell spec waits for it instead of failing. */
static void create_of_a_changed_spec_waits_for_an_ask_holding_the_lease(void **state) {
  fixture *f = *state;
  static const char head[] = "name: asked\n"
                             "parameters: {x: {type: float, low: 0, high: 1}}\n"
                             "objectives: [{name: y, goal: minimize}]\n";
  char *two = nas_asprintf("%sbudget: {trials: 2}\n", head);
  char *five = nas_asprintf("%sbudget: {trials: 5}\n", head);
  char *spec = test_write(f->dir, "asked.yaml", two);
  char *larger = test_write(f->dir, "asked5.yaml", five);
  nas_ok(f, "create", spec, NULL);
  storage *st;
  nas_err err;
  experiment_row exp;
  assert_int_equal(storage_open(f->db, &st, &err), NAS_OK);
  assert_int_equal(storage_experiment_get(st, "asked", &exp, &err), NAS_OK);
  char host[256];
  assert_int_equal(gethostname(host, sizeof host), 0);
  assert_int_equal(storage_lease_take(st, exp.id, "asker", host, getpid(), NULL, &err), NAS_OK);
  pid_t create = fork();
  assert_true(create >= 0);
  if (create == 0) {
    execl(test_nas_bin(), test_nas_bin(), "create", larger, "--storage", f->db, (char *)NULL);
    _exit(127);
  }
  nas_sleep(0.5);
  assert_int_equal(storage_lease_release(st, exp.id, "asker", &err), NAS_OK);
  assert_int_equal(exit_status(create), 0);
  experiment_row_clear(&exp);
  assert_int_equal(storage_experiment_get(st, "asked", &exp, &err), NAS_OK);
  assert_non_null(strstr(exp.spec_text, "trials: 5"));
  experiment_row_clear(&exp);
  storage_close(st);
  free(two), free(five), free(spec), free(larger);
}

static void deleting_the_database_mid_run_stops_with_an_error(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "slow.yaml", slow_spec);
  pid_t run = start_logged(f, spec, "run.log");
  wait_until_running(f, "slow");
  const char *suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char *path = nas_asprintf("%s/nas.db%s", f->dir, suffixes[i]);
    unlink(path);
    free(path);
  }
  assert_int_equal(exit_status(run), 1);
  char *log = nas_asprintf("%s/run.log", f->dir), *text;
  nas_err err;
  assert_int_equal(nas_read_file(log, &text, NULL, &err), NAS_OK);
  if (!strstr(text, "nas.db is gone") || !strstr(text, "deleted")) fail_msg("run said: %s", text);
  free(text), free(log), free(spec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(second_scheduler_is_refused_on_sqlite, setup, teardown),
      cmocka_unit_test_setup_teardown(second_scheduler_is_refused_on_postgresql, setup, teardown),
      cmocka_unit_test_setup_teardown(scheduler_killed_with_9_is_taken_over_at_once, setup, teardown),
      cmocka_unit_test(lease_is_judged_by_its_heartbeat_and_its_pid),
      cmocka_unit_test_setup_teardown(lease_changes_hands_only_by_compare_and_swap, setup, teardown),
      cmocka_unit_test_setup_teardown(create_of_a_changed_spec_waits_for_an_ask_holding_the_lease,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(deleting_the_database_mid_run_stops_with_an_error, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
