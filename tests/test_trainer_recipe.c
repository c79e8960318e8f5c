/* The training recipe of built-in trials: the one-cycle and warmed-up schedules and label
 * smoothing against values computed by hand from PyTorch's definitions (OneCycleLR, the
 * label_smoothing of CrossEntropyLoss), and the epochs-as-budget hook: a run resumed from
 * saved weights and training state ends where an uninterrupted one does, for every
 * optimiser, and on two sharded thread ranks and through two thread pipeline stages (a
 * state file per rank or stage); a damaged training state file is refused, as is one saved
 * by another number of ranks or stages. */
#include "tests/testutil.h"

#include <math.h>
#include <stdatomic.h>
#include <zlib.h>

#include "builtin/builtin.h"
#include "trainer/pipeline.h"
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

/* n images 1x4x4 of two classes that differ in their left half. */
static tr_dataset two_class_images(tr_ctx *ctx, int64_t n) {
  tr_tensor *x = tr_randn(ctx, TR_F32, 4, SHAPE(n, 1, 4, 4), 0.5);
  int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) {
    y[i] = (int32_t)(i % 2);
    for (int64_t p = 0; p < 16; p += 4) tr_f32(x)[i * 16 + p] += y[i] ? 1.5f : -1.5f;
  }
  return (tr_dataset){x, y, n, 2};
}

/* An MLP with dropout, so that the generator's state matters as well as the optimiser's. */
static int mlp_build(tr_ctx *ctx, tr_model *m) {
  tr_mlp_config cfg = {.layers = 1, .widths = {8}, .activation = TR_RELU, .dropout = 0.25};
  return tr_mlp_build(ctx, &cfg, (tr_input_shape){1, 4, 4}, 2, m);
}

static tr_model mlp(tr_ctx *ctx) {
  tr_model m;
  assert_int_equal(mlp_build(ctx, &m), NAS_OK);
  return m;
}

/* The recipe of the resume tests: 3 epochs of one-cycle with smoothing and augmentation. */
static tr_fit_config recipe(tr_optim_config optim) {
  return (tr_fit_config){.epochs = 3, .batch_size = 16, .optim = optim,
                         .schedule = TR_LR_ONECYCLE, .shuffle_seed = 77, .label_smoothing = 0.1,
                         .augment = {.crop_padding = 1, .flip = true}};
}

/* Whether a and b hold bit for bit the same parameters and buffers. */
static bool same_weights(tr_module *a, tr_module *b) {
  tr_param_list pa = {0}, pb = {0};
  nas_err err;
  assert_int_equal(tr_module_parameters(a, true, &pa, &err), NAS_OK);
  assert_int_equal(tr_module_parameters(b, true, &pb, &err), NAS_OK);
  assert_int_equal(pa.n, pb.n);
  bool same = true;
  for (size_t i = 0; i < pa.n; i++)
    same = same && memcmp(tr_f32(pa.items[i]), tr_f32(pb.items[i]),
                          sizeof(float) * (size_t)pa.items[i]->numel) == 0;
  tr_param_list_free(&pa), tr_param_list_free(&pb);
  return same;
}

/* Trains m (built in ctx) for the first epoch of the recipe with optim, saving the
 * training state at state_path. */
static void train_first_epoch(tr_ctx *ctx, tr_model *m, const tr_dataset *data,
                              tr_optim_config optim, const char *state_path) {
  tr_fit_config cfg = recipe(optim);
  cfg.stop_epoch = 1, cfg.state_out = state_path;
  nas_err err;
  if (tr_fit(ctx, m->module, data, data, &cfg, NULL, &err)) fail_msg("%s", err.msg);
}

/* Trains 1 epoch of the recipe with optim, saving weights and (in dir) the training state,
 * then into *resumed (built from other weights and generator) loads them and trains epochs
 * 2 and 3, with the state when keep_state; *acc gets its last validation accuracy. */
