/* mlp_train: a run of linear layers, each optionally followed by a ReLU, as one op with
 * one backward node, for training on the engine's thread pool (nn.c's sequential forward
 * uses it in grad mode where tn_mlp_train_fits).
 *
 * Why: run op by op, each layer's GEMM, bias, ReLU, bias gradient and mask is its own job
 * over the pool, and each splits its tensors its own way (a GEMM by the weight's rows, an
 * elementwise op by the batch's), so activations written by one core are read by the
 * other at almost every op. On this project's machines the two vCPUs are sometimes 400-500
 * ns apart, and then moving a 128x256 activation between them took longer than the ReLU on
 * it. Here the parts of the pool keep their own slice of every activation through the
 * whole step, and a step of the benchmark's MLP is four jobs instead of eleven.
 *
 * Layout over P parts (part t = worker t, as the pool hands them out):
 *   layer 0, column-parallel: part t computes its columns c_t of the output (its rows of
 *     W0), adds the bias and the ReLU on that block, and keeps H0[:, c_t];
 *   layer 1, row-parallel: in the same job, part t multiplies H0[:, c_t] by the same
 *     columns of W1, a partial sum of layer 1's whole output;
 *   a second job adds the partials in part order after the bias (the ReLU last), each part
 *     for its batch rows r_t, and runs layers 2.. on those rows (each part all of a
 *     layer's weights, its own rows of the activations).
 * Backward runs the other way: a job over batch rows (layers n-1..2: input gradients, mask,
 * each part's partial weight and bias gradients), a job over c_t (layer 1's weight gradient
 * columns c_t and input gradient columns c_t, layer 0's mask, bias gradient and weight
 * gradient rows c_t, and the sums of the partial gradients), and, when the input needs a
 * gradient, a job adding each part's share of it. So only layer 1's partial sums and
 * output gradient (and the small layers' partials) pass between the cores, and each part
 * writes the rows of W0's gradient the optimiser then updates on the same thread.
 *
 * Invariant: the function and gradients of the modules one by one. The sums of the GEMMs
 * split along k (layer 1's, the partial gradients, the input's) are added in part order,
 * so they may round differently from one GEMM (within float rounding) but are the same from
 * call to call with the same threads. The bias is added after the sum (as GEMM's beta = 1
 * adds the sum to it: the same value), the ReLU and its mask are the ReLU kernel's. */
#include <cblas.h>
#include <string.h>

#include "trainer/fast/infer.h"

/* Least batch rows per part: below this a part's GEMMs are too thin to pay for a job. */
#define ROWS_PER_PART 16

/* The op's shapes and data, shared by its jobs. Layer k maps width[k] to width[k + 1]. */
typedef struct {
  int n, parts;
  int64_t rows, width[TN_MLP_MAX_LAYERS + 1];
  bool relu[TN_MLP_MAX_LAYERS];
  const float *w[TN_MLP_MAX_LAYERS], *b[TN_MLP_MAX_LAYERS]; /* b[k] NULL: no bias */
  const float *x;                                           /* (rows, width[0]) */
  float *h[TN_MLP_MAX_LAYERS]; /* layer k's output after its ReLU, (rows, width[k + 1]) */
  float *partial;              /* (parts, rows, width[2]): layer 1's partial sums */
} mlp_fwd;

static void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b, (blasint)ldb, 0.0f, c,
              (blasint)ldc);
}

/* Rows [lo, hi) of layer k (k >= 2): its GEMM on those rows, bias, ReLU. */
static void layer_rows(const mlp_fwd *f, int k, int64_t lo, int64_t hi) {
  int64_t in = f->width[k], out = f->width[k + 1];
  float *y = f->h[k] + lo * out;
  sgemm(false, true, hi - lo, out, in, f->h[k - 1] + lo * in, in, f->w[k], in, y, out);
  for (int64_t r = 0; r < hi - lo; r++) tn_add_bias_relu(y + r * out, f->b[k], out, f->relu[k]);
}

