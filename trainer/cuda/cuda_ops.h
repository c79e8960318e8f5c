/* cuda_ops: the engine's entry points into the CUDA backend (internal; trainer/core/internal.h
 * includes it). Each public op in ops_*.c checks its inputs, computes output shapes, records
 * its node and composes its backward for every device; only the compute step dispatches
 * (tn_on_cuda) to the tc_* kernel functions here, which run the launchers of
 * trainer/cuda/cuda_kernels.cu on ctx->cuda's stream (trainer/cuda/cuda*.c). A few ops
 * whose side data differs by device (dropout, cross-entropy, embedding, norms, pools) hand their checked
 * inputs to a tc_* function that computes and records.
 *
 * The tc_* functions take borrowed inputs and return a new reference or NULL, or NAS_OK /
 * NAS_ERR, with ctx->err set; they expect inputs already checked by tc_check. */
#ifndef NAS_TRAINER_CUDA_OPS_H
#define NAS_TRAINER_CUDA_OPS_H

#include "trainer/cuda/cuda_kernels.h"
#include "trainer/trainer.h"

static inline bool tn_on_cuda(const tr_tensor *t) {
  return t && t->storage->device.kind == TR_CUDA;
}
bool tn_any_on_cuda(int n, tr_tensor *const *ts);
/* Whether any of the params has a gradient on a device. */
bool tn_grads_on_cuda(tr_tensor *const *params, size_t n);

/* A caching allocator of device memory (trainer/core/alloc.c): the same size classes and
 * statistics as the host one, blocks from cudaMalloc on device. */
tr_allocator *tn_allocator_new_device(int device, size_t cache_limit);
/* A new contiguous tensor whose storage comes from alloc (may be NULL: host malloc) and
 * lives on device (trainer/core/tensor.c). */
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

/* ---------------------------------------------------------------- checks (cuda.c) */

/* Checks that ctx has an engine and that every non-NULL input of op is a float32 or
 * float64 tensor on its device, all of one dtype. */
int tc_check(tr_ctx *ctx, const char *op, int n, tr_tensor *const *ts);
/* dst = src, both CUDA on ctx's device, same numel, any strides and dtypes; no version bump. */
int tc_copy_raw(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src);

/* ---------------------------------------------------------------- kernels (cuda_ops.c) */

/* out = a op b (op: TCK_ADD ... TCK_DIV); sa, sb: the inputs' strides aligned to out's
 * shape, 0 on broadcast dims. */
int tc_binary_fwd(tr_ctx *ctx, int op, const char *name, tr_tensor *out, const tr_tensor *a,
                  const int64_t *sa, const tr_tensor *b, const int64_t *sb);
/* y = op(x) and dx = op'(saved) dy on contiguous tensors (op: TCK_RELU ... TCK_SCALE). */
int tc_unary_fwd(tr_ctx *ctx, const char *name, int op, const tr_tensor *x, tr_tensor *y,
                 double s);
int tc_unary_bwd(tr_ctx *ctx, const char *name, int op, const tr_tensor *saved,
                 const tr_tensor *dy, tr_tensor *dx, double s);
/* out (outer, 1, inner) = scale * the sums of x (outer, n, inner) over n; contiguous. */
int tc_sum_axis(tr_ctx *ctx, const tr_tensor *x, tr_tensor *out, int64_t outer, int64_t n,
                int64_t inner, double scale);
/* Softmax (log_out: log-softmax) of contiguous x (outer, n, inner) over n, and its backward
 * from the output y. */
int tc_softmax_fwd(tr_ctx *ctx, const tr_tensor *x, tr_tensor *y, int64_t outer, int64_t n,
                   int64_t inner, bool log_out);
int tc_softmax_bwd(tr_ctx *ctx, const char *name, const tr_tensor *y, const tr_tensor *dy,
                   tr_tensor *dx, int64_t outer, int64_t n, int64_t inner, bool log_out);
/* C = op(A) op(B) for 2-D tensors (any strides), new (cuBLAS; bf16 operands under autocast). */
tr_tensor *tc_gemm(tr_ctx *ctx, tr_tensor *a, bool ta, tr_tensor *b, bool tb);
/* y (R, out) = x2 (R, in) W^T (+ b). */
tr_tensor *tc_linear_fwd(tr_ctx *ctx, tr_tensor *x2, tr_tensor *w, tr_tensor *b);

/* ---------------------------------------------------------------- ops (cuda_ops.c) */

/* Training dropout (0 < p < 1) of a checked input: the mask is a saved device tensor. */
tr_tensor *tc_dropout(tr_ctx *ctx, tr_tensor *a, double p);
/* Cross-entropy of checked logits (N, C) and labels in [0, C): labels saved on the device. */
tr_tensor *tc_cross_entropy(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels);
/* Embedding rows of a checked weight (V, D) for ids in [0, V): ids saved on the device. */
tr_tensor *tc_embedding(tr_ctx *ctx, tr_tensor *weight, int64_t n, const int32_t *ids);

/* ---------------------------------------------------------------- nn (cuda_nn.c) */

/* Norms of checked inputs (shapes already validated): statistics saved as a float64 device
 * tensor. */
tr_tensor *tc_layer_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, double eps);
tr_tensor *tc_batch_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b,
                         tr_tensor *running_mean, tr_tensor *running_var, bool training,
                         double momentum, double eps);
/* Convolution of contiguous xc, wc, bc (may be NULL) with geometry geo into y (N, O, OH, OW);
 * and its backward from dy into gi[i] for each input i that node wants. */
int tc_conv2d_fwd(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc, const tr_tensor *bc,
                  const tck_conv_geom *geo, tr_tensor *y);
int tc_conv2d_bwd(tr_ctx *ctx, const tr_node *node, tr_tensor *x, tr_tensor *w,
                  const tr_tensor *dy, const tck_conv_geom *geo, tr_tensor **gi);
/* Pooling of a checked x with geometry geo (kernel and stride validated): max-pool's argmax
 * is saved on the device. */
tr_tensor *tc_pool2d(tr_ctx *ctx, tr_tensor *x, const tck_conv_geom *geo, bool is_max);
/* One optimiser update of p (CUDA) from p->grad; state[0..1] its slots (made on first use). */
int tc_optim_update(tr_ctx *ctx, const tr_optim_config *cfg, tr_tensor *p, tr_tensor **state,
                    double bc1, double bc2);
double tc_clip_grad_norm(tr_tensor *const *params, size_t n, double max_norm);

#endif
