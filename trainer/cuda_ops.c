/* cuda_ops: the CUDA twins of the elementwise, reduce, matmul, loss and shape ops, each
 * forward beside its backward (trainer/ops_*.c dispatch here when an input is on a device).
 *
 * The math is the CPU ops' (docs/engine.md), run by trainer/cuda_kernels.cu on ctx->cuda's
 * stream; nodes are recorded with the same names and the same saved tensors, and their
 * backward runs on the device as well. Integer side data (labels, ids) lives on the device
 * as int32 bits in 4-byte tensors (tc_upload_i32), saved like any tensor.
 * Mixed precision: with autocast on, every GEMM here (matmul, linear, forward and backward)
 * multiplies bf16 copies of float32 operands with float32 accumulation into float32. */
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda_internal.h"

/* ---------------------------------------------------------------- broadcasting */

/* Output meta of a op b (numpy broadcasting) and each input's layout aligned to it, stride 0
 * on stretched dims. */
static int broadcast(tr_ctx *ctx, const char *op, const tr_tensor *a, const tr_tensor *b,
                     tr_meta *m, tck_layout *al, tck_layout *bl) {
  m->ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
  *al = (tck_layout){.ndim = m->ndim};
  *bl = (tck_layout){.ndim = m->ndim};
  for (int d = 0; d < m->ndim; d++) {
    int da = d - (m->ndim - a->ndim), db = d - (m->ndim - b->ndim);
    int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      return nas_errf(&ctx->err, "%s: shapes do not broadcast (dim %d: %lld vs %lld)", op, d,
                      (long long)sa, (long long)sb);
    m->shape[d] = sa == 1 ? sb : sa;
    al->strides[d] = sa != 1 ? a->strides[da] : 0;
    bl->strides[d] = sb != 1 ? b->strides[db] : 0;
  }
  memcpy(al->shape, m->shape, sizeof al->shape);
  memcpy(bl->shape, m->shape, sizeof bl->shape);
  return NAS_OK;
}

/* a op b with no history. */
static tr_tensor *binary_raw(tr_ctx *ctx, int op, const char *name, const tr_tensor *a,
                             const tr_tensor *b) {
  tr_meta m;
  tck_layout al, bl;
  if (broadcast(ctx, name, a, b, &m, &al, &bl)) return NULL;
  tr_tensor *out = tc_empty_meta(ctx, a->dtype, &m);
  tck_layout ol = out ? tc_layout(out) : al;
  if (out && tc_ok(ctx, name,
                   tck_binary(tc_stream(ctx), (int)a->dtype, op, tr_data(a), &al, tr_data(b), &bl,
                              tr_data(out), &ol))) {
    tr_free(out);
    return NULL;
  }
  return out;
}

/* Sums a over the dims in mask, times scale, keeping them as size 1; no history. One axis at
 * a time, highest first, as the CPU. */
static tr_tensor *reduce_raw(tr_ctx *ctx, const tr_tensor *a, uint32_t mask, double scale) {
  tr_tensor *cur = tc_contig(ctx, a);
  for (int d = a->ndim - 1; d >= 0 && cur; d--) {
    if (!(mask & (1u << d))) continue;
    int64_t outer, n, inner;
    tn_split_at(cur, d, &outer, &n, &inner);
    tr_meta m = tn_meta(cur);
    m.shape[d] = 1;
    tr_tensor *next = tc_empty_meta(ctx, a->dtype, &m);
    if (next && tc_ok(ctx, "sum",
                      tck_sum_axis(tc_stream(ctx), (int)a->dtype, tr_data(cur), tr_data(next),
                                   outer, n, inner, scale))) {
      tr_free(next);
      next = NULL;
    }
    scale = 1.0; /* applied once */
    tr_free(cur);
    cur = next;
  }
  if (cur && scale != 1.0) tc_scale(cur, scale);
  return cur;
}

