/* The CUDA backend's contracts. Where no device can be used (no GPU, no driver, or a build
 * without nvcc) the device tests are skipped, each printing why, and the tests of the
 * unavailable path run: every way onto a device fails with a message that names the reason,
 * and CPU tensors behave as before. With a device, every op's forward and gradient match the
 * CPU backend (float64 to 1e-9, float32 to 1e-4 relative), a few MLP and CNN training steps
 * give the CPU's parameters, and the device allocator reuses its blocks. */
#include "tests/testutil.h"

#include <math.h>

#include "trainer/trainer.h"

#define SHAPE(...)                                                                                 \
  (int64_t[]) { __VA_ARGS__ }

/* ---------------------------------------------------------------- fixtures */

/* A ctx with an engine on device 0, or a skip that says why there is none. */
typedef struct {
  tr_ctx ctx;
  tr_cuda *cu;
} gpu;

static void gpu_open(gpu *g, uint64_t seed) {
  nas_err err = {{0}};
  if (tr_cuda_device_count(&err) == 0) {
    print_message("skipped: no usable CUDA device (%s)\n", err.msg);
    skip();
  }
  tr_ctx_init(&g->ctx, seed);
  g->cu = tr_cuda_new(0, (size_t)1 << 30, &err);
  if (!g->cu) fail_msg("tr_cuda_new: %s", err.msg);
  g->ctx.cuda = g->cu;
}

static void gpu_close(gpu *g) {
  nas_err err = {{0}};
  assert_int_equal(tr_cuda_sync(g->cu, &err), NAS_OK);
  tr_cuda_free(g->cu);
}

static tr_tensor *on_gpu(tr_ctx *ctx, tr_tensor *t) {
  tr_tensor *d = tr_to_device(ctx, t, TR_DEVICE_CUDA(0));
  if (!d) fail_msg("to_device: %s", ctx->err.msg);
  return d;
}

/* Largest |a - b| / (1 + |b|) over the elements (read through tr_get on either device). */
static double max_rel_diff(const tr_tensor *a, const tr_tensor *b) {
  assert_int_equal(a->numel, b->numel);
  double worst = 0;
  for (int64_t i = 0; i < a->numel; i++) {
    double x = tr_get(a, i), y = tr_get(b, i);
    double d = fabs(x - y) / (1 + fabs(y));
    if (!(d <= worst)) worst = d; /* NaN counts as worst */
  }
  return worst;
}

/* ---------------------------------------------------------------- without a device */

static void device_count_names_the_reason_when_there_is_none(void **state) {
  (void)state;
  nas_err err = {{0}};
  int n = tr_cuda_device_count(&err);
  if (n > 0) {
    print_message("skipped: this machine has %d CUDA device(s)\n", n);
    skip();
  }
  assert_int_equal(n, 0);
  assert_non_null(strstr(err.msg, "CUDA unavailable: "));
  assert_true(strlen(err.msg) > strlen("CUDA unavailable: "));
}

static void engine_refuses_to_start_without_a_device(void **state) {
  (void)state;
  nas_err err = {{0}};
  if (tr_cuda_device_count(&err) > 0) {
    print_message("skipped: a CUDA device is present\n");
    skip();
  }
  assert_null(tr_cuda_new(0, 1 << 20, &err));
  assert_non_null(strstr(err.msg, "cuda:0"));
  assert_non_null(strstr(err.msg, "CUDA unavailable"));
}

static void to_device_without_an_engine_fails_naming_the_reason(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *t = tr_rand(&ctx, TR_F32, 2, SHAPE(2, 3), -1, 1);
  tr_set_requires_grad(t, true);
  assert_null(tr_to_device(&ctx, t, TR_DEVICE_CUDA(0)));
  assert_non_null(strstr(ctx.err.msg, "cuda:0 requested"));
  nas_err why = {{0}};
  if (tr_cuda_device_count(&why) == 0)
    assert_non_null(strstr(ctx.err.msg, why.msg)); /* the reason itself */
  else
    assert_non_null(strstr(ctx.err.msg, "ctx->cuda is NULL"));
  tr_module *m = tr_linear_new(&ctx, 3, 2, true);
  assert_int_equal(tr_module_to_device(&ctx, m, TR_DEVICE_CUDA(0)), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "cuda:0 requested"));
  tr_module_free(m);
  tr_release(t);
}

