/* ops_depthwise: grouped 2-D convolution, depthwise (groups = C) included, forward beside
 * backward, by the direct loops of kern_depthwise.h: no im2col, no GEMM.
 *
 *   y[n, o] = b[o] + sum over the CG input channels c of o's group of w[o, c - c0] * x[n, c]
 *   dx[n, c] = sum over the OG outputs o of c's group of w[o, c - c0] (adjoint) dy[n, o]
 *   dw[o, ci] = sum over n of dy[n, o] correlated with x[n, c0 + ci];  db = sums of dy.
 *
 * groups = 1 is an ordinary convolution and goes to tr_conv2d (im2col + GEMM), which is
 * faster when every output reads every input channel. At stride 1 the loops run over
 * padded planes in a wide layout (kern_depthwise.h), with a scratch per thread from ctx's
 * allocator. The CPU runs the loops; on a CUDA device the op says it is not supported
 * there. */
#include <omp.h>
#include <string.h>

#include "trainer/ops/dispatch.h"

typedef tck_conv_geom conv_geom;

#define KERN_FILE "trainer/ops/kern_depthwise.h"
#include "trainer/core/kern_both.h"

/* The kernels' scratch for geometry g (tn_par_threads() parts), or *scratch = NULL when
 * they need none; NAS_ERR when out of memory. Owned by the caller. */
static int scratch_new(tr_ctx *ctx, tr_dtype dtype, const conv_geom *g, tr_tensor **scratch) {
  int64_t per = scratch_per_thread_f32(g), n = per * tn_par_threads();
  *scratch = per ? tr_empty(ctx, dtype, 1, &n) : NULL;
  return !per || *scratch ? NAS_OK : NAS_ERR;
}

typedef struct {
  tr_node base;
  int stride, padding, groups;
  tr_saved x, w; /* contiguous */
} grouped_conv_node;

static int grouped_conv_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  grouped_conv_node *n = (grouped_conv_node *)node;
  tr_tensor *x = ag_saved(ctx, node, &n->x), *w = x ? ag_saved(ctx, node, &n->w) : NULL;
  if (!w) return NAS_ERR;
  conv_geom geo;
  tn_conv_geom(ctx, "conv2d_grouped", x, w->shape[2], w->shape[3], n->stride, n->padding, &geo);
  int64_t o = w->shape[0];
  tr_tensor *gc = tn_contig(ctx, g), *scratch = NULL;
  int rc = gc ? scratch_new(ctx, x->dtype, &geo, &scratch) : NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 0) && !(gi[0] = tn_empty_like(ctx, x))) rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 1) && !(gi[1] = tn_empty_like(ctx, w))) rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 2)) { /* db (O): dy summed over N, OH, OW */
    tr_tensor *sums = tn_sum_dims(ctx, gc, 1u | 4u | 8u, 1.0);
    gi[2] = sums ? tn_view(ctx, sums, 1, &o) : NULL;
    tr_release(sums);
    if (!gi[2]) rc = NAS_ERR;
  }
  if (rc == NAS_OK && gi[0])
    TR_DISPATCH(x->dtype, grouped_bwd_input, tr_data(gc), tr_data(w), tr_data(gi[0]), &geo, o,
                n->groups, scratch ? tr_data(scratch) : NULL);
  if (rc == NAS_OK && gi[1])
    TR_DISPATCH(x->dtype, grouped_bwd_weight, tr_data(x), tr_data(gc), tr_data(gi[1]), &geo, o,
                n->groups, scratch ? tr_data(scratch) : NULL);
  tr_release(scratch);
  tr_release(gc);
  return rc;
}
static const tr_node_ops grouped_conv_ops = {"ConvolutionBackward", grouped_conv_backward,
                                             sizeof(grouped_conv_node), NULL};

static int check_grouped_args(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *w,
                              const tr_tensor *b, int groups) {
  if (x->ndim != 4 || w->ndim != 4)
    return nas_errf(&ctx->err, "conv2d_grouped: input (N, C, H, W) and weight (O, C/groups, KH, "
                               "KW) expected, got %d and %d dims",
                    x->ndim, w->ndim);
  int64_t c = x->shape[1], o = w->shape[0];
  if (groups < 1 || c % groups || o % groups || w->shape[1] * groups != c)
    return nas_errf(&ctx->err,
                    "conv2d_grouped: %d groups need input channels (%lld) and output channels "
                    "(%lld) divisible by them and weight (O, C/groups, KH, KW), has %lld per group",
                    groups, (long long)c, (long long)o, (long long)w->shape[1]);
  if (b && (b->ndim != 1 || b->shape[0] != o))
    return nas_errf(&ctx->err, "conv2d_grouped: bias must have %lld values", (long long)o);
  return NAS_OK;
}

tr_tensor *tr_conv2d_grouped(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int stride,
                             int padding, int groups) {
  if (groups == 1) return tr_conv2d(ctx, x, w, b, stride, padding);
  tr_tensor *in[3] = {x, w, b};
  conv_geom geo;
  if (tn_check_inputs(ctx, "conv2d_grouped", 3, in) || check_grouped_args(ctx, x, w, b, groups) ||
      tn_conv_geom(ctx, "conv2d_grouped", x, w->shape[2], w->shape[3], stride, padding, &geo))
    return NULL;
  if (tn_on_cuda(x))
    return tr_fail(ctx, "conv2d_grouped: not supported on cuda (groups %d); train this model on "
                        "the cpu",
                   groups);
  int64_t o = w->shape[0];
  tr_tensor *xc = tn_contig(ctx, x), *wc = tn_contig(ctx, w), *bc = b ? tn_contig(ctx, b) : NULL;
  tr_meta ym = {4, {geo.n, o, geo.oh, geo.ow}};
  tr_tensor *y = xc && wc && (!b || bc) ? tn_empty_meta(ctx, x->dtype, &ym) : NULL;
  tr_tensor *scratch = NULL;
  int rc = y ? scratch_new(ctx, x->dtype, &geo, &scratch) : NAS_ERR;
  if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, grouped_fwd, tr_data(xc), tr_data(wc), bc ? tr_data(bc) : NULL,
                tr_data(y), &geo, o, groups, scratch ? tr_data(scratch) : NULL);
  tr_release(scratch);
  grouped_conv_node *node = ag_record(ctx, &grouped_conv_ops, 3, in, y, &rc);
  if (node) {
    node->stride = stride;
    node->padding = padding;
    node->groups = groups;
    rc = ag_save(ctx, &node->base, &node->x, xc);
    if (rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->w, wc);
  }
  tr_release(xc);
  tr_release(wc);
  tr_release(bc);
  return ag_output(y, rc);
}
