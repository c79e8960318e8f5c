/* ops_mobile: the small ops of mobile and residual blocks, forward beside backward:
 * hard-sigmoid and hard-swish (MobileNetV3's activations), global average pooling, and
 * squeeze-and-excitation's per-channel scaling.
 *
 *   hard-sigmoid(x) = relu6(x + 3) / 6        hard-swish(x) = x * hard-sigmoid(x)
 *   gap: x (N, C, H, W) → (N, C), the mean of each plane; dx = dy / (H*W) everywhere
 *   channel scale: y = x (N, C, H, W) * s (N, C) broadcast over H, W;
 *                  dx = dy * s,  ds[n, c] = sum over the plane of dy * x
 *
 * The CPU runs kern_mobile.h. On a CUDA device global average pooling and channel scaling
 * are the same computation done by ops that run there (a mean over H, W; a broadcasting
 * multiply), so residual networks train there; the hard activations say they are not
 * supported on cuda. */
#include <string.h>

#include "trainer/ops/dispatch.h"

#define KERN_FILE "trainer/ops/kern_mobile.h"
#include "trainer/core/kern_both.h"

/* ---------------------------------------------------------------- hard activations */

typedef struct {
  tr_node base;
  bool swish;
  tr_saved x;
} hard_node;

static int hard_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  hard_node *n = (hard_node *)node;
  tr_tensor *x = ag_saved(ctx, node, &n->x);
  tr_tensor *gc = x ? tn_contig(ctx, g) : NULL;
  gi[0] = gc ? tn_empty_like(ctx, x) : NULL;
  if (gi[0]) TR_DISPATCH(x->dtype, hard_bwd, tr_data(x), tr_data(gc), tr_data(gi[0]), x->numel,
                         n->swish);
  tr_release(gc);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops hardsigmoid_ops = {"HardsigmoidBackward", hard_backward,
                                            sizeof(hard_node), NULL};
static const tr_node_ops hardswish_ops = {"HardswishBackward", hard_backward, sizeof(hard_node),
                                          NULL};

static tr_tensor *hard_op(tr_ctx *ctx, tr_tensor *a, bool swish) {
  const char *name = swish ? "hardswish" : "hardsigmoid";
  if (tn_check_inputs(ctx, name, 1, &a)) return NULL;
  if (tn_on_cuda(a)) return tr_fail(ctx, "%s: not supported on cuda; use relu there", name);
  tr_tensor *x = tn_contig(ctx, a);
  tr_tensor *y = x ? tn_empty_like(ctx, x) : NULL;
  int rc = y ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK) TR_DISPATCH(a->dtype, hard_fwd, tr_data(x), tr_data(y), a->numel, swish);
  hard_node *node = ag_record(ctx, swish ? &hardswish_ops : &hardsigmoid_ops, 1, &a, y, &rc);
  if (node) {
    node->swish = swish;
    rc = ag_save(ctx, &node->base, &node->x, x);
  }
  tr_release(x);
  return ag_output(y, rc);
}

tr_tensor *tr_hardsigmoid(tr_ctx *ctx, tr_tensor *a) { return hard_op(ctx, a, false); }
tr_tensor *tr_hardswish(tr_ctx *ctx, tr_tensor *a) { return hard_op(ctx, a, true); }

/* ---------------------------------------------------------------- global average pool */

/* The node needs only the input's shape (in_meta[0]). */
static int gap_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  const tr_meta *m = &node->in_meta[0];
  tr_tensor *gc = tn_contig(ctx, g);
  gi[0] = gc ? tn_empty_meta(ctx, g->dtype, m) : NULL;
  if (gi[0])
    TR_DISPATCH(g->dtype, plane_means_bwd, tr_data(gc), tr_data(gi[0]), m->shape[0] * m->shape[1],
                m->shape[2] * m->shape[3]);
  tr_release(gc);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops gap_ops = {"GlobalAvgPool2DBackward", gap_backward, 0, NULL};

