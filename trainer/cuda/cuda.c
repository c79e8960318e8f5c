/* cuda: the CUDA engine object (tr_cuda: stream, cuBLAS handle, caching device allocator),
 * device tensors and copies between host and device, and the device twins of tensor.c's
 * helpers and in-place writes.
 *
 * Invariants: a CUDA tensor's storage has device {TR_CUDA, i} and its memory from the
 * device allocator of an engine of device i (so freeing it needs no engine); its data
 * pointer is never dereferenced on the host. Work with a ctx goes on ctx->cuda's stream;
 * the calls that have no ctx (tr_get, tr_zero_grad, clipping) use the device's legacy
 * default stream, which is ordered with the engine's blocking stream, so everything on a
 * device runs in the order it was issued. Compiled in both builds: without nvcc every
 * kernel call fails "built without CUDA" (trainer/cuda/cuda_nocuda.c) and tr_cuda_new refuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda/cuda_internal.h"

_Static_assert(TCK_F32 == (int)TR_F32 && TCK_F64 == (int)TR_F64 && TCK_BF16 == (int)TR_BF16,
               "kernel dtype codes follow tr_dtype");
_Static_assert(TCK_MAX_DIMS == TR_MAX_DIMS, "kernel layouts hold every tensor");

/* ---------------------------------------------------------------- the engine */

int tr_cuda_device_count(nas_err *err) {
  int count = 0;
  tck_status st = tck_device_count(&count);
  if (st) {
    nas_errf(err, "CUDA unavailable: %s", st);
    return 0;
  }
  if (count == 0) nas_errf(err, "CUDA unavailable: no CUDA device");
  return count;
}

tr_cuda *tr_cuda_new(int device, size_t cache_limit, nas_err *err) {
  nas_err probe = {{0}};
  int count = tr_cuda_device_count(&probe);
  if (count == 0) {
    nas_errf(err, "cuda:%d: %s", device, probe.msg);
    return NULL;
  }
  if (device < 0 || device >= count) {
    nas_errf(err, "cuda:%d: no such device (%d found)", device, count);
    return NULL;
  }
  tr_cuda *cu = calloc(1, sizeof *cu);
  if (!cu) {
    nas_errf(err, "cuda:%d: out of memory", device);
    return NULL;
  }
  cu->device = device;
  tck_status st = tck_stream_new(device, &cu->stream);
  if (!st) st = tck_blas_new(device, cu->stream, &cu->blas);
  if (!st && !(cu->alloc = tn_allocator_new_device(&tc_device_ops, device, cache_limit)))
    st = "out of memory";
  if (st) {
    nas_errf(err, "cuda:%d: cannot start the engine: %s", device, st);
    tr_cuda_free(cu);
    return NULL;
  }
  return cu;
}

void tr_cuda_free(tr_cuda *cu) {
  if (!cu) return;
  /* Queued work may still read memory that tensors free later: let it finish first. */
  (void)tck_stream_sync((tck_stream){cu->device, cu->stream});
  (void)tck_blas_free(cu->device, cu->blas);
  (void)tck_stream_free(cu->device, cu->stream);
  tr_allocator_release(cu->alloc);
  free(cu);
}

int tr_cuda_device(const tr_cuda *cu) { return cu->device; }

int tr_cuda_sync(tr_cuda *cu, nas_err *err) {
  tck_status st = tck_stream_sync((tck_stream){cu->device, cu->stream});
  return st ? nas_errf(err, "cuda:%d: %s", cu->device, st) : NAS_OK;
}

void tr_cuda_memory_stats(tr_cuda *cu, tr_alloc_stats *out) { tr_allocator_stats(cu->alloc, out); }
void tr_cuda_trim(tr_cuda *cu) { tr_allocator_trim(cu->alloc); }
void tr_cuda_set_autocast(tr_cuda *cu, bool bf16) { cu->autocast_bf16 = bf16; }

/* ---------------------------------------------------------------- shared helpers */

const char *tc_device_str(tr_device d, char *buf, size_t cap) {
  if (d.kind == TR_CUDA)
    snprintf(buf, cap, "cuda:%d", d.index);
  else
    snprintf(buf, cap, "cpu");
  return buf;
}

