/* cli/worker.c: `nas worker --trial ID` — runs one built-in trial (trial.builtin in the
 * spec): reads the trial and its experiment's spec from storage, trains the model its
 * settings describe, stores the validation accuracy after every epoch (step = epoch) with
 * a heartbeat, then saves the weights in the run folder and stores every final metric.
 *
 * Invariant: the final metrics go to storage in one call (one transaction), after the
 * weights are saved, so a worker killed at any instant leaves either none of them (the
 * scheduler then sees a failed or lost trial, never a completed one) or all of them.
 * Progress goes to stdout, the trial's log; no line of it starts with "nas-metric",
 * because the metrics are stored directly and must not be read twice. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "builtin/builtin.h"
#include "metrics/metrics.h"
#include "scheduler/scheduler.h"

static const char worker_help[] =
    "usage: nas worker [--trial ID] [--storage URL] [--run-dir DIR]\n\n"
    "Runs one built-in trial (a spec with trial.builtin; docs/spec.md): trains the model\n"
    "its settings describe, stores the validation accuracy after every epoch and then\n"
    "accuracy, params, model_bytes, flops, latency_ms_p50, latency_ms_p99, train_seconds\n"
    "(and test_accuracy when the dataset has a test split; docs/metrics.md), and saves the\n"
    "weights as DIR/weights.nasw with DIR/model.json describing them. nas starts it for\n"
    "every built-in trial; the defaults are what it sets: $NAS_TRIAL_ID, $NAS_STORAGE,\n"
    "$NAS_RUN_DIR. Named datasets are looked for in $NAS_DATA_DIR first; the prepared\n"
    "data is cached in $NAS_CACHE_DIR (default $XDG_CACHE_HOME/nas, else ~/.cache/nas;\n"
    "setting data_cache).\n"
    "Under multi_fidelity nas also sets the budget: $NAS_EPOCHS, $NAS_FIRST_EPOCH and\n"
    "$NAS_MAX_EPOCHS (train epochs FIRST+1..EPOCHS of a MAX-epoch schedule), the weights\n"
    "and training state (train_state.nast: the optimiser's, dropout's; one per rank or stage\n"
    "of a sharded or pipelined trial: train_state.rank0.nast ...) to go on from in\n"
    "$NAS_RESUME_DIR, and $NAS_SAVE_DIR to save both in as well.\n";

/* Seconds between heartbeats while an epoch runs, at most: a quarter of the trial's
 * heartbeat_timeout when that is shorter, so that one late beat does not lose the trial. */
static const double heartbeat_every_s = 5.0;

typedef struct {
  char *storage; /* owned: --storage (cli_storage_flag), NULL when not given */
  const char *run_dir, *trial;
  const char *trial_from; /* where trial came from, for messages: --trial or NAS_TRIAL_ID */
} worker_args;

/* One trial being run; everything owned. */
typedef struct {
  storage *st;
  trial_row trial;
  experiment_row exp;
  spec *s;
  json_t *settings;
  worker_plan plan;
  tr_ctx ctx;
  worker_data data;
  tr_model model;
  double last_beat;   /* monotonic seconds of the last heartbeat */
  double started;     /* monotonic seconds when training started, before setting up
                         ranks or stages (docs/metrics.md, train_seconds) */
  tr_comm *comm;      /* owned: this process's rank when launched as one of several (srun
                         tasks); NULL otherwise */
  char comm_name[TR_COMM_NAME_MAX]; /* comm's group name: a pipeline names its segment so */
  tr_cuda *cuda;      /* owned: the device with device: cuda; NULL on the CPU */
  uint64_t seed;      /* of the trial's generators */
  double accuracy;    /* validation accuracy after the last epoch (rank 0's) */
  const char *resume_dir; /* multi-fidelity: weights to go on from ($NAS_RESUME_DIR); NULL */
  const char *save_dir;   /* … and where this rung's weights go too ($NAS_SAVE_DIR); NULL */
  char *state_in, *state_out; /* owned: the training state files of those folders; NULL */
  const char *state_note;     /* what the log says about the training state on resuming */
} worker;

static int take_worker_option(const char *cmd, int c, char *arg, void *ctx) {
  worker_args *a = ctx;
  (void)cmd;
  if (c == 't') {
    a->trial = arg;
    a->trial_from = "--trial";
  } else {
    a->run_dir = arg; /* --run-dir */
  }
  return -1;
}