/* The backward of broadcasting: g summed over the dims m stretched, shaped like m. */
static tr_tensor *sum_to(tr_ctx *ctx, const tr_tensor *g, const tr_meta *m) {
  uint32_t mask = 0;
  for (int d = 0; d < g->ndim; d++) {
    int dm = d - (g->ndim - m->ndim);
    if ((dm < 0 || m->shape[dm] == 1) && g->shape[d] != 1) mask |= 1u << d;
  }
  tr_tensor *r = reduce_raw(ctx, g, mask, 1.0);
  tr_tensor *out = r ? tn_view(ctx, r, m->ndim, m->shape) : NULL;
  tr_free(r);
  return out;
}

/* -g, no history. */
static tr_tensor *negate(tr_ctx *ctx, const tr_tensor *g) {
  tr_tensor *out = tc_clone(ctx, g);
  if (out) tc_scale(out, -1.0);
  return out;
}

/* ---------------------------------------------------------------- binary ops */

/* sum_to(g op other) in the shape of input i. */
static tr_tensor *grad_through(tr_ctx *ctx, int op, const tr_tensor *g, const tr_tensor *other,
                               const tr_meta *m) {
  tr_tensor *full = binary_raw(ctx, op, "backward", g, other);
  tr_tensor *out = full ? sum_to(ctx, full, m) : NULL;
  tr_free(full);
  return out;
}

/* ia[0]: the op. saved: mul a, b; div b, out. */
static int binary_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  int op = (int)node->ia[0];
  tr_tensor *s0 = NULL, *s1 = NULL;
  if ((op == TCK_MUL || op == TCK_DIV) &&
      (!(s0 = ag_saved(ctx, node, 0)) || !(s1 = ag_saved(ctx, node, 1))))
    return NAS_ERR;
  if (ag_wants(node, 0)) {
    gi[0] = op == TCK_MUL   ? grad_through(ctx, TCK_MUL, g, s1, &node->in_meta[0])
            : op == TCK_DIV ? grad_through(ctx, TCK_DIV, g, s0, &node->in_meta[0])
                            : sum_to(ctx, g, &node->in_meta[0]);
    if (!gi[0]) return NAS_ERR;
  }
  if (!ag_wants(node, 1)) return NAS_OK;
  if (op == TCK_MUL) {
    gi[1] = grad_through(ctx, TCK_MUL, g, s0, &node->in_meta[1]);
  } else { /* add: g; sub: -g; div: -(g * out / b) */
    tr_tensor *t = op == TCK_DIV ? binary_raw(ctx, TCK_MUL, "backward", g, s1) : NULL;
    tr_tensor *u = t ? binary_raw(ctx, TCK_DIV, "backward", t, s0) : NULL;
    tr_tensor *s = sum_to(ctx, op == TCK_DIV ? u : g, &node->in_meta[1]);
    gi[1] = s && op != TCK_ADD ? negate(ctx, s) : tr_retain(s);
    tr_free(s);
    tr_free(t);
    tr_free(u);
  }
  return gi[1] ? NAS_OK : NAS_ERR;
}

static const tr_node_ops binary_ops[] = {
    {"AddBackward", binary_backward},
    {"SubBackward", binary_backward},
    {"MulBackward", binary_backward},
    {"DivBackward", binary_backward},
};

tr_tensor *tc_binary(tr_ctx *ctx, int op, tr_tensor *a, tr_tensor *b) {
  static const char *const names[] = {"add", "sub", "mul", "div"};
  tr_tensor *in[2] = {a, b};
  if (tc_check(ctx, names[op], 2, in)) return NULL;
  tr_tensor *out = binary_raw(ctx, op, names[op], a, b);
  if (!out) return NULL;
  tr_node *node;
  int rc = ag_record(ctx, &binary_ops[op], 2, in, out, &node);
  if (rc == NAS_OK && node) {
    node->ia[0] = op;
    if (op == TCK_MUL) rc = ag_save(ctx, node, a) || ag_save(ctx, node, b);
    if (op == TCK_DIV) rc = ag_save(ctx, node, b) || ag_save(ctx, node, out);
  }
  if (rc) {
    tr_free(out);
    return NULL;
  }
  return out;
}

/* ---------------------------------------------------------------- unary ops */

