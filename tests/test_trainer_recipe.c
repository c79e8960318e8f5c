/* The training recipe of built-in trials: the one-cycle and warmed-up schedules and label
 * smoothing against values computed by hand from PyTorch's definitions (OneCycleLR, the
 * label_smoothing of CrossEntropyLoss), and the epochs-as-budget hook: a run resumed from
 * saved weights ends where an uninterrupted one does. */
#include "tests/testutil.h"

#include <math.h>

#include "builtin/builtin.h"
#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }
#define NEAR(a, b) assert_true(fabs((a) - (b)) < 1e-9)

/* OneCycleLR(max_lr=1, total_steps=8, pct_start=3/8): rise over steps 0-2, fall over 3-7. */
static void one_cycle_follows_pytorch_one_cycle_lr(void **state) {
  (void)state;
  tr_lr_schedule s = {.kind = TR_LR_ONECYCLE, .base_lr = 1.0, .warmup = 3, .total = 5};
  const double want[] = {0.04, 0.52, 1.0, 0.904508879153485, 0.654509879153485,
                         0.3454941208465151, 0.09549512084651508, 4e-06, 4e-06};
  for (int step = 0; step < 9; step++) NEAR(tr_lr_at(&s, step), want[step]);
}

static void cosine_after_warm_up_starts_at_the_base_rate(void **state) {
  (void)state;
  tr_lr_schedule s = {.kind = TR_LR_COSINE, .base_lr = 1.0, .warmup = 2, .total = 4};
  NEAR(tr_lr_at(&s, 0), 0.5);
  NEAR(tr_lr_at(&s, 1), 1.0);
  NEAR(tr_lr_at(&s, 2), 1.0);
  NEAR(tr_lr_at(&s, 3), 0.5 * (1 + cos(M_PI / 4)));
  NEAR(tr_lr_at(&s, 6), 0.0);
}

/* The reference inputs of test_trainer_reference.c: 3 rows of 4 logits, labels 2, 0, 3. */
static const double logits_vals[] = {0.5, -1.25, 2.0, 0.0, -0.75, 1.5, -2.5, 3.0, 1.0, 0.25, -0.5, -1.5};
static const int32_t labels[] = {2, 0, 3};

static void label_smoothing_matches_pytorch_definition(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *logits = tr_from_data(&ctx, TR_F64, 2, SHAPE(3, 4), logits_vals);
  logits->requires_grad = true;
  tr_tensor *plain = tr_cross_entropy_smooth(&ctx, logits, labels, 0);
  NEAR(tr_item(plain), 2.461161194922423);
  tr_tensor *loss = tr_cross_entropy_smooth(&ctx, logits, labels, 0.1);
  NEAR(tr_item(loss), 2.4382445282557565);
  /* d loss / d logits = (softmax - target) / rows, target = 0.9 onehot + 0.1 / 4 */
  assert_int_equal(tr_backward(&ctx, loss, NULL, false), NAS_OK);
  const double want[] = {0.04489785001070274,  0.0009168593108934674, -0.06976772073920523,
                         0.023953011417609017, -0.30206561823751715, 0.051133091793327444,
                         -0.007244167764709466, 0.2581766942088991,  0.17918734781136078,
                         0.08024516438663283,  0.03350818628162491,  -0.29294069847961857};
  for (int i = 0; i < 12; i++) NEAR(tr_get(logits->grad, i), want[i]);
  tr_tensor *quarter = tr_cross_entropy_smooth(&ctx, logits, labels, 0.25);
  NEAR(tr_item(quarter), 2.4038695282557563);
  assert_null(tr_cross_entropy_smooth(&ctx, logits, labels, 1.0));
  assert_non_null(strstr(ctx.err.msg, "label smoothing 1 outside [0, 1)"));
  tr_release(plain), tr_release(loss), tr_release(quarter), tr_release(logits);
}

/* ---- epochs as the budget ---- */

/* 96 images 1x4x4 of two classes that differ in their left half. */
static tr_dataset two_class_images(tr_ctx *ctx) {
  tr_tensor *x = tr_randn(ctx, TR_F32, 4, SHAPE(96, 1, 4, 4), 0.5);
  int32_t *y = malloc(sizeof(int32_t) * 96);
  assert_non_null(y);
  for (int64_t i = 0; i < 96; i++) {
    y[i] = (int32_t)(i % 2);
    for (int64_t p = 0; p < 16; p += 4) tr_f32(x)[i * 16 + p] += y[i] ? 1.5f : -1.5f;
  }
  return (tr_dataset){x, y, 96, 2};
}

