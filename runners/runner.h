/* runners: where trials run. One interface, a backend per file (local.c, slurm.c), chosen
 * by the spec's `runner: {type: …}`.
 *
 * A runner starts a job for a trial and gives back a handle: a short string the scheduler
 * stores before it does anything else with it, so that a scheduler restarted after a crash
 * can attach to the same job again and learn how it ended. Every job writes its stdout and
 * stderr to stdout.log / stderr.log in its run folder; the scheduler reads metric lines
 * from stdout.log (metrics/metrics.h), whichever runner ran it. */
#ifndef NAS_RUNNER_H
#define NAS_RUNNER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

typedef struct runner runner;

/* What to run. All pointers are borrowed for the duration of runner_start. */
typedef struct {
  char *const *argv;    /* NULL-terminated; argv[0] without '/' is searched in PATH,
                           with '/' it is relative to workdir */
  const char *workdir;  /* the job's current directory */
  const char *run_dir;  /* folder for stdout.log, stderr.log and the runner's own files;
                           created when missing; logs an earlier job left there are
                           removed first, so a job's logs start empty */
  char *const *env;     /* NULL-terminated "NAME=VALUE" set on top of the caller's env */
  double timeout_s;     /* 0 = none; past it the job's process group gets TERM, then KILL */
} runner_job;

typedef enum {
  JOB_RUNNING,   /* still going (or pending in a queue) */
  JOB_EXITED,    /* ended by itself: see exit_code */
  JOB_SIGNALED,  /* killed by a signal it did not ask for: see signal */
  JOB_TIMEOUT,   /* killed at its time limit */
  JOB_STOPPED,   /* stopped through runner_stop */
  JOB_LOST,      /* the runner can no longer tell (its process vanished without a word) */
  JOB_UNREADABLE, /* ended, but its exit.json cannot be read (detail says why): only the
                     job itself can have spoilt it, so it is not lost but failed */
} job_state;

typedef struct {
  job_state state;
  int exit_code;    /* JOB_EXITED */
  int signal;       /* JOB_SIGNALED */
  bool waiting;     /* JOB_RUNNING but not started yet (pending in Slurm's queue, its node
                       booting, suspended): silent by no fault of its own */
  char detail[160]; /* the runner's own words on how the job ended, for messages ("Slurm job
                       12: OUT_OF_MEMORY"); "" when it has none to add */
} job_status;

const char *job_state_name(job_state state);

/* Creates the runner named by type ("local") with its spec options (a JSON object,
 * borrowed; NULL = defaults). Unknown types and options are errors. */
int runner_create(const char *type, const json_t *options, runner **out, nas_err *err);
void runner_free(runner *r);
/* Checks options as runner_create would read them for the runner type: the same errors,
 * nothing kept. */
int runner_validate_options(const char *type, const json_t *options, nas_err *err);

/* How many jobs the runner lets run at once; 0 when it sets no limit of its own. The
 * local runner with `gpus`: its devices / gpus_per_trial. The scheduler runs no more trials
 * at once than this, whatever budget.parallel says. */
size_t runner_capacity(const runner *r);

/* Starts a job; *handle (owned) identifies it from now on, also to another process. A job
 * without a command, a workdir or a run_dir, or whose timeout is no non-negative number,
 * is refused before its run folder is touched (as by every start below). */
int runner_start(runner *r, const runner_job *job, char **handle, nas_err *err);
/* Starts n jobs; handles[i] (owned) identifies jobs[i] exactly as runner_start's handle
 * would. A backend that can submits them as one unit (slurm with `array: true`: one job
 * array); the others start them one by one. All or nothing: on failure no handle is
 * returned, and the jobs already started are stopped and polled until they end (up to
 * 30 s), so none runs on untracked and the local runner leaves no zombie monitor. */
int runner_start_batch(runner *r, const runner_job *jobs, size_t n, char **handles,
                       nas_err *err);
/* Like runner_start, but the job waits until runner_release: the caller stores the handle
 * first, so a caller that dies between starting and storing leaves no job running that
 * nobody knows of (a held job whose starter is gone never runs; polling its handle then
 * says JOB_LOST). Backends that cannot hold start the job at once. */
int runner_start_held(runner *r, const runner_job *job, char **handle, nas_err *err);
/* Lets a job started held run. */
int runner_release(runner *r, const char *handle, nas_err *err);
/* Learns the state of n jobs in one go; run_dirs[i] is the run folder handles[i] was
 * started with. Works for handles started by an earlier process too (after a restart). */
int runner_poll(runner *r, char *const *handles, char *const *run_dirs, size_t n,
                job_status *out, nas_err *err);
/* Asks a job to stop (TERM, then KILL after a grace period); returns at once. */
int runner_stop(runner *r, const char *handle, const char *run_dir, nas_err *err);

/* ---- backends: the table of functions a runner forwards to -------------------------------
 * A backend is a table of functions, like Redis's dictType. The built-in ones (local.c,
 * slurm.c) are chosen by type name in runner_create; runner_from_backend plugs in any other
 * table, such as the scripted fake runner the scheduler's tests inject (sched_options). */
typedef struct runner_backend {
  const char *type; /* the name a spec uses: "local" */
  /* Reads options (a JSON object, borrowed; NULL = defaults) into an owned *state.
   * Unknown options are errors that name the option. Only runner_create calls it (NULL in
   * a table only ever given to runner_from_backend). */
  int (*create)(const json_t *options, void **state, nas_err *err);
  void (*free)(void *state);
  /* Same contracts as runner_start / runner_poll / runner_stop above. */
  int (*start)(void *state, const runner_job *job, char **handle, nas_err *err);
  /* Optional (NULL: runner_start_batch starts a batch job by job). Starts the n jobs as
   * one unit, all or nothing; returns NAS_ENOTFOUND, having done nothing, when the
   * backend's options do not ask for batches, and runner_start_batch then starts them one
   * by one. */
  int (*start_batch)(void *state, const runner_job *jobs, size_t n, char **handles,
                     nas_err *err);
  int (*poll)(void *state, char *const *handles, char *const *run_dirs, size_t n,
              job_status *out, nas_err *err);
  int (*stop)(void *state, const char *handle, const char *run_dir, nas_err *err);
  /* Optional (NULL when the backend cannot hold a job): runner_start_held and
   * runner_release. */
  int (*start_held)(void *state, const runner_job *job, char **handle, nas_err *err);
  int (*release)(void *state, const char *handle, nas_err *err);
  /* Optional (NULL: no limit): runner_capacity. */
  size_t (*capacity)(const void *state);
} runner_backend;

/* A runner forwarding to backend (borrowed: a table that outlives the runner) with state,
 * which the runner owns from now on, also on failure (backend->free frees it). */
int runner_from_backend(const runner_backend *backend, void *state, runner **out,
                        nas_err *err);

#endif