static void train_cut_then_resume(const char *dir, const tr_dataset *data, tr_optim_config optim,
                                  bool keep_state, tr_model *resumed, double *acc) {
  char *weights, *state;
  assert_true(asprintf(&weights, "%s/after1.nasw", dir) > 0);
  assert_true(asprintf(&state, "%s/after1.nast", dir) > 0);
  tr_ctx ctx;
  nas_err err;
  tr_ctx_init(&ctx, 9);
  tr_model cut = mlp(&ctx);
  train_first_epoch(&ctx, &cut, data, optim, state);
  assert_int_equal(tr_module_save(cut.module, weights, &err), NAS_OK);
  tr_ctx_init(&ctx, 1234); /* other weights and draws: the saved ones replace them */
  *resumed = mlp(&ctx);
  assert_int_equal(tr_module_load(resumed->module, weights, &err), NAS_OK);
  tr_fit_config resume_cfg = recipe(optim);
  resume_cfg.first_epoch = 1, resume_cfg.state_in = keep_state ? state : NULL;
  if (tr_fit(&ctx, resumed->module, data, data, &resume_cfg, acc, &err)) fail_msg("%s", err.msg);
  tr_model_free(&cut);
  free(weights), free(state);
}

/* For every optimiser, with dropout on: 3 epochs straight end on the very weights (bit for
 * bit) of 1 epoch saved with its training state and then continued to 3 — same schedule
 * position, batch order, augmentation draws, optimiser state and dropout masks. */
static void resumed_fit_ends_where_an_uninterrupted_one_does(void **state) {
  (void)state;
  const tr_optim_config optimisers[] = {
      {.kind = TR_SGD, .lr = 0.1},
      {.kind = TR_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3},
      {.kind = TR_ADAM, .lr = 0.01},
      {.kind = TR_ADAMW, .lr = 0.01, .weight_decay = 0.01},
  };
  char *dir = test_tmpdir();
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx, 96);
  nas_err err;
  for (size_t k = 0; k < sizeof optimisers / sizeof optimisers[0]; k++) {
    tr_fit_config cfg = recipe(optimisers[k]);
    double acc_whole = 0, acc_resumed = 0;
    tr_ctx_init(&ctx, 9);
    tr_model whole = mlp(&ctx), resumed;
    assert_int_equal(tr_fit(&ctx, whole.module, &data, &data, &cfg, &acc_whole, &err), NAS_OK);
    assert_true(acc_whole > 0.8); /* it learns: 0.5 by chance */
    train_cut_then_resume(dir, &data, optimisers[k], true, &resumed, &acc_resumed);
    if (!same_weights(whole.module, resumed.module)) fail_msg("optimiser %zu: weights differ", k);
    assert_true(acc_whole == acc_resumed);
    tr_model_free(&whole), tr_model_free(&resumed);
  }
  tr_fit_config late = recipe(optimisers[0]);
  late.first_epoch = 4;
  tr_model m = mlp(&ctx);
  assert_int_equal(tr_fit(&ctx, m.module, &data, &data, &late, NULL, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "resuming after epoch 4 of 3"));
  tr_model_free(&m);
  tr_dataset_free(&data);
  test_rmtree(dir);
  free(dir);
}

/* A batch of no examples would make an epoch of infinitely many steps (a division by 0):
 * refused with what was given, before any step. */
static void fit_refuses_batches_of_no_examples(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx, 8);
  tr_model m = mlp(&ctx);
  tr_fit_config cfg = recipe((tr_optim_config){.kind = TR_SGD, .lr = 0.1});
  nas_err err;
  for (int64_t batch = 0; batch >= -1; batch--) {
    cfg.batch_size = batch;
    assert_int_equal(tr_fit(&ctx, m.module, &data, &data, &cfg, NULL, &err), NAS_ERR);
    if (!strstr(err.msg, "batch_size") || !strstr(err.msg, "at least 1"))
      fail_msg("batch_size %lld: '%s'", (long long)batch, err.msg);
  }
  tr_model_free(&m);
  tr_dataset_free(&data);
}

/* The test above can fail: without the training state Adam's moments start afresh and the
 * dropout masks differ, and so do the weights. */
