/* trainer: the embedded training engine (CPU, and CUDA devices: see the devices section).
 *
 * Layers, each built on the one before (docs/engine.md tells the design):
 *   tensor    float32/float64 data with shape and strides over a reference-counted storage
 *             that carries a version counter; views share the storage.
 *   autograd  define-by-run: an op whose inputs need grad creates a backward node (tr_node)
 *             with next_edges to its inputs' nodes (leaves get an AccumulateGrad node);
 *             tr_backward runs the nodes in dependency order and frees the graph's buffers.
 *   ops       forward + backward per op (elementwise, reduce, matmul, conv, norm, loss, shape).
 *   nn        modules (Linear, Conv2d, norms, activations, Sequential), init, save/load.
 *   optim     SGD (momentum, Nesterov, weight decay), Adam, AdamW, LR schedules, clipping.
 *   data      IDX (gzip ok) and CSV loaders, split, normalisation, seeded shuffled batches.
 *
 * Conventions:
 * - All mutable engine state (grad mode, random generator, last error) lives in a tr_ctx the
 *   caller owns; there is no global state. One ctx per thread.
 * - Ops take borrowed inputs and return an owned new reference, or NULL with ctx->err set.
 *   tr_retain adds a reference, tr_free drops one; a tensor goes with its last reference.
 * - Ops compute in the dtype of their inputs (all inputs must share it); float64 exists so
 *   gradient checks by central differences are exact enough to mean something.
 * - Functions that return int return 0 (NAS_OK) or a negative NAS_E* code with a message. */
#ifndef NAS_TRAINER_H
#define NAS_TRAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---------------------------------------------------------------- context */

/* Where tensor memory comes from: a cache of freed blocks by size, so that a training
 * step's buffers are reused instead of coming back from the kernel as fresh pages, and
 * byte counts (in use, peak) for memory accounting. Reference counted: every storage made
 * from it holds a reference, so releasing the creator's reference is safe at any time. */
typedef struct tr_allocator tr_allocator;
typedef struct {
  size_t in_use, peak, cached; /* bytes */
} tr_alloc_stats;

/* Keeps at most cache_limit bytes of freed blocks; NULL when out of memory. */
tr_allocator *tr_allocator_new(size_t cache_limit);
void tr_allocator_release(tr_allocator *a);
void tr_allocator_stats(tr_allocator *a, tr_alloc_stats *out);
/* Frees the cached blocks (not the ones in use). */
void tr_allocator_trim(tr_allocator *a);

/* The engine's own worker threads, for the work it splits finer than an OpenMP parallel
 * region pays for (the GEMMs and matrix-vector products of a training step or of batch-1
 * inference, the optimiser's updates): `threads` counts the caller, so 2 starts one worker.
 * A context uses it when ctx->threads points at it and OpenBLAS runs on one thread; run
 * OpenMP on one thread then too (OMP_NUM_THREADS=1), so that one pool works at a time.
 * Idle workers spin a few hundred microseconds, then sleep. Used by one thread at a time;
 * free it after the last op that uses it. 1 to 16 threads; NULL with err set on failure. */
typedef struct tr_threadpool tr_threadpool;
tr_threadpool *tr_threadpool_new(int threads, nas_err *err);
void tr_threadpool_free(tr_threadpool *pool);

/* Everything the engine would otherwise keep in globals. */
typedef struct tr_ctx {
  bool grad_enabled;   /* false: ops build no graph at all (inference, evaluation) */
  tr_allocator *alloc; /* borrowed; NULL: plain malloc. Training loops should set one: it
                          is worth ~30% of a CNN step (bench/bench_engine.c shows how). */
  uint64_t rng[4];     /* xoshiro256** state: dropout masks, init, shuffles */
  uint64_t epoch;      /* increments once per backward; marks the nodes a pass visited */
  nas_err err;         /* the message of the last failed call */
  struct tr_cuda *cuda; /* borrowed; NULL: no device. Ops on CUDA tensors run on it (devices) */
  tr_threadpool *threads; /* borrowed; NULL: the engine's loops use OpenMP's threads */
} tr_ctx;

/* Grad mode on, generator seeded from seed (same seed, same numbers). */
void tr_ctx_init(tr_ctx *ctx, uint64_t seed);
/* Sets grad mode; returns the previous one so a caller can restore it. */
bool tr_set_grad_enabled(tr_ctx *ctx, bool enabled);
uint64_t tr_rand_u64(tr_ctx *ctx);
/* Uniform in [0, 1). */
double tr_rand_uniform(tr_ctx *ctx);
/* Standard normal (Box-Muller). */
double tr_rand_normal(tr_ctx *ctx);

/* ---------------------------------------------------------------- tensor */

#define TR_MAX_DIMS 6

/* TR_BF16 (bfloat16) exists only on CUDA devices, for mixed precision (devices section). */
typedef enum { TR_F32 = 0, TR_F64 = 1, TR_BF16 = 2 } tr_dtype;
typedef enum { TR_CPU = 0, TR_CUDA = 1 } tr_device_kind;
typedef struct {
  tr_device_kind kind;
  int index; /* which device of that kind; 0 on CPU */
} tr_device;

/* The memory a tensor and all its views look into. */
typedef struct tr_storage {
  int refs;   /* tensors (and views) holding it */
  void *data; /* owned: nbytes of it (alloc_size reserved) */
  size_t nbytes;
  size_t alloc_size;   /* the block's size in its allocator */
  tr_allocator *alloc; /* owned reference, or NULL (malloc) */
  uint64_t version;    /* bumped by every in-place write; saved tensors check it */
  tr_device device;
} tr_storage;

typedef struct tr_node tr_node;

typedef struct tr_tensor {
  int refs;
  tr_storage *storage; /* owned reference */
  int64_t offset;      /* in elements from storage->data */
  tr_dtype dtype;
  int ndim;
  int64_t shape[TR_MAX_DIMS];
  int64_t strides[TR_MAX_DIMS]; /* in elements */
  int64_t numel;
  bool requires_grad;
  struct tr_tensor *grad; /* owned; same shape; filled by backward on leaves */
  tr_node *grad_fn;       /* owned reference; NULL on leaves */
} tr_tensor;

