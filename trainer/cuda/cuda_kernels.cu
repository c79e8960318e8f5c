/* cuda_kernels: the engine's CUDA kernels and their launchers (plain C interface in
 * trainer/cuda/cuda_kernels.h), the device twins of trainer/ops/kern_*.h.
 *
 * Each kernel is a template over the element type T (float, double; bf16 only where the
 * header says so) and computes what its CPU twin computes, with the same formulas, so the
 * two backends agree to rounding. Launchers check their arguments, launch nothing for empty
 * work, and return the launch error as a message.
 *
 * Invariants: every kernel bounds-checks its index (grid-stride loops over exactly the work
 * it was given); grids are capped (kMaxBlocks) and loop, so no size makes an invalid grid;
 * reductions accumulate in double and are deterministic (one block or one thread sums a
 * group in a fixed order: no atomics), so a run repeats bit for bit. */
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "trainer/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 256; /* a power of two: block_sum halves it */
constexpr int64_t kMaxBlocks = 65535;

#define GRID_LOOP(i, n)                                                                            \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
       i += (int64_t)gridDim.x * blockDim.x)

/* The kernels that split a flat index into coordinates (convolution and pooling layouts)
 * take the index type I as a template parameter: int32_t where every index of the call is
 * below kIndex32, else int64_t. The GPU emulates 64-bit division in dozens of instructions,
 * and those kernels do several per element; the bound leaves room for a grid stride past
 * the last index. */
constexpr int64_t kIndex32 = INT64_C(1) << 30;

#define GRID_LOOP_I(I, i, n)                                                                       \
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)(n);                               \
       i += (I)(gridDim.x * blockDim.x))

/* tck_conv_geom in index type I. */
template <class I> struct geom_i {
  I n, c, h, w, kh, kw, stride, pad, oh, ow;
};

template <class I> geom_i<I> geom_as(const tck_conv_geom &g) {
  return {(I)g.n,  (I)g.c,      (I)g.h,   (I)g.w,  (I)g.kh,
          (I)g.kw, (I)g.stride, (I)g.pad, (I)g.oh, (I)g.ow};
}

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

unsigned groups_for(int64_t groups) {
  return (unsigned)(groups < 1 ? 1 : groups > kMaxBlocks ? kMaxBlocks : groups);
}

cudaStream_t stream_of(tck_stream s) { return static_cast<cudaStream_t>(s.stream); }

tck_status begin(tck_stream s) {
  cudaError_t e = cudaSetDevice(s.device);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

tck_status launched() {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

constexpr const char *kBadDtype = "dtype not supported by this kernel (float32, float64)";

/* Calls fn<float> or fn<double> for dtype. */
#define FD(dtype, fn, ...)                                                                         \
  ((dtype) == TCK_F32   ? fn<float>(__VA_ARGS__)                                                   \
   : (dtype) == TCK_F64 ? fn<double>(__VA_ARGS__)                                                  \
                        : kBadDtype)

/* Conversions through double, bf16 included. */
template <class T> __device__ __forceinline__ double to_d(T v) { return (double)v; }
template <> __device__ __forceinline__ double to_d(__nv_bfloat16 v) {
  return (double)__bfloat162float(v);
}
template <class T> __device__ __forceinline__ T from_d(double v) { return (T)v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_d(double v) {
  return __float2bfloat16((float)v);
}

__device__ __forceinline__ float m_exp(float v) { return expf(v); }
__device__ __forceinline__ double m_exp(double v) { return exp(v); }
__device__ __forceinline__ float m_log(float v) { return logf(v); }
__device__ __forceinline__ double m_log(double v) { return log(v); }
__device__ __forceinline__ float m_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double m_tanh(double v) { return tanh(v); }

/* Offset of logical element i under layout l, in index type I (see strided_launch). The
 * outermost coordinate needs no remainder: i over the inner extents' product is below
 * shape[0]. The loop is unrolled over every possible dim: indexed by a variable, a kernel
 * parameter's arrays are copied to each thread's local memory first, which made a bias add
 * over 4M elements 13 times slower than a ReLU over them (H200). */
template <class I> __device__ __forceinline__ I offset_of(const tck_layout &l, I i) {
  I off = 0;
#pragma unroll
  for (int d = TCK_MAX_DIMS - 1; d > 0; d--) {
    if (d >= l.ndim) continue;
    off += (i % (I)l.shape[d]) * (I)l.strides[d];
    i /= (I)l.shape[d];
  }
  return l.ndim > 0 ? off + i * (I)l.strides[0] : off;
}

/* l with its dims of extent 1 dropped and each dim merged into the one outside it where the
 * two walk memory as one (strides[d] == strides[d + 1] * shape[d + 1]): the same offset for
 * every logical index, with fewer divisions per element (none for a contiguous view, which
 * becomes one dim). Each operand of a kernel is compacted on its own, as each maps the same
 * logical index through its own layout. */
tck_layout compact(const tck_layout &l) {
  tck_layout c = {};
  for (int d = 0; d < l.ndim; d++) {
    if (l.shape[d] == 1) continue;
    if (c.ndim > 0 && c.strides[c.ndim - 1] == l.strides[d] * l.shape[d]) {
      c.shape[c.ndim - 1] *= l.shape[d];
      c.strides[c.ndim - 1] = l.strides[d];
    } else {
      c.shape[c.ndim] = l.shape[d];
      c.strides[c.ndim] = l.strides[d];
      c.ndim++;
    }
  }
  return c;
}

/* Whether n elements and every offset under these layouts stay below kIndex32. */
bool fits_index32(int64_t n, std::initializer_list<const tck_layout *> layouts) {
  if (n >= kIndex32) return false;
  for (const tck_layout *l : layouts) {
    int64_t reach = 0;
    for (int d = 0; d < l->ndim; d++)
      reach += (l->shape[d] - 1) * (l->strides[d] < 0 ? -l->strides[d] : l->strides[d]);
    if (reach >= kIndex32) return false;
  }
  return true;
}

/* The strided elementwise kernels (copy, fill, axpy, binary) take their index type I as a
 * template parameter, as the convolution kernels do: launch(I{}) runs with int32_t where
 * fits_index32 allows, else with int64_t, whose division the GPU emulates. */
template <class F> tck_status strided_launch(bool narrow, F launch) {
  return narrow ? launch(int32_t{}) : launch(int64_t{});
}

/* Sum of v over the block (blockDim.x == kThreads), the same value on every thread. */
__device__ double block_sum(double v) {
  __shared__ double shm[kThreads];
  shm[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) shm[threadIdx.x] += shm[threadIdx.x + s];
    __syncthreads();
  }
  double r = shm[0];
  __syncthreads();
  return r;
}

/* ---------------------------------------------------------------- copies, fills, axpy */

template <class S, class D, class I>
__global__ void copy_k(const S *src, tck_layout sl, D *dst, tck_layout dl, I n) {
  GRID_LOOP_I(I, i, n) dst[offset_of(dl, i)] = from_d<D>(to_d(src[offset_of(sl, i)]));
}

template <class S, class D>
tck_status copy_t(tck_stream s, const void *src, const tck_layout *sl, void *dst,
                  const tck_layout *dl, int64_t n) {
  tck_layout sc = compact(*sl), dc = compact(*dl);
  return strided_launch(fits_index32(n, {&sc, &dc}), [&](auto index) {
    using I = decltype(index);
    copy_k<S, D, I><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const S *>(src), sc,
                                                                static_cast<D *>(dst), dc, (I)n);
    return launched();
  });
}

template <class S>
tck_status copy_to(tck_stream s, const void *src, const tck_layout *sl, int dd, void *dst,
                   const tck_layout *dl, int64_t n) {
  switch (dd) {
  case TCK_F32: return copy_t<S, float>(s, src, sl, dst, dl, n);
  case TCK_F64: return copy_t<S, double>(s, src, sl, dst, dl, n);
  case TCK_BF16: return copy_t<S, __nv_bfloat16>(s, src, sl, dst, dl, n);
  }
  return "copy: unknown destination dtype";
}

/* A layout of n contiguous elements, for callers that pass none. */
tck_layout flat_layout(const tck_layout *l, int64_t n) {
  if (l) return *l;
  tck_layout flat = {};
  flat.ndim = 1;
  flat.shape[0] = n;
  flat.strides[0] = 1;
  return flat;
}

template <class T, class I> __global__ void fill_k(T *x, tck_layout xl, I n, T value) {
  GRID_LOOP_I(I, i, n) x[offset_of(xl, i)] = value;
}

template <class T> tck_status fill_t(tck_stream s, void *x, tck_layout xl, int64_t n, T value) {
  tck_layout xc = compact(xl);
  return strided_launch(fits_index32(n, {&xc}), [&](auto index) {
    using I = decltype(index);
    fill_k<T, I><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<T *>(x), xc, (I)n,
                                                               value);
    return launched();
  });
}

