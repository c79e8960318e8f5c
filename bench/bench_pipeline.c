/* bench_pipeline: pipeline parallel training on the CPU with thread stages (issue 23): step
 * time and memory per stage for 1, 2 and 4 stages x 1, 4 and 8 micro-batches x the three
 * checkpoint modes, with FSDP on the same model and batch beside them. Prints a markdown
 * table for bench/RESULTS.md.
 *
 * Model and step: a deep MLP, 256 -> 8 x (Linear 256, ReLU) -> Linear 10 (17 children,
 * split evenly by count), cross-entropy, SGD momentum 0.9, a mini-batch of 512 random
 * examples; WARMUP steps, then STEPS timed on stage 0 (a step ends at the stages' barrier,
 * so stage 0's step is everyone's), the median printed, and each stage's CPU time per timed
 * step (its thread's: the work it does, without its waits; with a core per stage, stage 0's
 * step less the largest of these x (chunks + stages - 1) / chunks, GPipe's fill and drain,
 * is what the hand-offs between stages cost; under `never` the thread stages run one
 * forward one backward instead, docs/engine-pipeline.md, and the step may come below that,
 * down to the last stage's time plus stage 0's first forward). Memory is each stage's
 * allocator (the model itself comes from malloc): its peak over the run, and what stays in use
 * between steps (gradients and momentum); their difference is the stage's activation
 * memory, the column the target is about: with checkpoint `always`, the largest stage's
 * activations should stay within 1/stages of one rank's with `never`, plus one stage's
 * working set: one micro-batch through one stage — its graph (1/(stages x chunks) of one
 * rank's), the three tensors at the stage's edges (its input, the output's gradient
 * received and the input's gradient sent) and one layer's gradient, which a micro-batch's
 * backward may make before adding it to the accumulated one (a linear layer adds its
 * weight's in place, its bias's not). The model is narrow and the
 * batch large, so activations dominate. OpenBLAS and OpenMP run one thread per stage.
 *
 * Then the residual rows: 256 -> Linear 256, ReLU -> 4 x (stash, Linear 256, ReLU,
 * Linear 256, pop add, ReLU) -> Linear 10 (27 children, split evenly by count, so skips
 * cross stages and the pipeline carries them), one rank and 2 and 4 stages with 8
 * micro-batches checkpointed `always`, against the same target.
 *
 * `bench_pipeline --stages N` prints the one-rank row and the rows of N stages only (a
 * shorter run for timing windows). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "trainer/dist.h"
#include "trainer/pipeline.h"
#include "trainer/trainer.h"

#define BATCH 512
#define WIDTH 256
#define DEPTH 8
#define WARMUP 2
#define STEPS 10
#define MAX_STAGES 4
#define RES_BLOCKS 4

typedef struct {
  int stages;
  bool residual;            /* the residual MLP instead of the deep one */
  tr_pipe_config pipe;      /* pipeline runs */
  tr_fsdp_config fsdp;      /* FSDP runs */
  double seconds[STEPS];    /* stage (rank) 0's steps */
  double cpu[MAX_STAGES];   /* each stage's (rank's) thread CPU seconds per timed step */
  size_t peak[MAX_STAGES], in_use[MAX_STAGES];
} bench_run;

static tr_module *deep_mlp_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  for (int i = 0; m && i <= DEPTH; i++) {
    bool last = i == DEPTH;
    if (tr_sequential_add(ctx, m, tr_linear_new(ctx, WIDTH, last ? 10 : WIDTH, true)) ||
        (!last && tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU)))) {
      tr_module_free(m);
      return NULL;
    }
  }
  return m;
}

static int add_all(tr_ctx *ctx, tr_module *m, tr_module *const *children, int n) {
  int rc = NAS_OK;
  for (int i = 0; i < n; i++)
    if (rc == NAS_OK) rc = tr_sequential_add(ctx, m, children[i]);
    else tr_module_free(children[i]);
  return rc;
}

