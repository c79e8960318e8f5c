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

/* Stride 1, the wide layout: with the input plane padded into xp (HP = H + 2 pad rows of
 * WP = W + 2 pad, then KW - 1 zeros of slack) and the output kept as OH rows of WP values,
 * the first OW of each real, tap (kh, kw) is one flat pass over OH*WP values:
 * yw[j] += w * xp[j + kh*WP + kw]. No row is too short for the vector units (a 14-wide
 * map's rows are 14 values; a 3x3 tap's pass here is 224), at the price of computing
 * WP - OW columns that are thrown away. A thread's scratch holds xp and one wide plane. */
static inline int64_t S(wide_row)(const conv_geom *g) { return g->w + 2 * g->pad; }
static inline int64_t S(padded_len)(const conv_geom *g) {
  return (g->h + 2 * g->pad) * S(wide_row)(g) + g->kw;
}
static inline int64_t S(wide_len)(const conv_geom *g) { return g->oh * S(wide_row)(g); }

/* xp = the plane x with pad zeros around it (and the slack zeroed). */
static inline void S(pad_plane)(const T *x, T *xp, const conv_geom *g) {
  int64_t wp = S(wide_row)(g);
  memset(xp, 0, sizeof(T) * (size_t)S(padded_len)(g));
  for (int64_t r = 0; r < g->h; r++)
    memcpy(xp + (r + g->pad) * wp + g->pad, x + r * g->w, sizeof(T) * (size_t)g->w);
}

/* yw = the plane y in wide rows, the columns past OW zero. */
static inline void S(widen_plane)(const T *y, T *yw, const conv_geom *g) {
  int64_t wp = S(wide_row)(g);
  for (int64_t r = 0; r < g->oh; r++) {
    memcpy(yw + r * wp, y + r * g->ow, sizeof(T) * (size_t)g->ow);
    memset(yw + r * wp + g->ow, 0, sizeof(T) * (size_t)(wp - g->ow));
  }
}

/* Forward (yw += w applied to xp) or adjoint (xp += w's transpose applied to yw) of the
 * k x k filter in the wide layout. */
TR_KERNEL static void S(wide_taps)(T *xp, T *yw, const T *w, const conv_geom *g, bool adjoint) {
  int64_t wp = S(wide_row)(g), len = S(wide_len)(g);
  for (int64_t kh = 0; kh < g->kh; kh++)
    for (int64_t kw = 0; kw < g->kw; kw++) {
      const T wv = w[kh * g->kw + kw];
      T *in = xp + kh * wp + kw;
      if (adjoint)
#pragma omp simd
        for (int64_t j = 0; j < len; j++) in[j] += wv * yw[j];
      else
#pragma omp simd
        for (int64_t j = 0; j < len; j++) yw[j] += wv * in[j];
    }
}

/* dw (KH, KW) += per tap the dot product of the padded input xp with the wide output
 * gradient dyw (zero past OW in each row, so the thrown-away columns add nothing). */
TR_KERNEL static void S(wide_weight_grad)(const T *xp, const T *dyw, T *dw, const conv_geom *g) {
  int64_t wp = S(wide_row)(g), len = S(wide_len)(g);
  for (int64_t kh = 0; kh < g->kh; kh++)
    for (int64_t kw = 0; kw < g->kw; kw++) {
      const T *in = xp + kh * wp + kw;
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < len; j++) acc += in[j] * dyw[j];
      dw[kh * g->kw + kw] += acc;
    }
}

/* Output plane i = (n, oc) of grouped_fwd: its bias, plus its group's input planes through
 * their filters; wide when scratch is given (stride 1). */
static void S(fwd_plane)(const T *x, const T *w, const T *b, T *y, const conv_geom *g, int64_t o,
                         int64_t groups, int64_t i, T *scratch) {
  int64_t cg = g->c / groups, og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t n = i / o, oc = i % o, c0 = oc / og * cg, hw = g->h * g->w;
  const T bias = b ? b[oc] : 0;
  T *yp = y + i * p;
  if (!scratch) {
    for (int64_t j = 0; j < p; j++) yp[j] = bias;
    for (int64_t ci = 0; ci < cg; ci++)
      S(plane_taps)((T *)x + (n * g->c + c0 + ci) * hw, yp, w + (oc * cg + ci) * kk, g, false);
    return;
  }
  T *xp = scratch, *yw = scratch + S(padded_len)(g);
  int64_t wp = S(wide_row)(g);
  memset(yw, 0, sizeof(T) * (size_t)S(wide_len)(g));
  for (int64_t ci = 0; ci < cg; ci++) {
    S(pad_plane)(x + (n * g->c + c0 + ci) * hw, xp, g);
    S(wide_taps)(xp, yw, w + (oc * cg + ci) * kk, g, false);
  }
  for (int64_t r = 0; r < g->oh; r++)
    for (int64_t j = 0; j < g->ow; j++) yp[r * g->ow + j] = bias + yw[r * wp + j];
}

