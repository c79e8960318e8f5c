/* builtin/models.c: the model families of built-in trials (MLP, CNN, ResNet and MobileNet,
 * builtin.h) built as Sequential modules, counting parameters, buffers and forward FLOPs as
 * they go. A block with a branch (a residual block, squeeze-and-excitation) is built by a
 * second builder that appends to the branch's own Sequential and counts into the same
 * model.
 *
 * The counts come from the same shapes the modules are built with, layer by layer, so
 * they cannot drift from the model: params always equals tr_module_param_count. FLOPs
 * follow docs/metrics.md: 2 per multiply-add of linear and convolution layers plus one
 * per bias add; everything else (residual adds and channel scaling included) counts 0. A failed build frees what it made. */
#include <stdlib.h>
#include <string.h>

#include "builtin/builtin.h"

/* A model under construction and the shape of what its last layer puts out. */
typedef struct {
  tr_ctx *ctx;
  tr_model *m;
  tr_module *seq;   /* borrowed: where add appends (the model, or a branch) */
  const char *what; /* the family, for messages */
  int64_t channels, height, width; /* an MLP's features are channels × 1 × 1 */
} builder;

/* A NULL child is one its constructor could not make: ctx->err already says why. */
static int add(builder *b, tr_module *child) {
  return child ? tr_sequential_add(b->ctx, b->seq, child) : NAS_ERR;
}

static int add_linear(builder *b, int64_t out) {
  if (out < 1)
    return nas_errf(&b->ctx->err, "%s: %lld features (at least 1)", b->what, (long long)out);
  int64_t in = b->channels;
  b->m->params += in * out + out;
  b->m->flops += 2 * in * out + out;
  b->channels = out;
  return add(b, tr_linear_new(b->ctx, in, out, true));
}

/* Batch norm adds a scale and shift per channel and two running statistics. */
static int add_norm(builder *b, tr_norm_kind norm) {
  if (norm == TR_NORM_NONE) return NAS_OK;
  b->m->params += 2 * b->channels;
  if (norm == TR_NORM_LAYER) return add(b, tr_layernorm_new(b->ctx, b->channels));
  b->m->buffers += 2 * b->channels;
  return add(b, tr_batchnorm_new(b->ctx, b->channels));
}

static int add_activation(builder *b, tr_module_kind activation, double dropout) {
  int rc = add(b, tr_activation_new(b->ctx, activation));
  return rc || dropout <= 0 ? rc : add(b, tr_dropout_new(b->ctx, dropout));
}

/* Padding kernel/2: at stride 1 the map keeps its size for odd kernels. A bias only
 * without batch norm, which would cancel it. groups > 1: a grouped convolution. */
static int add_conv_grouped(builder *b, int64_t out, int kernel, int stride, int groups,
                            bool bias) {
  if (out < 1)
    return nas_errf(&b->ctx->err, "%s: %lld channels (at least 1)", b->what, (long long)out);
  int pad = kernel / 2;
  int64_t in = b->channels, span_h = b->height + 2 * pad - kernel,
          span_w = b->width + 2 * pad - kernel;
  if (span_h < 0 || span_w < 0)
    return nas_errf(&b->ctx->err, "%s: a %dx%d kernel leaves no output pixel", b->what, kernel,
                    kernel);
  b->height = span_h / stride + 1;
  b->width = span_w / stride + 1;
  int64_t pixels = b->height * b->width, weights = in / groups * (int64_t)kernel * kernel * out;
  b->m->params += weights + (bias ? out : 0);
  b->m->flops += 2 * weights * pixels + (bias ? out * pixels : 0);
  b->channels = out;
  return add(b, tr_conv2d_grouped_new(b->ctx, in, out, kernel, stride, pad, groups, bias));
}

static int add_conv(builder *b, int64_t out, int kernel, bool bias) {
  return add_conv_grouped(b, out, kernel, 1, 1, bias);
}

static int add_pool(builder *b, tr_module_kind pool) {
  if (b->height < 2 || b->width < 2) return NAS_OK;
  b->height /= 2;
  b->width /= 2;
  return add(b, tr_pool_new(b->ctx, pool, 2));
}

/* Flatten: the map becomes channels × height × width features. */
static int add_flatten(builder *b) {
  b->channels *= b->height * b->width;
  b->height = b->width = 1;
  return add(b, tr_activation_new(b->ctx, TR_FLATTEN));
}

static int builder_start(builder *b, tr_ctx *ctx, tr_model *out, tr_input_shape in,
                         int blocks, const char *what) {
  memset(out, 0, sizeof *out);
  *b = (builder){ctx, out, NULL, what, in.channels, in.height, in.width};
  if (blocks < 1 || blocks > TR_MAX_BLOCKS)
    return nas_errf(&ctx->err, "%s: %d blocks, between 1 and %d expected", what, blocks,
                    TR_MAX_BLOCKS);
  b->seq = out->module = tr_sequential_new(ctx);
  return out->module ? NAS_OK : NAS_ERR;
}

