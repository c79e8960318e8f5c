/* builtin/fit.c: the training loop of built-in trials — cross-entropy (label smoothing
 * optional), an optimiser with a learning-rate schedule and warm-up, shuffled and optionally
 * augmented batches, validation after every epoch, resuming after a given epoch (with the
 * optimiser's and dropout's state from a training state file, exactly) — and accuracy;
 * and the same loop on one rank of several (tr_fit_sharded), the model sharded by FSDP,
 * each rank keeping its shards' training state in a file of its own.
 *
 * The loop is the one docs/engine.md shows, with every error checked. Evaluation runs in
 * evaluation mode without a graph, in slices (views) of the dataset, and puts the model
 * back in training mode. Only the API of trainer/trainer.h and trainer/dist.h is used.
 *
 * Ranks stay in lockstep: every rank draws the same global batches (same shuffle seed),
 * trains on its slice, and after every step all ranks add up [failed, failing ranks, loss
 * sum, examples] in one all-reduce, so a failure anywhere outside a collective (a callback,
 * the loader) stops every rank at the same step instead of leaving the others waiting; the
 * set-up (loader, optimiser, resumed state) is agreed the same way before the first step.
 * When one rank failed, a second all-reduce hands its message to the others. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "builtin/fit_internal.h"

/* Examples per forward pass when evaluating: big enough for GEMM, small enough for memory. */
enum { EVAL_BATCH = 500 };

int64_t tr_argmax(const float *values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(values[i])) return -1; /* compares false both ways: it would pick index 0 */
    if (values[i] > values[best]) best = i;
  }
  return best;
}

tr_device fit_module_device(tr_module *m) {
  tr_param_list params = {0};
  nas_err ignored;
  tr_device device = TR_DEVICE_CPU;
  if (tr_module_parameters(m, false, &params, &ignored) == NAS_OK && params.n > 0)
    device = tr_tensor_device(params.items[0]);
  tr_param_list_free(&params);
  return device;
}

int fit_move_to(tr_ctx *ctx, tr_tensor **t, tr_device device) {
  if (tr_tensor_device(*t).kind == device.kind) return NAS_OK;
  tr_tensor *moved = tr_to_device(ctx, *t, device);
  tr_release(*t);
  *t = moved;
  return moved ? NAS_OK : NAS_ERR;
}

/* Correct predictions among the rows of x (a slice of a dataset, on the CPU) with labels
 * y, by m on its device. */
static int count_correct(tr_ctx *ctx, tr_module *m, tr_tensor *x, const int32_t *y,
                         int64_t *correct, nas_err *err) {
  tr_tensor *input = tr_retain(x);
  tr_tensor *logits = fit_move_to(ctx, &input, fit_module_device(m)) == NAS_OK
                          ? tr_module_forward(ctx, m, input) : NULL;
  tr_release(input);
  if (logits && fit_move_to(ctx, &logits, TR_DEVICE_CPU) != NAS_OK) logits = NULL;
  tr_tensor *dense = logits ? tr_contiguous(ctx, logits) : NULL;
  tr_release(logits);
  if (!dense) return nas_errf(err, "evaluation: %s", ctx->err.msg);
  int64_t rows = dense->shape[0], classes = dense->numel / (rows ? rows : 1);
  for (int64_t r = 0; r < rows; r++)
    *correct += tr_argmax(tr_f32(dense) + r * classes, classes) == y[r];
  tr_release(dense);
  return NAS_OK;
}

int tr_evaluate(tr_ctx *ctx, tr_module *m, const tr_dataset *ds, int64_t batch,
                double *accuracy, nas_err *err) {
  return tr_evaluate_between(ctx, m, ds, batch, NULL, NULL, accuracy, err);
}

int tr_evaluate_between(tr_ctx *ctx, tr_module *m, const tr_dataset *ds, int64_t batch,
                        int (*between)(void *arg, nas_err *err), void *arg, double *accuracy,
                        nas_err *err) {
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
    tr_release(slice);
    if (rc == NAS_OK && between) rc = between(arg, err);
  }
  tr_set_grad_enabled(ctx, grad);
  tr_module_train(m, true);
  if (rc == NAS_OK) *accuracy = (double)correct / (double)ds->n;
  return rc;
}

