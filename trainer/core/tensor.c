/* tensor: the context, the random generator, tensors over reference-counted storage, and
 * in-place writes.
 *
 * Invariants: a tensor holds one reference to its storage; views are other tensors on the
 * same storage, so the version counter (in the storage) is shared by all of them, as in
 * PyTorch. Every in-place write bumps it. numel is the product of shape. Strides may be
 * anything non-negative (views), but tensors made here are contiguous row-major. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

#include "trainer/core/internal.h"

/* ---------------------------------------------------------------- context and generator */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void tr_rng_seed(uint64_t s[4], uint64_t seed) {
  for (int i = 0; i < 4; i++) s[i] = splitmix64(&seed);
}

void tr_ctx_init(tr_ctx *ctx, uint64_t seed) {
  memset(ctx, 0, sizeof *ctx);
  ctx->grad_enabled = true;
  tr_rng_seed(ctx->rng, seed);
}

bool tr_set_grad_enabled(tr_ctx *ctx, bool enabled) {
  bool previous = ctx->grad_enabled;
  ctx->grad_enabled = enabled;
  return previous;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tr_rng_next(uint64_t s[4]) {
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

uint64_t tr_rand_u64(tr_ctx *ctx) { return tr_rng_next(ctx->rng); }

double tr_rand_uniform(tr_ctx *ctx) { return (double)(tr_rand_u64(ctx) >> 11) * 0x1.0p-53; }

double tr_rand_normal(tr_ctx *ctx) {
  double u1 = tr_rand_uniform(ctx), u2 = tr_rand_uniform(ctx);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

tr_tensor *tr_fail(tr_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err.msg, sizeof ctx->err.msg, fmt, ap);
  va_end(ap);
  return NULL;
}

/* ---------------------------------------------------------------- creation and lifetime */

int tn_par_threads(void) { return openblas_get_num_threads() > 1 ? 1 : omp_get_max_threads(); }

size_t tr_dtype_size(tr_dtype dtype) { return dtype == TR_F64 ? 8 : dtype == TR_BF16 ? 2 : 4; }

int64_t tn_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t n = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = n;
    n *= shape[d];
  }
  return n;
}

tr_tensor *tr_empty(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape) {
  /* the host's kernels know these two: others were filled as doubles past their block */
  if (dtype == TR_BF16)
    return tr_fail(ctx, "tensor: bfloat16 exists only on CUDA devices (mixed precision)");
  if (dtype != TR_F32 && dtype != TR_F64)
    return tr_fail(ctx, "tensor: dtype %d is not float32 or float64", (int)dtype);
  return tn_empty_on(ctx, ctx->alloc, (tr_device){TR_CPU, 0}, dtype, ndim, shape);
}

tr_tensor *tn_empty_on(tr_ctx *ctx, tr_allocator *alloc, tr_device device, tr_dtype dtype,
                       int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > TR_MAX_DIMS)
    return tr_fail(ctx, "tensor: %d dims (at most %d)", ndim, TR_MAX_DIMS);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0) return tr_fail(ctx, "tensor: negative size %lld", (long long)shape[d]);
  int64_t numel;
  if (!tn_numel_fits(ndim, shape, &numel))
    return tr_fail(ctx, "tensor: too many elements (their count or bytes overflow int64)");
  tr_tensor *t = calloc(1, sizeof *t);
  tr_storage *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    return tr_fail(ctx, "tensor: out of memory");
  }
  t->refs = 1;
  t->dtype = dtype;
  t->ndim = ndim;
  if (ndim > 0) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  t->numel = tn_contiguous_strides(ndim, shape, t->strides);
  s->refs = 1;
  s->nbytes = (size_t)t->numel * tr_dtype_size(dtype);
  /* 64-byte alignment: whole cache lines and aligned AVX-512 loads for the kernels. */
  s->alloc_size = tn_alloc_size(s->nbytes);
  s->data = tn_alloc(alloc, s->alloc_size);
  if (s->data && alloc) s->alloc = tn_allocator_retain(alloc);
  s->device = device;
  if (!s->data) {
    size_t nbytes = s->nbytes;
    free(t);
    free(s);
    return tr_fail(ctx, "tensor: out of %s memory for %zu bytes",
                   device.kind == TR_CUDA ? "device" : "host", nbytes);
  }
  t->storage = s;
  return t;
}

