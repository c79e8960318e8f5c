/* trainer internals shared by the engine's files: the autograd node, saved variables, and
 * tensor helpers that ops use. Not part of the public API (trainer.h). */
#ifndef NAS_TRAINER_INTERNAL_H
#define NAS_TRAINER_INTERNAL_H

#include "trainer/trainer.h"

/* ---------------------------------------------------------------- autograd graph */

/* Where a gradient goes: input number input_nr of node fn (NULL: nowhere, the input does
 * not need grad). Every node here has one output, so input_nr is always 0 for now. */
typedef struct {
  tr_node *fn;
  int input_nr;
} tr_edge;

/* A tensor kept for backward, with the storage version it had when saved: a named field of
 * an op's node (x, w, mask, ...). ag_save links it into its node's list, so the engine frees
 * every saved tensor of every node without knowing the node's layout. */
typedef struct tr_saved {
  tr_tensor *t; /* owned detached alias (no grad_fn: saving never makes a cycle); NULL: none */
  uint64_t version;
  struct tr_saved *next; /* the node's next saved variable */
} tr_saved;

/* What an op's backward node is. apply gets the gradient of the node's output and writes one
 * owned gradient per next edge into grad_in (left NULL where the edge's fn is NULL). size:
 * the op's node struct, which begins with its tr_node (0: a bare tr_node).
 * release_variables (may be NULL, as PyTorch's Node::release_variables) frees what the node
 * owns besides its saved tensors; it runs once, after the node's backward (unless
 * retain_graph) or when the node goes. */
typedef struct {
  const char *name;
  int (*apply)(tr_ctx *ctx, tr_node *node, tr_tensor *grad_out, tr_tensor **grad_in);
  size_t size;
  void (*release_variables)(tr_node *node);
} tr_node_ops;

/* Shape of an op input, recorded when the node is made. */
typedef struct {
  int ndim;
  int64_t shape[TR_MAX_DIMS];
} tr_meta;

#define TR_MAX_META 3

/* The part every backward node has; an op's node embeds it first and names what it saved:
 *   typedef struct { tr_node base; tr_saved a, b; } mul_node;
 * as PyTorch's generated nodes do. */
struct tr_node {
  int refs; /* output tensors and next_edges of later nodes */
  const tr_node_ops *ops;
  int n_next;
  tr_edge *next_edges;          /* owned array; each fn an owned reference */
  tr_saved *saved;              /* the saved variables among the op's fields (a list) */
  bool released;                /* saved variables freed by a backward without retain */
  tr_meta in_meta[TR_MAX_META]; /* shapes of the first inputs */
  /* engine scratch, valid during one tr_backward */
  uint64_t mark;
  int deps;
  tr_tensor *grad_buf;
};

/* Whether an op on these inputs must record a node (grad mode on and an input needs grad). */
bool ag_needs_grad(const tr_ctx *ctx, int n, tr_tensor *const *inputs);
/* The recording step of an op: when *rc is NAS_OK and ag_needs_grad, makes the op's node
 * (ops->size bytes, zeroed) with edges to the inputs' nodes, makes out point at it and
 * returns it (borrowed: out holds it), for the op to fill in; NULL otherwise, with *rc set
 * when the node could not be made. */
void *ag_record(tr_ctx *ctx, const tr_node_ops *ops, int n, tr_tensor *const *inputs,
                tr_tensor *out, int *rc);
/* Saves t (its data and current version) in slot, a field of node's struct. */
int ag_save(tr_ctx *ctx, tr_node *node, tr_saved *slot, tr_tensor *t);
/* The tensor saved in slot (borrowed), or NULL with an error when it was modified in place
 * since it was saved or freed by an earlier backward. */
tr_tensor *ag_saved(tr_ctx *ctx, tr_node *node, const tr_saved *slot);
/* NAS_OK, or an error when a backward without retain_graph freed node's state (for nodes
 * whose state is not a saved tensor). */
