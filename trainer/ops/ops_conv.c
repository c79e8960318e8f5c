/* ops_conv: 2-D convolution (im2col + GEMM, image by image) and max/average pooling,
 * forward beside backward.
 *
 *   conv:  per image n: col = im2col(x_n) (C*KH*KW, P); y_n = W (O, C*KH*KW) @ col + b
 *          dW = sum_n dy_n @ col^T;  dx_n = col2im(W^T @ dy_n);  db = sums of dy.
 *          col is recomputed in backward rather than kept (it is KH*KW times the input).
 *   pools: k x k windows, stride s, no padding; max keeps its argmax per output (int32, on
 *          the input's device).
 *
 * Threads: images are spread over OpenMP threads when OpenBLAS itself runs on one thread
 * (OPENBLAS_NUM_THREADS=1); with more BLAS threads each GEMM is threaded instead, and
 * nesting the two would put more threads than cores on the machine.
 *
 * Checks, geometry, nodes and saved tensors serve both devices; on a device the compute goes
 * to tc_conv2d_fwd / tc_conv2d_bwd (trainer/cuda/cuda_nn.c: the whole batch in one GEMM) and
 * tc_pool_fwd / tc_pool_bwd. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/dispatch.h"

/* x (n, c, h, w), kernel kh x kw, stride, pad, output oh x ow: the CUDA kernels' struct. */
typedef tck_conv_geom conv_geom;

#define T float
#define S(name) name##_f32
#define TDT TR_F32
#include "trainer/ops/kern_conv.h"
#undef T
#undef S
#undef TDT
#define T double
#define S(name) name##_f64
#define TDT TR_F64
#include "trainer/ops/kern_conv.h"
#undef T
#undef S
#undef TDT

static int geom_of(tr_ctx *ctx, const char *op, const tr_tensor *x, int64_t kh, int64_t kw,
                   int stride, int pad, conv_geom *g) {
  if (x->ndim != 4)
    return nas_errf(&ctx->err, "%s: input must be (N, C, H, W), has %d dims", op, x->ndim);
  if (stride < 1 || pad < 0)
    return nas_errf(&ctx->err, "%s: stride %d, padding %d", op, stride, pad);
  if (kh < 1 || kw < 1) /* an empty window would make a map from nothing */
    return nas_errf(&ctx->err, "%s: kernel %lldx%lld", op, (long long)kh, (long long)kw);
  *g = (conv_geom){x->shape[0], x->shape[1], x->shape[2], x->shape[3], kh, kw, stride, pad, 0, 0};
  if (g->h + 2 * pad < kh || g->w + 2 * pad < kw)
    return nas_errf(&ctx->err, "%s: kernel %lldx%lld larger than the padded input %lldx%lld", op,
                    (long long)kh, (long long)kw, (long long)(g->h + 2 * pad),
                    (long long)(g->w + 2 * pad));
  g->oh = (g->h + 2 * pad - kh) / stride + 1;
  g->ow = (g->w + 2 * pad - kw) / stride + 1;
  return NAS_OK;
}

int tn_conv_geom(tr_ctx *ctx, const char *op, const tr_tensor *x, int64_t kh, int64_t kw,
                 int stride, int pad, tck_conv_geom *g) {
  return geom_of(ctx, op, x, kh, kw, stride, pad, g);
}

/* Threads for the per-image loop (see the file comment). */
static int image_threads(int64_t images) {
  int nt = tn_par_threads();
  return images < nt ? (int)(images > 0 ? images : 1) : nt;
}

/* Scratch of n elements for the per-image loop (owned by the caller), from ctx's allocator
 * like any tensor, so that it is reused from step to step. */
static tr_tensor *scratch_new(tr_ctx *ctx, tr_dtype dtype, int64_t n) {
  int64_t shape[1] = {n > 0 ? n : 1};
  return tr_empty(ctx, dtype, 1, shape);
}

/* ---------------------------------------------------------------- conv2d */

typedef struct {
  tr_node base;
  int stride, padding;
  tr_saved x, w; /* contiguous */
} conv_node;

