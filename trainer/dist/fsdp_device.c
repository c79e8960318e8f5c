/* fsdp_device: where FSDP's buffers live — on the host for a CPU model, on the model's CUDA
 * device for a model there — and the checks that a model, its communicators and its ctx
 * agree on that place (docs/engine-fsdp.md, "On a CUDA device").
 *
 * A device model's flat buffers, shards and gradient buffers come from the device
 * allocator of ctx->cuda, so they are counted there and freed the way every device tensor
 * is; zeroing and copies are queued on the engine's stream. The collectives run on an
 * NCCL communicator, which waits for all work queued on the device before each call and
 * returns only when its own stream is done (trainer/dist/comm_nccl.h): the engine's work that
 * wrote a collective's input is complete before NCCL reads it, and the engine's work
 * queued after a call sees its output. That host-synchronous call is the whole ordering
 * between the two streams; nothing here records events.
 *
 * Invariants: placement is decided once, at tr_fsdp_new, before the model is touched, and
 * every buffer is then made on that device; the CPU path is the code it always was (host
 * memory, memcpy), so a CPU model trains bit for bit as before. Only the collectives' own
 * buffers cross to the device: values a caller adds up on the host (norms, losses) are
 * staged through device memory for NCCL, which moves nothing else. */
#include <string.h>

#include "trainer/cuda/cuda_internal.h"
#include "trainer/dist/fsdp_internal.h"

/* ---------------------------------------------------------------- placement */

/* The one device of every parameter and buffer of model; an error naming two that differ. */
static int model_device(tr_ctx *ctx, tr_module *model, tr_device *device) {
  tr_param_list list = {0};
  if (tr_module_parameters(model, true, &list, &ctx->err)) return NAS_ERR;
  int rc = NAS_OK;
  *device = TR_DEVICE_CPU;
  for (size_t i = 0; i < list.n && rc == NAS_OK; i++) {
    tr_device at = tr_tensor_device(list.items[i]);
    if (i == 0) *device = at;
    if (at.kind == device->kind && at.index == device->index) continue;
    char a[32], b[32];
    rc = nas_errf(&ctx->err, "fsdp: %s is on %s but %s on %s: the model must be on one device "
                  "(tr_module_to_device moves it)", list.names[i], tc_device_str(at, a, sizeof a),
                  list.names[0], tc_device_str(*device, b, sizeof b));
  }
  tr_param_list_free(&list);
  return rc;
}

/* A communicator (role: "main", "prefetch") that can move buffers on device. */
static int check_comm_kind(tr_ctx *ctx, const tr_comm *comm, const char *role, tr_device device) {
  bool nccl = tr_comm_backend_of(comm) == TR_COMM_NCCL;
  if (device.kind == TR_CUDA && !nccl)
    return nas_errf(&ctx->err, "fsdp: the model is on cuda:%d but the %s communicator is a CPU "
                    "one (threads or processes), which cannot move device memory: join an NCCL "
                    "group (TR_COMM_NCCL)", device.index, role);
  if (device.kind == TR_CPU && nccl)
    return nas_errf(&ctx->err, "fsdp: the model is on the cpu but the %s communicator is NCCL, "
                    "which moves device memory only: use threads or processes, or move the "
                    "model to the GPU (tr_module_to_device)", role);
  return NAS_OK;
}

/* What a model on a CUDA device needs besides an NCCL communicator. */
static int check_device_model(tr_ctx *ctx, const tr_fsdp_config *cfg, tr_device device) {
  if (!ctx->cuda)
    return nas_errf(&ctx->err, "fsdp: the model is on cuda:%d but ctx->cuda is NULL (set it to "
                    "the engine of that device, from tr_cuda_new)", device.index);
  if (tr_cuda_device(ctx->cuda) != device.index)
    return nas_errf(&ctx->err, "fsdp: the model is on cuda:%d but ctx->cuda is the engine of "
                    "cuda:%d", device.index, tr_cuda_device(ctx->cuda));
  /* A helper thread's NCCL calls on a second communicator would run beside the main
   * thread's on the same device: NCCL does not promise progress for concurrent
   * communicators there, and every call here waits for the whole device anyway. */
  if (cfg->prefetch && cfg->mode != TR_SHARD_NONE)
    return nas_errf(&ctx->err, "fsdp: prefetch is not supported for a model on cuda:%d (its "
                    "gathers would need a second NCCL communicator running beside the first "
                    "on one device): turn prefetch off", device.index);
  return NAS_OK;
}

