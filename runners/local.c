/* runners/local.c: the local backend — every job runs on this machine under a monitor.
 *
 * runner_start forks a monitor: a copy of the caller (no exec) that calls setsid(), becomes
 * a child subreaper, forks the job into a process group of its own, waits for it, enforces
 * its time limit and stop requests (TERM to the group and to every process the job started
 * that left it, KILL kill_grace seconds later), kills whatever is left of them when the job
 * ends, writes run_dir/exit.json and exits. The monitor does not depend on the caller, so
 * a scheduler killed with -9 and started again finds every job through its handle
 * "PID:STARTTIME" (the monitor's pid and field 22 of /proc/PID/stat, so that a reused pid
 * is never taken for the monitor) and its run_dir.
 *
 * Invariants:
 * - The caller keeps no state per job: handle and run_dir are all that poll and stop need.
 * - exit.json appears atomically and only after the job's process group and every other
 *   process descended from the job are gone and reaped (or, for ones that a KILL does not
 *   end within LEFTOVERS_LIMIT_S, after stderr.log says so); runner_start removes one left
 *   from an earlier run first. Polling reads it only once the monitor has ended: until
 *   then the job may have written one of its own there.
 * - The monitor is a child subreaper: a process the job started whose parent ends (a
 *   daemon that forked twice, a setsid child of an ended shell) becomes the monitor's
 *   child, not init's, so every process that ever descended from the job still descends
 *   from the monitor, whatever its group or session. The monitor starts no process but the
 *   job, so all its descendants are the job's to end, and it reaps the ones it adopts.
 * - The monitor never returns into the caller's code and ends with _exit: no atexit
 *   handlers, no flush of the caller's stdio buffers. What can fail in a way the caller
 *   must hear about (folders, log files, environment) is prepared before the fork.
 * - The caller waits only for a pid whose start time matches a handle and whose parent it
 *   is: it never reaps a process it did not start, and it reaps each monitor it started as
 *   soon as a poll sees that monitor's end.
 * - A job does not outlive its monitor: it gets SIGKILL when the monitor dies
 *   (PR_SET_PDEATHSIG), since nobody could observe or time it any more.
 * - A job polls as waiting while its monitor has no child: held, or waiting for GPUs.
 * - A job started held runs only once the caller writes "go" on the hold pipe (fd 4 in
 *   the monitor). If the caller dies first, or frees the runner, the pipe closes and the
 *   monitor ends without running the job and without exit.json (polling says JOB_LOST).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runners/backend.h"
#include "runners/gpus.h"

#define DEFAULT_KILL_GRACE_S 5.0
#define EXIT_NOT_STARTED 127 /* exit code of a job whose command could not run (as in sh) */
#define DESCENDANTS_MAX 256  /* processes one walk pins (pidfds); more are left to the next */
#define LEFTOVERS_LIMIT_S 5.0 /* how long an ended job's leftovers may take to die of KILL */

/* A job started held: the write end of the pipe its monitor waits on. */
typedef struct {
  char *handle; /* owned */
  int fd;       /* owned */
} held_job;

typedef struct {
  double kill_grace; /* seconds between TERM and KILL */
  runner_self self;  /* the nas binary the jobs are told of */
  gpu_pool gpus;     /* devices shared out among the jobs; none unless the spec asks */
  held_job *held;    /* owned: jobs started held and not released yet */
  size_t n_held;
} local_runner;

/* The monitor a handle names. */
typedef struct {
  pid_t pid;
  unsigned long long start; /* field 22 of /proc/PID/stat: clock ticks after boot */
} monitor_id;

/* What /proc/PID/stat says about a process. */
typedef struct {
  char state; /* 'R', 'S', 'Z', … */
  pid_t ppid;
  pid_t pgrp; /* process group */
  unsigned long long start;
} proc_stat;

/* A process found to descend from the monitor, pinned by a pidfd: its pid may come to name
 * another process once it is reaped, the pidfd never does. */
typedef struct {
  pid_t pid;
  int pidfd; /* owned */
} descendant;

/* One walk over the monitor's descendants (descendants_signal). */
typedef struct {
  descendant found[DESCENDANTS_MAX];
  size_t n;
  bool any_running; /* one found (or left for a later walk) had not ended: not a zombie */
} descendant_walk;

