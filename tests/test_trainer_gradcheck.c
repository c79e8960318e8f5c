/* Gradient checks for every engine op: the gradient backward computes against central
 * differences in float64, with a random upstream gradient so every output element counts.
 * Inputs include broadcast shapes, each reduction axis, and non-contiguous views. */
#include "tests/testutil.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "trainer/trainer.h"

typedef tr_tensor *(*op_fn)(tr_ctx *ctx, tr_tensor **in);

static tr_tensor *leaf(tr_ctx *ctx, int ndim, const int64_t *shape, double lo, double hi) {
  tr_tensor *t = tr_rand(ctx, TR_F64, ndim, shape, lo, hi);
  assert_non_null(t);
  tr_set_requires_grad(t, true);
  return t;
}

/* sum(out * r) in double. */
static double dot(const tr_tensor *out, const tr_tensor *r) {
  double s = 0;
  for (int64_t i = 0; i < out->numel; i++) s += tr_get(out, i) * tr_get(r, i);
  return s;
}

/* f at the current inputs with the generator reset to rng (dropout masks repeat), no graph. */
static double probe(tr_ctx *ctx, op_fn f, tr_tensor **in, const uint64_t rng[4],
                    const tr_tensor *r) {
  memcpy(ctx->rng, rng, sizeof ctx->rng);
  bool prev = tr_set_grad_enabled(ctx, false);
  tr_tensor *out = f(ctx, in);
  assert_non_null(out);
  double v = dot(out, r);
  tr_release(out);
  tr_set_grad_enabled(ctx, prev);
  return v;
}

/* Checks d sum(f(in) * r) / d in against central differences; frees the inputs. */
static void gradcheck(const char *name, tr_ctx *ctx, op_fn f, int n, tr_tensor **in) {
  uint64_t rng[4];
  memcpy(rng, ctx->rng, sizeof rng);
  tr_tensor *out = f(ctx, in);
  if (!out) fail_msg("%s: %s", name, ctx->err.msg);
  tr_ctx rctx;
  tr_ctx_init(&rctx, 99);
  tr_tensor *r = tr_randn(&rctx, TR_F64, out->ndim, out->shape, 1.0);
  assert_int_equal(tr_backward(ctx, out, r, false), NAS_OK);
  tr_release(out);
  const double eps = 1e-6;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    if (!in[i]->requires_grad) continue;
    if (!in[i]->grad) fail_msg("%s: input %d got no gradient", name, i);
    double *x = tr_f64(in[i]);
    for (int64_t j = 0; j < in[i]->numel; j++) {
      double keep = x[j];
      x[j] = keep + eps;
      double up = probe(ctx, f, in, rng, r);
      x[j] = keep - eps;
      double down = probe(ctx, f, in, rng, r);
      x[j] = keep;
      double numeric = (up - down) / (2 * eps), analytic = tr_get(in[i]->grad, j);
      double err = fabs(numeric - analytic) / (1.0 + fabs(numeric));
      if (err > worst) worst = err;
      if (err > 1e-6)
        fail_msg("%s: input %d element %lld: backward %.9g, numeric %.9g", name, i, (long long)j,
                 analytic, numeric);
    }
  }
  print_message("%-28s max rel err %.2e\n", name, worst);
  tr_release(r);
  for (int i = 0; i < n; i++) tr_release(in[i]);
}

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }

/* ---------------------------------------------------------------- elementwise */

static tr_tensor *f_add(tr_ctx *c, tr_tensor **in) { return tr_add(c, in[0], in[1]); }
static tr_tensor *f_sub(tr_ctx *c, tr_tensor **in) { return tr_sub(c, in[0], in[1]); }
static tr_tensor *f_mul(tr_ctx *c, tr_tensor **in) { return tr_mul(c, in[0], in[1]); }
static tr_tensor *f_div(tr_ctx *c, tr_tensor **in) { return tr_div(c, in[0], in[1]); }