static void resumed_fit_without_the_training_state_ends_elsewhere(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  tr_ctx ctx;
  nas_err err;
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx, 96);
  tr_optim_config adam = {.kind = TR_ADAM, .lr = 0.01};
  tr_fit_config cfg = recipe(adam);
  tr_ctx_init(&ctx, 9);
  tr_model whole = mlp(&ctx), resumed;
  assert_int_equal(tr_fit(&ctx, whole.module, &data, &data, &cfg, NULL, &err), NAS_OK);
  double acc = 0;
  train_cut_then_resume(dir, &data, adam, false, &resumed, &acc);
  assert_false(same_weights(whole.module, resumed.module));
  tr_model_free(&whole), tr_model_free(&resumed);
  tr_dataset_free(&data);
  test_rmtree(dir);
  free(dir);
}

/* Bytes of the file at path, owned; *n gets their count. */
static unsigned char *file_bytes(const char *path, size_t *n) {
  char *data = NULL;
  nas_err err;
  if (nas_read_file(path, &data, n, &err)) fail_msg("%s", err.msg);
  return (unsigned char *)data;
}

/* Writes n bytes of data to path, with a fresh CRC-32 over the first n - 4 when reseal. */
static void file_put(const char *path, unsigned char *data, size_t n, bool reseal) {
  if (reseal) {
    uint32_t crc = (uint32_t)crc32(0L, data, (uInt)(n - 4));
    for (int i = 0; i < 4; i++) data[n - 4 + (size_t)i] = (unsigned char)(crc >> (8 * i));
  }
  nas_err err;
  if (nas_write_file_atomic(path, (const char *)data, n, &err)) fail_msg("%s", err.msg);
}

/* Loads the state at path into a fresh optimiser of kind over m; NAS_ERR with err set. */
static int load_into(tr_ctx *ctx, tr_module *m, tr_optim_config cfg, const char *path,
                     nas_err *err) {
  tr_param_list params = {0};
  assert_int_equal(tr_module_parameters(m, false, &params, err), NAS_OK);
  tr_optim *opt = tr_optim_new(ctx, &cfg, params.items, params.n);
  assert_non_null(opt);
  int rc = tr_train_state_load(ctx, opt, NULL, path, err);
  tr_optim_free(opt);
  tr_param_list_free(&params);
  return rc;
}

static void expect_refused(tr_ctx *ctx, tr_module *m, tr_optim_config cfg, const char *path,
                           const char *why) {
  nas_err err = {{0}};
  assert_int_equal(load_into(ctx, m, cfg, path, &err), NAS_ERR);
  if (!strstr(err.msg, why)) fail_msg("expected '%s' in: %s", why, err.msg);
}

/* A truncated, overwritten, newer, or other optimiser's training state file is refused
 * with the reason and the path; a sound one loads. */
static void damaged_training_state_is_refused_with_the_reason(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *path, *bad;
  assert_true(asprintf(&path, "%s/state.nast", dir) > 0);
  assert_true(asprintf(&bad, "%s/bad.nast", dir) > 0);
  tr_ctx ctx;
  nas_err err;
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx, 96);
  tr_model m = mlp(&ctx);
  tr_optim_config adam = {.kind = TR_ADAM, .lr = 0.01};
  train_first_epoch(&ctx, &m, &data, adam, path);
  assert_int_equal(load_into(&ctx, m.module, adam, path, &err), NAS_OK);
  size_t n;
  unsigned char *bytes = file_bytes(path, &n);
  file_put(bad, bytes, n - 100, false);
  expect_refused(&ctx, m.module, adam, bad, "checksum mismatch (the file is corrupt or truncated)");
  bytes[n / 2] ^= 0x40;
  file_put(bad, bytes, n, false);
  expect_refused(&ctx, m.module, adam, bad, "checksum mismatch");
  bytes[n / 2] ^= 0x40;
  bytes[4] = 4; /* version 4, checksum made good */
  file_put(bad, bytes, n, true);
  expect_refused(&ctx, m.module, adam, bad, "training state version 4, this nas reads versions 1 to 3");
  bytes[4] = 3;
  file_put(bad, bytes, n - 4, true); /* the last 4 bytes of data missing, checksum good */
  expect_refused(&ctx, m.module, adam, bad, "truncated data of");
  expect_refused(&ctx, m.module, (tr_optim_config){.kind = TR_SGD, .lr = 0.1, .momentum = 0.9},
                 path, "the state of adam keeping 2 tensors per parameter; this run's optimiser "
                 "is sgd keeping 1");
  expect_refused(&ctx, m.module, adam, "/nonexistent/state.nast", "/nonexistent/state.nast");
  tr_fit_config resume = recipe(adam);
  resume.first_epoch = 1, resume.state_in = bad;
  assert_int_equal(tr_fit(&ctx, m.module, &data, &data, &resume, NULL, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "resuming the training state: "));
  free(bytes);
  tr_model_free(&m);
  tr_dataset_free(&data);
  test_rmtree(dir);
  free(dir), free(path), free(bad);
}