/* Everything the monitor needs, prepared by the caller before the fork. */
typedef struct {
  char *const *argv;   /* borrowed from the job */
  const char *workdir; /* borrowed from the job */
  char **envp;         /* owned array of borrowed strings: the job's whole environment */
  char *self_env[3];   /* owned: NAS_BIN=… and PATH=… (nas's folder first), on top of the
                          job's env; NULL-terminated */
  char *exit_path;     /* owned: run_dir/exit.json */
  int null_fd;         /* owned, -1 when closed: the job's stdin (/dev/null) */
  int out_fd;          /* owned, -1 when closed: stdout.log, appended to */
  int err_fd;          /* owned, -1 when closed: stderr.log, appended to */
  double timeout_s;    /* 0 = none */
  double kill_grace;
  int hold_fd;         /* borrowed, -1 when not held: the pipe end the monitor waits on */
  const gpu_pool *gpus; /* borrowed: devices to take before the job starts (n = 0: none) */
  char cuda_env[GPU_ENV_MAX]; /* the job's CUDA_VISIBLE_DEVICES=… and NAS_GPUS=…, filled in */
  char gpus_env[GPU_ENV_MAX]; /* by the monitor once it holds the devices (envp points here) */
} launch;

/* ---- /proc and handles ---- */

/* Reads /proc/pid/stat into *out; -1 when there is no such process. */
static int proc_stat_read(pid_t pid, proc_stat *out) {
  char path[32], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  /* The command name (field 2) may hold spaces and ')': fields go on after the last ')'.
   * Then come state (3), ppid (4), pgrp (5), 16 fields we skip (6-21) and the start time
   * (22). */
  const char *rest = strrchr(text, ')');
  int ppid, pgrp;
  if (!rest || sscanf(rest + 1,
                      " %c %d %d %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s"
                      " %*s %llu",
                      &out->state, &ppid, &pgrp, &out->start) != 4)
    return -1;
  out->ppid = (pid_t)ppid;
  out->pgrp = (pid_t)pgrp;
  return 0;
}

static int handle_parse(const char *handle, monitor_id *id, nas_err *err) {
  char *end;
  errno = 0;
  long pid = isdigit((unsigned char)handle[0]) ? strtol(handle, &end, 10) : 0;
  bool ok = pid > 0 && pid <= INT_MAX && *end == ':' && isdigit((unsigned char)end[1]);
  if (ok) {
    id->pid = (pid_t)pid;
    id->start = strtoull(end + 1, &end, 10);
    ok = *end == '\0' && errno == 0;
  }
  if (!ok) return nas_errf(err, "malformed local job handle '%s' (expected PID:STARTTIME)", handle);
  return NAS_OK;
}

/* Whether the monitor id names is still running (an ended one waiting to be reaped is not). */
static bool monitor_running(monitor_id id) {
  proc_stat st;
  if (proc_stat_read(id.pid, &st) != 0 || st.start != id.start) return false;
  return st.state != 'Z' && st.state != 'X';
}

/* Whether the monitor has forked its job: a monitor without a child waits for its "go"
 * (held) or for free GPUs. Read from /proc/PID/task/PID/children; a kernel without that
 * file says yes. */
static bool monitor_has_job(monitor_id id) {
  char path[64], text[32];
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)id.pid, (int)id.pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  ssize_t n = read(fd, text, sizeof text);
  close(fd);
  return n != 0;
}

/* Reaps the monitor when it is the caller's child. Called once it has ended or written
 * exit.json, after which its only step left is _exit, so waiting cannot last. */
