/* bench_fsdp: FSDP on the CPU with thread ranks (issue 9): step time and memory per rank
 * for 1, 2 and 4 ranks under each sharding mode, with and without activation
 * checkpointing, and plain single-rank training beside them. Prints a markdown table for
 * bench/RESULTS.md.
 *
 * Model and step: MLP 784-512-512-10, ReLU, cross-entropy, SGD momentum 0.9, a global batch
 * of 128 random examples split evenly over the ranks; WARMUP steps, then STEPS timed one by
 * one on rank 0 (a step ends in collectives, so rank 0's step is everyone's), the median
 * printed, with the samples per second it makes. Memory is each rank's allocator: the peak
 * over the run and what stays in use between steps (parameters, gradients, momentum); the
 * largest over the ranks is printed. OpenBLAS and the engine's
 * OpenMP loops run on one thread per rank: the ranks are the parallelism (ranks each
 * asking for more threads would oversubscribe the cores, and on a busy machine a parallel
 * region waits for every one of its threads). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_util.h"
#include "trainer/dist.h"
#include "trainer/trainer.h"

#define BATCH 128
#define WARMUP 3
#define STEPS 20
#define MAX_WORLD 4

/* One configuration's results, filled by the ranks. */
typedef struct {
  tr_fsdp_config cfg;
  double seconds[STEPS];                     /* each timed step, measured by rank 0 */
  size_t peak[MAX_WORLD], in_use[MAX_WORLD]; /* bytes, per rank */
} bench_run;

static tr_module *mlp_new(tr_ctx *ctx) {
  static const int64_t widths[] = {784, 512, 512, 10};
  tr_module *m = tr_sequential_new(ctx);
  for (int i = 0; m && i < 3; i++) {
    if (tr_sequential_add(ctx, m, tr_linear_new(ctx, widths[i], widths[i + 1], true)) ||
        (i < 2 && tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU)))) {
      tr_module_free(m);
      return NULL;
    }
  }
  return m;
}

/* The rank's state for one configuration. */
typedef struct {
  tr_ctx ctx;
  tr_module *model;
  tr_fsdp *f;
  tr_optim *opt;
  tr_tensor *x; /* this rank's slice */
  int32_t labels[BATCH];
} rank_bench;

static int step(rank_bench *b) {
  tr_optim_zero_grad(b->opt);
  tr_tensor *logits = tr_fsdp_forward(&b->ctx, b->f, b->x);
  tr_tensor *loss = logits ? tr_cross_entropy(&b->ctx, logits, b->labels) : NULL;
  int rc = loss ? tr_fsdp_backward(&b->ctx, b->f, loss) : NAS_ERR;
  if (rc == NAS_OK) rc = tr_optim_step(&b->ctx, b->opt);
  tr_release(loss);
  tr_release(logits);
  return rc;
}

static int setup(rank_bench *b, const tr_fsdp_rank *rank, const tr_fsdp_config *cfg) {
  /* model and input from malloc: the allocator then counts what FSDP keeps and makes */
  tr_ctx_init(&b->ctx, 1);
  b->model = mlp_new(&b->ctx);
  int64_t local = BATCH / rank->world;
  b->x = tr_randn(&b->ctx, TR_F32, 2, (int64_t[]){local, 784}, 1.0);
  for (int i = 0; i < local; i++) b->labels[i] = (int32_t)(tr_rand_u64(&b->ctx) % 10);
  b->ctx.alloc = tr_allocator_new((size_t)256 << 20);
  b->f = b->model && b->x ? tr_fsdp_new(&b->ctx, b->model, rank->comm, rank->prefetch_comm, cfg)
                          : NULL;
  b->opt = b->f ? tr_fsdp_optim_new(&b->ctx, b->f,
                                    &(tr_optim_config){.kind = TR_SGD, .lr = 0.01, .momentum = 0.9})
                : NULL;
  return b->opt ? NAS_OK : NAS_ERR;
}

static int bench_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  bench_run *run = arg;
  rank_bench b = {0};
  int rc = setup(&b, rank, &run->cfg);
  for (int i = 0; i < WARMUP && rc == NAS_OK; i++) rc = step(&b);
  if (rc == NAS_OK) rc = tr_comm_barrier(rank->comm, &b.ctx.err);
  for (int i = 0; i < STEPS && rc == NAS_OK; i++) {
    double start = nas_monotonic();
    rc = step(&b);
    if (rank->rank == 0) run->seconds[i] = nas_monotonic() - start;
  }
  if (rc == NAS_OK) {
    tr_fsdp_memory m;
    tr_fsdp_memory_stats(b.f, &m);
    run->peak[rank->rank] = m.alloc.peak;
    run->in_use[rank->rank] = m.alloc.in_use;
  }
  if (rc) nas_errf(err, "%s", b.ctx.err.msg);
  tr_release(b.x);
  tr_optim_free(b.opt);
  tr_fsdp_free(b.f);
  tr_module_free(b.model);
  tr_allocator_release(b.ctx.alloc);
  return rc;
}

