/* The engine's fast paths compute what the plain paths compute: GEMMs and matrix-vector
 * products split over threads against one call on one thread, and the fused inference of
 * conv2d + ReLU + max pool and of linear + ReLU against the modules run one by one. Sizes are odd on purpose
 * (not multiples of 16, batch 1, 3 and 127), so that ragged edges and parts of unequal
 * size are exercised. The thread settings are the process's; each test restores them. */
#include "tests/testutil.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "trainer/infer.h"
#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }

/* The engine's own threads in use (OpenBLAS on one thread), or one thread for everything. */
typedef struct {
  int blas, omp;
} thread_settings;

static thread_settings threads_set(int omp) {
  thread_settings old = {openblas_get_num_threads(), omp_get_max_threads()};
  openblas_set_num_threads(1);
  omp_set_num_threads(omp);
  return old;
}

static void threads_restore(thread_settings old) {
  openblas_set_num_threads(old.blas);
  omp_set_num_threads(old.omp);
}

/* |a - b| <= tol * scale[i] for every element (scale NULL: 1). */
static void assert_close(const tr_tensor *a, const tr_tensor *b, const tr_tensor *scale, double tol,
                         const char *what) {
  assert_int_equal(a->numel, b->numel);
  for (int64_t i = 0; i < a->numel; i++) {
    double d = fabs(tr_get(a, i) - tr_get(b, i)), s = scale ? tr_get(scale, i) : 1.0;
    if (!(d <= tol * s)) fail_msg("%s: element %lld: %g vs %g", what, (long long)i, tr_get(a, i), tr_get(b, i));
  }
}

static void assert_equal(const tr_tensor *a, const tr_tensor *b, const char *what) {
  assert_close(a, b, NULL, 0.0, what);
}

/* A (rows, cols) operand: contiguous, or a transposed view of a contiguous (cols, rows). */
static tr_tensor *operand(tr_ctx *ctx, int64_t rows, int64_t cols, bool transposed) {
  if (!transposed) return tr_rand(ctx, TR_F32, 2, SHAPE(rows, cols), -1, 1);
  tr_tensor *stored = tr_rand(ctx, TR_F32, 2, SHAPE(cols, rows), -1, 1);
  tr_tensor *view = tr_transpose(ctx, stored, 0, 1);
  tr_free(stored);
  return view;
}

/* |a| @ |b|: the scale of each element's rounding error. */
static tr_tensor *abs_product(tr_ctx *ctx, const tr_tensor *a, const tr_tensor *b) {
  tr_tensor *pa = tr_empty(ctx, TR_F32, 2, a->shape), *pb = tr_empty(ctx, TR_F32, 2, b->shape);
  for (int64_t i = 0; i < a->numel; i++) tr_f32(pa)[i] = (float)fabs(tr_get(a, i));
  for (int64_t i = 0; i < b->numel; i++) tr_f32(pb)[i] = (float)fabs(tr_get(b, i));
  tr_tensor *p = tr_matmul(ctx, pa, pb);
  tr_free(pa);
  tr_free(pb);
  return p;
}

static void split_gemm_matches_one_call_in_every_layout(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_set_grad_enabled(&ctx, false);
  /* m, n, k: split by columns (B the largest: the MLP's first layer; ragged), by rows (C the
   * largest), by columns and by rows where the other dimension is too short */
  static const int64_t sizes[][3] = {{128, 256, 784}, {127, 301, 129}, {300, 257, 40},
                                     {3, 1001, 700},  {1000, 17, 77}};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (int layout = 0; layout < 4; layout++) {
      int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
      tr_tensor *a = operand(&ctx, m, k, layout & 1), *b = operand(&ctx, k, n, layout & 2);
      thread_settings old = threads_set(1);
      tr_tensor *one = tr_matmul(&ctx, a, b);
      omp_set_num_threads(2);
      tr_tensor *split = tr_matmul(&ctx, a, b);
      threads_restore(old);
      tr_tensor *scale = abs_product(&ctx, a, b);
      assert_close(split, one, scale, 1e-5, "split GEMM");
      tr_free(scale);
      tr_free(split);
      tr_free(one);
      tr_free(a);
      tr_free(b);
    }
}

/* One training step of a linear layer (forward, then dx, dW, db) at batch 127 with the
 * GEMMs split over two threads and on one. */
