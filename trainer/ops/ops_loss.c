/* ops_loss: fused cross-entropy (log-softmax + negative log-likelihood, mean over rows) and
 * mean squared error.
 *
 * Cross-entropy keeps the softmax probabilities from the forward pass, so its backward is one
 * pass: dlogits = (probs - onehot) * dloss / N. It is one node instead of two, and never
 * forms log-probabilities of the classes it does not need. The labels are kept as int32 on
 * the logits' device; only the compute steps split by device (tc_cross_entropy_* on CUDA). */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/ops/dispatch.h"

#define KERN_FILE "trainer/ops/kern_loss.h"
#include "trainer/core/kern_both.h"

typedef struct {
  tr_node base;
  tr_saved probs;  /* (N, C), the softmax of the logits */
  tr_saved labels; /* N int32 (tn_i32_new) */
} cross_entropy_node;

static int cross_entropy_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  cross_entropy_node *n = (cross_entropy_node *)node;
  tr_tensor *probs = ag_saved(ctx, node, &n->probs);
  tr_tensor *labels = probs ? ag_saved(ctx, node, &n->labels) : NULL;
  if (!labels) return NAS_ERR;
  int64_t rows = probs->shape[0], classes = probs->shape[1];
  gi[0] = tn_empty_like_dev(ctx, probs);
  if (!gi[0]) return NAS_ERR;
  if (tn_on_cuda(probs)) return tc_cross_entropy_bwd(ctx, probs, labels, g, gi[0]);
  double scale = tr_item(g) / (double)rows;
  TR_DISPATCH(probs->dtype, cross_entropy_bwd, tr_data(probs), tr_data(labels), tr_data(gi[0]),
              rows, classes, scale);
  return NAS_OK;
}
static const tr_node_ops cross_entropy_ops = {"CrossEntropyBackward", cross_entropy_backward,
                                              sizeof(cross_entropy_node), NULL};

static int check_labels(tr_ctx *ctx, const int32_t *labels, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; r++)
    if (labels[r] < 0 || labels[r] >= classes)
      return nas_errf(&ctx->err, "cross_entropy: label %d of row %lld is outside [0, %lld)",
                      labels[r], (long long)r, (long long)classes);
  return NAS_OK;
}

/* The host's compute step: probs and the mean loss (a new scalar) from x and labels. */
static tr_tensor *cross_entropy_host(tr_ctx *ctx, const tr_tensor *x, const tr_tensor *labels,
                                     tr_tensor *probs) {
  tr_tensor *loss = tr_empty(ctx, x->dtype, 0, NULL);
  if (!loss) return NULL;
  int64_t rows = x->shape[0], classes = x->shape[1];
  if (x->dtype == TR_F32)
    tr_f32(loss)[0] = (float)cross_entropy_fwd_f32(tr_data(x), tr_data(labels), tr_data(probs),
                                                   rows, classes);
  else
    tr_f64(loss)[0] = cross_entropy_fwd_f64(tr_data(x), tr_data(labels), tr_data(probs), rows,
                                            classes);
  return loss;
}

tr_tensor *tr_cross_entropy(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels) {
  if (tn_check_inputs(ctx, "cross_entropy", 1, &logits)) return NULL;
  if (logits->ndim != 2 || logits->shape[0] < 1)
    return tr_fail(ctx, "cross_entropy: logits must be (N >= 1, C)");
  int64_t rows = logits->shape[0], classes = logits->shape[1];
  if (check_labels(ctx, labels, rows, classes)) return NULL;
  tr_tensor *x = tn_contig(ctx, logits);
  tr_tensor *lab = x ? tn_i32_new(ctx, logits, labels, rows) : NULL;
  tr_tensor *probs = lab ? tn_empty_like_dev(ctx, x) : NULL;
  tr_tensor *loss = !probs              ? NULL
                    : tn_on_cuda(probs) ? tc_cross_entropy_fwd(ctx, x, lab, probs)
                                        : cross_entropy_host(ctx, x, lab, probs);
  int rc = loss ? NAS_OK : NAS_ERR;
  cross_entropy_node *node = ag_record(ctx, &cross_entropy_ops, 1, &logits, loss, &rc);
  if (node) rc = ag_save(ctx, &node->base, &node->probs, probs);
  if (node && rc == NAS_OK) rc = ag_save(ctx, &node->base, &node->labels, lab);
  tr_release(probs);
  tr_release(lab);
  tr_release(x);
  return ag_output(loss, rc);
}

tr_tensor *tr_mse_loss(tr_ctx *ctx, tr_tensor *pred, tr_tensor *target) {
  if (!tr_same_shape(pred, target)) return tr_fail(ctx, "mse_loss: shapes differ");
  tr_tensor *diff = tr_sub(ctx, pred, target);
  tr_tensor *sq = diff ? tr_mul(ctx, diff, diff) : NULL;
  tr_tensor *loss = sq ? tr_mean(ctx, sq, 0, NULL, false) : NULL;
  tr_release(diff);
  tr_release(sq);
  return loss;
}