/* A sealed state file that ends right after its magic is called damaged, not read as a
 * version it does not hold. */
static void training_state_ending_after_its_magic_is_called_damaged(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *path;
  assert_true(asprintf(&path, "%s/short.nast", dir) > 0);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_model m = mlp(&ctx);
  unsigned char bytes[8] = {'N', 'A', 'S', 'T'};
  file_put(path, bytes, sizeof bytes, true);
  expect_refused(&ctx, m.module, (tr_optim_config){.kind = TR_ADAM, .lr = 0.01}, path,
                 "the head of the training state is damaged");
  tr_model_free(&m);
  test_rmtree(dir);
  free(dir), free(path);
}

/* ---- on several thread ranks or stages ---- */

/* One run of the ranks or stages: each trains the MLP (same seed: the stages' layers are
 * one model's) in a context of its own; the first saves the trained model. */
typedef struct {
  const tr_dataset *data;
  tr_fit_config cfg;
  const char *weights_in;  /* loaded into every copy first; NULL: the initial weights */
  const char *weights_out; /* rank or stage 0's trained model */
} split_run;

/* This rank's or stage's context (with an allocator) and model; free with split_free. */
static int split_model(const split_run *run, tr_ctx *ctx, tr_model *m, nas_err *err) {
  tr_ctx_init(ctx, 9);
  *m = (tr_model){0};
  if (!(ctx->alloc = tr_allocator_new((size_t)16 << 20))) return nas_errf(err, "out of memory");
  if (mlp_build(ctx, m) != NAS_OK) return nas_errf(err, "%s", ctx->err.msg);
  return run->weights_in ? tr_module_load(m->module, run->weights_in, err) : NAS_OK;
}

/* The model saved by the first of the ranks or stages, then everything freed. */
static int split_finish(const split_run *run, bool first, tr_ctx *ctx, tr_model *m, int rc,
                        nas_err *err) {
  if (rc == NAS_OK && first && run->weights_out) rc = tr_module_save(m->module, run->weights_out, err);
  tr_model_free(m);
  if (ctx->alloc) tr_allocator_release(ctx->alloc);
  return rc;
}

static int sharded_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  const split_run *run = arg;
  tr_ctx ctx;
  tr_model m;
  tr_fit_ranks ranks = {rank->comm, rank->prefetch_comm, {.mode = TR_SHARD_FULL}};
  int rc = split_model(run, &ctx, &m, err);
  if (rc == NAS_OK)
    rc = tr_fit_sharded(&ctx, m.module, &ranks, run->data, run->data, &run->cfg, NULL, err);
  return split_finish(run, rank->rank == 0, &ctx, &m, rc, err);
}

static int pipeline_stage(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  const split_run *run = arg;
  tr_ctx ctx;
  tr_model m;
  tr_pipe_config pipe = {.chunks = 2};
  int rc = split_model(run, &ctx, &m, err);
  if (rc == NAS_OK)
    rc = tr_fit_pipeline_stage(&ctx, m.module, rank, &pipe, run->data, run->data, &run->cfg,
                               NULL, err);
  return split_finish(run, rank->stage == 0, &ctx, &m, rc, err);
}

