/* pipeline_shm: the process transport of a pipeline — stages that are processes on one
 * node meeting in a POSIX shared-memory segment, /dev/shm/nas-pipe-NAME — and
 * tr_pipe_run_process and tr_pipe_run_group, the drivers a stage process calls (the
 * latter also over an NCCL group, pipeline_nccl.c; docs/engine-pipeline.md).
 *
 * The segment holds a header (a process-shared robust mutex and a condition variable, the
 * abort flag with its message, the step barrier, each stage's pid) and a mailbox per
 * ordered pair of stages: a byte ring of ring_bytes that the sender writes and the receiver
 * reads. A message is its header (dtype, shape) then its values, streamed through the ring
 * in as many pieces as it takes, so a message may be larger than the ring.
 *
 * Invariants:
 * - Joining uses the stages' process group of the collectives (comm_shm.c) as the
 *   handshake: stage 0 builds the segment under a temporary name and renames it into place,
 *   then broadcasts that it did, so every stage opens the fresh segment; after a barrier
 *   stage 0 unlinks the name, and nothing is left in /dev/shm however the stages end.
 * - A ring has one writer and one reader. Its counters (bytes written, bytes read) change
 *   under the mutex; the bytes themselves are copied outside it, into space the counters
 *   give the writer alone (or out of data they give the reader alone); the mutex orders
 *   those copies before the counter that hands them over.
 * - No wait is unbounded: a waiting stage looks every SHM_POLL_S at the stage it waits for
 *   (at the barrier: those not arrived), aborts the world naming it when its process has
 *   exited, and aborts with the thread transport's message when the timeout passes. The
 *   first abort's message is the only one; every stage's pending and later calls fail with
 *   it. A stage that dies holding the mutex aborts the world too (robust mutex). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "trainer/dist/comm_internal.h"
#include "trainer/dist/pipeline_internal.h"

#define PIPE_SHM_MAGIC 0x6e61732d70697065ull /* "nas-pipe" */
#define PIPE_SHM_POLL_S 0.1                 /* how often a waiting stage checks on others */
#define PIPE_RING_BYTES ((size_t)1 << 20)   /* each mailbox's ring */

/* One ordered pair's mailbox counters; the ring's bytes lie in the data area. */
typedef struct {
  uint64_t written, read; /* bytes, ever: written - read are in the ring */
} shm_ring;

typedef struct {
  uint64_t magic; /* PIPE_SHM_MAGIC once the segment is complete */
  int32_t stages;
  uint64_t ring_bytes;
  pthread_mutex_t lock;   /* process-shared, robust */
  pthread_cond_t changed; /* process-shared, CLOCK_MONOTONIC; broadcast on every change */
  int32_t aborted;
  char why[sizeof(nas_err)]; /* the abort's message */
  int32_t pid[TR_PIPE_MAX_STAGES];     /* 0 until the stage has joined */
  uint64_t pid_ns[TR_PIPE_MAX_STAGES]; /* its pid namespace (0: unknown) */
  /* the step barrier */
  int32_t arrived;
  uint64_t generation;
  uint64_t passes[TR_PIPE_MAX_STAGES]; /* barriers each stage has arrived at */
  double values[TR_PIPE_MAX_STAGES];
  double result;
} shm_head;

/* This process's view of the segment. */
typedef struct {
  shm_head *head; /* the mapping */
  size_t bytes;
  shm_ring *rings;     /* stages * stages, in the mapping: [from * stages + to] */
  unsigned char *data; /* stages * stages rings of ring_bytes, in the mapping */
  int stages;
  double timeout_s;
  uint64_t pid_ns;
} pw_shm;

/* A message's header in the ring. */
typedef struct {
  int32_t dtype, ndim;
  int64_t shape[TR_MAX_DIMS];
} shm_msg;

/* ---------------------------------------------------------------- layout */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t rings_at(void) { return align64(sizeof(shm_head)); }

static size_t data_at(int stages) {
  return rings_at() + align64((size_t)stages * (size_t)stages * sizeof(shm_ring));
}

static size_t segment_bytes(int stages, size_t ring_bytes) {
  return data_at(stages) + (size_t)stages * (size_t)stages * ring_bytes;
}