static int conv_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  conv_node *n = (conv_node *)node;
  tr_tensor *x = ag_saved(ctx, node, &n->x), *w = x ? ag_saved(ctx, node, &n->w) : NULL;
  if (!w) return NAS_ERR;
  conv_geom geo;
  geom_of(ctx, "conv2d", x, w->shape[2], w->shape[3], n->stride, n->padding, &geo);
  if (tn_on_cuda(x)) return tc_conv2d_bwd(ctx, node, x, w, g, &geo, gi);
  int64_t o = w->shape[0], ckk = geo.c * geo.kh * geo.kw, p = geo.oh * geo.ow;
  int nt = image_threads(geo.n);
  tr_tensor *gc = tn_contig(ctx, g);
  tr_tensor *scratch = gc ? scratch_new(ctx, x->dtype, nt * (2 * ckk * p + o * ckk)) : NULL;
  int rc = scratch ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 0) && !(gi[0] = tr_zeros(ctx, x->dtype, 4, x->shape)))
    rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 1) && !(gi[1] = tn_empty_like(ctx, w))) rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 2) &&
      !(gi[2] = tn_empty_meta(ctx, x->dtype, &node->in_meta[2])))
    rc = NAS_ERR;
  if (rc == NAS_OK && (gi[0] || gi[1]))
    TR_DISPATCH(x->dtype, conv_bwd, tr_data(x), tr_data(w), tr_data(gc),
                gi[0] ? tr_data(gi[0]) : NULL, gi[1] ? tr_data(gi[1]) : NULL, &geo, o,
                tr_data(scratch), nt);
  if (rc == NAS_OK && gi[2])
    TR_DISPATCH(x->dtype, conv_bias_grad, tr_data(gc), tr_data(gi[2]), geo.n, o, p);
  tr_release(scratch);
  tr_release(gc);
  return rc;
}
static const tr_node_ops conv_ops = {"ConvolutionBackward", conv_backward, sizeof(conv_node),
                                     NULL};

static int check_conv_args(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *w,
                           const tr_tensor *b) {
  if (w->ndim != 4 || x->ndim != 4 || w->shape[1] != x->shape[1])
    return nas_errf(&ctx->err,
                    "conv2d: input (N, C, H, W) with C = %lld needs weight (O, C, KH, KW)",
                    (long long)(x->ndim == 4 ? x->shape[1] : -1));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return nas_errf(&ctx->err, "conv2d: bias must have %lld values", (long long)w->shape[0]);
  return NAS_OK;
}

tr_tensor *tr_conv2d(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int stride,
                     int padding) {
  tr_tensor *in[3] = {x, w, b};
  conv_geom geo;
  if (tn_check_inputs(ctx, "conv2d", 3, in) || check_conv_args(ctx, x, w, b) ||
      geom_of(ctx, "conv2d", x, w->shape[2], w->shape[3], stride, padding, &geo))
    return NULL;
  int64_t o = w->shape[0], ckk = geo.c * geo.kh * geo.kw;
  int nt = image_threads(geo.n);
  tr_tensor *xc = tn_contig(ctx, x), *wc = tn_contig(ctx, w), *bc = b ? tn_contig(ctx, b) : NULL;
  tr_meta ym = {4, {geo.n, o, geo.oh, geo.ow}};
  tr_tensor *y = xc && wc && (!b || bc) ? tn_empty_dev(ctx, x, x->dtype, &ym) : NULL;
  int rc = y ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && tn_on_cuda(y)) {
    rc = tc_conv2d_fwd(ctx, xc, wc, bc, &geo, y);
  } else if (rc == NAS_OK) {
    tr_tensor *scratch = scratch_new(ctx, x->dtype, nt * ckk * geo.oh * geo.ow);
    if (scratch)
      TR_DISPATCH(x->dtype, conv_fwd, tr_data(xc), tr_data(wc), bc ? tr_data(bc) : NULL,
                  tr_data(y), &geo, o, tr_data(scratch), nt);
    else
      rc = NAS_ERR;
    tr_release(scratch);
  }
  conv_node *node = ag_record(ctx, &conv_ops, 3, in, y, &rc);
  if (node) {
    node->stride = stride;
    node->padding = padding;
    rc = ag_save(ctx, &node->base, &node->x, xc);
    if (rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->w, wc);
  }
  tr_release(xc);
  tr_release(wc);
  tr_release(bc);
  return ag_output(y, rc);
}

