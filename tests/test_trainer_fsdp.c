/* FSDP on thread ranks (trainer.h's FSDP section): training under every sharding mode,
 * world size and option gives the parameters of single-rank training on the same global
 * batch; prefetch and checkpointing change no bit (batch norm's running statistics
 * included); each rank holds 1/N of the memory; checkpointing lowers the peak; nonsense
 * configurations and batches are refused.
 *
 * Every rank builds its model from its own seed, so matching the reference also shows that
 * the start broadcasts rank 0's parameters. Each rank's dropout stream is seeded by its
 * rank; a model with dropout is compared with a single-rank reference that runs the same
 * slices with the same streams one after another and averages their gradients (there is
 * no other way to draw the same masks), a model without dropout with plain training on
 * the whole global batch. cmocka's asserts run on the main thread: ranks return errors. */
#include "tests/testutil.h"
#include "tests/trainer_compare.h"

#include <math.h>

#include "builtin/builtin.h"
#include "trainer/dist.h"
#include "trainer/trainer.h"

#define MAX_WORLD 4
#define MAX_STEPS 3
#define MAX_BATCH 256
#define MODEL_SEED 11
#define STREAM_SEED 500

typedef enum {
  MODEL_MLP,         /* 20-32-16-5, ReLU */
  MODEL_MLP_DROPOUT, /* the same with layer norm after the first layer and dropout */
  MODEL_CNN,         /* conv, relu, pool, conv, relu, pool, flatten, linear on 1x8x8 */
  MODEL_DEEP,        /* 64 -> 8 blocks (Linear 128, LayerNorm, GELU) -> 10 */
  MODEL_WIDE,        /* 256-512-512-10: big enough that allocator rounding is noise */
  MODEL_MLP_BN,      /* 20-32-5 with batch norm after the first layer */
} model_kind;

/* ---------------------------------------------------------------- models and data */

static void add(tr_ctx *ctx, tr_module *seq, tr_module *child) {
  assert_int_equal(tr_sequential_add(ctx, seq, child), NAS_OK);
}

static tr_module *mlp_new(tr_ctx *ctx, const int64_t *widths, int n, bool norm_dropout) {
  tr_module *m = tr_sequential_new(ctx);
  for (int i = 0; i + 1 < n; i++) {
    add(ctx, m, tr_linear_new(ctx, widths[i], widths[i + 1], true));
    if (i + 2 == n) break;
    if (norm_dropout && i == 0) add(ctx, m, tr_layernorm_new(ctx, widths[1]));
    add(ctx, m, tr_activation_new(ctx, TR_RELU));
    if (norm_dropout) add(ctx, m, tr_dropout_new(ctx, 0.25));
  }
  return m;
}

static tr_module *cnn_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_conv2d_new(ctx, 1, 4, 3, 1, 1, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  add(ctx, m, tr_conv2d_new(ctx, 4, 8, 3, 1, 1, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  add(ctx, m, tr_linear_new(ctx, 8 * 2 * 2, 5, true));
  return m;
}

static tr_module *mlp_bn_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_linear_new(ctx, 20, 32, true));
  add(ctx, m, tr_batchnorm_new(ctx, 32));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_linear_new(ctx, 32, 5, true));
  return m;
}

/* Each block a Sequential child of its own, so the per-child policy makes it one unit. */
static tr_module *deep_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  for (int i = 0; i < 8; i++) {
    tr_module *block = tr_sequential_new(ctx);
    add(ctx, block, tr_linear_new(ctx, i ? 128 : 64, 128, true));
    add(ctx, block, tr_layernorm_new(ctx, 128));
    add(ctx, block, tr_activation_new(ctx, TR_GELU));
    add(ctx, m, block);
  }
  add(ctx, m, tr_linear_new(ctx, 128, 10, true));
  return m;
}

static tr_module *model_new(tr_ctx *ctx, model_kind kind) {
  switch (kind) {
  case MODEL_MLP: return mlp_new(ctx, (int64_t[]){20, 32, 16, 5}, 4, false);
  case MODEL_MLP_DROPOUT: return mlp_new(ctx, (int64_t[]){20, 32, 16, 5}, 4, true);
  case MODEL_CNN: return cnn_new(ctx);
  case MODEL_DEEP: return deep_new(ctx);
  case MODEL_WIDE: return mlp_new(ctx, (int64_t[]){256, 512, 512, 10}, 4, false);
  case MODEL_MLP_BN: return mlp_bn_new(ctx);
  }
  return NULL;
}

/* The global batch of a step (the same on every rank) and its labels. */
static tr_tensor *batch_new(model_kind kind, int step, int64_t batch, int32_t *labels) {
  tr_ctx gen;
  tr_ctx_init(&gen, 4242 + (uint64_t)step);
  int64_t features = kind == MODEL_DEEP ? 64 : kind == MODEL_WIDE ? 256 : 20;
  tr_tensor *x = kind == MODEL_CNN ? tr_randn(&gen, TR_F32, 4, (int64_t[]){batch, 1, 8, 8}, 1.0)
                                   : tr_randn(&gen, TR_F32, 2, (int64_t[]){batch, features}, 1.0);
  int classes = kind == MODEL_DEEP ? 10 : kind == MODEL_WIDE ? 10 : 5;
  for (int64_t i = 0; i < batch; i++) labels[i] = (int32_t)(tr_rand_u64(&gen) % (uint64_t)classes);
  return x;
}

/* Points ctx's generator at the dropout stream of rank. */
static void stream_seed(tr_ctx *ctx, int rank) {
  tr_ctx seeded;
  tr_ctx_init(&seeded, STREAM_SEED + (uint64_t)rank);
  memcpy(ctx->rng, seeded.rng, sizeof ctx->rng);
}

/* ---------------------------------------------------------------- one training run */

typedef struct {
  model_kind model;
  tr_fsdp_config fsdp;
  tr_optim_config optim;
  int steps;
  int64_t batch;
  double clip; /* > 0: clip the global gradient norm to it every step */
  /* filled by the ranks */
  float *params[MAX_WORLD]; /* owned: the full parameters each rank sees at the end */
  float *values0; /* owned: rank 0's parameters and buffers (each rank's batch norm has its own
                     running statistics) */
  int64_t n_values;
  int64_t n_params;
  double norms[MAX_WORLD][MAX_STEPS];
  tr_fsdp_memory memory[MAX_WORLD]; /* after the last step */
} run_spec;

typedef struct {
  tr_ctx ctx;
  tr_module *model;
  tr_fsdp *f;
  tr_optim *opt;
} rank_state;

static void rank_state_free(rank_state *s) {
  tr_optim_free(s->opt);
  tr_fsdp_free(s->f);
  tr_module_free(s->model);
  tr_allocator_release(s->ctx.alloc);
}