static void monitor_reap(monitor_id id) {
  proc_stat st;
  if (proc_stat_read(id.pid, &st) != 0 || st.start != id.start || st.ppid != getpid()) return;
  while (waitpid(id.pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

/* Sends sig to the monitor unless it has ended. The pidfd pins the process before its
 * start time is compared, so the signal cannot reach another process that reused the pid;
 * kernels without pidfd_open fall back to kill() after the same check. */
static int monitor_signal(monitor_id id, int sig, nas_err *err) {
  int pidfd = pidfd_open(id.pid, 0);
  if (pidfd < 0 && errno == ESRCH) return NAS_OK;
  if (pidfd < 0 && errno != ENOSYS)
    return nas_errf(err, "monitor %d: %s", (int)id.pid, strerror(errno));
  int rc = 0;
  if (monitor_running(id))
    rc = pidfd >= 0 ? pidfd_send_signal(pidfd, sig, NULL, 0) : kill(id.pid, sig);
  int sent_errno = errno;
  if (pidfd >= 0) close(pidfd);
  if (rc != 0 && sent_errno != ESRCH)
    return nas_errf(err, "cannot signal monitor %d: %s", (int)id.pid, strerror(sent_errno));
  return NAS_OK;
}

/* ---- the monitor (runs in the forked child; never returns) ---- */

/* Signals the monitor waits for: its job's end, and stop requests. */
static sigset_t monitor_signals(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

/* Undoes the caller's handlers and ignored signals (exec keeps ignored ones, and a job
 * that inherits an ignored SIGPIPE or SIGTERM misbehaves). */
static void signals_reset(void) {
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; sig++) sigaction(sig, &dfl, NULL); /* fails for KILL/STOP */
}

static _Noreturn void monitor_fail(int report_fd, const char *what) {
  dprintf(report_fd, "-%s: %s", what, strerror(errno));
  _exit(1);
}

/* Makes stdin /dev/null and stdout/stderr the logs (the job inherits them), puts the report
 * pipe on fd 3 and the hold pipe (when held) on fd 4, and closes every other descriptor
 * inherited from the caller. The copies above 9 come first so that no dup2 overwrites a
 * descriptor still to be moved. */
static void monitor_fds_install(const launch *l, int report_fd) {
  int from[] = {l->null_fd, l->out_fd, l->err_fd, report_fd, l->hold_fd};
  int n = l->hold_fd >= 0 ? 5 : 4, high[5];
  for (int i = 0; i < n; i++) {
    high[i] = fcntl(from[i], F_DUPFD_CLOEXEC, 10);
    if (high[i] < 0) monitor_fail(report_fd, "cannot set up the job's files");
  }
  for (int i = 0; i < 3; i++)
    if (dup2(high[i], i) < 0) monitor_fail(high[3], "cannot set up the job's files");
  for (int i = 3; i < n; i++)
    if (dup3(high[i], i, O_CLOEXEC) < 0) monitor_fail(high[3], "cannot set up the job's files");
  if (close_range((unsigned)n, ~0U, 0) != 0) {
    for (int fd = n; fd < 1024; fd++) close(fd); /* kernels before 5.9 */
  }
}

/* A held monitor waits for "g" on fd 4; anything else (the caller died) ends it quietly. */
static void hold_wait(const launch *l) {
  if (l->hold_fd < 0) return;
  char go = 0;
  ssize_t got;
  while ((got = read(4, &go, 1)) < 0 && errno == EINTR) {
  }
  if (got != 1 || go != 'g') _exit(0);
  close(4);
}

/* The job's side of the fork: its own process group, default signals, its folder, its
 * environment, then the command. */
static _Noreturn void job_exec(const launch *l, pid_t monitor) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != monitor) _exit(EXIT_NOT_STARTED); /* the monitor died before prctl */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (chdir(l->workdir) != 0) {
    dprintf(2, "nas: cannot enter workdir %s: %s\n", l->workdir, strerror(errno));
    _exit(EXIT_NOT_STARTED);
  }
  environ = l->envp; /* so that execvp searches the job's PATH, not the caller's */
  execvp(l->argv[0], l->argv);
  dprintf(2, "nas: cannot run '%s' (in %s): %s\n", l->argv[0], l->workdir, strerror(errno));
  _exit(EXIT_NOT_STARTED);
}

/* Waits for one of the monitor's signals for up to seconds (INFINITY = no limit). */
static int signal_wait(const sigset_t *set, double seconds) {
  if (isinf(seconds)) return sigwaitinfo(set, NULL);
  if (seconds < 0) seconds = 0;
  time_t whole = (time_t)seconds;
  struct timespec ts = {.tv_sec = whole, .tv_nsec = (long)((seconds - (double)whole) * 1e9)};
  return sigtimedwait(set, NULL, &ts);
}

/* The process with pid that the walk found, or NULL. */
static const descendant *walk_find(const descendant_walk *w, pid_t pid) {
  for (size_t i = 0; i < w->n; i++)
    if (w->found[i].pid == pid) return &w->found[i];
  return NULL;
}

/* Whether a process whose parent is ppid descends from the monitor: ppid is the monitor's,
 * or that of a process the walk found that still holds it, not reaped (a pidfd signals a
 * zombie too; EPERM answers for a live process this user may not signal). */
static bool walk_is_parent(const descendant_walk *w, pid_t ppid) {
  if (ppid == getpid()) return true;
  const descendant *parent = walk_find(w, ppid);
  return parent && (pidfd_send_signal(parent->pidfd, 0, NULL, 0) == 0 || errno == EPERM);
}

/* Adds the process pid to the walk if it descends from the monitor, and sends it sig unless
 * it belongs to group skip_group. Returns whether it was added. */
static bool walk_visit(descendant_walk *w, pid_t pid, int sig, pid_t skip_group) {
  proc_stat st;
  if (walk_find(w, pid) || proc_stat_read(pid, &st) != 0 || !walk_is_parent(w, st.ppid))
    return false;
  int pidfd = pidfd_open(pid, 0);
  if (pidfd < 0) {
    if (errno != ESRCH && errno != ENOSYS) w->any_running = true; /* out of fds: next walk */
    return false;
  }
  /* Read again now that the pidfd pins the process, and check the parent after that read:
   * still unreaped, it held its pid at the read, so the process then was its child. If the
   * pinned process ended before the read and another took its pid, the signal below finds
   * nobody, and the other is not taken for anyone's parent (its pidfd says reaped). */
  bool descends = proc_stat_read(pid, &st) == 0 && walk_is_parent(w, st.ppid);
  if (descends && st.state != 'Z' && st.state != 'X') w->any_running = true;
  if (!descends || w->n == DESCENDANTS_MAX) {
    close(pidfd);
    return false;
  }
  if (st.pgrp != skip_group) pidfd_send_signal(pidfd, sig, NULL, 0);
  w->found[w->n++] = (descendant){.pid = pid, .pidfd = pidfd};
  return true;
}

/* Sends sig to every process that descends from the monitor (the job and all it started,
 * in its group or not), except members of group skip_group (0: none), which the caller
 * signals as a group. Each process is found through its parent's pid in /proc, pass after
 * pass until one finds nobody new: a child listed before its parent, or forked meanwhile,
 * is found by a later pass. Returns whether any of them had not ended. Without pidfds
 * (kernels before 5.3) it finds none. */
static bool descendants_signal(int sig, pid_t skip_group) {
  descendant_walk w = {.n = 0};
  DIR *proc = opendir("/proc");
  if (!proc) return false;
  for (bool added = true; added;) {
    added = false;
    rewinddir(proc);
    for (struct dirent *e; (e = readdir(proc));)
      if (isdigit((unsigned char)e->d_name[0]) &&
          walk_visit(&w, (pid_t)strtol(e->d_name, NULL, 10), sig, skip_group))
        added = true;
  }
  closedir(proc);
  for (size_t i = 0; i < w.n; i++) close(w.found[i].pidfd);
  return w.any_running;
}

/* Sends sig to the job's process group and to every process it started that left it. */
static void job_signal(pid_t job, int sig) {
  killpg(job, sig);
  descendants_signal(sig, job);
}

/* Reaps the monitor's ended children other than the job (0 once job_reap has reaped it):
 * processes it adopted. waitid with WNOWAIT names an ended child without reaping it, so
 * that the job, ended or not, is only ever reaped by job_reap; when it is the one named,
 * the rest wait for a later call. */
static void adopted_reap(pid_t job) {
  for (;;) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0 ||
        info.si_pid == job)
      return;
    while (waitpid(info.si_pid, NULL, 0) < 0 && errno == EINTR) {
    }
  }
}

