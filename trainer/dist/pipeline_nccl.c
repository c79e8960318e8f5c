/* pipeline_nccl: the NCCL transport of a pipeline — stages that are processes, each on its
 * own CUDA device, sending device tensors to one another with NCCL's send and receive
 * over the stages' NCCL group (docs/engine-pipeline.md, "Stages on CUDA devices").
 *
 * A message is its header (dtype, shape), staged through the communicator's own device
 * buffer, then the tensor's values, device to device. The step barrier is messages too:
 * every stage sends its value to stage 0, which adds them in stage order and sends the
 * sum back, so the sum is the same as on the other transports.
 *
 * Invariants:
 * - One stage per process, and one call at a time on its communicator: each call returns
 *   once its bytes have moved (trainer/dist/comm_nccl.h), so a send waits until its
 *   receiver takes it. The schedule never has a stage wait for a message it has yet to
 *   send (forward messages flow to later stages, backward ones to earlier, and each
 *   stage's skip messages go out in the order of their pops, which is stage order), so
 *   that only paces the sender, as a full mailbox does on shared memory.
 * - Every wait is bounded by the group's timeout (NCCL's: the communicator aborts itself
 *   after it). NCCL cannot wake a peer that waits for a stage that failed, so where the
 *   shared-memory transport fails every stage at once with the failing stage's message,
 *   here the others fail when their wait times out, naming what they waited for.
 * - The first failure's message is the only one: every later call of this stage fails
 *   with it. */
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda/cuda_internal.h"
#include "trainer/dist/comm_internal.h"
#include "trainer/dist/comm_nccl.h"
#include "trainer/dist/pipeline_internal.h"

/* A message's header. */
typedef struct {
  int32_t dtype, ndim;
  int64_t shape[TR_MAX_DIMS];
} nccl_msg;

_Static_assert(sizeof(nccl_msg) <= COMM_NCCL_HOST_BYTES, "a header must fit the staging buffer");

typedef struct {
  comm_nccl *nc; /* borrowed: the communicator of the stages' group */
  int stage, stages;
  bool aborted;
  nas_err why; /* the first failure's message */
} pw_nccl;

/* Records the first failure (err's message); err gets the world's message. */
static int fail(pw_nccl *w, nas_err *err) {
  if (!w->aborted) {
    w->aborted = true;
    w->why = *err;
  }
  *err = w->why;
  return NAS_ERR;
}

static int check_alive(pw_nccl *w, nas_err *err) {
  return w->aborted ? nas_errf(err, "%s", w->why.msg) : NAS_OK;
}

static int nccl_send(tr_ctx *ctx, void *impl, int from, int to, const tr_tensor *t) {
  pw_nccl *w = impl;
  if (check_alive(w, &ctx->err)) return NAS_ERR;
  if (!tn_on_cuda(t))
    return nas_errf(&ctx->err, "pipeline stage %d: a host tensor for stage %d: stages over "
                    "NCCL send device tensors", from, to);
  nccl_msg m = {.dtype = (int32_t)t->dtype, .ndim = t->ndim};
  memcpy(m.shape, t->shape, sizeof m.shape);
  tr_tensor *values = tn_contig(ctx, t);
  int rc = values ? comm_nccl_send(w->nc, &m, sizeof m, to, true, &ctx->err) : NAS_ERR;
  if (rc == NAS_OK)
    rc = comm_nccl_send(w->nc, tr_data(values),
                        (int64_t)((size_t)values->numel * tr_dtype_size(values->dtype)), to,
                        false, &ctx->err);
  tr_release(values);
  if (rc == NAS_OK) return NAS_OK;
  nas_err_prefix(&ctx->err, "pipeline stage %d sending to stage %d", from, to);
  return fail(w, &ctx->err);
}

/* The header from `from`, checked; NAS_ERR with err set. */
static int recv_header(pw_nccl *w, int from, nccl_msg *m, nas_err *err) {
  if (comm_nccl_recv(w->nc, m, sizeof *m, from, true, err) != NAS_OK) return NAS_ERR;
  if (m->ndim < 0 || m->ndim > TR_MAX_DIMS ||
      (m->dtype != TR_F32 && m->dtype != TR_F64 && m->dtype != TR_BF16))
    return nas_errf(err, "a message with dtype %d and %d dimensions", m->dtype, m->ndim);
  return NAS_OK;
}

