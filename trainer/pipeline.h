/* trainer/pipeline.h: pipeline parallel training after GPipe (torchgpipe): a Sequential cut
 * into consecutive stages, one per rank, with each mini-batch split into micro-batches that
 * stream through the stages in GPipe's fill-drain order; the API of trainer/dist/pipeline*.c
 * (docs/engine-pipeline.md tells the design).
 *
 * Contract: every stage builds the same model (same layers, same seed), makes a tr_pipe over
 * its own copy with the same config, and calls the same tr_pipe functions in the same order
 * with the same batch sizes; stage s then owns and trains children [first, first + count)
 * of the model's top Sequential, and the pipeline's model is the union of the stages'
 * layers. Stage 0 alone reads the inputs, the last stage alone the labels (through the
 * loss callback). Gradients accumulate over the micro-batches, so one optimiser step per
 * mini-batch trains as one rank would on the whole mini-batch (batch norm aside: it
 * normalises each micro-batch, as GPipe's does).
 *
 * Failures: a stage that fails, or waits for another longer than the pipeline's timeout,
 * aborts the pipeline: every stage's pending and later calls fail with that one message
 * ("pipeline stage 2: ..."). Ranks are threads of one process (tr_pipe_run_threads),
 * processes on one node over shared memory (tr_pipe_run_process), or processes on CUDA
 * devices over NCCL (tr_pipe_run_group with an NCCL group); the stage code is the same
 * for all, a GPU stage having its model on its device and ctx->cuda set to its engine. */
#ifndef NAS_TRAINER_PIPELINE_H
#define NAS_TRAINER_PIPELINE_H

#include "trainer/dist.h"
#include "trainer/trainer.h"

#define TR_PIPE_MAX_STAGES 16

/* torchgpipe's checkpoint modes: which micro-batches keep only their stage input in the
 * forward and recompute the stage (same dropout masks) just before its backward. */
typedef enum {
  TR_PIPE_CKPT_EXCEPT_LAST = 0, /* all but the last micro-batch (torchgpipe's default) */
  TR_PIPE_CKPT_ALWAYS = 1,
  TR_PIPE_CKPT_NEVER = 2
} tr_pipe_checkpoint;

typedef struct {
  int chunks; /* micro-batches per mini-batch (>= 1; a mini-batch needs at least as many
                 examples) */
  tr_pipe_checkpoint checkpoint;
  /* Children of the model per stage, summing to the model's children; all zero: as even
   * a split by count as there is (tr_pipe_balance_* compute better ones). */
  int balance[TR_PIPE_MAX_STAGES];
  /* The batch norms of a stage (inside its children too) update their running statistics
   * once per mini-batch, from the statistics of the whole mini-batch (torchgpipe's
   * DeferredBatchNorm), instead of once per micro-batch. */
  bool deferred_batch_norm;
} tr_pipe_config;

/* ---------------------------------------------------------------- ranks */

typedef struct tr_pipe_world tr_pipe_world;

typedef struct {
  int stage, stages;
  tr_pipe_world *world; /* borrowed: what the stages share (queues, abort, step barrier) */
} tr_pipe_rank;
typedef int (*tr_pipe_rank_fn)(const tr_pipe_rank *rank, void *arg, nas_err *err);

/* Runs fn on `stages` threads (1..TR_PIPE_MAX_STAGES), one per stage, each with an equal
 * share of the OpenMP threads, and returns the pipeline's abort message, or else the first
 * failing stage's error. timeout_s (> 0) bounds every wait of a stage for another. fn must
 * make its own tr_ctx and allocator. A stage whose fn fails aborts the pipeline, so the
 * others stop waiting for it. */
int tr_pipe_run_threads(int stages, double timeout_s, tr_pipe_rank_fn fn, void *arg,
                        nas_err *err);

/* This process is stage `stage` of `stages` processes on one node that meet by name (the
 * same on every stage, unique to the launch; [A-Za-z0-9._-], under 64 characters): joins
 * them (each waits up to timeout_s for the others), runs fn, and returns as
 * tr_pipe_run_threads does. Stages exchange tensors through mailboxes in a shared-memory
 * segment (/dev/shm/nas-pipe-NAME, unlinked once all have joined); a stage whose process
 * exits while another waits for it fails every stage with one message naming it. A
 * process that forks its stages after it ran parallel ops releases OpenMP's threads first
 * (omp_pause_resource_all(omp_pause_hard)): libgomp's pool does not survive fork, and a
 * child's first parallel region would wait forever for its threads. */