/* The residual MLP of the file's comment. */
static tr_module *residual_mlp_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  tr_module *stem[] = {tr_linear_new(ctx, WIDTH, WIDTH, true), tr_activation_new(ctx, TR_RELU)};
  int rc = m ? add_all(ctx, m, stem, 2) : NAS_ERR;
  for (int b = 0; b < RES_BLOCKS && rc == NAS_OK; b++) {
    tr_module *stash, *pop;
    if (tr_skip_new(ctx, TR_SKIP_ADD, &stash, &pop)) {
      rc = NAS_ERR;
      break;
    }
    tr_module *block[] = {stash, tr_linear_new(ctx, WIDTH, WIDTH, true),
                          tr_activation_new(ctx, TR_RELU), tr_linear_new(ctx, WIDTH, WIDTH, true),
                          pop, tr_activation_new(ctx, TR_RELU)};
    rc = add_all(ctx, m, block, 6);
  }
  if (rc == NAS_OK) rc = tr_sequential_add(ctx, m, tr_linear_new(ctx, WIDTH, 10, true));
  if (rc == NAS_OK) return m;
  tr_module_free(m);
  return NULL;
}

static const tr_optim_config sgd = {.kind = TR_SGD, .lr = 0.01, .momentum = 0.9};

/* What a stage or rank holds: the model and data from malloc, the rest from its allocator. */
typedef struct {
  tr_ctx ctx;
  tr_module *model;
  tr_tensor *x;
  int32_t labels[BATCH];
  tr_optim *opt;
} member;

static int member_setup(member *b, int64_t examples, bool residual) {
  tr_ctx_init(&b->ctx, 1);
  b->model = residual ? residual_mlp_new(&b->ctx) : deep_mlp_new(&b->ctx);
  b->x = tr_randn(&b->ctx, TR_F32, 2, (int64_t[]){examples, WIDTH}, 1.0);
  for (int64_t i = 0; i < examples; i++) b->labels[i] = (int32_t)(tr_rand_u64(&b->ctx) % 10);
  b->ctx.alloc = tr_allocator_new((size_t)512 << 20);
  return b->model && b->x && b->ctx.alloc ? NAS_OK : NAS_ERR;
}

static void member_free(member *b) {
  tr_optim_free(b->opt);
  tr_release(b->x);
  tr_module_free(b->model);
  tr_allocator_release(b->ctx.alloc);
}

/* The calling thread's CPU time in seconds. */
static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void member_record(member *b, bench_run *run, int index) {
  tr_alloc_stats st;
  tr_allocator_stats(b->ctx.alloc, &st);
  run->peak[index] = st.peak;
  run->in_use[index] = st.in_use;
}

/* ---------------------------------------------------------------- pipeline */

static tr_tensor *loss_of(tr_ctx *ctx, tr_tensor *out, int64_t start, int64_t count, void *y) {
  (void)count;
  return tr_cross_entropy(ctx, out, (const int32_t *)y + start);
}

static int pipe_step(member *b, tr_pipe *p, int stage) {
  tr_optim_zero_grad(b->opt);
  int rc = tr_pipe_train_step(&b->ctx, p, stage == 0 ? b->x : NULL, BATCH, loss_of, b->labels,
                              NULL);
  return rc == NAS_OK ? tr_optim_step(&b->ctx, b->opt) : rc;
}

static int bench_stage(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  bench_run *run = arg;
  member b = {0};
  tr_pipe *p = NULL;
  int rc = member_setup(&b, BATCH, run->residual);
  if (rc == NAS_OK && !(p = tr_pipe_new(&b.ctx, b.model, rank, &run->pipe))) rc = NAS_ERR;
  if (rc == NAS_OK && !(b.opt = tr_pipe_optim_new(&b.ctx, p, &sgd))) rc = NAS_ERR;
  for (int i = 0; i < WARMUP && rc == NAS_OK; i++) rc = pipe_step(&b, p, rank->stage);
  double cpu_start = thread_cpu_s();
  for (int i = 0; i < STEPS && rc == NAS_OK; i++) {
    double start = nas_monotonic();
    rc = pipe_step(&b, p, rank->stage);
    if (rank->stage == 0) run->seconds[i] = nas_monotonic() - start;
  }
  run->cpu[rank->stage] = (thread_cpu_s() - cpu_start) / STEPS;
  if (rc == NAS_OK) member_record(&b, run, rank->stage);
  if (rc) nas_errf(err, "%s", b.ctx.err.msg);
  tr_pipe_free(p);
  member_free(&b);
  return rc;
}

