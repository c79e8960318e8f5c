/* nn modules, weights files, flat parameter buffers, optimisers (against hand-computed and
 * torch-checked steps), learning-rate schedules and gradient clipping. */
#include "tests/testutil.h"

#include <math.h>
#include <zlib.h>

#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }
#define NEAR(a, b) assert_true(fabs((a) - (b)) < 1e-9)

/* ---------------------------------------------------------------- optimisers */

/* Two steps with grad 0.5 on a parameter starting at 1; returns its value after each. */
static void two_steps(const tr_optim_config *cfg, double out[2]) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *p = tr_full(&ctx, TR_F64, 1, SHAPE(1), 1.0);
  tr_set_requires_grad(p, true);
  tr_optim *opt = tr_optim_new(&ctx, cfg, &p, 1);
  assert_non_null(opt);
  for (int s = 0; s < 2; s++) {
    if (!p->grad)
      p->grad = tr_full(&ctx, TR_F64, 1, SHAPE(1), 0.5);
    else
      tr_f64(p->grad)[0] = 0.5;
    assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
    out[s] = tr_item(p);
  }
  tr_optim_free(opt);
  tr_release(p);
}

static void sgd_steps_match_hand_computed_values(void **state) {
  (void)state;
  double v[2];
  /* momentum: buf = 0.5, p = 1 - 0.05; buf = 0.9*0.5 + 0.5 = 0.95, p = 0.95 - 0.095 */
  two_steps(&(tr_optim_config){.kind = TR_SGD, .lr = 0.1, .momentum = 0.9}, v);
  NEAR(v[0], 0.95);
  NEAR(v[1], 0.855);
  /* Nesterov: step along g + 0.9 buf: 0.95 then 0.5 + 0.855 */
  two_steps(&(tr_optim_config){.kind = TR_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true}, v);
  NEAR(v[0], 0.905);
  NEAR(v[1], 0.7695);
  /* weight decay 0.1: g = 0.5 + 0.1 p */
  two_steps(&(tr_optim_config){.kind = TR_SGD, .lr = 0.1, .weight_decay = 0.1}, v);
  NEAR(v[0], 0.94);
  NEAR(v[1], 0.8806);
}

static void adam_and_adamw_steps_match_hand_computed_values(void **state) {
  (void)state;
  double v[2];
  /* bias-corrected moments are exactly g and g^2 under a constant g: each step moves lr */
  two_steps(&(tr_optim_config){.kind = TR_ADAM, .lr = 0.1}, v);
  NEAR(v[0], 0.900000002);
  NEAR(v[1], 0.800000004);
  /* coupled decay (values from torch.optim.Adam in float64) */
  two_steps(&(tr_optim_config){.kind = TR_ADAM, .lr = 0.1, .weight_decay = 0.1}, v);
  NEAR(v[0], 0.9000000016666666);
  NEAR(v[1], 0.8000473404883315);
  /* decoupled: p *= 1 - 0.01 first, then the Adam step */
  two_steps(&(tr_optim_config){.kind = TR_ADAMW, .lr = 0.1, .weight_decay = 0.1}, v);
  NEAR(v[0], 0.890000002);
  NEAR(v[1], 0.78110000398);
}

/* Two parameters at 1: on step 1 only a has a gradient (b is frozen, or in a branch the
 * step did not use), on step 2 both have 0.5. Each counts its own steps, as torch's
 * state['step']: b's first step is its t = 1, where the bias-corrected moments are exactly g
 * and g^2, so it moves lr * g / (|g| + eps) as a's first step did (with one count for all,
 * b's t was 2: m_hat = 0.05 / 0.19, v_hat = 0.00025 / 0.001999, and b went to 0.9256). A
 * training state saved after step 1 keeps the counts: the step after its load is the same. */