/* The model (from a seed of this rank's own) and its FSDP wrapper. The model's memory
 * comes from malloc, the rest from the rank's allocator: its peak then measures steps. */
static int rank_setup(rank_state *s, run_spec *run, const tr_fsdp_rank *rank) {
  tr_ctx_init(&s->ctx, MODEL_SEED + 7919 * (uint64_t)rank->rank);
  s->model = model_new(&s->ctx, run->model);
  s->ctx.alloc = tr_allocator_new((size_t)64 << 20);
  stream_seed(&s->ctx, rank->rank);
  s->f = tr_fsdp_new(&s->ctx, s->model, rank->comm, rank->prefetch_comm, &run->fsdp);
  s->opt = s->f ? tr_fsdp_optim_new(&s->ctx, s->f, &run->optim) : NULL;
  return s->opt ? NAS_OK : NAS_ERR;
}

static int train_step(rank_state *s, run_spec *run, int rank, int step) {
  int32_t labels[MAX_BATCH];
  tr_tensor *x = batch_new(run->model, step, run->batch, labels);
  int64_t start, count;
  if (tr_fsdp_batch_slice(s->f, run->batch, &start, &count, &s->ctx.err)) {
    tr_release(x);
    return NAS_ERR;
  }
  tr_tensor *slice = tr_narrow(&s->ctx, x, 0, start, count);
  tr_optim_zero_grad(s->opt);
  tr_tensor *logits = slice ? tr_fsdp_forward(&s->ctx, s->f, slice) : NULL;
  tr_tensor *loss = logits ? tr_cross_entropy(&s->ctx, logits, labels + start) : NULL;
  int rc = loss ? tr_fsdp_backward(&s->ctx, s->f, loss) : NAS_ERR;
  if (rc == NAS_OK && run->clip > 0)
    rc = tr_fsdp_clip_grad_norm(&s->ctx, s->f, run->clip, &run->norms[rank][step]);
  if (rc == NAS_OK) rc = tr_optim_step(&s->ctx, s->opt);
  tr_release(loss);
  tr_release(logits);
  tr_release(slice);
  tr_release(x);
  return rc;
}

static int train_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  run_spec *run = arg;
  rank_state s = {0};
  int rc = rank_setup(&s, run, rank);
  for (int step = 0; step < run->steps && rc == NAS_OK; step++)
    rc = train_step(&s, run, rank->rank, step);
  if (rc == NAS_OK) {
    tr_fsdp_memory_stats(s.f, &run->memory[rank->rank]);
    rc = tr_fsdp_summon_full(&s.ctx, s.f);
  }
  if (rc == NAS_OK) {
    int64_t n;
    run->params[rank->rank] = module_values_copy(s.model, false, &n);
    if (rank->rank == 0) run->n_params = n; /* the same on every rank; one writer */
    if (rank->rank == 0) run->values0 = module_values_copy(s.model, true, &run->n_values);
    rc = tr_fsdp_release_full(&s.ctx, s.f);
  }
  if (rc) nas_errf(err, "%s", s.ctx.err.msg);
  rank_state_free(&s);
  return rc;
}

/* Runs spec on world ranks; asserts success and that every rank ends with rank 0's bits. */
static void run_world(run_spec *run, int world) {
  nas_err err = {{0}};
  int rc = tr_fsdp_run_threads(world, train_rank, run, &err);
  if (rc) print_error("%s\n", err.msg);
  assert_int_equal(rc, NAS_OK);
  for (int r = 1; r < world; r++) {
    assert_non_null(run->params[r]);
    assert_memory_equal(run->params[r], run->params[0], (size_t)run->n_params * sizeof(float));
  }
}

static void run_free(run_spec *run) {
  free(run->values0);
  run->values0 = NULL;
  for (int r = 0; r < MAX_WORLD; r++) {
    free(run->params[r]);
    run->params[r] = NULL;
  }
}

/* ---------------------------------------------------------------- the reference */

/* Single-rank training without FSDP on the same global batches, as `slices` slices run one
 * after another with the ranks' dropout streams, their gradients averaged (slices 1: the
 * plain step on the whole batch). norms (may be NULL) gets the clipped norms. Owned. */
static float *reference_train(const run_spec *run, int slices, double *norms) {
  tr_ctx ctx, streams[MAX_WORLD];
  tr_ctx_init(&ctx, MODEL_SEED);
  tr_module *model = model_new(&ctx, run->model);
  for (int r = 0; r < slices; r++) {
    tr_ctx_init(&streams[r], 0);
    stream_seed(&streams[r], r);
  }
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(model, false, &ps, NULL), NAS_OK);
  tr_optim *opt = tr_optim_new(&ctx, &run->optim, ps.items, ps.n);
  assert_non_null(opt);
  int64_t count = run->batch / slices;
  for (int step = 0; step < run->steps; step++) {
    int32_t labels[MAX_BATCH];
    tr_tensor *x = batch_new(run->model, step, run->batch, labels);
    tr_optim_zero_grad(opt);
    for (int r = 0; r < slices; r++) {
      tr_tensor *slice = tr_narrow(&ctx, x, 0, r * count, count);
      tr_tensor *logits = tr_module_forward(&streams[r], model, slice);
      assert_non_null(logits);
      tr_tensor *loss = tr_cross_entropy(&ctx, logits, labels + r * count);
      tr_tensor *share = slices > 1 ? tr_full(&ctx, TR_F32, 0, NULL, 1.0 / slices) : NULL;
      assert_int_equal(tr_backward(&ctx, loss, share, false), NAS_OK);
      tr_release(share);
      tr_release(loss);
      tr_release(logits);
      tr_release(slice);
    }
    if (run->clip > 0) {
      double norm;
      assert_int_equal(tr_clip_grad_norm(&ctx, ps.items, ps.n, run->clip, &norm), NAS_OK);
      if (norms) norms[step] = norm;
    }
    assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
    tr_release(x);
  }
  int64_t n;
  float *out = module_values_copy(model, false, &n);
  tr_optim_free(opt);
  tr_param_list_free(&ps);
  tr_module_free(model);
  return out;
}

/* ---------------------------------------------------------------- matching single-rank */

static const char *const mode_names[] = {"full", "grad_op", "none"};

static const tr_optim_config optimisers[] = {
    {.kind = TR_SGD, .lr = 0.1, .momentum = 0.9},
    {.kind = TR_ADAMW, .lr = 0.01, .weight_decay = 0.01},
};

/* Every world (1, 2, 4), mode, checkpointing and prefetch setting, with both optimisers,
 * against the single-rank reference. */