static void cpu_tensors_stay_on_the_cpu_and_compute_as_before(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  tr_tensor *a = tr_from_data(&ctx, TR_F64, 1, SHAPE(3), (double[]){1, 2, 3});
  tr_set_requires_grad(a, true);
  assert_int_equal(tr_tensor_device(a).kind, TR_CPU);
  tr_tensor *same = tr_to_device(&ctx, a, TR_DEVICE_CPU);
  assert_ptr_equal(same, a); /* already there: the tensor itself, as torch's .to() */
  tr_tensor *b = tr_mul(&ctx, same, a);
  tr_tensor *s = tr_sum(&ctx, b, 0, NULL, false);
  assert_true(tr_item(s) == 14.0);
  assert_int_equal(tr_backward(&ctx, s, NULL, false), NAS_OK);
  for (int i = 0; i < 3; i++) assert_true(tr_get(a->grad, i) == 2.0 * (i + 1));
  tr_module *m = tr_linear_new(&ctx, 3, 2, true);
  assert_int_equal(tr_module_to_device(&ctx, m, TR_DEVICE_CPU), NAS_OK); /* a no-op */
  tr_module_free(m);
  tr_release(s);
  tr_release(b);
  tr_release(same);
  tr_release(a);
}

static void bfloat16_is_refused_on_the_cpu(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_tensor *t = tr_rand(&ctx, TR_F32, 1, SHAPE(4), -1, 1);
  assert_null(tr_to_dtype(&ctx, t, TR_BF16));
  assert_non_null(strstr(ctx.err.msg, "bfloat16 exists only on CUDA devices"));
  tr_release(t);
}

/* ---------------------------------------------------------------- ops against the CPU */

/* An op under test on inputs in[0..n) (all on one device). */
typedef tr_tensor *(*op_fn)(tr_ctx *ctx, tr_tensor *const *in);

typedef struct {
  const char *name;
  op_fn fn;
  int n;
  int ndim[4];
  int64_t shape[4][4];
  double lo, hi; /* input range */
} op_case;

static const int32_t kLabels[8] = {1, 0, 5, 2, 3, 3, 4, 0};
static const int32_t kIds[5] = {2, 0, 2, 3, 1};