/* ---------------------------------------------------------------- FSDP beside it */

static int fsdp_step(member *b, tr_fsdp *f) {
  tr_optim_zero_grad(b->opt);
  tr_tensor *logits = tr_fsdp_forward(&b->ctx, f, b->x);
  tr_tensor *loss = logits ? tr_cross_entropy(&b->ctx, logits, b->labels) : NULL;
  int rc = loss ? tr_fsdp_backward(&b->ctx, f, loss) : NAS_ERR;
  if (rc == NAS_OK) rc = tr_optim_step(&b->ctx, b->opt);
  tr_release(loss);
  tr_release(logits);
  return rc;
}

static int bench_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  bench_run *run = arg;
  member b = {0};
  tr_fsdp *f = NULL;
  int rc = member_setup(&b, BATCH / rank->world, false);
  if (rc == NAS_OK &&
      !(f = tr_fsdp_new(&b.ctx, b.model, rank->comm, rank->prefetch_comm, &run->fsdp)))
    rc = NAS_ERR;
  if (rc == NAS_OK && !(b.opt = tr_fsdp_optim_new(&b.ctx, f, &sgd))) rc = NAS_ERR;
  for (int i = 0; i < WARMUP && rc == NAS_OK; i++) rc = fsdp_step(&b, f);
  double cpu_start = thread_cpu_s();
  for (int i = 0; i < STEPS && rc == NAS_OK; i++) {
    double start = nas_monotonic();
    rc = fsdp_step(&b, f);
    if (rank->rank == 0) run->seconds[i] = nas_monotonic() - start;
  }
  run->cpu[rank->rank] = (thread_cpu_s() - cpu_start) / STEPS;
  if (rc == NAS_OK) member_record(&b, run, rank->rank);
  if (rc) nas_errf(err, "%s", b.ctx.err.msg);
  tr_fsdp_free(f);
  member_free(&b);
  return rc;
}

/* ---------------------------------------------------------------- the table */

static double median_step(double *seconds) { return bench_median(seconds, STEPS); }

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* The largest stage's activation memory (peak less what stays between steps). */
static size_t largest_activation(const bench_run *run, int n) {
  size_t most = 0;
  for (int s = 0; s < n; s++) {
    size_t act = run->peak[s] - run->in_use[s];
    most = act > most ? act : most;
  }
  return most;
}

/* "a / b / ..." of one value per stage (n of them), with one decimal. */
static void per_stage_text(const double *values, int n, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  for (int s = 0; s < n && len < cap; s++)
    len += (size_t)snprintf(out + len, cap - len, "%s%.1f", s ? " / " : "", values[s]);
}

static const char *const ckpt_names[] = {"except_last", "always", "never"};

static void print_row(const char *kind, int members, const char *mode, bench_run *run,
                      size_t single_act, int chunks) {
  char peaks[128], cpu[128], target[32] = "";
  double peak_mib[MAX_STAGES] = {0}, cpu_ms[MAX_STAGES] = {0};
  for (int s = 0; s < members; s++) {
    peak_mib[s] = mib(run->peak[s]);
    cpu_ms[s] = run->cpu[s] * 1e3;
  }
  per_stage_text(peak_mib, members, peaks, sizeof peaks);
  per_stage_text(cpu_ms, members, cpu, sizeof cpu);
  size_t act = largest_activation(run, members);
  if (single_act > 0 && chunks > 0) {
    double layer_grad = (double)((WIDTH * WIDTH + WIDTH) * sizeof(float));
    double edges = 3.0 * (double)(BATCH / chunks * WIDTH * sizeof(float));
    double bound = (double)single_act / members + (double)single_act / (members * chunks) +
                   edges + layer_grad;
    snprintf(target, sizeof target, "%.1f (%s)", mib((size_t)bound),
             (double)act <= bound ? "met" : "missed");
  }
  double step_s = median_step(run->seconds);
  printf("| %s | %d | %s | %.1f | %.0f | %s | %s | %.1f | %s |\n", kind, members, mode,
         step_s * 1e3, BATCH / step_s, cpu, peaks, mib(act), target);
}

