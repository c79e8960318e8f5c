/* cuda_ops: the engine's entry points into the CUDA backend (internal; trainer/internal.h
 * includes it). Public ops, in-place writes and the optimiser check their inputs with
 * tn_on_cuda and hand a CUDA input to the tc_* twin here, which runs on ctx->cuda and
 * records autograd nodes whose backward runs on the device too (trainer/cuda*.c).
 *
 * The tc_* functions follow the conventions of the public ops they stand for (borrowed
 * inputs, a new reference or NULL with ctx->err set); inputs on different devices, or a CUDA
 * input with no ctx->cuda for its device, are errors. */
#ifndef NAS_TRAINER_CUDA_OPS_H
#define NAS_TRAINER_CUDA_OPS_H

#include "trainer/cuda_kernels.h"
#include "trainer/trainer.h"

static inline bool tn_on_cuda(const tr_tensor *t) {
  return t && t->storage->device.kind == TR_CUDA;
}
bool tn_any_on_cuda(int n, tr_tensor *const *ts);
/* Whether any of the params has a gradient on a device. */
bool tn_grads_on_cuda(tr_tensor *const *params, size_t n);

/* A caching allocator of device memory (trainer/alloc.c): the same size classes and
 * statistics as the host one, blocks from cudaMalloc on device. */
tr_allocator *tn_allocator_new_device(int device, size_t cache_limit);
/* A new contiguous tensor whose storage comes from alloc (may be NULL: host malloc) and
 * lives on device (trainer/tensor.c). */
tr_tensor *tn_empty_on(tr_ctx *ctx, tr_allocator *alloc, tr_device device, tr_dtype dtype, int ndim,
                       const int64_t *shape);

/* ---------------------------------------------------------------- tensors (cuda.c) */

tr_tensor *tc_empty(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape);
tr_tensor *tc_zeros(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape);
/* Twins of the tensor.c helpers for a CUDA t. The ones without a ctx use the device's
 * legacy default stream, which is ordered with every engine stream; their errors go
 * unreported (tr_get then returns NaN). */
double tc_get(const tr_tensor *t, int64_t i);
void tc_fill(tr_tensor *t, double value);
double tc_sumsq(const tr_tensor *t);
void tc_scale(tr_tensor *t, double s);
tr_tensor *tc_contig(tr_ctx *ctx, const tr_tensor *t);
tr_tensor *tc_clone(tr_ctx *ctx, const tr_tensor *t);
int tc_add_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha);
int tc_mul_scalar_(tr_ctx *ctx, tr_tensor *t, double s);
int tc_copy_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src);
tr_tensor *tc_to_dtype(tr_ctx *ctx, const tr_tensor *t, tr_dtype dtype);
/* The gradient backward starts from for a CUDA root (grad may be NULL or on the host). */
tr_tensor *tc_initial_grad(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad);

/* ---------------------------------------------------------------- ops (cuda_ops.c) */

/* op: TCK_ADD, TCK_SUB, TCK_MUL, TCK_DIV. */
tr_tensor *tc_binary(tr_ctx *ctx, int op, tr_tensor *a, tr_tensor *b);
/* op: TCK_RELU ... TCK_SCALE (s: the scale). */
tr_tensor *tc_unary(tr_ctx *ctx, int op, tr_tensor *a, double s);
tr_tensor *tc_dropout(tr_ctx *ctx, tr_tensor *a, double p, bool training);
tr_tensor *tc_reduce(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim,
                     bool mean);
tr_tensor *tc_softmax(tr_ctx *ctx, tr_tensor *a, int dim, bool log_out);
tr_tensor *tc_matmul(tr_ctx *ctx, tr_tensor *a, tr_tensor *b);
tr_tensor *tc_linear(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b);
tr_tensor *tc_cross_entropy(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels);
tr_tensor *tc_reshape(tr_ctx *ctx, tr_tensor *t, int ndim, const int64_t *shape);
tr_tensor *tc_transpose(tr_ctx *ctx, tr_tensor *t, int dim0, int dim1);
tr_tensor *tc_narrow(tr_ctx *ctx, tr_tensor *t, int dim, int64_t start, int64_t length);
tr_tensor *tc_contiguous(tr_ctx *ctx, tr_tensor *t);
tr_tensor *tc_concat(tr_ctx *ctx, int n, tr_tensor *const *ts, int dim);
tr_tensor *tc_embedding(tr_ctx *ctx, tr_tensor *weight, int64_t n, const int32_t *ids);

/* ---------------------------------------------------------------- nn ops (cuda_nn.c) */

tr_tensor *tc_layer_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, double eps);
tr_tensor *tc_batch_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b,
                         tr_tensor *running_mean, tr_tensor *running_var, bool training,
                         double momentum, double eps);
tr_tensor *tc_conv2d(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int stride,
                     int padding);
tr_tensor *tc_pool2d(tr_ctx *ctx, tr_tensor *x, int kernel, int stride, bool is_max);
/* One optimiser update of p (CUDA) from p->grad; state[0..1] its slots (made on first use). */
int tc_optim_update(tr_ctx *ctx, const tr_optim_config *cfg, tr_tensor *p, tr_tensor **state,
                    double bc1, double bc2);
double tc_clip_grad_norm(tr_tensor *const *params, size_t n, double max_norm);

#endif