int ag_live(tr_ctx *ctx, const tr_node *node);
/* The end of every op's forward: out when rc is NAS_OK, else NULL with out freed. */
tr_tensor *ag_output(tr_tensor *out, int rc);
/* Drops a reference to node; the last one frees it and every node only it kept alive. */
void ag_node_release(tr_node *node);
/* When edge i of node ends at a leaf (its AccumulateGrad) that already has a gradient on
 * the host, contiguous, of dtype and numel elements, in no storage of reads (n_reads
 * tensors the op reads meanwhile): that gradient (borrowed). The op may then add its own
 * into it in place (bumping its version) and leave grad_in[i] NULL, which spares a buffer
 * for the gradient and the AccumulateGrad's second pass over it (gradient accumulation
 * over micro-batches has one per backward). NULL otherwise. */
tr_tensor *ag_accumulator(const tr_node *node, int i, tr_dtype dtype, int64_t numel,
                          const tr_tensor *const *reads, int n_reads);
/* Whether edge i of node wants a gradient. */
static inline bool ag_wants(const tr_node *node, int i) { return node->next_edges[i].fn != NULL; }

/* ---------------------------------------------------------------- memory */

/* Block size the allocator hands out for nbytes. */
size_t tn_alloc_size(size_t nbytes);
/* A 64-byte aligned block of size (from tn_alloc_size) from a, or from malloc when a is
 * NULL; tn_dealloc gives it back the same way. */
void *tn_alloc(tr_allocator *a, size_t size);
void tn_dealloc(tr_allocator *a, void *ptr, size_t size);
tr_allocator *tn_allocator_retain(tr_allocator *a);
/* Drops a reference to s; the last one frees its memory. */
void tn_storage_release(tr_storage *s);

/* ---------------------------------------------------------------- modules */

/* The children of m (borrowed; *n of them), in order: a Sequential's, a block's branches
 * (residual: body, shortcut; squeeze-and-excitation: gate); *n is 0 for other kinds. FSDP
 * (fsdp.c) cuts a model into units along a Sequential's. */
tr_module *const *tn_module_children(const tr_module *m, size_t *n);
/* Whether m is an end of a skip connection (tr_skip_new): then the slot both ends share
 * (borrowed; it holds the owned tensor the stash kept, or NULL) and *stashes (may be NULL)
 * whether m is the stash. The pipeline (dist/pipeline_skip.c) carries slots across stages;
 * two ends are a pair when their slots are the same. NULL for other modules. */
tr_tensor **tn_module_skip(const tr_module *m, bool *stashes);
/* Whether m is a batch norm; if so its running statistics (borrowed), momentum and whether
 * it is in training mode. The pipeline's deferred batch norm (dist/pipeline_bn.c) uses it. */
bool tn_module_batch_norm(const tr_module *m, tr_tensor **running_mean, tr_tensor **running_var,
                          double *momentum, bool *training);
/* A batch norm module with a hook runs hook(ctx, arg, m, x) in place of its forward, which
 * the hook runs itself with tn_batchnorm_forward: the pipeline's deferred batch norm sees
 * the input of every batch norm of its stage that way, nested ones included. NULL removes
 * the hook. */
typedef tr_tensor *(*tn_bn_hook)(tr_ctx *ctx, void *arg, tr_module *m, tr_tensor *x);
void tn_module_set_bn_hook(tr_module *m, tn_bn_hook hook, void *arg);
/* A batch norm module's own forward, whatever its hook. */
tr_tensor *tn_batchnorm_forward(tr_ctx *ctx, tr_module *m, tr_tensor *x);

/* ---------------------------------------------------------------- tensor helpers */

/* xoshiro256** step on an explicit state (ctx->rng, or a loader's own). */
uint64_t tr_rng_next(uint64_t s[4]);
/* Seeds a xoshiro256** state from one number (splitmix64). */
void tr_rng_seed(uint64_t s[4], uint64_t seed);