/* New tensors (contiguous, on the CPU). shape has ndim entries; ndim 0 is a scalar. */
tr_tensor *tr_empty(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape);
tr_tensor *tr_zeros(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape);
tr_tensor *tr_full(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape, double value);
/* Copies numel values of dtype from data. */
tr_tensor *tr_from_data(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape,
                        const void *data);
/* Normal(0, std) or Uniform[lo, hi) entries from ctx's generator. */
tr_tensor *tr_randn(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape, double std);
tr_tensor *tr_rand(tr_ctx *ctx, tr_dtype dtype, int ndim, const int64_t *shape, double lo,
                   double hi);

tr_tensor *tr_retain(tr_tensor *t);
/* Drops one reference; NULL is fine. */
void tr_free(tr_tensor *t);

size_t tr_dtype_size(tr_dtype dtype);
bool tr_is_contiguous(const tr_tensor *t);
/* Pointer to the element at offset 0 (views: their first element). */
void *tr_data(const tr_tensor *t);
float *tr_f32(const tr_tensor *t);
double *tr_f64(const tr_tensor *t);
/* The i-th element in row-major logical order, whatever the strides, as a double. */
double tr_get(const tr_tensor *t, int64_t i);
/* Value of a one-element tensor. */
double tr_item(const tr_tensor *t);
bool tr_same_shape(const tr_tensor *a, const tr_tensor *b);

void tr_set_requires_grad(tr_tensor *t, bool requires_grad);
/* A new tensor on the same storage with no history (shares the version counter). */
tr_tensor *tr_detach(tr_ctx *ctx, tr_tensor *t);
/* A contiguous copy converted to dtype, with no history. */
tr_tensor *tr_to_dtype(tr_ctx *ctx, const tr_tensor *t, tr_dtype dtype);

/* In-place writes: each bumps the storage's version. A leaf that requires grad may only be
 * written with grad mode off (what optimisers do). */
int tr_fill_(tr_ctx *ctx, tr_tensor *t, double value);
/* dst += alpha * src (same shape). */
int tr_add_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha);
int tr_mul_scalar_(tr_ctx *ctx, tr_tensor *t, double s);
/* dst = src (same shape, any strides). */
int tr_copy_(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src);

/* ---------------------------------------------------------------- autograd */

/* Runs backward from root. grad NULL means 1 (root must then have one element). Gradients
 * accumulate into the .grad of the leaves that require grad. Unless retain_graph, the
 * graph's saved tensors are freed and a second backward through it is an error. */
int tr_backward(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad, bool retain_graph);
/* Sets t->grad to zeros when it exists (keeps the buffer: it may be a flat-buffer view). */
void tr_zero_grad(tr_tensor *t);
/* Name of the op that made t ("MulBackward"), or NULL on a leaf. */
const char *tr_grad_fn_name(const tr_tensor *t);

/* ---------------------------------------------------------------- ops */
/* Shape: views share storage; reshape copies only when it must. */
tr_tensor *tr_reshape(tr_ctx *ctx, tr_tensor *t, int ndim, const int64_t *shape);
tr_tensor *tr_transpose(tr_ctx *ctx, tr_tensor *t, int dim0, int dim1);
/* The view t[..., start:start+length, ...] along dim. */
tr_tensor *tr_narrow(tr_ctx *ctx, tr_tensor *t, int dim, int64_t start, int64_t length);
tr_tensor *tr_contiguous(tr_ctx *ctx, tr_tensor *t);
tr_tensor *tr_concat(tr_ctx *ctx, int n, tr_tensor *const *ts, int dim);
/* weight (V, D), ids n indices in [0, V) → (n, D). */
tr_tensor *tr_embedding(tr_ctx *ctx, tr_tensor *weight, int64_t n, const int32_t *ids);

/* Elementwise; binary ops broadcast numpy-style. */
tr_tensor *tr_add(tr_ctx *ctx, tr_tensor *a, tr_tensor *b);
tr_tensor *tr_sub(tr_ctx *ctx, tr_tensor *a, tr_tensor *b);
tr_tensor *tr_mul(tr_ctx *ctx, tr_tensor *a, tr_tensor *b);
tr_tensor *tr_div(tr_ctx *ctx, tr_tensor *a, tr_tensor *b);
tr_tensor *tr_scale(tr_ctx *ctx, tr_tensor *a, double s);
tr_tensor *tr_relu(tr_ctx *ctx, tr_tensor *a);
/* tanh approximation, as GPT-2 and torch's approximate="tanh". */
tr_tensor *tr_gelu(tr_ctx *ctx, tr_tensor *a);
tr_tensor *tr_tanh(tr_ctx *ctx, tr_tensor *a);
tr_tensor *tr_sigmoid(tr_ctx *ctx, tr_tensor *a);
tr_tensor *tr_exp(tr_ctx *ctx, tr_tensor *a);
tr_tensor *tr_log(tr_ctx *ctx, tr_tensor *a);
/* Inverted dropout: zeroes with probability p and scales the rest by 1/(1-p) when training;
 * the identity otherwise. */
tr_tensor *tr_dropout(tr_ctx *ctx, tr_tensor *a, double p, bool training);

/* Reductions over the listed axes (negative counts from the end; naxes 0 means all). */
tr_tensor *tr_sum(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim);
tr_tensor *tr_mean(tr_ctx *ctx, tr_tensor *a, int naxes, const int *axes, bool keepdim);
tr_tensor *tr_softmax(tr_ctx *ctx, tr_tensor *a, int dim);
tr_tensor *tr_log_softmax(tr_ctx *ctx, tr_tensor *a, int dim);

/* a (M, K) @ b (K, N) → (M, N). */
tr_tensor *tr_matmul(tr_ctx *ctx, tr_tensor *a, tr_tensor *b);
/* x (..., in) @ w (out, in)^T + b (out) → (..., out); b may be NULL. */
tr_tensor *tr_linear(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b);

/* Mean over rows of -log softmax(logits)[label]; logits (N, C), labels N values in [0, C). */
tr_tensor *tr_cross_entropy(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels);
/* Cross-entropy against smoothed targets (PyTorch's label_smoothing): 1 - smoothing on the
 * label plus smoothing / C on every class, i.e. (1 - smoothing) · cross-entropy + smoothing
 * · mean over rows and classes of -log softmax. smoothing in [0, 1); 0 is tr_cross_entropy. */
