/* ops_matmul: matrix multiply and the linear layer on OpenBLAS GEMM, forward beside
 * backward.
 *
 * Operands go to BLAS without copying when they are contiguous or a transposed contiguous
 * matrix (the transpose becomes a GEMM flag); anything else is copied first.
 *   matmul: C (M,N) = A (M,K) B (K,N);  dA = dC B^T,  dB = A^T dC.
 *   linear: y (R,out) = x (R,in) W^T + b; dx = dy W, dW = dy^T x, db = column sums of dy.
 *   One row (batch-1 inference) goes through our own matrix-vector kernel (kern_matmul.h).
 *   A pipeline stage may have the linear layer's dW queued rather than computed in the
 *   backward (tr_wgrads_*, ctx->wgrads), to run once it has sent the input's gradient on.
 * The ops serve both devices: on CUDA inputs the products go to cuBLAS (tc_gemm,
 * tc_linear_fwd in trainer/cuda/cuda_ops.c); checks, shapes, nodes and backward are these. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/dispatch.h"

#define KERN_FILE "trainer/ops/kern_matmul.h"
#include "trainer/core/kern_both.h"

/* One OpenBLAS call. */
static void blas_gemm(tr_dtype dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      double beta, void *c, int64_t ldc) {
  enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (dtype == TR_F32)
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)alpha, a,
                (blasint)lda, b, (blasint)ldb, (float)beta, c, (blasint)ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda,
                b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* Below this many multiply-adds a GEMM runs as one call: a part must take well over the
 * microsecond that handing it to another thread costs. */
#define GEMM_SPLIT_MIN ((int64_t)1 << 20)

/* Whether to split C by rows (else by columns): along the largest matrix, so that each
 * thread reads or writes its own part of it. In a training step that is the weight: the
 * forward splits W's rows (C's columns), the weight gradient its rows (C's rows), which
 * are also the halves the optimiser updates on each thread. Each core then keeps its half
 * of the weights in its own cache from step to step; split the other way, every step
 * moved half of the weights between the cores. Ties go to C, then B; a dimension too short
 * to split is not chosen. */
static bool split_by_rows(int64_t m, int64_t n, int64_t k, int parts) {
  if (m < 16 * parts || n < 16 * parts) return m >= n;
  int64_t size_a = m * k, size_b = k * n, size_c = m * n;
  if (size_c >= size_a && size_c >= size_b) return true;
  return size_b < size_a;
}

/* One GEMM and how it is split (gemm_part's argument). */
typedef struct {
  tr_dtype dtype;
  bool trans_a, trans_b, by_rows;
  int64_t m, n, k, lda, ldb, ldc;
  double alpha, beta;
  const char *a, *b;
  char *c;
} gemm_job;

static void gemm_part(void *arg, int part, int parts) {
  const gemm_job *j = arg;
  size_t es = tr_dtype_size(j->dtype);
  int64_t lo, hi;
  tn_par_range(j->by_rows ? j->m : j->n, part, parts, &lo, &hi);
  if (hi <= lo) return;
  if (j->by_rows) /* rows of C: rows of op(A) */
    blas_gemm(j->dtype, j->trans_a, j->trans_b, hi - lo, j->n, j->k, j->alpha,
              j->a + (size_t)(j->trans_a ? lo : lo * j->lda) * es, j->lda, j->b, j->ldb, j->beta,
              j->c + (size_t)(lo * j->ldc) * es, j->ldc);
  else /* columns of C: columns of op(B) */
    blas_gemm(j->dtype, j->trans_a, j->trans_b, j->m, hi - lo, j->k, j->alpha, j->a, j->lda,
              j->b + (size_t)(j->trans_b ? lo * j->ldb : lo) * es, j->ldb, j->beta,
              j->c + (size_t)lo * es, j->ldc);
}

/* The GEMMs of a training step are small (batch 128: 128x784x256 and less), and OpenBLAS's
 * own threading splits them badly (two BLAS threads train the MLP no faster than one).
 * With OpenBLAS on one thread, the engine splits C into one block of whole rows or columns
 * per thread (tn_par_run) and makes one single-threaded call per block. Each element is
 * the same sum of the same products, but OpenBLAS may tile a block differently from the
 * whole, so a few percent of the elements round differently (within float tolerance:
 * tests/test_trainer_speedpaths.c). */
