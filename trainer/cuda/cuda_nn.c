/* cuda_nn: the CUDA side of the norm, convolution and pooling ops and of the optimiser
 * updates and gradient clipping, each forward beside its backward. The public ops
 * (trainer/ops/ops_norm.c, ops_conv.c) check inputs and shapes for both devices and hand checked
 * inputs here; convolution's node and saved tensors are recorded there too, so only its
 * compute (tc_conv2d_fwd / tc_conv2d_bwd) is here.
 *
 * Norm statistics (mean and 1/std per group, doubles) stay on the device in a float64
 * tensor saved with the node; max-pool argmax is int32 on the device (tc_upload_i32's
 * convention). Convolution lays the whole batch out at once: col (C*KH*KW, N*P) =
 * im2col(x), then one GEMM per pass:
 *   forward  yo (O, N*P) = W (O, CKK) @ col,            y (N, O, P) = yo permuted + b
 *   backward dyo (O, N*P) = dy permuted;  dW = dyo @ col^T;  dx = col2im(W^T @ dyo)
 * (col is recomputed in backward, as on the CPU; with autocast the GEMMs run in bf16). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda/cuda_internal.h"

static void *data_or_null(const tr_tensor *t) { return t ? tr_data(t) : NULL; }

/* A float64 device tensor of n doubles (norm statistics). */
static tr_tensor *stats_new(tr_ctx *ctx, int64_t n) { return tc_empty(ctx, TR_F64, 1, &n); }

/* The gradients of w and b a norm backward fills, NULL where not wanted. */
static int param_grads(tr_ctx *ctx, tr_node *node, tr_dtype dtype, tr_tensor **gi) {
  for (int i = 1; i < 3; i++)
    if (ag_wants(node, i) && !(gi[i] = tc_empty_meta(ctx, dtype, &node->in_meta[i])))
      return NAS_ERR;
  return NAS_OK;
}

/* ---------------------------------------------------------------- layer norm */

/* saved: x, stats, w (when ia[0]). */
static int layer_norm_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *x = ag_saved(ctx, node, 0), *stats = x ? ag_saved(ctx, node, 1) : NULL, *w = NULL;
  if (!stats || (node->ia[0] && !(w = ag_saved(ctx, node, 2)))) return NAS_ERR;
  tr_tensor *gc = tc_contig(ctx, g);
  int rc = gc ? param_grads(ctx, node, x->dtype, gi) : NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 0) && !(gi[0] = tc_empty_like(ctx, x))) rc = NAS_ERR;
  int64_t d = x->shape[x->ndim - 1];
  if (rc == NAS_OK)
    rc = tc_ok(ctx, "LayerNormBackward",
               tck_layer_norm_bwd(tc_stream(ctx), (int)x->dtype, tr_data(x), data_or_null(w),
                                  tr_data(gc), tr_data(stats), data_or_null(gi[0]),
                                  data_or_null(gi[1]), data_or_null(gi[2]), x->numel / d, d));
  tr_free(gc);
  return rc;
}
static const tr_node_ops layer_norm_ops = {"LayerNormBackward", layer_norm_backward};

tr_tensor *tc_layer_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, double eps) {
  tr_tensor *in[3] = {x, w, b};
  int64_t d = x->shape[x->ndim - 1], rows = x->numel / d;
  tr_tensor *xc = tc_contig(ctx, x), *wc = w ? tc_contig(ctx, w) : NULL,
            *bc = b ? tc_contig(ctx, b) : NULL;
  tr_tensor *y = xc && (!w || wc) && (!b || bc) ? tc_empty_like(ctx, xc) : NULL;
  tr_tensor *stats = y ? stats_new(ctx, 2 * rows) : NULL;
  int rc =
      stats ? tc_ok(ctx, "layer_norm",
                    tck_layer_norm_fwd(tc_stream(ctx), (int)x->dtype, tr_data(xc), data_or_null(wc),
                                       data_or_null(bc), tr_data(y), tr_data(stats), rows, d, eps))
            : NAS_ERR;
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &layer_norm_ops, 3, in, y, &node);
  if (node) {
    node->ia[0] = w != NULL;
    rc = ag_save(ctx, node, xc) || ag_save(ctx, node, stats) || (w && ag_save(ctx, node, wc));
  }
  tr_free(stats);
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

