/* comm_internal: what the backends of the collectives share (docs/engine-comm.md): the
 * descriptor of one call, the backend table behind struct tr_comm, the argument checks
 * and the rank-order reduction. Not part of the public API (trainer.h). */
#ifndef NAS_TRAINER_COMM_INTERNAL_H
#define NAS_TRAINER_COMM_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "trainer/dist.h"

typedef enum {
  COMM_BARRIER,
  COMM_ALL_REDUCE,
  COMM_ALL_GATHER,
  COMM_REDUCE_SCATTER,
  COMM_BROADCAST
} comm_kind;

/* What one rank asked for in one collective. Plain data: the process backend copies it
 * into shared memory, where other ranks read every field but the pointers' targets. */
typedef struct {
  comm_kind kind;
  tr_dtype dtype;
  tr_reduce_op op;  /* reductions only */
  int64_t count;    /* elements per rank (the chunk size of gather and scatter) */
  int root;         /* broadcast only */
  const void *send; /* borrowed from the calling rank until the call returns */
  void *recv;       /* idem; broadcast: send and recv are its one buffer */
} comm_call;

/* One backend: how a communicator of that kind runs a collective and lets go. */
typedef struct {
  tr_comm_backend kind;
  /* Runs call on comm's rank: the same verdict on every rank where the backend can
   * check arguments across ranks (the CPU backends). */
  int (*run)(tr_comm *comm, const comm_call *call, nas_err *err);
  /* Frees what comm owns and comm itself; NULL when a group owns its communicators. */
  void (*free)(tr_comm *comm);
} comm_backend;

struct tr_comm {
  const comm_backend *backend; /* static table of the backend */
  int rank, world;
  uint64_t round; /* rendezvous this rank has entered: CPU backends' slot parity */
  void *impl;     /* the backend's state: thread group (borrowed), shared segment or NCCL
                     communicator (owned) */
};

const char *comm_kind_name(comm_kind kind);
/* Whether the call alone makes sense (dtype, count, buffers, op, root in [0, world));
 * messages name rank, the rank that passed it. */
int comm_check_args(const comm_call *call, int world, int rank, nas_err *err);
/* The check every rank of a CPU backend runs on the calls of all world ranks: each one's
 * arguments, then each one against rank 0's. All ranks read the same calls, so all reach
 * the same verdict and message. */
int comm_check_calls(const comm_call *calls, int world, nas_err *err);
/* [lo, hi) of chunk rank when count elements are cut into world nearly equal chunks. */
void comm_chunk_bounds(int64_t count, int world, int rank, int64_t *lo, int64_t *hi);
/* dsts[d][i] = op over ranks r = 0, 1, ... (in that order, in dtype) of srcs[r][i], for i
 * in [0, n) and each of the n_dst destinations. A block of results is complete before any
 * of it is written, so a destination may be one of the sources. */
void comm_reduce(tr_dtype dtype, tr_reduce_op op, int world, const void *const *srcs,
                 void *const *dsts, int n_dst, int64_t n);

/* The thread backend (comm_threads.c): comm's rank has stopped calling for good (its
 * thread's function returned; failure: that function's message, or NULL), so every wait
 * for it, now or later, fails with a message saying so instead of waiting forever. */
void comm_threads_leave(tr_comm *comm, const char *failure);

/* Whether name can name a group or a pipeline's segment (comm_join.c): it becomes part of
 * a file name in /dev/shm, so 1 to TR_COMM_NAME_MAX - 1 letters, digits, '.', '_' or '-',
 * not starting with '.'. */
bool comm_name_ok(const char *name);

/* The process backend (comm_shm.c): joins the group named opts->name on this node. */
int comm_shm_join(const tr_comm_options *opts, tr_comm **out, nas_err *err);

/* Shared-memory helpers of comm_shm.c that the pipeline's process transport
 * (pipeline_shm.c) uses too. */
/* The inode of this process's pid namespace (0: unknown); pids compare only within one. */
uint64_t comm_pid_namespace(void);
/* Whether process pid has ended: gone, or a zombie its parent has not reaped yet. */
bool comm_pid_exited(pid_t pid);
/* Makes a process-shared robust mutex and a CLOCK_MONOTONIC condition variable. */
int comm_shm_init_sync(pthread_mutex_t *lock, pthread_cond_t *cond, nas_err *err);
/* Creates the file path (O_EXCL) of size bytes, reserves its pages and maps it; on
 * failure nothing is left. */
void *comm_shm_map_new(const char *path, size_t bytes, nas_err *err);
/* The NCCL backend (comm_nccl_join.c): meets the other ranks, then makes the communicator. */
int comm_nccl_join(const tr_comm_options *opts, tr_comm **out, nas_err *err);

#endif
