/* ops_shape: reshape/view, transpose, narrow, contiguous, concat and embedding, each forward
 * beside its backward.
 *
 * reshape, transpose and narrow return views (new tensor headers on the input's storage,
 * sharing its version counter); reshape copies first only when the input is not contiguous.
 * Gradients come back contiguous in the input's shape.
 * Every op here serves both devices: views are headers either way, and copies go through
 * helpers that follow the tensor's device (tn_contig, tn_clone, tr_copy_). Embedding keeps
 * its ids as int32 on the weight's device; only its compute steps split by device
 * (tc_embedding_*, trainer/cuda/cuda_ops.c). */
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/dispatch.h"

/* The view t[..., start:start+length, ...] along dim d (no history). */
static tr_tensor *narrow_alias(tr_ctx *ctx, const tr_tensor *t, int d, int64_t start,
                               int64_t length) {
  tr_tensor *v = tn_alias(ctx, t);
  if (!v) return NULL;
  v->offset += start * t->strides[d];
  v->shape[d] = length;
  v->numel = tn_prod(v->shape, 0, v->ndim);
  return v;
}

/* ---------------------------------------------------------------- reshape */

static int reshape_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *gc = tn_contig(ctx, g);
  gi[0] = gc ? tn_view(ctx, gc, node->in_meta[0].ndim, node->in_meta[0].shape) : NULL;
  tr_release(gc);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops reshape_ops = {"ViewBackward", reshape_backward, 0, NULL};

tr_tensor *tr_reshape(tr_ctx *ctx, tr_tensor *t, int ndim, const int64_t *shape) {
  int64_t shp[TR_MAX_DIMS], known = 1;
  int infer = -1;
  if (tn_check_inputs(ctx, "reshape", 1, &t)) return NULL;
  if (ndim < 0 || ndim > TR_MAX_DIMS) return tr_fail(ctx, "reshape: %d dims", ndim);
  for (int d = 0; d < ndim; d++) { /* one -1 is inferred from the others */
    shp[d] = shape[d];
    if (shape[d] == -1 && infer < 0)
      shp[infer = d] = 1;
    else if (shape[d] < 0)
      return tr_fail(ctx, "reshape: size %lld at dim %d (one -1 may be inferred, no other "
                          "negative size)", (long long)shape[d], d);
  }
  if (!tn_numel_fits(ndim, shp, &known))
    return tr_fail(ctx, "reshape: the shape's element count overflows int64");
  if (infer >= 0) shp[infer] = known ? t->numel / known : 0;
  int64_t numel = tn_prod(shp, 0, ndim); /* at most t->numel when inferred, else known */
  if (numel != t->numel)
    return tr_fail(ctx, "reshape: %lld elements cannot take a shape of %lld", (long long)t->numel,
                   (long long)numel);
  tr_tensor *c = tn_contig(ctx, t);
  tr_tensor *out = c ? tn_view(ctx, c, ndim, shp) : NULL;
  tr_release(c);
  int rc = out ? NAS_OK : NAS_ERR;
  ag_record(ctx, &reshape_ops, 1, &t, out, &rc);
  return ag_output(out, rc);
}

/* ---------------------------------------------------------------- transpose */

typedef struct {
  tr_node base;
  int dim0, dim1;
} transpose_node;

static int transpose_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *v = tn_alias(ctx, g);
  if (!v) return NAS_ERR;
  int d0 = ((transpose_node *)node)->dim0, d1 = ((transpose_node *)node)->dim1;
  int64_t s = v->shape[d0], st = v->strides[d0];
  v->shape[d0] = v->shape[d1];
  v->strides[d0] = v->strides[d1];
  v->shape[d1] = s;
  v->strides[d1] = st;
  gi[0] = tn_clone(ctx, v);
  tr_release(v);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops transpose_ops = {"TransposeBackward", transpose_backward,
                                          sizeof(transpose_node), NULL};