/* On failure frees the half-built model. */
static int builder_finish(builder *b, int rc) {
  if (rc != NAS_OK) tr_model_free(b->m);
  return rc;
}

int tr_mlp_build(tr_ctx *ctx, const tr_mlp_config *cfg, tr_input_shape in, int32_t classes,
                 tr_model *out) {
  builder b;
  int rc = builder_start(&b, ctx, out, in, cfg->layers, "mlp");
  if (rc == NAS_OK) rc = add_flatten(&b);
  for (int i = 0; rc == NAS_OK && i < cfg->layers; i++) {
    rc = add_linear(&b, cfg->widths[i]);
    if (rc == NAS_OK) rc = add_norm(&b, cfg->norm);
    if (rc == NAS_OK) rc = add_activation(&b, cfg->activation, cfg->dropout);
  }
  if (rc == NAS_OK) rc = add_linear(&b, classes);
  return builder_finish(&b, rc);
}

int tr_cnn_build(tr_ctx *ctx, const tr_cnn_config *cfg, tr_input_shape in, int32_t classes,
                 tr_model *out) {
  builder b;
  int rc = builder_start(&b, ctx, out, in, cfg->stages, "cnn");
  if (rc == NAS_OK && cfg->norm == TR_NORM_LAYER)
    rc = nas_errf(&ctx->err, "cnn: layer norm is not offered for convolutions (none or batch)");
  for (int i = 0; rc == NAS_OK && i < cfg->stages; i++) {
    rc = add_conv(&b, cfg->channels[i], cfg->kernel, cfg->norm == TR_NORM_NONE);
    if (rc == NAS_OK) rc = add_norm(&b, cfg->norm);
    if (rc == NAS_OK) rc = add(&b, tr_activation_new(ctx, cfg->activation));
    if (rc == NAS_OK) rc = add_pool(&b, cfg->pool);
  }
  if (rc == NAS_OK) rc = add_flatten(&b);
  if (rc == NAS_OK && cfg->dropout > 0) rc = add(&b, tr_dropout_new(ctx, cfg->dropout));
  if (rc == NAS_OK && cfg->head_width > 0) {
    rc = add_linear(&b, cfg->head_width);
    if (rc == NAS_OK) rc = add_activation(&b, cfg->activation, cfg->dropout);
  }
  if (rc == NAS_OK) rc = add_linear(&b, classes);
  return builder_finish(&b, rc);
}

/* ---------------------------------------------------------------- residual families */

/* Convolution (no bias) → batch norm → activation. */
static int add_conv_bn_act(builder *b, int64_t out, int kernel, int stride, int groups,
                           tr_module_kind activation) {
  int rc = add_conv_grouped(b, out, kernel, stride, groups, false);
  if (rc == NAS_OK) rc = add_norm(b, TR_NORM_BATCH);
  return rc == NAS_OK ? add(b, tr_activation_new(b->ctx, activation)) : rc;
}

/* A builder for a branch of a block: b's shape and counts, appending to a new Sequential. */
static int branch_start(const builder *b, builder *branch) {
  *branch = *b;
  branch->seq = tr_sequential_new(b->ctx);
  return branch->seq ? NAS_OK : NAS_ERR;
}

/* When rc is NAS_OK, appends body + shortcut (NULL: the identity) to b, which takes the
 * body's output shape; else frees both. Returns rc or the append's result. */
static int add_residual(builder *b, int rc, builder *body, tr_module *shortcut) {
  if (rc != NAS_OK) {
    tr_module_free(body->seq);
    tr_module_free(shortcut);
    return rc;
  }
  b->channels = body->channels;
  b->height = body->height;
  b->width = body->width;
  return add(b, tr_residual_new(b->ctx, body->seq, shortcut));
}

/* Global average pooling → dropout (when > 0) → Linear(classes). */
static int add_pooled_head(builder *b, double dropout, int32_t classes) {
  int rc = add(b, tr_activation_new(b->ctx, TR_GLOBALAVGPOOL));
  b->height = b->width = 1;
  if (rc == NAS_OK && dropout > 0) rc = add(b, tr_dropout_new(b->ctx, dropout));
  return rc == NAS_OK ? add_linear(b, classes) : rc;
}

/* ResNet's basic block (builtin.h), then its ReLU. */
static int add_basic_block(builder *b, int64_t out, int stride) {
  builder body, skip = {.seq = NULL};
  int rc = branch_start(b, &body);
  if (rc == NAS_OK) rc = add_conv_bn_act(&body, out, 3, stride, 1, TR_RELU);
  if (rc == NAS_OK) rc = add_conv_grouped(&body, out, 3, 1, 1, false);
  if (rc == NAS_OK) rc = add_norm(&body, TR_NORM_BATCH);
  if (rc == NAS_OK && (stride != 1 || out != b->channels)) { /* a 1×1 projection */
    rc = branch_start(b, &skip);
    if (rc == NAS_OK) rc = add_conv_grouped(&skip, out, 1, stride, 1, false);
    if (rc == NAS_OK) rc = add_norm(&skip, TR_NORM_BATCH);
  }
  rc = add_residual(b, rc, &body, skip.seq);
  return rc == NAS_OK ? add(b, tr_activation_new(b->ctx, TR_RELU)) : rc;
}

