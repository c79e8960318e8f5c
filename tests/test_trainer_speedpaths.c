/* The engine's fast paths compute what the plain paths compute: GEMMs and matrix-vector
 * products split over threads (OpenMP's, or the engine's own pool) against one call on one
 * thread, the pool itself (every part of every job runs once, also after its workers slept),
 * and the fused inference of conv2d + ReLU + max pool and of linear + ReLU against the
 * modules run one by one. Sizes are odd on purpose (not multiples of 16, batch 1, 3 and
 * 127), so that ragged edges and parts of unequal size are exercised. Thread settings are
 * the process's; each test restores them. */
#include "tests/testutil.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "trainer/fast/infer.h"
#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }

/* How the engine may use threads: not at all, OpenMP's two, or a pool of two. */
typedef enum { ONE_THREAD, OPENMP, POOL } thread_mode;
static const char *const mode_names[] = {"one thread", "OpenMP", "pool"};

/* A context set up for a mode, and the process settings to restore. */
typedef struct {
  tr_ctx ctx;
  int blas, omp;
} run_env;

static void env_begin(run_env *e, thread_mode mode, uint64_t seed) {
  tr_ctx_init(&e->ctx, seed);
  e->blas = openblas_get_num_threads();
  e->omp = omp_get_max_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(mode == OPENMP ? 2 : 1);
  if (mode == POOL) assert_non_null(e->ctx.threads = tr_threadpool_new(2, &e->ctx.err));
}

static void env_end(run_env *e) {
  tr_threadpool_free(e->ctx.threads);
  openblas_set_num_threads(e->blas);
  omp_set_num_threads(e->omp);
}

/* |a - b| <= tol * scale[i] for every element (scale NULL: 1). */
static void assert_close(const tr_tensor *a, const tr_tensor *b, const tr_tensor *scale,
                         double tol, const char *what, thread_mode mode) {
  assert_int_equal(a->numel, b->numel);
  for (int64_t i = 0; i < a->numel; i++) {
    double d = fabs(tr_get(a, i) - tr_get(b, i)), s = scale ? tr_get(scale, i) : 1.0;
    if (!(d <= tol * s))
      fail_msg("%s (%s): element %lld: %g vs %g", what, mode_names[mode], (long long)i,
               tr_get(a, i), tr_get(b, i));
  }
}

/* ---------------------------------------------------------------- the pool */

enum { COUNTED_PARTS = 4 };

typedef struct {
  _Atomic int runs[COUNTED_PARTS];
  _Atomic int bad_parts; /* calls whose parts was not the pool's size */
  int want_parts;
} part_counts;

static void count_part(void *arg, int part, int parts) {
  part_counts *c = arg;
  if (parts != c->want_parts || part < 0 || part >= parts) atomic_fetch_add(&c->bad_parts, 1);
  else atomic_fetch_add(&c->runs[part], 1);
}

static void pool_runs_every_part_of_every_job_once(void **state) {
  (void)state;
  for (int threads = 1; threads <= 3; threads++) {
    run_env e;
    env_begin(&e, ONE_THREAD, 1);
    assert_non_null(e.ctx.threads = tr_threadpool_new(threads, &e.ctx.err));
    assert_int_equal(tn_par_parts(&e.ctx), threads);
    for (int job = 0; job < 20000; job++) {
      part_counts c = {.want_parts = threads};
      tn_par_run(&e.ctx, count_part, &c);
      /* every part has run when tn_par_run returns: nothing may arrive later */
      for (int p = 0; p < threads; p++) assert_int_equal(atomic_load(&c.runs[p]), 1);
      assert_int_equal(atomic_load(&c.bad_parts), 0);
      if (job % 5000 == 4999) usleep(20000); /* long enough for idle workers to sleep */
    }
    env_end(&e);
  }
}

/* Part 0 of every job runs on the thread that called tn_par_run (infer.c gives it a larger
 * share, since it starts first), in every mode. */
typedef struct {
  pthread_t caller;
  _Atomic int elsewhere; /* jobs whose part 0 ran on another thread */
} part_zero_check;

static void note_part_zero(void *arg, int part, int parts) {
  (void)parts;
  part_zero_check *c = arg;
  if (part == 0 && !pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->elsewhere, 1);
}

static void part_zero_runs_on_the_calling_thread(void **state) {
  (void)state;
  for (thread_mode mode = ONE_THREAD; mode <= POOL; mode++) {
    run_env e;
    env_begin(&e, mode, 1);
    part_zero_check c = {.caller = pthread_self()};
    for (int job = 0; job < 2000; job++) tn_par_run(&e.ctx, note_part_zero, &c);
    assert_int_equal(atomic_load(&c.elsewhere), 0);
    env_end(&e);
  }
}

/* A part that splits work again: the inner job runs inline, as one part. Parts may run on
 * a worker thread, where cmocka cannot assert: they count what is wrong instead. */
typedef struct {
  const tr_ctx *ctx;
  part_counts inner[2];
  _Atomic int bad; /* outer parts out of range, or inner jobs offered more than one part */
} nested_job;

