/* ops_norm: layer norm and batch norm (training and evaluation), forward beside backward.
 *
 * Each keeps its per-group mean and 1/std (aux, doubles) for backward, and saves x and w.
 * Batch norm in training normalises with the batch's statistics and moves the running ones
 * (torch's convention: running = (1 - momentum) running + momentum batch, the variance
 * unbiased); in evaluation it uses the running statistics, which are constants to backward.
 * The checks here serve both devices; on a device the statistics are a saved float64 tensor
 * instead of aux, so the ops hand their checked inputs to tc_layer_norm / tc_batch_norm
 * (trainer/cuda/cuda_nn.c). */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/core/internal.h"

#define KERN_FILE "trainer/ops/kern_norm.h"
#include "trainer/core/kern_both.h"

/* The gradient buffers of w and b a norm backward fills (zeroed), NULL where not wanted. */
static int param_grads(tr_ctx *ctx, tr_node *node, tr_tensor **gi) {
  for (int i = 1; i < 3; i++) {
    if (!ag_wants(node, i)) continue;
    gi[i] = tn_zeros_meta(ctx, node->saved[0].t->dtype, &node->in_meta[i]);
    if (!gi[i]) return NAS_ERR;
  }
  return NAS_OK;
}

static void *data_or_null(const tr_tensor *t) { return t ? tr_data(t) : NULL; }

/* ---------------------------------------------------------------- layer norm */

/* saved: x (contiguous), w (when given); aux: stats; ia[0] = has w. */
static int layer_norm_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *x = ag_saved(ctx, node, 0), *w = NULL;
  if (!x || (node->ia[0] && !(w = ag_saved(ctx, node, 1)))) return NAS_ERR;
  const double *stats = ag_aux(ctx, node);
  if (!stats) return NAS_ERR;
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NAS_ERR;
  int rc = param_grads(ctx, node, gi);
  if (rc == NAS_OK && ag_wants(node, 0) && !(gi[0] = tn_empty_like(ctx, x))) rc = NAS_ERR;
  if (rc == NAS_OK) {
    int64_t d = x->shape[x->ndim - 1];
    TR_DISPATCH(x->dtype, layer_norm_bwd, tr_data(x), data_or_null(w), tr_data(gc), stats,
                data_or_null(gi[0]), data_or_null(gi[1]), data_or_null(gi[2]), x->numel / d, d);
  }
  tr_free(gc);
  return rc;
}
static const tr_node_ops layer_norm_ops = {"LayerNormBackward", layer_norm_backward};

tr_tensor *tr_layer_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, double eps) {
  tr_tensor *in[3] = {x, w, b};
  if (tn_check_inputs(ctx, "layer_norm", 3, in)) return NULL;
  int64_t d = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (d < 1 || (w && w->numel != d) || (b && b->numel != d))
    return tr_fail(ctx, "layer_norm: last dim %lld, weight and bias must match it", (long long)d);
  if (tn_on_cuda(x)) return tc_layer_norm(ctx, x, w, b, eps);
  int64_t rows = x->numel / d;
  tr_tensor *xc = tn_contig(ctx, x), *wc = w ? tn_contig(ctx, w) : NULL,
            *bc = b ? tn_contig(ctx, b) : NULL;
  tr_tensor *y = xc ? tn_empty_like(ctx, xc) : NULL;
  double *stats = malloc(sizeof(double) * 2 * (size_t)rows);
  int rc = y && stats && (!w || wc) && (!b || bc)
               ? NAS_OK
               : nas_errf(&ctx->err, "layer_norm: out of memory");
  if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, layer_norm_fwd, tr_data(xc), data_or_null(wc), data_or_null(bc),
                tr_data(y), stats, rows, d, eps);
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &layer_norm_ops, 3, in, y, &node);
  if (node) {
    node->aux = stats;
    stats = NULL;
    node->ia[0] = w != NULL;
    rc = ag_save(ctx, node, xc) || (w && ag_save(ctx, node, wc));
  }
  free(stats);
  tr_free(xc);
  tr_free(wc);
  tr_free(bc);
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
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
  tr_tensor *x = ag_saved(ctx, node, 0), *w = NULL;
  if (!x || (node->ia[1] && !(w = ag_saved(ctx, node, 1)))) return NAS_ERR;
  const double *stats = ag_aux(ctx, node);
  if (!stats) return NAS_ERR;
  int64_t n, c, l;
  tn_bn_dims(ctx, x, &n, &c, &l);
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NAS_ERR;
  int rc = param_grads(ctx, node, gi);
  if (rc == NAS_OK && ag_wants(node, 0) && !(gi[0] = tn_empty_like(ctx, x))) rc = NAS_ERR;
  if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, batch_norm_bwd, tr_data(x), data_or_null(w), tr_data(gc), stats,
                node->ia[0] != 0, data_or_null(gi[0]), data_or_null(gi[1]), data_or_null(gi[2]), n,
                c, l);
  tr_free(gc);
  return rc;
}
static const tr_node_ops batch_norm_ops = {"BatchNormBackward", batch_norm_backward};

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