tr_tensor *tr_cross_entropy_smooth(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels,
                                   double smoothing);
tr_tensor *tr_mse_loss(tr_ctx *ctx, tr_tensor *pred, tr_tensor *target);

/* Normalises over the last dim; w and b (D) may be NULL. */
tr_tensor *tr_layer_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, double eps);
/* x (N, C) or (N, C, H, W), per channel. Training: batch statistics, and running_mean/var
 * (C, may be NULL) move by momentum (torch's convention, unbiased variance). Evaluation:
 * the running statistics. */
tr_tensor *tr_batch_norm(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b,
                         tr_tensor *running_mean, tr_tensor *running_var, bool training,
                         double momentum, double eps);

/* x (N, C, H, W), w (O, C, KH, KW), b (O) or NULL → (N, O, OH, OW). */
tr_tensor *tr_conv2d(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int stride,
                     int padding);
tr_tensor *tr_max_pool2d(tr_ctx *ctx, tr_tensor *x, int kernel, int stride);
tr_tensor *tr_avg_pool2d(tr_ctx *ctx, tr_tensor *x, int kernel, int stride);

/* ---------------------------------------------------------------- nn */

typedef enum {
  TR_LINEAR,
  TR_CONV2D,
  TR_BATCHNORM,
  TR_LAYERNORM,
  TR_RELU,
  TR_GELU,
  TR_TANH,
  TR_SIGMOID,
  TR_DROPOUT,
  TR_MAXPOOL2D,
  TR_AVGPOOL2D,
  TR_FLATTEN,
  TR_SEQUENTIAL
} tr_module_kind;

typedef struct tr_module tr_module;

/* Parameters (or buffers) with their state-dict names ("0.weight"); borrowed tensors. */
typedef struct {
  tr_tensor **items;
  char **names; /* owned strings */
  size_t n, cap;
} tr_param_list;
void tr_param_list_free(tr_param_list *list);

/* Constructors return an owned module, or NULL with ctx->err set. Weights get torch's
 * default init (Kaiming-uniform with a = sqrt 5: U(+-1/sqrt(fan_in)), biases alike). */
tr_module *tr_linear_new(tr_ctx *ctx, int64_t in, int64_t out, bool bias);
tr_module *tr_conv2d_new(tr_ctx *ctx, int64_t in_ch, int64_t out_ch, int kernel, int stride,
                         int padding, bool bias);
tr_module *tr_batchnorm_new(tr_ctx *ctx, int64_t features);
tr_module *tr_layernorm_new(tr_ctx *ctx, int64_t features);
/* Parameterless modules: tr_activation_new takes TR_RELU, TR_GELU, TR_TANH, TR_SIGMOID or
 * TR_FLATTEN ((N, ...) to (N, -1)); dropout takes its probability; tr_pool_new takes
 * TR_MAXPOOL2D or TR_AVGPOOL2D and a kernel that is also the stride. */
tr_module *tr_activation_new(tr_ctx *ctx, tr_module_kind kind);
tr_module *tr_dropout_new(tr_ctx *ctx, double p);
tr_module *tr_pool_new(tr_ctx *ctx, tr_module_kind kind, int kernel);
tr_module *tr_sequential_new(tr_ctx *ctx);
/* Appends child (ownership moves to seq). */
int tr_sequential_add(tr_ctx *ctx, tr_module *seq, tr_module *child);
void tr_module_free(tr_module *m);

tr_tensor *tr_module_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x);
/* Training mode (dropout, batch norm statistics) for m and its children. */
void tr_module_train(tr_module *m, bool training);
/* Appends m's parameters (and, with buffers, its running statistics) to list. */
int tr_module_parameters(tr_module *m, bool buffers, tr_param_list *list, nas_err *err);
int64_t tr_module_param_count(tr_module *m);

/* Re-initialises weights: Kaiming-normal (fan_in, ReLU gain) or Xavier-uniform; biases 0. */
typedef enum { TR_INIT_KAIMING, TR_INIT_XAVIER } tr_init_kind;
int tr_module_init(tr_ctx *ctx, tr_module *m, tr_init_kind kind);

/* Moves every parameter of m into one flat storage (and its grads into another), so each
 * parameter is a view at an offset: the unit that sharding later splits. *params and
 * *grads (may be NULL) get owned 1-D views of the whole buffers. */
int tr_module_flatten(tr_ctx *ctx, tr_module *m, tr_tensor **params, tr_tensor **grads);

/* Weights file (docs/engine.md): "NASW", version, then per tensor its name, dtype, shape and
 * little-endian data, then a CRC-32 of everything before. Load checks the checksum and that
 * names and shapes match m's parameters and buffers. */
int tr_module_save(tr_module *m, const char *path, nas_err *err);
int tr_module_load(tr_module *m, const char *path, nas_err *err);

/* ---------------------------------------------------------------- optim */

typedef enum { TR_SGD, TR_ADAM, TR_ADAMW } tr_optim_kind;

typedef struct {
  tr_optim_kind kind;
  double lr;
  double momentum;          /* SGD */
  bool nesterov;            /* SGD, needs momentum > 0 */
  double weight_decay;      /* SGD and Adam: added to the gradient; AdamW: decoupled */
  double beta1, beta2, eps; /* Adam, AdamW (0 means the defaults 0.9, 0.999, 1e-8) */
} tr_optim_config;

typedef struct tr_optim tr_optim;

/* params are borrowed (retained by the optimiser). */
tr_optim *tr_optim_new(tr_ctx *ctx, const tr_optim_config *cfg, tr_tensor *const *params, size_t n);
void tr_optim_free(tr_optim *opt);
/* One update from the parameters' current .grad (parameters without grad are skipped). */
int tr_optim_step(tr_ctx *ctx, tr_optim *opt);
/* Clears the parameters' gradients: a grad of its own is dropped (set to none, so the next
 * backward writes a fresh one without a zeroing pass), one in a shared (flat) buffer is
 * zeroed in place. */
void tr_optim_zero_grad(tr_optim *opt);
void tr_optim_set_lr(tr_optim *opt, double lr);

