/* Forward values of the engine's ops against PyTorch 1.13's (float64, fixed inputs), in
 * the manner of llm.c's tests: gradient checks prove that backward matches forward, these
 * prove that forward computes what the op is meant to compute. The reference arrays are the
 * output of tests/data/trainer_reference.py (run with /usr/bin/python3 and torch). */
#include "tests/testutil.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }
#define LEN(a) (sizeof(a) / sizeof(a[0]))

/* clang-format off */
static const double ref_relu[] = {
    0.5, 0, 2, 0, 0, 1.5, 0, 3, 1, 0.25, 0, 0};
static const double ref_gelu[] = {
    0.345714009825, -0.13228579703, 1.95459769409, 0, -0.170039444834, 1.39957157698,
    -0.01508426609, 2.99636260792, 0.841191990608, 0.149675350702, -0.154285990175, -0.10042842302};
static const double ref_tanh[] = {
    0.46211715726, -0.848283639958, 0.964027580076, 0, -0.635148952387, 0.905148253645,
    -0.986614298151, 0.995054753687, 0.761594155956, 0.244918662404, -0.46211715726,
    -0.905148253645};
static const double ref_sigmoid[] = {
    0.622459331202, 0.222700138825, 0.880797077978, 0.5, 0.320821300825, 0.817574476194,
    0.0758581800212, 0.952574126822, 0.73105857863, 0.562176500886, 0.377540668798, 0.182425523806};
static const double ref_exp[] = {
    1.6487212707, 0.28650479686, 7.38905609893, 1, 0.472366552741, 4.48168907034, 0.0820849986239,
    20.0855369232, 2.71828182846, 1.28402541669, 0.606530659713, 0.223130160148};
static const double ref_log[] = {
    0, 0.559615787935, 0.916290731874, -0.69314718056, 0.223143551314, 0.69314718056,
    1.09861228867, 1.2527629685, 0.405465108108, -0.287682072452, 0, 0.69314718056};
static const double ref_softmax[] = {
    0.159693550032, 0.0277505779327, 0.715696837782, 0.0968590342528, 0.0188031452874,
    0.17839927538, 0.00326749670587, 0.799530082627, 0.562562043434, 0.26573549316,
    0.125524558845, 0.0461779045611};
static const double ref_log_softmax0[] = {
    -1.07678447504, -3.05042502856, -0.0891036821571, -3.05911389527, -2.32678447504,
    -0.300425028562, -4.58910368216, -0.0591138952728, -0.576784475036, -1.55042502856,
    -2.58910368216, -4.55911389527};
static const double ref_cross_entropy[] = {
    2.46116119492};
static const double ref_linear[] = {
    1.075, -0.95, -0.35, 0.275, -0.425, -0.25};
static const double ref_layer_norm[] = {
    0.341571766094, -0.871032683594, -1.14943059656, -0.536826146875, -0.658242959514,
    0.0824826711915, 1.63807581091, 2.55721154973, 2.02584027242, 0.0365067001216, 0.637866714459,
    -2.83808040146};
static const double ref_batch_norm[] = {
    0.609519962126, -0.830059426624, -0.967498574517, -0.534521720223, -1.9380798485,
    0.392997107411, 1.47696296205, 2.67260860111, 1.62855988638, -0.162937680787, 0.390535612465,
    -2.13808688089};
static const double ref_sum_axis0[] = {
    0.75, 0.5, -1, 1.5};
static const double ref_mean_all[] = {
    0.145833333333};
