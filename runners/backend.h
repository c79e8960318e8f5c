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
  int (*poll)(void *state, char *const *handles, char *const *run_dirs, size_t n,
              job_status *out, nas_err *err);
  int (*stop)(void *state, const char *handle, const char *run_dir, nas_err *err);
} runner_backend;

extern const runner_backend runner_local_backend; /* runners/local.c */

#endif