/* ---------------------------------------------------------------- pooling */

typedef struct {
  tr_node base;
  int kernel, stride;
  bool is_max;
  tr_saved argmax; /* max only */
} pool_node;

static int pool_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  pool_node *n = (pool_node *)node;
  bool is_max = n->is_max;
  tr_tensor *argmax = is_max ? ag_saved(ctx, node, &n->argmax) : NULL;
  if (is_max && !argmax) return NAS_ERR;
  tr_tensor *gc = tn_contig(ctx, g);
  tr_tensor *dx = gc ? tn_empty_dev(ctx, gc, g->dtype, &node->in_meta[0]) : NULL; /* all written */
  int rc = dx ? NAS_OK : NAS_ERR;
  conv_geom geo;
  if (rc == NAS_OK)
    geom_of(ctx, "pool", dx, n->kernel, n->kernel, n->stride, 0, &geo);
  if (rc == NAS_OK && tn_on_cuda(dx))
    rc = tc_pool_bwd(ctx, gc, dx, argmax, &geo, is_max);
  else if (rc == NAS_OK)
    TR_DISPATCH(g->dtype, pool_bwd, tr_data(gc), tr_data(dx), argmax ? tr_data(argmax) : NULL,
                &geo, is_max);
  tr_release(gc);
  if (rc) {
    tr_release(dx);
    return NAS_ERR;
  }
  gi[0] = dx;
  return NAS_OK;
}
static const tr_node_ops max_pool_ops = {"MaxPool2DBackward", pool_backward, sizeof(pool_node),
                                         NULL};
static const tr_node_ops avg_pool_ops = {"AvgPool2DBackward", pool_backward, sizeof(pool_node),
                                         NULL};

static tr_tensor *pool_op(tr_ctx *ctx, tr_tensor *x, int kernel, int stride, bool is_max) {
  const char *name = is_max ? "max_pool2d" : "avg_pool2d";
  conv_geom geo;
  if (tn_check_inputs(ctx, name, 1, &x)) return NULL;
  if (kernel < 1) return tr_fail(ctx, "pool: kernel %d", kernel);
  if (geom_of(ctx, name, x, kernel, kernel, stride, 0, &geo)) return NULL;
  tr_meta ym = {4, {geo.n, geo.c, geo.oh, geo.ow}};
  tr_tensor *xc = tn_contig(ctx, x);
  tr_tensor *y = xc ? tn_empty_dev(ctx, x, x->dtype, &ym) : NULL;
  /* argmax: an int32 per output, in a 4-byte tensor on x's device (tn_i32_new's convention) */
  tr_tensor *argmax = y && is_max ? tn_empty_dev(ctx, x, TR_F32, &ym) : NULL;
  int rc = y && (argmax || !is_max) ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && tn_on_cuda(x))
    rc = tc_pool_fwd(ctx, xc, y, argmax, &geo, is_max);
  else if (rc == NAS_OK)
    TR_DISPATCH(x->dtype, pool_fwd, tr_data(xc), tr_data(y), argmax ? tr_data(argmax) : NULL,
                &geo, is_max);
  tr_release(xc);
  pool_node *node = ag_record(ctx, is_max ? &max_pool_ops : &avg_pool_ops, 1, &x, y, &rc);
  if (node) {
    node->kernel = kernel;
    node->stride = stride;
    node->is_max = is_max;
    if (is_max) rc = ag_save(ctx, &node->base, &node->argmax, argmax);
  }
  tr_release(argmax);
  return ag_output(y, rc);
}

tr_tensor *tr_max_pool2d(tr_ctx *ctx, tr_tensor *x, int kernel, int stride) {
  return pool_op(ctx, x, kernel, stride, true);
}
tr_tensor *tr_avg_pool2d(tr_ctx *ctx, tr_tensor *x, int kernel, int stride) {
  return pool_op(ctx, x, kernel, stride, false);
}
