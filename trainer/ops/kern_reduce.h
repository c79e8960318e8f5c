/* Reduction kernels over type T (included twice by ops_reduce.c). Inputs are contiguous and
 * seen as (outer, n, inner) around the reduced dim: element (o, j, i) at (o * n + j) * inner + i.
 */

/* out[o, i] = scale * sum_j x[o, j, i]. */
TR_KERNEL static void S(sum_axis)(const void *xv, void *outv, int64_t outer, int64_t n,
                                  int64_t inner, double scale) {
  const T *x = xv;
  T *out = outv;
  const T sc = (T)scale;
#pragma omp parallel for TR_PAR(outer > 1 ? outer * n * inner : 0)
  for (int64_t o = 0; o < outer; o++) {
    T *row = out + o * inner;
    const T *src = x + o * n * inner;
    if (inner == 1) {
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < n; j++) acc += src[j];
      row[0] = acc * sc;
      continue;
    }
    for (int64_t i = 0; i < inner; i++) row[i] = 0;
    for (int64_t j = 0; j < n; j++)
#pragma omp simd
      for (int64_t i = 0; i < inner; i++) row[i] += src[j * inner + i];
    for (int64_t i = 0; i < inner; i++) row[i] *= sc;
  }
}

/* Softmax (log_softmax when log) along the middle dim. */
TR_KERNEL static void S(softmax_fwd)(const void *xv, void *yv, int64_t outer, int64_t n,
                                     int64_t inner, bool log_out) {
  const T *x = xv;
  T *y = yv;
#pragma omp parallel for TR_PAR(outer *n *inner)
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t i = 0; i < inner; i++) {
      const T *xr = x + o * n * inner + i;
      T *yr = y + o * n * inner + i;
      T mx = xr[0];
      for (int64_t j = 1; j < n; j++) mx = xr[j * inner] > mx ? xr[j * inner] : mx;
      T sum = 0;
      for (int64_t j = 0; j < n; j++) {
        T e = exp(xr[j * inner] - mx);
        yr[j * inner] = e;
        sum += e;
      }
      if (log_out) {
        T lse = log(sum);
        for (int64_t j = 0; j < n; j++) yr[j * inner] = xr[j * inner] - mx - lse;
      } else {
        T inv = 1 / sum;
        for (int64_t j = 0; j < n; j++) yr[j * inner] *= inv;
      }
    }
  }
}

/* softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy). */
TR_KERNEL static void S(softmax_bwd)(const void *yv, const void *dyv, void *dxv, int64_t outer,
                                     int64_t n, int64_t inner, bool log_out) {
  const T *y = yv, *dy = dyv;
  T *dx = dxv;
#pragma omp parallel for TR_PAR(outer *n *inner)
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * n * inner + i;
      T acc = 0;
      for (int64_t j = 0; j < n; j++)
        acc += log_out ? dy[base + j * inner] : dy[base + j * inner] * y[base + j * inner];
      for (int64_t j = 0; j < n; j++) {
        int64_t k = base + j * inner;
        dx[k] = log_out ? dy[k] - exp(y[k]) * acc : y[k] * (dy[k] - acc);
      }
    }
  }
}
