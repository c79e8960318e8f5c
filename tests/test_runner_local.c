/* Tests of the local runner with real processes: exit codes, signals, time limits, stop,
 * processes that leave the job's group, environment, folders, logs, attaching from another
 * process, lost monitors, zombies. */
#include "tests/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>

#include "metrics/metrics.h"
#include "runners/runner.h"

#define KILL_GRACE_S 0.2

typedef struct {
  char *dir;  /* a fresh folder per test */
  runner *r;  /* local runner with kill_grace 0.2 s */
  int n_runs; /* run folders handed out so far */
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = test_tmpdir();
  json_t *options = json_pack("{s:f}", "kill_grace", KILL_GRACE_S);
  nas_err err;
  if (runner_create("local", options, &f->r, &err) != NAS_OK) fail_msg("%s", err.msg);
  json_decref(options);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  runner_free(f->r);
  test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* An owned path inside the test's folder. */
static char *path_in(const fixture *f, const char *name) {
  char *path = NULL;
  assert_true(asprintf(&path, "%s/%s", f->dir, name) > 0);
  return path;
}

/* An owned fresh run folder path (not created: the runner does that). */
static char *run_dir_new(fixture *f) {
  char name[32];
  snprintf(name, sizeof name, "runs/%d", f->n_runs++);
  return path_in(f, name);
}

/* Starts argv in workdir (the test folder when NULL); returns the owned handle. */
static char *start(fixture *f, const char *run_dir, char *const *argv, const char *workdir,
                   char *const *env, double timeout_s) {
  runner_job job = {.argv = argv, .workdir = workdir ? workdir : f->dir, .run_dir = run_dir,
                    .env = env, .timeout_s = timeout_s};
  char *handle = NULL;
  nas_err err;
  if (runner_start(f->r, &job, &handle, &err) != NAS_OK) fail_msg("runner_start: %s", err.msg);
  return handle;
}

static job_status poll1(fixture *f, char *handle, char *run_dir) {
  job_status st;
  nas_err err;
  if (runner_poll(f->r, &handle, &run_dir, 1, &st, &err) != NAS_OK) fail_msg("poll: %s", err.msg);
  return st;
}

/* Polls until the job is no longer running; fails past limit_s seconds. */
static job_status wait_end(fixture *f, char *handle, char *run_dir, double limit_s) {
  double until = nas_monotonic() + limit_s;
  for (;;) {
    job_status st = poll1(f, handle, run_dir);
    if (st.state != JOB_RUNNING) return st;
    if (nas_monotonic() > until) fail_msg("job %s still running after %.1f s", handle, limit_s);
    nas_sleep(0.01);
  }
}

/* Runs a shell script to its end; returns how it ended. */
static job_status run_sh(fixture *f, const char *script, double timeout_s, char **run_dir_out) {
  char *argv[] = {"sh", "-c", (char *)script, NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, timeout_s);
  job_status st = wait_end(f, handle, run_dir, 10);
  free(handle);
  if (run_dir_out) *run_dir_out = run_dir;
  else free(run_dir);
  return st;
}

/* The owned contents of dir/name ("" when missing). */
static char *file_text(const char *dir, const char *name) {
  char *path = NULL, *text = NULL;
  assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
  if (nas_read_file(path, &text, NULL, NULL) != NAS_OK) text = strdup("");
  free(path);
  return text;
}

/* Waits up to 5 s for dir/name to hold a pid, and returns it. */
static pid_t pid_file_wait(const char *dir, const char *name) {
  double until = nas_monotonic() + 5;
  for (;;) {
    char *text = file_text(dir, name);
    pid_t pid = (pid_t)atoi(text);
    free(text);
    if (pid > 0) return pid;
    if (nas_monotonic() > until) fail_msg("no pid in %s/%s", dir, name);
    nas_sleep(0.01);
  }
}

/* Waits up to 5 s for dir/name to exist. */
static void file_wait(const char *dir, const char *name) {
  char *path = NULL;
  assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
  double until = nas_monotonic() + 5;
  while (access(path, F_OK) != 0) {
    if (nas_monotonic() > until) fail_msg("no %s", path);
    nas_sleep(0.01);
  }
  free(path);
}

/* Whether pid names a process that still runs (a zombie does not). */
static bool process_running(pid_t pid) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *fp = fopen(path, "r");
  if (!fp) return false;
  size_t n = fread(text, 1, sizeof text - 1, fp);
  fclose(fp);
  text[n] = '\0';
  const char *rest = strrchr(text, ')');
  return rest && rest[2] != 'Z' && rest[2] != 'X';
}

/* Waits up to limit_s seconds for pid to stop running; returns whether it did. */
static bool process_ends_within(pid_t pid, double limit_s) {
  double until = nas_monotonic() + limit_s;
  while (process_running(pid)) {
    if (nas_monotonic() > until) return false;
    nas_sleep(0.01);
  }
  return true;
}

/* Fields of /proc/PID/stat that processes_count can match. */
typedef enum { STAT_PPID, STAT_SESSION } stat_field;

/* Number of processes, zombies included, whose field of /proc/PID/stat is id. */
static int processes_count(stat_field field, pid_t id) {
  DIR *proc = opendir("/proc");
  assert_non_null(proc);
  int count = 0;
  struct dirent *e;
  while ((e = readdir(proc))) {
    char path[300], text[512];
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *fp = fopen(path, "r");
    if (!fp) continue;
    size_t n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = '\0';
    const char *rest = strrchr(text, ')'); /* then state, ppid, pgrp, session */
    int ppid = 0, session = 0;
    if (rest && sscanf(rest + 1, " %*c %d %*d %d", &ppid, &session) == 2 &&
        (field == STAT_PPID ? ppid : session) == id)
      count++;
  }
  closedir(proc);
  return count;
}

static void assert_no_children(void) {
  assert_int_equal(processes_count(STAT_PPID, getpid()), 0);
  assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
  assert_int_equal(errno, ECHILD);
}

static void exit_codes_are_reported(void **state) {
  fixture *f = *state;
  job_status st = run_sh(f, "exit 0", 0, NULL);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 0);
  st = run_sh(f, "exit 3", 0, NULL);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 3);
  assert_no_children();
}