tr_tensor *tr_transpose(tr_ctx *ctx, tr_tensor *t, int dim0, int dim1) {
  if (tn_check_inputs(ctx, "transpose", 1, &t)) return NULL;
  int d0 = tn_dim(t->ndim, dim0), d1 = tn_dim(t->ndim, dim1);
  if (d0 < 0 || d1 < 0)
    return tr_fail(ctx, "transpose: dims %d, %d out of range for %d dims", dim0, dim1, t->ndim);
  tr_tensor *out = tn_alias(ctx, t);
  if (!out) return NULL;
  out->shape[d0] = t->shape[d1];
  out->strides[d0] = t->strides[d1];
  out->shape[d1] = t->shape[d0];
  out->strides[d1] = t->strides[d0];
  int rc = NAS_OK;
  transpose_node *node = ag_record(ctx, &transpose_ops, 1, &t, out, &rc);
  if (node) {
    node->dim0 = d0;
    node->dim1 = d1;
  }
  return ag_output(out, rc);
}

/* ---------------------------------------------------------------- narrow */

typedef struct {
  tr_node base;
  int dim;
  int64_t start, length;
} narrow_node;

static int narrow_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  narrow_node *n = (narrow_node *)node;
  tr_tensor *full = tn_zeros_dev(ctx, g, g->dtype, &node->in_meta[0]);
  tr_tensor *part = full ? narrow_alias(ctx, full, n->dim, n->start, n->length) : NULL;
  if (!part) {
    tr_release(full);
    return NAS_ERR;
  }
  int rc = tr_copy_(ctx, part, g);
  tr_release(part);
  gi[0] = full;
  return rc;
}
static const tr_node_ops narrow_ops = {"NarrowBackward", narrow_backward, sizeof(narrow_node),
                                       NULL};

tr_tensor *tr_narrow(tr_ctx *ctx, tr_tensor *t, int dim, int64_t start, int64_t length) {
  if (tn_check_inputs(ctx, "narrow", 1, &t)) return NULL;
  int d = tn_dim(t->ndim, dim);
  /* length against what is left after start: start + length may overflow */
  if (d < 0 || start < 0 || length < 0 || start > t->shape[d] || length > t->shape[d] - start)
    return tr_fail(ctx, "narrow: %lld from %lld along dim %d is outside the tensor",
                   (long long)length, (long long)start, dim);
  tr_tensor *out = narrow_alias(ctx, t, d, start, length);
  if (!out) return NULL;
  int rc = NAS_OK;
  narrow_node *node = ag_record(ctx, &narrow_ops, 1, &t, out, &rc);
  if (node) {
    node->dim = d;
    node->start = start;
    node->length = length;
  }
  return ag_output(out, rc);
}

/* ---------------------------------------------------------------- contiguous */

static int clone_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  (void)node;
  gi[0] = tn_contig(ctx, g);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops clone_ops = {"CloneBackward", clone_backward, 0, NULL};

tr_tensor *tr_contiguous(tr_ctx *ctx, tr_tensor *t) {
  if (tn_check_inputs(ctx, "contiguous", 1, &t)) return NULL;
  if (tr_is_contiguous(t)) return tr_retain(t);
  tr_tensor *out = tn_contig(ctx, t);
  int rc = out ? NAS_OK : NAS_ERR;
  ag_record(ctx, &clone_ops, 1, &t, out, &rc);
  return ag_output(out, rc);
}

/* ---------------------------------------------------------------- concat */

typedef struct {
  tr_node base;
  int dim;
  int64_t *sizes; /* owned: the size of each input along dim */
} concat_node;

static void concat_release(tr_node *node) {
  concat_node *n = (concat_node *)node;
  free(n->sizes);
  n->sizes = NULL;
}