/* Learning rate at a step: linear warm-up from 0 over warmup steps, then the schedule.
 * TR_LR_ONECYCLE is PyTorch's OneCycleLR (cosine annealing, two phases): it rises from
 * base_lr/25 to base_lr over its warmup steps (the first at base_lr/25, the last at base_lr)
 * by half a cosine, then falls to base_lr/25/1e4 over total more steps the same way. */
typedef enum { TR_LR_CONSTANT, TR_LR_STEP, TR_LR_COSINE, TR_LR_ONECYCLE } tr_lr_kind;
typedef struct {
  tr_lr_kind kind;
  double base_lr;
  int64_t warmup;    /* steps of linear warm-up (0: none); TR_LR_ONECYCLE: of its rise */
  int64_t step_size; /* TR_LR_STEP: multiply by gamma every step_size steps */
  double gamma;
  int64_t total; /* TR_LR_COSINE, TR_LR_ONECYCLE: steps from the end of warm-up to the end */
  double min_lr;
} tr_lr_schedule;
double tr_lr_at(const tr_lr_schedule *s, int64_t step);

/* Scales all grads so their joint L2 norm is at most max_norm; returns the norm before. */
double tr_clip_grad_norm(tr_tensor *const *params, size_t n, double max_norm);

/* ---------------------------------------------------------------- data */

/* Examples as float32 features (n, ...sample shape) with int32 labels. */
typedef struct {
  tr_tensor *x; /* owned */
  int32_t *y;   /* owned, n labels */
  int64_t n;
  int32_t nclasses; /* 1 + largest label */
} tr_dataset;

void tr_dataset_free(tr_dataset *ds);
/* IDX images (n, rows, cols as floats 0..255) and labels; gzip-compressed or plain. */
int tr_idx_load(tr_ctx *ctx, const char *images_path, const char *labels_path, tr_dataset *out,
                nas_err *err);
/* CSV of numbers, one example a line, the label in column label_col (-1: last); gzip ok.
 * A first line that does not parse as numbers is taken as a header and skipped. */
int tr_csv_load(tr_ctx *ctx, const char *path, int label_col, tr_dataset *out, nas_err *err);
/* Shuffles with seed and moves the first round(n * val_fraction) examples to val. Both
 * outputs are new datasets; src is left as it was. */
int tr_dataset_split(tr_ctx *ctx, const tr_dataset *src, double val_fraction, uint64_t seed,
                     tr_dataset *train, tr_dataset *val, nas_err *err);
/* Per-feature mean and std of ds (std floored at 1e-6 so constant pixels stay finite); then
 * x = (x - mean) / std in place. Call fit on training data, apply to both. */
typedef struct {
  float *mean, *std; /* owned, one per feature */
  int64_t nfeat;
} tr_normalizer;
int tr_normalizer_fit(const tr_dataset *ds, tr_normalizer *out, nas_err *err);
int tr_normalizer_apply(const tr_normalizer *nz, tr_dataset *ds, nas_err *err);
void tr_normalizer_free(tr_normalizer *nz);

/* Augmentation of image batches (trainer/augment.c), on the fly: each image of a batch is
 * flipped left-right with probability 1/2 (flip) and/or cropped back to H×W at a random
 * offset from the image padded by crop_padding pixels of value fill on every side. */
typedef struct {
  int crop_padding; /* 0: no crop */
  bool flip;
  float fill;       /* value of the padding pixels */
} tr_augment_config;
/* Whether cfg changes anything. */
bool tr_augment_active(const tr_augment_config *cfg);
/* Augments x (n, C, H, W), contiguous float32 on the CPU and not shared with anyone, in
 * place; the choices come from seed alone, so the same seed gives the same batch. */
int tr_augment_batch(tr_tensor *x, const tr_augment_config *cfg, uint64_t seed, nas_err *err);
/* One image (C, H, W) flipped left-right in place. */
void tr_image_flip(float *image, int64_t channels, int64_t height, int64_t width);
/* dst (C, H, W) = the H×W window at (top, left) of src padded by pad pixels of fill on
 * every side (0 <= top, left <= 2 pad); src and dst do not overlap. */
void tr_image_crop(const float *src, float *dst, int64_t channels, int64_t height, int64_t width,
                   int pad, int64_t top, int64_t left, float fill);

/* Batches over a dataset (borrowed), reshuffled each epoch by its own seeded generator. */
typedef struct {
  const tr_dataset *ds;
  int64_t batch;
  bool shuffle;
  int64_t *order; /* owned permutation */
  int64_t pos;
  uint64_t rng[4];
} tr_loader;
int tr_loader_init(tr_loader *ld, const tr_dataset *ds, int64_t batch, bool shuffle, uint64_t seed,
                   nas_err *err);
void tr_loader_free(tr_loader *ld);
/* Next batch: *x (owned, (b, ...)) and *y (owned, b labels); returns the batch size b, 0
 * at the end of an epoch (after which the next call starts a new, reshuffled one), or
 * NAS_ERR with ctx->err set. */
int64_t tr_loader_next(tr_ctx *ctx, tr_loader *ld, tr_tensor **x, int32_t **y);
/* Passes over epochs epochs without reading a batch: the order is then the one the loader
 * would have after that many epochs (resuming a training run). */
void tr_loader_skip_epochs(tr_loader *ld, int epochs);

/* ================================================================ built-in models
 * Appended for `nas worker` (built-in trials, docs/spec.md): the two model families,
 * datasets by name, and a training loop with per-epoch validation. trainer/models.c,
 * trainer/datasets.c, trainer/fit.c; they use only the API above. */

#define TR_MAX_BLOCKS 8 /* hidden layers of an MLP, stages of a CNN */

typedef enum { TR_NORM_NONE, TR_NORM_BATCH, TR_NORM_LAYER } tr_norm_kind;

/* Flatten, then per hidden layer i: Linear(widths[i]) → norm → activation → dropout (when
 * dropout > 0), then Linear(classes). */
typedef struct {
  int layers;                     /* 1..TR_MAX_BLOCKS */
  int64_t widths[TR_MAX_BLOCKS];
  tr_module_kind activation;      /* TR_RELU, TR_GELU, TR_TANH or TR_SIGMOID */
  tr_norm_kind norm;
  double dropout;
} tr_mlp_config;