static void run_inner(void *arg, int part, int parts) {
  nested_job *j = arg;
  if (part >= 2 || parts != 2 || tn_par_parts(j->ctx) != 1) {
    atomic_fetch_add(&j->bad, 1);
    return;
  }
  tn_par_run(j->ctx, count_part, &j->inner[part]);
}

static void pool_job_inside_a_pool_job_runs_inline(void **state) {
  (void)state;
  run_env e;
  env_begin(&e, POOL, 2);
  nested_job j = {.ctx = &e.ctx, .inner = {{.want_parts = 1}, {.want_parts = 1}}};
  tn_par_run(&e.ctx, run_inner, &j);
  assert_int_equal(atomic_load(&j.bad), 0);
  for (int p = 0; p < 2; p++) {
    assert_int_equal(atomic_load(&j.inner[p].runs[0]), 1);
    assert_int_equal(atomic_load(&j.inner[p].bad_parts), 0);
  }
  env_end(&e);
}

static void threadpool_refuses_a_count_out_of_range(void **state) {
  (void)state;
  nas_err err = {0};
  assert_null(tr_threadpool_new(0, &err));
  assert_non_null(strstr(err.msg, "0 threads"));
  tr_threadpool_free(NULL); /* like free(NULL) */
}

/* ---------------------------------------------------------------- split GEMMs */

/* A (rows, cols) operand: contiguous, or a transposed view of a contiguous (cols, rows). */
static tr_tensor *operand(tr_ctx *ctx, int64_t rows, int64_t cols, bool transposed) {
  if (!transposed) return tr_rand(ctx, TR_F32, 2, SHAPE(rows, cols), -1, 1);
  tr_tensor *stored = tr_rand(ctx, TR_F32, 2, SHAPE(cols, rows), -1, 1);
  tr_tensor *view = tr_transpose(ctx, stored, 0, 1);
  tr_release(stored);
  return view;
}

/* |a| @ |b|: the scale of each element's rounding error. */
static tr_tensor *abs_product(tr_ctx *ctx, const tr_tensor *a, const tr_tensor *b) {
  tr_tensor *pa = tr_empty(ctx, TR_F32, 2, a->shape), *pb = tr_empty(ctx, TR_F32, 2, b->shape);
  for (int64_t i = 0; i < a->numel; i++) tr_f32(pa)[i] = (float)fabs(tr_get(a, i));
  for (int64_t i = 0; i < b->numel; i++) tr_f32(pb)[i] = (float)fabs(tr_get(b, i));
  tr_tensor *p = tr_matmul(ctx, pa, pb);
  tr_release(pa);
  tr_release(pb);
  return p;
}

/* tr_matmul of a and b with the engine's threads in `mode`. */
static tr_tensor *matmul_in(thread_mode mode, tr_tensor *a, tr_tensor *b) {
  run_env e;
  env_begin(&e, mode, 1);
  tr_set_grad_enabled(&e.ctx, false);
  tr_tensor *c = tr_matmul(&e.ctx, a, b);
  env_end(&e);
  assert_non_null(c);
  return c;
}

static void split_gemm_matches_one_call_in_every_layout(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  /* m, n, k: split by columns (B the largest: the MLP's first layer; ragged), by rows (C the
   * largest), by columns and by rows where the other dimension is too short */
  static const int64_t sizes[][3] = {{128, 256, 784}, {127, 301, 129}, {300, 257, 40},
                                     {3, 1001, 700},  {1000, 17, 77}};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (int layout = 0; layout < 4; layout++) {
      int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
      tr_tensor *a = operand(&ctx, m, k, layout & 1), *b = operand(&ctx, k, n, layout & 2);
      tr_tensor *one = matmul_in(ONE_THREAD, a, b), *scale = abs_product(&ctx, a, b);
      for (thread_mode mode = OPENMP; mode <= POOL; mode++) {
        tr_tensor *split = matmul_in(mode, a, b);
        assert_close(split, one, scale, 1e-5, "split GEMM", mode);
        tr_release(split);
      }
      tr_release(scale);
      tr_release(one);
      tr_release(a);
      tr_release(b);
    }
}

enum { STEP_OUTPUTS = 5 };

/* Two SGD steps of a linear layer at batch 127 (forward, then dx, dW, db, and the updated
 * weight after the second step) with the engine's threads in `mode`; out gets y, dx, dW,
 * db, W. */
static void linear_steps_in(thread_mode mode, tr_tensor **out) {
  run_env e;
  env_begin(&e, mode, 2);
  tr_module *lin = tr_linear_new(&e.ctx, 300, 257, true);
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(lin, false, &ps, &e.ctx.err), NAS_OK);
  tr_optim_config sgd = {.kind = TR_SGD, .lr = 0.1, .momentum = 0.9};
  tr_optim *opt = tr_optim_new(&e.ctx, &sgd, ps.items, ps.n);
  tr_tensor *x = tr_rand(&e.ctx, TR_F32, 2, SHAPE(127, 300), -1, 1);
  tr_tensor *g = tr_rand(&e.ctx, TR_F32, 2, SHAPE(127, 257), -1, 1);
  tr_set_requires_grad(x, true);
  for (int step = 0; step < 2; step++) {
    tr_optim_zero_grad(opt);
    tr_release(out[0]);
    out[0] = tr_module_forward(&e.ctx, lin, x);
    assert_non_null(out[0]);
    assert_int_equal(tr_backward(&e.ctx, out[0], g, false), NAS_OK);
    assert_int_equal(tr_optim_step(&e.ctx, opt), NAS_OK);
  }
  out[1] = tr_retain(x->grad);
  out[2] = tr_retain(ps.items[0]->grad);
  out[3] = tr_retain(ps.items[1]->grad);
  out[4] = tr_detach(&e.ctx, ps.items[0]); /* the weight storage outlives the module */
  tr_optim_free(opt);
  tr_release(g);
  tr_release(x);
  tr_param_list_free(&ps);
  tr_module_free(lin);
  env_end(&e);
}