static bool saves_output(int op) {
  return op == TCK_RELU || op == TCK_TANH || op == TCK_SIGMOID || op == TCK_EXP;
}

static int unary_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  int op = (int)node->ia[0];
  tr_tensor *saved = NULL;
  if (op != TCK_SCALE && !(saved = ag_saved(ctx, node, 0))) return NAS_ERR;
  tr_tensor *gc = tc_contig(ctx, g);
  tr_tensor *dx = gc ? tc_empty_like(ctx, gc) : NULL;
  if (dx && tc_ok(ctx, node->ops->name,
                  tck_unary_bwd(tc_stream(ctx), (int)g->dtype, op, saved ? tr_data(saved) : NULL,
                                tr_data(gc), tr_data(dx), g->numel, node->fa[0]))) {
    tr_free(dx);
    dx = NULL;
  }
  tr_free(gc);
  gi[0] = dx;
  return dx ? NAS_OK : NAS_ERR;
}

static const tr_node_ops unary_ops[] = {
    {"ReluBackward", unary_backward},  {"GeluBackward", unary_backward},
    {"TanhBackward", unary_backward},  {"SigmoidBackward", unary_backward},
    {"ExpBackward", unary_backward},   {"LogBackward", unary_backward},
    {"ScaleBackward", unary_backward},
};

tr_tensor *tc_unary(tr_ctx *ctx, int op, tr_tensor *a, double s) {
  static const char *const names[] = {"relu", "gelu", "tanh", "sigmoid", "exp", "log", "scale"};
  if (tc_check(ctx, names[op], 1, &a)) return NULL;
  tr_tensor *x = tc_contig(ctx, a);
  tr_tensor *y = x ? tc_empty_like(ctx, x) : NULL;
  int rc = y ? tc_ok(ctx, names[op],
                     tck_unary_fwd(tc_stream(ctx), (int)a->dtype, op, tr_data(x), tr_data(y),
                                   a->numel, s))
             : NAS_ERR;
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &unary_ops[op], 1, &a, y, &node);
  if (node) {
    node->ia[0] = op;
    node->fa[0] = s;
    if (op != TCK_SCALE) rc = ag_save(ctx, node, saves_output(op) ? y : x);
  }
  tr_free(x);
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- dropout */

/* saved 0: the mask, 0 or 1/(1-p) per element. */
static int dropout_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *mask = ag_saved(ctx, node, 0);
  gi[0] = mask ? binary_raw(ctx, TCK_MUL, "DropoutBackward", g, mask) : NULL;
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

tr_tensor *tc_dropout(tr_ctx *ctx, tr_tensor *a, double p, bool training) {
  if (p < 0 || p >= 1) return tr_fail(ctx, "dropout: p = %g is outside [0, 1)", p);
  if (!training || p == 0) return tc_unary(ctx, TCK_SCALE, a, 1.0);
  if (tc_check(ctx, "dropout", 1, &a)) return NULL;
  tr_tensor *mask = dropout_mask(ctx, a, p);
  tr_tensor *y = mask ? binary_raw(ctx, TCK_MUL, "dropout", a, mask) : NULL;
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

/* ---------------------------------------------------------------- sum and mean */

/* ia[0]: the reduced dims; fa[0]: the scale. The gradient repeats over the reduced dims: a
 * stride-0 view of g copied out. */
static int reduce_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  const tr_meta *in = &node->in_meta[0];
  uint32_t reduced = (uint32_t)node->ia[0];
  tr_tensor *gc = tc_contig(ctx, g);
  tr_tensor *view = gc ? tn_alias(ctx, gc) : NULL;
  tr_tensor *out = view ? tc_empty_meta(ctx, g->dtype, in) : NULL;
  if (out) {
    view->ndim = in->ndim;
    memcpy(view->shape, in->shape, sizeof view->shape);
    int64_t stride = 1;
    for (int d = in->ndim - 1; d >= 0; d--) {
      bool r = reduced & (1u << d);
      view->strides[d] = r ? 0 : stride;
      stride *= r ? 1 : in->shape[d];
    }
    view->numel = out->numel;
    tck_layout vl = tc_layout(view), ol = tc_layout(out);
    if (tc_ok(ctx, node->ops->name,
              tck_copy(tc_stream(ctx), (int)g->dtype, tr_data(view), &vl, (int)g->dtype,
                       tr_data(out), &ol, out->numel))) {
      tr_free(out);
      out = NULL;
    }
    if (out && node->fa[0] != 1.0) tc_scale(out, node->fa[0]);
  }
  tr_free(view);
  tr_free(gc);
  gi[0] = out;
  return out ? NAS_OK : NAS_ERR;
}
static const tr_node_ops sum_ops = {"SumBackward", reduce_backward};
static const tr_node_ops mean_ops = {"MeanBackward", reduce_backward};