static void death_by_signal_is_signaled(void **state) {
  fixture *f = *state;
  job_status st = run_sh(f, "kill -USR1 $$", 0, NULL);
  assert_int_equal(st.state, JOB_SIGNALED);
  assert_int_equal(st.signal, SIGUSR1);
  assert_no_children();
}

static void timeout_kills_whole_process_group(void **state) {
  fixture *f = *state;
  double t0 = nas_monotonic();
  char *run_dir;
  job_status st = run_sh(f, "sleep 100 & echo $! > grandchild.pid; echo $$ > job.pid; wait", 0.3,
                         &run_dir);
  double took = nas_monotonic() - t0;
  assert_int_equal(st.state, JOB_TIMEOUT);
  assert_int_equal(st.signal, SIGTERM);
  assert_true(took >= 0.3 && took < 0.3 + KILL_GRACE_S + 1);
  assert_true(process_ends_within(pid_file_wait(f->dir, "job.pid"), 0));
  assert_true(process_ends_within(pid_file_wait(f->dir, "grandchild.pid"), 0));
  char *exit_json = file_text(run_dir, "exit.json");
  assert_non_null(strstr(exit_json, "\"state\": \"timeout\""));
  free(exit_json);
  free(run_dir);
  assert_no_children();
}

static void timeout_escalates_to_kill_when_term_is_ignored(void **state) {
  fixture *f = *state;
  double t0 = nas_monotonic();
  job_status st =
      run_sh(f, "trap '' TERM; sleep 100 & echo $! > grandchild.pid; wait; wait", 0.3, NULL);
  double took = nas_monotonic() - t0;
  assert_int_equal(st.state, JOB_TIMEOUT);
  assert_int_equal(st.signal, SIGKILL);
  assert_true(took >= 0.3 + KILL_GRACE_S);
  assert_true(process_ends_within(pid_file_wait(f->dir, "grandchild.pid"), 0));
  assert_no_children();
}

static void leftovers_of_an_ended_job_are_killed(void **state) {
  fixture *f = *state;
  job_status st = run_sh(f, "sleep 100 & echo $! > grandchild.pid; exit 5", 0, NULL);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 5);
  assert_true(process_ends_within(pid_file_wait(f->dir, "grandchild.pid"), 0));
}

/* Whether pid is gone within limit_s seconds, reaped too: kill(pid, 0) fails with ESRCH (a
 * zombie still answers it). One still there is killed with its group (the escaped processes
 * below lead their own) so that a failing test leaves nothing running. */
static bool process_gone_within(pid_t pid, double limit_s) {
  double until = nas_monotonic() + limit_s;
  while (kill(pid, 0) == 0 || errno != ESRCH) {
    if (nas_monotonic() > until) {
      kill(-pid, SIGKILL);
      return false;
    }
    nas_sleep(0.01);
  }
  return true;
}

/* A job's child that starts a session of its own (setsid), and a daemon that forks twice
 * (its parent exits, so it is nobody's child in the job): both leave the job's group. */
#define ESCAPE_SETSID "setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' & "
#define ESCAPE_DAEMON "(setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' &); "

/* Both processes that ESCAPE_SETSID and ESCAPE_DAEMON started are gone, reaped too (both
 * are looked at, so that a failure leaves neither running). */
static void assert_escaped_gone(const fixture *f) {
  bool escaped_gone = process_gone_within(pid_file_wait(f->dir, "escaped.pid"), 0);
  bool daemon_gone = process_gone_within(pid_file_wait(f->dir, "daemon.pid"), 0);
  assert_true(escaped_gone);
  assert_true(daemon_gone);
}

static void processes_that_leave_the_group_end_with_the_job(void **state) {
  fixture *f = *state;
  pid_t outsider = fork(); /* the runner's caller's own child is none of the job's business */
  if (outsider == 0) {
    int null_fd = open("/dev/null", O_WRONLY); /* not the test's stdout: nobody waits on it */
    dup2(null_fd, 1);
    dup2(null_fd, 2);
    execlp("sleep", "sleep", "300", (char *)NULL);
    _exit(127);
  }
  assert_true(outsider > 0);
  job_status st = run_sh(f,
                         ESCAPE_SETSID ESCAPE_DAEMON
                         "while [ ! -s escaped.pid ] || [ ! -s daemon.pid ]; do sleep 0.01; done; "
                         "exit 4",
                         0, NULL);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 4);
  bool outsider_runs = process_running(outsider);
  kill(outsider, SIGKILL);
  assert_int_equal(waitpid(outsider, NULL, 0), outsider);
  assert_true(outsider_runs);
  assert_escaped_gone(f);
  assert_no_children();
}

/* A stop gives an escaped process TERM as it gives the group, and kill_grace to use it:
 * the job waits on its TERM for the escaped one to have handled its own (5 s of grace, so
 * a KILL at the grace's end cannot pass for an end). */
static void stop_ends_processes_that_left_the_group_with_term_first(void **state) {
  fixture *f = *state;
  runner_free(f->r);
  json_t *options = json_pack("{s:f}", "kill_grace", 5.0);
  nas_err err;
  if (runner_create("local", options, &f->r, &err) != NAS_OK) fail_msg("%s", err.msg);
  json_decref(options);
  char *argv[] = {"sh", "-c",
                  "setsid sh -c 'trap \"echo > escaped.term; exit 0\" TERM; echo $$ > escaped.pid; "
                  "while :; do sleep 0.05; done' & "
                  "trap 'while [ ! -e escaped.term ]; do sleep 0.01; done; exit 0' TERM; "
                  "while [ ! -s escaped.pid ]; do sleep 0.01; done; echo > ready; "
                  "while :; do sleep 0.05; done",
                  NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  file_wait(f->dir, "ready");
  double t0 = nas_monotonic();
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK);
  job_status st = wait_end(f, handle, run_dir, 10);
  assert_int_equal(st.state, JOB_STOPPED);
  assert_int_equal(st.signal, 0); /* ended by its own trap, not by KILL */
  assert_int_equal(st.exit_code, 0);
  assert_true(nas_monotonic() - t0 < 4);
  char *term = path_in(f, "escaped.term");
  assert_int_equal(access(term, F_OK), 0);
  assert_true(process_gone_within(pid_file_wait(f->dir, "escaped.pid"), 0));
  free(term), free(handle), free(run_dir);
  assert_no_children();
}

