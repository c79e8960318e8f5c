/* Pipeline parallelism (trainer/pipeline.h) on thread stages, on process stages over
 * shared memory and (with CUDA devices; skipped without) on GPU stages over NCCL:
 * training through 1, 2 or 4 stages with 1, 2, 4 or 8 micro-batches in every checkpoint
 * mode gives the parameters of single-rank training, also for residual models whose skip
 * connections cross stages; checkpointing with dropout changes no bit;
 * deferred batch norm moves the running statistics by the whole mini-batch; balancing
 * finds the known best cuts and counts the tensors skips carry; a stage that fails,
 * stalls or (a process) dies fails every stage with one message; configurations that do
 * not fit the model are refused.
 *
 * Batch norm normalises each micro-batch by its own statistics (GPipe's semantics), so a
 * model with batch norm is compared with a single-rank reference that runs the same
 * micro-batches one after another and adds their loss-weighted gradients; a model without
 * with plain training on the whole mini-batch. cmocka's asserts run on the main thread (or
 * the test process, which plays stage 0 of process stages): stages return errors. */
#include "tests/testutil.h"
#include "tests/trainer_compare.h"

#include <dirent.h>
#include <math.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "trainer/pipeline.h"
#include "trainer/trainer.h"

#define MAX_STAGES 4
#define MAX_BATCH 256
#define MODEL_SEED 11
#define TIMEOUT_S 30.0

typedef enum {
  MODEL_MLP,         /* 20-32-16-5, ReLU: 5 children */
  MODEL_MLP_DROPOUT, /* the same with dropout after each ReLU: 7 children */
  MODEL_CNN_BN,      /* conv, bn, relu, pool, conv, bn, relu, pool, flatten, linear */
  MODEL_CNN_BN1,     /* conv, bn, relu, pool, flatten, linear: one batch norm */
  MODEL_DEEP,        /* 20 -> 8 x (Linear 64, ReLU) -> 5: 17 children */
  MODEL_WIDE,        /* 20-4096-5, ReLU: activations of 16 KiB an example */
  MODEL_RES_MLP,     /* an MLP with a residual add and a concatenating skip: 13 children */
  MODEL_RES_CNN,     /* a CNN with batch norm and a residual block: 13 children */
  MODEL_RES_DEEP,    /* 20 -> Linear 64, ReLU -> 4 x (stash, Linear 64, ReLU, Linear 64,
                        pop add, ReLU) -> 5: 27 children, a skip across each cut */
  MODEL_POP_FIRST,   /* Linear, a skip's pop, then its stash, Linear: not a model */
  MODEL_NESTED_BN,   /* conv, residual block (conv, bn, relu), relu, pool, flatten, linear:
                        its batch norm inside a child, as built-in ResNets have them */
} model_kind;

/* ---------------------------------------------------------------- models and data */

static void add(tr_ctx *ctx, tr_module *seq, tr_module *child) {
  assert_int_equal(tr_sequential_add(ctx, seq, child), NAS_OK);
}

static tr_module *mlp_new(tr_ctx *ctx, bool dropout) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_linear_new(ctx, 20, 32, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  if (dropout) add(ctx, m, tr_dropout_new(ctx, 0.25));
  add(ctx, m, tr_linear_new(ctx, 32, 16, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  if (dropout) add(ctx, m, tr_dropout_new(ctx, 0.25));
  add(ctx, m, tr_linear_new(ctx, 16, 5, true));
  return m;
}

static tr_module *cnn_new(tr_ctx *ctx, int blocks) {
  tr_module *m = tr_sequential_new(ctx);
  int64_t in = 1, side = 8;
  for (int b = 0; b < blocks; b++) {
    add(ctx, m, tr_conv2d_new(ctx, in, 4 * (b + 1), 3, 1, 1, false));
    add(ctx, m, tr_batchnorm_new(ctx, 4 * (b + 1)));
    add(ctx, m, tr_activation_new(ctx, TR_RELU));
    add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
    in = 4 * (b + 1);
    side /= 2;
  }
  add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  add(ctx, m, tr_linear_new(ctx, in * side * side, 5, true));
  return m;
}

static tr_module *deep_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  for (int i = 0; i < 8; i++) {
    add(ctx, m, tr_linear_new(ctx, i ? 64 : 20, 64, true));
    add(ctx, m, tr_activation_new(ctx, TR_RELU));
  }
  add(ctx, m, tr_linear_new(ctx, 64, 5, true));
  return m;
}

static tr_module *wide_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_linear_new(ctx, 20, 4096, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_linear_new(ctx, 4096, 5, true));
  return m;
}

/* Both skips cross stages however 2 or 4 stages cut the 13 children evenly (4 stages:
 * the first from stage 0 to stage 2, the second from 2 to 3). */
static tr_module *res_mlp_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx), *stash, *pop, *stash2, *pop2;
  assert_int_equal(tr_skip_new(ctx, TR_SKIP_ADD, &stash, &pop), NAS_OK);
  assert_int_equal(tr_skip_new(ctx, TR_SKIP_CONCAT, &stash2, &pop2), NAS_OK);
  add(ctx, m, tr_linear_new(ctx, 20, 32, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, stash);
  add(ctx, m, tr_linear_new(ctx, 32, 32, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_linear_new(ctx, 32, 32, true));
  add(ctx, m, pop); /* x + the block's input */
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, stash2);
  add(ctx, m, tr_linear_new(ctx, 32, 32, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, pop2); /* [x, the block's input]: 64 features */
  add(ctx, m, tr_linear_new(ctx, 64, 5, true));
  return m;
}

static tr_module *res_cnn_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx), *stash, *pop;
  assert_int_equal(tr_skip_new(ctx, TR_SKIP_ADD, &stash, &pop), NAS_OK);
  add(ctx, m, tr_conv2d_new(ctx, 1, 4, 3, 1, 1, false));
  add(ctx, m, tr_batchnorm_new(ctx, 4));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, stash);
  add(ctx, m, tr_conv2d_new(ctx, 4, 4, 3, 1, 1, false));
  add(ctx, m, tr_batchnorm_new(ctx, 4));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_conv2d_new(ctx, 4, 4, 3, 1, 1, true));
  add(ctx, m, pop);
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  add(ctx, m, tr_linear_new(ctx, 4 * 4 * 4, 5, true));
  return m;
}

static tr_module *res_deep_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_linear_new(ctx, 20, 64, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  for (int i = 0; i < 4; i++) {
    tr_module *stash, *pop;
    assert_int_equal(tr_skip_new(ctx, TR_SKIP_ADD, &stash, &pop), NAS_OK);
    add(ctx, m, stash);
    add(ctx, m, tr_linear_new(ctx, 64, 64, true));
    add(ctx, m, tr_activation_new(ctx, TR_RELU));
    add(ctx, m, tr_linear_new(ctx, 64, 64, true));
    add(ctx, m, pop);
    add(ctx, m, tr_activation_new(ctx, TR_RELU));
  }
  add(ctx, m, tr_linear_new(ctx, 64, 5, true));
  return m;
}

static tr_module *pop_first_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx), *stash, *pop;
  assert_int_equal(tr_skip_new(ctx, TR_SKIP_ADD, &stash, &pop), NAS_OK);
  add(ctx, m, tr_linear_new(ctx, 20, 5, true));
  add(ctx, m, pop);
  add(ctx, m, stash);
  add(ctx, m, tr_linear_new(ctx, 5, 5, true));
  return m;
}

static tr_module *nested_bn_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx), *body = tr_sequential_new(ctx);
  add(ctx, body, tr_conv2d_new(ctx, 4, 4, 3, 1, 1, false));
  add(ctx, body, tr_batchnorm_new(ctx, 4));
  add(ctx, body, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_conv2d_new(ctx, 1, 4, 3, 1, 1, true));
  add(ctx, m, tr_residual_new(ctx, body, NULL));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  add(ctx, m, tr_linear_new(ctx, 4 * 4 * 4, 5, true));
  return m;
}