static const double ref_conv2d[] = {
    -0.744780741875, -2.10571538169, -2.14044410341, -0.123012674188, 1.42111555328,
    3.05588515268, 2.05978695638, -0.977793668259, -1.24215245048, -2.15831458213, 0.525129303576,
    3.13807683194, 0.973656054722, 1.30340003417, -1.08577044382, -2.49386171224, -2.407504958,
    -2.72131198774, -1.02657459623, 0.116487323264, 2.93790410805, 2.35343018793, -0.32371893684,
    -1.45395879341, -2.54106939886, -0.516956013219, 2.23749275569, 2.29667514651, 0.861973066641,
    -0.891660068191, -2.69752378543, -2.30307490997, -1.77052407272, -0.824013482706,
    1.4488420704, 0.940976409185, 3.12290546955, 0.71626008018, -1.82317431862, -0.278226217217,
    -1.44954202797, 2.13973187951, 3.09390508204, 0.559115796656, 0.828821064495, -1.81682943307,
    -1.81254292569, 0.116470708758, -1.20611494984, -2.42727989903, -1.11686467709, 1.36799217713,
    1.55083628649, 2.80356047362, 0.49176666462, -2.499432719, -0.696271229465, -0.70575144887,
    2.08507943602, 3.29604677111, 0.464620170211, -0.0992303328224, -2.09764299729,
    -2.02513352752, -2.78848876002, -1.95228887468, 0.470037315507, 1.12389929617, 2.62901355171,
    0.944971146095, -2.02030942746, -2.46801311604, -0.981576540165, 1.24513168193, 2.90415446875,
    2.15818894549, -0.554067221838, -2.1687642088, -2.71452976537, -1.65449744364, -1.81232980485,
    0.51314865578, 2.40173834625, 0.780393473462, 2.5852535456, -0.891473317176, -2.49572812287,
    -0.0957811910765, 0.0640951329796, 3.01424063925, 2.41437068535, 0.218256352702,
    -0.532213175053, -2.10078547051, -0.823129037615, 0.504275599255};
static const double ref_max_pool[] = {
    0.841470984808, 0.909297426826, 0.989358246623, 0.990607355695, 0.912945250728,
    0.149877209663, 0.270905788308, 0.956375928405, 0.999911860107, 0.963795386284,
    0.850903524534, 0.901788347649, 0.98662759204, 0.670229175843, 0.436164755248, 0.992872648085};
static const double ref_avg_pool[] = {
    -0.218563946291, 0.356997133851, 0.321267712673, 0.024220969603, 0.12507502018,
    -0.364045437644, -0.357664552002, 0.081716277367, -0.0209946113628, 0.340265995404,
    0.363773985329, -0.180733705038, -0.0848636429652, -0.287672475018, -0.339078659487,
    0.264446414719};
static const double ref_bn_running_mean[] = {
    0.025, 0.0166666666667, -0.0333333333333, 0.05};
static const double ref_bn_running_var[] = {
    0.98125, 1.08958333333, 1.40833333333, 1.425};
/* clang-format on */

static const double x_vals[] = {0.5, -1.25, 2.0, 0.0, -0.75, 1.5, -2.5, 3.0, 1.0, 0.25, -0.5, -1.5};
static const double w_vals[] = {0.2, -0.1, 0.4, 0.3, -0.5, 0.6, 0.1, -0.2};
static const double b_vals[] = {0.05, -0.15};
static const double g_vals[] = {1.5, 0.5, -1.0, 2.0}, beta_vals[] = {0.1, -0.2, 0.3, 0.0};
static const int32_t labels[] = {2, 0, 3};

/* Compares out (owned, freed here) with want element by element. */
static void expect(const char *name, tr_ctx *ctx, tr_tensor *out, const double *want, size_t n) {
  if (!out) fail_msg("%s: %s", name, ctx->err.msg);
  assert_int_equal(out->numel, (int64_t)n);
  double worst = 0;
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(tr_get(out, (int64_t)i) - want[i]));
  print_message("%-16s max |diff| %.2e\n", name, worst);
  if (worst > 1e-9) fail_msg("%s differs from PyTorch by %g", name, worst);
  tr_release(out);
}

static tr_tensor *x_tensor(tr_ctx *ctx) {
  return tr_from_data(ctx, TR_F64, 2, SHAPE(3, 4), x_vals);
}

