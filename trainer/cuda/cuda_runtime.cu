/* cuda_runtime: devices, streams, device memory, copies and cuBLAS GEMM behind the plain C
 * interface of trainer/cuda/cuda_kernels.h.
 *
 * Invariants: every CUDA and cuBLAS call is checked and its failure returned as a message
 * (no call here aborts or prints); each call first makes its device current, so callers may
 * hold devices in any order; nothing here keeps state between calls (handles and streams
 * belong to the caller's tr_cuda). cuBLAS is not linked: each blas object loads it for
 * itself (trainer/cuda/cuda_dl.h) and calls it only through its own function table. Copies to or
 * from the host wait for their stream, so the host buffer may be reused when the call
 * returns. */
#include <climits>
#include <cstdlib>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "trainer/cuda/cuda_dl.h"
#include "trainer/cuda/cuda_kernels.h"

#define CU_TRY(call)                                                                               \
  do {                                                                                             \
    cudaError_t cu_err_ = (call);                                                                  \
    if (cu_err_ != cudaSuccess) {                                                                  \
      cudaGetLastError(); /* clear a sticky-free error */                                          \
      return cudaGetErrorString(cu_err_);                                                          \
    }                                                                                              \
  } while (0)

#define BLAS_TRY(blas, call)                                                                       \
  do {                                                                                             \
    cublasStatus_t blas_err_ = (call);                                                             \
    if (blas_err_ != CUBLAS_STATUS_SUCCESS) return (blas)->status_string(blas_err_);               \
  } while (0)

/* cublasGemmEx is overloaded in C++ (cublas_api.h adds an inline wrapper that takes the old
 * cudaDataType compute type), so decltype cannot name it: this picks the exported one, and
 * compiles only while the header declares exactly this signature. */
using blas_gemm_ex_fn = decltype(static_cast<cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
    const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t)>(&cublasGemmEx));

/* The cuBLAS functions used here: (field of tck_blas, function of cublas_v2.h, its type
 * taken from the header's declaration). */
#define BLAS_FUNCTIONS(X)                                                                          \
  X(create, cublasCreate, decltype(&cublasCreate))                                                 \
  X(destroy, cublasDestroy, decltype(&cublasDestroy))                                              \
  X(set_stream, cublasSetStream, decltype(&cublasSetStream))                                       \
  X(sgemm, cublasSgemm, decltype(&cublasSgemm))                                                    \
  X(dgemm, cublasDgemm, decltype(&cublasDgemm))                                                    \
  X(gemm_ex, cublasGemmEx, blas_gemm_ex_fn)                                                        \
  X(status_string, cublasGetStatusString, decltype(&cublasGetStatusString))

/* What tck_blas_new gives (the opaque blas handle): cuBLAS loaded for one engine, its
 * functions, and a cuBLAS handle bound to the engine's stream. */
struct tck_blas {
  void *lib; /* owned dlopen handle of libcublas */
#define BLAS_FIELD(field, fn, type) type field;
  BLAS_FUNCTIONS(BLAS_FIELD)
#undef BLAS_FIELD
  cublasHandle_t handle; /* owned; NULL until made */
  char msg[640];         /* why loading failed: what tck_blas_new then returns */
};

static cudaStream_t stream_of(tck_stream s) { return static_cast<cudaStream_t>(s.stream); }

extern "C" tck_status tck_device_count(int *count) {
  *count = 0;
  int n = 0;
  CU_TRY(cudaGetDeviceCount(&n));
  *count = n;
  return nullptr;
}

extern "C" tck_status tck_device_name(int device, char *name, size_t cap) {
  cudaDeviceProp prop;
  CU_TRY(cudaGetDeviceProperties(&prop, device));
  if (cap > 0) {
    size_t i = 0;
    for (; i + 1 < cap && prop.name[i]; i++) name[i] = prop.name[i];
    name[i] = '\0';
  }
  return nullptr;
}

extern "C" tck_status tck_stream_new(int device, void **stream) {
  *stream = nullptr;
  cudaStream_t st;
  CU_TRY(cudaSetDevice(device));
  /* A blocking stream: ordered with the legacy default stream, which the calls that have no
   * context (tr_get, tr_zero_grad) use. */
  CU_TRY(cudaStreamCreate(&st));
  *stream = st;
  return nullptr;
}