static void assert_matches_single_rank_everywhere(model_kind model, int64_t unit_params) {
  bool dropout = model == MODEL_MLP_DROPOUT;
  for (size_t o = 0; o < sizeof optimisers / sizeof *optimisers; o++) {
    for (int world = 1; world <= MAX_WORLD; world *= 2) {
      run_spec base = {.model = model, .optim = optimisers[o], .steps = 3, .batch = 16};
      float *want = reference_train(&base, dropout ? world : 1, NULL);
      for (int mode = 0; mode < 3; mode++) {
        for (int option = 0; option < 4; option++) {
          run_spec run = base;
          run.fsdp = (tr_fsdp_config){.mode = (tr_shard_mode)mode,
                                      .unit_params = unit_params,
                                      .checkpoint = option & 1,
                                      .prefetch = option & 2};
          run_world(&run, world);
          char what[160];
          snprintf(what, sizeof what, "model %d, optimiser %zu, world %d, %s, checkpoint %d, "
                   "prefetch %d", (int)model, o, world, mode_names[mode], option & 1,
                   (option & 2) != 0);
          assert_close(run.params[0], want, run.n_params, 1e-5, what);
          run_free(&run);
        }
      }
      free(want);
    }
  }
}

static void mlp_trains_like_single_rank_in_every_mode_world_and_option(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_MLP, 0);
}

static void mlp_with_layer_norm_and_dropout_trains_like_single_rank(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_MLP_DROPOUT, 0);
}

static void cnn_trains_like_single_rank_in_every_mode_world_and_option(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_CNN, 0);
}

static void units_grouped_by_a_threshold_train_like_single_rank(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_MLP, 1000);
}

/* ---------------------------------------------------------------- bit-identical options */

/* Parameters after 3 steps on world ranks (owned). */
static float *train_params(model_kind model, int world, tr_fsdp_config cfg, int64_t *n) {
  run_spec run = {.model = model, .fsdp = cfg, .optim = optimisers[1], .steps = 3, .batch = 16};
  run_world(&run, world);
  float *out = run.params[0];
  run.params[0] = NULL;
  *n = run.n_params;
  run_free(&run);
  return out;
}

static void prefetch_changes_no_bit(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    for (int ckpt = 0; ckpt < 2; ckpt++) {
      tr_fsdp_config plain = {.mode = (tr_shard_mode)mode, .checkpoint = ckpt};
      tr_fsdp_config ahead = plain;
      ahead.prefetch = true;
      int64_t n;
      float *a = train_params(MODEL_CNN, 4, plain, &n), *b = train_params(MODEL_CNN, 4, ahead, &n);
      assert_memory_equal(a, b, (size_t)n * sizeof *a);
      free(a);
      free(b);
    }
  }
}

/* Rank 0's parameters and buffers after 3 steps on 2 ranks, with and without
 * checkpointing, in every mode: the same bits. */
static void assert_checkpointing_changes_no_bit(model_kind model) {
  for (int mode = 0; mode < 3; mode++) {
    run_spec plain = {.model = model, .fsdp = {.mode = (tr_shard_mode)mode},
                      .optim = optimisers[1], .steps = 3, .batch = 16};
    run_spec recompute = plain;
    recompute.fsdp.checkpoint = true;
    run_world(&plain, 2);
    run_world(&recompute, 2);
    assert_int_equal(plain.n_values, recompute.n_values);
    assert_memory_equal(plain.values0, recompute.values0,
                        (size_t)plain.n_values * sizeof *plain.values0);
    run_free(&plain);
    run_free(&recompute);
  }
}

static void checkpointing_with_dropout_changes_no_bit(void **state) {
  (void)state;
  assert_checkpointing_changes_no_bit(MODEL_MLP_DROPOUT);
}

/* The recomputed forward runs batch norm in training mode again: the running statistics
 * must move once per step, as without checkpointing. */
static void checkpointing_with_batch_norm_changes_no_bit(void **state) {
  (void)state;
  assert_checkpointing_changes_no_bit(MODEL_MLP_BN);
}

/* ---------------------------------------------------------------- clipping */

static void clipping_uses_the_global_norm_over_all_ranks(void **state) {
  (void)state;
  for (int world = 2; world <= MAX_WORLD; world *= 2) {
    for (int mode = 0; mode < 3; mode++) {
      run_spec run = {.model = MODEL_MLP,
                      .fsdp = {.mode = (tr_shard_mode)mode},
                      .optim = optimisers[0],
                      .steps = 3,
                      .batch = 16,
                      .clip = 0.05};
      double want_norms[MAX_STEPS];
      float *want = reference_train(&run, 1, want_norms);
      run_world(&run, world);
      for (int step = 0; step < run.steps; step++) {
        assert_true(want_norms[step] > run.clip); /* the clip did act */
        for (int r = 0; r < world; r++)
          assert_true(fabs(run.norms[r][step] - want_norms[step]) <= 1e-5 * want_norms[step]);
      }
      assert_close(run.params[0], want, run.n_params, 1e-5, "clipped");
      free(want);
      run_free(&run);
    }
  }
}

/* ---------------------------------------------------------------- memory */

/* Bytes of parameters + gradients + Adam's two moments of the whole model. */
static double unsharded_bytes(int64_t params) { return 4.0 * (double)params * sizeof(float); }

static void assert_memory_is_world_th(tr_shard_mode mode, int world) {
  run_spec run = {.model = MODEL_WIDE,
                  .fsdp = {.mode = mode},
                  .optim = optimisers[1],
                  .steps = 1,
                  .batch = 8};
  run_world(&run, world);
  for (int r = 0; r < world; r++) {
    const tr_fsdp_memory *m = &run.memory[r];
    double share = unsharded_bytes(m->params) / world;
    /* this rank's padding, and page rounding of 4 tensors (param, grad, 2 moments) a unit */
    double padding = ((double)m->local - (double)m->params / world) * sizeof(float);
    double slack = 4.0 * (padding + 4096.0 * m->units);
    print_message("    %s, world %d, rank %d: %zu bytes in use, 1/N of the model %.0f\n",
                  mode_names[mode], world, r, m->alloc.in_use, share);
    assert_true(m->local * world >= m->params && m->local * world < m->params + world * m->units);
    assert_true(fabs((double)m->alloc.in_use - share) <= slack);
  }
  run_free(&run);
}

static void full_shard_keeps_a_world_th_of_params_grads_and_state_per_rank(void **state) {
  (void)state;
  assert_memory_is_world_th(TR_SHARD_FULL, 2);
  assert_memory_is_world_th(TR_SHARD_FULL, 4);
}

static void grad_op_keeps_a_world_th_of_grads_and_state_per_rank(void **state) {
  (void)state;
  assert_memory_is_world_th(TR_SHARD_GRAD_OP, 2);
  assert_memory_is_world_th(TR_SHARD_GRAD_OP, 4);
}

