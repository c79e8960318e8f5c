/* cuda_nocuda: the stand-ins for trainer/cuda_*.cu in a build without nvcc (`make CUDA=0`).
 *
 * Every function of trainer/cuda/cuda_kernels.h fails with "built without CUDA" and writes no
 * output but the NULL or 0 its caller may read, so the C side of the CUDA backend compiles
 * and links the same in both builds and every CUDA path ends in that clear error: no device
 * is ever reported, so no device tensor can exist. */
#include <stddef.h>

#include "trainer/cuda/cuda_kernels.h"

/* The stand-ins ignore their arguments by design: they only say why nothing can run. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

static const char kNoCuda[] =
    "built without CUDA (no nvcc at build time, or make CUDA=0; rebuild with CUDA=1)";

tck_status tck_device_count(int *count) {
  *count = 0;
  return kNoCuda;
}

tck_status tck_device_name(int device, char *name, size_t cap) { return kNoCuda; }

tck_status tck_stream_new(int device, void **stream) {
  *stream = NULL;
  return kNoCuda;
}

tck_status tck_stream_free(int device, void *stream) { return kNoCuda; }

tck_status tck_stream_sync(tck_stream s) { return kNoCuda; }

tck_status tck_malloc(int device, size_t nbytes, void **ptr) {
  *ptr = NULL;
  return kNoCuda;
}

tck_status tck_free(int device, void *ptr) { return kNoCuda; }

tck_status tck_memcpy(tck_stream s, void *dst, const void *src, size_t nbytes, int kind) {
  return kNoCuda;
}

tck_status tck_memset0(tck_stream s, void *dst, size_t nbytes) { return kNoCuda; }

tck_status tck_blas_new(int device, void *stream, void **handle) {
  *handle = NULL;
  return kNoCuda;
}

tck_status tck_blas_free(int device, void *handle) { return kNoCuda; }

tck_status tck_gemm(tck_stream s, void *blas, int ab_dtype, int c_dtype, bool trans_a, bool trans_b,
                    int64_t m, int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                    const void *b, int64_t ldb, double beta, void *c, int64_t ldc) {
  return kNoCuda;
}

tck_status tck_copy(tck_stream s, int sd, const void *src, const tck_layout *sl, int dd, void *dst,
                    const tck_layout *dl, int64_t n) {
  return kNoCuda;
}

tck_status tck_fill(tck_stream s, int dtype, void *x, const tck_layout *xl, int64_t n,
                    double value) {
  return kNoCuda;
}

tck_status tck_axpy(tck_stream s, int dtype, int64_t n, double alpha, const void *x,
                    const tck_layout *xl, void *y, const tck_layout *yl) {
  return kNoCuda;
}

tck_status tck_sumsq(tck_stream s, int dtype, const void *x, int64_t n, double *out) {
  return kNoCuda;
}

tck_status tck_unary_fwd(tck_stream s, int dtype, int op, const void *x, void *y, int64_t n,
                         double sc) {
  return kNoCuda;
}

tck_status tck_unary_bwd(tck_stream s, int dtype, int op, const void *saved, const void *dy,
                         void *dx, int64_t n, double sc) {
  return kNoCuda;
}

tck_status tck_binary(tck_stream s, int dtype, int op, const void *a, const tck_layout *al,
                      const void *b, const tck_layout *bl, void *out, const tck_layout *ol) {
  return kNoCuda;
}

int64_t tck_sum_scratch(int64_t outer, int64_t n, int64_t inner) { return 0; }

tck_status tck_sum_axis(tck_stream s, int dtype, const void *x, void *out, int64_t outer, int64_t n,
                        int64_t inner, double scale, double *scratch) {
  return kNoCuda;
}

tck_status tck_softmax_fwd(tck_stream s, int dtype, const void *x, void *y, int64_t outer,
                           int64_t n, int64_t inner, bool log_out) {
  return kNoCuda;
}

tck_status tck_softmax_bwd(tck_stream s, int dtype, const void *y, const void *dy, void *dx,
                           int64_t outer, int64_t n, int64_t inner, bool log_out) {
  return kNoCuda;
}

tck_status tck_cross_entropy_fwd(tck_stream s, int dtype, const void *logits, const int32_t *labels,
                                 void *probs, void *loss_rows, int64_t rows, int64_t classes) {
  return kNoCuda;
}

tck_status tck_cross_entropy_bwd(tck_stream s, int dtype, const void *probs, const int32_t *labels,
                                 const void *dloss, void *dx, int64_t rows, int64_t classes) {
  return kNoCuda;
}

tck_status tck_layer_norm_fwd(tck_stream s, int dtype, const void *x, const void *w, const void *b,
                              void *y, double *stats, int64_t rows, int64_t d, double eps) {
  return kNoCuda;
}

tck_status tck_layer_norm_bwd(tck_stream s, int dtype, const void *x, const void *w, const void *dy,
                              const double *stats, void *dx, void *dw, void *db, int64_t rows,
                              int64_t d) {
  return kNoCuda;
}

tck_status tck_batch_norm_stats(tck_stream s, int dtype, const void *x, double *stats, double *var,
                                int64_t n, int64_t c, int64_t l, double eps) {
  return kNoCuda;
}

tck_status tck_batch_norm_stats_running(tck_stream s, int dtype, const void *rmean,
                                        const void *rvar, double *stats, int64_t c, double eps) {
  return kNoCuda;
}

tck_status tck_running_update(tck_stream s, int dtype, void *running, const double *values,
                              int64_t stride, double scale, double momentum, int64_t c) {
  return kNoCuda;
}

tck_status tck_batch_norm_apply(tck_stream s, int dtype, const void *x, const void *w,
                                const void *b, const double *stats, void *y, int64_t n, int64_t c,
                                int64_t l) {
  return kNoCuda;
}

tck_status tck_batch_norm_bwd(tck_stream s, int dtype, const void *x, const void *w, const void *dy,
                              const double *stats, bool training, void *dx, void *dw, void *db,
                              int64_t n, int64_t c, int64_t l) {
  return kNoCuda;
}

tck_status tck_im2col(tck_stream s, int dtype, const void *x, void *col, const tck_conv_geom *g) {
  return kNoCuda;
}

tck_status tck_col2im(tck_stream s, int dtype, const void *dcol, void *dx, const tck_conv_geom *g) {
  return kNoCuda;
}

tck_status tck_conv_to_nop(tck_stream s, int dtype, const void *yo, const void *b, void *y,
                           int64_t n, int64_t o, int64_t p) {
  return kNoCuda;
}

tck_status tck_conv_from_nop(tck_stream s, int dtype, const void *dy, void *dyo, int64_t n,
                             int64_t o, int64_t p) {
  return kNoCuda;
}

tck_status tck_pool_fwd(tck_stream s, int dtype, const void *x, void *y, int32_t *argmax,
                        const tck_conv_geom *g, bool is_max) {
  return kNoCuda;
}

tck_status tck_pool_bwd(tck_stream s, int dtype, const void *dy, void *dx, const int32_t *argmax,
                        const tck_conv_geom *g, bool is_max) {
  return kNoCuda;
}

tck_status tck_embedding_fwd(tck_stream s, int dtype, const void *w, const int32_t *ids, void *out,
                             int64_t n, int64_t d) {
  return kNoCuda;
}

tck_status tck_embedding_bwd(tck_stream s, int dtype, const void *dy, const int32_t *ids, void *dw,
                             int64_t n, int64_t v, int64_t d) {
  return kNoCuda;
}

tck_status tck_sgd_update(tck_stream s, int dtype, void *p, const void *g, void *buf, int64_t n,
                          double lr, double momentum, double wd, bool nesterov) {
  return kNoCuda;
}

tck_status tck_adam_update(tck_stream s, int dtype, void *p, const void *g, void *m, void *v,
                           int64_t n, double lr, double b1, double b2, double eps, double wd,
                           bool decoupled, double bc1, double bc2) {
  return kNoCuda;
}