static tr_module *model_new(tr_ctx *ctx, model_kind kind) {
  switch (kind) {
  case MODEL_MLP: return mlp_new(ctx, false);
  case MODEL_MLP_DROPOUT: return mlp_new(ctx, true);
  case MODEL_CNN_BN: return cnn_new(ctx, 2);
  case MODEL_CNN_BN1: return cnn_new(ctx, 1);
  case MODEL_DEEP: return deep_new(ctx);
  case MODEL_WIDE: return wide_new(ctx);
  case MODEL_RES_MLP: return res_mlp_new(ctx);
  case MODEL_RES_CNN: return res_cnn_new(ctx);
  case MODEL_RES_DEEP: return res_deep_new(ctx);
  case MODEL_POP_FIRST: return pop_first_new(ctx);
  case MODEL_NESTED_BN: return nested_bn_new(ctx);
  }
  return NULL;
}

static bool is_cnn(model_kind kind) {
  return kind == MODEL_CNN_BN || kind == MODEL_CNN_BN1 || kind == MODEL_RES_CNN ||
         kind == MODEL_NESTED_BN;
}

/* The mini-batch of a step and its labels. */
static tr_tensor *batch_new(model_kind kind, int step, int64_t batch, int32_t *labels) {
  tr_ctx gen;
  tr_ctx_init(&gen, 4242 + (uint64_t)step);
  tr_tensor *x = is_cnn(kind) ? tr_randn(&gen, TR_F32, 4, (int64_t[]){batch, 1, 8, 8}, 1.0)
                              : tr_randn(&gen, TR_F32, 2, (int64_t[]){batch, 20}, 1.0);
  for (int64_t i = 0; i < batch; i++) labels[i] = (int32_t)(tr_rand_u64(&gen) % 5);
  return x;
}

/* ---------------------------------------------------------------- one pipeline run */

typedef struct {
  model_kind model;
  tr_pipe_config pipe;
  int steps;
  int64_t batch;
  /* failure injection on the last stage: fail or sleep in the loss of this step (-1: no) */
  int fail_step, stall_step;
  double stall_s;
  int fail_setup_stage; /* this stage fails before making its tr_pipe (-1: none) */
  int die_step;         /* process stages: the last stage's process exits in this step */
  bool cuda;            /* stage s trains on CUDA device s (processes over NCCL) */
  /* filled by the stages */
  float *state; /* owned: stage 0's gathered parameters and buffers */
  float *params; /* owned: and its parameters alone */
  int64_t n_state, n_params;
  double loss[TR_PIPE_MAX_STAGES]; /* each stage's loss of the last step */
  nas_err errors[TR_PIPE_MAX_STAGES];
  tr_pipe_memory memory[TR_PIPE_MAX_STAGES];
} run_spec;

typedef struct {
  const run_spec *run;
  const int32_t *labels;
  int step;
} loss_arg;

static tr_tensor *loss_of(tr_ctx *ctx, tr_tensor *out, int64_t start, int64_t count, void *arg) {
  const loss_arg *a = arg;
  (void)count;
  if (a->step == a->run->fail_step) {
    nas_errf(&ctx->err, "the loss is out of order");
    return NULL;
  }
  if (a->step == a->run->stall_step) nas_sleep(a->run->stall_s);
  if (a->step == a->run->die_step) _exit(3);
  return tr_cross_entropy(ctx, out, a->labels + start);
}

static const tr_optim_config optimiser = {.kind = TR_SGD, .lr = 0.1, .momentum = 0.9};

static int stage_steps(tr_ctx *ctx, run_spec *run, const tr_pipe_rank *rank, tr_pipe *p,
                       tr_optim *opt) {
  int rc = NAS_OK;
  for (int step = 0; step < run->steps && rc == NAS_OK; step++) {
    int32_t labels[MAX_BATCH];
    tr_tensor *x = batch_new(run->model, step, run->batch, labels);
    loss_arg arg = {run, labels, step};
    tr_optim_zero_grad(opt);
    rc = tr_pipe_train_step(ctx, p, rank->stage == 0 ? x : NULL, run->batch, loss_of, &arg,
                            &run->loss[rank->stage]);
    if (rc == NAS_OK) rc = tr_optim_step(ctx, opt);
    tr_release(x);
  }
  return rc;
}

/* With run->cuda: the engine of device `stage` into ctx, and the model moved there. */
static int stage_to_gpu(tr_ctx *ctx, const run_spec *run, int stage, tr_module *model,
                        tr_cuda **cu) {
  *cu = NULL;
  if (!run->cuda) return NAS_OK;
  if (!(*cu = tr_cuda_new(stage, (size_t)1 << 28, &ctx->err))) return NAS_ERR;
  ctx->cuda = *cu;
  return tr_module_to_device(ctx, model, TR_DEVICE_CUDA(stage));
}

static int train_stage(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  run_spec *run = arg;
  tr_ctx ctx;
  tr_ctx_init(&ctx, MODEL_SEED);
  tr_module *model = model_new(&ctx, run->model); /* from malloc: the allocator counts steps */
  tr_module_train(model, true);
  ctx.alloc = tr_allocator_new((size_t)64 << 20);
  tr_pipe *p = NULL;
  tr_optim *opt = NULL;
  tr_cuda *cu = NULL;
  int rc = NAS_ERR;
  if (rank->stage == run->fail_setup_stage)
    nas_errf(&ctx.err, "no model for this stage");
  else if (stage_to_gpu(&ctx, run, rank->stage, model, &cu) == NAS_OK &&
           (p = tr_pipe_new(&ctx, model, rank, &run->pipe)) &&
           (opt = tr_pipe_optim_new(&ctx, p, &optimiser)))
    rc = stage_steps(&ctx, run, rank, p, opt);
  if (rc == NAS_OK) {
    tr_pipe_memory_stats(p, &ctx, &run->memory[rank->stage]);
    rc = tr_pipe_gather_model(&ctx, p);
  }
  /* the gathered model is read on the host */
  if (rc == NAS_OK && rank->stage == 0 && cu)
    rc = tr_module_to_device(&ctx, model, TR_DEVICE_CPU);
  if (rc == NAS_OK && rank->stage == 0) {
    run->state = module_values_copy(model, true, &run->n_state);
    run->params = module_values_copy(model, false, &run->n_params);
  }
  if (rc) nas_errf(err, "%s", ctx.err.msg);
  run->errors[rank->stage] = ctx.err;
  tr_optim_free(opt);
  tr_pipe_free(p);
  tr_module_free(model);
  tr_allocator_release(ctx.alloc);
  tr_cuda_free(cu);
  return rc;
}

static run_spec run_defaults(model_kind model, int chunks, tr_pipe_checkpoint ckpt) {
  return (run_spec){.model = model,
                    .pipe = {.chunks = chunks, .checkpoint = ckpt},
                    .steps = 3,
                    .batch = 16,
                    .fail_step = -1,
                    .stall_step = -1,
                    .fail_setup_stage = -1,
                    .die_step = -1};
}

static void run_free(run_spec *run) {
  free(run->state);
  free(run->params);
  run->state = run->params = NULL;
}

static void run_pipeline(run_spec *run, int stages) {
  nas_err err = {{0}};
  int rc = tr_pipe_run_threads(stages, TIMEOUT_S, train_stage, run, &err);
  if (rc) print_error("%s\n", err.msg);
  assert_int_equal(rc, NAS_OK);
  assert_non_null(run->state);
}

/* What a forked stage reports to the test process. */
typedef struct {
  double loss;
  nas_err error;
  int rc;
} stage_report;

