/* trainer/fit.c: the training loop of built-in trials — cross-entropy, an optimiser with a
 * learning-rate schedule, shuffled batches, validation after every epoch — and accuracy.
 *
 * The loop is the one docs/engine.md shows, with every error checked. Evaluation runs in
 * evaluation mode without a graph, in slices (views) of the dataset, and puts the model
 * back in training mode. Only the API of trainer.h is used. */
#include <stdlib.h>

#include "trainer/trainer.h"

/* Examples per forward pass when evaluating: big enough for GEMM, small enough for memory. */
enum { EVAL_BATCH = 500 };

int64_t tr_argmax(const float *values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (values[i] > values[best]) best = i;
  return best;
}

/* Correct predictions among the rows of x (a slice of a dataset) with labels y. */
static int count_correct(tr_ctx *ctx, tr_module *m, tr_tensor *x, const int32_t *y,
                         int64_t *correct, nas_err *err) {
  tr_tensor *logits = tr_module_forward(ctx, m, x);
  tr_tensor *dense = logits ? tr_contiguous(ctx, logits) : NULL;
  tr_free(logits);
  if (!dense) return nas_errf(err, "evaluation: %s", ctx->err.msg);
  int64_t rows = dense->shape[0], classes = dense->numel / (rows ? rows : 1);
  for (int64_t r = 0; r < rows; r++)
    *correct += tr_argmax(tr_f32(dense) + r * classes, classes) == y[r];
  tr_free(dense);
  return NAS_OK;
}

int tr_evaluate(tr_ctx *ctx, tr_module *m, const tr_dataset *ds, int64_t batch,
                double *accuracy, nas_err *err) {
  if (ds->n == 0) return nas_errf(err, "evaluation: no examples");
  if (batch < 1) batch = EVAL_BATCH;
  tr_module_train(m, false);
  bool grad = tr_set_grad_enabled(ctx, false);
  int64_t correct = 0;
  int rc = NAS_OK;
  for (int64_t start = 0; rc == NAS_OK && start < ds->n; start += batch) {
    int64_t len = ds->n - start < batch ? ds->n - start : batch;
    tr_tensor *slice = tr_narrow(ctx, ds->x, 0, start, len);
    rc = slice ? count_correct(ctx, m, slice, ds->y + start, &correct, err)
               : nas_errf(err, "evaluation: %s", ctx->err.msg);
    tr_free(slice);
  }
  tr_set_grad_enabled(ctx, grad);
  tr_module_train(m, true);
  if (rc == NAS_OK) *accuracy = (double)correct / (double)ds->n;
  return rc;
}

/* One optimiser step on a batch; *loss gets its value. */
static int train_step(tr_ctx *ctx, tr_module *m, tr_optim *opt, tr_tensor *x, const int32_t *y,
                      double *loss, nas_err *err) {
  tr_tensor *logits = tr_module_forward(ctx, m, x);
  tr_tensor *value = logits ? tr_cross_entropy(ctx, logits, y) : NULL;
  int rc = value ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK) {
    *loss = tr_item(value);
    tr_optim_zero_grad(opt);
    rc = tr_backward(ctx, value, NULL, false);
  }
  if (rc == NAS_OK) rc = tr_optim_step(ctx, opt);
  tr_free(value);
  tr_free(logits);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "training step: %s", ctx->err.msg);
}

static tr_lr_schedule schedule_for(const tr_fit_config *cfg, int64_t total_steps) {
  tr_lr_schedule s = {.kind = cfg->schedule, .base_lr = cfg->optim.lr, .total = total_steps};
  if (cfg->schedule == TR_LR_STEP) {
    s.step_size = (total_steps + 2) / 3;
    s.gamma = 0.1;
  }
  return s;
}

/* One pass over the training data; *mean_loss gets the loss averaged over examples. */
static int train_epoch(tr_ctx *ctx, tr_module *m, tr_optim *opt, tr_loader *ld,
                       const tr_fit_config *cfg, const tr_lr_schedule *sched, int64_t *step,
                       double *mean_loss, nas_err *err) {
  double sum = 0;
  int64_t seen = 0, b;
  tr_tensor *x;
  int32_t *y;
  int rc = NAS_OK;
  while (rc == NAS_OK && (b = tr_loader_next(ctx, ld, &x, &y)) > 0) {
    double loss = 0;
    tr_optim_set_lr(opt, tr_lr_at(sched, (*step)++));
    rc = train_step(ctx, m, opt, x, y, &loss, err);
    tr_free(x);
    free(y);
    sum += loss * (double)b;
    seen += b;
    if (rc == NAS_OK && cfg->on_step) rc = cfg->on_step(cfg->arg, err);
  }
  if (rc == NAS_OK && b < 0) rc = nas_errf(err, "batches: %s", ctx->err.msg);
  *mean_loss = seen ? sum / (double)seen : 0;
  return rc;
}

int tr_fit(tr_ctx *ctx, tr_module *m, const tr_dataset *train, const tr_dataset *val,
           const tr_fit_config *cfg, double *accuracy, nas_err *err) {
  if (train->n == 0) return nas_errf(err, "training: no examples");
  tr_param_list params = {0};
  if (tr_module_parameters(m, false, &params, err) != NAS_OK) return NAS_ERR;
  tr_optim *opt = tr_optim_new(ctx, &cfg->optim, params.items, params.n);
  tr_loader ld = {0};
  int rc = opt ? tr_loader_init(&ld, train, cfg->batch_size, true, cfg->shuffle_seed, err)
               : nas_errf(err, "optimiser: %s", ctx->err.msg);
  int64_t per_epoch = (train->n + cfg->batch_size - 1) / cfg->batch_size, step = 0;
  tr_lr_schedule sched = schedule_for(cfg, per_epoch * cfg->epochs);
  tr_module_train(m, true);
  for (int epoch = 1; rc == NAS_OK && epoch <= cfg->epochs; epoch++) {
    double loss = 0, acc = 0;
    rc = train_epoch(ctx, m, opt, &ld, cfg, &sched, &step, &loss, err);
    if (rc == NAS_OK) rc = tr_evaluate(ctx, m, val, EVAL_BATCH, &acc, err);
    if (rc == NAS_OK && accuracy) *accuracy = acc;
    if (rc == NAS_OK && cfg->on_epoch) rc = cfg->on_epoch(cfg->arg, epoch, loss, acc, err);
  }
  tr_loader_free(&ld);
  tr_optim_free(opt);
  tr_param_list_free(&params);
  return rc;
}