/* Per stage i: Conv2d(channels[i], kernel, stride 1, padding kernel/2; no bias under
 * batch norm) → batch norm → activation → pool 2×2 (skipped once the map is 1 pixel
 * high or wide); then Flatten → dropout → [Linear(head_width) → activation → dropout]
 * (when head_width > 0) → Linear(classes). Dropout modules only when dropout > 0. */
typedef struct {
  int stages;                     /* 1..TR_MAX_BLOCKS */
  int64_t channels[TR_MAX_BLOCKS];
  int kernel;
  tr_module_kind pool;            /* TR_MAXPOOL2D or TR_AVGPOOL2D */
  int64_t head_width;
  tr_module_kind activation;
  tr_norm_kind norm;              /* TR_NORM_NONE or TR_NORM_BATCH */
  double dropout;
} tr_cnn_config;

/* One example's shape (channels, height, width); an MLP sees the product. */
typedef struct {
  int64_t channels, height, width;
} tr_input_shape;

/* A built model and what was counted while building it. */
typedef struct {
  tr_module *module; /* owned */
  int64_t params;    /* trainable values (tr_module_param_count) */
  int64_t buffers;   /* other values saved with it: batch norm's running statistics */
  int64_t flops;     /* one example's forward pass: 2 per multiply-add of the linear and
                        convolution layers plus one per bias add; norms, activations,
                        pools and dropout count 0 (docs/metrics.md) */
} tr_model;

int tr_mlp_build(tr_ctx *ctx, const tr_mlp_config *cfg, tr_input_shape in, int32_t classes,
                 tr_model *out);
int tr_cnn_build(tr_ctx *ctx, const tr_cnn_config *cfg, tr_input_shape in, int32_t classes,
                 tr_model *out);
void tr_model_free(tr_model *m);

/* A dataset as images (n, C, H, W) with a training part and, when the source has one, a
 * test part (test.n == 0 otherwise). */
typedef struct {
  tr_dataset train, test;
  tr_input_shape shape;
  char *source; /* owned: the file or folder it came from */
} tr_named_dataset;

/* Loads `name`: "digits" (scikit-learn's 8×8 digits, digits.csv.gz), "fashion-mnist"
 * (Debian's dataset-fashion-mnist) or a path: a folder of IDX files
 * (train-images-idx3-ubyte, train-labels-idx1-ubyte, optionally t10k-…; each may end in
 * .gz) or a CSV file (label last; k² features read as a 1×k×k image, others as k×1×1).
 * Named datasets are looked for in the folders dirs (NULL-terminated): digits.csv.gz in
 * each, or a fashion-mnist/ folder in each. */
int tr_named_dataset_load(tr_ctx *ctx, const char *name, const char *const *dirs,
                          tr_named_dataset *out, nas_err *err);
/* Where tr_named_dataset_load would read `name` from, without reading it: *path (owned) is
 * the file or folder found. When there is none, an error saying where it looked and how to
 * get the dataset (the same error the load gives). */
int tr_named_dataset_find(const char *name, const char *const *dirs, char **path, nas_err *err);
void tr_named_dataset_free(tr_named_dataset *nd);
/* Keeps the first n examples of ds (all when n is 0 or at least ds->n). */
int tr_dataset_truncate(tr_ctx *ctx, tr_dataset *ds, int64_t n, nas_err *err);
/* One mean and one standard deviation over every value of ref; each dataset in sets
 * (count n) becomes (x - mean) / std in place. One pair for all features, so a pixel that
 * is constant in ref cannot blow up in another split. */
int tr_standardize(const tr_dataset *ref, tr_dataset *const *sets, size_t n, nas_err *err);

/* What tr_fit does; callbacks may be NULL. A callback that returns non-zero stops
 * training with that return (its message in err). */
typedef struct {
  int epochs;
  int64_t batch_size;
  tr_optim_config optim;
  tr_lr_kind schedule;       /* constant; cosine: to 0 over all steps; step: ×0.1 after each
                                third of the steps; onecycle (all after the warm-up) */
  uint64_t shuffle_seed;     /* batch order, and the augmentation's draws */
  /* The recipe (docs/spec.md, "Training recipe"): */
  double warmup_epochs;      /* linear warm-up over this many epochs (fractions too); for
                                onecycle the rise (0: 30% of the steps, as PyTorch) */
  double label_smoothing;    /* tr_cross_entropy_smooth's smoothing */
  tr_augment_config augment; /* applied to every training batch */
  /* Epochs as the budget: the run trains epochs first_epoch + 1 … epochs, as the last part
   * of a run of `epochs` epochs from weights saved after first_epoch (the learning rate
   * and batch order continue where that run was; the optimiser's state starts afresh). */
  int first_epoch;
  tr_device device;          /* where the model is (zero: the CPU); batches are moved there */
  /* After every epoch (1-based) with the mean training loss and validation accuracy. */
  int (*on_epoch)(void *arg, int epoch, double train_loss, double val_accuracy, nas_err *err);
  /* After every training step; for heartbeats. */
  int (*on_step)(void *arg, nas_err *err);
  void *arg;
} tr_fit_config;

/* Trains m on train with cross-entropy, evaluating on val after every epoch; *accuracy
 * (may be NULL) gets the last validation accuracy. */
int tr_fit(tr_ctx *ctx, tr_module *m, const tr_dataset *train, const tr_dataset *val,
           const tr_fit_config *cfg, double *accuracy, nas_err *err);
/* Share of ds's examples whose largest logit is their label, in evaluation mode without a
 * graph, batch examples at a time; leaves m in training mode. */
int tr_evaluate(tr_ctx *ctx, tr_module *m, const tr_dataset *ds, int64_t batch,
                double *accuracy, nas_err *err);
/* Index of the largest of n values (the first on ties). */
int64_t tr_argmax(const float *values, int64_t n);