int tr_resnet_build(tr_ctx *ctx, const tr_resnet_config *cfg, tr_input_shape in,
                    int32_t classes, tr_model *out) {
  builder b;
  int rc = builder_start(&b, ctx, out, in, cfg->stages, "resnet");
  if (rc == NAS_OK) rc = add_conv_bn_act(&b, cfg->channels[0], 3, 1, 1, TR_RELU);
  for (int i = 0; rc == NAS_OK && i < cfg->stages; i++) {
    if (cfg->blocks[i] < 1) rc = nas_errf(&ctx->err, "resnet: stage %d has no block", i + 1);
    for (int j = 0; rc == NAS_OK && j < cfg->blocks[i]; j++)
      rc = add_basic_block(&b, cfg->channels[i], i > 0 && j == 0 ? 2 : 1);
  }
  if (rc == NAS_OK) rc = add_pooled_head(&b, cfg->dropout, classes);
  return builder_finish(&b, rc);
}

/* x times gate(x): GAP → Linear(C, max(1, C/4)) → ReLU → Linear(C) → hard-sigmoid. */
static int add_squeeze_excite(builder *b) {
  int64_t c = b->channels;
  builder gate;
  int rc = branch_start(b, &gate);
  if (rc == NAS_OK) rc = add(&gate, tr_activation_new(b->ctx, TR_GLOBALAVGPOOL));
  if (rc == NAS_OK) rc = add_linear(&gate, c / 4 > 0 ? c / 4 : 1);
  if (rc == NAS_OK) rc = add(&gate, tr_activation_new(b->ctx, TR_RELU));
  if (rc == NAS_OK) rc = add_linear(&gate, c);
  if (rc == NAS_OK) rc = add(&gate, tr_activation_new(b->ctx, TR_HARDSIGMOID));
  if (rc != NAS_OK) {
    tr_module_free(gate.seq);
    return rc;
  }
  return add(b, tr_squeeze_excite_new(b->ctx, gate.seq));
}

/* MobileNet's inverted residual block (builtin.h) for stage i. */
static int add_inverted_residual(builder *b, const tr_mobilenet_config *cfg, int i, int stride) {
  int64_t out = cfg->channels[i], expanded = b->channels * cfg->expansion[i];
  bool residual = stride == 1 && out == b->channels;
  builder body, *to = residual ? &body : b;
  int rc = residual ? branch_start(b, &body) : NAS_OK;
  if (rc == NAS_OK && cfg->expansion[i] > 1)
    rc = add_conv_bn_act(to, expanded, 1, 1, 1, cfg->activation);
  if (rc == NAS_OK)
    rc = add_conv_bn_act(to, expanded, cfg->kernel[i], stride, (int)expanded, cfg->activation);
  if (rc == NAS_OK && cfg->se[i]) rc = add_squeeze_excite(to);
  if (rc == NAS_OK) rc = add_conv_grouped(to, out, 1, 1, 1, false);
  if (rc == NAS_OK) rc = add_norm(to, TR_NORM_BATCH);
  return residual ? add_residual(b, rc, &body, NULL) : rc;
}

static int check_mobilenet_stage(tr_ctx *ctx, const tr_mobilenet_config *cfg, int i) {
  if (cfg->blocks[i] < 1 || cfg->expansion[i] < 1 || cfg->kernel[i] < 1 || cfg->kernel[i] % 2 == 0)
    return nas_errf(&ctx->err, "mobilenet: stage %d: %d blocks, expansion %d, kernel %d (at "
                    "least 1 block, expansion from 1, an odd kernel)", i + 1, cfg->blocks[i],
                    cfg->expansion[i], cfg->kernel[i]);
  return NAS_OK;
}

int tr_mobilenet_build(tr_ctx *ctx, const tr_mobilenet_config *cfg, tr_input_shape in,
                       int32_t classes, tr_model *out) {
  builder b;
  int rc = builder_start(&b, ctx, out, in, cfg->stages, "mobilenet");
  if (rc == NAS_OK && cfg->activation != TR_RELU && cfg->activation != TR_HARDSWISH)
    rc = nas_errf(&ctx->err, "mobilenet: the activation is relu or hardswish");
  if (rc == NAS_OK) rc = add_conv_bn_act(&b, cfg->channels[0], 3, 1, 1, cfg->activation);
  for (int i = 0; rc == NAS_OK && i < cfg->stages; i++) {
    rc = check_mobilenet_stage(ctx, cfg, i);
    for (int j = 0; rc == NAS_OK && j < cfg->blocks[i]; j++)
      rc = add_inverted_residual(&b, cfg, i, i > 0 && j == 0 ? 2 : 1);
  }
  if (rc == NAS_OK) rc = add_pooled_head(&b, cfg->dropout, classes);
  return builder_finish(&b, rc);
}

void tr_model_free(tr_model *m) {
  tr_module_free(m->module);
  memset(m, 0, sizeof *m);
}
