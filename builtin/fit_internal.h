/* builtin/fit_internal.h: what the training loops of builtin/ share beyond builtin.h: the
 * set-up every fit does once it has its optimiser (fit.c; the pipelined loop in
 * fit_pipeline.c uses it too). */
#ifndef NAS_BUILTIN_FIT_INTERNAL_H
#define NAS_BUILTIN_FIT_INTERNAL_H

#include "builtin/builtin.h"

/* The shuffled loader of train, the schedule over every epoch's steps, and m in training
 * mode; opt NULL means making the optimiser failed, and ctx says why. */
int fit_begin(tr_ctx *ctx, tr_module *m, const tr_optim *opt, const tr_dataset *train,
              const tr_fit_config *cfg, tr_loader *ld, tr_lr_schedule *sched, nas_err *err);

#endif