static void split_linear_steps_match_one_thread(void **state) {
  (void)state;
  static const char *names[STEP_OUTPUTS] = {"y", "dx", "dW", "db", "W after two steps"};
  tr_tensor *one[STEP_OUTPUTS] = {0};
  linear_steps_in(ONE_THREAD, one);
  for (thread_mode mode = OPENMP; mode <= POOL; mode++) {
    tr_tensor *split[STEP_OUTPUTS] = {0};
    linear_steps_in(mode, split);
    for (int i = 0; i < STEP_OUTPUTS; i++) {
      /* entries are sums of at most 300 products of values in [-1, 1], some grown by lr 0.1 */
      assert_close(split[i], one[i], NULL, 300 * 1e-6, names[i], mode);
      tr_release(split[i]);
    }
  }
  for (int i = 0; i < STEP_OUTPUTS; i++) tr_release(one[i]);
}

enum { MLP_OUTPUTS = 4 };

/* Two SGD steps of linear 300->97, ReLU, linear 97->130, ReLU, cross-entropy at `batch`
 * with the engine's threads in `mode`; out gets dx, dW2, db2 and W2 after the steps. At
 * batch 127 the ReLUs (127x97, 127x130), the bias gradient of 130 columns and the update of
 * W2 (12 610 elements) are big enough to be split over the pool; at 1 and 3 they are not. */
static void mlp_steps_in(thread_mode mode, int64_t batch, tr_tensor **out) {
  run_env e;
  env_begin(&e, mode, 3);
  tr_module *m = tr_sequential_new(&e.ctx);
  assert_int_equal(tr_sequential_add(&e.ctx, m, tr_linear_new(&e.ctx, 300, 97, true)), NAS_OK);
  assert_int_equal(tr_sequential_add(&e.ctx, m, tr_activation_new(&e.ctx, TR_RELU)), NAS_OK);
  assert_int_equal(tr_sequential_add(&e.ctx, m, tr_linear_new(&e.ctx, 97, 130, true)), NAS_OK);
  assert_int_equal(tr_sequential_add(&e.ctx, m, tr_activation_new(&e.ctx, TR_RELU)), NAS_OK);
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(m, false, &ps, &e.ctx.err), NAS_OK);
  tr_optim_config sgd = {.kind = TR_SGD, .lr = 0.1, .momentum = 0.9};
  tr_optim *opt = tr_optim_new(&e.ctx, &sgd, ps.items, ps.n);
  tr_tensor *x = tr_rand(&e.ctx, TR_F32, 2, SHAPE(batch, 300), -1, 1);
  int32_t labels[127];
  for (int64_t r = 0; r < batch; r++) labels[r] = (int32_t)(r * 37 % 130);
  tr_set_requires_grad(x, true);
  for (int step = 0; step < 2; step++) {
    tr_optim_zero_grad(opt);
    tr_tensor *y = tr_module_forward(&e.ctx, m, x);
    tr_tensor *loss = y ? tr_cross_entropy(&e.ctx, y, labels) : NULL;
    assert_non_null(loss);
    assert_int_equal(tr_backward(&e.ctx, loss, NULL, false), NAS_OK);
    assert_int_equal(tr_optim_step(&e.ctx, opt), NAS_OK);
    tr_release(loss);
    tr_release(y);
  }
  out[0] = tr_retain(x->grad);
  out[1] = tr_retain(ps.items[2]->grad);
  out[2] = tr_retain(ps.items[3]->grad);
  out[3] = tr_detach(&e.ctx, ps.items[2]);
  tr_optim_free(opt);
  tr_release(x);
  tr_param_list_free(&ps);
  tr_module_free(m);
  env_end(&e);
}

static void split_mlp_steps_with_relu_match_one_thread(void **state) {
  (void)state;
  static const char *names[MLP_OUTPUTS] = {"dx", "dW2", "db2", "W2 after two steps"};
  static const int64_t batches[] = {1, 3, 127};
  for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
    tr_tensor *one[MLP_OUTPUTS] = {0};
    mlp_steps_in(ONE_THREAD, batches[b], one);
    for (thread_mode mode = OPENMP; mode <= POOL; mode++) {
      tr_tensor *split[MLP_OUTPUTS] = {0};
      mlp_steps_in(mode, batches[b], split);
      for (int i = 0; i < MLP_OUTPUTS; i++) {
        /* sums of at most 300 products of values below 1 in size; a ReLU mask may flip only
         * where a pre-activation rounds across 0, which these tolerances absorb */
        assert_close(split[i], one[i], NULL, 300 * 1e-6, names[i], mode);
        tr_release(split[i]);
      }
    }
    for (int i = 0; i < MLP_OUTPUTS; i++) tr_release(one[i]);
  }
}

