/* trainer/dist.h: distributed training on the engine — collectives between ranks (threads,
 * processes on one node, or CUDA devices over NCCL) and fully sharded data parallel
 * training (FSDP) built on them: the API of trainer/dist/; docs/engine-comm.md and
 * docs/engine-fsdp.md tell the design. */
#ifndef NAS_TRAINER_DIST_H
#define NAS_TRAINER_DIST_H

#include "trainer/trainer.h"

/* ================================================================ collectives
 *
 * A communicator group joins world ranks that run the same program in lockstep; each rank
 * calls the same collectives in the same order with matching arguments (NCCL's and MPI's
 * contract). Three backends sit behind the same calls (docs/engine-comm.md):
 *   threads    ranks are threads of one process (tr_comm_group_new);
 *   processes  ranks are processes on one node, meeting in POSIX shared memory;
 *   NCCL       one CUDA device per rank, on any number of nodes; buffers in device memory.
 * Processes form a group by a name (tr_comm_join), which tr_comm_init_env takes from the
 * environment `srun` gives its tasks (SLURM_PROCID, SLURM_NTASKS, ...) or from NAS_RANK,
 * NAS_WORLD and NAS_COMM_ID.
 *
 * - Buffers are contiguous arrays of count elements of dtype (float32 or float64). send and
 *   recv may be the same pointer (in place) where noted; the buffers of different ranks must
 *   not overlap. A call returns when this rank's output is complete and its input may be
 *   reused.
 * - CPU backends: sums are taken in rank order, ((x0 + x1) + x2) + ..., in the buffer's
 *   dtype, whatever the world size or which rank computes them, so results are
 *   bit-identical run to run. TR_REDUCE_AVG divides that sum by world. NCCL sums in the
 *   order of its rings and trees: equal within rounding.
 * - CPU backends: arguments are checked on every rank against every other rank's: a
 *   mismatch (another collective, dtype, count, root or reduce op) or a bad argument on any
 *   rank makes the call fail on all ranks with the same message, and the group stays
 *   usable. NCCL checks each rank's own arguments only.
 * - Processes and NCCL: a rank never waits for the others longer than the group's timeout,
 *   and (processes) stops waiting as soon as a rank it waits for has exited; it then fails
 *   with a message naming the ranks it waited for, the group is broken, and every rank's
 *   calls fail from then on. Threads wait without a limit. */

typedef struct tr_comm_group tr_comm_group;
typedef struct tr_comm tr_comm;

typedef enum { TR_REDUCE_SUM = 0, TR_REDUCE_AVG = 1 } tr_reduce_op;

/* Shared state for world thread ranks (world >= 1); NULL with err set on failure. */
tr_comm_group *tr_comm_group_new(int world, nas_err *err);
/* Frees the group and its communicators; no rank may be inside a call. */
void tr_comm_group_free(tr_comm_group *group);
/* The communicator of rank (borrowed from the group), for the thread that plays it; NULL
 * with err set when rank is not in [0, world). */
tr_comm *tr_comm_group_comm(tr_comm_group *group, int rank, nas_err *err);
int tr_comm_rank(const tr_comm *comm);
int tr_comm_world(const tr_comm *comm);

/* recv = op over all ranks of send (count elements each); in place allowed. */
int tr_comm_all_reduce(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                       int64_t count, tr_reduce_op op, nas_err *err);
/* recv (world * count) = the send (count) of rank 0, then rank 1, ...; in place allowed
 * when send is recv + rank * count. */
int tr_comm_all_gather(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                       int64_t count, nas_err *err);
/* recv (count) = op over all ranks of chunk `rank` of send (world * count); in place
 * allowed when recv is send + rank * count. */
int tr_comm_reduce_scatter(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                           int64_t count, tr_reduce_op op, nas_err *err);
/* buf (count) on every rank = buf of rank root. */
int tr_comm_broadcast(tr_comm *comm, tr_dtype dtype, void *buf, int64_t count, int root,
                      nas_err *err);
/* Returns once every rank has called it; whatever a rank wrote before is visible to all
 * ranks after. */
int tr_comm_barrier(tr_comm *comm, nas_err *err);

typedef enum {
  TR_COMM_THREADS = 0,   /* tr_comm_group_new */
  TR_COMM_PROCESSES = 1, /* processes on one node, over POSIX shared memory */
  TR_COMM_NCCL = 2       /* a CUDA device per rank, any nodes (CUDA=1 builds) */
} tr_comm_backend;

/* Default longest wait for another rank: generous, since ranks may rightly wait minutes
 * for a slow one (rank 0 evaluating); an exited rank is noticed at once anyway. */
#define TR_COMM_TIMEOUT_S 600.0
#define TR_COMM_NAME_MAX 128