/* saved: x, stats, w (when ia[1]); ia[0]: training. */
static int batch_norm_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *x = ag_saved(ctx, node, 0), *stats = x ? ag_saved(ctx, node, 1) : NULL, *w = NULL;
  if (!stats || (node->ia[1] && !(w = ag_saved(ctx, node, 2)))) return NAS_ERR;
  int64_t n, c, l;
  tn_bn_dims(ctx, x, &n, &c, &l);
  tr_tensor *gc = tc_contig(ctx, g);
  int rc = gc ? param_grads(ctx, node, x->dtype, gi) : NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 0) && !(gi[0] = tc_empty_like(ctx, x))) rc = NAS_ERR;
  if (rc == NAS_OK)
    rc =
        tc_ok(ctx, "BatchNormBackward",
              tck_batch_norm_bwd(tc_stream(ctx), (int)x->dtype, tr_data(x), data_or_null(w),
                                 tr_data(gc), tr_data(stats), node->ia[0] != 0, data_or_null(gi[0]),
                                 data_or_null(gi[1]), data_or_null(gi[2]), n, c, l));
  tr_free(gc);
  return rc;
}
static const tr_node_ops batch_norm_ops = {"BatchNormBackward", batch_norm_backward};

/* Fills stats (2C doubles) from the batch, moving the running statistics (training), or
 * from the running statistics (evaluation). */
static int bn_stats(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *rmean, tr_tensor *rvar,
                    bool training, double momentum, double eps, tr_tensor *stats) {
  int64_t n, c, l;
  tn_bn_dims(ctx, xc, &n, &c, &l);
  tck_stream s = tc_stream(ctx);
  int dt = (int)xc->dtype;
  if (!training) {
    if (!rmean || !rvar)
      return nas_errf(&ctx->err, "batch_norm: evaluation needs running statistics");
    tr_tensor *m = tc_contig(ctx, rmean), *v = m ? tc_contig(ctx, rvar) : NULL;
    int rc = v ? tc_ok(ctx, "batch_norm",
                       tck_batch_norm_stats_running(s, dt, tr_data(m), tr_data(v), tr_data(stats),
                                                    c, eps))
               : NAS_ERR;
    tr_free(m);
    tr_free(v);
    return rc;
  }
  if (n * l < 2)
    return nas_errf(&ctx->err, "batch_norm: training needs more than one value per channel");
  tr_tensor *var = stats_new(ctx, c);
  int rc = var ? tc_ok(ctx, "batch_norm",
                       tck_batch_norm_stats(s, dt, tr_data(xc), tr_data(stats), tr_data(var), n, c,
                                            l, eps))
               : NAS_ERR;
  double unbias = (double)(n * l) / (double)(n * l - 1);
  /* The running buffers are contiguous module buffers; a view would need a copy back. */
  if (rc == NAS_OK && rmean && !tr_is_contiguous(rmean))
    rc = nas_errf(&ctx->err, "batch_norm: running statistics must be contiguous on cuda");
  if (rc == NAS_OK && rmean)
    rc = tc_ok(ctx, "batch_norm",
               tck_running_update(s, dt, tr_data(rmean), tr_data(stats), 2, 1.0, momentum, c));
  if (rc == NAS_OK && rvar && !tr_is_contiguous(rvar))
    rc = nas_errf(&ctx->err, "batch_norm: running statistics must be contiguous on cuda");
  if (rc == NAS_OK && rvar)
    rc = tc_ok(ctx, "batch_norm",
               tck_running_update(s, dt, tr_data(rvar), tr_data(var), 1, unbias, momentum, c));
  if (rc == NAS_OK && rmean) rmean->storage->version++;
  if (rc == NAS_OK && rvar) rvar->storage->version++;
  tr_free(var);
  return rc;
}

tr_tensor *tc_batch_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b,
                         tr_tensor *running_mean, tr_tensor *running_var, bool training,
                         double momentum, double eps) {
  tr_tensor *in[3] = {x, w, b};
  int64_t n, c, l;
  tn_bn_dims(ctx, x, &n, &c, &l);
  tr_tensor *xc = tc_contig(ctx, x), *wc = w ? tc_contig(ctx, w) : NULL,
            *bc = b ? tc_contig(ctx, b) : NULL;
  tr_tensor *y = xc && (!w || wc) && (!b || bc) ? tc_empty_like(ctx, xc) : NULL;
  tr_tensor *stats = y ? stats_new(ctx, 2 * c) : NULL;
  int rc = stats ? bn_stats(ctx, xc, running_mean, running_var, training, momentum, eps, stats)
                 : NAS_ERR;
  if (rc == NAS_OK)
    rc = tc_ok(ctx, "batch_norm",
               tck_batch_norm_apply(tc_stream(ctx), (int)x->dtype, tr_data(xc), data_or_null(wc),
                                    data_or_null(bc), tr_data(stats), tr_data(y), n, c, l));
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &batch_norm_ops, 3, in, y, &node);
  if (node) {
    node->ia[0] = training;
    node->ia[1] = w != NULL;
    rc = ag_save(ctx, node, xc) || ag_save(ctx, node, stats) || (w && ag_save(ctx, node, wc));
  }
  tr_free(stats);
  tr_free(xc);
  tr_free(wc);
  tr_free(bc);
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- conv2d */