static void binary_ops_broadcast_both_ways(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  op_fn fns[] = {f_add, f_sub, f_mul, f_div};
  const char *names[] = {"add", "sub", "mul", "div"};
  for (int k = 0; k < 4; k++) {
    /* (2,3,4) with (4), (3,1) with (1,4), (2,1,4) with (3,1), same shapes */
    tr_tensor *a[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), 0.5, 2), leaf(&ctx, 1, SHAPE(4), 0.5, 2)};
    gradcheck(names[k], &ctx, fns[k], 2, a);
    tr_tensor *b[] = {leaf(&ctx, 2, SHAPE(3, 1), 0.5, 2), leaf(&ctx, 2, SHAPE(1, 4), 0.5, 2)};
    gradcheck(names[k], &ctx, fns[k], 2, b);
    tr_tensor *c[] = {leaf(&ctx, 3, SHAPE(2, 1, 4), 0.5, 2), leaf(&ctx, 2, SHAPE(3, 1), 0.5, 2)};
    gradcheck(names[k], &ctx, fns[k], 2, c);
    tr_tensor *d[] = {leaf(&ctx, 2, SHAPE(3, 4), 0.5, 2), leaf(&ctx, 2, SHAPE(3, 4), 0.5, 2)};
    gradcheck(names[k], &ctx, fns[k], 2, d);
  }
}

static tr_tensor *f_relu(tr_ctx *c, tr_tensor **in) { return tr_relu(c, in[0]); }
static tr_tensor *f_gelu(tr_ctx *c, tr_tensor **in) { return tr_gelu(c, in[0]); }
static tr_tensor *f_tanh(tr_ctx *c, tr_tensor **in) { return tr_tanh(c, in[0]); }
static tr_tensor *f_sigmoid(tr_ctx *c, tr_tensor **in) { return tr_sigmoid(c, in[0]); }
static tr_tensor *f_exp(tr_ctx *c, tr_tensor **in) { return tr_exp(c, in[0]); }
static tr_tensor *f_log(tr_ctx *c, tr_tensor **in) { return tr_log(c, in[0]); }
static tr_tensor *f_scale(tr_ctx *c, tr_tensor **in) { return tr_scale(c, in[0], -2.5); }
static tr_tensor *f_dropout(tr_ctx *c, tr_tensor **in) { return tr_dropout(c, in[0], 0.3, true); }

static void unary_ops_match_central_differences(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  op_fn fns[] = {f_gelu, f_tanh, f_sigmoid, f_exp, f_scale, f_dropout};
  const char *names[] = {"gelu", "tanh", "sigmoid", "exp", "scale", "dropout"};
  for (int k = 0; k < 6; k++) {
    tr_tensor *a[] = {leaf(&ctx, 2, SHAPE(5, 7), -2, 2)};
    gradcheck(names[k], &ctx, fns[k], 1, a);
  }
  tr_tensor *pos[] = {leaf(&ctx, 2, SHAPE(5, 7), 0.2, 3)};
  gradcheck("log", &ctx, f_log, 1, pos);
  /* relu away from its kink at 0, where differences are not defined */
  tr_tensor *r[] = {leaf(&ctx, 2, SHAPE(5, 7), -2, 2)};
  for (int64_t i = 0; i < r[0]->numel; i++)
    if (fabs(tr_f64(r[0])[i]) < 0.05) tr_f64(r[0])[i] = 0.5;
  gradcheck("relu", &ctx, f_relu, 1, r);
}

/* ---------------------------------------------------------------- reductions */

static int g_axis;
static tr_tensor *f_sum_axis(tr_ctx *c, tr_tensor **in) {
  return tr_sum(c, in[0], 1, &g_axis, false);
}
static tr_tensor *f_mean_axis(tr_ctx *c, tr_tensor **in) {
  return tr_mean(c, in[0], 1, &g_axis, true);
}
static tr_tensor *f_sum_two(tr_ctx *c, tr_tensor **in) {
  return tr_sum(c, in[0], 2, (int[]){0, 2}, false);
}
static tr_tensor *f_mean_all(tr_ctx *c, tr_tensor **in) {
  return tr_mean(c, in[0], 0, NULL, false);
}
static tr_tensor *f_softmax(tr_ctx *c, tr_tensor **in) { return tr_softmax(c, in[0], g_axis); }
static tr_tensor *f_log_softmax(tr_ctx *c, tr_tensor **in) {
  return tr_log_softmax(c, in[0], g_axis);
}

/* The axis is a file-level variable only because op_fn takes no closure; tests run in
 * sequence within this one binary. */
