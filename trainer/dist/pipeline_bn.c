/* pipeline_bn: deferred batch norm for a pipeline stage, after torchgpipe's
 * DeferredBatchNorm. Each micro-batch is still normalised by its own statistics (the
 * forward is the module's own), but the running statistics move once per mini-batch, by
 * the mean and unbiased variance of all its micro-batches together, as one rank's batch
 * norm on the whole mini-batch would move them.
 *
 * Invariants: between begin and end, every tracked forward leaves the running statistics
 * as they were at begin (the module's own update is undone), while per-channel sums of x
 * and x², in double, and the count of values per channel grow; end applies the momentum
 * once. Only batch norm children of the stage itself are tracked (the model's top-level
 * children, as the built-in families make them), and only in training mode. */
#include <stdlib.h>
#include <string.h>

#include "trainer/dist/pipeline_internal.h"

typedef struct {
  tr_module *module;      /* borrowed */
  tr_tensor *mean, *var;  /* borrowed: its running statistics */
  double momentum;
  tr_tensor *start_mean, *start_var; /* owned: the running statistics at begin */
  double *sums;           /* owned, 2 * channels: sum of x, then sum of x² */
  int64_t channels, count; /* values per channel summed so far */
} bn_track;

struct pipe_bn {
  int n_children;
  bn_track *tracks; /* owned, one per child; module NULL where the child is no batch norm */
};

static void track_clear(bn_track *t) {
  tr_release(t->start_mean);
  tr_release(t->start_var);
  t->start_mean = t->start_var = NULL;
}

void pipe_bn_free(pipe_bn *bn) {
  if (!bn) return;
  for (int k = 0; k < bn->n_children; k++) {
    track_clear(&bn->tracks[k]);
    free(bn->tracks[k].sums);
  }
  free(bn->tracks);
  free(bn);
}

pipe_bn *pipe_bn_new(tr_ctx *ctx, tr_module *const *children, int n) {
  pipe_bn *bn = calloc(1, sizeof *bn);
  if (bn) bn->tracks = calloc((size_t)n, sizeof *bn->tracks);
  if (!bn || !bn->tracks) {
    free(bn);
    tr_fail(ctx, "pipeline: out of memory");
    return NULL;
  }
  bn->n_children = n;
  for (int k = 0; k < n; k++) {
    bn_track *t = &bn->tracks[k];
    bool training;
    if (!tn_module_batch_norm(children[k], &t->mean, &t->var, &t->momentum, &training))
      continue;
    t->module = children[k];
    t->channels = t->mean->numel;
    t->sums = calloc((size_t)(2 * t->channels), sizeof *t->sums);
    if (!t->sums) {
      pipe_bn_free(bn);
      tr_fail(ctx, "pipeline: out of memory");
      return NULL;
    }
  }
  return bn;
}

bool pipe_bn_tracks(const pipe_bn *bn, int k) {
  const bn_track *t = &bn->tracks[k];
  tr_tensor *mean, *var;
  double momentum;
  bool training = false;
  return t->module && tn_module_batch_norm(t->module, &mean, &var, &momentum, &training) &&
         training;
}

int pipe_bn_begin(tr_ctx *ctx, pipe_bn *bn) {
  for (int k = 0; k < bn->n_children; k++) {
    bn_track *t = &bn->tracks[k];
    if (!t->module) continue;
    track_clear(t);
    t->start_mean = tn_clone(ctx, t->mean);
    t->start_var = tn_clone(ctx, t->var);
    if (!t->start_mean || !t->start_var) return NAS_ERR;
    memset(t->sums, 0, (size_t)(2 * t->channels) * sizeof *t->sums);
    t->count = 0;
  }
  return NAS_OK;
}

/* Adds x ((N, C) or (N, C, ...), contiguous) to t's per-channel sums. */
static void track_add(bn_track *t, const tr_tensor *x) {
  int64_t n = x->shape[0], c = t->channels, inner = tn_prod(x->shape, 2, x->ndim);
  for (int64_t i = 0; i < n; i++) {
    for (int64_t ch = 0; ch < c; ch++) {
      int64_t base = (i * c + ch) * inner;
      double sum = 0, sq = 0;
      for (int64_t j = 0; j < inner; j++) {
        double v = x->dtype == TR_F32 ? (double)tr_f32(x)[base + j] : tr_f64(x)[base + j];
        sum += v;
        sq += v * v;
      }
      t->sums[ch] += sum;
      t->sums[c + ch] += sq;
    }
  }
  t->count += n * inner;
}

tr_tensor *pipe_bn_forward(tr_ctx *ctx, pipe_bn *bn, int k, tr_tensor *x) {
  bn_track *t = &bn->tracks[k];
  if (x->ndim < 2 || x->shape[1] != t->channels)
    return tr_module_forward(ctx, t->module, x); /* the module says what is wrong */
  tr_tensor *xc = tn_contig(ctx, x);
  if (!xc) return NULL;
  track_add(t, xc);
  tr_release(xc);
  tr_tensor *out = tr_module_forward(ctx, t->module, x);
  tn_copy_to_contig(t->start_mean, tr_data(t->mean));
  tn_copy_to_contig(t->start_var, tr_data(t->var));
  return out;
}

int pipe_bn_end(tr_ctx *ctx, pipe_bn *bn) {
  (void)ctx;
  for (int k = 0; k < bn->n_children; k++) {
    bn_track *t = &bn->tracks[k];
    if (!t->module || t->count < 2) continue;
    double n = (double)t->count, m = t->momentum;
    for (int64_t ch = 0; ch < t->channels; ch++) {
      double mean = t->sums[ch] / n;
      double var = (t->sums[t->channels + ch] - n * mean * mean) / (n - 1);
      tn_set(t->mean, ch, (1 - m) * tr_get(t->start_mean, ch) + m * mean);
      tn_set(t->var, ch, (1 - m) * tr_get(t->start_var, ch) + m * var);
    }
    t->mean->storage->version++;
    t->var->storage->version++;
  }
  return NAS_OK;
}
