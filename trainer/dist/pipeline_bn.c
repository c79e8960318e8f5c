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
 * children, as the built-in families make them), and only in training mode. On a CUDA
 * stage the sums are taken from a host copy of each micro-batch's input and the new
 * statistics are computed on the host and copied to the device. */
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

/* x's values, contiguous on the host (owned; no history). */
static tr_tensor *host_values(tr_ctx *ctx, tr_tensor *x) {
  if (!tn_on_cuda(x)) return tn_contig(ctx, x);
  tr_tensor *plain = tr_detach(ctx, x);
  tr_tensor *host = plain ? tr_to_device(ctx, plain, TR_DEVICE_CPU) : NULL;
  tr_release(plain);
  return host;
}

tr_tensor *pipe_bn_forward(tr_ctx *ctx, pipe_bn *bn, int k, tr_tensor *x) {
  bn_track *t = &bn->tracks[k];
  if (x->ndim < 2 || x->shape[1] != t->channels)
    return tr_module_forward(ctx, t->module, x); /* the module says what is wrong */
  tr_tensor *xc = host_values(ctx, x);
  if (!xc) return NULL;
  track_add(t, xc);
  tr_release(xc);
  tr_tensor *out = tr_module_forward(ctx, t->module, x);
  if (out && (pipe_copy_values(ctx, t->mean, t->start_mean) != NAS_OK ||
              pipe_copy_values(ctx, t->var, t->start_var) != NAS_OK)) {
    tr_release(out);
    return NULL;
  }
  return out;
}

/* stat = (1 - m) * start + m * batch[ch] for each channel ch, on stat's device. */
static int blend(tr_ctx *ctx, tr_tensor *stat, tr_tensor *start, const double *batch,
                 double m) {
  bool cuda = tn_on_cuda(stat);
  /* on a device: computed in a host copy of start, then copied over */
  tr_tensor *host = cuda ? tr_to_device(ctx, start, TR_DEVICE_CPU) : tr_retain(stat);
  if (!host) return NAS_ERR;
  const tr_tensor *from = cuda ? host : start;
  for (int64_t ch = 0; ch < stat->numel; ch++)
    tn_set(host, ch, (1 - m) * tr_get(from, ch) + m * batch[ch]);
  int rc = NAS_OK;
  if (cuda)
    rc = tr_copy_(ctx, stat, host);
  else
    stat->storage->version++;
  tr_release(host);
  return rc;
}

int pipe_bn_end(tr_ctx *ctx, pipe_bn *bn) {
  int rc = NAS_OK;
  for (int k = 0; k < bn->n_children && rc == NAS_OK; k++) {
    bn_track *t = &bn->tracks[k];
    if (!t->module || t->count < 2) continue;
    double n = (double)t->count;
    /* the sums are spent: they become the mini-batch's mean and unbiased variance */
    for (int64_t ch = 0; ch < t->channels; ch++) {
      double mean = t->sums[ch] / n;
      t->sums[t->channels + ch] = (t->sums[t->channels + ch] - n * mean * mean) / (n - 1);
      t->sums[ch] = mean;
    }
    rc = blend(ctx, t->mean, t->start_mean, t->sums, t->momentum);
    if (rc == NAS_OK) rc = blend(ctx, t->var, t->start_var, t->sums + t->channels, t->momentum);
  }
  return rc;
}
