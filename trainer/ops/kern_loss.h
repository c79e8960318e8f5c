/* Loss kernels over type T (included twice by ops_loss.c). */

/* Cross-entropy forward for logits (N, C): probs = softmax per row (kept for backward);
 * returns the mean over rows of -log probs[label]. */
TR_KERNEL static double S(cross_entropy_fwd)(const void *logitsv, const int32_t *labels,
                                             void *probsv, int64_t rows, int64_t classes) {
  const T *logits = logitsv;
  T *probs = probsv;
  double total = 0;
#pragma omp parallel for reduction(+ : total) TR_PAR(rows *classes)
  for (int64_t r = 0; r < rows; r++) {
    const T *x = logits + r * classes;
    T *p = probs + r * classes;
    T mx = x[0];
    for (int64_t c = 1; c < classes; c++) mx = x[c] > mx ? x[c] : mx;
    T sum = 0;
    for (int64_t c = 0; c < classes; c++) {
      p[c] = exp(x[c] - mx);
      sum += p[c];
    }
    T inv = 1 / sum;
    for (int64_t c = 0; c < classes; c++) p[c] *= inv;
    total += (double)(mx + log(sum) - x[labels[r]]);
  }
  return total / (double)rows;
}

/* dlogits = scale * (probs - onehot(label)), scale = dloss / N. */
TR_KERNEL static void S(cross_entropy_bwd)(const void *probsv, const int32_t *labels, void *dxv,
                                           int64_t rows, int64_t classes, double scale) {
  const T *probs = probsv;
  T *dx = dxv;
  const T sc = (T)scale;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < classes; c++) dx[r * classes + c] = probs[r * classes + c] * sc;
    dx[r * classes + labels[r]] -= sc;
  }
}
