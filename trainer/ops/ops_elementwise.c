/* ops_elementwise: broadcasting add/sub/mul/div, unary activations, scale and dropout, each
 * op's forward beside its backward.
 *
 * Binary ops broadcast numpy-style: shapes align from the right, a size-1 (or missing) dim
 * stretches. Their backward sums the gradient back over the stretched dims (tn_sum_to).
 * Inputs may be any view: the kernels read through strides; outputs are contiguous.
 * Backward functions compute with grad mode off (no double backward).
 * Every function here serves both devices: on CUDA inputs only the kernel calls go to the
 * tc_* kernel functions (trainer/cuda/cuda_ops.c), whose op numbers are the same (TCK_*). */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/ops/dispatch.h"

enum { UN_RELU, UN_GELU, UN_TANH, UN_SIGMOID, UN_EXP, UN_LOG, UN_SCALE };
enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV };
_Static_assert((int)UN_LOG == (int)TCK_LOG && (int)UN_SCALE == (int)TCK_SCALE,
               "unary op numbers are the CUDA kernels' (TCK_*)");
_Static_assert((int)BIN_MUL == (int)TCK_MUL && (int)BIN_DIV == (int)TCK_DIV,
               "binary op numbers are the CUDA kernels' (TCK_*)");

#define KERN_FILE "trainer/ops/kern_elementwise.h"
#include "trainer/core/kern_both.h"

/* ---------------------------------------------------------------- broadcasting */

/* Output shape of broadcasting a with b; error when a dim differs and neither is 1. */
static int broadcast_shape(tr_ctx *ctx, const char *op, const tr_tensor *a, const tr_tensor *b,
                           tr_meta *out) {
  out->ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int d = 0; d < out->ndim; d++) {
    int da = d - (out->ndim - a->ndim), db = d - (out->ndim - b->ndim);
    int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      return nas_errf(&ctx->err, "%s: shapes do not broadcast (dim %d: %lld vs %lld)", op, d,
                      (long long)sa, (long long)sb);
    out->shape[d] = sa == 1 ? sb : sa;
  }
  return NAS_OK;
}

/* t's strides aligned right to an ndim-dim output, 0 on broadcast dims. */
static void broadcast_strides(const tr_tensor *t, int ndim, int64_t *strides) {
  for (int d = 0; d < ndim; d++) {
    int dt = d - (ndim - t->ndim);
    strides[d] = dt >= 0 && t->shape[dt] != 1 ? t->strides[dt] : 0;
  }
}

/* a op b with no history. */
static tr_tensor *binary_raw(tr_ctx *ctx, int op, const char *name, const tr_tensor *a,
                             const tr_tensor *b) {
  tr_meta m;
  if (broadcast_shape(ctx, name, a, b, &m)) return NULL;
  tr_tensor *out = tn_empty_dev(ctx, a, a->dtype, &m);
  if (!out) return NULL;
  int64_t sa[TR_MAX_DIMS], sb[TR_MAX_DIMS];
  broadcast_strides(a, m.ndim, sa);
  broadcast_strides(b, m.ndim, sb);
  if (!tn_on_cuda(out)) {
    TR_DISPATCH(a->dtype, binary_fwd, op, tr_data(out), tr_data(a), sa, tr_data(b), sb, m.shape,
                m.ndim);
  } else if (tc_binary_fwd(ctx, op, name, out, a, sa, b, sb)) {
    tr_release(out);
    return NULL;
  }
  return out;
}

/* The device sums the stretched dims by reductions (tn_sum_dims), then drops the missing
 * leading ones. */
static tr_tensor *sum_to_by_reduction(tr_ctx *ctx, const tr_tensor *g, const tr_meta *m) {
  uint32_t mask = 0;
  for (int d = 0; d < g->ndim; d++) {
    int dm = d - (g->ndim - m->ndim);
    if ((dm < 0 || m->shape[dm] == 1) && g->shape[d] != 1) mask |= 1u << d;
  }
  tr_tensor *r = tn_sum_dims(ctx, g, mask, 1.0);
  tr_tensor *out = r ? tn_view(ctx, r, m->ndim, m->shape) : NULL;
  tr_release(r);
  return out;
}