static void split_linear_step_matches_one_thread(void **state) {
  (void)state;
  tr_tensor *out[2][4];
  for (int run = 0; run < 2; run++) {
    tr_ctx ctx;
    tr_ctx_init(&ctx, 2);
    thread_settings old = threads_set(run + 1);
    tr_module *lin = tr_linear_new(&ctx, 300, 257, true);
    tr_param_list ps = {0};
    assert_int_equal(tr_module_parameters(lin, false, &ps, &ctx.err), NAS_OK);
    tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(127, 300), -1, 1);
    tr_set_requires_grad(x, true);
    tr_tensor *y = tr_module_forward(&ctx, lin, x);
    assert_non_null(y);
    tr_tensor *g = tr_rand(&ctx, TR_F32, 2, SHAPE(127, 257), -1, 1);
    assert_int_equal(tr_backward(&ctx, y, g, false), NAS_OK);
    threads_restore(old);
    out[run][0] = y;
    out[run][1] = tr_retain(x->grad);
    out[run][2] = tr_retain(ps.items[0]->grad);
    out[run][3] = tr_retain(ps.items[1]->grad);
    tr_free(g);
    tr_free(x);
    tr_param_list_free(&ps);
    tr_module_free(lin);
  }
  static const char *names[4] = {"y", "dx", "dW", "db"};
  for (int i = 0; i < 4; i++) {
    /* entries are sums of at most 300 products of values in [-1, 1] */
    assert_close(out[1][i], out[0][i], NULL, 300 * 1e-6, names[i]);
    tr_free(out[0][i]);
    tr_free(out[1][i]);
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
 * way on each thread, so the results are identical. */
static void split_matrix_vector_is_identical_to_one_thread(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_set_grad_enabled(&ctx, false);
  tr_module *m = mlp_new(&ctx, 301, 1001);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(1, 301), -1, 1);
  thread_settings old = threads_set(1);
  tr_tensor *one = tr_module_forward(&ctx, m, x);
  omp_set_num_threads(2);
  tr_tensor *split = tr_module_forward(&ctx, m, x);
  threads_restore(old);
  assert_non_null(one);
  assert_non_null(split);
  assert_equal(split, one, "batch-1 MLP");
  tr_free(one);
  tr_free(split);
  tr_free(x);
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
    assert_equal(fused, plain, "linear + ReLU");
    tr_free(plain);
    tr_free(fused);
    tr_free(x);
  }
  tr_module_free(m);
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
  if (bc->relu) assert_int_equal(tr_sequential_add(ctx, m, tr_activation_new(ctx, TR_RELU)), NAS_OK);
  if (bc->pool)
    assert_int_equal(tr_sequential_add(ctx, m, tr_pool_new(ctx, TR_MAXPOOL2D, bc->pool)), NAS_OK);
  return m;
}

/* The module forward with grad mode on (ops one by one, building a graph) and in no-grad
 * mode (the fused path where it fits) agree; with `threads` engine threads. */
static void check_block(const block_case *bc, int threads) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  tr_module *m = block_new(&ctx, bc);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 4, SHAPE(bc->n, bc->c, bc->h, bc->w), -1, 1);
  thread_settings old = threads_set(threads);
  tr_tensor *plain = tr_module_forward(&ctx, m, x);
  tr_set_grad_enabled(&ctx, false);
  tr_tensor *fused = tr_module_forward(&ctx, m, x);
  threads_restore(old);
  assert_non_null(plain);
  assert_non_null(fused);
  assert_int_equal(fused->ndim, 4);
  for (int d = 0; d < 4; d++) assert_int_equal(fused->shape[d], plain->shape[d]);
  /* sums of C*K*K products of values in [-1, 1] (weights smaller), rounded differently */
  assert_close(fused, plain, NULL, 1e-6 * (double)(bc->c * bc->kernel * bc->kernel), "conv block");
  tr_free(plain);
  tr_free(fused);
  tr_free(x);
  tr_module_free(m);
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
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_block(&cases[i], 1);
}

/* Images spread over threads, each with its own scratch; batch 127 and batch 3. */
static void fused_conv_block_on_two_threads_equals_the_modules(void **state) {
  (void)state;
  static const block_case cases[] = {{127, 1, 28, 28, 16, 3, 1, 0, true, 2},
                                     {3, 16, 13, 13, 32, 3, 1, 1, true, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_block(&cases[i], 2);
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
  tr_free(y);
  tr_free(x64);
  tr_free(wrong);
  tr_free(b);
  tr_free(w);
  tr_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(split_gemm_matches_one_call_in_every_layout),
      cmocka_unit_test(split_linear_step_matches_one_thread),
      cmocka_unit_test(split_matrix_vector_is_identical_to_one_thread),
      cmocka_unit_test(fused_linear_relu_equals_the_modules),
      cmocka_unit_test(fused_conv_block_equals_the_modules_one_by_one),
      cmocka_unit_test(fused_conv_block_on_two_threads_equals_the_modules),
      cmocka_unit_test(conv_block_fits_only_what_it_can_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
