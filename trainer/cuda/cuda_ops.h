/* cuda_ops: the engine's entry points into the CUDA backend (internal; the ops reach it
 * through trainer/ops/dispatch.h, the core through its device table). Each public op in ops_*.c checks its inputs, computes output shapes, records
 * its node and composes its backward for every device; only the compute step dispatches
 * (tn_on_cuda) to the tc_* kernel functions here, which run the launchers of
 * trainer/cuda/cuda_kernels.cu on ctx->cuda's stream (trainer/cuda/cuda*.c).
 *
 * The tc_* functions take borrowed inputs and return a new reference or NULL, or NAS_OK /
 * NAS_ERR, with ctx->err set; they expect inputs already checked by tc_check. */
#ifndef NAS_TRAINER_CUDA_OPS_H
#define NAS_TRAINER_CUDA_OPS_H

#include "trainer/core/internal.h"
#include "trainer/cuda/cuda_kernels.h"

/* Whether any of the params has a gradient on a device. */
bool tn_grads_on_cuda(tr_tensor *const *params, size_t n);
/* The CUDA backend's table for the core (tn_device_ops): its device allocators carry it. */
extern const tn_device_ops tc_device_ops;

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

/* Cross-entropy of contiguous logits x (N, C) and labels (int32, in [0, C)): probs (N, C)
 * written, the mean loss returned (a new device scalar); and its backward into dx from the
 * loss's gradient dloss (a device scalar). */
tr_tensor *tc_cross_entropy_fwd(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *labels,
                                tr_tensor *probs);
int tc_cross_entropy_bwd(tr_ctx *ctx, const tr_tensor *probs, const tr_tensor *labels,
                         const tr_tensor *dloss, tr_tensor *dx);
/* out (n, D) = rows ids (int32, n of them, in [0, V)) of contiguous w (V, D); dw (V, D,
 * overwritten) = the sums of the rows of contiguous dy (n, D) by id. */
int tc_embedding_fwd(tr_ctx *ctx, const tr_tensor *w, const tr_tensor *ids, tr_tensor *out);
int tc_embedding_bwd(tr_ctx *ctx, const tr_tensor *dy, const tr_tensor *ids, tr_tensor *dw);
/* A device tensor of n int32 values copied from the host. The engine has no integer dtype:
 * the values are kept as the bits of n float32 elements, read back as int32 by kernels. */
tr_tensor *tc_upload_i32(tr_ctx *ctx, const int32_t *values, int64_t n);

/* ---------------------------------------------------------------- nn (cuda_nn.c) */

/* The compute steps of the norms on contiguous tensors (ops_norm.c): stats are float64,
 * mean and 1/std per group (rows of d for layer norm, channels of x (n, c, l) for batch
 * norm); gi[0..2] (dx, dw, db) may each be NULL (not wanted) and are overwritten. Batch
 * norm's stats come from the batch, moving the running statistics (training), or from the
 * running statistics (evaluation). */
int tc_layer_norm_fwd(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc, const tr_tensor *bc,
                      tr_tensor *y, tr_tensor *stats, int64_t rows, int64_t d, double eps);
int tc_layer_norm_bwd(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *w, const tr_tensor *dy,
                      const tr_tensor *stats, tr_tensor *const *gi, int64_t rows, int64_t d);
int tc_batch_norm_stats(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *rmean, tr_tensor *rvar,
                        bool training, double momentum, double eps, tr_tensor *stats);
int tc_batch_norm_apply(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc,
                        const tr_tensor *bc, const tr_tensor *stats, tr_tensor *y, int64_t n,
                        int64_t c, int64_t l);
int tc_batch_norm_bwd(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *w, const tr_tensor *dy,
                      const tr_tensor *stats, bool training, tr_tensor *const *gi, int64_t n,
                      int64_t c, int64_t l);
/* Convolution of contiguous xc, wc, bc (may be NULL) with geometry geo into y (N, O, OH, OW);
 * and its backward from dy into gi[i] for each input i that node wants. */
int tc_conv2d_fwd(tr_ctx *ctx, const tr_tensor *xc, const tr_tensor *wc, const tr_tensor *bc,
                  const tck_conv_geom *geo, tr_tensor *y);
int tc_conv2d_bwd(tr_ctx *ctx, const tr_node *node, tr_tensor *x, tr_tensor *w,
                  const tr_tensor *dy, const tck_conv_geom *geo, tr_tensor **gi);
/* Pooling of contiguous xc with geometry geo into y, max-pool's argmax (int32 per output)
 * into argmax; and its backward into dx (overwritten) from contiguous dy. */
int tc_pool_fwd(tr_ctx *ctx, const tr_tensor *xc, tr_tensor *y, tr_tensor *argmax,
                const tck_conv_geom *geo, bool is_max);
int tc_pool_bwd(tr_ctx *ctx, const tr_tensor *dy, tr_tensor *dx, const tr_tensor *argmax,
                const tck_conv_geom *geo, bool is_max);
/* One optimiser update of p (CUDA) from p->grad; state[0..1] its slots (made on first use). */
int tc_optim_update(tr_ctx *ctx, const tr_optim_config *cfg, tr_tensor *p, tr_tensor **state,
                    double bc1, double bc2);
double tc_clip_grad_norm(tr_tensor *const *params, size_t n, double max_norm);

#endif
