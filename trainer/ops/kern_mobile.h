/* Kernels of the mobile blocks' small ops over type T (included twice by ops_mobile.c
 * through kern_both.h): hard-sigmoid and hard-swish, global average pooling and the
 * per-channel scaling of squeeze-and-excitation. Planes are the (H, W) maps of x
 * (N, C, H, W), numbered n * C + c; s and the pooled values hold one value per plane. */

/* relu6(x + 3) / 6 and x times it (MobileNetV3's piecewise-linear sigmoid and swish). */
static inline T S(hsig)(T x) { return x <= -3 ? 0 : x >= 3 ? 1 : (x + 3) / 6; }

/* y = hard-swish(x) when swish, else hard-sigmoid(x). */
TR_KERNEL static void S(hard_fwd)(const void *xv, void *yv, int64_t n, bool swish) {
  const T *x = xv;
  T *y = yv;
  if (swish)
    TR_PAR_FOR(n, y[i] = x[i] * S(hsig)(x[i]););
  else
    TR_PAR_FOR(n, y[i] = S(hsig)(x[i]););
}

/* dx = dy * the derivative at x, with torch's choices at the kinks: hard-sigmoid's slope is
 * 1/6 on the open interval (-3, 3), hard-swish's (2x + 3) / 6 on [-3, 3]. */
TR_KERNEL static void S(hard_bwd)(const void *xv, const void *dyv, void *dxv, int64_t n,
                                  bool swish) {
  const T *x = xv, *dy = dyv;
  T *dx = dxv;
  if (swish)
    TR_PAR_FOR(n, dx[i] = x[i] < -3 ? 0 : x[i] > 3 ? dy[i] : dy[i] * (2 * x[i] + 3) / 6;);
  else
    TR_PAR_FOR(n, dx[i] = x[i] > -3 && x[i] < 3 ? dy[i] / 6 : 0;);
}

/* Per-plane helpers: loops with a simd pragma, which a macro argument cannot hold. */
static inline T S(plane_sum)(const T *a, int64_t hw) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < hw; j++) acc += a[j];
  return acc;
}
static inline T S(plane_dot)(const T *a, const T *b, int64_t hw) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < hw; j++) acc += a[j] * b[j];
  return acc;
}
/* dst = src * f, or f everywhere when src is NULL. */
static inline void S(plane_set)(T *dst, const T *src, T f, int64_t hw) {
  if (src) {
#pragma omp simd
    for (int64_t j = 0; j < hw; j++) dst[j] = src[j] * f;
  } else {
#pragma omp simd
    for (int64_t j = 0; j < hw; j++) dst[j] = f;
  }
}

/* y[i] = the mean of plane i of x (planes of hw values). */
TR_KERNEL static void S(plane_means)(const void *xv, void *yv, int64_t planes, int64_t hw) {
  const T *x = xv;
  T *y = yv;
  TR_PAR_LOOP(planes, planes * hw, y[i] = S(plane_sum)(x + i * hw, hw) / (T)hw;);
}

/* Every value of plane i of dx = dy[i] / hw (the adjoint of plane_means). */
TR_KERNEL static void S(plane_means_bwd)(const void *dyv, void *dxv, int64_t planes, int64_t hw) {
  const T *dy = dyv;
  T *dx = dxv;
  TR_PAR_LOOP(planes, planes * hw, S(plane_set)(dx + i * hw, NULL, dy[i] / (T)hw, hw););
}

/* Plane i of y = plane i of x times s[i]. */
TR_KERNEL static void S(plane_scale)(const void *xv, const void *sv, void *yv, int64_t planes,
                                     int64_t hw) {
  const T *x = xv, *s = sv;
  T *y = yv;
  TR_PAR_LOOP(planes, planes * hw, S(plane_set)(y + i * hw, x + i * hw, s[i], hw););
}

/* ds[i] = the dot product of planes i of dy and x (plane_scale's gradient for s). */
TR_KERNEL static void S(plane_dots)(const void *dyv, const void *xv, void *dsv, int64_t planes,
                                    int64_t hw) {
  const T *dy = dyv, *x = xv;
  T *ds = dsv;
  TR_PAR_LOOP(planes, planes * hw, ds[i] = S(plane_dot)(dy + i * hw, x + i * hw, hw););
}