tr_device tr_tensor_device(const tr_tensor *t) { return t->storage->device; }

bool tn_grads_on_cuda(tr_tensor *const *params, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (tn_on_cuda(params[i]->grad)) return true;
  return false;
}

int tc_ok(tr_ctx *ctx, const char *what, tck_status st) {
  return st ? nas_errf(&ctx->err, "cuda %s: %s", what, st) : NAS_OK;
}

int tc_check(tr_ctx *ctx, const char *op, int n, tr_tensor *const *ts) {
  for (int i = 0; i < n; i++) {
    const tr_tensor *t = ts[i];
    if (!t) continue;
    if (!tn_on_cuda(t))
      return nas_errf(&ctx->err,
                      "%s: input %d is on the cpu and another on cuda: inputs must be on one "
                      "device (tr_to_device moves them)",
                      op, i);
    if (!ctx->cuda)
      return nas_errf(&ctx->err,
                      "%s: input %d is on cuda:%d but ctx->cuda is NULL (set it to an engine "
                      "from tr_cuda_new)",
                      op, i, t->storage->device.index);
    if (t->storage->device.index != ctx->cuda->device)
      return nas_errf(&ctx->err, "%s: input %d is on cuda:%d, ctx->cuda on cuda:%d", op, i,
                      t->storage->device.index, ctx->cuda->device);
    if (t->dtype != TR_F32 && t->dtype != TR_F64)
      return nas_errf(&ctx->err,
                      "%s: input %d is bfloat16; CUDA ops take float32 or float64 (bf16 is "
                      "used inside linear, matmul and conv2d with tr_cuda_set_autocast)",
                      op, i);
  }
  return tn_check_dtypes(ctx, op, n, ts);
}

tck_layout tc_layout(const tr_tensor *t) {
  tck_layout l = {.ndim = t->ndim};
  memcpy(l.shape, t->shape, sizeof l.shape);
  memcpy(l.strides, t->strides, sizeof l.strides);
  return l;
}

tr_tensor *tc_empty(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape) {
  if (!ctx->cuda) return tr_fail(ctx, "cuda: ctx->cuda is NULL (no engine)");
  return tn_empty_on(ctx, ctx->cuda->alloc, TR_DEVICE_CUDA(ctx->cuda->device), dtype, ndim, shape);
}

tr_tensor *tc_zeros(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape) {
  tr_tensor *t = tc_empty(ctx, dtype, ndim, shape);
  if (t && tc_ok(ctx, "zeros", tck_memset0(tc_stream(ctx), tr_data(t), t->storage->nbytes))) {
    tr_release(t);
    return NULL;
  }
  return t;
}

tr_tensor *tc_empty_meta(tr_ctx *ctx, tr_dtype dtype, const tr_meta *m) {
  return tc_empty(ctx, dtype, m->ndim, m->shape);
}

tr_tensor *tc_empty_like(tr_ctx *ctx, const tr_tensor *t) {
  return tc_empty(ctx, t->dtype, t->ndim, t->shape);
}

tr_tensor *tc_upload_i32(tr_ctx *ctx, const int32_t *values, int64_t n) {
  int64_t shape[1] = {n};
  tr_tensor *t = tc_empty(ctx, TR_F32, 1, shape); /* 4-byte elements holding int32 bits */
  if (t &&
      tc_ok(ctx, "upload",
            tck_memcpy(tc_stream(ctx), tr_data(t), values, sizeof(int32_t) * (size_t)n, TCK_H2D))) {
    tr_release(t);
    return NULL;
  }
  return t;
}

int tc_copy_raw(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src) {
  tck_layout sl = tc_layout(src), dl = tc_layout(dst);
  return tc_ok(ctx, "copy",
               tck_copy(tc_stream(ctx), (int)src->dtype, tr_data(src), &sl, (int)dst->dtype,
                        tr_data(dst), &dl, dst->numel));
}

/* ---------------------------------------------------------------- tensor.c twins */