template <class T, class I>
__global__ void axpy_k(I n, T alpha, const T *x, tck_layout xl, T *y, tck_layout yl) {
  GRID_LOOP_I(I, i, n) {
    T &dst = y[offset_of(yl, i)];
    dst = x ? dst + alpha * x[offset_of(xl, i)] : dst * alpha;
  }
}

template <class T>
tck_status axpy_t(tck_stream s, int64_t n, double alpha, const void *x, const tck_layout *xl,
                  void *y, const tck_layout *yl) {
  tck_layout xc = compact(flat_layout(xl, n)), yc = compact(flat_layout(yl, n));
  return strided_launch(fits_index32(n, {&xc, &yc}), [&](auto index) {
    using I = decltype(index);
    axpy_k<T, I><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        (I)n, (T)alpha, static_cast<const T *>(x), xc, static_cast<T *>(y), yc);
    return launched();
  });
}

/* One block: deterministic order whatever the grid. */
template <class T> __global__ void sumsq_k(const T *x, int64_t n, double *out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += to_d(x[i]) * to_d(x[i]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = acc;
}

template <class T> tck_status sumsq_t(tck_stream s, const void *x, int64_t n, double *out) {
  sumsq_k<T><<<1, kThreads, 0, stream_of(s)>>>(static_cast<const T *>(x), n, out);
  return launched();
}

/* ---------------------------------------------------------------- elementwise */

template <class T> __device__ __forceinline__ T gelu_inner(T v) {
  const T k0 = (T)0.7978845608028654, k1 = (T)0.044715; /* sqrt(2/pi), GELU's cubic */
  return m_tanh(k0 * (v + k1 * v * v * v));
}

template <class T> __global__ void unary_fwd_k(int op, const T *x, T *y, int64_t n, T sc) {
  GRID_LOOP(i, n) {
    T v = x[i];
    switch (op) {
    case TCK_RELU: y[i] = v > 0 ? v : (T)0; break;
    case TCK_GELU: y[i] = (T)0.5 * v * (1 + gelu_inner(v)); break;
    case TCK_TANH: y[i] = m_tanh(v); break;
    case TCK_SIGMOID: y[i] = 1 / (1 + m_exp(-v)); break;
    case TCK_EXP: y[i] = m_exp(v); break;
    case TCK_LOG: y[i] = m_log(v); break;
    default: y[i] = sc * v; break; /* TCK_SCALE */
    }
  }
}

template <class T>
__global__ void unary_bwd_k(int op, const T *sv, const T *dy, T *dx, int64_t n, T sc) {
  const T k0 = (T)0.7978845608028654, k1 = (T)0.044715;
  GRID_LOOP(i, n) {
    T g = dy[i];
    if (op == TCK_SCALE) {
      dx[i] = g * sc;
      continue;
    }
    T v = sv[i];
    switch (op) {
    case TCK_RELU: dx[i] = v > 0 ? g : (T)0; break;
    case TCK_GELU: {
      T th = gelu_inner(v), du = k0 * (1 + 3 * k1 * v * v);
      dx[i] = g * ((T)0.5 * (1 + th) + (T)0.5 * v * (1 - th * th) * du);
      break;
    }
    case TCK_TANH: dx[i] = g * (1 - v * v); break;
    case TCK_SIGMOID: dx[i] = g * v * (1 - v); break;
    case TCK_EXP: dx[i] = g * v; break;
    default: dx[i] = g / v; break; /* TCK_LOG */
    }
  }
}

template <class T>
tck_status unary_fwd_t(tck_stream s, int op, const void *x, void *y, int64_t n, double sc) {
  unary_fwd_k<T><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(op, static_cast<const T *>(x),
                                                               static_cast<T *>(y), n, (T)sc);
  return launched();
}

template <class T>
tck_status unary_bwd_t(tck_stream s, int op, const void *sv, const void *dy, void *dx, int64_t n,
                       double sc) {
  unary_bwd_k<T><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
      op, static_cast<const T *>(sv), static_cast<const T *>(dy), static_cast<T *>(dx), n, (T)sc);
  return launched();
}

template <class T, class I>
__global__ void binary_k(int op, const T *a, tck_layout al, const T *b, tck_layout bl, T *out,
                         I n) {
  GRID_LOOP_I(I, i, n) {
    T x = a[offset_of(al, i)], y = b[offset_of(bl, i)];
    out[i] = op == TCK_ADD ? x + y : op == TCK_SUB ? x - y : op == TCK_MUL ? x * y : x / y;
  }
}

template <class T>
tck_status binary_t(tck_stream s, int op, const void *a, const tck_layout *al, const void *b,
                    const tck_layout *bl, void *out, int64_t n) {
  tck_layout ac = compact(*al), bc = compact(*bl);
  return strided_launch(fits_index32(n, {&ac, &bc}), [&](auto index) {
    using I = decltype(index);
    binary_k<T, I><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(op, static_cast<const T *>(a), ac,
                                                                 static_cast<const T *>(b), bc,
                                                                 static_cast<T *>(out), (I)n);
    return launched();
  });
}

/* ---------------------------------------------------------------- reductions, softmax */

/* inner == 1: one block per row of n. */
template <class In, class Out>
__global__ void sum_rows_k(const In *x, Out *out, int64_t outer, int64_t n, double scale) {
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    double acc = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) acc += to_d(x[o * n + j]);
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[o] = (Out)(acc * scale);
  }
}

/* Fewer outputs than kFewOutputs cannot fill the device one block or one thread each (a
 * convolution's bias gradient: 16 sums of 700 000), so each output's n elements are cut into
 * chunks of kChunk, one block each (sum_chunks_k); with several chunks the blocks write their
 * sums to a scratch of doubles that one block per output then adds up in order (sum_rows_k). */
constexpr int64_t kFewOutputs = 1024, kChunk = 4096;

/* Chunks per output for the few-outputs path; 0 where the other kernels serve. */
int64_t sum_chunks(int64_t outer, int64_t n, int64_t inner) {
  return outer * inner < kFewOutputs && n >= kThreads ? (n + kChunk - 1) / kChunk : 0;
}