static tr_tensor *op_add(tr_ctx *c, tr_tensor *const *in) { return tr_add(c, in[0], in[1]); }
static tr_tensor *op_sub(tr_ctx *c, tr_tensor *const *in) { return tr_sub(c, in[0], in[1]); }
static tr_tensor *op_mul(tr_ctx *c, tr_tensor *const *in) { return tr_mul(c, in[0], in[1]); }
static tr_tensor *op_div(tr_ctx *c, tr_tensor *const *in) { return tr_div(c, in[0], in[1]); }
static tr_tensor *op_scale(tr_ctx *c, tr_tensor *const *in) { return tr_scale(c, in[0], -2.5); }
static tr_tensor *op_relu(tr_ctx *c, tr_tensor *const *in) { return tr_relu(c, in[0]); }
static tr_tensor *op_gelu(tr_ctx *c, tr_tensor *const *in) { return tr_gelu(c, in[0]); }
static tr_tensor *op_tanh(tr_ctx *c, tr_tensor *const *in) { return tr_tanh(c, in[0]); }
static tr_tensor *op_sigmoid(tr_ctx *c, tr_tensor *const *in) { return tr_sigmoid(c, in[0]); }
static tr_tensor *op_exp(tr_ctx *c, tr_tensor *const *in) { return tr_exp(c, in[0]); }
static tr_tensor *op_log(tr_ctx *c, tr_tensor *const *in) { return tr_log(c, in[0]); }
static tr_tensor *op_dropout(tr_ctx *c, tr_tensor *const *in) {
  return tr_dropout(c, in[0], 0.3, true);
}
static tr_tensor *op_sum_axis(tr_ctx *c, tr_tensor *const *in) {
  return tr_sum(c, in[0], 2, (int[]){0, 2}, true);
}
static tr_tensor *op_sum_dim0(tr_ctx *c, tr_tensor *const *in) {
  return tr_sum(c, in[0], 1, (int[]){0}, false);
}
static tr_tensor *op_sum_dim1(tr_ctx *c, tr_tensor *const *in) {
  return tr_sum(c, in[0], 1, (int[]){1}, false);
}
static tr_tensor *op_mean_all(tr_ctx *c, tr_tensor *const *in) {
  return tr_mean(c, in[0], 0, NULL, false);
}
static tr_tensor *op_softmax0(tr_ctx *c, tr_tensor *const *in) { return tr_softmax(c, in[0], 0); }
static tr_tensor *op_log_softmax(tr_ctx *c, tr_tensor *const *in) {
  return tr_log_softmax(c, in[0], -1);
}
static tr_tensor *op_matmul(tr_ctx *c, tr_tensor *const *in) { return tr_matmul(c, in[0], in[1]); }
/* a^T @ b: a transposed view goes to GEMM as a flag. */
static tr_tensor *op_matmul_t(tr_ctx *c, tr_tensor *const *in) {
  tr_tensor *at = tr_transpose(c, in[0], 0, 1);
  tr_tensor *out = tr_matmul(c, at, in[1]);
  tr_release(at);
  return out;
}
static tr_tensor *op_linear(tr_ctx *c, tr_tensor *const *in) {
  return tr_linear(c, in[0], in[1], in[2]);
}
static tr_tensor *op_cross_entropy(tr_ctx *c, tr_tensor *const *in) {
  return tr_cross_entropy(c, in[0], kLabels);
}
static tr_tensor *op_mse(tr_ctx *c, tr_tensor *const *in) { return tr_mse_loss(c, in[0], in[1]); }
static tr_tensor *op_layer_norm(tr_ctx *c, tr_tensor *const *in) {
  return tr_layer_norm(c, in[0], in[1], in[2], 1e-5);
}
static tr_tensor *op_batch_norm(tr_ctx *c, tr_tensor *const *in) {
  return tr_batch_norm(c, in[0], in[1], in[2], NULL, NULL, true, 0.1, 1e-5);
}
static tr_tensor *op_conv_pad(tr_ctx *c, tr_tensor *const *in) {
  return tr_conv2d(c, in[0], in[1], in[2], 1, 1);
}
static tr_tensor *op_conv_stride(tr_ctx *c, tr_tensor *const *in) {
  return tr_conv2d(c, in[0], in[1], NULL, 2, 0);
}
static tr_tensor *op_max_pool(tr_ctx *c, tr_tensor *const *in) {
  return tr_max_pool2d(c, in[0], 2, 2);
}
static tr_tensor *op_avg_pool_overlap(tr_ctx *c, tr_tensor *const *in) {
  return tr_avg_pool2d(c, in[0], 3, 1);
}
static tr_tensor *op_max_pool_overlap(tr_ctx *c, tr_tensor *const *in) {
  return tr_max_pool2d(c, in[0], 3, 2);
}
static tr_tensor *op_reshape_transpose(tr_ctx *c, tr_tensor *const *in) {
  tr_tensor *r = tr_reshape(c, in[0], 2, SHAPE(4, -1));
  tr_tensor *t = r ? tr_transpose(c, r, 0, 1) : NULL;
  tr_tensor *out = t ? tr_contiguous(c, t) : NULL;
  tr_release(r);
  tr_release(t);
  return out;
}
static tr_tensor *op_narrow_concat(tr_ctx *c, tr_tensor *const *in) {
  tr_tensor *n = tr_narrow(c, in[0], 1, 1, 2);
  tr_tensor *out = n ? tr_concat(c, 2, (tr_tensor *[]){n, in[1]}, 1) : NULL;
  tr_release(n);
  return out;
}
static tr_tensor *op_embedding(tr_ctx *c, tr_tensor *const *in) {
  return tr_embedding(c, in[0], 5, kIds);
}

