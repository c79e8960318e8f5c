/* nn: modules (Linear, Conv2d, BatchNorm, LayerNorm, activations, Dropout, pools, Flatten,
 * Sequential, and the branching blocks Residual and SqueezeExcite), their initialisation,
 * parameter iteration, flat parameter buffers, and the weights file.
 *
 * A module owns its parameters and buffers (float32 tensors); Sequential owns its children.
 * The kinds are a closed set, so forward is a switch rather than a vtable. Parameter names
 * follow torch's state_dict ("0.weight", "2.running_mean"), so a reader can match them.
 *
 * Weights file, version 1 (all integers little-endian):
 *   "NASW"  u32 version  u32 count
 *   count x { u32 name_len, name, u8 dtype (0 f32, 1 f64), u8 ndim, i64 shape[ndim], data }
 *   u32 CRC-32 (zlib's) of every byte before it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/fast/infer.h"
#include "trainer/core/internal.h"
#include "trainer/nn/serial.h"

/* What the two ends of a skip connection share: the tensor the stash kept until the pop
 * takes it. Freed with the last of the two modules. */
typedef struct {
  int refs;         /* modules that hold it: 2, then 1 */
  tr_tensor *kept;  /* owned; NULL when nothing is stashed */
} nn_skip;

struct tr_module {
  tr_module_kind kind;
  bool training;
  tr_tensor *weight, *bias;              /* owned parameters, NULL when absent */
  tr_tensor *running_mean, *running_var; /* owned buffers (batch norm) */
  int kernel, stride, padding;           /* conv, pools */
  int groups;                            /* conv: 1, or more for a grouped convolution */
  double p, eps, momentum;               /* dropout; norms */
  tr_module **children;                  /* owned (sequential; residual: body, shortcut;
                                            squeeze-excite: gate) */
  size_t n_children, cap_children;
  nn_skip *skip;                         /* stash and pop: shared with the other end */
  tr_skip_merge merge;                   /* pop */
  tn_bn_hook bn_hook;                    /* batch norm: runs the forward when set */
  void *bn_hook_arg;                     /* borrowed: the hook's */
};

/* ---------------------------------------------------------------- construction */

static tr_module *module_new(tr_ctx *ctx, tr_module_kind kind) {
  tr_module *m = calloc(1, sizeof *m);
  if (!m) {
    tr_fail(ctx, "nn: out of memory");
    return NULL;
  }
  m->kind = kind;
  m->training = true;
  return m;
}

/* torch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias (Kaiming-uniform
 * with a = sqrt 5 works out to this bound). */
static tr_module *with_weights(tr_ctx *ctx, tr_module *m, int ndim, const int64_t *wshape,
                               int64_t fan_in, bool bias) {
  double bound = 1.0 / sqrt((double)(fan_in ? fan_in : 1));
  m->weight = tr_rand(ctx, TR_F32, ndim, wshape, -bound, bound);
  if (bias) m->bias = tr_rand(ctx, TR_F32, 1, wshape, -bound, bound);
  if (!m->weight || (bias && !m->bias)) {
    tr_module_free(m);
    return NULL;
  }
  tr_set_requires_grad(m->weight, true);
  if (m->bias) tr_set_requires_grad(m->bias, true);
  return m;
}

tr_module *tr_linear_new(tr_ctx *ctx, int64_t in, int64_t out, bool bias) {
  tr_module *m = module_new(ctx, TR_LINEAR);
  return m ? with_weights(ctx, m, 2, (int64_t[]){out, in}, in, bias) : NULL;
}

tr_module *tr_conv2d_new(tr_ctx *ctx, int64_t in_ch, int64_t out_ch, int kernel, int stride,
                         int padding, bool bias) {
  return tr_conv2d_grouped_new(ctx, in_ch, out_ch, kernel, stride, padding, 1, bias);
}