static tr_module *mlp_new(tr_ctx *ctx, int64_t in, int64_t hidden) {
  tr_module *m = tr_sequential_new(ctx);
  assert_int_equal(tr_sequential_add(ctx, m, tr_linear_new(ctx, in, hidden, true)), NAS_OK);
  assert_int_equal(tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU)), NAS_OK);
  assert_int_equal(tr_sequential_add(ctx, m, tr_linear_new(ctx, hidden, 10, true)), NAS_OK);
  return m;
}

/* Batch 1 through a layer big enough to be split by rows: every output is computed the same
 * way on each thread, so the results are identical. Grad mode stays on so that the layers
 * run one by one (no-grad mode fuses the whole MLP: batch1_mlp_* below). */
static void split_matrix_vector_is_identical_to_one_thread(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_module *m = mlp_new(&ctx, 301, 1001);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(1, 301), -1, 1), *out[3];
  for (thread_mode mode = ONE_THREAD; mode <= POOL; mode++) {
    run_env e;
    env_begin(&e, mode, 3);
    assert_non_null(out[mode] = tr_module_forward(&e.ctx, m, x));
    env_end(&e);
  }
  for (thread_mode mode = OPENMP; mode <= POOL; mode++) {
    assert_close(out[mode], out[ONE_THREAD], NULL, 0.0, "batch-1 MLP", mode);
    tr_release(out[mode]);
  }
  tr_release(out[ONE_THREAD]);
  tr_release(x);
  tr_module_free(m);
}

/* ---------------------------------------------------------------- fused inference */

/* Linear + ReLU: the ReLU applied in place to the linear layer's output in no-grad mode, the
 * ReLU module after it with grad mode on: the same values, to the bit. */
static void fused_linear_relu_equals_the_modules(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 6);
  tr_module *m = mlp_new(&ctx, 37, 19);
  for (int64_t rows = 1; rows <= 3; rows += 2) {
    tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(rows, 37), -1, 1);
    tr_tensor *plain = tr_module_forward(&ctx, m, x);
    tr_set_grad_enabled(&ctx, false);
    tr_tensor *fused = tr_module_forward(&ctx, m, x);
    tr_set_grad_enabled(&ctx, true);
    assert_non_null(plain);
    assert_non_null(fused);
    assert_null(fused->grad_fn);
    assert_close(fused, plain, NULL, 0.0, "linear + ReLU", ONE_THREAD);
    tr_release(plain);
    tr_release(fused);
    tr_release(x);
  }
  tr_module_free(m);
}

/* A batch-1 MLP with odd widths, a layer without bias, one without ReLU in the middle and
 * none at the end: flatten, in -> hidden (ReLU) -> 131 (no bias, no ReLU) -> 65 (ReLU) -> 7
 * (no bias). */
static tr_module *odd_mlp_new(tr_ctx *ctx, int64_t in, int64_t hidden) {
  tr_module *m = tr_sequential_new(ctx);
  tr_module *parts[] = {tr_activation_new(ctx, TR_FLATTEN),
                        tr_linear_new(ctx, in, hidden, true),
                        tr_activation_new(ctx, TR_RELU),
                        tr_linear_new(ctx, hidden, 131, false),
                        tr_linear_new(ctx, 131, 65, true),
                        tr_activation_new(ctx, TR_RELU),
                        tr_linear_new(ctx, 65, 7, false)};
  for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
    assert_int_equal(tr_sequential_add(ctx, m, parts[i]), NAS_OK);
  return m;
}

/* The whole MLP in one pass at batch 1 (no-grad mode) against the modules one by one (grad
 * mode on): to the bit on one thread, for a small MLP and for one whose first layer is
 * large enough to split over threads. */
static void batch1_mlp_on_one_thread_equals_the_modules_to_the_bit(void **state) {
  (void)state;
  for (int64_t hidden = 23; hidden <= 257; hidden += 234) {
    run_env e;
    env_begin(&e, ONE_THREAD, 8);
    tr_module *m = odd_mlp_new(&e.ctx, 301, hidden);
    tr_tensor *x = tr_rand(&e.ctx, TR_F32, 3, SHAPE(1, 7, 43), -1, 1);
    tr_tensor *plain = tr_module_forward(&e.ctx, m, x);
    tr_set_grad_enabled(&e.ctx, false);
    tr_tensor *fused = tr_module_forward(&e.ctx, m, x);
    assert_non_null(plain);
    assert_non_null(fused);
    assert_null(fused->grad_fn);
    assert_int_equal(fused->ndim, 2);
    assert_int_equal(fused->shape[0], 1);
    assert_int_equal(fused->shape[1], 7);
    assert_close(fused, plain, NULL, 0.0, "batch-1 MLP", ONE_THREAD);
    tr_release(plain);
    tr_release(fused);
    tr_release(x);
    tr_module_free(m);
    env_end(&e);
  }
}

