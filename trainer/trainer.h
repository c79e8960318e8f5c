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
 *   optim     SGD (momentum, Nesterov, weight decay), Adam, AdamW, LR schedules, clipping,
 *             the training state file (optimiser state and generator, to resume exactly).
 *   data      IDX (gzip ok) and CSV loaders, split, normalisation, seeded shuffled batches.
 * Collectives and FSDP have their own header, trainer/dist.h; the built-in trials that use
 * the engine are builtin/ (builtin/builtin.h).
 *
 * Conventions:
 * - All mutable engine state (grad mode, random generator, last error) lives in a tr_ctx the
 *   caller owns; there is no global state. One ctx per thread.
 * - Ops take borrowed inputs and return an owned new reference, or NULL with ctx->err set.
 *   tr_retain adds a reference, tr_release drops one; a tensor goes with its last reference.
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
  struct tr_wgrad_queue *wgrads; /* borrowed; NULL: a backward computes every gradient.
                                    A pipeline stage sets it around its backwards to put
                                    weight gradients off (docs/engine-pipeline.md) */
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

/* New tensors (contiguous, on the CPU). shape has ndim entries; ndim 0 is a scalar. A shape
 * whose element count, or bytes, would overflow int64 is an error. */
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
void tr_release(tr_tensor *t);

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

/* Runs backward from root. grad NULL means 1 (root must then have one element); a grad given
 * has root's shape. Gradients accumulate into the .grad of the leaves that require grad.
 * Unless retain_graph, the graph's saved tensors are freed and a second backward through it
 * is an error. */
int tr_backward(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad, bool retain_graph);
/* Sets t->grad to zeros when it exists (keeps the buffer: it may be a flat-buffer view). */
void tr_zero_grad(tr_tensor *t);
/* Name of the op that made t ("MulBackward"), or NULL on a leaf. */
const char *tr_grad_fn_name(const tr_tensor *t);

/* Weight gradients put off (a pipeline stage's, docs/engine-pipeline.md, "Weight gradients
 * in the drain"): while ctx->wgrads is set, a linear layer's backward whose weight already
 * has a gradient on the host computes only its input's and bias's gradients and queues
 * dW += dy^T x, holding dy and x. Added in the order queued, the products add what the
 * backwards would have added, in the same order: the same bits. */
typedef struct tr_wgrad_queue tr_wgrad_queue;
tr_wgrad_queue *tr_wgrads_new(void);
/* Drops what is still queued (those gradients then lack it) and frees q (NULL: nothing). */
void tr_wgrads_free(tr_wgrad_queue *q);
/* Drops what is still queued, unadded. */
void tr_wgrads_drop(tr_wgrad_queue *q);
/* How many products were ever queued: the mark of everything queued so far. */
size_t tr_wgrads_queued(const tr_wgrad_queue *q);
/* Adds the queued products before mark into their gradients, oldest first; fails (ctx->err)
 * when a tensor one reads was written in place since it was queued. */
int tr_wgrads_run(tr_ctx *ctx, tr_wgrad_queue *q, size_t mark);

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

/* Reductions over the listed axes (negative counts from the end; naxes 0 means all; an axis
 * named twice is an error). Softmax over an empty dim is an error. */
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
/* Grouped convolution: x (N, C, H, W), w (O, C/groups, KH, KW), b (O) or NULL, C and O
 * divisible by groups; output channel o sees the input channels of group o / (O/groups).
 * groups = C is a depthwise convolution. groups > 1 runs direct loops (no im2col); 1 is
 * tr_conv2d. CPU only (docs/engine.md). */
tr_tensor *tr_conv2d_grouped(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int stride,
                             int padding, int groups);
