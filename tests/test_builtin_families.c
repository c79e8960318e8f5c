/* The residual model families of built-in trials (builtin/models.c): ResNet and MobileNet
 * counts against counts done by hand, the block structure their parameter names show,
 * forward shapes in training and inference, a short training run on scikit-learn's digits
 * (tests/data) that learns, and bin/nas searching each family with every final metric
 * (params, FLOPs, latency p50/p99) stored as for mlp and cnn. */
#include <math.h>

#include "builtin/builtin.h"
#include "metrics/metrics.h"
#include "tests/e2e.h"
#include "trainer/trainer.h"

static const tr_input_shape digits_shape = {1, 8, 8};

/* A ResNet: stem 1→4; stage 1, one block 4→4 (identity shortcut); stage 2, one block 4→8
 * with stride 2 (1×1 projection). */
static const tr_resnet_config small_resnet = {.stages = 2, .blocks = {1, 1}, .channels = {4, 8}};

/* A MobileNet: stem 1→4; stage 1, expansion 1, 3×3, residual; stage 2, 4→8 with expansion
 * 2, 5×5 stride 2 and squeeze-and-excitation (no residual: the shape changes). */
static const tr_mobilenet_config small_mobilenet = {.stages = 2,
                                                    .blocks = {1, 1},
                                                    .channels = {4, 8},
                                                    .expansion = {1, 2},
                                                    .kernel = {3, 5},
                                                    .se = {false, true},
                                                    .activation = TR_HARDSWISH};

static tr_model build(tr_ctx *ctx, bool resnet, const void *cfg, tr_input_shape in) {
  tr_model m;
  int rc = resnet ? tr_resnet_build(ctx, cfg, in, 10, &m) : tr_mobilenet_build(ctx, cfg, in, 10, &m);
  if (rc) fail_msg("%s: %s", resnet ? "resnet" : "mobilenet", ctx->err.msg);
  assert_int_equal(m.params, tr_module_param_count(m.module));
  return m;
}

/* Whether m has a parameter called name. */
static bool has_param(tr_model *m, const char *name) {
  tr_param_list list = {0};
  nas_err err;
  assert_int_equal(tr_module_parameters(m->module, false, &list, &err), NAS_OK);
  bool found = false;
  for (size_t i = 0; i < list.n; i++) found = found || strcmp(list.names[i], name) == 0;
  tr_param_list_free(&list);
  return found;
}

static void resnet_counts_match_hand_counts(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_model m = build(&ctx, true, &small_resnet, digits_shape);
  /* stem: 3x3 1→4 (no bias) + BN(4). Block 1: two 3x3 4→4 + two BN(4). Block 2: 3x3 4→8,
   * 3x3 8→8, 1x1 4→8, three BN(8). Head: 8→10 with bias. */
  int64_t stem = 36 + 8, block1 = 144 + 8 + 144 + 8, block2 = 288 + 576 + 32 + 3 * 16;
  assert_int_equal(m.params, stem + block1 + block2 + 90);
  assert_int_equal(m.buffers, 8 + 16 + 48);
  /* 8x8 maps until stage 2's stride: (8 + 2 - 3) / 2 + 1 = 4, so 4x4 there. */
  assert_int_equal(m.flops, 2 * 36 * 64 + 2 * (2 * 144 * 64) + 2 * 288 * 16 + 2 * 576 * 16 +
                                2 * 32 * 16 + (2 * 80 + 10));
  /* Children: 0 conv, 1 BN, 2 ReLU, 3 block 1, 4 ReLU, 5 block 2, ... */
  assert_true(has_param(&m, "3.0.0.weight"));
  assert_false(has_param(&m, "3.1.0.weight")); /* identity shortcut */
  assert_true(has_param(&m, "5.1.0.weight"));  /* projection */
  tr_model_free(&m);
}

static void mobilenet_counts_match_hand_counts(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  tr_model m = build(&ctx, false, &small_mobilenet, digits_shape);
  /* stem 36 + BN 8. Block 1 (E = 4): depthwise 3x3 4·9, BN 8, 1x1 4→4 16, BN 8. Block 2
   * (E = 8): 1x1 4→8 32, BN 16, depthwise 5x5 8·25, BN 16, SE 8→2→8 with biases (18 + 24),
   * 1x1 8→8 64, BN 16. Head 8→10 with bias. */
  int64_t block1 = 36 + 8 + 16 + 8, block2 = 32 + 16 + 200 + 16 + 18 + 24 + 64 + 16;
  assert_int_equal(m.params, 44 + block1 + block2 + 90);
  assert_int_equal(m.buffers, 8 + 16 + 48);
  /* Stage 2's depthwise conv runs at stride 2: (8 + 4 - 5) / 2 + 1 = 4. */
  assert_int_equal(m.flops, 2 * 36 * 64 + (2 * 36 * 64 + 2 * 16 * 64) +
                                (2 * 32 * 64 + 2 * 200 * 16 + (2 * 16 + 2) + (2 * 16 + 8) +
                                 2 * 64 * 16) +
                                (2 * 80 + 10));
  /* Children: 0 conv, 1 BN, 2 act, 3 block 1 (residual: body 3.0), then block 2 inline:
   * 4 conv, 5 BN, 6 act, 7 depthwise, 8 BN, 9 act, 10 SE (gate 10.0: GAP, linear, ...). */
  assert_true(has_param(&m, "3.0.0.weight"));
  assert_true(has_param(&m, "7.weight"));
  assert_true(has_param(&m, "10.0.1.weight"));
  tr_model_free(&m);
}