static void reductions_over_each_axis(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  for (g_axis = -1; g_axis < 3; g_axis++) {
    tr_tensor *a[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -1, 1)};
    gradcheck("sum(axis)", &ctx, f_sum_axis, 1, a);
    tr_tensor *b[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -1, 1)};
    gradcheck("mean(axis, keepdim)", &ctx, f_mean_axis, 1, b);
    tr_tensor *s[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -2, 2)};
    gradcheck("softmax(axis)", &ctx, f_softmax, 1, s);
    tr_tensor *l[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -2, 2)};
    gradcheck("log_softmax(axis)", &ctx, f_log_softmax, 1, l);
  }
  tr_tensor *c[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -1, 1)};
  gradcheck("sum(0, 2)", &ctx, f_sum_two, 1, c);
  tr_tensor *d[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -1, 1)};
  gradcheck("mean(all)", &ctx, f_mean_all, 1, d);
}

/* ---------------------------------------------------------------- views and shapes */

static tr_tensor *f_transpose_mul(tr_ctx *c, tr_tensor **in) {
  tr_tensor *t = tr_transpose(c, in[0], 0, 1);
  tr_tensor *out = tr_mul(c, t, in[1]);
  tr_release(t);
  return out;
}
static tr_tensor *f_narrow_tanh(tr_ctx *c, tr_tensor **in) {
  tr_tensor *v = tr_narrow(c, in[0], 1, 1, 2);
  tr_tensor *out = tr_tanh(c, v);
  tr_release(v);
  return out;
}
static tr_tensor *f_reshape_softmax(tr_ctx *c, tr_tensor **in) {
  tr_tensor *t = tr_transpose(c, in[0], 0, 2); /* non-contiguous: reshape must copy */
  tr_tensor *r = tr_reshape(c, t, 2, SHAPE(4, -1));
  tr_tensor *out = tr_softmax(c, r, 1);
  tr_release(t);
  tr_release(r);
  return out;
}
static tr_tensor *f_concat(tr_ctx *c, tr_tensor **in) {
  tr_tensor *t = tr_concat(c, 2, in, 1);
  tr_tensor *out = tr_mul(c, t, t);
  tr_release(t);
  return out;
}
static tr_tensor *f_embedding(tr_ctx *c, tr_tensor **in) {
  return tr_embedding(c, in[0], 5, (int32_t[]){3, 0, 3, 1, 2});
}
static tr_tensor *f_contiguous(tr_ctx *c, tr_tensor **in) {
  tr_tensor *t = tr_transpose(c, in[0], 1, 0);
  tr_tensor *out = tr_contiguous(c, t);
  tr_release(t);
  return out;
}

static void views_and_shapes_pass_gradients_through(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  tr_tensor *a[] = {leaf(&ctx, 2, SHAPE(4, 3), -1, 1), leaf(&ctx, 2, SHAPE(3, 4), -1, 1)};
  gradcheck("transpose*mul", &ctx, f_transpose_mul, 2, a);
  tr_tensor *b[] = {leaf(&ctx, 3, SHAPE(2, 4, 3), -1, 1)};
  gradcheck("narrow", &ctx, f_narrow_tanh, 1, b);
  tr_tensor *c[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -1, 1)};
  gradcheck("transpose+reshape", &ctx, f_reshape_softmax, 1, c);
  tr_tensor *d[] = {leaf(&ctx, 3, SHAPE(2, 2, 3), -1, 1), leaf(&ctx, 3, SHAPE(2, 1, 3), -1, 1)};
  gradcheck("concat", &ctx, f_concat, 2, d);
  tr_tensor *e[] = {leaf(&ctx, 2, SHAPE(4, 3), -1, 1)};
  gradcheck("embedding", &ctx, f_embedding, 1, e);
  tr_tensor *f[] = {leaf(&ctx, 2, SHAPE(3, 5), -1, 1)};
  gradcheck("contiguous", &ctx, f_contiguous, 1, f);
}

/* ---------------------------------------------------------------- matmul and losses */