/* Whether the monitor has a child, ended or not: every descendant descends through one, so
 * without one there is nothing to look for in /proc. */
static bool monitor_has_child(void) {
  siginfo_t info;
  return waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 || errno != ECHILD;
}

/* Kills every process the ended and reaped job left, round after round while one still
 * runs (the children of a killed one come to the monitor; one may fork before its KILL
 * lands), reaping the ones that come to the monitor, for at most LEFTOVERS_LIMIT_S: one
 * that a KILL does not end by then (stuck in the kernel) is left to end on its own, and
 * stderr.log says so. */
static void leftovers_kill(void) {
  sigset_t child_ended;
  sigemptyset(&child_ended);
  sigaddset(&child_ended, SIGCHLD);
  double give_up = nas_monotonic() + LEFTOVERS_LIMIT_S;
  while (monitor_has_child() && descendants_signal(SIGKILL, 0)) {
    adopted_reap(0);
    if (nas_monotonic() > give_up) {
      dprintf(2, "nas monitor: processes the job started still run %.0f s after SIGKILL\n",
              LEFTOVERS_LIMIT_S);
      return;
    }
    signal_wait(&child_ended, 0.01); /* no signal comes for a grandchild's end */
  }
  adopted_reap(0);
}

/* Whether the job has ended. If so, kills what is left of its process group while the
 * ended job, not yet reaped, still holds the group's id (so the kill cannot reach a new
 * group that reused it), reaps it into *wstatus, then ends whatever else it left. */
