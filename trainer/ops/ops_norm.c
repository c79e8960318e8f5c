/* ops_norm: layer norm and batch norm (training and evaluation), forward beside backward.
 *
 * Each keeps its per-group mean and 1/std (stats, a float64 tensor on the input's device)
 * for backward, and saves x and w.
 * Batch norm in training normalises with the batch's statistics and moves the running ones
 * (torch's convention: running = (1 - momentum) running + momentum batch, the variance
 * unbiased); in evaluation it uses the running statistics, which are constants to backward.
 * Checks, nodes and backward serve both devices; only the compute steps split, to the
 * kern_norm.h kernels on the host and to tc_layer_norm_* / tc_batch_norm_* on a device
 * (trainer/cuda/cuda_nn.c). */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/ops/dispatch.h"

#define KERN_FILE "trainer/ops/kern_norm.h"
#include "trainer/core/kern_both.h"

/* The gradient buffers a norm backward fills, NULL where not wanted: those of w and b zeroed
 * (the host kernels add into them; a device's overwrite them), and dx. */
static int norm_grads(tr_ctx *ctx, tr_node *node, const tr_tensor *x, tr_tensor **gi) {
  for (int i = 1; i < 3; i++) {
    if (!ag_wants(node, i)) continue;
    gi[i] = tn_zeros_dev(ctx, x, x->dtype, &node->in_meta[i]);
    if (!gi[i]) return NAS_ERR;
  }
  if (ag_wants(node, 0) && !(gi[0] = tn_empty_like_dev(ctx, x))) return NAS_ERR;
  return NAS_OK;
}

static void *data_or_null(const tr_tensor *t) { return t ? tr_data(t) : NULL; }

/* The statistics of n groups: mean and 1/std of each, float64 on like's device. */
static tr_tensor *stats_new(tr_ctx *ctx, const tr_tensor *like, int64_t n) {
  tr_meta m = {1, {2 * n}};
  return tn_empty_dev(ctx, like, TR_F64, &m);
}

/* The contiguous inputs of a norm and its output; NAS_ERR when one could not be made. */
typedef struct {
  tr_tensor *x, *w, *b, *y, *stats;
} norm_parts;

static int norm_parts_new(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int64_t groups,
                          norm_parts *p) {
  p->x = tn_contig(ctx, x);
  p->w = w ? tn_contig(ctx, w) : NULL;
  p->b = b ? tn_contig(ctx, b) : NULL;
  p->y = p->x ? tn_empty_like_dev(ctx, p->x) : NULL;
  p->stats = p->y ? stats_new(ctx, x, groups) : NULL;
  return p->stats && (!w || p->w) && (!b || p->b) ? NAS_OK : NAS_ERR;
}

/* The node of both norms: x (contiguous), its statistics, and w when the op had one. */
typedef struct {
  tr_node base;
  bool training; /* batch norm: the statistics were the batch's */
  bool has_w;
  tr_saved x, stats, w;
} norm_node;

static int norm_save(tr_ctx *ctx, norm_node *node, const norm_parts *p) {
  int rc = ag_save(ctx, &node->base, &node->x, p->x);
  if (rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->stats, p->stats);
  node->has_w = p->w != NULL;
  if (rc == NAS_OK && p->w) rc = ag_save(ctx, &node->base, &node->w, p->w);
  return rc;
}

/* Records the norm's node for y and returns y, or NULL with everything freed. */
static tr_tensor *norm_finish(tr_ctx *ctx, const tr_node_ops *ops, tr_tensor *const *in,
                              norm_parts *p, bool training, int rc) {
  norm_node *node = ag_record(ctx, ops, 3, in, p->y, &rc);
  if (node) {
    node->training = training;
    rc = norm_save(ctx, node, p);
  }
  tr_release(p->stats);
  tr_release(p->x);
  tr_release(p->w);
  tr_release(p->b);
  return ag_output(p->y, rc);
}

