/* runners/slurm_cmd.c: running Slurm's commands (sbatch, squeue, scancel) for the runner.
 *
 * A command is spawned with posix_spawnp from an argv, never through a shell; it is found
 * in PATH and inherits the caller's environment (so SLURM_CONF is honoured) less its
 * secrets, NAS_STORAGE (which may hold a database password) and NAS_TOKEN: sbatch
 * --export=ALL would hand them to Slurm, which keeps a job's environment in its
 * controller's state and may keep it in accounting; a trial gets its own from its run
 * folder's env.sh, which only its user can read. Its stdout
 * and stderr are read together until both close and it is waited for, both within its
 * time limit; a command past it (one that closed its output but kept running too) is
 * killed.
 * A failure that looks transient (the controller did not answer, a socket timed out) is
 * retried after a wait that doubles each time, a bounded number of times; any other
 * failure is reported at once with what the command wrote to stderr.
 *
 * Invariants:
 * - The child starts with an empty signal mask and default handlers, whatever the caller
 *   (the scheduler blocks SIGCHLD, SIGINT and SIGTERM) has set, stdin on /dev/null, and
 *   no descriptor of the caller's but its pipes.
 * - The child leads a process group of its own: a Ctrl-C in the caller's terminal is the
 *   scheduler's to handle (its first one lets running trials finish) and never kills an
 *   sbatch or squeue half-way; a command past its time limit is killed with its group.
 * - Only the spawned pid is waited for, and always: no zombie is left behind. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runners/slurm_internal.h"

extern char **environ;

/* Words in stderr that mean "try again": the controller or a node did not answer in time,
 * or asked to be called later. Matched without regard to case. */
static const char *const transient_words[] = {
    "socket timed out",
    "unable to contact slurm controller",
    "connection refused",
    "connection reset",
    "zero bytes were transmitted",
    "resource temporarily unavailable",
    "transport endpoint is not connected",
    "communication connection failure",
    "temporarily unable",
    "try again",
};

void slurm_output_free(slurm_output *res) {
  free(res->out);
  free(res->errs);
  res->out = res->errs = NULL;
}

/* A growing text read from a pipe. */
typedef struct {
  int fd;     /* owned; -1 once the writer closed it */
  char *text; /* owned, NUL-terminated */
  size_t len, cap;
} capture;

/* Gives c its buffer; c->fd is set already (and owned by c whatever happens). */
static int capture_alloc(capture *c) {
  c->cap = 1024;
  c->text = malloc(c->cap);
  if (!c->text) return NAS_ERR;
  c->text[0] = '\0';
  return NAS_OK;
}

/* Reads what the pipe holds; closes it at end of file. NAS_ERR when out of memory. */
static int capture_read(capture *c) {
  if (c->cap - c->len < 512) {
    char *bigger = realloc(c->text, c->cap * 2);
    if (!bigger) return NAS_ERR;
    c->text = bigger;
    c->cap *= 2;
  }
  ssize_t got = read(c->fd, c->text + c->len, c->cap - c->len - 1);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return NAS_OK;
  if (got <= 0) {
    close(c->fd);
    c->fd = -1;
    return NAS_OK;
  }
  c->len += (size_t)got;
  c->text[c->len] = '\0';
  return NAS_OK;
}

/* Reads both pipes until both close or the deadline (monotonic seconds) passes.
 * Returns 1 when done, 0 at the deadline, NAS_ERR when out of memory. */
static int captures_drain(capture *c, double deadline) {
  while (c[0].fd >= 0 || c[1].fd >= 0) {
    struct pollfd fds[2] = {{.fd = c[0].fd, .events = POLLIN}, {.fd = c[1].fd, .events = POLLIN}};
    double left = deadline - nas_monotonic();
    if (left <= 0) return 0;
    int ready = poll(fds, 2, (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR) return NAS_ERR;
    for (int i = 0; i < 2 && ready > 0; i++)
      if (fds[i].revents && capture_read(&c[i]) != NAS_OK) return NAS_ERR;
  }
  return 1;
}

/* Variables of the caller's environment that never reach a Slurm command. */
static const char *const secret_names[] = {"NAS_STORAGE", "NAS_TOKEN"};

static bool is_secret(const char *entry) {
  for (size_t i = 0; i < sizeof secret_names / sizeof *secret_names; i++) {
    size_t len = strlen(secret_names[i]);
    if (strncmp(entry, secret_names[i], len) == 0 && entry[len] == '=') return true;
  }
  return false;
}

/* The caller's environment less its secrets: an owned array of pointers into environ,
 * NULL-terminated, or NULL when out of memory. */
static char **environ_without_secrets(void) {
  size_t n = 0;
  while (environ[n]) n++;
  char **kept = calloc(n + 1, sizeof *kept);
  if (!kept) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!is_secret(environ[i])) kept[k++] = environ[i];
  return kept;
}

