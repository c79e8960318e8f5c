/* cuda_ops: the CUDA compute steps of the elementwise, reduce, matmul, loss and shape ops,
 * and the three ops whose side data lives on the device (dropout, cross-entropy, embedding).
 *
 * The public ops (trainer/ops_*.c) check inputs, compute shapes, record nodes and compose
 * backward for both devices; where their input is on a device they call the kernel functions
 * here, which run trainer/cuda/cuda_kernels.cu on ctx->cuda's stream with the math of the CPU
 * kernels (docs/engine.md). Integer side data (labels, ids) lives on the device as int32 bits
 * in 4-byte tensors (tc_upload_i32), saved like any tensor.
 * Mixed precision: with autocast on, every GEMM here (tc_gemm: matmul, linear, conv, forward
 * and backward) multiplies bf16 copies of float32 operands with float32 accumulation. */
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda/cuda_internal.h"

/* ---------------------------------------------------------------- elementwise */

int tc_binary_fwd(tr_ctx *ctx, int op, const char *name, tr_tensor *out, const tr_tensor *a,
                  const int64_t *sa, const tr_tensor *b, const int64_t *sb) {
  tck_layout ol = tc_layout(out), al = ol, bl = ol;
  memcpy(al.strides, sa, sizeof(int64_t) * (size_t)out->ndim);
  memcpy(bl.strides, sb, sizeof(int64_t) * (size_t)out->ndim);
  return tc_ok(ctx, name,
               tck_binary(tc_stream(ctx), (int)a->dtype, op, tr_data(a), &al, tr_data(b), &bl,
                          tr_data(out), &ol));
}

int tc_unary_fwd(tr_ctx *ctx, const char *name, int op, const tr_tensor *x, tr_tensor *y,
                 double s) {
  return tc_ok(ctx, name,
               tck_unary_fwd(tc_stream(ctx), (int)x->dtype, op, tr_data(x), tr_data(y), x->numel, s));
}

int tc_unary_bwd(tr_ctx *ctx, const char *name, int op, const tr_tensor *saved,
                 const tr_tensor *dy, tr_tensor *dx, double s) {
  return tc_ok(ctx, name,
               tck_unary_bwd(tc_stream(ctx), (int)dy->dtype, op, saved ? tr_data(saved) : NULL,
                             tr_data(dy), tr_data(dx), dy->numel, s));
}

/* ---------------------------------------------------------------- dropout */

/* a * mask for a mask of a's shape, no history. */
static tr_tensor *mul_by_mask(tr_ctx *ctx, const char *name, const tr_tensor *a,
                              const tr_tensor *mask) {
  tr_tensor *out = tc_empty(ctx, a->dtype, a->ndim, a->shape);
  if (out && tc_binary_fwd(ctx, TCK_MUL, name, out, a, a->strides, mask, mask->strides)) {
    tr_free(out);
    return NULL;
  }
  return out;
}

/* saved 0: the mask, 0 or 1/(1-p) per element. */
static int dropout_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *mask = ag_saved(ctx, node, 0);
  gi[0] = mask ? mul_by_mask(ctx, "DropoutBackward", g, mask) : NULL;
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops dropout_ops = {"DropoutBackward", dropout_backward};

/* The mask is drawn on the host from ctx's generator exactly as the CPU op draws it, so a
 * seeded run drops the same elements on either backend. */
static tr_tensor *dropout_mask(tr_ctx *ctx, const tr_tensor *a, double p) {
  tr_tensor *host = tr_empty(ctx, a->dtype, a->ndim, a->shape);
  if (!host) return NULL;
  uint32_t threshold = (uint32_t)(p * 16777216.0); /* keep when a 24-bit draw >= p */
  double scale = 1.0 / (1.0 - p);
  for (int64_t i = 0; i < a->numel; i++) {
    double v = (tr_rand_u64(ctx) >> 40) >= threshold ? scale : 0.0;
    if (a->dtype == TR_F32)
      tr_f32(host)[i] = (float)v;
    else
      tr_f64(host)[i] = v;
  }
  tr_tensor *mask = tr_to_device(ctx, host, tr_tensor_device(a));
  tr_free(host);
  return mask;
}

