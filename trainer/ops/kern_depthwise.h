/* Grouped (and depthwise) convolution kernels over type T, by direct loops (included twice
 * by ops_depthwise.c through kern_both.h).
 *
 * Geometry g: x (N, C, H, W), kernel KH x KW, stride, padding, output OH x OW (P = OH*OW);
 * w (O, CG, KH, KW) with CG = C / groups input channels per group and OG = O / groups
 * output channels; output channel o reads input channels [o / OG * CG, ... + CG).
 * A depthwise convolution (groups = C, CG = 1) does K*K multiply-adds per output, too few
 * for a GEMM to pay for an im2col copy K*K times the input: here each tap (kh, kw) is one
 * pass over the rows of a plane, vectorised along the output row (stride 1: contiguous in
 * both planes). Planes are small enough (28x28 floats: 3 KB) to stay in L1 over the K*K
 * passes. */

/* The output columns [lo, hi) whose input column ow*stride - pad + kw is inside the image. */
static inline void S(tap_cols)(const conv_geom *g, int64_t kw, int64_t *lo, int64_t *hi) {
  int64_t first = g->pad - kw, last = g->w - 1 + g->pad - kw;
  *lo = first <= 0 ? 0 : (first + g->stride - 1) / g->stride;
  *hi = last < 0 ? 0 : last / g->stride + 1;
  if (*hi > g->ow) *hi = g->ow;
  if (*lo > *hi) *lo = *hi;
}

/* One pass of the k x k filter w between an input plane x (H, W) and an output plane
 * y (OH, OW): forward, y += w applied to x; adjoint, x += w's transpose applied to y (the
 * input gradient, with x = dx and y = dy). The same walk over taps and rows both ways;
 * forward only reads x and the adjoint only reads y, so callers may cast away their const. */
TR_KERNEL static void S(plane_taps)(T *x, T *y, const T *w, const conv_geom *g, bool adjoint) {
  for (int64_t kh = 0; kh < g->kh; kh++)
    for (int64_t kw = 0; kw < g->kw; kw++) {
      const T wv = w[kh * g->kw + kw];
      int64_t lo, hi;
      S(tap_cols)(g, kw, &lo, &hi);
      for (int64_t oh = 0; oh < g->oh; oh++) {
        int64_t ih = oh * g->stride - g->pad + kh;
        if (ih < 0 || ih >= g->h) continue;
        T *in = x + ih * g->w + kw - g->pad, *out = y + oh * g->ow;
        if (g->stride == 1 && adjoint)
#pragma omp simd
          for (int64_t ow = lo; ow < hi; ow++) in[ow] += wv * out[ow];
        else if (g->stride == 1)
#pragma omp simd
          for (int64_t ow = lo; ow < hi; ow++) out[ow] += wv * in[ow];
        else if (adjoint)
          for (int64_t ow = lo; ow < hi; ow++) in[ow * g->stride] += wv * out[ow];
        else
          for (int64_t ow = lo; ow < hi; ow++) out[ow] += wv * in[ow * g->stride];
      }
    }
}

/* dw (KH, KW) += for each tap, the dot product of dy (OH, OW) with the input pixels it saw. */
TR_KERNEL static void S(plane_bwd_weight)(const T *x, const T *dy, T *dw, const conv_geom *g) {
  for (int64_t kh = 0; kh < g->kh; kh++)
    for (int64_t kw = 0; kw < g->kw; kw++) {
      int64_t lo, hi;
      S(tap_cols)(g, kw, &lo, &hi);
      T acc = 0;
      for (int64_t oh = 0; oh < g->oh; oh++) {
        int64_t ih = oh * g->stride - g->pad + kh;
        if (ih < 0 || ih >= g->h) continue;
        const T *src = x + ih * g->w + kw - g->pad, *d = dy + oh * g->ow;
        if (g->stride == 1)
#pragma omp simd reduction(+ : acc)
          for (int64_t ow = lo; ow < hi; ow++) acc += src[ow] * d[ow];
        else
          for (int64_t ow = lo; ow < hi; ow++) acc += src[ow * g->stride] * d[ow];
      }
      dw[kh * g->kw + kw] += acc;
    }
}

/* y (N, O, OH, OW), every element written: per output plane (n, o), its bias (or 0) plus
 * its group's CG input planes through their filters. Planes spread over threads. */
static void S(grouped_fwd)(const void *xv, const void *wv, const void *bv, void *yv,
                           const conv_geom *g, int64_t o, int64_t groups) {
  const T *x = xv, *w = wv, *b = bv;
  T *y = yv;
  int64_t cg = g->c / groups, og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t planes = g->n * o;
  TR_PAR_LOOP(planes, planes * p * cg * kk, { /* i: the output plane (n, oc) */
    int64_t n = i / o, oc = i % o, c0 = oc / og * cg;
    T *yp = y + i * p;
    const T bias = b ? b[oc] : 0;
    for (int64_t j = 0; j < p; j++) yp[j] = bias;
    for (int64_t ci = 0; ci < cg; ci++)
      S(plane_taps)((T *)x + (n * g->c + c0 + ci) * g->h * g->w, yp, w + (oc * cg + ci) * kk, g,
                    false);
  });
}

/* dx (N, C, H, W), every element written: per input plane (n, c), the OG output planes of
 * its group sent back through their filters. */
static void S(grouped_bwd_input)(const void *dyv, const void *wv, void *dxv, const conv_geom *g,
                                 int64_t o, int64_t groups) {
  const T *dy = dyv, *w = wv;
  T *dx = dxv;
  int64_t cg = g->c / groups, og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t planes = g->n * g->c, hw = g->h * g->w;
  TR_PAR_LOOP(planes, planes * p * og * kk, { /* i: the input plane (n, c) */
    int64_t n = i / g->c, c = i % g->c, o0 = c / cg * og, ci = c % cg;
    T *dxp = dx + i * hw;
    memset(dxp, 0, sizeof(T) * (size_t)hw);
    for (int64_t oc = o0; oc < o0 + og; oc++)
      S(plane_taps)(dxp, (T *)dy + (n * o + oc) * p, w + (oc * cg + ci) * kk, g, true);
  });
}

/* dw (O, CG, KH, KW), every element written: per filter (oc, ci), summed over the batch in
 * image order (the same bits on any number of threads). */
static void S(grouped_bwd_weight)(const void *xv, const void *dyv, void *dwv, const conv_geom *g,
                                  int64_t o, int64_t groups) {
  const T *x = xv, *dy = dyv;
  T *dw = dwv;
  int64_t cg = g->c / groups, og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t filters = o * cg;
  TR_PAR_LOOP(filters, filters * g->n * p * kk, { /* i: the filter (oc, ci) */
    int64_t oc = i / cg, c = oc / og * cg + i % cg;
    T *dwf = dw + i * kk;
    memset(dwf, 0, sizeof(T) * (size_t)kk);
    for (int64_t n = 0; n < g->n; n++)
      S(plane_bwd_weight)(x + (n * g->c + c) * g->h * g->w, dy + (n * o + oc) * p, dwf, g);
  });
}