static void no_sharding_keeps_the_whole_model_on_every_rank(void **state) {
  (void)state;
  run_spec run = {.model = MODEL_WIDE,
                  .fsdp = {.mode = TR_SHARD_NONE},
                  .optim = optimisers[1],
                  .steps = 1,
                  .batch = 8};
  run_world(&run, 4);
  for (int r = 0; r < 4; r++) {
    const tr_fsdp_memory *m = &run.memory[r];
    assert_int_equal(m->local, m->params);
    double whole = unsharded_bytes(m->params);
    assert_true((double)m->alloc.in_use >= whole);
    assert_true((double)m->alloc.in_use <= whole + 4.0 * 4096 * m->units);
  }
  run_free(&run);
}

static size_t peak_of_deep_step(bool checkpoint) {
  run_spec run = {.model = MODEL_DEEP,
                  .fsdp = {.mode = TR_SHARD_FULL, .checkpoint = checkpoint},
                  .optim = optimisers[0],
                  .steps = 1,
                  .batch = 256};
  run_world(&run, 2);
  assert_int_equal(run.memory[0].units, 9);
  size_t peak = run.memory[0].alloc.peak;
  run_free(&run);
  return peak;
}

static void checkpointing_lowers_the_peak_memory_of_a_deep_mlp(void **state) {
  (void)state;
  size_t with = peak_of_deep_step(true), without = peak_of_deep_step(false);
  print_message("    peak per rank: %zu bytes with checkpointing, %zu without\n", with, without);
  assert_true((double)with < 0.75 * (double)without);
}

/* ---------------------------------------------------------------- units, full model */

typedef struct {
  model_kind model;
  int64_t unit_params;
  int units; /* filled */
} units_probe;

static int count_units(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  units_probe *probe = arg;
  rank_state s = {0};
  run_spec run = {.model = probe->model, .fsdp = {.unit_params = probe->unit_params}};
  int rc = rank_setup(&s, &run, rank);
  if (rc == NAS_OK) probe->units = tr_fsdp_unit_count(s.f);
  if (rc) nas_errf(err, "%s", s.ctx.err.msg);
  rank_state_free(&s);
  return rc;
}

static int units_of(model_kind model, int64_t unit_params) {
  units_probe probe = {model, unit_params, 0};
  nas_err err = {{0}};
  assert_int_equal(tr_fsdp_run_threads(1, count_units, &probe, &err), NAS_OK);
  return probe.units;
}

static void units_follow_the_policy(void **state) {
  (void)state;
  /* MLP: linear 672, relu, linear 528, relu, linear 85 parameters */
  assert_int_equal(units_of(MODEL_MLP, 0), 3);       /* one per child with parameters */
  assert_int_equal(units_of(MODEL_MLP, 500), 3);     /* 672 | 528 | 85 */
  assert_int_equal(units_of(MODEL_MLP, 600), 2);     /* 672 | 528+85 */
  assert_int_equal(units_of(MODEL_MLP, 1000), 2);    /* 672+528 | 85 */
  assert_int_equal(units_of(MODEL_MLP, 100000), 1);  /* everything */
  /* layer norm has parameters: linear | norm, relu, dropout | linear, ... | linear */
  assert_int_equal(units_of(MODEL_MLP_DROPOUT, 0), 4);
  /* conv, relu, pool | conv, relu, pool, flatten | linear */
  assert_int_equal(units_of(MODEL_CNN, 0), 3);
}

/* Whether the summoned model computes what the sharded one does on x, and release gives
 * back the memory that summoning took (at least the model's bytes). */
static int check_summoned(rank_state *s, tr_tensor *x, nas_err *err) {
  tr_tensor *sharded = tr_fsdp_forward(&s->ctx, s->f, x);
  if (!sharded) return nas_errf(err, "%s", s->ctx.err.msg);
  tr_alloc_stats before, during, after;
  tr_allocator_stats(s->ctx.alloc, &before);
  int rc = tr_fsdp_summon_full(&s->ctx, s->f);
  tr_allocator_stats(s->ctx.alloc, &during);
  tr_tensor *summoned = rc == NAS_OK ? tr_module_forward(&s->ctx, s->model, x) : NULL;
  if (!summoned) rc = nas_errf(err, "%s", s->ctx.err.msg);
  /* to rounding: without grad a Sequential may fuse conv, ReLU and pool (infer.c) */
  for (int64_t i = 0; rc == NAS_OK && i < sharded->numel; i++)
    if (fabs(tr_get(sharded, i) - tr_get(summoned, i)) > 1e-5 * (1 + fabs(tr_get(sharded, i))))
      rc = nas_errf(err, "logit %lld: %g summoned, %g sharded", (long long)i,
                    tr_get(summoned, i), tr_get(sharded, i));
  tr_release(summoned);
  if (rc == NAS_OK && tr_fsdp_release_full(&s->ctx, s->f))
    rc = nas_errf(err, "%s", s->ctx.err.msg);
  tr_allocator_stats(s->ctx.alloc, &after);
  size_t model_bytes = (size_t)tr_module_param_count(s->model) * sizeof(float);
  bool gave_back = after.in_use == before.in_use;
  if (rc == NAS_OK && (during.in_use < before.in_use + model_bytes || !gave_back))
    rc = nas_errf(err, "in use: %zu before summon, %zu summoned, %zu released", before.in_use,
                  during.in_use, after.in_use);
  tr_release(sharded);
  return rc;
}

/* Summons, frees the tr_fsdp, and checks that the model still computes what it did. */
static int check_kept_after_free(rank_state *s, tr_tensor *x, nas_err *err) {
  if (tr_fsdp_summon_full(&s->ctx, s->f)) return nas_errf(err, "%s", s->ctx.err.msg);
  tr_tensor *before = tr_module_forward(&s->ctx, s->model, x);
  tr_fsdp_free(s->f);
  s->f = NULL;
  tr_tensor *after = before ? tr_module_forward(&s->ctx, s->model, x) : NULL;
  int rc = after ? NAS_OK : nas_errf(err, "%s", s->ctx.err.msg);
  if (rc == NAS_OK && memcmp(tr_f32(before), tr_f32(after), (size_t)after->numel * 4))
    rc = nas_errf(err, "the model computes otherwise once its tr_fsdp is freed");
  tr_release(after);
  tr_release(before);
  return rc;
}