double tc_get(const tr_tensor *t, int64_t i) {
  int64_t off = 0, rest = i;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (rest % t->shape[d]) * t->strides[d];
    rest /= t->shape[d];
  }
  size_t es = tr_dtype_size(t->dtype);
  unsigned char bytes[8] = {0};
  if (tck_memcpy(tc_stream_of(t), bytes, (const char *)tr_data(t) + (size_t)off * es, es, TCK_D2H))
    return NAN;
  if (t->dtype == TR_F64) {
    double v;
    memcpy(&v, bytes, sizeof v);
    return v;
  }
  if (t->dtype == TR_BF16) { /* bf16 is the high half of a float32 */
    uint32_t bits = (uint32_t)bytes[0] << 16 | (uint32_t)bytes[1] << 24;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
  }
  float v;
  memcpy(&v, bytes, sizeof v);
  return v;
}

void tc_fill(tr_tensor *t, double value) {
  tck_layout l = tc_layout(t);
  (void)tck_fill(tc_stream_of(t), (int)t->dtype, tr_data(t), &l, t->numel, value);
  t->storage->version++;
}

void tc_scale(tr_tensor *t, double s) {
  tck_layout l = tc_layout(t);
  (void)tck_axpy(tc_stream_of(t), (int)t->dtype, t->numel, s, NULL, NULL, tr_data(t), &l);
}

/* Sum of squares without a ctx: scratch comes straight from the device (cudaMalloc), which
 * is fine for its one caller, gradient clipping, once per step and tensor. */
double tc_sumsq(const tr_tensor *t) {
  tck_stream s = tc_stream_of(t);
  size_t es = tr_dtype_size(t->dtype),
         contig_bytes = tr_is_contiguous(t) ? 0 : (size_t)t->numel * es;
  void *scratch = NULL;
  double sq = NAN;
  if (tck_malloc(s.device, sizeof(double) + contig_bytes, &scratch)) return NAN;
  const void *x = tr_data(t);
  tck_status st = NULL;
  if (contig_bytes) { /* a strided view: a contiguous copy after the double */
    tck_layout sl = tc_layout(t), dl = tc_layout(t);
    tn_contiguous_strides(t->ndim, t->shape, dl.strides);
    x = (char *)scratch + sizeof(double);
    st = tck_copy(s, (int)t->dtype, tr_data(t), &sl, (int)t->dtype, (void *)x, &dl, t->numel);
  }
  if (!st) st = tck_sumsq(s, (int)t->dtype, x, t->numel, scratch);
  if (!st) st = tck_memcpy(s, &sq, scratch, sizeof sq, TCK_D2H);
  (void)tck_free(s.device, scratch);
  return st ? NAN : sq;
}

/* ctx's engine runs t's device (t is CUDA). */
static int engine_for(tr_ctx *ctx, const char *op, const tr_tensor *t) {
  tr_tensor *ts[1] = {(tr_tensor *)t};
  if (t->dtype == TR_BF16 && ctx->cuda && ctx->cuda->device == t->storage->device.index)
    return NAS_OK; /* bf16 may be copied and converted, not computed on */
  return tc_check(ctx, op, 1, ts);
}

tr_tensor *tc_clone(tr_ctx *ctx, const tr_tensor *t) {
  if (engine_for(ctx, "clone", t)) return NULL;
  tr_tensor *c = tc_empty_like(ctx, t);
  if (c && tc_copy_raw(ctx, c, t)) {
    tr_release(c);
    return NULL;
  }
  return c;
}

tr_tensor *tc_contig(tr_ctx *ctx, const tr_tensor *t) {
  return tr_is_contiguous(t) ? tn_alias(ctx, t) : tc_clone(ctx, t);
}

tr_tensor *tc_to_dtype(tr_ctx *ctx, const tr_tensor *t, tr_dtype dtype) {
  if (t->dtype == dtype) return tc_contig(ctx, t);
  if (engine_for(ctx, "to_dtype", t)) return NULL;
  tr_tensor *c = tc_empty(ctx, dtype, t->ndim, t->shape);
  if (c && tc_copy_raw(ctx, c, t)) {
    tr_release(c);
    return NULL;
  }
  return c;
}

