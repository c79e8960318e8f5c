/* runners/exit_file.c: exit.json, the file in a run folder that records how a job ended.
 *
 * The local runner's monitor and the Slurm runner's job script write it once the job's
 * command has ended: {"state": "exited"|"signaled"|"timeout"|"stopped", "exit_code": N,
 * "signal": N}. Writers make it appear atomically (rename), so a reader sees all of it or
 * nothing. The job itself can write in its run folder too, so what is found there is
 * untrusted input: anything but a small regular file of that form is refused with the
 * reason, never waited on (a FIFO) nor read without end (a device). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runners/backend.h"

#define EXIT_FILE_MAX 4096 /* bytes; the runners write about 60 */

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

/* Parses the open file fd into *out; errors name the file by RUNNER_EXIT_FILE alone, as
 * they end up in a trial's error text. */
static int exit_fd_read(int fd, job_status *out, nas_err *err) {
  struct stat st;
  if (fstat(fd, &st) != 0) return nas_errf(err, RUNNER_EXIT_FILE ": %s", strerror(errno));
  if (!S_ISREG(st.st_mode)) return nas_errf(err, RUNNER_EXIT_FILE " is not a regular file");
  if (st.st_size > EXIT_FILE_MAX)
    return nas_errf(err, RUNNER_EXIT_FILE " holds %lld bytes, more than %d", (long long)st.st_size,
                    EXIT_FILE_MAX);
  json_error_t jerr;
  json_t *root = json_loadfd(fd, 0, &jerr);
  job_status read = *out;
  int rc = NAS_OK;
  if (!root) rc = nas_errf(err, RUNNER_EXIT_FILE " is not JSON: %s", jerr.text);
  else if (exit_json_parse(root, &read) != NAS_OK)
    rc = nas_errf(err, RUNNER_EXIT_FILE " is not {\"state\": exited|signaled|timeout|stopped, "
                       "\"exit_code\": N, \"signal\": N}");
  json_decref(root);
  if (rc == NAS_OK) *out = read;
  return rc;
}

int runner_exit_file_read(const char *run_dir, job_status *out, nas_err *err) {
  char *path = runner_exit_path(run_dir);
  if (!path) return nas_errf(err, "%s: out of memory", run_dir);
  /* Non-blocking: opening a FIFO the job put there must not wait for a writer. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  int open_errno = errno;
  free(path);
  if (fd < 0 && open_errno == ENOENT) return 0;
  if (fd < 0 && open_errno == ELOOP) return nas_errf(err, RUNNER_EXIT_FILE " is a symbolic link");
  if (fd < 0) return nas_errf(err, RUNNER_EXIT_FILE ": %s", strerror(open_errno));
  int rc = exit_fd_read(fd, out, err);
  close(fd);
  return rc == NAS_OK ? 1 : NAS_ERR;
}