tr_tensor *tc_reduce(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim,
                     bool mean) {
  if (tc_check(ctx, mean ? "mean" : "sum", 1, &a)) return NULL;
  uint32_t mask = naxes ? 0 : (1u << a->ndim) - 1;
  for (int i = 0; i < naxes; i++) {
    int d = tn_dim(a->ndim, axes[i]);
    if (d < 0) return tr_fail(ctx, "sum: axis %d out of range for %d dims", axes[i], a->ndim);
    mask |= 1u << d;
  }
  int64_t count = 1;
  for (int d = 0; d < a->ndim; d++)
    if (mask & (1u << d)) count *= a->shape[d];
  double scale = mean ? 1.0 / (double)(count ? count : 1) : 1.0;
  tr_tensor *out = reduce_raw(ctx, a, mask, scale);
  if (!out) return NULL;
  if (!keepdim) { /* drop the size-1 dims: same data, fewer dims */
    int nd = 0;
    for (int d = 0; d < a->ndim; d++)
      if (!(mask & (1u << d))) out->shape[nd++] = a->shape[d];
    out->ndim = nd;
    tn_contiguous_strides(nd, out->shape, out->strides);
  }
  tr_node *node;
  if (ag_record(ctx, mean ? &mean_ops : &sum_ops, 1, &a, out, &node)) {
    tr_free(out);
    return NULL;
  }
  if (node) {
    node->ia[0] = mask;
    node->fa[0] = scale;
  }
  return out;
}

/* ---------------------------------------------------------------- softmax */

/* ia[0]: dim, ia[1]: log; saved 0: the output. */
static int softmax_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *y = ag_saved(ctx, node, 0);
  if (!y) return NAS_ERR;
  int64_t outer, n, inner;
  tn_split_at(y, (int)node->ia[0], &outer, &n, &inner);
  tr_tensor *gc = tc_contig(ctx, g);
  tr_tensor *dx = gc ? tc_empty_like(ctx, y) : NULL;
  if (dx && tc_ok(ctx, node->ops->name,
                  tck_softmax_bwd(tc_stream(ctx), (int)y->dtype, tr_data(y), tr_data(gc),
                                  tr_data(dx), outer, n, inner, node->ia[1] != 0))) {
    tr_free(dx);
    dx = NULL;
  }
  tr_free(gc);
  gi[0] = dx;
  return dx ? NAS_OK : NAS_ERR;
}
static const tr_node_ops softmax_ops = {"SoftmaxBackward", softmax_backward};
static const tr_node_ops log_softmax_ops = {"LogSoftmaxBackward", softmax_backward};

tr_tensor *tc_softmax(tr_ctx *ctx, tr_tensor *a, int dim, bool log_out) {
  if (tc_check(ctx, "softmax", 1, &a)) return NULL;
  int d = tn_dim(a->ndim, dim);
  if (d < 0) return tr_fail(ctx, "softmax: dim %d out of range for %d dims", dim, a->ndim);
  tr_tensor *x = tc_contig(ctx, a);
  tr_tensor *y = x ? tc_empty_like(ctx, x) : NULL;
  int64_t outer, n, inner;
  if (y) tn_split_at(x, d, &outer, &n, &inner);
  int rc = y ? tc_ok(ctx, "softmax",
                     tck_softmax_fwd(tc_stream(ctx), (int)a->dtype, tr_data(x), tr_data(y), outer,
                                     n, inner, log_out))
             : NAS_ERR;
  tr_free(x);
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, log_out ? &log_softmax_ops : &softmax_ops, 1, &a, y, &node);
  if (node) {
    node->ia[0] = d;
    node->ia[1] = log_out;
    rc = ag_save(ctx, node, y);
  }
  if (rc) {
    tr_free(y);
    return NULL;
  }
  return y;
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