/* Returns -1 when the command should go on, else the exit status; a->storage is to be
 * freed either way. */
static int parse_args(int argc, char **argv, worker_args *a) {
  static const struct option options[] = {{"trial", required_argument, NULL, 't'},
                                          {"run-dir", required_argument, NULL, 'r'},
                                          {NULL, 0, NULL, 0}};
  *a = (worker_args){.trial = getenv("NAS_TRIAL_ID"), .trial_from = "NAS_TRIAL_ID",
                     .run_dir = getenv("NAS_RUN_DIR")};
  const cli_command cmd = {"worker", worker_help, options, NULL, take_worker_option, a};
  int status = cli_parse_options(&cmd, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (optind != argc) return cli_usage_error("worker", "unexpected argument '%s'", argv[optind]);
  if (!a->trial || !*a->trial)
    return cli_usage_error("worker", "no trial: give --trial ID (or run it as a trial, which "
                                     "sets NAS_TRIAL_ID)");
  char *end = NULL;
  if (strtoll(a->trial, &end, 10) < 1 || *end != '\0')
    return cli_usage_error("worker", "%s '%s' is not a trial id (a whole number from 1)",
                           a->trial_from, a->trial);
  return -1;
}

/* ---- the trial and its experiment ---- */

/* Storage, trial, experiment, spec and the trial's settings. */
static int worker_open(worker *w, const worker_args *a, nas_err *err) {
  int64_t id = strtoll(a->trial, NULL, 10);
  json_t *params = NULL;
  int rc = storage_open_with(cli_storage_url(a->storage), STORAGE_MUST_EXIST, &w->st, err);
  if (rc == NAS_OK) rc = storage_trial_get(w->st, id, &w->trial, err);
  if (rc == NAS_OK) rc = cli_experiment_by_id(w->st, w->trial.experiment_id, &w->exp, err);
  if (rc == NAS_OK) rc = sched_experiment_spec(&w->exp, &w->s, err);
  if (rc == NAS_OK && !(params = json_loads(w->trial.params_json, 0, NULL)))
    rc = nas_errf(err, "trial %lld: stored parameters are not JSON", (long long)id);
  if (rc == NAS_OK) rc = spec_builtin_settings(w->s, params, &w->settings, err);
  if (rc == NAS_OK) rc = worker_plan_read(w->settings, w->s->trial.builtin->model, &w->plan, err);
  json_decref(params);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "trial %lld", (long long)id);
}

static void worker_close(worker *w) {
  free(w->state_in);
  free(w->state_out);
  tr_comm_free(w->comm);
  tr_model_free(&w->model);
  tr_cuda_free(w->cuda);
  worker_data_free(&w->data);
  if (w->ctx.alloc) tr_allocator_release(w->ctx.alloc);
  json_decref(w->settings);
  spec_free(w->s);
  experiment_row_clear(&w->exp);
  trial_row_clear(&w->trial);
  storage_close(w->st);
}

/* splitmix64's finaliser: well-spread seeds from small numbers. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* A heartbeat only says "alive"; one that fails (a trial run by hand, not running) is no
 * reason to stop training. */
static void heartbeat(worker *w) {
  nas_err ignored;
  storage_trial_heartbeat(w->st, w->trial.id, &ignored);
  w->last_beat = nas_monotonic();
}

static void set_threads(int threads) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
}

/* ---- the budget (multi-fidelity; docs/spec.md, "Multi-fidelity") ---- */

/* An epoch count from the environment, when set: a whole number in [0, 100000]. */
static int env_epochs(const char *name, int *out, bool *set, nas_err *err) {
  const char *text = getenv(name);
  *set = text && *text;
  if (!*set) return NAS_OK;
  char *end;
  long v = strtol(text, &end, 10);
  if (*end != '\0' || v < 0 || v > 100000)
    return nas_errf(err, "%s: expected a number of epochs, got '%s'", name, text);
  *out = (int)v;
  return NAS_OK;
}

/* The epochs this launch trains when the scheduler set a budget: epochs NAS_FIRST_EPOCH + 1
 * … NAS_EPOCHS of a run whose schedule spans NAS_MAX_EPOCHS (trial.builtin's epochs
 * setting gives way to them). */