/* Block (c, k): dst[k * gridDim.x + c] = scale * the sum of chunk c of output k = (o, i). */
template <class T, class Out>
__global__ void sum_chunks_k(const T *x, Out *dst, int64_t n, int64_t inner, double scale) {
  int64_t k = blockIdx.y, c = blockIdx.x, end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
  const T *src = x + (k / inner) * n * inner + k % inner;
  double acc = 0;
  for (int64_t j = c * kChunk + threadIdx.x; j < end; j += blockDim.x) acc += to_d(src[j * inner]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) dst[k * gridDim.x + c] = (Out)(acc * scale);
}

/* inner > 1 with many outputs (a linear layer's bias gradient: 4 096 sums down the rows of a
 * 1024 x 4096 matrix). One thread per output summing its whole column left the device mostly
 * idle (385 us for that sum on an H200), so a block takes a tile of kTileCols outputs (next to
 * each other in memory: the loads coalesce) over one chunk of the rows, its kTileRows rows of
 * threads each taking every kTileRows-th row, and adds their sums in a fixed order. The chunk
 * count (tile_chunks) depends on the shape alone, so a sum is the same on every run and
 * device. One chunk: the sums go to out, scaled; several: chunk c's to scratch[c * outputs +
 * k] (doubles), which sum_parts_k adds up in chunk order. */
constexpr int kTileCols = 32, kTileRows = 8;
constexpr int64_t kTileBlocks = 1024;  /* blocks aimed at: several per multiprocessor */
constexpr int64_t kMinChunkRows = 64; /* fewer rows per chunk cost more in partial sums */

int64_t tile_chunks(int64_t outputs, int64_t n) {
  int64_t tiles = (outputs + kTileCols - 1) / kTileCols;
  int64_t wanted = (kTileBlocks + tiles - 1) / tiles, most = (n + kMinChunkRows - 1) / kMinChunkRows;
  int64_t chunks = wanted < most ? wanted : most;
  return chunks < 1 ? 1 : chunks > kMaxBlocks ? kMaxBlocks : chunks;
}

template <class T, class Out>
__global__ void sum_tiles_k(const T *x, Out *dst, int64_t outputs, int64_t n, int64_t inner,
                            int64_t chunk_rows, double scale) {
  __shared__ double part[kTileRows][kTileCols];
  int64_t begin = blockIdx.y * chunk_rows, end = begin + chunk_rows < n ? begin + chunk_rows : n;
  for (int64_t tile = blockIdx.x; tile * kTileCols < outputs; tile += gridDim.x) {
    int64_t k = tile * kTileCols + threadIdx.x;
    double acc = 0;
    if (k < outputs) {
      const T *src = x + (k / inner) * n * inner + k % inner;
      for (int64_t j = begin + threadIdx.y; j < end; j += kTileRows) acc += to_d(src[j * inner]);
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && k < outputs) {
      double sum = 0;
      for (int r = 0; r < kTileRows; r++) sum += part[r][threadIdx.x];
      dst[blockIdx.y * outputs + k] = (Out)(sum * scale);
    }
    __syncthreads();
  }
}

template <class T>
__global__ void sum_parts_k(const double *parts, T *out, int64_t outputs, int64_t chunks,
                            double scale) {
  GRID_LOOP(k, outputs) {
    double acc = 0;
    for (int64_t c = 0; c < chunks; c++) acc += parts[c * outputs + k];
    out[k] = (T)(acc * scale);
  }
}

template <class T>
tck_status sum_tiles_t(tck_stream s, const T *x, T *out, int64_t outputs, int64_t n, int64_t inner,
                       double scale, double *scratch) {
  int64_t chunks = tile_chunks(outputs, n), chunk_rows = (n + chunks - 1) / chunks;
  dim3 grid(groups_for((outputs + kTileCols - 1) / kTileCols), (unsigned)chunks);
  dim3 block(kTileCols, kTileRows);
  if (chunks == 1) {
    sum_tiles_k<T, T><<<grid, block, 0, stream_of(s)>>>(x, out, outputs, n, inner, n, scale);
    return launched();
  }
  if (!scratch) return "sum: no scratch for the tiled sum (tck_sum_scratch)";
  sum_tiles_k<T, double>
      <<<grid, block, 0, stream_of(s)>>>(x, scratch, outputs, n, inner, chunk_rows, 1.0);
  sum_parts_k<T>
      <<<blocks_for(outputs), kThreads, 0, stream_of(s)>>>(scratch, out, outputs, chunks, scale);
  return launched();
}

template <class T>
tck_status sum_axis_t(tck_stream s, const void *xv, void *outv, int64_t outer, int64_t n,
                      int64_t inner, double scale, double *scratch) {
  const T *x = static_cast<const T *>(xv);
  T *out = static_cast<T *>(outv);
  int64_t outputs = outer * inner, chunks = sum_chunks(outer, n, inner);
  if (chunks == 1) {
    sum_chunks_k<T, T><<<dim3(1, (unsigned)outputs), kThreads, 0, stream_of(s)>>>(x, out, n, inner,
                                                                                 scale);
  } else if (chunks > 1) {
    if (!scratch) return "sum: no scratch for the chunked sum (tck_sum_scratch)";
    sum_chunks_k<T, double><<<dim3((unsigned)chunks, (unsigned)outputs), kThreads, 0,
                              stream_of(s)>>>(x, scratch, n, inner, 1.0);
    sum_rows_k<double, T>
        <<<groups_for(outputs), kThreads, 0, stream_of(s)>>>(scratch, out, outputs, chunks, scale);
  } else if (inner == 1)
    sum_rows_k<T, T><<<groups_for(outer), kThreads, 0, stream_of(s)>>>(x, out, outer, n, scale);
  else
    return sum_tiles_t(s, x, out, outputs, n, inner, scale, scratch);
  return launched();
}

/* One thread per softmax row (o, i), as the CPU kernel. */
template <class T>
__global__ void softmax_fwd_k(const T *x, T *y, int64_t outer, int64_t n, int64_t inner,
                              bool log_out) {
  GRID_LOOP(k, outer * inner) {
    int64_t base = (k / inner) * n * inner + k % inner;
    const T *xr = x + base;
    T *yr = y + base;
    T mx = xr[0];
    for (int64_t j = 1; j < n; j++) mx = xr[j * inner] > mx ? xr[j * inner] : mx;
    T sum = 0;
    for (int64_t j = 0; j < n; j++) {
      T e = m_exp(xr[j * inner] - mx);
      yr[j * inner] = e;
      sum += e;
    }
    T lse = m_log(sum), inv = 1 / sum;
    for (int64_t j = 0; j < n; j++)
      yr[j * inner] = log_out ? xr[j * inner] - mx - lse : yr[j * inner] * inv;
  }
}

template <class T>
__global__ void softmax_bwd_k(const T *y, const T *dy, T *dx, int64_t outer, int64_t n,
                              int64_t inner, bool log_out) {
  GRID_LOOP(k, outer * inner) {
    int64_t base = (k / inner) * n * inner + k % inner;
    T acc = 0;
    for (int64_t j = 0; j < n; j++) {
      int64_t q = base + j * inner;
      acc += log_out ? dy[q] : dy[q] * y[q];
    }
    for (int64_t j = 0; j < n; j++) {
      int64_t q = base + j * inner;
      dx[q] = log_out ? dy[q] - m_exp(y[q]) * acc : y[q] * (dy[q] - acc);
    }
  }
}