static tr_tensor *f_matmul(tr_ctx *c, tr_tensor **in) { return tr_matmul(c, in[0], in[1]); }
static tr_tensor *f_matmul_t(tr_ctx *c, tr_tensor **in) {
  tr_tensor *bt = tr_transpose(c, in[1], 0, 1); /* BLAS gets it as a transpose flag */
  tr_tensor *out = tr_matmul(c, in[0], bt);
  tr_release(bt);
  return out;
}
static tr_tensor *f_linear(tr_ctx *c, tr_tensor **in) { return tr_linear(c, in[0], in[1], in[2]); }
static tr_tensor *f_linear_nobias(tr_ctx *c, tr_tensor **in) {
  return tr_linear(c, in[0], in[1], NULL);
}
static tr_tensor *f_cross_entropy(tr_ctx *c, tr_tensor **in) {
  return tr_cross_entropy(c, in[0], (int32_t[]){2, 0, 4, 1});
}
static tr_tensor *f_mse(tr_ctx *c, tr_tensor **in) { return tr_mse_loss(c, in[0], in[1]); }

static void matmul_linear_and_losses_match_central_differences(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_tensor *a[] = {leaf(&ctx, 2, SHAPE(3, 4), -1, 1), leaf(&ctx, 2, SHAPE(4, 5), -1, 1)};
  gradcheck("matmul", &ctx, f_matmul, 2, a);
  tr_tensor *b[] = {leaf(&ctx, 2, SHAPE(3, 4), -1, 1), leaf(&ctx, 2, SHAPE(5, 4), -1, 1)};
  gradcheck("matmul(transposed view)", &ctx, f_matmul_t, 2, b);
  tr_tensor *c[] = {leaf(&ctx, 3, SHAPE(2, 3, 4), -1, 1), leaf(&ctx, 2, SHAPE(5, 4), -1, 1),
                    leaf(&ctx, 1, SHAPE(5), -1, 1)};
  gradcheck("linear (3-d input)", &ctx, f_linear, 3, c);
  tr_tensor *d[] = {leaf(&ctx, 2, SHAPE(3, 4), -1, 1), leaf(&ctx, 2, SHAPE(2, 4), -1, 1)};
  gradcheck("linear (no bias)", &ctx, f_linear_nobias, 2, d);
  tr_tensor *one[] = {leaf(&ctx, 2, SHAPE(1, 4), -1, 1), leaf(&ctx, 2, SHAPE(5, 4), -1, 1),
                      leaf(&ctx, 1, SHAPE(5), -1, 1)};
  gradcheck("linear (one row: gemv)", &ctx, f_linear, 3, one);
  tr_tensor *e[] = {leaf(&ctx, 2, SHAPE(4, 5), -3, 3)};
  gradcheck("cross_entropy", &ctx, f_cross_entropy, 1, e);
  tr_tensor *f[] = {leaf(&ctx, 2, SHAPE(3, 4), -1, 1), leaf(&ctx, 2, SHAPE(3, 4), -1, 1)};
  gradcheck("mse_loss", &ctx, f_mse, 2, f);
}

/* ---------------------------------------------------------------- conv, pool, norms */

static tr_tensor *f_conv_pad(tr_ctx *c, tr_tensor **in) {
  return tr_conv2d(c, in[0], in[1], in[2], 1, 1);
}
static tr_tensor *f_conv_stride(tr_ctx *c, tr_tensor **in) {
  return tr_conv2d(c, in[0], in[1], NULL, 2, 0);
}
static tr_tensor *f_conv_unpadded(tr_ctx *c, tr_tensor **in) {
  return tr_conv2d(c, in[0], in[1], in[2], 1, 0);
}
static tr_tensor *f_max_pool(tr_ctx *c, tr_tensor **in) { return tr_max_pool2d(c, in[0], 2, 2); }
static tr_tensor *f_avg_pool(tr_ctx *c, tr_tensor **in) { return tr_avg_pool2d(c, in[0], 2, 1); }
static tr_tensor *f_layer_norm(tr_ctx *c, tr_tensor **in) {
  return tr_layer_norm(c, in[0], in[1], in[2], 1e-5);
}
static tr_tensor *f_layer_norm_plain(tr_ctx *c, tr_tensor **in) {
  return tr_layer_norm(c, in[0], NULL, NULL, 1e-5);
}
static tr_tensor *f_batch_norm_train(tr_ctx *c, tr_tensor **in) {
  return tr_batch_norm(c, in[0], in[1], in[2], NULL, NULL, true, 0.1, 1e-5);
}
static tr_tensor *f_batch_norm_eval(tr_ctx *c, tr_tensor **in) {
  return tr_batch_norm(c, in[0], in[1], in[2], in[3], in[4], false, 0.1, 1e-5);
}