void tn_gemm(const tr_ctx *ctx, tr_dtype dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
             int64_t k, double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
             double beta, void *c, int64_t ldc) {
  int parts = m * n * k < GEMM_SPLIT_MIN ? 1 : tn_par_parts(ctx);
  if (parts < 2) {
    blas_gemm(dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_job job = {dtype, trans_a, trans_b, split_by_rows(m, n, k, parts), m, n, k, lda, ldb,
                  ldc, alpha, beta, a, b, c};
  tn_par_run(ctx, gemm_part, &job);
}

/* Below this many matrix elements a matrix-vector product runs on one thread. */
#define GEMV_SPLIT_MIN ((int64_t)1 << 16)

typedef struct {
  tr_dtype dtype;
  int64_t m, n, lda;
  const char *a;
  const void *x;
  double beta;
  char *y;
} gemv_job;

static void gemv_part(void *arg, int part, int parts) {
  const gemv_job *j = arg;
  size_t es = tr_dtype_size(j->dtype);
  int64_t lo, hi;
  tn_par_range(j->m, part, parts, &lo, &hi);
  if (hi > lo)
    TR_DISPATCH(j->dtype, gemv_rows, hi - lo, j->n, j->a + (size_t)(lo * j->lda) * es, j->lda,
                j->x, j->beta, j->y + (size_t)lo * es);
}

/* Batch-1 inference reads each weight once, so it is bound by how fast the weights come
 * in: from two cores' caches at once, each reading its own rows, that is nearly twice as
 * fast as from one (a 784x256 layer, 0.8 MB, also fits the two L2 caches where it does
 * not quite fit one). Each y[i] is computed exactly as on one thread. */
void tn_gemv(const tr_ctx *ctx, tr_dtype dtype, int64_t m, int64_t n, const void *a, int64_t lda,
             const void *x, double beta, void *y) {
  gemv_job job = {dtype, m, n, lda, a, x, beta, y};
  if (m * n < GEMV_SPLIT_MIN)
    gemv_part(&job, 0, 1);
  else
    tn_par_run(ctx, gemv_part, &job);
}

/* A 2-D matrix as BLAS sees it: data, whether it is stored transposed, leading dim. */
typedef struct {
  tr_tensor *owner; /* owned: t itself (retained) or a contiguous copy */
  bool trans;
  int64_t ld;
} gemm_operand;

static int operand_of(tr_ctx *ctx, tr_tensor *t, gemm_operand *op) {
  int64_t rows = t->shape[0], cols = t->shape[1];
  if (t->strides[1] == 1 && (t->strides[0] == cols || rows == 1)) {
    *op = (gemm_operand){tr_retain(t), false, cols};
  } else if (t->strides[0] == 1 && (t->strides[1] == rows || cols == 1)) {
    *op = (gemm_operand){tr_retain(t), true, rows};
  } else {
    *op = (gemm_operand){tn_contig(ctx, t), false, cols};
    if (!op->owner) return NAS_ERR;
  }
  if (op->ld < 1) op->ld = 1;
  return NAS_OK;
}

/* c = op(A) op(B) + beta c for 2-D host tensors, op() adding the transposes asked for; c
 * is contiguous, of op(A)'s rows and op(B)'s columns. */
static int gemm_into(tr_ctx *ctx, tr_tensor *a, bool ta, tr_tensor *b, bool tb, double beta,
                     tr_tensor *c) {
  gemm_operand oa, ob;
  if (operand_of(ctx, a, &oa)) return NAS_ERR;
  if (operand_of(ctx, b, &ob)) {
    tr_release(oa.owner);
    return NAS_ERR;
  }
  int64_t m = ta ? a->shape[1] : a->shape[0], k = ta ? a->shape[0] : a->shape[1];
  int64_t n = tb ? b->shape[0] : b->shape[1];
  if (m && n && k == 0 && beta == 0.0)
    memset(tr_data(c), 0, (size_t)(m * n) * tr_dtype_size(c->dtype));
  else if (m && n && k)
    tn_gemm(ctx, a->dtype, ta != oa.trans, tb != ob.trans, m, n, k, 1.0, tr_data(oa.owner), oa.ld,
            tr_data(ob.owner), ob.ld, beta, tr_data(c), n);
  tr_release(oa.owner);
  tr_release(ob.owner);
  return NAS_OK;
}

/* C = op(A) op(B) for 2-D tensors, op() adding the transposes asked for; C is new, on A's
 * device. */
static tr_tensor *gemm_new(tr_ctx *ctx, tr_tensor *a, bool ta, tr_tensor *b, bool tb) {
  if (tn_on_cuda(a)) return tc_gemm(ctx, a, ta, b, tb);
  int64_t shape[2] = {ta ? a->shape[1] : a->shape[0], tb ? b->shape[0] : b->shape[1]};
  tr_tensor *c = tr_empty(ctx, a->dtype, 2, shape);
  if (c && gemm_into(ctx, a, ta, b, tb, 0.0, c) != NAS_OK) {
    tr_release(c);
    return NULL;
  }
  return c;
}

/* ---------------------------------------------------------------- matmul */

typedef struct {
  tr_node base;
  tr_saved a, b;
} matmul_node;

static int matmul_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  matmul_node *n = (matmul_node *)node;
  tr_tensor *a = ag_saved(ctx, node, &n->a), *b = a ? ag_saved(ctx, node, &n->b) : NULL;
  if (!b) return NAS_ERR;
  if (ag_wants(node, 0) && !(gi[0] = gemm_new(ctx, g, false, b, true))) return NAS_ERR;
  if (ag_wants(node, 1) && !(gi[1] = gemm_new(ctx, a, true, g, false))) return NAS_ERR;
  return NAS_OK;
}
static const tr_node_ops matmul_ops = {"MmBackward", matmul_backward, sizeof(matmul_node), NULL};

tr_tensor *tr_matmul(tr_ctx *ctx, tr_tensor *a, tr_tensor *b) {
  tr_tensor *in[2] = {a, b};
  if (tn_check_inputs(ctx, "matmul", 2, in)) return NULL;
  if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0])
    return tr_fail(ctx, "matmul: shapes (%lld, %lld) @ (%lld, %lld) do not fit",
                   (long long)a->shape[0], (long long)(a->ndim > 1 ? a->shape[1] : 0),
                   (long long)b->shape[0], (long long)(b->ndim > 1 ? b->shape[1] : 0));
  tr_tensor *c = gemm_new(ctx, a, false, b, false);
  if (!c) return NULL;
  int rc = NAS_OK;
  matmul_node *node = ag_record(ctx, &matmul_ops, 2, in, c, &rc);
  if (node) rc = ag_save(ctx, &node->base, &node->a, a);
  if (node && rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->b, b);
  return ag_output(c, rc);
}