template <class T>
tck_status softmax_fwd_t(tck_stream s, const void *x, void *y, int64_t outer, int64_t n,
                         int64_t inner, bool log_out) {
  softmax_fwd_k<T><<<blocks_for(outer * inner), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(x), static_cast<T *>(y), outer, n, inner, log_out);
  return launched();
}

template <class T>
tck_status softmax_bwd_t(tck_stream s, const void *y, const void *dy, void *dx, int64_t outer,
                         int64_t n, int64_t inner, bool log_out) {
  softmax_bwd_k<T><<<blocks_for(outer * inner), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(y), static_cast<const T *>(dy), static_cast<T *>(dx), outer, n, inner,
      log_out);
  return launched();
}

/* ---------------------------------------------------------------- cross-entropy */

template <class T>
__global__ void ce_fwd_k(const T *logits, const int32_t *labels, T *probs, T *loss_rows,
                         int64_t rows, int64_t classes) {
  GRID_LOOP(r, rows) {
    const T *x = logits + r * classes;
    T *p = probs + r * classes;
    T mx = x[0];
    for (int64_t c = 1; c < classes; c++) mx = x[c] > mx ? x[c] : mx;
    T sum = 0;
    for (int64_t c = 0; c < classes; c++) {
      p[c] = m_exp(x[c] - mx);
      sum += p[c];
    }
    T inv = 1 / sum;
    for (int64_t c = 0; c < classes; c++) p[c] *= inv;
    int32_t label = labels[r];
    loss_rows[r] = label >= 0 && label < classes ? mx + m_log(sum) - x[label] : (T)NAN;
  }
}

template <class T>
__global__ void ce_bwd_k(const T *probs, const int32_t *labels, const T *dloss, T *dx, int64_t rows,
                         int64_t classes) {
  const T sc = dloss[0] / (T)rows;
  GRID_LOOP(k, rows * classes) {
    int64_t r = k / classes, c = k % classes;
    dx[k] = probs[k] * sc - (labels[r] == c ? sc : (T)0);
  }
}

template <class T>
tck_status ce_fwd_t(tck_stream s, const void *logits, const int32_t *labels, void *probs,
                    void *loss_rows, int64_t rows, int64_t classes) {
  ce_fwd_k<T><<<blocks_for(rows), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(logits), labels, static_cast<T *>(probs), static_cast<T *>(loss_rows),
      rows, classes);
  return launched();
}

template <class T>
tck_status ce_bwd_t(tck_stream s, const void *probs, const int32_t *labels, const void *dloss,
                    void *dx, int64_t rows, int64_t classes) {
  ce_bwd_k<T><<<blocks_for(rows * classes), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(probs), labels, static_cast<const T *>(dloss), static_cast<T *>(dx),
      rows, classes);
  return launched();
}

/* ---------------------------------------------------------------- layer norm */

template <class T>
__global__ void ln_fwd_k(const T *x, const T *w, const T *b, T *y, double *stats, int64_t rows,
                         int64_t d, double eps) {
  GRID_LOOP(r, rows) {
    const T *xr = x + r * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; i++) mean += (double)xr[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    double rstd = 1.0 / sqrt(var / (double)d + eps);
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
    for (int64_t i = 0; i < d; i++) {
      T xhat = (T)(((double)xr[i] - mean) * rstd);
      y[r * d + i] = xhat * (w ? w[i] : (T)1) + (b ? b[i] : (T)0);
    }
  }
}

template <class T>
__global__ void ln_bwd_dx_k(const T *x, const T *w, const T *dy, const double *stats, T *dx,
                            int64_t rows, int64_t d) {
  GRID_LOOP(r, rows) {
    const T *xr = x + r * d, *dyr = dy + r * d;
    double mean = stats[2 * r], rstd = stats[2 * r + 1], m1 = 0, m2 = 0;
    for (int64_t i = 0; i < d; i++) {
      double xhat = ((double)xr[i] - mean) * rstd,
             dxhat = (double)dyr[i] * (w ? (double)w[i] : 1.0);
      m1 += dxhat;
      m2 += dxhat * xhat;
    }
    m1 /= (double)d;
    m2 /= (double)d;
    for (int64_t i = 0; i < d; i++) {
      double xhat = ((double)xr[i] - mean) * rstd,
             dxhat = (double)dyr[i] * (w ? (double)w[i] : 1.0);
      dx[r * d + i] = (T)(rstd * (dxhat - m1 - xhat * m2));
    }
  }
}

/* dw[i] = sum_r dy[r, i] xhat[r, i], db[i] = sum_r dy[r, i]: one thread per column. */
template <class T>
__global__ void ln_bwd_params_k(const T *x, const T *dy, const double *stats, T *dw, T *db,
                                int64_t rows, int64_t d) {
  GRID_LOOP(i, d) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < rows; r++) {
      double g = (double)dy[r * d + i];
      sw += g * (((double)x[r * d + i] - stats[2 * r]) * stats[2 * r + 1]);
      sb += g;
    }
    if (dw) dw[i] = (T)sw;
    if (db) db[i] = (T)sb;
  }
}

template <class T>
tck_status ln_fwd_t(tck_stream s, const void *x, const void *w, const void *b, void *y,
                    double *stats, int64_t rows, int64_t d, double eps) {
  ln_fwd_k<T><<<blocks_for(rows), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(x), static_cast<const T *>(w), static_cast<const T *>(b),
      static_cast<T *>(y), stats, rows, d, eps);
  return launched();
}

template <class T>
tck_status ln_bwd_t(tck_stream s, const void *x, const void *w, const void *dy, const double *stats,
                    void *dx, void *dw, void *db, int64_t rows, int64_t d) {
  const T *xt = static_cast<const T *>(x), *dyt = static_cast<const T *>(dy);
  if (dx) {
    ln_bwd_dx_k<T><<<blocks_for(rows), kThreads, 0, stream_of(s)>>>(
        xt, static_cast<const T *>(w), dyt, stats, static_cast<T *>(dx), rows, d);
    if (tck_status st = launched()) return st;
  }
  if (dw || db) {
    ln_bwd_params_k<T><<<blocks_for(d), kThreads, 0, stream_of(s)>>>(
        xt, dyt, stats, static_cast<T *>(dw), static_cast<T *>(db), rows, d);
    return launched();
  }
  return nullptr;
}

/* ---------------------------------------------------------------- batch norm */

/* One block per channel: two passes (mean, then the centred squares), as the CPU. */
template <class T>
__global__ void bn_stats_k(const T *x, double *stats, double *var_out, int64_t n, int64_t c,
                           int64_t l, double eps) {
  int64_t cnt = n * l;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double sum = 0;
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x)
      sum += (double)x[((k / l) * c + ch) * l + k % l];
    double mean = block_sum(sum) / (double)cnt;
    double sq = 0;
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
      double v = (double)x[((k / l) * c + ch) * l + k % l] - mean;
      sq += v * v;
    }
    double var = block_sum(sq) / (double)cnt;
    if (threadIdx.x == 0) {
      stats[2 * ch] = mean;
      stats[2 * ch + 1] = 1.0 / sqrt(var + eps);
      var_out[ch] = var;
    }
  }
}

template <class T>
__global__ void bn_stats_running_k(const T *rmean, const T *rvar, double *stats, int64_t c,
                                   double eps) {
  GRID_LOOP(ch, c) {
    stats[2 * ch] = (double)rmean[ch];
    stats[2 * ch + 1] = 1.0 / sqrt((double)rvar[ch] + eps);
  }
}