/* Names in /dev/shm that hold name: segments of the pipeline or of its join. */
static int shm_leftovers(const char *name) {
  DIR *dir = opendir("/dev/shm");
  assert_non_null(dir);
  int found = 0;
  for (struct dirent *e; (e = readdir(dir));)
    if (strstr(e->d_name, name)) {
      print_error("left in /dev/shm: %s\n", e->d_name);
      found++;
    }
  closedir(dir);
  return found;
}

/* A name for one launch of stages, unique to this test process and moment. */
static void launch_name(char *name, size_t cap, const char *tag) {
  snprintf(name, cap, "test-%d-%s-%llx", (int)getpid(), tag,
           (unsigned long long)(nas_monotonic() * 1e9));
}

/* fork() for a child that runs the engine. libgomp's thread pool does not survive fork:
 * a child of a process that has run a parallel region (every test before, with OpenBLAS
 * on one thread, when the engine's loops use OpenMP's threads) waits forever in its first
 * parallel region for threads it does not have. Releasing them first (OpenMP 5.0's pause)
 * leaves both sides to start a pool of their own. */
static pid_t fork_stage(void) {
  assert_int_equal(omp_pause_resource_all(omp_pause_hard), 0);
  return fork();
}

/* Runs the stages as processes: stages 1.. forked, stage 0 played by the test process
 * (so run->state is its gathered model); each forked stage's error and loss come back in
 * run. The stages' return codes and the driver's message of stage 0 into *rc0 / err. */
static int run_processes(run_spec *run, int stages, double timeout_s, nas_err *err) {
  char name[64];
  launch_name(name, sizeof name, "pipe");
  stage_report *reports = mmap(NULL, sizeof(stage_report) * TR_PIPE_MAX_STAGES,
                               PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(reports != MAP_FAILED);
  pid_t pids[TR_PIPE_MAX_STAGES] = {0};
  fflush(stdout);
  fflush(stderr);
  for (int s = 1; s < stages; s++) {
    pids[s] = fork_stage();
    assert_true(pids[s] >= 0);
    if (pids[s] == 0) {
      nas_err mine = {{0}};
      reports[s].rc = tr_pipe_run_process(name, s, stages, timeout_s, train_stage, run, &mine);
      reports[s].loss = run->loss[s];
      reports[s].error = run->errors[s];
      _exit(0);
    }
  }
  int rc = tr_pipe_run_process(name, 0, stages, timeout_s, train_stage, run, err);
  for (int s = 1; s < stages; s++) {
    int status;
    assert_int_equal(waitpid(pids[s], &status, 0), pids[s]);
    run->loss[s] = reports[s].loss;
    run->errors[s] = reports[s].error;
    if (reports[s].rc != NAS_OK) rc = NAS_ERR;
  }
  munmap(reports, sizeof(stage_report) * TR_PIPE_MAX_STAGES);
  assert_int_equal(shm_leftovers(name), 0);
  return rc;
}

/* ---------------------------------------------------------------- the reference */

/* Single-rank training on the same mini-batches, as `chunks` micro-batches one after
 * another with loss-weighted gradients (chunks 1: the plain step on the whole batch): its
 * parameters (and buffers), owned. */
static float *reference_train(const run_spec *run, int chunks, bool buffers, int64_t *n) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, MODEL_SEED);
  tr_module *model = model_new(&ctx, run->model);
  tr_module_train(model, true);
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(model, false, &ps, NULL), NAS_OK);
  tr_optim *opt = tr_optim_new(&ctx, &optimiser, ps.items, ps.n);
  assert_non_null(opt);
  for (int step = 0; step < run->steps; step++) {
    int32_t labels[MAX_BATCH];
    tr_tensor *x = batch_new(run->model, step, run->batch, labels);
    tr_optim_zero_grad(opt);
    for (int i = 0; i < chunks; i++) {
      int64_t start = run->batch * i / chunks, count = run->batch * (i + 1) / chunks - start;
      tr_tensor *slice = tr_narrow(&ctx, x, 0, start, count);
      tr_tensor *logits = tr_module_forward(&ctx, model, slice);
      assert_non_null(logits);
      tr_tensor *loss = tr_cross_entropy(&ctx, logits, labels + start);
      tr_tensor *share = tr_full(&ctx, TR_F32, 0, NULL, (double)count / (double)run->batch);
      assert_int_equal(tr_backward(&ctx, loss, share, false), NAS_OK);
      tr_release(share);
      tr_release(loss);
      tr_release(logits);
      tr_release(slice);
    }
    assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
    tr_release(x);
  }
  float *out = module_values_copy(model, buffers, n);
  tr_optim_free(opt);
  tr_param_list_free(&ps);
  tr_module_free(model);
  return out;
}

/* ---------------------------------------------------------------- matching single-rank */

static const char *const ckpt_names[] = {"except_last", "always", "never"};

/* Stages 1, 2, 4 x chunks 1, 2, 4, 8 x the three checkpoint modes against the reference;
 * with batch norm the reference runs the same micro-batches and the running statistics
 * are compared too (unless deferred: they move by the whole mini-batch then). */
static void assert_matches_single_rank_everywhere(model_kind model, bool deferred) {
  bool micro = is_cnn(model);
  for (int chunks = 1; chunks <= 8; chunks *= 2) {
    run_spec base = run_defaults(model, chunks, TR_PIPE_CKPT_NEVER);
    int64_t n_want;
    float *want = reference_train(&base, micro ? chunks : 1, !deferred, &n_want);
    for (int stages = 1; stages <= MAX_STAGES; stages *= 2) {
      for (int ckpt = 0; ckpt < 3; ckpt++) {
        run_spec run = base;
        run.pipe.checkpoint = (tr_pipe_checkpoint)ckpt;
        run.pipe.deferred_batch_norm = deferred;
        run_pipeline(&run, stages);
        char what[160];
        snprintf(what, sizeof what, "model %d, %d stages, %d chunks, checkpoint %s%s",
                 (int)model, stages, chunks, ckpt_names[ckpt], deferred ? ", deferred bn" : "");
        /* with deferred batch norm only the parameters match */
        assert_int_equal(deferred ? run.n_params : run.n_state, n_want);
        assert_close(deferred ? run.params : run.state, want, n_want, 1e-5, what);
        for (int s = 1; s < stages; s++) assert_true(run.loss[s] == run.loss[0]);
        run_free(&run);
      }
    }
    free(want);
  }
}

static void mlp_trains_like_single_rank_for_every_stages_chunks_and_checkpoint(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_MLP, false);
}

static void cnn_with_batch_norm_trains_like_single_rank_on_the_same_micro_batches(
    void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_CNN_BN, false);
}

static void cnn_with_deferred_batch_norm_trains_like_single_rank(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_CNN_BN, true);
}

/* Uneven explicit balances, a stage of one parameterless ReLU among them, train the same
 * model as the even split does. */
/* Skip connections (tr_skip_new) across stages: the kept tensor travels from the stash's
 * stage to the pop's, its gradient back, through every checkpoint mode's recomputation. */
static void residual_mlp_with_skips_across_stages_trains_like_single_rank(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_RES_MLP, false);
}

static void residual_cnn_with_skips_across_stages_trains_like_single_rank(void **state) {
  (void)state;
  assert_matches_single_rank_everywhere(MODEL_RES_CNN, false);
  assert_matches_single_rank_everywhere(MODEL_RES_CNN, true);
}

/* A skip whose pop no earlier child stashes cannot be carried, and is refused. */
static void a_pop_before_its_stash_is_refused(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_POP_FIRST, 2, TR_PIPE_CKPT_NEVER);
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_run_threads(2, TIMEOUT_S, train_stage, &run, &err), NAS_ERR);
  if (!strstr(err.msg, "child 1 pops a skip connection that no earlier child")) print_error("%s\n", err.msg);
  assert_non_null(strstr(err.msg, "child 1 pops a skip connection that no earlier child"));
}