typedef struct {
  tr_module *model;
  const char *path;
  int stop_after;
} saver;

/* Saves the weights after epoch stop_after and stops there, as a run cut off would. */
static int save_and_stop(void *arg, int epoch, double loss, double acc, nas_err *err) {
  (void)loss, (void)acc;
  saver *s = arg;
  if (epoch < s->stop_after) return NAS_OK;
  if (tr_module_save(s->model, s->path, err) != NAS_OK) return NAS_ERR;
  return nas_errf(err, "stopped after epoch %d", epoch);
}

static tr_model mlp(tr_ctx *ctx) {
  tr_mlp_config cfg = {.layers = 1, .widths = {8}, .activation = TR_RELU};
  tr_model m;
  assert_int_equal(tr_mlp_build(ctx, &cfg, (tr_input_shape){1, 4, 4}, 2, &m), NAS_OK);
  return m;
}

/* SGD without momentum keeps no state, so resuming from the weights after epoch 2 must
 * give the weights of an uninterrupted 4-epoch run: same schedule position, batch order
 * and augmentation draws. */
static void resumed_fit_ends_where_an_uninterrupted_one_does(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *weights;
  assert_true(asprintf(&weights, "%s/after2.nasw", dir) > 0);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx);
  tr_fit_config cfg = {.epochs = 4, .batch_size = 16, .optim = {.kind = TR_SGD, .lr = 0.1},
                       .schedule = TR_LR_ONECYCLE, .shuffle_seed = 77, .label_smoothing = 0.1,
                       .augment = {.crop_padding = 1, .flip = true}};
  nas_err err;
  double acc_whole = 0, acc_resumed = 0;
  tr_ctx_init(&ctx, 9);
  tr_model whole = mlp(&ctx);
  assert_int_equal(tr_fit(&ctx, whole.module, &data, &data, &cfg, &acc_whole, &err), NAS_OK);
  assert_true(acc_whole > 0.9);
  tr_ctx_init(&ctx, 9);
  tr_model cut = mlp(&ctx);
  saver s = {cut.module, weights, 2};
  tr_fit_config cut_cfg = cfg;
  cut_cfg.on_epoch = save_and_stop, cut_cfg.arg = &s;
  assert_int_equal(tr_fit(&ctx, cut.module, &data, &data, &cut_cfg, NULL, &err), NAS_ERR);
  tr_ctx_init(&ctx, 1234); /* other initial weights: the saved ones replace them */
  tr_model resumed = mlp(&ctx);
  assert_int_equal(tr_module_load(resumed.module, weights, &err), NAS_OK);
  tr_fit_config resume_cfg = cfg;
  resume_cfg.first_epoch = 2;
  assert_int_equal(tr_fit(&ctx, resumed.module, &data, &data, &resume_cfg, &acc_resumed, &err),
                   NAS_OK);
  tr_param_list a = {0}, b = {0};
  assert_int_equal(tr_module_parameters(whole.module, false, &a, &err), NAS_OK);
  assert_int_equal(tr_module_parameters(resumed.module, false, &b, &err), NAS_OK);
  assert_int_equal(a.n, b.n);
  for (size_t i = 0; i < a.n; i++)
    for (int64_t j = 0; j < a.items[i]->numel; j++)
      assert_true(fabs(tr_get(a.items[i], j) - tr_get(b.items[i], j)) < 1e-6);
  NEAR(acc_whole, acc_resumed);
  resume_cfg.first_epoch = 5;
  assert_int_equal(tr_fit(&ctx, resumed.module, &data, &data, &resume_cfg, NULL, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "resuming after epoch 5 of 4"));
  tr_param_list_free(&a), tr_param_list_free(&b);
  tr_model_free(&whole), tr_model_free(&cut), tr_model_free(&resumed);
  tr_dataset_free(&data);
  test_rmtree(dir);
  free(dir), free(weights);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_cycle_follows_pytorch_one_cycle_lr),
      cmocka_unit_test(cosine_after_warm_up_starts_at_the_base_rate),
      cmocka_unit_test(label_smoothing_matches_pytorch_definition),
      cmocka_unit_test(resumed_fit_ends_where_an_uninterrupted_one_does),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