int tr_pipe_run_process(const char *name, int stage, int stages, double timeout_s,
                        tr_pipe_rank_fn fn, void *arg, nas_err *err);
/* The same for a process group this process has joined already (borrowed): stage
 * tr_comm_rank(group) of tr_comm_world(group). A TR_COMM_PROCESSES group (as srun tasks
 * form one) meets in the segment that name names, as above (a name of other characters
 * is refused); a TR_COMM_NCCL group sends device tensors with NCCL, each stage on its
 * GPU, its waits bounded by the group's own timeout, and a stage that fails fails the
 * others only when their wait times out. */
int tr_pipe_run_group(tr_comm *group, const char *name, double timeout_s, tr_pipe_rank_fn fn,
                      void *arg, nas_err *err);

/* ---------------------------------------------------------------- a stage */

typedef struct tr_pipe tr_pipe;

/* The loss of one micro-batch on the last stage: out (borrowed) is the model's output for
 * examples [start, start + count) of the mini-batch; returns the mean loss over them
 * (owned, one element, with grad), or NULL with ctx->err set. */
typedef tr_tensor *(*tr_pipe_loss_fn)(tr_ctx *ctx, tr_tensor *out, int64_t start,
                                      int64_t count, void *arg);

/* This rank's stage over model (borrowed; it must outlive the tr_pipe). NULL with ctx->err
 * set when the config or the balance does not fit the model. */
tr_pipe *tr_pipe_new(tr_ctx *ctx, tr_module *model, const tr_pipe_rank *rank,
                     const tr_pipe_config *cfg);
void tr_pipe_free(tr_pipe *p);
/* The children this stage owns: [*first, *first + *count). */
void tr_pipe_layers(const tr_pipe *p, int *first, int *count);

/* One mini-batch of `batch` examples forward and backward through the pipeline (a
 * collective call of all stages): x (borrowed, (batch, ...)) on stage 0, NULL elsewhere;
 * loss_fn on the last stage (ignored elsewhere). Gradients accumulate into the stage's
 * parameters; *loss (may be NULL) gets the mini-batch mean loss on every stage. */
int tr_pipe_train_step(tr_ctx *ctx, tr_pipe *p, tr_tensor *x, int64_t batch,
                       tr_pipe_loss_fn loss_fn, void *loss_arg, double *loss);
/* An optimiser (owned by the caller) over this stage's parameters. */
tr_optim *tr_pipe_optim_new(tr_ctx *ctx, tr_pipe *p, const tr_optim_config *cfg);
/* Copies every stage's parameters and buffers into stage 0's model, which then holds the
 * whole trained model (to evaluate or save it). A collective call. */
int tr_pipe_gather_model(tr_ctx *ctx, tr_pipe *p);

/* ---------------------------------------------------------------- balance
 *
 * A balance (children per stage, into balance[0..stages)) that minimises the largest
 * stage's cost, keeping children in order and at least one per stage. By time: each
 * child's measured forward and backward time on sample (borrowed, a batch the model takes),
 * best of `repeats` runs; by size: each child's parameters and gradients plus the
 * activation it outputs for sample, in bytes; or given costs (one per child). */
int tr_pipe_balance_by_time(tr_ctx *ctx, tr_module *model, tr_tensor *sample, int stages,
                            int repeats, int *balance);
int tr_pipe_balance_by_size(tr_ctx *ctx, tr_module *model, tr_tensor *sample, int stages,
                            int *balance);
int tr_pipe_balance_costs(const double *costs, int n, int stages, int *balance, nas_err *err);

/* What this stage holds: its allocator's in-use and peak bytes, and its parameters. */
typedef struct {
  int64_t params;
  tr_alloc_stats alloc;
} tr_pipe_memory;
void tr_pipe_memory_stats(const tr_pipe *p, tr_ctx *ctx, tr_pipe_memory *out);

#endif