static void explicit_balance_trains_like_single_rank(void **state) {
  (void)state;
  static const struct {
    int stages, balance[4];
  } cases[] = {{2, {4, 1}}, {2, {1, 4}}, {4, {1, 1, 1, 2}}, {4, {2, 1, 1, 1}}, {3, {1, 3, 1}}};
  run_spec base = run_defaults(MODEL_MLP, 4, TR_PIPE_CKPT_EXCEPT_LAST);
  int64_t n_want;
  float *want = reference_train(&base, 1, false, &n_want);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    run_spec run = base;
    memcpy(run.pipe.balance, cases[c].balance, sizeof cases[c].balance);
    run_pipeline(&run, cases[c].stages);
    assert_int_equal(run.n_params, n_want);
    assert_close(run.params, want, n_want, 1e-5, "explicit balance");
    run_free(&run);
  }
  free(want);
}

/* Recomputation draws the forward's dropout masks: `always` (every micro-batch
 * recomputed) gives the bits of `except_last` (the last one not), both in fill-drain's
 * order; `never` runs one forward one backward on thread stages, whose backwards add the
 * micro-batches' gradients in another order, so it agrees to rounding (another mask would
 * differ by far more). */
static void checkpointing_with_dropout_changes_no_bit(void **state) {
  (void)state;
  for (int stages = 1; stages <= MAX_STAGES; stages *= 2) {
    run_spec never = run_defaults(MODEL_MLP_DROPOUT, 4, TR_PIPE_CKPT_NEVER);
    run_spec except_last = run_defaults(MODEL_MLP_DROPOUT, 4, TR_PIPE_CKPT_EXCEPT_LAST);
    run_spec always = run_defaults(MODEL_MLP_DROPOUT, 4, TR_PIPE_CKPT_ALWAYS);
    run_pipeline(&never, stages);
    run_pipeline(&except_last, stages);
    run_pipeline(&always, stages);
    assert_int_equal(always.n_state, except_last.n_state);
    assert_memory_equal(always.state, except_last.state,
                        (size_t)always.n_state * sizeof(float));
    assert_int_equal(always.n_state, never.n_state);
    assert_close(always.state, never.state, never.n_state, 1e-6, "always against never");
    run_free(&always);
    run_free(&except_last);
    run_free(&never);
  }
}

/* The running statistics after one pipelined step of model (deferred or not) against
 * those of one batch norm over the whole mini-batch, `stats` values from `at` in the
 * model's state; the largest difference. */
static double running_statistics_gap(model_kind model, bool deferred, int64_t at,
                                     int64_t stats) {
  run_spec run = run_defaults(model, 4, TR_PIPE_CKPT_ALWAYS);
  run.steps = 1;
  run.pipe.deferred_batch_norm = deferred;
  run_pipeline(&run, 2);
  tr_ctx ctx;
  tr_ctx_init(&ctx, MODEL_SEED);
  tr_module *whole = model_new(&ctx, model);
  tr_module_train(whole, true);
  int32_t labels[MAX_BATCH];
  tr_tensor *x = batch_new(model, 0, run.batch, labels);
  bool prev = tr_set_grad_enabled(&ctx, false);
  tr_tensor *out = tr_module_forward(&ctx, whole, x);
  tr_set_grad_enabled(&ctx, prev);
  int64_t n_all;
  float *all = module_values_copy(whole, true, &n_all);
  assert_int_equal(n_all, run.n_state);
  double gap = 0;
  for (int64_t i = at; i < at + stats; i++)
    gap = fmax(gap, fabs((double)run.state[i] - all[i]) / fmax(1.0, fabs((double)all[i])));
  free(all);
  tr_release(out);
  tr_release(x);
  tr_module_free(whole);
  run_free(&run);
  return gap;
}

/* One step of conv, bn, relu, pool, flatten, linear: the running statistics are those of
 * one batch norm over the whole mini-batch, not of four updates by micro-batches. */
static void deferred_batch_norm_moves_running_statistics_by_the_whole_mini_batch(
    void **state) {
  (void)state;
  /* state order: conv weight, bn weight, bn bias, running mean, running var, linear */
  int64_t channels = 4, at = 4 * 9 + 2 * channels;
  assert_true(running_statistics_gap(MODEL_CNN_BN1, true, at, 2 * channels) < 1e-5);
  /* four momentum updates by micro-batches are not the same */
  assert_true(running_statistics_gap(MODEL_CNN_BN1, false, at, 2 * channels) > 1e-3);
}

/* A batch norm inside a residual block (ResNet's and MobileNet's are) is deferred too. */
static void deferred_batch_norm_covers_a_batch_norm_inside_a_child(void **state) {
  (void)state;
  /* state order: conv weight and bias, the block's conv weight, bn weight, bn bias,
   * running mean, running var, linear */
  int64_t channels = 4, at = 4 * 9 + 4 + 4 * 4 * 9 + 2 * channels;
  double gap = running_statistics_gap(MODEL_NESTED_BN, true, at, 2 * channels);
  print_message("    nested batch norm, deferred: running statistics off by %.3g\n", gap);
  assert_true(gap < 1e-5);
}

/* Activation memory of the largest stage: its allocator's peak less what stays between
 * steps (gradients, momentum). */
static size_t largest_activation(const run_spec *run, int stages) {
  size_t most = 0;
  for (int s = 0; s < stages; s++) {
    size_t act = run->memory[s].alloc.peak - run->memory[s].alloc.in_use;
    most = act > most ? act : most;
  }
  return most;
}

/* GPipe's point: with `always`, a stage keeps its micro-batches' inputs (the whole
 * batch's, 64 wide) and one stage's working set — one micro-batch's graph through it, the
 * tensors at its edges (input, output gradient, input gradient; a carried skip and its
 * gradient) and the gradient of one layer, which a micro-batch's backward may make before
 * adding it to the accumulated one (a linear layer adds its weight's in place, its bias's
 * not) — which is within 1/stages of one rank's activations
 * plus that working set (bench_pipeline's target); `never` keeps every graph. The model is
 * narrow and the batch large, so activations dominate. */
static void assert_always_within_share(model_kind model, int edge_tensors) {
  run_spec single = run_defaults(model, 1, TR_PIPE_CKPT_NEVER);
  single.batch = 256;
  size_t layer_grad = (64 * 64 + 64) * sizeof(float);
  run_pipeline(&single, 1);
  size_t one_rank = largest_activation(&single, 1);
  for (int stages = 2; stages <= MAX_STAGES; stages *= 2) {
    for (int chunks = 4; chunks <= 8; chunks *= 2) {
      run_spec always = single, never = single;
      always.pipe = (tr_pipe_config){.chunks = chunks, .checkpoint = TR_PIPE_CKPT_ALWAYS};
      never.pipe = (tr_pipe_config){.chunks = chunks, .checkpoint = TR_PIPE_CKPT_NEVER};
      always.state = always.params = never.state = never.params = NULL;
      run_pipeline(&always, stages);
      run_pipeline(&never, stages);
      size_t act = largest_activation(&always, stages);
      double edges =
          edge_tensors * (double)(single.batch / chunks * 64 * (int64_t)sizeof(float));
      double working_set = (double)one_rank / (stages * chunks) + edges + (double)layer_grad;
      double inputs = (double)(single.batch * 64 * (int64_t)sizeof(float));
      double share = (double)one_rank / stages, bound = fmin(share, inputs) + working_set;
      if ((double)act > bound)
        print_error("model %d, %d stages, %d chunks: %zu bytes, bound %.0f (one rank %zu)\n",
                    (int)model, stages, chunks, act, bound, one_rank);
      assert_true((double)act <= bound);
      assert_true(act < largest_activation(&never, stages));
      run_free(&always);
      run_free(&never);
    }
  }
  run_free(&single);
}

