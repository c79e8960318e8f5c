/* Normalisation kernels over type T (included twice by ops_norm.c).
 *
 * Both norms normalise groups of values: layer norm a row of D (contiguous), batch norm a
 * channel's N x L values (x seen as (N, C, L), L = H*W or 1). stats holds per group its
 * mean and 1/sqrt(var + eps) as doubles. The backward of a group with batch statistics is
 *   dxhat = dy * w;  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
 * and with fixed statistics (batch norm in evaluation) just dx = rstd * dxhat. */

/* x (R, D) → y; stats[2r] = mean, stats[2r+1] = rstd. w, b may be NULL. */
TR_KERNEL static void S(layer_norm_fwd)(const void *xv, const void *wv, const void *bv, void *yv,
                                        double *stats, int64_t rows, int64_t d, double eps) {
  const T *x = xv, *w = wv, *b = bv;
  T *y = yv;
#pragma omp parallel for TR_PAR(rows *d)
  for (int64_t r = 0; r < rows; r++) {
    const T *xr = x + r * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; i++) mean += xr[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    double rstd = 1.0 / sqrt(var / (double)d + eps);
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
    for (int64_t i = 0; i < d; i++) {
      T xhat = (T)(((double)xr[i] - mean) * rstd);
      y[r * d + i] = xhat * (w ? w[i] : 1) + (b ? b[i] : 0);
    }
  }
}

TR_KERNEL static void S(layer_norm_bwd)(const void *xv, const void *wv, const void *dyv,
                                        const double *stats, void *dxv, void *dwv, void *dbv,
                                        int64_t rows, int64_t d) {
  const T *x = xv, *w = wv, *dy = dyv;
  T *dx = dxv, *dw = dwv, *db = dbv;
  for (int64_t r = 0; r < rows; r++) {
    const T *xr = x + r * d, *dyr = dy + r * d;
    double mean = stats[2 * r], rstd = stats[2 * r + 1], m1 = 0, m2 = 0;
    for (int64_t i = 0; i < d; i++) {
      double xhat = ((double)xr[i] - mean) * rstd, dxhat = (double)dyr[i] * (w ? w[i] : 1);
      m1 += dxhat;
      m2 += dxhat * xhat;
      if (dw) dw[i] += (T)(dyr[i] * xhat);
      if (db) db[i] += dyr[i];
    }
    m1 /= (double)d;
    m2 /= (double)d;
    if (!dx) continue;
    for (int64_t i = 0; i < d; i++) {
      double xhat = ((double)xr[i] - mean) * rstd, dxhat = (double)dyr[i] * (w ? w[i] : 1);
      dx[r * d + i] = (T)(rstd * (dxhat - m1 - xhat * m2));
    }
  }
}

/* Batch statistics per channel of x (N, C, L): stats[2c] mean, stats[2c+1] rstd; var_out[c]
 * gets the biased variance (for the running estimate). */
TR_KERNEL static void S(batch_norm_stats)(const void *xv, double *stats, double *var_out, int64_t n,
                                          int64_t c, int64_t l, double eps) {
  const T *x = xv;
#pragma omp parallel for TR_PAR(n *c *l)
  for (int64_t ch = 0; ch < c; ch++) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) {
      const T *p = x + (i * c + ch) * l;
      for (int64_t j = 0; j < l; j++) sum += p[j];
    }
    double mean = sum / (double)(n * l);
    for (int64_t i = 0; i < n; i++) {
      const T *p = x + (i * c + ch) * l;
      for (int64_t j = 0; j < l; j++) sq += ((double)p[j] - mean) * ((double)p[j] - mean);
    }
    double var = sq / (double)(n * l);
    stats[2 * ch] = mean;
    stats[2 * ch + 1] = 1.0 / sqrt(var + eps);
    var_out[ch] = var;
  }
}

/* y = (x - mean) * rstd * w + b per channel. */
TR_KERNEL static void S(batch_norm_apply)(const void *xv, const void *wv, const void *bv,
                                          const double *stats, void *yv, int64_t n, int64_t c,
                                          int64_t l) {
  const T *x = xv, *w = wv, *b = bv;
  T *y = yv;
#pragma omp parallel for collapse(2) TR_PAR(n *c *l)
  for (int64_t i = 0; i < n; i++)
    for (int64_t ch = 0; ch < c; ch++) {
      T scale = (T)stats[2 * ch + 1] * (w ? w[ch] : 1);
      T shift = (b ? b[ch] : 0) - (T)stats[2 * ch] * scale;
      const T *p = x + (i * c + ch) * l;
      T *q = y + (i * c + ch) * l;
      for (int64_t j = 0; j < l; j++) q[j] = p[j] * scale + shift;
    }
}

/* training: batch statistics (full formula); else fixed statistics. */
TR_KERNEL static void S(batch_norm_bwd)(const void *xv, const void *wv, const void *dyv,
                                        const double *stats, bool training, void *dxv, void *dwv,
                                        void *dbv, int64_t n, int64_t c, int64_t l) {
  const T *x = xv, *w = wv, *dy = dyv;
  T *dx = dxv, *dw = dwv, *db = dbv;
#pragma omp parallel for TR_PAR(n *c *l)
  for (int64_t ch = 0; ch < c; ch++) {
    double mean = stats[2 * ch], rstd = stats[2 * ch + 1], wc = w ? (double)w[ch] : 1.0;
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t i = 0; i < n; i++) {
      const T *p = x + (i * c + ch) * l, *g = dy + (i * c + ch) * l;
      for (int64_t j = 0; j < l; j++) {
        sum_dy += g[j];
        sum_dy_xhat += g[j] * ((double)p[j] - mean) * rstd;
      }
    }
    if (dw) dw[ch] = (T)sum_dy_xhat;
    if (db) db[ch] = (T)sum_dy;
    if (!dx) continue;
    double cnt = (double)(n * l);
    double m1 = training ? wc * sum_dy / cnt : 0, m2 = training ? wc * sum_dy_xhat / cnt : 0;
    for (int64_t i = 0; i < n; i++) {
      const T *p = x + (i * c + ch) * l, *g = dy + (i * c + ch) * l;
      T *q = dx + (i * c + ch) * l;
      for (int64_t j = 0; j < l; j++) {
        double xhat = ((double)p[j] - mean) * rstd;
        q[j] = (T)(rstd * (wc * g[j] - m1 - xhat * m2));
      }
    }
  }
}