/* Runs `parts` thread ranks or stages of run. */
typedef int (*split_runner)(int parts, split_run *run, nas_err *err);

static int run_sharded(int parts, split_run *run, nas_err *err) {
  return tr_fsdp_run_threads(parts, sharded_rank, run, err);
}

static int run_pipelined(int parts, split_run *run, nas_err *err) {
  return tr_pipe_run_threads(parts, 60, pipeline_stage, run, err);
}

static bool same_file(const char *a, const char *b) {
  size_t na, nb;
  unsigned char *da = file_bytes(a, &na), *db = file_bytes(b, &nb);
  bool same = na == nb && memcmp(da, db, na) == 0;
  free(da), free(db);
  return same;
}

/* With Adam and dropout on `parts` thread ranks or stages named unit: 3 epochs straight end
 * on the very weights (bit for bit) of 1 epoch saved with a state file per rank or stage
 * and continued to 3; continued without the state they end elsewhere; and the state saved
 * by parts + 1 of them is refused, saying why. 97 examples in batches of 16: each epoch
 * ends on a batch of one, too small to split, whose step counts all the same. */
static void split_resume_ends_where_straight_does(split_runner runner, int parts, const char *unit) {
  char *dir = test_tmpdir(), *straight, *after1, *resumed, *state, *part;
  assert_true(asprintf(&straight, "%s/straight.nasw", dir) > 0);
  assert_true(asprintf(&after1, "%s/after1.nasw", dir) > 0);
  assert_true(asprintf(&resumed, "%s/resumed.nasw", dir) > 0);
  assert_true(asprintf(&state, "%s/state.nast", dir) > 0);
  tr_ctx ctx;
  nas_err err = {{0}};
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx, 97);
  tr_fit_config cfg = recipe((tr_optim_config){.kind = TR_ADAM, .lr = 0.01});
  split_run run = {&data, cfg, NULL, straight};
  if (runner(parts, &run, &err)) fail_msg("%s", err.msg);
  run.cfg.stop_epoch = 1, run.cfg.state_out = state, run.weights_out = after1;
  if (runner(parts, &run, &err)) fail_msg("%s", err.msg);
  for (int i = 0; i < parts; i++) {
    assert_true(asprintf(&part, "%s/state.%s%d.nast", dir, unit, i) > 0);
    assert_int_equal(access(part, R_OK), 0);
    free(part);
  }
  run = (split_run){&data, cfg, after1, resumed};
  run.cfg.first_epoch = 1, run.cfg.state_in = state;
  if (runner(parts, &run, &err)) fail_msg("%s", err.msg);
  if (!same_file(straight, resumed)) fail_msg("%d %ss: the resumed run ends elsewhere", parts, unit);
  run.cfg.state_in = NULL;
  if (runner(parts, &run, &err)) fail_msg("%s", err.msg);
  assert_false(same_file(straight, resumed));
  run = (split_run){&data, cfg, NULL, after1};
  run.cfg.stop_epoch = 1, run.cfg.state_out = state;
  if (runner(parts + 1, &run, &err)) fail_msg("%s", err.msg);
  run = (split_run){&data, cfg, after1, NULL};
  run.cfg.first_epoch = 1, run.cfg.state_in = state;
  assert_int_equal(runner(parts, &run, &err), NAS_ERR);
  char *why;
  assert_true(asprintf(&why, " of %d; this is %s ", parts + 1, unit) > 0);
  if (!strstr(err.msg, why)) fail_msg("expected '%s' in: %s", why, err.msg);
  free(why);
  assert_true(asprintf(&why, "training resumes on as many %ss as saved it", unit) > 0);
  assert_non_null(strstr(err.msg, why));
  free(why);
  tr_dataset_free(&data);
  test_rmtree(dir);
  free(dir), free(straight), free(after1), free(resumed), free(state);
}