static void builds_reject_what_they_cannot_make(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_model m;
  tr_mobilenet_config even = small_mobilenet;
  even.kernel[1] = 4;
  assert_int_equal(tr_mobilenet_build(&ctx, &even, digits_shape, 10, &m), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "mobilenet: stage 2"));
  assert_null(m.module);
  tr_mobilenet_config gelu = small_mobilenet;
  gelu.activation = TR_GELU;
  assert_int_equal(tr_mobilenet_build(&ctx, &gelu, digits_shape, 10, &m), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "relu or hardswish"));
  tr_resnet_config empty = small_resnet;
  empty.blocks[1] = 0;
  assert_int_equal(tr_resnet_build(&ctx, &empty, digits_shape, 10, &m), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "resnet: stage 2 has no block"));
}

/* One row of 10 class scores per example, the same with and without a graph (inference
 * takes other, fused paths through Sequential). Both families, with relu and with hard-swish, on 28x28. */
static void families_run_forward_in_both_modes(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  tr_resnet_config rcfg = {.stages = 3, .blocks = {2, 1, 1}, .channels = {4, 8, 8}, .dropout = 0.1};
  tr_mobilenet_config mcfg = small_mobilenet;
  mcfg.stages = 3;
  mcfg.blocks[2] = 2, mcfg.channels[2] = 8, mcfg.expansion[2] = 3, mcfg.kernel[2] = 3;
  mcfg.se[2] = true;
  for (int k = 0; k < 3; k++) {
    if (k == 2) mcfg.activation = TR_RELU;
    tr_model m = k == 0 ? build(&ctx, true, &rcfg, (tr_input_shape){1, 28, 28})
                        : build(&ctx, false, &mcfg, (tr_input_shape){1, 28, 28});
    tr_tensor *x = tr_randn(&ctx, TR_F32, 4, (int64_t[]){3, 1, 28, 28}, 1.0), *y[2];
    tr_module_train(m.module, false);
    for (int grad = 0; grad < 2; grad++) {
      tr_set_grad_enabled(&ctx, grad);
      y[grad] = tr_module_forward(&ctx, m.module, x);
      if (!y[grad]) fail_msg("forward: %s", ctx.err.msg);
      assert_int_equal(y[grad]->ndim, 2);
      assert_int_equal(y[grad]->shape[0], 3);
      assert_int_equal(y[grad]->shape[1], 10);
    }
    for (int64_t i = 0; i < 30; i++) assert_true(fabs(tr_get(y[0], i) - tr_get(y[1], i)) < 1e-5);
    tr_release(y[0]);
    tr_release(y[1]);
    tr_release(x);
    tr_model_free(&m);
  }
}

/* ---- learning ---- */

typedef struct {
  double first_loss, last_loss;
} losses;

static int record_loss(void *arg, int epoch, double train_loss, double val_accuracy,
                       nas_err *err) {
  (void)val_accuracy;
  (void)err;
  losses *l = arg;
  if (epoch == 1) l->first_loss = train_loss;
  l->last_loss = train_loss;
  return NAS_OK;
}

/* 600 training and 300 validation digits, 8 epochs of Adam: the loss goes down and the
 * validation accuracy is far above chance (0.1). */
static void families_learn_digits(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  nas_err err;
  tr_named_dataset nd;
  const char *const dirs[] = {"tests/data", NULL};
  if (tr_named_dataset_load(&ctx, "digits", dirs, &nd, &err)) fail_msg("%s", err.msg);
  tr_dataset train, val;
  assert_int_equal(tr_dataset_split(&ctx, &nd.train, 0.2, 7, &train, &val), NAS_OK);
  assert_int_equal(tr_dataset_truncate(&ctx, &train, 600, &err), NAS_OK);
  assert_int_equal(tr_dataset_truncate(&ctx, &val, 300, &err), NAS_OK);
  tr_dataset *const parts[] = {&train, &val};
  assert_int_equal(tr_standardize(&train, parts, 2, NULL, &err), NAS_OK);
  tr_mobilenet_config relu_mobilenet = small_mobilenet;
  relu_mobilenet.activation = TR_RELU;
  const void *cfgs[] = {&small_resnet, &small_mobilenet, &relu_mobilenet};
  for (int k = 0; k < 3; k++) {
    tr_model m = build(&ctx, k == 0, cfgs[k], digits_shape);
    losses l = {0, 0};
    tr_fit_config fit = {.epochs = 8,
                         .batch_size = 32,
                         .optim = {.kind = TR_ADAM, .lr = 0.005},
                         .schedule = TR_LR_CONSTANT,
                         .shuffle_seed = 3,
                         .on_epoch = record_loss,
                         .arg = &l};
    double accuracy = 0;
    if (tr_fit(&ctx, m.module, &train, &val, &fit, &accuracy, &err)) fail_msg("%s", err.msg);
    print_message("%s: loss %.3f -> %.3f, validation accuracy %.3f\n",
                  k == 0 ? "resnet" : "mobilenet", l.first_loss, l.last_loss, accuracy);
    assert_true(l.last_loss < l.first_loss);
    assert_true(accuracy > 0.5);
    tr_model_free(&m);
  }
  tr_dataset_free(&train);
  tr_dataset_free(&val);
  tr_named_dataset_free(&nd);
}