static int concat_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  if (ag_live(ctx, node)) return NAS_ERR;
  const int64_t *sizes = ((concat_node *)node)->sizes;
  int d = ((concat_node *)node)->dim;
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NAS_ERR;
  int64_t start = 0;
  for (int i = 0; i < node->n_next; i++) {
    if (ag_wants(node, i)) {
      tr_tensor *view = narrow_alias(ctx, gc, d, start, sizes[i]);
      if (view) {
        gi[i] = tn_contig(ctx, view);
        tr_release(view);
      }
      if (!gi[i]) {
        tr_release(gc);
        return NAS_ERR;
      }
    }
    start += sizes[i];
  }
  tr_release(gc);
  return NAS_OK;
}
static const tr_node_ops concat_ops = {"CatBackward", concat_backward, sizeof(concat_node),
                                       concat_release};

/* Output shape of concat, or an error when the other dims disagree. */
static int concat_shape(tr_ctx *ctx, int n, tr_tensor *const *ts, int d, tr_meta *m) {
  *m = tn_meta(ts[0]);
  m->shape[d] = 0;
  for (int i = 0; i < n; i++) {
    if (ts[i]->ndim != m->ndim)
      return nas_errf(&ctx->err, "concat: input %d has %d dims, input 0 has %d", i, ts[i]->ndim,
                      m->ndim);
    for (int k = 0; k < m->ndim; k++)
      if (k != d && ts[i]->shape[k] != ts[0]->shape[k])
        return nas_errf(&ctx->err, "concat: input %d differs in size at dim %d", i, k);
    m->shape[d] += ts[i]->shape[d];
  }
  return NAS_OK;
}

/* Copies t into out[..., start:start + t->shape[d], ...] along d: one strided copy into the
 * view on a device, contiguous chunks on the host. */
static int copy_into_part(tr_ctx *ctx, tr_tensor *out, int d, int64_t start, const tr_tensor *t) {
  if (tn_on_cuda(out)) {
    tr_tensor *part = narrow_alias(ctx, out, d, start, t->shape[d]);
    int rc = part ? tc_copy_raw(ctx, part, t) : NAS_ERR;
    tr_release(part);
    return rc;
  }
  tr_tensor *c = tn_contig(ctx, t);
  if (!c) return NAS_ERR;
  size_t esz = tr_dtype_size(out->dtype);
  int64_t outer = tn_prod(out->shape, 0, d), inner = tn_prod(out->shape, d + 1, out->ndim);
  size_t chunk = (size_t)(t->shape[d] * inner) * esz;
  for (int64_t o = 0; o < outer; o++)
    memcpy((char *)tr_data(out) + ((size_t)(o * out->shape[d] + start) * (size_t)inner) * esz,
           (char *)tr_data(c) + (size_t)o * chunk, chunk);
  tr_release(c);
  return NAS_OK;
}

tr_tensor *tr_concat(tr_ctx *ctx, int n, tr_tensor *const *ts, int dim) {
  if (n < 1) return tr_fail(ctx, "concat: no inputs");
  if (tn_check_inputs(ctx, "concat", n, ts)) return NULL;
  int d = tn_dim(ts[0]->ndim, dim);
  tr_meta m;
  if (d < 0) return tr_fail(ctx, "concat: dim %d out of range", dim);
  if (concat_shape(ctx, n, ts, d, &m)) return NULL;
  tr_tensor *out = tn_empty_dev(ctx, ts[0], ts[0]->dtype, &m);
  int64_t *sizes = malloc(sizeof(int64_t) * (size_t)n);
  if (!out || !sizes) {
    tr_release(out);
    free(sizes);
    return out ? tr_fail(ctx, "concat: out of memory") : NULL;
  }
  int64_t start = 0;
  for (int i = 0; i < n && out; i++) {
    sizes[i] = ts[i]->shape[d];
    if (copy_into_part(ctx, out, d, start, ts[i])) {
      tr_release(out);
      out = NULL;
    }
    start += sizes[i];
  }
  int rc = out ? NAS_OK : NAS_ERR;
  concat_node *node = ag_record(ctx, &concat_ops, n, ts, out, &rc);
  if (node) {
    node->dim = d;
    node->sizes = sizes;
  } else {
    free(sizes);
  }
  return ag_output(out, rc);
}