static void elementwise_and_softmax_match_pytorch(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *x = x_tensor(&ctx);
  expect("relu", &ctx, tr_relu(&ctx, x), ref_relu, LEN(ref_relu));
  expect("gelu (tanh)", &ctx, tr_gelu(&ctx, x), ref_gelu, LEN(ref_gelu));
  expect("tanh", &ctx, tr_tanh(&ctx, x), ref_tanh, LEN(ref_tanh));
  expect("sigmoid", &ctx, tr_sigmoid(&ctx, x), ref_sigmoid, LEN(ref_sigmoid));
  expect("exp", &ctx, tr_exp(&ctx, x), ref_exp, LEN(ref_exp));
  double abs_vals[12];
  for (int i = 0; i < 12; i++) abs_vals[i] = fabs(x_vals[i]) + 0.5;
  tr_tensor *pos = tr_from_data(&ctx, TR_F64, 2, SHAPE(3, 4), abs_vals);
  expect("log", &ctx, tr_log(&ctx, pos), ref_log, LEN(ref_log));
  expect("softmax(1)", &ctx, tr_softmax(&ctx, x, 1), ref_softmax, LEN(ref_softmax));
  expect("log_softmax(0)", &ctx, tr_log_softmax(&ctx, x, 0), ref_log_softmax0,
         LEN(ref_log_softmax0));
  expect("sum(0)", &ctx, tr_sum(&ctx, x, 1, (int[]){0}, false), ref_sum_axis0, LEN(ref_sum_axis0));
  expect("mean", &ctx, tr_mean(&ctx, x, 0, NULL, false), ref_mean_all, LEN(ref_mean_all));
  expect("cross_entropy", &ctx, tr_cross_entropy(&ctx, x, labels), ref_cross_entropy,
         LEN(ref_cross_entropy));
  tr_release(pos);
  tr_release(x);
}

static void linear_and_norms_match_pytorch(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  tr_tensor *x = x_tensor(&ctx);
  tr_tensor *w = tr_from_data(&ctx, TR_F64, 2, SHAPE(2, 4), w_vals);
  tr_tensor *b = tr_from_data(&ctx, TR_F64, 1, SHAPE(2), b_vals);
  tr_tensor *g = tr_from_data(&ctx, TR_F64, 1, SHAPE(4), g_vals);
  tr_tensor *beta = tr_from_data(&ctx, TR_F64, 1, SHAPE(4), beta_vals);
  tr_tensor *rm = tr_zeros(&ctx, TR_F64, 1, SHAPE(4)),
            *rv = tr_full(&ctx, TR_F64, 1, SHAPE(4), 1.0);
  expect("linear", &ctx, tr_linear(&ctx, x, w, b), ref_linear, LEN(ref_linear));
  expect("layer_norm", &ctx, tr_layer_norm(&ctx, x, g, beta, 1e-5), ref_layer_norm,
         LEN(ref_layer_norm));
  expect("batch_norm", &ctx, tr_batch_norm(&ctx, x, g, beta, rm, rv, true, 0.1, 1e-5),
         ref_batch_norm, LEN(ref_batch_norm));
  expect("running mean", &ctx, tr_retain(rm), ref_bn_running_mean, LEN(ref_bn_running_mean));
  expect("running var", &ctx, tr_retain(rv), ref_bn_running_var, LEN(ref_bn_running_var));
  tr_release(rm);
  tr_release(rv);
  tr_release(beta);
  tr_release(g);
  tr_release(b);
  tr_release(w);
  tr_release(x);
}

static void conv_and_pools_match_pytorch(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  double img_vals[64], k_vals[54];
  for (int i = 0; i < 64; i++) img_vals[i] = sin((double)i);
  for (int i = 0; i < 54; i++) k_vals[i] = 0.5 * cos((double)i);
  tr_tensor *img = tr_from_data(&ctx, TR_F64, 4, SHAPE(2, 2, 4, 4), img_vals);
  tr_tensor *k = tr_from_data(&ctx, TR_F64, 4, SHAPE(3, 2, 3, 3), k_vals);
  tr_tensor *kb = tr_from_data(&ctx, TR_F64, 1, SHAPE(3), (double[]){0.1, -0.2, 0.3});
  expect("conv2d (pad 1)", &ctx, tr_conv2d(&ctx, img, k, kb, 1, 1), ref_conv2d, LEN(ref_conv2d));
  expect("max_pool2d", &ctx, tr_max_pool2d(&ctx, img, 2, 2), ref_max_pool, LEN(ref_max_pool));
  expect("avg_pool2d", &ctx, tr_avg_pool2d(&ctx, img, 2, 2), ref_avg_pool, LEN(ref_avg_pool));
  tr_release(kb);
  tr_release(k);
  tr_release(img);
}

