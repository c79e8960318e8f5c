/* ops_reduce: sum and mean over any set of axes, softmax and log-softmax along a dim, each
 * forward beside its backward.
 *
 * A multi-axis reduction runs one axis at a time (highest first), each as an (outer, n,
 * inner) kernel on a contiguous input. Backward expands the gradient back through stride-0
 * views: the reduced dims repeat the same gradient value.
 * Every function here serves both devices: on CUDA inputs only the kernel calls go to the
 * tc_* kernel functions (trainer/cuda/cuda_ops.c). */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/ops/dispatch.h"

#define KERN_FILE "trainer/ops/kern_reduce.h"
#include "trainer/core/kern_both.h"

/* ---------------------------------------------------------------- sum and mean */

/* g (the shape of the input with reduced dims kept as 1, or dropped) repeated over the
 * reduced dims of in, times scale. */
static tr_tensor *expand_grad(tr_ctx *ctx, tr_tensor *g, const tr_meta *in, uint32_t reduced,
                              double scale) {
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NULL;
  tr_tensor *view = tn_alias(ctx, gc);
  tr_tensor *out = view ? tn_empty_dev(ctx, gc, g->dtype, in) : NULL;
  if (out) {
    view->ndim = in->ndim;
    memcpy(view->shape, in->shape, sizeof view->shape);
    int64_t stride = 1;
    for (int d = in->ndim - 1; d >= 0; d--) {
      bool r = reduced & (1u << d);
      view->strides[d] = r ? 0 : stride;
      stride *= r ? 1 : in->shape[d];
    }
    view->numel = out->numel;
    if (!tn_on_cuda(out)) {
      tn_copy_to_contig(view, tr_data(out));
    } else if (tc_copy_raw(ctx, out, view)) {
      tr_release(out);
      out = NULL;
    }
    if (out && scale != 1.0) tn_scale_contig(out, scale);
  }
  tr_release(view);
  tr_release(gc);
  return out;
}

/* Sum and mean: the reduced dims and the factor (1, or 1 / the count for the mean). */
typedef struct {
  tr_node base;
  uint32_t mask; /* bit d: dim d was reduced */
  double scale;
} sum_node;

static int sum_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  sum_node *n = (sum_node *)node;
  gi[0] = expand_grad(ctx, g, &node->in_meta[0], n->mask, n->scale);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops sum_ops = {"SumBackward", sum_backward, sizeof(sum_node), NULL};
static const tr_node_ops mean_ops = {"MeanBackward", sum_backward, sizeof(sum_node), NULL};

/* Bitmask of the dims named by axes (all when naxes is 0). */
static int reduced_mask(tr_ctx *ctx, const tr_tensor *a, int naxes, const int *axes,
                        uint32_t *mask) {
  *mask = naxes ? 0 : (1u << a->ndim) - 1;
  if (naxes < 0) return nas_errf(&ctx->err, "sum: %d axes", naxes);
  for (int i = 0; i < naxes; i++) {
    int d = tn_dim(a->ndim, axes[i]);
    if (d < 0)
      return nas_errf(&ctx->err, "sum: axis %d out of range for %d dims", axes[i], a->ndim);
    if (*mask & (1u << d)) return nas_errf(&ctx->err, "sum: axis %d is named twice", axes[i]);
    *mask |= 1u << d;
  }
  return NAS_OK;
}

tr_tensor *tn_sum_dims(tr_ctx *ctx, const tr_tensor *a, uint32_t mask, double scale) {
  tr_tensor *cur = tn_contig(ctx, a);
  for (int d = a->ndim - 1; d >= 0 && cur; d--) {
    if (!(mask & (1u << d))) continue;
    int64_t outer, n, inner;
    tn_split_at(cur, d, &outer, &n, &inner);
    tr_meta m = tn_meta(cur);
    m.shape[d] = 1;
    tr_tensor *next = tn_empty_dev(ctx, cur, a->dtype, &m);
    if (next && !tn_on_cuda(next)) {
      TR_DISPATCH(a->dtype, sum_axis, tr_data(cur), tr_data(next), outer, n, inner, scale);
    } else if (next && tc_sum_axis(ctx, cur, next, outer, n, inner, scale)) {
      tr_release(next);
      next = NULL;
    }
    scale = 1.0; /* applied once */
    tr_release(cur);
    cur = next;
  }
  if (cur && scale != 1.0) tn_scale_contig(cur, scale);
  return cur;
}