/* Spawns argv with stdout and stderr on the write ends of out_pipe and err_pipe. */
static int spawn(char *const *argv, const int out_pipe[2], const int err_pipe[2], pid_t *pid,
                 nas_err *err) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETPGROUP);
  char **env = environ_without_secrets();
  int rc = env ? posix_spawnp(pid, argv[0], &actions, &attr, argv, env) : ENOMEM;
  free(env);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    return nas_errf(err, "cannot run %s: %s (is Slurm installed and in PATH?)", argv[0],
                    strerror(rc));
  return NAS_OK;
}

static int exit_status(int wstatus) {
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

static int wait_child(pid_t pid) {
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  return exit_status(wstatus);
}

/* Waits for pid until deadline (monotonic seconds): true, with *status, once it ended.
 * A command may close its stdout and stderr and keep running (a site's wrapper that
 * leaves a helper behind, an sbatch stuck on a dead controller): the deadline still
 * holds after its pipes close. Polls, pausing 1 ms at first and up to 50 ms. */
static bool wait_child_until(pid_t pid, double deadline, int *status) {
  for (double pause_s = 0.001;; pause_s = pause_s < 0.025 ? pause_s * 2 : 0.05) {
    int wstatus = 0;
    pid_t got = waitpid(pid, &wstatus, WNOHANG);
    if (got == pid || (got < 0 && errno != EINTR)) {
      *status = exit_status(wstatus);
      return true;
    }
    if (nas_monotonic() >= deadline) return false;
    nas_sleep(pause_s);
  }
}

static void fd_close(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* Runs argv once into res. NAS_ERR only when it could not be run or read at all. */
static int run_once(char *const *argv, double timeout_s, slurm_output *res, nas_err *err) {
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  pid_t pid = -1;
  int rc = pipe2(out_pipe, O_CLOEXEC) == 0 && pipe2(err_pipe, O_CLOEXEC) == 0
               ? NAS_OK
               : nas_errf(err, "pipe: %s", strerror(errno));
  if (rc == NAS_OK) rc = spawn(argv, out_pipe, err_pipe, &pid, err);
  fd_close(&out_pipe[1]);
  fd_close(&err_pipe[1]);
  capture c[2] = {{.fd = out_pipe[0]}, {.fd = err_pipe[0]}}; /* they own the read ends */
  if (rc == NAS_OK && (capture_alloc(&c[0]) != NAS_OK || capture_alloc(&c[1]) != NAS_OK))
    rc = nas_errf(err, "%s: out of memory", argv[0]);
  double deadline = nas_monotonic() + timeout_s;
  int drained = rc == NAS_OK ? captures_drain(c, deadline) : NAS_ERR;
  if (rc == NAS_OK && drained < 0) rc = nas_errf(err, "%s: cannot read its output", argv[0]);
  if (pid > 0) {
    int status;
    bool ended = drained == 1 && wait_child_until(pid, deadline, &status);
    if (!ended) {
      kill(-pid, SIGKILL); /* its group: a site's wrapper script too */
      status = wait_child(pid);
    }
    res->status = drained >= 0 && !ended ? -1 : status;
  }
  fd_close(&c[0].fd);
  fd_close(&c[1].fd);
  res->out = c[0].text;
  res->errs = c[1].text;
  return rc;
}

static bool looks_transient(const slurm_output *res) {
  if (res->status == -1) return true;
  for (size_t i = 0; i < sizeof transient_words / sizeof *transient_words; i++)
    if (res->errs && strcasestr(res->errs, transient_words[i])) return true;
  return false;
}

/* The failure's message: what the command wrote to stderr, its lines joined into one. */
static int failure(char *const *argv, const slurm_output *res, int attempts, double timeout_s,
                   nas_err *err) {
  if (res->status == -1)
    return nas_errf(err, "%s did not end within %g s and was killed (%d attempt%s)", argv[0],
                    timeout_s, attempts, attempts == 1 ? "" : "s");
  nas_errf(err, "%s failed with status %d%s: %s", argv[0], res->status,
           attempts > 1 ? " (after retries)" : "", res->errs ? res->errs : "");
  if (!err) return NAS_ERR;
  size_t len = strlen(err->msg);
  while (len > 0 && (err->msg[len - 1] == '\n' || err->msg[len - 1] == ' ')) err->msg[--len] = '\0';
  for (char *p = err->msg; *p; p++)
    if (*p == '\n') *p = ' ';
  return NAS_ERR;
}

int slurm_cmd_run(const slurm_retry *retry, char *const *argv, const slurm_recover *recover,
                  slurm_output *res, nas_err *err) {
  *res = (slurm_output){0};
  double wait_s = retry->backoff_s;
  for (int attempt = 1;; attempt++) {
    slurm_output_free(res);
    if (run_once(argv, retry->timeout_s, res, err) != NAS_OK) return NAS_ERR;
    if (res->status == 0) return NAS_OK;
    res->transient = looks_transient(res);
    if (!res->transient || attempt > retry->retries) return failure(argv, res, attempt, retry->timeout_s, err);
    if (recover) {
      int found = recover->check(recover->ctx, res, err);
      if (found < 0) return NAS_ERR;
      if (found) return NAS_OK;
    }
    nas_sleep(wait_s);
    wait_s *= 2;
  }
}