/* Escaped processes that ignore TERM (as the job does: they inherit it) get KILL at the
 * grace's end, as the group does. */
static void timeout_kills_processes_that_left_the_group(void **state) {
  fixture *f = *state;
  job_status st = run_sh(f, "trap '' TERM; " ESCAPE_SETSID ESCAPE_DAEMON "wait; wait", 0.3, NULL);
  assert_int_equal(st.state, JOB_TIMEOUT);
  assert_int_equal(st.signal, SIGKILL);
  assert_escaped_gone(f);
  assert_no_children();
}

/* An escaped process still forking while the monitor ends it: the monitor goes on until
 * none of its session is left (the loop is bounded, so a failure leaves at most 300). */
static void escaped_process_forking_while_killed_leaves_nothing(void **state) {
  fixture *f = *state;
  job_status st = run_sh(f,
                         "setsid sh -c 'echo $$ > escaped.pid; i=0; while [ $i -lt 300 ]; do "
                         "sleep 300 & i=$((i+1)); done; wait' & "
                         "while [ ! -s escaped.pid ]; do sleep 0.01; done; sleep 0.1",
                         0, NULL);
  assert_int_equal(st.state, JOB_EXITED);
  pid_t sid = pid_file_wait(f->dir, "escaped.pid");
  int left = processes_count(STAT_SESSION, sid);
  for (int i = 0; i < 20 && processes_count(STAT_SESSION, sid) > 0; i++) { /* clean up after a failure */
    kill(-sid, SIGKILL);
    nas_sleep(0.05);
  }
  assert_int_equal(left, 0);
  assert_no_children();
}

static void job_ending_at_its_deadline_is_exited_or_timeout(void **state) {
  fixture *f = *state;
  char *argv[] = {"sleep", "0.2", NULL};
  char *handles[4], *run_dirs[4];
  for (int i = 0; i < 4; i++) {
    run_dirs[i] = run_dir_new(f);
    handles[i] = start(f, run_dirs[i], argv, NULL, NULL, 0.2);
  }
  for (int i = 0; i < 4; i++) {
    job_status st = wait_end(f, handles[i], run_dirs[i], 5);
    assert_true((st.state == JOB_EXITED && st.exit_code == 0) || st.state == JOB_TIMEOUT);
    free(handles[i]);
    free(run_dirs[i]);
  }
  assert_no_children();
}

static void stop_ends_a_running_job(void **state) {
  fixture *f = *state;
  char *argv[] = {"sleep", "100", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_RUNNING);
  nas_err err;
  double t0 = nas_monotonic();
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_STOPPED);
  assert_int_equal(st.signal, SIGTERM);
  assert_true(nas_monotonic() - t0 < KILL_GRACE_S + 1);
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK); /* ended: no error */
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_STOPPED);
  free(handle);
  free(run_dir);
  assert_no_children();
}

static void stop_escalates_to_kill_when_term_is_ignored(void **state) {
  fixture *f = *state;
  char *argv[] = {"sh", "-c", "trap '' TERM; echo $$ > ready.pid; while :; do sleep 0.05; done",
                  NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  pid_file_wait(f->dir, "ready.pid"); /* the trap is set */
  nas_err err;
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_STOPPED);
  assert_int_equal(st.signal, SIGKILL);
  free(handle);
  free(run_dir);
  assert_no_children();
}

static void job_starts_with_default_signals_whatever_the_caller_blocks(void **state) {
  fixture *f = *state;
  sigset_t blocked, old;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  sigprocmask(SIG_BLOCK, &blocked, &old);
  struct sigaction ignore = {.sa_handler = SIG_IGN}, old_pipe;
  sigaction(SIGPIPE, &ignore, &old_pipe);

  char *argv[] = {"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  char *out = file_text(run_dir, "stdout.log");
  unsigned long long blk, ign;
  assert_int_equal(sscanf(out, "SigBlk:\t%llx\nSigIgn:\t%llx", &blk, &ign), 2);
  /* Signals 32 and 33 are glibc's own (threads); no program can set them through libc,
   * so an environment that ignores them passes that on. Every other one must be reset. */
  unsigned long long glibc_reserved = (1ULL << 31) | (1ULL << 32);
  assert_int_equal(blk, 0);
  assert_int_equal(ign & ~glibc_reserved, 0);
  free(out);
  free(handle);
  free(run_dir);

  sigaction(SIGPIPE, &old_pipe, NULL);
  sigprocmask(SIG_SETMASK, &old, NULL);
  assert_no_children();
}

static void env_reaches_the_job_and_overrides(void **state) {
  fixture *f = *state;
  setenv("NAS_T_INHERITED", "base", 1);
  setenv("NAS_T_OVERRIDDEN", "old", 1);
  char *env[] = {"NAS_T_OVERRIDDEN=new", "NAS_T_NEW=first", "NAS_T_NEW=last", NULL};
  char *argv[] = {"sh", "-c", "echo \"$NAS_T_INHERITED $NAS_T_OVERRIDDEN $NAS_T_NEW\"", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, env, 0);
  assert_int_equal(wait_end(f, handle, run_dir, 5).state, JOB_EXITED);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "base new last\n");
  free(out);
  free(handle);
  free(run_dir);
  unsetenv("NAS_T_INHERITED");
  unsetenv("NAS_T_OVERRIDDEN");
}

static void command_is_searched_in_the_jobs_path(void **state) {
  fixture *f = *state;
  char *bin = path_in(f, "bin");
  assert_int_equal(mkdir(bin, 0755), 0);
  char *tool = test_write(bin, "nas-test-tool", "#!/bin/sh\necho from-job-path\n");
  assert_int_equal(chmod(tool, 0755), 0);
  char *path_env = NULL;
  assert_true(asprintf(&path_env, "PATH=%s:/usr/bin:/bin", bin) > 0);
  char *env[] = {path_env, NULL};
  char *argv[] = {"nas-test-tool", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, env, 0);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 0);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "from-job-path\n");
  free(out);
  free(handle);
  free(run_dir);
  free(path_env);
  free(tool);
  free(bin);
}

