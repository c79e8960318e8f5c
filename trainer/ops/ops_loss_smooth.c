/* ops_loss_smooth: cross-entropy against label-smoothed targets, composed of existing ops
 * (cross-entropy, log-softmax, mean, scale, add), so it runs on every device those do and
 * its gradient is theirs. The smoothing term costs a second log-softmax of the logits,
 * which is small beside the model that made them (N × C values). */
#include "trainer/core/internal.h"

tr_tensor *tr_cross_entropy_smooth(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels,
                                   double smoothing) {
  if (!(smoothing >= 0 && smoothing < 1))
    return tr_fail(ctx, "cross_entropy: label smoothing %g outside [0, 1)", smoothing);
  tr_tensor *nll = tr_cross_entropy(ctx, logits, labels);
  if (!nll || smoothing == 0) return nll;
  /* mean over rows of (1/C) sum_c -log p_c = -mean of every log-probability */
  tr_tensor *logp = tr_log_softmax(ctx, logits, 1);
  tr_tensor *mean_logp = logp ? tr_mean(ctx, logp, 0, NULL, false) : NULL;
  tr_tensor *kept = mean_logp ? tr_scale(ctx, nll, 1 - smoothing) : NULL;
  tr_tensor *spread = kept ? tr_scale(ctx, mean_logp, -smoothing) : NULL;
  tr_tensor *loss = spread ? tr_add(ctx, kept, spread) : NULL;
  tr_release(nll);
  tr_release(logp);
  tr_release(mean_logp);
  tr_release(kept);
  tr_release(spread);
  return loss;
}