static const op_case kCases[] = {
    {"add broadcast", op_add, 2, {2, 1}, {{3, 4}, {4}}, -1, 1},
    {"sub broadcast", op_sub, 2, {3, 2}, {{2, 3, 4}, {3, 1}}, -1, 1},
    {"mul", op_mul, 2, {2, 2}, {{3, 4}, {3, 4}}, -1, 1},
    {"div broadcast", op_div, 2, {2, 2}, {{3, 4}, {1, 4}}, 0.5, 1.5},
    {"scale", op_scale, 1, {2}, {{3, 4}}, -1, 1},
    {"relu", op_relu, 1, {2}, {{5, 7}}, -1, 1},
    {"gelu", op_gelu, 1, {2}, {{5, 7}}, -2, 2},
    {"tanh", op_tanh, 1, {2}, {{5, 7}}, -2, 2},
    {"sigmoid", op_sigmoid, 1, {2}, {{5, 7}}, -2, 2},
    {"exp", op_exp, 1, {2}, {{5, 7}}, -2, 2},
    {"log", op_log, 1, {2}, {{5, 7}}, 0.2, 2},
    {"dropout", op_dropout, 1, {2}, {{16, 9}}, -1, 1},
    {"sum over axes 0 and 2", op_sum_axis, 1, {3}, {{3, 4, 5}}, -1, 1},
    {"mean of all", op_mean_all, 1, {3}, {{3, 4, 5}}, -1, 1},
    /* few outputs over long sums: the device sums them in chunks of 4096 (one chunk, and
     * several through a scratch), see cuda_kernels.cu */
    {"sum of long rows, one chunk", op_sum_dim1, 1, {2}, {{4, 1000}}, -1, 1},
    {"sum of long rows, chunked", op_sum_dim1, 1, {2}, {{3, 9000}}, -1, 1},
    {"sum of long columns, chunked", op_sum_dim0, 1, {2}, {{9000, 5}}, -1, 1},
    {"mean of many", op_mean_all, 1, {2}, {{300, 40}}, -1, 1},
    /* many outputs: blocks of 32 outputs by a chunk of the rows; several chunks through a
     * scratch, one straight to the output. Outputs are compared element by element, each
     * read from the device on its own: sizes stay small where the path allows. */
    {"sum of many columns, tiled", op_sum_dim0, 1, {2}, {{1024, 2100}}, -1, 1},
    {"sum over the middle, tiled", op_sum_dim1, 1, {3}, {{3, 700, 400}}, -1, 1},
    {"sum of short columns, one chunk", op_sum_dim0, 1, {2}, {{50, 1500}}, -1, 1},
    {"linear, a wide bias", op_linear, 3, {2, 2, 1}, {{130, 16}, {1100, 16}, {1100}}, -1, 1},
    {"add broadcast over rows", op_add, 2, {2, 1}, {{40, 900}, {900}}, -1, 1},
    {"softmax dim 0", op_softmax0, 1, {3}, {{3, 4, 5}}, -2, 2},
    {"log_softmax last dim", op_log_softmax, 1, {2}, {{6, 9}}, -2, 2},
    {"matmul", op_matmul, 2, {2, 2}, {{3, 4}, {4, 5}}, -1, 1},
    {"matmul of a transposed view", op_matmul_t, 2, {2, 2}, {{4, 3}, {4, 5}}, -1, 1},
    {"linear 3-D", op_linear, 3, {3, 2, 1}, {{2, 3, 4}, {5, 4}, {5}}, -1, 1},
    {"cross_entropy", op_cross_entropy, 1, {2}, {{8, 6}}, -2, 2},
    {"mse_loss", op_mse, 2, {2, 2}, {{4, 3}, {4, 3}}, -1, 1},
    {"layer_norm", op_layer_norm, 3, {2, 1, 1}, {{3, 6}, {6}, {6}}, -1, 1},
    {"batch_norm 4-D", op_batch_norm, 3, {4, 1, 1}, {{4, 3, 2, 2}, {3}, {3}}, -1, 1},
    {"conv2d padding 1", op_conv_pad, 3, {4, 4, 1}, {{2, 3, 5, 5}, {4, 3, 3, 3}, {4}}, -1, 1},
    {"conv2d stride 2", op_conv_stride, 2, {4, 4}, {{2, 2, 7, 6}, {3, 2, 3, 2}}, -1, 1},
    {"max_pool2d 2x2", op_max_pool, 1, {4}, {{2, 3, 4, 6}}, -1, 1},
    {"max_pool2d 3x3 stride 2", op_max_pool_overlap, 1, {4}, {{2, 2, 7, 7}}, -1, 1},
    {"avg_pool2d 3x3 stride 1", op_avg_pool_overlap, 1, {4}, {{2, 2, 5, 5}}, -1, 1},
    {"reshape, transpose, contiguous", op_reshape_transpose, 1, {3}, {{2, 4, 3}}, -1, 1},
    {"narrow and concat", op_narrow_concat, 2, {2, 2}, {{3, 4}, {3, 5}}, -1, 1},
    {"embedding", op_embedding, 1, {2}, {{4, 3}}, -1, 1},
};

