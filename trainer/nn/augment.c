/* augment: on-the-fly augmentation of image batches (n, C, H, W) — random crop with
 * padding and horizontal flip, the standard pair for small images (CIFAR, Fashion-MNIST).
 *
 * Every choice comes from a xoshiro256** state seeded by the caller's seed, drawn in a fixed
 * order per image (flip, then the crop's row and column), so a batch augmented twice with
 * one seed comes out the same; the training loop derives the seed from the step, so a
 * resumed run augments exactly as an uninterrupted one. */
#include <stdlib.h>
#include <string.h>

#include "trainer/core/internal.h"

bool tr_augment_active(const tr_augment_config *cfg) {
  return cfg->flip || cfg->crop_padding > 0;
}

void tr_image_flip(float *image, int64_t channels, int64_t height, int64_t width) {
  for (int64_t row = 0; row < channels * height; row++) {
    float *line = image + row * width;
    for (int64_t lo = 0, hi = width - 1; lo < hi; lo++, hi--) {
      float t = line[lo];
      line[lo] = line[hi];
      line[hi] = t;
    }
  }
}

static void fill_span(float *dst, int64_t n, float value) {
  for (int64_t i = 0; i < n; i++) dst[i] = value;
}

void tr_image_crop(const float *src, float *dst, int64_t channels, int64_t height, int64_t width,
                   int pad, int64_t top, int64_t left, float fill) {
  /* Output column x reads source column x + dx; columns [first, last) of it exist (none
   * when the padding is wider than the image). */
  int64_t dy = top - pad, dx = left - pad;
  int64_t first = dx < 0 ? -dx : 0, last = dx > 0 ? width - dx : width;
  if (first > width) first = width;
  if (last < first) last = first;
  for (int64_t c = 0; c < channels; c++)
    for (int64_t y = 0; y < height; y++) {
      float *out = dst + (c * height + y) * width;
      int64_t sy = y + dy;
      if (sy < 0 || sy >= height) {
        fill_span(out, width, fill);
        continue;
      }
      const float *in = src + (c * height + sy) * width;
      fill_span(out, first, fill);
      memcpy(out + first, in + first + dx, sizeof(float) * (size_t)(last - first));
      fill_span(out + last, width - last, fill);
    }
}

int tr_augment_batch(tr_tensor *x, const tr_augment_config *cfg, uint64_t seed, nas_err *err) {
  if (!tr_augment_active(cfg)) return NAS_OK;
  if (x->ndim != 4 || x->dtype != TR_F32 || !tr_is_contiguous(x) || tn_on_cuda(x))
    return nas_errf(err, "augmentation: a contiguous float32 batch (n, C, H, W) on the CPU "
                         "expected");
  int64_t channels = x->shape[1], height = x->shape[2], width = x->shape[3];
  int64_t image = channels * height * width, pad = cfg->crop_padding;
  float *scratch = pad > 0 ? malloc(sizeof(float) * (size_t)(image ? image : 1)) : NULL;
  if (pad > 0 && !scratch) return nas_errf(err, "augmentation: out of memory");
  uint64_t rng[4];
  tr_rng_seed(rng, seed);
  for (int64_t i = 0; i < x->shape[0]; i++) {
    float *img = tr_f32(x) + i * image;
    if (cfg->flip && (tr_rng_next(rng) >> 63)) tr_image_flip(img, channels, height, width);
    if (pad == 0) continue;
    int64_t top = (int64_t)(tr_rng_next(rng) % (uint64_t)(2 * pad + 1));
    int64_t left = (int64_t)(tr_rng_next(rng) % (uint64_t)(2 * pad + 1));
    memcpy(scratch, img, sizeof(float) * (size_t)image);
    tr_image_crop(scratch, img, channels, height, width, (int)pad, top, left, cfg->fill);
  }
  free(scratch);
  x->storage->version++;
  return NAS_OK;
}