static size_t largest(const size_t *v, int n) {
  size_t m = 0;
  for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
  return m;
}

static double median_step(double *seconds) { return bench_median(seconds, STEPS); }

static void print_row(const char *ranks, const char *mode, const char *ckpt, double step_s,
                      size_t peak, size_t in_use) {
  double mib = 1024.0 * 1024.0;
  printf("| %s | %s | %s | %.2f | %.0f | %.2f | %.2f |\n", ranks, mode, ckpt, step_s * 1e3,
         BATCH / step_s, (double)peak / mib, (double)in_use / mib);
}

/* Plain training of the same model on one thread, without FSDP: the baseline. */
static int plain_row(void) {
  /* the input from malloc, the model from the allocator (as FSDP's ranks count them) */
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *x = tr_randn(&ctx, TR_F32, 2, (int64_t[]){BATCH, 784}, 1.0);
  int32_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (int32_t)(tr_rand_u64(&ctx) % 10);
  ctx.alloc = tr_allocator_new((size_t)256 << 20);
  tr_module *m = mlp_new(&ctx);
  tr_param_list ps = {0};
  tr_optim *opt = NULL;
  if (m && x && tr_module_parameters(m, false, &ps, &ctx.err) == NAS_OK)
    opt = tr_optim_new(&ctx, &(tr_optim_config){.kind = TR_SGD, .lr = 0.01, .momentum = 0.9},
                       ps.items, ps.n);
  int rc = opt ? NAS_OK : NAS_ERR;
  double seconds[STEPS];
  for (int i = 0; i < WARMUP + STEPS && rc == NAS_OK; i++) {
    double start = nas_monotonic();
    tr_optim_zero_grad(opt);
    tr_tensor *logits = tr_module_forward(&ctx, m, x);
    tr_tensor *loss = logits ? tr_cross_entropy(&ctx, logits, labels) : NULL;
    rc = loss ? tr_backward(&ctx, loss, NULL, false) : NAS_ERR;
    if (rc == NAS_OK) rc = tr_optim_step(&ctx, opt);
    tr_release(loss);
    tr_release(logits);
    if (i >= WARMUP) seconds[i - WARMUP] = nas_monotonic() - start;
  }
  if (rc == NAS_OK) {
    tr_alloc_stats st;
    tr_allocator_stats(ctx.alloc, &st);
    print_row("1", "no FSDP", "no", median_step(seconds), st.peak, st.in_use);
  } else {
    fprintf(stderr, "bench_fsdp: plain training: %s\n", ctx.err.msg);
  }
  tr_optim_free(opt);
  tr_param_list_free(&ps);
  tr_release(x);
  tr_module_free(m);
  tr_allocator_release(ctx.alloc);
  return rc;
}

/* The configurations of each world size: every mode with and without checkpointing, and
 * full sharding with prefetch. */
static const struct {
  const char *name;
  tr_fsdp_config cfg;
} configs[] = {
    {"full", {.mode = TR_SHARD_FULL}},
    {"full", {.mode = TR_SHARD_FULL, .checkpoint = true}},
    {"full + prefetch", {.mode = TR_SHARD_FULL, .prefetch = true}},
    {"grad_op", {.mode = TR_SHARD_GRAD_OP}},
    {"grad_op", {.mode = TR_SHARD_GRAD_OP, .checkpoint = true}},
    {"none", {.mode = TR_SHARD_NONE}},
    {"none", {.mode = TR_SHARD_NONE, .checkpoint = true}},
};

int main(void) {
  openblas_set_num_threads(1);
  omp_set_num_threads(1); /* this thread's; tr_fsdp_run_threads hands each rank its share */
  printf("FSDP, MLP 784-512-512-10, global batch %d, SGD momentum; median of %d steps after %d "
         "warm-up; memory: the largest over ranks; one thread per rank\n\n", BATCH, STEPS, WARMUP);
  printf("| ranks | sharding | checkpoint | step ms | samples/s | peak MiB/rank | "
         "resident MiB/rank |\n|---|---|---|---|---|---|---|\n");
  if (plain_row()) return 1;
  for (int world = 1; world <= MAX_WORLD; world *= 2) {
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
      bench_run run = {.cfg = configs[c].cfg};
      nas_err err = {{0}};
      if (tr_fsdp_run_threads(world, bench_rank, &run, &err)) {
        fprintf(stderr, "bench_fsdp: %d ranks, %s: %s\n", world, configs[c].name, err.msg);
        return 1;
      }
      char ranks[16];
      snprintf(ranks, sizeof ranks, "%d", world);
      print_row(ranks, configs[c].name, run.cfg.checkpoint ? "yes" : "no", median_step(run.seconds),
                largest(run.peak, world), largest(run.in_use, world));
    }
  }
  return 0;
}
