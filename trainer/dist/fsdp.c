/* fsdp: the runtime of fully sharded data parallel training over trainer.h's collectives
 * — gathering and freeing each unit's full parameters, the autograd node that gathers,
 * recomputes, reduce-scatters and frees around a unit's backward, forward and backward,
 * the sharded optimiser and clipping, the full model on demand (docs/engine-fsdp.md; how
 * units are made is fsdp_units.c).
 *
 * A unit's forward runs on a detached copy of its input (a leaf), so its ops build an
 * inner graph of their own; from the outside the unit is one node, FsdpUnitBackward, with
 * two edges: to the input's node and to the AccumulateGrad of the unit's flat shard. Its
 * backward gathers the full parameters, runs the inner graph backward (tr_backward) into a
 * zeroed full gradient buffer that the parameters' .grad tensors view, reduce-scatters it
 * (all-reduces in mode none) and hands the result to the shard's AccumulateGrad, so
 * gradients accumulate across backwards as for any leaf.
 *
 * Invariants:
 * - A unit's parameter tensors are views of full's storage for the tr_fsdp's whole life;
 *   sharding frees and re-allocates only the storage's data, so tensors saved by the inner
 *   graph see the re-gathered values.
 * - full's version moves only when a gather brings different values: when flat's version
 *   (bumped by optimiser steps) differs from the one last gathered. Re-gathering for
 *   backward the values a forward saw leaves saved tensors valid; a step between forward
 *   and backward makes them fail the version check instead of giving a wrong gradient.
 * - Whether a unit is gathered, prefetched or freed depends only on the sequence of calls,
 *   which every rank makes alike, so every rank issues the same collectives in the same
 *   order on each group. The main group carries gathers that were not prefetched,
 *   reduce-scatters, all-reduces and broadcasts; the prefetch group only prefetches.
 * - Padding is zero in full parameters and gradients, so it stays zero under SGD, Adam
 *   and AdamW and adds nothing to norms.
 * - Checkpointing saves the ctx generator before a unit's forward and replays it for the
 *   recompute, then puts back the current state: the masks match and the stream after the
 *   step is the one without checkpointing. The recompute puts batch norm's running
 *   statistics back as the forward left them, so they move once per step, as without.
 * - Every buffer is on the model's device (fsdp_device.c): full's data comes from and goes
 *   back to its storage's allocator, which for a device model is the engine's device
 *   allocator; the collectives there are NCCL's, which wait for the device first. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/dist/fsdp_internal.h"
#include "trainer/dist/pipeline_internal.h"

/* ---------------------------------------------------------------- full buffers */

static tr_storage *full_storage(const fsdp_unit *u) { return u->full->storage; }

static int full_alloc(tr_ctx *ctx, fsdp_unit *u) {
  tr_storage *s = full_storage(u);
  if (s->data) return NAS_OK;
  s->data = tn_alloc(s->alloc, s->alloc_size);
  return s->data ? NAS_OK
                 : nas_errf(&ctx->err, "fsdp unit %d: out of memory for %zu bytes of parameters",
                            u->index, s->alloc_size);
}

/* After a gather: a version bump when the values differ from the last gather's. */
static void mark_gathered(fsdp_unit *u) {
  uint64_t shard_version = u->flat->storage->version;
  if (u->gathered_version == shard_version) return;
  full_storage(u)->version++;
  u->gathered_version = shard_version;
}

static bool is_pending(const tr_fsdp *f, const fsdp_unit *u) {
  return f->prefetcher && fsdp_prefetcher_pending(f->prefetcher, u);
}

/* Whether full holds the current parameters (and no gather into it is in flight). */
static bool is_current(const tr_fsdp *f, const fsdp_unit *u) {
  return !is_pending(f, u) && full_storage(u)->data &&
         u->gathered_version == u->flat->storage->version;
}

/* Makes u's full parameters current: from its prefetch, or gathered now. */
static int unit_gather(tr_ctx *ctx, tr_fsdp *f, fsdp_unit *u) {
  if (!fsdp_is_sharded(f)) return NAS_OK;
  if (is_pending(f, u)) {
    if (fsdp_prefetcher_wait(f->prefetcher, u, &ctx->err)) return NAS_ERR;
  } else if (is_current(f, u)) {
    return NAS_OK;
  } else if (full_alloc(ctx, u) ||
             tr_comm_all_gather(f->comm, f->dtype, tr_data(u->flat), full_storage(u)->data,
                                u->shard_numel, &ctx->err)) {
    return nas_err_prefix(&ctx->err, "fsdp unit %d", u->index);
  }
  mark_gathered(u);
  return NAS_OK;
}

