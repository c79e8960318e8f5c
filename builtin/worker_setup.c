/* builtin/worker_setup.c: a built-in trial's settings -> the engine's configurations, its data
 * split and standardised, its model built.
 *
 * The settings object is complete and valid (spec/builtin.c fills defaults and checked
 * every value a parameter can take), so reading it only maps words to the engine's enums;
 * a word it does not know is still reported, never guessed. Named datasets are looked
 * for in $NAS_DATA_DIR, beside the nas binary, then in Debian's folders. */
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "builtin/builtin.h"

typedef struct {
  const char *word;
  int value;
} word_value;

static const word_value activations[] = {
    {"relu", TR_RELU},           {"gelu", TR_GELU},   {"tanh", TR_TANH},
    {"sigmoid", TR_SIGMOID},     {"hardswish", TR_HARDSWISH}, {NULL, 0}};
static const word_value families[] = {{"mlp", WORKER_MLP},
                                      {"cnn", WORKER_CNN},
                                      {"resnet", WORKER_RESNET},
                                      {"mobilenet", WORKER_MOBILENET},
                                      {NULL, 0}};
static const word_value norms[] = {
    {"none", TR_NORM_NONE}, {"batch", TR_NORM_BATCH}, {"layer", TR_NORM_LAYER}, {NULL, 0}};
static const word_value optimizers[] = {
    {"sgd", TR_SGD}, {"adam", TR_ADAM}, {"adamw", TR_ADAMW}, {NULL, 0}};
static const word_value schedules[] = {
    {"constant", TR_LR_CONSTANT}, {"cosine", TR_LR_COSINE}, {"step", TR_LR_STEP},
    {"onecycle", TR_LR_ONECYCLE}, {NULL, 0}};
static const word_value poolings[] = {{"max", TR_MAXPOOL2D}, {"avg", TR_AVGPOOL2D}, {NULL, 0}};
static const word_value device_kinds[] = {{"cpu", TR_CPU}, {"cuda", TR_CUDA}, {NULL, 0}};
static const word_value shardings[] = {
    {"full", TR_SHARD_FULL}, {"grad_op", TR_SHARD_GRAD_OP}, {"none", TR_SHARD_NONE}, {NULL, 0}};

/* The value of word (may be NULL) in table; NAS_ENOTFOUND when it has none. */
static int value_of_word(const word_value *table, const char *word, int *out) {
  for (const word_value *w = table; word && w->word; w++) {
    if (strcmp(w->word, word) != 0) continue;
    *out = w->value;
    return NAS_OK;
  }
  return NAS_ENOTFOUND;
}

static int word_of(const json_t *settings, const char *name, const word_value *table, int *out,
                   nas_err *err) {
  const char *word = json_string_value(json_object_get(settings, name));
  if (value_of_word(table, word, out) == NAS_OK) return NAS_OK;
  return nas_errf(err, "setting %s: '%s' is not known here", name, word ? word : "(none)");
}

static long long int_of(const json_t *settings, const char *name) {
  return json_integer_value(json_object_get(settings, name));
}

static double number_of(const json_t *settings, const char *name) {
  return json_number_value(json_object_get(settings, name));
}

/* NAME<layer> when given, else NAME: the width of one layer or stage. */
static int64_t per_layer(const json_t *settings, const char *name, int layer) {
  char key[32];
  snprintf(key, sizeof key, "%s%d", name, layer);
  const json_t *own = json_object_get(settings, key);
  return own ? json_integer_value(own) : int_of(settings, name);
}

static int read_blocks(const json_t *settings, const char *count_name, const char *width_name,
                       int *count, int64_t *widths, nas_err *err) {
  *count = (int)int_of(settings, count_name);
  if (*count < 1 || *count > TR_MAX_BLOCKS)
    return nas_errf(err, "setting %s: %d, between 1 and %d expected", count_name, *count,
                    TR_MAX_BLOCKS);
  for (int i = 0; i < *count; i++) widths[i] = per_layer(settings, width_name, i + 1);
  return NAS_OK;
}

/* ResNet: stages, and per stage its blocks and channels. */
static int read_resnet(const json_t *settings, tr_resnet_config *cfg, nas_err *err) {
  *cfg = (tr_resnet_config){.dropout = number_of(settings, "dropout")};
  int rc = read_blocks(settings, "stages", "channels", &cfg->stages, cfg->channels, err);
  for (int i = 0; rc == NAS_OK && i < cfg->stages; i++)
    cfg->blocks[i] = (int)per_layer(settings, "blocks", i + 1);
  return rc;
}