/* With two threads the first layer is split by rows (each output as on one thread) and the
 * second's sums are added in two halves, so the result is the modules' within float
 * rounding; and the same on every call. */
static void batch1_mlp_on_two_threads_equals_the_modules(void **state) {
  (void)state;
  for (thread_mode mode = OPENMP; mode <= POOL; mode++) {
    run_env e;
    env_begin(&e, mode, 9);
    tr_module *m = odd_mlp_new(&e.ctx, 301, 257);
    tr_tensor *x = tr_rand(&e.ctx, TR_F32, 2, SHAPE(1, 301), -1, 1);
    tr_tensor *plain = tr_module_forward(&e.ctx, m, x);
    tr_set_grad_enabled(&e.ctx, false);
    tr_tensor *fused = tr_module_forward(&e.ctx, m, x), *again = tr_module_forward(&e.ctx, m, x);
    assert_non_null(plain);
    assert_non_null(fused);
    assert_non_null(again);
    assert_close(fused, plain, NULL, 1e-5, "batch-1 MLP", mode);
    assert_close(again, fused, NULL, 0.0, "batch-1 MLP, second call", mode);
    tr_release(plain);
    tr_release(fused);
    tr_release(again);
    tr_release(x);
    tr_module_free(m);
    env_end(&e);
  }
}

/* The fused MLP takes only what it can run: one example, contiguous float32, widths that
 * chain, hidden widths it has room for. */
static void batch1_mlp_fits_only_what_it_can_run(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 10);
  tr_tensor *w1 = tr_rand(&ctx, TR_F32, 2, SHAPE(9, 6), -1, 1);
  tr_tensor *w2 = tr_rand(&ctx, TR_F32, 2, SHAPE(4, 9), -1, 1);
  tr_tensor *wide = tr_rand(&ctx, TR_F32, 2, SHAPE(TN_MLP_MAX_WIDTH + 1, 6), -1, 1);
  tr_tensor *w2_wide = tr_rand(&ctx, TR_F32, 2, SHAPE(4, TN_MLP_MAX_WIDTH + 1), -1, 1);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(1, 6), -1, 1);
  tr_tensor *x2 = tr_rand(&ctx, TR_F32, 2, SHAPE(2, 6), -1, 1);
  tr_tensor *x3d = tr_rand(&ctx, TR_F32, 3, SHAPE(1, 2, 3), -1, 1);
  tr_tensor *w1t_base = tr_rand(&ctx, TR_F32, 2, SHAPE(6, 9), -1, 1);
  tr_tensor *w1t = tr_transpose(&ctx, w1t_base, 0, 1); /* (9, 6), not contiguous */
  tn_mlp_layer two[2] = {{w1, NULL, true}, {w2, NULL, false}};
  assert_true(tn_mlp_fits(x, false, two, 2));
  assert_true(tn_mlp_fits(x3d, true, two, 2));
  assert_false(tn_mlp_fits(x3d, false, two, 2));
  assert_false(tn_mlp_fits(x2, false, two, 2));
  assert_false(tn_mlp_fits(x, false, two, 0));
  assert_false(tn_mlp_fits(x, false, (tn_mlp_layer[]){{w2, NULL, true}}, 1));
  assert_false(tn_mlp_fits(x, false, (tn_mlp_layer[]){{w1, w1, true}}, 1));
  assert_false(tn_mlp_fits(x, false, (tn_mlp_layer[]){{w1t, NULL, true}}, 1));
  assert_true(tn_mlp_fits(x, false, (tn_mlp_layer[]){{wide, NULL, true}}, 1));
  tn_mlp_layer too_wide[2] = {{wide, NULL, true}, {w2_wide, NULL, false}};
  assert_false(tn_mlp_fits(x, false, too_wide, 2));
  tr_release(w1t);
  tr_release(w1t_base);
  tr_release(x3d);
  tr_release(x2);
  tr_release(x);
  tr_release(w2_wide);
  tr_release(wide);
  tr_release(w2);
  tr_release(w1);
}

/* A linear layer without bias at batch 1 writes its output without reading it: a recycled
 * block full of NaNs under it changes nothing. */
static void batch1_linear_without_bias_ignores_what_its_buffer_held(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 11);
  ctx.alloc = tr_allocator_new((size_t)1 << 24);
  tr_tensor *w = tr_rand(&ctx, TR_F32, 2, SHAPE(13, 29), -1, 1);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(1, 29), -1, 1);
  tr_tensor *nans = tr_full(&ctx, TR_F32, 2, SHAPE(1, 13), NAN);
  tr_release(nans); /* its block goes back to the cache, NaNs and all */
  tr_tensor *y = tr_linear(&ctx, x, w, NULL);
  assert_non_null(y);
  for (int64_t i = 0; i < y->numel; i++) assert_true(isfinite(tr_get(y, i)));
  tr_release(y);
  tr_release(x);
  tr_release(w);
  tr_allocator_release(ctx.alloc);
}