/* C = op(A) op(B) for 2-D tensors, new (float32 under autocast). */
static tr_tensor *gemm_new(tr_ctx *ctx, tr_tensor *a, bool ta, tr_tensor *b, bool tb) {
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

static int matmul_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *a = ag_saved(ctx, node, 0), *b = a ? ag_saved(ctx, node, 1) : NULL;
  if (!b) return NAS_ERR;
  if (ag_wants(node, 0) && !(gi[0] = gemm_new(ctx, g, false, b, true))) return NAS_ERR;
  if (ag_wants(node, 1) && !(gi[1] = gemm_new(ctx, a, true, g, false))) return NAS_ERR;
  return NAS_OK;
}
static const tr_node_ops matmul_ops = {"MmBackward", matmul_backward};

tr_tensor *tc_matmul(tr_ctx *ctx, tr_tensor *a, tr_tensor *b) {
  tr_tensor *in[2] = {a, b};
  if (tc_check(ctx, "matmul", 2, in)) return NULL;
  if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0])
    return tr_fail(ctx, "matmul: shapes (%lld, %lld) @ (%lld, %lld) do not fit",
                   (long long)a->shape[0], (long long)(a->ndim > 1 ? a->shape[1] : 0),
                   (long long)b->shape[0], (long long)(b->ndim > 1 ? b->shape[1] : 0));
  tr_tensor *c = gemm_new(ctx, a, false, b, false);
  if (!c) return NULL;
  tr_node *node;
  int rc = ag_record(ctx, &matmul_ops, 2, in, c, &node);
  if (rc == NAS_OK) rc = ag_save(ctx, node, a) || ag_save(ctx, node, b);
  if (rc) {
    tr_free(c);
    return NULL;
  }
  return c;
}

/* x (..., in) seen as (rows, in). */
static tr_tensor *as_rows(tr_ctx *ctx, const tr_tensor *x) {
  int64_t shape[2] = {tn_prod(x->shape, 0, x->ndim - 1), x->shape[x->ndim - 1]};
  tr_tensor *c = tc_contig(ctx, x);
  tr_tensor *v = c ? tn_view(ctx, c, 2, shape) : NULL;
  tr_free(c);
  return v;
}

/* saved: x as rows, w. dx = dy W, dW = dy^T x, db = column sums of dy. */
static int linear_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *x = ag_saved(ctx, node, 0), *w = x ? ag_saved(ctx, node, 1) : NULL;
  tr_tensor *dy = w ? as_rows(ctx, g) : NULL;
  if (!dy) return NAS_ERR;
  int rc = NAS_OK;
  if (ag_wants(node, 0)) {
    tr_tensor *dx = gemm_new(ctx, dy, false, w, false);
    gi[0] = dx ? tn_view(ctx, dx, node->in_meta[0].ndim, node->in_meta[0].shape) : NULL;
    tr_free(dx);
    if (!gi[0]) rc = NAS_ERR;
  }
  if (rc == NAS_OK && ag_wants(node, 1) && !(gi[1] = gemm_new(ctx, dy, true, x, false)))
    rc = NAS_ERR;
  if (rc == NAS_OK && ag_wants(node, 2) && !(gi[2] = sum_to(ctx, dy, &node->in_meta[2])))
    rc = NAS_ERR;
  tr_free(dy);
  return rc;
}
static const tr_node_ops linear_ops = {"LinearBackward", linear_backward};