static int run_pipeline(int stages, int chunks, tr_pipe_checkpoint ckpt, bool residual,
                        bench_run *run) {
  *run = (bench_run){.stages = stages, .residual = residual,
                     .pipe = {.chunks = chunks, .checkpoint = ckpt}};
  nas_err err = {{0}};
  if (tr_pipe_run_threads(stages, 600.0, bench_stage, run, &err) == NAS_OK) return NAS_OK;
  fprintf(stderr, "bench_pipeline: %d stages, %d chunks, %s: %s\n", stages, chunks,
          ckpt_names[ckpt], err.msg);
  return NAS_ERR;
}

/* The stage count of `--stages N`, 0 when not given (every row), -1 when the arguments
 * are wrong. */
static int only_stages(int argc, char **argv) {
  if (argc == 1) return 0;
  int n = argc == 3 && strcmp(argv[1], "--stages") == 0 ? atoi(argv[2]) : 0;
  if (n == 1 || n == 2 || n == 4) return n;
  fprintf(stderr, "usage: bench_pipeline [--stages 1|2|4]\n");
  return -1;
}

int main(int argc, char **argv) {
  int only = only_stages(argc, argv);
  if (only < 0) return 2;
  openblas_set_num_threads(1);
  omp_set_num_threads(1); /* this thread's; the drivers hand each stage or rank its share */
  printf("Pipeline, MLP %d -> %d x (Linear %d, ReLU) -> 10, mini-batch %d, SGD momentum; "
         "median of %d steps after %d warm-up; one thread per stage or rank\n\n",
         WIDTH, DEPTH, WIDTH, BATCH, STEPS, WARMUP);
  printf("| parallelism | stages/ranks | chunks, checkpoint | step ms | samples/s | CPU ms per "
         "step per stage | peak MiB per stage | activations MiB (largest) | `always` target "
         "MiB |\n|---|---|---|---|---|---|---|---|---|\n");
  bench_run base;
  if (run_pipeline(1, 1, TR_PIPE_CKPT_NEVER, false, &base)) return 1;
  size_t single_act = largest_activation(&base, 1);
  print_row("one rank", 1, "1, never", &base, 0, 0);
  static const int chunk_counts[] = {1, 4, 8};
  for (int stages = 1; stages <= MAX_STAGES; stages *= 2) {
    if (only && stages != only) continue;
    for (size_t c = 0; c < sizeof chunk_counts / sizeof *chunk_counts; c++) {
      for (int ckpt = 0; ckpt < 3; ckpt++) {
        bench_run run;
        int chunks = chunk_counts[c];
        if (run_pipeline(stages, chunks, (tr_pipe_checkpoint)ckpt, false, &run)) return 1;
        char mode[48];
        snprintf(mode, sizeof mode, "%d, %s", chunks, ckpt_names[ckpt]);
        print_row("pipeline", stages, mode, &run, ckpt == TR_PIPE_CKPT_ALWAYS ? single_act : 0,
                  chunks);
      }
    }
  }
  if (only) return 0;
  if (run_pipeline(1, 1, TR_PIPE_CKPT_NEVER, true, &base)) return 1;
  single_act = largest_activation(&base, 1);
  print_row("residual, one rank", 1, "1, never", &base, 0, 0);
  for (int stages = 2; stages <= MAX_STAGES; stages *= 2) {
    bench_run run;
    if (run_pipeline(stages, 8, TR_PIPE_CKPT_ALWAYS, true, &run)) return 1;
    print_row("residual pipeline", stages, "8, always", &run, single_act, 8);
  }
  for (int world = 2; world <= MAX_STAGES; world *= 2) {
    for (int ckpt = 0; ckpt < 2; ckpt++) {
      bench_run run = {.fsdp = {.mode = TR_SHARD_FULL, .checkpoint = ckpt, .prefetch = true}};
      nas_err err = {{0}};
      if (tr_fsdp_run_threads(world, bench_rank, &run, &err)) {
        fprintf(stderr, "bench_pipeline: FSDP %d ranks: %s\n", world, err.msg);
        return 1;
      }
      print_row("FSDP full", world, ckpt ? "checkpoint" : "-", &run, 0, 0);
    }
  }
  return 0;
}
