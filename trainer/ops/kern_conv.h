/* Convolution and pooling kernels over type T (included twice by ops_conv.c, which also
 * defines TDT, the matching tr_dtype, for GEMM).
 *
 * Geometry g: x (N, C, H, W), kernel KH x KW, stride, padding, output OH x OW (P = OH*OW).
 * Convolution runs image by image: im2col lays one image out as col (C*KH*KW, P), row
 * (c, kh, kw) and column (oh, ow) holding x[c, oh*stride - pad + kh, ow*stride - pad + kw]
 * (0 outside), and one GEMM with the weights (O, C*KH*KW) gives that image's output. One
 * image's columns stay in cache between im2col and GEMM, where a whole batch's would not;
 * images spread over threads, each with its own scratch. col2im is im2col's adjoint. */

/* The output columns [lo, hi) whose input column ow*stride - pad + kw is inside the image. */
static inline void S(valid_cols)(const conv_geom *g, int64_t kw, int64_t *lo, int64_t *hi) {
  int64_t first = g->pad - kw, last = g->w - 1 + g->pad - kw;
  *lo = first <= 0 ? 0 : (first + g->stride - 1) / g->stride;
  *hi = last < 0 ? 0 : last / g->stride + 1;
  if (*hi > g->ow) *hi = g->ow;
  if (*lo > *hi) *lo = *hi;
}

/* For stride 1 without padding (the common case), row (c, kh, kw) of col holds OH runs of
 * OW values of plane c, W apart in x, one per output row: the two functions below copy them
 * into col and add them back into dx. The runs are short (11 values on a 28x28 CNN's second
 * layer) and a loop of unknown length spends most of its time outside its vector part, so
 * each run goes in chunks of a fixed RUN_CHUNK values, whole vectors: a copy's last chunk
 * runs on into col's next run, which is written after it, and an add's last chunk adds 0
 * past the run's end. The last runs of a row, whose chunks would reach past the image or
 * col, go value by value. col2im adds the even runs, then the odd ones: run oh + 1 starts
 * W values after run oh, inside its last chunk, and a load that overlaps a store still in
 * flight waits for it (col2im took 8.6 us an image on the CNN's second layer in run order,
 * 3.1 us this way, 5.6 us before chunks). */
#define RUN_CHUNK 16

/* How many of the runs of a col row (starting at x_at in the image and col_at in col) can
 * go in whole chunks; *span gets the values the chunks of one run cover. */
static inline int64_t S(chunked_runs)(const conv_geom *g, int64_t x_at, int64_t col_at,
                                      int64_t *span) {
  *span = (g->ow + RUN_CHUNK - 1) / RUN_CHUNK * RUN_CHUNK;
  int64_t x_room = g->c * g->h * g->w - x_at - *span;
  int64_t col_room = g->c * g->kh * g->kw * g->oh * g->ow - col_at - *span;
  if (x_room < 0 || col_room < 0) return 0;
  int64_t by_x = x_room / g->w + 1, by_col = col_room / g->ow + 1;
  int64_t runs = by_x < by_col ? by_x : by_col;
  return runs < g->oh ? runs : g->oh;
}

TR_KERNEL static void S(im2col_unpadded)(const T *x, T *col, const conv_geom *g) {
  int64_t p = g->oh * g->ow, rows = g->c * g->kh * g->kw, span;
  for (int64_t row = 0; row < rows; row++) {
    int64_t c = row / (g->kh * g->kw), kh = row / g->kw % g->kh, kw = row % g->kw;
    int64_t from = (c * g->h + kh) * g->w + kw, chunked = S(chunked_runs)(g, from, row * p, &span);
    const T *src = x + from;
    T *dst = col + row * p;
    int64_t oh = 0;
    for (; oh < chunked; oh++, src += g->w, dst += g->ow)
      for (int64_t ow = 0; ow < span; ow += RUN_CHUNK)
#pragma omp simd
        for (int64_t j = 0; j < RUN_CHUNK; j++) dst[ow + j] = src[ow + j];
    for (; oh < g->oh; oh++, src += g->w, dst += g->ow)
      for (int64_t ow = 0; ow < g->ow; ow++) dst[ow] = src[ow];
  }
}

