/* builtin/fit_internal.h: what the training loops of builtin/ share beyond builtin.h: the
 * set-up every fit does once it has its optimiser (fit.c; the pipelined loop in
 * fit_pipeline.c uses it too). */
#ifndef NAS_BUILTIN_FIT_INTERNAL_H
#define NAS_BUILTIN_FIT_INTERNAL_H

#include "builtin/builtin.h"

/* The shuffled loader of train, the schedule over every epoch's steps, and m in training
 * mode (a batch_size below 1 is refused); opt NULL means making the optimiser failed, and
 * ctx says why. A resumed run (cfg->first_epoch > 0) gets its loader and *step where those
 * epochs left them. */
int fit_begin(tr_ctx *ctx, tr_module *m, const tr_optim *opt, const tr_dataset *train,
              const tr_fit_config *cfg, tr_loader *ld, tr_lr_schedule *sched, int64_t *step,
              nas_err *err);
/* The next training batch (tr_loader_next's contract), augmented as cfg says with a seed
 * of the step, so a resumed run draws what an uninterrupted one would. */
int64_t fit_next_batch(tr_ctx *ctx, tr_loader *ld, const tr_fit_config *cfg, int64_t step,
                       tr_tensor **x, int32_t **y);
/* The device m's parameters are on (the CPU for a model without any). */
tr_device fit_module_device(tr_module *m);
/* *t moved to device (a CPU tensor stays as it is); NAS_ERR with ctx->err set. */
int fit_move_to(tr_ctx *ctx, tr_tensor **t, tr_device device);

/* Which batches a fit trains. It cuts each batch into `parts` shares (a sharded fit's
 * ranks, a pipelined one's micro-batches; 1 for tr_fit) and skips a batch that leaves a
 * share empty. A model with batch norm also skips one that leaves a share a single example
 * where a full batch gives each more: batch norm cannot normalise one example (PyTorch
 * refuses it too), and the last batch of an epoch can come out that small. Its step of the
 * schedule passes all the same, so a resumed run continues exactly. */
typedef struct {
  int64_t parts;
  int64_t full_share; /* a full batch's share: of the batch size, or of all examples when fewer */
  bool batch_norm;
} fit_batching;

/* m's batching (before it is sharded or cut: every rank or stage gets the same answer). */
fit_batching fit_batching_of(tr_module *m, const tr_fit_config *cfg, const tr_dataset *train,
                             int64_t parts);
/* Whether a batch of b examples trains. */
bool fit_batch_trains(const fit_batching *fb, int64_t b);
/* A fit that trains only on batches of at least `least` examples (a sharded batch: one
 * per rank; a pipelined one: one per micro-batch, `what` says which) refuses, saying why,
 * when the batch size or the training examples are fewer: every batch would be skipped
 * and the fit would end on its initial weights as if it had trained. */
int fit_batches_check(const tr_fit_config *cfg, const tr_dataset *train, int64_t least,
                      const char *what, nas_err *err);
/* The last epoch a fit trains: cfg->epochs, or stop_epoch when it stops earlier. */
int fit_last_epoch(const tr_fit_config *cfg);
/* part's training state (cfg->state_in, at tr_fit_state_path's name for the part) into
 * opt and ctx; nothing to do without state_in. Errors say what was being done. */
int fit_state_load(tr_ctx *ctx, tr_optim *opt, const tr_fit_config *cfg,
                   const tr_train_part *part, nas_err *err);
/* opt's and ctx's state as part's training state (cfg->state_out); nothing without one. */
int fit_state_save(tr_ctx *ctx, tr_optim *opt, const tr_fit_config *cfg,
                   const tr_train_part *part, nas_err *err);

#endif