template <class T>
__global__ void running_update_k(T *running, const double *values, int64_t stride, double scale,
                                 double momentum, int64_t c) {
  GRID_LOOP(i, c) {
    running[i] = (T)((1 - momentum) * (double)running[i] + momentum * scale * values[i * stride]);
  }
}

template <class T>
__global__ void bn_apply_k(const T *x, const T *w, const T *b, const double *stats, T *y, int64_t n,
                           int64_t c, int64_t l) {
  GRID_LOOP(k, n * c * l) {
    int64_t ch = (k / l) % c;
    T scale = (T)stats[2 * ch + 1] * (w ? w[ch] : (T)1);
    T shift = (b ? b[ch] : (T)0) - (T)stats[2 * ch] * scale;
    y[k] = x[k] * scale + shift;
  }
}

template <class T>
__global__ void bn_bwd_k(const T *x, const T *w, const T *dy, const double *stats, bool training,
                         T *dx, T *dw, T *db, int64_t n, int64_t c, int64_t l) {
  int64_t cnt = n * l;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double mean = stats[2 * ch], rstd = stats[2 * ch + 1], wc = w ? (double)w[ch] : 1.0;
    double s_dy = 0, s_dy_xhat = 0;
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
      int64_t q = ((k / l) * c + ch) * l + k % l;
      s_dy += (double)dy[q];
      s_dy_xhat += (double)dy[q] * ((double)x[q] - mean) * rstd;
    }
    s_dy = block_sum(s_dy);
    s_dy_xhat = block_sum(s_dy_xhat);
    if (threadIdx.x == 0) {
      if (dw) dw[ch] = (T)s_dy_xhat;
      if (db) db[ch] = (T)s_dy;
    }
    if (!dx) continue;
    double m1 = training ? wc * s_dy / (double)cnt : 0,
           m2 = training ? wc * s_dy_xhat / (double)cnt : 0;
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
      int64_t q = ((k / l) * c + ch) * l + k % l;
      double xhat = ((double)x[q] - mean) * rstd;
      dx[q] = (T)(rstd * (wc * (double)dy[q] - m1 - xhat * m2));
    }
  }
}

template <class T>
tck_status bn_stats_t(tck_stream s, const void *x, double *stats, double *var, int64_t n, int64_t c,
                      int64_t l, double eps) {
  bn_stats_k<T><<<groups_for(c), kThreads, 0, stream_of(s)>>>(static_cast<const T *>(x), stats, var,
                                                              n, c, l, eps);
  return launched();
}

template <class T>
tck_status bn_stats_running_t(tck_stream s, const void *rmean, const void *rvar, double *stats,
                              int64_t c, double eps) {
  bn_stats_running_k<T><<<blocks_for(c), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(rmean), static_cast<const T *>(rvar), stats, c, eps);
  return launched();
}

template <class T>
tck_status running_update_t(tck_stream s, void *running, const double *values, int64_t stride,
                            double scale, double momentum, int64_t c) {
  running_update_k<T><<<blocks_for(c), kThreads, 0, stream_of(s)>>>(
      static_cast<T *>(running), values, stride, scale, momentum, c);
  return launched();
}

template <class T>
tck_status bn_apply_t(tck_stream s, const void *x, const void *w, const void *b,
                      const double *stats, void *y, int64_t n, int64_t c, int64_t l) {
  bn_apply_k<T><<<blocks_for(n * c * l), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(x), static_cast<const T *>(w), static_cast<const T *>(b), stats,
      static_cast<T *>(y), n, c, l);
  return launched();
}

template <class T>
tck_status bn_bwd_t(tck_stream s, const void *x, const void *w, const void *dy, const double *stats,
                    bool training, void *dx, void *dw, void *db, int64_t n, int64_t c, int64_t l) {
  bn_bwd_k<T><<<groups_for(c), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(x), static_cast<const T *>(w), static_cast<const T *>(dy), stats,
      training, static_cast<T *>(dx), static_cast<T *>(dw), static_cast<T *>(db), n, c, l);
  return launched();
}

/* ---------------------------------------------------------------- convolution */

/* col row (c, kh, kw), column (n, oh, ow) = x[n, c, oh*stride - pad + kh, ...] or 0.
 * One thread per column walks the rows of its column, so its only divisions are the two
 * that find (n, oh, ow); neighbouring threads write neighbouring columns of each row. */
template <class T, class I> __global__ void im2col_k(const T *x, T *col, geom_i<I> g) {
  I p = g.oh * g.ow, cols = g.n * p, plane = g.h * g.w;
  GRID_LOOP_I(I, k, cols) {
    I n = k / p, at = k - n * p, oh = at / g.ow, ow = at - oh * g.ow;
    I ih0 = oh * g.stride - g.pad, iw0 = ow * g.stride - g.pad;
    const T *img = x + n * g.c * plane;
    T *dst = col + k;
    for (I c = 0; c < g.c; c++, img += plane)
      for (I ih = ih0; ih < ih0 + g.kh; ih++) {
        bool row_inside = ih >= 0 && ih < g.h;
        for (I iw = iw0; iw < iw0 + g.kw; iw++, dst += cols)
          *dst = row_inside && iw >= 0 && iw < g.w ? img[ih * g.w + iw] : (T)0;
      }
  }
}

/* Gather form of col2im: each input pixel sums the columns that read it (no atomics, so
 * the order is fixed). The kernel rows that reach row ih are kh = (ih + pad) mod stride,
 * then every stride further, from output rows oh = (ih + pad - kh) / stride falling by
 * one each step (the same for columns): no division inside the loops. */
template <class T, class I> __global__ void col2im_k(const T *col, T *dx, geom_i<I> g) {
  I p = g.oh * g.ow, cols = g.n * p, total = g.n * g.c * g.h * g.w;
  GRID_LOOP_I(I, k, total) {
    I rows = k / g.w, iw = k - rows * g.w, planes = rows / g.h, ih = rows - planes * g.h;
    I n = planes / g.c, c = planes - n * g.c;
    I ihp = ih + g.pad, iwp = iw + g.pad;
    const T *src = col + n * p;
    T acc = 0;
    for (I kh = ihp % g.stride, oh = ihp / g.stride; kh < g.kh && oh >= 0; kh += g.stride, oh--) {
      if (oh >= g.oh) continue;
      for (I kw = iwp % g.stride, ow = iwp / g.stride; kw < g.kw && ow >= 0;
           kw += g.stride, ow--) {
        if (ow >= g.ow) continue;
        I row = (c * g.kh + kh) * g.kw + kw;
        acc += src[row * cols + oh * g.ow + ow];
      }
    }
    dx[k] = acc;
  }
}

template <class T, class I>
__global__ void to_nop_k(const T *yo, const T *b, T *y, I n, I o, I p) {
  GRID_LOOP_I(I, k, n * o * p) {
    I rows = k / p, j = k - rows * p, img = rows / o, oc = rows - img * o;
    y[k] = yo[(oc * n + img) * p + j] + (b ? b[oc] : (T)0);
  }
}

template <class T, class I> __global__ void from_nop_k(const T *dy, T *dyo, I n, I o, I p) {
  GRID_LOOP_I(I, k, n * o * p) {
    I rows = k / p, j = k - rows * p, oc = rows / n, img = rows - oc * n;
    dyo[k] = dy[(img * o + oc) * p + j];
  }
}

/* Whether every index of a convolution of g (its input, output and columns) fits int32_t. */
bool conv_fits_i32(const tck_conv_geom *g) {
  return g->n * g->c * g->h * g->w < kIndex32 &&
         g->c * g->kh * g->kw * g->n * g->oh * g->ow < kIndex32;
}