/* How this process joins a group of processes. */
typedef struct {
  tr_comm_backend backend; /* TR_COMM_PROCESSES or TR_COMM_NCCL */
  int rank, world;         /* 0 <= rank < world */
  int local_rank;          /* rank among the group's ranks on this node; NCCL uses CUDA
                              device local_rank mod the number of devices it sees */
  int nodes;               /* nodes the ranks run on (1 for one node); processes need 1 */
  /* The group's name: letters, digits, '.', '_', '-'; unique among the groups that may
   * exist at the same time (on this node, or in run_dir). */
  char name[TR_COMM_NAME_MAX];
  /* Borrowed, may be NULL. NCCL: a folder every rank sees (the trial's run folder on a
   * shared filesystem), where rank 0 publishes its NCCL id; required when nodes > 1, and
   * used whenever given. Without it one node meets in shared memory. */
  const char *run_dir;
  double timeout_s;   /* longest wait for another rank, joining and in each call; <= 0:
                         TR_COMM_TIMEOUT_S */
  size_t stage_bytes; /* processes: shared memory each rank stages its buffers through
                         per round (a call moves larger buffers in pieces); 0: 1 MiB */
} tr_comm_options;

/* Fills rank, world, local_rank, nodes and name of opts from the environment, leaving the
 * other fields alone: NAS_RANK, NAS_WORLD and NAS_COMM_ID (the name) when NAS_RANK is set
 * (processes a launcher starts on one node); else, in a task of srun, SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES and the name "slurm-JOB.STEP" from
 * SLURM_JOB_ID and SLURM_STEP_ID, prefixed by "NAS_COMM_ID-" when that is set. An error
 * names the variable that is missing or malformed. */
int tr_comm_env(tr_comm_options *opts, nas_err *err);
/* Joins the group opts describes and returns this rank's communicator in *out (owned:
 * tr_comm_free). Every rank of the group calls it; it returns once all world ranks have
 * joined, or fails after opts->timeout_s naming the ranks that did not come. */
int tr_comm_join(const tr_comm_options *opts, tr_comm **out, nas_err *err);
/* tr_comm_env, then tr_comm_join. opts (may be NULL: processes, default timeout) gives
 * backend, run_dir, timeout_s and stage_bytes. */
int tr_comm_init_env(const tr_comm_options *opts, tr_comm **out, nas_err *err);
/* Frees a communicator made by tr_comm_join (not collective: each rank frees its own once
 * it is done with its calls). NULL and communicators of a tr_comm_group are ignored. */
void tr_comm_free(tr_comm *comm);
tr_comm_backend tr_comm_backend_of(const tr_comm *comm);

/* ================================================================ FSDP
 *
 * Fully sharded data parallel training in the sense of PyTorch's FSDP
 * (docs/engine-fsdp.md). Every rank holds the same model (a Sequential), its own tr_ctx
 * with its own allocator, and a slice of each global batch. The model is cut into units
 * along its children; each unit's parameters become one flat buffer, padded to a multiple
 * of world and split evenly, and a rank keeps only its shard, the shard's gradient and the
 * optimiser state of the shard. A unit's full parameters are all-gathered before its
 * forward and again before its backward and freed after; its gradient is reduce-scattered
 * (averaged) so each rank keeps the gradient of its shard. Each unit is one autograd node
 * (FsdpUnitBackward) in the rank's graph, so tr_backward drives all of it.
 *
 * Contract (as for collectives): every rank calls the same tr_fsdp functions in the same
 * order with the same shapes; the loss is the mean over the rank's slice, so the averaged
 * gradient is the gradient of the mean over the global batch. While a tr_fsdp lives, the
 * model's parameter tensors hold data only between tr_fsdp_summon_full and
 * tr_fsdp_release_full (always in mode none); graphs made by tr_fsdp_forward must go before
 * the tr_fsdp does. Ranks are threads (tr_fsdp_run_threads) or processes over a CPU
 * communicator for a model on the CPU; for a model on a CUDA device (ctx->cuda its engine)
 * every FSDP buffer lives on that device and the communicator must be NCCL's (one GPU per
 * rank; no prefetch there). Batch norm keeps per-rank batch statistics (no sync batch
 * norm); its running statistics start from rank 0's. */

typedef enum {
  TR_SHARD_FULL = 0,    /* parameters, gradients and optimiser state sharded; full
                           parameters gathered per unit for its forward and its backward */
  TR_SHARD_GRAD_OP = 1, /* gradients and optimiser state sharded; full parameters gathered
                           once per step in forward and kept until the unit's backward */
  TR_SHARD_NONE = 2     /* plain data parallel: full parameters, gradients and optimiser on
                           every rank; gradients all-reduced (averaged) */
} tr_shard_mode;

typedef struct {
  tr_shard_mode mode;
  /* Unit policy. 0: one unit per child of the model that has parameters. > 0: consecutive
   * children grouped until a unit holds at least this many parameters (a smaller rest is a
   * unit of its own). Parameterless children ride along in the unit before them (the first
   * unit for leading ones). */
  int64_t unit_params;
  bool checkpoint; /* activation checkpointing per unit: the forward keeps only the unit's
                      input; backward recomputes the unit (same dropout masks) */
  bool prefetch;   /* all-gather the next unit (forward order in forward, reverse in
                      backward) on a helper thread while this one computes; needs
                      prefetch_comm; nothing to do in mode none. Results are bit-identical. */
} tr_fsdp_config;