/* Trains a step, then checks the summoned model without grad, then after tr_fsdp_free. */
static int summon_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  (void)arg;
  run_spec run = {.model = MODEL_CNN, .optim = optimisers[0], .steps = 1, .batch = 8};
  rank_state s = {0};
  int32_t labels[8];
  tr_tensor *x = batch_new(MODEL_CNN, 7, 8, labels);
  int rc = rank_setup(&s, &run, rank);
  if (rc == NAS_OK) rc = train_step(&s, &run, rank->rank, 0);
  if (rc) nas_errf(err, "%s", s.ctx.err.msg);
  tr_set_grad_enabled(&s.ctx, false);
  if (rc == NAS_OK) rc = check_summoned(&s, x, err);
  tr_optim_free(s.opt); /* it holds the shards */
  s.opt = NULL;
  if (rc == NAS_OK) rc = check_kept_after_free(&s, x, err);
  tr_release(x);
  rank_state_free(&s);
  return rc;
}

static void summoned_model_computes_what_the_sharded_one_does_and_outlives_fsdp(void **state) {
  (void)state;
  nas_err err = {{0}};
  int rc = tr_fsdp_run_threads(2, summon_rank, NULL, &err);
  if (rc) print_error("%s\n", err.msg);
  assert_int_equal(rc, NAS_OK);
}

/* A step between forward and backward changes the parameters the forward used: the
 * re-gather for backward must not pass that off as the same tensor. */
static int step_inside_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  (void)arg;
  run_spec run = {.model = MODEL_MLP, .optim = optimisers[0], .steps = 1, .batch = 8};
  rank_state s = {0};
  int32_t labels[8];
  tr_tensor *x = batch_new(MODEL_MLP, 0, 8, labels), *logits = NULL, *loss = NULL;
  int rc = rank_setup(&s, &run, rank);
  if (rc == NAS_OK) rc = train_step(&s, &run, rank->rank, 0);
  if (rc == NAS_OK) {
    logits = tr_fsdp_forward(&s.ctx, s.f, x);
    loss = logits ? tr_cross_entropy(&s.ctx, logits, labels) : NULL;
    rc = loss ? tr_optim_step(&s.ctx, s.opt) : NAS_ERR; /* the old gradients are still there */
  }
  if (rc == NAS_OK) rc = tr_fsdp_backward(&s.ctx, s.f, loss);
  if (rc) nas_errf(err, "%s", s.ctx.err.msg);
  tr_release(loss);
  tr_release(logits);
  tr_release(x);
  rank_state_free(&s);
  return rc;
}

static void step_between_forward_and_backward_fails_the_version_check(void **state) {
  (void)state;
  nas_err err = {{0}};
  assert_int_equal(tr_fsdp_run_threads(2, step_inside_rank, NULL, &err), NAS_ERR);
  print_message("    %s\n", err.msg);
  assert_non_null(strstr(err.msg, "modified by an in-place operation"));
}

/* ---------------------------------------------------------------- errors */

/* tr_fsdp_new on one rank with cfg; returns its error message (owned) or NULL. The model
 * is left usable on failure: a forward through it still works. */
static char *new_error(tr_module *model, const tr_fsdp_config *cfg, bool allocator,
                       bool prefetch_comm) {
  nas_err err = {{0}};
  tr_comm_group *g = tr_comm_group_new(1, &err), *pg = tr_comm_group_new(1, &err);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  if (allocator) ctx.alloc = tr_allocator_new(1 << 20);
  tr_fsdp *f = tr_fsdp_new(&ctx, model, tr_comm_group_comm(g, 0, &err),
                           prefetch_comm ? tr_comm_group_comm(pg, 0, &err) : NULL, cfg);
  char *msg = f ? NULL : strdup(ctx.err.msg);
  if (!f) {
    tr_tensor *x = tr_zeros(&ctx, TR_F32, 2, (int64_t[]){2, 20});
    tr_tensor *y = tr_module_forward(&ctx, model, x);
    assert_non_null(y);
    tr_release(y);
    tr_release(x);
  }
  tr_fsdp_free(f);
  tr_allocator_release(ctx.alloc);
  tr_comm_group_free(pg);
  tr_comm_group_free(g);
  return msg;
}

static void assert_refused(tr_module *model, tr_fsdp_config cfg, bool allocator,
                           bool prefetch_comm, const char *needle) {
  char *msg = new_error(model, &cfg, allocator, prefetch_comm);
  assert_non_null(msg);
  print_message("    %s\n", msg);
  assert_non_null(strstr(msg, needle));
  free(msg);
}

static void configs_that_make_no_sense_are_refused_clearly(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_module *model = model_new(&ctx, MODEL_MLP);
  assert_refused(model, (tr_fsdp_config){.unit_params = -5}, true, true, "negative");
  assert_refused(model, (tr_fsdp_config){.mode = (tr_shard_mode)7}, true, true,
                 "unknown sharding mode 7");
  assert_refused(model, (tr_fsdp_config){.prefetch = true}, true, false,
                 "prefetch needs a communicator");
  assert_refused(model, (tr_fsdp_config){0}, false, true, "no allocator");
  tr_module *bare = tr_sequential_new(&ctx);
  add(&ctx, bare, tr_activation_new(&ctx, TR_RELU));
  assert_refused(bare, (tr_fsdp_config){0}, true, true, "no parameters");
  tr_module_free(bare);
  tr_module_free(model);
}

static int slice_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  const int64_t *global = arg;
  run_spec run = {.model = MODEL_MLP, .optim = optimisers[0]};
  rank_state s = {0};
  int rc = rank_setup(&s, &run, rank);
  int64_t start, count;
  if (rc) nas_errf(err, "%s", s.ctx.err.msg);
  if (rc == NAS_OK) rc = tr_fsdp_batch_slice(s.f, *global, &start, &count, err);
  if (rc == NAS_OK && (count != *global / rank->world || start != rank->rank * count))
    rc = nas_errf(err, "rank %d got [%lld, +%lld)", rank->rank, (long long)start, (long long)count);
  rank_state_free(&s);
  return rc;
}

static void a_batch_that_does_not_split_over_the_world_is_refused(void **state) {
  (void)state;
  nas_err err = {{0}};
  int64_t global = 12;
  assert_int_equal(tr_fsdp_run_threads(4, slice_rank, &global, &err), NAS_OK);
  global = 10;
  assert_int_equal(tr_fsdp_run_threads(4, slice_rank, &global, &err), NAS_ERR);
  print_message("    %s\n", err.msg);
  assert_non_null(strstr(err.msg, "global batch of 10 examples does not split evenly over 4"));
  assert_int_equal(tr_fsdp_run_threads(0, slice_rank, &global, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "world size must be at least 1"));
}

/* Rank 1 builds a model of another shape: the start broadcast fails on every rank. */
static int mismatched_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  (void)arg;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  ctx.alloc = tr_allocator_new(1 << 20);
  tr_module *model = rank->rank == 1 ? mlp_new(&ctx, (int64_t[]){20, 33, 16, 5}, 4, false)
                                     : model_new(&ctx, MODEL_MLP);
  tr_fsdp *f = tr_fsdp_new(&ctx, model, rank->comm, NULL, &(tr_fsdp_config){0});
  int rc = f ? NAS_OK : nas_errf(err, "%s", ctx.err.msg);
  tr_fsdp_free(f);
  tr_module_free(model);
  tr_allocator_release(ctx.alloc);
  return rc;
}