static int worker_budget(worker *w, nas_err *err) {
  int epochs = 0, first = 0, most = 0;
  bool has_epochs, has_first, has_most;
  if (env_epochs("NAS_EPOCHS", &epochs, &has_epochs, err) != NAS_OK ||
      env_epochs("NAS_FIRST_EPOCH", &first, &has_first, err) != NAS_OK ||
      env_epochs("NAS_MAX_EPOCHS", &most, &has_most, err) != NAS_OK)
    return NAS_ERR;
  if (!has_epochs) return NAS_OK;
  if (!has_most) most = epochs;
  if (epochs < 1 || first >= epochs || epochs > most)
    return nas_errf(err, "budget: NAS_FIRST_EPOCH %d, NAS_EPOCHS %d and NAS_MAX_EPOCHS %d must "
                    "satisfy 0 <= first < epochs <= max", first, epochs, most);
  w->plan.fit.epochs = most;
  w->plan.fit.stop_epoch = epochs;
  w->plan.fit.first_epoch = first;
  w->resume_dir = first > 0 ? getenv("NAS_RESUME_DIR") : NULL;
  w->save_dir = getenv("NAS_SAVE_DIR");
  if (first > 0 && !w->resume_dir)
    return nas_errf(err, "budget: NAS_FIRST_EPOCH %d without NAS_RESUME_DIR to go on from", first);
  return NAS_OK;
}

/* The weights saved after first_epoch epochs, into module (the worker's model just built,
 * or a thread stage's copy of it). */
static int worker_resume(worker *w, tr_module *module, nas_err *err) {
  if (!w->resume_dir) return NAS_OK;
  char *weights = nas_asprintf("%s/weights.nasw", w->resume_dir);
  int rc = weights ? tr_module_load(module, weights, err) : nas_errf(err, "out of memory");
  if (rc != NAS_OK) rc = nas_err_prefix(err, "resuming at epoch %d", w->plan.fit.first_epoch);
  free(weights);
  return rc;
}

/* The training state beside the weights (docs/spec.md, "Multi-fidelity"). */
static const char state_file[] = "train_state.nast";

/* The file of the first part of the trial's training state named base: base itself, or
 * rank 0's or stage 0's of a sharded or pipelined trial (tr_fit_state_path). Owned. */
static char *first_state_part(const worker *w, const char *base) {
  bool pipeline = w->plan.pipeline_stages > 1;
  return tr_fit_state_path(base, pipeline ? "stage" : "rank", 0,
                           pipeline ? w->plan.pipeline_stages : w->plan.devices);
}

/* The training state files of the budget's folders (the fits keep them, a sharded rank or
 * a pipeline stage its own part): loaded from the resume folder when it holds them — a
 * folder an older nas saved holds none (of a sharded or pipelined trial: never), and the
 * optimiser and dropout then start afresh — and saved into the save folder. */
static int worker_state_files(worker *w, nas_err *err) {
  w->state_note = ", with the optimiser's state and dropout's generator";
  if (w->resume_dir) {
    w->state_in = nas_asprintf("%s/%s", w->resume_dir, state_file);
    char *first = w->state_in ? first_state_part(w, w->state_in) : NULL;
    if (!first) return nas_errf(err, "out of memory");
    bool absent = access(first, F_OK) != 0 && errno == ENOENT;
    free(first);
    if (absent) {
      free(w->state_in);
      w->state_in = NULL;
      w->state_note = "; it holds no training state (saved by an older nas): the optimiser's "
                      "state and dropout's masks start afresh";
    }
  }
  w->plan.fit.state_in = w->state_in;
  if (!w->save_dir) return NAS_OK;
  w->plan.fit.state_out = w->state_out = nas_asprintf("%s/%s", w->save_dir, state_file);
  if (!w->state_out) return nas_errf(err, "out of memory");
  return nas_mkdirs(w->save_dir, err);
}

/* ---- devices ---- */

/* Whether a launcher started this process as one rank of several: a task of an srun step
 * with more than one task, or NAS_RANK (tr_comm_env reads the rest). */
static bool launched_as_rank(void) {
  const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
  return getenv("NAS_RANK") || (getenv("SLURM_STEP_ID") && tasks && atoi(tasks) > 1);
}

static bool lead_rank(const worker *w) { return !w->comm || tr_comm_rank(w->comm) == 0; }

/* Joins the group of ranks the launcher started; there must be as many as the trial's
 * devices. GPUs meet over NCCL (the id through the run folder), CPU ranks in shared memory. */
