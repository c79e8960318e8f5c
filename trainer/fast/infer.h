/* trainer/fast/infer.h: fused paths, internal to the engine. nn.c's sequential forward uses them
 * where a run of modules fits one: in no-grad mode (infer.c) conv2d [+ ReLU] [+ max pool],
 * linear + ReLU, and at batch 1 a whole MLP ([flatten], then linear [+ ReLU] layers); in
 * grad mode on the engine's pool (mlp_train.c) an MLP of a batch, as one op. */
#ifndef NAS_TRAINER_INFER_H
#define NAS_TRAINER_INFER_H

#include "trainer/core/internal.h"

/* Whether conv2d(x, w, b) with this stride and padding, then a max pool of window and
 * stride `pool` (0: none), can run as tn_conv_block_infer: float32 CPU tensors of shapes
 * that fit, stride 1. When it cannot, the modules run one by one (and report any error). */
bool tn_conv_block_fits(const tr_tensor *x, const tr_tensor *w, const tr_tensor *b, int stride,
                        int padding, int pool);

/* max_pool(relu(conv2d(x, w, b, stride 1, padding)), pool) in one pass, for inference: no
 * graph, whatever the grad mode. relu false leaves out the ReLU, pool 0 the pool. Equal to
 * the modules one after another up to the rounding of the convolution's sums. */
tr_tensor *tn_conv_block_infer(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int padding,
                               bool relu, int pool);

/* Whether linear(x, w, b) then ReLU can run as tn_linear_relu_infer: float32 CPU tensors
 * (tr_linear itself checks the shapes and reports any error). */
bool tn_linear_relu_fits(const tr_tensor *x, const tr_tensor *w);

/* relu(linear(x, w, b)) for inference, no graph: the ReLU applied in place to the linear
 * layer's fresh output, so one tensor and one op fewer than the modules; the same values. */
tr_tensor *tn_linear_relu_infer(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b);

/* One linear layer of a batch-1 MLP run: y = x W^T + b, then ReLU when relu. */
typedef struct {
  const tr_tensor *w, *b; /* borrowed; b may be NULL */
  bool relu;
} tn_mlp_layer;

#define TN_MLP_MAX_LAYERS 8    /* a longer run is cut into several */
#define TN_MLP_MAX_WIDTH 2048  /* hidden widths held on the stack between layers */

/* Whether these n layers (1 to TN_MLP_MAX_LAYERS) chain on x: float32 CPU tensors,
 * contiguous, x (rows, in) or, when flatten, any (rows, ...) of in values per row, and each
 * layer's input width the previous one's output width. */
bool tn_mlp_chains(const tr_tensor *x, bool flatten, const tn_mlp_layer *layers, int n);

/* Whether tn_mlp_infer can run these n layers (1 to TN_MLP_MAX_LAYERS) on x: one example
 * (x (1, in), or any (1, ...) of in values when flatten), float32 CPU tensors, contiguous,
 * widths that chain and hidden ones up to TN_MLP_MAX_WIDTH. */
bool tn_mlp_fits(const tr_tensor *x, bool flatten, const tn_mlp_layer *layers, int n);

/* The layers one after another on x (flattened to (1, in) first when flatten), for
 * inference: no graph, no tensor between layers, one output (1, out). On one thread (or a
 * first layer too small to split) bit-identical to the modules one by one; split over
 * ctx's threads, the second layer's sums are added in parts, so equal within float
 * rounding (and the same from call to call with the same threads). */
tr_tensor *tn_mlp_infer(tr_ctx *ctx, const tr_tensor *x, const tn_mlp_layer *layers, int n);

/* Whether tn_mlp_train runs these n layers on x: they chain, there are 2 or more, and ctx
 * has a pool splitting into parts of at least 16 batch rows and 16 of the first layer's
 * outputs. */
bool tn_mlp_train_fits(const tr_ctx *ctx, const tr_tensor *x, bool flatten,
                       const tn_mlp_layer *layers, int n);

/* The layers one after another on x (viewed as (rows, in)), as one op with one backward
 * node ("MlpBackward") whose inputs are x and every weight and bias: the same function and
 * gradients as the modules one by one, within float rounding (mlp_train.c). */
tr_tensor *tn_mlp_train(tr_ctx *ctx, tr_tensor *x, const tn_mlp_layer *layers, int n);

/* y[i] = relu?(y[i] + b[i]) (no bias: b NULL) for i in [0, n). */
void tn_add_bias_relu(float *y, const float *b, int64_t n, bool relu);

/* y[i] = relu?(b[i] + the blocks' partial sums in block order) for i in [0, n): block k's
 * values start at partial + k * stride (no bias: b NULL, no ReLU: relu false). */
void tn_sum_partials(float *y, const float *b, const float *partial, int blocks, int64_t stride,
                     int64_t n, bool relu);

#endif