static void ranks_with_different_models_all_fail_without_deadlock(void **state) {
  (void)state;
  nas_err err = {{0}};
  assert_int_equal(tr_fsdp_run_threads(2, mismatched_rank, NULL, &err), NAS_ERR);
  print_message("    %s\n", err.msg);
  assert_non_null(strstr(err.msg, "same model"));
}

/* Rank 1 fails before its first collective (as one whose model cannot be built would);
 * rank 0 goes on into an all-reduce that waits for it. */
static int rank_failing_alone(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  (void)arg;
  if (rank->rank == 1) return nas_errf(err, "no model for this rank");
  double x = 1;
  return tr_comm_all_reduce(rank->comm, TR_F64, &x, &x, 1, TR_REDUCE_SUM, err);
}

/* Runs in a forked child, so a hang fails the test instead of hanging it. */
static void a_rank_that_fails_alone_fails_the_ranks_waiting_for_it(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(stdout);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    nas_err err = {{0}};
    int rc = tr_fsdp_run_threads(2, rank_failing_alone, NULL, &err);
    ssize_t wrote = write(fds[1], err.msg, strlen(err.msg) + 1);
    _exit(rc == NAS_ERR && wrote > 0 ? 0 : 1);
  }
  close(fds[1]);
  int status = 0;
  double deadline = nas_monotonic() + 10;
  while (waitpid(pid, &status, WNOHANG) == 0 && nas_monotonic() < deadline) nas_sleep(0.01);
  bool hung = kill(pid, 0) == 0 && waitpid(pid, &status, WNOHANG) == 0;
  if (hung) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  char msg[sizeof(nas_err)] = "";
  ssize_t got = read(fds[0], msg, sizeof msg - 1);
  close(fds[0]);
  print_message("    %s\n", got > 0 ? msg : "(nothing)");
  assert_false(hung);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* the waiting rank's message names who left and why */
  assert_non_null(strstr(msg, "all_reduce"));
  assert_non_null(strstr(msg, "rank 1"));
  assert_non_null(strstr(msg, "no model for this rank"));
}

/* ---------------------------------------------------------------- devices: the checks */

/* Marks every parameter and buffer of m (only the first parameter: first_only) as being
 * on device without moving any data. tr_fsdp_new decides placement from where tensors say
 * they are and refuses before it touches any memory, so its device checks run on a
 * machine without a GPU too. */
static void tag_device(tr_module *m, tr_device device, bool first_only) {
  tr_param_list list = {0};
  assert_int_equal(tr_module_parameters(m, true, &list, NULL), NAS_OK);
  for (size_t i = 0; i < (first_only ? 1 : list.n); i++) list.items[i]->storage->device = device;
  tr_param_list_free(&list);
}

/* tr_fsdp_new of model (tagged) on one thread rank; its error (owned), the model retagged
 * to the CPU and shown untouched by a forward. */
static char *tagged_error(tr_module *model, tr_device device, bool first_only) {
  nas_err err = {{0}};
  tr_comm_group *g = tr_comm_group_new(1, &err);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  ctx.alloc = tr_allocator_new(1 << 20);
  tag_device(model, device, first_only);
  tr_fsdp *f = tr_fsdp_new(&ctx, model, tr_comm_group_comm(g, 0, &err), NULL,
                           &(tr_fsdp_config){0});
  tag_device(model, TR_DEVICE_CPU, false);
  assert_null(f);
  char *msg = strdup(ctx.err.msg);
  print_message("    %s\n", msg);
  tr_tensor *x = tr_zeros(&ctx, TR_F32, 2, (int64_t[]){2, 20});
  tr_tensor *y = tr_module_forward(&ctx, model, x);
  assert_non_null(y);
  tr_release(y);
  tr_release(x);
  tr_allocator_release(ctx.alloc);
  tr_comm_group_free(g);
  return msg;
}

static void a_model_split_over_devices_or_on_a_gpu_with_a_cpu_communicator_is_refused(
    void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_module *model = model_new(&ctx, MODEL_MLP);
  char *msg = tagged_error(model, TR_DEVICE_CUDA(0), true);
  assert_non_null(strstr(msg, "0.bias is on cpu but 0.weight on cuda:0"));
  assert_non_null(strstr(msg, "the model must be on one device"));
  free(msg);
  msg = tagged_error(model, TR_DEVICE_CUDA(0), false);
  assert_non_null(strstr(msg, "the model is on cuda:0 but the main communicator is a CPU one"));
  free(msg);
  tr_module_free(model);
}

/* ---------------------------------------------------------------- devices: one GPU */

/* One rank on device 0: its engine and a world-1 NCCL communicator, or a skip saying why
 * there are none. ctx.alloc serves the host tensors (batches). */
typedef struct {
  tr_ctx ctx;
  tr_cuda *cu;
  tr_comm *comm;
} gpu_rank;

static tr_comm *nccl_join(const char *tag) {
  tr_comm_options o = {.backend = TR_COMM_NCCL, .world = 1, .nodes = 1, .timeout_s = 60};
  snprintf(o.name, sizeof o.name, "test-fsdp-%d-%s", (int)getpid(), tag);
  tr_comm *comm = NULL;
  nas_err err = {{0}};
  if (tr_comm_join(&o, &comm, &err) != NAS_OK) fail_msg("NCCL join: %s", err.msg);
  return comm;
}

static void gpu_rank_open(gpu_rank *g) {
  nas_err err = {{0}};
  if (tr_cuda_device_count(&err) == 0) {
    print_message("skipped: FSDP on a GPU needs a CUDA device (%s)\n", err.msg);
    skip();
  }
  tr_ctx_init(&g->ctx, MODEL_SEED);
  g->cu = tr_cuda_new(0, (size_t)1 << 30, &err);
  if (!g->cu) fail_msg("tr_cuda_new: %s", err.msg);
  g->ctx.cuda = g->cu;
  g->ctx.alloc = tr_allocator_new((size_t)64 << 20);
  g->comm = nccl_join("main");
}

static void gpu_rank_close(gpu_rank *g) {
  nas_err err = {{0}};
  assert_int_equal(tr_cuda_sync(g->cu, &err), NAS_OK);
  tr_comm_free(g->comm);
  tr_allocator_release(g->ctx.alloc);
  tr_cuda_free(g->cu);
}