/* Starts gathering unit `index` on the helper thread, when there is one and it needs it. */
static int unit_prefetch(tr_ctx *ctx, tr_fsdp *f, int index) {
  if (!f->prefetcher || !fsdp_is_sharded(f) || index < 0 || index >= f->n_units) return NAS_OK;
  fsdp_unit *u = &f->units[index];
  if (is_pending(f, u) || is_current(f, u)) return NAS_OK;
  if (full_alloc(ctx, u)) return NAS_ERR;
  fsdp_prefetcher_post(f->prefetcher, u);
  return NAS_OK;
}

void fsdp_unit_reshard(tr_fsdp *f, fsdp_unit *u) {
  tr_storage *s = full_storage(u);
  if (!fsdp_is_sharded(f) || !s->data || is_pending(f, u)) return;
  tn_dealloc(s->alloc, s->data, s->alloc_size);
  s->data = NULL;
}

/* Waits for every prefetch still in flight; returns the first failure. */
static int drain_prefetches(tr_ctx *ctx, tr_fsdp *f) {
  int rc = NAS_OK;
  for (int i = 0; i < f->n_units; i++) {
    fsdp_unit *u = &f->units[i];
    if (!is_pending(f, u)) continue;
    nas_err err = {{0}};
    if (fsdp_prefetcher_wait(f->prefetcher, u, &err) == NAS_OK)
      mark_gathered(u);
    else if (rc == NAS_OK)
      rc = nas_errf(&ctx->err, "%s", err.msg);
  }
  return rc;
}

/* ---------------------------------------------------------------- full gradients */

static void grads_detach(fsdp_unit *u) {
  for (size_t i = 0; i < u->n_params; i++) {
    tr_release(u->params[i]->grad);
    u->params[i]->grad = NULL;
  }
}

/* A zeroed full gradient buffer (padded), with every parameter's .grad a view of it at
 * the parameter's offset, so the inner backward accumulates straight into it. */
static tr_tensor *grads_attach(tr_ctx *ctx, const tr_fsdp *f, fsdp_unit *u) {
  tr_tensor *grad_full = fsdp_buffer_new(ctx, f, u->padded, true);
  for (size_t i = 0; grad_full && i < u->n_params; i++) {
    tr_tensor *p = u->params[i];
    tr_release(p->grad);
    p->grad = tn_view(ctx, grad_full, p->ndim, p->shape);
    if (!p->grad) {
      grads_detach(u);
      tr_release(grad_full);
      return NULL;
    }
    p->grad->offset = p->offset;
  }
  return grad_full;
}

/* The averaged gradient of flat into *grad_flat (owned): this rank's chunk of grad_full
 * (reduce-scatter), or grad_full itself all-reduced in place (mode none; taken). */
static int reduce_grads(tr_ctx *ctx, tr_fsdp *f, fsdp_unit *u, tr_tensor **grad_full,
                        tr_tensor **grad_flat) {
  void *full = tr_data(*grad_full);
  if (!fsdp_is_sharded(f)) {
    if (tr_comm_all_reduce(f->comm, f->dtype, full, full, u->numel, TR_REDUCE_AVG, &ctx->err))
      return nas_err_prefix(&ctx->err, "fsdp unit %d", u->index);
    *grad_flat = *grad_full;
    *grad_full = NULL;
    return NAS_OK;
  }
  tr_tensor *shard = fsdp_buffer_new(ctx, f, u->shard_numel, false);
  if (!shard) return NAS_ERR;
  if (tr_comm_reduce_scatter(f->comm, f->dtype, full, tr_data(shard), u->shard_numel,
                             TR_REDUCE_AVG, &ctx->err)) {
    tr_release(shard);
    return nas_err_prefix(&ctx->err, "fsdp unit %d", u->index);
  }
  *grad_flat = shard;
  return NAS_OK;
}

/* ---------------------------------------------------------------- the unit's node */

/* The unit's node. input and inner are kept as they are (not as detached aliases, so not
 * as tr_saved) because the backward needs the input leaf's .grad and the inner output's
 * graph. Neither points at the outer graph (the input was detached), so no cycle. The
 * release after backward frees both, and with them the inner graph. */
typedef struct {
  tr_node base;
  tr_fsdp *f;             /* borrowed: graphs go before the tr_fsdp */
  fsdp_unit *unit;        /* borrowed from f */
  uint64_t rng[4];        /* ctx's generator before the unit's forward (checkpoint replays it) */
  tr_tensor *input;       /* owned: the detached input leaf */
  uint64_t input_version; /* its storage's version then */
  tr_tensor *inner;       /* owned: the inner graph's output; NULL when checkpointing */
} unit_node;

static void unit_release(tr_node *node) {
  unit_node *n = (unit_node *)node;
  tr_release(n->input);
  tr_release(n->inner);
  n->input = n->inner = NULL;
}