static void map_parts(pw_shm *w, void *map, size_t bytes, int stages) {
  w->head = map;
  w->bytes = bytes;
  w->rings = (shm_ring *)((char *)map + rings_at());
  w->data = (unsigned char *)map + data_at(stages);
  w->stages = stages;
}

/* ---------------------------------------------------------------- abort and waits */

/* Lock held: aborts with message unless aborted already, and wakes every waiter. */
static void abort_locked(shm_head *h, const char *message) {
  if (h->aborted) return;
  snprintf(h->why, sizeof h->why, "%s", message);
  h->aborted = 1;
  pthread_cond_broadcast(&h->changed);
}

/* What a lock or timed wait returned: a stage that died holding the mutex aborts the world
 * (what it guarded may be half written). */
static void after_lock(shm_head *h, int rc) {
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(&h->lock);
    abort_locked(h, "pipeline: a stage process died while it held the pipeline's lock");
  } else if (rc != 0 && rc != ETIMEDOUT) {
    nas_err e;
    nas_errf(&e, "pipeline: waiting on the shared segment: %s", strerror(rc));
    abort_locked(h, e.msg);
  }
}

static void lock(pw_shm *w) { after_lock(w->head, pthread_mutex_lock(&w->head->lock)); }

static void unlock(pw_shm *w) { pthread_mutex_unlock(&w->head->lock); }

/* Lock held: aborts the world when stage q's process has exited. */
static void check_exited(pw_shm *w, int q, int stage, const char *what) {
  shm_head *h = w->head;
  if (h->pid[q] == 0 || w->pid_ns == 0 || h->pid_ns[q] != w->pid_ns ||
      !comm_pid_exited(h->pid[q]))
    return;
  nas_err e;
  nas_errf(&e, "pipeline stage %d (pid %d) exited while stage %d waited for %s", q,
           (int)h->pid[q], stage, what);
  abort_locked(h, e.msg);
}

static struct timespec monotonic_at(double seconds) {
  double whole = floor(seconds);
  return (struct timespec){.tv_sec = (time_t)whole, .tv_nsec = (long)((seconds - whole) * 1e9)};
}

/* What a wait waits for: ready(w, arg) under the lock; peer is the stage it waits on (-1:
 * those that have not reached the barrier stage is at). */
typedef struct {
  bool (*ready)(const pw_shm *w, const void *arg);
  const void *arg;
  int stage, peer;
  const char *what;
} shm_wait;

static void check_peers(pw_shm *w, const shm_wait *wait) {
  if (wait->peer >= 0) {
    check_exited(w, wait->peer, wait->stage, wait->what);
    return;
  }
  for (int q = 0; q < w->stages; q++)
    if (w->head->passes[q] < w->head->passes[wait->stage])
      check_exited(w, q, wait->stage, wait->what);
}

/* Lock held: waits until ready or aborted; NAS_OK when ready, else the abort's message. */
static int wait_locked(pw_shm *w, const shm_wait *wait, nas_err *err) {
  shm_head *h = w->head;
  double deadline = nas_monotonic() + w->timeout_s;
  while (!h->aborted && !wait->ready(w, wait->arg)) {
    struct timespec until = monotonic_at(fmin(nas_monotonic() + PIPE_SHM_POLL_S, deadline));
    int rc = pthread_cond_timedwait(&h->changed, &h->lock, &until);
    after_lock(h, rc);
    if (rc != ETIMEDOUT || h->aborted || wait->ready(w, wait->arg)) continue;
    check_peers(w, wait);
    if (!h->aborted && nas_monotonic() >= deadline) {
      nas_err stalled;
      pw_stalled_message(&stalled, wait->stage, w->timeout_s, wait->what);
      abort_locked(h, stalled.msg);
    }
  }
  return h->aborted ? nas_errf(err, "%s", h->why) : NAS_OK;
}

/* ---------------------------------------------------------------- rings */

typedef struct {
  const shm_ring *ring;
  uint64_t cap;
} ring_arg;

static bool ring_has_room(const pw_shm *w, const void *arg) {
  (void)w;
  const ring_arg *a = arg;
  return a->ring->written - a->ring->read < a->cap;
}

static bool ring_has_data(const pw_shm *w, const void *arg) {
  (void)w;
  const ring_arg *a = arg;
  return a->ring->written != a->ring->read;
}

