/* infer: fused inference in no-grad mode for conv2d (stride 1) + ReLU + max pool, the
 * block small CNNs are made of, for linear + ReLU, and for a whole MLP at batch 1.
 *
 * The training path runs the three as separate ops, with an im2col per image whose rows are
 * OW values long (11 for the second layer of a 28x28 CNN): at batch 1 the short copies, the
 * bias pass and the separate ReLU and pool passes took more time than the arithmetic. Here
 * one image goes through three steps:
 *   1. "wide" columns: output position (oh, ow) is numbered oh*WP + ow, WP the padded input
 *      width, so that for each kernel tap (c, kh, kw) the inputs of all positions lie in one
 *      contiguous run of the padded plane: col row (c, kh, kw) is one memcpy of WIDE values
 *      (WIDE = (OH-1)*WP + OW). The WP-OW positions past each output row are computed and
 *      thrown away (KW-1 of every WP: 2 of 13 on that second layer).
 *   2. one GEMM: out (O, WIDE) = W (O, C*KH*KW) @ col.
 *   3. one pass: y = max over each pool window of relu(out + b), written once.
 * Invariant: the result is the function the modules compute one by one. Adding the bias
 * after the sum is what GEMM with beta = 1 does on the training path; ReLU and the max are
 * applied per element in the same order (the window's first element, then any strictly
 * greater one in row-major order, as the pool kernel does). Only the convolution's sums may
 * round differently, since the GEMM has another shape. */
#include <stdalign.h>
#include <string.h>

#include "trainer/fast/infer.h"

/* One image's geometry: padded input (C, HP, WP), kernel KH x KW, output OH x OW numbered
 * in the wide layout, pooled output PH x PW (pool 0: none, PH x PW = OH x OW). */
typedef struct {
  int64_t c, h, w, pad, hp, wp;
  int64_t o, kh, kw, taps; /* taps = C*KH*KW, the GEMM's k */
  int64_t oh, ow, wide;
  int64_t pool, ph, pw;
} block_geom;

static block_geom geom_of(const tr_tensor *x, const tr_tensor *w, int padding, int pool) {
  block_geom g = {.c = x->shape[1], .h = x->shape[2], .w = x->shape[3], .pad = padding};
  g.hp = g.h + 2 * g.pad;
  g.wp = g.w + 2 * g.pad;
  g.o = w->shape[0];
  g.kh = w->shape[2];
  g.kw = w->shape[3];
  g.taps = g.c * g.kh * g.kw;
  g.oh = g.hp - g.kh + 1;
  g.ow = g.wp - g.kw + 1;
  g.wide = (g.oh - 1) * g.wp + g.ow;
  g.pool = pool;
  g.ph = pool ? (g.oh - pool) / pool + 1 : g.oh;
  g.pw = pool ? (g.ow - pool) / pool + 1 : g.ow;
  return g;
}

static bool on_cpu_f32(const tr_tensor *t) {
  return t->dtype == TR_F32 && t->storage->device.kind == TR_CPU;
}

bool tn_conv_block_fits(const tr_tensor *x, const tr_tensor *w, const tr_tensor *b, int stride,
                        int padding, int pool) {
  if (!on_cpu_f32(x) || !on_cpu_f32(w) || (b && !on_cpu_f32(b))) return false;
  if (x->ndim != 4 || w->ndim != 4 || w->shape[1] != x->shape[1] || stride != 1 || padding < 0)
    return false;
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) return false;
  if (x->shape[1] < 1 || w->shape[0] < 1 || w->shape[2] < 1 || w->shape[3] < 1) return false;
  int64_t oh = x->shape[2] + 2 * padding - w->shape[2] + 1;
  int64_t ow = x->shape[3] + 2 * padding - w->shape[3] + 1;
  return oh >= 1 && ow >= 1 && pool >= 0 && oh >= pool && ow >= pool;
}

/* xp (C, HP, WP) = x (C, H, W) with `pad` zeros around each plane. */
static void pad_image(const float *x, float *xp, const block_geom *g) {
  memset(xp, 0, sizeof(float) * (size_t)(g->c * g->hp * g->wp));
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t r = 0; r < g->h; r++)
      memcpy(xp + (c * g->hp + r + g->pad) * g->wp + g->pad, x + (c * g->h + r) * g->w,
             sizeof(float) * (size_t)g->w);
}

/* col (C*KH*KW, WIDE): row (c, kh, kw) is the padded plane c from (kh, kw) on. */
static void wide_columns(const float *xp, float *col, const block_geom *g) {
  int64_t row = 0;
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t kh = 0; kh < g->kh; kh++)
      for (int64_t kw = 0; kw < g->kw; kw++, row++)
        memcpy(col + row * g->wide, xp + (c * g->hp + kh) * g->wp + kw,
               sizeof(float) * (size_t)g->wide);
}

