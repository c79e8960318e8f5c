/* ops_loss: fused cross-entropy (log-softmax + negative log-likelihood, mean over rows) and
 * mean squared error.
 *
 * Cross-entropy keeps the softmax probabilities from the forward pass, so its backward is one
 * pass: dlogits = (probs - onehot) * dloss / N. It is one node instead of two, and never
 * forms log-probabilities of the classes it does not need. */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/core/internal.h"

#define KERN_FILE "trainer/ops/kern_loss.h"
#include "trainer/core/kern_both.h"

/* saved 0: probs (N, C); aux: the labels (int32, N). */
static int cross_entropy_backward(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **gi) {
  tr_tensor *probs = ag_saved(ctx, node, 0);
  const int32_t *labels = probs ? ag_aux(ctx, node) : NULL;
  if (!labels) return NAS_ERR;
  int64_t rows = probs->shape[0], classes = probs->shape[1];
  gi[0] = tn_empty_like(ctx, probs);
  if (!gi[0]) return NAS_ERR;
  double scale = tr_item(g) / (double)rows;
  TR_DISPATCH(probs->dtype, cross_entropy_bwd, tr_data(probs), labels, tr_data(gi[0]), rows,
              classes, scale);
  return NAS_OK;
}
static const tr_node_ops cross_entropy_ops = {"CrossEntropyBackward", cross_entropy_backward};

static int check_labels(tr_ctx *ctx, const int32_t *labels, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; r++)
    if (labels[r] < 0 || labels[r] >= classes)
      return nas_errf(&ctx->err, "cross_entropy: label %d of row %lld is outside [0, %lld)",
                      labels[r], (long long)r, (long long)classes);
  return NAS_OK;
}

tr_tensor *tr_cross_entropy(tr_ctx *ctx, tr_tensor *logits, const int32_t *labels) {
  if (tn_check_inputs(ctx, "cross_entropy", 1, &logits)) return NULL;
  if (logits->ndim != 2 || logits->shape[0] < 1)
    return tr_fail(ctx, "cross_entropy: logits must be (N >= 1, C)");
  int64_t rows = logits->shape[0], classes = logits->shape[1];
  if (check_labels(ctx, labels, rows, classes)) return NULL;
  /* On a device the labels are kept there and the loss stays there (trainer/cuda/cuda_ops.c). */
  if (tn_on_cuda(logits)) return tc_cross_entropy(ctx, logits, labels);
  tr_tensor *x = tn_contig(ctx, logits);
  tr_tensor *probs = x ? tn_empty_like(ctx, x) : NULL;
  tr_tensor *loss = probs ? tr_empty(ctx, logits->dtype, 0, NULL) : NULL;
  int32_t *labels_copy = loss ? malloc(sizeof(int32_t) * (size_t)rows) : NULL;
  if (!labels_copy) {
    tr_free(x);
    tr_free(probs);
    tr_free(loss);
    return loss ? tr_fail(ctx, "cross_entropy: out of memory") : NULL;
  }
  double value;
  if (logits->dtype == TR_F32)
    value = cross_entropy_fwd_f32(tr_data(x), labels, tr_data(probs), rows, classes);
  else
    value = cross_entropy_fwd_f64(tr_data(x), labels, tr_data(probs), rows, classes);
  if (loss->dtype == TR_F32)
    tr_f32(loss)[0] = (float)value;
  else
    tr_f64(loss)[0] = value;
  tr_free(x);
  memcpy(labels_copy, labels, sizeof(int32_t) * (size_t)rows);
  tr_node *node;
  int rc = ag_record(ctx, &cross_entropy_ops, 1, &logits, loss, &node);
  if (node && rc == NAS_OK) {
    node->aux = labels_copy;
    labels_copy = NULL;
    rc = ag_save(ctx, node, probs);
  }
  free(labels_copy);
  tr_free(probs);
  if (rc) {
    tr_free(loss);
    return NULL;
  }
  return loss;
}

tr_tensor *tr_mse_loss(tr_ctx *ctx, tr_tensor *pred, tr_tensor *target) {
  if (!tr_same_shape(pred, target)) return tr_fail(ctx, "mse_loss: shapes differ");
  tr_tensor *diff = tr_sub(ctx, pred, target);
  tr_tensor *sq = diff ? tr_mul(ctx, diff, diff) : NULL;
  tr_tensor *loss = sq ? tr_mean(ctx, sq, 0, NULL, false) : NULL;
  tr_free(diff);
  tr_free(sq);
  return loss;
}