tr_tensor *tr_zeros(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape) {
  tr_tensor *t = tr_empty(ctx, dtype, ndim, shape);
  if (t) memset(t->storage->data, 0, t->storage->nbytes);
  return t;
}

static void fill_contig(tr_tensor *t, double value) {
  if (t->dtype == TR_F32) {
    float *p = tr_f32(t), v = (float)value;
    for (int64_t i = 0; i < t->numel; i++) p[i] = v;
  } else {
    double *p = tr_f64(t);
    for (int64_t i = 0; i < t->numel; i++) p[i] = value;
  }
}

tr_tensor *tr_full(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape, double value) {
  tr_tensor *t = tr_empty(ctx, dtype, ndim, shape);
  if (t) fill_contig(t, value);
  return t;
}

tr_tensor *tr_from_data(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape,
                        const void *data) {
  tr_tensor *t = tr_empty(ctx, dtype, ndim, shape);
  if (t) memcpy(t->storage->data, data, t->storage->nbytes);
  return t;
}

tr_tensor *tr_randn(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape, double std) {
  tr_tensor *t = tr_empty(ctx, dtype, ndim, shape);
  if (!t) return NULL;
  for (int64_t i = 0; i < t->numel; i++) {
    double v = std * tr_rand_normal(ctx);
    if (dtype == TR_F32)
      tr_f32(t)[i] = (float)v;
    else
      tr_f64(t)[i] = v;
  }
  return t;
}

tr_tensor *tr_rand(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape, double lo,
                   double hi) {
  tr_tensor *t = tr_empty(ctx, dtype, ndim, shape);
  if (!t) return NULL;
  for (int64_t i = 0; i < t->numel; i++) {
    double v = lo + (hi - lo) * tr_rand_uniform(ctx);
    if (dtype == TR_F32)
      tr_f32(t)[i] = (float)v;
    else
      tr_f64(t)[i] = v;
  }
  return t;
}

tr_tensor *tr_retain(tr_tensor *t) {
  if (t) t->refs++;
  return t;
}

void tn_storage_release(tr_storage *s) {
  if (!s || --s->refs > 0) return;
  tn_dealloc(s->alloc, s->data, s->alloc_size);
  tr_allocator_release(s->alloc);
  free(s);
}

void tr_release(tr_tensor *t) {
  if (!t || --t->refs > 0) return;
  tn_storage_release(t->storage);
  tr_release(t->grad);
  ag_node_release(t->grad_fn);
  free(t);
}

tr_tensor *tn_alias(tr_ctx *ctx, const tr_tensor *t) {
  tr_tensor *a = calloc(1, sizeof *a);
  if (!a) return tr_fail(ctx, "tensor: out of memory");
  a->refs = 1;
  a->storage = t->storage;
  t->storage->refs++;
  a->offset = t->offset;
  a->dtype = t->dtype;
  a->ndim = t->ndim;
  memcpy(a->shape, t->shape, sizeof a->shape);
  memcpy(a->strides, t->strides, sizeof a->strides);
  a->numel = t->numel;
  return a;
}

tr_tensor *tr_detach(tr_ctx *ctx, tr_tensor *t) { return tn_alias(ctx, t); }

tr_tensor *tn_empty_like(tr_ctx *ctx, const tr_tensor *t) {
  return tr_empty(ctx, t->dtype, t->ndim, t->shape);
}

tr_tensor *tn_empty_meta(tr_ctx *ctx, tr_dtype dtype, const tr_meta *m) {
  return tr_empty(ctx, dtype, m->ndim, m->shape);
}

tr_tensor *tn_zeros_meta(tr_ctx *ctx, tr_dtype dtype, const tr_meta *m) {
  return tr_zeros(ctx, dtype, m->ndim, m->shape);
}

tr_meta tn_meta(const tr_tensor *t) {
  tr_meta m = {.ndim = t->ndim};
  memcpy(m.shape, t->shape, sizeof m.shape);
  return m;
}

tr_tensor *tn_view(tr_ctx *ctx, const tr_tensor *t, int ndim, const int64_t *shape) {
  tr_tensor *v = tn_alias(ctx, t);
  if (!v) return NULL;
  v->ndim = ndim;
  if (ndim > 0) memcpy(v->shape, shape, sizeof(int64_t) * (size_t)ndim);
  tn_contiguous_strides(ndim, shape, v->strides);
  v->numel = tn_prod(shape, 0, ndim); /* its own: a view may cover only part of t (FSDP) */
  return v;
}

