/* cli/worker.h: the parts of `nas worker` (cli/worker.c) that turn a built-in trial's
 * settings into what the engine trains (cli/worker_setup.c). Internal to cli/. */
#ifndef NAS_CLI_WORKER_H
#define NAS_CLI_WORKER_H

#include <jansson.h>

#include "spec/spec.h"
#include "trainer/data_cache.h"
#include "trainer/trainer.h"

/* Everything a built-in trial's settings decide (spec_builtin_settings). */
typedef struct {
  bool cnn;              /* the model family: CNN, else MLP */
  tr_mlp_config mlp;
  tr_cnn_config cnn_cfg;
  tr_fit_config fit;     /* callbacks and shuffle seed left to the caller */
  double validation;     /* share of the training data held out */
  int64_t limit_train, limit_val; /* 0: all */
  int threads;           /* for training; latency is measured on one */
  tr_device_kind device; /* where training runs */
  int devices;           /* ranks one model is trained across (docs/spec.md) */
  tr_fsdp_config fsdp;   /* how, when devices > 1 */
  bool data_cache;       /* map the prepared data from the dataset cache (cli/worker_data.c) */
} worker_plan;

/* Reads the complete settings object of a trial into plan. */
int worker_plan_read(const json_t *settings, const char *model, worker_plan *plan, nas_err *err);

/* A dataset ready for training: the training part split into train and validation,
 * subsets kept, all parts standardised by the training part. */
typedef struct {
  tr_named_dataset all; /* all.train: the training part (after the split); all.test: the
                           test part, when the dataset has one */
  tr_dataset val;
  float background;     /* the smallest standardised training value: what crops pad with */
  tr_data_cache *cache; /* owned: the mapping the features lie on; NULL when read directly */
  char origin[400];     /* where the data came from, for the trial's log */
} worker_data;

/* Finds the dataset, then maps it prepared from the cache (plan->data_cache; a cache that
 * cannot be used falls back to reading, saying why in origin) or reads and prepares it. */
int worker_data_load(tr_ctx *ctx, const char *dataset, const worker_plan *plan,
                     uint64_t split_seed, worker_data *out, nas_err *err);
void worker_data_free(worker_data *d);
/* Reads and prepares the dataset at path (a file or folder tr_named_dataset_find gave). */
int worker_data_read(tr_ctx *ctx, const char *path, const worker_plan *plan, uint64_t split_seed,
                     worker_data *out, nas_err *err);
/* The same, through the dataset cache (cli/worker_data.c). */
int worker_data_cached(tr_ctx *ctx, const char *path, const worker_plan *plan,
                       uint64_t split_seed, worker_data *out, nas_err *err);

/* Checks, in the process about to launch a spec's built-in trials on this machine (the
 * local runner), what would fail every one of them: a dataset that is not where `nas
 * worker` looks (trial.env's NAS_DATA_DIR counts, as in the trials), or device: cuda
 * without a CUDA device. Command trials and other runners (whose trials run elsewhere)
 * pass. The error says what is missing and what to do. */
int worker_builtin_check(const spec *s, nas_err *err);

/* Builds the plan's model for the data's example shape and class count. */
int worker_model_build(tr_ctx *ctx, const worker_plan *plan, const worker_data *data,
                       tr_model *out, nas_err *err);

#endif