template <class T>
tck_status im2col_t(tck_stream s, const void *x, void *col, const tck_conv_geom *g) {
  int64_t cols = g->n * g->oh * g->ow;
  if (cols == 0 || g->c * g->kh * g->kw == 0) return nullptr;
  const T *src = static_cast<const T *>(x);
  T *dst = static_cast<T *>(col);
  if (conv_fits_i32(g))
    im2col_k<T, int32_t>
        <<<blocks_for(cols), kThreads, 0, stream_of(s)>>>(src, dst, geom_as<int32_t>(*g));
  else
    im2col_k<T, int64_t>
        <<<blocks_for(cols), kThreads, 0, stream_of(s)>>>(src, dst, geom_as<int64_t>(*g));
  return launched();
}

template <class T>
tck_status col2im_t(tck_stream s, const void *col, void *dx, const tck_conv_geom *g) {
  int64_t total = g->n * g->c * g->h * g->w;
  if (total == 0) return nullptr;
  const T *src = static_cast<const T *>(col);
  T *dst = static_cast<T *>(dx);
  if (conv_fits_i32(g))
    col2im_k<T, int32_t>
        <<<blocks_for(total), kThreads, 0, stream_of(s)>>>(src, dst, geom_as<int32_t>(*g));
  else
    col2im_k<T, int64_t>
        <<<blocks_for(total), kThreads, 0, stream_of(s)>>>(src, dst, geom_as<int64_t>(*g));
  return launched();
}

template <class T>
tck_status to_nop_t(tck_stream s, const void *yo, const void *b, void *y, int64_t n, int64_t o,
                    int64_t p) {
  const T *src = static_cast<const T *>(yo), *bias = static_cast<const T *>(b);
  T *dst = static_cast<T *>(y);
  if (n * o * p < kIndex32)
    to_nop_k<T, int32_t><<<blocks_for(n * o * p), kThreads, 0, stream_of(s)>>>(
        src, bias, dst, (int32_t)n, (int32_t)o, (int32_t)p);
  else
    to_nop_k<T, int64_t>
        <<<blocks_for(n * o * p), kThreads, 0, stream_of(s)>>>(src, bias, dst, n, o, p);
  return launched();
}

template <class T>
tck_status from_nop_t(tck_stream s, const void *dy, void *dyo, int64_t n, int64_t o, int64_t p) {
  const T *src = static_cast<const T *>(dy);
  T *dst = static_cast<T *>(dyo);
  if (n * o * p < kIndex32)
    from_nop_k<T, int32_t><<<blocks_for(n * o * p), kThreads, 0, stream_of(s)>>>(
        src, dst, (int32_t)n, (int32_t)o, (int32_t)p);
  else
    from_nop_k<T, int64_t>
        <<<blocks_for(n * o * p), kThreads, 0, stream_of(s)>>>(src, dst, n, o, p);
  return launched();
}

/* ---------------------------------------------------------------- pooling */

/* One thread per output; ties go to the first in row-major window order (as the CPU). */
template <class T, class I>
__global__ void pool_fwd_k(const T *x, T *y, int32_t *argmax, geom_i<I> g, bool is_max) {
  I per = g.oh * g.ow;
  GRID_LOOP_I(I, k, g.n * g.c * per) {
    I plane = k / per, oh = k % per / g.ow, ow = k % g.ow;
    const T *src = x + plane * g.h * g.w;
    I best = (oh * g.stride) * g.w + ow * g.stride;
    T acc = is_max ? src[best] : (T)0;
    for (I kh = 0; kh < g.kh; kh++)
      for (I kw = 0; kw < g.kw; kw++) {
        I idx = (oh * g.stride + kh) * g.w + ow * g.stride + kw;
        if (!is_max) {
          acc += src[idx];
        } else if (src[idx] > acc) {
          acc = src[idx];
          best = idx;
        }
      }
    y[k] = is_max ? acc : acc / (T)(g.kh * g.kw);
    if (is_max) argmax[k] = (int32_t)best;
  }
}

/* Gather form: each input pixel sums the outputs whose window covers it. */
template <class T, class I>
__global__ void pool_bwd_k(const T *dy, T *dx, const int32_t *argmax, geom_i<I> g, bool is_max) {
  I per = g.oh * g.ow, hw = g.h * g.w;
  T inv = 1 / (T)(g.kh * g.kw);
  GRID_LOOP_I(I, k, g.n * g.c * hw) {
    I plane = k / hw, idx = k % hw, ih = idx / g.w, iw = idx % g.w;
    I oh_lo = ih - g.kh + 1 > 0 ? (ih - g.kh + 1 + g.stride - 1) / g.stride : 0;
    I ow_lo = iw - g.kw + 1 > 0 ? (iw - g.kw + 1 + g.stride - 1) / g.stride : 0;
    I oh_hi = ih / g.stride < g.oh - 1 ? ih / g.stride : g.oh - 1;
    I ow_hi = iw / g.stride < g.ow - 1 ? iw / g.stride : g.ow - 1;
    T acc = 0;
    for (I oh = oh_lo; oh <= oh_hi; oh++)
      for (I ow = ow_lo; ow <= ow_hi; ow++) {
        I o = plane * per + oh * g.ow + ow;
        if (!is_max)
          acc += dy[o] * inv;
        else if (argmax[o] == idx)
          acc += dy[o];
      }
    dx[k] = acc;
  }
}

/* Whether every index of a pooling of g (input and output) fits int32_t. */
bool pool_fits_i32(const tck_conv_geom *g) {
  return g->n * g->c * g->h * g->w < kIndex32 && g->n * g->c * g->oh * g->ow < kIndex32;
}

template <class T>
tck_status pool_fwd_t(tck_stream s, const void *x, void *y, int32_t *argmax, const tck_conv_geom *g,
                      bool is_max) {
  int64_t total = g->n * g->c * g->oh * g->ow;
  if (total == 0) return nullptr;
  const T *src = static_cast<const T *>(x);
  T *dst = static_cast<T *>(y);
  if (pool_fits_i32(g))
    pool_fwd_k<T, int32_t><<<blocks_for(total), kThreads, 0, stream_of(s)>>>(
        src, dst, argmax, geom_as<int32_t>(*g), is_max);
  else
    pool_fwd_k<T, int64_t><<<blocks_for(total), kThreads, 0, stream_of(s)>>>(
        src, dst, argmax, geom_as<int64_t>(*g), is_max);
  return launched();
}

template <class T>
tck_status pool_bwd_t(tck_stream s, const void *dy, void *dx, const int32_t *argmax,
                      const tck_conv_geom *g, bool is_max) {
  int64_t total = g->n * g->c * g->h * g->w;
  if (total == 0) return nullptr;
  const T *src = static_cast<const T *>(dy);
  T *dst = static_cast<T *>(dx);
  if (pool_fits_i32(g))
    pool_bwd_k<T, int32_t><<<blocks_for(total), kThreads, 0, stream_of(s)>>>(
        src, dst, argmax, geom_as<int32_t>(*g), is_max);
  else
    pool_bwd_k<T, int64_t><<<blocks_for(total), kThreads, 0, stream_of(s)>>>(
        src, dst, argmax, geom_as<int64_t>(*g), is_max);
  return launched();
}

/* ---------------------------------------------------------------- embedding */