static bool job_reap(pid_t job, int *wstatus) {
  siginfo_t info;
  memset(&info, 0, sizeof info);
  if (waitid(P_PID, (id_t)job, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0)
    return false;
  killpg(job, SIGKILL);
  while (waitpid(job, wstatus, 0) < 0 && errno == EINTR) {
  }
  leftovers_kill();
  return true;
}

/* Waits for the job to end, ending it at its time limit or on a stop request: TERM to
 * its group and to the processes that left it, KILL once kill_grace has passed. Every
 * event is acted on only after checking that the job has not ended meanwhile, so a job
 * ending at its deadline counts as exited. Adopted processes that end meanwhile are reaped
 * as they end (a long job may leave many). */
static job_status monitor_wait(pid_t job, const launch *l) {
  sigset_t waited = monitor_signals();
  job_state cause = JOB_EXITED; /* JOB_TIMEOUT or JOB_STOPPED once the monitor ends it */
  bool stop_requested = false;
  double deadline = l->timeout_s > 0 ? nas_monotonic() + l->timeout_s : INFINITY;
  int wstatus = 0;
  while (!job_reap(job, &wstatus)) {
    adopted_reap(job);
    double now = nas_monotonic();
    if (cause == JOB_EXITED && (stop_requested || now >= deadline)) {
      cause = stop_requested ? JOB_STOPPED : JOB_TIMEOUT;
      job_signal(job, SIGTERM);
      deadline = now + l->kill_grace;
    } else if (cause != JOB_EXITED && now >= deadline) {
      job_signal(job, SIGKILL);
      deadline = INFINITY;
    }
    int sig = signal_wait(&waited, deadline - nas_monotonic());
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) stop_requested = true;
  }
  job_status end = {.state = cause};
  if (WIFEXITED(wstatus)) end.exit_code = WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) {
    end.signal = WTERMSIG(wstatus);
    if (cause == JOB_EXITED) end.state = JOB_SIGNALED;
  }
  return end;
}

static _Noreturn void monitor_exit(const char *path, const job_status *end);

/* Takes the job's devices (their locks stay with the monitor until it ends), waiting for
 * enough of them to be free; a stop request meanwhile ends the job before it starts. */
static void gpus_take(launch *l) {
  int fds[GPU_PER_JOB_MAX];
  sigset_t waited = monitor_signals();
  for (bool told = false; !gpu_pool_take(l->gpus, fds, l->cuda_env, l->gpus_env); told = true) {
    if (!told) dprintf(2, "nas: waiting for %d free GPU%s\n", l->gpus->per_job,
                       l->gpus->per_job == 1 ? "" : "s");
    int sig = signal_wait(&waited, 0.25);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
      monitor_exit(l->exit_path, &(job_status){.state = JOB_STOPPED});
  }
}

/* Records how the job ended in exit.json and ends the monitor. */
static _Noreturn void monitor_exit(const char *path, const job_status *end) {
  char text[128];
  int n = snprintf(text, sizeof text, "{\"state\": \"%s\", \"exit_code\": %d, \"signal\": %d}\n",
                   job_state_name(end->state), end->exit_code, end->signal);
  nas_err err;
  if (nas_write_file_atomic(path, text, (size_t)n, &err) != NAS_OK) {
    dprintf(2, "nas monitor: %s\n", err.msg); /* stderr.log; poll will say JOB_LOST */
    _exit(1);
  }
  _exit(0);
}

/* Forks the job; when that fails after the caller stopped listening (a held job), the
 * failure is recorded like a command that could not run. */
static pid_t job_fork(const launch *l, int report_fd) {
  pid_t monitor = getpid(), job = fork();
  if (job == 0) job_exec(l, monitor);
  if (job > 0) {
    setpgid(job, job); /* as the job does: whichever runs first, the group exists from now on */
    return job;
  }
  if (report_fd >= 0) monitor_fail(report_fd, "cannot fork the job");
  dprintf(2, "nas monitor: cannot fork the job: %s\n", strerror(errno));
  monitor_exit(l->exit_path, &(job_status){.state = JOB_EXITED, .exit_code = EXIT_NOT_STARTED});
}

/* The monitor: reports "+" on the pipe once the job is forked ("-message" on failure) —
 * or, when held, once it is ready, then waits for "go" — then waits for the job and
 * records how it ended. Starts with every signal blocked. */
static _Noreturn void monitor_main(launch *l, int report_fd) {
  setsid(); /* out of the caller's session: a Ctrl-C in its terminal reaches neither */
  signals_reset();
  monitor_fds_install(l, report_fd);
  report_fd = 3;
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) /* the job's orphans come here, not to init */
    monitor_fail(report_fd, "cannot become the job's subreaper");
  sigset_t waited = monitor_signals();
  sigprocmask(SIG_SETMASK, &waited, NULL);
  if (l->hold_fd >= 0) {
    if (write(report_fd, "+", 1) != 1) _exit(1);
    close(report_fd);
    report_fd = -1;
    hold_wait(l);
  }
  if (l->gpus->n > 0) { /* the wait may be long: the caller hears now, as for a held job */
    if (report_fd >= 0 && write(report_fd, "+", 1) != 1) _exit(1);
    if (report_fd >= 0) close(report_fd);
    report_fd = -1;
    gpus_take(l);
  }
  pid_t job = job_fork(l, report_fd);
  if (report_fd >= 0) {
    if (write(report_fd, "+", 1) != 1) _exit(1); /* caller gone; so is the job (PDEATHSIG) */
    close(report_fd);
  }
  job_status end = monitor_wait(job, l);
  monitor_exit(l->exit_path, &end);
}