/* ---------------------------------------------------------------- access */

bool tr_is_contiguous(const tr_tensor *t) {
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expect) return false;
    expect *= t->shape[d];
  }
  return true;
}

void *tr_data(const tr_tensor *t) {
  return (char *)t->storage->data + (size_t)t->offset * tr_dtype_size(t->dtype);
}
float *tr_f32(const tr_tensor *t) { return (float *)tr_data(t); }
double *tr_f64(const tr_tensor *t) { return (double *)tr_data(t); }

static int64_t offset_of(const tr_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->strides[d];
    i /= t->shape[d];
  }
  return off;
}

bool tn_any_on_cuda(int n, tr_tensor *const *ts) {
  for (int i = 0; i < n; i++)
    if (tn_on_cuda(ts[i])) return true;
  return false;
}

double tr_get(const tr_tensor *t, int64_t i) {
  if (tn_on_cuda(t)) return tn_device_of(t)->get(t, i);
  int64_t off = offset_of(t, i);
  return t->dtype == TR_F32 ? (double)tr_f32(t)[off] : tr_f64(t)[off];
}

double tr_item(const tr_tensor *t) { return tr_get(t, 0); }

void tn_set(tr_tensor *t, int64_t i, double v) {
  int64_t off = offset_of(t, i);
  if (t->dtype == TR_F32)
    tr_f32(t)[off] = (float)v;
  else
    tr_f64(t)[off] = v;
}

double tn_sumsq(const tr_tensor *t) {
  if (tn_on_cuda(t)) return tn_device_of(t)->sumsq(t);
  double sq = 0;
  if (tr_is_contiguous(t) && t->dtype == TR_F32) {
    const float *p = tr_f32(t);
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < t->numel; i++) sq += (double)p[i] * p[i];
    return sq;
  }
  for (int64_t i = 0; i < t->numel; i++) sq += tr_get(t, i) * tr_get(t, i);
  return sq;
}

bool tr_same_shape(const tr_tensor *a, const tr_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

void tr_set_requires_grad(tr_tensor *t, bool requires_grad) { t->requires_grad = requires_grad; }

int tn_dim(int ndim, int dim) {
  if (dim < 0) dim += ndim;
  return dim >= 0 && dim < ndim ? dim : -1;
}

bool tn_numel_fits(int ndim, const int64_t *shape, int64_t *numel) {
  *numel = 1;
  for (int d = 0; d < ndim; d++)
    if (shape[d] == 0) { /* no element, however large the other sizes */
      *numel = 0;
      return true;
    }
  /* the byte count, up to 8 bytes an element, must fit an int64 (and so a size_t) too */
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0 || __builtin_mul_overflow(*numel, shape[d], numel) ||
        *numel > INT64_MAX / 8)
      return false;
  return true;
}

int64_t tn_prod(const int64_t *shape, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= shape[d];
  return p;
}

void tn_split_at(const tr_tensor *t, int dim, int64_t *outer, int64_t *n, int64_t *inner) {
  assert(dim >= 0 && dim < t->ndim);
  *outer = tn_prod(t->shape, 0, dim);
  *inner = tn_prod(t->shape, dim + 1, t->ndim);
  *n = t->shape[dim];
}

int tn_check_dtypes(tr_ctx *ctx, const char *op, int n, tr_tensor *const *ts) {
  for (int i = 1; i < n; i++)
    if (ts[i] && ts[i]->dtype != ts[0]->dtype)
      return nas_errf(&ctx->err, "%s: inputs of different dtypes (input %d)", op, i);
  return NAS_OK;
}

/* ---------------------------------------------------------------- strided copies */

/* Copies the strided block at dim..ndim-1 of src (element offset off) to *dst, advancing
 * it; innermost dim as a plain loop. */
#define COPY_STRIDED(T)                                                              \
  static void copy_strided_##T(const tr_tensor *s, int dim, const T *src, T **dst) { \
    int64_t n = s->shape[dim], st = s->strides[dim];                                 \
    if (dim == s->ndim - 1) {                                                        \
      T *out = *dst;                                                                 \
      for (int64_t i = 0; i < n; i++) out[i] = src[i * st];                          \
      *dst += n;                                                                     \
      return;                                                                        \
    }                                                                                \
    for (int64_t i = 0; i < n; i++) copy_strided_##T(s, dim + 1, src + i * st, dst); \
  }
