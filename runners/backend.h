/* runners/backend.h: what the backends of runners/ share (internal to runners/).
 *
 * A backend is a table of functions (runner_backend, runner.h), like Redis's dictType:
 * runner.c picks the table whose `type` matches the spec's `runner: {type: …}` and forwards
 * every public call to it with the backend's own state. A new backend (runners/slurm.c) is
 * one more table and one more line in runner.c's list; nothing else changes. */
#ifndef NAS_RUNNER_BACKEND_H
#define NAS_RUNNER_BACKEND_H

#include "runners/runner.h"

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
