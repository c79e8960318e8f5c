/* runners/gpus.c: GPUs shared out among the local runner's jobs (see gpus.h). */
#include "runners/gpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define NVIDIA_GPUS_DIR "/proc/driver/nvidia/gpus" /* one entry per device the driver sees */

/* Devices the NVIDIA driver sees, numbered 0…n-1 as CUDA numbers them by default. */
static int detect(gpu_pool *pool, nas_err *err) {
  DIR *dir = opendir(NVIDIA_GPUS_DIR);
  size_t n = 0;
  for (struct dirent *e; dir && (e = readdir(dir));) n += e->d_name[0] != '.';
  if (dir) closedir(dir);
  if (n == 0)
    return nas_errf(err, "option gpus: auto, but this machine has no NVIDIA GPU (%s %s); "
                    "leave gpus out to run trials without one", NVIDIA_GPUS_DIR,
                    dir ? "is empty" : "is missing");
  if (!(pool->ids = calloc(n, sizeof *pool->ids))) return nas_errf(err, "out of memory");
  for (size_t i = 0; i < n; i++) pool->ids[i] = (int)i;
  pool->n = n;
  return NAS_OK;
}

/* An explicit list: distinct device numbers, not checked against the machine. */
static int list_read(const json_t *gpus, gpu_pool *pool, nas_err *err) {
  size_t n = json_array_size(gpus), i;
  if (n == 0) return nas_errf(err, "option gpus: expected auto or a non-empty list of device numbers");
  if (!(pool->ids = calloc(n, sizeof *pool->ids))) return nas_errf(err, "out of memory");
  json_t *item;
  json_array_foreach(gpus, i, item) {
    json_int_t id = json_integer_value(item);
    if (!json_is_integer(item) || id < 0 || id > 4095)
      return nas_errf(err, "option gpus: item %zu is not a device number (0, 1, …)", i + 1);
    for (size_t j = 0; j < i; j++)
      if (pool->ids[j] == id) return nas_errf(err, "option gpus: device %d is listed twice", (int)id);
    pool->ids[i] = (int)id;
  }
  pool->n = n;
  return NAS_OK;
}

/* The lock folder is ours alone: in a shared /tmp another user could have made it first
 * and then hold (or swap) the lock files. lstat, so a symlink is refused, not followed. */
static int locks_dir_check(const char *dir, nas_err *err) {
  struct stat st;
  if (lstat(dir, &st) != 0)
    return nas_errf(err, "cannot read the GPU lock folder %s: %s", dir, strerror(errno));
  char why[96];
  if (!S_ISDIR(st.st_mode))
    snprintf(why, sizeof why, "it is not a directory (a symlink or a file)");
  else if (st.st_uid != getuid())
    snprintf(why, sizeof why, "it is owned by uid %u, not by this user (uid %u)",
             (unsigned)st.st_uid, (unsigned)getuid());
  else if (st.st_mode & 022)
    snprintf(why, sizeof why, "group or others may write to it (mode %03o)",
             (unsigned)(st.st_mode & 0777));
  else
    return NAS_OK;
  return nas_errf(err, "GPU lock folder %s refused: %s; remove it (or set TMPDIR to a "
                  "folder of your own) so that nas makes it again, mode 0700", dir, why);
}

/* $TMPDIR/nas-gpus-UID (made 0700, checked) and one lock file path per device. */
static int locks_prepare(gpu_pool *pool, nas_err *err) {
  const char *tmp = getenv("TMPDIR");
  char *dir = nas_asprintf("%s/nas-gpus-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)getuid());
  if (!dir) return nas_errf(err, "out of memory");
  int rc = mkdir(dir, 0700) == 0 || errno == EEXIST
               ? locks_dir_check(dir, err)
               : nas_errf(err, "cannot make the GPU lock folder %s: %s", dir, strerror(errno));
  if (rc == NAS_OK && !(pool->lock_paths = calloc(pool->n, sizeof *pool->lock_paths)))
    rc = nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < pool->n; i++)
    if (!(pool->lock_paths[i] = nas_asprintf("%s/%d.lock", dir, pool->ids[i])))
      rc = nas_errf(err, "out of memory");
  free(dir);
  return rc;
}

int gpu_pool_read(const json_t *gpus, const json_t *per_job, gpu_pool *pool, nas_err *err) {
  *pool = (gpu_pool){.per_job = 1};
  if (!gpus && !per_job) return NAS_OK;
  if (per_job) {
    json_int_t n = json_integer_value(per_job);
    if (!json_is_integer(per_job) || n < 1 || n > GPU_PER_JOB_MAX)
      return nas_errf(err, "option gpus_per_trial: expected a whole number of devices from 1 to %d",
                      GPU_PER_JOB_MAX);
    pool->per_job = (int)n;
  }
  int rc;
  if (!gpus || (json_is_string(gpus) && strcmp(json_string_value(gpus), "auto") == 0))
    rc = detect(pool, err);
  else if (json_is_array(gpus))
    rc = list_read(gpus, pool, err);
  else
    rc = nas_errf(err, "option gpus: expected auto or a list of device numbers ([0, 1])");
  if (rc == NAS_OK && (size_t)pool->per_job > pool->n)
    rc = nas_errf(err, "option gpus_per_trial: %d, but only %zu GPU%s to share out",
                  pool->per_job, pool->n, pool->n == 1 ? "" : "s");
  if (rc == NAS_OK) rc = locks_prepare(pool, err);
  if (rc != NAS_OK) gpu_pool_free(pool);
  return rc;
}

void gpu_pool_free(gpu_pool *pool) {
  for (size_t i = 0; pool->lock_paths && i < pool->n; i++) free(pool->lock_paths[i]);
  free(pool->lock_paths);
  free(pool->ids);
  *pool = (gpu_pool){.per_job = 1};
}

size_t gpu_pool_capacity(const gpu_pool *pool) {
  return pool->n ? pool->n / (size_t)pool->per_job : 0;
}

bool gpu_pool_take(const gpu_pool *pool, int *fds, char cuda_env[GPU_ENV_MAX],
                   char gpus_env[GPU_ENV_MAX]) {
  char list[GPU_ENV_MAX - 32] = "";
  size_t used = 0;
  int taken = 0;
  for (size_t i = 0; i < pool->n && taken < pool->per_job; i++) {
    int fd = open(pool->lock_paths[i], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      continue;
    }
    fds[taken++] = fd;
    if (used < sizeof list)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", used ? "," : "", pool->ids[i]);
  }
  if (taken < pool->per_job || used >= sizeof list) {
    while (taken > 0) close(fds[--taken]);
    return false;
  }
  snprintf(cuda_env, GPU_ENV_MAX, "CUDA_VISIBLE_DEVICES=%s", list);
  snprintf(gpus_env, GPU_ENV_MAX, "NAS_GPUS=%s", list);
  return true;
}
