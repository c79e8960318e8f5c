/* builtin/builtin.h: the built-in trials of `nas worker` (docs/spec.md), on the engine of
 * trainer/: the model families (models.c), datasets by name (datasets.c), the training
 * loop with per-epoch validation, on one rank or sharded over several (fit.c), and a
 * trial's settings turned into all of these (worker_setup.c). They use only the public
 * API of trainer/: trainer.h, dist.h, pipeline.h and nn/data_cache.h (the dataset cache,
 * worker_data.c). */
#ifndef NAS_BUILTIN_H
#define NAS_BUILTIN_H

#include <jansson.h>

#include "spec/spec.h"
#include "trainer/nn/data_cache.h"
#include "trainer/dist.h"
#include "trainer/pipeline.h"
#include "trainer/trainer.h"

/* ================================================================ models, datasets, fit */

#define TR_MAX_BLOCKS 8 /* hidden layers of an MLP, stages of a CNN, ResNet or MobileNet */

typedef enum { TR_NORM_NONE, TR_NORM_BATCH, TR_NORM_LAYER } tr_norm_kind;

/* Flatten, then per hidden layer i: Linear(widths[i]) → norm → activation → dropout (when
 * dropout > 0), then Linear(classes). */
typedef struct {
  int layers;                     /* 1..TR_MAX_BLOCKS */
  int64_t widths[TR_MAX_BLOCKS];
  tr_module_kind activation;      /* TR_RELU, TR_GELU, TR_TANH or TR_SIGMOID */
  tr_norm_kind norm;
  double dropout;
} tr_mlp_config;

/* Per stage i: Conv2d(channels[i], kernel, stride 1, padding kernel/2; no bias under
 * batch norm) → batch norm → activation → pool 2×2 (skipped once the map is 1 pixel
 * high or wide); then Flatten → dropout → [Linear(head_width) → activation → dropout]
 * (when head_width > 0) → Linear(classes). Dropout modules only when dropout > 0. */
typedef struct {
  int stages;                     /* 1..TR_MAX_BLOCKS */
  int64_t channels[TR_MAX_BLOCKS];
  int kernel;
  tr_module_kind pool;            /* TR_MAXPOOL2D or TR_AVGPOOL2D */
  int64_t head_width;
  tr_module_kind activation;
  tr_norm_kind norm;              /* TR_NORM_NONE or TR_NORM_BATCH */
  double dropout;
} tr_cnn_config;

/* Stem: Conv2d(channels[0], 3×3) → batch norm → ReLU. Stage i: blocks[i] basic blocks of
 * channels[i], the first of stage i > 0 with stride 2. A basic block: two 3×3 convolutions
 * (the first with the block's stride), each followed by batch norm, a ReLU between them;
 * plus the shortcut: the identity, or a 1×1 convolution with the stride and batch norm
 * when the shape changes; then a ReLU. Then global average pooling → dropout (when > 0)
 * → Linear(classes). Convolutions have no bias (batch norm follows each). */
typedef struct {
  int stages;                     /* 1..TR_MAX_BLOCKS */
  int blocks[TR_MAX_BLOCKS];      /* 1.. per stage */
  int64_t channels[TR_MAX_BLOCKS];
  double dropout;
} tr_resnet_config;

/* Stem: Conv2d(channels[0], 3×3) → batch norm → activation. Stage i: blocks[i] inverted
 * residual blocks of channels[i] output channels, the first of stage i > 0 with stride 2.
 * An inverted residual block from C to O channels with expansion e, kernel k and stride s:
 * [1×1 conv to E = C·e → BN → act] (when e > 1) → depthwise k×k conv, stride s → BN → act
 * → [squeeze-and-excitation: GAP → Linear(E, max(1, E/4)) → ReLU → Linear(E) →
 * hard-sigmoid, scaling each of the E maps] (when se) → 1×1 conv to O → BN; plus x when
 * s = 1 and C = O. Then global average pooling → dropout (when > 0) → Linear(classes). */
typedef struct {
  int stages;                     /* 1..TR_MAX_BLOCKS */
  int blocks[TR_MAX_BLOCKS];      /* 1.. per stage */
  int64_t channels[TR_MAX_BLOCKS];
  int expansion[TR_MAX_BLOCKS];   /* 1.. */
  int kernel[TR_MAX_BLOCKS];      /* odd */
  bool se[TR_MAX_BLOCKS];
  tr_module_kind activation;      /* TR_RELU or TR_HARDSWISH */
  double dropout;
} tr_mobilenet_config;