/* MobileNet: what ResNet reads, and per stage expansion, kernel and SE. */
static int read_mobilenet(const json_t *settings, tr_mobilenet_config *cfg, nas_err *err) {
  int activation;
  *cfg = (tr_mobilenet_config){.dropout = number_of(settings, "dropout")};
  int rc = word_of(settings, "activation", activations, &activation, err);
  if (rc == NAS_OK)
    rc = read_blocks(settings, "stages", "channels", &cfg->stages, cfg->channels, err);
  cfg->activation = (tr_module_kind)activation;
  for (int i = 0; rc == NAS_OK && i < cfg->stages; i++) {
    char se[16];
    snprintf(se, sizeof se, "se%d", i + 1);
    const json_t *own = json_object_get(settings, se);
    cfg->blocks[i] = (int)per_layer(settings, "blocks", i + 1);
    cfg->expansion[i] = (int)per_layer(settings, "expansion", i + 1);
    cfg->kernel[i] = (int)per_layer(settings, "kernel", i + 1);
    cfg->se[i] = json_is_true(own ? own : json_object_get(settings, "se"));
  }
  return rc;
}

static int read_model(const json_t *settings, worker_plan *plan, nas_err *err) {
  if (plan->family == WORKER_RESNET) return read_resnet(settings, &plan->resnet, err);
  if (plan->family == WORKER_MOBILENET) return read_mobilenet(settings, &plan->mobilenet, err);
  int activation, norm, pool;
  double dropout = number_of(settings, "dropout");
  int rc = word_of(settings, "activation", activations, &activation, err);
  if (rc == NAS_OK) rc = word_of(settings, "norm", norms, &norm, err);
  if (rc != NAS_OK) return rc;
  if (plan->family == WORKER_MLP) {
    plan->mlp = (tr_mlp_config){.activation = (tr_module_kind)activation,
                                .norm = (tr_norm_kind)norm, .dropout = dropout};
    return read_blocks(settings, "layers", "width", &plan->mlp.layers, plan->mlp.widths, err);
  }
  if ((rc = word_of(settings, "pooling", poolings, &pool, err)) != NAS_OK) return rc;
  plan->cnn_cfg = (tr_cnn_config){.kernel = (int)int_of(settings, "kernel"),
                                  .pool = (tr_module_kind)pool,
                                  .head_width = int_of(settings, "head_width"),
                                  .activation = (tr_module_kind)activation,
                                  .norm = (tr_norm_kind)norm, .dropout = dropout};
  return read_blocks(settings, "stages", "channels", &plan->cnn_cfg.stages,
                     plan->cnn_cfg.channels, err);
}

/* Momentum and Nesterov are SGD's (Nesterov without momentum is plain SGD, so it is
 * simply off then); Adam's betas keep the engine's defaults. The augmentation's fill is
 * the data's (worker_data.background), set once the data is read. */
static int read_training(const json_t *settings, worker_plan *plan, nas_err *err) {
  int optimizer, schedule;
  int rc = word_of(settings, "optimizer", optimizers, &optimizer, err);
  if (rc == NAS_OK) rc = word_of(settings, "schedule", schedules, &schedule, err);
  if (rc != NAS_OK) return rc;
  double momentum = optimizer == TR_SGD ? number_of(settings, "momentum") : 0;
  plan->fit = (tr_fit_config){
      .epochs = (int)int_of(settings, "epochs"),
      .batch_size = int_of(settings, "batch_size"),
      .optim = {.kind = (tr_optim_kind)optimizer,
                .lr = number_of(settings, "lr"),
                .momentum = momentum,
                .nesterov = momentum > 0 && json_is_true(json_object_get(settings, "nesterov")),
                .weight_decay = number_of(settings, "weight_decay")},
      .schedule = (tr_lr_kind)schedule,
      .warmup_epochs = number_of(settings, "warmup"),
      .label_smoothing = number_of(settings, "label_smoothing"),
      .augment = {.crop_padding = (int)int_of(settings, "augment_crop"),
                  .flip = json_is_true(json_object_get(settings, "augment_flip"))}};
  plan->data_cache = json_is_true(json_object_get(settings, "data_cache"));
  plan->validation = number_of(settings, "validation");
  plan->limit_train = int_of(settings, "limit_train");
  plan->limit_val = int_of(settings, "limit_val");
  plan->threads = (int)int_of(settings, "threads");
  return NAS_OK;
}