tr_tensor *tn_sum_to(tr_ctx *ctx, const tr_tensor *g, const tr_meta *m) {
  tr_tensor *gc = tn_contig(ctx, g);
  if (!gc) return NULL;
  bool same =
      gc->ndim == m->ndim && !memcmp(gc->shape, m->shape, sizeof(int64_t) * (size_t)m->ndim);
  if (same) return gc;
  if (tn_on_cuda(gc)) {
    tr_tensor *sum = sum_to_by_reduction(ctx, gc, m);
    tr_release(gc);
    return sum;
  }
  tr_tensor *out = tn_zeros_meta(ctx, g->dtype, m);
  if (out) {
    int64_t mstrides[TR_MAX_DIMS], ts[TR_MAX_DIMS];
    tn_contiguous_strides(m->ndim, m->shape, mstrides);
    for (int d = 0; d < gc->ndim; d++) {
      int dm = d - (gc->ndim - m->ndim);
      ts[d] = dm >= 0 && m->shape[dm] != 1 ? mstrides[dm] : 0;
    }
    TR_DISPATCH(g->dtype, sum_to, tr_data(out), ts, tr_data(gc), gc->shape, gc->ndim);
  }
  tr_release(gc);
  return out;
}

/* ---------------------------------------------------------------- binary ops */

static int add_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  for (int i = 0; i < 2; i++) {
    if (!ag_wants(node, i)) continue;
    gi[i] = tn_sum_to(ctx, g, &node->in_meta[i]);
    if (!gi[i]) return NAS_ERR;
  }
  return NAS_OK;
}

static int sub_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  if (add_backward(ctx, node, g, gi)) return NAS_ERR;
  if (gi[1]) {
    tr_tensor *neg = tr_scale(ctx, gi[1], -1.0);
    tr_release(gi[1]);
    gi[1] = neg;
    if (!neg) return NAS_ERR;
  }
  return NAS_OK;
}

/* Gradient of input i as sum_to(g op other), the shape of input i. */
static tr_tensor *grad_through(tr_ctx *ctx, int op, tr_tensor *g, const tr_tensor *other,
                               const tr_meta *m) {
  tr_tensor *full = binary_raw(ctx, op, "backward", g, other);
  if (!full) return NULL;
  tr_tensor *out = tn_sum_to(ctx, full, m);
  tr_release(full);
  return out;
}

/* a * b saves both inputs. */
typedef struct {
  tr_node base;
  tr_saved a, b;
} mul_node;

static int mul_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  mul_node *n = (mul_node *)node;
  tr_tensor *a = ag_saved(ctx, node, &n->a), *b = a ? ag_saved(ctx, node, &n->b) : NULL;
  if (!b) return NAS_ERR;
  if (ag_wants(node, 0) && !(gi[0] = grad_through(ctx, BIN_MUL, g, b, &node->in_meta[0])))
    return NAS_ERR;
  if (ag_wants(node, 1) && !(gi[1] = grad_through(ctx, BIN_MUL, g, a, &node->in_meta[1])))
    return NAS_ERR;
  return NAS_OK;
}

/* d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b, with a/b the saved output. */
typedef struct {
  tr_node base;
  tr_saved b, out;
} div_node;