/* ---------------------------------------------------------------- linear */

/* x (..., in) seen as (rows, in), without copying when contiguous. */
static tr_tensor *as_rows(tr_ctx *ctx, const tr_tensor *x) {
  int64_t shape[2] = {tn_prod(x->shape, 0, x->ndim - 1), x->shape[x->ndim - 1]};
  tr_tensor *c = tn_contig(ctx, x);
  tr_tensor *v = c ? tn_view(ctx, c, 2, shape) : NULL;
  tr_release(c);
  return v;
}

/* Column sums of a (rows, cols) gradient (bias_grad_part's argument). */
typedef struct {
  tr_dtype dtype;
  int64_t rows, cols;
  const char *dy;
  char *db;
} bias_grad_job;

/* db[j] = sum_r dy[r, j] for the columns j of part `part`: each column is summed in the
 * same order whatever the split. */
static void bias_grad_part(void *arg, int part, int parts) {
  const bias_grad_job *j = arg;
  size_t es = tr_dtype_size(j->dtype);
  int64_t lo, hi;
  tn_par_range(j->cols, part, parts, &lo, &hi);
  if (hi > lo)
    tn_col_sums(j->dtype, j->rows, hi - lo, j->dy + (size_t)lo * es, j->cols,
                j->db + (size_t)lo * es);
}

/* With the engine's own pool, bias gradients of this many elements of dy on are split by
 * columns over it (128x256 takes a few microseconds on one thread). */
#define BIAS_GRAD_SPLIT_MIN 8192

/* db (shape m) = column sums of dy: by a reduction on the device. */
static tr_tensor *bias_grad_new(tr_ctx *ctx, const tr_tensor *dy, const tr_meta *m) {
  if (tn_on_cuda(dy)) return tn_sum_to(ctx, dy, m);
  tr_tensor *db = tn_empty_meta(ctx, dy->dtype, m);
  if (!db) return NULL;
  bias_grad_job job = {dy->dtype, dy->shape[0], dy->shape[1], tr_data(dy), tr_data(db)};
  tn_pool_run_from(ctx, dy->numel, BIAS_GRAD_SPLIT_MIN, bias_grad_part, &job);
  return db;
}

typedef struct {
  tr_node base;
  tr_saved x; /* the input as rows (R, in) */
  tr_saved w;
} linear_node;