static const word_value pipe_checkpoints[] = {
    {"except_last", TR_PIPE_CKPT_EXCEPT_LAST},
    {"always", TR_PIPE_CKPT_ALWAYS},
    {"never", TR_PIPE_CKPT_NEVER},
    {NULL, 0}};
static const word_value pipe_balances[] = {{"count", TR_FIT_BALANCE_COUNT},
                                           {"size", TR_FIT_BALANCE_SIZE},
                                           {"time", TR_FIT_BALANCE_TIME},
                                           {NULL, 0}};

/* A pipeline: balance as the trial says, batch norm deferred (statistics over
 * the whole mini-batch, as one rank's). Exclusive with FSDP: search parameters may pick
 * both, which only a trial can see. */
static int read_pipeline(const json_t *settings, worker_plan *plan, nas_err *err) {
  int checkpoint, balance;
  if (word_of(settings, "pipeline_checkpoint", pipe_checkpoints, &checkpoint, err) ||
      word_of(settings, "pipeline_balance", pipe_balances, &balance, err))
    return NAS_ERR;
  plan->pipe_balance = (tr_fit_balance)balance;
  plan->pipeline_stages = (int)int_of(settings, "pipeline_stages");
  plan->pipe = (tr_pipe_config){.chunks = (int)int_of(settings, "pipeline_chunks"),
                                .checkpoint = (tr_pipe_checkpoint)checkpoint,
                                .deferred_batch_norm = true};
  if (plan->pipeline_stages > 1 && plan->devices > 1)
    return nas_errf(err, "pipeline_stages %d and devices %d: a trial splits its model over "
                    "ranks one way, a pipeline or sharded data parallel", plan->pipeline_stages,
                    plan->devices);
  return NAS_OK;
}

/* Devices and sharding: one unit per layer, prefetch on (it changes no result). */
static int read_devices(const json_t *settings, worker_plan *plan, nas_err *err) {
  int device, sharding;
  int rc = word_of(settings, "device", device_kinds, &device, err);
  if (rc == NAS_OK) rc = word_of(settings, "sharding", shardings, &sharding, err);
  if (rc != NAS_OK) return rc;
  plan->device = (tr_device_kind)device;
  plan->devices = (int)int_of(settings, "devices");
  plan->fsdp = (tr_fsdp_config){
      .mode = (tr_shard_mode)sharding,
      .checkpoint = json_is_true(json_object_get(settings, "checkpoint_activations")),
      .prefetch = true};
  return NAS_OK;
}

int worker_plan_read(const json_t *settings, const char *model, worker_plan *plan, nas_err *err) {
  memset(plan, 0, sizeof *plan);
  int family;
  if (value_of_word(families, model, &family) != NAS_OK)
    return nas_errf(err, "model '%s' is not known here", model);
  plan->family = (worker_family)family;
  int rc = read_model(settings, plan, err);
  if (rc == NAS_OK) rc = read_training(settings, plan, err);
  if (rc == NAS_OK) rc = read_devices(settings, plan, err);
  return rc == NAS_OK ? read_pipeline(settings, plan, err) : rc;
}

/* ---- data ---- */

/* Folders named datasets are looked for in, NULL-terminated, owned: data_dir (the worker's
 * $NAS_DATA_DIR; may be NULL); beside the binary <prefix>/share/nas (an install) and
 * <repo>/tests/data (the source tree, where bin/nas lives); Debian's dataset folder;
 * scikit-learn's data folder. */
static char **data_dirs(const char *data_dir) {
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[len > 0 ? len : 0] = '\0';
  const char *env = data_dir, *bin = len > 0 ? dirname(exe) : NULL;
  char *found[] = {env && *env ? strdup(env) : NULL,
                   bin ? nas_asprintf("%s/../share/nas", bin) : NULL,
                   bin ? nas_asprintf("%s/../tests/data", bin) : NULL,
                   strdup("/usr/share/datasets"),
                   strdup("/usr/lib/python3/dist-packages/sklearn/datasets/data")};
  enum { N_FOUND = sizeof found / sizeof found[0] };
  char **dirs = calloc(N_FOUND + 1, sizeof *dirs);
  size_t n = 0;
  for (size_t i = 0; i < N_FOUND; i++) {
    if (dirs && found[i]) dirs[n++] = found[i];
    else free(found[i]);
  }
  return dirs;
}

