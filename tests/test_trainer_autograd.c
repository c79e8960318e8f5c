/* The tensor and autograd engine's contracts: views share storage and version, in-place
 * writes after a save are caught, no-grad mode builds nothing, gradients accumulate, graphs
 * are freed (ASan checks the leaks), a linear layer adds its weight gradient straight into
 * an existing one or queues it for later (the same bits), and float32 agrees with float64. */
#include "tests/testutil.h"

#include <math.h>

#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }

static tr_tensor *leaf(tr_ctx *ctx, int ndim, const int64_t *shape) {
  tr_tensor *t = tr_rand(ctx, TR_F64, ndim, shape, -1, 1);
  assert_non_null(t);
  tr_set_requires_grad(t, true);
  return t;
}

static void views_share_storage_and_version(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *a = tr_rand(&ctx, TR_F32, 2, SHAPE(3, 4), 0, 1);
  tr_tensor *t = tr_transpose(&ctx, a, 0, 1);
  assert_false(tr_is_contiguous(t));
  assert_ptr_equal(t->storage, a->storage);
  assert_true(tr_get(t, 1) == tr_get(a, 4)); /* t[0][1] is a[1][0] */
  uint64_t v0 = a->storage->version;
  tr_tensor *row = tr_narrow(&ctx, a, 0, 1, 1);
  assert_int_equal(tr_fill_(&ctx, row, 7.0), NAS_OK);
  assert_true(a->storage->version == v0 + 1);
  assert_true(tr_get(a, 4) == 7.0 && tr_get(a, 0) != 7.0);
  tr_tensor *r = tr_reshape(&ctx, a, 1, SHAPE(12));
  assert_ptr_equal(r->storage, a->storage); /* contiguous: a view, not a copy */
  tr_tensor *rt = tr_reshape(&ctx, t, 1, SHAPE(12));
  assert_ptr_not_equal(rt->storage, a->storage); /* transposed: must copy */
  assert_true(tr_get(rt, 1) == tr_get(a, 4));
  tr_release(rt);
  tr_release(r);
  tr_release(row);
  tr_release(t);
  tr_release(a);
}

static void in_place_write_after_save_fails_backward_with_a_clear_error(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  tr_tensor *a = leaf(&ctx, 1, SHAPE(5));
  tr_tensor *e = tr_exp(&ctx, a); /* saves its output */
  tr_tensor *s = tr_sum(&ctx, e, 0, NULL, false);
  assert_int_equal(tr_mul_scalar_(&ctx, e, 2.0), NAS_OK);
  assert_int_equal(tr_backward(&ctx, s, NULL, false), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "ExpBackward"));
  assert_non_null(strstr(ctx.err.msg, "modified by an in-place operation"));
  assert_null(a->grad);
  tr_release(s);
  tr_release(e);
  tr_release(a);
}

static void leaf_that_requires_grad_cannot_be_written_with_grad_mode_on(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_tensor *a = leaf(&ctx, 1, SHAPE(3));
  assert_int_equal(tr_fill_(&ctx, a, 1.0), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "leaf"));
  tr_set_grad_enabled(&ctx, false);
  assert_int_equal(tr_fill_(&ctx, a, 1.0), NAS_OK);
  tr_release(a);
}

static void no_grad_mode_builds_no_graph(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  tr_tensor *a = leaf(&ctx, 2, SHAPE(2, 3));
  bool prev = tr_set_grad_enabled(&ctx, false);
  assert_true(prev);
  tr_tensor *b = tr_tanh(&ctx, a);
  assert_null(b->grad_fn);
  assert_false(b->requires_grad);
  tr_set_grad_enabled(&ctx, true);
  tr_tensor *c = tr_tanh(&ctx, a);
  assert_string_equal(tr_grad_fn_name(c), "TanhBackward");
  assert_int_equal(tr_backward(&ctx, b, NULL, false), NAS_ERR); /* nothing to run */
  tr_release(c);
  tr_release(b);
  tr_release(a);
}