int tc_add_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha) {
  tr_tensor *ts[2] = {dst, (tr_tensor *)src};
  if (tc_check(ctx, "add_", 2, ts)) return NAS_ERR;
  if (dst->numel != src->numel)
    return nas_errf(&ctx->err, "add_: %lld elements += %lld", (long long)dst->numel,
                    (long long)src->numel);
  tck_layout sl = tc_layout(src), dl = tc_layout(dst);
  if (tc_ok(ctx, "add_",
            tck_axpy(tc_stream(ctx), (int)dst->dtype, dst->numel, alpha, tr_data(src), &sl,
                     tr_data(dst), &dl)))
    return NAS_ERR;
  dst->storage->version++;
  return NAS_OK;
}

int tc_mul_scalar_(tr_ctx *ctx, tr_tensor *t, double s) {
  if (tc_check(ctx, "mul_", 1, &t)) return NAS_ERR;
  tck_layout l = tc_layout(t);
  if (tc_ok(ctx, "mul_",
            tck_axpy(tc_stream(ctx), (int)t->dtype, t->numel, s, NULL, NULL, tr_data(t), &l)))
    return NAS_ERR;
  t->storage->version++;
  return NAS_OK;
}

/* ---------------------------------------------------------------- host <-> device */

/* A contiguous device copy of host tensor t (same dtype). */
static tr_tensor *upload(tr_ctx *ctx, const tr_tensor *t) {
  tr_tensor *hc = tn_contig(ctx, t);
  tr_tensor *d = hc ? tc_empty_like(ctx, hc) : NULL;
  if (d &&
      tc_ok(ctx, "copy to the device",
            tck_memcpy(tc_stream(ctx), tr_data(d), tr_data(hc), d->storage->nbytes, TCK_H2D))) {
    tr_release(d);
    d = NULL;
  }
  tr_release(hc);
  return d;
}

/* A contiguous host copy of device tensor t (same dtype). */
static tr_tensor *download(tr_ctx *ctx, const tr_tensor *t) {
  if (engine_for(ctx, "copy to the host", t)) return NULL;
  tr_tensor *dc = tc_contig(ctx, t);
  tr_tensor *h = dc ? tr_empty(ctx, t->dtype, t->ndim, t->shape) : NULL;
  if (h &&
      tc_ok(ctx, "copy to the host",
            tck_memcpy(tc_stream(ctx), tr_data(h), tr_data(dc), h->storage->nbytes, TCK_D2H))) {
    tr_release(h);
    h = NULL;
  }
  tr_release(dc);
  return h;
}

int tc_copy_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src) {
  if (dst->numel != src->numel)
    return nas_errf(&ctx->err, "copy_: %lld elements from %lld", (long long)dst->numel,
                    (long long)src->numel);
  if (!tn_on_cuda(dst)) { /* device to host: through a host copy */
    tr_tensor *h = download(ctx, src);
    int rc = h ? tr_copy_(ctx, dst, h) : NAS_ERR;
    tr_release(h);
    return rc;
  }
  if (engine_for(ctx, "copy_", dst) || (tn_on_cuda(src) && engine_for(ctx, "copy_", src)))
    return NAS_ERR; /* both on ctx's device: no copies between devices */
  tr_tensor *staged = tn_on_cuda(src) ? tr_retain((tr_tensor *)src) : upload(ctx, src);
  int rc = staged ? tc_copy_raw(ctx, dst, staged) : NAS_ERR;
  tr_release(staged);
  if (rc == NAS_OK) dst->storage->version++;
  return rc;
}