/* Copies n bytes between buf and the ring at byte position pos (wrapping). */
static void ring_copy(unsigned char *ring, uint64_t cap, uint64_t pos, unsigned char *buf,
                      size_t n, bool into_ring) {
  size_t at = (size_t)(pos % cap), first = n < cap - at ? n : (size_t)(cap - at);
  if (into_ring) {
    memcpy(ring + at, buf, first);
    memcpy(ring, buf + first, n - first);
  } else {
    memcpy(buf, ring + at, first);
    memcpy(buf + first, ring, n - first);
  }
}

/* Moves n bytes through the ring from → to: the sender (writing) or the receiver. */
static int ring_move(pw_shm *w, int from, int to, unsigned char *buf, size_t n, bool writing,
                     const char *what, nas_err *err) {
  shm_ring *r = &w->rings[from * w->stages + to];
  uint64_t cap = w->head->ring_bytes;
  unsigned char *ring = w->data + (size_t)(from * w->stages + to) * cap;
  ring_arg arg = {r, cap};
  shm_wait wait = {writing ? ring_has_room : ring_has_data, &arg, writing ? from : to,
                   writing ? to : from, what};
  while (n > 0) {
    lock(w);
    int rc = wait_locked(w, &wait, err);
    uint64_t pos = writing ? r->written : r->read;
    uint64_t ready = writing ? cap - (r->written - r->read) : r->written - r->read;
    unlock(w);
    if (rc != NAS_OK) return rc;
    size_t k = n < ready ? n : (size_t)ready;
    ring_copy(ring, cap, pos, buf, k, writing);
    lock(w);
    if (writing)
      r->written += k;
    else
      r->read += k;
    pthread_cond_broadcast(&w->head->changed);
    unlock(w);
    buf += k;
    n -= k;
  }
  return NAS_OK;
}

static int shm_send(tr_ctx *ctx, void *impl, int from, int to, const tr_tensor *t) {
  pw_shm *w = impl;
  nas_err *err = &ctx->err;
  size_t bytes = (size_t)t->numel * tr_dtype_size(t->dtype);
  unsigned char *values = malloc(bytes ? bytes : 1);
  if (!values) return nas_errf(err, "pipeline: out of memory for a message of %zu bytes", bytes);
  tn_copy_to_contig(t, values);
  shm_msg m = {.dtype = (int32_t)t->dtype, .ndim = t->ndim};
  memcpy(m.shape, t->shape, sizeof m.shape);
  char what[64];
  snprintf(what, sizeof what, "room in its mailbox to stage %d", to);
  int rc = ring_move(w, from, to, (unsigned char *)&m, sizeof m, true, what, err);
  if (rc == NAS_OK) rc = ring_move(w, from, to, values, bytes, true, what, err);
  free(values);
  return rc;
}

static tr_tensor *shm_recv(tr_ctx *ctx, void *impl, int from, int to, const char *what) {
  pw_shm *w = impl;
  char waited[256];
  snprintf(waited, sizeof waited, "%s from stage %d", what, from);
  shm_msg m;
  if (ring_move(w, from, to, (unsigned char *)&m, sizeof m, false, waited, &ctx->err))
    return NULL;
  if (m.ndim < 0 || m.ndim > TR_MAX_DIMS)
    return tr_fail(ctx, "pipeline: a message from stage %d has %d dimensions", from, m.ndim);
  tr_tensor *t = tr_empty(ctx, (tr_dtype)m.dtype, m.ndim, m.shape);
  if (!t) return NULL;
  size_t bytes = (size_t)t->numel * tr_dtype_size(t->dtype);
  if (ring_move(w, from, to, tr_data(t), bytes, false, waited, &ctx->err) == NAS_OK) return t;
  tr_release(t);
  return NULL;
}

/* ---------------------------------------------------------------- barrier and abort */

typedef struct {
  uint64_t generation;
} barrier_ticket;

static bool barrier_passed(const pw_shm *w, const void *ticket) {
  return w->head->generation != ((const barrier_ticket *)ticket)->generation;
}