/* ---- end to end ---- */

/* Runs a 2-trial random search over `params` (YAML lines) of model on digits and checks
 * every trial's final metrics; 4 epochs on 400 examples put accuracy well above chance. */
static void search_family(fixture *f, const char *model, const char *params) {
  char *text, *out;
  assert_true(asprintf(&text,
                       "name: %s\n"
                       "seed: 4\n"
                       "parameters:\n"
                       "  lr: {type: float, low: 0.003, high: 0.01, log: true}\n"
                       "%s"
                       "objectives:\n"
                       "  - {name: accuracy, goal: maximize}\n"
                       "  - {name: params, goal: minimize}\n"
                       "trial:\n"
                       "  builtin: {model: %s, dataset: digits, epochs: 4, batch_size: 32, limit_train: 400, "
                       "stages: 2, channels: 4, channels2: 8}\n"
                       "  timeout: 2m\n"
                       "budget: {trials: 2, parallel: 1}\n"
                       "optimizer: {type: random}\n",
                       model, params, model) > 0);
  char *spec = test_write(f->dir, "family.yaml", text);
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  free(out);
  json_t *rows = trials_json(f, model);
  assert_int_equal(count_status(rows, "completed"), 2);
  for (size_t i = 0; i < 2; i++) {
    json_t *trial = json_array_get(rows, i);
    print_message("%s: accuracy %.3f, %g params\n", model, num(trial, METRIC_ACCURACY),
                  num(trial, METRIC_PARAMS));
    assert_true(num(trial, METRIC_ACCURACY) > 0.3);
    assert_true(num(trial, METRIC_PARAMS) > 0);
    assert_true(num(trial, METRIC_FLOPS) > num(trial, METRIC_PARAMS));
    assert_true(num(trial, METRIC_LATENCY_P50) > 0);
    assert_true(num(trial, METRIC_LATENCY_P50) <= num(trial, METRIC_LATENCY_P99));
    assert_true(num(trial, METRIC_MODEL_BYTES) > 4 * num(trial, METRIC_PARAMS));
  }
  json_decref(rows);
  free(spec);
  free(text);
}

static void nas_searches_resnet_and_mobilenet_spaces(void **state) {
  fixture *f = *state;
  search_family(f, "resnet", "  blocks1: {type: int, low: 1, high: 2}\n");
  search_family(f, "mobilenet",
                "  kernel2: {type: categorical, choices: [3, 5]}\n"
                "  se2: {type: categorical, choices: [true, false]}\n"
                "  expansion: {type: int, low: 1, high: 4}\n"
                "  activation: {type: categorical, choices: [relu, hardswish]}\n");
}

/* The example search spaces load, each with the family it names. */
static void example_specs_load(void **state) {
  (void)state;
  const char *const files[][2] = {{"examples/resnet-nas.yaml", "resnet"},
                                  {"examples/mobile-nas.yaml", "mobilenet"}};
  for (size_t i = 0; i < 2; i++) {
    spec *s;
    nas_err err;
    if (spec_load(files[i][0], &s, &err)) fail_msg("%s", err.msg);
    assert_string_equal(s->trial.builtin->model, files[i][1]);
    spec_free(s);
  }
}

/* mobilenet on a fixed device: cuda is refused before anything runs, GPU or not: its
 * depthwise convolutions and hard-swish are CPU only. */
static void mobilenet_on_cuda_is_refused_at_the_start(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "gpu.yaml",
                          "name: gpu\n"
                          "parameters:\n  channels: {type: int, low: 4, high: 8}\n"
                          "objectives: [{name: accuracy, goal: maximize}]\n"
                          "trial:\n  builtin: {model: mobilenet, dataset: digits, device: cuda}\n"
                          "budget: {trials: 1}\n"),
       *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 1);
  assert_non_null(strstr(out, "mobilenet's depthwise convolutions and hard-swish run on the cpu"));
  free(out);
  free(spec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resnet_counts_match_hand_counts),
      cmocka_unit_test(mobilenet_counts_match_hand_counts),
      cmocka_unit_test(builds_reject_what_they_cannot_make),
      cmocka_unit_test(families_run_forward_in_both_modes),
      cmocka_unit_test(families_learn_digits),
      cmocka_unit_test(example_specs_load),
      cmocka_unit_test_setup_teardown(nas_searches_resnet_and_mobilenet_spaces, setup, teardown),
      cmocka_unit_test_setup_teardown(mobilenet_on_cuda_is_refused_at_the_start, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