/* y = relu(v + bias) or v + bias: what the bias, then the ReLU module, make of a sum. */
static inline float activate(float v, float bias, bool relu) {
  float y = v + bias;
  return relu ? (y > 0 ? y : 0) : y;
}

/* The stores write each output row in chunks of a fixed number of values, so that a chunk
 * is a few whole vector operations with no scalar remainder (rows here are 5 to 26 long,
 * and a loop of unknown length leaves half of them to scalar code). A row's last chunk runs
 * past the row's end into the next rows, which are written after it and overwrite that;
 * a chunk never runs past the image's output (`room`: floats from the row's start to the
 * image's end), since the next image may be another thread's. Reads run past a row too,
 * into later wide rows, but never past the wide output: a chunk that fits in y's room reads
 * at most as far into out, whose rows are at least as long as y's. Each store is inlined
 * twice, with relu a constant in each copy: a run-time flag in the loop stops
 * vectorisation. */
#define TR_INLINE static inline __attribute__((always_inline))
#define PLAIN_CHUNK 16
#define POOL2_CHUNK 8

/* No pool: output row (o, oh) of y (O, OH, OW) from the wide out (O, WIDE). */
TR_INLINE void plain_row(const float *s, float bias, float *d, int64_t n, int64_t room, bool relu) {
  int64_t ow = 0;
  for (; ow < n && ow + PLAIN_CHUNK <= room; ow += PLAIN_CHUNK)
#pragma omp simd
    for (int64_t j = 0; j < PLAIN_CHUNK; j++) d[ow + j] = activate(s[ow + j], bias, relu);
  for (; ow < n; ow++) d[ow] = activate(s[ow], bias, relu);
}

TR_INLINE void plain_rows(const float *out, const float *b, float *y, const block_geom *g,
                          bool relu) {
  int64_t total = g->o * g->oh * g->ow;
  for (int64_t o = 0; o < g->o; o++)
    for (int64_t oh = 0; oh < g->oh; oh++) {
      int64_t at = (o * g->oh + oh) * g->ow;
      plain_row(out + o * g->wide + oh * g->wp, b ? b[o] : 0, y + at, g->ow, total - at, relu);
    }
}

TR_KERNEL static void store_plain(const float *out, const float *b, float *y, const block_geom *g,
                                  bool relu) {
  if (relu)
    plain_rows(out, b, y, g, true);
  else
    plain_rows(out, b, y, g, false);
}

/* One pooled output of a 2x2 window from input rows r0, r1 at column 2*pw, compared in the
 * order of the pool kernel (kern_conv.h, max_pool_2x2): each row's pair, then the rows. */
TR_INLINE float pool2_at(const float *r0, const float *r1, int64_t pw, float bias, bool relu) {
  float x0 = activate(r0[2 * pw], bias, relu), x1 = activate(r0[2 * pw + 1], bias, relu);
  float y0 = activate(r1[2 * pw], bias, relu), y1 = activate(r1[2 * pw + 1], bias, relu);
  float top = x1 > x0 ? x1 : x0, bottom = y1 > y0 ? y1 : y0;
  return bottom > top ? bottom : top;
}

/* Pooled row (o, ph) of 2x2 windows from wide rows r0 and r0 + WP. */
TR_INLINE void pool2_row(const float *r0, int64_t wp, float bias, float *d, int64_t n,
                         int64_t room, bool relu) {
  const float *r1 = r0 + wp;
  int64_t pw = 0;
  for (; pw < n && pw + POOL2_CHUNK <= room; pw += POOL2_CHUNK)
#pragma omp simd
    for (int64_t j = 0; j < POOL2_CHUNK; j++) d[pw + j] = pool2_at(r0, r1, pw + j, bias, relu);
  for (; pw < n; pw++) d[pw] = pool2_at(r0, r1, pw, bias, relu);
}

TR_INLINE void pool2_rows(const float *out, const float *b, float *y, const block_geom *g,
                          bool relu) {
  int64_t total = g->o * g->ph * g->pw;
  for (int64_t o = 0; o < g->o; o++)
    for (int64_t ph = 0; ph < g->ph; ph++) {
      int64_t at = (o * g->ph + ph) * g->pw;
      pool2_row(out + o * g->wide + 2 * ph * g->wp, g->wp, b ? b[o] : 0, y + at, g->pw, total - at,
                relu);
    }
}