/* y += b on every row, in place (the binary kernel reads each element before writing it). */
static int add_bias(tr_ctx *ctx, tr_tensor *y, const tr_tensor *b) {
  tr_meta m;
  tck_layout yl, bl;
  if (broadcast(ctx, "linear", y, b, &m, &yl, &bl)) return NAS_ERR;
  tck_layout ol = tc_layout(y);
  return tc_ok(ctx, "linear",
               tck_binary(tc_stream(ctx), (int)y->dtype, TCK_ADD, tr_data(y), &yl, tr_data(b), &bl,
                          tr_data(y), &ol));
}

tr_tensor *tc_linear(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b) {
  tr_tensor *in[3] = {x, w, b};
  if (tc_check(ctx, "linear", 3, in)) return NULL;
  if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
      (b && (b->ndim != 1 || b->shape[0] != w->shape[0])))
    return tr_fail(ctx, "linear: input features %lld, weight (%lld, %lld), bias %lld",
                   (long long)(x->ndim ? x->shape[x->ndim - 1] : 0), (long long)w->shape[0],
                   (long long)(w->ndim > 1 ? w->shape[1] : 0), (long long)(b ? b->shape[0] : -1));
  tr_tensor *x2 = as_rows(ctx, x);
  tr_tensor *y2 = x2 ? gemm_new(ctx, x2, false, w, true) : NULL;
  tr_tensor *y = NULL;
  if (y2 && (!b || add_bias(ctx, y2, b) == NAS_OK)) {
    tr_meta m = tn_meta(x);
    m.shape[m.ndim - 1] = w->shape[0];
    y = tn_view(ctx, y2, m.ndim, m.shape);
  }
  tr_free(y2);
  tr_node *node;
  int rc = y ? ag_record(ctx, &linear_ops, 3, in, y, &node) : NAS_ERR;
  if (rc == NAS_OK) rc = ag_save(ctx, node, x2) || ag_save(ctx, node, w);
  tr_free(x2);
  if (rc) {
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
  if (tc_check(ctx, "cross_entropy", 1, &logits)) return NULL;
  if (logits->ndim != 2 || logits->shape[0] < 1)
    return tr_fail(ctx, "cross_entropy: logits must be (N >= 1, C)");
  int64_t rows = logits->shape[0], classes = logits->shape[1];
  for (int64_t r = 0; r < rows; r++)
    if (labels[r] < 0 || labels[r] >= classes)
      return tr_fail(ctx, "cross_entropy: label %d of row %lld is outside [0, %lld)", labels[r],
                     (long long)r, (long long)classes);
  tr_tensor *x = tc_contig(ctx, logits);
  tr_tensor *lab = x ? tc_upload_i32(ctx, labels, rows) : NULL;
  tr_tensor *probs = lab ? tc_empty_like(ctx, x) : NULL;
  tr_tensor *per_row = probs ? tc_empty(ctx, logits->dtype, 1, &rows) : NULL;
  int rc = per_row
               ? tc_ok(ctx, "cross_entropy",
                       tck_cross_entropy_fwd(tc_stream(ctx), (int)x->dtype, tr_data(x), tc_i32(lab),
                                             tr_data(probs), tr_data(per_row), rows, classes))
               : NAS_ERR;
  tr_tensor *mean = rc == NAS_OK ? reduce_raw(ctx, per_row, 1u, 1.0 / (double)rows) : NULL;
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

/* ---------------------------------------------------------------- views */

/* Views are the CPU's (headers over the same storage); only their backward needs the
 * device, for the copies. */

static int view_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *gc = tc_contig(ctx, g);
  gi[0] = gc ? tn_view(ctx, gc, node->in_meta[0].ndim, node->in_meta[0].shape) : NULL;
  tr_free(gc);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops view_ops = {"ViewBackward", view_backward};

/* Records a node of ops for out (a view of t or a copy); frees out on failure. */
static tr_tensor *with_node(tr_ctx *ctx, const tr_node_ops *ops, int n, tr_tensor *const *in,
                            tr_tensor *out, tr_node **node) {
  *node = NULL;
  if (out && ag_record(ctx, ops, n, in, out, node)) {
    tr_free(out);
    return NULL;
  }
  return out;
}

tr_tensor *tc_reshape(tr_ctx *ctx, tr_tensor *t, int ndim, const int64_t *shape) {
  if (tc_check(ctx, "reshape", 1, &t)) return NULL;
  if (ndim < 0 || ndim > TR_MAX_DIMS) return tr_fail(ctx, "reshape: %d dims", ndim);
  int64_t shp[TR_MAX_DIMS], known = 1;
  int infer = -1;
  for (int d = 0; d < ndim; d++) { /* one -1 is inferred from the others */
    shp[d] = shape[d];
    if (shape[d] == -1 && infer < 0)
      infer = d;
    else
      known *= shape[d];
  }
  if (infer >= 0) shp[infer] = known ? t->numel / known : 0;
  if (tn_prod(shp, 0, ndim) != t->numel)
    return tr_fail(ctx, "reshape: %lld elements cannot take a shape of %lld", (long long)t->numel,
                   (long long)tn_prod(shp, 0, ndim));
  tr_tensor *c = tc_contig(ctx, t);
  tr_tensor *out = c ? tn_view(ctx, c, ndim, shp) : NULL;
  tr_free(c);
  tr_node *node;
  return with_node(ctx, &view_ops, 1, &t, out, &node);
}

/* ia[0], ia[1]: the swapped dims. */
static int transpose_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *v = tn_alias(ctx, g);
  if (!v) return NAS_ERR;
  int d0 = (int)node->ia[0], d1 = (int)node->ia[1];
  int64_t s = v->shape[d0], st = v->strides[d0];
  v->shape[d0] = v->shape[d1];
  v->strides[d0] = v->strides[d1];
  v->shape[d1] = s;
  v->strides[d1] = st;
  gi[0] = tc_contig(ctx, v);
  tr_free(v);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops transpose_ops = {"TransposeBackward", transpose_backward};

tr_tensor *tc_transpose(tr_ctx *ctx, tr_tensor *t, int dim0, int dim1) {
  if (tc_check(ctx, "transpose", 1, &t)) return NULL;
  int d0 = tn_dim(t->ndim, dim0), d1 = tn_dim(t->ndim, dim1);
  if (d0 < 0 || d1 < 0)
    return tr_fail(ctx, "transpose: dims %d, %d out of range for %d dims", dim0, dim1, t->ndim);
  tr_tensor *out = tn_alias(ctx, t);
  if (out) {
    out->shape[d0] = t->shape[d1];
    out->strides[d0] = t->strides[d1];
    out->shape[d1] = t->shape[d0];
    out->strides[d1] = t->strides[d0];
  }
  tr_node *node;
  out = with_node(ctx, &transpose_ops, 1, &t, out, &node);
  if (node) {
    node->ia[0] = d0;
    node->ia[1] = d1;
  }
  return out;
}

/* The view t[..., start:start+length, ...] along dim (no history). */
static tr_tensor *narrow_view(tr_ctx *ctx, const tr_tensor *t, int d, int64_t start,
                              int64_t length) {
  tr_tensor *v = tn_alias(ctx, t);
  if (!v) return NULL;
  v->offset += start * t->strides[d];
  v->shape[d] = length;
  v->numel = tn_prod(v->shape, 0, v->ndim);
  return v;
}

/* ia: dim, start, length. */
static int narrow_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *full = tc_zeros(ctx, g->dtype, node->in_meta[0].ndim, node->in_meta[0].shape);
  tr_tensor *part =
      full ? narrow_view(ctx, full, (int)node->ia[0], node->ia[1], node->ia[2]) : NULL;
  int rc = part ? tc_copy_(ctx, part, g) : NAS_ERR;
  tr_free(part);
  gi[0] = full;
  return rc;
}
static const tr_node_ops narrow_ops = {"NarrowBackward", narrow_backward};