/* sum(out * w) with a fixed random w on out's device: a scalar whose gradient is w. */
static tr_tensor *weighted_sum(tr_ctx *ctx, tr_tensor *out, tr_tensor *w_cpu) {
  tr_tensor *w = tr_tensor_device(out).kind == TR_CUDA ? on_gpu(ctx, w_cpu) : tr_retain(w_cpu);
  tr_tensor *p = tr_mul(ctx, out, w);
  tr_tensor *s = p ? tr_sum(ctx, p, 0, NULL, false) : NULL;
  if (!s) fail_msg("weighted sum: %s", ctx->err.msg);
  tr_release(p);
  tr_release(w);
  return s;
}

/* Runs c on CPU leaves and on their device copies (same generator state, so dropout draws
 * the same mask), backward through both to the same leaves, and compares. */
static void check_case(gpu *g, const op_case *c, tr_dtype dtype, double tol) {
  tr_ctx *ctx = &g->ctx;
  tr_tensor *leaf[4], *dev[4], *grad_cpu[4];
  for (int i = 0; i < c->n; i++) {
    leaf[i] = tr_rand(ctx, dtype, c->ndim[i], c->shape[i], c->lo, c->hi);
    tr_set_requires_grad(leaf[i], true);
  }
  uint64_t rng[4];
  memcpy(rng, ctx->rng, sizeof rng);
  tr_tensor *out_cpu = c->fn(ctx, leaf);
  if (!out_cpu) fail_msg("%s on cpu: %s", c->name, ctx->err.msg);
  tr_tensor *w = tr_rand(ctx, dtype, out_cpu->ndim, out_cpu->shape, -1, 1);
  tr_tensor *s_cpu = weighted_sum(ctx, out_cpu, w);
  assert_int_equal(tr_backward(ctx, s_cpu, NULL, false), NAS_OK);
  for (int i = 0; i < c->n; i++) {
    grad_cpu[i] = leaf[i]->grad;
    leaf[i]->grad = NULL;
    dev[i] = on_gpu(ctx, leaf[i]);
  }
  memcpy(ctx->rng, rng, sizeof rng);
  tr_tensor *out_gpu = c->fn(ctx, dev);
  if (!out_gpu) fail_msg("%s on cuda: %s", c->name, ctx->err.msg);
  assert_int_equal(tr_tensor_device(out_gpu).kind, TR_CUDA);
  tr_tensor *s_gpu = weighted_sum(ctx, out_gpu, w);
  if (tr_backward(ctx, s_gpu, NULL, false)) fail_msg("%s backward: %s", c->name, ctx->err.msg);
  double d_out = max_rel_diff(out_gpu, out_cpu);
  print_message("%-32s %s  output %.2e", c->name, dtype == TR_F64 ? "f64" : "f32", d_out);
  assert_true(d_out <= tol);
  for (int i = 0; i < c->n; i++) {
    assert_non_null(leaf[i]->grad); /* came back through ToCopyBackward, on the cpu */
    assert_int_equal(tr_tensor_device(leaf[i]->grad).kind, TR_CPU);
    double d = max_rel_diff(leaf[i]->grad, grad_cpu[i]);
    print_message("  grad %d %.2e", i, d);
    assert_true(d <= tol);
  }
  print_message("\n");
  for (int i = 0; i < c->n; i++) {
    tr_release(dev[i]);
    tr_release(grad_cpu[i]);
    tr_release(leaf[i]);
  }
  tr_release(s_gpu);
  tr_release(out_gpu);
  tr_release(s_cpu);
  tr_release(out_cpu);
  tr_release(w);
}