static void gradients_of_a_reused_tensor_add_up(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  tr_tensor *x = leaf(&ctx, 1, SHAPE(4));
  /* y = sum(x * x + x): dy/dx = 2x + 1 */
  tr_tensor *sq = tr_mul(&ctx, x, x);
  tr_tensor *p = tr_add(&ctx, sq, x);
  tr_tensor *y = tr_sum(&ctx, p, 0, NULL, false);
  assert_int_equal(tr_backward(&ctx, y, NULL, true), NAS_OK);
  for (int i = 0; i < 4; i++)
    assert_true(fabs(tr_get(x->grad, i) - (2 * tr_get(x, i) + 1)) < 1e-12);
  /* retained graph: a second backward adds the same again */
  assert_int_equal(tr_backward(&ctx, y, NULL, false), NAS_OK);
  for (int i = 0; i < 4; i++)
    assert_true(fabs(tr_get(x->grad, i) - 2 * (2 * tr_get(x, i) + 1)) < 1e-12);
  /* not retained the second time: a third is an error, not a wrong gradient */
  assert_int_equal(tr_backward(&ctx, y, NULL, false), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "second time"));
  tr_zero_grad(x);
  assert_true(tr_get(x->grad, 0) == 0.0);
  tr_release(y);
  tr_release(p);
  tr_release(sq);
  tr_release(x);
}

static void deep_graph_is_run_and_freed_without_recursion(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 6);
  tr_tensor *x = leaf(&ctx, 1, SHAPE(8));
  tr_tensor *cur = tr_retain(x);
  for (int i = 0; i < 20000; i++) {
    tr_tensor *next = tr_scale(&ctx, cur, 1.0);
    tr_release(cur);
    cur = next;
  }
  tr_tensor *s = tr_sum(&ctx, cur, 0, NULL, false);
  tr_release(cur);
  assert_int_equal(tr_backward(&ctx, s, NULL, false), NAS_OK);
  assert_true(tr_get(x->grad, 3) == 1.0);
  tr_release(s); /* frees 20000 nodes; ASan reports any leak */
  tr_release(x);
}

static void float32_ops_agree_with_float64(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 7);
  tr_tensor *x64 = tr_rand(&ctx, TR_F64, 2, SHAPE(16, 32), -1, 1);
  tr_tensor *w64 = leaf(&ctx, 2, SHAPE(10, 32));
  tr_tensor *x32 = tr_to_dtype(&ctx, x64, TR_F32), *w32 = tr_to_dtype(&ctx, w64, TR_F32);
  tr_set_requires_grad(w32, true);
  int32_t labels[16];
  for (int i = 0; i < 16; i++) labels[i] = i % 10;
  tr_tensor *w[2] = {w64, w32}, *x[2] = {x64, x32}, *loss[2];
  for (int k = 0; k < 2; k++) {
    tr_tensor *h = tr_linear(&ctx, x[k], w[k], NULL);
    tr_tensor *g = tr_gelu(&ctx, h);
    loss[k] = tr_cross_entropy(&ctx, g, labels);
    assert_int_equal(tr_backward(&ctx, loss[k], NULL, false), NAS_OK);
    tr_release(g);
    tr_release(h);
  }
  assert_true(fabs(tr_item(loss[0]) - tr_item(loss[1])) < 1e-5);
  for (int64_t i = 0; i < w64->numel; i++)
    assert_true(fabs(tr_get(w64->grad, i) - tr_get(w32->grad, i)) < 1e-5);
  for (int k = 0; k < 2; k++) {
    tr_release(loss[k]);
    tr_release(w[k]);
    tr_release(x[k]);
  }
}

static void mismatched_shapes_are_reported(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 8);
  tr_tensor *a = tr_zeros(&ctx, TR_F32, 2, SHAPE(2, 3)),
            *b = tr_zeros(&ctx, TR_F32, 2, SHAPE(2, 4));
  assert_null(tr_add(&ctx, a, b));
  assert_non_null(strstr(ctx.err.msg, "broadcast"));
  assert_null(tr_matmul(&ctx, a, b));
  assert_non_null(strstr(ctx.err.msg, "matmul"));
  assert_null(tr_cross_entropy(&ctx, a, (int32_t[]){0, 3}));
  assert_non_null(strstr(ctx.err.msg, "label 3"));
  tr_release(a);
  tr_release(b);
}