static int div_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  div_node *n = (div_node *)node;
  tr_tensor *b = ag_saved(ctx, node, &n->b), *out = b ? ag_saved(ctx, node, &n->out) : NULL;
  if (!out) return NAS_ERR;
  if (ag_wants(node, 0) && !(gi[0] = grad_through(ctx, BIN_DIV, g, b, &node->in_meta[0])))
    return NAS_ERR;
  if (ag_wants(node, 1)) {
    tr_tensor *t = binary_raw(ctx, BIN_MUL, "backward", g, out);
    tr_tensor *u = t ? binary_raw(ctx, BIN_DIV, "backward", t, b) : NULL;
    tr_release(t);
    if (!u) return NAS_ERR;
    tr_tensor *s = tn_sum_to(ctx, u, &node->in_meta[1]);
    tr_release(u);
    gi[1] = s ? tr_scale(ctx, s, -1.0) : NULL;
    tr_release(s);
    if (!gi[1]) return NAS_ERR;
  }
  return NAS_OK;
}

static const tr_node_ops add_ops = {"AddBackward", add_backward, 0, NULL};
static const tr_node_ops sub_ops = {"SubBackward", sub_backward, 0, NULL};
static const tr_node_ops mul_ops = {"MulBackward", mul_backward, sizeof(mul_node), NULL};
static const tr_node_ops div_ops = {"DivBackward", div_backward, sizeof(div_node), NULL};

/* Saves what mul and div keep (nothing for add and sub). */
static int binary_save(tr_ctx *ctx, int op, tr_node *node, tr_tensor *a, tr_tensor *b,
                       tr_tensor *out) {
  int rc = NAS_OK;
  if (op == BIN_MUL) {
    mul_node *n = (mul_node *)node;
    rc = ag_save(ctx, node, &n->a, a);
    if (rc == NAS_OK) rc = ag_save(ctx, node, &n->b, b);
  } else if (op == BIN_DIV) {
    div_node *n = (div_node *)node;
    rc = ag_save(ctx, node, &n->b, b);
    if (rc == NAS_OK) rc = ag_save(ctx, node, &n->out, out);
  }
  return rc;
}

static tr_tensor *binary_op(tr_ctx *ctx, int op, const char *name, const tr_node_ops *ops,
                            tr_tensor *a, tr_tensor *b) {
  tr_tensor *in[2] = {a, b};
  if (tn_check_inputs(ctx, name, 2, in)) return NULL;
  tr_tensor *out = binary_raw(ctx, op, name, a, b);
  if (!out) return NULL;
  int rc = NAS_OK;
  tr_node *node = ag_record(ctx, ops, 2, in, out, &rc);
  if (node) rc = binary_save(ctx, op, node, a, b, out);
  return ag_output(out, rc);
}

tr_tensor *tr_add(tr_ctx *ctx, tr_tensor *a, tr_tensor *b) {
  return binary_op(ctx, BIN_ADD, "add", &add_ops, a, b);
}
tr_tensor *tr_sub(tr_ctx *ctx, tr_tensor *a, tr_tensor *b) {
  return binary_op(ctx, BIN_SUB, "sub", &sub_ops, a, b);
}
tr_tensor *tr_mul(tr_ctx *ctx, tr_tensor *a, tr_tensor *b) {
  return binary_op(ctx, BIN_MUL, "mul", &mul_ops, a, b);
}
tr_tensor *tr_div(tr_ctx *ctx, tr_tensor *a, tr_tensor *b) {
  return binary_op(ctx, BIN_DIV, "div", &div_ops, a, b);
}

/* ---------------------------------------------------------------- unary ops */

/* Which tensor each unary op keeps for backward. */
static bool saves_output(int op) {
  return op == UN_RELU || op == UN_TANH || op == UN_SIGMOID || op == UN_EXP;
}

/* One unary kernel call over n contiguous elements (unary_part's argument): forward reads
 * in (x) and writes out (y); backward reads saved and in (dy) and writes out (dx). */
typedef struct {
  tr_dtype dtype;
  int op;
  bool backward;
  const char *saved, *in; /* saved: NULL forward and for UN_SCALE */
  char *out;
  int64_t n;
  double s;
} unary_job;