/* One optimiser step on a batch; *loss gets its value. */
static int train_step(tr_ctx *ctx, tr_module *m, tr_optim *opt, tr_tensor *x, const int32_t *y,
                      const tr_fit_config *cfg, double *loss, nas_err *err) {
  tr_tensor *logits = tr_module_forward(ctx, m, x);
  tr_tensor *value = logits ? tr_cross_entropy_smooth(ctx, logits, y, cfg->label_smoothing) : NULL;
  int rc = value ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK) {
    *loss = tr_item(value);
    tr_optim_zero_grad(opt);
    rc = tr_backward(ctx, value, NULL, false);
  }
  if (rc == NAS_OK) rc = tr_optim_step(ctx, opt);
  tr_release(value);
  tr_release(logits);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "training step: %s", ctx->err.msg);
}

/* The schedule over all epochs' steps: the warm-up first (onecycle's rise, 30% of the
 * steps unless set), the schedule over the rest. */
static tr_lr_schedule schedule_for(const tr_fit_config *cfg, int64_t per_epoch) {
  int64_t total_steps = per_epoch * cfg->epochs;
  int64_t warmup = llround(cfg->warmup_epochs * (double)per_epoch);
  if (cfg->schedule == TR_LR_ONECYCLE && warmup == 0) warmup = llround(0.3 * (double)total_steps);
  if (warmup > total_steps) warmup = total_steps;
  tr_lr_schedule s = {.kind = cfg->schedule, .base_lr = cfg->optim.lr, .warmup = warmup,
                      .total = total_steps - warmup};
  if (cfg->schedule == TR_LR_STEP) {
    s.step_size = (s.total + 2) / 3;
    s.gamma = 0.1;
  }
  return s;
}

int fit_last_epoch(const tr_fit_config *cfg) {
  return cfg->stop_epoch > 0 && cfg->stop_epoch < cfg->epochs ? cfg->stop_epoch : cfg->epochs;
}

/* What both fits set up once they made their optimiser (opt NULL: it failed, and ctx says
 * why): the shuffled loader of train, the schedule over every epoch's steps, and m in
 * training mode; a resumed run's loader and *step where the first_epoch epochs left them. */
int fit_begin(tr_ctx *ctx, tr_module *m, const tr_optim *opt, const tr_dataset *train,
              const tr_fit_config *cfg, tr_loader *ld, tr_lr_schedule *sched, int64_t *step,
              nas_err *err) {
  if (cfg->batch_size < 1)
    return nas_errf(err, "training: batch_size %lld (at least 1)", (long long)cfg->batch_size);
  int64_t per_epoch = (train->n + cfg->batch_size - 1) / cfg->batch_size;
  *sched = schedule_for(cfg, per_epoch);
  *step = per_epoch * cfg->first_epoch;
  tr_module_train(m, true);
  if (!opt) return nas_errf(err, "optimiser: %s", ctx->err.msg);
  if (cfg->first_epoch < 0 || cfg->first_epoch > cfg->epochs)
    return nas_errf(err, "training: resuming after epoch %d of %d", cfg->first_epoch, cfg->epochs);
  int rc = tr_loader_init(ld, train, cfg->batch_size, true, cfg->shuffle_seed, err);
  if (rc == NAS_OK) tr_loader_skip_epochs(ld, cfg->first_epoch);
  return rc;
}

/* Whether m keeps buffers besides its parameters: only batch norm's running statistics are. */
static bool has_batch_norm(tr_module *m) {
  tr_param_list params = {0}, with_buffers = {0};
  nas_err ignored;
  bool more = tr_module_parameters(m, false, &params, &ignored) == NAS_OK &&
              tr_module_parameters(m, true, &with_buffers, &ignored) == NAS_OK &&
              with_buffers.n > params.n;
  tr_param_list_free(&params);
  tr_param_list_free(&with_buffers);
  return more;
}

fit_batching fit_batching_of(tr_module *m, const tr_fit_config *cfg, const tr_dataset *train,
                             int64_t parts) {
  int64_t full = cfg->batch_size < train->n ? cfg->batch_size : train->n;
  return (fit_batching){parts, full / parts, has_batch_norm(m)};
}