typedef struct {
  int64_t n, c, h, w, o;
  int kernel, stride, padding;
  bool relu;
  int pool; /* 0: none */
} block_case;

static tr_module *block_new(tr_ctx *ctx, const block_case *bc) {
  tr_module *m = tr_sequential_new(ctx);
  assert_int_equal(tr_sequential_add(ctx, m, tr_conv2d_new(ctx, bc->c, bc->o, bc->kernel,
                                                           bc->stride, bc->padding, true)),
                   NAS_OK);
  if (bc->relu)
    assert_int_equal(tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU)), NAS_OK);
  if (bc->pool)
    assert_int_equal(tr_sequential_add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, bc->pool)), NAS_OK);
  return m;
}

/* The module forward with grad mode on (ops one by one, building a graph) and in no-grad
 * mode (the fused path where it fits) agree, with the engine's threads in `mode`. */
static void check_block(const block_case *bc, thread_mode mode) {
  run_env e;
  env_begin(&e, mode, 4);
  tr_module *m = block_new(&e.ctx, bc);
  tr_tensor *x = tr_rand(&e.ctx, TR_F32, 4, SHAPE(bc->n, bc->c, bc->h, bc->w), -1, 1);
  tr_tensor *plain = tr_module_forward(&e.ctx, m, x);
  tr_set_grad_enabled(&e.ctx, false);
  tr_tensor *fused = tr_module_forward(&e.ctx, m, x);
  assert_non_null(plain);
  assert_non_null(fused);
  assert_int_equal(fused->ndim, 4);
  for (int d = 0; d < 4; d++) assert_int_equal(fused->shape[d], plain->shape[d]);
  /* sums of C*K*K products of values in [-1, 1] (weights smaller), rounded differently */
  assert_close(fused, plain, NULL, 1e-6 * (double)(bc->c * bc->kernel * bc->kernel), "conv block",
               mode);
  tr_release(plain);
  tr_release(fused);
  tr_release(x);
  tr_module_free(m);
  env_end(&e);
}

static void fused_conv_block_equals_the_modules_one_by_one(void **state) {
  (void)state;
  static const block_case cases[] = {
      {1, 1, 28, 28, 16, 3, 1, 0, true, 2},  /* the benchmark CNN's first block */
      {1, 16, 13, 13, 32, 3, 1, 0, true, 2}, /* its second: 11x11 pooled to 5x5 */
      {3, 3, 7, 9, 5, 3, 1, 1, true, 3},     /* padding, a 3x3 pool, not square */
      {3, 2, 6, 5, 4, 2, 1, 0, true, 0},     /* conv + ReLU, no pool */
      {1, 2, 9, 8, 3, 3, 1, 2, false, 2},    /* pool of values that may be negative */
      {1, 4, 5, 6, 17, 1, 1, 0, false, 0},   /* conv alone, 1x1 kernel */
      {2, 3, 9, 9, 4, 3, 2, 1, true, 2},     /* stride 2: not fused, still the same */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_block(&cases[i], ONE_THREAD);
}

/* Images spread over threads, each with its own scratch; batch 127 and batch 3. */
static void fused_conv_block_on_two_threads_equals_the_modules(void **state) {
  (void)state;
  static const block_case cases[] = {{127, 1, 28, 28, 16, 3, 1, 0, true, 2},
                                     {3, 16, 13, 13, 32, 3, 1, 1, true, 2}};
  for (thread_mode mode = OPENMP; mode <= POOL; mode++)
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_block(&cases[i], mode);
}

/* The fused op itself, called directly, on the shapes tn_conv_block_fits accepts. */
static void conv_block_fits_only_what_it_can_run(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 4, SHAPE(1, 3, 8, 8), -1, 1);
  tr_tensor *w = tr_rand(&ctx, TR_F32, 4, SHAPE(4, 3, 3, 3), -1, 1);
  tr_tensor *b = tr_rand(&ctx, TR_F32, 1, SHAPE(4), -1, 1);
  tr_tensor *wrong = tr_rand(&ctx, TR_F32, 4, SHAPE(4, 2, 3, 3), -1, 1);
  tr_tensor *x64 = tr_rand(&ctx, TR_F64, 4, SHAPE(1, 3, 8, 8), -1, 1);
  assert_true(tn_conv_block_fits(x, w, b, 1, 0, 2));
  assert_true(tn_conv_block_fits(x, w, NULL, 1, 1, 0));
  assert_false(tn_conv_block_fits(x, w, b, 2, 0, 2));     /* stride */
  assert_false(tn_conv_block_fits(x, wrong, b, 1, 0, 2)); /* channels */
  assert_false(tn_conv_block_fits(x64, w, b, 1, 0, 2));   /* float64 */
  assert_false(tn_conv_block_fits(x, w, b, 1, 0, 7));     /* 6x6 output, pool 7 */
  tr_tensor *y = tn_conv_block_infer(&ctx, x, w, b, 0, true, 2);
  assert_non_null(y);
  assert_int_equal(y->shape[1], 4);
  assert_int_equal(y->shape[2], 3);
  assert_int_equal(y->shape[3], 3);
  for (int64_t i = 0; i < y->numel; i++) assert_true(tr_get(y, i) >= 0); /* ReLU */
  tr_release(y);
  tr_release(x64);
  tr_release(wrong);
  tr_release(b);
  tr_release(w);
  tr_release(x);
}

