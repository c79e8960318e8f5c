/* pipeline_world: the pw_* calls, which reach a world's transport, and the thread
 * transport, where the stages of a pipeline of thread ranks meet — a FIFO of tensor
 * messages from each stage to each other, a step barrier that adds up one value per stage,
 * and the abort that fails every stage with one message — with tr_pipe_run_threads, the
 * driver that runs one stage per thread (docs/engine-pipeline.md).
 *
 * Invariants:
 * - A message is a malloc'd copy of the sender's tensor: sending never blocks, the sender's
 *   allocator (one per rank, not thread-safe) never sees another thread, and the receiver
 *   copies the data into its own allocator.
 * - Every wait is bounded by the world's timeout and ends early when the world is aborted;
 *   a wait that times out aborts the world itself, naming the stage that waited, so a
 *   stalled stage fails every other one instead of hanging it. The first abort's message
 *   is the only one: every later failing call returns it.
 * - All shared state is guarded by the world's mutex; one condition variable is broadcast
 *   on every change (few threads, short critical sections). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer/dist.h"
#include "trainer/dist/pipeline_internal.h"

typedef struct pipe_msg {
  struct pipe_msg *next;
  tr_dtype dtype;
  int ndim;
  int64_t shape[TR_MAX_DIMS];
  void *data; /* owned (malloc): the tensor's values, contiguous */
} pipe_msg;

typedef struct {
  pipe_msg *head, *tail;
} pipe_queue;

typedef struct {
  int stages;
  double timeout_s;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  pipe_queue *queues; /* owned, stages * stages: [from * stages + to] */
  bool aborted;
  nas_err message;    /* the abort's message */
  /* the step barrier */
  int arrived;
  uint64_t generation;
  double *values; /* owned, one per stage: what each brought to the barrier */
  double result;  /* the last completed barrier's sum */
} pw_threads;

/* ---------------------------------------------------------------- lifetime */

static pw_threads *threads_new(int stages, double timeout_s, nas_err *err) {
  if (stages < 1 || stages > TR_PIPE_MAX_STAGES) {
    nas_errf(err, "pipeline: %d stages, not in [1, %d]", stages, TR_PIPE_MAX_STAGES);
    return NULL;
  }
  if (!(timeout_s > 0)) {
    nas_errf(err, "pipeline: the timeout must be positive, got %g s", timeout_s);
    return NULL;
  }
  pw_threads *w = calloc(1, sizeof *w);
  size_t n = (size_t)stages;
  if (w) {
    w->queues = calloc(n * n, sizeof *w->queues);
    w->values = calloc(n, sizeof *w->values);
  }
  if (!w || !w->queues || !w->values || pthread_mutex_init(&w->lock, NULL) != 0) {
    if (w) free(w->queues), free(w->values);
    free(w);
    nas_errf(err, "pipeline of %d stages: out of memory", stages);
    return NULL;
  }
  if (pthread_cond_init(&w->changed, NULL) != 0) {
    pthread_mutex_destroy(&w->lock);
    free(w->queues);
    free(w->values);
    free(w);
    nas_errf(err, "pipeline of %d stages: cannot make a condition variable", stages);
    return NULL;
  }
  w->stages = stages;
  w->timeout_s = timeout_s;
  return w;
}

static void threads_free(void *impl) {
  pw_threads *w = impl;
  for (int i = 0; i < w->stages * w->stages; i++) {
    for (pipe_msg *m = w->queues[i].head, *next; m; m = next) {
      next = m->next;
      free(m->data);
      free(m);
    }
  }
  pthread_cond_destroy(&w->changed);
  pthread_mutex_destroy(&w->lock);
  free(w->queues);
  free(w->values);
  free(w);
}

static void threads_abort(void *impl, const char *message, nas_err *err);
static bool threads_aborted(void *impl, nas_err *err);
static int threads_send(tr_ctx *ctx, void *impl, int from, int to, const tr_tensor *t);
static tr_tensor *threads_recv(tr_ctx *ctx, void *impl, int from, int to, const char *what);
static int threads_step_end(void *impl, int stage, double *value, nas_err *err);

static const pw_transport threads_transport = {threads_send,    threads_recv,
                                               threads_step_end, threads_abort,
                                               threads_aborted, threads_free, false, false};