bool fit_batch_trains(const fit_batching *fb, int64_t b) {
  int64_t share = b / fb->parts;
  return share > 1 || (share == 1 && !(fb->batch_norm && fb->full_share > 1));
}

int fit_batches_check(const tr_fit_config *cfg, const tr_dataset *train, int64_t least,
                      const char *what, nas_err *err) {
  if (cfg->batch_size < least)
    return nas_errf(err, "training: batch_size %lld is smaller than the %lld %s: every batch "
                    "would be skipped and nothing trained", (long long)cfg->batch_size,
                    (long long)least, what);
  if (train->n < least)
    return nas_errf(err, "training: %lld training examples are fewer than the %lld %s: every "
                    "batch would be skipped and nothing trained", (long long)train->n,
                    (long long)least, what);
  return NAS_OK;
}

char *tr_fit_state_path(const char *base, const char *unit, int index, int count) {
  if (count <= 1) return nas_asprintf("%s", base);
  const char *slash = strrchr(base, '/'), *dot = strrchr(base, '.');
  int stem = (int)(dot && (!slash || dot > slash) ? dot - base : (ptrdiff_t)strlen(base));
  return nas_asprintf("%.*s.%s%d%s", stem, base, unit, index, base + stem);
}

/* tr_train_state_load or _save. */
typedef int (*state_file_fn)(tr_ctx *ctx, tr_optim *opt, const tr_train_part *part,
                             const char *path, nas_err *err);

/* io on part's file of base (none: nothing to do); errors prefixed with `doing`. */
static int state_file_io(tr_ctx *ctx, tr_optim *opt, const char *base, const tr_train_part *part,
                         state_file_fn io, const char *doing, nas_err *err) {
  if (!base) return NAS_OK;
  char *path = tr_fit_state_path(base, part->unit, part->index, part->count);
  int rc = path ? io(ctx, opt, part, path, err) : nas_errf(err, "out of memory");
  free(path);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "%s", doing);
}

int fit_state_load(tr_ctx *ctx, tr_optim *opt, const tr_fit_config *cfg,
                   const tr_train_part *part, nas_err *err) {
  return state_file_io(ctx, opt, cfg->state_in, part, tr_train_state_load,
                       "resuming the training state", err);
}

int fit_state_save(tr_ctx *ctx, tr_optim *opt, const tr_fit_config *cfg,
                   const tr_train_part *part, nas_err *err) {
  return state_file_io(ctx, opt, cfg->state_out, part, tr_train_state_save,
                       "saving the training state", err);
}

/* The next training batch (tr_loader_next's contract), augmented as cfg says with a seed
 * of the step, so a resumed run draws what an uninterrupted one would. */
int64_t fit_next_batch(tr_ctx *ctx, tr_loader *ld, const tr_fit_config *cfg, int64_t step,
                       tr_tensor **x, int32_t **y) {
  int64_t b = tr_loader_next(ctx, ld, x, y);
  if (b <= 0 || !tr_augment_active(&cfg->augment)) return b;
  uint64_t seed = (cfg->shuffle_seed ^ 0x5bd1e995u) + (uint64_t)step * 0x9e3779b97f4a7c15ULL;
  if (tr_augment_batch(*x, &cfg->augment, seed, &ctx->err) == NAS_OK) return b;
  tr_release(*x);
  free(*y);
  *x = NULL;
  *y = NULL;
  return NAS_ERR;
}