/* A trial calls `nas …` whatever PATH nas was started with: the running binary's folder
 * comes first on the job's PATH (before the job's own PATH entry) and NAS_BIN names it. */
static void job_is_told_of_the_running_binary_first_on_its_path(void **state) {
  fixture *f = *state;
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(len > 0);
  exe[len] = '\0';
  char *env[] = {"PATH=/usr/bin:/bin", NULL};
  char *argv[] = {"sh", "-c", "echo \"$NAS_BIN\"; echo \"$PATH\"", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, env, 0);
  assert_int_equal(wait_end(f, handle, run_dir, 5).state, JOB_EXITED);
  char *out = file_text(run_dir, "stdout.log"), *expected = NULL;
  *strrchr(exe, '/') = '\0';
  assert_true(asprintf(&expected, "%s/test_runner_local\n%s:/usr/bin:/bin\n", exe, exe) > 0);
  assert_string_equal(out, expected);
  free(expected), free(out), free(handle), free(run_dir);
}

static void relative_command_runs_from_workdir(void **state) {
  fixture *f = *state;
  char *workdir = path_in(f, "work");
  char *tools = path_in(f, "work/tools");
  assert_int_equal(mkdir(workdir, 0755), 0);
  assert_int_equal(mkdir(tools, 0755), 0);
  char *script = test_write(tools, "where.sh", "#!/bin/sh\npwd -P\n");
  assert_int_equal(chmod(script, 0755), 0);
  char *argv[] = {"tools/where.sh", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, workdir, NULL, 0);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 0);
  char *out = file_text(run_dir, "stdout.log");
  char *real = realpath(workdir, NULL);
  assert_true(strlen(out) > 0);
  out[strlen(out) - 1] = '\0';
  assert_string_equal(out, real);
  free(real);
  free(out);
  free(handle);
  free(run_dir);
  free(script);
  free(tools);
  free(workdir);
}

static void output_lands_in_the_logs_of_a_new_run_dir(void **state) {
  fixture *f = *state;
  char *argv[] = {"sh", "-c", "echo out; echo err >&2; cat; echo after-stdin", NULL};
  char *run_dir = path_in(f, "deep/er/run");
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  assert_int_equal(wait_end(f, handle, run_dir, 5).state, JOB_EXITED);
  char *out = file_text(run_dir, "stdout.log"), *err_text = file_text(run_dir, "stderr.log");
  assert_string_equal(out, "out\nafter-stdin\n"); /* stdin is empty, never the caller's */
  assert_string_equal(err_text, "err\n");
  free(out);
  free(err_text);
  free(handle);
  free(run_dir);
}

/* A job the runner refuses (no command, a timeout that is no number of seconds) starts
 * nothing and removes nothing: the logs a job left in the run folder stay (they went
 * before the refusal, for every runner, when runner.c cleared the folder first). */
static void a_refused_job_leaves_the_run_folder_as_it_was(void **state) {
  fixture *f = *state;
  char *run_dir = NULL;
  assert_int_equal(run_sh(f, "echo kept", 0, &run_dir).state, JOB_EXITED);
  char *argv[] = {"true", NULL}, *none[] = {NULL};
  runner_job bad[] = {{.argv = argv, .workdir = f->dir, .run_dir = run_dir, .timeout_s = -1},
                      {.argv = argv, .workdir = f->dir, .run_dir = run_dir, .timeout_s = NAN},
                      {.argv = none, .workdir = f->dir, .run_dir = run_dir}};
  const char *why[] = {"timeout", "timeout", "no command"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *handle = NULL;
    nas_err err;
    assert_int_equal(runner_start(f->r, &bad[i], &handle, &err), NAS_ERR);
    if (!strstr(err.msg, why[i])) fail_msg("job %zu: '%s' says nothing of %s", i, err.msg, why[i]);
    assert_null(handle);
    assert_int_equal(runner_start_held(f->r, &bad[i], &handle, &err), NAS_ERR);
    assert_int_equal(runner_start_batch(f->r, &bad[i], 1, &handle, &err), NAS_ERR);
    char *out = file_text(run_dir, "stdout.log");
    assert_string_equal(out, "kept\n");
    free(out);
  }
  free(run_dir);
}

/* A batch whose last job cannot start (its run folder lies under a file) is all or
 * nothing: the jobs already started are stopped and their monitors reaped before
 * runner_start_batch returns, so no job runs on and no zombie is left. */
static void batch_failing_part_way_leaves_no_job_and_no_zombie(void **state) {
  fixture *f = *state;
  char *blocker = path_in(f, "a-file");
  free(test_write(f->dir, "a-file", "not a folder\n"));
  char *run_dirs[3] = {run_dir_new(f), run_dir_new(f), NULL};
  assert_true(asprintf(&run_dirs[2], "%s/run", blocker) > 0);
  char *argv[] = {"sleep", "30", NULL};
  runner_job jobs[3];
  for (int i = 0; i < 3; i++)
    jobs[i] = (runner_job){.argv = argv, .workdir = f->dir, .run_dir = run_dirs[i]};
  char *handles[3];
  nas_err err;
  assert_int_equal(runner_start_batch(f->r, jobs, 3, handles, &err), NAS_ERR);
  for (int i = 0; i < 3; i++) assert_null(handles[i]);
  assert_no_children();
  for (int i = 0; i < 3; i++) free(run_dirs[i]);
  free(blocker);
}

static void missing_command_exits_127_with_a_message(void **state) {
  fixture *f = *state;
  char *argv[] = {"nas-no-such-command", "x", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 127);
  char *err_text = file_text(run_dir, "stderr.log");
  assert_non_null(strstr(err_text, "cannot run 'nas-no-such-command'"));
  assert_non_null(strstr(err_text, "No such file or directory"));
  free(err_text);
  free(handle);
  free(run_dir);

  char *missing_dir = path_in(f, "no-such-workdir");
  char *ls[] = {"ls", NULL};
  run_dir = run_dir_new(f);
  handle = start(f, run_dir, ls, missing_dir, NULL, 0);
  st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.exit_code, 127);
  err_text = file_text(run_dir, "stderr.log");
  assert_non_null(strstr(err_text, "cannot enter workdir"));
  free(err_text);
  free(handle);
  free(run_dir);
  free(missing_dir);
  assert_no_children();
}