tr_pipe_world *pw_new(int stages, double timeout_s, nas_err *err) {
  pw_threads *impl = threads_new(stages, timeout_s, err);
  if (!impl) return NULL;
  tr_pipe_world *w = malloc(sizeof *w);
  if (!w) {
    threads_free(impl);
    nas_errf(err, "pipeline of %d stages: out of memory", stages);
    return NULL;
  }
  *w = (tr_pipe_world){&threads_transport, impl};
  return w;
}

/* ---------------------------------------------------------------- any transport */

void pw_free(tr_pipe_world *w) {
  if (!w) return;
  w->transport->free(w->impl);
  free(w);
}

int pw_send(tr_ctx *ctx, tr_pipe_world *w, int from, int to, const tr_tensor *t) {
  return w->transport->send(ctx, w->impl, from, to, t);
}

tr_tensor *pw_recv(tr_ctx *ctx, tr_pipe_world *w, int from, int to, const char *what) {
  return w->transport->recv(ctx, w->impl, from, to, what);
}

int pw_step_end(tr_pipe_world *w, int stage, double *value, nas_err *err) {
  return w->transport->step_end(w->impl, stage, value, err);
}

/* Whether message begins with "pipeline stage <stage>" as a whole phrase, as tr_pipe_new's
 * checks and the NCCL transport's messages do. */
static bool names_stage(const char *message, int stage) {
  char own[32];
  int n = snprintf(own, sizeof own, "pipeline stage %d", stage);
  return strncmp(message, own, (size_t)n) == 0 && (message[n] == ':' || message[n] == ' ');
}

int pw_abort(tr_pipe_world *w, int stage, nas_err *err) {
  nas_err mine = *err;
  if (!names_stage(mine.msg, stage)) nas_err_prefix(&mine, "pipeline stage %d", stage);
  w->transport->abort(w->impl, mine.msg, err);
  return NAS_ERR;
}

bool pw_aborted(tr_pipe_world *w, nas_err *err) { return w->transport->aborted(w->impl, err); }

bool pw_moves_device_memory(const tr_pipe_world *w) { return w->transport->device_memory; }

bool pw_sends_wait(const tr_pipe_world *w) { return w->transport->sends_wait; }

void pw_stalled_message(nas_err *out, int stage, double timeout_s, const char *what) {
  nas_errf(out, "pipeline stage %d waited %g s for %s: a stage stalled or failed", stage,
           timeout_s, what);
}

/* ---------------------------------------------------------------- abort and waits */

/* Under the lock. */
static void abort_locked(pw_threads *w, const char *message) {
  if (w->aborted) return;
  w->aborted = true;
  nas_errf(&w->message, "%s", message);
  pthread_cond_broadcast(&w->changed);
}

static void threads_abort(void *impl, const char *message, nas_err *err) {
  pw_threads *w = impl;
  pthread_mutex_lock(&w->lock);
  abort_locked(w, message);
  nas_errf(err, "%s", w->message.msg);
  pthread_mutex_unlock(&w->lock);
}

static bool threads_aborted(void *impl, nas_err *err) {
  pw_threads *w = impl;
  pthread_mutex_lock(&w->lock);
  bool aborted = w->aborted;
  if (aborted && err) nas_errf(err, "%s", w->message.msg);
  pthread_mutex_unlock(&w->lock);
  return aborted;
}