static void allocator_reuses_freed_blocks_and_outlives_its_creator(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 9);
  ctx.alloc = tr_allocator_new(1 << 20);
  tr_tensor *a = tr_zeros(&ctx, TR_F32, 2, SHAPE(100, 100)); /* 40 000 bytes: 10 pages */
  void *block = a->storage->data;
  tr_alloc_stats st;
  tr_allocator_stats(ctx.alloc, &st);
  assert_int_equal(st.in_use, 40960);
  tr_release(a);
  tr_allocator_stats(ctx.alloc, &st);
  assert_true(st.in_use == 0 && st.cached == 40960 && st.peak == 40960);
  tr_tensor *b = tr_empty(&ctx, TR_F32, 1, SHAPE(10000)); /* same block size: reused */
  assert_ptr_equal(b->storage->data, block);
  tr_tensor *c = tr_empty(&ctx, TR_F32, 1, SHAPE(3));
  tr_allocator_release(ctx.alloc); /* the tensors still hold it */
  ctx.alloc = NULL;
  tr_f32(b)[9999] = 1.0f;
  tr_release(b);
  tr_release(c); /* the last one frees the allocator (ASan checks) */
}

/* y = sum(x W^T) over an (8, 128) x that needs no gradient: the backward's only product is
 * dW; the allocator's peak says whether it needed a buffer besides W's gradient. */
static size_t linear_backward_extra_bytes(tr_ctx *ctx, tr_tensor *x, tr_tensor *w) {
  tr_alloc_stats before, after;
  tr_allocator_stats(ctx->alloc, &before);
  tr_tensor *y = tr_linear(ctx, x, w, NULL);
  tr_tensor *s = y ? tr_sum(ctx, y, 0, NULL, false) : NULL;
  assert_non_null(s);
  assert_int_equal(tr_backward(ctx, s, NULL, false), NAS_OK);
  tr_release(s);
  tr_release(y);
  tr_allocator_stats(ctx->alloc, &after);
  return after.peak > before.in_use ? after.peak - before.in_use : 0;
}

static void linear_adds_the_weight_gradient_into_an_existing_one_without_a_buffer(
    void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 11);
  ctx.alloc = tr_allocator_new(1 << 20);
  tr_tensor *x = tr_rand(&ctx, TR_F32, 2, SHAPE(8, 128), -1, 1);
  tr_tensor *w = tr_rand(&ctx, TR_F32, 2, SHAPE(128, 128), -1, 1);
  tr_set_requires_grad(w, true);
  size_t w_bytes = 128 * 128 * sizeof(float);
  /* first backward: dW is computed and becomes W's gradient */
  assert_true(linear_backward_extra_bytes(&ctx, x, w) >= w_bytes);
  tr_tensor *grad = w->grad;
  float first[128 * 128];
  memcpy(first, tr_f32(grad), sizeof first);
  uint64_t version = grad->storage->version;
  /* second: added straight into that gradient, so the peak is y and dy (4 KiB each) */
  assert_true(linear_backward_extra_bytes(&ctx, x, w) < w_bytes);
  assert_ptr_equal(w->grad, grad);
  assert_true(grad->storage->version > version);
  for (int i = 0; i < 128 * 128; i++)
    assert_true(fabsf(tr_f32(grad)[i] - 2 * first[i]) <= 1e-5f * fabsf(first[i]) + 1e-6f);
  tr_release(w);
  tr_release(x);
  tr_allocator_release(ctx.alloc);
}

/* One backward of sum(linear(x, w, b)) into the leaves' gradients. */
static void linear_sum_backward(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b) {
  tr_tensor *y = tr_linear(ctx, x, w, b);
  tr_tensor *s = tr_sum(ctx, y, 0, NULL, false);
  assert_int_equal(tr_backward(ctx, s, NULL, false), NAS_OK);
  tr_release(s);
  tr_release(y);
}

/* Two ctxs on the same seed: a and b make the same leaves. */
typedef struct {
  tr_ctx ctx;
  tr_tensor *x, *w, *b;
} linear_leaves;

static void linear_leaves_new(linear_leaves *l) {
  tr_ctx_init(&l->ctx, 21);
  l->x = leaf(&l->ctx, 2, SHAPE(6, 5));
  l->w = leaf(&l->ctx, 2, SHAPE(4, 5));
  l->b = leaf(&l->ctx, 1, SHAPE(4));
}

static void linear_leaves_free(linear_leaves *l) {
  tr_release(l->x);
  tr_release(l->w);
  tr_release(l->b);
}

static void assert_same_bits(const tr_tensor *a, const tr_tensor *b) {
  assert_int_equal(a->numel, b->numel);
  assert_memory_equal(tr_f64(a), tr_f64(b), (size_t)a->numel * sizeof(double));
}

