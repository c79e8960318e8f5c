/* fsdp internals shared by fsdp_units.c (units, sharding, lifetime), fsdp.c (gathering,
 * the unit's autograd node, forward and backward), fsdp_prefetch.c (the helper thread
 * that all-gathers the next unit ahead of use) and fsdp_device.c (where the buffers live:
 * the host or the model's CUDA device).
 * Not part of the public API (trainer.h); docs/engine-fsdp.md tells the design. */
#ifndef NAS_TRAINER_FSDP_INTERNAL_H
#define NAS_TRAINER_FSDP_INTERNAL_H

#include "trainer/dist.h"
#include "trainer/core/internal.h"

/* Where a unit's prefetch stands. Only the owning rank's main thread moves IDLE → QUEUED
 * (posting) and DONE → IDLE (consuming); only the helper moves QUEUED → DONE. */
typedef enum { FSDP_PF_IDLE, FSDP_PF_QUEUED, FSDP_PF_DONE } fsdp_pf_state;

/* One unit: consecutive children of the model whose parameters are one flat buffer.
 *
 * full is a 1-D tensor of `padded` elements over the storage that the unit's parameter
 * tensors view (each at its offset, in module order, padding zero at the end). In the
 * sharded modes its data comes and goes: tn_alloc'd for an all-gather, handed back to the
 * allocator when resharded, while the storage struct (and so every view of it, including
 * tensors saved by the inner graph) stays. flat is what the optimiser updates and what
 * carries the unit's gradient: this rank's shard (own storage) when sharded, full itself
 * in mode none. */
typedef struct {
  int index;
  tr_module **children; /* owned array of borrowed modules, n_children of them */
  size_t n_children;
  tr_tensor **params; /* owned references to the module's parameter tensors */
  size_t n_params;
  int64_t numel;       /* parameter values in the unit */
  int64_t padded;      /* numel rounded up to a multiple of world (numel in mode none) */
  int64_t shard_numel; /* padded / world (numel in mode none) */
  tr_tensor *full;     /* owned; see above */
  tr_tensor *flat;     /* owned; requires grad; see above */
  /* flat's storage version when full was last gathered: full is current when it has data
   * and this still matches (an optimiser step bumps flat's version) */
  uint64_t gathered_version;
  /* prefetch of this unit, guarded by the prefetcher's lock */
  fsdp_pf_state pf_state;
  int pf_rc;
  nas_err pf_err;
} fsdp_unit;

typedef struct fsdp_prefetcher fsdp_prefetcher;

struct tr_fsdp {
  tr_fsdp_config cfg;
  tr_comm *comm; /* borrowed: main group */
  int rank, world;
  tr_dtype dtype;
  tr_device device;    /* where every parameter, buffer and FSDP buffer of the model is */
  tr_allocator *alloc; /* owned reference: the rank's allocator (host), or the device
                          allocator of ctx->cuda for a model on a CUDA device */
  fsdp_unit *units;    /* owned, n_units */
  int n_units;
  int64_t params;
  fsdp_prefetcher *prefetcher; /* owned; NULL without prefetch */
};

static inline bool fsdp_is_sharded(const tr_fsdp *f) { return f->cfg.mode != TR_SHARD_NONE; }
static inline bool fsdp_on_cuda(const tr_fsdp *f) { return f->device.kind == TR_CUDA; }

/* ---- fsdp_device.c: placement, and buffers on the host or the model's device ---- */

/* The device model's parameters and buffers are on, checked with everything that must
 * match it before the model is touched: one device for all of them, a communicator of
 * the right kind (CPU threads or processes for a CPU model, NCCL for a CUDA one), no
 * prefetch on a device, ctx's engine on that device; *alloc (borrowed) is the allocator
 * FSDP's buffers come from: ctx->alloc on the CPU, the engine's device allocator on a GPU. */
int fsdp_placement(tr_ctx *ctx, tr_module *model, const tr_fsdp_config *cfg, tr_comm *comm,
                   tr_comm *prefetch_comm, tr_device *device, tr_allocator **alloc);
/* A new contiguous 1-D tensor of n elements of f's dtype on f's device, from f's
 * allocator; zero-filled when zero (on a device, queued on ctx's engine stream). */
tr_tensor *fsdp_buffer_new(tr_ctx *ctx, const tr_fsdp *f, int64_t n, bool zero);
/* nbytes from src to dst, both on f's device (memcpy, or a copy queued on ctx's stream). */
int fsdp_copy_bytes(tr_ctx *ctx, const tr_fsdp *f, void *dst, const void *src, size_t nbytes);
/* p's values (any strides) into full at element offset off, contiguously. */
int fsdp_copy_param(tr_ctx *ctx, const tr_fsdp *f, const tr_tensor *p, tr_tensor *full,
                    int64_t off);
/* Hands u's full parameters back to the allocator (sharded modes; not while a prefetch of
 * u is in flight). */
void fsdp_unit_reshard(tr_fsdp *f, fsdp_unit *u);

/* A helper thread that runs all-gathers on comm (borrowed: the rank's communicator in a
 * group kept for prefetch traffic) for at most capacity queued units; NULL with err set. */
fsdp_prefetcher *fsdp_prefetcher_new(tr_comm *comm, tr_dtype dtype, size_t capacity,
                                     nas_err *err);
/* Finishes the queued gathers (the other ranks wait for them), then joins the thread. */
void fsdp_prefetcher_free(fsdp_prefetcher *p);
/* Queues the all-gather of u->flat (a shard) into u->full's data, which must be allocated
 * and must not be touched until fsdp_prefetcher_wait returns for u. u must be idle. */
void fsdp_prefetcher_post(fsdp_prefetcher *p, fsdp_unit *u);
/* Whether u was posted and not yet waited for. */
bool fsdp_prefetcher_pending(fsdp_prefetcher *p, const fsdp_unit *u);
/* Waits for u's gather and makes u idle again; returns its result (err: its message). */
int fsdp_prefetcher_wait(fsdp_prefetcher *p, fsdp_unit *u, nas_err *err);

#endif