static void unary_part(void *arg, int part, int parts) {
  const unary_job *j = arg;
  int64_t lo, hi;
  tn_par_range(j->n, part, parts, &lo, &hi);
  if (hi <= lo) return;
  size_t at = (size_t)lo * tr_dtype_size(j->dtype);
  if (j->backward)
    TR_DISPATCH(j->dtype, unary_bwd, j->op, j->saved ? j->saved + at : NULL, j->in + at,
                j->out + at, hi - lo, j->s);
  else
    TR_DISPATCH(j->dtype, unary_fwd, j->op, j->in + at, j->out + at, hi - lo, j->s);
}

/* With the engine's own pool, ops from this many elements on are split over it: a hand-off
 * costs about a microsecond, a ReLU of a 128x256 activation several on one thread (and at
 * TR_PAR_MIN or below, OpenMP's loops leave it on one). Each element is computed as on
 * one thread. */
#define UNARY_SPLIT_MIN 8192

/* A unary op's node: the input or the output, as the op needs (saves_output); none for
 * scale, whose factor is s. */
typedef struct {
  tr_node base;
  int op;
  double s;
  tr_saved xy;
} unary_node;

static int unary_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  unary_node *n = (unary_node *)node;
  int op = n->op;
  tr_tensor *saved = NULL;
  if (op != UN_SCALE && !(saved = ag_saved(ctx, node, &n->xy))) return NAS_ERR;
  tr_tensor *gc = tn_contig(ctx, g);
  tr_tensor *dx = gc ? tn_empty_like_dev(ctx, gc) : NULL;
  if (dx && !tn_on_cuda(dx)) {
    unary_job job = {g->dtype,    op,          true,     saved ? tr_data(saved) : NULL,
                     tr_data(gc), tr_data(dx), g->numel, n->s};
    tn_pool_run_from(ctx, job.n, UNARY_SPLIT_MIN, unary_part, &job);
  } else if (dx && tc_unary_bwd(ctx, node->ops->name, op, saved, gc, dx, n->s)) {
    tr_release(dx);
    dx = NULL;
  }
  tr_release(gc);
  gi[0] = dx;
  return dx ? NAS_OK : NAS_ERR;
}

static const tr_node_ops unary_ops[] = {
    {"ReluBackward", unary_backward, sizeof(unary_node), NULL},
    {"GeluBackward", unary_backward, sizeof(unary_node), NULL},
    {"TanhBackward", unary_backward, sizeof(unary_node), NULL},
    {"SigmoidBackward", unary_backward, sizeof(unary_node), NULL},
    {"ExpBackward", unary_backward, sizeof(unary_node), NULL},
    {"LogBackward", unary_backward, sizeof(unary_node), NULL},
    {"ScaleBackward", unary_backward, sizeof(unary_node), NULL},
};

static tr_tensor *unary_op(tr_ctx *ctx, int op, tr_tensor *a, double s) {
  static const char *const names[] = {"relu", "gelu", "tanh", "sigmoid", "exp", "log", "scale"};
  if (tn_check_inputs(ctx, names[op], 1, &a)) return NULL;
  tr_tensor *x = tn_contig(ctx, a);
  tr_tensor *y = x ? tn_empty_like_dev(ctx, x) : NULL;
  if (!y) {
    tr_release(x);
    return NULL;
  }
  int rc = NAS_OK;
  if (!tn_on_cuda(y)) {
    unary_job job = {a->dtype, op, false, NULL, tr_data(x), tr_data(y), a->numel, s};
    tn_pool_run_from(ctx, job.n, UNARY_SPLIT_MIN, unary_part, &job);
  } else {
    rc = tc_unary_fwd(ctx, names[op], op, x, y, s);
  }
  unary_node *node = ag_record(ctx, &unary_ops[op], 1, &a, y, &rc);
  if (node) {
    node->op = op;
    node->s = s;
    if (op != UN_SCALE) rc = ag_save(ctx, &node->base, &node->xy, saves_output(op) ? y : x);
  }
  tr_release(x);
  return ag_output(y, rc);
}