/* One example's shape (channels, height, width); an MLP sees the product. */
typedef struct {
  int64_t channels, height, width;
} tr_input_shape;

/* A built model and what was counted while building it. */
typedef struct {
  tr_module *module; /* owned */
  int64_t params;    /* trainable values (tr_module_param_count) */
  int64_t buffers;   /* other values saved with it: batch norm's running statistics */
  int64_t flops;     /* one example's forward pass: 2 per multiply-add of the linear and
                        convolution layers plus one per bias add; norms, activations,
                        pools and dropout count 0 (docs/metrics.md) */
} tr_model;

int tr_mlp_build(tr_ctx *ctx, const tr_mlp_config *cfg, tr_input_shape in, int32_t classes,
                 tr_model *out);
int tr_cnn_build(tr_ctx *ctx, const tr_cnn_config *cfg, tr_input_shape in, int32_t classes,
                 tr_model *out);
int tr_resnet_build(tr_ctx *ctx, const tr_resnet_config *cfg, tr_input_shape in,
                    int32_t classes, tr_model *out);
int tr_mobilenet_build(tr_ctx *ctx, const tr_mobilenet_config *cfg, tr_input_shape in,
                       int32_t classes, tr_model *out);
void tr_model_free(tr_model *m);

/* A dataset as images (n, C, H, W) with a training part and, when the source has one, a
 * test part (test.n == 0 otherwise). */
typedef struct {
  tr_dataset train, test;
  tr_input_shape shape;
  char *source; /* owned: the file or folder it came from */
} tr_named_dataset;

/* Loads `name`: "digits" (scikit-learn's 8×8 digits, digits.csv.gz), "fashion-mnist"
 * (Debian's dataset-fashion-mnist) or a path: a folder of IDX files
 * (train-images-idx3-ubyte, train-labels-idx1-ubyte, optionally t10k-… of images of the
 * same shape; each may end in .gz) or a CSV file (label last; k² features read as a 1×k×k
 * image, others as k×1×1). Named datasets are looked for in the folders dirs
 * (NULL-terminated): digits.csv.gz in each, or a fashion-mnist/ folder in each. Training
 * examples of one label only are refused. */
int tr_named_dataset_load(tr_ctx *ctx, const char *name, const char *const *dirs,
                          tr_named_dataset *out, nas_err *err);
/* Where tr_named_dataset_load would read `name` from, without reading it: *path (owned) is
 * the file or folder found. When there is none, an error saying where it looked and how to
 * get the dataset (the same error the load gives). */
int tr_named_dataset_find(const char *name, const char *const *dirs, char **path, nas_err *err);
void tr_named_dataset_free(tr_named_dataset *nd);
/* Whether examples of this shape are images (flips and crops apply): more than one pixel
 * high or wide. A CSV file whose feature count is not a square is not (k×1×1). */
bool tr_input_is_image(tr_input_shape s);
/* Whether the dataset at path (tr_named_dataset_find's) holds images, from its kind and a
 * CSV file's first line alone, without loading it. */
int tr_named_dataset_holds_images(const char *path, bool *images, nas_err *err);
/* Keeps the first n examples of ds (all when n is 0 or at least ds->n). */
int tr_dataset_truncate(tr_ctx *ctx, tr_dataset *ds, int64_t n, nas_err *err);
/* What tr_standardize did: x became (x - mean) / std. */
typedef struct {
  double mean, std;
} tr_standardization;
/* One mean and one standard deviation over every value of ref; each dataset in sets
 * (count n) becomes (x - mean) / std in place, and *done (may be NULL) gets the pair, which
 * new inputs need too. One pair for all features, so a pixel that is constant in ref
 * cannot blow up in another split. */
int tr_standardize(const tr_dataset *ref, tr_dataset *const *sets, size_t n,
                   tr_standardization *done, nas_err *err);

/* What tr_fit does; callbacks may be NULL. A callback that returns non-zero stops
 * training with that return (its message in err). */