/* Returns NULL after writing the message into ctx->err. */
tr_tensor *tr_fail(tr_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* New tensor header over t's storage with t's layout and no history. */
tr_tensor *tn_alias(tr_ctx *ctx, const tr_tensor *t);
/* t itself (retained) when contiguous, else a contiguous copy; no history either way. */
tr_tensor *tn_contig(tr_ctx *ctx, const tr_tensor *t);
tr_tensor *tn_empty_like(tr_ctx *ctx, const tr_tensor *t);
tr_tensor *tn_empty_meta(tr_ctx *ctx, tr_dtype dtype, const tr_meta *m);
tr_tensor *tn_zeros_meta(tr_ctx *ctx, tr_dtype dtype, const tr_meta *m);
/* Sets strides of a contiguous layout for shape; returns numel. */
int64_t tn_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Copies src (any strides) into contiguous dst of the same dtype and numel. */
void tn_copy_to_contig(const tr_tensor *src, void *dst);
/* *numel = the product of shape; false when a size is negative or the count (or its bytes
 * at 8 an element) overflows int64. */
bool tn_numel_fits(int ndim, const int64_t *shape, int64_t *numel);
/* Product of shape[from..to) (1 when empty): a numel that needs no division. */
int64_t tn_prod(const int64_t *shape, int from, int to);
/* Normalises a possibly negative dim; -1 when out of range. */
int tn_dim(int ndim, int dim);
/* Sizes around dim of a contiguous shape: outer * n * inner = numel. */
void tn_split_at(const tr_tensor *t, int dim, int64_t *outer, int64_t *n, int64_t *inner);
/* Checks that all tensors share dtype (op names the caller in errors). */
int tn_check_dtypes(tr_ctx *ctx, const char *op, int n, tr_tensor *const *ts);
tr_meta tn_meta(const tr_tensor *t);
/* A contiguous view of shape at t's offset (no history): a reshape of t, or its first
 * elements when shape holds fewer. */
tr_tensor *tn_view(tr_ctx *ctx, const tr_tensor *t, int ndim, const int64_t *shape);

/* Fills t with value and bumps its version, with no grad-mode check (internal writes). */
void tn_fill(tr_tensor *t, double value);

/* t *= s for a contiguous t (no version bump: for buffers the caller just made). */
void tn_scale_contig(tr_tensor *t, double s);
/* y[0..n) += alpha * x[0..n) on contiguous data of dtype (BLAS axpy). */
void tn_axpy(tr_dtype dtype, int64_t n, double alpha, const void *x, void *y);
/* out[j] = the sum over r < rows of y[r * ld + j] for j < n, added in row order (so a block
 * of columns sums to the same bits as the whole): bias gradients. */
void tn_col_sums(tr_dtype dtype, int64_t rows, int64_t n, const void *y, int64_t ld, void *out);

/* Writes the i-th element in logical order (any strides); no version bump. */
void tn_set(tr_tensor *t, int64_t i, double v);
/* Sum of squares of all elements, accumulated in double. */
double tn_sumsq(const tr_tensor *t);

/* Whether only the caller can see t's data (one reference to t and to its storage). */
bool tn_is_private(const tr_tensor *t);
/* A contiguous copy of t, no history. */
tr_tensor *tn_clone(tr_ctx *ctx, const tr_tensor *t);
/* dst += alpha * src (same numel, any strides), bumping dst's version; no grad-mode check. */
int tn_add(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha);
/* A gradient buffer: *acc = *acc + g, taking g as *acc when *acc is NULL. Consumes g. */
int tn_accumulate(tr_ctx *ctx, tr_tensor **acc, tr_tensor *g);

/* Broadcasting sum back to a shape (the backward of broadcasting): g reduced over the axes
 * where m has size 1 or is missing. Returns an owned contiguous tensor shaped like m. */
tr_tensor *tn_sum_to(tr_ctx *ctx, const tr_tensor *g, const tr_meta *m);

/* Kernels are written once over a type T and suffix S() in kern_*.h files, each included
 * twice (float → _f32, double → _f64); they take void pointers so that one call site serves
 * both. TR_DISPATCH calls the one for dtype. */
#define TR_DISPATCH(dtype, fn, ...) \
  do {                              \
    if ((dtype) == TR_F32)          \
      fn##_f32(__VA_ARGS__);        \
    else                            \
      fn##_f64(__VA_ARGS__);        \
  } while (0)

/* Hot kernels are compiled for AVX-512 and AVX2 besides the baseline, and the loader picks
 * the best the CPU has (GCC function multi-versioning), since the build uses no -march. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TR_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TR_KERNEL
#endif

/* Below this many elements a loop runs on one thread: forking costs more than it saves. */
#define TR_PAR_MIN 32768
/* Threads for the engine's own parallel loops: OpenMP's count when OpenBLAS runs on one
 * thread, else 1. Only one of the two thread pools works at a time: both at once put four
 * spinning threads on two cores (measured: an MLP step 6x slower, bench/RESULTS.md). */
int tn_par_threads(void);
/* The OpenMP clauses for a loop over n elements (macros expand inside omp pragmas). */
#define TR_PAR(n) \
  if ((n) > TR_PAR_MIN) num_threads(tn_par_threads())
/* clang-format off */
/* for (i = 0; i < n; i++) { body }, vectorised, on the engine's threads when n is large.
 * Small loops skip the parallel construct altogether: even with if(false) OpenMP enters
 * the runtime and makes a futex call, a syscall per op that batch-1 inference notices. */
#define TR_PAR_FOR(n, ...)                                                  \
  do {                                                                      \
    if ((n) > TR_PAR_MIN && tn_par_threads() > 1) {                         \
      _Pragma("omp parallel for simd num_threads(tn_par_threads())")        \
      for (int64_t i = 0; i < (n); i++) { __VA_ARGS__ }                     \
    } else {                                                                \
      _Pragma("omp simd")                                                   \
      for (int64_t i = 0; i < (n); i++) { __VA_ARGS__ }                     \
    }                                                                       \
  } while (0)
/* The same for an outer loop of n iterations whose total work is `work` elements (rows of
 * a reduction, planes of a pool): threads split the iterations, no simd. */
#define TR_PAR_LOOP(n, work, ...)                                           \
  do {                                                                      \
    if ((work) > TR_PAR_MIN && (n) > 1 && tn_par_threads() > 1) {           \
      _Pragma("omp parallel for num_threads(tn_par_threads())")             \
      for (int64_t i = 0; i < (n); i++) { __VA_ARGS__ }                     \
    } else {                                                                \
      for (int64_t i = 0; i < (n); i++) { __VA_ARGS__ }                     \
    }                                                                       \
  } while (0)
/* clang-format on */

/* How many parts tn_par_run splits work into for ctx (NULL: no context): the threads of
 * ctx's pool, or OpenMP's (tn_par_threads) outside a parallel region; 1 inside a part, or
 * when OpenBLAS runs on several threads. */
int tn_par_parts(const tr_ctx *ctx);
/* fn(arg, part, parts) for each part in [0, tn_par_parts(ctx)), on ctx's pool, OpenMP's
 * threads, or (one part) the caller's; returns when all are done (par.c). Part 0 always
 * runs on the calling thread, first. */
void tn_par_run(const tr_ctx *ctx, void (*fn)(void *arg, int part, int parts), void *arg);
/* tn_par_run on ctx's own pool when it has one and work (elements) is at least min_work,
 * else fn(arg, 0, 1) on the caller, whose kernels' OpenMP loops may split it themselves:
 * for element-wise passes too short to pay for a hand-off to the pool. */
void tn_pool_run_from(const tr_ctx *ctx, int64_t work, int64_t min_work,
                      void (*fn)(void *arg, int part, int parts), void *arg);
/* The range [lo, hi) of `part` of `parts` over n items: near-even parts that start at
 * multiples of 16 (a cache line of floats) when n allows, so that parts start aligned and
 * write separate lines. */
void tn_par_range(int64_t n, int part, int parts, int64_t *lo, int64_t *hi);

/* C = alpha * op(A) op(B) + beta * C on row-major contiguous data of dtype (OpenBLAS); large
 * ones split over ctx's threads (ctx may be NULL: one call). */
void tn_gemm(const tr_ctx *ctx, tr_dtype dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
             int64_t k, double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
             double beta, void *c, int64_t ldc);

/* Batch norm's input x, (N, C) or (N, C, H, W), as (N, C, L) with L = H*W (1 for 2-D);
 * an error naming the op otherwise (ops_norm.c; the CUDA batch norm uses it too). */
int tn_bn_dims(tr_ctx *ctx, const tr_tensor *x, int64_t *n, int64_t *c, int64_t *l);

/* y (m) = A (m, n, row-major) x + beta y; large ones split by rows over ctx's threads. */
void tn_gemv(const tr_ctx *ctx, tr_dtype dtype, int64_t m, int64_t n, const void *a, int64_t lda,
             const void *x, double beta, void *y);

/* ---------------------------------------------------------------- devices */

/* What the core (tensors, allocator, autograd) needs from a device backend. A backend plugs
 * in by handing its table to the allocator its tensors come from (tn_allocator_new_device);
 * the core finds it through a tensor's storage (tn_device_of) and includes no backend code.
 * The CUDA backend's table is tc_device_ops (trainer/cuda/cuda.c); ops reach a device's
 * compute steps through trainer/cuda/cuda_ops.h. The calls without a ctx run on the device's
 * default stream and report no errors (get then returns NaN). */
typedef struct tn_device_ops {
  void *(*block_new)(int device, size_t size); /* NULL when out of memory */
  void (*block_free)(int device, void *ptr);
  double (*get)(const tr_tensor *t, int64_t i);
  double (*sumsq)(const tr_tensor *t);
  void (*fill)(tr_tensor *t, double value);
  void (*scale)(tr_tensor *t, double s);
  tr_tensor *(*contig)(tr_ctx *ctx, const tr_tensor *t);
  tr_tensor *(*clone)(tr_ctx *ctx, const tr_tensor *t);
  tr_tensor *(*to_dtype)(tr_ctx *ctx, const tr_tensor *t, tr_dtype dtype);
  /* dst and src: one of them on the device, the other anywhere */
  int (*add_)(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src, double alpha);
  int (*copy_)(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src);
  int (*mul_scalar_)(tr_ctx *ctx, tr_tensor *t, double s);
  /* The gradient backward starts from for a root on the device (grad may be NULL or on the
   * host). */
  tr_tensor *(*initial_grad)(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad);
} tn_device_ops;

/* A caching allocator of a device's memory (alloc.c): the same size classes and statistics
 * as the host one, blocks from ops->block_new on device. */
tr_allocator *tn_allocator_new_device(const tn_device_ops *ops, int device, size_t cache_limit);
/* The table of the device t's storage lives on; NULL on the host. */
const tn_device_ops *tn_device_of(const tr_tensor *t);

static inline bool tn_on_cuda(const tr_tensor *t) {
  return t && t->storage->device.kind == TR_CUDA;
}
bool tn_any_on_cuda(int n, tr_tensor *const *ts);
/* A new contiguous tensor whose storage comes from alloc (may be NULL: host malloc) and
 * lives on device (tensor.c). */
tr_tensor *tn_empty_on(tr_ctx *ctx, tr_allocator *alloc, tr_device device, tr_dtype dtype, int ndim,
                       const int64_t *shape);

/* Sums a over the dims in mask (bit d: dim d), times scale, keeping them as size 1; no
 * history; on a's device (ops_reduce.c). */
tr_tensor *tn_sum_dims(tr_ctx *ctx, const tr_tensor *a, uint32_t mask, double scale);

#endif