TR_KERNEL static void S(col2im_unpadded)(const T *col, T *dx, const conv_geom *g) {
  int64_t p = g->oh * g->ow, rows = g->c * g->kh * g->kw, span;
  for (int64_t row = 0; row < rows; row++) {
    int64_t c = row / (g->kh * g->kw), kh = row / g->kw % g->kh, kw = row % g->kw;
    int64_t to = (c * g->h + kh) * g->w + kw, chunked = S(chunked_runs)(g, to, row * p, &span);
    const T *src = col + row * p;
    T *dst = dx + to;
    for (int64_t first = 0; first < 2; first++)
      for (int64_t oh = first; oh < chunked; oh += 2)
        for (int64_t ow = 0; ow < span; ow += RUN_CHUNK)
#pragma omp simd
          for (int64_t j = 0; j < RUN_CHUNK; j++) {
            T v = src[oh * g->ow + ow + j];
            dst[oh * g->w + ow + j] += ow + j < g->ow ? v : 0;
          }
    for (int64_t oh = chunked; oh < g->oh; oh++)
      for (int64_t ow = 0; ow < g->ow; ow++) dst[oh * g->w + ow] += src[oh * g->ow + ow];
  }
}

TR_KERNEL static void S(im2col_image)(const T *x, T *col, const conv_geom *g) {
  if (g->stride == 1 && g->pad == 0) {
    S(im2col_unpadded)(x, col, g);
    return;
  }
  int64_t p = g->oh * g->ow, rows = g->c * g->kh * g->kw;
  for (int64_t row = 0; row < rows; row++) {
    int64_t c = row / (g->kh * g->kw), kh = row / g->kw % g->kh, kw = row % g->kw, lo, hi;
    S(valid_cols)(g, kw, &lo, &hi);
    const T *plane = x + c * g->h * g->w;
    for (int64_t oh = 0; oh < g->oh; oh++) {
      int64_t ih = oh * g->stride - g->pad + kh;
      T *d = col + row * p + oh * g->ow;
      if (ih < 0 || ih >= g->h) {
        memset(d, 0, sizeof(T) * (size_t)g->ow);
        continue;
      }
      const T *src = plane + ih * g->w + kw - g->pad;
      for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0;
      if (g->stride == 1) /* rows are short (OW values): a loop, not a memcpy call */
#pragma omp simd
        for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow];
      else
        for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * g->stride];
      for (int64_t ow = hi; ow < g->ow; ow++) d[ow] = 0;
    }
  }
}

TR_KERNEL static void S(col2im_image)(const T *col, T *dx, const conv_geom *g) {
  if (g->stride == 1 && g->pad == 0) {
    S(col2im_unpadded)(col, dx, g);
    return;
  }
  int64_t p = g->oh * g->ow, rows = g->c * g->kh * g->kw;
  for (int64_t row = 0; row < rows; row++) {
    int64_t c = row / (g->kh * g->kw), kh = row / g->kw % g->kh, kw = row % g->kw, lo, hi;
    S(valid_cols)(g, kw, &lo, &hi);
    T *plane = dx + c * g->h * g->w;
    for (int64_t oh = 0; oh < g->oh; oh++) {
      int64_t ih = oh * g->stride - g->pad + kh;
      if (ih < 0 || ih >= g->h) continue;
      const T *s = col + row * p + oh * g->ow;
      T *dst = plane + ih * g->w + kw - g->pad;
      if (g->stride == 1)
#pragma omp simd
        for (int64_t ow = lo; ow < hi; ow++) dst[ow] += s[ow];
      else
        for (int64_t ow = lo; ow < hi; ow++) dst[ow * g->stride] += s[ow];
    }
  }
}

/* conv_fwd's loop over images: an orphaned omp for, so it runs split over the threads of
 * an enclosing parallel region, or serially (no OpenMP runtime call) without one. */
TR_KERNEL static void S(conv_fwd_images)(const T *x, const T *w, const T *b, T *y,
                                         const conv_geom *g, int64_t o, T *scratch) {
  int64_t p = g->oh * g->ow, ckk = g->c * g->kh * g->kw;
  T *col = scratch + (int64_t)omp_get_thread_num() * ckk * p;
#pragma omp for schedule(static)
  for (int64_t n = 0; n < g->n; n++) {
    S(im2col_image)(x + n * g->c * g->h * g->w, col, g);
    T *yn = y + n * o * p;
    for (int64_t oc = 0; b && oc < o; oc++) {
      const T bias = b[oc]; /* a local: a store through yn might otherwise change b[oc] */
      T *row = yn + oc * p;
#pragma omp simd
      for (int64_t j = 0; j < p; j++) row[j] = bias;
    }
    tn_gemm(NULL, TDT, false, false, o, p, ckk, 1.0, w, ckk, col, p, b ? 1.0 : 0.0, yn, p);
  }
}