tr_module *tr_conv2d_grouped_new(tr_ctx *ctx, int64_t in_ch, int64_t out_ch, int kernel,
                                 int stride, int padding, int groups, bool bias) {
  if (kernel < 1 || stride < 1 || padding < 0) {
    tr_fail(ctx, "nn: conv kernel %d, stride %d, padding %d (kernel and stride from 1, padding "
                 "from 0)", kernel, stride, padding);
    return NULL;
  }
  if (groups < 1 || in_ch % groups || out_ch % groups) {
    tr_fail(ctx, "nn: %lld input and %lld output channels do not split into %d groups",
            (long long)in_ch, (long long)out_ch, groups);
    return NULL;
  }
  tr_module *m = module_new(ctx, TR_CONV2D);
  if (!m) return NULL;
  m->kernel = kernel;
  m->stride = stride;
  m->padding = padding;
  m->groups = groups;
  return with_weights(ctx, m, 4, (int64_t[]){out_ch, in_ch / groups, kernel, kernel},
                      in_ch / groups * kernel * kernel, bias);
}

/* weight 1, bias 0; batch norm adds running mean 0 and variance 1. */
static tr_module *norm_new(tr_ctx *ctx, tr_module_kind kind, int64_t features) {
  tr_module *m = module_new(ctx, kind);
  if (!m) return NULL;
  m->eps = 1e-5;
  m->momentum = 0.1;
  int64_t shape[1] = {features};
  m->weight = tr_full(ctx, TR_F32, 1, shape, 1.0);
  m->bias = tr_zeros(ctx, TR_F32, 1, shape);
  if (kind == TR_BATCHNORM) {
    m->running_mean = tr_zeros(ctx, TR_F32, 1, shape);
    m->running_var = tr_full(ctx, TR_F32, 1, shape, 1.0);
  }
  if (!m->weight || !m->bias || (kind == TR_BATCHNORM && (!m->running_mean || !m->running_var))) {
    tr_module_free(m);
    return NULL;
  }
  tr_set_requires_grad(m->weight, true);
  tr_set_requires_grad(m->bias, true);
  return m;
}

tr_module *tr_batchnorm_new(tr_ctx *ctx, int64_t features) {
  return norm_new(ctx, TR_BATCHNORM, features);
}
tr_module *tr_layernorm_new(tr_ctx *ctx, int64_t features) {
  return norm_new(ctx, TR_LAYERNORM, features);
}

tr_module *tr_activation_new(tr_ctx *ctx, tr_module_kind kind) {
  if (kind != TR_RELU && kind != TR_GELU && kind != TR_TANH && kind != TR_SIGMOID &&
      kind != TR_HARDSWISH && kind != TR_HARDSIGMOID && kind != TR_GLOBALAVGPOOL &&
      kind != TR_FLATTEN) {
    tr_fail(ctx, "nn: module kind %d is not a parameterless activation", (int)kind);
    return NULL;
  }
  return module_new(ctx, kind);
}

tr_module *tr_dropout_new(tr_ctx *ctx, double p) {
  if (!(p >= 0 && p < 1)) { /* NaN too; refused here rather than at the first forward */
    tr_fail(ctx, "nn: dropout p = %g is outside [0, 1)", p);
    return NULL;
  }
  tr_module *m = module_new(ctx, TR_DROPOUT);
  if (m) m->p = p;
  return m;
}

tr_module *tr_pool_new(tr_ctx *ctx, tr_module_kind kind, int kernel) {
  if (kind != TR_MAXPOOL2D && kind != TR_AVGPOOL2D) {
    tr_fail(ctx, "nn: module kind %d is not a pool", (int)kind);
    return NULL;
  }
  tr_module *m = module_new(ctx, kind);
  if (m) m->kernel = m->stride = kernel;
  return m;
}

tr_module *tr_sequential_new(tr_ctx *ctx) { return module_new(ctx, TR_SEQUENTIAL); }

int tr_sequential_add(tr_ctx *ctx, tr_module *seq, tr_module *child) {
  if (!child) return nas_errf(&ctx->err, "sequential: no module to add");
  if (seq->n_children == seq->cap_children) {
    size_t ncap = seq->cap_children ? seq->cap_children * 2 : 8;
    tr_module **grown = realloc(seq->children, ncap * sizeof *grown);
    if (!grown) {
      tr_module_free(child);
      return nas_errf(&ctx->err, "sequential: out of memory");
    }
    seq->children = grown;
    seq->cap_children = ncap;
  }
  seq->children[seq->n_children++] = child;
  child->training = seq->training;
  return NAS_OK;
}