static void every_op_and_its_gradient_match_the_cpu(void **state) {
  (void)state;
  gpu g;
  gpu_open(&g, 7);
  for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++) {
    check_case(&g, &kCases[i], TR_F64, 1e-9);
    check_case(&g, &kCases[i], TR_F32, 1e-4);
  }
  gpu_close(&g);
}

/* ---------------------------------------------------------------- tensors on the device */

static void in_place_writes_and_reads_work_on_the_device(void **state) {
  (void)state;
  gpu g;
  gpu_open(&g, 3);
  tr_ctx *ctx = &g.ctx;
  tr_tensor *h = tr_from_data(ctx, TR_F32, 2, SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  tr_tensor *d = on_gpu(ctx, h);
  assert_true(tr_get(d, 4) == 5.0);
  tr_tensor *col = tr_narrow(ctx, d, 1, 1, 1); /* a strided view: column 1 */
  uint64_t v0 = d->storage->version;
  assert_int_equal(tr_fill_(ctx, col, -1.0), NAS_OK);
  assert_true(d->storage->version == v0 + 1);
  assert_true(tr_get(d, 1) == -1.0 && tr_get(d, 4) == -1.0 && tr_get(d, 0) == 1.0);
  assert_int_equal(tr_mul_scalar_(ctx, d, 2.0), NAS_OK);
  assert_int_equal(tr_add_(ctx, d, d, 0.5), NAS_OK); /* d = 3 times the filled values */
  assert_true(tr_get(d, 5) == 18.0);
  assert_int_equal(tr_copy_(ctx, h, d), NAS_OK); /* device to host */
  assert_true(tr_get(h, 5) == 18.0);
  assert_int_equal(tr_copy_(ctx, col, h), NAS_ERR); /* 2 elements from 6 */
  tr_tensor *d64 = tr_to_dtype(ctx, d, TR_F64);
  assert_int_equal(d64->dtype, TR_F64);
  assert_true(tr_get(d64, 3) == 12.0);
  tr_tensor *s = tr_sum(ctx, d, 0, NULL, false);
  assert_true(fabs(tr_item(s) - 3.0 * (1 - 1 + 3 + 4 - 1 + 6)) < 1e-4);
  tr_release(s);
  tr_release(d64);
  tr_release(col);
  tr_release(d);
  tr_release(h);
  gpu_close(&g);
}

static void inputs_on_different_devices_are_an_error(void **state) {
  (void)state;
  gpu g;
  gpu_open(&g, 4);
  tr_ctx *ctx = &g.ctx;
  tr_tensor *h = tr_rand(ctx, TR_F32, 1, SHAPE(4), -1, 1);
  tr_tensor *d = on_gpu(ctx, h);
  assert_null(tr_add(ctx, h, d));
  assert_non_null(strstr(ctx->err.msg, "one device"));
  assert_null(tr_matmul(ctx, d, h));
  assert_non_null(strstr(ctx->err.msg, "one device"));
  g.ctx.cuda = NULL;
  assert_null(tr_relu(ctx, d));
  assert_non_null(strstr(ctx->err.msg, "ctx->cuda is NULL"));
  g.ctx.cuda = g.cu;
  tr_release(d);
  tr_release(h);
  gpu_close(&g);
}

static void device_allocator_reuses_blocks_and_counts_bytes(void **state) {
  (void)state;
  gpu g;
  gpu_open(&g, 5);
  tr_alloc_stats st;
  tr_cuda_memory_stats(g.cu, &st);
  assert_int_equal(st.in_use, 0);
  tr_tensor *a = tr_empty(&g.ctx, TR_F32, 1, SHAPE(100000));
  tr_tensor *d = on_gpu(&g.ctx, a);
  tr_cuda_memory_stats(g.cu, &st);
  assert_true(st.in_use >= 400000 && st.peak == st.in_use);
  void *block = d->storage->data;
  tr_release(d);
  tr_cuda_memory_stats(g.cu, &st);
  assert_int_equal(st.in_use, 0);
  assert_true(st.cached >= 400000);
  tr_tensor *again = on_gpu(&g.ctx, a);
  assert_ptr_equal(again->storage->data, block); /* the cached block, no cudaMalloc */
  tr_cuda_memory_stats(g.cu, &st);
  assert_int_equal(st.cached, 0);
  tr_release(again);
  tr_cuda_trim(g.cu);
  tr_cuda_memory_stats(g.cu, &st);
  assert_true(st.cached == 0 && st.in_use == 0 && st.peak >= 400000);
  tr_release(a);
  gpu_close(&g);
}

/* ---------------------------------------------------------------- training */

static tr_module *mlp(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  tr_sequential_add(ctx, m, tr_linear_new(ctx, 12, 16, true));
  tr_sequential_add(ctx, m, tr_layernorm_new(ctx, 16));
  tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_GELU));
  tr_sequential_add(ctx, m, tr_linear_new(ctx, 16, 6, true)); /* kLabels' 6 classes */
  return m;
}