/* A pipeline stage sends its input's gradient before it adds its weights' (zero-bubble
 * schedules): with a queue set, the backward leaves the weight's gradient for later and
 * makes the others; added later, in order, the products give the bits of the backwards
 * that add them at once. */
static void put_off_weight_gradients_add_the_same_bits_once_run(void **state) {
  (void)state;
  linear_leaves now, later;
  linear_leaves_new(&now);
  linear_leaves_new(&later);
  for (int i = 0; i < 3; i++) linear_sum_backward(&now.ctx, now.x, now.w, now.b);
  /* the first backward makes the weight's gradient, which the later ones are queued for */
  linear_sum_backward(&later.ctx, later.x, later.w, later.b);
  tr_tensor *first = tr_from_data(&later.ctx, TR_F64, 2, later.w->shape, tr_data(later.w->grad));
  tr_wgrad_queue *q = tr_wgrads_new();
  assert_non_null(q);
  later.ctx.wgrads = q;
  for (int i = 0; i < 2; i++) linear_sum_backward(&later.ctx, later.x, later.w, later.b);
  later.ctx.wgrads = NULL;
  assert_true(tr_wgrads_queued(q) == 2);
  assert_same_bits(later.w->grad, first); /* not added yet */
  assert_same_bits(later.x->grad, now.x->grad);
  assert_same_bits(later.b->grad, now.b->grad);
  assert_int_equal(tr_wgrads_run(&later.ctx, q, 1), NAS_OK); /* the first queued only */
  assert_int_equal(tr_wgrads_run(&later.ctx, q, tr_wgrads_queued(q)), NAS_OK);
  assert_same_bits(later.w->grad, now.w->grad);
  assert_true(tr_wgrads_queued(q) == 2); /* marks go on counting */
  tr_wgrads_free(q);
  tr_release(first);
  linear_leaves_free(&now);
  linear_leaves_free(&later);
}

/* The queued product reads the layer's input later: written in place meanwhile, the
 * product fails as a backward through a modified saved tensor does. */
static void a_put_off_weight_gradient_refuses_an_input_written_since(void **state) {
  (void)state;
  linear_leaves l;
  linear_leaves_new(&l);
  linear_sum_backward(&l.ctx, l.x, l.w, l.b);
  tr_wgrad_queue *q = tr_wgrads_new();
  l.ctx.wgrads = q;
  linear_sum_backward(&l.ctx, l.x, l.w, l.b);
  l.ctx.wgrads = NULL;
  bool prev = tr_set_grad_enabled(&l.ctx, false);
  assert_int_equal(tr_fill_(&l.ctx, l.x, 0.5), NAS_OK);
  tr_set_grad_enabled(&l.ctx, prev);
  assert_int_equal(tr_wgrads_run(&l.ctx, q, tr_wgrads_queued(q)), NAS_ERR);
  assert_non_null(strstr(l.ctx.err.msg, "modified in place"));
  tr_wgrads_free(q);
  linear_leaves_free(&l);
}

/* Large enough that BLAS takes the product's inner dimension in more than one block, so a
 * gradient written while the product still reads it would show. */
#define ALIASED 600

static void linear_reading_its_weights_gradient_does_not_write_it_while_reading(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 12);
  tr_tensor *w = tr_rand(&ctx, TR_F64, 2, SHAPE(ALIASED, ALIASED), -1, 1);
  tr_set_requires_grad(w, true);
  w->grad = tr_rand(&ctx, TR_F64, 2, SHAPE(ALIASED, ALIASED), -1, 1);
  tr_tensor *before = tr_from_data(&ctx, TR_F64, 2, w->grad->shape, tr_data(w->grad));
  /* y = sum(G W^T) with G = W's gradient as the input: dW = ones^T G, so W's gradient
   * becomes G[i][j] + the sum of column j of G, computed from G as it was */
  tr_tensor *y = tr_linear(&ctx, w->grad, w, NULL);
  tr_tensor *s = tr_sum(&ctx, y, 0, NULL, false);
  assert_int_equal(tr_backward(&ctx, s, NULL, false), NAS_OK);
  const double *g0 = tr_f64(before), *g = tr_f64(w->grad);
  for (int j = 0; j < ALIASED; j++) {
    double col = 0;
    for (int r = 0; r < ALIASED; r++) col += g0[r * ALIASED + j];
    for (int i = 0; i < ALIASED; i++)
      assert_true(fabs(g[i * ALIASED + j] - (g0[i * ALIASED + j] + col)) < 1e-9);
  }
  tr_release(before);
  tr_release(s);
  tr_release(y);
  tr_release(w);
}