static void adam_counts_each_parameters_own_steps(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *path;
  assert_true(asprintf(&path, "%s/state.nast", dir) > 0);
  for (int reload = 0; reload < 2; reload++) {
    tr_ctx ctx;
    tr_ctx_init(&ctx, 1);
    tr_tensor *ps[2] = {tr_full(&ctx, TR_F64, 1, SHAPE(1), 1.0), tr_full(&ctx, TR_F64, 1, SHAPE(1), 1.0)};
    tr_optim_config adam = {.kind = TR_ADAM, .lr = 0.1};
    tr_optim *opt = tr_optim_new(&ctx, &adam, ps, 2);
    assert_non_null(opt);
    ps[0]->grad = tr_full(&ctx, TR_F64, 1, SHAPE(1), 0.5);
    assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
    NEAR(tr_item(ps[0]), 0.900000002);
    NEAR(tr_item(ps[1]), 1.0);
    nas_err err;
    if (reload) {
      assert_int_equal(tr_train_state_save(&ctx, opt, NULL, path, &err), NAS_OK);
      tr_optim_free(opt);
      opt = tr_optim_new(&ctx, &adam, ps, 2);
      assert_non_null(opt);
      if (tr_train_state_load(&ctx, opt, NULL, path, &err) != NAS_OK) fail_msg("%s", err.msg);
    }
    ps[1]->grad = tr_full(&ctx, TR_F64, 1, SHAPE(1), 0.5);
    assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
    NEAR(tr_item(ps[0]), 0.800000004);
    NEAR(tr_item(ps[1]), 0.900000002);
    tr_optim_free(opt);
    tr_release(ps[0]);
    tr_release(ps[1]);
  }
  test_rmtree(dir);
  free(dir);
  free(path);
}

static void lr_schedules_warm_up_then_decay(void **state) {
  (void)state;
  tr_lr_schedule warm_step = {
      .kind = TR_LR_STEP, .base_lr = 1.0, .warmup = 4, .step_size = 2, .gamma = 0.5};
  NEAR(tr_lr_at(&warm_step, 0), 0.25);
  NEAR(tr_lr_at(&warm_step, 3), 1.0);
  NEAR(tr_lr_at(&warm_step, 5), 1.0);
  NEAR(tr_lr_at(&warm_step, 6), 0.5);
  NEAR(tr_lr_at(&warm_step, 8), 0.25);
  tr_lr_schedule cosine = {.kind = TR_LR_COSINE, .base_lr = 1.0, .total = 10, .min_lr = 0.1};
  NEAR(tr_lr_at(&cosine, 0), 1.0);
  NEAR(tr_lr_at(&cosine, 5), 0.55);
  NEAR(tr_lr_at(&cosine, 10), 0.1);
  NEAR(tr_lr_at(&cosine, 50), 0.1);
}

static void clip_grad_norm_scales_all_grads_jointly(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  tr_tensor *p[2] = {tr_zeros(&ctx, TR_F32, 1, SHAPE(1)), tr_zeros(&ctx, TR_F32, 1, SHAPE(1))};
  p[0]->grad = tr_full(&ctx, TR_F32, 1, SHAPE(1), 3.0);
  p[1]->grad = tr_full(&ctx, TR_F32, 1, SHAPE(1), 4.0);
  double norm;
  assert_int_equal(tr_clip_grad_norm(&ctx, p, 2, 10.0, &norm), NAS_OK);
  NEAR(norm, 5.0); /* under the limit: untouched */
  assert_true(tr_item(p[0]->grad) == 3.0f);
  assert_int_equal(tr_clip_grad_norm(&ctx, p, 2, 1.0, &norm), NAS_OK);
  NEAR(norm, 5.0);
  assert_true(fabs(tr_item(p[0]->grad) - 0.6) < 1e-5 && fabs(tr_item(p[1]->grad) - 0.8) < 1e-5);
  tr_release(p[0]);
  tr_release(p[1]);
}

/* ---------------------------------------------------------------- modules */