static void conv_and_pools_match_central_differences(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 6);
  /* Both threading paths: images over OpenMP threads (BLAS on one thread), and one image at
   * a time with BLAS threads (the test process's settings, restored after). */
  int blas_threads = openblas_get_num_threads(), omp_threads = omp_get_max_threads();
  for (int path = 0; path < 2; path++) {
    openblas_set_num_threads(path == 0 ? 1 : 2);
    omp_set_num_threads(2);
    tr_tensor *a[] = {leaf(&ctx, 4, SHAPE(3, 3, 5, 5), -1, 1),
                      leaf(&ctx, 4, SHAPE(4, 3, 3, 3), -1, 1), leaf(&ctx, 1, SHAPE(4), -1, 1)};
    gradcheck("conv2d (pad 1)", &ctx, f_conv_pad, 3, a);
    tr_tensor *b[] = {leaf(&ctx, 4, SHAPE(2, 2, 7, 6), -1, 1),
                      leaf(&ctx, 4, SHAPE(3, 2, 3, 2), -1, 1)};
    gradcheck("conv2d (stride 2, no bias)", &ctx, f_conv_stride, 2, b);
    /* stride 1, no padding: im2col and col2im copy whole runs in fixed-size chunks; output
     * rows of 7 and of 19 (two chunks), images too small for the last rows' chunks */
    tr_tensor *e[] = {leaf(&ctx, 4, SHAPE(2, 3, 5, 9), -1, 1),
                      leaf(&ctx, 4, SHAPE(2, 3, 3, 3), -1, 1), leaf(&ctx, 1, SHAPE(2), -1, 1)};
    gradcheck("conv2d (stride 1, unpadded)", &ctx, f_conv_unpadded, 3, e);
    tr_tensor *f[] = {leaf(&ctx, 4, SHAPE(1, 2, 4, 21), -1, 1),
                      leaf(&ctx, 4, SHAPE(3, 2, 2, 3), -1, 1), leaf(&ctx, 1, SHAPE(3), -1, 1)};
    gradcheck("conv2d (unpadded, wide rows)", &ctx, f_conv_unpadded, 3, f);
  }
  openblas_set_num_threads(blas_threads);
  omp_set_num_threads(omp_threads);
  tr_tensor *c[] = {leaf(&ctx, 4, SHAPE(2, 3, 6, 4), -1, 1)};
  gradcheck("max_pool2d", &ctx, f_max_pool, 1, c);
  /* a last row and column in no window */
  tr_tensor *c_odd[] = {leaf(&ctx, 4, SHAPE(1, 2, 5, 7), -1, 1)};
  gradcheck("max_pool2d (odd sizes)", &ctx, f_max_pool, 1, c_odd);
  tr_tensor *d[] = {leaf(&ctx, 4, SHAPE(2, 3, 4, 5), -1, 1)};
  gradcheck("avg_pool2d (overlapping)", &ctx, f_avg_pool, 1, d);
}

static void norms_match_central_differences(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 7);
  tr_tensor *a[] = {leaf(&ctx, 3, SHAPE(2, 3, 6), -1, 1), leaf(&ctx, 1, SHAPE(6), 0.5, 1.5),
                    leaf(&ctx, 1, SHAPE(6), -1, 1)};
  gradcheck("layer_norm", &ctx, f_layer_norm, 3, a);
  tr_tensor *b[] = {leaf(&ctx, 2, SHAPE(4, 5), -1, 1)};
  gradcheck("layer_norm (no affine)", &ctx, f_layer_norm_plain, 1, b);
  tr_tensor *c[] = {leaf(&ctx, 2, SHAPE(6, 3), -1, 1), leaf(&ctx, 1, SHAPE(3), 0.5, 1.5),
                    leaf(&ctx, 1, SHAPE(3), -1, 1)};
  gradcheck("batch_norm (train, 2-d)", &ctx, f_batch_norm_train, 3, c);
  tr_tensor *d[] = {leaf(&ctx, 4, SHAPE(3, 2, 3, 2), -1, 1), leaf(&ctx, 1, SHAPE(2), 0.5, 1.5),
                    leaf(&ctx, 1, SHAPE(2), -1, 1)};
  gradcheck("batch_norm (train, 4-d)", &ctx, f_batch_norm_train, 3, d);
  tr_tensor *e[] = {leaf(&ctx, 4, SHAPE(3, 2, 3, 2), -1, 1), leaf(&ctx, 1, SHAPE(2), 0.5, 1.5),
                    leaf(&ctx, 1, SHAPE(2), -1, 1), tr_rand(&ctx, TR_F64, 1, SHAPE(2), -1, 1),
                    tr_rand(&ctx, TR_F64, 1, SHAPE(2), 0.5, 2)};
  gradcheck("batch_norm (eval)", &ctx, f_batch_norm_eval, 5, e);
}