/* x (N, C, H, W) → (N, C): the mean of each channel's map. */
tr_tensor *tr_global_avg_pool2d(tr_ctx *ctx, tr_tensor *x);
/* x (N, C, H, W) times s (N, C), each map by its value: squeeze-and-excitation's scaling. */
tr_tensor *tr_channel_scale(tr_ctx *ctx, tr_tensor *x, tr_tensor *s);
/* relu6(x + 3) / 6, and x times it (MobileNetV3); CPU only. */
tr_tensor *tr_hardsigmoid(tr_ctx *ctx, tr_tensor *a);
tr_tensor *tr_hardswish(tr_ctx *ctx, tr_tensor *a);

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
  TR_SEQUENTIAL,
  TR_HARDSWISH,
  TR_HARDSIGMOID,
  TR_GLOBALAVGPOOL, /* (N, C, H, W) → (N, C) */
  TR_RESIDUAL,      /* body(x) + shortcut(x), or body(x) + x without a shortcut */
  TR_SQUEEZE_EXCITE, /* x scaled per channel by gate(x) (N, C) */
  TR_STASH, /* one end of a skip connection (tr_skip_new) */
  TR_POP    /* and the other */
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
/* A grouped convolution (tr_conv2d_grouped): weight (out_ch, in_ch / groups, k, k);
 * groups = in_ch = out_ch is a depthwise one. */
tr_module *tr_conv2d_grouped_new(tr_ctx *ctx, int64_t in_ch, int64_t out_ch, int kernel,
                                 int stride, int padding, int groups, bool bias);
tr_module *tr_batchnorm_new(tr_ctx *ctx, int64_t features);
tr_module *tr_layernorm_new(tr_ctx *ctx, int64_t features);
/* Parameterless modules: tr_activation_new takes TR_RELU, TR_GELU, TR_TANH, TR_SIGMOID,
 * TR_HARDSWISH, TR_HARDSIGMOID, TR_GLOBALAVGPOOL or TR_FLATTEN ((N, ...) to (N, -1)); dropout takes its probability, in [0, 1); tr_pool_new takes
 * TR_MAXPOOL2D or TR_AVGPOOL2D and a kernel that is also the stride. */
tr_module *tr_activation_new(tr_ctx *ctx, tr_module_kind kind);
tr_module *tr_dropout_new(tr_ctx *ctx, double p);
tr_module *tr_pool_new(tr_ctx *ctx, tr_module_kind kind, int kernel);
tr_module *tr_sequential_new(tr_ctx *ctx);
/* Appends child (ownership moves to seq). */
int tr_sequential_add(tr_ctx *ctx, tr_module *seq, tr_module *child);
/* Blocks with a branch. Each takes ownership of its modules, also on failure (NULL ones
 * allowed where said). Residual: body(x) + shortcut(x), the identity when shortcut is
 * NULL; parameters "0.*" (body), "1.*" (shortcut). Squeeze-and-excitation: x times
 * gate(x), which maps (N, C, H, W) to (N, C); parameters "0.*". */
tr_module *tr_residual_new(tr_ctx *ctx, tr_module *body, tr_module *shortcut);
tr_module *tr_squeeze_excite_new(tr_ctx *ctx, tr_module *gate);
/* A skip connection for a Sequential, after torchgpipe's @skippable stash/pop: *stash
 * passes its input on unchanged and keeps it; *pop, a later child of the same Sequential,
 * takes what the stash kept and merges it into its own input: adds it (same shape) or
 * concatenates it after the input along dim 1 (channels, or features). Gradients flow
 * through both ways. A pipeline carries the kept tensor from the stash's stage to the
 * pop's (docs/engine-pipeline.md). Both modules are owned by the caller (then by the
 * Sequential); NAS_OK, or NAS_ERR with ctx->err set. */
typedef enum { TR_SKIP_ADD, TR_SKIP_CONCAT } tr_skip_merge;
int tr_skip_new(tr_ctx *ctx, tr_skip_merge merge, tr_module **stash, tr_module **pop);
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
 * names and shapes match m's parameters and buffers, and changes m only when all of them
 * do. */
int tr_module_save(tr_module *m, const char *path, nas_err *err);
int tr_module_load(tr_module *m, const char *path, nas_err *err);

/* ---------------------------------------------------------------- optim */

typedef enum { TR_SGD, TR_ADAM, TR_ADAMW } tr_optim_kind;