/* 4 features in, `outputs` out. */
static tr_module *mlp_to(tr_ctx *ctx, int64_t outputs) {
  tr_module *m = tr_sequential_new(ctx);
  assert_int_equal(tr_sequential_add(ctx, m, tr_linear_new(ctx, 4, 8, true)), NAS_OK);
  assert_int_equal(tr_sequential_add(ctx, m, tr_batchnorm_new(ctx, 8)), NAS_OK);
  assert_int_equal(tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU)), NAS_OK);
  assert_int_equal(tr_sequential_add(ctx, m, tr_dropout_new(ctx, 0.2)), NAS_OK);
  assert_int_equal(tr_sequential_add(ctx, m, tr_linear_new(ctx, 8, outputs, true)), NAS_OK);
  return m;
}

static tr_module *mlp(tr_ctx *ctx) { return mlp_to(ctx, 3); }

static void sequential_names_parameters_like_torch(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_module *m = mlp(&ctx);
  tr_param_list list = {0};
  assert_int_equal(tr_module_parameters(m, true, &list, NULL), NAS_OK);
  const char *want[] = {"0.weight",       "0.bias",        "1.weight", "1.bias",
                        "1.running_mean", "1.running_var", "4.weight", "4.bias"};
  assert_int_equal(list.n, 8);
  for (size_t i = 0; i < list.n; i++) assert_string_equal(list.names[i], want[i]);
  assert_int_equal(tr_module_param_count(m), 4 * 8 + 8 + 8 + 8 + 8 * 3 + 3);
  tr_param_list_free(&list);
  tr_module_free(m);
}

static void cnn_forward_gives_logits_per_example(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  tr_module *m = tr_sequential_new(&ctx);
  tr_sequential_add(&ctx, m, tr_conv2d_new(&ctx, 1, 16, 3, 1, 0, true));
  tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_RELU));
  tr_sequential_add(&ctx, m, tr_pool_new(&ctx, TR_MAXPOOL2D, 2));
  tr_sequential_add(&ctx, m, tr_conv2d_new(&ctx, 16, 32, 3, 1, 0, true));
  tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_RELU));
  tr_sequential_add(&ctx, m, tr_pool_new(&ctx, TR_MAXPOOL2D, 2));
  tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_FLATTEN));
  tr_sequential_add(&ctx, m, tr_linear_new(&ctx, 32 * 5 * 5, 10, true));
  assert_int_equal(tr_module_init(&ctx, m, TR_INIT_KAIMING), NAS_OK);
  tr_tensor *x = tr_randn(&ctx, TR_F32, 4, SHAPE(2, 1, 28, 28), 1.0);
  tr_tensor *y = tr_module_forward(&ctx, m, x);
  assert_non_null(y);
  assert_int_equal(y->ndim, 2);
  assert_int_equal(y->shape[0], 2);
  assert_int_equal(y->shape[1], 10);
  tr_tensor *loss = tr_cross_entropy(&ctx, y, (int32_t[]){3, 7});
  assert_int_equal(tr_backward(&ctx, loss, NULL, false), NAS_OK);
  tr_param_list list = {0};
  tr_module_parameters(m, false, &list, NULL);
  for (size_t i = 0; i < list.n; i++) assert_non_null(list.items[i]->grad);
  tr_param_list_free(&list);
  tr_release(loss);
  tr_release(y);
  tr_release(x);
  tr_module_free(m);
}

static void batchnorm_moves_running_statistics_only_in_training(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_module *bn = tr_batchnorm_new(&ctx, 2);
  tr_tensor *x = tr_from_data(&ctx, TR_F32, 2, SHAPE(2, 2), (float[]){1, 10, 3, 20});
  tr_tensor *y = tr_module_forward(&ctx, bn, x);
  tr_param_list list = {0};
  tr_module_parameters(bn, true, &list, NULL);
  tr_tensor *rm = list.items[2], *rv = list.items[3];
  assert_true(fabs(tr_get(rm, 0) - 0.2) < 1e-6 && fabs(tr_get(rm, 1) - 1.5) < 1e-6);
  /* unbiased batch variance: 2 and 50 */
  assert_true(fabs(tr_get(rv, 0) - (0.9 + 0.1 * 2)) < 1e-6 &&
              fabs(tr_get(rv, 1) - (0.9 + 5)) < 1e-5);
  tr_module_train(bn, false);
  tr_tensor *z = tr_module_forward(&ctx, bn, x);
  assert_true(fabs(tr_get(rm, 0) - 0.2) < 1e-6); /* evaluation leaves them */
  assert_true(fabs(tr_get(z, 0) - (1 - 0.2) / sqrt(1.1 + 1e-5)) < 1e-5);
  tr_param_list_free(&list);
  tr_release(z);
  tr_release(y);
  tr_release(x);
  tr_module_free(bn);
}

