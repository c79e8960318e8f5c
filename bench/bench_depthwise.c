/* bench_depthwise: a depthwise convolution's forward + backward time, by the engine's direct
 * loops (tr_conv2d_grouped) against the same convolution done the way it would run without
 * them: one tr_conv2d (im2col + GEMM) per channel on narrowed views, concatenated. Prints
 * "key value" lines (median of the timed repetitions, in ms) and the largest difference
 * between the two outputs. Shapes: a MobileNet block on Fashion-MNIST, batch 64, 96
 * channels of 14×14, 3×3 stride 1 and 5×5 stride 2. Threads from the environment (run with
 * OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 to compare one core). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "trainer/trainer.h"

#define BATCH 64
#define CHANNELS 96
#define SIDE 14
#define WARMUP 3
#define REPS 15

static void die(const char *what, const tr_ctx *ctx) {
  fprintf(stderr, "bench_depthwise: %s: %s\n", what, ctx->err.msg);
  exit(1);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The depthwise convolution as CHANNELS ordinary ones on views, concatenated. */
static tr_tensor *per_channel(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, int stride, int pad) {
  tr_tensor *outs[CHANNELS];
  for (int c = 0; c < CHANNELS; c++) {
    tr_tensor *xc = tr_narrow(ctx, x, 1, c, 1), *wc = tr_narrow(ctx, w, 0, c, 1);
    outs[c] = xc && wc ? tr_conv2d(ctx, xc, wc, NULL, stride, pad) : NULL;
    tr_release(xc);
    tr_release(wc);
    if (!outs[c]) die("per-channel conv2d", ctx);
  }
  tr_tensor *y = tr_concat(ctx, CHANNELS, outs, 1);
  for (int c = 0; c < CHANNELS; c++) tr_release(outs[c]);
  return y;
}

/* Forward, sum, backward; returns the output (owned) for the comparison. */
static tr_tensor *step(tr_ctx *ctx, bool direct, tr_tensor *x, tr_tensor *w, int stride,
                       int pad) {
  tr_zero_grad(x);
  tr_zero_grad(w);
  tr_tensor *y = direct ? tr_conv2d_grouped(ctx, x, w, NULL, stride, pad, CHANNELS)
                        : per_channel(ctx, x, w, stride, pad);
  if (!y) die("forward", ctx);
  tr_tensor *loss = tr_sum(ctx, y, 0, NULL, false);
  if (!loss || tr_backward(ctx, loss, NULL, false)) die("backward", ctx);
  tr_release(loss);
  return y;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_ms(tr_ctx *ctx, bool direct, tr_tensor *x, tr_tensor *w, int stride,
                        int pad) {
  double t[REPS];
  for (int r = 0; r < WARMUP + REPS; r++) {
    double start = now_ms();
    tr_release(step(ctx, direct, x, w, stride, pad));
    if (r >= WARMUP) t[r - WARMUP] = now_ms() - start;
  }
  qsort(t, REPS, sizeof t[0], by_value);
  return t[REPS / 2];
}

static void run(tr_ctx *ctx, int kernel, int stride) {
  tr_tensor *x = tr_randn(ctx, TR_F32, 4, (int64_t[]){BATCH, CHANNELS, SIDE, SIDE}, 1.0);
  tr_tensor *w = tr_randn(ctx, TR_F32, 4, (int64_t[]){CHANNELS, 1, kernel, kernel}, 0.3);
  if (!x || !w) die("inputs", ctx);
  tr_set_requires_grad(x, true);
  tr_set_requires_grad(w, true);
  int pad = kernel / 2;
  tr_tensor *a = step(ctx, true, x, w, stride, pad), *b = step(ctx, false, x, w, stride, pad);
  double diff = 0;
  for (int64_t i = 0; i < a->numel; i++) diff = fmax(diff, fabs(tr_get(a, i) - tr_get(b, i)));
  tr_release(a);
  tr_release(b);
  double direct = median_ms(ctx, true, x, w, stride, pad);
  double im2col = median_ms(ctx, false, x, w, stride, pad);
  printf("depthwise_%dx%d_s%d_direct_fwd_bwd_ms %.3f\n", kernel, kernel, stride, direct);
  printf("depthwise_%dx%d_s%d_per_channel_im2col_fwd_bwd_ms %.3f\n", kernel, kernel, stride,
         im2col);
  printf("depthwise_%dx%d_s%d_speedup %.1f\n", kernel, kernel, stride, im2col / direct);
  printf("depthwise_%dx%d_s%d_max_abs_diff %.2g\n", kernel, kernel, stride, diff);
  tr_release(x);
  tr_release(w);
}

int main(void) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_allocator *alloc = tr_allocator_new((size_t)1 << 30);
  if (!alloc) die("allocator", &ctx);
  ctx.alloc = alloc;
  printf("shape x (%d, %d, %d, %d), float32, median of %d after %d\n", BATCH, CHANNELS, SIDE,
         SIDE, REPS, WARMUP);
  run(&ctx, 3, 1);
  run(&ctx, 5, 2);
  tr_allocator_release(alloc);
  return 0;
}