static void dropout_zeroes_about_p_and_scales_the_rest(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 10);
  tr_tensor *x = tr_full(&ctx, TR_F32, 1, SHAPE(100000), 1.0);
  tr_tensor *y = tr_dropout(&ctx, x, 0.25, true);
  int64_t zeros = 0;
  for (int64_t i = 0; i < y->numel; i++) {
    double v = tr_get(y, i);
    if (v == 0.0) zeros++;
    else assert_true(fabs(v - 1.0 / 0.75) < 1e-6);
  }
  assert_true(zeros > 24000 && zeros < 26000); /* 25 000 expected, sd ~137 */
  tr_tensor *z = tr_dropout(&ctx, x, 0.25, false); /* evaluation: the identity */
  for (int64_t i = 0; i < z->numel; i += 997) assert_true(tr_get(z, i) == 1.0);
  tr_release(z);
  tr_release(y);
  tr_release(x);
}

static void concat_and_embedding_put_values_in_place(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 11);
  tr_tensor *a = tr_from_data(&ctx, TR_F32, 2, SHAPE(2, 2), (float[]){1, 2, 3, 4});
  tr_tensor *b = tr_from_data(&ctx, TR_F32, 2, SHAPE(2, 1), (float[]){5, 6});
  tr_tensor *c = tr_concat(&ctx, 2, (tr_tensor *[]){a, b}, 1);
  const float want[] = {1, 2, 5, 3, 4, 6};
  for (int i = 0; i < 6; i++) assert_true(tr_get(c, i) == want[i]);
  tr_tensor *e = tr_embedding(&ctx, a, 3, (int32_t[]){1, 0, 1});
  const float rows[] = {3, 4, 1, 2, 3, 4};
  for (int i = 0; i < 6; i++) assert_true(tr_get(e, i) == rows[i]);
  assert_null(tr_embedding(&ctx, a, 1, (int32_t[]){2}));
  assert_non_null(strstr(ctx.err.msg, "outside"));
  tr_release(e);
  tr_release(c);
  tr_release(b);
  tr_release(a);
}

static void shapes_whose_element_or_byte_count_overflows_are_refused(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 20);
  /* 2^32 x 2^32 elements wrap int64 to 0; 2^62 float32s wrap the byte count to 0 */
  assert_null(tr_empty(&ctx, TR_F32, 2, SHAPE(1LL << 32, 1LL << 32)));
  assert_non_null(strstr(ctx.err.msg, "too many elements"));
  assert_null(tr_zeros(&ctx, TR_F32, 1, SHAPE(1LL << 62)));
  assert_non_null(strstr(ctx.err.msg, "too many elements"));
  tr_tensor *none = tr_empty(&ctx, TR_F32, 3, SHAPE(1LL << 40, 1LL << 40, 0)); /* 0 elements */
  assert_non_null(none);
  assert_int_equal(none->numel, 0);
  tr_release(none);
}

static void reshape_refuses_negative_sizes_and_a_second_inferred_dim(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 21);
  tr_tensor *a = tr_zeros(&ctx, TR_F32, 2, SHAPE(2, 3));
  assert_null(tr_reshape(&ctx, a, 2, SHAPE(-2, -3))); /* the product is 6 all the same */
  assert_non_null(strstr(ctx.err.msg, "reshape"));
  assert_null(tr_reshape(&ctx, a, 2, SHAPE(-1, -1)));
  assert_non_null(strstr(ctx.err.msg, "reshape"));
  tr_tensor *none = tr_zeros(&ctx, TR_F32, 1, SHAPE(0));
  assert_null(tr_reshape(&ctx, none, 3, SHAPE(1LL << 33, 1LL << 33, 4))); /* wraps to 0 */
  assert_non_null(strstr(ctx.err.msg, "reshape"));
  tr_tensor *r = tr_reshape(&ctx, a, 2, SHAPE(3, -1));
  assert_non_null(r);
  assert_true(r->shape[0] == 3 && r->shape[1] == 2);
  tr_release(r);
  tr_release(none);
  tr_release(a);
}