/* ---- the caller's side ---- */

/* Whether the variable of entry ("NAME=…") is set again by one of extra[from…]. */
static bool env_set_later(const char *entry, char *const *extra, size_t from) {
  size_t name_len = strcspn(entry, "=");
  for (size_t i = from; extra[i]; i++)
    if (strncmp(extra[i], entry, name_len) == 0 && extra[i][name_len] == '=') return true;
  return false;
}

/* The caller's environment with extra on top: a later entry wins over an earlier one. */
static int env_merge(char *const *extra, char ***out, nas_err *err) {
  size_t n_base = 0, n_extra = 0;
  while (environ && environ[n_base]) n_base++;
  while (extra && extra[n_extra]) n_extra++;
  for (size_t i = 0; i < n_extra; i++)
    if (extra[i][0] == '=' || !strchr(extra[i], '='))
      return nas_errf(err, "environment entry '%s' is not NAME=VALUE", extra[i]);
  char **envp = calloc(n_base + n_extra + 1, sizeof *envp);
  if (!envp) return nas_errf(err, "out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n_base; i++)
    if (!extra || !env_set_later(environ[i], extra, 0)) envp[k++] = environ[i];
  for (size_t i = 0; i < n_extra; i++)
    if (!env_set_later(extra[i], extra, i + 1)) envp[k++] = extra[i];
  *out = envp;
  return NAS_OK;
}

/* The value of the last PATH in env, else the caller's PATH, else the system's default
 * (where execvp would look). Borrowed. */
static const char *path_base(char *const *env, char *fallback, size_t cap) {
  const char *path = getenv("PATH");
  for (size_t i = 0; env && env[i]; i++)
    if (strncmp(env[i], "PATH=", 5) == 0) path = env[i] + 5;
  if (path) return path;
  size_t len = confstr(_CS_PATH, fallback, cap);
  return len > 0 && len <= cap ? fallback : "/usr/bin:/bin";
}

/* The job's whole environment: the caller's, the job's env on top, then NAS_BIN and the
 * PATH with nas's own folder first (runners/nas_self.c). */
static int job_env_build(const local_runner *lr, const runner_job *job, launch *l,
                         nas_err *err) {
  char fallback[256];
  l->self_env[0] = nas_asprintf("NAS_BIN=%s", lr->self.bin);
  l->self_env[1] = nas_asprintf("PATH=%s:%s", lr->self.dir,
                                path_base(job->env, fallback, sizeof fallback));
  size_t n = 0;
  while (job->env && job->env[n]) n++;
  char **extra = calloc(n + 5, sizeof *extra);
  if (!extra || !l->self_env[0] || !l->self_env[1]) {
    free(extra);
    return nas_errf(err, "out of memory");
  }
  for (size_t i = 0; i < n; i++) extra[i] = job->env[i];
  extra[n] = l->self_env[0];
  extra[n + 1] = l->self_env[1];
  if (l->gpus->n > 0) { /* the monitor writes the devices in once it holds them */
    snprintf(l->cuda_env, sizeof l->cuda_env, "CUDA_VISIBLE_DEVICES=");
    snprintf(l->gpus_env, sizeof l->gpus_env, "NAS_GPUS=");
    extra[n + 2] = l->cuda_env;
    extra[n + 3] = l->gpus_env;
  }
  int rc = env_merge(extra, &l->envp, err);
  free(extra);
  return rc;
}

static int log_open(const char *run_dir, const char *name, int *fd, nas_err *err) {
  char *path = nas_asprintf("%s/%s", run_dir, name);
  if (!path) return nas_errf(err, "%s: out of memory", run_dir);
  *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int rc = *fd < 0 ? nas_errf(err, "cannot open %s: %s", path, strerror(errno)) : NAS_OK;
  free(path);
  return rc;
}

static void launch_release(launch *l) {
  free(l->envp);
  for (int i = 0; i < 2; i++) free(l->self_env[i]);
  free(l->exit_path);
  int *fds[] = {&l->null_fd, &l->out_fd, &l->err_fd};
  for (int i = 0; i < 3; i++) {
    if (*fds[i] >= 0) close(*fds[i]);
    *fds[i] = -1;
  }
}

/* Creates run_dir, removes an old exit.json and opens the job's files. */
static int launch_prepare(const local_runner *lr, const runner_job *job, launch *l,
                          nas_err *err) {
  *l = (launch){.argv = job->argv, .workdir = job->workdir, .null_fd = -1, .out_fd = -1,
                .err_fd = -1, .timeout_s = job->timeout_s, .kill_grace = lr->kill_grace,
                .hold_fd = -1, .gpus = &lr->gpus};
  if (nas_mkdirs(job->run_dir, err) != NAS_OK) return NAS_ERR;
  l->exit_path = runner_exit_path(job->run_dir);
  if (!l->exit_path) return nas_errf(err, "%s: out of memory", job->run_dir);
  if (unlink(l->exit_path) != 0 && errno != ENOENT)
    return nas_errf(err, "cannot remove old %s: %s", l->exit_path, strerror(errno));
  l->null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (l->null_fd < 0) return nas_errf(err, "cannot open /dev/null: %s", strerror(errno));
  if (log_open(job->run_dir, "stdout.log", &l->out_fd, err) != NAS_OK ||
      log_open(job->run_dir, "stderr.log", &l->err_fd, err) != NAS_OK)
    return NAS_ERR;
  return job_env_build(lr, job, l, err);
}

/* Reads the monitor's report until it and the job have closed the pipe (the job's copy
 * closes at exec). Returns the bytes read, NUL-terminated in buf. */
static size_t report_read(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n < cap - 1) {
    ssize_t got = read(fd, buf + n, cap - 1 - n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n += (size_t)got;
  }
  buf[n] = '\0';
  return n;
}

/* Ends a monitor whose job cannot be handed to the caller (the job dies with it). */
static void monitor_abandon(pid_t pid) {
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

/* Forks the monitor for l and waits for its report; *handle names it. */
static int monitor_spawn(launch *l, char **handle, nas_err *err) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return nas_errf(err, "pipe: %s", strerror(errno));
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* nothing reaches the monitor before it is ready */
  pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    monitor_main(l, pipe_fds[1]);
  }
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  close(pipe_fds[1]);
  if (pid < 0) {
    close(pipe_fds[0]);
    return nas_errf(err, "cannot fork a monitor: %s", strerror(fork_errno));
  }
  char report[512];
  report_read(pipe_fds[0], report, sizeof report);
  close(pipe_fds[0]);
  if (report[0] != '+') {
    monitor_abandon(pid);
    return nas_errf(err, "monitor: %s",
                    report[0] == '-' ? report + 1 : "ended before the job started");
  }
  proc_stat st;
  if (proc_stat_read(pid, &st) != 0) {
    monitor_abandon(pid);
    return nas_errf(err, "cannot read /proc/%d/stat of the monitor", (int)pid);
  }
  *handle = nas_asprintf("%d:%llu", (int)pid, st.start);
  if (!*handle) {
    monitor_abandon(pid);
    return nas_errf(err, "out of memory");
  }
  return NAS_OK;
}