/* ---------------------------------------------------------------- weights files */

static tr_tensor *eval_output(tr_ctx *ctx, tr_module *m, tr_tensor *x) {
  tr_module_train(m, false);
  bool prev = tr_set_grad_enabled(ctx, false);
  tr_tensor *y = tr_module_forward(ctx, m, x);
  tr_set_grad_enabled(ctx, prev);
  assert_non_null(y);
  return y;
}

static void save_then_load_restores_weights_and_running_statistics(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 6);
  char *dir = test_tmpdir();
  char *path = nas_asprintf("%s/w.nasw", dir);
  tr_module *a = mlp(&ctx);
  tr_tensor *x = tr_randn(&ctx, TR_F32, 2, SHAPE(5, 4), 1.0);
  tr_release(tr_module_forward(&ctx, a, x)); /* moves the running statistics */
  nas_err err = {{0}};
  assert_int_equal(tr_module_save(a, path, &err), NAS_OK);
  tr_ctx other;
  tr_ctx_init(&other, 7);
  tr_module *b = mlp(&other);
  tr_tensor *ya = eval_output(&ctx, a, x), *yb = eval_output(&ctx, b, x);
  assert_true(fabs(tr_get(ya, 0) - tr_get(yb, 0)) > 1e-6);
  tr_release(yb);
  assert_int_equal(tr_module_load(b, path, &err), NAS_OK);
  yb = eval_output(&ctx, b, x);
  for (int64_t i = 0; i < ya->numel; i++) assert_true(tr_get(ya, i) == tr_get(yb, i));
  tr_release(ya);
  tr_release(yb);
  tr_release(x);
  tr_module_free(a);
  tr_module_free(b);
  test_rmtree(dir);
  free(path);
  free(dir);
}

static void corrupt_truncated_or_mismatched_weights_are_rejected(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 8);
  char *dir = test_tmpdir();
  char *path = nas_asprintf("%s/w.nasw", dir);
  tr_module *a = mlp(&ctx);
  nas_err err = {{0}};
  assert_int_equal(tr_module_save(a, path, &err), NAS_OK);
  char *data;
  size_t len;
  assert_int_equal(nas_read_file(path, &data, &len, &err), NAS_OK);
  data[len / 2] ^= 0x10; /* one flipped bit in the middle of the weights */
  assert_int_equal(nas_write_file_atomic(path, data, len, &err), NAS_OK);
  assert_int_equal(tr_module_load(a, path, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "checksum"));
  data[len / 2] ^= 0x10;
  assert_int_equal(nas_write_file_atomic(path, data, len - 9, &err), NAS_OK);
  assert_int_equal(tr_module_load(a, path, &err), NAS_ERR);
  tr_module *wider = tr_sequential_new(&ctx);
  tr_sequential_add(&ctx, wider, tr_linear_new(&ctx, 4, 9, true));
  assert_int_equal(nas_write_file_atomic(path, data, len, &err), NAS_OK);
  assert_int_equal(tr_module_load(wider, path, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "tensors"));
  free(data);
  tr_module_free(wider);
  tr_module_free(a);
  test_rmtree(dir);
  free(path);
  free(dir);
}

/* A file whose last tensor does not fit the model is refused before anything is written:
 * the model keeps every weight it had (the first records used to be loaded already). */