TR_KERNEL static void store_pool2(const float *out, const float *b, float *y, const block_geom *g,
                                  bool relu) {
  if (relu)
    pool2_rows(out, b, y, g, true);
  else
    pool2_rows(out, b, y, g, false);
}

/* Any pool window k x k, stride k. */
static void store_pool(const float *out, const float *b, float *y, const block_geom *g,
                       bool relu) {
  int64_t k = g->pool;
  for (int64_t o = 0; o < g->o; o++) {
    float bias = b ? b[o] : 0;
    for (int64_t ph = 0; ph < g->ph; ph++)
      for (int64_t pw = 0; pw < g->pw; pw++) {
        const float *s = out + o * g->wide + ph * k * g->wp + pw * k;
        float acc = activate(s[0], bias, relu);
        for (int64_t i = 0; i < k; i++)
          for (int64_t j = i == 0; j < k; j++) {
            float v = activate(s[i * g->wp + j], bias, relu);
            acc = v > acc ? v : acc;
          }
        y[(o * g->ph + ph) * g->pw + pw] = acc;
      }
  }
}

/* Floats of scratch one image needs: padded input (when padded), columns, wide output. */
static int64_t image_scratch(const block_geom *g) {
  return (g->pad ? g->c * g->hp * g->wp : 0) + g->taps * g->wide + g->o * g->wide;
}

/* One image: x (C, H, W) to y (O, PH, PW); its GEMM may split over ctx's threads. */
static void block_image(const tr_ctx *ctx, const float *x, const float *w, const float *b,
                        float *y, const block_geom *g, bool relu, float *scratch) {
  float *col = scratch + (g->pad ? g->c * g->hp * g->wp : 0), *out = col + g->taps * g->wide;
  if (g->pad) pad_image(x, scratch, g);
  wide_columns(g->pad ? scratch : x, col, g);
  tn_gemm(ctx, TR_F32, false, false, g->o, g->wide, g->taps, 1.0, w, g->taps, col, g->wide, 0.0,
          out, g->wide);
  if (g->pool == 2)
    store_pool2(out, b, y, g, relu);
  else if (g->pool)
    store_pool(out, b, y, g, relu);
  else
    store_plain(out, b, y, g, relu);
}

/* A batch through the block (block_part's argument). */
typedef struct {
  const tr_ctx *ctx;
  const float *x, *w, *b;
  float *y, *scratch; /* scratch: image_scratch floats per part */
  int64_t n;
  const block_geom *g;
  bool relu;
} block_job;

/* Images [lo, hi) of part `part`, with that part's scratch. */
static void block_part(void *arg, int part, int parts) {
  const block_job *j = arg;
  const block_geom *g = j->g;
  int64_t in_per = g->c * g->h * g->w, out_per = g->o * g->ph * g->pw, lo, hi;
  tn_par_range(j->n, part, parts, &lo, &hi);
  for (int64_t i = lo; i < hi; i++)
    block_image(j->ctx, j->x + i * in_per, j->w, j->b, j->y + i * out_per, g, j->relu,
                j->scratch + part * image_scratch(g));
}

tr_tensor *tn_conv_block_infer(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b, int padding,
                               bool relu, int pool) {
  block_geom g = geom_of(x, w, padding, pool);
  int64_t n = x->shape[0];
  int parts = n > 1 ? tn_par_parts(ctx) : 1; /* images over threads; one image: its GEMM */
  tr_tensor *xc = tn_contig(ctx, x), *wc = tn_contig(ctx, w), *bc = b ? tn_contig(ctx, b) : NULL;
  tr_tensor *y = xc && wc && (!b || bc) ? tr_empty(ctx, TR_F32, 4, (int64_t[]){n, g.o, g.ph, g.pw})
                                        : NULL;
  tr_tensor *scratch = y ? tr_empty(ctx, TR_F32, 1, (int64_t[]){parts * image_scratch(&g)}) : NULL;
  if (scratch) {
    block_job job = {ctx,           tr_data(xc), tr_data(wc), bc ? tr_data(bc) : NULL, tr_data(y),
                     tr_data(scratch), n,        &g,          relu};
    if (parts > 1)
      tn_par_run(ctx, block_part, &job);
    else
      block_part(&job, 0, 1);
  }
  tr_release(scratch);
  tr_release(xc);
  tr_release(wc);
  tr_release(bc);
  if (!scratch) {
    tr_release(y);
    return NULL;
  }
  return y;
}

/* ---------------------------------------------------------------- linear + ReLU */

bool tn_linear_relu_fits(const tr_tensor *x, const tr_tensor *w) {
  return on_cpu_f32(x) && on_cpu_f32(w);
}