COPY_STRIDED(float)
COPY_STRIDED(double)

void tn_copy_to_contig(const tr_tensor *src, void *dst) {
  if (tr_is_contiguous(src)) {
    memcpy(dst, tr_data(src), (size_t)src->numel * tr_dtype_size(src->dtype));
  } else if (src->ndim == 0) {
    memcpy(dst, tr_data(src), tr_dtype_size(src->dtype));
  } else if (src->dtype == TR_F32) {
    float *out = dst;
    copy_strided_float(src, 0, tr_f32(src), &out);
  } else {
    double *out = dst;
    copy_strided_double(src, 0, tr_f64(src), &out);
  }
}

tr_tensor *tn_contig(tr_ctx *ctx, const tr_tensor *t) {
  if (tn_on_cuda(t)) return tn_device_of(t)->contig(ctx, t);
  if (tr_is_contiguous(t)) {
    tr_tensor *a = tn_alias(ctx, t);
    return a;
  }
  tr_tensor *c = tn_empty_like(ctx, t);
  if (c) tn_copy_to_contig(t, tr_data(c));
  return c;
}

tr_tensor *tr_to_dtype(tr_ctx *ctx, const tr_tensor *t, tr_dtype dtype) {
  if (tn_on_cuda(t)) return tn_device_of(t)->to_dtype(ctx, t, dtype);
  if (dtype == TR_BF16 || t->dtype == TR_BF16)
    return tr_fail(ctx, "to_dtype: bfloat16 exists only on CUDA devices (mixed precision)");
  tr_tensor *c = tn_contig(ctx, t);
  if (!c || c->dtype == dtype) return c;
  tr_tensor *out = tr_empty(ctx, dtype, t->ndim, t->shape);
  if (out) {
    for (int64_t i = 0; i < t->numel; i++) {
      if (dtype == TR_F32)
        tr_f32(out)[i] = (float)tr_f64(c)[i];
      else
        tr_f64(out)[i] = (double)tr_f32(c)[i];
    }
  }
  tr_release(c);
  return out;
}

/* ---------------------------------------------------------------- in-place writes */

static int check_inplace(tr_ctx *ctx, const tr_tensor *t, const char *op) {
  if (ctx->grad_enabled && t->requires_grad && !t->grad_fn)
    return nas_errf(&ctx->err,
                    "%s: a leaf tensor that requires grad is written in place with grad "
                    "mode on (turn grad mode off, as optimisers do)",
                    op);
  return NAS_OK;
}

/* What for_each_pair writes into each element of dst. */
typedef enum { PAIR_SET, PAIR_AXPY, PAIR_SCALE, PAIR_COPY } pair_op;

/* The slow path of the in-place writes, for any strides and dtypes: walks dst's elements in
 * logical order with src's (may be NULL) alongside. */
static void for_each_pair(tr_tensor *dst, const tr_tensor *src, double alpha, pair_op op) {
  for (int64_t i = 0; i < dst->numel; i++) {
    double cur = tr_get(dst, i), s = src ? tr_get(src, i) : 0.0;
    double v = op == PAIR_SET     ? alpha
               : op == PAIR_AXPY  ? cur + alpha * s
               : op == PAIR_SCALE ? cur * alpha
                                  : s;
    tn_set(dst, i, v);
  }
}

void tn_fill(tr_tensor *t, double value) {
  if (tn_on_cuda(t)) { tn_device_of(t)->fill(t, value); return; }
  if (tr_is_contiguous(t))
    fill_contig(t, value);
  else
    for_each_pair(t, NULL, value, PAIR_SET);
  t->storage->version++;
}

int tr_fill_(tr_ctx *ctx, tr_tensor *t, double value) {
  if (check_inplace(ctx, t, "fill_")) return NAS_ERR;
  tn_fill(t, value);
  return NAS_OK;
}