static void narrow_past_the_end_is_refused_even_when_start_plus_length_overflows(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 22);
  tr_tensor *a = tr_zeros(&ctx, TR_F32, 2, SHAPE(2, 3));
  assert_null(tr_narrow(&ctx, a, 0, INT64_MAX, 2)); /* start + length wraps negative */
  assert_non_null(strstr(ctx.err.msg, "outside the tensor"));
  assert_null(tr_narrow(&ctx, a, 1, 2, INT64_MAX));
  assert_non_null(strstr(ctx.err.msg, "outside the tensor"));
  tr_release(a);
}

static void softmax_over_an_empty_dim_is_refused(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 23);
  /* its kernel read the dim's first element at each of 100 inner offsets of an empty tensor */
  tr_tensor *a = tr_zeros(&ctx, TR_F32, 3, SHAPE(1, 0, 100));
  assert_null(tr_softmax(&ctx, a, 1));
  assert_non_null(strstr(ctx.err.msg, "empty"));
  assert_null(tr_log_softmax(&ctx, a, 1));
  tr_tensor *other = tr_softmax(&ctx, a, 2); /* a non-empty dim of an empty tensor: empty */
  assert_non_null(other);
  assert_int_equal(other->numel, 0);
  tr_release(other);
  tr_release(a);
}

static void reductions_refuse_a_repeated_axis_and_a_negative_axis_count(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 24);
  tr_tensor *a = tr_zeros(&ctx, TR_F32, 2, SHAPE(2, 3));
  assert_null(tr_sum(&ctx, a, 2, (int[]){0, 0}, false));
  assert_non_null(strstr(ctx.err.msg, "twice"));
  assert_null(tr_mean(&ctx, a, 2, (int[]){1, -1}, false)); /* -1 is 1 */
  assert_non_null(strstr(ctx.err.msg, "twice"));
  assert_null(tr_sum(&ctx, a, -1, (int[]){0}, false));
  assert_non_null(strstr(ctx.err.msg, "axes"));
  tr_release(a);
}

static void convolutions_and_their_modules_refuse_an_empty_kernel(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 26);
  tr_tensor *x = tr_zeros(&ctx, TR_F32, 4, SHAPE(1, 2, 3, 3));
  tr_tensor *w = tr_zeros(&ctx, TR_F32, 4, SHAPE(4, 2, 0, 0));
  assert_null(tr_conv2d(&ctx, x, w, NULL, 1, 0)); /* was a 4x4 map of zeros from a 3x3 input */
  assert_non_null(strstr(ctx.err.msg, "kernel 0x0"));
  ctx.err.msg[0] = 0;
  assert_null(tr_conv2d_new(&ctx, 2, 4, 0, 1, 0, true));
  assert_non_null(strstr(ctx.err.msg, "kernel 0"));
  tr_release(w);
  tr_release(x);
}

static void backward_refuses_a_gradient_of_another_shape(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 28);
  tr_tensor *x = leaf(&ctx, 2, SHAPE(2, 3));
  tr_tensor *y = tr_relu(&ctx, x);
  tr_tensor *g = tr_full(&ctx, TR_F64, 2, SHAPE(3, 2), 1.0); /* as many elements */
  assert_int_equal(tr_backward(&ctx, y, g, false), NAS_ERR); /* x got a (3, 2) gradient */
  assert_non_null(strstr(ctx.err.msg, "shape"));
  assert_null(x->grad);
  tr_release(g);
  tr_release(y);
  tr_release(x);
}

static void norms_refuse_a_negative_or_nan_eps_and_momentum_outside_0_1(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 29);
  tr_tensor *x = tr_randn(&ctx, TR_F32, 2, SHAPE(4, 3), 1.0);
  assert_null(tr_layer_norm(&ctx, x, NULL, NULL, -1.0)); /* was a NaN output */
  assert_non_null(strstr(ctx.err.msg, "eps"));
  assert_null(tr_layer_norm(&ctx, x, NULL, NULL, NAN));
  assert_null(tr_batch_norm(&ctx, x, NULL, NULL, NULL, NULL, true, 0.1, -1.0));
  assert_non_null(strstr(ctx.err.msg, "eps"));
  assert_null(tr_batch_norm(&ctx, x, NULL, NULL, NULL, NULL, true, NAN, 1e-5));
  assert_non_null(strstr(ctx.err.msg, "momentum"));
  tr_release(x);
}

static void global_average_pooling_refuses_an_empty_map(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 30);
  tr_tensor *x = tr_zeros(&ctx, TR_F32, 4, SHAPE(1, 2, 0, 0));
  assert_null(tr_global_avg_pool2d(&ctx, x)); /* was 0 / 0: NaN per channel */
  assert_non_null(strstr(ctx.err.msg, "empty"));
  tr_release(x);
}