/* A module of kind whose children are the n given (NULL ones skipped), all owned by it;
 * on failure they are freed. */
static tr_module *branching_new(tr_ctx *ctx, tr_module_kind kind, tr_module **given, size_t n) {
  tr_module *m = module_new(ctx, kind);
  size_t i = 0;
  for (; m && i < n; i++)
    if (given[i] && tr_sequential_add(ctx, m, given[i]) != NAS_OK) { /* it freed given[i] */
      tr_module_free(m);
      m = NULL;
    }
  for (; i < n; i++) tr_module_free(given[i]);
  return m;
}

tr_module *tr_residual_new(tr_ctx *ctx, tr_module *body, tr_module *shortcut) {
  if (!body) {
    tr_module_free(shortcut);
    tr_fail(ctx, "nn: a residual block needs a body");
    return NULL;
  }
  return branching_new(ctx, TR_RESIDUAL, (tr_module *[]){body, shortcut}, 2);
}

tr_module *tr_squeeze_excite_new(tr_ctx *ctx, tr_module *gate) {
  if (!gate) {
    tr_fail(ctx, "nn: squeeze-and-excitation needs a gate");
    return NULL;
  }
  return branching_new(ctx, TR_SQUEEZE_EXCITE, &gate, 1);
}

int tr_skip_new(tr_ctx *ctx, tr_skip_merge merge, tr_module **stash, tr_module **pop) {
  *stash = *pop = NULL;
  if (merge != TR_SKIP_ADD && merge != TR_SKIP_CONCAT)
    return nas_errf(&ctx->err, "nn: unknown skip merge %d", (int)merge);
  nn_skip *skip = calloc(1, sizeof *skip);
  tr_module *in = module_new(ctx, TR_STASH), *out = module_new(ctx, TR_POP);
  if (!skip || !in || !out) {
    free(skip), free(in), free(out);
    return nas_errf(&ctx->err, "nn: out of memory");
  }
  skip->refs = 2;
  in->skip = out->skip = skip;
  out->merge = merge;
  *stash = in;
  *pop = out;
  return NAS_OK;
}

void tr_module_free(tr_module *m) {
  if (!m) return;
  if (m->skip && --m->skip->refs == 0) {
    tr_release(m->skip->kept);
    free(m->skip);
  }
  for (size_t i = 0; i < m->n_children; i++) tr_module_free(m->children[i]);
  free(m->children);
  tr_release(m->weight);
  tr_release(m->bias);
  tr_release(m->running_mean);
  tr_release(m->running_var);
  free(m);
}

/* ---------------------------------------------------------------- forward */

/* Children i.. of seq as an MLP run for tn_mlp_infer: an optional flatten, then linear
 * layers, each optionally followed by a ReLU. Fills layers (*n of them) and *flatten;
 * returns how many children the run spans (0: it has no linear layer). */
static size_t mlp_run(const tr_module *seq, size_t i, bool *flatten, tn_mlp_layer *layers,
                      int *n) {
  size_t at = i;
  *flatten = at < seq->n_children && seq->children[at]->kind == TR_FLATTEN;
  at += *flatten;
  for (*n = 0; *n < TN_MLP_MAX_LAYERS && at < seq->n_children; (*n)++) {
    const tr_module *lin = seq->children[at];
    if (lin->kind != TR_LINEAR) break;
    bool relu = at + 1 < seq->n_children && seq->children[at + 1]->kind == TR_RELU;
    layers[*n] = (tn_mlp_layer){lin->weight, lin->bias, relu};
    at += 1 + relu;
  }
  return *n ? at - i : 0;
}

/* No-grad mode: children i.. of seq as one fused inference step where infer.c has one
 * (at batch 1, a run of [flatten] linear [ReLU] ...; conv2d, then optionally ReLU, then
 * optionally a max pool; linear then ReLU), else child i alone. *used gets how many
 * children ran. A fused step computes the same function. */