/* ---------------------------------------------------------------- mobile and residual blocks
 * No PyTorch here to run tests/data/trainer_reference.py for these: the references are
 * independent of the ops' code instead. A grouped convolution is an ordinary one whose
 * weight is zero outside each output's group (torch's definition), so tr_conv2d, pinned to
 * PyTorch above, gives its values; hard-sigmoid and hard-swish are checked at points where
 * torch's formulas give exact binary fractions; pooling and scaling by plain loops here. */

/* out (owned, freed here) against ref's values (borrowed). */
static void expect_same(const char *name, tr_ctx *ctx, tr_tensor *out, const tr_tensor *ref) {
  assert_non_null(ref);
  double *want = malloc(sizeof(double) * (size_t)ref->numel);
  assert_non_null(want);
  for (int64_t i = 0; i < ref->numel; i++) want[i] = tr_get(ref, i);
  expect(name, ctx, out, want, (size_t)ref->numel);
  free(want);
}

/* w (O, C/groups, K, K) as the (O, C, K, K) weight of an ordinary convolution. */
static tr_tensor *block_diagonal(tr_ctx *ctx, const tr_tensor *w, int64_t c, int groups) {
  int64_t o = w->shape[0], cg = c / groups, og = o / groups, kk = w->shape[2] * w->shape[3];
  tr_tensor *full = tr_zeros(ctx, TR_F64, 4, SHAPE(o, c, w->shape[2], w->shape[3]));
  for (int64_t oc = 0; oc < o; oc++)
    for (int64_t ci = 0; ci < cg; ci++)
      for (int64_t k = 0; k < kk; k++)
        tr_f64(full)[(oc * c + oc / og * cg + ci) * kk + k] = tr_f64(w)[(oc * cg + ci) * kk + k];
  return full;
}

static void grouped_conv_case(tr_ctx *ctx, const char *name, tr_tensor *img, int64_t o, int k,
                              int stride, int pad, int groups, bool bias) {
  int64_t c = img->shape[1], n = o * (c / groups) * k * k;
  double *vals = malloc(sizeof(double) * (size_t)n);
  assert_non_null(vals);
  for (int64_t i = 0; i < n; i++) vals[i] = 0.5 * cos((double)i);
  tr_tensor *w = tr_from_data(ctx, TR_F64, 4, SHAPE(o, c / groups, k, k), vals);
  tr_tensor *b = bias ? tr_rand(ctx, TR_F64, 1, SHAPE(o), -1, 1) : NULL;
  tr_tensor *full = block_diagonal(ctx, w, c, groups);
  tr_tensor *ref = tr_conv2d(ctx, img, full, b, stride, pad);
  expect_same(name, ctx, tr_conv2d_grouped(ctx, img, w, b, stride, pad, groups), ref);
  tr_release(ref);
  tr_release(full);
  tr_release(b);
  tr_release(w);
  free(vals);
}

