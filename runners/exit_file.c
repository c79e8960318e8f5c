/* runners/exit_file.c: exit.json, the file in a run folder that records how a job ended.
 *
 * The local runner's monitor and the Slurm runner's job script write it once the job's
 * command has ended: {"state": "exited"|"signaled"|"timeout"|"stopped", "exit_code": N,
 * "signal": N}. Writers make it appear atomically (rename), so a reader sees all of it or
 * nothing. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runners/backend.h"

char *runner_exit_path(const char *run_dir) {
  return nas_asprintf("%s/" RUNNER_EXIT_FILE, run_dir);
}

static int state_from_name(const char *name, job_state *state) {
  for (job_state s = JOB_EXITED; s <= JOB_STOPPED; s++) {
    if (strcmp(job_state_name(s), name) == 0) {
      *state = s;
      return NAS_OK;
    }
  }
  return NAS_ERR;
}

static int exit_json_parse(json_t *root, job_status *out) {
  const char *state;
  if (json_unpack(root, "{s:s, s:i, s:i}", "state", &state, "exit_code", &out->exit_code,
                  "signal", &out->signal) != 0)
    return NAS_ERR;
  return state_from_name(state, &out->state);
}

int runner_exit_file_read(const char *run_dir, job_status *out, nas_err *err) {
  char *path = runner_exit_path(run_dir);
  if (!path) return nas_errf(err, "%s: out of memory", run_dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int rc = errno == ENOENT ? 0 : nas_errf(err, "%s: %s", path, strerror(errno));
    free(path);
    return rc;
  }
  json_error_t jerr;
  json_t *root = json_loadfd(fd, 0, &jerr);
  close(fd);
  int rc = 1;
  if (!root) rc = nas_errf(err, "%s: %s", path, jerr.text);
  else if (exit_json_parse(root, out) != NAS_OK)
    rc = nas_errf(err, "%s: expected {\"state\": exited|signaled|timeout|stopped, "
                       "\"exit_code\": N, \"signal\": N}", path);
  json_decref(root);
  free(path);
  return rc;
}