static tr_tensor *inference_forward(tr_ctx *ctx, const tr_module *seq, size_t i, tr_tensor *x,
                                    size_t *used) {
  tr_module *const *c = seq->children + i;
  size_t left = seq->n_children - i;
  tn_mlp_layer layers[TN_MLP_MAX_LAYERS];
  bool flatten;
  int n;
  size_t span = mlp_run(seq, i, &flatten, layers, &n);
  if (span && tn_mlp_fits(x, flatten, layers, n)) {
    *used = span;
    return tn_mlp_infer(ctx, x, layers, n);
  }
  *used = 1;
  if (c[0]->kind == TR_CONV2D) {
    bool relu = left > 1 && c[1]->kind == TR_RELU;
    size_t at = relu ? 2 : 1;
    bool pools = left > at && c[at]->kind == TR_MAXPOOL2D && c[at]->stride == c[at]->kernel;
    int pool = pools ? c[at]->kernel : 0;
    if (tn_conv_block_fits(x, c[0]->weight, c[0]->bias, c[0]->stride, c[0]->padding, pool)) {
      *used = at + (pool > 0);
      return tn_conv_block_infer(ctx, x, c[0]->weight, c[0]->bias, c[0]->padding, relu, pool);
    }
  }
  if (c[0]->kind == TR_LINEAR && left > 1 && c[1]->kind == TR_RELU &&
      tn_linear_relu_fits(x, c[0]->weight)) {
    *used = 2;
    return tn_linear_relu_infer(ctx, x, c[0]->weight, c[0]->bias);
  }
  return tr_module_forward(ctx, c[0], x);
}

/* Grad mode: children i.. of seq as one fused MLP op where it fits (mlp_train.c), else
 * child i alone; *used gets how many children ran. */
static tr_tensor *training_forward(tr_ctx *ctx, const tr_module *seq, size_t i, tr_tensor *x,
                                   size_t *used) {
  tn_mlp_layer layers[TN_MLP_MAX_LAYERS];
  bool flatten;
  int n;
  size_t span = mlp_run(seq, i, &flatten, layers, &n);
  if (span && tn_mlp_train_fits(ctx, x, flatten, layers, n)) {
    *used = span;
    return tn_mlp_train(ctx, x, layers, n);
  }
  *used = 1;
  return tr_module_forward(ctx, seq->children[i], x);
}

static tr_tensor *sequential_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  tr_tensor *cur = tr_retain(x);
  for (size_t i = 0, used = 1; i < m->n_children && cur; i += used) {
    tr_tensor *next = ctx->grad_enabled ? training_forward(ctx, m, i, cur, &used)
                                        : inference_forward(ctx, m, i, cur, &used);
    tr_release(cur);
    cur = next;
  }
  return cur;
}

static tr_tensor *flatten_forward(tr_ctx *ctx, tr_tensor *x) {
  int64_t shape[2] = {x->ndim ? x->shape[0] : 1, -1};
  return tr_reshape(ctx, x, 2, shape);
}

static tr_tensor *residual_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  tr_tensor *body = tr_module_forward(ctx, m->children[0], x);
  tr_tensor *skip = !body            ? NULL
                    : m->n_children > 1 ? tr_module_forward(ctx, m->children[1], x)
                                        : tr_retain(x);
  tr_tensor *y = skip ? tr_add(ctx, body, skip) : NULL;
  tr_release(skip);
  tr_release(body);
  return y;
}

static tr_tensor *squeeze_excite_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  tr_tensor *gate = tr_module_forward(ctx, m->children[0], x);
  tr_tensor *y = gate ? tr_channel_scale(ctx, x, gate) : NULL;
  tr_release(gate);
  return y;
}

static tr_tensor *stash_forward(tr_module *m, tr_tensor *x) {
  tr_release(m->skip->kept);
  m->skip->kept = tr_retain(x);
  return tr_retain(x);
}