static int join_ranks(worker *w, const char *run_dir, int *local_rank, nas_err *err) {
  tr_comm_options opts = {.backend = w->plan.device == TR_CUDA ? TR_COMM_NCCL : TR_COMM_PROCESSES,
                          .run_dir = w->plan.device == TR_CUDA ? run_dir : NULL};
  if (tr_comm_env(&opts, err) != NAS_OK) return NAS_ERR;
  bool pipeline = w->plan.pipeline_stages > 1;
  int ranks = pipeline ? w->plan.pipeline_stages : w->plan.devices;
  if (opts.world != ranks)
    return nas_errf(err, "the trial has %s: %d but runs as %d ranks (srun tasks): make the "
                    "runner's ntasks equal to %s", pipeline ? "pipeline stages" : "devices",
                    ranks, opts.world, pipeline ? "the stages" : "devices");
  *local_rank = opts.local_rank;
  snprintf(w->comm_name, sizeof w->comm_name, "%s", opts.name);
  return tr_comm_join(&opts, &w->comm, err);
}

/* Ranks and device, before any data is read: a rank of a launched group joins it; several
 * devices in one process are CPU threads (GPUs take one process each); device: cuda gets
 * the GPU of this rank on its node. */
static int worker_devices(worker *w, const char *run_dir, nas_err *err) {
  int local_rank = 0;
  if (launched_as_rank() && join_ranks(w, run_dir, &local_rank, err) != NAS_OK) return NAS_ERR;
  if (w->plan.device != TR_CUDA) return NAS_OK;
  if (w->plan.devices > 1 && !w->comm)
    return nas_errf(err, "devices: %d with device: cuda takes one process per GPU: run the trial "
                    "as %d srun tasks (runner options ntasks: %d, srun: true)", w->plan.devices,
                    w->plan.devices, w->plan.devices);
  int stages = w->plan.pipeline_stages;
  if (stages > 1 && !w->comm)
    return nas_errf(err, "pipeline stages: %d with device: cuda takes one process per GPU (the "
                    "stages meet over NCCL): run the trial as %d srun tasks (runner options "
                    "ntasks: %d, srun: true)", stages, stages, stages);
  int count = tr_cuda_device_count(err);
  if (count < 1) return nas_err_prefix(err, "device: cuda");
  w->cuda = tr_cuda_new(local_rank % count, (size_t)1 << 30, err);
  return w->cuda ? NAS_OK : nas_err_prefix(err, "device: cuda");
}

/* Data and model. Every trial of an experiment splits off the same validation examples
 * (the experiment's seed), so their accuracies compare; initial weights and batch order
 * differ per trial. */
static int worker_prepare(worker *w, nas_err *err) {
  if (lead_rank(w)) heartbeat(w); /* reading a large dataset takes seconds */
  uint64_t seed = w->seed = mix((uint64_t)w->s->seed * 1000003u + (uint64_t)w->trial.number);
  tr_ctx_init(&w->ctx, seed);
  set_threads(w->plan.threads);
  /* Thread ranks and stages share the OpenMP threads (tr_fsdp_run_threads); OpenBLAS, called by all
   * of them at once, stays on one thread each. */
  if ((w->plan.devices > 1 || w->plan.pipeline_stages > 1) && !w->comm)
    openblas_set_num_threads(1);
  const builtin_spec *b = w->s->trial.builtin;
  double start = nas_monotonic();
  int rc = worker_data_load(&w->ctx, b->dataset, &w->plan, (uint64_t)w->s->seed, &w->data, err);
  if (rc != NAS_OK) return rc;
  double data_seconds = nas_monotonic() - start;
  if ((rc = worker_augment_check(&w->plan, &w->data, err)) != NAS_OK) return rc;
  w->plan.fit.augment.fill = w->data.background;
  /* Only now: the caching allocator would keep the blocks of the data read and dropped. */
  if (!(w->ctx.alloc = tr_allocator_new((size_t)256 << 20))) return nas_errf(err, "out of memory");
  if ((rc = worker_model_build(&w->ctx, &w->plan, &w->data, &w->model, err)) != NAS_OK) return rc;
  if ((rc = worker_resume(w, w->model.module, err)) != NAS_OK) return rc;
  if (w->cuda) {
    w->ctx.cuda = w->cuda;
    w->plan.fit.device = TR_DEVICE_CUDA(tr_cuda_device(w->cuda));
    if (tr_module_to_device(&w->ctx, w->model.module, w->plan.fit.device) != NAS_OK)
      return nas_errf(err, "model to the device: %s", w->ctx.err.msg);
  }
  w->plan.fit.shuffle_seed = mix(seed);
  const tr_input_shape *in = &w->data.all.shape;
  if (!lead_rank(w)) return NAS_OK;
  printf("trial %d of %s: %s on %s (%lldx%lldx%lld, %d classes, data ready in %.3f s, %s): "
         "%lld training, %lld validation, %lld test examples; %lld parameters, %lld FLOPs per "
         "example\n",
         w->trial.number, w->exp.name, b->model, w->data.all.source, (long long)in->channels,
         (long long)in->height, (long long)in->width, (int)w->data.all.train.nclasses,
         data_seconds, w->data.origin, (long long)w->data.all.train.n, (long long)w->data.val.n,
         (long long)w->data.all.test.n, (long long)w->model.params, (long long)w->model.flops);
  if (w->plan.fit.stop_epoch > 0)
    printf("budget: epochs %d to %d of a %d-epoch schedule\n", w->plan.fit.first_epoch + 1,
           w->plan.fit.stop_epoch, w->plan.fit.epochs);
  if (w->resume_dir)
    printf("resumed at epoch %d from %s%s\n", w->plan.fit.first_epoch, w->resume_dir,
           w->state_note);
  fflush(stdout);
  return NAS_OK;
}

