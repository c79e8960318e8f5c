/* cuda_kernels: the plain C interface of the CUDA side of the engine (trainer/cuda_*.cu),
 * on raw pointers, compiled as C and as C++.
 *
 * The .cu files implement these with the CUDA runtime, cuBLAS and kernels; without nvcc,
 * trainer/cuda/cuda_nocuda.c implements every one as a failure "built without CUDA". The C side
 * (trainer/cuda/cuda*.c) handles tensors and autograd and calls only what is declared here.
 *
 * Conventions:
 * - Every call returns NULL on success or a message that says what failed (a constant
 *   string: the CUDA or cuBLAS error text, or ours); callers add the op's name.
 * - A tck_stream names the device and the stream (a cudaStream_t; NULL is the legacy
 *   default stream, which is ordered with every blocking stream of the device). Work is
 *   queued on it; a call returns before the kernels finish, except the copies to or from
 *   the host, which wait for the stream.
 * - dtype is TCK_F32, TCK_F64 or TCK_BF16 (the values of tr_dtype). Sizes are element
 *   counts; n == 0 launches nothing. Buffers are contiguous unless a layout is given. */
#ifndef NAS_TRAINER_CUDA_KERNELS_H
#define NAS_TRAINER_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { TCK_F32 = 0, TCK_F64 = 1, TCK_BF16 = 2 };
enum { TCK_MAX_DIMS = 6 };

typedef const char *tck_status; /* NULL: success */

typedef struct {
  int device;
  void *stream; /* cudaStream_t, borrowed; NULL: the legacy default stream */
} tck_stream;

/* A strided view: element (i0, ..., i{ndim-1}) sits at sum_d i_d * strides[d]. */
typedef struct {
  int ndim;
  int64_t shape[TCK_MAX_DIMS];
  int64_t strides[TCK_MAX_DIMS];
} tck_layout;

/* ---------------------------------------------------------------- runtime (cuda_runtime.cu) */

/* Number of devices; a failure (no driver, no device) is the status, count then 0. */
tck_status tck_device_count(int *count);
tck_status tck_device_name(int device, char *name, size_t cap);
tck_status tck_stream_new(int device, void **stream);
tck_status tck_stream_free(int device, void *stream);
tck_status tck_stream_sync(tck_stream s);
tck_status tck_malloc(int device, size_t nbytes, void **ptr);
tck_status tck_free(int device, void *ptr);
/* Copies between host and device or device and device (kind below); host copies wait. */
enum { TCK_H2D = 0, TCK_D2H = 1, TCK_D2D = 2 };
tck_status tck_memcpy(tck_stream s, void *dst, const void *src, size_t nbytes, int kind);
tck_status tck_memset0(tck_stream s, void *dst, size_t nbytes);

/* A cuBLAS handle bound to a stream, in an object that also holds cuBLAS itself: the
 * library is not linked but loaded here (libcublas.so.13 from the toolkit's lib64, else by
 * the search path), so only processes that make an engine pay for it. Failing to load is
 * the status "cuBLAS: cannot load libcublas.so.13: <why> (...)". *handle is owned and may
 * be set even when the call fails (the message lives in it): tck_blas_free it in every
 * case, after reading the status (NULL is accepted). */
tck_status tck_blas_new(int device, void *stream, void **handle);
tck_status tck_blas_free(int device, void *handle);
/* Row-major C (m, n) = alpha op(A) op(B) + beta C, with ld in elements (as cblas row-major).
 * ab_dtype: dtype of A and B; c_dtype: of C. Same dtype: sgemm/dgemm. A, B bf16: GemmEx with
 * float32 accumulation, C float32 or bf16. */
tck_status tck_gemm(tck_stream s, void *blas, int ab_dtype, int c_dtype, bool trans_a, bool trans_b,
                    int64_t m, int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                    const void *b, int64_t ldb, double beta, void *c, int64_t ldc);

/* ---------------------------------------------------------------- kernels (cuda_kernels.cu) */

/* dst (layout dl, dtype dd) = src (layout sl, dtype sd), element by element in logical
 * order; n elements. Converts between dtypes. */