tr_tensor *tr_relu(tr_ctx *ctx, tr_tensor *a) {
  return unary_op(ctx, UN_RELU, a, 0);
}
tr_tensor *tr_gelu(tr_ctx *ctx, tr_tensor *a) {
  return unary_op(ctx, UN_GELU, a, 0);
}
tr_tensor *tr_tanh(tr_ctx *ctx, tr_tensor *a) {
  return unary_op(ctx, UN_TANH, a, 0);
}
tr_tensor *tr_sigmoid(tr_ctx *ctx, tr_tensor *a) {
  return unary_op(ctx, UN_SIGMOID, a, 0);
}
tr_tensor *tr_exp(tr_ctx *ctx, tr_tensor *a) {
  return unary_op(ctx, UN_EXP, a, 0);
}
tr_tensor *tr_log(tr_ctx *ctx, tr_tensor *a) {
  return unary_op(ctx, UN_LOG, a, 0);
}
tr_tensor *tr_scale(tr_ctx *ctx, tr_tensor *a, double s) {
  return unary_op(ctx, UN_SCALE, a, s);
}

/* ---------------------------------------------------------------- dropout */

/* y = x * mask for contiguous x and the mask (0 or 1/(1-p) per element), no history. */
static tr_tensor *dropout_apply(tr_ctx *ctx, const char *name, const tr_tensor *x,
                                const tr_tensor *mask) {
  tr_tensor *y = tn_empty_like_dev(ctx, x);
  if (y && !tn_on_cuda(y)) {
    TR_DISPATCH(x->dtype, dropout_apply, tr_data(x), tr_data(mask), tr_data(y), x->numel);
  } else if (y && tc_binary_fwd(ctx, BIN_MUL, name, y, x, x->strides, mask, mask->strides)) {
    tr_release(y);
    return NULL;
  }
  return y;
}

typedef struct {
  tr_node base;
  tr_saved mask;
} dropout_node;

static int dropout_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *mask = ag_saved(ctx, node, &((dropout_node *)node)->mask);
  tr_tensor *gc = mask ? tn_contig(ctx, g) : NULL;
  gi[0] = gc ? dropout_apply(ctx, "DropoutBackward", gc, mask) : NULL;
  tr_release(gc);
  return gi[0] ? NAS_OK : NAS_ERR;
}
static const tr_node_ops dropout_ops = {"DropoutBackward", dropout_backward,
                                        sizeof(dropout_node), NULL};

/* The mask of a's shape and dtype on a's device: 1/(1-p) where an element is kept, 0 where
 * it is dropped. It is drawn on the host from ctx's generator, so a seeded run drops the
 * same elements on either device. */
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
  if (!tn_on_cuda(a)) return host;
  tr_tensor *mask = tr_to_device(ctx, host, tr_tensor_device(a));
  tr_release(host);
  return mask;
}

tr_tensor *tr_dropout(tr_ctx *ctx, tr_tensor *a, double p, bool training) {
  if (!(p >= 0 && p < 1)) return tr_fail(ctx, "dropout: p = %g is outside [0, 1)", p); /* NaN too */
  if (!training || p == 0) return unary_op(ctx, UN_SCALE, a, 1.0);
  if (tn_check_inputs(ctx, "dropout", 1, &a)) return NULL;
  tr_tensor *x = tn_contig(ctx, a);
  tr_tensor *mask = x ? dropout_mask(ctx, a, p) : NULL;
  tr_tensor *y = mask ? dropout_apply(ctx, "dropout", x, mask) : NULL;
  int rc = y ? NAS_OK : NAS_ERR;
  dropout_node *node = ag_record(ctx, &dropout_ops, 1, &a, y, &rc);
  if (node) rc = ag_save(ctx, &node->base, &node->mask, mask);
  tr_release(mask);
  tr_release(x);
  return ag_output(y, rc);
}