typedef struct {
  int epochs;
  int64_t batch_size;
  tr_optim_config optim;
  tr_lr_kind schedule;       /* constant; cosine: to 0 over all steps; step: ×0.1 after each
                                third of the steps; onecycle (all after the warm-up) */
  uint64_t shuffle_seed;     /* batch order, and the augmentation's draws */
  /* The recipe (docs/spec.md, "Training recipe"): */
  double warmup_epochs;      /* linear warm-up over this many epochs (fractions too); for
                                onecycle the rise (0: 30% of the steps, as PyTorch) */
  double label_smoothing;    /* tr_cross_entropy_smooth's smoothing */
  tr_augment_config augment; /* applied to every training batch */
  /* Epochs as the budget: the run trains epochs first_epoch + 1 … epochs, as the last part
   * of a run of `epochs` epochs from weights saved after first_epoch (the learning rate,
   * batch order and augmentation continue where that run was; with state_in the optimiser
   * and dropout too, so it ends exactly as that run would have). */
  int first_epoch;
  int stop_epoch;            /* 0: train to `epochs`; else stop after this epoch (a rung of
                                multi-fidelity: the schedule still spans `epochs`) */
  /* Training state files (tr_train_state_save): tr_fit's is the file named; a sharded
   * rank or a pipeline stage keeps its own part of the state in the file
   * tr_fit_state_path names, and resumes only on as many ranks or stages as saved it. */
  const char *state_in;      /* loaded before the first step: the state a run saved after
                                first_epoch; NULL: the optimiser starts afresh */
  const char *state_out;     /* saved after the last epoch this call trains; NULL: not kept */
  tr_device device;          /* where the model is (zero: the CPU); batches are moved there */
  /* After every epoch (1-based) with the mean training loss and validation accuracy. */
  int (*on_epoch)(void *arg, int epoch, double train_loss, double val_accuracy, nas_err *err);
  /* After every training step and every slice of a validation pass (a pass over many
   * examples can take minutes): for heartbeats. */
  int (*on_step)(void *arg, nas_err *err);
  void *arg;
} tr_fit_config;

/* Trains m on train with cross-entropy, evaluating on val after every epoch; *accuracy
 * (may be NULL) gets the last validation accuracy. A model with batch norm skips a last
 * batch of one example when full batches hold more (batch norm cannot normalise one; the
 * sharded and pipelined fits skip one that leaves a rank or micro-batch one alike). */
int tr_fit(tr_ctx *ctx, tr_module *m, const tr_dataset *train, const tr_dataset *val,
           const tr_fit_config *cfg, double *accuracy, nas_err *err);
/* The training state file of part `index` of `count` (unit "rank": a sharded rank;
 * "stage": a pipeline stage) for the file named base: base itself when count is 1, else
 * base with ".<unit><index>" before its extension (train_state.rank1.nast). Owned; NULL
 * when out of memory. */
char *tr_fit_state_path(const char *base, const char *unit, int index, int count);
/* Share of ds's examples whose largest logit is their label, in evaluation mode without a
 * graph, batch examples at a time; leaves m in training mode. */
int tr_evaluate(tr_ctx *ctx, tr_module *m, const tr_dataset *ds, int64_t batch,
                double *accuracy, nas_err *err);
/* The same, calling between(arg) (may be NULL) after every batch of examples: what a pass
 * of minutes must still do, such as a trial's heartbeat. A non-zero return stops the pass
 * with that return (its message in err). */
int tr_evaluate_between(tr_ctx *ctx, tr_module *m, const tr_dataset *ds, int64_t batch,
                        int (*between)(void *arg, nas_err *err), void *arg, double *accuracy,
                        nas_err *err);
/* Index of the largest of n values (the first on ties); -1 when one is NaN: an output
 * that is not a number predicts no class (a diverged model scores no example). */
int64_t tr_argmax(const float *values, int64_t n);

/* ================================================================ sharded training */

/* Data-parallel training on one rank of several (docs/engine-fsdp.md): what tr_fit does,
 * with m sharded by FSDP across the ranks of comm and each rank training on its slice of
 * every global batch. Every rank calls it with the same data and cfg (shuffle seed
 * included); the callbacks run on rank 0 only, which also validates; a failure on any
 * rank stops all of them at the same step. A batch is cut to a multiple of the world size
 * (the last batch of an epoch may lose up to world - 1 examples); a batch_size or a
 * training set smaller than the world is refused, as no batch would train. *accuracy is
 * rank 0's (0 elsewhere). On return m holds the whole trained model on every rank. */
typedef struct {
  tr_comm *comm;          /* borrowed: this rank's communicator */
  tr_comm *prefetch_comm; /* borrowed; NULL: no prefetch whatever fsdp says (nor on a
                             CUDA device, where FSDP has none) */
  tr_fsdp_config fsdp;
} tr_fit_ranks;
int tr_fit_sharded(tr_ctx *ctx, tr_module *m, const tr_fit_ranks *ranks, const tr_dataset *train,
                   const tr_dataset *val, const tr_fit_config *cfg, double *accuracy,
                   nas_err *err);