extern "C" tck_status tck_stream_free(int device, void *stream) {
  if (!stream) return nullptr;
  CU_TRY(cudaSetDevice(device));
  CU_TRY(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
  return nullptr;
}

extern "C" tck_status tck_stream_sync(tck_stream s) {
  CU_TRY(cudaSetDevice(s.device));
  CU_TRY(cudaStreamSynchronize(stream_of(s)));
  return nullptr;
}

extern "C" tck_status tck_malloc(int device, size_t nbytes, void **ptr) {
  *ptr = nullptr;
  CU_TRY(cudaSetDevice(device));
  CU_TRY(cudaMalloc(ptr, nbytes));
  return nullptr;
}

extern "C" tck_status tck_free(int device, void *ptr) {
  if (!ptr) return nullptr;
  CU_TRY(cudaSetDevice(device));
  CU_TRY(cudaFree(ptr));
  return nullptr;
}

extern "C" tck_status tck_memcpy(tck_stream s, void *dst, const void *src, size_t nbytes,
                                 int kind) {
  if (nbytes == 0) return nullptr;
  cudaMemcpyKind k = kind == TCK_H2D   ? cudaMemcpyHostToDevice
                     : kind == TCK_D2H ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyDeviceToDevice;
  CU_TRY(cudaSetDevice(s.device));
  CU_TRY(cudaMemcpyAsync(dst, src, nbytes, k, stream_of(s)));
  if (kind != TCK_D2D) CU_TRY(cudaStreamSynchronize(stream_of(s)));
  return nullptr;
}

extern "C" tck_status tck_memset0(tck_stream s, void *dst, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  CU_TRY(cudaSetDevice(s.device));
  CU_TRY(cudaMemsetAsync(dst, 0, nbytes, stream_of(s)));
  return nullptr;
}

/* Loads cuBLAS into b and fills its function table; false with b->msg when it cannot. */
static bool blas_load(tck_blas *b) {
  static const char *const sonames[] = {"libcublas.so.13", "libcublas.so", nullptr};
  b->lib = cuda_dl_open("cuBLAS", sonames, b->msg, sizeof b->msg);
#define BLAS_BIND(field, fn, type)                                                                 \
  &&cuda_dl_sym(b->lib, "cuBLAS", CUDA_DL_NAME(fn), &b->field, b->msg, sizeof b->msg)
  return b->lib BLAS_FUNCTIONS(BLAS_BIND);
#undef BLAS_BIND
}

extern "C" tck_status tck_blas_new(int device, void *stream, void **handle) {
  tck_blas *b = static_cast<tck_blas *>(calloc(1, sizeof *b));
  *handle = b;
  if (!b) return "out of memory";
  /* From here a failure leaves b in *handle: it owns the message returned (b->msg, the
   * library's status strings), which the caller reads before tck_blas_free. */
  if (!blas_load(b)) return b->msg;
  CU_TRY(cudaSetDevice(device));
  cublasHandle_t h;
  BLAS_TRY(b, b->create(&h));
  b->handle = h;
  BLAS_TRY(b, b->set_stream(h, static_cast<cudaStream_t>(stream)));
  return nullptr;
}

extern "C" tck_status tck_blas_free(int device, void *handle) {
  tck_blas *b = static_cast<tck_blas *>(handle);
  if (!b) return nullptr;
  tck_status st = nullptr;
  if (b->handle) {
    cudaError_t rc = cudaSetDevice(device);
    if (rc != cudaSuccess)
      st = cudaGetErrorString(rc);
    else if (cublasStatus_t done = b->destroy(b->handle); done != CUBLAS_STATUS_SUCCESS)
      st = b->status_string(done);
  }
  if (b->lib) dlclose(b->lib);
  free(b);
  return st;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static cudaDataType_t blas_type(int dtype) {
  return dtype == TCK_F64 ? CUDA_R_64F : dtype == TCK_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same buffers with
 * the operands swapped, so no data moves. */
extern "C" tck_status tck_gemm(tck_stream s, void *blas, int ab_dtype, int c_dtype, bool trans_a,
                               bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                               const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                               void *c, int64_t ldc) {
  if (m == 0 || n == 0) return nullptr;
  if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
      !fits_int(ldc))
    return "GEMM sizes exceed cuBLAS's 32-bit int";
  tck_blas *bl = static_cast<tck_blas *>(blas);
  cublasHandle_t h = bl->handle;
  cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CU_TRY(cudaSetDevice(s.device));
  if (ab_dtype == TCK_F32 && c_dtype == TCK_F32) {
    float al = (float)alpha, be = (float)beta;
    BLAS_TRY(bl, bl->sgemm(h, opb, opa, (int)n, (int)m, (int)k, &al, static_cast<const float *>(b),
                         (int)ldb, static_cast<const float *>(a), (int)lda, &be,
                         static_cast<float *>(c), (int)ldc));
  } else if (ab_dtype == TCK_F64 && c_dtype == TCK_F64) {
    BLAS_TRY(bl, bl->dgemm(h, opb, opa, (int)n, (int)m, (int)k, &alpha,
                         static_cast<const double *>(b), (int)ldb, static_cast<const double *>(a),
                         (int)lda, &beta, static_cast<double *>(c), (int)ldc));
  } else if (ab_dtype == TCK_BF16 && (c_dtype == TCK_F32 || c_dtype == TCK_BF16)) {
    /* Mixed precision: bf16 operands, float32 accumulation (and scalars). */
    float al = (float)alpha, be = (float)beta;
    BLAS_TRY(bl, bl->gemm_ex(h, opb, opa, (int)n, (int)m, (int)k, &al, b, CUDA_R_16BF, (int)ldb, a,
                          CUDA_R_16BF, (int)lda, &be, c, blas_type(c_dtype), (int)ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    return "GEMM: unsupported combination of dtypes";
  }
  return nullptr;
}
