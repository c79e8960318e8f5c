/* trainer/infer.h: fused inference paths (infer.c), internal to the engine. nn.c's
 * sequential forward uses them in no-grad mode where a run of modules fits one: conv2d
 * [+ ReLU] [+ max pool], linear + ReLU, and at batch 1 a whole MLP ([flatten], then linear
 * [+ ReLU] layers). */
#ifndef NAS_TRAINER_INFER_H
#define NAS_TRAINER_INFER_H

#include "trainer/internal.h"

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

#endif