static void weights_that_do_not_fit_leave_the_model_as_it_was(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 8);
  char *dir = test_tmpdir();
  char *path = nas_asprintf("%s/w.nasw", dir);
  tr_module *a = mlp(&ctx), *b = mlp_to(&ctx, 5); /* names alike, the last layer wider */
  nas_err err = {{0}};
  assert_int_equal(tr_module_save(a, path, &err), NAS_OK);
  tr_param_list before = {0};
  assert_int_equal(tr_module_parameters(b, true, &before, &err), NAS_OK);
  float kept[4 * 8];
  memcpy(kept, tr_f32(before.items[0]), sizeof kept);
  uint64_t version = before.items[0]->storage->version;
  assert_int_equal(tr_module_load(b, path, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "4.weight"));
  assert_memory_equal(tr_f32(before.items[0]), kept, sizeof kept);
  assert_int_equal(before.items[0]->storage->version, version);
  tr_param_list_free(&before);
  tr_module_free(a);
  tr_module_free(b);
  test_rmtree(dir);
  free(path);
  free(dir);
}

/* Writes head (n bytes) to path sealed with its CRC-32, as a weights file is. */
static void put_sealed(const char *path, const char *head, size_t n) {
  unsigned char bytes[64];
  assert_true(n + 4 <= sizeof bytes);
  memcpy(bytes, head, n);
  uint32_t crc = (uint32_t)crc32(0L, bytes, (uInt)n);
  for (int i = 0; i < 4; i++) bytes[n + (size_t)i] = (unsigned char)(crc >> (8 * i));
  nas_err err;
  if (nas_write_file_atomic(path, (const char *)bytes, n + 4, &err)) fail_msg("%s", err.msg);
}

/* A sealed file that ends inside the head (after the magic, or after the version) is
 * called truncated, not read as a version or tensor count it does not hold. */
static void weights_file_ending_inside_its_head_is_called_truncated(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 8);
  char *dir = test_tmpdir();
  char *path = nas_asprintf("%s/w.nasw", dir);
  tr_module *a = mlp(&ctx);
  const char *heads[] = {"NASW", "NASW\1\0\0\0"};
  const size_t lens[] = {4, 8};
  for (int i = 0; i < 2; i++) {
    put_sealed(path, heads[i], lens[i]);
    nas_err err = {{0}};
    assert_int_equal(tr_module_load(a, path, &err), NAS_ERR);
    if (!strstr(err.msg, "truncated head") || !strstr(err.msg, path))
      fail_msg("head of %zu bytes: %s", lens[i], err.msg);
  }
  tr_module_free(a);
  test_rmtree(dir);
  free(path);
  free(dir);
}

/* ---------------------------------------------------------------- flat buffers */

/* Sequential(stash, tanh, pop): the pop adds what the stash kept (y = tanh x + x, dy/dx =
 * 1 - tanh^2 x + 1) or concatenates it after its input along dim 1; a pop whose stash has
 * not run fails with a message. */
static void skip_pop_adds_or_concatenates_what_its_stash_kept(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  for (int merge = TR_SKIP_ADD; merge <= TR_SKIP_CONCAT; merge++) {
    tr_module *m = tr_sequential_new(&ctx), *stash, *pop;
    assert_int_equal(tr_skip_new(&ctx, (tr_skip_merge)merge, &stash, &pop), NAS_OK);
    assert_int_equal(tr_sequential_add(&ctx, m, stash), NAS_OK);
    assert_int_equal(tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_TANH)), NAS_OK);
    assert_int_equal(tr_sequential_add(&ctx, m, pop), NAS_OK);
    tr_tensor *x = tr_from_data(&ctx, TR_F64, 2, SHAPE(1, 2), (double[]){0.5, -1.0});
    tr_set_requires_grad(x, true);
    tr_tensor *y = tr_module_forward(&ctx, m, x);
    assert_non_null(y);
    const double *v = tr_f64(y);
    if (merge == TR_SKIP_ADD) {
      assert_int_equal(y->shape[1], 2);
      NEAR(v[0], tanh(0.5) + 0.5);
      NEAR(v[1], tanh(-1.0) - 1.0);
      tr_tensor *ones = tr_full(&ctx, TR_F64, 2, SHAPE(1, 2), 1.0);
      assert_int_equal(tr_backward(&ctx, y, ones, false), NAS_OK);
      NEAR(tr_f64(x->grad)[0], 2 - tanh(0.5) * tanh(0.5));
      NEAR(tr_f64(x->grad)[1], 2 - tanh(-1.0) * tanh(-1.0));
      tr_release(ones);
    } else {
      assert_int_equal(y->shape[1], 4);
      NEAR(v[0], tanh(0.5));
      NEAR(v[3], -1.0);
    }
    tr_release(y);
    /* the pop took what was kept: alone it has nothing */
    assert_null(tr_module_forward(&ctx, pop, x));
    assert_non_null(strstr(ctx.err.msg, "pop ran before its stash"));
    tr_release(x);
    tr_module_free(m);
  }
}