/* ---- training ---- */

static void beat_when_due(worker *w) {
  double timeout = w->s->trial.heartbeat_timeout_s;
  double every = timeout > 0 && timeout / 4 < heartbeat_every_s ? timeout / 4 : heartbeat_every_s;
  if (nas_monotonic() - w->last_beat >= every) heartbeat(w);
}

static int on_step(void *arg, nas_err *err) {
  (void)err;
  beat_when_due(arg);
  return NAS_OK;
}

/* The epoch's validation accuracy as an intermediate value at step = epoch. */
static int on_epoch(void *arg, int epoch, double train_loss, double val_accuracy, nas_err *err) {
  worker *w = arg;
  metric_obs obs = {METRIC_PER_EPOCH, epoch, val_accuracy, nas_now()};
  if (storage_metrics_add(w->st, w->trial.id, &obs, 1, -1, err) != NAS_OK) return NAS_ERR;
  heartbeat(w);
  printf("epoch %d/%d: training loss %.4f, validation accuracy %.4f (%.1f s)\n", epoch,
         w->plan.fit.epochs, train_loss, val_accuracy, nas_monotonic() - w->started);
  fflush(stdout);
  return NAS_OK;
}

/* ---- training on several ranks (docs/spec.md, "Training on several devices") ---- */

/* The context (seeded with seed, its own allocator) and model of a thread rank other than
 * rank 0, which uses the worker's; free with rank_model_free even on failure. */
static int rank_model_new(worker *w, uint64_t seed, tr_ctx *ctx, tr_model *model, nas_err *err) {
  tr_ctx_init(ctx, seed);
  *model = (tr_model){0};
  if (!(ctx->alloc = tr_allocator_new((size_t)256 << 20))) return nas_errf(err, "out of memory");
  return worker_model_build(ctx, &w->plan, &w->data, model, err);
}

static void rank_model_free(tr_ctx *ctx, tr_model *model) {
  tr_model_free(model);
  if (ctx->alloc) tr_allocator_release(ctx->alloc);
}

/* One thread rank: rank 0 trains the worker's own model with its context, the others a
 * model of their own (FSDP gives them rank 0's parameters). */
static int thread_rank(const tr_fsdp_rank *rank, void *arg, nas_err *err) {
  worker *w = arg;
  tr_fit_ranks ranks = {rank->comm, rank->prefetch_comm, w->plan.fsdp};
  if (rank->rank == 0)
    return tr_fit_sharded(&w->ctx, w->model.module, &ranks, &w->data.all.train, &w->data.val,
                          &w->plan.fit, &w->accuracy, err);
  tr_ctx ctx;
  tr_model model;
  int rc = rank_model_new(w, w->seed + (uint64_t)rank->rank, &ctx, &model, err);
  if (rc == NAS_OK)
    rc = tr_fit_sharded(&ctx, model.module, &ranks, &w->data.all.train, &w->data.val,
                        &w->plan.fit, NULL, err);
  rank_model_free(&ctx, &model);
  return rc;
}

/* One pipeline stage (docs/engine-pipeline.md): stage 0 trains the worker's own model and
 * ends with the whole of it; the others build the same model from the same seed (and the
 * resumed weights) and train their layers of it. */