typedef struct tr_fsdp tr_fsdp;

/* Wraps model (borrowed; it must outlive the tr_fsdp) for the rank of comm (borrowed).
 * prefetch_comm (borrowed, may be NULL without prefetch) is this rank's communicator in a
 * second group of the same world, used only for prefetch. A collective call: every rank's
 * model gets rank 0's parameters and buffers, then the parameters are sharded (the model's
 * parameter tensors become views of the units' flat buffers; old gradients are dropped).
 * ctx must have an allocator (per-rank memory accounting). NULL with ctx->err set: a
 * config or model that makes no sense is refused before the model is touched. */
tr_fsdp *tr_fsdp_new(tr_ctx *ctx, tr_module *model, tr_comm *comm, tr_comm *prefetch_comm,
                     const tr_fsdp_config *cfg);
/* Waits for prefetches in flight, then frees the shards and buffers. The model's parameter
 * tensors keep their data only if it was summoned (or in mode none); otherwise the model
 * may only be freed. */
void tr_fsdp_free(tr_fsdp *f);
int tr_fsdp_unit_count(const tr_fsdp *f);

/* This rank's slice [*start, *start + *count) of a global batch of `global` examples;
 * an error unless global is a positive multiple of world. */
int tr_fsdp_batch_slice(const tr_fsdp *f, int64_t global, int64_t *start, int64_t *count,
                        nas_err *err);

/* The model's forward on this rank's slice x (borrowed), unit by unit. With grad mode on
 * the result's graph holds one FsdpUnitBackward node per unit. */
tr_tensor *tr_fsdp_forward(tr_ctx *ctx, tr_fsdp *f, tr_tensor *x);
/* tr_backward from loss (one element), then waits for any prefetch still in flight. After
 * it, each rank's shard tensors carry the averaged gradient of their shard. */
int tr_fsdp_backward(tr_ctx *ctx, tr_fsdp *f, tr_tensor *loss);

/* An optimiser (owned by the caller; tr_optim_step/zero_grad/free as usual) over this
 * rank's flat shards: its state is sharded too. Mode none: over the full flat buffers. */
tr_optim *tr_fsdp_optim_new(tr_ctx *ctx, tr_fsdp *f, const tr_optim_config *cfg);
/* Gradient clipping by the global norm over all ranks (an all-reduce of the squared
 * norms of the shards): as tr_clip_grad_norm on the unsharded model. *norm (may be NULL)
 * gets the norm before clipping. A collective call. */
int tr_fsdp_clip_grad_norm(tr_ctx *ctx, tr_fsdp *f, double max_norm, double *norm);
/* values (n host float64s) = op over all ranks of values, on f's main communicator: what a
 * training loop adds up between steps (losses, failure flags). For a device model the
 * values travel through device memory, the only memory NCCL moves. A collective call. */
int tr_fsdp_all_reduce_host(tr_ctx *ctx, tr_fsdp *f, double *values, int64_t n,
                            tr_reduce_op op);

/* Gathers every unit's full parameters into the model's own parameter tensors, so the
 * model can be evaluated (tr_evaluate, tr_module_forward), saved or read on any rank;
 * release hands the memory back. Both are collective calls (release only for symmetry: it
 * moves no data). An optimiser step while summoned is fine: the next use re-gathers. */
int tr_fsdp_summon_full(tr_ctx *ctx, tr_fsdp *f);
int tr_fsdp_release_full(tr_ctx *ctx, tr_fsdp *f);

/* What this rank holds. */
typedef struct {
  int units;
  int64_t params;      /* parameters of the whole model (unsharded) */
  int64_t local;       /* parameter values this rank keeps between steps: its shards with
                          padding (all parameters in mode none); gradients and optimiser
                          state match it */
  tr_alloc_stats alloc; /* the rank's allocator: in_use, peak, cached bytes (a model on a
                           CUDA device: its engine's device allocator) */
} tr_fsdp_memory;
void tr_fsdp_memory_stats(const tr_fsdp *f, tr_fsdp_memory *out);

/* A driver for ranks that are threads: starts world threads, each running fn with its
 * rank's communicators (a main group and a prefetch group made here), joins them and
 * returns the first failing rank's error ("rank 2: ..."). Each thread gets an equal share
 * of the process's OpenMP threads (at least one). fn must make its own tr_ctx and
 * allocator. A rank that fails alone while the others wait in a collective hangs them, as
 * with NCCL: fail on all ranks alike (the collectives' own checks do). */
typedef struct {
  int rank, world;
  tr_comm *comm;          /* borrowed: the main group */
  tr_comm *prefetch_comm; /* borrowed: the prefetch group */
} tr_fsdp_rank;
typedef int (*tr_fsdp_rank_fn)(const tr_fsdp_rank *rank, void *arg, nas_err *err);
int tr_fsdp_run_threads(int world, tr_fsdp_rank_fn fn, void *arg, nas_err *err);

#endif
