/* bench_engine: the engine's speed, per BENCH.md section 2. Prints "key value" lines that
 * bench/engine.sh (CPU) and bench/engine_gpu.sh (`--device cuda`) set beside PyTorch's
 * (bench/engine_torch.py) in one table.
 *
 * Measured: training samples/s at batch 128 or `--batch N` (MLP 784-256-128-10 and the small
 * CNN, ReLU, cross-entropy, SGD momentum 0.9, random inputs of Fashion-MNIST's shape, a fixed
 * number of steps after warm-up); batch-1 inference latency p50/p99 over 1000 runs after warm-up
 * (evaluation mode, no graph); sgemm 1024^3 through tr_matmul and through cblas_sgemm; the
 * cross-core round trip at the start and at the end.
 * Thread counts come from the environment (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS), and
 * `--pool N` gives the context the engine's own pool of N threads (tr_threadpool).
 * `--device cuda` runs the models on CUDA device 0 (inputs copied there once, labels from the
 * host each step as the engine's cross-entropy takes them); every timed span ends with
 * tr_cuda_sync, so it counts the device's work, not its queueing. The CPU-only lines (OpenBLAS,
 * cross-core round trip) are left out there and sgemm is 4096^3 on the device. `--model mlp` or
 * `--model cnn` measures that model's training alone (a short run for a profiler); `--model
 * wide` the training of MLP 784-4096-4096-10 (issue 9's GPU comparison), measured only then. */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer.h"

/* What a run measures, from the command line. */
typedef struct {
  bool quick;  /* a few steps of each: a smoke test of the benchmark itself */
  int pool;    /* threads of the engine's own pool; 0: none */
  int batch;   /* training batch */
  bool cuda;   /* on CUDA device 0 instead of the CPU */
  const char *model; /* "mlp", "cnn" or "wide" alone (training only); NULL: mlp and cnn, all */
} bench_opts;

static void die(const char *what, const tr_ctx *ctx) {
  fprintf(stderr, "bench_engine: %s: %s\n", what, ctx->err.msg);
  exit(1);
}

static void add(tr_ctx *ctx, tr_module *seq, tr_module *m) {
  if (tr_sequential_add(ctx, seq, m)) die("model", ctx);
}

/* Flatten, then Linear widths[0] -> widths[1] -> widths[2] -> widths[3] with ReLU between. */
static tr_module *mlp_of(tr_ctx *ctx, const int64_t widths[4]) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  for (int i = 0; i < 3; i++) {
    if (i > 0) add(ctx, m, tr_activation_new(ctx, TR_RELU));
    add(ctx, m, tr_linear_new(ctx, widths[i], widths[i + 1], true));
  }
  return m;
}

static tr_module *mlp_new(tr_ctx *ctx) { return mlp_of(ctx, (const int64_t[]){784, 256, 128, 10}); }

/* The wider MLP of issue 9's GPU numbers (GEMM-bound). */
static tr_module *wide_new(tr_ctx *ctx) {
  return mlp_of(ctx, (const int64_t[]){784, 4096, 4096, 10});
}

static tr_module *cnn_new(tr_ctx *ctx) {
  tr_module *m = tr_sequential_new(ctx);
  add(ctx, m, tr_conv2d_new(ctx, 1, 16, 3, 1, 0, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  add(ctx, m, tr_conv2d_new(ctx, 16, 32, 3, 1, 0, true));
  add(ctx, m, tr_activation_new(ctx, TR_RELU));
  add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, 2));
  add(ctx, m, tr_activation_new(ctx, TR_FLATTEN));
  add(ctx, m, tr_linear_new(ctx, 32 * 5 * 5, 10, true));
  return m;
}

/* One SGD step on (x, labels). */
static void train_step(tr_ctx *ctx, tr_module *m, tr_optim *opt, tr_tensor *x,
                       const int32_t *labels) {
  tr_optim_zero_grad(opt);
  tr_tensor *logits = tr_module_forward(ctx, m, x);
  tr_tensor *loss = logits ? tr_cross_entropy(ctx, logits, labels) : NULL;
  if (!loss || tr_backward(ctx, loss, NULL, false) || tr_optim_step(ctx, opt))
    die("train step", ctx);
  tr_release(loss);
  tr_release(logits);
}