static tr_module *cnn(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  tr_sequential_add(ctx, m, tr_conv2d_new(ctx, 1, 4, 3, 1, 1, false));
  tr_sequential_add(ctx, m, tr_batchnorm_new(ctx, 4));
  tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU));
  tr_sequential_add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  tr_sequential_add(ctx, m, tr_linear_new(ctx, 4 * 3 * 3, 6, true)); /* kLabels' 6 classes */
  return m;
}

/* steps of training m (on device, or the CPU) on fixed batches x (CPU) with labels. */
static void train(tr_ctx *ctx, tr_module *m, tr_device device, const tr_optim_config *cfg,
                  tr_tensor *x, int steps, bool clip) {
  assert_int_equal(tr_module_to_device(ctx, m, device), NAS_OK);
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(m, false, &ps, &ctx->err), NAS_OK);
  tr_optim *opt = tr_optim_new(ctx, cfg, ps.items, ps.n);
  tr_tensor *xd = tr_to_device(ctx, x, device);
  for (int s = 0; s < steps; s++) {
    tr_tensor *logits = tr_module_forward(ctx, m, xd);
    if (!logits) fail_msg("forward: %s", ctx->err.msg);
    tr_tensor *loss = tr_cross_entropy(ctx, logits, kLabels);
    if (!loss) fail_msg("loss: %s", ctx->err.msg);
    tr_optim_zero_grad(opt);
    if (tr_backward(ctx, loss, NULL, false)) fail_msg("backward: %s", ctx->err.msg);
    if (clip) assert_int_equal(tr_clip_grad_norm(ctx, ps.items, ps.n, 0.5, NULL), NAS_OK);
    assert_int_equal(tr_optim_step(ctx, opt), NAS_OK);
    tr_release(loss);
    tr_release(logits);
  }
  assert_int_equal(tr_module_to_device(ctx, m, TR_DEVICE_CPU), NAS_OK); /* and back */
  tr_release(xd);
  tr_optim_free(opt);
  tr_param_list_free(&ps);
}

/* The same model (same seed) trained on the CPU and on the device ends with the same
 * parameters and buffers. */
static void check_training(tr_module *(*build)(tr_ctx *), const int64_t *xshape, int xdim,
                           const tr_optim_config *cfg, bool clip) {
  gpu g;
  gpu_open(&g, 11);
  tr_ctx cpu;
  tr_ctx_init(&cpu, 11);
  tr_module *mc = build(&cpu), *mg = build(&g.ctx);
  tr_tensor *x = tr_rand(&cpu, TR_F32, xdim, xshape, -1, 1);
  train(&cpu, mc, TR_DEVICE_CPU, cfg, x, 4, clip);
  train(&g.ctx, mg, TR_DEVICE_CUDA(0), cfg, x, 4, clip);
  tr_param_list pc = {0}, pg = {0};
  assert_int_equal(tr_module_parameters(mc, true, &pc, &cpu.err), NAS_OK);
  assert_int_equal(tr_module_parameters(mg, true, &pg, &cpu.err), NAS_OK);
  for (size_t i = 0; i < pc.n; i++) {
    assert_int_equal(tr_tensor_device(pg.items[i]).kind, TR_CPU);
    double d = max_rel_diff(pg.items[i], pc.items[i]);
    print_message("%-16s %.2e\n", pc.names[i], d);
    assert_true(d <= 1e-4);
  }
  tr_param_list_free(&pc);
  tr_param_list_free(&pg);
  tr_release(x);
  tr_module_free(mc);
  tr_module_free(mg);
  gpu_close(&g);
}