static void garbage_output_keeps_its_metric_lines(void **state) {
  fixture *f = *state;
  char *run_dir;
  job_status st = run_sh(f,
                         "head -c 300000 /dev/urandom; printf '\\nnas-metric {\"acc\": 0.5}\\n';"
                         "head -c 1000 /dev/urandom",
                         0, &run_dir);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 0);
  char *log = NULL;
  assert_true(asprintf(&log, "%s/stdout.log", run_dir) > 0);
  metric_set set = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read_rest(log, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 1);
  assert_string_equal(set.obs[0].name, "acc");
  assert_true(set.obs[0].value == 0.5);
  assert_int_equal(offset, 300000 + strlen("\nnas-metric {\"acc\": 0.5}\n") + 1000);
  metric_set_free(&set);
  free(log);
  free(run_dir);
}

static void attach_from_another_process_sees_running_then_exit(void **state) {
  fixture *f = *state;
  char *run_dir = run_dir_new(f);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t starter = fork();
  assert_true(starter >= 0);
  if (starter == 0) { /* a scheduler that starts a job and dies */
    char *argv[] = {"sh", "-c", "sleep 0.5; exit 4", NULL};
    runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
    char *handle = NULL;
    if (runner_start(f->r, &job, &handle, NULL) != NAS_OK) _exit(1);
    ssize_t w = write(fds[1], handle, strlen(handle));
    _exit(w > 0 ? 0 : 1);
  }
  close(fds[1]);
  char handle[128] = {0};
  assert_true(read(fds[0], handle, sizeof handle - 1) > 0);
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(starter, &status, 0), starter);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  assert_int_equal(poll1(f, handle, run_dir).state, JOB_RUNNING);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 4);
  free(run_dir);
  assert_no_children();
}

static void killed_monitor_means_lost_and_takes_the_job_along(void **state) {
  fixture *f = *state;
  char *argv[] = {"sh", "-c", "echo $$ > job.pid; exec sleep 100", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  pid_t job = pid_file_wait(f->dir, "job.pid");
  pid_t monitor = (pid_t)atoi(handle);
  assert_int_equal(kill(monitor, SIGKILL), 0);
  assert_true(process_ends_within(monitor, 5));
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_LOST);
  assert_true(process_ends_within(job, 5));
  nas_err err;
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK);
  free(handle);
  free(run_dir);
  assert_no_children();
}

static void many_jobs_are_polled_at_once(void **state) {
  fixture *f = *state;
  enum { N = 16 };
  char *handles[N], *run_dirs[N], scripts[N][32];
  for (int i = 0; i < N; i++) {
    snprintf(scripts[i], sizeof scripts[i], "sleep 0.%d; exit %d", i % 3, i);
    char *argv[] = {"sh", "-c", scripts[i], NULL};
    run_dirs[i] = run_dir_new(f);
    handles[i] = start(f, run_dirs[i], argv, NULL, NULL, 0);
  }
  job_status st[N];
  double until = nas_monotonic() + 10;
  for (;;) {
    nas_err err;
    assert_int_equal(runner_poll(f->r, handles, run_dirs, N, st, &err), NAS_OK);
    int running = 0;
    for (int i = 0; i < N; i++) running += st[i].state == JOB_RUNNING;
    if (running == 0) break;
    assert_true(nas_monotonic() < until);
    nas_sleep(0.02);
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(st[i].state, JOB_EXITED);
    assert_int_equal(st[i].exit_code, i);
    free(handles[i]);
    free(run_dirs[i]);
  }
  assert_no_children();
}

static void restart_in_the_same_run_dir_forgets_the_old_end(void **state) {
  fixture *f = *state;
  char *run_dir = run_dir_new(f);
  char *exit3[] = {"sh", "-c", "exit 3", NULL};
  char *handle = start(f, run_dir, exit3, NULL, NULL, 0);
  assert_int_equal(wait_end(f, handle, run_dir, 5).exit_code, 3);
  free(handle);
  char *sleeper[] = {"sleep", "100", NULL};
  handle = start(f, run_dir, sleeper, NULL, NULL, 0);
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_RUNNING);
  nas_err err;
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK);
  assert_int_equal(wait_end(f, handle, run_dir, 5).state, JOB_STOPPED);
  free(handle);
  free(run_dir);
}

static void reused_pid_is_never_taken_for_the_monitor(void **state) {
  fixture *f = *state;
  char handle[64];
  snprintf(handle, sizeof handle, "%d:1", (int)getpid()); /* our pid, another start time */
  char *run_dir = run_dir_new(f);
  nas_err err;
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK); /* and we live on */
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_LOST);
  free(run_dir);
}

static void bad_options_handles_and_jobs_are_errors(void **state) {
  fixture *f = *state;
  runner *r = NULL;
  nas_err err;
  json_t *options = json_pack("{s:f, s:i}", "kill_grace", 1.0, "kill_grase", 2);
  assert_int_equal(runner_create("local", options, &r, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "unknown option 'kill_grase'"));
  json_decref(options);
  options = json_pack("{s:i}", "kill_grace", -1);
  assert_int_equal(runner_create("local", options, &r, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "kill_grace"));
  json_decref(options);
  options = json_pack("{s:s}", "kill_grace", "5s");
  assert_int_equal(runner_create("local", options, &r, &err), NAS_ERR);
  json_decref(options);
  assert_int_equal(runner_create("slurmy", NULL, &r, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "unknown runner type 'slurmy' (known: local, slurm)"));
  assert_null(r);
  assert_int_equal(runner_create("local", NULL, &r, &err), NAS_OK);
  runner_free(r);

  char *handle = "12ab", *run_dir = f->dir;
  job_status st;
  assert_int_equal(runner_poll(f->r, &handle, &run_dir, 1, &st, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "'12ab'"));
  assert_int_equal(runner_stop(f->r, ":5", f->dir, &err), NAS_ERR);

  char *argv[] = {"true", NULL}, *no_argv[] = {NULL};
  char *bad_env[] = {"NOEQUALS", NULL};
  runner_job job = {.argv = no_argv, .workdir = f->dir, .run_dir = f->dir};
  char *out = NULL;
  assert_int_equal(runner_start(f->r, &job, &out, &err), NAS_ERR);
  job = (runner_job){.argv = argv, .workdir = f->dir, .run_dir = f->dir, .env = bad_env};
  assert_int_equal(runner_start(f->r, &job, &out, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "'NOEQUALS'"));
  job = (runner_job){.argv = argv, .workdir = f->dir, .run_dir = f->dir, .timeout_s = -1};
  assert_int_equal(runner_start(f->r, &job, &out, &err), NAS_ERR);
  job = (runner_job){.argv = argv, .workdir = f->dir, .run_dir = "/proc/nas-cannot-create"};
  assert_int_equal(runner_start(f->r, &job, &out, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "nas-cannot-create"));
  assert_null(out);
  assert_no_children();
}