static tr_tensor *pop_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  tr_tensor *kept = m->skip->kept;
  if (!kept) return tr_fail(ctx, "nn: a skip connection's pop ran before its stash");
  m->skip->kept = NULL;
  tr_tensor *both[2] = {x, kept};
  tr_tensor *out = m->merge == TR_SKIP_ADD ? tr_add(ctx, x, kept) : tr_concat(ctx, 2, both, 1);
  tr_release(kept);
  return out;
}

tr_tensor *tn_batchnorm_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  return tr_batch_norm(ctx, x, m->weight, m->bias, m->running_mean, m->running_var, m->training,
                       m->momentum, m->eps);
}

tr_tensor *tr_module_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  switch (m->kind) {
  case TR_LINEAR: return tr_linear(ctx, x, m->weight, m->bias);
  case TR_CONV2D:
    return tr_conv2d_grouped(ctx, x, m->weight, m->bias, m->stride, m->padding, m->groups);
  case TR_BATCHNORM:
    return m->bn_hook ? m->bn_hook(ctx, m->bn_hook_arg, m, x) : tn_batchnorm_forward(ctx, m, x);
  case TR_LAYERNORM: return tr_layer_norm(ctx, x, m->weight, m->bias, m->eps);
  case TR_RELU: return tr_relu(ctx, x);
  case TR_GELU: return tr_gelu(ctx, x);
  case TR_TANH: return tr_tanh(ctx, x);
  case TR_SIGMOID: return tr_sigmoid(ctx, x);
  case TR_DROPOUT: return tr_dropout(ctx, x, m->p, m->training);
  case TR_MAXPOOL2D: return tr_max_pool2d(ctx, x, m->kernel, m->stride);
  case TR_AVGPOOL2D: return tr_avg_pool2d(ctx, x, m->kernel, m->stride);
  case TR_FLATTEN: return flatten_forward(ctx, x);
  case TR_SEQUENTIAL: return sequential_forward(ctx, m, x);
  case TR_HARDSWISH: return tr_hardswish(ctx, x);
  case TR_HARDSIGMOID: return tr_hardsigmoid(ctx, x);
  case TR_GLOBALAVGPOOL: return tr_global_avg_pool2d(ctx, x);
  case TR_RESIDUAL: return residual_forward(ctx, m, x);
  case TR_SQUEEZE_EXCITE: return squeeze_excite_forward(ctx, m, x);
  case TR_STASH: return stash_forward(m, x);
  case TR_POP: return pop_forward(ctx, m, x);
  }
  return tr_fail(ctx, "nn: unknown module kind %d", (int)m->kind);
}

void tr_module_train(tr_module *m, bool training) {
  m->training = training;
  for (size_t i = 0; i < m->n_children; i++) tr_module_train(m->children[i], training);
}

/* ---------------------------------------------------------------- parameters */

void tr_param_list_free(tr_param_list *list) {
  for (size_t i = 0; i < list->n; i++) free(list->names[i]);
  free(list->names);
  free(list->items);
  memset(list, 0, sizeof *list);
}

static int list_add(tr_param_list *list, const char *prefix, const char *name, tr_tensor *t,
                    nas_err *err) {
  if (!t) return NAS_OK;
  if (list->n == list->cap) {
    size_t ncap = list->cap ? list->cap * 2 : 16;
    tr_tensor **items = realloc(list->items, ncap * sizeof *items);
    if (items) list->items = items;
    char **names = items ? realloc(list->names, ncap * sizeof *names) : NULL;
    if (!names) return nas_errf(err, "parameters: out of memory");
    list->names = names;
    list->cap = ncap;
  }
  char *full = nas_asprintf("%s%s", prefix, name);
  if (!full) return nas_errf(err, "parameters: out of memory");
  list->items[list->n] = t;
  list->names[list->n++] = full;
  return NAS_OK;
}