static int pipeline_stage(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  worker *w = arg;
  if (rank->stage == 0)
    return tr_fit_pipeline_stage(&w->ctx, w->model.module, rank, &w->plan.pipe,
                                 &w->data.all.train, &w->data.val, &w->plan.fit, &w->accuracy,
                                 err);
  tr_ctx ctx;
  tr_model model;
  int rc = rank_model_new(w, w->seed, &ctx, &model, err);
  if (rc == NAS_OK) rc = worker_resume(w, model.module, err);
  if (rc == NAS_OK)
    rc = tr_fit_pipeline_stage(&ctx, model.module, rank, &w->plan.pipe, &w->data.all.train,
                               &w->data.val, &w->plan.fit, NULL, err);
  rank_model_free(&ctx, &model);
  return rc;
}

/* This process as one rank of the group its launcher started; prefetch needs a second
 * group and is left out. */
static int process_rank(worker *w, nas_err *err) {
  tr_fit_ranks ranks = {w->comm, NULL, w->plan.fsdp};
  return tr_fit_sharded(&w->ctx, w->model.module, &ranks, &w->data.all.train, &w->data.val,
                        &w->plan.fit, &w->accuracy, err);
}

/* The stages' balance, computed once here so every stage cuts alike, then the stages. */
static int worker_pipeline(worker *w, nas_err *err) {
  if (tr_fit_pipeline_balance(&w->ctx, w->model.module, w->plan.pipe_balance, &w->data.all.train,
                              w->plan.fit.batch_size, w->plan.pipeline_stages, &w->plan.pipe,
                              err) != NAS_OK)
    return NAS_ERR;
  return tr_pipe_run_threads(w->plan.pipeline_stages, TR_COMM_TIMEOUT_S, pipeline_stage, w, err);
}

/* One stage as this process (an srun task): each process trains its own copy of the
 * model, which on stage 0 ends up whole. */
static int process_stage(const tr_pipe_rank *rank, void *arg, nas_err *err) {
  worker *w = arg;
  return tr_fit_pipeline_stage(&w->ctx, w->model.module, rank, &w->plan.pipe,
                               &w->data.all.train, &w->data.val, &w->plan.fit,
                               rank->stage == 0 ? &w->accuracy : NULL, err);
}

/* Stage 0's balance (n values) to every stage; NCCL moves device memory only, so there
 * it travels through the device. */
static int broadcast_balance(worker *w, double *balance, int64_t n, nas_err *err) {
  if (tr_comm_backend_of(w->comm) != TR_COMM_NCCL)
    return tr_comm_broadcast(w->comm, TR_F64, balance, n, 0, err);
  tr_tensor *host = tr_from_data(&w->ctx, TR_F64, 1, &n, balance);
  tr_tensor *dev = host ? tr_to_device(&w->ctx, host, w->plan.fit.device) : NULL;
  /* the broadcast waits for the upload: NCCL calls wait for the device's queued work */
  int rc = dev ? tr_comm_broadcast(w->comm, TR_F64, tr_data(dev), n, 0, err)
               : nas_errf(err, "%s", w->ctx.err.msg);
  for (int64_t s = 0; s < n && rc == NAS_OK; s++) balance[s] = tr_get(dev, s);
  tr_release(dev);
  tr_release(host);
  return rc;
}

/* This process as one stage of the pipeline its launcher's tasks form: stage 0's balance
 * (a measured time differs from process to process) goes to every stage first. */
static int process_pipeline(worker *w, nas_err *err) {
  int stages = w->plan.pipeline_stages;
  double balance[TR_PIPE_MAX_STAGES] = {0};
  int rc = NAS_OK;
  if (tr_comm_rank(w->comm) == 0) {
    rc = tr_fit_pipeline_balance(&w->ctx, w->model.module, w->plan.pipe_balance,
                                 &w->data.all.train, w->plan.fit.batch_size, stages,
                                 &w->plan.pipe, err);
    for (int s = 0; s < stages; s++) balance[s] = w->plan.pipe.balance[s];
  }
  /* stage 0 comes to the broadcast even when balancing failed, so no stage waits for it */
  balance[0] = rc == NAS_OK ? balance[0] : -1;
  if (broadcast_balance(w, balance, stages, err) != NAS_OK) return NAS_ERR;
  if (rc != NAS_OK) return rc;
  if (balance[0] < 0) return nas_errf(err, "pipeline stage 0 could not balance the stages");
  for (int s = 0; s < stages; s++) w->plan.pipe.balance[s] = (int)balance[s];
  return tr_pipe_run_group(w->comm, w->comm_name, TR_COMM_TIMEOUT_S, process_stage, w, err);
}