/* ---- the backend ---- */

static int options_read(const json_t *options, local_runner *lr, nas_err *err) {
  if (!json_is_object(options)) return nas_errf(err, "options must be a mapping");
  const char *key;
  json_t *value;
  json_object_foreach((json_t *)options, key, value) {
    if (strcmp(key, "gpus") == 0 || strcmp(key, "gpus_per_trial") == 0) continue;
    if (strcmp(key, "kill_grace") != 0)
      return nas_errf(err, "unknown option '%s' (known: kill_grace, gpus, gpus_per_trial)", key);
    double grace = json_number_value(value);
    if (!json_is_number(value) || !(grace >= 0) || !isfinite(grace))
      return nas_errf(err, "option kill_grace: expected a non-negative number of seconds");
    lr->kill_grace = grace;
  }
  return gpu_pool_read(json_object_get(options, "gpus"), json_object_get(options, "gpus_per_trial"),
                       &lr->gpus, err);
}

/* Closing a held job's pipe without "go" ends its monitor before the job runs. */
static void local_free(void *state) {
  local_runner *lr = state;
  for (size_t i = 0; i < lr->n_held; i++) {
    close(lr->held[i].fd);
    free(lr->held[i].handle);
  }
  free(lr->held);
  runner_self_free(&lr->self);
  gpu_pool_free(&lr->gpus);
  free(lr);
}

static int local_create(const json_t *options, void **state, nas_err *err) {
  local_runner *lr = calloc(1, sizeof *lr);
  if (!lr) return nas_errf(err, "out of memory");
  lr->kill_grace = DEFAULT_KILL_GRACE_S;
  lr->gpus.per_job = 1;
  if ((options && options_read(options, lr, err) != NAS_OK) ||
      runner_self_find(&lr->self, err) != NAS_OK) {
    local_free(lr);
    return NAS_ERR;
  }
  *state = lr;
  return NAS_OK;
}

/* Starts a job (checked by runner.c), held when hold_fd (the monitor's end of the hold
 * pipe) is >= 0. */