TR_KERNEL static void relu_in_place(float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = y[i] > 0 ? y[i] : 0; /* as the ReLU kernel */
}

tr_tensor *tn_linear_relu_infer(tr_ctx *ctx, tr_tensor *x, tr_tensor *w, tr_tensor *b) {
  bool prev = tr_set_grad_enabled(ctx, false); /* y must have no history to be written */
  tr_tensor *y = tr_linear(ctx, x, w, b);
  tr_set_grad_enabled(ctx, prev);
  if (y) relu_in_place(tr_f32(y), y->numel); /* contiguous: tr_linear made it */
  return y;
}

/* ---------------------------------------------------------------- a batch-1 MLP */

/* Batch-1 latency of a small MLP is a few microseconds of reading weights; the module path
 * spent a third as much again on what surrounds it: a tensor header, storage and view per
 * op, the flatten step, the bias copies. Here activations pass between layers in stack
 * buffers, and only the output is a tensor. A layer is the module path's arithmetic: each
 * row's sum by tn_gemv, the bias added to it, then the ReLU. (The module path copies the
 * bias in first and has tn_gemv add the sum to it: b + s is s + b to the bit, and one pass
 * after the sums is cheaper than a copy before them and a read of it in tn_gemv.)
 *
 * A first layer large enough to split (the 784x256 one: 0.8 MB, more than one core's L2
 * holds) goes over ctx's threads in one job, each thread on the same rows every call, so
 * that its share of the weights stays in its cache. That job also does the second layer's
 * share that needs only those rows' outputs: block k of the first layer's rows [lo, hi)
 * times the second's columns [lo, hi), a partial sum per output; the caller adds the
 * partials in block order, after the bias. So the second layer is split too without a
 * second hand-off, and each core keeps its columns of it in cache as well. With one block
 * (one thread) that is the module path's sum exactly; with several, the second layer's
 * sums are added in another order and may round differently (within float rounding), the
 * first layer's are unchanged.
 *
 * Block 0 is the caller's part, which starts before any worker: a worker sees the job one
 * cache-line transfer later and reads its argument with another (0.3-0.4 us together here,
 * a tenth of a 784x128 half). So block 0 takes HEAD_LEAD rows more than an even share, from
 * block 1 (bench_engine here: MLP p50 6.05-6.3 us without the lead, 5.6-6.1 with it; 32
 * rows was no better than 16). */

#define MLP_SPLIT_MIN ((int64_t)1 << 16) /* weights of a first layer worth splitting */
#define MLP_PARTIAL_FLOATS 2048          /* stack room for the second layer's partials */
#define HEAD_LEAD 16                     /* block 0's extra rows: one vector-aligned step */

static bool contig_f32(const tr_tensor *t) { return on_cpu_f32(t) && tr_is_contiguous(t); }

bool tn_mlp_chains(const tr_tensor *x, bool flatten, const tn_mlp_layer *layers, int n) {
  if (n < 1 || n > TN_MLP_MAX_LAYERS || !contig_f32(x) || x->ndim < 1 || x->shape[0] < 1)
    return false;
  if (!flatten && x->ndim != 2) return false;
  int64_t width = x->numel / x->shape[0];
  for (int k = 0; k < n; k++) {
    const tr_tensor *w = layers[k].w, *b = layers[k].b;
    if (!contig_f32(w) || w->ndim != 2 || w->shape[1] != width) return false;
    if (b && (!contig_f32(b) || b->ndim != 1 || b->shape[0] != w->shape[0])) return false;
    width = w->shape[0];
  }
  return true;
}

bool tn_mlp_fits(const tr_tensor *x, bool flatten, const tn_mlp_layer *layers, int n) {
  if (!tn_mlp_chains(x, flatten, layers, n) || x->shape[0] != 1) return false;
  for (int k = 0; k < n - 1; k++)
    if (layers[k].w->shape[0] > TN_MLP_MAX_WIDTH) return false;
  return true;
}

TR_KERNEL void tn_add_bias_relu(float *y, const float *b, int64_t n, bool relu) {
  if (b) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += b[i];
  }
  if (relu) relu_in_place(y, n);
}

/* Rows [lo, hi) of relu?(W x + b) into y[0, hi - lo), as the linear module then the ReLU
 * module do them. */
static void mlp_rows(const tr_ctx *ctx, const tn_mlp_layer *l, int64_t lo, int64_t hi,
                     const float *x, float *y) {
  int64_t in = l->w->shape[1];
  tn_gemv(ctx, TR_F32, hi - lo, in, tr_f32(l->w) + lo * in, in, x, 0.0, y);
  tn_add_bias_relu(y, l->b ? tr_f32(l->b) + lo : NULL, hi - lo, l->relu);
}