/* ---------------------------------------------------------------- weight gradients put off */

/* One queued dW += dy^T x, with the versions its operands had when queued. */
typedef struct {
  tr_tensor *dy, *x, *acc; /* owned references */
  uint64_t dy_version, x_version;
} wgrad_job;

struct tr_wgrad_queue {
  wgrad_job *jobs; /* [done, n) still to run */
  size_t done, n, cap;
  size_t retired; /* jobs run or dropped before jobs[0] (marks count from the first ever) */
};

tr_wgrad_queue *tr_wgrads_new(void) { return calloc(1, sizeof(tr_wgrad_queue)); }

static void wgrad_job_clear(wgrad_job *j) {
  tr_release(j->dy);
  tr_release(j->x);
  tr_release(j->acc);
  *j = (wgrad_job){0};
}

/* Once every queued job has run: the array empties, the marks go on counting. */
static void wgrads_compact(tr_wgrad_queue *q) {
  if (q->done < q->n) return;
  q->retired += q->n;
  q->done = q->n = 0;
}

void tr_wgrads_drop(tr_wgrad_queue *q) {
  if (!q) return;
  for (size_t i = q->done; i < q->n; i++) wgrad_job_clear(&q->jobs[i]);
  q->done = q->n;
  wgrads_compact(q);
}

void tr_wgrads_free(tr_wgrad_queue *q) {
  tr_wgrads_drop(q);
  if (q) free(q->jobs);
  free(q);
}

size_t tr_wgrads_queued(const tr_wgrad_queue *q) { return q->retired + q->n; }

static int wgrads_push(tr_ctx *ctx, tr_wgrad_queue *q, tr_tensor *dy, tr_tensor *x,
                       tr_tensor *acc) {
  if (q->n == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 32;
    wgrad_job *grown = realloc(q->jobs, cap * sizeof *grown);
    if (!grown) return nas_errf(&ctx->err, "linear backward: out of memory");
    q->jobs = grown;
    q->cap = cap;
  }
  q->jobs[q->n++] = (wgrad_job){tr_retain(dy), tr_retain(x), tr_retain(acc),
                                dy->storage->version, x->storage->version};
  return NAS_OK;
}

/* acc += dy^T x in place (the GEMM's beta = 1), bumping acc's version. */
static int weight_grad_add(tr_ctx *ctx, tr_tensor *dy, tr_tensor *x, tr_tensor *acc) {
  if (gemm_into(ctx, dy, true, x, false, 1.0, acc) != NAS_OK) return NAS_ERR;
  acc->storage->version++;
  return NAS_OK;
}

static int wgrad_job_run(tr_ctx *ctx, const wgrad_job *j) {
  if (j->dy->storage->version != j->dy_version || j->x->storage->version != j->x_version)
    return nas_errf(&ctx->err, "LinearBackward: a tensor a put-off weight gradient reads was "
                    "modified in place after the backward that queued it; the gradient would "
                    "be wrong");
  return weight_grad_add(ctx, j->dy, j->x, j->acc);
}

int tr_wgrads_run(tr_ctx *ctx, tr_wgrad_queue *q, size_t mark) {
  int rc = NAS_OK;
  while (rc == NAS_OK && q->done < q->n && q->retired + q->done < mark) {
    rc = wgrad_job_run(ctx, &q->jobs[q->done]);
    wgrad_job_clear(&q->jobs[q->done++]);
  }
  wgrads_compact(q);
  return rc;
}

/* ---------------------------------------------------------------- linear, backward */

/* dW = dy^T x: added straight into W's accumulated gradient when it has one on the host
 * (the GEMM's beta = 1, as over the micro-batches of a pipeline or gradient accumulation:
 * no buffer for this backward's dW and no second pass to add it), or queued to be added so
 * later when ctx->wgrads is set; else a new tensor in *gw for the engine to accumulate. */
static int weight_grad(tr_ctx *ctx, tr_node *node, tr_tensor *dy, tr_tensor *x, tr_tensor *w,
                       tr_tensor **gw) {
  const tr_tensor *reads[] = {dy, x};
  tr_tensor *acc = tn_on_cuda(dy) ? NULL : ag_accumulator(node, 1, dy->dtype, w->numel, reads, 2);
  if (!acc) return (*gw = gemm_new(ctx, dy, true, x, false)) ? NAS_OK : NAS_ERR;
  if (ctx->wgrads) return wgrads_push(ctx, ctx->wgrads, dy, x, acc);
  return weight_grad_add(ctx, dy, x, acc);
}