tr_tensor *tc_initial_grad(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad) {
  if (engine_for(ctx, "backward", root)) return NULL;
  if (grad) {
    if (grad->numel != root->numel || grad->dtype != root->dtype)
      return tr_fail(ctx, "backward: gradient has %lld elements for a tensor of %lld",
                     (long long)grad->numel, (long long)root->numel);
    return tn_on_cuda(grad) ? tc_contig(ctx, grad) : upload(ctx, grad);
  }
  if (root->numel != 1)
    return tr_fail(ctx,
                   "backward: a gradient is needed for a tensor of %lld elements "
                   "(only one-element outputs get 1 implicitly)",
                   (long long)root->numel);
  tr_tensor *g = tc_empty_like(ctx, root);
  if (g &&
      tc_ok(ctx, "backward", tck_fill(tc_stream(ctx), (int)g->dtype, tr_data(g), NULL, 1, 1.0))) {
    tr_release(g);
    return NULL;
  }
  return g;
}

/* ---------------------------------------------------------------- tr_to_device */

/* Why ctx cannot reach device: no engine (and why there may be none), or another one. */
static tr_tensor *no_engine(tr_ctx *ctx, const char *op, tr_device device) {
  if (ctx->cuda)
    return tr_fail(ctx, "%s: cuda:%d requested, but ctx->cuda is the engine of cuda:%d", op,
                   device.index, ctx->cuda->device);
  nas_err why = {{0}};
  int count = tr_cuda_device_count(&why);
  if (count == 0) return tr_fail(ctx, "%s: cuda:%d requested: %s", op, device.index, why.msg);
  return tr_fail(ctx, "%s: cuda:%d requested but ctx->cuda is NULL (tr_cuda_new gives an engine)",
                 op, device.index);
}

typedef struct {
  tr_node base;
  tr_device from; /* the device the input was on */
} to_copy_node;

static int to_copy_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  bool to_cuda = ((to_copy_node *)node)->from.kind == TR_CUDA;
  gi[0] = to_cuda == tn_on_cuda(g) ? tn_contig(ctx, g)
          : to_cuda                ? upload(ctx, g)
                                   : download(ctx, g);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops to_copy_ops = {"ToCopyBackward", to_copy_backward,
                                        sizeof(to_copy_node), NULL};

tr_tensor *tr_to_device(tr_ctx *ctx, tr_tensor *t, tr_device device) {
  tr_device from = tr_tensor_device(t);
  char a[32], b[32];
  if (device.kind != TR_CPU && device.kind != TR_CUDA)
    return tr_fail(ctx, "to_device: unknown device kind %d", (int)device.kind);
  if (device.kind == TR_CPU) device.index = 0;
  if (from.kind == device.kind && from.index == device.index) return tr_retain(t);
  if (from.kind == TR_CUDA && device.kind == TR_CUDA)
    return tr_fail(ctx, "to_device: %s to %s: copies between CUDA devices are not supported",
                   tc_device_str(from, a, sizeof a), tc_device_str(device, b, sizeof b));
  tr_device cuda_side = device.kind == TR_CUDA ? device : from;
  if (!ctx->cuda || ctx->cuda->device != cuda_side.index)
    return no_engine(ctx, "to_device", cuda_side);
  tr_tensor *out = device.kind == TR_CUDA ? upload(ctx, t) : download(ctx, t);
  int rc = out ? NAS_OK : NAS_ERR;
  to_copy_node *node = ag_record(ctx, &to_copy_ops, 1, &t, out, &rc);
  if (node) node->from = from;
  return ag_output(out, rc);
}

/* ---------------------------------------------------------------- modules */

/* Storages already moved: from (a held reference, so its address stays unique) to its copy. */
typedef struct {
  tr_storage **from, **to;
  size_t n, cap;
} storage_map;

static void map_free(storage_map *map) {
  for (size_t i = 0; i < map->n; i++) {
    tn_storage_release(map->from[i]);
    tn_storage_release(map->to[i]);
  }
  free(map->from);
  free(map->to);
}