/* Job 1: layer 0's columns c_t, then this part's partial sums of layer 1. */
static void forward_columns(void *arg, int part, int parts) {
  const mlp_fwd *f = arg;
  int64_t in = f->width[0], mid = f->width[1], out = f->width[2], lo, hi;
  tn_par_range(mid, part, parts, &lo, &hi);
  float *h0 = f->h[0] + lo, *p = f->partial + part * f->rows * out;
  if (hi <= lo) {
    memset(p, 0, sizeof(float) * (size_t)(f->rows * out));
    return;
  }
  sgemm(false, true, f->rows, hi - lo, in, f->x, in, f->w[0] + lo * in, in, h0, mid);
  for (int64_t r = 0; r < f->rows; r++)
    tn_add_bias_relu(h0 + r * mid, f->b[0] ? f->b[0] + lo : NULL, hi - lo, f->relu[0]);
  sgemm(false, true, f->rows, out, hi - lo, h0, mid, f->w[1] + lo, mid, p, out);
}

/* Job 2: rows r_t of layer 1 (the partials added) and of every later layer. */
static void forward_rows(void *arg, int part, int parts) {
  const mlp_fwd *f = arg;
  int64_t out = f->width[2], lo, hi;
  tn_par_range(f->rows, part, parts, &lo, &hi);
  for (int64_t r = lo; r < hi; r++)
    tn_sum_partials(f->h[1] + r * out, f->b[1], f->partial + r * out, f->parts, f->rows * out,
                    out, f->relu[1]);
  for (int k = 2; k < f->n && hi > lo; k++) layer_rows(f, k, lo, hi);
}

/* How many parts the jobs split into: the pool's (tn_par_run hands each job that many). */
static int parts_of(const tr_ctx *ctx) { return ctx->threads ? tn_par_parts(ctx) : 1; }

bool tn_mlp_train_fits(const tr_ctx *ctx, const tr_tensor *x, bool flatten,
                       const tn_mlp_layer *layers, int n) {
  int parts = parts_of(ctx);
  if (parts < 2 || n < 2 || n > TN_MLP_MAX_LAYERS) return false;
  if (!tn_mlp_chains(x, flatten, layers, n)) return false;
  return x->shape[0] >= ROWS_PER_PART * parts && layers[0].w->shape[0] >= ROWS_PER_PART * parts;
}

/* ---------------------------------------------------------------- backward */

/* The backward's buffers, shared by its jobs. dy[k] is the gradient of layer k's output
 * before its ReLU, (rows, width[k + 1]); for the last layer without a ReLU it is g itself. */
typedef struct {
  const mlp_fwd *f;
  const float *dy_last_in; /* the gradient arriving at the op's output */
  float *dy[TN_MLP_MAX_LAYERS];
  float *dw[TN_MLP_MAX_LAYERS], *db[TN_MLP_MAX_LAYERS]; /* the gradients (db[k] NULL: none) */
  float *dx;                                            /* NULL: the input needs none */
  /* per part: the weight gradients of layers 2.. and the bias gradients of layers 1.. over
   * its rows, and its share of dx; pdw[k] is (parts, width[k + 1], width[k]) */
  float *pdw[TN_MLP_MAX_LAYERS], *pdb[TN_MLP_MAX_LAYERS], *pdx;
} mlp_bwd;

/* g where h > 0, else 0 (the ReLU kernel's mask), over n values. */
TR_KERNEL static void relu_mask(float *dy, const float *g, const float *h, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dy[i] = h[i] > 0 ? g[i] : 0;
}

/* Rows [lo, hi) of the gradient of the last layer's output before its ReLU. */
static void last_dy_rows(const mlp_bwd *d, int64_t lo, int64_t hi) {
  const mlp_fwd *f = d->f;
  int last = f->n - 1;
  int64_t out = f->width[f->n];
  if (f->relu[last])
    relu_mask(d->dy[last] + lo * out, d->dy_last_in + lo * out, f->h[last] + lo * out,
              (hi - lo) * out);
}

/* Job 1, rows r_t: layers n-1..2 back to layer 1's output gradient, with this part's
 * partial weight and bias gradients. */
static void backward_rows(void *arg, int part, int parts) {
  const mlp_bwd *d = arg;
  const mlp_fwd *f = d->f;
  int64_t lo, hi;
  tn_par_range(f->rows, part, parts, &lo, &hi);
  last_dy_rows(d, lo, hi);
  for (int k = f->n - 1; k >= 1; k--) {
    int64_t in = f->width[k], out = f->width[k + 1];
    const float *dy = d->dy[k] + lo * out;
    if (d->pdb[k]) tn_col_sums(TR_F32, hi - lo, out, dy, out, d->pdb[k] + part * out);
    if (k == 1) break;
    float *pdw = d->pdw[k] + part * out * in, *dh = d->dy[k - 1] + lo * in;
    if (hi > lo)
      sgemm(true, false, out, in, hi - lo, dy, out, f->h[k - 1] + lo * in, in, pdw, in);
    else
      memset(pdw, 0, sizeof(float) * (size_t)(out * in));
    sgemm(false, false, hi - lo, in, out, dy, out, f->w[k], in, dh, in);
    if (f->relu[k - 1]) relu_mask(dh, dh, f->h[k - 1] + lo * in, (hi - lo) * in);
  }
}