/* kind built from MODEL_SEED (as reference_train builds it) and moved to device 0. */
static tr_module *gpu_model_new(gpu_rank *g, model_kind kind) {
  tr_ctx seeded;
  tr_ctx_init(&seeded, MODEL_SEED);
  memcpy(g->ctx.rng, seeded.rng, sizeof g->ctx.rng);
  tr_module *m = model_new(&g->ctx, kind);
  if (tr_module_to_device(&g->ctx, m, TR_DEVICE_CUDA(0)) != NAS_OK)
    fail_msg("model to the device: %s", g->ctx.err.msg);
  return m;
}

/* All of m's parameters (on the device), concatenated on the host (owned). */
static float *gpu_params_copy(tr_ctx *ctx, tr_module *m) {
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(m, false, &ps, NULL), NAS_OK);
  float *out = malloc((size_t)tr_module_param_count(m) * sizeof *out);
  assert_non_null(out);
  bool grad = tr_set_grad_enabled(ctx, false);
  int64_t off = 0;
  for (size_t i = 0; i < ps.n; i++) {
    tr_tensor *h = tr_to_device(ctx, ps.items[i], TR_DEVICE_CPU);
    if (!h) fail_msg("parameter to the host: %s", ctx->err.msg);
    memcpy(out + off, tr_f32(h), (size_t)h->numel * sizeof *out);
    off += h->numel;
    tr_release(h);
  }
  tr_set_grad_enabled(ctx, grad);
  tr_param_list_free(&ps);
  return out;
}

/* One step on the whole global batch of `step`, through f (or plainly, f NULL). */
static void gpu_step(gpu_rank *g, const run_spec *run, tr_module *m, tr_fsdp *f, tr_optim *opt,
                     tr_param_list *ps, int step) {
  tr_ctx *ctx = &g->ctx;
  int32_t labels[MAX_BATCH];
  tr_tensor *x = batch_new(run->model, step, run->batch, labels);
  tr_tensor *xd = tr_to_device(ctx, x, TR_DEVICE_CUDA(0));
  tr_optim_zero_grad(opt);
  tr_tensor *logits = !xd ? NULL
                      : f ? tr_fsdp_forward(ctx, f, xd)
                          : tr_module_forward(ctx, m, xd);
  tr_tensor *loss = logits ? tr_cross_entropy(ctx, logits, labels) : NULL;
  int rc = !loss ? NAS_ERR
           : f   ? tr_fsdp_backward(ctx, f, loss)
                 : tr_backward(ctx, loss, NULL, false);
  if (rc == NAS_OK && run->clip > 0) {
    if (f)
      rc = tr_fsdp_clip_grad_norm(ctx, f, run->clip, NULL);
    else
      rc = tr_clip_grad_norm(ctx, ps->items, ps->n, run->clip, NULL);
  }
  if (rc == NAS_OK) rc = tr_optim_step(ctx, opt);
  if (rc != NAS_OK) fail_msg("step %d: %s", step, ctx->err.msg);
  tr_release(loss);
  tr_release(logits);
  tr_release(xd);
  tr_release(x);
}

/* run's training on device 0, through FSDP over the NCCL communicator (with_fsdp) or as
 * plain single-device training; the parameters at the end, on the host (owned). With FSDP
 * also checks that the memory statistics are the device allocator's. */
static float *gpu_train(gpu_rank *g, const run_spec *run, bool with_fsdp) {
  tr_ctx *ctx = &g->ctx;
  tr_module *m = gpu_model_new(g, run->model);
  tr_param_list ps = {0};
  tr_fsdp *f = NULL;
  tr_optim *opt;
  if (with_fsdp) {
    f = tr_fsdp_new(ctx, m, g->comm, NULL, &run->fsdp);
    if (!f) fail_msg("tr_fsdp_new: %s", ctx->err.msg);
    opt = tr_fsdp_optim_new(ctx, f, &run->optim);
  } else {
    assert_int_equal(tr_module_parameters(m, false, &ps, NULL), NAS_OK);
    opt = tr_optim_new(ctx, &run->optim, ps.items, ps.n);
  }
  assert_non_null(opt);
  for (int step = 0; step < run->steps; step++) gpu_step(g, run, m, f, opt, &ps, step);
  if (f) {
    tr_fsdp_memory fm;
    tr_alloc_stats device;
    tr_fsdp_memory_stats(f, &fm);
    tr_cuda_memory_stats(g->cu, &device);
    assert_true(fm.alloc.in_use > 0);
    assert_int_equal(fm.alloc.in_use, device.in_use);
    assert_int_equal(fm.alloc.peak, device.peak);
    assert_int_equal(tr_fsdp_summon_full(ctx, f), NAS_OK);
  }
  float *out = gpu_params_copy(ctx, m);
  if (f) assert_int_equal(tr_fsdp_release_full(ctx, f), NAS_OK);
  tr_optim_free(opt);
  tr_fsdp_free(f);
  tr_param_list_free(&ps);
  tr_module_free(m);
  return out;
}

static void one_gpu_fsdp_trains_like_plain_gpu_and_cpu_training_in_every_mode(void **state) {
  (void)state;
  gpu_rank g;
  gpu_rank_open(&g);
  const model_kind models[] = {MODEL_MLP, MODEL_CNN};
  for (size_t k = 0; k < 2; k++) {
    for (size_t o = 0; o < sizeof optimisers / sizeof *optimisers; o++) {
      run_spec base = {.model = models[k], .optim = optimisers[o], .steps = 3, .batch = 16,
                       .clip = 0.5};
      float *cpu = reference_train(&base, 1, NULL);
      float *plain = gpu_train(&g, &base, false);
      int64_t n = 0;
      tr_module *counted = model_new(&g.ctx, base.model);
      n = tr_module_param_count(counted);
      tr_module_free(counted);
      assert_close(plain, cpu, n, 1e-4, "plain GPU training against the CPU");
      for (int mode = 0; mode < 3; mode++) {
        for (int checkpoint = 0; checkpoint < 2; checkpoint++) {
          run_spec run = base;
          run.fsdp = (tr_fsdp_config){.mode = (tr_shard_mode)mode, .checkpoint = checkpoint};
          float *sharded = gpu_train(&g, &run, true);
          char what[160];
          snprintf(what, sizeof what, "model %d, optimiser %zu, %s, checkpoint %d",
                   (int)models[k], o, mode_names[mode], checkpoint);
          assert_close(sharded, plain, n, 1e-5, what);
          assert_close(sharded, cpu, n, 1e-4, what);
          free(sharded);
        }
      }
      free(plain);
      free(cpu);
    }
  }
  gpu_rank_close(&g);
}