/* ---------------------------------------------------------------- embedding */

/* n int32 values as the bits of a 4-byte tensor (the engine has no integer dtype) on like's
 * device: labels, ids (dispatch.h). */
tr_tensor *tn_i32_new(tr_ctx *ctx, const tr_tensor *like, const int32_t *values, int64_t n) {
  if (tn_on_cuda(like)) return tc_upload_i32(ctx, values, n);
  tr_tensor *t = tr_empty(ctx, TR_F32, 1, &n);
  if (t) memcpy(tr_data(t), values, sizeof(int32_t) * (size_t)n);
  return t;
}

typedef struct {
  tr_node base;
  tr_saved ids; /* the ids looked up (int32, tn_i32_new) */
} embedding_node;

static int embedding_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *ids = ag_saved(ctx, node, &((embedding_node *)node)->ids);
  tr_tensor *gc = ids ? tn_contig(ctx, g) : NULL;
  tr_tensor *dw = gc ? tn_zeros_dev(ctx, gc, g->dtype, &node->in_meta[0]) : NULL;
  int rc = dw ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && tn_on_cuda(dw)) {
    rc = tc_embedding_bwd(ctx, gc, ids, dw);
  } else if (rc == NAS_OK) {
    const int32_t *id = tr_data(ids);
    int64_t dim = dw->shape[1];
    size_t esz = tr_dtype_size(g->dtype);
    for (int64_t i = 0; i < ids->numel; i++)
      tn_axpy(g->dtype, dim, 1.0, (char *)tr_data(gc) + (size_t)(i * dim) * esz,
              (char *)tr_data(dw) + (size_t)((int64_t)id[i] * dim) * esz);
  }
  tr_release(gc);
  if (rc) {
    tr_release(dw);
    return NAS_ERR;
  }
  gi[0] = dw;
  return NAS_OK;
}
static const tr_node_ops embedding_ops = {"EmbeddingBackward", embedding_backward,
                                          sizeof(embedding_node), NULL};

/* The host's compute step: out (n, D) = the rows ids of w. */
static void embedding_host(const tr_tensor *w, const int32_t *ids, tr_tensor *out) {
  size_t row = (size_t)out->shape[1] * tr_dtype_size(w->dtype);
  for (int64_t i = 0; i < out->shape[0]; i++)
    memcpy((char *)tr_data(out) + (size_t)i * row, (char *)tr_data(w) + (size_t)ids[i] * row, row);
}

tr_tensor *tr_embedding(tr_ctx *ctx, tr_tensor *weight, int64_t n, const int32_t *ids) {
  if (tn_check_inputs(ctx, "embedding", 1, &weight)) return NULL;
  if (weight->ndim != 2) return tr_fail(ctx, "embedding: weight must be (V, D)");
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= weight->shape[0])
      return tr_fail(ctx, "embedding: id %d at %lld outside [0, %lld)", ids[i], (long long)i,
                     (long long)weight->shape[0]);
  tr_meta om = {2, {n, weight->shape[1]}};
  tr_tensor *w = tn_contig(ctx, weight);
  tr_tensor *id = w ? tn_i32_new(ctx, weight, ids, n) : NULL;
  tr_tensor *out = id ? tn_empty_dev(ctx, weight, weight->dtype, &om) : NULL;
  int rc = out ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && tn_on_cuda(out))
    rc = tc_embedding_fwd(ctx, w, id, out);
  else if (rc == NAS_OK)
    embedding_host(w, ids, out);
  tr_release(w);
  embedding_node *node = ag_record(ctx, &embedding_ops, 1, &weight, out, &rc);
  if (node) rc = ag_save(ctx, &node->base, &node->ids, id);
  tr_release(id);
  return ag_output(out, rc);
}