/* Waits for the device's queued work (nothing to wait for on the CPU). */
static void wait_device(tr_ctx *ctx) {
  if (ctx->cuda && tr_cuda_sync(ctx->cuda, &ctx->err)) die("device", ctx);
}

/* x on the device the context computes on (ctx->cuda, else the CPU); x's reference moves. */
static tr_tensor *onto_device(tr_ctx *ctx, tr_tensor *x) {
  if (!x || !ctx->cuda) return x;
  tr_tensor *moved = tr_to_device(ctx, x, TR_DEVICE_CUDA(tr_cuda_device(ctx->cuda)));
  if (!moved) die("to device", ctx);
  tr_release(x);
  return moved;
}

/* CPU seconds this process has used (all threads). */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Samples per wall second; *per_cpu gets samples per CPU second, which a busy shared
 * machine disturbs much less (a process that waits for a core uses no CPU meanwhile). */
static double train_rate(tr_ctx *ctx, tr_module *m, int batch, int warmup, int steps,
                         double *per_cpu) {
  tr_tensor *x = onto_device(ctx, tr_randn(ctx, TR_F32, 4, (int64_t[]){batch, 1, 28, 28}, 1.0));
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
  if (!labels) {
    fprintf(stderr, "bench_engine: out of memory\n");
    exit(1);
  }
  for (int i = 0; i < batch; i++) labels[i] = (int32_t)(tr_rand_u64(ctx) % 10);
  tr_param_list params = {0};
  if (tr_module_parameters(m, false, &params, &ctx->err)) die("parameters", ctx);
  tr_optim *opt = tr_optim_new(ctx, &(tr_optim_config){.kind = TR_SGD, .lr = 0.01, .momentum = 0.9},
                               params.items, params.n);
  for (int i = 0; i < warmup; i++) train_step(ctx, m, opt, x, labels);
  wait_device(ctx);
  double start = nas_monotonic(), cpu_start = cpu_seconds();
  for (int i = 0; i < steps; i++) train_step(ctx, m, opt, x, labels);
  wait_device(ctx);
  double rate = (double)steps * batch / (nas_monotonic() - start);
  *per_cpu = (double)steps * batch / (cpu_seconds() - cpu_start);
  free(labels);
  tr_optim_free(opt);
  tr_param_list_free(&params);
  tr_release(x);
  return rate;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Batch-1 forward latency in microseconds (until the result is computed, on a device too):
 * p50 and p99 of runs after warm-up. */
static void latency(tr_ctx *ctx, tr_module *m, double *p50, double *p99) {
  enum { WARMUP = 200, RUNS = 1000 };
  static const int64_t shape[4] = {1, 1, 28, 28};
  tr_tensor *x = onto_device(ctx, tr_randn(ctx, TR_F32, 4, shape, 1.0));
  double *us = malloc(sizeof(double) * RUNS);
  tr_module_train(m, false);
  bool prev = tr_set_grad_enabled(ctx, false);
  for (int i = 0; i < WARMUP + RUNS; i++) {
    double start = nas_monotonic();
    tr_tensor *y = tr_module_forward(ctx, m, x);
    if (!y) die("inference", ctx);
    wait_device(ctx);
    tr_release(y);
    if (i >= WARMUP) us[i - WARMUP] = (nas_monotonic() - start) * 1e6;
  }
  tr_set_grad_enabled(ctx, prev);
  tr_module_train(m, true);
  qsort(us, RUNS, sizeof *us, cmp_double);
  *p50 = us[RUNS / 2];
  *p99 = us[RUNS * 99 / 100];
  free(us);
  tr_release(x);
}

/* Cross-core round trip in ns: the median of batches of two threads handing a counter to
 * each other. On this project's 2-vCPU machines it is 70-80 ns while the two vCPUs share a
 * cache and 400-500 ns while they do not (the hypervisor moves them), and everything split
 * over two threads runs at the speed of that hand-off: print it beside the numbers. */
enum { PING_ROUNDS = 2000, PING_BATCHES = 9 };

static void *pong(void *arg) {
  _Atomic int *ball = arg;
  for (int i = 0; i < PING_ROUNDS * PING_BATCHES; i++) {
    while (atomic_load_explicit(ball, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(ball, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static double core_round_trip_ns(void) {
  _Atomic int ball = 0;
  pthread_t t;
  if (pthread_create(&t, NULL, pong, &ball) != 0) return -1;
  double ns[PING_BATCHES];
  for (int b = 0, i = 0; b < PING_BATCHES; b++) {
    double start = nas_monotonic();
    for (int r = 0; r < PING_ROUNDS; r++, i++) {
      atomic_store_explicit(&ball, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns[b] = (nas_monotonic() - start) * 1e9 / PING_ROUNDS;
  }
  pthread_join(t, NULL);
  qsort(ns, PING_BATCHES, sizeof *ns, cmp_double);
  return ns[PING_BATCHES / 2];
}

/* How much faster two threads run the MLP's first GEMM (128x784 by 784x256, as the forward
 * computes it) than one: each thread one single-threaded OpenBLAS call on its own half of
 * the weight's rows, on buffers of its own that stay put, against one call on the whole;
 * best of SCALING_REPS each. No data moves between the cores, so this is the compute the
 * machine gives two busy threads: on this project's 2-vCPU machines anywhere from 1.4 to
 * 2.0 from minute to minute, whatever the cross-core round trip (the host's other load). */
enum { HALF_ROWS = 128, GEMM_M = 128, GEMM_K = 784, SCALING_REPS = 200 };

typedef struct {
  float *x, *w, *y; /* (GEMM_M, GEMM_K), (HALF_ROWS, GEMM_K), (GEMM_M, HALF_ROWS): owned */
  _Atomic int *go, *done;
} gemm_half;

static void half_gemm(const gemm_half *h, int rows) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GEMM_M, rows, GEMM_K, 1.0f, h->x, GEMM_K,
              h->w, GEMM_K, 0.0f, h->y, rows);
}

static void *second_half(void *arg) {
  gemm_half *h = arg;
  for (int r = 1; r <= SCALING_REPS; r++) {
    while (atomic_load_explicit(h->go, memory_order_acquire) < r) {
    }
    half_gemm(h, HALF_ROWS);
    atomic_store_explicit(h->done, r, memory_order_release);
  }
  return NULL;
}

static bool half_new(gemm_half *h, int rows) {
  h->x = calloc((size_t)GEMM_M * GEMM_K, sizeof(float));
  h->w = calloc((size_t)rows * GEMM_K, sizeof(float));
  h->y = calloc((size_t)GEMM_M * rows, sizeof(float));
  return h->x && h->w && h->y;
}

static void half_free(gemm_half *h) {
  free(h->x);
  free(h->w);
  free(h->y);
}

static double two_core_gemm_speedup(void) {
  int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1); /* one core per call, whatever the configuration's setting */
  _Atomic int go = 0, done = 0;
  gemm_half whole = {0}, first = {.go = &go, .done = &done}, second = first;
  double best_one = 1e9, best_two = 1e9;
  pthread_t t;
  bool ok = half_new(&whole, 2 * HALF_ROWS) && half_new(&first, HALF_ROWS) &&
            half_new(&second, HALF_ROWS) && pthread_create(&t, NULL, second_half, &second) == 0;
  for (int r = 1; ok && r <= SCALING_REPS; r++) {
    double t0 = nas_monotonic();
    half_gemm(&whole, 2 * HALF_ROWS);
    double t1 = nas_monotonic();
    atomic_store_explicit(&go, r, memory_order_release);
    half_gemm(&first, HALF_ROWS);
    while (atomic_load_explicit(&done, memory_order_acquire) < r) {
    }
    double t2 = nas_monotonic();
    if (t1 - t0 < best_one) best_one = t1 - t0;
    if (t2 - t1 < best_two) best_two = t2 - t1;
  }
  if (ok) pthread_join(t, NULL);
  half_free(&whole);
  half_free(&first);
  half_free(&second);
  openblas_set_num_threads(blas_threads);
  return ok ? best_one / best_two : -1;
}

/* Best GFLOP/s over reps of 1024^3: through the engine, and OpenBLAS called directly. */
static void sgemm_rates(tr_ctx *ctx, double *engine, double *direct) {
  enum { N = 1024, REPS = 16 };
  const int64_t shape[2] = {N, N};
  tr_tensor *a = tr_randn(ctx, TR_F32, 2, shape, 1.0), *b = tr_randn(ctx, TR_F32, 2, shape, 1.0);
  tr_tensor *c = tr_zeros(ctx, TR_F32, 2, shape);
  double flops = 2.0 * N * N * N, best_e = 1e9, best_d = 1e9;
  bool prev = tr_set_grad_enabled(ctx, false);
  for (int r = 0; r < REPS; r++) {
    double t0 = nas_monotonic();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, tr_f32(a), N, tr_f32(b),
                N, 0.0f, tr_f32(c), N);
    double t1 = nas_monotonic();
    tr_tensor *e = tr_matmul(ctx, a, b);
    double t2 = nas_monotonic();
    if (!e) die("matmul", ctx);
    tr_release(e);
    if (t1 - t0 < best_d) best_d = t1 - t0;
    if (t2 - t1 < best_e) best_e = t2 - t1;
  }
  tr_set_grad_enabled(ctx, prev);
  *engine = flops / best_e * 1e-9;
  *direct = flops / best_d * 1e-9;
  tr_release(a);
  tr_release(b);
  tr_release(c);
}

/* Best GFLOP/s of tr_matmul over reps of 4096^3 on the device, each waited for. */
static double device_sgemm_rate(tr_ctx *ctx) {
  enum { N = 4096, REPS = 16 };
  const int64_t shape[2] = {N, N};
  tr_tensor *a = onto_device(ctx, tr_randn(ctx, TR_F32, 2, shape, 1.0));
  tr_tensor *b = onto_device(ctx, tr_randn(ctx, TR_F32, 2, shape, 1.0));
  double best = 1e9;
  bool prev = tr_set_grad_enabled(ctx, false);
  for (int r = 0; r < REPS; r++) {
    double start = nas_monotonic();
    tr_tensor *c = tr_matmul(ctx, a, b);
    if (!c) die("matmul", ctx);
    wait_device(ctx);
    double took = nas_monotonic() - start;
    tr_release(c);
    if (took < best) best = took;
  }
  tr_set_grad_enabled(ctx, prev);
  tr_release(a);
  tr_release(b);
  return 2.0 * N * N * N / best * 1e-9;
}

static bool parse_opts(int argc, char **argv, bench_opts *opts) {
  *opts = (bench_opts){.batch = 128};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      opts->quick = true;
    } else if (strcmp(argv[i], "--pool") == 0 && i + 1 < argc) {
      opts->pool = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
      opts->batch = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc &&
               (strcmp(argv[i + 1], "cuda") == 0 || strcmp(argv[i + 1], "cpu") == 0)) {
      opts->cuda = strcmp(argv[++i], "cuda") == 0;
    } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc &&
               (strcmp(argv[i + 1], "mlp") == 0 || strcmp(argv[i + 1], "cnn") == 0 ||
                strcmp(argv[i + 1], "wide") == 0)) {
      opts->model = argv[++i];
    } else {
      return false;
    }
  }
  return true;
}

/* The CPU-only lines: OpenBLAS's thread count, the machine's two-core figures. */
static void print_cpu_figures(void) {
  printf("openblas_threads %d\n", openblas_get_num_threads());
  printf("core_round_trip_ns %.0f\n", core_round_trip_ns());
  printf("gemm_two_core_speedup %.2f\n", two_core_gemm_speedup());
}

/* Everything opts asks for, printed as "key value" lines. */
static void measure(tr_ctx *ctx, const bench_opts *opts, tr_module *mlp, tr_module *cnn) {
  bool quick = opts->quick;
  double per_cpu, rate;
  if (!opts->model || strcmp(opts->model, "mlp") == 0) {
    rate = train_rate(ctx, mlp, opts->batch, quick ? 2 : 50, quick ? 5 : 400, &per_cpu);
    printf("mlp_train_samples_per_s %.0f\nmlp_train_samples_per_cpu_s %.0f\n", rate, per_cpu);
  }
  if (!opts->model || strcmp(opts->model, "cnn") == 0) {
    rate = train_rate(ctx, cnn, opts->batch, quick ? 1 : 10, quick ? 2 : 60, &per_cpu);
    printf("cnn_train_samples_per_s %.0f\ncnn_train_samples_per_cpu_s %.0f\n", rate, per_cpu);
  }
  if (opts->model && strcmp(opts->model, "wide") == 0) {
    tr_module *wide = wide_new(ctx);
    if (opts->cuda && tr_module_to_device(ctx, wide, TR_DEVICE_CUDA(0)))
      die("model to device", ctx);
    rate = train_rate(ctx, wide, opts->batch, quick ? 1 : 10, quick ? 2 : 100, &per_cpu);
    printf("wide_train_samples_per_s %.0f\nwide_train_samples_per_cpu_s %.0f\n", rate, per_cpu);
    tr_module_free(wide);
  }
  if (opts->model) return; /* one model's training alone */
  double p50, p99;
  latency(ctx, mlp, &p50, &p99);
  printf("mlp_infer_p50_us %.2f\nmlp_infer_p99_us %.2f\n", p50, p99);
  latency(ctx, cnn, &p50, &p99);
  printf("cnn_infer_p50_us %.2f\ncnn_infer_p99_us %.2f\n", p50, p99);
  if (opts->cuda) {
    printf("sgemm_engine_gflops %.1f\n", device_sgemm_rate(ctx));
  } else {
    double engine, direct;
    sgemm_rates(ctx, &engine, &direct);
    printf("sgemm_engine_gflops %.1f\nsgemm_openblas_gflops %.1f\n", engine, direct);
    print_cpu_figures();
  }
}

int main(int argc, char **argv) {
  bench_opts opts;
  if (!parse_opts(argc, argv, &opts)) {
    fprintf(stderr,
            "usage: bench_engine [--quick] [--pool THREADS] [--batch N] [--device cpu|cuda] "
            "[--model mlp|cnn|wide]\n");
    return 2;
  }
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  ctx.alloc = tr_allocator_new((size_t)1 << 30); /* reuse step buffers: see trainer.h */
  if (opts.pool && !(ctx.threads = tr_threadpool_new(opts.pool, &ctx.err))) die("pool", &ctx);
  if (opts.cuda && !(ctx.cuda = tr_cuda_new(0, (size_t)1 << 30, &ctx.err))) die("cuda", &ctx);
  if (!opts.cuda) print_cpu_figures();
  printf("batch %d\n", opts.batch);
  tr_module *mlp = mlp_new(&ctx), *cnn = cnn_new(&ctx);
  if (opts.cuda && (tr_module_to_device(&ctx, mlp, TR_DEVICE_CUDA(0)) ||
                    tr_module_to_device(&ctx, cnn, TR_DEVICE_CUDA(0))))
    die("module to device", &ctx);
  measure(&ctx, &opts, mlp, cnn);
  tr_module_free(mlp);
  tr_module_free(cnn);
  if (ctx.cuda) tr_cuda_free(ctx.cuda);
  tr_threadpool_free(ctx.threads);
  tr_allocator_release(ctx.alloc);
  return 0;
}