static int collect(tr_module *m, bool buffers, const char *prefix, tr_param_list *list,
                   nas_err *err) {
  if (list_add(list, prefix, "weight", m->weight, err) ||
      list_add(list, prefix, "bias", m->bias, err))
    return NAS_ERR;
  if (buffers && (list_add(list, prefix, "running_mean", m->running_mean, err) ||
                  list_add(list, prefix, "running_var", m->running_var, err)))
    return NAS_ERR;
  for (size_t i = 0; i < m->n_children; i++) {
    char *child_prefix = nas_asprintf("%s%zu.", prefix, i);
    if (!child_prefix) return nas_errf(err, "parameters: out of memory");
    int rc = collect(m->children[i], buffers, child_prefix, list, err);
    free(child_prefix);
    if (rc) return rc;
  }
  return NAS_OK;
}

int tr_module_parameters(tr_module *m, bool buffers, tr_param_list *list, nas_err *err) {
  return collect(m, buffers, "", list, err);
}

int64_t tr_module_param_count(tr_module *m) {
  int64_t n = (m->weight ? m->weight->numel : 0) + (m->bias ? m->bias->numel : 0);
  for (size_t i = 0; i < m->n_children; i++) n += tr_module_param_count(m->children[i]);
  return n;
}

tr_module *const *tn_module_children(const tr_module *m, size_t *n) {
  *n = m->n_children;
  return m->children;
}

tr_tensor **tn_module_skip(const tr_module *m, bool *stashes) {
  if (!m->skip) return NULL;
  if (stashes) *stashes = m->kind == TR_STASH;
  return &m->skip->kept;
}

bool tn_module_batch_norm(const tr_module *m, tr_tensor **running_mean, tr_tensor **running_var,
                          double *momentum, bool *training) {
  if (m->kind != TR_BATCHNORM) return false;
  *running_mean = m->running_mean;
  *running_var = m->running_var;
  *momentum = m->momentum;
  *training = m->training;
  return true;
}

void tn_module_set_bn_hook(tr_module *m, tn_bn_hook hook, void *arg) {
  m->bn_hook = hook;
  m->bn_hook_arg = arg;
}

/* ---------------------------------------------------------------- init */

static void fill_normal(tr_ctx *ctx, tr_tensor *t, double std) {
  for (int64_t i = 0; i < t->numel; i++) tr_f32(t)[i] = (float)(std * tr_rand_normal(ctx));
}

static void fill_uniform(tr_ctx *ctx, tr_tensor *t, double bound) {
  for (int64_t i = 0; i < t->numel; i++)
    tr_f32(t)[i] = (float)(bound * (2 * tr_rand_uniform(ctx) - 1));
}

int tr_module_init(tr_ctx *ctx, tr_module *m, tr_init_kind kind) {
  for (size_t i = 0; i < m->n_children; i++)
    if (tr_module_init(ctx, m->children[i], kind)) return NAS_ERR;
  if (m->kind != TR_LINEAR && m->kind != TR_CONV2D) return NAS_OK;
  int64_t receptive = m->kind == TR_CONV2D ? m->weight->shape[2] * m->weight->shape[3] : 1;
  double fan_in = (double)(m->weight->shape[1] * receptive);
  double fan_out = (double)(m->weight->shape[0] * receptive);
  if (kind == TR_INIT_KAIMING)
    fill_normal(ctx, m->weight, sqrt(2.0 / fan_in));
  else
    fill_uniform(ctx, m->weight, sqrt(6.0 / (fan_in + fan_out)));
  m->weight->storage->version++;
  if (m->bias) tn_fill(m->bias, 0.0);
  return NAS_OK;
}

/* ---------------------------------------------------------------- flat buffers */

/* Points t at offset off of storage s (same shape, contiguous); t's data must already be
 * there. Everyone holding t sees the move: t is the same object. */
static void rebase(tr_tensor *t, tr_storage *s, int64_t off) {
  s->refs++;
  tr_storage *old = t->storage;
  t->storage = s;
  t->offset = off;
  tn_contiguous_strides(t->ndim, t->shape, t->strides);
  tn_storage_release(old);
}