tr_tensor *tc_dropout(tr_ctx *ctx, tr_tensor *a, double p) {
  tr_tensor *mask = dropout_mask(ctx, a, p);
  tr_tensor *y = mask ? mul_by_mask(ctx, "dropout", a, mask) : NULL;
  tr_node *node = NULL;
  int rc = y ? ag_record(ctx, &dropout_ops, 1, &a, y, &node) : NAS_ERR;
  if (rc == NAS_OK) rc = ag_save(ctx, node, mask);
  tr_free(mask);
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- reductions */

int tc_sum_axis(tr_ctx *ctx, const tr_tensor *x, tr_tensor *out, int64_t outer, int64_t n,
                int64_t inner, double scale) {
  return tc_ok(ctx, "sum",
               tck_sum_axis(tc_stream(ctx), (int)x->dtype, tr_data(x), tr_data(out), outer, n,
                            inner, scale));
}

int tc_softmax_fwd(tr_ctx *ctx, const tr_tensor *x, tr_tensor *y, int64_t outer, int64_t n,
                   int64_t inner, bool log_out) {
  return tc_ok(ctx, "softmax",
               tck_softmax_fwd(tc_stream(ctx), (int)x->dtype, tr_data(x), tr_data(y), outer, n,
                               inner, log_out));
}

int tc_softmax_bwd(tr_ctx *ctx, const char *name, const tr_tensor *y, const tr_tensor *dy,
                   tr_tensor *dx, int64_t outer, int64_t n, int64_t inner, bool log_out) {
  return tc_ok(ctx, name,
               tck_softmax_bwd(tc_stream(ctx), (int)y->dtype, tr_data(y), tr_data(dy), tr_data(dx),
                               outer, n, inner, log_out));
}

/* ---------------------------------------------------------------- GEMM */

/* A 2-D matrix as cuBLAS sees it: data, whether it is stored transposed, leading dim. */
typedef struct {
  tr_tensor *owner; /* owned: t itself (retained), a contiguous copy, or a bf16 copy */
  bool trans;
  int64_t ld;
} gemm_operand;

static int operand_of(tr_ctx *ctx, tr_tensor *t, bool bf16, gemm_operand *op) {
  int64_t rows = t->shape[0], cols = t->shape[1];
  if (bf16) { /* autocast: a contiguous bf16 copy */
    *op = (gemm_operand){tc_to_dtype(ctx, t, TR_BF16), false, cols};
  } else if (t->strides[1] == 1 && (t->strides[0] == cols || rows == 1)) {
    *op = (gemm_operand){tr_retain(t), false, cols};
  } else if (t->strides[0] == 1 && (t->strides[1] == rows || cols == 1)) {
    *op = (gemm_operand){tr_retain(t), true, rows};
  } else {
    *op = (gemm_operand){tc_contig(ctx, t), false, cols};
  }
  if (op->ld < 1) op->ld = 1;
  return op->owner ? NAS_OK : NAS_ERR;
}

/* float32 results under autocast. */
tr_tensor *tc_gemm(tr_ctx *ctx, tr_tensor *a, bool ta, tr_tensor *b, bool tb) {
  bool bf16 = ctx->cuda->autocast_bf16 && a->dtype == TR_F32;
  gemm_operand oa, ob;
  if (operand_of(ctx, a, bf16, &oa)) return NULL;
  if (operand_of(ctx, b, bf16, &ob)) {
    tr_free(oa.owner);
    return NULL;
  }
  int64_t m = ta ? a->shape[1] : a->shape[0], k = ta ? a->shape[0] : a->shape[1];
  int64_t n = tb ? b->shape[0] : b->shape[1];
  int64_t shape[2] = {m, n};
  tr_tensor *c = k == 0 ? tc_zeros(ctx, a->dtype, 2, shape) : tc_empty(ctx, a->dtype, 2, shape);
  if (c && k > 0 &&
      tc_ok(ctx, "gemm",
            tck_gemm(tc_stream(ctx), ctx->cuda->blas, (int)oa.owner->dtype, (int)c->dtype,
                     ta != oa.trans, tb != ob.trans, m, n, k, 1.0, tr_data(oa.owner), oa.ld,
                     tr_data(ob.owner), ob.ld, 0.0, tr_data(c), n))) {
    tr_free(c);
    c = NULL;
  }
  tr_free(oa.owner);
  tr_free(ob.owner);
  return c;
}

/* y += b on every row, in place (the binary kernel reads each element before writing it). */
static int add_bias(tr_ctx *ctx, tr_tensor *y, const tr_tensor *b) {
  int64_t sb[2] = {0, b->strides[0]};
  return tc_binary_fwd(ctx, TCK_ADD, "linear", y, y, y->strides, b, sb);
}

tr_tensor *tc_linear_fwd(tr_ctx *ctx, tr_tensor *x2, tr_tensor *w, tr_tensor *b) {
  tr_tensor *y = tc_gemm(ctx, x2, false, w, true);
  if (y && b && add_bias(ctx, y, b)) {
    tr_free(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- cross-entropy */

/* saved: probs (N, C), labels (N int32). */
static int cross_entropy_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *probs = ag_saved(ctx, node, 0), *labels = probs ? ag_saved(ctx, node, 1) : NULL;
  tr_tensor *gc = labels ? tc_contig(ctx, g) : NULL;
  tr_tensor *dx = gc ? tc_empty_like(ctx, probs) : NULL;
  if (dx &&
      tc_ok(ctx, "CrossEntropyBackward",
            tck_cross_entropy_bwd(tc_stream(ctx), (int)probs->dtype, tr_data(probs), tc_i32(labels),
                                  tr_data(gc), tr_data(dx), probs->shape[0], probs->shape[1]))) {
    tr_free(dx);
    dx = NULL;
  }
  tr_free(gc);
  gi[0] = dx;
  return dx ? NAS_OK : NAS_ERR;
}
static const tr_node_ops cross_entropy_ops = {"CrossEntropyBackward", cross_entropy_backward};

tr_tensor *tc_cross_entropy(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels) {
  int64_t rows = logits->shape[0], classes = logits->shape[1];
  tr_tensor *x = tc_contig(ctx, logits);
  tr_tensor *lab = x ? tc_upload_i32(ctx, labels, rows) : NULL;
  tr_tensor *probs = lab ? tc_empty_like(ctx, x) : NULL;
  tr_tensor *per_row = probs ? tc_empty(ctx, logits->dtype, 1, &rows) : NULL;
  int rc = per_row
               ? tc_ok(ctx, "cross_entropy",
                       tck_cross_entropy_fwd(tc_stream(ctx), (int)x->dtype, tr_data(x), tc_i32(lab),
                                             tr_data(probs), tr_data(per_row), rows, classes))
               : NAS_ERR;
  tr_tensor *mean = rc == NAS_OK ? tn_sum_dims(ctx, per_row, 1u, 1.0 / (double)rows) : NULL;
  tr_tensor *loss = mean ? tn_view(ctx, mean, 0, NULL) : NULL;
  tr_node *node = NULL;
  rc = loss ? ag_record(ctx, &cross_entropy_ops, 1, &logits, loss, &node) : NAS_ERR;
  if (rc == NAS_OK) rc = ag_save(ctx, node, probs) || ag_save(ctx, node, lab);
  tr_free(mean);
  tr_free(per_row);
  tr_free(probs);
  tr_free(lab);
  tr_free(x);
  if (rc) {
    tr_free(loss);
    return NULL;
  }
  return loss;
}

/* ---------------------------------------------------------------- embedding */

/* saved 0: the ids (int32 on the device); ia[0]: their count. */
static int embedding_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *ids = ag_saved(ctx, node, 0);
  tr_tensor *gc = ids ? tc_contig(ctx, g) : NULL;
  tr_tensor *dw = gc ? tc_empty_meta(ctx, g->dtype, &node->in_meta[0]) : NULL;
  if (dw && tc_ok(ctx, "EmbeddingBackward",
                  tck_embedding_bwd(tc_stream(ctx), (int)g->dtype, tr_data(gc), tc_i32(ids),
                                    tr_data(dw), node->ia[0], dw->shape[0], dw->shape[1]))) {
    tr_free(dw);
    dw = NULL;
  }
  tr_free(gc);
  gi[0] = dw;
  return dw ? NAS_OK : NAS_ERR;
}
static const tr_node_ops embedding_ops = {"EmbeddingBackward", embedding_backward};

tr_tensor *tc_embedding(tr_ctx *ctx, tr_tensor *weight, int64_t n, const int32_t *ids) {
  int64_t shape[2] = {n, weight->shape[1]};
  tr_tensor *w = tc_contig(ctx, weight);
  tr_tensor *dev_ids = w ? tc_upload_i32(ctx, ids, n) : NULL;
  tr_tensor *out = dev_ids ? tc_empty(ctx, weight->dtype, 2, shape) : NULL;
  int rc = out ? tc_ok(ctx, "embedding",
                       tck_embedding_fwd(tc_stream(ctx), (int)w->dtype, tr_data(w), tc_i32(dev_ids),
                                         tr_data(out), n, shape[1]))
               : NAS_ERR;
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &embedding_ops, 1, &weight, out, &node);
  if (node) {
    node->ia[0] = n;
    rc = ag_save(ctx, node, dev_ids);
  }
  tr_free(dev_ids);
  tr_free(w);
  if (rc) {
    tr_free(out);
    return NULL;
  }
  return out;
}
