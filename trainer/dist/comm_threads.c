/* comm_threads: the thread backend of the collectives: ranks that are threads of one
 * process, moving data straight between each other's buffers (docs/engine-comm.md).
 *
 * Every collective is a rendezvous. A rank writes its comm_call into its slot and waits at
 * the group's barrier; then every rank checks all the slots (comm_check_calls), so all of
 * them reach the same verdict, and on a mismatch all return the same message and nobody is
 * left waiting. A valid call then moves data straight between the ranks' buffers (each
 * rank reads the others' inputs in place, no staging copy) and waits at the barrier once
 * more, so no rank returns and reuses its input while another still reads it, nor reads
 * its output while another still writes it.
 *
 * Invariants:
 * - Slots are double-buffered by round parity: a fast rank may write its slot for round
 *   k+1 while a slow one still reads round k's; round k+2 reuses a slot only after every
 *   rank reached round k+1's first barrier, so after all have finished with round k.
 * - Reductions cut the elements into world chunks and rank r alone reads and writes chunk
 *   r of every rank's buffers, so in-place calls have no races.
 * - All shared state is guarded by the group's mutex; the barrier's lock and unlock order
 *   every write a rank made before it before every read another rank makes after it.
 * - A barrier completes only when all world ranks arrive, so once a rank has left
 *   (comm_threads_leave: its thread's function returned) every wait that has not completed
 *   fails with who left and why, now and in every later call, instead of waiting forever. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/dist/comm_internal.h"

struct tr_comm_group {
  int world;
  pthread_mutex_t lock;
  pthread_cond_t released; /* signalled when the last rank reaches the barrier */
  int arrived;             /* ranks waiting at the barrier now */
  uint64_t generation;     /* barriers completed: a waiter leaves when it changes */
  int left;                /* ranks whose thread has stopped calling (comm_threads_leave) */
  char why[600];           /* the first of them: who, and its failure */
  comm_call *slots;        /* owned, 2 * world: [parity * world + rank] */
  tr_comm *comms;          /* owned, world */
  const void **srcs;       /* owned, world * world: rank r's comm_reduce sources at r * world */
  void **dsts;             /* owned, world * world: and its destinations */
};

static int threads_run(tr_comm *comm, const comm_call *call, nas_err *err);

static const comm_backend threads_backend = {TR_COMM_THREADS, threads_run, NULL};

/* ---------------------------------------------------------------- group */

static void group_release(tr_comm_group *g) {
  free(g->slots);
  free(g->comms);
  free(g->srcs);
  free(g->dsts);
  free(g);
}

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
  size_t n = (size_t)world;
  g->slots = calloc(2 * n, sizeof *g->slots);
  g->comms = calloc(n, sizeof *g->comms);
  g->srcs = calloc(n * n, sizeof *g->srcs);
  g->dsts = calloc(n * n, sizeof *g->dsts);
  bool locked = g->slots && g->comms && g->srcs && g->dsts &&
                pthread_mutex_init(&g->lock, NULL) == 0;
  if (!locked || pthread_cond_init(&g->released, NULL) != 0) {
    if (locked) pthread_mutex_destroy(&g->lock);
    group_release(g);
    nas_errf(err, "comm group of %d ranks: out of memory or synchronisation objects", world);
    return NULL;
  }
  for (int r = 0; r < world; r++)
    g->comms[r] = (tr_comm){.backend = &threads_backend, .rank = r, .world = world, .impl = g};
  return g;
}

void tr_comm_group_free(tr_comm_group *group) {
  if (!group) return;
  pthread_cond_destroy(&group->released);
  pthread_mutex_destroy(&group->lock);
  group_release(group);
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

void comm_threads_leave(tr_comm *comm, const char *failure) {
  tr_comm_group *g = comm->impl;
  pthread_mutex_lock(&g->lock);
  if (g->left++ == 0 && failure)
    snprintf(g->why, sizeof g->why, "rank %d failed and left the group (%s)", comm->rank, failure);
  else if (g->left == 1)
    snprintf(g->why, sizeof g->why, "rank %d left the group", comm->rank);
  pthread_cond_broadcast(&g->released);
  pthread_mutex_unlock(&g->lock);
}

/* Blocks until all world ranks have called it (a generation-counting barrier: the
 * generation, not the arrival count, tells a waiter it may go, so a rank that races ahead
 * into the next barrier cannot confuse one still waking from this one). Fails, naming
 * during, once a rank has left: it will never arrive. */
static int group_wait(tr_comm_group *g, const char *during, nas_err *err) {
  pthread_mutex_lock(&g->lock);
  uint64_t generation = g->generation;
  if (++g->arrived == g->world) {
    g->arrived = 0;
    g->generation++;
    pthread_cond_broadcast(&g->released);
  } else {
    while (generation == g->generation && !g->left) pthread_cond_wait(&g->released, &g->lock);
  }
  int rc = generation != g->generation ? NAS_OK : nas_errf(err, "%s: %s", during, g->why);
  pthread_mutex_unlock(&g->lock);
  return rc;
}

/* ---------------------------------------------------------------- data movement */

static const char *at(const void *p, int64_t i, size_t size) {
  return (const char *)p + (size_t)i * size;
}

/* This rank's share of a checked call whose slots (one per rank) are calls. */
static void threads_move(tr_comm *comm, const comm_call *calls) {
  tr_comm_group *g = comm->impl;
  int world = comm->world, rank = comm->rank;
  const comm_call *call = &calls[rank];
  const void **srcs = g->srcs + (size_t)rank * (size_t)world;
  void **dsts = g->dsts + (size_t)rank * (size_t)world;
  int64_t count = call->count;
  size_t size = tr_dtype_size(call->dtype);
  int64_t lo, hi;
  switch (call->kind) {
  case COMM_ALL_REDUCE: /* chunk rank of every send, into chunk rank of every recv */
    comm_chunk_bounds(count, world, rank, &lo, &hi);
    for (int r = 0; r < world; r++) {
      srcs[r] = at(calls[r].send, lo, size);
      dsts[r] = (char *)calls[r].recv + (size_t)lo * size;
    }
    comm_reduce(call->dtype, call->op, world, srcs, dsts, world, hi - lo);
    break;
  case COMM_REDUCE_SCATTER: /* chunk rank of every send, into this rank's recv */
    for (int r = 0; r < world; r++) srcs[r] = at(calls[r].send, rank * count, size);
    dsts[0] = call->recv;
    comm_reduce(call->dtype, call->op, world, srcs, dsts, 1, count);
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
}

/* The round: post the call, meet, check all calls, move this rank's share, meet again. */
static int threads_run(tr_comm *comm, const comm_call *call, nas_err *err) {
  tr_comm_group *g = comm->impl;
  comm_call *round = g->slots + (size_t)(comm->round++ & 1) * (size_t)g->world;
  round[comm->rank] = *call;
  const char *name = comm_kind_name(call->kind);
  if (group_wait(g, name, err) != NAS_OK) return NAS_ERR;
  if (comm_check_calls(round, g->world, err) != NAS_OK) return NAS_ERR;
  if (call->kind == COMM_BARRIER) return NAS_OK;
  threads_move(comm, round);
  return group_wait(g, name, err);
}
