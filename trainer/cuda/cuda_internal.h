/* cuda_internal: what the C files of the CUDA backend (trainer/cuda/cuda*.c) share: the engine
 * struct, argument checks, kernel-status conversion, layouts and small tensor helpers. */
#ifndef NAS_TRAINER_CUDA_INTERNAL_H
#define NAS_TRAINER_CUDA_INTERNAL_H

#include "trainer/cuda/cuda_ops.h"

/* The engine of one device (public as the opaque tr_cuda). */
struct tr_cuda {
  int device;
  void *stream;        /* owned cudaStream_t: all of this engine's work */
  void *blas;          /* owned tck_blas_new object (cuBLAS loaded for this engine), bound to stream */
  tr_allocator *alloc; /* owned reference: device memory for tensors */
  bool autocast_bf16;  /* mixed precision for the GEMMs (tr_cuda_set_autocast) */
};

/* ctx's stream (ctx->cuda must be set: tc_check first). */
static inline tck_stream tc_stream(const tr_ctx *ctx) {
  return (tck_stream){ctx->cuda->device, ctx->cuda->stream};
}
/* The legacy default stream of t's device, for calls without a ctx. */
static inline tck_stream tc_stream_of(const tr_tensor *t) {
  return (tck_stream){t->storage->device.index, NULL};
}

/* NAS_OK when st is NULL, else an error "cuda <what>: <st>" in ctx->err. */
int tc_ok(tr_ctx *ctx, const char *what, tck_status st);
/* t's layout for the kernels (shape and strides). */
tck_layout tc_layout(const tr_tensor *t);
tr_tensor *tc_empty_meta(tr_ctx *ctx, tr_dtype dtype, const tr_meta *m);
tr_tensor *tc_empty_like(tr_ctx *ctx, const tr_tensor *t);
static inline const int32_t *tc_i32(const tr_tensor *t) { return (const int32_t *)tr_data(t); }
/* "cpu" or "cuda:N" into buf. */
const char *tc_device_str(tr_device d, char *buf, size_t cap);

#endif