/* Input plane i = (n, c) of grouped_bwd_input, every value written. */
static void S(bwd_input_plane)(const T *dy, const T *w, T *dx, const conv_geom *g, int64_t o,
                               int64_t groups, int64_t i, T *scratch) {
  int64_t cg = g->c / groups, og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t n = i / g->c, c = i % g->c, o0 = c / cg * og, ci = c % cg, hw = g->h * g->w;
  T *dxp = dx + i * hw;
  if (!scratch) {
    memset(dxp, 0, sizeof(T) * (size_t)hw);
    for (int64_t oc = o0; oc < o0 + og; oc++)
      S(plane_taps)(dxp, (T *)dy + (n * o + oc) * p, w + (oc * cg + ci) * kk, g, true);
    return;
  }
  T *xp = scratch, *dyw = scratch + S(padded_len)(g);
  int64_t wp = S(wide_row)(g);
  memset(xp, 0, sizeof(T) * (size_t)S(padded_len)(g));
  for (int64_t oc = o0; oc < o0 + og; oc++) {
    S(widen_plane)(dy + (n * o + oc) * p, dyw, g);
    S(wide_taps)(xp, dyw, w + (oc * cg + ci) * kk, g, true);
  }
  for (int64_t r = 0; r < g->h; r++)
    memcpy(dxp + r * g->w, xp + (r + g->pad) * wp + g->pad, sizeof(T) * (size_t)g->w);
}

/* Filter i = (oc, ci) of grouped_bwd_weight, summed over the batch in image order. */
static void S(bwd_weight_filter)(const T *x, const T *dy, T *dw, const conv_geom *g, int64_t o,
                                 int64_t groups, int64_t i, T *scratch) {
  int64_t cg = g->c / groups, og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t oc = i / cg, c = oc / og * cg + i % cg, hw = g->h * g->w;
  T *dwf = dw + i * kk;
  memset(dwf, 0, sizeof(T) * (size_t)kk);
  for (int64_t n = 0; n < g->n; n++) {
    const T *xn = x + (n * g->c + c) * hw, *dyn = dy + (n * o + oc) * p;
    if (!scratch) {
      S(plane_bwd_weight)(xn, dyn, dwf, g);
      continue;
    }
    T *xp = scratch, *dyw = scratch + S(padded_len)(g);
    S(pad_plane)(xn, xp, g);
    S(widen_plane)(dyn, dyw, g);
    S(wide_weight_grad)(xp, dyw, dwf, g);
  }
}

/* This thread's part of scratch (per: values a thread uses), or NULL without scratch. */
static inline T *S(thread_scratch)(void *scratch, int64_t per) {
  return scratch ? (T *)scratch + (int64_t)omp_get_thread_num() * per : NULL;
}

/* Values of scratch one thread uses at stride 1 (the wide layout), per thread of
 * tn_par_threads(); 0 at other strides (no scratch). */
static inline int64_t S(scratch_per_thread)(const conv_geom *g) {
  return g->stride == 1 ? S(padded_len)(g) + S(wide_len)(g) : 0;
}

/* y (N, O, OH, OW), every element written: per output plane (n, o), its bias (or 0) plus
 * its group's CG input planes through their filters. Planes spread over threads. */
static void S(grouped_fwd)(const void *xv, const void *wv, const void *bv, void *yv,
                           const conv_geom *g, int64_t o, int64_t groups, void *scratch) {
  int64_t cg = g->c / groups, p = g->oh * g->ow, kk = g->kh * g->kw, planes = g->n * o;
  int64_t per = S(scratch_per_thread)(g);
  TR_PAR_LOOP(planes, planes * p * cg * kk,
              S(fwd_plane)(xv, wv, bv, yv, g, o, groups, i, S(thread_scratch)(scratch, per)););
}

/* dx (N, C, H, W), every element written: per input plane (n, c), the OG output planes of
 * its group sent back through their filters. */
static void S(grouped_bwd_input)(const void *dyv, const void *wv, void *dxv, const conv_geom *g,
                                 int64_t o, int64_t groups, void *scratch) {
  int64_t og = o / groups, p = g->oh * g->ow, kk = g->kh * g->kw, planes = g->n * g->c;
  int64_t per = S(scratch_per_thread)(g);
  TR_PAR_LOOP(planes, planes * p * og * kk,
              S(bwd_input_plane)(dyv, wv, dxv, g, o, groups, i,
                                 S(thread_scratch)(scratch, per)););
}

/* dw (O, CG, KH, KW), every element written: per filter (oc, ci), summed over the batch in
 * image order (the same bits on any number of threads). */
static void S(grouped_bwd_weight)(const void *xv, const void *dyv, void *dwv, const conv_geom *g,
                                  int64_t o, int64_t groups, void *scratch) {
  int64_t filters = o * (g->c / groups), p = g->oh * g->ow, kk = g->kh * g->kw;
  int64_t per = S(scratch_per_thread)(g);
  TR_PAR_LOOP(filters, filters * g->n * p * kk,
              S(bwd_weight_filter)(xv, dyv, dwv, g, o, groups, i,
                                   S(thread_scratch)(scratch, per)););
}