static int linear_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  linear_node *n = (linear_node *)node;
  tr_tensor *x = ag_saved(ctx, node, &n->x), *w = x ? ag_saved(ctx, node, &n->w) : NULL;
  tr_tensor *dy = w ? as_rows(ctx, g) : NULL;
  if (!dy) return NAS_ERR;
  int rc = NAS_OK;
  if (ag_wants(node, 0)) {
    tr_tensor *dx = gemm_new(ctx, dy, false, w, false);
    gi[0] = dx ? tn_view(ctx, dx, node->in_meta[0].ndim, node->in_meta[0].shape) : NULL;
    tr_release(dx);
    if (!gi[0]) rc = NAS_ERR;
  }
  if (rc == NAS_OK && ag_wants(node, 1)) rc = weight_grad(ctx, node, dy, x, w, &gi[1]);
  if (rc == NAS_OK && ag_wants(node, 2) && !(gi[2] = bias_grad_new(ctx, dy, &node->in_meta[2])))
    rc = NAS_ERR;
  tr_release(dy);
  return rc;
}
static const tr_node_ops linear_ops = {"LinearBackward", linear_backward, sizeof(linear_node),
                                       NULL};

/* y = x W^T (+ b): the bias is copied into every row first, then GEMM adds onto it. */
static tr_tensor *linear_forward(tr_ctx *ctx, tr_tensor *x2, tr_tensor *w, tr_tensor *b) {
  int64_t rows = x2->shape[0], out_f = w->shape[0];
  int64_t shape[2] = {rows, out_f};
  tr_tensor *y = tr_empty(ctx, x2->dtype, 2, shape);
  if (!y) return NULL;
  size_t row_bytes = (size_t)out_f * tr_dtype_size(x2->dtype);
  tr_tensor *bc = b ? tn_contig(ctx, b) : NULL;
  if (b && !bc) {
    tr_release(y);
    return NULL;
  }
  for (int64_t r = 0; bc && r < rows; r++)
    memcpy((char *)tr_data(y) + (size_t)r * row_bytes, tr_data(bc), row_bytes);
  tr_release(bc);
  gemm_operand ow;
  if (operand_of(ctx, w, &ow)) {
    tr_release(y);
    return NULL;
  }
  if (rows == 1 && !ow.trans) /* one example (inference): W x reads W row by row */
    tn_gemv(ctx, x2->dtype, out_f, x2->shape[1], tr_data(ow.owner), ow.ld, tr_data(x2),
            b ? 1.0 : 0.0, tr_data(y));
  else if (rows && out_f)
    tn_gemm(ctx, x2->dtype, false, !ow.trans, rows, out_f, x2->shape[1], 1.0, tr_data(x2),
            x2->shape[1], tr_data(ow.owner), ow.ld, b ? 1.0 : 0.0, tr_data(y), out_f);
  tr_release(ow.owner);
  return y;
}

tr_tensor *tr_linear(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b) {
  tr_tensor *in[3] = {x, w, b};
  if (tn_check_inputs(ctx, "linear", b ? 3 : 2, in)) return NULL;
  if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
      (b && (b->ndim != 1 || b->shape[0] != w->shape[0])))
    return tr_fail(ctx, "linear: input features %lld, weight (%lld, %lld), bias %lld",
                   (long long)(x->ndim ? x->shape[x->ndim - 1] : 0), (long long)w->shape[0],
                   (long long)(w->ndim > 1 ? w->shape[1] : 0), (long long)(b ? b->shape[0] : -1));
  tr_tensor *x2 = as_rows(ctx, x);
  tr_tensor *y2 = !x2                ? NULL
                  : tn_on_cuda(x2) ? tc_linear_fwd(ctx, x2, w, b)
                                   : linear_forward(ctx, x2, w, b);
  tr_tensor *y = NULL;
  if (y2) {
    tr_meta m = tn_meta(x);
    m.shape[m.ndim - 1] = w->shape[0];
    y = tn_view(ctx, y2, m.ndim, m.shape);
  }
  tr_release(y2);
  int rc = y ? NAS_OK : NAS_ERR;
  linear_node *node = ag_record(ctx, &linear_ops, 3, in, y, &rc);
  if (node) rc = ag_save(ctx, &node->base, &node->x, x2);
  if (node && rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->w, w);
  tr_release(x2);
  return ag_output(y, rc);
}