/* ================================================================ pipelined training */

/* What tr_fit does, on one stage of a pipeline (docs/engine-pipeline.md): m cut into the
 * stages of rank's pipeline by pipe, each mini-batch streamed through them as micro-batches.
 * Every stage calls it with the same data and cfg (shuffle seed included) on its own copy
 * of the same model; a batch smaller than pipe->chunks is skipped (a batch_size or a
 * training set smaller is refused, as no batch would train). The callbacks run on stage 0,
 * which also validates: after every epoch the stages' layers are gathered into
 * stage 0's m, which holds the whole trained model on return. *accuracy is stage 0's (0
 * elsewhere). On a CUDA device (cfg->device), m is there and ctx->cuda is its engine;
 * the stages then meet over NCCL (one process per GPU). */
int tr_fit_pipeline_stage(tr_ctx *ctx, tr_module *m, const tr_pipe_rank *rank,
                          const tr_pipe_config *pipe, const tr_dataset *train,
                          const tr_dataset *val, const tr_fit_config *cfg, double *accuracy,
                          nas_err *err);

/* How a built-in trial cuts its model into stages: even by count of children, or by
 * tr_pipe_balance_by_size or _by_time on its first training batch. */
typedef enum { TR_FIT_BALANCE_COUNT, TR_FIT_BALANCE_SIZE, TR_FIT_BALANCE_TIME } tr_fit_balance;

/* pipe->balance for `stages` stages of m by kind (count: all zero, the even split), sizes
 * and times taken on the first `batch` examples of train. m is left as it was. */
int tr_fit_pipeline_balance(tr_ctx *ctx, tr_module *m, tr_fit_balance kind,
                            const tr_dataset *train, int64_t batch, int stages,
                            tr_pipe_config *pipe, nas_err *err);

/* ================================================================ a trial's settings */

/* The model families of built-in trials (setting `model`). */
typedef enum { WORKER_MLP, WORKER_CNN, WORKER_RESNET, WORKER_MOBILENET } worker_family;

/* Everything a built-in trial's settings decide (spec_builtin_settings). */
typedef struct {
  worker_family family;  /* which of the configurations below is used */
  tr_mlp_config mlp;
  tr_cnn_config cnn_cfg;
  tr_resnet_config resnet;
  tr_mobilenet_config mobilenet;
  tr_fit_config fit;     /* callbacks and shuffle seed left to the caller */
  double validation;     /* share of the training data held out */
  int64_t limit_train, limit_val; /* 0: all */
  int threads;           /* for training; latency is measured on one */
  tr_device_kind device; /* where training runs */
  int devices;           /* ranks one model is trained across (docs/spec.md) */
  tr_fsdp_config fsdp;   /* how, when devices > 1 */
  bool data_cache;       /* map the prepared data from the dataset cache (builtin/worker_data.c) */
  int pipeline_stages;   /* > 1: a pipeline of this many stages (exclusive with devices) */
  tr_pipe_config pipe;   /* how, when pipeline_stages > 1 (balance: see pipe_balance) */
  tr_fit_balance pipe_balance;
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
  tr_standardization standardization; /* every part's: what new inputs need too */
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
/* The same, through the dataset cache (builtin/worker_data.c). */
int worker_data_cached(tr_ctx *ctx, const char *path, const worker_plan *plan,
                       uint64_t split_seed, worker_data *out, nas_err *err);

/* Checks, in the process about to launch a spec's built-in trials on this machine (the
 * local runner), what would fail every one of them: a dataset that is not where `nas
 * worker` looks (trial.env's NAS_DATA_DIR counts, as in the trials), augmentation the spec
 * fixes on a dataset without images, or device: cuda without a CUDA device or for
 * mobilenet (whose ops run on the CPU only). Command trials and other runners (whose trials run elsewhere)
 * pass. The error says what is missing and what to do. */
int worker_builtin_check(const spec *s, nas_err *err);

/* Refuses augmentation (augment_flip, augment_crop) on data whose examples are no images,
 * saying what to set instead. */
int worker_augment_check(const worker_plan *plan, const worker_data *data, nas_err *err);

/* Builds the plan's model for the data's example shape and class count. */
int worker_model_build(tr_ctx *ctx, const worker_plan *plan, const worker_data *data,
                       tr_model *out, nas_err *err);

#endif