static tr_tensor *nccl_recv(tr_ctx *ctx, void *impl, int from, int to, const char *what) {
  pw_nccl *w = impl;
  if (check_alive(w, &ctx->err)) return NULL;
  if (!ctx->cuda)
    return tr_fail(ctx, "pipeline stage %d: ctx->cuda is NULL: stages over NCCL receive into "
                   "the device of ctx->cuda", to);
  nccl_msg m;
  tr_tensor *t = NULL;
  int rc = recv_header(w, from, &m, &ctx->err);
  if (rc == NAS_OK) {
    t = tn_empty_on(ctx, ctx->cuda->alloc, TR_DEVICE_CUDA(tr_cuda_device(ctx->cuda)),
                    (tr_dtype)m.dtype, m.ndim, m.shape);
    rc = t ? comm_nccl_recv(w->nc, tr_data(t),
                            (int64_t)((size_t)t->numel * tr_dtype_size(t->dtype)), from, false,
                            &ctx->err)
           : NAS_ERR;
  }
  if (rc == NAS_OK) return t;
  tr_release(t);
  nas_err_prefix(&ctx->err, "pipeline stage %d waiting for %s from stage %d", to, what, from);
  fail(w, &ctx->err);
  return NULL;
}

/* Stage 0: every other stage's value, added in stage order, and the sum sent back. */
static int gather_sum(pw_nccl *w, double *value, nas_err *err) {
  double sum = *value;
  for (int s = 1; s < w->stages; s++) {
    double v;
    if (comm_nccl_recv(w->nc, &v, sizeof v, s, true, err) != NAS_OK) return NAS_ERR;
    sum += v;
  }
  for (int s = 1; s < w->stages; s++)
    if (comm_nccl_send(w->nc, &sum, sizeof sum, s, true, err) != NAS_OK) return NAS_ERR;
  *value = sum;
  return NAS_OK;
}

static int nccl_step_end(void *impl, int stage, double *value, nas_err *err) {
  pw_nccl *w = impl;
  if (check_alive(w, err)) return NAS_ERR;
  int rc = stage == 0 ? gather_sum(w, value, err)
                      : comm_nccl_send(w->nc, value, sizeof *value, 0, true, err);
  if (rc == NAS_OK && stage > 0) rc = comm_nccl_recv(w->nc, value, sizeof *value, 0, true, err);
  if (rc == NAS_OK) return NAS_OK;
  nas_err_prefix(err, "pipeline stage %d waiting for the other stages to end the step", stage);
  return fail(w, err);
}

static void nccl_abort(void *impl, const char *message, nas_err *err) {
  pw_nccl *w = impl;
  nas_errf(err, "%s", message);
  fail(w, err);
}

static bool nccl_aborted(void *impl, nas_err *err) {
  pw_nccl *w = impl;
  if (w->aborted && err) *err = w->why;
  return w->aborted;
}

static void nccl_free(void *impl) { free(impl); }

static const pw_transport nccl_transport = {nccl_send,    nccl_recv, nccl_step_end, nccl_abort,
                                            nccl_aborted, nccl_free, true, true};

tr_pipe_world *pw_nccl_new(tr_comm *group, nas_err *err) {
  if (tr_comm_backend_of(group) != TR_COMM_NCCL) {
    nas_errf(err, "pipeline over NCCL: the group is not an NCCL one");
    return NULL;
  }
  pw_nccl *impl = calloc(1, sizeof *impl);
  tr_pipe_world *world = malloc(sizeof *world);
  if (!impl || !world) {
    free(impl);
    free(world);
    nas_errf(err, "pipeline over NCCL: out of memory");
    return NULL;
  }
  *impl = (pw_nccl){.nc = group->impl, .stage = tr_comm_rank(group),
                    .stages = tr_comm_world(group)};
  *world = (tr_pipe_world){&nccl_transport, impl};
  return world;
}