static void strings_free(char **list) {
  for (char **p = list; p && *p; p++) free(*p);
  free(list);
}

/* Splits off the validation part, keeps the subsets asked for, standardises. */
static int prepare(tr_ctx *ctx, const worker_plan *plan, uint64_t split_seed, worker_data *d,
                   nas_err *err) {
  tr_dataset train;
  if (tr_dataset_split(ctx, &d->all.train, plan->validation, split_seed, &train, &d->val))
    return nas_errf(err, "%s", ctx->err.msg);
  tr_dataset_free(&d->all.train);
  d->all.train = train;
  if (d->all.train.n == 0 || d->val.n == 0)
    return nas_errf(err, "%s: %lld examples leave %lld for training and %lld for validation "
                    "(setting validation: %g)", d->all.source,
                    (long long)(d->all.train.n + d->val.n), (long long)d->all.train.n,
                    (long long)d->val.n, plan->validation);
  int rc = tr_dataset_truncate(ctx, &d->all.train, plan->limit_train, err);
  if (rc == NAS_OK) rc = tr_dataset_truncate(ctx, &d->val, plan->limit_val, err);
  tr_dataset *const parts[] = {&d->all.train, &d->val, &d->all.test};
  return rc == NAS_OK ? tr_standardize(&d->all.train, parts, 3, &d->standardization, err) : rc;
}

static float smallest_value(const tr_dataset *ds) {
  const float *v = tr_f32(ds->x);
  float least = ds->x->numel > 0 ? v[0] : 0;
  for (int64_t i = 1; i < ds->x->numel; i++)
    if (v[i] < least) least = v[i];
  return least;
}

int worker_data_read(tr_ctx *ctx, const char *path, const worker_plan *plan, uint64_t split_seed,
                     worker_data *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  int rc = tr_named_dataset_load(ctx, path, NULL, &out->all, err);
  if (rc == NAS_OK) rc = prepare(ctx, plan, split_seed, out, err);
  if (rc != NAS_OK) worker_data_free(out);
  else out->background = smallest_value(&out->all.train);
  return rc;
}

int worker_data_load(tr_ctx *ctx, const char *dataset, const worker_plan *plan,
                     uint64_t split_seed, worker_data *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  char **dirs = data_dirs(getenv("NAS_DATA_DIR")), *path = NULL;
  int rc = dirs ? tr_named_dataset_find(dataset, (const char *const *)dirs, &path, err)
                : nas_errf(err, "out of memory");
  strings_free(dirs);
  if (rc == NAS_OK && plan->data_cache)
    rc = worker_data_cached(ctx, path, plan, split_seed, out, err);
  else if (rc == NAS_OK && (rc = worker_data_read(ctx, path, plan, split_seed, out, err)) == NAS_OK)
    snprintf(out->origin, sizeof out->origin, "read directly (data_cache: false)");
  free(path);
  return rc;
}

void worker_data_free(worker_data *d) {
  tr_named_dataset_free(&d->all);
  tr_dataset_free(&d->val);
  tr_data_cache_close(d->cache); /* after the features on it are freed */
  d->cache = NULL;
}

int worker_model_build(tr_ctx *ctx, const worker_plan *plan, const worker_data *data,
                       tr_model *out, nas_err *err) {
  const tr_named_dataset *all = &data->all;
  int32_t classes = all->train.nclasses;
  int rc = plan->family == WORKER_MLP ? tr_mlp_build(ctx, &plan->mlp, all->shape, classes, out)
           : plan->family == WORKER_CNN
               ? tr_cnn_build(ctx, &plan->cnn_cfg, all->shape, classes, out)
           : plan->family == WORKER_RESNET
               ? tr_resnet_build(ctx, &plan->resnet, all->shape, classes, out)
               : tr_mobilenet_build(ctx, &plan->mobilenet, all->shape, classes, out);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "model: %s", ctx->err.msg);
}

