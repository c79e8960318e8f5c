/* runners/gpus.h: GPUs shared out among the local runner's jobs (internal to runners/).
 *
 * `runner: {type: local, gpus: auto | [0, 1, …], gpus_per_trial: N}` gives each job N
 * devices of its own through CUDA_VISIBLE_DEVICES (and NAS_GPUS, the same list). A device
 * is taken by holding an flock on its lock file, $TMPDIR/nas-gpus-UID/ID.lock (TMPDIR
 * defaults to /tmp), for as long as the job's monitor lives: the kernel drops the lock when
 * the monitor ends however it ends, so every nas process of the user on this machine (a
 * resumed scheduler, a second experiment) sees the same free devices, and nothing is left
 * to clean up. A job that finds too few free waits for them; the local runner's capacity
 * (devices / gpus_per_trial) caps how many trials the scheduler runs at once. */
#ifndef NAS_RUNNER_GPUS_H
#define NAS_RUNNER_GPUS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

#define GPU_ENV_MAX 512   /* bytes of "CUDA_VISIBLE_DEVICES=0,1,…" */
#define GPU_PER_JOB_MAX 64 /* most devices one job may ask for */

typedef struct {
  int *ids;          /* owned: the devices jobs may use; NULL when the spec asks for none */
  size_t n;
  int per_job;       /* devices each job gets (gpus_per_trial) */
  char **lock_paths; /* owned: lock file of each device, as ids */
} gpu_pool;

/* Reads the `gpus` and `gpus_per_trial` options (either may be NULL: not given) into
 * *pool. `auto` takes every NVIDIA device of this machine (/proc/driver/nvidia/gpus) and
 * is refused when there is none. Creates the lock folder, or refuses an existing one that
 * is not a directory of this user (a symlink is not followed) or that others may write to. */
int gpu_pool_read(const json_t *gpus, const json_t *per_job, gpu_pool *pool, nas_err *err);
void gpu_pool_free(gpu_pool *pool);
/* How many jobs the pool lets run at once; 0 when it holds no devices (no limit). */
size_t gpu_pool_capacity(const gpu_pool *pool);

/* Tries once to take per_job free devices: on success fds[0..per_job) hold their locks
 * (close them to give the devices back), cuda_env and gpus_env hold
 * "CUDA_VISIBLE_DEVICES=…" and "NAS_GPUS=…", and it returns true; otherwise it takes
 * nothing. Only system calls and snprintf: safe in the local runner's forked monitor. */
bool gpu_pool_take(const gpu_pool *pool, int *fds, char cuda_env[GPU_ENV_MAX],
                   char gpus_env[GPU_ENV_MAX]);

#endif
