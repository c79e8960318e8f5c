/* pipeline_bn: deferred batch norm for a pipeline stage, after torchgpipe's
 * DeferredBatchNorm. Each micro-batch is still normalised by its own statistics (the
 * forward is the module's own), but the running statistics move once per mini-batch, by
 * the mean and unbiased variance of all its micro-batches together, as one rank's batch
 * norm on the whole mini-batch would move them.
 *
 * Invariants: between begin and end, every tracked forward leaves the running statistics
 * as they were at begin (the module's own update is undone), while per-channel sums of x
 * and x², in double, and the count of values per channel grow; end applies the momentum
 * once. Every batch norm of the stage is tracked, those inside its children (a residual
 * block's, as built-in ResNets and MobileNets have them) too: each gets a hook
 * (tn_module_set_bn_hook) through which its forward passes, and which adds up its input
 * while the stage runs a forward (not a recomputation) in training mode. On a CUDA stage
 * the sums are taken from a host copy of each micro-batch's input and the new statistics
 * are computed on the host and copied to the device. */
#include <stdlib.h>
#include <string.h>

#include "trainer/dist/pipeline_internal.h"

typedef struct {
  pipe_bn *owner;         /* borrowed: the stage's state, which says when to track */
  tr_module *module;      /* borrowed */
  tr_tensor *mean, *var;  /* borrowed: its running statistics */
  double momentum;
  tr_tensor *start_mean, *start_var; /* owned: the running statistics at begin */
  double *sums;           /* owned, 2 * channels: sum of x, then sum of x² */
  int64_t channels, count; /* values per channel summed so far */
} bn_track;

struct pipe_bn {
  int n_tracks;
  bn_track *tracks; /* owned, one per batch norm of the stage (nested ones included) */
  bool tracking;    /* the stage runs a forward whose statistics count */
};

static void track_clear(bn_track *t) {
  tr_release(t->start_mean);
  tr_release(t->start_var);
  t->start_mean = t->start_var = NULL;
}

void pipe_bn_free(pipe_bn *bn) {
  if (!bn) return;
  for (int k = 0; k < bn->n_tracks; k++) {
    tn_module_set_bn_hook(bn->tracks[k].module, NULL, NULL);
    track_clear(&bn->tracks[k]);
    free(bn->tracks[k].sums);
  }
  free(bn->tracks);
  free(bn);
}

static tr_tensor *tracked_forward(tr_ctx *ctx, void *arg, tr_module *m, tr_tensor *x);

/* Calls add(bn, m) for every batch norm of m and below, in module order; counts them. */
static int each_batch_norm(tr_module *m, pipe_bn *bn, int (*add)(pipe_bn *, tr_module *)) {
  tr_tensor *mean, *var;
  double momentum;
  bool training;
  if (tn_module_batch_norm(m, &mean, &var, &momentum, &training)) return add ? add(bn, m) : 1;
  size_t n = 0;
  tr_module *const *children = tn_module_children(m, &n);
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    int got = each_batch_norm(children[i], bn, add);
    if (got < 0) return got;
    found += got;
  }
  return found;
}

/* m as the next track, hooked: 1, or -1 when out of memory. */
static int hook_batch_norm(pipe_bn *bn, tr_module *m) {
  bn_track *t = &bn->tracks[bn->n_tracks];
  bool training;
  tn_module_batch_norm(m, &t->mean, &t->var, &t->momentum, &training);
  t->channels = t->mean->numel;
  t->sums = calloc((size_t)(2 * t->channels), sizeof *t->sums);
  if (!t->sums) return -1;
  t->owner = bn;
  t->module = m;
  bn->n_tracks++;
  tn_module_set_bn_hook(m, tracked_forward, t);
  return 1;
}

pipe_bn *pipe_bn_new(tr_ctx *ctx, tr_module *const *children, int n) {
  int found = 0;
  for (int k = 0; k < n; k++) found += each_batch_norm(children[k], NULL, NULL);
  pipe_bn *bn = calloc(1, sizeof *bn);
  if (bn) bn->tracks = calloc((size_t)(found ? found : 1), sizeof *bn->tracks);
  bool ok = bn && bn->tracks;
  for (int k = 0; ok && k < n; k++) ok = each_batch_norm(children[k], bn, hook_batch_norm) >= 0;
  if (!ok) {
    pipe_bn_free(bn);
    tr_fail(ctx, "pipeline: out of memory");
    return NULL;
  }
  return bn;
}

void pipe_bn_track(pipe_bn *bn, bool on) { bn->tracking = on; }

int pipe_bn_begin(tr_ctx *ctx, pipe_bn *bn) {
  for (int k = 0; k < bn->n_tracks; k++) {
    bn_track *t = &bn->tracks[k];
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

/* The hook of a tracked batch norm: while its stage runs a forward in training mode, adds
 * x (one micro-batch) to the sums, runs the module, and puts the running statistics back
 * as they were at begin; else the module's plain forward. */
static tr_tensor *tracked_forward(tr_ctx *ctx, void *arg, tr_module *m, tr_tensor *x) {
  bn_track *t = arg;
  tr_tensor *mean, *var;
  double momentum;
  bool training;
  tn_module_batch_norm(m, &mean, &var, &momentum, &training);
  /* a wrong shape: the module says what is wrong */
  if (!t->owner->tracking || !training || !t->start_mean || x->ndim < 2 ||
      x->shape[1] != t->channels)
    return tn_batchnorm_forward(ctx, m, x);
  tr_tensor *xc = host_values(ctx, x);
  if (!xc) return NULL;
  track_add(t, xc);
  tr_release(xc);
  tr_tensor *out = tn_batchnorm_forward(ctx, m, x);
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
  for (int k = 0; k < bn->n_tracks && rc == NAS_OK; k++) {
    bn_track *t = &bn->tracks[k];
    if (t->count < 2) continue;
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