tr_tensor *tr_global_avg_pool2d(tr_ctx *ctx, tr_tensor *x) {
  if (tn_check_inputs(ctx, "global_avg_pool2d", 1, &x)) return NULL;
  if (x->ndim != 4)
    return tr_fail(ctx, "global_avg_pool2d: input must be (N, C, H, W), has %d dims", x->ndim);
  if (x->shape[2] * x->shape[3] == 0) /* its mean would be 0 / 0 */
    return tr_fail(ctx, "global_avg_pool2d: the maps are empty (%lldx%lld)",
                   (long long)x->shape[2], (long long)x->shape[3]);
  if (tn_on_cuda(x)) return tr_mean(ctx, x, 2, (const int[]){2, 3}, false);
  tr_tensor *xc = tn_contig(ctx, x);
  tr_tensor *y = xc ? tr_empty(ctx, x->dtype, 2, x->shape) : NULL;
  int rc = y ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, plane_means, tr_data(xc), tr_data(y), x->shape[0] * x->shape[1],
                x->shape[2] * x->shape[3]);
  tr_release(xc);
  ag_record(ctx, &gap_ops, 1, &x, y, &rc);
  return ag_output(y, rc);
}

/* ---------------------------------------------------------------- channel scale */

typedef struct {
  tr_node base;
  tr_saved x, s; /* contiguous */
} channel_scale_node;

static int channel_scale_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  channel_scale_node *n = (channel_scale_node *)node;
  tr_tensor *x = ag_saved(ctx, node, &n->x), *s = x ? ag_saved(ctx, node, &n->s) : NULL;
  tr_tensor *gc = s ? tn_contig(ctx, g) : NULL;
  if (!gc) return NAS_ERR;
  int64_t planes = s->numel, hw = x->shape[2] * x->shape[3];
  int rc = NAS_OK;
  if (ag_wants(node, 0) && (gi[0] = tn_empty_like(ctx, x)))
    TR_DISPATCH(x->dtype, plane_scale, tr_data(gc), tr_data(s), tr_data(gi[0]), planes, hw);
  else if (ag_wants(node, 0))
    rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 1) && (gi[1] = tn_empty_like(ctx, s)))
    TR_DISPATCH(x->dtype, plane_dots, tr_data(gc), tr_data(x), tr_data(gi[1]), planes, hw);
  else if (rc == NAS_OK && ag_wants(node, 1))
    rc = NAS_ERR;
  tr_release(gc);
  return rc;
}
static const tr_node_ops channel_scale_ops = {"ChannelScaleBackward", channel_scale_backward,
                                              sizeof(channel_scale_node), NULL};

/* The broadcasting multiply that computes the same on a device. */
static tr_tensor *channel_scale_by_mul(tr_ctx *ctx, tr_tensor *x, tr_tensor *s) {
  tr_tensor *s4 = tr_reshape(ctx, s, 4, (const int64_t[]){s->shape[0], s->shape[1], 1, 1});
  tr_tensor *y = s4 ? tr_mul(ctx, x, s4) : NULL;
  tr_release(s4);
  return y;
}

tr_tensor *tr_channel_scale(tr_ctx *ctx, tr_tensor *x, tr_tensor *s) {
  tr_tensor *in[2] = {x, s};
  if (tn_check_inputs(ctx, "channel_scale", 2, in)) return NULL;
  if (x->ndim != 4 || s->ndim != 2 || s->shape[0] != x->shape[0] || s->shape[1] != x->shape[1])
    return tr_fail(ctx, "channel_scale: x (N, C, H, W) and s (N, C) expected, got %d and %d dims "
                        "or other sizes",
                   x->ndim, s->ndim);
  if (tn_on_cuda(x)) return channel_scale_by_mul(ctx, x, s);
  tr_tensor *xc = tn_contig(ctx, x), *sc = xc ? tn_contig(ctx, s) : NULL;
  tr_tensor *y = sc ? tn_empty_like(ctx, xc) : NULL;
  int rc = y ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, plane_scale, tr_data(xc), tr_data(sc), tr_data(y), s->numel,
                x->shape[2] * x->shape[3]);
  channel_scale_node *node = ag_record(ctx, &channel_scale_ops, 2, in, y, &rc);
  if (node) {
    rc = ag_save(ctx, &node->base, &node->x, xc);
    if (rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->s, sc);
  }
  tr_release(xc);
  tr_release(sc);
  return ag_output(y, rc);
}