/* col (C*KH*KW, N*P) of x. */
static tr_tensor *im2col(tr_ctx *ctx, const tr_tensor *x, const tck_conv_geom *g) {
  int64_t shape[2] = {g->c * g->kh * g->kw, g->n * g->oh * g->ow};
  tr_tensor *col = tc_empty(ctx, x->dtype, 2, shape);
  if (col && tc_ok(ctx, "conv2d",
                   tck_im2col(tc_stream(ctx), (int)x->dtype, tr_data(x), tr_data(col), g))) {
    tr_free(col);
    return NULL;
  }
  return col;
}

/* weight (O, C, KH, KW) as the matrix (O, CKK). */
static tr_tensor *weight_matrix(tr_ctx *ctx, const tr_tensor *w) {
  int64_t shape[2] = {w->shape[0], w->numel / (w->shape[0] ? w->shape[0] : 1)};
  return tn_view(ctx, w, 2, shape);
}

int tc_conv2d_bwd(tr_ctx *ctx, const tr_node *node, tr_tensor *x, tr_tensor *w,
                  const tr_tensor *g, const tck_conv_geom *geo, tr_tensor **gi) {
  int64_t o = w->shape[0], p = geo->oh * geo->ow, oshape[2] = {o, geo->n * p};
  tr_tensor *gc = tc_contig(ctx, g);
  tr_tensor *dyo = gc ? tc_empty(ctx, x->dtype, 2, oshape) : NULL;
  int rc = dyo ? tc_ok(ctx, "ConvolutionBackward",
                       tck_conv_from_nop(tc_stream(ctx), (int)x->dtype, tr_data(gc), tr_data(dyo),
                                         geo->n, o, p))
               : NAS_ERR;
  tr_tensor *wm = rc == NAS_OK ? weight_matrix(ctx, w) : NULL;
  if (!wm) rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 1)) { /* dW = dyo @ col^T */
    tr_tensor *col = im2col(ctx, x, geo);
    tr_tensor *dwm = col ? tc_gemm(ctx, dyo, false, col, true) : NULL;
    gi[1] = dwm ? tn_view(ctx, dwm, 4, w->shape) : NULL;
    tr_free(dwm);
    tr_free(col);
    if (!gi[1]) rc = NAS_ERR;
  }
  if (rc == NAS_OK && ag_wants(node, 0)) { /* dx = col2im(W^T @ dyo) */
    tr_tensor *dcol = tc_gemm(ctx, wm, true, dyo, false);
    gi[0] = dcol ? tc_empty_like(ctx, x) : NULL;
    rc = gi[0]
             ? tc_ok(ctx, "ConvolutionBackward",
                     tck_col2im(tc_stream(ctx), (int)x->dtype, tr_data(dcol), tr_data(gi[0]), geo))
             : NAS_ERR;
    tr_free(dcol);
  }
  if (rc == NAS_OK && ag_wants(node, 2)) { /* db = row sums of dyo (grad mode is off) */
    int axis = 1;
    gi[2] = tr_sum(ctx, dyo, 1, &axis, false);
    if (!gi[2]) rc = NAS_ERR;
  }
  tr_free(wm);
  tr_free(dyo);
  tr_free(gc);
  return rc;
}

int tc_conv2d_fwd(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc, const tr_tensor *bc,
                  const tck_conv_geom *geo, tr_tensor *y) {
  tr_tensor *col = im2col(ctx, xc, geo);
  tr_tensor *wm = col ? weight_matrix(ctx, wc) : NULL;
  tr_tensor *yo = wm ? tc_gemm(ctx, wm, false, col, false) : NULL;
  int rc = yo ? tc_ok(ctx, "conv2d",
                      tck_conv_to_nop(tc_stream(ctx), (int)xc->dtype, tr_data(yo), data_or_null(bc),
                                      tr_data(y), geo->n, wc->shape[0], geo->oh * geo->ow))
              : NAS_ERR;
  tr_free(yo);
  tr_free(wm);
  tr_free(col);
  return rc;
}

/* ---------------------------------------------------------------- pooling */