static int start_job(local_runner *lr, const runner_job *job, int hold_fd, char **handle,
                     nas_err *err) {
  launch l;
  int rc = launch_prepare(lr, job, &l, err);
  l.hold_fd = hold_fd;
  if (rc == NAS_OK) rc = monitor_spawn(&l, handle, err);
  launch_release(&l);
  if (rc != NAS_OK) return nas_err_prefix(err, "cannot start %s", job->argv[0]);
  return NAS_OK;
}

static int local_start(void *state, const runner_job *job, char **handle, nas_err *err) {
  return start_job(state, job, -1, handle, err);
}

static int local_start_held(void *state, const runner_job *job, char **handle, nas_err *err) {
  local_runner *lr = state;
  int fds[2];
  held_job *bigger = realloc(lr->held, (lr->n_held + 1) * sizeof *bigger);
  if (!bigger) return nas_errf(err, "out of memory");
  lr->held = bigger;
  if (pipe2(fds, O_CLOEXEC) != 0) return nas_errf(err, "pipe: %s", strerror(errno));
  int rc = start_job(lr, job, fds[0], handle, err);
  close(fds[0]);
  if (rc != NAS_OK) {
    close(fds[1]);
    return rc;
  }
  char *key = strdup(*handle);
  if (!key) { /* closing the pipe ends the monitor before its job runs */
    close(fds[1]);
    free(*handle);
    *handle = NULL;
    return nas_errf(err, "out of memory");
  }
  lr->held[lr->n_held++] = (held_job){.handle = key, .fd = fds[1]};
  return NAS_OK;
}

/* Writes "go" without dying of SIGPIPE when the monitor is already gone: the signal is
 * blocked for the write and a pending one taken back. */
static bool go_send(int fd) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  bool sent = write(fd, "g", 1) == 1;
  if (!sent && errno == EPIPE) {
    struct timespec none = {0, 0};
    sigtimedwait(&pipe_only, NULL, &none);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return sent;
}

static int local_release(void *state, const char *handle, nas_err *err) {
  local_runner *lr = state;
  for (size_t i = 0; i < lr->n_held; i++) {
    if (!lr->held[i].handle || strcmp(lr->held[i].handle, handle) != 0) continue;
    bool sent = go_send(lr->held[i].fd);
    close(lr->held[i].fd);
    free(lr->held[i].handle);
    lr->held[i] = lr->held[--lr->n_held];
    return sent ? NAS_OK : nas_errf(err, "job %s: its monitor is gone", handle);
  }
  return nas_errf(err, "job %s was not started held by this runner", handle);
}

/* The monitor first: while it runs, so does the job, whatever its run folder holds (the job
 * can write a file named exit.json there too; the monitor's own replaces it at the end).
 * Once the monitor has ended, exit.json says how the job ended; without one the job is
 * lost, and one that cannot be read fails the job with the reason. */
static int poll_one(const char *handle, const char *run_dir, job_status *out, nas_err *err) {
  monitor_id id;
  if (handle_parse(handle, &id, err) != NAS_OK) return NAS_ERR;
  *out = (job_status){.state = JOB_RUNNING};
  if (monitor_running(id)) {
    out->waiting = !monitor_has_job(id);
    return NAS_OK;
  }
  nas_err why;
  int found = runner_exit_file_read(run_dir, out, &why);
  if (found == 0) out->state = JOB_LOST;
  if (found < 0) {
    *out = (job_status){.state = JOB_UNREADABLE};
    snprintf(out->detail, sizeof out->detail, "%.150s", why.msg);
  }
  monitor_reap(id);
  return NAS_OK;
}

static int local_poll(void *state, char *const *handles, char *const *run_dirs, size_t n,
                      job_status *out, nas_err *err) {
  (void)state;
  for (size_t i = 0; i < n; i++)
    if (poll_one(handles[i], run_dirs[i], &out[i], err) != NAS_OK)
      return nas_err_prefix(err, "job %s", handles[i]);
  return NAS_OK;
}

static size_t local_capacity(const void *state) {
  return gpu_pool_capacity(&((const local_runner *)state)->gpus);
}

static int local_stop(void *state, const char *handle, const char *run_dir, nas_err *err) {
  (void)state;
  (void)run_dir;
  monitor_id id;
  if (handle_parse(handle, &id, err) != NAS_OK) return NAS_ERR;
  if (monitor_signal(id, SIGTERM, err) != NAS_OK) return nas_err_prefix(err, "job %s", handle);
  return NAS_OK;
}

const runner_backend runner_local_backend = {
    .type = "local",
    .create = local_create,
    .free = local_free,
    .start = local_start,
    .poll = local_poll,
    .stop = local_stop,
    .start_held = local_start_held,
    .release = local_release,
    .capacity = local_capacity,
};
