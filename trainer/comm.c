/* comm: collectives (all-reduce, all-gather, reduce-scatter, broadcast, barrier) for ranks
 * that are threads of one process over shared memory: the CPU backend of trainer.h's
 * communicator, on which data-parallel and sharded training stand (docs/engine-comm.md).
 *
 * Every collective is a rendezvous. A rank writes what it was asked (a comm_call: which
 * collective, dtype, count, buffers) into its slot and waits at the group's barrier; then
 * every rank reads all the slots. All ranks see the same slots, so they reach the same
 * verdict on whether the call is valid, and on a mismatch all of them return the same
 * message and nobody is left waiting. A valid call then moves data straight between the
 * ranks' buffers (each rank reads the others' inputs in place, no staging copy) and waits
 * at the barrier once more, so no rank returns and reuses its input while another still
 * reads it, nor reads its output while another still writes it.
 *
 * Invariants:
 * - Slots are double-buffered by round parity: a fast rank may write its slot for round
 *   k+1 while a slow one still reads round k's; round k+2 reuses a slot only after every
 *   rank reached round k+1's first barrier, so after all have finished with round k.
 * - Reductions cut the elements into world chunks and rank r alone reads and writes chunk
 *   r of every rank's buffers, so in-place calls have no races. Each element is summed in
 *   rank order, x0 + x1 + ..., in its dtype, whichever rank computes it: the result does
 *   not depend on the chunking, the thread timing, or the run.
 * - All shared state is guarded by the group's mutex; the barrier's lock and unlock order
 *   every write a rank made before it before every read another rank makes after it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/internal.h"

#define KERN_FILE "trainer/kern_comm.h"
#include "trainer/kern_both.h"

typedef enum {
  COMM_BARRIER,
  COMM_ALL_REDUCE,
  COMM_ALL_GATHER,
  COMM_REDUCE_SCATTER,
  COMM_BROADCAST
} comm_kind;

static const char *const comm_kind_names[] = {"barrier", "all_reduce", "all_gather",
                                              "reduce_scatter", "broadcast"};

/* What one rank asked for in one round. */
typedef struct {
  comm_kind kind;
  tr_dtype dtype;
  tr_reduce_op op;  /* reductions only */
  int64_t count;    /* elements per rank (the chunk size of gather and scatter) */
  int root;         /* broadcast only */
  const void *send; /* borrowed from the calling rank until the round ends */
  void *recv;       /* idem; broadcast: send and recv are its one buffer */
} comm_call;

struct tr_comm {
  tr_comm_group *group; /* borrowed: the group owns its communicators */
  int rank;
  uint64_t round; /* collectives this rank has entered: picks the slot parity */
};

struct tr_comm_group {
  int world;
  pthread_mutex_t lock;
  pthread_cond_t released; /* signalled when the last rank reaches the barrier */
  int arrived;             /* ranks waiting at the barrier now */
  uint64_t generation;     /* barriers completed: a waiter leaves when it changes */
  comm_call *slots;        /* owned, 2 * world: [parity * world + rank] */
  tr_comm *comms;          /* owned, world */
};

/* Bytes of the stack block a reduction sums through (fits L1 with its sources). */
#define COMM_BLOCK_BYTES 8192

/* ---------------------------------------------------------------- group */

tr_comm_group *tr_comm_group_new(int world, nas_err *err) {
  if (world < 1) {
    nas_errf(err, "comm group: world size must be at least 1, got %d", world);
    return NULL;
  }
  tr_comm_group *g = calloc(1, sizeof *g);
  if (!g) {
    nas_errf(err, "comm group of %d ranks: out of memory", world);
    return NULL;
  }
  g->world = world;
  g->slots = calloc(2 * (size_t)world, sizeof *g->slots);
  g->comms = calloc((size_t)world, sizeof *g->comms);
  bool locked = g->slots && g->comms && pthread_mutex_init(&g->lock, NULL) == 0;
  if (!locked || pthread_cond_init(&g->released, NULL) != 0) {
    if (locked) pthread_mutex_destroy(&g->lock);
    free(g->slots);
    free(g->comms);
    free(g);
    nas_errf(err, "comm group of %d ranks: out of memory or synchronisation objects", world);
    return NULL;
  }
  for (int r = 0; r < world; r++) g->comms[r] = (tr_comm){.group = g, .rank = r};
  return g;
}

void tr_comm_group_free(tr_comm_group *group) {
  if (!group) return;
  pthread_cond_destroy(&group->released);
  pthread_mutex_destroy(&group->lock);
  free(group->slots);
  free(group->comms);
  free(group);
}

tr_comm *tr_comm_group_comm(tr_comm_group *group, int rank, nas_err *err) {
  if (!group) {
    nas_errf(err, "comm group: no group");
    return NULL;
  }
  if (rank < 0 || rank >= group->world) {
    nas_errf(err, "comm group: rank %d is not in [0, %d)", rank, group->world);
    return NULL;
  }
  return &group->comms[rank];
}