static struct timespec deadline_after(double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double whole = floor(seconds);
  ts.tv_sec += (time_t)whole;
  ts.tv_nsec += (long)((seconds - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Waits (under the lock) until ready(w, arg) or an abort; a timeout aborts the world with
 * a message naming stage and what it waited for. NAS_OK when ready. */
static int wait_until(pw_threads *w, bool (*ready)(const pw_threads *, const void *),
                      const void *arg, int stage, const char *what, nas_err *err) {
  struct timespec deadline = deadline_after(w->timeout_s);
  while (!w->aborted && !ready(w, arg)) {
    if (pthread_cond_timedwait(&w->changed, &w->lock, &deadline) == ETIMEDOUT &&
        !w->aborted && !ready(w, arg)) {
      nas_err stalled;
      pw_stalled_message(&stalled, stage, w->timeout_s, what);
      abort_locked(w, stalled.msg);
    }
  }
  if (!w->aborted) return NAS_OK;
  return nas_errf(err, "%s", w->message.msg);
}

/* ---------------------------------------------------------------- messages */

static int threads_send(tr_ctx *ctx, void *impl, int from, int to, const tr_tensor *t) {
  pw_threads *w = impl;
  pipe_msg *m = calloc(1, sizeof *m);
  size_t bytes = (size_t)t->numel * tr_dtype_size(t->dtype);
  if (m) m->data = malloc(bytes ? bytes : 1);
  if (!m || !m->data) {
    free(m);
    return nas_errf(&ctx->err, "pipeline: out of memory for a message of %zu bytes", bytes);
  }
  m->dtype = t->dtype;
  m->ndim = t->ndim;
  memcpy(m->shape, t->shape, sizeof m->shape);
  tn_copy_to_contig(t, m->data);
  pthread_mutex_lock(&w->lock);
  pipe_queue *q = &w->queues[from * w->stages + to];
  if (q->tail)
    q->tail->next = m;
  else
    q->head = m;
  q->tail = m;
  pthread_cond_broadcast(&w->changed);
  pthread_mutex_unlock(&w->lock);
  return NAS_OK;
}

static bool queue_ready(const pw_threads *w, const void *q) {
  (void)w;
  return ((const pipe_queue *)q)->head != NULL;
}

static tr_tensor *threads_recv(tr_ctx *ctx, void *impl, int from, int to, const char *what) {
  pw_threads *w = impl;
  char waited[256];
  snprintf(waited, sizeof waited, "%s from stage %d", what, from);
  pthread_mutex_lock(&w->lock);
  pipe_queue *q = &w->queues[from * w->stages + to];
  pipe_msg *m = NULL;
  if (wait_until(w, queue_ready, q, to, waited, &ctx->err) == NAS_OK) {
    m = q->head;
    q->head = m->next;
    if (!q->head) q->tail = NULL;
  }
  pthread_mutex_unlock(&w->lock);
  if (!m) return NULL;
  tr_tensor *t = tr_from_data(ctx, m->dtype, m->ndim, m->shape, m->data);
  free(m->data);
  free(m);
  return t;
}

/* ---------------------------------------------------------------- step barrier */

typedef struct {
  uint64_t generation;
} barrier_ticket;

static bool barrier_passed(const pw_threads *w, const void *ticket) {
  return w->generation != ((const barrier_ticket *)ticket)->generation;
}

static int threads_step_end(void *impl, int stage, double *value, nas_err *err) {
  pw_threads *w = impl;
  pthread_mutex_lock(&w->lock);
  barrier_ticket ticket = {w->generation};
  w->values[stage] = *value;
  if (++w->arrived == w->stages) {
    w->result = 0;
    for (int s = 0; s < w->stages; s++) w->result += w->values[s];
    w->arrived = 0;
    w->generation++;
    pthread_cond_broadcast(&w->changed);
  }
  int rc = wait_until(w, barrier_passed, &ticket, stage, "the other stages to end the step",
                      err);
  if (rc == NAS_OK) *value = w->result;
  pthread_mutex_unlock(&w->lock);
  return rc;
}

/* ---------------------------------------------------------------- threads */

typedef struct {
  tr_pipe_world *world;
  tr_pipe_rank_fn fn;
  void *arg;
} stage_job;

/* One stage on the rank thread FSDP's driver starts; its failure aborts the world. */
static int stage_main(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  stage_job *job = arg;
  tr_pipe_rank stage = {.stage = rank->rank, .stages = rank->world, .world = job->world};
  int rc = job->fn(&stage, job->arg, err);
  if (rc != NAS_OK) pw_abort(job->world, rank->rank, err);
  return rc;
}

int tr_pipe_run_threads(int stages, double timeout_s, tr_pipe_rank_fn fn, void *arg,
                        nas_err *err) {
  if (!fn) return nas_errf(err, "pipeline threads: no stage function");
  stage_job job = {.fn = fn, .arg = arg, .world = pw_new(stages, timeout_s, err)};
  if (!job.world) return NAS_ERR;
  int rc = tr_fsdp_run_threads(stages, stage_main, &job, err);
  /* the abort's message is the one every stage failed with */
  if (rc != NAS_OK && !pw_aborted(job.world, err)) nas_err_prefix(err, "pipeline");
  pw_free(job.world);
  return rc;
}