/* The saved x, stats and w (NULL when none) of a norm's node; NAS_ERR when they are gone. */
static int norm_saved(tr_ctx *ctx, tr_node *node, tr_tensor **x, tr_tensor **stats,
                      tr_tensor **w) {
  norm_node *n = (norm_node *)node;
  *w = NULL;
  *x = ag_saved(ctx, node, &n->x);
  *stats = *x ? ag_saved(ctx, node, &n->stats) : NULL;
  if (!*stats || (n->has_w && !(*w = ag_saved(ctx, node, &n->w)))) return NAS_ERR;
  return NAS_OK;
}

/* ---------------------------------------------------------------- layer norm */

static int layer_norm_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *x, *stats, *w;
  if (norm_saved(ctx, node, &x, &stats, &w)) return NAS_ERR;
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NAS_ERR;
  int rc = norm_grads(ctx, node, x, gi);
  int64_t d = x->shape[x->ndim - 1], rows = x->numel / d;
  if (rc == NAS_OK && tn_on_cuda(x))
    rc = tc_layer_norm_bwd(ctx, x, w, gc, stats, gi, rows, d);
  else if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, layer_norm_bwd, tr_data(x), data_or_null(w), tr_data(gc),
                tr_data(stats), data_or_null(gi[0]), data_or_null(gi[1]), data_or_null(gi[2]),
                rows, d);
  tr_release(gc);
  return rc;
}
static const tr_node_ops layer_norm_ops = {"LayerNormBackward", layer_norm_backward,
                                           sizeof(norm_node), NULL};

tr_tensor *tr_layer_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, double eps) {
  tr_tensor *in[3] = {x, w, b};
  if (tn_check_inputs(ctx, "layer_norm", 3, in)) return NULL;
  int64_t d = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (d < 1 || (w && w->numel != d) || (b && b->numel != d))
    return tr_fail(ctx, "layer_norm: last dim %lld, weight and bias must match it", (long long)d);
  if (!(eps >= 0)) return tr_fail(ctx, "layer_norm: eps %g (from 0)", eps); /* NaN too */
  int64_t rows = x->numel / d;
  norm_parts p;
  int rc = norm_parts_new(ctx, x, w, b, rows, &p);
  if (rc == NAS_OK && tn_on_cuda(x))
    rc = tc_layer_norm_fwd(ctx, p.x, p.w, p.b, p.y, p.stats, rows, d, eps);
  else if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, layer_norm_fwd, tr_data(p.x), data_or_null(p.w), data_or_null(p.b),
                tr_data(p.y), tr_data(p.stats), rows, d, eps);
  return norm_finish(ctx, &layer_norm_ops, in, &p, false, rc);
}

/* ---------------------------------------------------------------- batch norm */

/* x as (N, C, L) (internal.h). */
int tn_bn_dims(tr_ctx *ctx, const tr_tensor *x, int64_t *n, int64_t *c, int64_t *l) {
  *n = *c = *l = 0;
  if (x->ndim != 2 && x->ndim != 4)
    return nas_errf(&ctx->err, "batch_norm: input must be (N, C) or (N, C, H, W), has %d dims",
                    x->ndim);
  *n = x->shape[0];
  *c = x->shape[1];
  *l = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1;
  return NAS_OK;
}

static int batch_norm_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *x, *stats, *w;
  if (norm_saved(ctx, node, &x, &stats, &w)) return NAS_ERR;
  int64_t n, c, l;
  tn_bn_dims(ctx, x, &n, &c, &l);
  bool training = ((norm_node *)node)->training;
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NAS_ERR;
  int rc = norm_grads(ctx, node, x, gi);
  if (rc == NAS_OK && tn_on_cuda(x))
    rc = tc_batch_norm_bwd(ctx, x, w, gc, stats, training, gi, n, c, l);
  else if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, batch_norm_bwd, tr_data(x), data_or_null(w), tr_data(gc),
                tr_data(stats), training, data_or_null(gi[0]), data_or_null(gi[1]),
                data_or_null(gi[2]), n, c, l);
  tr_release(gc);
  return rc;
}
static const tr_node_ops batch_norm_ops = {"BatchNormBackward", batch_norm_backward,
                                           sizeof(norm_node), NULL};