/* ================================================================ devices (issue 9)
 *
 * CUDA tensors (docs/engine-cuda.md). A tr_cuda is the engine of one device: a stream that
 * all its work is queued on, a cuBLAS handle, and a caching device allocator. The caller
 * owns it and points ctx->cuda at it; ops whose inputs are on that device then run there
 * (every op of the "ops" section, backward included) and return tensors on it. Inputs on
 * different devices are an error, never a silent copy: tr_to_device moves data, as a
 * differentiable copy (PyTorch's .to()). Without nvcc (make CUDA=0), or without a device,
 * every call here fails saying why, and nothing else changes.
 *
 * On a CUDA tensor tr_data() is a device pointer: read values with tr_get / tr_item (each
 * copies back and waits) or tr_to_device to the CPU. Work is asynchronous: a call returns
 * when its kernels are queued; copies to the host, tr_get and tr_cuda_sync wait. */

typedef struct tr_cuda tr_cuda;

/* The CPU, and CUDA device i. */
#define TR_DEVICE_CPU ((tr_device){TR_CPU, 0})
#define TR_DEVICE_CUDA(i) ((tr_device){TR_CUDA, (i)})

/* Number of usable CUDA devices; 0 with the reason in err (may be NULL) when there is none
 * (built without CUDA, no driver, no device). */
int tr_cuda_device_count(nas_err *err);
/* The engine for device: its stream, cuBLAS handle and a caching allocator that keeps at most
 * cache_limit bytes of freed device blocks. NULL with err set when the device cannot be
 * used. Free it after the last op that uses it; tensors may outlive it (their storage holds
 * the allocator). */
tr_cuda *tr_cuda_new(int device, size_t cache_limit, nas_err *err);
void tr_cuda_free(tr_cuda *cu);
int tr_cuda_device(const tr_cuda *cu);
/* Waits until all work queued on cu's stream is done; reports an error a kernel raised. */
int tr_cuda_sync(tr_cuda *cu, nas_err *err);
/* Device memory of cu's allocator: in use, peak, cached (bytes), and a trim of the cache. */
void tr_cuda_memory_stats(tr_cuda *cu, tr_alloc_stats *out);
void tr_cuda_trim(tr_cuda *cu);
/* Mixed precision: with bf16 on, linear, matmul and conv2d on float32 inputs run their
 * GEMMs on bf16 copies of the operands with float32 accumulation and float32 results; the
 * parameters, their gradients and optimiser states stay float32 (the master weights). */
void tr_cuda_set_autocast(tr_cuda *cu, bool bf16);

tr_device tr_tensor_device(const tr_tensor *t);
/* t on device: t itself (a new reference) when already there, else a copy that records a
 * node when t requires grad, so gradients flow back to t on its own device. Copies between
 * two CUDA devices are not supported (one engine per ctx). */
tr_tensor *tr_to_device(tr_ctx *ctx, tr_tensor *t, tr_device device);
/* Moves every parameter, gradient and buffer of m to device in place (the same tensor
 * objects, new storage; tensors that shared a storage, as flat buffers, still share one). */
int tr_module_to_device(tr_ctx *ctx, tr_module *m, tr_device device);

/* ================================================================ collectives (issue 9)
 *
 * A communicator group joins world ranks that run the same program in lockstep; each rank
 * calls the same collectives in the same order with matching arguments (NCCL's and MPI's
 * contract). Three backends sit behind the same calls (docs/engine-comm.md):
 *   threads    ranks are threads of one process (tr_comm_group_new);
 *   processes  ranks are processes on one node, meeting in POSIX shared memory;
 *   NCCL       one CUDA device per rank, on any number of nodes; buffers in device memory.
 * Processes form a group by a name (tr_comm_join), which tr_comm_init_env takes from the
 * environment `srun` gives its tasks (SLURM_PROCID, SLURM_NTASKS, ...) or from NAS_RANK,
 * NAS_WORLD and NAS_COMM_ID.
 *
 * - Buffers are contiguous arrays of count elements of dtype (float32 or float64). send and
 *   recv may be the same pointer (in place) where noted; the buffers of different ranks must
 *   not overlap. A call returns when this rank's output is complete and its input may be
 *   reused.
 * - CPU backends: sums are taken in rank order, ((x0 + x1) + x2) + ..., in the buffer's
 *   dtype, whatever the world size or which rank computes them, so results are
 *   bit-identical run to run. TR_REDUCE_AVG divides that sum by world. NCCL sums in the
 *   order of its rings and trees: equal within rounding.
 * - CPU backends: arguments are checked on every rank against every other rank's: a
 *   mismatch (another collective, dtype, count, root or reduce op) or a bad argument on any
 *   rank makes the call fail on all ranks with the same message, and the group stays
 *   usable. NCCL checks each rank's own arguments only.
 * - Processes and NCCL: a rank never waits for the others longer than the group's timeout,
 *   and (processes) stops waiting as soon as a rank it waits for has exited; it then fails
 *   with a message naming the ranks it waited for, the group is broken, and every rank's
 *   calls fail from then on. Threads wait without a limit. */

typedef struct tr_comm_group tr_comm_group;
typedef struct tr_comm tr_comm;

typedef enum { TR_REDUCE_SUM = 0, TR_REDUCE_AVG = 1 } tr_reduce_op;

/* Shared state for world thread ranks (world >= 1); NULL with err set on failure. */
tr_comm_group *tr_comm_group_new(int world, nas_err *err);
/* Frees the group and its communicators; no rank may be inside a call. */
void tr_comm_group_free(tr_comm_group *group);
/* The communicator of rank (borrowed from the group), for the thread that plays it; NULL
 * with err set when rank is not in [0, world). */
tr_comm *tr_comm_group_comm(tr_comm_group *group, int rank, nas_err *err);
int tr_comm_rank(const tr_comm *comm);
int tr_comm_world(const tr_comm *comm);

/* recv = op over all ranks of send (count elements each); in place allowed. */
int tr_comm_all_reduce(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                       int64_t count, tr_reduce_op op, nas_err *err);
/* recv (world * count) = the send (count) of rank 0, then rank 1, ...; in place allowed
 * when send is recv + rank * count. */
int tr_comm_all_gather(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                       int64_t count, nas_err *err);
/* recv (count) = op over all ranks of chunk `rank` of send (world * count); in place
 * allowed when recv is send + rank * count. */
int tr_comm_reduce_scatter(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                           int64_t count, tr_reduce_op op, nas_err *err);
/* buf (count) on every rank = buf of rank root. */
int tr_comm_broadcast(tr_comm *comm, tr_dtype dtype, void *buf, int64_t count, int root,
                      nas_err *err);