static void checkpointing_always_keeps_a_stage_within_its_share_of_activations(void **state) {
  (void)state;
  assert_always_within_share(MODEL_DEEP, 3);
}

/* A skip's carried tensor is an input of the pop's stage that `always` does not keep
 * either: the pop's stage drops it after the forward and receives it again for the
 * recomputation, so it holds one micro-batch's, not every micro-batch's. */
static void checkpointing_always_keeps_no_carried_skip_between_forward_and_backward(
    void **state) {
  (void)state;
  assert_always_within_share(MODEL_RES_DEEP, 5);
}

/* Each micro-batch's backward adds its weight gradients straight into the accumulated ones
 * (a linear layer's GEMM with beta = 1), so a stage makes no weight-sized buffer per
 * micro-batch: on the wide model, whose first layer's weights (320 KiB) outweigh a 4-example
 * batch's activations (16 KiB an example), the largest stage's peak stays below them above
 * what it keeps between steps. */
static void micro_batches_add_weight_gradients_without_a_buffer_each(void **state) {
  (void)state;
  size_t first_layer_weights = 20 * 4096 * sizeof(float);
  for (int stages = 1; stages <= 2; stages++) {
    for (int ckpt = 0; ckpt < 3; ckpt++) {
      run_spec run = run_defaults(MODEL_WIDE, 4, (tr_pipe_checkpoint)ckpt);
      run.batch = 4;
      run_pipeline(&run, stages);
      size_t act = largest_activation(&run, stages);
      if (act >= first_layer_weights)
        print_error("%d stages, %s: %zu bytes above what stays\n", stages, ckpt_names[ckpt],
                    act);
      assert_true(act < first_layer_weights);
      run_free(&run);
    }
  }
}

/* ---------------------------------------------------------------- the schedule */

/* One step whose loss looks, at each call (each micro-batch's forward on the last stage,
 * then checkpointing's recomputations), whether a backward has put a gradient into the
 * stage's parameters yet. */
typedef struct {
  tr_pipe_checkpoint checkpoint;
  int chunks, calls;
  bool had_grad[8]; /* per call */
  const int32_t *labels;
  tr_param_list params; /* borrowed: the last stage's model's */
} order_probe;

static tr_tensor *probing_loss(tr_ctx *ctx, tr_tensor *out, int64_t start, int64_t count,
                               void *arg) {
  order_probe *probe = arg;
  (void)count;
  bool any = false;
  for (size_t i = 0; i < probe->params.n; i++) any = any || probe->params.items[i]->grad;
  if (probe->calls < 8) probe->had_grad[probe->calls] = any;
  probe->calls++;
  return tr_cross_entropy(ctx, out, probe->labels + start);
}

static int probed_stage(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  order_probe *probe = arg;
  tr_ctx ctx;
  tr_ctx_init(&ctx, MODEL_SEED);
  tr_module *model = model_new(&ctx, MODEL_MLP);
  tr_module_train(model, true);
  int32_t labels[MAX_BATCH];
  tr_tensor *x = batch_new(MODEL_MLP, 0, 16, labels);
  bool last = rank->stage == rank->stages - 1;
  if (last) {
    probe->labels = labels;
    assert_int_equal(tr_module_parameters(model, false, &probe->params, NULL), NAS_OK);
  }
  tr_pipe *p = tr_pipe_new(&ctx, model, rank,
                           &(tr_pipe_config){.chunks = probe->chunks,
                                             .checkpoint = probe->checkpoint});
  int rc = p ? tr_pipe_train_step(&ctx, p, rank->stage == 0 ? x : NULL, 16, probing_loss,
                                  probe, NULL)
             : NAS_ERR;
  if (rc) nas_errf(err, "%s", ctx.err.msg);
  if (last) tr_param_list_free(&probe->params);
  tr_pipe_free(p);
  tr_release(x);
  tr_module_free(model);
  return rc;
}

/* Under `never` the last stage runs micro-batch i's backward before micro-batch i + 1's
 * forward (one forward one backward), so stage s - 1 gets micro-batch 0's gradient before
 * the last forward; checkpointing keeps GPipe's fill-drain, every forward first. */
static void never_runs_each_backward_on_the_last_stage_before_the_next_forward(void **state) {
  (void)state;
  for (int stages = 2; stages <= MAX_STAGES; stages *= 2) {
    for (int ckpt = 0; ckpt < 3; ckpt++) {
      order_probe probe = {.checkpoint = (tr_pipe_checkpoint)ckpt, .chunks = 4};
      nas_err err = {{0}};
      assert_int_equal(tr_pipe_run_threads(stages, TIMEOUT_S, probed_stage, &probe, &err),
                       NAS_OK);
      /* checkpointing calls the loss again in recomputations, after the four forwards */
      assert_true(probe.calls >= 4);
      bool interleaved = probe.checkpoint == TR_PIPE_CKPT_NEVER;
      for (int i = 0; i < 4; i++) {
        if (probe.had_grad[i] != (interleaved && i > 0))
          print_error("%d stages, %s: the forward of micro-batch %d %s a backward\n", stages,
                      ckpt_names[ckpt], i, probe.had_grad[i] ? "came after" : "came before");
        assert_true(probe.had_grad[i] == (interleaved && i > 0));
      }
    }
  }
}

/* ---------------------------------------------------------------- balance */

static void assert_balance(const double *costs, int n, int stages, const int *want) {
  int got[TR_PIPE_MAX_STAGES];
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_balance_costs(costs, n, stages, got, &err), NAS_OK);
  for (int s = 0; s < stages; s++) assert_int_equal(got[s], want[s]);
}

static void balance_by_costs_minimises_the_largest_stage(void **state) {
  (void)state;
  assert_balance((double[]){1, 1, 1, 1, 1, 1, 1, 1}, 8, 4, (int[]){2, 2, 2, 2});
  assert_balance((double[]){1, 2, 3, 4, 5, 6, 7, 8, 9}, 9, 3, (int[]){5, 2, 2});
  assert_balance((double[]){8, 1, 1, 1, 1, 1, 1, 1, 1}, 9, 2, (int[]){1, 8});
  assert_balance((double[]){1, 1, 1, 10}, 4, 2, (int[]){3, 1});
  assert_balance((double[]){5}, 1, 1, (int[]){1});
  int got[TR_PIPE_MAX_STAGES];
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_balance_costs((double[]){1, 1}, 2, 3, got, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "3 stages"));
}

/* Linear(256, 256) costs ~65k parameters, its neighbours a few dozen. */
static tr_module *lopsided_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_linear_new(ctx, 4, 256, true));
  add(ctx, m, tr_linear_new(ctx, 256, 256, true));
  add(ctx, m, tr_linear_new(ctx, 256, 4, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_linear_new(ctx, 4, 4, true));
  return m;
}

static void balance_by_size_and_by_time_isolate_the_heavy_layer(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_module *m = lopsided_new(&ctx);
  tr_tensor *x = tr_randn(&ctx, TR_F32, 2, (int64_t[]){64, 4}, 1.0);
  int got[TR_PIPE_MAX_STAGES];
  /* stage 0 the first layer, stage 1 the heavy one, stage 2 the rest */
  assert_int_equal(tr_pipe_balance_by_size(&ctx, m, x, 3, got), NAS_OK);
  assert_int_equal(got[0], 1);
  assert_int_equal(got[1], 1);
  assert_int_equal(got[2], 3);
  assert_int_equal(tr_pipe_balance_by_time(&ctx, m, x, 2, 3, got), NAS_OK);
  assert_true(got[0] == 2 || got[0] == 1); /* the heavy layer ends stage 0 or starts 1 */
  assert_int_equal(got[0] + got[1], 5);
  assert_int_equal(tr_pipe_balance_by_time(&ctx, m, x, 3, 3, got), NAS_OK);
  assert_int_equal(got[1], 1);
  /* more stages than children: said once, not "pipeline balance: pipeline balance: …" */
  assert_int_equal(tr_pipe_balance_by_size(&ctx, m, x, 6, got), NAS_ERR);
  assert_true(strncmp(ctx.err.msg, "pipeline balance: 6 stages for 5 children", 41) == 0);
  tr_release(x);
  tr_module_free(m);
}