static int shm_step_end(void *impl, int stage, double *value, nas_err *err) {
  pw_shm *w = impl;
  shm_head *h = w->head;
  lock(w);
  barrier_ticket ticket = {h->generation};
  h->values[stage] = *value;
  h->passes[stage]++;
  if (++h->arrived == h->stages) {
    h->result = 0;
    for (int s = 0; s < h->stages; s++) h->result += h->values[s];
    h->arrived = 0;
    h->generation++;
    pthread_cond_broadcast(&h->changed);
  }
  shm_wait wait = {barrier_passed, &ticket, stage, -1, "the other stages to end the step"};
  int rc = wait_locked(w, &wait, err);
  if (rc == NAS_OK) *value = h->result;
  unlock(w);
  return rc;
}

static void shm_abort(void *impl, const char *message, nas_err *err) {
  pw_shm *w = impl;
  lock(w);
  abort_locked(w->head, message);
  nas_errf(err, "%s", w->head->why);
  unlock(w);
}

static bool shm_aborted(void *impl, nas_err *err) {
  pw_shm *w = impl;
  lock(w);
  bool aborted = w->head->aborted;
  if (aborted && err) nas_errf(err, "%s", w->head->why);
  unlock(w);
  return aborted;
}

static void shm_free(void *impl) {
  pw_shm *w = impl;
  if (w->head) munmap(w->head, w->bytes);
  free(w);
}

static const pw_transport shm_transport = {shm_send,  shm_recv,    shm_step_end,
                                           shm_abort, shm_aborted, shm_free, false, true};

/* ---------------------------------------------------------------- joining */

/* Stage 0: the complete segment under a temporary name, renamed to path. */
static int segment_create(pw_shm *w, const char *path, int stages, nas_err *err) {
  size_t bytes = segment_bytes(stages, PIPE_RING_BYTES);
  char *tmp = nas_asprintf("%s.tmp-%ld", path, (long)getpid());
  if (!tmp) return nas_errf(err, "out of memory");
  void *map = comm_shm_map_new(tmp, bytes, err);
  if (!map) {
    free(tmp);
    return NAS_ERR;
  }
  map_parts(w, map, bytes, stages);
  w->head->stages = stages;
  w->head->ring_bytes = PIPE_RING_BYTES;
  w->head->pid[0] = (int32_t)getpid();
  w->head->pid_ns[0] = w->pid_ns;
  int rc = comm_shm_init_sync(&w->head->lock, &w->head->changed, err);
  if (rc == NAS_OK) {
    __atomic_store_n(&w->head->magic, PIPE_SHM_MAGIC, __ATOMIC_RELEASE);
    if (rename(tmp, path) != 0)
      rc = nas_errf(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  }
  if (rc != NAS_OK) unlink(tmp);
  free(tmp);
  return rc;
}

/* Stages but 0: maps stage 0's segment (complete: the group has formed) and registers. */
static int segment_attach(pw_shm *w, const char *path, int stage, int stages, nas_err *err) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nas_errf(err, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0)
    map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return nas_errf(err, "cannot map %s: %s", path, strerror(errno));
  shm_head *h = map;
  size_t bytes = (size_t)st.st_size;
  if (bytes < sizeof *h || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != PIPE_SHM_MAGIC ||
      h->stages != stages || segment_bytes(stages, h->ring_bytes) != bytes) {
    munmap(map, bytes);
    return nas_errf(err, "%s is not a pipeline segment for %d stages", path, stages);
  }
  map_parts(w, map, bytes, stages);
  lock(w);
  int taken = h->pid[stage];
  if (!taken) {
    h->pid[stage] = (int32_t)getpid();
    h->pid_ns[stage] = w->pid_ns;
  }
  unlock(w);
  if (taken)
    return nas_errf(err, "stage %d has joined already (pid %d): two launches share the name",
                    stage, taken);
  return NAS_OK;
}

/* The world of this process's stage, meeting the others in the segment of name; group
 * (borrowed) is the stages' process group, the handshake. NULL with err set. */