template <class T>
__global__ void embedding_fwd_k(const T *w, const int32_t *ids, T *out, int64_t n, int64_t d) {
  GRID_LOOP(k, n * d) out[k] = w[(int64_t)ids[k / d] * d + k % d];
}

/* One thread per column: rows are summed in id order (deterministic, no atomics). */
template <class T>
__global__ void embedding_bwd_k(const T *dy, const int32_t *ids, T *dw, int64_t n, int64_t d) {
  GRID_LOOP(j, d) {
    for (int64_t i = 0; i < n; i++) dw[(int64_t)ids[i] * d + j] += dy[i * d + j];
  }
}

template <class T>
tck_status embedding_fwd_t(tck_stream s, const void *w, const int32_t *ids, void *out, int64_t n,
                           int64_t d) {
  embedding_fwd_k<T><<<blocks_for(n * d), kThreads, 0, stream_of(s)>>>(
      static_cast<const T *>(w), ids, static_cast<T *>(out), n, d);
  return launched();
}

template <class T>
tck_status embedding_bwd_t(tck_stream s, const void *dy, const int32_t *ids, void *dw, int64_t n,
                           int64_t v, int64_t d) {
  cudaError_t e = cudaMemsetAsync(dw, 0, sizeof(T) * (size_t)(v * d), stream_of(s));
  if (e != cudaSuccess) return cudaGetErrorString(e);
  if (n == 0) return nullptr;
  embedding_bwd_k<T><<<blocks_for(d), kThreads, 0, stream_of(s)>>>(static_cast<const T *>(dy), ids,
                                                                   static_cast<T *>(dw), n, d);
  return launched();
}

/* ---------------------------------------------------------------- optimisers */

template <class T>
__global__ void sgd_k(T *p, const T *grad, T *buf, int64_t n, T lr, T mo, T wd, T from_g,
                      T from_buf) {
  GRID_LOOP(i, n) {
    T g = grad[i] + wd * p[i];
    if (!buf) {
      p[i] -= lr * g;
      continue;
    }
    T b = mo * buf[i] + g;
    buf[i] = b;
    p[i] -= lr * (from_g * g + from_buf * b);
  }
}

template <class T>
__global__ void adam_k(T *p, const T *grad, T *m, T *v, int64_t n, T b1, T b2, T eps, T step,
                       T inv_sqrt_bc2, T decay, T coupled) {
  GRID_LOOP(i, n) {
    T g = grad[i] + coupled * p[i];
    p[i] *= decay;
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    p[i] -= step * m[i] / (sqrt(v[i]) * inv_sqrt_bc2 + eps);
  }
}

template <class T>
tck_status sgd_t(tck_stream s, void *p, const void *g, void *buf, int64_t n, double lr,
                 double momentum, double wd, bool nesterov) {
  sgd_k<T><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
      static_cast<T *>(p), static_cast<const T *>(g), static_cast<T *>(buf), n, (T)lr, (T)momentum,
      (T)wd, nesterov ? (T)1 : (T)0, nesterov ? (T)momentum : (T)1);
  return launched();
}

template <class T>
tck_status adam_t(tck_stream s, void *p, const void *g, void *m, void *v, int64_t n, double lr,
                  double b1, double b2, double eps, double wd, bool decoupled, double bc1,
                  double bc2) {
  adam_k<T><<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
      static_cast<T *>(p), static_cast<const T *>(g), static_cast<T *>(m), static_cast<T *>(v), n,
      (T)b1, (T)b2, (T)eps, (T)(lr / bc1), (T)(1.0 / sqrt(bc2)),
      decoupled ? (T)(1 - lr * wd) : (T)1, decoupled ? (T)0 : (T)wd);
  return launched();
}

bool is_contiguous(const tck_layout *l) {
  int64_t expect = 1;
  for (int d = l->ndim - 1; d >= 0; d--) {
    if (l->shape[d] != 1 && l->strides[d] != expect) return false;
    expect *= l->shape[d];
  }
  return true;
}

size_t dtype_size(int dtype) { return dtype == TCK_F64 ? 8 : dtype == TCK_BF16 ? 2 : 4; }

} // namespace

/* ---------------------------------------------------------------- the C interface */

/* Every launcher: make the device current, launch nothing for empty work, then dispatch. */
#define BEGIN(s, n)                                                                                \
  do {                                                                                             \
    if ((n) <= 0) return nullptr;                                                                  \
    if (tck_status st_ = begin(s)) return st_;                                                     \
  } while (0)

extern "C" tck_status tck_copy(tck_stream s, int sd, const void *src, const tck_layout *sl, int dd,
                               void *dst, const tck_layout *dl, int64_t n) {
  BEGIN(s, n);
  if (sd == dd && is_contiguous(sl) && is_contiguous(dl)) {
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * dtype_size(sd), cudaMemcpyDeviceToDevice,
                                    stream_of(s));
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  switch (sd) {
  case TCK_F32: return copy_to<float>(s, src, sl, dd, dst, dl, n);
  case TCK_F64: return copy_to<double>(s, src, sl, dd, dst, dl, n);
  case TCK_BF16: return copy_to<__nv_bfloat16>(s, src, sl, dd, dst, dl, n);
  }
  return "copy: unknown source dtype";
}

extern "C" tck_status tck_fill(tck_stream s, int dtype, void *x, const tck_layout *xl, int64_t n,
                               double value) {
  BEGIN(s, n);
  tck_layout l = flat_layout(xl, n);
  if (dtype == TCK_F32) return fill_t<float>(s, x, l, n, (float)value);
  if (dtype == TCK_F64) return fill_t<double>(s, x, l, n, value);
  return fill_t<__nv_bfloat16>(s, x, l, n, __float2bfloat16((float)value));
}

extern "C" tck_status tck_axpy(tck_stream s, int dtype, int64_t n, double alpha, const void *x,
                               const tck_layout *xl, void *y, const tck_layout *yl) {
  BEGIN(s, n);
  return FD(dtype, axpy_t, s, n, alpha, x, xl, y, yl);
}

extern "C" tck_status tck_sumsq(tck_stream s, int dtype, const void *x, int64_t n, double *out) {
  if (tck_status st = begin(s)) return st;
  return FD(dtype, sumsq_t, s, x, n, out); /* n == 0 still writes the 0 */
}

extern "C" tck_status tck_unary_fwd(tck_stream s, int dtype, int op, const void *x, void *y,
                                    int64_t n, double sc) {
  BEGIN(s, n);
  return FD(dtype, unary_fwd_t, s, op, x, y, n, sc);
}

extern "C" tck_status tck_unary_bwd(tck_stream s, int dtype, int op, const void *saved,
                                    const void *dy, void *dx, int64_t n, double sc) {
  BEGIN(s, n);
  return FD(dtype, unary_bwd_t, s, op, saved, dy, dx, n, sc);
}

extern "C" tck_status tck_binary(tck_stream s, int dtype, int op, const void *a,
                                 const tck_layout *al, const void *b, const tck_layout *bl,
                                 void *out, const tck_layout *ol) {
  int64_t n = 1;
  for (int d = 0; d < ol->ndim; d++) n *= ol->shape[d];
  BEGIN(s, n);
  return FD(dtype, binary_t, s, op, a, al, b, bl, out, n);
}

extern "C" int64_t tck_sum_scratch(int64_t outer, int64_t n, int64_t inner) {
  int64_t outputs = outer * inner, chunks = sum_chunks(outer, n, inner);
  if (chunks == 0 && inner > 1) chunks = tile_chunks(outputs, n); /* sum_tiles_t's path */
  return chunks > 1 ? outputs * chunks : 0;
}