static tr_tensor *reduce_op(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim,
                            bool mean) {
  uint32_t mask;
  if (tn_check_inputs(ctx, mean ? "mean" : "sum", 1, &a) ||
      reduced_mask(ctx, a, naxes, axes, &mask))
    return NULL;
  int64_t count = 1;
  for (int d = 0; d < a->ndim; d++)
    if (mask & (1u << d)) count *= a->shape[d];
  double scale = mean ? 1.0 / (double)(count ? count : 1) : 1.0;
  tr_tensor *out = tn_sum_dims(ctx, a, mask, scale);
  if (!out) return NULL;
  if (!keepdim) { /* drop the size-1 dims: same data, fewer dims */
    int nd = 0;
    for (int d = 0; d < a->ndim; d++)
      if (!(mask & (1u << d))) out->shape[nd++] = a->shape[d];
    out->ndim = nd;
    tn_contiguous_strides(nd, out->shape, out->strides);
  }
  int rc = NAS_OK;
  sum_node *node = ag_record(ctx, mean ? &mean_ops : &sum_ops, 1, &a, out, &rc);
  if (node) {
    node->mask = mask;
    node->scale = scale;
  }
  return ag_output(out, rc);
}

tr_tensor *tr_sum(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim) {
  return reduce_op(ctx, a, naxes, axes, keepdim, false);
}

tr_tensor *tr_mean(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim) {
  return reduce_op(ctx, a, naxes, axes, keepdim, true);
}

/* ---------------------------------------------------------------- softmax */

typedef struct {
  tr_node base;
  int dim;
  bool log_out; /* log-softmax */
  tr_saved y;   /* the output */
} softmax_node;

static int softmax_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  softmax_node *sn = (softmax_node *)node;
  tr_tensor *y = ag_saved(ctx, node, &sn->y);
  if (!y) return NAS_ERR;
  int64_t outer, n, inner;
  tn_split_at(y, sn->dim, &outer, &n, &inner);
  tr_tensor *gc = tn_contig(ctx, g);
  tr_tensor *dx = gc ? tn_empty_like_dev(ctx, y) : NULL;
  if (dx && !tn_on_cuda(dx)) {
    TR_DISPATCH(y->dtype, softmax_bwd, tr_data(y), tr_data(gc), tr_data(dx), outer, n, inner,
                sn->log_out);
  } else if (dx && tc_softmax_bwd(ctx, node->ops->name, y, gc, dx, outer, n, inner,
                                  sn->log_out)) {
    tr_release(dx);
    dx = NULL;
  }
  tr_release(gc);
  gi[0] = dx;
  return dx ? NAS_OK : NAS_ERR;
}
static const tr_node_ops softmax_ops = {"SoftmaxBackward", softmax_backward,
                                        sizeof(softmax_node), NULL};
static const tr_node_ops log_softmax_ops = {"LogSoftmaxBackward", softmax_backward,
                                            sizeof(softmax_node), NULL};

static tr_tensor *softmax_op(tr_ctx *ctx, tr_tensor *a, int dim, bool log_out) {
  if (tn_check_inputs(ctx, "softmax", 1, &a)) return NULL;
  int d = tn_dim(a->ndim, dim);
  if (d < 0) return tr_fail(ctx, "softmax: dim %d out of range for %d dims", dim, a->ndim);
  if (a->shape[d] == 0)
    return tr_fail(ctx, "softmax: dim %d is empty (no value to normalise)", dim);
  tr_tensor *x = tn_contig(ctx, a);
  tr_tensor *y = x ? tn_empty_like_dev(ctx, x) : NULL;
  if (!y) {
    tr_release(x);
    return NULL;
  }
  int64_t outer, n, inner;
  tn_split_at(x, d, &outer, &n, &inner);
  int rc = NAS_OK;
  if (!tn_on_cuda(y))
    TR_DISPATCH(a->dtype, softmax_fwd, tr_data(x), tr_data(y), outer, n, inner, log_out);
  else
    rc = tc_softmax_fwd(ctx, x, y, outer, n, inner, log_out);
  tr_release(x);
  softmax_node *node = ag_record(ctx, log_out ? &log_softmax_ops : &softmax_ops, 1, &a, y, &rc);
  if (node) {
    node->dim = d;
    node->log_out = log_out;
    rc = ag_save(ctx, &node->base, &node->y, y);
  }
  return ag_output(y, rc);
}

tr_tensor *tr_softmax(tr_ctx *ctx, tr_tensor *a, int dim) {
  return softmax_op(ctx, a, dim, false);
}
tr_tensor *tr_log_softmax(tr_ctx *ctx, tr_tensor *a, int dim) {
  return softmax_op(ctx, a, dim, true);
}