static int worker_train(worker *w, double *seconds, nas_err *err) {
  w->plan.fit.on_epoch = on_epoch;
  w->plan.fit.on_step = on_step;
  w->plan.fit.arg = w;
  w->started = w->last_beat = nas_monotonic();
  int rc;
  if (w->comm && w->plan.pipeline_stages > 1) rc = process_pipeline(w, err);
  else if (w->comm) rc = process_rank(w, err);
  else if (w->plan.devices > 1) rc = tr_fsdp_run_threads(w->plan.devices, thread_rank, w, err);
  else if (w->plan.pipeline_stages > 1)
    rc = worker_pipeline(w, err);
  else rc = tr_fit(&w->ctx, w->model.module, &w->data.all.train, &w->data.val, &w->plan.fit,
                   &w->accuracy, err);
  *seconds = nas_monotonic() - w->started;
  /* Latency, test accuracy and the weights file are measured and written on the CPU. */
  if (rc == NAS_OK && w->cuda &&
      tr_module_to_device(&w->ctx, w->model.module, TR_DEVICE_CPU) != NAS_OK)
    rc = nas_errf(err, "model back from the device: %s", w->ctx.err.msg);
  return rc;
}

/* ---- measuring and keeping the trained model ---- */

/* One batch-1 request as a server answers it: the example copied into a fresh input,
 * the forward pass, the predicted class read out. */
typedef struct {
  worker *w;             /* its heartbeats go on between requests */
  tr_ctx *ctx;
  tr_module *module;
  const tr_dataset *examples;
  int64_t next, values;  /* next example to send; values per example */
  int64_t shape[4];
} serving;

static int serve_one(void *arg, nas_err *err) {
  serving *sv = arg;
  const float *example = tr_f32(sv->examples->x) + (sv->next++ % sv->examples->n) * sv->values;
  tr_tensor *x = tr_from_data(sv->ctx, TR_F32, 4, sv->shape, example);
  tr_tensor *logits = x ? tr_module_forward(sv->ctx, sv->module, x) : NULL;
  if (logits) (void)tr_argmax(tr_f32(logits), logits->numel);
  tr_release(x);
  tr_release(logits);
  return logits ? NAS_OK : nas_errf(err, "%s", sv->ctx->err.msg);
}

static void between_requests(void *arg) { beat_when_due(((serving *)arg)->w); }

/* On one thread, in evaluation mode without a graph, cycling through validation examples;
 * heartbeats go on between requests (a large model's 1 100 requests take minutes). */
static int measure_latency(worker *w, metric_latency *out, nas_err *err) {
  const tr_input_shape *in = &w->data.all.shape;
  serving sv = {w, &w->ctx, w->model.module, &w->data.val, 0,
                in->channels * in->height * in->width,
                {1, in->channels, in->height, in->width}};
  set_threads(1);
  tr_module_train(w->model.module, false);
  bool grad = tr_set_grad_enabled(&w->ctx, false);
  int rc = metric_latency_measure_between(serve_one, between_requests, &sv,
                                          METRIC_LATENCY_WARMUP, METRIC_LATENCY_RUNS, out, err);
  tr_set_grad_enabled(&w->ctx, grad);
  tr_module_train(w->model.module, true);
  return rc;
}

/* DIR/weights.nasw (the engine's format) and DIR/model.json, which says what they are and
 * how their inputs were standardised (new inputs need the same). */
