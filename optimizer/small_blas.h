/* optimizer/small_blas.h: single-threaded dense kernels for the per-candidate hot path of
 * the acquisition functions (internal to optimizer/).
 *
 * Why not OpenBLAS here: a candidate evaluation is a handful of level-2 operations of a few
 * thousand to a few tens of thousands of flops, repeated thousands of times per suggestion.
 * OpenBLAS hands such sizes to its thread pool, and on a shared 2-core machine waking and
 * joining the threads costs several times the arithmetic (measured: a suggestion at 200
 * observations took 0.9 s with OpenBLAS threads under load, 0.2 s in one thread). The
 * per-suggestion level-3 work (factorisations, baselines) stays with OpenBLAS.
 * All matrices are row-major with a leading dimension; loops run in a fixed order, so
 * results do not depend on threads. Where a loop updates independent outputs (one entry of
 * y or C per lane) it runs SIMD: each output still sums its terms in the same order, so
 * the results are the same to the bit; sums into one output (sb_dot) stay sequential. */
#ifndef NAS_OPTIMIZER_SMALL_BLAS_H
#define NAS_OPTIMIZER_SMALL_BLAS_H

#include <stddef.h>

static inline double sb_dot(size_t n, const double *x, const double *y) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i] * y[i];
  return s;
}

/* y[i·incy] = beta·y[i·incy] + alpha·Σ_j A[i·lda + j] x[j], i < m, j < n. As in BLAS,
 * beta = 0 ignores what y held (which may be uninitialised, even NaN). */
static inline void sb_mv(size_t m, size_t n, double alpha, const double *A, size_t lda,
                         const double *x, double beta, double *y, size_t incy) {
  for (size_t i = 0; i < m; i++) {
    double prior = beta == 0 ? 0.0 : beta * y[i * incy];
    y[i * incy] = prior + alpha * sb_dot(n, A + i * lda, x);
  }
}

/* y[j] = beta·y[j] + alpha·Σ_i A[i·lda + j] x[i·incx], i < m, j < n (beta = 0: as sb_mv). */
static inline void sb_mtv(size_t m, size_t n, double alpha, const double *A, size_t lda,
                          const double *x, size_t incx, double beta, double *y) {
  for (size_t j = 0; j < n; j++) y[j] = beta == 0 ? 0.0 : beta * y[j];
  for (size_t i = 0; i < m; i++) {
    double xi = alpha * x[i * incx];
    const double *row = A + i * lda;
#pragma omp simd
    for (size_t j = 0; j < n; j++) y[j] += xi * row[j];
  }
}

/* B (n×m, ldb) ← L⁻¹ B for the lower-triangular L (n×n, ldl); m = 1 solves a vector. */
static inline void sb_lower_solve(size_t n, size_t m, const double *L, size_t ldl, double *B,
                                  size_t ldb) {
  for (size_t i = 0; i < n; i++) {
    double *bi = B + i * ldb;
    for (size_t p = 0; p < i; p++) {
      double l = L[i * ldl + p];
      const double *bp = B + p * ldb;
#pragma omp simd
      for (size_t j = 0; j < m; j++) bi[j] -= l * bp[j];
    }
    for (size_t j = 0; j < m; j++) bi[j] /= L[i * ldl + i];
  }
}

/* b (n) ← L⁻¹ b for the lower-triangular L given as its transpose U = Lᵀ (n×n, ldu): the
 * operations of sb_lower_solve(n, 1, L, …) in the same order for each entry, so the same
 * result to the bit, but a column of L (a row of U) at a time: the updates of different
 * entries are independent and run SIMD, where solving by rows makes each entry one chain
 * of dependent subtractions. */
static inline void sb_lower_solve_t(size_t n, const double *U, size_t ldu, double *b) {
  for (size_t p = 0; p < n; p++) {
    b[p] /= U[p * ldu + p];
    const double bp = b[p], *row = U + p * ldu;
#pragma omp simd
    for (size_t i = p + 1; i < n; i++) b[i] -= row[i] * bp;
  }
}

/* b (n) ← L⁻ᵀ b for the lower-triangular L (n×n, ldl): back substitution, a row of L (a
 * column of Lᵀ) at a time. */
static inline void sb_lower_transpose_solve(size_t n, const double *L, size_t ldl, double *b) {
  for (size_t i = n; i-- > 0;) {
    b[i] /= L[i * ldl + i];
    const double bi = b[i], *row = L + i * ldl;
#pragma omp simd
    for (size_t p = 0; p < i; p++) b[p] -= row[p] * bi;
  }
}

#endif