/* tr_optim_new refuses what would make NaN or diverging steps: lr, weight decay and eps
 * below 0, momentum outside [0, 1), betas outside [0, 1) (NaN in any of them too). */
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
/* One update from the parameters' current .grad (parameters without grad are skipped, and
 * do not count the step: Adam's bias correction uses each parameter's own count of
 * updates, as torch does). */
int tr_optim_step(tr_ctx *ctx, tr_optim *opt);
/* Clears the parameters' gradients: a grad of its own is dropped (set to none, so the next
 * backward writes a fresh one without a zeroing pass), one in a shared (flat) buffer is
 * zeroed in place. */
void tr_optim_zero_grad(tr_optim *opt);
/* A rate below 0 or NaN fails the next tr_optim_step, which then changes nothing. */
void tr_optim_set_lr(tr_optim *opt, double lr);
/* Which part of a training split over several ranks an optimiser holds: part `index` of
 * `count` (a sharded rank's shards, a pipeline stage's layers); `unit` names the parts in
 * messages ("rank", "stage"). */
typedef struct {
  int index, count;
  const char *unit;
} tr_train_part;
/* Training state file (docs/engine.md): what a run holds besides the weights, so that one
 * stopped after a step goes on exactly as if it had not stopped: the optimiser's kind, step
 * counts (its own and each parameter's) and state tensors (SGD's momentum buffers, Adam's
 * moments; zeros where no step made them yet), ctx's generator (dropout's masks) and which
 * part of the training it is (part NULL: the whole, part 0 of 1). Written atomically. Load
 * checks the checksum, the version, that the state is this part's of as many parts, of this
 * optimiser's kind and parameters, and changes nothing unless all of it is good. */
int tr_train_state_save(tr_ctx *ctx, tr_optim *opt, const tr_train_part *part, const char *path,
                        nas_err *err);
int tr_train_state_load(tr_ctx *ctx, tr_optim *opt, const tr_train_part *part, const char *path,
                        nas_err *err);

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

/* Scales all grads so their joint L2 norm is at most max_norm (from 0; a negative or NaN one
 * is an error); *norm (may be NULL) gets the norm before. */
int tr_clip_grad_norm(tr_ctx *ctx, tr_tensor *const *params, size_t n, double max_norm,
                      double *norm);

/* ---------------------------------------------------------------- data
 * Functions that take a ctx report their errors in ctx->err; those without one (the
 * normaliser, the loader's set-up) in their err. */

/* Examples as float32 features (n, ...sample shape) with int32 labels. */
typedef struct {
  tr_tensor *x; /* owned */
  int32_t *y;   /* owned, n labels */
  int64_t n;
  int32_t nclasses; /* 1 + largest label */
} tr_dataset;

void tr_dataset_free(tr_dataset *ds);
/* IDX images (n, rows, cols as floats 0..255) and labels; gzip-compressed or plain. */
int tr_idx_load(tr_ctx *ctx, const char *images_path, const char *labels_path, tr_dataset *out);
/* CSV of numbers (finite, within float32's range), one example a line, the label in column
 * label_col (-1: last; an integer 0 to 65535); gzip ok. A first line that does not parse
 * as numbers is taken as a header and skipped. */
int tr_csv_load(tr_ctx *ctx, const char *path, int label_col, tr_dataset *out);
/* Shuffles with seed and moves the first round(n * val_fraction) examples to val. Both
 * outputs are new datasets; src is left as it was. */
int tr_dataset_split(tr_ctx *ctx, const tr_dataset *src, double val_fraction, uint64_t seed,
                     tr_dataset *train, tr_dataset *val);
/* Per-feature mean and std of ds (std floored at 1e-6 so constant pixels stay finite); then
 * x = (x - mean) / std in place. Call fit on training data, apply to both. */
typedef struct {
  float *mean, *std; /* owned, one per feature */
  int64_t nfeat;
} tr_normalizer;
int tr_normalizer_fit(const tr_dataset *ds, tr_normalizer *out, nas_err *err);
int tr_normalizer_apply(const tr_normalizer *nz, tr_dataset *ds, nas_err *err);
void tr_normalizer_free(tr_normalizer *nz);

/* Augmentation of image batches (trainer/nn/augment.c), on the fly: each image of a batch is
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

#endif