static int save_model(worker *w, const char *dir, nas_err *err) {
  const tr_input_shape *in = &w->data.all.shape;
  const tr_standardization *st = &w->data.standardization;
  char *weights = nas_asprintf("%s/weights.nasw", dir), *about = nas_asprintf("%s/model.json", dir);
  json_t *desc = json_pack("{s:s, s:s, s:O, s:[I,I,I], s:i, s:I, s:s, s:{s:f, s:f}}", "model",
                           w->s->trial.builtin->model, "dataset", w->data.all.source, "settings",
                           w->settings, "input", (json_int_t)in->channels, (json_int_t)in->height,
                           (json_int_t)in->width, "classes", (int)w->data.all.train.nclasses,
                           "params", (json_int_t)w->model.params, "weights", "weights.nasw",
                           "standardize", "mean", st->mean, "std", st->std);
  char *text = desc ? json_dumps(desc, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
  int rc = weights && about && text ? nas_mkdirs(dir, err) : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = tr_module_save(w->model.module, weights, err);
  if (rc == NAS_OK) rc = nas_write_file_atomic(about, text, strlen(text), err);
  free(weights), free(about), free(text);
  json_decref(desc);
  return rc;
}

/* Every final metric in one call: all of them are stored, or none. */
static int report_final(worker *w, double accuracy, double test_accuracy, const metric_latency *lat,
                        double seconds, nas_err *err) {
  double now = nas_now();
  metric_obs obs[] = {
      {METRIC_ACCURACY, METRIC_FINAL, accuracy, now},
      {METRIC_PARAMS, METRIC_FINAL, (double)w->model.params, now},
      {METRIC_MODEL_BYTES, METRIC_FINAL, 4.0 * (double)(w->model.params + w->model.buffers), now},
      {METRIC_FLOPS, METRIC_FINAL, (double)w->model.flops, now},
      {METRIC_LATENCY_P50, METRIC_FINAL, lat->p50_ms, now},
      {METRIC_LATENCY_P99, METRIC_FINAL, lat->p99_ms, now},
      {METRIC_TRAIN_SECONDS, METRIC_FINAL, seconds, now},
      {METRIC_TEST_ACCURACY, METRIC_FINAL, test_accuracy, now},
  };
  size_t n = sizeof obs / sizeof obs[0] - (w->data.all.test.n > 0 ? 0 : 1);
  return storage_metrics_add(w->st, w->trial.id, obs, n, -1, err);
}

/* The test split is evaluated first, on the training's threads (latency leaves one), with
 * heartbeats going on through each part, so that a trial under trial.heartbeat_timeout is
 * not lost here. */
static int worker_finish(worker *w, const char *run_dir, double accuracy, double seconds,
                         nas_err *err) {
  metric_latency lat;
  double test_accuracy = 0;
  int rc = NAS_OK;
  if (w->data.all.test.n > 0)
    rc = tr_evaluate_between(&w->ctx, w->model.module, &w->data.all.test, 0, on_step, w,
                             &test_accuracy, err);
  heartbeat(w);
  if (rc == NAS_OK) rc = measure_latency(w, &lat, err);
  heartbeat(w);
  if (rc == NAS_OK && run_dir) rc = save_model(w, run_dir, err);
  if (rc == NAS_OK && w->save_dir) rc = save_model(w, w->save_dir, err);
  if (rc == NAS_OK) rc = report_final(w, accuracy, test_accuracy, &lat, seconds, err);
  if (rc != NAS_OK) return rc;
  printf("done: accuracy %.4f", accuracy);
  if (w->data.all.test.n > 0) printf(", test accuracy %.4f", test_accuracy);
  printf(", %lld parameters, %lld bytes, %lld FLOPs, latency p50 %.4f ms p99 %.4f ms (1 thread, "
         "%d requests), %.1f s training%s%s\n",
         (long long)w->model.params, (long long)(4 * (w->model.params + w->model.buffers)),
         (long long)w->model.flops, lat.p50_ms, lat.p99_ms, lat.runs, seconds,
         run_dir ? "; weights in " : "; weights not saved (no run folder)", run_dir ? run_dir : "");
  return NAS_OK;
}

int cmd_worker(int argc, char **argv) {
  worker_args a;
  int status = parse_args(argc, argv, &a);
  if (status >= 0) {
    free(a.storage);
    return status;
  }
  worker w;
  memset(&w, 0, sizeof w);
  nas_err err;
  double seconds = 0;
  int rc = worker_open(&w, &a, &err);
  if (rc == NAS_OK) rc = worker_budget(&w, &err);
  if (rc == NAS_OK) rc = worker_devices(&w, a.run_dir, &err);
  if (rc == NAS_OK) rc = worker_state_files(&w, &err);
  if (rc == NAS_OK) rc = worker_prepare(&w, &err);
  if (rc == NAS_OK) rc = worker_train(&w, &seconds, &err);
  /* Rank 0 measures, saves and reports for the whole group. */
  if (rc == NAS_OK && lead_rank(&w)) rc = worker_finish(&w, a.run_dir, w.accuracy, seconds, &err);
  worker_close(&w);
  free(a.storage);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}
