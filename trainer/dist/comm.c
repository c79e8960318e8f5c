/* comm: the collectives' public calls (trainer.h) and what their backends share: the checks
 * of a call's arguments, alone and across ranks, and the rank-order reduction
 * (docs/engine-comm.md). A public call packs its arguments into a comm_call and hands it
 * to the backend in the communicator's table: threads (comm_threads.c), processes
 * (comm_shm.c) or NCCL (comm_nccl_join.c).
 *
 * Invariants:
 * - No call checks its arguments here before the backend runs it: a rank that returned
 *   early would leave the others waiting for it. The CPU backends check the calls of all
 *   ranks after they meet; NCCL, which cannot, checks each rank's own.
 * - The checks are pure functions of the calls, so ranks that read the same calls reach the
 *   same verdict and message.
 * - A reduction sums each element in rank order, x0 + x1 + ..., in its dtype, whichever rank
 *   computes it and however the elements are cut into blocks, chunks and pieces. */
#include <stdlib.h>
#include <string.h>

#include "trainer/dist/comm_internal.h"
#include "trainer/core/internal.h"

#define KERN_FILE "trainer/dist/kern_comm.h"
#include "trainer/core/kern_both.h"

/* Bytes of the stack block a reduction sums through (fits L1 with its sources). */
#define COMM_BLOCK_BYTES 8192

const char *comm_kind_name(comm_kind kind) {
  switch (kind) {
  case COMM_BARRIER: return "barrier";
  case COMM_ALL_REDUCE: return "all_reduce";
  case COMM_ALL_GATHER: return "all_gather";
  case COMM_REDUCE_SCATTER: return "reduce_scatter";
  case COMM_BROADCAST: return "broadcast";
  }
  return "unknown collective";
}

static const char *dtype_name(tr_dtype dtype) {
  return dtype == TR_F32 ? "float32" : dtype == TR_F64 ? "float64" : "other";
}

/* ---------------------------------------------------------------- checks */

static bool comm_is_reduction(comm_kind kind) {
  return kind == COMM_ALL_REDUCE || kind == COMM_REDUCE_SCATTER;
}

int comm_check_args(const comm_call *c, int world, int rank, nas_err *err) {
  const char *name = comm_kind_name(c->kind);
  if (c->kind == COMM_BARRIER) return NAS_OK;
  if (c->dtype != TR_F32 && c->dtype != TR_F64)
    return nas_errf(err, "%s: rank %d passed dtype %d (collectives take float32 or float64)",
                    name, rank, (int)c->dtype);
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
static int check_match(const comm_call *c0, const comm_call *c, int rank, nas_err *err) {
  const char *name = comm_kind_name(c0->kind);
  if (c->kind != c0->kind)
    return nas_errf(err, "collective mismatch: rank %d called %s while rank 0 called %s", rank,
                    comm_kind_name(c->kind), name);
  if (c->kind == COMM_BARRIER) return NAS_OK;
  if (c->dtype != c0->dtype)
    return nas_errf(err, "%s: rank %d passed dtype %s, rank 0 %s", name, rank,
                    dtype_name(c->dtype), dtype_name(c0->dtype));
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

int comm_check_calls(const comm_call *calls, int world, nas_err *err) {
  for (int r = 0; r < world; r++)
    if (comm_check_args(&calls[r], world, r, err) != NAS_OK) return NAS_ERR;
  for (int r = 1; r < world; r++)
    if (check_match(&calls[0], &calls[r], r, err) != NAS_OK) return NAS_ERR;
  return NAS_OK;
}

/* ---------------------------------------------------------------- data movement */

void comm_chunk_bounds(int64_t count, int world, int rank, int64_t *lo, int64_t *hi) {
  int64_t base = count / world, extra = count % world;
  *lo = rank * base + (rank < extra ? rank : extra);
  *hi = *lo + base + (rank < extra ? 1 : 0);
}

void comm_reduce(tr_dtype dtype, tr_reduce_op op, int world, const void *const *srcs,
                 void *const *dsts, int n_dst, int64_t n) {
  _Alignas(64) unsigned char block[COMM_BLOCK_BYTES];
  size_t size = tr_dtype_size(dtype);
  int64_t step = (int64_t)(sizeof block / size);
  for (int64_t from = 0; from < n; from += step) {
    int64_t len = n - from < step ? n - from : step;
    size_t offset = (size_t)from * size, bytes = (size_t)len * size;
    memcpy(block, (const char *)srcs[0] + offset, bytes);
    for (int r = 1; r < world; r++)
      TR_DISPATCH(dtype, comm_add, block, (const char *)srcs[r] + offset, len);
    if (op == TR_REDUCE_AVG) TR_DISPATCH(dtype, comm_div, block, len, world);
    for (int d = 0; d < n_dst; d++) memcpy((char *)dsts[d] + offset, block, bytes);
  }
}

/* ---------------------------------------------------------------- public calls */

static int comm_run(tr_comm *comm, const comm_call *call, nas_err *err) {
  if (!comm) return nas_errf(err, "%s: no communicator", comm_kind_name(call->kind));
  return comm->backend->run(comm, call, err);
}

int tr_comm_rank(const tr_comm *comm) { return comm->rank; }
int tr_comm_world(const tr_comm *comm) { return comm->world; }
tr_comm_backend tr_comm_backend_of(const tr_comm *comm) { return comm->backend->kind; }

void tr_comm_free(tr_comm *comm) {
  if (comm && comm->backend->free) comm->backend->free(comm);
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