static tr_pipe_world *shm_join(tr_comm *group, const char *name, double timeout_s,
                               nas_err *err) {
  int stage = tr_comm_rank(group), stages = tr_comm_world(group);
  if (!comm_name_ok(name)) {
    nas_errf(err, "pipeline stage %d: name '%.*s' must be 1 to %d letters, digits, '.', '_' or "
             "'-', not starting with '.' (it names a file in /dev/shm)", stage,
             TR_COMM_NAME_MAX, name, TR_COMM_NAME_MAX - 1);
    return NULL;
  }
  char *path = nas_asprintf("/dev/shm/nas-pipe-%s", name);
  pw_shm *impl = calloc(1, sizeof *impl);
  tr_pipe_world *world = malloc(sizeof *world);
  int rc = path && impl && world ? NAS_OK : nas_errf(err, "out of memory");
  if (rc == NAS_OK) {
    impl->timeout_s = timeout_s;
    impl->pid_ns = comm_pid_namespace();
  }
  if (rc == NAS_OK && stage == 0) rc = segment_create(impl, path, stages, err);
  bool named = rc == NAS_OK && stage == 0;
  /* stage 0 tells whether it made the segment, so a failure there fails every stage */
  double made = rc == NAS_OK;
  if (rc == NAS_OK || stage == 0) {
    int sent = tr_comm_broadcast(group, TR_F64, &made, 1, 0, err);
    if (rc == NAS_OK) rc = sent;
  }
  if (rc == NAS_OK && made != 1)
    rc = nas_errf(err, "stage 0 could not make the shared segment %s", path);
  if (rc == NAS_OK && stage > 0) rc = segment_attach(impl, path, stage, stages, err);
  if (rc == NAS_OK) rc = tr_comm_barrier(group, err);
  if (named) unlink(path); /* everyone has mapped it, or the join failed */
  free(path);
  if (rc == NAS_OK) {
    *world = (tr_pipe_world){&shm_transport, impl};
    return world;
  }
  nas_err_prefix(err, "pipeline stage %d joining '%s'", stage, name);
  if (impl) shm_free(impl);
  free(world);
  return NULL;
}

static int check_timeout(double timeout_s, nas_err *err) {
  return timeout_s > 0 ? NAS_OK
                       : nas_errf(err, "pipeline: the timeout must be positive, got %g s",
                                  timeout_s);
}

int tr_pipe_run_group(tr_comm *group, const char *name, double timeout_s, tr_pipe_rank_fn fn,
                      void *arg, nas_err *err) {
  if (!fn || !name || !group) return nas_errf(err, "pipeline process: no stage function, name or group");
  int stage = tr_comm_rank(group), stages = tr_comm_world(group);
  tr_comm_backend backend = tr_comm_backend_of(group);
  if (backend != TR_COMM_PROCESSES && backend != TR_COMM_NCCL)
    return nas_errf(err, "pipeline stages as processes need a process group (stages on the "
                    "CPU, on one node) or an NCCL group (stages on CUDA devices)");
  if (stages > TR_PIPE_MAX_STAGES)
    return nas_errf(err, "pipeline: %d stages, not in [1, %d]", stages, TR_PIPE_MAX_STAGES);
  if (check_timeout(timeout_s, err)) return NAS_ERR;
  tr_pipe_world *world = backend == TR_COMM_NCCL ? pw_nccl_new(group, err)
                                                 : shm_join(group, name, timeout_s, err);
  if (!world) return NAS_ERR;
  tr_pipe_rank rank = {.stage = stage, .stages = stages, .world = world};
  int rc = fn(&rank, arg, err);
  if (rc != NAS_OK) pw_abort(world, stage, err);
  pw_free(world);
  return rc;
}

int tr_pipe_run_process(const char *name, int stage, int stages, double timeout_s,
                        tr_pipe_rank_fn fn, void *arg, nas_err *err) {
  if (!name) return nas_errf(err, "pipeline process: no name");
  if (stages < 1 || stages > TR_PIPE_MAX_STAGES || stage < 0 || stage >= stages)
    return nas_errf(err, "pipeline process: stage %d of %d stages (at most %d)", stage, stages,
                    TR_PIPE_MAX_STAGES);
  if (check_timeout(timeout_s, err)) return NAS_ERR;
  tr_comm_options opts = {.backend = TR_COMM_PROCESSES, .rank = stage, .world = stages,
                          .local_rank = stage, .nodes = 1, .timeout_s = timeout_s};
  if (snprintf(opts.name, sizeof opts.name, "%s", name) >= (int)sizeof opts.name)
    return nas_errf(err, "pipeline name '%s' is too long", name);
  tr_comm *group = NULL;
  if (tr_comm_join(&opts, &group, err) != NAS_OK)
    return nas_err_prefix(err, "pipeline stage %d joining '%s'", stage, name);
  int rc = tr_pipe_run_group(group, name, timeout_s, fn, arg, err);
  tr_comm_free(group);
  return rc;
}