/* A job that leaves the file `marker` behind when it runs. */
static runner_job touch_job(fixture *f, char **argv, char **marker, char **run_dir) {
  *marker = path_in(f, "ran");
  argv[0] = "touch", argv[1] = *marker, argv[2] = NULL;
  *run_dir = run_dir_new(f);
  return (runner_job){.argv = argv, .workdir = f->dir, .run_dir = *run_dir};
}

static void held_job_runs_only_once_released(void **state) {
  fixture *f = *state;
  char *argv[3], *marker, *run_dir;
  runner_job job = touch_job(f, argv, &marker, &run_dir);
  char *handle = NULL;
  nas_err err;
  assert_int_equal(runner_start_held(f->r, &job, &handle, &err), NAS_OK);
  nas_sleep_ms(300);
  assert_int_not_equal(access(marker, F_OK), 0); /* held: not run yet */
  job_status st;
  assert_int_equal(runner_poll(f->r, &handle, &run_dir, 1, &st, &err), NAS_OK);
  assert_int_equal(st.state, JOB_RUNNING);
  assert_int_equal(runner_release(f->r, handle, &err), NAS_OK);
  st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(access(marker, F_OK), 0);
  assert_int_equal(runner_release(f->r, handle, &err), NAS_ERR); /* only once */
  free(handle), free(run_dir), free(marker);
  assert_no_children();
}

/* A job that has not started (held here; waiting for GPUs likewise) polls as waiting, so
 * that heartbeat_timeout does not count that time as silence; once it runs it does not. */
static void a_job_not_started_yet_polls_as_waiting(void **state) {
  fixture *f = *state;
  char *marker = path_in(f, "started"), *run_dir = run_dir_new(f), *handle = NULL;
  char *argv[] = {"sh", "-c", "touch started; exec sleep 1", NULL};
  runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
  nas_err err;
  assert_int_equal(runner_start_held(f->r, &job, &handle, &err), NAS_OK);
  job_status st = poll1(f, handle, run_dir);
  assert_int_equal(st.state, JOB_RUNNING);
  assert_true(st.waiting);
  assert_int_equal(runner_release(f->r, handle, &err), NAS_OK);
  for (double until = nas_monotonic() + 5; access(marker, F_OK) != 0; nas_sleep(0.01))
    assert_true(nas_monotonic() < until);
  st = poll1(f, handle, run_dir);
  assert_int_equal(st.state, JOB_RUNNING);
  assert_false(st.waiting);
  assert_int_equal(wait_end(f, handle, run_dir, 5).state, JOB_EXITED);
  free(handle), free(run_dir), free(marker);
  assert_no_children();
}

/* The starter dies (here: frees its runner) before releasing: the job never runs and the
 * handle reads as lost, so a scheduler that crashed there retries it exactly once. */
static void held_job_whose_starter_is_gone_never_runs(void **state) {
  fixture *f = *state;
  char *argv[3], *marker, *run_dir;
  runner_job job = touch_job(f, argv, &marker, &run_dir);
  char *handle = NULL;
  nas_err err;
  runner *starter;
  json_t *options = json_pack("{s:f}", "kill_grace", KILL_GRACE_S);
  assert_int_equal(runner_create("local", options, &starter, &err), NAS_OK);
  json_decref(options);
  assert_int_equal(runner_start_held(starter, &job, &handle, &err), NAS_OK);
  runner_free(starter);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_LOST);
  assert_int_not_equal(access(marker, F_OK), 0);
  free(handle), free(run_dir), free(marker);
  assert_no_children();
}

/* ---- GPUs (a made-up device list: no GPU is needed, only the lock files) ---- */

/* Checks the local runner's options_json (kill_grace 0.2 s added) with the GPU lock files
 * under the test's folder (TMPDIR, as the runner reads it, only for the while); when out
 * is not NULL, *out gets the runner. Returns what runner_create returned. */
static int gpu_runner_create(fixture *f, const char *options_json, runner **out, nas_err *err) {
  json_t *options = json_loads(options_json, 0, NULL);
  assert_non_null(options);
  json_object_set_new(options, "kill_grace", json_real(KILL_GRACE_S));
  char *tmpdir = getenv("TMPDIR") ? strdup(getenv("TMPDIR")) : NULL;
  setenv("TMPDIR", f->dir, 1);
  int rc = out ? runner_create("local", options, out, err)
               : runner_validate_options("local", options, err);
  if (tmpdir) setenv("TMPDIR", tmpdir, 1);
  else unsetenv("TMPDIR");
  free(tmpdir);
  json_decref(options);
  return rc;
}

/* The fixture's runner replaced by one with options_json. */
static void gpu_runner_use(fixture *f, const char *options_json) {
  runner_free(f->r);
  f->r = NULL;
  nas_err err;
  if (gpu_runner_create(f, options_json, &f->r, &err) != NAS_OK) fail_msg("%s", err.msg);
}

/* Each line of a job's stdout.log: "START DEVICES NAS_GPUS END". */
typedef struct {
  double start, end;
  char devices[32], nas_gpus[32];
} gpu_job_log;