int tr_comm_rank(const tr_comm *comm) { return comm->rank; }
int tr_comm_world(const tr_comm *comm) { return comm->group->world; }

/* Blocks until all world ranks have called it (a generation-counting barrier: the
 * generation, not the arrival count, tells a waiter it may go, so a rank that races ahead
 * into the next barrier cannot confuse one still waking from this one). */
static void group_wait(tr_comm_group *g) {
  pthread_mutex_lock(&g->lock);
  uint64_t generation = g->generation;
  if (++g->arrived == g->world) {
    g->arrived = 0;
    g->generation++;
    pthread_cond_broadcast(&g->released);
  } else {
    while (generation == g->generation) pthread_cond_wait(&g->released, &g->lock);
  }
  pthread_mutex_unlock(&g->lock);
}

/* ---------------------------------------------------------------- checks */

static bool comm_is_reduction(comm_kind kind) {
  return kind == COMM_ALL_REDUCE || kind == COMM_REDUCE_SCATTER;
}

/* Whether rank's own call makes sense on its own. */
static int call_check_args(const comm_call *c, int world, int rank, nas_err *err) {
  const char *name = comm_kind_names[c->kind];
  if (c->kind == COMM_BARRIER) return NAS_OK;
  if (c->dtype != TR_F32 && c->dtype != TR_F64)
    return nas_errf(err, "%s: rank %d passed unknown dtype %d", name, rank, (int)c->dtype);
  /* gather and scatter address world * count elements */
  if (c->count < 0 || c->count > PTRDIFF_MAX / 8 / world)
    return nas_errf(err, "%s: rank %d passed count %lld", name, rank, (long long)c->count);
  if (c->count > 0 && (!c->send || !c->recv))
    return nas_errf(err, "%s: rank %d passed a NULL buffer", name, rank);
  if (comm_is_reduction(c->kind) && c->op != TR_REDUCE_SUM && c->op != TR_REDUCE_AVG)
    return nas_errf(err, "%s: rank %d passed unknown reduce op %d", name, rank, (int)c->op);
  if (c->kind == COMM_BROADCAST && (c->root < 0 || c->root >= world))
    return nas_errf(err, "%s: rank %d passed root %d, not in [0, %d)", name, rank, c->root, world);
  return NAS_OK;
}

/* Whether rank's call agrees with rank 0's on everything all ranks must share. */
static int call_check_match(const comm_call *c0, const comm_call *c, int rank, nas_err *err) {
  const char *name = comm_kind_names[c0->kind];
  if (c->kind != c0->kind)
    return nas_errf(err, "collective mismatch: rank %d called %s while rank 0 called %s", rank,
                    comm_kind_names[c->kind], name);
  if (c->kind == COMM_BARRIER) return NAS_OK;
  if (c->dtype != c0->dtype)
    return nas_errf(err, "%s: rank %d passed dtype %s, rank 0 %s", name, rank,
                    c->dtype == TR_F32 ? "float32" : "float64",
                    c0->dtype == TR_F32 ? "float32" : "float64");
  if (c->count != c0->count)
    return nas_errf(err, "%s: rank %d passed count %lld, rank 0 %lld", name, rank,
                    (long long)c->count, (long long)c0->count);
  if (comm_is_reduction(c->kind) && c->op != c0->op)
    return nas_errf(err, "%s: rank %d passed reduce op %d, rank 0 %d", name, rank, (int)c->op,
                    (int)c0->op);
  if (c->kind == COMM_BROADCAST && c->root != c0->root)
    return nas_errf(err, "broadcast: rank %d passed root %d, rank 0 %d", rank, c->root, c0->root);
  return NAS_OK;
}

/* Posts this rank's call, waits for all ranks, and checks all calls together; *calls gets
 * the round's slots (one per rank). Every rank returns the same verdict and message. */
static int comm_rendezvous(tr_comm *comm, const comm_call *call, const comm_call **calls,
                           nas_err *err) {
  tr_comm_group *g = comm->group;
  comm_call *round = g->slots + (size_t)(comm->round++ & 1) * (size_t)g->world;
  round[comm->rank] = *call;
  group_wait(g);
  *calls = round;
  for (int r = 0; r < g->world; r++)
    if (call_check_args(&round[r], g->world, r, err) != NAS_OK) return NAS_ERR;
  for (int r = 1; r < g->world; r++)
    if (call_check_match(&round[0], &round[r], r, err) != NAS_OK) return NAS_ERR;
  return NAS_OK;
}

/* ---------------------------------------------------------------- data movement */

/* [lo, hi) of chunk rank when count elements are cut into world nearly equal chunks. */
static void chunk_bounds(int64_t count, int world, int rank, int64_t *lo, int64_t *hi) {
  int64_t base = count / world, extra = count % world;
  *lo = rank * base + (rank < extra ? rank : extra);
  *hi = *lo + base + (rank < extra ? 1 : 0);
}