/* Returns once every rank has called it; whatever a rank wrote before is visible to all
 * ranks after. */
int tr_comm_barrier(tr_comm *comm, nas_err *err);

typedef enum {
  TR_COMM_THREADS = 0,   /* tr_comm_group_new */
  TR_COMM_PROCESSES = 1, /* processes on one node, over POSIX shared memory */
  TR_COMM_NCCL = 2       /* a CUDA device per rank, any nodes (CUDA=1 builds) */
} tr_comm_backend;

/* Default longest wait for another rank: generous, since ranks may rightly wait minutes
 * for a slow one (rank 0 evaluating); an exited rank is noticed at once anyway. */
#define TR_COMM_TIMEOUT_S 600.0
#define TR_COMM_NAME_MAX 128

/* How this process joins a group of processes. */
typedef struct {
  tr_comm_backend backend; /* TR_COMM_PROCESSES or TR_COMM_NCCL */
  int rank, world;         /* 0 <= rank < world */
  int local_rank;          /* rank among the group's ranks on this node; NCCL uses CUDA
                              device local_rank mod the number of devices it sees */
  int nodes;               /* nodes the ranks run on (1 for one node); processes need 1 */
  /* The group's name: letters, digits, '.', '_', '-'; unique among the groups that may
   * exist at the same time (on this node, or in run_dir). */
  char name[TR_COMM_NAME_MAX];
  /* Borrowed, may be NULL. NCCL: a folder every rank sees (the trial's run folder on a
   * shared filesystem), where rank 0 publishes its NCCL id; required when nodes > 1, and
   * used whenever given. Without it one node meets in shared memory. */
  const char *run_dir;
  double timeout_s;   /* longest wait for another rank, joining and in each call; <= 0:
                         TR_COMM_TIMEOUT_S */
  size_t stage_bytes; /* processes: shared memory each rank stages its buffers through
                         per round (a call moves larger buffers in pieces); 0: 1 MiB */
} tr_comm_options;

/* Fills rank, world, local_rank, nodes and name of opts from the environment, leaving the
 * other fields alone: NAS_RANK, NAS_WORLD and NAS_COMM_ID (the name) when NAS_RANK is set
 * (processes a launcher starts on one node); else, in a task of srun, SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES and the name "slurm-JOB.STEP" from
 * SLURM_JOB_ID and SLURM_STEP_ID, prefixed by "NAS_COMM_ID-" when that is set. An error
 * names the variable that is missing or malformed. */
int tr_comm_env(tr_comm_options *opts, nas_err *err);
/* Joins the group opts describes and returns this rank's communicator in *out (owned:
 * tr_comm_free). Every rank of the group calls it; it returns once all world ranks have
 * joined, or fails after opts->timeout_s naming the ranks that did not come. */
int tr_comm_join(const tr_comm_options *opts, tr_comm **out, nas_err *err);
/* tr_comm_env, then tr_comm_join. opts (may be NULL: processes, default timeout) gives
 * backend, run_dir, timeout_s and stage_bytes. */
int tr_comm_init_env(const tr_comm_options *opts, tr_comm **out, nas_err *err);
/* Frees a communicator made by tr_comm_join (not collective: each rank frees its own once
 * it is done with its calls). NULL and communicators of a tr_comm_group are ignored. */
void tr_comm_free(tr_comm *comm);
tr_comm_backend tr_comm_backend_of(const tr_comm *comm);

/* ================================================================ FSDP (issue 9)
 *
 * Fully sharded data parallel training in the sense of PyTorch's FSDP
 * (docs/engine-fsdp.md). Every rank holds the same model (a Sequential), its own tr_ctx
 * with its own allocator, and a slice of each global batch. The model is cut into units
 * along its children; each unit's parameters become one flat buffer, padded to a multiple
 * of world and split evenly, and a rank keeps only its shard, the shard's gradient and the
 * optimiser state of the shard. A unit's full parameters are all-gathered before its
 * forward and again before its backward and freed after; its gradient is reduce-scattered
 * (averaged) so each rank keeps the gradient of its shard. Each unit is one autograd node
 * (FsdpUnitBackward) in the rank's graph, so tr_backward drives all of it.
 *
 * Contract (as for collectives): every rank calls the same tr_fsdp functions in the same
 * order with the same shapes; the loss is the mean over the rank's slice, so the averaged
 * gradient is the gradient of the mean over the global batch. While a tr_fsdp lives, the
 * model's parameter tensors hold data only between tr_fsdp_summon_full and
 * tr_fsdp_release_full (always in mode none); graphs made by tr_fsdp_forward must go before
 * the tr_fsdp does. Ranks are threads (tr_fsdp_run_threads) or processes over a CPU
 * communicator for a model on the CPU; for a model on a CUDA device (ctx->cuda its engine)
 * every FSDP buffer lives on that device and the communicator must be NCCL's (one GPU per
 * rank; no prefetch there). Batch norm keeps per-rank batch statistics (no sync batch
 * norm); its running statistics start from rank 0's. */

typedef enum {
  TR_SHARD_FULL = 0,    /* parameters, gradients and optimiser state sharded; full
                           parameters gathered per unit for its forward and its backward */
  TR_SHARD_GRAD_OP = 1, /* gradients and optimiser state sharded; full parameters gathered
                           once per step in forward and kept until the unit's backward */
  TR_SHARD_NONE = 2     /* plain data parallel: full parameters, gradients and optimiser on
                           every rank; gradients all-reduced (averaged) */
} tr_shard_mode;

typedef struct {
  tr_shard_mode mode;
  /* Unit policy. 0: one unit per child of the model that has parameters. > 0: consecutive
   * children grouped until a unit holds at least this many parameters (a smaller rest is a
   * unit of its own). Parameterless children ride along in the unit before them (the first
   * unit for leading ones). */
  int64_t unit_params;
  bool checkpoint; /* activation checkpointing per unit: the forward keeps only the unit's
                      input; backward recomputes the unit (same dropout masks) */
  bool prefetch;   /* all-gather the next unit (forward order in forward, reverse in
                      backward) on a helper thread while this one computes; needs
                      prefetch_comm; nothing to do in mode none. Results are bit-identical. */
} tr_fsdp_config;

