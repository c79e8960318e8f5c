/* cuda_nn: the CUDA compute steps of the norm, convolution and pooling ops and of the
 * optimiser updates and gradient clipping, each forward beside its backward. The public ops
 * (trainer/ops/ops_norm.c, ops_conv.c) check inputs and shapes, record nodes and keep the
 * side data for both devices; only their compute steps come here, as launchers of
 * trainer/cuda/cuda_kernels.cu on ctx's stream.
 *
 * Norm statistics (mean and 1/std per group, doubles) are a float64 device tensor; max-pool
 * argmax is int32 on the device (tc_upload_i32's convention). Convolution lays the whole batch out at once: col (C*KH*KW, N*P) =
 * im2col(x), then one GEMM per pass:
 *   forward  yo (O, N*P) = W (O, CKK) @ col,            y (N, O, P) = yo permuted + b
 *   backward dyo (O, N*P) = dy permuted;  dW = dyo @ col^T;  dx = col2im(W^T @ dyo)
 * (col is recomputed in backward, as on the CPU; with autocast the GEMMs run in bf16). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda/cuda_internal.h"

static void *data_or_null(const tr_tensor *t) { return t ? tr_data(t) : NULL; }

/* ---------------------------------------------------------------- layer norm */

int tc_layer_norm_fwd(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc, const tr_tensor *bc,
                      tr_tensor *y, tr_tensor *stats, int64_t rows, int64_t d, double eps) {
  return tc_ok(ctx, "layer_norm",
               tck_layer_norm_fwd(tc_stream(ctx), (int)xc->dtype, tr_data(xc), data_or_null(wc),
                                  data_or_null(bc), tr_data(y), tr_data(stats), rows, d, eps));
}

int tc_layer_norm_bwd(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *w, const tr_tensor *dy,
                      const tr_tensor *stats, tr_tensor *const *gi, int64_t rows, int64_t d) {
  return tc_ok(ctx, "LayerNormBackward",
               tck_layer_norm_bwd(tc_stream(ctx), (int)x->dtype, tr_data(x), data_or_null(w),
                                  tr_data(dy), tr_data(stats), data_or_null(gi[0]),
                                  data_or_null(gi[1]), data_or_null(gi[2]), rows, d));
}

/* ---------------------------------------------------------------- batch norm */

/* The running statistics (evaluation) as stats. */
static int bn_stats_running(tr_ctx *ctx, const tr_tensor *rmean, const tr_tensor *rvar,
                            int64_t c, double eps, tr_tensor *stats) {
  tr_tensor *m = tc_contig(ctx, rmean), *v = m ? tc_contig(ctx, rvar) : NULL;
  int rc = v ? tc_ok(ctx, "batch_norm",
                     tck_batch_norm_stats_running(tc_stream(ctx), (int)rmean->dtype, tr_data(m),
                                                  tr_data(v), tr_data(stats), c, eps))
             : NAS_ERR;
  tr_release(m);
  tr_release(v);
  return rc;
}

/* running = (1 - momentum) running + momentum scale values[i * stride]; bumps its version. */
static int bn_running_update(tr_ctx *ctx, tr_tensor *running, const double *values,
                             int64_t stride, double scale, double momentum) {
  /* The running buffers are contiguous module buffers; a view would need a copy back. */
  if (!tr_is_contiguous(running))
    return nas_errf(&ctx->err, "batch_norm: running statistics must be contiguous on cuda");
  if (tc_ok(ctx, "batch_norm",
            tck_running_update(tc_stream(ctx), (int)running->dtype, tr_data(running), values,
                               stride, scale, momentum, running->numel)))
    return NAS_ERR;
  running->storage->version++;
  return NAS_OK;
}

int tc_batch_norm_stats(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *rmean, tr_tensor *rvar,
                        bool training, double momentum, double eps, tr_tensor *stats) {
  int64_t n, c, l;
  tn_bn_dims(ctx, xc, &n, &c, &l);
  if (!training) return bn_stats_running(ctx, rmean, rvar, c, eps, stats);
  int64_t cn = c;
  tr_tensor *var = tc_empty(ctx, TR_F64, 1, &cn);
  int rc = var ? tc_ok(ctx, "batch_norm",
                       tck_batch_norm_stats(tc_stream(ctx), (int)xc->dtype, tr_data(xc),
                                            tr_data(stats), tr_data(var), n, c, l, eps))
               : NAS_ERR;
  double unbias = (double)(n * l) / (double)(n * l - 1);
  if (rc == NAS_OK && rmean) rc = bn_running_update(ctx, rmean, tr_data(stats), 2, 1.0, momentum);
  if (rc == NAS_OK && rvar) rc = bn_running_update(ctx, rvar, tr_data(var), 1, unbias, momentum);
  tr_release(var);
  return rc;
}