/* The first two layers split in blocks (mlp_head_part's argument). */
typedef struct {
  const tr_ctx *ctx;
  const tn_mlp_layer *first, *second;
  const float *x;
  float *partial; /* (blocks, second's outputs): each block's share of the second's sums */
  int blocks;
} mlp_head_job;

/* Rows [lo, hi) of the first layer in block k of `blocks`: an even split, but block 0 leads
 * by HEAD_LEAD rows where block 1 has room to spare them. */
static void head_block_rows(int64_t rows, int k, int blocks, int64_t *lo, int64_t *hi) {
  tn_par_range(rows, k, blocks, lo, hi);
  if (blocks < 2) return;
  int64_t lo1, hi1;
  tn_par_range(rows, 1, blocks, &lo1, &hi1);
  if (hi1 - lo1 < 4 * HEAD_LEAD) return;
  if (k == 0) *hi += HEAD_LEAD;
  if (k == 1) *lo += HEAD_LEAD;
}

/* Blocks of this part: the first layer's rows of each block, then the second layer's
 * partial sums over the same range of its inputs. The first layer's outputs stay on this
 * thread's stack: only the partial sums go to the caller (writing the caller's stack
 * would make this core fetch lines the caller wrote since). */
static void mlp_head_part(void *arg, int part, int parts) {
  const mlp_head_job *j = arg;
  alignas(64) float hidden[TN_MLP_MAX_WIDTH];
  int64_t mid = j->first->w->shape[0], out = j->second->w->shape[0], first_block, end_block;
  tn_par_range(j->blocks, part, parts, &first_block, &end_block);
  for (int64_t k = first_block; k < end_block; k++) {
    int64_t lo, hi;
    head_block_rows(mid, (int)k, j->blocks, &lo, &hi);
    mlp_rows(j->ctx, j->first, lo, hi, j->x, hidden);
    tn_gemv(j->ctx, TR_F32, out, hi - lo, tr_f32(j->second->w) + lo, mid, hidden, 0.0,
            j->partial + k * out);
  }
}

TR_KERNEL void tn_sum_partials(float *y, const float *b, const float *partial, int blocks,
                               int64_t stride, int64_t n, bool relu) {
  if (b) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = b[i] + partial[i];
  } else {
    memcpy(y, partial, sizeof(float) * (size_t)n);
  }
  for (int k = 1; k < blocks; k++) {
    const float *p = partial + k * stride;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += p[i];
  }
  if (relu) relu_in_place(y, n);
}

/* How many blocks the first two layers split into: 1 (no split) unless the first is large
 * and ctx has threads, and the second layer's partials fit the stack room. */
static int head_blocks(const tr_ctx *ctx, const tn_mlp_layer *layers, int n) {
  if (n < 2 || layers[0].w->numel < MLP_SPLIT_MIN) return 1;
  int parts = tn_par_parts(ctx);
  return parts * layers[1].w->shape[0] <= MLP_PARTIAL_FLOATS ? parts : 1;
}

tr_tensor *tn_mlp_infer(tr_ctx *ctx, const tr_tensor *x, const tn_mlp_layer *layers, int n) {
  alignas(64) float hidden[2][TN_MLP_MAX_WIDTH], partial[MLP_PARTIAL_FLOATS];
  tr_tensor *y = tr_empty(ctx, TR_F32, 2, (int64_t[]){1, layers[n - 1].w->shape[0]});
  if (!y) return NULL;
  const float *in = tr_f32(x);
  int k = 0, blocks = head_blocks(ctx, layers, n);
  if (blocks > 1) { /* layers 0 and 1, writing hidden[1] (or y) as below */
    float *second_out = n == 2 ? tr_f32(y) : hidden[1];
    mlp_head_job job = {ctx, &layers[0], &layers[1], in, partial, blocks};
    tn_par_run(ctx, mlp_head_part, &job);
    const tn_mlp_layer *l = &layers[1];
    int64_t out = l->w->shape[0];
    tn_sum_partials(second_out, l->b ? tr_f32(l->b) : NULL, partial, blocks, out, out, l->relu);
    in = second_out;
    k = 2;
  }
  for (; k < n; k++) { /* layer k writes hidden[k % 2], the last one y */
    float *out = k == n - 1 ? tr_f32(y) : hidden[k % 2];
    mlp_rows(ctx, &layers[k], 0, layers[k].w->shape[0], in, out);
    in = out;
  }
  return y;
}