/* A copy of storage s (holding dtype elements) on device, same bytes. */
static tr_storage *storage_copy(tr_ctx *ctx, const tr_storage *s, tr_dtype dtype,
                                tr_device device) {
  int64_t shape[1] = {(int64_t)(s->nbytes / tr_dtype_size(dtype))};
  tr_allocator *alloc = device.kind == TR_CUDA ? ctx->cuda->alloc : ctx->alloc;
  tr_tensor *carrier = tn_empty_on(ctx, alloc, device, dtype, 1, shape);
  if (!carrier) return NULL;
  int kind = device.kind == TR_CUDA ? TCK_H2D : TCK_D2H;
  if (tc_ok(ctx, "module to device",
            tck_memcpy(tc_stream(ctx), carrier->storage->data, s->data, carrier->storage->nbytes,
                       kind))) {
    tr_release(carrier);
    return NULL;
  }
  tr_storage *copy = carrier->storage;
  copy->refs++;
  tr_release(carrier);
  return copy;
}

/* Points t at the copy of its storage on device (made on first sight). */
static int move_tensor(tr_ctx *ctx, tr_tensor *t, tr_device device, storage_map *map) {
  if (!t) return NAS_OK;
  tr_device at = tr_tensor_device(t);
  if (at.kind == device.kind && at.index == device.index) return NAS_OK;
  tr_storage *to = NULL;
  for (size_t i = 0; i < map->n && !to; i++)
    if (map->from[i] == t->storage) to = map->to[i];
  if (!to) {
    if (map->n == map->cap) {
      size_t ncap = map->cap ? 2 * map->cap : 16;
      tr_storage **f = realloc(map->from, ncap * sizeof *f);
      if (f) map->from = f;
      tr_storage **g = f ? realloc(map->to, ncap * sizeof *g) : NULL;
      if (!g) return nas_errf(&ctx->err, "module to device: out of memory");
      map->to = g;
      map->cap = ncap;
    }
    if (!(to = storage_copy(ctx, t->storage, t->dtype, device))) return NAS_ERR;
    map->from[map->n] = t->storage;
    t->storage->refs++;
    map->to[map->n++] = to;
  }
  to->refs++;
  tn_storage_release(t->storage);
  t->storage = to;
  to->version++;
  return NAS_OK;
}

int tr_module_to_device(tr_ctx *ctx, tr_module *m, tr_device device) {
  if (device.kind == TR_CPU) device.index = 0;
  if (device.kind == TR_CUDA && (!ctx->cuda || ctx->cuda->device != device.index)) {
    no_engine(ctx, "module to device", device);
    return NAS_ERR;
  }
  tr_param_list list = {0};
  if (tr_module_parameters(m, true, &list, &ctx->err)) return NAS_ERR;
  storage_map map = {0};
  int rc = NAS_OK;
  for (size_t i = 0; i < list.n && rc == NAS_OK; i++) {
    tr_tensor *t = list.items[i];
    tr_device at = tr_tensor_device(t);
    if (at.kind == TR_CUDA && device.kind == TR_CUDA && at.index != device.index)
      rc = nas_errf(&ctx->err,
                    "module to device: %s is on cuda:%d; copies between CUDA devices "
                    "are not supported",
                    list.names[i], at.index);
    else if (at.kind == TR_CUDA && (!ctx->cuda || ctx->cuda->device != at.index) &&
             !no_engine(ctx, "module to device", at))
      rc = NAS_ERR;
    if (rc == NAS_OK) rc = move_tensor(ctx, t, device, &map);
    if (rc == NAS_OK) rc = move_tensor(ctx, t->grad, device, &map);
  }
  map_free(&map);
  tr_param_list_free(&list);
  return rc;
}

/* ---------------------------------------------------------------- the core's table */

static void *block_new(int device, size_t size) {
  void *ptr = NULL;
  return tck_malloc(device, size, &ptr) ? NULL : ptr;
}

/* A cudaFree error here has no caller to tell: the block is lost either way. */
static void block_free(int device, void *ptr) { (void)tck_free(device, ptr); }

const tn_device_ops tc_device_ops = {
    .block_new = block_new,
    .block_free = block_free,
    .get = tc_get,
    .sumsq = tc_sumsq,
    .fill = tc_fill,
    .scale = tc_scale,
    .contig = tc_contig,
    .clone = tc_clone,
    .to_dtype = tc_to_dtype,
    .add_ = tc_add_,
    .copy_ = tc_copy_,
    .mul_scalar_ = tc_mul_scalar_,
    .initial_grad = tc_initial_grad,
};
