/* trainer/infer.h: fused inference paths (infer.c), internal to the engine. nn.c's
 * sequential forward uses them in no-grad mode where a run of modules fits one: conv2d
 * [+ ReLU] [+ max pool], and linear + ReLU. */
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

#endif