/* running = (1 - m) running + m value, written as the buffer's dtype; bumps its version. */
static void running_update(tr_tensor *running, const double *values, int64_t stride, double scale,
                           double momentum) {
  for (int64_t i = 0; i < running->numel; i++) {
    double v = (1 - momentum) * tr_get(running, i) + momentum * scale * values[i * stride];
    if (running->dtype == TR_F32)
      tr_f32(running)[i] = (float)v;
    else
      tr_f64(running)[i] = v;
  }
  running->storage->version++;
}

/* The host's batch_norm_stats step: stats (2C) from the batch, moving the running
 * statistics (training), or from the running statistics (evaluation). */
static int bn_stats_host(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *rmean, tr_tensor *rvar,
                         bool training, double momentum, double eps, double *stats) {
  int64_t n, c, l;
  tn_bn_dims(ctx, xc, &n, &c, &l);
  if (!training) {
    for (int64_t ch = 0; ch < c; ch++) {
      stats[2 * ch] = tr_get(rmean, ch);
      stats[2 * ch + 1] = 1.0 / sqrt(tr_get(rvar, ch) + eps);
    }
    return NAS_OK;
  }
  double *var = malloc(sizeof(double) * (size_t)c);
  if (!var) return nas_errf(&ctx->err, "batch_norm: out of memory");
  TR_DISPATCH(xc->dtype, batch_norm_stats, tr_data(xc), stats, var, n, c, l, eps);
  if (rmean) running_update(rmean, stats, 2, 1.0, momentum);
  if (rvar) running_update(rvar, var, 1, (double)(n * l) / (double)(n * l - 1), momentum);
  free(var);
  return NAS_OK;
}

static int check_batch_norm_args(tr_ctx *ctx, tr_tensor *const *in, bool training, int64_t c,
                                 int64_t values_per_channel) {
  for (int i = 1; i < 5; i++)
    if (in[i] && in[i]->numel != c)
      return nas_errf(&ctx->err,
                      "batch_norm: %lld channels; weight, bias and statistics must match",
                      (long long)c);
  if (!training && (!in[3] || !in[4]))
    return nas_errf(&ctx->err, "batch_norm: evaluation needs running statistics");
  if (training && values_per_channel < 2)
    return nas_errf(&ctx->err, "batch_norm: training needs more than one value per channel");
  return NAS_OK;
}

tr_tensor *tr_batch_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b,
                         tr_tensor *running_mean, tr_tensor *running_var, bool training,
                         double momentum, double eps) {
  tr_tensor *in[5] = {x, w, b, running_mean, running_var}; /* the node's inputs: the first 3 */
  bool on_cuda = tn_any_on_cuda(5, in);
  int64_t n, c, l;
  if (!(eps >= 0) || !(momentum >= 0 && momentum <= 1)) /* NaN too */
    return tr_fail(ctx, "batch_norm: momentum %g, eps %g (momentum in [0, 1], eps from 0)",
                   momentum, eps);
  /* on a device the running statistics must be there too */
  if (tn_check_inputs(ctx, "batch_norm", on_cuda ? 5 : 3, in) || tn_bn_dims(ctx, x, &n, &c, &l) ||
      check_batch_norm_args(ctx, in, training, c, n * l))
    return NULL;
  norm_parts p;
  int rc = norm_parts_new(ctx, x, w, b, c, &p);
  if (rc == NAS_OK && on_cuda)
    rc = tc_batch_norm_stats(ctx, p.x, running_mean, running_var, training, momentum, eps,
                             p.stats);
  else if (rc == NAS_OK)
    rc = bn_stats_host(ctx, p.x, running_mean, running_var, training, momentum, eps,
                       tr_data(p.stats));
  if (rc == NAS_OK && on_cuda)
    rc = tc_batch_norm_apply(ctx, p.x, p.w, p.b, p.stats, p.y, n, c, l);
  else if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, batch_norm_apply, tr_data(p.x), data_or_null(p.w), data_or_null(p.b),
                tr_data(p.stats), tr_data(p.y), n, c, l);
  return norm_finish(ctx, &batch_norm_ops, in, &p, training, rc);
}