/* y (N, O, P) = W (O, C*KH*KW) @ im2col(x_n) + b, image by image on nt threads; scratch
 * holds nt column buffers of C*KH*KW*P. */
static void S(conv_fwd)(const void *x, const void *w, const void *b, void *y, const conv_geom *g,
                        int64_t o, void *scratch, int nt) {
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    S(conv_fwd_images)(x, w, b, y, g, o, scratch);
  } else {
    S(conv_fwd_images)(x, w, b, y, g, o, scratch);
  }
}

/* conv_bwd's loop over images (an orphaned omp for, as in conv_fwd_images). */
TR_KERNEL static void S(conv_bwd_images)(const T *x, const T *w, const T *dy, T *dx, T *dw,
                                         const conv_geom *g, int64_t o, T *scratch) {
  int64_t p = g->oh * g->ow, ckk = g->c * g->kh * g->kw, per = 2 * ckk * p + o * ckk;
  int tid = omp_get_thread_num();
  T *col = scratch + tid * per, *dcol = col + ckk * p, *dwp = tid == 0 ? dw : dcol + ckk * p;
  if (dwp) memset(dwp, 0, sizeof(T) * (size_t)(o * ckk));
#pragma omp for schedule(static)
  for (int64_t n = 0; n < g->n; n++) {
    const T *dyn = dy + n * o * p;
    if (dw) {
      S(im2col_image)(x + n * g->c * g->h * g->w, col, g);
      tn_gemm(NULL, TDT, false, true, o, ckk, p, 1.0, dyn, p, col, p, 1.0, dwp, ckk);
    }
    if (dx) {
      tn_gemm(NULL, TDT, true, false, ckk, p, o, 1.0, w, ckk, dyn, p, 0.0, dcol, p);
      S(col2im_image)(dcol, dx + n * g->c * g->h * g->w, g);
    }
  }
}

/* Gradients of conv_fwd from dy (N, O, P): dw (O, C*KH*KW) and dx (N, C, H, W, zeroed) when
 * not NULL; db is done apart (conv_bias_grad). scratch per thread: a column buffer, a dcol
 * buffer, and (threads past the first) a partial dw, summed into dw at the end. */
static void S(conv_bwd)(const void *x, const void *w, const void *dy, void *dxv, void *dwv,
                        const conv_geom *g, int64_t o, void *scratchv, int nt) {
  T *dw = dwv, *scratch = scratchv;
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    S(conv_bwd_images)(x, w, dy, dxv, dw, g, o, scratch);
  } else {
    S(conv_bwd_images)(x, w, dy, dxv, dw, g, o, scratch);
  }
  int64_t ckk = g->c * g->kh * g->kw, p = g->oh * g->ow, per = 2 * ckk * p + o * ckk;
  for (int t = 1; dw && t < nt; t++) {
    const T *part = scratch + t * per + 2 * ckk * p;
    for (int64_t i = 0; i < o * ckk; i++) dw[i] += part[i];
  }
}

/* db[o] = sum of dy (N, O, P) over n and p. */
TR_KERNEL static void S(conv_bias_grad)(const void *dyv, void *dbv, int64_t n, int64_t o,
                                        int64_t p) {
  const T *dy = dyv;
  T *db = dbv;
  for (int64_t oc = 0; oc < o; oc++) {
    T acc = 0;
    for (int64_t i = 0; i < n; i++) {
      const T *src = dy + (i * o + oc) * p;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < p; j++) acc += src[j];
    }
    db[oc] = acc;
  }
}

/* Pooling over k x k windows with stride s (no padding) on planes of x (N*C, H, W).
 * max: y = window max, argmax[i] = its index in the plane; avg: y = window mean. */
/* One output of a max pool: the window's largest value and its index in the plane. */
static inline T S(window_max)(const T *src, const conv_geom *g, int64_t oh, int64_t ow,
                              int32_t *arg) {
  int64_t best = (oh * g->stride) * g->w + ow * g->stride;
  T acc = src[best];
  for (int64_t kh = 0; kh < g->kh; kh++)
    for (int64_t kw = 0; kw < g->kw; kw++) {
      int64_t idx = (oh * g->stride + kh) * g->w + ow * g->stride + kw;
      if (src[idx] > acc) {
        acc = src[idx];
        best = idx;
      }
    }
  *arg = (int32_t)best;
  return acc;
}

