/* runners/backend.h: what a runner backend provides (internal to runners/).
 *
 * A backend is a table of functions, like Redis's dictType: runner.c picks the table whose
 * `type` matches the spec's `runner: {type: …}` and forwards every public call to it with
 * the backend's own state. A new backend (runners/slurm.c) is one more table and one more
 * line in runner.c's list; nothing else changes. */
#ifndef NAS_RUNNER_BACKEND_H
#define NAS_RUNNER_BACKEND_H

#include "runners/runner.h"

typedef struct runner_backend {
  const char *type; /* the name a spec uses: "local" */
  /* Reads options (a JSON object, borrowed; NULL = defaults) into an owned *state.
   * Unknown options are errors that name the option. */
  int (*create)(const json_t *options, void **state, nas_err *err);
  void (*free)(void *state);
  /* Same contracts as runner_start / runner_poll / runner_stop in runner.h. */
  int (*start)(void *state, const runner_job *job, char **handle, nas_err *err);
  /* Optional (NULL: runner.c starts a batch job by job). Starts the n jobs as one unit,
   * all or nothing; returns NAS_ENOTFOUND, having done nothing, when the backend's
   * options do not ask for batches, and runner.c then starts them one by one. */
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

/* exit.json (runners/exit_file.c): how a job ended, written into its run folder by the
 * local runner's monitor and by the Slurm runner's job script. */
#define RUNNER_EXIT_FILE "exit.json"
/* Owned path of run_dir/exit.json; NULL when out of memory. */
char *runner_exit_path(const char *run_dir);
/* Reads run_dir/exit.json into *out: 1 when it exists, 0 when not (yet), else NAS_ERR with
 * why it cannot be read (not a small regular file of the right form: the job can write in
 * its run folder too), *out untouched. */
int runner_exit_file_read(const char *run_dir, job_status *out, nas_err *err);

/* The running nas binary (runners/nas_self.c): trials get NAS_BIN=bin and dir first on
 * their PATH, so that `nas report` in a trial finds this nas. */
typedef struct {
  char *bin; /* owned: absolute path of the running binary */
  char *dir; /* owned: the folder holding it */
} runner_self;
int runner_self_find(runner_self *out, nas_err *err);
void runner_self_free(runner_self *self);

extern const runner_backend runner_local_backend; /* runners/local.c */
extern const runner_backend runner_slurm_backend; /* runners/slurm.c */

#endif
