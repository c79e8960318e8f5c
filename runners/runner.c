/* runners/runner.c: the runner interface — picks a backend by type name and forwards to it.
 *
 * Invariants: a runner always holds a backend and that backend's state; the list of
 * backends runner_create chooses from is constant. Job state names are the words exit.json
 * files and messages use. */
#include "runners/runner.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runners/backend.h"

struct runner {
  const runner_backend *backend; /* borrowed: a constant table */
  void *state;                   /* owned by the backend */
};

static const runner_backend *const backends[] = {&runner_local_backend, &runner_slurm_backend};
#define N_BACKENDS (sizeof backends / sizeof backends[0])
/* Longest wait for the jobs a failed batch start stopped: the local runner's default
 * kill_grace and its leftovers limit (5 s each) with room to spare. */
#define UNDO_WAIT_S 30.0

const char *job_state_name(job_state state) {
  switch (state) {
  case JOB_RUNNING: return "running";
  case JOB_EXITED: return "exited";
  case JOB_SIGNALED: return "signaled";
  case JOB_TIMEOUT: return "timeout";
  case JOB_STOPPED: return "stopped";
  case JOB_LOST: return "lost";
  case JOB_UNREADABLE: return "unreadable";
  }
  return "unknown";
}

static const runner_backend *backend_named(const char *type) {
  for (size_t i = 0; i < N_BACKENDS; i++)
    if (strcmp(backends[i]->type, type) == 0) return backends[i];
  return NULL;
}