/* The element range of part `part` of each small gradient: the sum of the parts'
 * partials, in part order. */
static void sum_small_grads(const mlp_bwd *d, int part, int parts) {
  const mlp_fwd *f = d->f;
  for (int k = 1; k < f->n; k++) {
    int64_t out = f->width[k + 1], size = out * f->width[k], lo, hi;
    if (d->db[k]) {
      tn_par_range(out, part, parts, &lo, &hi);
      tn_sum_partials(d->db[k] + lo, NULL, d->pdb[k] + lo, parts, out, hi - lo, false);
    }
    if (k < 2) continue;
    tn_par_range(size, part, parts, &lo, &hi);
    tn_sum_partials(d->dw[k] + lo, NULL, d->pdw[k] + lo, parts, size, hi - lo, false);
  }
}

/* Job 2, columns c_t of layer 0's output: layer 1's weight gradient and input gradient
 * there, layer 0's mask, bias gradient, weight gradient rows c_t and share of dx. */
static void backward_columns(void *arg, int part, int parts) {
  const mlp_bwd *d = arg;
  const mlp_fwd *f = d->f;
  int64_t in = f->width[0], mid = f->width[1], out = f->width[2], rows = f->rows, lo, hi;
  tn_par_range(mid, part, parts, &lo, &hi);
  sum_small_grads(d, part, parts);
  float *pdx = d->pdx ? d->pdx + part * rows * in : NULL;
  if (hi <= lo) {
    if (pdx) memset(pdx, 0, sizeof(float) * (size_t)(rows * in));
    return;
  }
  float *dy0 = d->dy[0] + lo;
  sgemm(true, false, out, hi - lo, rows, d->dy[1], out, f->h[0] + lo, mid, d->dw[1] + lo, mid);
  sgemm(false, false, rows, hi - lo, out, d->dy[1], out, f->w[1] + lo, mid, dy0, mid);
  if (f->relu[0])
    for (int64_t r = 0; r < rows; r++)
      relu_mask(dy0 + r * mid, dy0 + r * mid, f->h[0] + r * mid + lo, hi - lo);
  if (d->db[0]) tn_col_sums(TR_F32, rows, hi - lo, dy0, mid, d->db[0] + lo);
  sgemm(true, false, hi - lo, in, rows, dy0, mid, f->x, in, d->dw[0] + lo * in, in);
  if (pdx) sgemm(false, false, rows, in, hi - lo, dy0, mid, f->w[0] + lo * in, in, pdx, in);
}

/* Job 3, rows r_t of dx: the parts' shares added in part order. */
static void backward_dx(void *arg, int part, int parts) {
  const mlp_bwd *d = arg;
  int64_t in = d->f->width[0], size = d->f->rows * in, lo, hi;
  tn_par_range(d->f->rows, part, parts, &lo, &hi);
  tn_sum_partials(d->dx + lo * in, NULL, d->pdx + lo * in, parts, size, (hi - lo) * in, false);
}

/* ---------------------------------------------------------------- the op */

/* The run's node. Inputs: x, then w and b per layer. */
typedef struct {
  tr_node base;
  int layers;
  uint32_t relu, bias; /* bit k: layer k has a ReLU, a bias */
  tr_saved x;          /* the 2-D input */
  tr_saved w[TN_MLP_MAX_LAYERS];
  /* the outputs of layers 0..n-2, and the op's output when the last layer has a ReLU (its
   * mask) */
  tr_saved h[TN_MLP_MAX_LAYERS];
} mlp_node;

/* fn over `parts` parts: on the pool when it splits into that many now, else in turn here
 * (the same results: each part's work and the order of the sums depend on parts only). */
static void run_job(const tr_ctx *ctx, int parts, void (*fn)(void *arg, int part, int parts),
                    void *arg) {
  if (parts > 1 && parts_of(ctx) == parts) {
    tn_par_run(ctx, fn, arg);
    return;
  }
  for (int part = 0; part < parts; part++) fn(arg, part, parts);
}

