/* builtin/fit_pipeline.c: the training loop of built-in trials on one stage of a pipeline
 * (tr_fit_pipeline_stage; docs/engine-pipeline.md): tr_fit's epochs, schedule and
 * validation, each batch one pipelined mini-batch, each stage keeping its layers' training
 * state in a file of its own. On the CPU or on the stage's CUDA device (the pipeline moves
 * stage 0's micro-batches there).
 *
 * Stages stay in lockstep without messages of their own: every stage draws the same
 * batches (same shuffle seed) and makes the same pipeline calls; a failure anywhere
 * aborts the pipeline (its driver does it when a stage returns an error), which fails the
 * other stages at their next call. */
#include <stdlib.h>
#include <string.h>

#include "builtin/fit_internal.h"

/* The last stage's loss of a micro-batch: cross-entropy against its labels. */
/* What the loss of a micro-batch needs: the mini-batch's labels and the recipe's smoothing. */
typedef struct {
  const int32_t *labels;
  double label_smoothing;
} micro_targets;

static tr_tensor *micro_loss(tr_ctx *ctx, tr_tensor *out, int64_t start, int64_t count,
                             void *arg) {
  (void)count;
  const micro_targets *t = arg;
  return tr_cross_entropy_smooth(ctx, out, t->labels + start, t->label_smoothing);
}

typedef struct {
  tr_ctx *ctx;
  tr_pipe *pipe;
  tr_optim *opt;
  bool lead; /* stage 0: runs the callbacks and validates */
} stage_run;

static int stage_epoch(stage_run *r, tr_loader *ld, const tr_fit_config *cfg,
                       const fit_batching *fb, const tr_lr_schedule *sched, int64_t *step,
                       double *mean_loss, nas_err *err) {
  double sum = 0, seen = 0;
  int64_t b;
  tr_tensor *x;
  int32_t *y;
  int rc = NAS_OK;
  while (rc == NAS_OK && (b = fit_next_batch(r->ctx, ld, cfg, *step, &x, &y)) > 0) {
    double loss = 0;
    /* every batch takes its step, one too small to split included: the schedule and
     * fit_begin's resumed step count per_epoch steps an epoch, as tr_fit does */
    tr_optim_set_lr(r->opt, tr_lr_at(sched, (*step)++));
    if (fit_batch_trains(fb, b)) {
      tr_optim_zero_grad(r->opt);
      micro_targets targets = {y, cfg->label_smoothing};
      rc = tr_pipe_train_step(r->ctx, r->pipe, x, b, micro_loss, &targets, &loss);
      if (rc == NAS_OK) rc = tr_optim_step(r->ctx, r->opt);
      if (rc != NAS_OK) rc = nas_errf(err, "training step: %s", r->ctx->err.msg);
      sum += loss * (double)b;
      seen += (double)b;
    }
    tr_release(x);
    free(y);
    if (rc == NAS_OK && r->lead && cfg->on_step) rc = cfg->on_step(cfg->arg, err);
  }
  if (rc == NAS_OK && b < 0) rc = nas_errf(err, "batches: %s", r->ctx->err.msg);
  *mean_loss = seen > 0 ? sum / seen : 0;
  return rc;
}

/* The stages' layers into stage 0's model, which validates and runs its callback. */
static int stage_validate(stage_run *r, tr_module *m, const tr_dataset *val,
                          const tr_fit_config *cfg, int epoch, double loss, double *accuracy,
                          nas_err *err) {
  if (tr_pipe_gather_model(r->ctx, r->pipe) != NAS_OK)
    return nas_errf(err, "gathering the stages: %s", r->ctx->err.msg);
  if (!r->lead) return NAS_OK;
  int rc = tr_evaluate_between(r->ctx, m, val, 0, cfg->on_step, cfg->arg, accuracy, err);
  if (rc == NAS_OK && cfg->on_epoch) rc = cfg->on_epoch(cfg->arg, epoch, loss, *accuracy, err);
  return rc;
}

int tr_fit_pipeline_stage(tr_ctx *ctx, tr_module *m, const tr_pipe_rank *rank,
                          const tr_pipe_config *pipe, const tr_dataset *train,
                          const tr_dataset *val, const tr_fit_config *cfg, double *accuracy,
                          nas_err *err) {
  if (train->n == 0) return nas_errf(err, "training: no examples");
  if (fit_batches_check(cfg, train, pipe->chunks, "micro-batches", err) != NAS_OK) return NAS_ERR;
  const fit_batching fb = fit_batching_of(m, cfg, train, pipe->chunks); /* before the cut */
  stage_run r = {ctx, tr_pipe_new(ctx, m, rank, pipe), NULL, rank->stage == 0};
  if (!r.pipe) return nas_errf(err, "cutting the model into stages: %s", ctx->err.msg);
  r.opt = tr_pipe_optim_new(ctx, r.pipe, &cfg->optim);
  tr_loader ld = {0};
  tr_lr_schedule sched;
  int64_t step = 0;
  tr_train_part part = {rank->stage, rank->stages, "stage"};
  /* a stage that fails here aborts the pipeline, which fails the others' first step */
  int rc = fit_begin(ctx, m, r.opt, train, cfg, &ld, &sched, &step, err);
  if (rc == NAS_OK) rc = fit_state_load(ctx, r.opt, cfg, &part, err);
  for (int epoch = cfg->first_epoch + 1; rc == NAS_OK && epoch <= fit_last_epoch(cfg); epoch++) {
    double loss = 0, acc = 0;
    rc = stage_epoch(&r, &ld, cfg, &fb, &sched, &step, &loss, err);
    if (rc == NAS_OK) rc = stage_validate(&r, m, val, cfg, epoch, loss, &acc, err);
    if (rc == NAS_OK && accuracy && r.lead) *accuracy = acc;
  }
  if (rc == NAS_OK) rc = fit_state_save(ctx, r.opt, cfg, &part, err);
  tr_loader_free(&ld);
  tr_optim_free(r.opt);
  tr_pipe_free(r.pipe);
  return rc;
}

int tr_fit_pipeline_balance(tr_ctx *ctx, tr_module *m, tr_fit_balance kind,
                            const tr_dataset *train, int64_t batch, int stages,
                            tr_pipe_config *pipe, nas_err *err) {
  memset(pipe->balance, 0, sizeof pipe->balance);
  if (kind == TR_FIT_BALANCE_COUNT) return NAS_OK;
  if (train->n == 0) return nas_errf(err, "balancing the stages: no training examples");
  tr_tensor *sample = tr_narrow(ctx, train->x, 0, 0, batch < train->n ? batch : train->n);
  /* measured where the stages run */
  if (sample && fit_move_to(ctx, &sample, fit_module_device(m)) != NAS_OK) sample = NULL;
  int rc = !sample ? NAS_ERR
           : kind == TR_FIT_BALANCE_SIZE
               ? tr_pipe_balance_by_size(ctx, m, sample, stages, pipe->balance)
               : tr_pipe_balance_by_time(ctx, m, sample, stages, 3, pipe->balance);
  tr_release(sample);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "balancing the stages: %s", ctx->err.msg);
}