int tr_module_flatten(tr_ctx *ctx, tr_module *m, tr_tensor **params, tr_tensor **grads) {
  tr_param_list list = {0};
  if (tr_module_parameters(m, false, &list, &ctx->err)) return NAS_ERR;
  int64_t total = 0;
  for (size_t i = 0; i < list.n; i++) total += list.items[i]->numel;
  int64_t shape[1] = {total};
  tr_tensor *flat = tr_empty(ctx, TR_F32, 1, shape),
            *gflat = flat ? tr_zeros(ctx, TR_F32, 1, shape) : NULL;
  if (!gflat) {
    tr_release(flat);
    tr_param_list_free(&list);
    return NAS_ERR;
  }
  int64_t off = 0;
  for (size_t i = 0; i < list.n; i++) {
    tr_tensor *p = list.items[i];
    tn_copy_to_contig(p, tr_f32(flat) + off);
    if (p->grad) tn_copy_to_contig(p->grad, tr_f32(gflat) + off);
    rebase(p, flat->storage, off);
    tr_tensor *g = tn_alias(ctx, p);
    if (g) rebase(g, gflat->storage, off);
    tr_release(p->grad);
    p->grad = g;
    off += p->numel;
  }
  tr_param_list_free(&list);
  if (params)
    *params = flat;
  else
    tr_release(flat);
  if (grads)
    *grads = gflat;
  else
    tr_release(gflat);
  return NAS_OK;
}

/* ---------------------------------------------------------------- save and load */

/* The file's head: magic, format version, tensor count. */
static int put_head(ser_buf *b, size_t count) {
  if (ser_put(b, "NASW", 4) || ser_put_u32(b, 1)) return NAS_ERR;
  return ser_put_u32(b, (uint32_t)count);
}

int tr_module_save(tr_module *m, const char *path, nas_err *err) {
  if (!ser_host_is_little_endian())
    return nas_errf(err, "%s: weights files are little-endian only", path);
  tr_param_list list = {0};
  if (tr_module_parameters(m, true, &list, err)) return NAS_ERR;
  ser_buf b = {0};
  int rc = put_head(&b, list.n);
  for (size_t i = 0; i < list.n && !rc; i++) rc = ser_put_tensor(&b, list.names[i], list.items[i]);
  if (rc)
    rc = nas_errf(err, "%s: out of memory while serialising weights", path);
  else
    rc = ser_seal_and_write(&b, path, err);
  free(b.data);
  tr_param_list_free(&list);
  return rc;
}

static int parse_weights(const unsigned char *data, size_t n, const char *path, tr_param_list *list,
                         nas_err *err) {
  ser_reader r;
  if (ser_open(data, n, "NASW", "nas weights file", path, &r, err)) return NAS_ERR;
  uint32_t version, count;
  if (!ser_take_u32(&r, &version) || !ser_take_u32(&r, &count))
    return nas_errf(err, "%s: truncated head", path);
  if (version != 1)
    return nas_errf(err, "%s: weights file version %u, this nas reads version 1", path, version);
  if (count != list->n)
    return nas_errf(err, "%s: %u tensors, the model has %zu", path, count, list->n);
  /* every record checked before any is written: a file that does not fit leaves m as it was */
  const unsigned char **values = calloc(list->n ? list->n : 1, sizeof *values);
  if (!values) return nas_errf(err, "%s: out of memory", path);
  int rc = NAS_OK;
  for (size_t i = 0; i < list->n && rc == NAS_OK; i++)
    rc = ser_check_tensor(&r, path, list->names[i], list->items[i], &values[i], err);
  if (rc == NAS_OK && r.left != 0)
    rc = nas_errf(err, "%s: %zu stray bytes after the last tensor", path, r.left);
  for (size_t i = 0; i < list->n && rc == NAS_OK; i++) ser_fill_tensor(list->items[i], values[i]);
  free(values);
  return rc;
}

int tr_module_load(tr_module *m, const char *path, nas_err *err) {
  if (!ser_host_is_little_endian())
    return nas_errf(err, "%s: weights files are little-endian only", path);
  char *data = NULL;
  size_t n = 0;
  if (nas_read_file(path, &data, &n, err)) return NAS_ERR;
  tr_param_list list = {0};
  int rc = tr_module_parameters(m, true, &list, err);
  if (rc == NAS_OK) rc = parse_weights((const unsigned char *)data, n, path, &list, err);
  tr_param_list_free(&list);
  free(data);
  return rc;
}