/* The forward's tensors as saved in node (an error if one was modified in place since). */
static int saved_fwd(tr_ctx *ctx, tr_node *node, mlp_fwd *f) {
  mlp_node *m = (mlp_node *)node;
  int n = m->layers;
  *f = (mlp_fwd){.n = n, .parts = parts_of(ctx)};
  tr_tensor *x = ag_saved(ctx, node, &m->x);
  if (!x) return NAS_ERR;
  f->x = tr_f32(x);
  f->rows = x->shape[0];
  f->width[0] = x->shape[1];
  for (int k = 0; k < n; k++) {
    f->relu[k] = m->relu >> k & 1;
    bool kept = k < n - 1 || f->relu[k]; /* the last layer's output only for its mask */
    tr_tensor *w = ag_saved(ctx, node, &m->w[k]), *h = kept ? ag_saved(ctx, node, &m->h[k]) : NULL;
    if (!w || (kept && !h)) return NAS_ERR;
    f->w[k] = tr_f32(w);
    f->width[k + 1] = w->shape[0];
    f->h[k] = h ? tr_f32(h) : NULL;
  }
  return NAS_OK;
}

/* Carves n floats, rounded up to a cache line, off *at. */
static float *carve(float **at, int64_t n) {
  float *p = *at;
  *at += (n + 15) / 16 * 16;
  return p;
}

/* Floats of the backward's scratch: output gradients of layers 0..n-2 (and n-1 under a
 * ReLU), partial weight gradients of layers 2.., partial bias gradients, dx's shares. */
static int64_t scratch_floats(const mlp_fwd *f, uint32_t bias, bool dx) {
  int64_t total = 16 * (3 * TN_MLP_MAX_LAYERS + 1); /* rounding room of every carve */
  for (int k = 0; k < f->n; k++) {
    int64_t out = f->width[k + 1];
    if (k < f->n - 1 || f->relu[k]) total += f->rows * out;
    if (k >= 2) total += f->parts * out * f->width[k];
    if (k >= 1 && (bias >> k & 1)) total += f->parts * out;
  }
  return total + (dx ? f->parts * f->rows * f->width[0] : 0);
}

static void carve_scratch(mlp_bwd *d, float *at, uint32_t bias) {
  const mlp_fwd *f = d->f;
  for (int k = 0; k < f->n; k++) {
    int64_t out = f->width[k + 1];
    d->dy[k] = k < f->n - 1 || f->relu[k] ? carve(&at, f->rows * out) : (float *)d->dy_last_in;
    if (k >= 2) d->pdw[k] = carve(&at, f->parts * out * f->width[k]);
    if (k >= 1 && (bias >> k & 1)) d->pdb[k] = carve(&at, f->parts * out);
  }
  if (d->dx) d->pdx = carve(&at, f->parts * f->rows * f->width[0]);
}

/* The gradients the node's inputs get: dx (as x's shape) when wanted, then per layer its
 * weight's and bias's. All are computed (the weights' always need them in training); those
 * no edge wants are freed. */
static int new_grads(tr_ctx *ctx, tr_node *node, const mlp_fwd *f, tr_tensor **gi, mlp_bwd *d) {
  uint32_t bias = ((mlp_node *)node)->bias;
  for (int k = 0; k < f->n; k++) {
    gi[1 + 2 * k] = tr_empty(ctx, TR_F32, 2, (int64_t[]){f->width[k + 1], f->width[k]});
    if (!gi[1 + 2 * k]) return NAS_ERR;
    d->dw[k] = tr_f32(gi[1 + 2 * k]);
    if (!(bias >> k & 1)) continue;
    if (!(gi[2 + 2 * k] = tr_empty(ctx, TR_F32, 1, (int64_t[]){f->width[k + 1]}))) return NAS_ERR;
    d->db[k] = tr_f32(gi[2 + 2 * k]);
  }
  if (!ag_wants(node, 0)) return NAS_OK;
  gi[0] = tr_empty(ctx, TR_F32, node->in_meta[0].ndim, node->in_meta[0].shape);
  d->dx = gi[0] ? tr_f32(gi[0]) : NULL;
  return gi[0] ? NAS_OK : NAS_ERR;
}