static gpu_job_log gpu_job_log_read(const char *run_dir) {
  gpu_job_log log = {0};
  char *out = file_text(run_dir, "stdout.log");
  assert_int_equal(sscanf(out, "%lf %31s %31s %lf", &log.start, log.devices, log.nas_gpus, &log.end), 4);
  free(out);
  return log;
}

static bool devices_overlap(const char *a, const char *b) {
  for (const char *p = a; *p; p++)
    if (*p != ',' && strchr(b, *p)) return true;
  return false;
}

static void trials_get_disjoint_gpus_and_wait_for_free_ones(void **state) {
  fixture *f = *state;
  gpu_runner_use(f, "{\"gpus\": [0, 1, 2, 3], \"gpus_per_trial\": 2}");
  assert_int_equal(runner_capacity(f->r), 2);
  char *argv[] = {"sh", "-c",
                  "printf '%s %s %s ' $(date +%s.%N) \"$CUDA_VISIBLE_DEVICES\" \"$NAS_GPUS\";"
                  " sleep 2; date +%s.%N", NULL}; /* long enough to overlap under ASan and load */
  char *run_dirs[3], *handles[3];
  for (int i = 0; i < 3; i++) {
    run_dirs[i] = run_dir_new(f);
    handles[i] = start(f, run_dirs[i], argv, NULL, NULL, 0);
  }
  gpu_job_log logs[3];
  int last = 0; /* the job that started last: it waited */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(wait_end(f, handles[i], run_dirs[i], 20).state, JOB_EXITED);
    logs[i] = gpu_job_log_read(run_dirs[i]);
    assert_string_equal(logs[i].devices, logs[i].nas_gpus);
    assert_int_equal(strlen(logs[i].devices), 3); /* two devices: "N,M" */
    if (logs[i].start > logs[last].start) last = i;
  }
  /* Two ran at once on disjoint devices; the third started only once one had ended. */
  int a = last == 0 ? 1 : 0, b = last == 2 ? 1 : 2;
  assert_true(logs[a].start < logs[b].end && logs[b].start < logs[a].end);
  assert_false(devices_overlap(logs[a].devices, logs[b].devices));
  assert_true(logs[last].start >= (logs[a].end < logs[b].end ? logs[a].end : logs[b].end));
  char *waited = file_text(run_dirs[last], "stderr.log");
  assert_string_equal(waited, "nas: waiting for 2 free GPUs\n");
  free(waited);
  for (int i = 0; i < 3; i++) free(handles[i]), free(run_dirs[i]);
}

static void stop_ends_a_trial_still_waiting_for_gpus(void **state) {
  fixture *f = *state;
  gpu_runner_use(f, "{\"gpus\": [7]}");
  /* The busy job says which GPU it got before it sleeps: the second job starts only once
   * the first holds GPU 7 (started together, either may take it first). */
  char *busy[] = {"sh", "-c", "echo \"gpu $NAS_GPUS\"; exec sleep 5", NULL};
  char *quick[] = {"echo", "ran", NULL};
  char *busy_dir = run_dir_new(f), *waiting_dir = run_dir_new(f);
  char *busy_handle = start(f, busy_dir, busy, NULL, NULL, 0);
  double until = nas_monotonic() + 20;
  char *held = file_text(busy_dir, "stdout.log");
  while (!strstr(held, "gpu 7") && nas_monotonic() < until) {
    free(held);
    nas_sleep(0.05);
    held = file_text(busy_dir, "stdout.log");
  }
  assert_non_null(strstr(held, "gpu 7"));
  free(held);
  char *waiting = start(f, waiting_dir, quick, NULL, NULL, 0);
  nas_sleep(0.3);
  assert_int_equal(poll1(f, waiting, waiting_dir).state, JOB_RUNNING);
  nas_err err;
  assert_int_equal(runner_stop(f->r, waiting, waiting_dir, &err), NAS_OK);
  assert_int_equal(wait_end(f, waiting, waiting_dir, 5).state, JOB_STOPPED);
  char *out = file_text(waiting_dir, "stdout.log");
  assert_string_equal(out, ""); /* it never ran */
  assert_int_equal(runner_stop(f->r, busy_handle, busy_dir, &err), NAS_OK);
  assert_int_equal(wait_end(f, busy_handle, busy_dir, 5).state, JOB_STOPPED);
  free(out), free(busy_handle), free(waiting), free(busy_dir), free(waiting_dir);
}

