/* fsdp_units: how a model becomes FSDP units — the unit policy, each unit's parameters
 * flattened into one buffer with rank 0's values, this rank's shard cut from it — and the
 * tr_fsdp's lifetime (docs/engine-fsdp.md; the runtime is fsdp.c).
 *
 * Invariants: the configuration, communicators, device and parameters are checked before
 * the model is touched, so a refused tr_fsdp_new leaves the model as it was (a failure of
 * the start broadcast, when ranks' models differ, leaves it fit only to be freed). Every
 * unit holds at least one parameter (parameterless children join a unit that has some);
 * its parameters keep module order in the flat buffer, each parameter tensor becoming a
 * view at its offset (the same tensor object, so the module's forward uses the flat
 * buffer), and the padding at the end is zero. Every rank makes the same broadcasts in the
 * same order, so ranks whose models differ in shape all fail on the same call. */
#include <stdlib.h>

#include "trainer/dist/fsdp_internal.h"

/* ---------------------------------------------------------------- units */

/* Whether a child with child_params parameters starts a new unit after one holding held. */
static bool starts_unit(const tr_fsdp_config *cfg, int64_t held, int64_t child_params) {
  return child_params > 0 && held > 0 && held >= cfg->unit_params;
}

/* Cuts children (n of them) into units by the policy: f->units gets their child ranges. */
static int plan_units(tr_ctx *ctx, tr_fsdp *f, tr_module *const *children, size_t n) {
  f->units = calloc(n, sizeof *f->units);
  if (!f->units) return nas_errf(&ctx->err, "fsdp: out of memory");
  int64_t held = 0;
  fsdp_unit *cur = NULL;
  for (size_t i = 0; i < n; i++) {
    int64_t child_params = tr_module_param_count(children[i]);
    if (!cur || starts_unit(&f->cfg, held, child_params)) {
      cur = &f->units[f->n_units];
      cur->index = f->n_units++;
      cur->children = calloc(n - i, sizeof *cur->children);
      if (!cur->children) return nas_errf(&ctx->err, "fsdp: out of memory");
      held = 0;
    }
    cur->children[cur->n_children++] = children[i];
    held += child_params;
    f->params += child_params;
  }
  if (f->params == 0) return nas_errf(&ctx->err, "fsdp: the model has no parameters to shard");
  return NAS_OK;
}

/* Points t at offset off of full's storage (its data must be copied there already). */
static void rebase(tr_tensor *t, tr_tensor *full, int64_t off) {
  tr_storage *old = t->storage;
  full->storage->refs++;
  t->storage = full->storage;
  t->offset = off;
  tn_contiguous_strides(t->ndim, t->shape, t->strides);
  tn_storage_release(old);
}

/* u->params: the module's parameter tensors of u's children, checked. */
static int collect_params(tr_ctx *ctx, tr_fsdp *f, fsdp_unit *u) {
  tr_param_list list = {0};
  int rc = NAS_OK;
  for (size_t c = 0; c < u->n_children && rc == NAS_OK; c++)
    rc = tr_module_parameters(u->children[c], false, &list, &ctx->err);
  u->params = rc == NAS_OK ? calloc(list.n ? list.n : 1, sizeof *u->params) : NULL;
  if (rc == NAS_OK && !u->params) rc = nas_errf(&ctx->err, "fsdp: out of memory");
  for (size_t i = 0; i < list.n && rc == NAS_OK; i++) {
    tr_tensor *p = list.items[i];
    if (!p->storage->data)
      rc = nas_errf(&ctx->err, "fsdp unit %d: parameter %s has no data (is the model sharded "
                    "by another tr_fsdp?)", u->index, list.names[i]);
    else if (p->dtype != f->dtype)
      rc = nas_errf(&ctx->err, "fsdp unit %d: parameter %s is %s, the first one %s", u->index,
                    list.names[i], p->dtype == TR_F32 ? "float32" : "float64",
                    f->dtype == TR_F32 ? "float32" : "float64");
    else
      u->params[u->n_params++] = tr_retain(p);
  }
  tr_param_list_free(&list);
  return rc;
}

/* Flattens u's parameters (collected) into full, with rank 0's values on every rank, then
 * keeps this rank's shard in flat and frees full's data (sharded modes). */