tck_status tck_copy(tck_stream s, int sd, const void *src, const tck_layout *sl, int dd, void *dst,
                    const tck_layout *dl, int64_t n);
/* x = value over n elements through layout xl (NULL: contiguous). */
tck_status tck_fill(tck_stream s, int dtype, void *x, const tck_layout *xl, int64_t n,
                    double value);
/* y += alpha * x, or y *= alpha when x is NULL; n elements, each through its layout (NULL:
 * contiguous). */
tck_status tck_axpy(tck_stream s, int dtype, int64_t n, double alpha, const void *x,
                    const tck_layout *xl, void *y, const tck_layout *yl);
/* out[0] (double) = sum of x[i]^2, accumulated in double; out is device memory. */
tck_status tck_sumsq(tck_stream s, int dtype, const void *x, int64_t n, double *out);

enum { TCK_RELU, TCK_GELU, TCK_TANH, TCK_SIGMOID, TCK_EXP, TCK_LOG, TCK_SCALE };
enum { TCK_ADD, TCK_SUB, TCK_MUL, TCK_DIV };
/* y = f(x) (scale: s x); n contiguous elements. */
tck_status tck_unary_fwd(tck_stream s, int dtype, int op, const void *x, void *y, int64_t n,
                         double sc);
/* dx = dy f'(saved): saved is y for relu, tanh, sigmoid, exp; x for gelu, log; unused for
 * scale. */
tck_status tck_unary_bwd(tck_stream s, int dtype, int op, const void *saved, const void *dy,
                         void *dx, int64_t n, double sc);
/* out (contiguous, shape of ol) = a op b, a and b read through their layouts (aligned to
 * out's dims, stride 0 where broadcast). */
tck_status tck_binary(tck_stream s, int dtype, int op, const void *a, const tck_layout *al,
                      const void *b, const tck_layout *bl, void *out, const tck_layout *ol);

/* Reductions on contiguous x seen as (outer, n, inner): out[o, i] = scale sum_j x[o, j, i].
 * scratch: tck_sum_scratch(outer, n, inner) doubles of device memory (NULL when that is 0),
 * free for reuse once the sum's work on s is done. */
int64_t tck_sum_scratch(int64_t outer, int64_t n, int64_t inner);
tck_status tck_sum_axis(tck_stream s, int dtype, const void *x, void *out, int64_t outer, int64_t n,
                        int64_t inner, double scale, double *scratch);
tck_status tck_softmax_fwd(tck_stream s, int dtype, const void *x, void *y, int64_t outer,
                           int64_t n, int64_t inner, bool log_out);
tck_status tck_softmax_bwd(tck_stream s, int dtype, const void *y, const void *dy, void *dx,
                           int64_t outer, int64_t n, int64_t inner, bool log_out);

/* Cross-entropy of logits (rows, classes) with int32 labels (device): probs = softmax,
 * loss_rows[r] = -log probs[r, label]. Labels outside [0, classes) give NaN rows. */
tck_status tck_cross_entropy_fwd(tck_stream s, int dtype, const void *logits, const int32_t *labels,
                                 void *probs, void *loss_rows, int64_t rows, int64_t classes);
/* dx = (probs - onehot) * dloss[0] / rows; dloss is a device scalar of dtype. */
tck_status tck_cross_entropy_bwd(tck_stream s, int dtype, const void *probs, const int32_t *labels,
                                 const void *dloss, void *dx, int64_t rows, int64_t classes);

/* Layer norm over rows of d; stats (device doubles): mean, rstd per row. w, b may be NULL. */
tck_status tck_layer_norm_fwd(tck_stream s, int dtype, const void *x, const void *w, const void *b,
                              void *y, double *stats, int64_t rows, int64_t d, double eps);
/* dx, dw, db may be NULL (not wanted); dw and db are overwritten. */
tck_status tck_layer_norm_bwd(tck_stream s, int dtype, const void *x, const void *w, const void *dy,
                              const double *stats, void *dx, void *dw, void *db, int64_t rows,
                              int64_t d);