static void bad_gpu_options_are_refused_and_no_gpus_means_no_limit(void **state) {
  fixture *f = *state;
  static const char *const bad[][2] = {
      {"{\"gpus\": []}", "non-empty list"},
      {"{\"gpus\": [0, 0]}", "device 0 is listed twice"},
      {"{\"gpus\": [-1]}", "item 1 is not a device number"},
      {"{\"gpus\": \"all\"}", "expected auto or a list"},
      {"{\"gpus\": [0], \"gpus_per_trial\": 0}", "gpus_per_trial: expected"},
      {"{\"gpus\": [0, 1], \"gpus_per_trial\": 3}", "only 2 GPUs to share out"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    nas_err err;
    assert_int_equal(gpu_runner_create(f, bad[i][0], NULL, &err), NAS_ERR);
    if (!strstr(err.msg, bad[i][1])) fail_msg("%s: '%s' lacks '%s'", bad[i][0], err.msg, bad[i][1]);
  }
  if (access("/proc/driver/nvidia/gpus", F_OK) != 0) { /* no GPU here: auto is refused */
    nas_err err;
    assert_int_equal(gpu_runner_create(f, "{\"gpus\": \"auto\"}", NULL, &err), NAS_ERR);
    assert_non_null(strstr(err.msg, "no NVIDIA GPU"));
  }
  assert_int_equal(runner_capacity(f->r), 0);
}

/* The lock folder another user could have made first in a shared /tmp: one that is not a
 * directory of this user that only it may write to is refused (its locks could be held or
 * swapped by others), and a symlink is not followed. */
static void gpu_lock_folder_others_control_is_refused(void **state) {
  fixture *f = *state;
  char name[64];
  snprintf(name, sizeof name, "nas-gpus-%u", (unsigned)getuid());
  char *lock_dir = path_in(f, name), *elsewhere = path_in(f, "elsewhere");
  static const char *const refusals[] = {"group or others may write", "not a directory",
                                         "owned by uid"};
  for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
    if (i == 0) {
      assert_int_equal(mkdir(lock_dir, 0700), 0);
      assert_int_equal(chmod(lock_dir, 0777), 0);
    } else if (i == 1) {
      assert_int_equal(rmdir(lock_dir), 0);
      assert_int_equal(mkdir(elsewhere, 0700), 0);
      assert_int_equal(symlink(elsewhere, lock_dir), 0); /* to a good folder: still refused */
    } else {
      if (getuid() != 0) break; /* only root can give the folder to someone else */
      assert_int_equal(unlink(lock_dir), 0);
      assert_int_equal(mkdir(lock_dir, 0700), 0);
      assert_int_equal(chown(lock_dir, getuid() + 1, (gid_t)-1), 0);
    }
    nas_err err;
    assert_int_equal(gpu_runner_create(f, "{\"gpus\": [0]}", NULL, &err), NAS_ERR);
    if (!strstr(err.msg, refusals[i]) || !strstr(err.msg, lock_dir))
      fail_msg("'%s' lacks '%s' or the folder", err.msg, refusals[i]);
  }
  /* Once the folder is this user's own again, the options are taken. */
  if (getuid() == 0) assert_int_equal(rmdir(lock_dir), 0);
  else assert_int_equal(unlink(lock_dir), 0);
  nas_err err;
  assert_int_equal(gpu_runner_create(f, "{\"gpus\": [0]}", NULL, &err), NAS_OK);
  struct stat st;
  assert_int_equal(lstat(lock_dir, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  free(lock_dir), free(elsewhere);
}

/* The job can write in its run folder too: an exit.json of its own, malformed or not, is
 * neither an error nor taken for its end while it runs, and the monitor's replaces it. */
static void exit_json_the_job_writes_is_not_taken_for_its_end(void **state) {
  fixture *f = *state;
  char *run_dir = run_dir_new(f), *script;
  assert_true(asprintf(&script,
                       "printf 'garbage{' > %s/exit.json; touch bad; sleep 0.3; "
                       "printf '{\"state\": \"exited\", \"exit_code\": 0, \"signal\": 0}' > "
                       "%s/exit.json; touch fake; sleep 0.3; exit 4",
                       run_dir, run_dir) > 0);
  char *argv[] = {"sh", "-c", script, NULL};
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  file_wait(f->dir, "bad");
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_RUNNING);
  file_wait(f->dir, "fake");
  assert_int_equal(poll1(f, handle, run_dir).state, JOB_RUNNING);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 4);
  free(handle), free(run_dir), free(script);
  assert_no_children();
}

/* A folder named exit.json keeps the monitor from recording the end: the job is not lost
 * (a retry would meet the same) but ends unreadable, with the reason. */
static void exit_json_the_job_spoils_ends_it_unreadable_with_the_reason(void **state) {
  fixture *f = *state;
  char *run_dir = run_dir_new(f), *script;
  assert_true(asprintf(&script, "mkdir %s/exit.json", run_dir) > 0);
  char *argv[] = {"sh", "-c", script, NULL};
  char *handle = start(f, run_dir, argv, NULL, NULL, 0);
  job_status st = wait_end(f, handle, run_dir, 5);
  assert_int_equal(st.state, JOB_UNREADABLE);
  assert_non_null(strstr(st.detail, "exit.json is not a regular file"));
  free(handle), free(run_dir), free(script);
  assert_no_children();
}

static void job_states_have_names(void **state) {
  (void)state;
  const char *names[] = {"running", "exited", "signaled", "timeout", "stopped", "lost",
                         "unreadable"};
  for (job_state s = JOB_RUNNING; s <= JOB_UNREADABLE; s++)
    assert_string_equal(job_state_name(s), names[s]);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(exit_codes_are_reported),
      T(death_by_signal_is_signaled),
      T(timeout_kills_whole_process_group),
      T(timeout_escalates_to_kill_when_term_is_ignored),
      T(leftovers_of_an_ended_job_are_killed),
      T(processes_that_leave_the_group_end_with_the_job),
      T(stop_ends_processes_that_left_the_group_with_term_first),
      T(timeout_kills_processes_that_left_the_group),
      T(escaped_process_forking_while_killed_leaves_nothing),
      T(job_ending_at_its_deadline_is_exited_or_timeout),
      T(stop_ends_a_running_job),
      T(stop_escalates_to_kill_when_term_is_ignored),
      T(job_starts_with_default_signals_whatever_the_caller_blocks),
      T(env_reaches_the_job_and_overrides),
      T(command_is_searched_in_the_jobs_path),
      T(job_is_told_of_the_running_binary_first_on_its_path),
      T(relative_command_runs_from_workdir),
      T(output_lands_in_the_logs_of_a_new_run_dir),
      T(a_refused_job_leaves_the_run_folder_as_it_was),
      T(batch_failing_part_way_leaves_no_job_and_no_zombie),
      T(missing_command_exits_127_with_a_message),
      T(garbage_output_keeps_its_metric_lines),
      T(attach_from_another_process_sees_running_then_exit),
      T(killed_monitor_means_lost_and_takes_the_job_along),
      T(many_jobs_are_polled_at_once),
      T(restart_in_the_same_run_dir_forgets_the_old_end),
      T(reused_pid_is_never_taken_for_the_monitor),
      T(bad_options_handles_and_jobs_are_errors),
      T(held_job_runs_only_once_released),
      T(a_job_not_started_yet_polls_as_waiting),
      T(held_job_whose_starter_is_gone_never_runs),
      T(exit_json_the_job_writes_is_not_taken_for_its_end),
      T(exit_json_the_job_spoils_ends_it_unreadable_with_the_reason),
      T(job_states_have_names),
      T(trials_get_disjoint_gpus_and_wait_for_free_ones),
      T(stop_ends_a_trial_still_waiting_for_gpus),
      T(bad_gpu_options_are_refused_and_no_gpus_means_no_limit),
      T(gpu_lock_folder_others_control_is_refused),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