/* Each rank keeps the state of its shards (FSDP full sharding) in a file of its own. */
static void sharded_fit_resumed_on_two_thread_ranks_ends_where_an_uninterrupted_one_does(
    void **state) {
  (void)state;
  split_resume_ends_where_straight_does(run_sharded, 2, "rank");
}

/* Each stage keeps the state of its layers in a file of its own. */
static void pipelined_fit_resumed_through_two_thread_stages_ends_where_an_uninterrupted_one_does(
    void **state) {
  (void)state;
  split_resume_ends_where_straight_does(run_pipelined, 2, "stage");
}

/* A sharded run whose rank 1 fails in its set-up, before the first step. */
typedef struct {
  split_run run;
  atomic_bool lead_returned;  /* rank 0's tr_fit_sharded has returned */
  bool lead_returned_in_time; /* rank 1 saw it while it was still in the group */
} set_up_failure;

/* Rank 1 resumes after an epoch past the last (its fit_begin refuses), then stays in the
 * group up to 20 s waiting for rank 0 to give up, as a process rank over NCCL does: NCCL
 * does not notice a rank that left, so only an agreement before the first step stops the
 * others in time. */
static int rank_failing_set_up(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  set_up_failure *sf = arg;
  tr_ctx ctx;
  tr_model m;
  tr_fit_ranks ranks = {rank->comm, rank->prefetch_comm, {.mode = TR_SHARD_FULL}};
  tr_fit_config cfg = sf->run.cfg;
  if (rank->rank == 1) cfg.first_epoch = cfg.epochs + 1;
  int rc = split_model(&sf->run, &ctx, &m, err);
  if (rc == NAS_OK)
    rc = tr_fit_sharded(&ctx, m.module, &ranks, sf->run.data, sf->run.data, &cfg, NULL, err);
  if (rank->rank == 0) atomic_store(&sf->lead_returned, true);
  for (double until = nas_monotonic() + 20; rank->rank == 1 && nas_monotonic() < until;)
    if ((sf->lead_returned_in_time = atomic_load(&sf->lead_returned))) break;
    else nas_sleep(0.01);
  return split_finish(&sf->run, false, &ctx, &m, rc, err);
}

static void set_up_failing_on_one_rank_stops_every_rank_before_the_first_step(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_dataset data = two_class_images(&ctx, 64);
  set_up_failure sf = {.run = {&data, recipe((tr_optim_config){.kind = TR_SGD, .lr = 0.1})}};
  atomic_init(&sf.lead_returned, false);
  nas_err err = {{0}};
  assert_int_equal(tr_fsdp_run_threads(2, rank_failing_set_up, &sf, &err), NAS_ERR);
  assert_true(sf.lead_returned_in_time);
  /* rank 0's error (the driver reports the first rank's) names rank 1 and its reason */
  assert_non_null(strstr(err.msg, "rank 0: stopped: rank 1 failed: training: resuming after "
                                  "epoch 4 of 3"));
  tr_dataset_free(&data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_cycle_follows_pytorch_one_cycle_lr),
      cmocka_unit_test(cosine_after_warm_up_starts_at_the_base_rate),
      cmocka_unit_test(label_smoothing_matches_pytorch_definition),
      cmocka_unit_test(resumed_fit_ends_where_an_uninterrupted_one_does),
      cmocka_unit_test(resumed_fit_without_the_training_state_ends_elsewhere),
      cmocka_unit_test(fit_refuses_batches_of_no_examples),
      cmocka_unit_test(damaged_training_state_is_refused_with_the_reason),
      cmocka_unit_test(training_state_ending_after_its_magic_is_called_damaged),
      cmocka_unit_test(sharded_fit_resumed_on_two_thread_ranks_ends_where_an_uninterrupted_one_does),
      cmocka_unit_test(set_up_failing_on_one_rank_stops_every_rank_before_the_first_step),
      cmocka_unit_test(
          pipelined_fit_resumed_through_two_thread_stages_ends_where_an_uninterrupted_one_does),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