static int shard_unit(tr_ctx *ctx, tr_fsdp *f, fsdp_unit *u) {
  for (size_t i = 0; i < u->n_params; i++) u->numel += u->params[i]->numel;
  u->padded = fsdp_is_sharded(f) ? (u->numel + f->world - 1) / f->world * f->world : u->numel;
  u->shard_numel = fsdp_is_sharded(f) ? u->padded / f->world : u->numel;
  u->full = fsdp_buffer_new(ctx, f, u->padded, true); /* the padding stays zero */
  if (!u->full) return NAS_ERR;
  size_t size = tr_dtype_size(f->dtype);
  int64_t off = 0;
  for (size_t i = 0; i < u->n_params; i++) {
    tr_tensor *p = u->params[i];
    if (fsdp_copy_param(ctx, f, p, u->full, off)) return NAS_ERR;
    rebase(p, u->full, off);
    tr_release(p->grad);
    p->grad = NULL;
    off += p->numel;
  }
  if (tr_comm_broadcast(f->comm, f->dtype, tr_data(u->full), u->padded, 0, &ctx->err))
    return nas_err_prefix(&ctx->err, "fsdp unit %d (do all ranks have the same model?)",
                          u->index);
  if (fsdp_is_sharded(f)) {
    u->flat = fsdp_buffer_new(ctx, f, u->shard_numel, false);
    if (!u->flat ||
        fsdp_copy_bytes(ctx, f, tr_data(u->flat),
                        (char *)tr_data(u->full) + (size_t)(f->rank * u->shard_numel) * size,
                        (size_t)u->shard_numel * size))
      return NAS_ERR;
  } else {
    u->flat = tr_retain(u->full);
  }
  u->flat->requires_grad = true;
  u->gathered_version = u->flat->storage->version;
  fsdp_unit_reshard(f, u);
  return NAS_OK;
}

/* Batch norm's running statistics (buffers) from rank 0, so every rank starts alike. */
static int broadcast_buffers(tr_ctx *ctx, tr_fsdp *f, tr_module *model) {
  tr_param_list list = {0};
  int rc = tr_module_parameters(model, true, &list, &ctx->err);
  for (size_t i = 0; i < list.n && rc == NAS_OK; i++) {
    tr_tensor *t = list.items[i];
    if (t->requires_grad) continue; /* a parameter */
    rc = tr_comm_broadcast(f->comm, t->dtype, tr_data(t), t->numel, 0, &ctx->err);
    if (rc) rc = nas_err_prefix(&ctx->err, "fsdp: buffer %s", list.names[i]);
    t->storage->version++;
  }
  tr_param_list_free(&list);
  return rc;
}

/* ---------------------------------------------------------------- lifetime */

static int check_comms(tr_ctx *ctx, const tr_fsdp_config *cfg, tr_comm *comm,
                       tr_comm *prefetch_comm) {
  if (!comm) return nas_errf(&ctx->err, "fsdp: no communicator");
  bool wants_prefetch = cfg->prefetch && cfg->mode != TR_SHARD_NONE;
  if (wants_prefetch && !prefetch_comm)
    return nas_errf(&ctx->err, "fsdp: prefetch needs a communicator of its own (this rank's "
                    "in a second group), got none");
  if (!prefetch_comm) return NAS_OK;
  if (prefetch_comm == comm)
    return nas_errf(&ctx->err, "fsdp: the prefetch communicator must come from a second "
                    "group, not be the main one (their calls would interleave)");
  if (tr_comm_rank(prefetch_comm) != tr_comm_rank(comm) ||
      tr_comm_world(prefetch_comm) != tr_comm_world(comm))
    return nas_errf(&ctx->err, "fsdp: the prefetch communicator is rank %d of %d, the main "
                    "one rank %d of %d", tr_comm_rank(prefetch_comm),
                    tr_comm_world(prefetch_comm), tr_comm_rank(comm), tr_comm_world(comm));
  return NAS_OK;
}

static int check_config(tr_ctx *ctx, const tr_fsdp_config *cfg, tr_module *model) {
  if (!cfg) return nas_errf(&ctx->err, "fsdp: no config");
  if (!model) return nas_errf(&ctx->err, "fsdp: no model");
  if (cfg->mode != TR_SHARD_FULL && cfg->mode != TR_SHARD_GRAD_OP && cfg->mode != TR_SHARD_NONE)
    return nas_errf(&ctx->err, "fsdp: unknown sharding mode %d (full %d, grad_op %d, none %d)",
                    (int)cfg->mode, TR_SHARD_FULL, TR_SHARD_GRAD_OP, TR_SHARD_NONE);
  if (cfg->unit_params < 0)
    return nas_errf(&ctx->err, "fsdp: unit threshold of %lld parameters is negative (0: one "
                    "unit per child with parameters)", (long long)cfg->unit_params);
  return NAS_OK;
}