typedef struct tr_fsdp tr_fsdp;

/* Wraps model (borrowed; it must outlive the tr_fsdp) for the rank of comm (borrowed).
 * prefetch_comm (borrowed, may be NULL without prefetch) is this rank's communicator in a
 * second group of the same world, used only for prefetch. A collective call: every rank's
 * model gets rank 0's parameters and buffers, then the parameters are sharded (the model's
 * parameter tensors become views of the units' flat buffers; old gradients are dropped).
 * ctx must have an allocator (per-rank memory accounting). NULL with ctx->err set: a
 * config or model that makes no sense is refused before the model is touched. */
tr_fsdp *tr_fsdp_new(tr_ctx *ctx, tr_module *model, tr_comm *comm, tr_comm *prefetch_comm,
                     const tr_fsdp_config *cfg);
/* Waits for prefetches in flight, then frees the shards and buffers. The model's parameter
 * tensors keep their data only if it was summoned (or in mode none); otherwise the model
 * may only be freed. */
void tr_fsdp_free(tr_fsdp *f);
int tr_fsdp_unit_count(const tr_fsdp *f);

/* This rank's slice [*start, *start + *count) of a global batch of `global` examples;
 * an error unless global is a positive multiple of world. */
int tr_fsdp_batch_slice(const tr_fsdp *f, int64_t global, int64_t *start, int64_t *count,
                        nas_err *err);

/* The model's forward on this rank's slice x (borrowed), unit by unit. With grad mode on
 * the result's graph holds one FsdpUnitBackward node per unit. */
tr_tensor *tr_fsdp_forward(tr_ctx *ctx, tr_fsdp *f, tr_tensor *x);
/* tr_backward from loss (one element), then waits for any prefetch still in flight. After
 * it, each rank's shard tensors carry the averaged gradient of their shard. */
int tr_fsdp_backward(tr_ctx *ctx, tr_fsdp *f, tr_tensor *loss);

/* An optimiser (owned by the caller; tr_optim_step/zero_grad/free as usual) over this
 * rank's flat shards: its state is sharded too. Mode none: over the full flat buffers. */
tr_optim *tr_fsdp_optim_new(tr_ctx *ctx, tr_fsdp *f, const tr_optim_config *cfg);
/* Gradient clipping by the global norm over all ranks (an all-reduce of the squared
 * norms of the shards): as tr_clip_grad_norm on the unsharded model. *norm (may be NULL)
 * gets the norm before clipping. A collective call. */
int tr_fsdp_clip_grad_norm(tr_ctx *ctx, tr_fsdp *f, double max_norm, double *norm);
/* values (n host float64s) = op over all ranks of values, on f's main communicator: what a
 * training loop adds up between steps (losses, failure flags). For a device model the
 * values travel through device memory, the only memory NCCL moves. A collective call. */
int tr_fsdp_all_reduce_host(tr_ctx *ctx, tr_fsdp *f, double *values, int64_t n,
                            tr_reduce_op op);

/* Gathers every unit's full parameters into the model's own parameter tensors, so the
 * model can be evaluated (tr_evaluate, tr_module_forward), saved or read on any rank;
 * release hands the memory back. Both are collective calls (release only for symmetry: it
 * moves no data). An optimiser step while summoned is fine: the next use re-gathers. */
int tr_fsdp_summon_full(tr_ctx *ctx, tr_fsdp *f);
int tr_fsdp_release_full(tr_ctx *ctx, tr_fsdp *f);

/* What this rank holds. */
typedef struct {
  int units;
  int64_t params;      /* parameters of the whole model (unsharded) */
  int64_t local;       /* parameter values this rank keeps between steps: its shards with
                          padding (all parameters in mode none); gradients and optimiser
                          state match it */
  tr_alloc_stats alloc; /* the rank's allocator: in_use, peak, cached bytes (a model on a
                           CUDA device: its engine's device allocator) */
} tr_fsdp_memory;
void tr_fsdp_memory_stats(const tr_fsdp *f, tr_fsdp_memory *out);

/* A driver for ranks that are threads: starts world threads, each running fn with its
 * rank's communicators (a main group and a prefetch group made here), joins them and
 * returns the first failing rank's error ("rank 2: ..."). Each thread gets an equal share
 * of the process's OpenMP threads (at least one). fn must make its own tr_ctx and
 * allocator. A rank that fails alone while the others wait in a collective hangs them, as
 * with NCCL: fail on all ranks alike (the collectives' own checks do). */
typedef struct {
  int rank, world;
  tr_comm *comm;          /* borrowed: the main group */
  tr_comm *prefetch_comm; /* borrowed: the prefetch group */
} tr_fsdp_rank;
typedef int (*tr_fsdp_rank_fn)(const tr_fsdp_rank *rank, void *arg, nas_err *err);
int tr_fsdp_run_threads(int world, tr_fsdp_rank_fn fn, void *arg, nas_err *err);

/* ================================================================ sharded built-in training
 * trainer/fit.c; uses the collectives and FSDP above. */

/* Data-parallel training on one rank of several (docs/engine-fsdp.md): what tr_fit does,
 * with m sharded by FSDP across the ranks of comm and each rank training on its slice of
 * every global batch. Every rank calls it with the same data and cfg (shuffle seed
 * included); the callbacks run on rank 0 only, which also validates; a failure on any
 * rank stops all of them at the same step. A batch is cut to a multiple of the world size
 * (the last batch of an epoch may lose up to world - 1 examples). *accuracy is rank 0's
 * (0 elsewhere). On return m holds the whole trained model on every rank. */
typedef struct {
  tr_comm *comm;          /* borrowed: this rank's communicator */
  tr_comm *prefetch_comm; /* borrowed; NULL: no prefetch whatever fsdp says (nor on a
                             CUDA device, where FSDP has none) */
  tr_fsdp_config fsdp;
} tr_fit_ranks;
int tr_fit_sharded(tr_ctx *ctx, tr_module *m, const tr_fit_ranks *ranks, const tr_dataset *train,
                   const tr_dataset *val, const tr_fit_config *cfg, double *accuracy,
                   nas_err *err);

#endif