/* The refusal of augmentation on a dataset whose examples are no images. */
static int refuse_augment(const char *source, nas_err *err) {
  return nas_errf(err, "augment_flip, augment_crop: %s holds no images (a CSV file whose "
                  "feature count is not a square is read as k values of 1x1 pixel), and "
                  "augmentation flips and crops images only; set augment_flip: false and "
                  "augment_crop: 0 for this dataset", source);
}

int worker_augment_check(const worker_plan *plan, const worker_data *data, nas_err *err) {
  if (!tr_augment_active(&plan->fit.augment) || tr_input_is_image(data->all.shape)) return NAS_OK;
  return refuse_augment(data->all.source, err);
}

/* ---- checks before launching ---- */

/* NAS_DATA_DIR as the trials will see it: the spec's trial.env wins over nas's own
 * environment, as it does in the job's; a relative one is the trials' folder's (they run
 * in trial.workdir). Owned; NULL when unset (or out of memory). */
static char *trials_data_dir(const spec *s) {
  static const char name[] = "NAS_DATA_DIR=";
  const char *value = getenv("NAS_DATA_DIR");
  for (size_t i = 0; i < s->trial.n_env; i++)
    if (strncmp(s->trial.env[i], name, sizeof name - 1) == 0) value = s->trial.env[i] + sizeof name - 1;
  return value && *value ? nas_abspath(value, s->trial.workdir) : NULL;
}

/* Where the trials will find the spec's dataset: *path (owned), or an error saying why not. */
static int trials_dataset(const spec *s, char **path, nas_err *err) {
  char *data_dir = trials_data_dir(s);
  char **dirs = data_dirs(data_dir);
  int rc = dirs ? tr_named_dataset_find(s->trial.builtin->dataset, (const char *const *)dirs,
                                        path, err)
                : nas_errf(err, "out of memory");
  strings_free(dirs);
  free(data_dir);
  return rc;
}

static int dataset_check(const spec *s, nas_err *err) {
  char *path = NULL;
  int rc = trials_dataset(s, &path, err);
  free(path);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "trial.builtin.dataset");
}

/* Only augmentation the spec fixes is checked: a trial drawing it off from a search trains. */
static int augment_check(const spec *s, nas_err *err) {
  const json_t *settings = s->trial.builtin->settings;
  bool flip = json_is_true(json_object_get(settings, "augment_flip")) &&
              spec_param_index(s, "augment_flip") < 0;
  bool crop = json_integer_value(json_object_get(settings, "augment_crop")) > 0 &&
              spec_param_index(s, "augment_crop") < 0;
  if (!flip && !crop) return NAS_OK;
  char *path = NULL;
  bool images = true;
  int rc = trials_dataset(s, &path, err);
  if (rc == NAS_OK) rc = tr_named_dataset_holds_images(path, &images, err);
  if (rc == NAS_OK && !images) rc = refuse_augment(path, err);
  free(path);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "trial.builtin");
}

/* Only a device the spec fixes is checked: one a search parameter picks may be the CPU. */
static int device_check(const spec *s, nas_err *err) {
  const char *device = json_string_value(json_object_get(s->trial.builtin->settings, "device"));
  if (!device || strcmp(device, "cuda") != 0 || spec_param_index(s, "device") >= 0) return NAS_OK;
  if (strcmp(s->trial.builtin->model, "mobilenet") == 0)
    return nas_errf(err, "trial.builtin.device: cuda, but mobilenet's depthwise convolutions and "
                    "hard-swish run on the cpu only (docs/engine.md); use device: cpu, or model: "
                    "resnet on cuda");
  nas_err why;
  if (tr_cuda_device_count(&why) >= 1) return NAS_OK;
  return nas_errf(err, "trial.builtin.device: cuda, but this machine has no CUDA device to run "
                  "the trials on (%s); use device: cpu, or run nas where a GPU is", why.msg);
}

int worker_builtin_check(const spec *s, nas_err *err) {
  if (!s->trial.builtin || strcmp(s->runner.type, "local") != 0) return NAS_OK;
  if (dataset_check(s, err) != NAS_OK || augment_check(s, err) != NAS_OK ||
      device_check(s, err) != NAS_OK)
    return nas_err_prefix(err, "nothing launched, as every built-in trial would fail");
  return NAS_OK;
}