tr_tensor *tc_narrow(tr_ctx *ctx, tr_tensor *t, int dim, int64_t start, int64_t length) {
  if (tc_check(ctx, "narrow", 1, &t)) return NULL;
  int d = tn_dim(t->ndim, dim);
  if (d < 0 || start < 0 || length < 0 || start + length > t->shape[d])
    return tr_fail(ctx, "narrow: [%lld, %lld) along dim %d is outside the tensor", (long long)start,
                   (long long)(start + length), dim);
  tr_node *node;
  tr_tensor *out = with_node(ctx, &narrow_ops, 1, &t, narrow_view(ctx, t, d, start, length), &node);
  if (node) {
    node->ia[0] = d;
    node->ia[1] = start;
    node->ia[2] = length;
  }
  return out;
}

static int clone_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  (void)node;
  gi[0] = tc_contig(ctx, g);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops clone_ops = {"CloneBackward", clone_backward};

tr_tensor *tc_contiguous(tr_ctx *ctx, tr_tensor *t) {
  if (tc_check(ctx, "contiguous", 1, &t)) return NULL;
  if (tr_is_contiguous(t)) return tr_retain(t);
  tr_node *node;
  return with_node(ctx, &clone_ops, 1, &t, tc_contig(ctx, t), &node);
}

