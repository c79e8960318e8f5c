/* trainer/ops/dispatch.h: what an op needs to run on either device: the compute steps of the
 * CUDA backend (trainer/cuda/cuda_ops.h) and helpers that follow a tensor's device. An op
 * checks, records and keeps its side data the same way on both; only its compute step
 * splits (tn_on_cuda). Internal to the engine. */
#ifndef NAS_TRAINER_OPS_DISPATCH_H
#define NAS_TRAINER_OPS_DISPATCH_H

#include "trainer/core/internal.h"
#include "trainer/cuda/cuda_ops.h"

/* An op's input check for every device: on a device, all inputs on ctx->cuda's device, of
 * one float dtype (tc_check); on the host, of one dtype. NULL inputs (after the first) are
 * skipped. */
static inline int tn_check_inputs(tr_ctx *ctx, const char *op, int n, tr_tensor *const *ts) {
  return tn_any_on_cuda(n, ts) ? tc_check(ctx, op, n, ts) : tn_check_dtypes(ctx, op, n, ts);
}
/* A new contiguous tensor of dtype and shape m on the device of like (an op's output or
 * gradient); on the host exactly tn_empty_meta. */
static inline tr_tensor *tn_empty_dev(tr_ctx *ctx, const tr_tensor *like, tr_dtype dtype,
                                      const tr_meta *m) {
  return tn_on_cuda(like) ? tc_empty(ctx, dtype, m->ndim, m->shape) : tn_empty_meta(ctx, dtype, m);
}
/* tn_empty_like on t's device. */
static inline tr_tensor *tn_empty_like_dev(tr_ctx *ctx, const tr_tensor *t) {
  return tn_on_cuda(t) ? tc_empty(ctx, t->dtype, t->ndim, t->shape) : tn_empty_like(ctx, t);
}
/* tn_zeros_meta on like's device. */
static inline tr_tensor *tn_zeros_dev(tr_ctx *ctx, const tr_tensor *like, tr_dtype dtype,
                                      const tr_meta *m) {
  return tn_on_cuda(like) ? tc_zeros(ctx, dtype, m->ndim, m->shape) : tn_zeros_meta(ctx, dtype, m);
}

/* n int32 values as the bits of a 4-byte (float32) tensor on like's device, the engine having
 * no integer dtype: labels, ids (ops_shape.c); max-pool's argmax has the same layout. */
tr_tensor *tn_i32_new(tr_ctx *ctx, const tr_tensor *like, const int32_t *values, int64_t n);

/* A convolution's or pool's geometry: x (N, C, H, W), kernel kh x kw, stride, pad and the
 * output size; an error naming op when x is not 4-D or the kernel does not fit (ops_conv.c). */
int tn_conv_geom(tr_ctx *ctx, const char *op, const tr_tensor *x, int64_t kh, int64_t kw,
                 int stride, int pad, tck_conv_geom *g);

#endif
