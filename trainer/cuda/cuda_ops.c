/* cuda_ops: the CUDA compute steps of the elementwise, reduce, matmul, loss and shape ops.
 *
 * The public ops (trainer/ops/ops_*.c) check inputs, compute shapes, record nodes, keep side
 * data and compose backward for both devices; where their input is on a device they call the
 * kernel functions here, which run trainer/cuda/cuda_kernels.cu on ctx->cuda's stream with
 * the math of the CPU kernels (docs/engine.md). Integer side data (labels, ids) is int32 bits
 * in 4-byte tensors (tc_upload_i32).
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

/* ---------------------------------------------------------------- reductions */

int tc_sum_axis(tr_ctx *ctx, const tr_tensor *x, tr_tensor *out, int64_t outer, int64_t n,
                int64_t inner, double scale) {
  int64_t parts = tck_sum_scratch(outer, n, inner);
  tr_tensor *scratch = parts ? tc_empty(ctx, TR_F64, 1, &parts) : NULL;
  if (parts && !scratch) return NAS_ERR;
  /* released at once: the allocator hands the block out again only to later work on the
   * same stream, which runs after this sum */
  int rc = tc_ok(ctx, "sum",
                 tck_sum_axis(tc_stream(ctx), (int)x->dtype, tr_data(x), tr_data(out), outer, n,
                              inner, scale, scratch ? tr_f64(scratch) : NULL));
  tr_release(scratch);
  return rc;
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
    tr_release(oa.owner);
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
    tr_release(c);
    c = NULL;
  }
  tr_release(oa.owner);
  tr_release(ob.owner);
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
    tr_release(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- cross-entropy */

tr_tensor *tc_cross_entropy_fwd(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *labels,
                                tr_tensor *probs) {
  int64_t rows = x->shape[0], classes = x->shape[1];
  tr_tensor *per_row = tc_empty(ctx, x->dtype, 1, &rows);
  int rc = per_row
               ? tc_ok(ctx, "cross_entropy",
                       tck_cross_entropy_fwd(tc_stream(ctx), (int)x->dtype, tr_data(x),
                                             tc_i32(labels), tr_data(probs), tr_data(per_row),
                                             rows, classes))
               : NAS_ERR;
  tr_tensor *mean = rc == NAS_OK ? tn_sum_dims(ctx, per_row, 1u, 1.0 / (double)rows) : NULL;
  tr_tensor *loss = mean ? tn_view(ctx, mean, 0, NULL) : NULL;
  tr_release(mean);
  tr_release(per_row);
  return loss;
}

int tc_cross_entropy_bwd(tr_ctx *ctx, const tr_tensor *probs, const tr_tensor *labels,
                         const tr_tensor *dloss, tr_tensor *dx) {
  tr_tensor *gc = tc_contig(ctx, dloss);
  int rc = gc ? tc_ok(ctx, "CrossEntropyBackward",
                      tck_cross_entropy_bwd(tc_stream(ctx), (int)probs->dtype, tr_data(probs),
                                            tc_i32(labels), tr_data(gc), tr_data(dx),
                                            probs->shape[0], probs->shape[1]))
              : NAS_ERR;
  tr_release(gc);
  return rc;
}

/* ---------------------------------------------------------------- embedding */

int tc_embedding_fwd(tr_ctx *ctx, const tr_tensor *w, const tr_tensor *ids, tr_tensor *out) {
  return tc_ok(ctx, "embedding",
               tck_embedding_fwd(tc_stream(ctx), (int)w->dtype, tr_data(w), tc_i32(ids),
                                 tr_data(out), ids->numel, w->shape[1]));
}

int tc_embedding_bwd(tr_ctx *ctx, const tr_tensor *dy, const tr_tensor *ids, tr_tensor *dw) {
  return tc_ok(ctx, "EmbeddingBackward",
               tck_embedding_bwd(tc_stream(ctx), (int)dy->dtype, tr_data(dy), tc_i32(ids),
                                 tr_data(dw), ids->numel, dw->shape[0], dw->shape[1]));
}