/* Runs the unit's children on x (borrowed). */
static tr_tensor *unit_run(tr_ctx *ctx, const fsdp_unit *u, tr_tensor *x) {
  tr_tensor *cur = tr_retain(x);
  for (size_t i = 0; i < u->n_children && cur; i++) {
    tr_tensor *next = tr_module_forward(ctx, u->children[i], cur);
    tr_release(cur);
    cur = next;
  }
  return cur;
}

/* The parameters and buffers of the unit's children (owned list). */
static int unit_state(tr_ctx *ctx, const fsdp_unit *u, tr_param_list *state) {
  for (size_t i = 0; i < u->n_children; i++)
    if (tr_module_parameters(u->children[i], true, state, &ctx->err) != NAS_OK) return NAS_ERR;
  return NAS_OK;
}

/* Checkpointing: the unit's forward again, with grad and the generator it had then; the
 * inner graph's output (owned). Batch norm in training mode moves its running statistics
 * in every forward; the forward already moved them, so the recompute puts them back (the
 * pipeline's recompute does the same with the same helpers). */
static tr_tensor *unit_recompute(tr_ctx *ctx, const unit_node *rec) {
  const tr_tensor *in = rec->input;
  if (in->storage->version != rec->input_version)
    return tr_fail(ctx,
                   "FsdpUnitBackward: the input of unit %d was modified by an in-place "
                   "operation after the forward (version %llu now, %llu then)",
                   rec->unit->index, (unsigned long long)in->storage->version,
                   (unsigned long long)rec->input_version);
  tr_param_list state = {0};
  if (unit_state(ctx, rec->unit, &state) != NAS_OK) {
    tr_param_list_free(&state);
    return NULL;
  }
  tr_tensor **saved = calloc(state.n ? state.n : 1, sizeof *saved);
  uint64_t now[4];
  memcpy(now, ctx->rng, sizeof now);
  memcpy(ctx->rng, rec->rng, sizeof now);
  bool prev = tr_set_grad_enabled(ctx, true);
  tr_tensor *y = NULL;
  if (!saved)
    tr_fail(ctx, "FsdpUnitBackward: out of memory");
  else if (pipe_buffers_save(ctx, &state, saved) == NAS_OK)
    y = unit_run(ctx, rec->unit, rec->input);
  tr_set_grad_enabled(ctx, prev);
  memcpy(ctx->rng, now, sizeof now);
  if (saved && pipe_buffers_restore(ctx, &state, saved) != NAS_OK) {
    tr_release(y);
    y = NULL;
  }
  free(saved);
  tr_param_list_free(&state);
  return y;
}

static int inner_backward(tr_ctx *ctx, const unit_node *rec, tr_tensor *g) {
  if (!rec->f->cfg.checkpoint) return tr_backward(ctx, rec->inner, g, false);
  tr_tensor *y = unit_recompute(ctx, rec);
  int rc = y ? tr_backward(ctx, y, g, false) : NAS_ERR;
  tr_release(y);
  return rc;
}

static int unit_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **grad_in) {
  if (ag_live(ctx, node)) return NAS_ERR;
  const unit_node *rec = (const unit_node *)node;
  tr_fsdp *f = rec->f;
  fsdp_unit *u = rec->unit;
  /* backward visits units in reverse: the one before this is next */
  if (unit_gather(ctx, f, u) || unit_prefetch(ctx, f, u->index - 1)) return NAS_ERR;
  tr_tensor *grad_full = grads_attach(ctx, f, u);
  int rc = grad_full ? inner_backward(ctx, rec, g) : NAS_ERR;
  grads_detach(u);
  if (rc == NAS_OK) rc = reduce_grads(ctx, f, u, &grad_full, &grad_in[1]);
  tr_release(grad_full);
  fsdp_unit_reshard(f, u);
  tr_tensor *input = rec->input;
  if (rc == NAS_OK && ag_wants(node, 0)) {
    grad_in[0] = input->grad; /* ownership moves to the engine */
    input->grad = NULL;
  }
  return rc;
}

static const tr_node_ops unit_ops = {"FsdpUnitBackward", unit_backward, sizeof(unit_node),
                                     unit_release};

/* The unit's forward with grad: inner graph (or, checkpointing, none) and the outer node. */
static tr_tensor *unit_forward_recorded(tr_ctx *ctx, tr_fsdp *f, fsdp_unit *u, tr_tensor *x) {
  tr_tensor *input = tr_detach(ctx, x);
  if (!input) return NULL;
  input->requires_grad = x->requires_grad;
  uint64_t rng[4];
  memcpy(rng, ctx->rng, sizeof rng);
  tr_tensor *inner = NULL, *out;
  if (f->cfg.checkpoint) {
    bool prev = tr_set_grad_enabled(ctx, false);
    out = unit_run(ctx, u, input);
    tr_set_grad_enabled(ctx, prev);
  } else {
    inner = unit_run(ctx, u, input);
    out = inner ? tn_alias(ctx, inner) : NULL;
  }
  /* flat requires grad and grad mode is on: ag_record always makes the node */
  int rc = out ? NAS_OK : NAS_ERR;
  unit_node *node = ag_record(ctx, &unit_ops, 2, (tr_tensor *[]){x, u->flat}, out, &rc);
  assert(node || rc != NAS_OK);
  if (node) {
    node->f = f;
    node->unit = u;
    memcpy(node->rng, rng, sizeof rng);
    node->input = input;
    node->input_version = input->storage->version;
    node->inner = inner;
    return out;
  }
  tr_release(input);
  tr_release(inner);
  tr_release(out);
  return NULL;
}