/* ---------------------------------------------------------------- the fused MLP in training */

/* An MLP for the fused training op: a 4-D input flattened or a 2-D one, then linear layers
 * of the given widths, each with or without bias and ReLU. */
typedef struct {
  int64_t batch, in_shape[3]; /* in_shape[1] 0: x is (batch, in_shape[0]) */
  int n;
  int64_t width[5]; /* width[0]: features in */
  bool bias[4], relu[4];
  bool x_grad;
} mlp_case;

static const mlp_case mlp_cases[] = {
    /* flattened 3x5x7 input, three layers (the benchmark's shape, smaller and ragged) */
    {67, {3, 5, 7}, 3, {105, 97, 61, 10}, {true, true, true}, {true, true, false}, true},
    /* two layers, the first without bias, a ReLU last */
    {50, {40}, 2, {40, 64, 33}, {false, true}, {true, true}, false},
    /* four layers, a hidden one without ReLU */
    {64, {40}, 4, {40, 48, 20, 30, 5}, {true, true, false, true}, {true, false, true, false},
     true},
};

enum { MLP_CASE_MAX_OUT = 10 }; /* output, dx, 4 weights and their biases at most */

/* One training step's forward and backward of case c on a context with a pool of `threads`
 * (1: none): out gets the output, dx (when c->x_grad) and every parameter's gradient, in
 * that order; *n_out their number. Whether the fused op ran is returned. */
static bool mlp_case_step(const mlp_case *c, int threads, tr_tensor **out, int *n_out) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 21);
  int blas = openblas_get_num_threads(), omp = omp_get_max_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  if (threads > 1) assert_non_null(ctx.threads = tr_threadpool_new(threads, &ctx.err));
  tr_module *m = tr_sequential_new(&ctx);
  if (c->in_shape[1])
    assert_int_equal(tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_FLATTEN)), NAS_OK);
  for (int k = 0; k < c->n; k++) {
    tr_module *lin = tr_linear_new(&ctx, c->width[k], c->width[k + 1], c->bias[k]);
    assert_int_equal(tr_sequential_add(&ctx, m, lin), NAS_OK);
    if (c->relu[k])
      assert_int_equal(tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_RELU)), NAS_OK);
  }
  tr_tensor *x = c->in_shape[1]
                     ? tr_rand(&ctx, TR_F32, 4,
                               SHAPE(c->batch, c->in_shape[0], c->in_shape[1], c->in_shape[2]),
                               -1, 1)
                     : tr_rand(&ctx, TR_F32, 2, SHAPE(c->batch, c->in_shape[0]), -1, 1);
  tr_set_requires_grad(x, c->x_grad);
  int32_t labels[128];
  for (int64_t r = 0; r < c->batch; r++) labels[r] = (int32_t)(r * 7 % c->width[c->n]);
  tr_tensor *y = tr_module_forward(&ctx, m, x);
  assert_non_null(y);
  bool fused = strcmp(tr_grad_fn_name(y), "MlpBackward") == 0;
  tr_tensor *loss = tr_cross_entropy(&ctx, y, labels);
  assert_non_null(loss);
  assert_int_equal(tr_backward(&ctx, loss, NULL, false), NAS_OK);
  *n_out = 0;
  out[(*n_out)++] = tr_detach(&ctx, y);
  if (c->x_grad) {
    assert_int_equal(x->grad->ndim, x->ndim);
    out[(*n_out)++] = tr_retain(x->grad);
  }
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(m, false, &ps, &ctx.err), NAS_OK);
  for (size_t i = 0; i < ps.n; i++) out[(*n_out)++] = tr_retain(ps.items[i]->grad);
  tr_param_list_free(&ps);
  tr_release(loss);
  tr_release(y);
  tr_release(x);
  tr_module_free(m);
  tr_threadpool_free(ctx.threads);
  openblas_set_num_threads(blas);
  omp_set_num_threads(omp);
  return fused;
}

/* In grad mode on a pool, a run of linear layers and ReLUs trains as one fused op (one
 * node, "MlpBackward") whose output, input gradient and parameter gradients are those of
 * the modules one by one: on 2 and 3 threads, with and without flatten, biases and ReLUs. */
static void fused_mlp_training_equals_the_modules(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof mlp_cases / sizeof *mlp_cases; i++) {
    tr_tensor *one[MLP_CASE_MAX_OUT], *split[MLP_CASE_MAX_OUT];
    int n_one, n_split;
    assert_false(mlp_case_step(&mlp_cases[i], 1, one, &n_one));
    for (int threads = 2; threads <= 3; threads++) {
      assert_true(mlp_case_step(&mlp_cases[i], threads, split, &n_split));
      assert_int_equal(n_split, n_one);
      for (int k = 0; k < n_one; k++) {
        char what[64];
        snprintf(what, sizeof what, "case %zu, %d threads, tensor %d", i, threads, k);
        assert_close(split[k], one[k], NULL, 1e-5, what, POOL);
        tr_release(split[k]);
      }
    }
    for (int k = 0; k < n_one; k++) tr_release(one[k]);
  }
}