/* A wide input (4096 features, 256 KiB a batch of 16) kept by a stash over a narrow block
 * and concatenated back before the last layer. Counting the tensor the pop's stage
 * receives doubles the pop's cost (its output and the carried input), and the best cut
 * into 3 stages leaves the last layer alone: {4, 2, 1} (by output and parameter bytes
 * alone it would be {1, 4, 2}). By time, the pop's repeats each find the kept tensor. */
static void balance_counts_the_tensor_a_skip_carries(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_module *m = tr_sequential_new(&ctx), *stash, *pop;
  assert_int_equal(tr_skip_new(&ctx, TR_SKIP_CONCAT, &stash, &pop), NAS_OK);
  add(&ctx, m, stash);
  add(&ctx, m, tr_linear_new(&ctx, 4096, 8, true));
  add(&ctx, m, tr_activation_new(&ctx, TR_RELU));
  add(&ctx, m, tr_linear_new(&ctx, 8, 8, true));
  add(&ctx, m, tr_linear_new(&ctx, 8, 8, true));
  add(&ctx, m, pop);
  add(&ctx, m, tr_linear_new(&ctx, 4096 + 8, 2, true));
  tr_tensor *x = tr_randn(&ctx, TR_F32, 2, (int64_t[]){16, 4096}, 1.0);
  int got[TR_PIPE_MAX_STAGES];
  assert_int_equal(tr_pipe_balance_by_size(&ctx, m, x, 3, got), NAS_OK);
  assert_int_equal(got[0], 4);
  assert_int_equal(got[1], 2);
  assert_int_equal(got[2], 1);
  assert_int_equal(tr_pipe_balance_by_time(&ctx, m, x, 3, 2, got), NAS_OK);
  assert_int_equal(got[0] + got[1] + got[2], 7);
  tr_release(x);
  tr_module_free(m);
}

/* Balancing runs the model forward (and backward, by time): it leaves no gradient behind
 * and batch norm's running statistics as they were. */
static void balancing_leaves_the_model_as_it_was(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, MODEL_SEED);
  tr_module *m = model_new(&ctx, MODEL_CNN_BN1);
  tr_module_train(m, true);
  int32_t labels[MAX_BATCH];
  tr_tensor *x = batch_new(MODEL_CNN_BN1, 0, 16, labels);
  int64_t n_before, n_after;
  float *before = module_values_copy(m, true, &n_before);
  int got[TR_PIPE_MAX_STAGES];
  assert_int_equal(tr_pipe_balance_by_size(&ctx, m, x, 2, got), NAS_OK);
  assert_int_equal(tr_pipe_balance_by_time(&ctx, m, x, 2, 2, got), NAS_OK);
  float *after = module_values_copy(m, true, &n_after);
  assert_int_equal(n_after, n_before);
  assert_memory_equal(after, before, (size_t)n_before * sizeof(float));
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(m, false, &ps, NULL), NAS_OK);
  for (size_t i = 0; i < ps.n; i++) assert_null(ps.items[i]->grad);
  tr_param_list_free(&ps);
  free(before);
  free(after);
  tr_release(x);
  tr_module_free(m);
}

/* ---------------------------------------------------------------- failures */

/* Every stage but origin (-1: none) failed with err, the driver's message; origin's own
 * function saw its error before the pipeline prefixed it. */
static void assert_every_stage_failed_with(const run_spec *run, int stages, int origin,
                                           const char *err, const char *needle) {
  assert_non_null(strstr(err, needle));
  for (int s = 0; s < stages; s++) {
    if (s == origin) {
      assert_non_null(strstr(err, run->errors[s].msg));
      continue;
    }
    if (strcmp(run->errors[s].msg, err) != 0)
      print_error("stage %d: %s\nwant: %s\n", s, run->errors[s].msg, err);
    assert_string_equal(run->errors[s].msg, err);
  }
}

static void a_stage_that_fails_fails_every_stage_with_one_message(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_MLP, 4, TR_PIPE_CKPT_EXCEPT_LAST);
  run.fail_step = 1;
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_run_threads(4, TIMEOUT_S, train_stage, &run, &err), NAS_ERR);
  assert_every_stage_failed_with(&run, 4, -1, err.msg, "pipeline stage 3: the loss is out of order");
  assert_null(run.state);
}

static void a_stage_that_fails_before_its_first_step_releases_the_others(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_MLP, 2, TR_PIPE_CKPT_NEVER);
  run.fail_setup_stage = 0;
  nas_err err = {{0}};
  double start = nas_monotonic();
  assert_int_equal(tr_pipe_run_threads(4, TIMEOUT_S, train_stage, &run, &err), NAS_ERR);
  assert_true(nas_monotonic() - start < TIMEOUT_S / 2); /* nobody waited for the timeout */
  assert_every_stage_failed_with(&run, 4, 0, err.msg, "pipeline stage 0: no model for this stage");
}

/* A stage whose message names it already, as tr_pipe_new's device checks do ("pipeline
 * stage 0: the stage is on cuda:0 but its stages meet on the host ..."). */
static int stage_failing_in_its_own_name(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  (void)arg;
  return nas_errf(err, "pipeline stage %d: the stage is on a device its stages cannot reach",
                  rank->stage);
}

static void a_message_that_names_its_stage_is_not_prefixed_again(void **state) {
  (void)state;
  const char *want = "pipeline stage 0: the stage is on a device its stages cannot reach";
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_run_threads(1, TIMEOUT_S, stage_failing_in_its_own_name, NULL, &err),
                   NAS_ERR);
  assert_string_equal(err.msg, want);
  char name[64];
  launch_name(name, sizeof name, "named");
  err = (nas_err){{0}};
  assert_int_equal(
      tr_pipe_run_process(name, 0, 1, TIMEOUT_S, stage_failing_in_its_own_name, NULL, &err),
      NAS_ERR);
  assert_string_equal(err.msg, want);
  assert_int_equal(shm_leftovers(name), 0);
}

static void a_stage_that_stalls_fails_every_stage_with_one_message(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_MLP, 4, TR_PIPE_CKPT_NEVER);
  run.stall_step = 1;
  run.stall_s = 0.6;
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_run_threads(2, 0.2, train_stage, &run, &err), NAS_ERR);
  assert_every_stage_failed_with(&run, 2, -1, err.msg, "waited 0.2 s for");
  assert_non_null(strstr(err.msg, "stalled"));
}

/* ---------------------------------------------------------------- process stages */

/* The MLP, and the residual one whose skips the processes carry too. */
static void process_stages_train_like_single_rank_in_every_checkpoint_mode(void **state) {
  (void)state;
  for (int run_no = 0; run_no < 4; run_no++) {
    int chunks = run_no % 2 ? 4 : 1;
    run_spec base = run_defaults(run_no < 2 ? MODEL_MLP : MODEL_RES_MLP, chunks,
                                 TR_PIPE_CKPT_NEVER);
    int64_t n_want;
    float *want = reference_train(&base, 1, true, &n_want);
    for (int stages = 2; stages <= MAX_STAGES; stages *= 2) {
      for (int ckpt = 0; ckpt < 3; ckpt++) {
        run_spec run = base;
        run.pipe.checkpoint = (tr_pipe_checkpoint)ckpt;
        nas_err err = {{0}};
        int rc = run_processes(&run, stages, TIMEOUT_S, &err);
        if (rc) print_error("%s\n", err.msg);
        assert_int_equal(rc, NAS_OK);
        char what[160];
        snprintf(what, sizeof what, "processes: model %d, %d stages, %d chunks, checkpoint %s",
                 (int)base.model, stages, chunks, ckpt_names[ckpt]);
        assert_int_equal(run.n_state, n_want);
        assert_close(run.state, want, n_want, 1e-5, what);
        for (int s = 1; s < stages; s++) assert_true(run.loss[s] == run.loss[0]);
        run_free(&run);
      }
    }
    free(want);
  }
}