/* Writes "local, slurm, …" into buf for messages. */
static void backend_names(char *buf, size_t cap) {
  buf[0] = '\0';
  for (size_t i = 0, used = 0; i < N_BACKENDS && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", backends[i]->type);
}

int runner_create(const char *type, const json_t *options, runner **out, nas_err *err) {
  const runner_backend *backend = backend_named(type);
  if (!backend) {
    char known[256];
    backend_names(known, sizeof known);
    return nas_errf(err, "unknown runner type '%s' (known: %s)", type, known);
  }
  void *state;
  if (backend->create(options, &state, err) != NAS_OK)
    return nas_err_prefix(err, "runner %s", type);
  return runner_from_backend(backend, state, out, err);
}

int runner_from_backend(const runner_backend *backend, void *state, runner **out,
                        nas_err *err) {
  runner *r = calloc(1, sizeof *r);
  if (!r) {
    backend->free(state);
    return nas_errf(err, "runner %s: out of memory", backend->type);
  }
  r->backend = backend;
  r->state = state;
  *out = r;
  return NAS_OK;
}

int runner_validate_options(const char *type, const json_t *options, nas_err *err) {
  runner *r = NULL;
  if (runner_create(type, options, &r, err) != NAS_OK) return NAS_ERR;
  runner_free(r);
  return NAS_OK;
}

void runner_free(runner *r) {
  if (!r) return;
  r->backend->free(r->state);
  free(r);
}

size_t runner_capacity(const runner *r) {
  return r->backend->capacity ? r->backend->capacity(r->state) : 0;
}

/* Removes the stdout.log and stderr.log an earlier job left in the run folder, so that a
 * job's logs hold its own output only: a run folder is used again by the trial of the same
 * number when an experiment is deleted with its runs kept and run anew, and the scheduler
 * reads a new trial's metrics from the start of stdout.log. Every backend appends to the
 * logs (a Slurm job requeued by Slurm appends to its own), so this is the one place they
 * start empty. A link is removed, never followed. */
static int logs_remove(const char *run_dir, nas_err *err) {
  static const char *const names[] = {"stdout.log", "stderr.log"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char *path = nas_asprintf("%s/%s", run_dir, names[i]);
    if (!path) return nas_errf(err, "out of memory");
    int rc = unlink(path) == 0 || errno == ENOENT || errno == ENOTDIR
                 ? NAS_OK
                 : nas_errf(err, "cannot remove the old %s: %s", path, strerror(errno));
    free(path);
    if (rc != NAS_OK) return rc;
  }
  return NAS_OK;
}

/* What every backend needs of a job, checked before its run folder is touched: a job
 * refused for bad input removes nothing. */
static int job_check(const runner_job *job, nas_err *err) {
  if (!job->argv || !job->argv[0] || !job->argv[0][0]) return nas_errf(err, "job has no command");
  if (!job->workdir || !job->run_dir) return nas_errf(err, "job needs a workdir and a run_dir");
  if (!(job->timeout_s >= 0) || !isfinite(job->timeout_s))
    return nas_errf(err, "job timeout must be a non-negative number of seconds");
  return NAS_OK;
}

/* A job checked, then its run folder cleared of an earlier job's logs. */
static int job_ready(const runner_job *job, nas_err *err) {
  return job_check(job, err) == NAS_OK ? logs_remove(job->run_dir, err) : NAS_ERR;
}

int runner_start(runner *r, const runner_job *job, char **handle, nas_err *err) {
  if (job_ready(job, err) != NAS_OK) return NAS_ERR;
  return r->backend->start(r->state, job, handle, err);
}

int runner_start_held(runner *r, const runner_job *job, char **handle, nas_err *err) {
  if (!r->backend->start_held) return runner_start(r, job, handle, err);
  if (job_ready(job, err) != NAS_OK) return NAS_ERR;
  return r->backend->start_held(r->state, job, handle, err);
}

int runner_release(runner *r, const char *handle, nas_err *err) {
  return r->backend->release ? r->backend->release(r->state, handle, err) : NAS_OK;
}

static bool any_running(const job_status *states, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (states[i].state == JOB_RUNNING) return true;
  return false;
}

/* Polls the n stopped jobs until none runs, or UNDO_WAIT_S has passed (a backend that
 * cannot learn their end, a job that ignores SIGTERM for a long kill_grace): a poll is
 * what notices an end, and the local runner reaps a job's monitor only there, so a job
 * stopped and never polled again would leave a zombie behind. */
static void stopped_wait(runner *r, char *const *handles, const runner_job *jobs, size_t n) {
  char **run_dirs = calloc(n, sizeof *run_dirs);
  job_status *states = calloc(n, sizeof *states);
  for (size_t i = 0; run_dirs && i < n; i++) run_dirs[i] = (char *)jobs[i].run_dir;
  double until = nas_monotonic() + UNDO_WAIT_S, pause_s = 0.01;
  bool running = run_dirs && states;
  while (running && nas_monotonic() < until) {
    nas_sleep(pause_s);
    pause_s = pause_s < 0.25 ? pause_s * 2 : 0.5;
    running = runner_poll(r, handles, run_dirs, n, states, NULL) == NAS_OK &&
              any_running(states, n);
  }
  free(run_dirs);
  free(states);
}

/* Starts the jobs one by one; when one fails, stops those started and waits for their end
 * (all or nothing: none is left running). */
static int start_each(runner *r, const runner_job *jobs, size_t n, char **handles,
                      nas_err *err) {
  size_t started = 0;
  while (started < n && r->backend->start(r->state, &jobs[started], &handles[started], err) == NAS_OK)
    started++;
  if (started == n) return NAS_OK;
  for (size_t i = 0; i < started; i++) runner_stop(r, handles[i], jobs[i].run_dir, NULL);
  if (started > 0) stopped_wait(r, handles, jobs, started);
  for (size_t i = 0; i < started; i++) {
    free(handles[i]);
    handles[i] = NULL;
  }
  return NAS_ERR;
}

int runner_start_batch(runner *r, const runner_job *jobs, size_t n, char **handles,
                       nas_err *err) {
  for (size_t i = 0; i < n; i++) handles[i] = NULL;
  if (n == 0) return NAS_OK;
  for (size_t i = 0; i < n; i++)
    if (job_check(&jobs[i], err) != NAS_OK) return NAS_ERR;
  for (size_t i = 0; i < n; i++)
    if (logs_remove(jobs[i].run_dir, err) != NAS_OK) return NAS_ERR;
  if (r->backend->start_batch) {
    int rc = r->backend->start_batch(r->state, jobs, n, handles, err);
    if (rc != NAS_ENOTFOUND) return rc;
  }
  return start_each(r, jobs, n, handles, err);
}

int runner_poll(runner *r, char *const *handles, char *const *run_dirs, size_t n,
                job_status *out, nas_err *err) {
  return r->backend->poll(r->state, handles, run_dirs, n, out, err);
}

int runner_stop(runner *r, const char *handle, const char *run_dir, nas_err *err) {
  return r->backend->stop(r->state, handle, run_dir, err);
}