/* Fills stats (2C) from the batch (training, moving the running statistics) or from the
 * running statistics (evaluation). */
static int bn_stats(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *rmean, tr_tensor *rvar,
                    bool training, double momentum, double eps, double *stats) {
  int64_t n, c, l;
  tn_bn_dims(ctx, xc, &n, &c, &l);
  if (!training) {
    if (!rmean || !rvar)
      return nas_errf(&ctx->err, "batch_norm: evaluation needs running statistics");
    for (int64_t ch = 0; ch < c; ch++) {
      stats[2 * ch] = tr_get(rmean, ch);
      stats[2 * ch + 1] = 1.0 / sqrt(tr_get(rvar, ch) + eps);
    }
    return NAS_OK;
  }
  if (n * l < 2)
    return nas_errf(&ctx->err, "batch_norm: training needs more than one value per channel");
  double *var = malloc(sizeof(double) * (size_t)c);
  if (!var) return nas_errf(&ctx->err, "batch_norm: out of memory");
  TR_DISPATCH(xc->dtype, batch_norm_stats, tr_data(xc), stats, var, n, c, l, eps);
  if (rmean) running_update(rmean, stats, 2, 1.0, momentum);
  if (rvar) running_update(rvar, var, 1, (double)(n * l) / (double)(n * l - 1), momentum);
  free(var);
  return NAS_OK;
}

tr_tensor *tr_batch_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b,
                         tr_tensor *running_mean, tr_tensor *running_var, bool training,
                         double momentum, double eps) {
  tr_tensor *in[5] = {x, w, b, running_mean, running_var}; /* the node's inputs: the first 3 */
  bool on_cuda = tn_any_on_cuda(5, in);
  int64_t n, c, l;
  /* on a device the running statistics must be there too */
  if (tn_check_inputs(ctx, "batch_norm", on_cuda ? 5 : 3, in) || tn_bn_dims(ctx, x, &n, &c, &l))
    return NULL;
  if ((w && w->numel != c) || (b && b->numel != c) || (running_mean && running_mean->numel != c) ||
      (running_var && running_var->numel != c))
    return tr_fail(ctx, "batch_norm: %lld channels; weight, bias and statistics must match",
                   (long long)c);
  if (on_cuda)
    return tc_batch_norm(ctx, x, w, b, running_mean, running_var, training, momentum, eps);
  tr_tensor *xc = tn_contig(ctx, x), *wc = w ? tn_contig(ctx, w) : NULL,
            *bc = b ? tn_contig(ctx, b) : NULL;
  tr_tensor *y = xc ? tn_empty_like(ctx, xc) : NULL;
  double *stats = malloc(sizeof(double) * 2 * (size_t)c);
  int rc = y && stats && (!w || wc) && (!b || bc)
               ? NAS_OK
               : nas_errf(&ctx->err, "batch_norm: out of memory");
  if (rc == NAS_OK)
    rc = bn_stats(ctx, xc, running_mean, running_var, training, momentum, eps, stats);
  if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, batch_norm_apply, tr_data(xc), data_or_null(wc), data_or_null(bc), stats,
                tr_data(y), n, c, l);
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &batch_norm_ops, 3, in, y, &node);
  if (node) {
    node->aux = stats;
    stats = NULL;
    node->ia[0] = training;
    node->ia[1] = w != NULL;
    rc = ag_save(ctx, node, xc) || (w && ag_save(ctx, node, wc));
  }
  free(stats);
  tr_free(xc);
  tr_free(wc);
  tr_free(bc);
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
}
