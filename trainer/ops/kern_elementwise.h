/* Elementwise kernels over type T (included twice by ops_elementwise.c, see internal.h).
 * Forward and backward of each op side by side; all buffers contiguous, n elements. */

/* Unary ops: y = f(x); backward dx = dy * f'(...) from what the op saved (x or y). One loop
 * per op (the switch outside), so each loop vectorises on its own. */
#define S_UNARY_LOOP(EXPR) TR_PAR_FOR(n, T v = x[i]; y[i] = (EXPR);)

TR_KERNEL static void S(unary_fwd)(int op, const void *xv, void *yv, int64_t n, double s) {
  const T *x = xv;
  T *y = yv;
  const T k0 = (T)0.7978845608028654, k1 = (T)0.044715, sc = (T)s; /* sqrt(2/pi), GELU's cubic */
  switch (op) {
  case UN_RELU: S_UNARY_LOOP(v > 0 ? v : 0); break;
  case UN_GELU: S_UNARY_LOOP((T)0.5 * v * (1 + tanh(k0 * (v + k1 * v * v * v)))); break;
  case UN_TANH: S_UNARY_LOOP(tanh(v)); break;
  case UN_SIGMOID: S_UNARY_LOOP(1 / (1 + exp(-v))); break;
  case UN_EXP: S_UNARY_LOOP(exp(v)); break;
  case UN_LOG: S_UNARY_LOOP(log(v)); break;
  default: S_UNARY_LOOP(sc * v); break; /* UN_SCALE */
  }
}

/* saved is y for relu, tanh, sigmoid, exp; x for gelu, log; unused for scale. */
#define S_UNARY_BWD_LOOP(EXPR) TR_PAR_FOR(n, T v = sv[i], g = dy[i]; dx[i] = (EXPR);)

static T S(gelu_grad)(T v) {
  const T k0 = (T)0.7978845608028654, k1 = (T)0.044715;
  T th = tanh(k0 * (v + k1 * v * v * v)), du = k0 * (1 + 3 * k1 * v * v);
  return (T)0.5 * (1 + th) + (T)0.5 * v * (1 - th * th) * du;
}

TR_KERNEL static void S(unary_bwd)(int op, const void *savedv, const void *dyv, void *dxv,
                                   int64_t n, double s) {
  const T *sv = savedv, *dy = dyv;
  T *dx = dxv;
  const T sc = (T)s;
  switch (op) {
  case UN_RELU: S_UNARY_BWD_LOOP(v > 0 ? g : 0); break;
  case UN_GELU: S_UNARY_BWD_LOOP(g * S(gelu_grad)(v)); break;
  case UN_TANH: S_UNARY_BWD_LOOP(g * (1 - v * v)); break;
  case UN_SIGMOID: S_UNARY_BWD_LOOP(g * v * (1 - v)); break;
  case UN_EXP: S_UNARY_BWD_LOOP(g * v); break;
  case UN_LOG: S_UNARY_BWD_LOOP(g / v); break;
  default: TR_PAR_FOR(n, dx[i] = dy[i] * sc;); /* UN_SCALE: nothing saved */
  }
}

/* Dropout: y = x * mask, dx = dy * mask (mask: 1/(1-p) where kept, 0 where dropped, whatever
 * x holds there). */
TR_KERNEL static void S(dropout_apply)(const void *xv, const void *maskv, void *yv, int64_t n) {
  const T *x = xv, *mask = maskv;
  T *y = yv;
  TR_PAR_FOR(n, y[i] = mask[i] != 0 ? x[i] * mask[i] : 0;);
}

/* One row of a broadcasting binary op: n outputs, inputs stepping by sa and sb (0 or 1
 * after broadcasting, or any stride for views). */
#define S_BIN_ROW(EXPR)                                     \
  do {                                                      \
    if (sa == 1 && sb == 1) {                               \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { \
        T x = a[i], y = b[i];                               \
        o[i] = (EXPR);                                      \
      }                                                     \
    } else if (sa == 1 && sb == 0) {                        \
      const T y = b[0];                                     \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { \
        T x = a[i];                                         \
        o[i] = (EXPR);                                      \
      }                                                     \
    } else {                                                \
      for (int64_t i = 0; i < n; i++) {                     \
        T x = a[i * sa], y = b[i * sb];                     \
        o[i] = (EXPR);                                      \
      }                                                     \
    }                                                       \
  } while (0)

TR_KERNEL static void S(binary_row)(int op, T *o, const T *a, int64_t sa, const T *b, int64_t sb,
                                    int64_t n) {
  switch (op) {
  case BIN_ADD: S_BIN_ROW(x + y); break;
  case BIN_SUB: S_BIN_ROW(x - y); break;
  case BIN_MUL: S_BIN_ROW(x * y); break;
  default: S_BIN_ROW(x / y); break;
  }
}

/* Offset, under strides st, of the first element of row r of shape[ndim] (rows are the
 * last dim). */
static inline int64_t S(row_offset)(int64_t r, const int64_t *st, const int64_t *shape, int ndim) {
  int64_t off = 0;
  for (int d = ndim - 2; d >= 0; d--) {
    off += (r % shape[d]) * st[d];
    r /= shape[d];
  }
  return off;
}

/* out (contiguous, shape[ndim]) = a op b with per-dim strides sa, sb (0 where broadcast). */
TR_KERNEL static void S(binary_fwd)(int op, void *outv, const void *av, const int64_t *sa,
                                    const void *bv, const int64_t *sb, const int64_t *shape,
                                    int ndim) {
  T *out = outv;
  const T *a = av, *b = bv;
  int64_t n = ndim ? shape[ndim - 1] : 1, rows = tn_prod(shape, 0, ndim - 1);
  int64_t last_a = ndim ? sa[ndim - 1] : 0, last_b = ndim ? sb[ndim - 1] : 0;
  /* i: the row */
  TR_PAR_LOOP(rows, rows * n,
              S(binary_row)(op, out + i * n, a + S(row_offset)(i, sa, shape, ndim), last_a,
                            b + S(row_offset)(i, sb, shape, ndim), last_b, n););
}

/* dst (zeroed, strides ts with 0 on reduced dims) += g (contiguous, shape[ndim]). */
TR_KERNEL static void S(sum_to)(void *dstv, const int64_t *ts, const void *gv, const int64_t *shape,
                                int ndim) {
  T *dst = dstv;
  const T *g = gv;
  int64_t n = ndim ? shape[ndim - 1] : 1, rows = tn_prod(shape, 0, ndim - 1);
  int64_t last = ndim ? ts[ndim - 1] : 0;
  for (int64_t r = 0; r < rows; r++) {
    const T *grow = g + r * n;
    T *drow = dst + S(row_offset)(r, ts, shape, ndim);
    if (last == 0) {
      T acc = 0;
      for (int64_t i = 0; i < n; i++) acc += grow[i];
      drow[0] += acc;
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) drow[i] += grow[i];
    }
  }
}