/* ia: kernel, stride, is_max; saved 0: argmax (max only). */
static int pool_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  bool is_max = node->ia[2] != 0;
  tr_tensor *argmax = is_max ? ag_saved(ctx, node, 0) : NULL;
  if (is_max && !argmax) return NAS_ERR;
  tr_tensor *gc = tc_contig(ctx, g);
  tr_tensor *dx = gc ? tc_empty_meta(ctx, g->dtype, &node->in_meta[0]) : NULL;
  const tr_meta *in = &node->in_meta[0];
  tck_conv_geom geo = {in->shape[0], in->shape[1], in->shape[2], in->shape[3], node->ia[0],
                       node->ia[0],  node->ia[1],  0,            g->shape[2],  g->shape[3]};
  int rc = dx ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK)
    rc = tc_ok(ctx, node->ops->name,
               tck_pool_bwd(tc_stream(ctx), (int)g->dtype, tr_data(gc), tr_data(dx),
                            argmax ? tc_i32(argmax) : NULL, &geo, is_max));
  tr_free(gc);
  if (rc) {
    tr_free(dx);
    return NAS_ERR;
  }
  gi[0] = dx;
  return NAS_OK;
}
static const tr_node_ops max_pool_ops = {"MaxPool2DBackward", pool_backward};
static const tr_node_ops avg_pool_ops = {"AvgPool2DBackward", pool_backward};

tr_tensor *tc_pool2d(tr_ctx *ctx, tr_tensor *x, const tck_conv_geom *geo, bool is_max) {
  const char *name = is_max ? "max_pool2d" : "avg_pool2d";
  int64_t oshape[4] = {geo->n, geo->c, geo->oh, geo->ow};
  tr_tensor *xc = tc_contig(ctx, x);
  tr_tensor *y = xc ? tc_empty(ctx, x->dtype, 4, oshape) : NULL;
  /* argmax: int32 per output, in a 4-byte tensor (tc_upload_i32's convention) */
  tr_tensor *argmax = y && is_max ? tc_empty(ctx, TR_F32, 4, oshape) : NULL;
  int rc = y && (argmax || !is_max)
               ? tc_ok(ctx, name,
                       tck_pool_fwd(tc_stream(ctx), (int)x->dtype, tr_data(xc), tr_data(y),
                                    argmax ? (int32_t *)tr_data(argmax) : NULL, geo, is_max))
               : NAS_ERR;
  tr_free(xc);
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, is_max ? &max_pool_ops : &avg_pool_ops, 1, &x, y, &node);
  if (node) {
    node->ia[0] = geo->kh;
    node->ia[1] = geo->stride;
    node->ia[2] = is_max;
    if (is_max) rc = ag_save(ctx, node, argmax);
  }
  tr_free(argmax);
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- optimisers */

/* State slot k of p, zeroed on the device when first used. */
static tr_tensor *state_of(tr_ctx *ctx, tr_tensor *p, tr_tensor **state, int k) {
  if (!state[k]) state[k] = tc_zeros(ctx, p->dtype, p->ndim, p->shape);
  return state[k];
}

int tc_optim_update(tr_ctx *ctx, const tr_optim_config *c, tr_tensor *p, tr_tensor **state,
                    double bc1, double bc2) {
  tr_tensor *g = p->grad, *in[2] = {p, g};
  if (tc_check(ctx, "optim", 2, in)) return NAS_ERR;
  if (!tr_is_contiguous(p) || !tr_is_contiguous(g) || g->numel != p->numel)
    return nas_errf(&ctx->err, "optim: a parameter and its grad must be contiguous and alike");
  tck_status st;
  if (c->kind == TR_SGD) {
    tr_tensor *buf = c->momentum > 0 ? state_of(ctx, p, state, 0) : NULL;
    if (c->momentum > 0 && !buf) return NAS_ERR;
    st = tck_sgd_update(tc_stream(ctx), (int)p->dtype, tr_data(p), tr_data(g), data_or_null(buf),
                        p->numel, c->lr, c->momentum, c->weight_decay, c->nesterov);
  } else {
    tr_tensor *m = state_of(ctx, p, state, 0), *v = m ? state_of(ctx, p, state, 1) : NULL;
    if (!v) return NAS_ERR;
    st = tck_adam_update(tc_stream(ctx), (int)p->dtype, tr_data(p), tr_data(g), tr_data(m),
                         tr_data(v), p->numel, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                         c->kind == TR_ADAMW, bc1, bc2);
  }
  if (tc_ok(ctx, "optim", st)) return NAS_ERR;
  p->storage->version++;
  return NAS_OK;
}

/* The norm comes back to the host (one wait per gradient); the scaling stays queued. */
double tc_clip_grad_norm(tr_tensor *const *params, size_t n, double max_norm) {
  double sq = 0;
  for (size_t i = 0; i < n; i++)
    if (params[i]->grad) sq += tn_sumsq(params[i]->grad);
  double norm = sqrt(sq);
  if (norm > max_norm && norm > 0) {
    double scale = max_norm / (norm + 1e-6); /* torch's epsilon, as the CPU */
    for (size_t i = 0; i < n; i++) {
      tr_tensor *g = params[i]->grad;
      if (!g) continue;
      tn_scale_contig(g, scale); /* any strides on the device */
      g->storage->version++;
    }
  }
  return norm;
}