/* tr_fsdp_new's error on g's device ctx (engine unset when no_engine), or NULL. */
static char *gpu_new_error(gpu_rank *g, tr_module *m, tr_comm *comm, tr_comm *prefetch_comm,
                           tr_fsdp_config cfg, bool no_engine) {
  tr_cuda *engine = g->ctx.cuda;
  if (no_engine) g->ctx.cuda = NULL;
  tr_fsdp *f = tr_fsdp_new(&g->ctx, m, comm, prefetch_comm, &cfg);
  g->ctx.cuda = engine;
  if (f) {
    tr_fsdp_free(f);
    return NULL;
  }
  print_message("    %s\n", g->ctx.err.msg);
  return strdup(g->ctx.err.msg);
}

static void assert_gpu_refused(gpu_rank *g, tr_module *m, tr_comm *comm, tr_comm *prefetch_comm,
                               tr_fsdp_config cfg, bool no_engine, const char *needle) {
  char *msg = gpu_new_error(g, m, comm, prefetch_comm, cfg, no_engine);
  assert_non_null(msg);
  assert_non_null(strstr(msg, needle));
  free(msg);
}

static void a_gpu_model_needs_nccl_its_engine_and_no_prefetch(void **state) {
  (void)state;
  gpu_rank g;
  gpu_rank_open(&g);
  nas_err err = {{0}};
  tr_comm_group *threads = tr_comm_group_new(1, &err);
  tr_comm *cpu_comm = tr_comm_group_comm(threads, 0, &err);
  tr_comm *second = nccl_join("prefetch");
  tr_module *device_model = gpu_model_new(&g, MODEL_MLP);
  assert_gpu_refused(&g, device_model, cpu_comm, NULL, (tr_fsdp_config){0}, false,
                     "main communicator is a CPU one");
  assert_gpu_refused(&g, device_model, g.comm, NULL, (tr_fsdp_config){0}, true,
                     "ctx->cuda is NULL");
  assert_gpu_refused(&g, device_model, g.comm, second, (tr_fsdp_config){.prefetch = true},
                     false, "prefetch is not supported for a model on cuda:0");
  tr_module *cpu_model = model_new(&g.ctx, MODEL_MLP);
  assert_gpu_refused(&g, cpu_model, g.comm, NULL, (tr_fsdp_config){0}, false,
                     "the model is on the cpu but the main communicator is NCCL");
  /* refused before anything moved: the device model still computes */
  int32_t labels[MAX_BATCH];
  tr_tensor *x = batch_new(MODEL_MLP, 0, 4, labels);
  tr_tensor *xd = tr_to_device(&g.ctx, x, TR_DEVICE_CUDA(0));
  tr_tensor *y = xd ? tr_module_forward(&g.ctx, device_model, xd) : NULL;
  if (!y) fail_msg("the refused model no longer computes: %s", g.ctx.err.msg);
  tr_release(y);
  tr_release(xd);
  tr_release(x);
  tr_module_free(cpu_model);
  tr_module_free(device_model);
  tr_comm_free(second);
  tr_comm_group_free(threads);
  gpu_rank_close(&g);
}

/* tr_fit_sharded on one GPU: its per-step agreement between ranks and the final gather
 * run over NCCL, with host values staged through the device; prefetch, asked for with a
 * second communicator at hand, is left out on the device instead of refused. */
static void sharded_fit_trains_a_gpu_model_over_nccl(void **state) {
  (void)state;
  gpu_rank g;
  gpu_rank_open(&g);
  tr_dataset data = {.n = 64, .nclasses = 5, .y = malloc(64 * sizeof(int32_t))};
  assert_non_null(data.y);
  data.x = batch_new(MODEL_MLP, 0, data.n, data.y);
  tr_module *m = gpu_model_new(&g, MODEL_MLP);
  float *before = gpu_params_copy(&g.ctx, m);
  tr_comm *second = nccl_join("fit-prefetch"); /* fit must not use it on a GPU */
  tr_fit_ranks ranks = {g.comm, second, {.mode = TR_SHARD_FULL, .prefetch = true}};
  tr_fit_config cfg = {.epochs = 2, .batch_size = 16, .optim = optimisers[0],
                       .device = TR_DEVICE_CUDA(0)};
  double accuracy = -1;
  nas_err err = {{0}};
  int rc = tr_fit_sharded(&g.ctx, m, &ranks, &data, &data, &cfg, &accuracy, &err);
  if (rc != NAS_OK) print_error("%s\n", err.msg);
  assert_int_equal(rc, NAS_OK);
  assert_true(accuracy >= 0 && accuracy <= 1);
  float *after = gpu_params_copy(&g.ctx, m);
  int64_t n = tr_module_param_count(m), changed = 0;
  for (int64_t i = 0; i < n; i++) changed += after[i] != before[i];
  assert_true(changed > n / 2);
  free(after);
  free(before);
  tr_module_free(m);
  tr_dataset_free(&data);
  tr_comm_free(second);
  gpu_rank_close(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mlp_trains_like_single_rank_in_every_mode_world_and_option),
      cmocka_unit_test(mlp_with_layer_norm_and_dropout_trains_like_single_rank),
      cmocka_unit_test(cnn_trains_like_single_rank_in_every_mode_world_and_option),
      cmocka_unit_test(units_grouped_by_a_threshold_train_like_single_rank),
      cmocka_unit_test(prefetch_changes_no_bit),
      cmocka_unit_test(checkpointing_with_dropout_changes_no_bit),
      cmocka_unit_test(checkpointing_with_batch_norm_changes_no_bit),
      cmocka_unit_test(clipping_uses_the_global_norm_over_all_ranks),
      cmocka_unit_test(full_shard_keeps_a_world_th_of_params_grads_and_state_per_rank),
      cmocka_unit_test(grad_op_keeps_a_world_th_of_grads_and_state_per_rank),
      cmocka_unit_test(no_sharding_keeps_the_whole_model_on_every_rank),
      cmocka_unit_test(checkpointing_lowers_the_peak_memory_of_a_deep_mlp),
      cmocka_unit_test(units_follow_the_policy),
      cmocka_unit_test(summoned_model_computes_what_the_sharded_one_does_and_outlives_fsdp),
      cmocka_unit_test(step_between_forward_and_backward_fails_the_version_check),
      cmocka_unit_test(configs_that_make_no_sense_are_refused_clearly),
      cmocka_unit_test(a_batch_that_does_not_split_over_the_world_is_refused),
      cmocka_unit_test(ranks_with_different_models_all_fail_without_deadlock),
      cmocka_unit_test(a_rank_that_fails_alone_fails_the_ranks_waiting_for_it),
      cmocka_unit_test(a_model_split_over_devices_or_on_a_gpu_with_a_cpu_communicator_is_refused),
      cmocka_unit_test(one_gpu_fsdp_trains_like_plain_gpu_and_cpu_training_in_every_mode),
      cmocka_unit_test(a_gpu_model_needs_nccl_its_engine_and_no_prefetch),
      cmocka_unit_test(sharded_fit_trains_a_gpu_model_over_nccl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