int fsdp_placement(tr_ctx *ctx, tr_module *model, const tr_fsdp_config *cfg, tr_comm *comm,
                   tr_comm *prefetch_comm, tr_device *device, tr_allocator **alloc) {
  if (model_device(ctx, model, device) || check_comm_kind(ctx, comm, "main", *device) ||
      (prefetch_comm && check_comm_kind(ctx, prefetch_comm, "prefetch", *device)))
    return NAS_ERR;
  if (device->kind == TR_CUDA) {
    if (check_device_model(ctx, cfg, *device)) return NAS_ERR;
    *alloc = ctx->cuda->alloc;
    return NAS_OK;
  }
  if (!ctx->alloc)
    return nas_errf(&ctx->err, "fsdp: the context has no allocator (each rank needs its own, "
                    "for memory accounting)");
  *alloc = ctx->alloc;
  return NAS_OK;
}

/* ---------------------------------------------------------------- buffers */

tr_tensor *fsdp_buffer_new(tr_ctx *ctx, const tr_fsdp *f, int64_t n, bool zero) {
  tr_tensor *t = tn_empty_on(ctx, f->alloc, f->device, f->dtype, 1, &n);
  if (!t || !zero) return t;
  if (!fsdp_on_cuda(f)) {
    memset(t->storage->data, 0, t->storage->nbytes);
    return t;
  }
  if (tc_ok(ctx, "fsdp zeros", tck_memset0(tc_stream(ctx), tr_data(t), t->storage->nbytes))) {
    tr_release(t);
    return NULL;
  }
  return t;
}

int fsdp_copy_bytes(tr_ctx *ctx, const tr_fsdp *f, void *dst, const void *src, size_t nbytes) {
  if (!fsdp_on_cuda(f)) {
    memcpy(dst, src, nbytes);
    return NAS_OK;
  }
  return tc_ok(ctx, "fsdp copy", tck_memcpy(tc_stream(ctx), dst, src, nbytes, TCK_D2D));
}

int fsdp_copy_param(tr_ctx *ctx, const tr_fsdp *f, const tr_tensor *p, tr_tensor *full,
                    int64_t off) {
  if (!fsdp_on_cuda(f)) {
    tn_copy_to_contig(p, (char *)tr_data(full) + (size_t)off * tr_dtype_size(f->dtype));
    return NAS_OK;
  }
  tr_tensor *dst = tn_view(ctx, full, p->ndim, p->shape); /* contiguous, at off */
  if (!dst) return NAS_ERR;
  dst->offset = off;
  int rc = tc_copy_raw(ctx, dst, p);
  tr_release(dst);
  return rc;
}

/* ---------------------------------------------------------------- host values */

int tr_fsdp_all_reduce_host(tr_ctx *ctx, tr_fsdp *f, double *values, int64_t n,
                            tr_reduce_op op) {
  if (!fsdp_on_cuda(f))
    return tr_comm_all_reduce(f->comm, TR_F64, values, values, n, op, &ctx->err);
  tr_tensor *stage = tn_empty_on(ctx, f->alloc, f->device, TR_F64, 1, &n);
  if (!stage) return NAS_ERR;
  size_t nbytes = (size_t)n * sizeof *values;
  /* the copies to and from the host wait for the engine's stream */
  int rc = tc_ok(ctx, "fsdp: values to the device",
                 tck_memcpy(tc_stream(ctx), tr_data(stage), values, nbytes, TCK_H2D));
  if (rc == NAS_OK)
    rc = tr_comm_all_reduce(f->comm, TR_F64, tr_data(stage), tr_data(stage), n, op, &ctx->err);
  if (rc == NAS_OK)
    rc = tc_ok(ctx, "fsdp: values from the device",
               tck_memcpy(tc_stream(ctx), values, tr_data(stage), nbytes, TCK_D2H));
  tr_release(stage);
  return rc;
}