extern "C" tck_status tck_sum_axis(tck_stream s, int dtype, const void *x, void *out, int64_t outer,
                                   int64_t n, int64_t inner, double scale, double *scratch) {
  BEGIN(s, outer * inner);
  return FD(dtype, sum_axis_t, s, x, out, outer, n, inner, scale, scratch);
}

extern "C" tck_status tck_softmax_fwd(tck_stream s, int dtype, const void *x, void *y,
                                      int64_t outer, int64_t n, int64_t inner, bool log_out) {
  BEGIN(s, outer * inner * n);
  return FD(dtype, softmax_fwd_t, s, x, y, outer, n, inner, log_out);
}

extern "C" tck_status tck_softmax_bwd(tck_stream s, int dtype, const void *y, const void *dy,
                                      void *dx, int64_t outer, int64_t n, int64_t inner,
                                      bool log_out) {
  BEGIN(s, outer * inner * n);
  return FD(dtype, softmax_bwd_t, s, y, dy, dx, outer, n, inner, log_out);
}

extern "C" tck_status tck_cross_entropy_fwd(tck_stream s, int dtype, const void *logits,
                                            const int32_t *labels, void *probs, void *loss_rows,
                                            int64_t rows, int64_t classes) {
  BEGIN(s, rows * classes);
  return FD(dtype, ce_fwd_t, s, logits, labels, probs, loss_rows, rows, classes);
}

extern "C" tck_status tck_cross_entropy_bwd(tck_stream s, int dtype, const void *probs,
                                            const int32_t *labels, const void *dloss, void *dx,
                                            int64_t rows, int64_t classes) {
  BEGIN(s, rows * classes);
  return FD(dtype, ce_bwd_t, s, probs, labels, dloss, dx, rows, classes);
}

extern "C" tck_status tck_layer_norm_fwd(tck_stream s, int dtype, const void *x, const void *w,
                                         const void *b, void *y, double *stats, int64_t rows,
                                         int64_t d, double eps) {
  BEGIN(s, rows * d);
  return FD(dtype, ln_fwd_t, s, x, w, b, y, stats, rows, d, eps);
}

extern "C" tck_status tck_layer_norm_bwd(tck_stream s, int dtype, const void *x, const void *w,
                                         const void *dy, const double *stats, void *dx, void *dw,
                                         void *db, int64_t rows, int64_t d) {
  BEGIN(s, rows * d);
  return FD(dtype, ln_bwd_t, s, x, w, dy, stats, dx, dw, db, rows, d);
}

extern "C" tck_status tck_batch_norm_stats(tck_stream s, int dtype, const void *x, double *stats,
                                           double *var, int64_t n, int64_t c, int64_t l,
                                           double eps) {
  BEGIN(s, n * c * l);
  return FD(dtype, bn_stats_t, s, x, stats, var, n, c, l, eps);
}

extern "C" tck_status tck_batch_norm_stats_running(tck_stream s, int dtype, const void *rmean,
                                                   const void *rvar, double *stats, int64_t c,
                                                   double eps) {
  BEGIN(s, c);
  return FD(dtype, bn_stats_running_t, s, rmean, rvar, stats, c, eps);
}

extern "C" tck_status tck_running_update(tck_stream s, int dtype, void *running,
                                         const double *values, int64_t stride, double scale,
                                         double momentum, int64_t c) {
  BEGIN(s, c);
  return FD(dtype, running_update_t, s, running, values, stride, scale, momentum, c);
}

extern "C" tck_status tck_batch_norm_apply(tck_stream s, int dtype, const void *x, const void *w,
                                           const void *b, const double *stats, void *y, int64_t n,
                                           int64_t c, int64_t l) {
  BEGIN(s, n * c * l);
  return FD(dtype, bn_apply_t, s, x, w, b, stats, y, n, c, l);
}

extern "C" tck_status tck_batch_norm_bwd(tck_stream s, int dtype, const void *x, const void *w,
                                         const void *dy, const double *stats, bool training,
                                         void *dx, void *dw, void *db, int64_t n, int64_t c,
                                         int64_t l) {
  BEGIN(s, n * c * l);
  return FD(dtype, bn_bwd_t, s, x, w, dy, stats, training, dx, dw, db, n, c, l);
}

extern "C" tck_status tck_im2col(tck_stream s, int dtype, const void *x, void *col,
                                 const tck_conv_geom *g) {
  BEGIN(s, 1);
  return FD(dtype, im2col_t, s, x, col, g);
}

extern "C" tck_status tck_col2im(tck_stream s, int dtype, const void *dcol, void *dx,
                                 const tck_conv_geom *g) {
  BEGIN(s, 1);
  return FD(dtype, col2im_t, s, dcol, dx, g);
}

extern "C" tck_status tck_conv_to_nop(tck_stream s, int dtype, const void *yo, const void *b,
                                      void *y, int64_t n, int64_t o, int64_t p) {
  BEGIN(s, n * o * p);
  return FD(dtype, to_nop_t, s, yo, b, y, n, o, p);
}

extern "C" tck_status tck_conv_from_nop(tck_stream s, int dtype, const void *dy, void *dyo,
                                        int64_t n, int64_t o, int64_t p) {
  BEGIN(s, n * o * p);
  return FD(dtype, from_nop_t, s, dy, dyo, n, o, p);
}

extern "C" tck_status tck_pool_fwd(tck_stream s, int dtype, const void *x, void *y, int32_t *argmax,
                                   const tck_conv_geom *g, bool is_max) {
  BEGIN(s, 1);
  if (is_max && !argmax) return "max pool: no argmax buffer";
  return FD(dtype, pool_fwd_t, s, x, y, argmax, g, is_max);
}

extern "C" tck_status tck_pool_bwd(tck_stream s, int dtype, const void *dy, void *dx,
                                   const int32_t *argmax, const tck_conv_geom *g, bool is_max) {
  BEGIN(s, 1);
  if (is_max && !argmax) return "max pool: no argmax buffer";
  return FD(dtype, pool_bwd_t, s, dy, dx, argmax, g, is_max);
}

extern "C" tck_status tck_embedding_fwd(tck_stream s, int dtype, const void *w, const int32_t *ids,
                                        void *out, int64_t n, int64_t d) {
  BEGIN(s, n * d);
  return FD(dtype, embedding_fwd_t, s, w, ids, out, n, d);
}

extern "C" tck_status tck_embedding_bwd(tck_stream s, int dtype, const void *dy, const int32_t *ids,
                                        void *dw, int64_t n, int64_t v, int64_t d) {
  BEGIN(s, v * d);
  return FD(dtype, embedding_bwd_t, s, dy, ids, dw, n, v, d);
}

extern "C" tck_status tck_sgd_update(tck_stream s, int dtype, void *p, const void *g, void *buf,
                                     int64_t n, double lr, double momentum, double wd,
                                     bool nesterov) {
  BEGIN(s, n);
  return FD(dtype, sgd_t, s, p, g, buf, n, lr, momentum, wd, nesterov);
}

extern "C" tck_status tck_adam_update(tck_stream s, int dtype, void *p, const void *g, void *m,
                                      void *v, int64_t n, double lr, double b1, double b2,
                                      double eps, double wd, bool decoupled, double bc1,
                                      double bc2) {
  BEGIN(s, n);
  return FD(dtype, adam_t, s, p, g, m, v, n, lr, b1, b2, eps, wd, decoupled, bc1, bc2);
}