int tn_add(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha) {
  if (tn_on_cuda(dst) || tn_on_cuda(src))
    return tn_device_of(tn_on_cuda(dst) ? dst : src)->add_(ctx, dst, src, alpha);
  if (dst->numel != src->numel)
    return nas_errf(&ctx->err, "add_: %lld elements += %lld", (long long)dst->numel,
                    (long long)src->numel);
  if (tr_is_contiguous(dst) && tr_is_contiguous(src) && dst->dtype == src->dtype) {
    int64_t n = dst->numel;
    if (dst->dtype == TR_F32) {
      float *d = tr_f32(dst), a = (float)alpha;
      const float *s = tr_f32(src);
      TR_PAR_FOR(n, d[i] += a * s[i];);
    } else {
      tn_axpy(TR_F64, n, alpha, tr_data(src), tr_data(dst));
    }
  } else {
    for_each_pair(dst, src, alpha, PAIR_AXPY);
  }
  dst->storage->version++;
  return NAS_OK;
}

int tr_add_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha) {
  if (check_inplace(ctx, dst, "add_")) return NAS_ERR;
  return tn_add(ctx, dst, src, alpha);
}

void tn_scale_contig(tr_tensor *t, double s) {
  if (tn_on_cuda(t)) { tn_device_of(t)->scale(t, s); return; }
  assert(tr_is_contiguous(t));
  if (t->dtype == TR_F32)
    cblas_sscal((blasint)t->numel, (float)s, tr_f32(t), 1);
  else
    cblas_dscal((blasint)t->numel, s, tr_f64(t), 1);
}

void tn_axpy(tr_dtype dtype, int64_t n, double alpha, const void *x, void *y) {
  if (dtype == TR_F32)
    cblas_saxpy((blasint)n, (float)alpha, x, 1, y, 1);
  else
    cblas_daxpy((blasint)n, alpha, x, 1, y, 1);
}

void tn_col_sums(tr_dtype dtype, int64_t rows, int64_t n, const void *y, int64_t ld, void *out) {
  size_t es = tr_dtype_size(dtype);
  memset(out, 0, (size_t)n * es);
  for (int64_t r = 0; r < rows; r++)
    tn_axpy(dtype, n, 1.0, (const char *)y + (size_t)(r * ld) * es, out);
}

int tr_mul_scalar_(tr_ctx *ctx, tr_tensor *t, double s) {
  if (check_inplace(ctx, t, "mul_")) return NAS_ERR;
  if (tn_on_cuda(t)) return tn_device_of(t)->mul_scalar_(ctx, t, s);
  if (tr_is_contiguous(t))
    tn_scale_contig(t, s);
  else
    for_each_pair(t, NULL, s, PAIR_SCALE);
  t->storage->version++;
  return NAS_OK;
}

int tr_copy_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src) {
  if (check_inplace(ctx, dst, "copy_")) return NAS_ERR;
  if (tn_on_cuda(dst) || tn_on_cuda(src))
    return tn_device_of(tn_on_cuda(dst) ? dst : src)->copy_(ctx, dst, src);
  if (dst->numel != src->numel)
    return nas_errf(&ctx->err, "copy_: %lld elements from %lld", (long long)dst->numel,
                    (long long)src->numel);
  if (tr_is_contiguous(dst) && dst->dtype == src->dtype)
    tn_copy_to_contig(src, tr_data(dst));
  else
    for_each_pair(dst, src, 0.0, PAIR_COPY);
  dst->storage->version++;
  return NAS_OK;
}

bool tn_is_private(const tr_tensor *t) {
  return t->refs == 1 && t->storage->refs == 1 && tr_is_contiguous(t) && !t->grad_fn;
}

tr_tensor *tn_clone(tr_ctx *ctx, const tr_tensor *t) {
  if (tn_on_cuda(t)) return tn_device_of(t)->clone(ctx, t);
  tr_tensor *c = tn_empty_like(ctx, t);
  if (c) tn_copy_to_contig(t, tr_data(c));
  return c;
}

/* A private accumulator is summed into in place; anything else may be seen elsewhere, so
 * the sum goes into a copy. */
int tn_accumulate(tr_ctx *ctx, tr_tensor **acc, tr_tensor *g) {
  if (!*acc) {
    *acc = g;
    return NAS_OK;
  }
  if (!tn_is_private(*acc)) {
    tr_tensor *copy = tn_clone(ctx, *acc);
    if (!copy) {
      tr_release(g);
      return NAS_ERR;
    }
    tr_release(*acc);
    *acc = copy;
  }
  int rc = tn_add(ctx, *acc, g, 1.0);
  tr_release(g);
  return rc;
}