static const char *at(const void *p, int64_t i, size_t size) {
  return (const char *)p + (size_t)i * size;
}

/* block[0..n) = the reduce op over ranks, in rank order, of send[from, from + n). */
static void reduce_block(const comm_call *calls, int world, int64_t from, int64_t n, void *block) {
  tr_dtype dtype = calls[0].dtype;
  size_t size = tr_dtype_size(dtype);
  memcpy(block, at(calls[0].send, from, size), (size_t)n * size);
  for (int r = 1; r < world; r++)
    TR_DISPATCH(dtype, comm_add, block, at(calls[r].send, from, size), n);
  if (calls[0].op == TR_REDUCE_AVG) TR_DISPATCH(dtype, comm_div, block, n, world);
}

/* Reduces send[lo, hi) over ranks block by block; element i of the result goes to
 * recv[i + dst_shift] of the ranks in [dst_first, dst_end). */
static void reduce_range(const comm_call *calls, int world, int64_t lo, int64_t hi,
                         int64_t dst_shift, int dst_first, int dst_end) {
  _Alignas(64) unsigned char block[COMM_BLOCK_BYTES];
  size_t size = tr_dtype_size(calls[0].dtype);
  int64_t step = (int64_t)(sizeof block / size);
  for (int64_t from = lo; from < hi; from += step) {
    int64_t n = hi - from < step ? hi - from : step;
    reduce_block(calls, world, from, n, block);
    for (int r = dst_first; r < dst_end; r++)
      memcpy((char *)calls[r].recv + (size_t)(from + dst_shift) * size, block, (size_t)n * size);
  }
}

/* ---------------------------------------------------------------- collectives */

/* Runs the round: rendezvous, this rank's share of the data movement, final barrier. */
static int comm_run(tr_comm *comm, const comm_call *call, nas_err *err) {
  if (!comm) return nas_errf(err, "%s: no communicator", comm_kind_names[call->kind]);
  const comm_call *calls;
  if (comm_rendezvous(comm, call, &calls, err) != NAS_OK) return NAS_ERR;
  if (call->kind == COMM_BARRIER) return NAS_OK;
  int world = comm->group->world, rank = comm->rank;
  int64_t count = call->count;
  size_t size = tr_dtype_size(call->dtype);
  int64_t lo, hi;
  switch (call->kind) {
  case COMM_ALL_REDUCE:
    chunk_bounds(count, world, rank, &lo, &hi);
    reduce_range(calls, world, lo, hi, 0, 0, world);
    break;
  case COMM_REDUCE_SCATTER: /* chunk rank of every send, into this rank's recv */
    reduce_range(calls, world, rank * count, (rank + 1) * count, -rank * count, rank, rank + 1);
    break;
  case COMM_ALL_GATHER:
    for (int r = 0; r < world; r++) {
      char *dst = (char *)call->recv + (size_t)(r * count) * size;
      if (dst != calls[r].send) memcpy(dst, calls[r].send, (size_t)count * size);
    }
    break;
  case COMM_BROADCAST:
    if (rank != call->root) memcpy(call->recv, calls[call->root].send, (size_t)count * size);
    break;
  case COMM_BARRIER:
    break;
  }
  group_wait(comm->group);
  return NAS_OK;
}

int tr_comm_all_reduce(tr_comm *comm, tr_dtype dtype, const void *send, void *recv, int64_t count,
                       tr_reduce_op op, nas_err *err) {
  comm_call call = {COMM_ALL_REDUCE, dtype, op, count, 0, send, recv};
  return comm_run(comm, &call, err);
}

int tr_comm_all_gather(tr_comm *comm, tr_dtype dtype, const void *send, void *recv, int64_t count,
                       nas_err *err) {
  comm_call call = {COMM_ALL_GATHER, dtype, TR_REDUCE_SUM, count, 0, send, recv};
  return comm_run(comm, &call, err);
}

int tr_comm_reduce_scatter(tr_comm *comm, tr_dtype dtype, const void *send, void *recv,
                           int64_t count, tr_reduce_op op, nas_err *err) {
  comm_call call = {COMM_REDUCE_SCATTER, dtype, op, count, 0, send, recv};
  return comm_run(comm, &call, err);
}

int tr_comm_broadcast(tr_comm *comm, tr_dtype dtype, void *buf, int64_t count, int root,
                      nas_err *err) {
  comm_call call = {COMM_BROADCAST, dtype, TR_REDUCE_SUM, count, root, buf, buf};
  return comm_run(comm, &call, err);
}

int tr_comm_barrier(tr_comm *comm, nas_err *err) {
  comm_call call = {COMM_BARRIER, TR_F32, TR_REDUCE_SUM, 0, 0, NULL, NULL};
  return comm_run(comm, &call, err);
}