static void host_tensors_refuse_bfloat16_and_unknown_dtypes(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 32);
  /* 2-byte elements filled as 8-byte doubles: writes past the block */
  assert_null(tr_full(&ctx, TR_BF16, 1, SHAPE(100), 1.0));
  assert_non_null(strstr(ctx.err.msg, "bfloat16"));
  assert_null(tr_zeros(&ctx, (tr_dtype)7, 1, SHAPE(4)));
  assert_non_null(strstr(ctx.err.msg, "dtype 7"));
}

static void a_second_backward_without_retain_graph_fails_before_touching_a_gradient(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 33);
  tr_tensor *x = leaf(&ctx, 1, SHAPE(3)), *y = leaf(&ctx, 1, SHAPE(3));
  tr_tensor *sum = tr_add(&ctx, x, y);
  tr_tensor *s = tr_sum(&ctx, sum, 0, NULL, false); /* neither node saves a tensor */
  assert_int_equal(tr_backward(&ctx, s, NULL, false), NAS_OK);
  assert_int_equal(tr_backward(&ctx, s, NULL, false), NAS_ERR); /* added into y->grad again */
  assert_non_null(strstr(ctx.err.msg, "second time"));
  assert_true(tr_get(y->grad, 0) == 1.0 && tr_get(x->grad, 2) == 1.0);
  tr_tensor *e = tr_exp(&ctx, x);
  tr_tensor *both = tr_add(&ctx, e, y);
  tr_tensor *s2 = tr_sum(&ctx, both, 0, NULL, false);
  assert_int_equal(tr_backward(&ctx, s2, NULL, false), NAS_OK);
  assert_int_equal(tr_backward(&ctx, s2, NULL, false), NAS_ERR); /* stops at the root */
  assert_true(tr_get(y->grad, 0) == 2.0);
  tr_release(s2);
  tr_release(both);
  tr_release(e);
  tr_release(s);
  tr_release(sum);
  tr_release(y);
  tr_release(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(views_share_storage_and_version),
      cmocka_unit_test(in_place_write_after_save_fails_backward_with_a_clear_error),
      cmocka_unit_test(leaf_that_requires_grad_cannot_be_written_with_grad_mode_on),
      cmocka_unit_test(no_grad_mode_builds_no_graph),
      cmocka_unit_test(gradients_of_a_reused_tensor_add_up),
      cmocka_unit_test(deep_graph_is_run_and_freed_without_recursion),
      cmocka_unit_test(float32_ops_agree_with_float64),
      cmocka_unit_test(mismatched_shapes_are_reported),
      cmocka_unit_test(allocator_reuses_freed_blocks_and_outlives_its_creator),
      cmocka_unit_test(linear_adds_the_weight_gradient_into_an_existing_one_without_a_buffer),
      cmocka_unit_test(linear_reading_its_weights_gradient_does_not_write_it_while_reading),
      cmocka_unit_test(put_off_weight_gradients_add_the_same_bits_once_run),
      cmocka_unit_test(a_put_off_weight_gradient_refuses_an_input_written_since),
      cmocka_unit_test(dropout_zeroes_about_p_and_scales_the_rest),
      cmocka_unit_test(concat_and_embedding_put_values_in_place),
      cmocka_unit_test(shapes_whose_element_or_byte_count_overflows_are_refused),
      cmocka_unit_test(reshape_refuses_negative_sizes_and_a_second_inferred_dim),
      cmocka_unit_test(narrow_past_the_end_is_refused_even_when_start_plus_length_overflows),
      cmocka_unit_test(softmax_over_an_empty_dim_is_refused),
      cmocka_unit_test(reductions_refuse_a_repeated_axis_and_a_negative_axis_count),
      cmocka_unit_test(convolutions_and_their_modules_refuse_an_empty_kernel),
      cmocka_unit_test(backward_refuses_a_gradient_of_another_shape),
      cmocka_unit_test(norms_refuse_a_negative_or_nan_eps_and_momentum_outside_0_1),
      cmocka_unit_test(global_average_pooling_refuses_an_empty_map),
      cmocka_unit_test(host_tensors_refuse_bfloat16_and_unknown_dtypes),
      cmocka_unit_test(a_second_backward_without_retain_graph_fails_before_touching_a_gradient),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