/* Batch norm on x (n, c, l). stats (device doubles): mean, rstd per channel; var gets the
 * biased batch variance. */
tck_status tck_batch_norm_stats(tck_stream s, int dtype, const void *x, double *stats, double *var,
                                int64_t n, int64_t c, int64_t l, double eps);
/* stats from running statistics (evaluation): mean, 1/sqrt(var + eps). */
tck_status tck_batch_norm_stats_running(tck_stream s, int dtype, const void *rmean,
                                        const void *rvar, double *stats, int64_t c, double eps);
/* running = (1 - m) running + m scale values[i * stride]. */
tck_status tck_running_update(tck_stream s, int dtype, void *running, const double *values,
                              int64_t stride, double scale, double momentum, int64_t c);
tck_status tck_batch_norm_apply(tck_stream s, int dtype, const void *x, const void *w,
                                const void *b, const double *stats, void *y, int64_t n, int64_t c,
                                int64_t l);
tck_status tck_batch_norm_bwd(tck_stream s, int dtype, const void *x, const void *w, const void *dy,
                              const double *stats, bool training, void *dx, void *dw, void *db,
                              int64_t n, int64_t c, int64_t l);

/* Convolution geometry: x (n, c, h, w), kernel kh x kw, stride, pad, output oh x ow. */
typedef struct {
  int64_t n, c, h, w, kh, kw, stride, pad, oh, ow;
} tck_conv_geom;
/* col (c*kh*kw, n*oh*ow): row (c, kh, kw), column (n, oh, ow). */
tck_status tck_im2col(tck_stream s, int dtype, const void *x, void *col, const tck_conv_geom *g);
/* dx (n, c, h, w) = the adjoint of im2col applied to dcol (overwrites dx). */
tck_status tck_col2im(tck_stream s, int dtype, const void *dcol, void *dx, const tck_conv_geom *g);
/* Between (O, n, P) and (n, O, P): to_nop moves yo (O, n*P) to y (n, O, P) adding b (O, may be
 * NULL); the other way moves dy (n, O, P) to dyo (O, n*P). */
tck_status tck_conv_to_nop(tck_stream s, int dtype, const void *yo, const void *b, void *y,
                           int64_t n, int64_t o, int64_t p);
tck_status tck_conv_from_nop(tck_stream s, int dtype, const void *dy, void *dyo, int64_t n,
                             int64_t o, int64_t p);
/* Pools over k x k windows (geometry with kh = kw = k, pad 0) on planes (n*c). argmax gets
 * the index in the plane of each max (max only). */
tck_status tck_pool_fwd(tck_stream s, int dtype, const void *x, void *y, int32_t *argmax,
                        const tck_conv_geom *g, bool is_max);
/* dx (overwritten) from dy: to the argmax (max) or spread evenly (avg). */
tck_status tck_pool_bwd(tck_stream s, int dtype, const void *dy, void *dx, const int32_t *argmax,
                        const tck_conv_geom *g, bool is_max);

/* out (n, d) = w[ids[i], :]; dw (v, d, overwritten) = sum over i with ids[i] = row of dy[i]. */
tck_status tck_embedding_fwd(tck_stream s, int dtype, const void *w, const int32_t *ids, void *out,
                             int64_t n, int64_t d);
tck_status tck_embedding_bwd(tck_stream s, int dtype, const void *dy, const int32_t *ids, void *dw,
                             int64_t n, int64_t v, int64_t d);

/* Optimiser updates (torch's formulas, as trainer/nn/kern_optim.h); p, g, state of dtype; buf
 * NULL: SGD without momentum. */
tck_status tck_sgd_update(tck_stream s, int dtype, void *p, const void *g, void *buf, int64_t n,
                          double lr, double momentum, double wd, bool nesterov);
tck_status tck_adam_update(tck_stream s, int dtype, void *p, const void *g, void *m, void *v,
                           int64_t n, double lr, double b1, double b2, double eps, double wd,
                           bool decoupled, double bc1, double bc2);

#ifdef __cplusplus
}
#endif

#endif