/* 160 examples of 16 KiB: messages of 2.5 MiB through mailboxes of 1 MiB, in pieces
 * that wrap around the ring. */
static void process_stages_carry_messages_larger_than_their_mailbox(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_WIDE, 1, TR_PIPE_CKPT_NEVER);
  run.batch = 160;
  run.steps = 2;
  int64_t n_want;
  float *want = reference_train(&run, 1, true, &n_want);
  nas_err err = {{0}};
  int rc = run_processes(&run, 3, TIMEOUT_S, &err);
  if (rc) print_error("%s\n", err.msg);
  assert_int_equal(rc, NAS_OK);
  assert_int_equal(run.n_state, n_want);
  assert_close(run.state, want, n_want, 1e-5, "wide model on 3 process stages");
  run_free(&run);
  free(want);
}

static void a_stage_process_that_dies_fails_every_stage_with_one_message(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_MLP, 4, TR_PIPE_CKPT_EXCEPT_LAST);
  run.die_step = 1;
  nas_err err = {{0}};
  double start = nas_monotonic();
  assert_int_equal(run_processes(&run, 3, TIMEOUT_S, &err), NAS_ERR);
  assert_true(nas_monotonic() - start < TIMEOUT_S / 2); /* found dead, not timed out */
  assert_non_null(strstr(err.msg, "pipeline stage 2 (pid "));
  assert_non_null(strstr(err.msg, "exited while stage 1 waited for"));
  /* the dead stage reports nothing; the living ones failed with the same message */
  assert_string_equal(run.errors[0].msg, err.msg);
  assert_string_equal(run.errors[1].msg, err.msg);
  assert_null(run.state);
}

static void a_stage_process_that_stalls_fails_every_stage_with_one_message(void **state) {
  (void)state;
  run_spec run = run_defaults(MODEL_MLP, 4, TR_PIPE_CKPT_NEVER);
  run.stall_step = 1;
  run.stall_s = 0.8;
  nas_err err = {{0}};
  assert_int_equal(run_processes(&run, 2, 0.3, &err), NAS_ERR);
  assert_every_stage_failed_with(&run, 2, -1, err.msg, "waited 0.3 s for");
  assert_non_null(strstr(err.msg, "stalled"));
}

static int stage_doing_nothing(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  (void)rank;
  (void)arg;
  (void)err;
  return NAS_OK;
}

/* The name becomes part of a path in /dev/shm: through a folder made for the purpose, one
 * with '/' in it put the segment over a file outside, then unlinked it. */
static void a_pipeline_name_that_is_no_plain_file_name_is_refused(void **state) {
  (void)state;
  char tag[64], dir[128], name[192], outside[128];
  launch_name(tag, sizeof tag, "escape");
  snprintf(dir, sizeof dir, "/dev/shm/nas-pipe-%s", tag);
  snprintf(name, sizeof name, "%s/../../../tmp/%s", tag, tag);
  snprintf(outside, sizeof outside, "/tmp/%s", tag);
  assert_int_equal(mkdir(dir, 0700), 0);
  FILE *f = fopen(outside, "w");
  assert_non_null(f);
  fclose(f);
  tr_comm_options opts = {.backend = TR_COMM_PROCESSES, .world = 1, .nodes = 1};
  snprintf(opts.name, sizeof opts.name, "%s", tag);
  tr_comm *group = NULL;
  nas_err err = {{0}};
  assert_int_equal(tr_comm_join(&opts, &group, &err), NAS_OK);
  int rc = tr_pipe_run_group(group, name, TIMEOUT_S, stage_doing_nothing, NULL, &err);
  tr_comm_free(group);
  rmdir(dir);
  bool kept = access(outside, F_OK) == 0;
  unlink(outside);
  print_message("    %s\n", err.msg);
  assert_true(kept);
  assert_int_equal(rc, NAS_ERR);
  assert_non_null(strstr(err.msg, "letters, digits"));
  assert_int_equal(shm_leftovers(tag), 0);
}

/* ---------------------------------------------------------------- stages on GPUs over NCCL
 *
 * Every stage is a forked process, and the test process itself never touches CUDA: a
 * process that has cannot fork children that use it. Without a GPU (or a build without
 * CUDA) these tests skip. */

#define GPU_VALUES 65536 /* floats of stage 0's gathered model that come back */

/* What the stage processes report to the test process (shared memory). */
typedef struct {
  stage_report stages[TR_PIPE_MAX_STAGES];
  int devices;
  int64_t n_state, n_params;
  float state[GPU_VALUES], params[GPU_VALUES];
} gpu_reports;

static gpu_reports *gpu_reports_new(void) {
  gpu_reports *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
  assert_true(r != MAP_FAILED);
  return r;
}

/* The CUDA devices this machine has, counted in a child process; skips the test when
 * there are fewer than `need`. */
static void need_gpus(gpu_reports *r, int need) {
  fflush(stdout);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    r->devices = tr_cuda_device_count(&r->stages[0].error);
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (r->devices >= need) return;
  print_message("SKIPPED: %d CUDA devices, the test needs %d: %s\n", r->devices, need,
                r->stages[0].error.msg);
  munmap(r, sizeof *r);
  skip();
}

/* Stage `stage` as this (forked) process: joins the NCCL group name, trains on device
 * `stage`, reports; stage 0 also its gathered model. */
static void gpu_stage_process(run_spec *run, const char *name, int stage, int stages,
                              gpu_reports *r) {
  tr_comm_options o = {.backend = TR_COMM_NCCL, .rank = stage, .world = stages,
                       .local_rank = stage, .nodes = 1, .timeout_s = TIMEOUT_S};
  snprintf(o.name, sizeof o.name, "%s", name);
  tr_comm *group = NULL;
  nas_err err = {{0}};
  int rc = tr_comm_join(&o, &group, &err);
  if (rc == NAS_OK) rc = tr_pipe_run_group(group, name, TIMEOUT_S, train_stage, run, &err);
  tr_comm_free(group);
  r->stages[stage] = (stage_report){run->loss[stage], err, rc};
  if (rc != NAS_OK || stage != 0) return;
  if (run->n_state > GPU_VALUES) {
    r->stages[0] = (stage_report){0, {"the model is larger than GPU_VALUES"}, NAS_ERR};
    return;
  }
  r->n_state = run->n_state;
  r->n_params = run->n_params;
  memcpy(r->state, run->state, (size_t)run->n_state * sizeof(float));
  memcpy(r->params, run->params, (size_t)run->n_params * sizeof(float));
}

/* Runs the stages as processes over NCCL, stage s on device s; their results into run. */
static void run_gpu_stages(run_spec *run, int stages, gpu_reports *r) {
  char name[64];
  launch_name(name, sizeof name, "gpipe");
  pid_t pids[TR_PIPE_MAX_STAGES];
  fflush(stdout);
  fflush(stderr);
  for (int s = 0; s < stages; s++) {
    pids[s] = fork_stage();
    assert_true(pids[s] >= 0);
    if (pids[s] == 0) {
      gpu_stage_process(run, name, s, stages, r);
      _exit(0);
    }
  }
  for (int s = 0; s < stages; s++) {
    int status;
    assert_int_equal(waitpid(pids[s], &status, 0), pids[s]);
    if (r->stages[s].rc != NAS_OK) print_error("stage %d: %s\n", s, r->stages[s].error.msg);
    assert_int_equal(r->stages[s].rc, NAS_OK);
    run->loss[s] = r->stages[s].loss;
  }
  run->n_state = r->n_state;
  run->n_params = r->n_params;
  run->state = malloc((size_t)r->n_state * sizeof(float));
  run->params = malloc((size_t)r->n_params * sizeof(float));
  assert_non_null(run->state);
  assert_non_null(run->params);
  memcpy(run->state, r->state, (size_t)r->n_state * sizeof(float));
  memcpy(run->params, r->params, (size_t)r->n_params * sizeof(float));
}