/* aux: each input's size along dim (host int64s); ia[0]: dim. */
static int concat_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  const int64_t *sizes = ag_aux(ctx, node);
  if (!sizes) return NAS_ERR;
  int d = (int)node->ia[0];
  int64_t start = 0;
  for (int i = 0; i < node->n_next; i++) {
    if (ag_wants(node, i)) {
      tr_tensor *view = narrow_view(ctx, g, d, start, sizes[i]);
      gi[i] = view ? tc_contig(ctx, view) : NULL;
      tr_free(view);
      if (!gi[i]) return NAS_ERR;
    }
    start += sizes[i];
  }
  return NAS_OK;
}
static const tr_node_ops concat_ops = {"CatBackward", concat_backward};

tr_tensor *tc_concat(tr_ctx *ctx, int n, tr_tensor *const *ts, int dim) {
  if (n < 1) return tr_fail(ctx, "concat: no inputs");
  if (tc_check(ctx, "concat", n, ts)) return NULL;
  int d = tn_dim(ts[0]->ndim, dim);
  if (d < 0) return tr_fail(ctx, "concat: dim %d out of range", dim);
  tr_meta m = tn_meta(ts[0]);
  m.shape[d] = 0;
  for (int i = 0; i < n; i++) {
    if (ts[i]->ndim != m.ndim)
      return tr_fail(ctx, "concat: input %d has %d dims, input 0 has %d", i, ts[i]->ndim, m.ndim);
    for (int k = 0; k < m.ndim; k++)
      if (k != d && ts[i]->shape[k] != ts[0]->shape[k])
        return tr_fail(ctx, "concat: input %d differs in size at dim %d", i, k);
    m.shape[d] += ts[i]->shape[d];
  }
  tr_tensor *out = tc_empty_meta(ctx, ts[0]->dtype, &m);
  int64_t *sizes = malloc(sizeof(int64_t) * (size_t)n);
  int rc = out && sizes ? NAS_OK : nas_errf(&ctx->err, "concat: out of memory");
  int64_t start = 0;
  for (int i = 0; i < n && rc == NAS_OK; i++) {
    sizes[i] = ts[i]->shape[d];
    tr_tensor *part = narrow_view(ctx, out, d, start, sizes[i]);
    rc = part ? tc_copy_raw(ctx, part, ts[i]) : NAS_ERR;
    tr_free(part);
    start += sizes[i];
  }
  tr_node *node = NULL;
  if (rc == NAS_OK) rc = ag_record(ctx, &concat_ops, n, ts, out, &node);
  if (node) {
    node->ia[0] = d;
    node->aux = sizes;
    sizes = NULL;
  }
  free(sizes);
  if (rc) {
    tr_free(out);
    return NULL;
  }
  return out;
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
  if (tc_check(ctx, "embedding", 1, &weight)) return NULL;
  if (weight->ndim != 2) return tr_fail(ctx, "embedding: weight must be (V, D)");
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= weight->shape[0])
      return tr_fail(ctx, "embedding: id %d at %lld outside [0, %lld)", ids[i], (long long)i,
                     (long long)weight->shape[0]);
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
