/* runners/slurm_internal.h: the parts of the Slurm backend (internal to runners/).
 *
 * slurm.c is the backend itself (options, submission, polling, cancelling); it builds on
 * slurm_script.c (the job scripts kept in run folders), slurm_cmd.c
 * (running Slurm's commands with argv, retrying transient failures) and slurm_state.c
 * (reading squeue's answer and mapping Slurm's job states onto job_status). */
#ifndef NAS_RUNNER_SLURM_INTERNAL_H
#define NAS_RUNNER_SLURM_INTERNAL_H

#include "runners/backend.h"

/* ---- slurm_script.c ---- */

/* What one trial's job script runs. Every pointer is borrowed. */
typedef struct {
  char *const *argv;     /* NULL-terminated */
  const char *workdir;   /* absolute */
  const char *run_dir;   /* absolute; exists */
  char *const *env;      /* NULL-terminated NAME=VALUE, or NULL */
  char *const *setup;    /* preamble lines (module loads), run before the command */
  size_t n_setup;
  bool srun;             /* run argv as `srun -- argv`: one copy per task of the job */
  const char *nas_bin;   /* the running nas: exported as NAS_BIN */
  const char *nas_dir;   /* its folder: put first on PATH (after the setup lines ran) */
} slurm_task;

/* Checks that every env entry is NAME=VALUE with a NAME bash can export. */
int slurm_env_check(char *const *env, nas_err *err);
/* The file beside job.sh holding the trial's environment (mode 0600: values may be
 * secrets). */
#define SLURM_ENV_FILE "env.sh"
/* Writes run_dir/env.sh (0600) and run_dir/job.sh (0700), which reads it, for task;
 * *path (owned) is job.sh's path. */
int slurm_job_script_write(const slurm_task *task, char **path, nas_err *err);
/* Writes dir/array.sh, which runs scripts[SLURM_ARRAY_TASK_ID]; *path (owned). */
int slurm_array_script_write(const char *dir, char *const *scripts, size_t n, char **path,
                             nas_err *err);

/* ---- slurm_cmd.c ---- */

/* How hard to try a Slurm command. */
typedef struct {
  int retries;        /* attempts after the first when a failure looks transient */
  double backoff_s;   /* wait before the first retry; doubled before each next one */
  double timeout_s;   /* a run taking longer is killed and counts as a transient failure */
} slurm_retry;

/* What one run of a command left. */
typedef struct {
  int status;     /* exit status; 128 + signal when killed; -1 when our time limit killed it */
  char *out;      /* owned: everything it wrote to stdout */
  char *errs;     /* owned: everything it wrote to stderr */
  bool transient; /* it failed in a way that looked transient (retries spent) */
} slurm_output;

void slurm_output_free(slurm_output *res);

/* Called after a transient failure, before the next attempt: 1 when it found that the
 * failed attempt took effect after all (putting the answer into res->out), 0 when not,
 * NAS_ERR on failure. */
typedef struct {
  int (*check)(void *ctx, slurm_output *res, nas_err *err);
  void *ctx;
} slurm_recover;

/* Runs argv (argv[0] searched in PATH) until it exits 0, fails in a way that does not
 * look transient, or the retries are spent. NAS_OK when it exited 0. Otherwise NAS_ERR
 * with a message quoting its stderr; res still holds the last run for callers that treat
 * some failures as answers. recover may be NULL. res is always filled; free it. */
int slurm_cmd_run(const slurm_retry *retry, char *const *argv, const slurm_recover *recover,
                  slurm_output *res, nas_err *err);

/* ---- slurm_state.c ---- */

/* The squeue output format slurm_rows_parse reads: one line per job,
 * "JOBID_OR_TASK|STATE|EXIT_CODE|REASON|". */
#define SLURM_SQUEUE_FORMAT "JobArrayID:|,State:|,exit_code:|,Reason:|"

/* One job of squeue's answer. */
typedef struct {
  char *id;          /* owned: "12" or "12_3", as handles are written */
  job_status status;
  bool held;         /* pending because someone holds it (JobHeldUser, JobHeldAdmin) */
} slurm_row;

/* Parses squeue's output into rows sorted by id (for slurm_rows_find). */
int slurm_rows_parse(const char *text, slurm_row **rows, size_t *n, nas_err *err);
void slurm_rows_free(slurm_row *rows, size_t n);
const slurm_row *slurm_rows_find(const slurm_row *rows, size_t n, const char *id);

/* Maps a Slurm job state and exit code ("768", a raw wait status as squeue prints it, or
 * "3:0" as scontrol does) onto a job_status, with detail naming id and state for
 * the states a trial's own exit status does not explain. */
job_status slurm_status_of(const char *id, const char *state, const char *exit_code,
                           const char *reason);

/* Whether handle is a Slurm job id we hand out: "12" or "12_3". */
bool slurm_handle_valid(const char *handle);

/* Seconds in a Slurm time limit: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" or
 * "D-HH:MM:SS". NAS_ERR (no message) when text is none of these. */
int slurm_time_parse(const char *text, double *seconds);

#endif