/* One pass over the training data; *mean_loss gets the loss averaged over examples. */
static int train_epoch(tr_ctx *ctx, tr_module *m, tr_optim *opt, tr_loader *ld,
                       const tr_fit_config *cfg, const fit_batching *fb,
                       const tr_lr_schedule *sched, int64_t *step, double *mean_loss,
                       nas_err *err) {
  double sum = 0;
  int64_t seen = 0, b;
  tr_tensor *x;
  int32_t *y;
  int rc = NAS_OK;
  while (rc == NAS_OK && (b = fit_next_batch(ctx, ld, cfg, *step, &x, &y)) > 0) {
    double loss = 0;
    bool trains = fit_batch_trains(fb, b);
    tr_optim_set_lr(opt, tr_lr_at(sched, (*step)++));
    if (trains && fit_move_to(ctx, &x, cfg->device) != NAS_OK)
      rc = nas_errf(err, "batch to the device: %s", ctx->err.msg);
    if (trains && rc == NAS_OK) rc = train_step(ctx, m, opt, x, y, cfg, &loss, err);
    tr_release(x);
    free(y);
    sum += trains ? loss * (double)b : 0;
    seen += trains ? b : 0;
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
  tr_lr_schedule sched;
  int64_t step = 0;
  const tr_train_part whole = {0, 1, "part"};
  const fit_batching fb = fit_batching_of(m, cfg, train, 1);
  int rc = fit_begin(ctx, m, opt, train, cfg, &ld, &sched, &step, err);
  if (rc == NAS_OK) rc = fit_state_load(ctx, opt, cfg, &whole, err);
  for (int epoch = cfg->first_epoch + 1; rc == NAS_OK && epoch <= fit_last_epoch(cfg); epoch++) {
    double loss = 0, acc = 0;
    rc = train_epoch(ctx, m, opt, &ld, cfg, &fb, &sched, &step, &loss, err);
    if (rc == NAS_OK)
      rc = tr_evaluate_between(ctx, m, val, EVAL_BATCH, cfg->on_step, cfg->arg, &acc, err);
    if (rc == NAS_OK && accuracy) *accuracy = acc;
    if (rc == NAS_OK && cfg->on_epoch) rc = cfg->on_epoch(cfg->arg, epoch, loss, acc, err);
  }
  if (rc == NAS_OK) rc = fit_state_save(ctx, opt, cfg, &whole, err);
  tr_loader_free(&ld);
  tr_optim_free(opt);
  tr_param_list_free(&params);
  return rc;
}

/* ---------------------------------------------------------------- on one rank of several */

/* One rank's training state. */
typedef struct {
  tr_ctx *ctx;
  tr_module *model;
  tr_fsdp *fsdp;
  tr_optim *opt;
  tr_comm *comm;
  bool lead; /* rank 0: runs the callbacks and evaluates */
  double label_smoothing;
  fit_batching batching; /* parts: the ranks */
} rank_run;

/* sums[0] and sums[1] of every ranks_agree call are its own: the ranks that failed, and
 * the sum of their numbers + 1 (which is the failing rank's number + 1 when one failed). */
enum { AGREE_SLOTS = 2, AGREE_REASON_MAX = 200 };

/* The failing rank's message (own_rc and err on that rank, NULL elsewhere) into reason on
 * every rank: its bytes travel as float64s, added up with zeros from the other ranks. Only
 * called once a failure was agreed, so a step that fails nowhere costs nothing more. */
static int reason_share(rank_run *r, const nas_err *own_err, char reason[AGREE_REASON_MAX]) {
  double bytes[AGREE_REASON_MAX] = {0};
  for (int i = 0; own_err && i < AGREE_REASON_MAX - 1 && own_err->msg[i]; i++)
    bytes[i] = (unsigned char)own_err->msg[i];
  if (tr_fsdp_all_reduce_host(r->ctx, r->fsdp, bytes, AGREE_REASON_MAX, TR_REDUCE_SUM) != NAS_OK)
    return NAS_ERR;
  for (int i = 0; i < AGREE_REASON_MAX; i++) reason[i] = (char)bytes[i];
  reason[AGREE_REASON_MAX - 1] = '\0';
  return NAS_OK;
}

/* Adds up sums (n values, the first AGREE_SLOTS this call's own) over the ranks in place;
 * a rank that failed (own_rc) counts in them. Returns NAS_ERR when any rank failed, with
 * err naming it and, when it failed alone, saying its reason; own_rc's message is kept
 * when this rank is the one. Every rank calls it whether or not its own part worked, so
 * none is left waiting in a later collective for a rank that gave up. */
static int ranks_agree(rank_run *r, int own_rc, double *sums, int64_t n, nas_err *err) {
  sums[0] = own_rc != NAS_OK;
  sums[1] = own_rc != NAS_OK ? tr_comm_rank(r->comm) + 1 : 0;
  /* through FSDP: on a GPU the sums travel via device memory, which is all NCCL moves */
  if (tr_fsdp_all_reduce_host(r->ctx, r->fsdp, sums, n, TR_REDUCE_SUM) != NAS_OK)
    return own_rc != NAS_OK ? own_rc : nas_errf(err, "%s", r->ctx->err.msg);
  if (sums[0] == 0) return NAS_OK;
  char reason[AGREE_REASON_MAX] = "";
  if (sums[0] == 1 && reason_share(r, own_rc != NAS_OK ? err : NULL, reason) != NAS_OK &&
      own_rc == NAS_OK)
    return nas_errf(err, "stopped: rank %g failed (%s)", sums[1] - 1, r->ctx->err.msg);
  if (own_rc != NAS_OK) return own_rc;
  if (sums[0] > 1) return nas_errf(err, "stopped: %g other ranks failed", sums[0]);
  return nas_errf(err, "stopped: rank %g failed: %s", sums[1] - 1, reason);
}

/* One step on this rank's slice of the global batch x (b examples) with labels y. */
static int rank_step(rank_run *r, tr_tensor *x, const int32_t *y, int64_t b, double *loss,
                     int64_t *count, nas_err *err) {
  int64_t start;
  if (tr_fsdp_batch_slice(r->fsdp, b, &start, count, err) != NAS_OK) return NAS_ERR;
  tr_tensor *slice = tr_narrow(r->ctx, x, 0, start, *count);
  tr_tensor *logits = slice ? tr_fsdp_forward(r->ctx, r->fsdp, slice) : NULL;
  tr_tensor *value =
      logits ? tr_cross_entropy_smooth(r->ctx, logits, y + start, r->label_smoothing) : NULL;
  int rc = value ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK) {
    *loss = tr_item(value);
    tr_optim_zero_grad(r->opt);
    rc = tr_fsdp_backward(r->ctx, r->fsdp, value);
  }
  if (rc == NAS_OK) rc = tr_optim_step(r->ctx, r->opt);
  tr_release(value);
  tr_release(logits);
  tr_release(slice);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "training step: %s", r->ctx->err.msg);
}