static inline T S(window_mean)(const T *src, const conv_geom *g, int64_t oh, int64_t ow) {
  T acc = 0;
  for (int64_t kh = 0; kh < g->kh; kh++)
    for (int64_t kw = 0; kw < g->kw; kw++)
      acc += src[(oh * g->stride + kh) * g->w + ow * g->stride + kw];
  return acc / (T)(g->kh * g->kw);
}

/* The common 2x2, stride 2 max pool of one plane, written without branches so that it
 * vectorises (random data makes the branches a coin toss for the predictor). Ties go to
 * the first in row-major window order, as in window_max. */
static inline void S(max_pool_2x2)(const T *src, const conv_geom *g, T *out, int32_t *arg) {
  const int ow_n = (int)g->ow, w = (int)g->w;
  for (int oh = 0; oh < (int)g->oh; oh++) {
    const T *r0 = src + 2 * oh * w, *r1 = r0 + w;
    T *o = out + oh * ow_n;
    int32_t *a = arg + oh * ow_n;
#pragma omp simd
    for (int ow = 0; ow < ow_n; ow++) {
      T x0 = r0[2 * ow], x1 = r0[2 * ow + 1], y0 = r1[2 * ow], y1 = r1[2 * ow + 1];
      int top_right = x1 > x0, bottom_right = y1 > y0;
      T top = top_right ? x1 : x0, bottom = bottom_right ? y1 : y0;
      int below = bottom > top;
      o[ow] = below ? bottom : top;
      a[ow] = 2 * oh * w + 2 * ow + below * (w + bottom_right) + (1 - below) * top_right;
    }
  }
}

/* One plane: max (argmax not NULL) or mean over each window, any window and stride. */
TR_KERNEL static void S(pool_plane)(const T *src, const conv_geom *g, T *out, int32_t *argmax,
                                    bool two_by_two) {
  if (two_by_two) {
    S(max_pool_2x2)(src, g, out, argmax);
    return;
  }
  for (int64_t oh = 0; oh < g->oh; oh++)
    for (int64_t ow = 0; ow < g->ow; ow++) {
      int64_t o = oh * g->ow + ow;
      out[o] = argmax ? S(window_max)(src, g, oh, ow, argmax + o) : S(window_mean)(src, g, oh, ow);
    }
}

TR_KERNEL static void S(pool_fwd)(const void *xv, void *yv, int32_t *argmax, const conv_geom *g,
                                  bool is_max) {
  const T *x = xv;
  T *y = yv;
  int64_t planes = g->n * g->c, per = g->oh * g->ow;
  bool two_by_two = is_max && g->kh == 2 && g->kw == 2 && g->stride == 2;
  /* i: the plane */
  TR_PAR_LOOP(planes, planes * per * g->kh * g->kw,
              S(pool_plane)(x + i * g->h * g->w, g, y + i * per, is_max ? argmax + i * per : NULL,
                            two_by_two););
}

/* One plane of pool_bwd, all of it written: dy routed to its argmax (not NULL) or spread
 * evenly over the window. The plane is zeroed here, while it is in cache, rather than the
 * whole dx beforehand (megabytes, written twice). */
TR_KERNEL static void S(pool_plane_bwd)(const T *dy, T *dst, const int32_t *argmax,
                                        const conv_geom *g) {
  memset(dst, 0, sizeof(T) * (size_t)(g->h * g->w));
  T inv = 1 / (T)(g->kh * g->kw);
  for (int64_t oh = 0; oh < g->oh; oh++)
    for (int64_t ow = 0; ow < g->ow; ow++) {
      int64_t o = oh * g->ow + ow;
      if (argmax) {
        dst[argmax[o]] += dy[o];
        continue;
      }
      for (int64_t kh = 0; kh < g->kh; kh++)
        for (int64_t kw = 0; kw < g->kw; kw++)
          dst[(oh * g->stride + kh) * g->w + ow * g->stride + kw] += dy[o] * inv;
    }
}

/* dx (N, C, H, W), every element written, from dy: to the argmax (max) or spread evenly
 * over each window (avg). */
TR_KERNEL static void S(pool_bwd)(const void *dyv, void *dxv, const int32_t *argmax,
                                  const conv_geom *g, bool is_max) {
  const T *dy = dyv;
  T *dx = dxv;
  int64_t planes = g->n * g->c;
  TR_PAR_LOOP(planes, planes * g->h * g->w, /* i: the plane */
              S(pool_plane_bwd)(dy + i * g->oh * g->ow, dx + i * g->h * g->w,
                                is_max ? argmax + i * g->oh * g->ow : NULL, g););
}