static void flattened_parameters_live_in_one_buffer_and_still_train(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 9);
  tr_module *m = mlp(&ctx);
  tr_tensor *x = tr_randn(&ctx, TR_F32, 2, SHAPE(6, 4), 1.0);
  tr_tensor *before = eval_output(&ctx, m, x);
  tr_module_train(m, true);
  tr_tensor *flat, *gflat;
  assert_int_equal(tr_module_flatten(&ctx, m, &flat, &gflat), NAS_OK);
  tr_param_list list = {0};
  tr_module_parameters(m, false, &list, NULL);
  int64_t total = 0;
  for (size_t i = 0; i < list.n; i++) {
    assert_ptr_equal(list.items[i]->storage, flat->storage);
    assert_ptr_equal(list.items[i]->grad->storage, gflat->storage);
    total += list.items[i]->numel;
  }
  assert_int_equal(flat->numel, total);
  tr_tensor *after = eval_output(&ctx, m, x); /* same function after the move */
  for (int64_t i = 0; i < before->numel; i++) assert_true(tr_get(before, i) == tr_get(after, i));
  tr_module_train(m, true);
  tr_tensor *y = tr_module_forward(&ctx, m, x);
  tr_tensor *loss = tr_cross_entropy(&ctx, y, (int32_t[]){0, 1, 2, 0, 1, 2});
  assert_int_equal(tr_backward(&ctx, loss, NULL, false), NAS_OK);
  double gsum = 0;
  for (int64_t i = 0; i < gflat->numel; i++) gsum += fabs(tr_get(gflat, i));
  assert_true(gsum > 0); /* the gradients arrived in the flat buffer */
  tr_optim *opt =
      tr_optim_new(&ctx, &(tr_optim_config){.kind = TR_SGD, .lr = 0.1}, list.items, list.n);
  double p0 = tr_get(flat, 0);
  assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
  assert_true(tr_get(flat, 0) != p0);
  tr_optim_free(opt);
  tr_param_list_free(&list);
  tr_release(loss);
  tr_release(y);
  tr_release(after);
  tr_release(before);
  tr_release(x);
  tr_release(flat);
  tr_release(gflat);
  tr_module_free(m);
}

static void dropout_refuses_a_nan_probability_and_its_module_a_p_outside_0_1(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 25);
  tr_tensor *x = tr_full(&ctx, TR_F32, 1, SHAPE(8), 1.0);
  assert_null(tr_dropout(&ctx, x, NAN, true)); /* passed both comparisons: NaN outputs */
  assert_non_null(strstr(ctx.err.msg, "dropout"));
  assert_null(tr_dropout(&ctx, x, NAN, false));
  const double bad[] = {-0.1, 1.0, 1.5, NAN};
  for (int i = 0; i < 4; i++) {
    ctx.err.msg[0] = 0;
    assert_null(tr_dropout_new(&ctx, bad[i]));
    assert_non_null(strstr(ctx.err.msg, "dropout"));
  }
  tr_module *ok = tr_dropout_new(&ctx, 0.5);
  assert_non_null(ok);
  tr_module_free(ok);
  tr_release(x);
}