static void mobile_block_ops_match_reference_values(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  double img_vals[2 * 4 * 6 * 5];
  for (int i = 0; i < 240; i++) img_vals[i] = sin((double)i);
  tr_tensor *img = tr_from_data(&ctx, TR_F64, 4, SHAPE(2, 4, 6, 5), img_vals);
  grouped_conv_case(&ctx, "depthwise 3x3", img, 4, 3, 1, 1, 4, true);
  grouped_conv_case(&ctx, "depthwise 5x5 s2", img, 8, 5, 2, 2, 4, false);
  grouped_conv_case(&ctx, "grouped (2)", img, 6, 3, 1, 0, 2, true);

  double means[8], scale_vals[8], scaled[240];
  for (int p = 0; p < 8; p++) {
    means[p] = 0;
    scale_vals[p] = 0.25 * (p - 3);
    for (int j = 0; j < 30; j++) means[p] += img_vals[p * 30 + j] / 30;
    for (int j = 0; j < 30; j++) scaled[p * 30 + j] = img_vals[p * 30 + j] * scale_vals[p];
  }
  expect("global_avg_pool", &ctx, tr_global_avg_pool2d(&ctx, img), means, 8);
  tr_tensor *s = tr_from_data(&ctx, TR_F64, 2, SHAPE(2, 4), scale_vals);
  expect("channel_scale", &ctx, tr_channel_scale(&ctx, img, s), scaled, 240);

  static const double pts[] = {-4, -3, -1.5, 0, 1.5, 3, 4.5};
  static const double hsig[] = {0, 0, 0.25, 0.5, 0.75, 1, 1};
  static const double hswish[] = {0, 0, -0.375, 0, 1.125, 3, 4.5};
  tr_tensor *x = tr_from_data(&ctx, TR_F64, 1, SHAPE(7), pts);
  expect("hardsigmoid", &ctx, tr_hardsigmoid(&ctx, x), hsig, LEN(hsig));
  expect("hardswish", &ctx, tr_hardswish(&ctx, x), hswish, LEN(hswish));
  tr_release(x);
  tr_release(s);
  tr_release(img);
}

/* y, dx and dw of a depthwise convolution large enough to be split over threads (stride 1:
 * the wide layout, a scratch per thread), in a fresh graph; out[0..2] owned. */
static void depthwise_step(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor **out) {
  tr_zero_grad(x);
  tr_zero_grad(w);
  tr_tensor *y = tr_conv2d_grouped(ctx, x, w, NULL, 1, 1, (int)x->shape[1]);
  tr_tensor *r = y ? tr_full(ctx, TR_F64, 4, y->shape, 0.5) : NULL;
  if (!r || tr_backward(ctx, y, r, false)) fail_msg("depthwise: %s", ctx->err.msg);
  out[0] = tr_detach(ctx, y);
  out[1] = tr_contiguous(ctx, x->grad);
  out[2] = tr_contiguous(ctx, w->grad);
  tr_release(r);
  tr_release(y);
}

/* Each plane and each filter is one thread's work, summed in a fixed order: two threads give
 * the same bits as one. */
static void depthwise_on_two_threads_matches_one(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  int blas_threads = openblas_get_num_threads(), omp_threads = omp_get_max_threads();
  openblas_set_num_threads(1);
  tr_tensor *x = tr_randn(&ctx, TR_F64, 4, SHAPE(8, 64, 16, 16), 1.0);
  tr_tensor *w = tr_randn(&ctx, TR_F64, 4, SHAPE(64, 1, 3, 3), 1.0);
  tr_set_requires_grad(x, true);
  tr_set_requires_grad(w, true);
  tr_tensor *one[3], *two[3];
  omp_set_num_threads(1);
  depthwise_step(&ctx, x, w, one);
  omp_set_num_threads(2);
  for (int round = 0; round < 4; round++) { /* the threads run side by side once started */
    depthwise_step(&ctx, x, w, two);
    for (int k = 0; k < 3; k++) {
      assert_int_equal(one[k]->numel, two[k]->numel);
      assert_memory_equal(tr_data(one[k]), tr_data(two[k]),
                          (size_t)one[k]->numel * sizeof(double));
      tr_release(two[k]);
    }
  }
  openblas_set_num_threads(blas_threads);
  omp_set_num_threads(omp_threads);
  for (int k = 0; k < 3; k++) tr_release(one[k]);
  tr_release(w);
  tr_release(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(elementwise_and_softmax_match_pytorch),
      cmocka_unit_test(linear_and_norms_match_pytorch),
      cmocka_unit_test(conv_and_pools_match_pytorch),
      cmocka_unit_test(mobile_block_ops_match_reference_values),
      cmocka_unit_test(depthwise_on_two_threads_matches_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
