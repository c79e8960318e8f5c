/* runners/nas_self.c: the nas binary that starts trials, as the trials are told of it.
 *
 * Every runner gives its trials NAS_BIN (the absolute path of the running binary, from
 * /proc/self/exe) and puts that binary's folder first on their PATH, so that a trial's
 * `nas report …` (or a Python trial's subprocess call of "nas") reaches the same nas that
 * runs the experiment, installed or not, whatever PATH the user started it with. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runners/backend.h"

int runner_self_find(runner_self *out, nas_err *err) {
  char exe[PATH_MAX];
  *out = (runner_self){0};
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len < 0)
    return nas_errf(err, "cannot find the running nas binary: /proc/self/exe: %s", strerror(errno));
  exe[len] = '\0';
  out->bin = strdup(exe);
  out->dir = strdup(dirname(exe));
  if (!out->bin || !out->dir) {
    runner_self_free(out);
    return nas_errf(err, "out of memory");
  }
  return NAS_OK;
}

void runner_self_free(runner_self *self) {
  free(self->bin);
  free(self->dir);
  *self = (runner_self){0};
}