/* The fused op saves the weights it multiplied by: one changed in place before backward
 * is the same clear error as on the modules' path, and no gradient is left half made. */
static void fused_mlp_reports_a_weight_changed_after_forward(void **state) {
  (void)state;
  run_env e;
  env_begin(&e, POOL, 22);
  tr_module *m = mlp_new(&e.ctx, 40, 64);
  tr_tensor *x = tr_rand(&e.ctx, TR_F32, 2, SHAPE(48, 40), -1, 1);
  tr_tensor *y = tr_module_forward(&e.ctx, m, x);
  assert_non_null(y);
  assert_string_equal(tr_grad_fn_name(y), "MlpBackward");
  tr_tensor *s = tr_sum(&e.ctx, y, 0, NULL, false);
  tr_param_list ps = {0};
  assert_int_equal(tr_module_parameters(m, false, &ps, &e.ctx.err), NAS_OK);
  tr_set_grad_enabled(&e.ctx, false); /* as an optimiser step would, between the two */
  assert_int_equal(tr_mul_scalar_(&e.ctx, ps.items[2], 0.5), NAS_OK);
  tr_set_grad_enabled(&e.ctx, true);
  assert_int_equal(tr_backward(&e.ctx, s, NULL, false), NAS_ERR);
  assert_non_null(strstr(e.ctx.err.msg, "MlpBackward"));
  assert_non_null(strstr(e.ctx.err.msg, "modified by an in-place operation"));
  for (size_t i = 0; i < ps.n; i++) assert_null(ps.items[i]->grad);
  tr_param_list_free(&ps);
  tr_release(s);
  tr_release(y);
  tr_release(x);
  tr_module_free(m);
  env_end(&e);
}

/* The fused op runs only where it can and pays: not without a pool, not for batches or
 * first layers of fewer than 16 rows per thread, not for a single layer; there the modules
 * run one by one. */
static void fused_mlp_training_fits_only_what_it_can_run(void **state) {
  (void)state;
  run_env e;
  env_begin(&e, POOL, 23);
  tr_module *m = mlp_new(&e.ctx, 40, 64), *narrow = mlp_new(&e.ctx, 40, 31);
  tr_module *single = tr_sequential_new(&e.ctx);
  assert_int_equal(tr_sequential_add(&e.ctx, single, tr_linear_new(&e.ctx, 40, 64, true)), NAS_OK);
  tr_tensor *x = tr_rand(&e.ctx, TR_F32, 2, SHAPE(32, 40), -1, 1);
  tr_tensor *small = tr_rand(&e.ctx, TR_F32, 2, SHAPE(31, 40), -1, 1);
  tr_tensor *y[5] = {tr_module_forward(&e.ctx, m, x), tr_module_forward(&e.ctx, m, small),
                     tr_module_forward(&e.ctx, narrow, x), tr_module_forward(&e.ctx, single, x)};
  tr_threadpool_free(e.ctx.threads);
  e.ctx.threads = NULL;
  y[4] = tr_module_forward(&e.ctx, m, x);
  for (int i = 0; i < 5; i++) {
    assert_non_null(y[i]);
    bool fused = strcmp(tr_grad_fn_name(y[i]), "MlpBackward") == 0;
    if (fused != (i == 0)) fail_msg("forward %d: fused %d", i, fused);
    tr_release(y[i]);
  }
  tr_release(small);
  tr_release(x);
  tr_module_free(single);
  tr_module_free(narrow);
  tr_module_free(m);
  env_end(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pool_runs_every_part_of_every_job_once),
      cmocka_unit_test(part_zero_runs_on_the_calling_thread),
      cmocka_unit_test(pool_job_inside_a_pool_job_runs_inline),
      cmocka_unit_test(threadpool_refuses_a_count_out_of_range),
      cmocka_unit_test(split_gemm_matches_one_call_in_every_layout),
      cmocka_unit_test(split_linear_steps_match_one_thread),
      cmocka_unit_test(split_mlp_steps_with_relu_match_one_thread),
      cmocka_unit_test(split_matrix_vector_is_identical_to_one_thread),
      cmocka_unit_test(fused_linear_relu_equals_the_modules),
      cmocka_unit_test(batch1_mlp_on_one_thread_equals_the_modules_to_the_bit),
      cmocka_unit_test(batch1_mlp_on_two_threads_equals_the_modules),
      cmocka_unit_test(batch1_mlp_fits_only_what_it_can_run),
      cmocka_unit_test(batch1_linear_without_bias_ignores_what_its_buffer_held),
      cmocka_unit_test(fused_conv_block_equals_the_modules_one_by_one),
      cmocka_unit_test(fused_conv_block_on_two_threads_equals_the_modules),
      cmocka_unit_test(conv_block_fits_only_what_it_can_run),
      cmocka_unit_test(fused_mlp_training_equals_the_modules),
      cmocka_unit_test(fused_mlp_reports_a_weight_changed_after_forward),
      cmocka_unit_test(fused_mlp_training_fits_only_what_it_can_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