/* The dtype of the model's first parameter (every parameter must share it): float32 or
 * float64, the dtypes the collectives move. */
static int model_dtype(tr_ctx *ctx, tr_module *model, tr_dtype *dtype) {
  tr_param_list list = {0};
  if (tr_module_parameters(model, false, &list, &ctx->err)) return NAS_ERR;
  if (list.n > 0) *dtype = list.items[0]->dtype;
  int rc = *dtype == TR_F32 || *dtype == TR_F64
               ? NAS_OK
               : nas_errf(&ctx->err, "fsdp: parameter %s is bfloat16; FSDP shards float32 or "
                          "float64 parameters (autocast keeps float32 master weights)",
                          list.names[0]);
  tr_param_list_free(&list);
  return rc;
}

/* The model's children; a module that is not a Sequential is one child of itself. */
static tr_module *const *model_children(tr_module **model, size_t *n) {
  tr_module *const *children = tn_module_children(*model, n);
  if (*n > 0) return children;
  *n = 1;
  return model;
}

tr_fsdp *tr_fsdp_new(tr_ctx *ctx, tr_module *model, tr_comm *comm, tr_comm *prefetch_comm,
                     const tr_fsdp_config *cfg) {
  tr_device device;
  tr_allocator *alloc;
  if (check_config(ctx, cfg, model) || check_comms(ctx, cfg, comm, prefetch_comm) ||
      fsdp_placement(ctx, model, cfg, comm, prefetch_comm, &device, &alloc))
    return NULL;
  tr_fsdp *f = calloc(1, sizeof *f);
  if (!f) {
    nas_errf(&ctx->err, "fsdp: out of memory");
    return NULL;
  }
  *f = (tr_fsdp){.cfg = *cfg, .comm = comm, .rank = tr_comm_rank(comm),
                 .world = tr_comm_world(comm), .dtype = TR_F32, .device = device,
                 .alloc = tn_allocator_retain(alloc)};
  size_t n;
  tr_module *const *children = model_children(&model, &n);
  int rc = plan_units(ctx, f, children, n);
  if (rc == NAS_OK) rc = model_dtype(ctx, model, &f->dtype);
  /* every check before the first parameter moves */
  for (int i = 0; rc == NAS_OK && i < f->n_units; i++) rc = collect_params(ctx, f, &f->units[i]);
  for (int i = 0; rc == NAS_OK && i < f->n_units; i++) rc = shard_unit(ctx, f, &f->units[i]);
  if (rc == NAS_OK) rc = broadcast_buffers(ctx, f, model);
  if (rc == NAS_OK && cfg->prefetch && fsdp_is_sharded(f)) {
    f->prefetcher = fsdp_prefetcher_new(prefetch_comm, f->dtype, (size_t)f->n_units, &ctx->err);
    if (!f->prefetcher) rc = NAS_ERR;
  }
  if (rc == NAS_OK) return f;
  tr_fsdp_free(f);
  return NULL;
}

void tr_fsdp_free(tr_fsdp *f) {
  if (!f) return;
  fsdp_prefetcher_free(f->prefetcher);
  for (int i = 0; i < f->n_units; i++) {
    fsdp_unit *u = &f->units[i];
    for (size_t p = 0; p < u->n_params; p++) tr_release(u->params[p]);
    free(u->params);
    free(u->children);
    tr_release(u->full);
    tr_release(u->flat);
  }
  free(f->units);
  tr_allocator_release(f->alloc);
  free(f);
}

int tr_fsdp_unit_count(const tr_fsdp *f) { return f->n_units; }

int tr_fsdp_batch_slice(const tr_fsdp *f, int64_t global, int64_t *start, int64_t *count,
                        nas_err *err) {
  if (global <= 0 || global % f->world != 0)
    return nas_errf(err, "fsdp: a global batch of %lld examples does not split evenly over %d "
                    "ranks (it must be a positive multiple of the world size)",
                    (long long)global, f->world);
  *count = global / f->world;
  *start = *count * f->rank;
  return NAS_OK;
}