static void optimisers_refuse_nan_rates_momentum_from_1_and_betas_outside_0_1(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 27);
  tr_tensor *p = tr_full(&ctx, TR_F64, 1, SHAPE(1), 1.0);
  const tr_optim_config bad[] = {
      {.kind = TR_SGD, .lr = NAN},
      {.kind = TR_SGD, .lr = 0.1, .momentum = 1.0},
      {.kind = TR_SGD, .lr = 0.1, .momentum = NAN},
      {.kind = TR_SGD, .lr = 0.1, .weight_decay = NAN},
      {.kind = TR_ADAM, .lr = 0.1, .beta1 = 1.0},
      {.kind = TR_ADAM, .lr = 0.1, .beta2 = -0.5},
      {.kind = TR_ADAMW, .lr = 0.1, .beta2 = NAN},
      {.kind = TR_ADAM, .lr = 0.1, .eps = -1e-8},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ctx.err.msg[0] = 0;
    tr_optim *opt = tr_optim_new(&ctx, &bad[i], &p, 1);
    if (opt) fail_msg("config %zu was taken", i);
    assert_non_null(strstr(ctx.err.msg, "optim"));
  }
  tr_release(p);
}

static void clip_grad_norm_refuses_a_negative_or_nan_limit(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_tensor *p = tr_zeros(&ctx, TR_F32, 1, SHAPE(1));
  p->grad = tr_full(&ctx, TR_F32, 1, SHAPE(1), 3.0);
  assert_int_equal(tr_clip_grad_norm(&ctx, &p, 1, -1.0, NULL), NAS_ERR); /* turned it to -1 */
  assert_non_null(strstr(ctx.err.msg, "max norm -1"));
  assert_int_equal(tr_clip_grad_norm(&ctx, &p, 1, NAN, NULL), NAS_ERR);
  assert_true(tr_item(p->grad) == 3.0f);
  tr_release(p);
}

static void an_optimiser_step_refuses_a_rate_set_to_nan_or_below_0(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 31);
  tr_tensor *p = tr_full(&ctx, TR_F64, 1, SHAPE(1), 1.0);
  tr_set_requires_grad(p, true);
  p->grad = tr_full(&ctx, TR_F64, 1, SHAPE(1), 0.5);
  tr_optim *opt = tr_optim_new(&ctx, &(tr_optim_config){.kind = TR_SGD, .lr = 0.1}, &p, 1);
  assert_non_null(opt);
  tr_optim_set_lr(opt, NAN); /* a schedule gone wrong: the step made the parameter NaN */
  assert_int_equal(tr_optim_step(&ctx, opt), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "lr nan"));
  tr_optim_set_lr(opt, -0.1);
  assert_int_equal(tr_optim_step(&ctx, opt), NAS_ERR);
  assert_true(tr_item(p) == 1.0);
  tr_optim_free(opt);
  tr_release(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sgd_steps_match_hand_computed_values),
      cmocka_unit_test(adam_and_adamw_steps_match_hand_computed_values),
      cmocka_unit_test(adam_counts_each_parameters_own_steps),
      cmocka_unit_test(lr_schedules_warm_up_then_decay),
      cmocka_unit_test(clip_grad_norm_scales_all_grads_jointly),
      cmocka_unit_test(sequential_names_parameters_like_torch),
      cmocka_unit_test(cnn_forward_gives_logits_per_example),
      cmocka_unit_test(batchnorm_moves_running_statistics_only_in_training),
      cmocka_unit_test(save_then_load_restores_weights_and_running_statistics),
      cmocka_unit_test(corrupt_truncated_or_mismatched_weights_are_rejected),
      cmocka_unit_test(weights_that_do_not_fit_leave_the_model_as_it_was),
      cmocka_unit_test(weights_file_ending_inside_its_head_is_called_truncated),
      cmocka_unit_test(skip_pop_adds_or_concatenates_what_its_stash_kept),
      cmocka_unit_test(flattened_parameters_live_in_one_buffer_and_still_train),
      cmocka_unit_test(dropout_refuses_a_nan_probability_and_its_module_a_p_outside_0_1),
      cmocka_unit_test(optimisers_refuse_nan_rates_momentum_from_1_and_betas_outside_0_1),
      cmocka_unit_test(clip_grad_norm_refuses_a_negative_or_nan_limit),
      cmocka_unit_test(an_optimiser_step_refuses_a_rate_set_to_nan_or_below_0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