int tc_batch_norm_apply(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc,
                        const tr_tensor *bc, const tr_tensor *stats, tr_tensor *y, int64_t n,
                        int64_t c, int64_t l) {
  return tc_ok(ctx, "batch_norm",
               tck_batch_norm_apply(tc_stream(ctx), (int)xc->dtype, tr_data(xc), data_or_null(wc),
                                    data_or_null(bc), tr_data(stats), tr_data(y), n, c, l));
}

int tc_batch_norm_bwd(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *w, const tr_tensor *dy,
                      const tr_tensor *stats, bool training, tr_tensor *const *gi, int64_t n,
                      int64_t c, int64_t l) {
  return tc_ok(ctx, "BatchNormBackward",
               tck_batch_norm_bwd(tc_stream(ctx), (int)x->dtype, tr_data(x), data_or_null(w),
                                  tr_data(dy), tr_data(stats), training, data_or_null(gi[0]),
                                  data_or_null(gi[1]), data_or_null(gi[2]), n, c, l));
}

/* ---------------------------------------------------------------- conv2d */

/* col (C*KH*KW, N*P) of x. */
static tr_tensor *im2col(tr_ctx *ctx, const tr_tensor *x, const tck_conv_geom *g) {
  int64_t shape[2] = {g->c * g->kh * g->kw, g->n * g->oh * g->ow};
  tr_tensor *col = tc_empty(ctx, x->dtype, 2, shape);
  if (col && tc_ok(ctx, "conv2d",
                   tck_im2col(tc_stream(ctx), (int)x->dtype, tr_data(x), tr_data(col), g))) {
    tr_release(col);
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
    tr_release(dwm);
    tr_release(col);
    if (!gi[1]) rc = NAS_ERR;
  }
  if (rc == NAS_OK && ag_wants(node, 0)) { /* dx = col2im(W^T @ dyo) */
    tr_tensor *dcol = tc_gemm(ctx, wm, true, dyo, false);
    gi[0] = dcol ? tc_empty_like(ctx, x) : NULL;
    rc = gi[0]
             ? tc_ok(ctx, "ConvolutionBackward",
                     tck_col2im(tc_stream(ctx), (int)x->dtype, tr_data(dcol), tr_data(gi[0]), geo))
             : NAS_ERR;
    tr_release(dcol);
  }
  if (rc == NAS_OK && ag_wants(node, 2)) { /* db = row sums of dyo (grad mode is off) */
    int axis = 1;
    gi[2] = tr_sum(ctx, dyo, 1, &axis, false);
    if (!gi[2]) rc = NAS_ERR;
  }
  tr_release(wm);
  tr_release(dyo);
  tr_release(gc);
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
  tr_release(yo);
  tr_release(wm);
  tr_release(col);
  return rc;
}

/* ---------------------------------------------------------------- pooling */

int tc_pool_fwd(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *y, tr_tensor *argmax,
                const tck_conv_geom *geo, bool is_max) {
  return tc_ok(ctx, is_max ? "max_pool2d" : "avg_pool2d",
               tck_pool_fwd(tc_stream(ctx), (int)xc->dtype, tr_data(xc), tr_data(y),
                            argmax ? (int32_t *)tr_data(argmax) : NULL, geo, is_max));
}

int tc_pool_bwd(tr_ctx *ctx, const tr_tensor *dy, tr_tensor *dx, const tr_tensor *argmax,
                const tck_conv_geom *geo, bool is_max) {
  return tc_ok(ctx, is_max ? "MaxPool2DBackward" : "AvgPool2DBackward",
               tck_pool_bwd(tc_stream(ctx), (int)dy->dtype, tr_data(dy), tr_data(dx),
                            argmax ? tc_i32(argmax) : NULL, geo, is_max));
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