static void mlp_training_steps_match_the_cpu(void **state) {
  (void)state;
  tr_optim_config sgd = {
      .kind = TR_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3};
  check_training(mlp, SHAPE(8, 12), 2, &sgd, true);
  tr_optim_config adamw = {.kind = TR_ADAMW, .lr = 0.01, .weight_decay = 0.01};
  check_training(mlp, SHAPE(8, 12), 2, &adamw, false);
}

static void cnn_training_steps_match_the_cpu(void **state) {
  (void)state;
  tr_optim_config adam = {.kind = TR_ADAM, .lr = 0.01};
  check_training(cnn, SHAPE(8, 1, 6, 6), 4, &adam, false);
}

/* ---------------------------------------------------------------- mixed precision */

static void bf16_autocast_linear_stays_close_to_float32(void **state) {
  (void)state;
  gpu g;
  gpu_open(&g, 13);
  tr_ctx *ctx = &g.ctx;
  tr_tensor *x = tr_rand(ctx, TR_F32, 2, SHAPE(32, 64), -1, 1);
  tr_tensor *w = tr_rand(ctx, TR_F32, 2, SHAPE(16, 64), -0.2, 0.2);
  tr_set_requires_grad(w, true);
  tr_tensor *xd = on_gpu(ctx, x), *wd = on_gpu(ctx, w);
  tr_tensor *full = tr_linear(ctx, xd, wd, NULL);
  tr_cuda_set_autocast(g.cu, true);
  tr_tensor *mixed = tr_linear(ctx, xd, wd, NULL);
  assert_non_null(mixed);
  assert_int_equal(mixed->dtype, TR_F32); /* float32 out of bf16 operands */
  tr_tensor *s = tr_sum(ctx, mixed, 0, NULL, false);
  assert_int_equal(tr_backward(ctx, s, NULL, false), NAS_OK);
  assert_int_equal(w->grad->dtype, TR_F32); /* the master weight's gradient */
  tr_cuda_set_autocast(g.cu, false);
  double d = max_rel_diff(mixed, full);
  print_message("bf16 vs f32 linear: %.2e\n", d);
  assert_true(d > 0 && d < 3e-2); /* bf16 has 8 bits of mantissa */
  tr_tensor *b16 = tr_to_dtype(ctx, xd, TR_BF16);
  assert_int_equal(b16->dtype, TR_BF16);
  assert_true(fabs(tr_get(b16, 7) - tr_get(x, 7)) < 1e-2);
  assert_null(tr_relu(ctx, b16)); /* bf16 is for GEMM operands only */
  assert_non_null(strstr(ctx->err.msg, "bfloat16"));
  tr_release(b16);
  tr_release(s);
  tr_release(mixed);
  tr_release(full);
  tr_release(xd);
  tr_release(wd);
  tr_release(w);
  tr_release(x);
  gpu_close(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_count_names_the_reason_when_there_is_none),
      cmocka_unit_test(engine_refuses_to_start_without_a_device),
      cmocka_unit_test(to_device_without_an_engine_fails_naming_the_reason),
      cmocka_unit_test(cpu_tensors_stay_on_the_cpu_and_compute_as_before),
      cmocka_unit_test(bfloat16_is_refused_on_the_cpu),
      cmocka_unit_test(every_op_and_its_gradient_match_the_cpu),
      cmocka_unit_test(in_place_writes_and_reads_work_on_the_device),
      cmocka_unit_test(inputs_on_different_devices_are_an_error),
      cmocka_unit_test(device_allocator_reuses_blocks_and_counts_bytes),
      cmocka_unit_test(mlp_training_steps_match_the_cpu),
      cmocka_unit_test(cnn_training_steps_match_the_cpu),
      cmocka_unit_test(bf16_autocast_linear_stays_close_to_float32),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