/* Stages on GPUs against single-rank training on the CPU (to 1e-4, as FSDP's GPU runs:
 * the device sums in another order): the MLP, and the residual CNN whose skips cross
 * stages with deferred batch norm, in every checkpoint mode. */
static void assert_gpu_stages_match_single_rank(int stages) {
  gpu_reports *r = gpu_reports_new();
  need_gpus(r, stages);
  for (int run_no = 0; run_no < 2; run_no++) {
    bool residual = run_no == 1;
    run_spec base = run_defaults(residual ? MODEL_RES_CNN : MODEL_MLP, 4, TR_PIPE_CKPT_NEVER);
    base.cuda = true;
    base.pipe.deferred_batch_norm = residual;
    int64_t n_want;
    /* batch norm: the reference runs the same micro-batches; deferred: parameters only */
    float *want = reference_train(&base, residual ? 4 : 1, !residual, &n_want);
    for (int ckpt = 0; ckpt < 3; ckpt++) {
      run_spec run = base;
      run.pipe.checkpoint = (tr_pipe_checkpoint)ckpt;
      memset(r->stages, 0, sizeof r->stages);
      run_gpu_stages(&run, stages, r);
      char what[160];
      snprintf(what, sizeof what, "GPUs: model %d, %d stages, checkpoint %s", (int)base.model,
               stages, ckpt_names[ckpt]);
      assert_int_equal(residual ? run.n_params : run.n_state, n_want);
      assert_close(residual ? run.params : run.state, want, n_want, 1e-4, what);
      for (int s = 1; s < stages; s++) assert_true(run.loss[s] == run.loss[0]);
      run_free(&run);
    }
    free(want);
  }
  munmap(r, sizeof *r);
}

static void one_stage_on_a_gpu_over_nccl_trains_like_single_rank(void **state) {
  (void)state;
  assert_gpu_stages_match_single_rank(1);
}

static void stages_on_two_gpus_over_nccl_train_like_single_rank(void **state) {
  (void)state;
  assert_gpu_stages_match_single_rank(2);
}

/* Thread stages meet on the host: a stage whose layers are on a GPU is refused there,
 * saying that GPU stages are processes over NCCL. */
static void a_gpu_stage_among_thread_stages_is_refused(void **state) {
  (void)state;
  gpu_reports *r = gpu_reports_new();
  need_gpus(r, 1);
  run_spec run = run_defaults(MODEL_MLP, 2, TR_PIPE_CKPT_NEVER);
  run.cuda = true;
  fflush(stdout);
  pid_t pid = fork_stage();
  assert_true(pid >= 0);
  if (pid == 0) {
    r->stages[0].rc = tr_pipe_run_threads(1, TIMEOUT_S, train_stage, &run, &r->stages[0].error);
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_int_equal(r->stages[0].rc, NAS_ERR);
  print_message("refused: %s\n", r->stages[0].error.msg);
  assert_non_null(strstr(r->stages[0].error.msg, "processes over NCCL"));
  munmap(r, sizeof *r);
}


static void configs_that_do_not_fit_the_model_are_refused(void **state) {
  (void)state;
  struct {
    int stages, chunks, balance[4];
    int64_t batch;
    const char *needle;
  } cases[] = {
      {2, 0, {0}, 16, "chunks must be at least 1"},
      {2, 2, {2, 2}, 16, "covers 4 children, the model has 5"},
      {2, 2, {5, 0}, 16, "balance[1] is 0"},
      {4, 8, {0}, 4, "4 examples cannot make 8 micro-batches"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    run_spec run = run_defaults(MODEL_MLP, cases[i].chunks, TR_PIPE_CKPT_NEVER);
    memcpy(run.pipe.balance, cases[i].balance, sizeof cases[i].balance);
    run.batch = cases[i].batch;
    nas_err err = {{0}};
    assert_int_equal(tr_pipe_run_threads(cases[i].stages, TIMEOUT_S, train_stage, &run, &err),
                     NAS_ERR);
    if (!strstr(err.msg, cases[i].needle)) print_error("%s\n", err.msg);
    assert_non_null(strstr(err.msg, cases[i].needle));
  }
  run_spec run = run_defaults(MODEL_MLP, 1, TR_PIPE_CKPT_NEVER);
  nas_err err = {{0}};
  assert_int_equal(tr_pipe_run_threads(8, TIMEOUT_S, train_stage, &run, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "8 stages for a model of 5 children"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mlp_trains_like_single_rank_for_every_stages_chunks_and_checkpoint),
      cmocka_unit_test(cnn_with_batch_norm_trains_like_single_rank_on_the_same_micro_batches),
      cmocka_unit_test(cnn_with_deferred_batch_norm_trains_like_single_rank),
      cmocka_unit_test(residual_mlp_with_skips_across_stages_trains_like_single_rank),
      cmocka_unit_test(residual_cnn_with_skips_across_stages_trains_like_single_rank),
      cmocka_unit_test(a_pop_before_its_stash_is_refused),
      cmocka_unit_test(explicit_balance_trains_like_single_rank),
      cmocka_unit_test(checkpointing_with_dropout_changes_no_bit),
      cmocka_unit_test(micro_batches_add_weight_gradients_without_a_buffer_each),
      cmocka_unit_test(never_runs_each_backward_on_the_last_stage_before_the_next_forward),
      cmocka_unit_test(deferred_batch_norm_moves_running_statistics_by_the_whole_mini_batch),
      cmocka_unit_test(deferred_batch_norm_covers_a_batch_norm_inside_a_child),
      cmocka_unit_test(checkpointing_always_keeps_a_stage_within_its_share_of_activations),
      cmocka_unit_test(checkpointing_always_keeps_no_carried_skip_between_forward_and_backward),
      cmocka_unit_test(balance_by_costs_minimises_the_largest_stage),
      cmocka_unit_test(balance_by_size_and_by_time_isolate_the_heavy_layer),
      cmocka_unit_test(balance_counts_the_tensor_a_skip_carries),
      cmocka_unit_test(balancing_leaves_the_model_as_it_was),
      cmocka_unit_test(a_stage_that_fails_fails_every_stage_with_one_message),
      cmocka_unit_test(a_stage_that_fails_before_its_first_step_releases_the_others),
      cmocka_unit_test(a_stage_that_stalls_fails_every_stage_with_one_message),
      cmocka_unit_test(a_message_that_names_its_stage_is_not_prefixed_again),
      cmocka_unit_test(a_pipeline_name_that_is_no_plain_file_name_is_refused),
      cmocka_unit_test(process_stages_train_like_single_rank_in_every_checkpoint_mode),
      cmocka_unit_test(process_stages_carry_messages_larger_than_their_mailbox),
      cmocka_unit_test(a_stage_process_that_dies_fails_every_stage_with_one_message),
      cmocka_unit_test(a_stage_process_that_stalls_fails_every_stage_with_one_message),
      cmocka_unit_test(one_stage_on_a_gpu_over_nccl_trains_like_single_rank),
      cmocka_unit_test(stages_on_two_gpus_over_nccl_train_like_single_rank),
      cmocka_unit_test(a_gpu_stage_among_thread_stages_is_refused),
      cmocka_unit_test(configs_that_do_not_fit_the_model_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