/* One pass over the data. A batch is cut to a multiple of the world size (the last batch
 * of an epoch may lose up to world - 1 examples); one smaller than the world is skipped. */
static int rank_epoch(rank_run *r, tr_loader *ld, const tr_fit_config *cfg,
                      const tr_lr_schedule *sched, int64_t *step, double *mean_loss,
                      nas_err *err) {
  int64_t world = tr_comm_world(r->comm), b;
  double seen = 0, loss_sum = 0;
  tr_tensor *x;
  int32_t *y;
  int rc = NAS_OK;
  while (rc == NAS_OK && (b = fit_next_batch(r->ctx, ld, cfg, *step, &x, &y)) > 0) {
    int64_t usable = b - b % world, count = 0;
    double loss = 0;
    tr_optim_set_lr(r->opt, tr_lr_at(sched, (*step)++));
    int own = fit_move_to(r->ctx, &x, cfg->device) == NAS_OK
                  ? NAS_OK : nas_errf(err, "batch to the device: %s", r->ctx->err.msg);
    if (own == NAS_OK && fit_batch_trains(&r->batching, b))
      own = rank_step(r, x, y, usable, &loss, &count, err);
    if (own == NAS_OK && r->lead && cfg->on_step) own = cfg->on_step(cfg->arg, err);
    double sums[AGREE_SLOTS + 2] = {0, 0, loss * (double)count, (double)count};
    rc = ranks_agree(r, own, sums, AGREE_SLOTS + 2, err);
    loss_sum += sums[AGREE_SLOTS];
    seen += sums[AGREE_SLOTS + 1];
    tr_release(x);
    free(y);
  }
  if (rc == NAS_OK && b < 0) rc = nas_errf(err, "batches: %s", r->ctx->err.msg);
  *mean_loss = seen > 0 ? loss_sum / seen : 0;
  return rc;
}

