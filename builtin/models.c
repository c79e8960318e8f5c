/* builtin/models.c: the model families of built-in trials (MLP and CNN, builtin.h) built
 * as Sequential modules, counting parameters, buffers and forward FLOPs as they go.
 *
 * The counts come from the same shapes the modules are built with, layer by layer, so
 * they cannot drift from the model: params always equals tr_module_param_count. FLOPs
 * follow docs/metrics.md: 2 per multiply-add of linear and convolution layers plus one
 * per bias add; everything else counts 0. A failed build frees what it made. */
#include <stdlib.h>
#include <string.h>

#include "builtin/builtin.h"

/* A model under construction and the shape of what its last layer puts out. */
typedef struct {
  tr_ctx *ctx;
  tr_model *m;
  int64_t channels, height, width; /* an MLP's features are channels × 1 × 1 */
} builder;

static int add(builder *b, tr_module *child) {
  return tr_sequential_add(b->ctx, b->m->module, child);
}

static int add_linear(builder *b, int64_t out) {
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

/* Stride 1 and padding kernel/2: the map keeps its size for odd kernels. A bias only
 * without batch norm, which would cancel it. */
static int add_conv(builder *b, int64_t out, int kernel, bool bias) {
  int pad = kernel / 2;
  int64_t in = b->channels;
  b->height = b->height + 2 * pad - kernel + 1;
  b->width = b->width + 2 * pad - kernel + 1;
  if (b->height < 1 || b->width < 1)
    return nas_errf(&b->ctx->err, "cnn: a %dx%d kernel leaves no output pixel", kernel, kernel);
  int64_t pixels = b->height * b->width, weights = in * (int64_t)kernel * kernel * out;
  b->m->params += weights + (bias ? out : 0);
  b->m->flops += 2 * weights * pixels + (bias ? out * pixels : 0);
  b->channels = out;
  return add(b, tr_conv2d_new(b->ctx, in, out, kernel, 1, pad, bias));
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
  *b = (builder){ctx, out, in.channels, in.height, in.width};
  if (blocks < 1 || blocks > TR_MAX_BLOCKS)
    return nas_errf(&ctx->err, "%s: %d blocks, between 1 and %d expected", what, blocks,
                    TR_MAX_BLOCKS);
  out->module = tr_sequential_new(ctx);
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

void tr_model_free(tr_model *m) {
  tr_module_free(m->module);
  memset(m, 0, sizeof *m);
}