/* ---------------------------------------------------------------- mobile and residual blocks */

static tr_tensor *f_depthwise(tr_ctx *c, tr_tensor **in) {
  return tr_conv2d_grouped(c, in[0], in[1], in[2], 1, 1, (int)in[0]->shape[1]);
}
static tr_tensor *f_depthwise_stride(tr_ctx *c, tr_tensor **in) {
  return tr_conv2d_grouped(c, in[0], in[1], NULL, 2, 2, (int)in[0]->shape[1]);
}
static tr_tensor *f_grouped(tr_ctx *c, tr_tensor **in) {
  return tr_conv2d_grouped(c, in[0], in[1], in[2], 1, 0, 2);
}
static tr_tensor *f_gap(tr_ctx *c, tr_tensor **in) { return tr_global_avg_pool2d(c, in[0]); }
static tr_tensor *f_channel_scale(tr_ctx *c, tr_tensor **in) {
  return tr_channel_scale(c, in[0], in[1]);
}
static tr_tensor *f_hardswish(tr_ctx *c, tr_tensor **in) { return tr_hardswish(c, in[0]); }
static tr_tensor *f_hardsigmoid(tr_ctx *c, tr_tensor **in) { return tr_hardsigmoid(c, in[0]); }

static void mobile_block_ops_match_central_differences(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 8);
  tr_tensor *a[] = {leaf(&ctx, 4, SHAPE(2, 3, 5, 6), -1, 1),
                    leaf(&ctx, 4, SHAPE(3, 1, 3, 3), -1, 1), leaf(&ctx, 1, SHAPE(3), -1, 1)};
  gradcheck("depthwise 3x3 (pad 1)", &ctx, f_depthwise, 3, a);
  /* a channel multiplier of 2, a 5x5 kernel, stride 2 over odd sizes */
  tr_tensor *b[] = {leaf(&ctx, 4, SHAPE(2, 2, 7, 5), -1, 1),
                    leaf(&ctx, 4, SHAPE(4, 1, 5, 5), -1, 1)};
  gradcheck("depthwise 5x5 (x2, stride 2)", &ctx, f_depthwise_stride, 2, b);
  tr_tensor *c[] = {leaf(&ctx, 4, SHAPE(2, 4, 4, 5), -1, 1),
                    leaf(&ctx, 4, SHAPE(6, 2, 2, 3), -1, 1), leaf(&ctx, 1, SHAPE(6), -1, 1)};
  gradcheck("grouped conv (2 groups)", &ctx, f_grouped, 3, c);
  tr_tensor *d[] = {leaf(&ctx, 4, SHAPE(2, 3, 4, 5), -1, 1)};
  gradcheck("global_avg_pool2d", &ctx, f_gap, 1, d);
  tr_tensor *e[] = {leaf(&ctx, 4, SHAPE(2, 3, 4, 5), -1, 1), leaf(&ctx, 2, SHAPE(2, 3), -1, 1)};
  gradcheck("channel_scale", &ctx, f_channel_scale, 2, e);
  /* both sides of the kinks at -3 and 3 */
  tr_tensor *f[] = {leaf(&ctx, 2, SHAPE(4, 6), -5, 5)};
  gradcheck("hardswish", &ctx, f_hardswish, 1, f);
  tr_tensor *g[] = {leaf(&ctx, 2, SHAPE(4, 6), -5, 5)};
  gradcheck("hardsigmoid", &ctx, f_hardsigmoid, 1, g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(binary_ops_broadcast_both_ways),
      cmocka_unit_test(unary_ops_match_central_differences),
      cmocka_unit_test(reductions_over_each_axis),
      cmocka_unit_test(views_and_shapes_pass_gradients_through),
      cmocka_unit_test(matmul_linear_and_losses_match_central_differences),
      cmocka_unit_test(conv_and_pools_match_central_differences),
      cmocka_unit_test(norms_match_central_differences),
      cmocka_unit_test(mobile_block_ops_match_central_differences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