/* Validation on rank 0 with the full parameters gathered, then its callback. */
static int rank_validate(rank_run *r, const tr_dataset *val, const tr_fit_config *cfg, int epoch,
                         double loss, double *accuracy, nas_err *err) {
  int own = tr_fsdp_summon_full(r->ctx, r->fsdp);
  if (own != NAS_OK) return nas_errf(err, "gathering the parameters: %s", r->ctx->err.msg);
  if (r->lead)
    own = tr_evaluate_between(r->ctx, r->model, val, EVAL_BATCH, cfg->on_step, cfg->arg, accuracy,
                              err);
  if (own == NAS_OK && tr_fsdp_release_full(r->ctx, r->fsdp) != NAS_OK)
    own = nas_errf(err, "releasing the parameters: %s", r->ctx->err.msg);
  if (own == NAS_OK && r->lead && cfg->on_epoch)
    own = cfg->on_epoch(cfg->arg, epoch, loss, *accuracy, err);
  double sums[AGREE_SLOTS];
  return ranks_agree(r, own, sums, AGREE_SLOTS, err);
}

int tr_fit_sharded(tr_ctx *ctx, tr_module *m, const tr_fit_ranks *ranks, const tr_dataset *train,
                   const tr_dataset *val, const tr_fit_config *cfg, double *accuracy,
                   nas_err *err) {
  if (train->n == 0) return nas_errf(err, "training: no examples");
  /* before any collective: every rank refuses alike */
  if (fit_batches_check(cfg, train, tr_comm_world(ranks->comm), "ranks", err) != NAS_OK)
    return NAS_ERR;
  rank_run r = {ctx, m, NULL, NULL, ranks->comm, tr_comm_rank(ranks->comm) == 0,
                cfg->label_smoothing, fit_batching_of(m, cfg, train, tr_comm_world(ranks->comm))};
  tr_fsdp_config fc = ranks->fsdp;
  fc.prefetch = fc.prefetch && ranks->prefetch_comm && cfg->device.kind != TR_CUDA;
  if (!(r.fsdp = tr_fsdp_new(ctx, m, ranks->comm, ranks->prefetch_comm, &fc)))
    return nas_errf(err, "sharding the model: %s", ctx->err.msg);
  r.opt = tr_fsdp_optim_new(ctx, r.fsdp, &cfg->optim);
  tr_loader ld = {0};
  tr_lr_schedule sched;
  int64_t step = 0;
  /* each rank its shards' state, in a file of its own: no rank holds more than its shards */
  tr_train_part part = {tr_comm_rank(ranks->comm), tr_comm_world(ranks->comm), "rank"};
  double agreed[AGREE_SLOTS];
  int rc = fit_begin(ctx, m, r.opt, train, cfg, &ld, &sched, &step, err);
  if (rc == NAS_OK) rc = fit_state_load(ctx, r.opt, cfg, &part, err);
  /* set-up agreed before the first step: a rank whose set-up failed would otherwise leave
   * the others in the step's first collective, up to TR_COMM_TIMEOUT_S over NCCL, which
   * does not notice a rank that is gone */
  rc = ranks_agree(&r, rc, agreed, AGREE_SLOTS, err);
  for (int epoch = cfg->first_epoch + 1; rc == NAS_OK && epoch <= fit_last_epoch(cfg); epoch++) {
    double loss = 0, acc = 0;
    rc = rank_epoch(&r, &ld, cfg, &sched, &step, &loss, err);
    if (rc == NAS_OK) rc = rank_validate(&r, val, cfg, epoch, loss, &acc, err);
    if (rc == NAS_OK && accuracy) *accuracy = acc;
  }
  if (rc == NAS_OK && cfg->state_out)
    rc = ranks_agree(&r, fit_state_save(ctx, r.opt, cfg, &part, err), agreed, AGREE_SLOTS, err);
  /* Every rank leaves with the whole model in m's own tensors. */
  if (rc == NAS_OK && tr_fsdp_summon_full(ctx, r.fsdp) != NAS_OK)
    rc = nas_errf(err, "gathering the parameters: %s", ctx->err.msg);
  tr_loader_free(&ld);
  tr_optim_free(r.opt);
  tr_fsdp_free(r.fsdp);
  return rc;
}
