/* Augmentation of image batches (trainer/nn/augment.c): flips and padded crops against
 * hand-made images, the identities they must keep, and determinism for a seed. */
#include "tests/testutil.h"

#include "trainer/trainer.h"

#define SHAPE(...) \
  (int64_t[]) { __VA_ARGS__ }

/* A batch (n, C, H, W) whose values are 1, 2, 3, … in order. */
static tr_tensor *counting_batch(tr_ctx *ctx, int64_t n, int64_t c, int64_t h, int64_t w) {
  tr_tensor *x = tr_empty(ctx, TR_F32, 4, SHAPE(n, c, h, w));
  assert_non_null(x);
  for (int64_t i = 0; i < x->numel; i++) tr_f32(x)[i] = (float)(i + 1);
  return x;
}

static bool same_values(const tr_tensor *a, const tr_tensor *b) {
  return a->numel == b->numel &&
         memcmp(tr_f32(a), tr_f32(b), sizeof(float) * (size_t)a->numel) == 0;
}

static void flip_reverses_each_row_and_twice_is_the_identity(void **state) {
  (void)state;
  float image[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}; /* 2 channels of 2x3 */
  const float flipped[] = {3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10};
  tr_image_flip(image, 2, 2, 3);
  assert_memory_equal(image, flipped, sizeof image);
  tr_image_flip(image, 2, 2, 3);
  for (int i = 0; i < 12; i++) assert_true(image[i] == (float)(i + 1));
}

static void crop_with_padding_zero_is_the_identity(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *x = counting_batch(&ctx, 3, 2, 4, 5), *copy = counting_batch(&ctx, 3, 2, 4, 5);
  nas_err err;
  tr_augment_config none = {.crop_padding = 0, .fill = -7};
  assert_false(tr_augment_active(&none));
  assert_int_equal(tr_augment_batch(x, &none, 11, &err), NAS_OK);
  assert_true(same_values(x, copy));
  float out[40];
  tr_image_crop(tr_f32(copy), out, 2, 4, 5, 0, 0, 0, -7);
  assert_memory_equal(out, tr_f32(copy), sizeof out);
  tr_release(x);
  tr_release(copy);
}

static void crop_shifts_the_window_and_fills_the_border(void **state) {
  (void)state;
  const float image[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}; /* 1x3x3 */
  float out[9];
  const float f = -1;
  /* padded by 1, window at (0, 0): the image moves one down and one right */
  tr_image_crop(image, out, 1, 3, 3, 1, 0, 0, f);
  const float down_right[] = {f, f, f, f, 1, 2, f, 4, 5};
  assert_memory_equal(out, down_right, sizeof out);
  /* window at (2, 1): one up, no sideways move */
  tr_image_crop(image, out, 1, 3, 3, 1, 2, 1, f);
  const float up[] = {4, 5, 6, 7, 8, 9, f, f, f};
  assert_memory_equal(out, up, sizeof out);
  /* padding wider than the image: all fill */
  tr_image_crop(image, out, 1, 3, 3, 4, 0, 8, f);
  for (int i = 0; i < 9; i++) assert_true(out[i] == f);
}

static void augmentation_is_deterministic_for_a_seed_and_keeps_the_shape(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_augment_config cfg = {.crop_padding = 2, .flip = true, .fill = 0};
  tr_tensor *a = counting_batch(&ctx, 16, 1, 6, 6), *b = counting_batch(&ctx, 16, 1, 6, 6);
  tr_tensor *c = counting_batch(&ctx, 16, 1, 6, 6), *orig = counting_batch(&ctx, 16, 1, 6, 6);
  nas_err err;
  assert_int_equal(tr_augment_batch(a, &cfg, 42, &err), NAS_OK);
  assert_int_equal(tr_augment_batch(b, &cfg, 42, &err), NAS_OK);
  assert_int_equal(tr_augment_batch(c, &cfg, 43, &err), NAS_OK);
  assert_true(same_values(a, b));
  assert_false(same_values(a, c));
  assert_false(same_values(a, orig));
  assert_int_equal(a->ndim, 4);
  assert_int_equal(a->shape[0], 16);
  assert_int_equal(a->shape[2], 6);
  assert_int_equal(a->shape[3], 6);
  /* flips alone only move values within a row: every row keeps its sum */
  tr_tensor *flipped = counting_batch(&ctx, 16, 1, 6, 6);
  assert_int_equal(tr_augment_batch(flipped, &(tr_augment_config){.flip = true}, 5, &err), NAS_OK);
  for (int64_t row = 0; row < 16 * 6; row++) {
    float got = 0, want = 0;
    for (int64_t k = 0; k < 6; k++) got += tr_f32(flipped)[row * 6 + k], want += tr_f32(orig)[row * 6 + k];
    assert_true(got == want);
  }
  assert_false(same_values(flipped, orig)); /* some of 16 images were flipped */
  tr_release(a), tr_release(b), tr_release(c), tr_release(orig), tr_release(flipped);
}

static void augmentation_refuses_what_is_not_an_image_batch(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_tensor *flat = tr_zeros(&ctx, TR_F32, 2, SHAPE(4, 9));
  nas_err err;
  assert_int_equal(tr_augment_batch(flat, &(tr_augment_config){.flip = true}, 1, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "(n, C, H, W)"));
  tr_release(flat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flip_reverses_each_row_and_twice_is_the_identity),
      cmocka_unit_test(crop_with_padding_zero_is_the_identity),
      cmocka_unit_test(crop_shifts_the_window_and_fills_the_border),
      cmocka_unit_test(augmentation_is_deterministic_for_a_seed_and_keeps_the_shape),
      cmocka_unit_test(augmentation_refuses_what_is_not_an_image_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