static tr_tensor *unit_forward(tr_ctx *ctx, tr_fsdp *f, fsdp_unit *u, tr_tensor *x) {
  if (unit_gather(ctx, f, u) || unit_prefetch(ctx, f, u->index + 1)) return NULL;
  tr_tensor *y = ctx->grad_enabled ? unit_forward_recorded(ctx, f, u, x) : unit_run(ctx, u, x);
  /* grad_op keeps the parameters for the backward; without grad none is coming */
  if (f->cfg.mode == TR_SHARD_FULL || !ctx->grad_enabled) fsdp_unit_reshard(f, u);
  return y;
}

tr_tensor *tr_fsdp_forward(tr_ctx *ctx, tr_fsdp *f, tr_tensor *x) {
  if (!x) return tr_fail(ctx, "fsdp forward: no input");
  tr_tensor *cur = tr_retain(x);
  for (int i = 0; i < f->n_units && cur; i++) {
    tr_tensor *next = unit_forward(ctx, f, &f->units[i], cur);
    tr_release(cur);
    cur = next;
  }
  return cur;
}

int tr_fsdp_backward(tr_ctx *ctx, tr_fsdp *f, tr_tensor *loss) {
  int rc = tr_backward(ctx, loss, NULL, false);
  nas_err first = ctx->err;
  int drained = drain_prefetches(ctx, f);
  if (rc) ctx->err = first;
  return rc ? rc : drained;
}

/* ---------------------------------------------------------------- optimiser, clipping */

tr_optim *tr_fsdp_optim_new(tr_ctx *ctx, tr_fsdp *f, const tr_optim_config *cfg) {
  tr_tensor **flats = calloc((size_t)f->n_units, sizeof *flats);
  if (!flats) {
    nas_errf(&ctx->err, "fsdp: out of memory");
    return NULL;
  }
  for (int i = 0; i < f->n_units; i++) flats[i] = f->units[i].flat;
  tr_optim *opt = tr_optim_new(ctx, cfg, flats, (size_t)f->n_units);
  free(flats);
  return opt;
}

int tr_fsdp_clip_grad_norm(tr_ctx *ctx, tr_fsdp *f, double max_norm, double *norm_out) {
  if (!(max_norm > 0))
    return nas_errf(&ctx->err, "fsdp clip: max_norm must be positive, got %g", max_norm);
  double sq = 0;
  for (int i = 0; i < f->n_units; i++)
    if (f->units[i].flat->grad) sq += tn_sumsq(f->units[i].flat->grad);
  /* shards are disjoint (padding is zero): their squares add up to the model's */
  if (fsdp_is_sharded(f) && tr_fsdp_all_reduce_host(ctx, f, &sq, 1, TR_REDUCE_SUM))
    return nas_err_prefix(&ctx->err, "fsdp clip");
  double norm = sqrt(sq);
  if (norm_out) *norm_out = norm;
  if (norm <= max_norm) return NAS_OK;
  double scale = max_norm / (norm + 1e-6); /* tr_clip_grad_norm's (torch's) epsilon */
  for (int i = 0; i < f->n_units; i++) {
    tr_tensor *g = f->units[i].flat->grad;
    if (!g) continue;
    tn_scale_contig(g, scale);
    g->storage->version++;
  }
  return NAS_OK;
}

/* ---------------------------------------------------------------- full model, memory */

int tr_fsdp_summon_full(tr_ctx *ctx, tr_fsdp *f) {
  for (int i = 0; i < f->n_units; i++)
    if (unit_gather(ctx, f, &f->units[i])) return NAS_ERR;
  return NAS_OK;
}

int tr_fsdp_release_full(tr_ctx *ctx, tr_fsdp *f) {
  int rc = drain_prefetches(ctx, f);
  for (int i = 0; i < f->n_units; i++) fsdp_unit_reshard(f, &f->units[i]);
  return rc;
}

void tr_fsdp_memory_stats(const tr_fsdp *f, tr_fsdp_memory *out) {
  *out = (tr_fsdp_memory){.units = f->n_units, .params = f->params};
  for (int i = 0; i < f->n_units; i++) out->local += f->units[i].shard_numel;
  tr_allocator_stats(f->alloc, &out->alloc);
}