static int mlp_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  mlp_fwd f;
  if (saved_fwd(ctx, node, &f)) return NAS_ERR;
  tr_tensor *gc = tn_contig(ctx, g);
  mlp_bwd d = {.f = &f, .dy_last_in = gc ? tr_f32(gc) : NULL};
  int rc = gc ? new_grads(ctx, node, &f, gi, &d) : NAS_ERR;
  uint32_t bias = ((mlp_node *)node)->bias;
  tr_tensor *scratch =
      rc ? NULL : tr_empty(ctx, TR_F32, 1, (int64_t[]){scratch_floats(&f, bias, d.dx != NULL)});
  if (scratch) {
    carve_scratch(&d, tr_f32(scratch), bias);
    run_job(ctx, f.parts, backward_rows, &d);
    run_job(ctx, f.parts, backward_columns, &d);
    if (d.dx) run_job(ctx, f.parts, backward_dx, &d);
  }
  for (int i = 1; i < node->n_next; i++) /* gradients no edge takes */
    if (!ag_wants(node, i)) {
      tr_release(gi[i]);
      gi[i] = NULL;
    }
  tr_release(scratch);
  tr_release(gc);
  return scratch ? NAS_OK : NAS_ERR;
}
static const tr_node_ops mlp_ops = {"MlpBackward", mlp_backward, sizeof(mlp_node), NULL};

/* Records the node of y = the run on x2 (x's 2-D view): inputs x and each layer's weight
 * and bias; saved x2, the weights and the layers' outputs backward needs. */
static int record(tr_ctx *ctx, tr_tensor *x, tr_tensor *x2, const tn_mlp_layer *layers, int n,
                  tr_tensor *const *h) {
  /* the inputs as autograd takes them: the layers hold them const for inference */
  tr_tensor *in[1 + 2 * TN_MLP_MAX_LAYERS] = {x};
  for (int k = 0; k < n; k++) {
    in[1 + 2 * k] = (tr_tensor *)layers[k].w;
    in[2 + 2 * k] = (tr_tensor *)layers[k].b;
  }
  int rc = NAS_OK;
  mlp_node *node = ag_record(ctx, &mlp_ops, 1 + 2 * n, in, h[n - 1], &rc);
  if (!node) return rc; /* nothing needs a gradient, or the node could not be made */
  node->layers = n;
  rc = ag_save(ctx, &node->base, &node->x, x2);
  for (int k = 0; k < n && rc == NAS_OK; k++) {
    node->relu |= (uint32_t)layers[k].relu << k;
    node->bias |= (uint32_t)(layers[k].b != NULL) << k;
    rc = ag_save(ctx, &node->base, &node->w[k], in[1 + 2 * k]);
  }
  for (int k = 0; k < n && rc == NAS_OK; k++)
    if (k < n - 1 || layers[k].relu) rc = ag_save(ctx, &node->base, &node->h[k], h[k]);
  return rc;
}

tr_tensor *tn_mlp_train(tr_ctx *ctx, tr_tensor *x, const tn_mlp_layer *layers, int n) {
  int64_t rows = x->shape[0];
  tr_tensor *x2 = tn_view(ctx, x, 2, (int64_t[]){rows, x->numel / rows});
  if (!x2) return NULL;
  mlp_fwd f = {.n = n, .parts = parts_of(ctx), .rows = rows, .x = tr_f32(x2)};
  f.width[0] = x2->shape[1];
  tr_tensor *h[TN_MLP_MAX_LAYERS] = {0}, *partial = NULL;
  int rc = NAS_OK;
  for (int k = 0; k < n && rc == NAS_OK; k++) {
    f.width[k + 1] = layers[k].w->shape[0];
    f.w[k] = tr_f32(layers[k].w);
    f.b[k] = layers[k].b ? tr_f32(layers[k].b) : NULL;
    f.relu[k] = layers[k].relu;
    h[k] = tr_empty(ctx, TR_F32, 2, (int64_t[]){rows, f.width[k + 1]});
    rc = h[k] ? NAS_OK : NAS_ERR;
    if (h[k]) f.h[k] = tr_f32(h[k]);
  }
  if (rc == NAS_OK) partial = tr_empty(ctx, TR_F32, 1, (int64_t[]){f.parts * rows * f.width[2]});
  if (partial) {
    f.partial = tr_f32(partial);
    run_job(ctx, f.parts, forward_columns, &f);
    run_job(ctx, f.parts, forward_rows, &f);
    rc = record(ctx, x, x2, layers, n, h);
  }
  tr_tensor *y = partial && rc == NAS_OK ? tr_retain(h[n - 1]) : NULL;
  for (int k = 0; k < n; k++) tr_release(h[k]);
  tr_release(partial);
  tr_release(x2);
  return y;
}
