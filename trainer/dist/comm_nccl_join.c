/* comm_nccl_join: the C side of the NCCL backend of the collectives: how the ranks share
 * rank 0's NCCL id before each makes its communicator, and the backend table entry that
 * maps a comm_call onto trainer/dist/comm_nccl.h (docs/engine-comm.md, "NCCL").
 *
 * Rendezvous. With a run folder, rank 0 writes the id in hex to
 * RUN_DIR/nas-comm-NAME.nccl-id atomically (a temporary file, then rename) and the others
 * poll for the file; that works across nodes when the folder is on a shared filesystem.
 * Without one, on one node, the ranks form a process group NAME.nccl-id for just as long
 * as it takes to broadcast the id through shared memory.
 *
 * Invariants:
 * - Every rank checks that it has a device before it meets the others, so where there is
 *   none (no GPU, no driver, a build without CUDA) each rank fails at once with the reason.
 * - Rank 0 removes the id file once its communicator exists (NCCL's creation waits for
 *   every rank, so all have read the id by then) or its creation failed.
 * - NCCL cannot compare calls across ranks, so each rank checks its own arguments before
 *   a call; a mismatch between ranks is NCCL's undefined behaviour, bounded by the
 *   communicator's timeout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer/dist/comm_internal.h"
#include "trainer/dist/comm_nccl.h"

#define ID_HEX (2 * COMM_NCCL_ID_BYTES)
#define ID_LOOK_S 0.02 /* how often a rank looks for rank 0's id file */

static int nccl_run(tr_comm *comm, const comm_call *call, nas_err *err);
static void nccl_free(tr_comm *comm);

static const comm_backend nccl_backend = {TR_COMM_NCCL, nccl_run, nccl_free};

/* ---------------------------------------------------------------- the id */

static int id_publish(const char *path, const unsigned char *id, nas_err *err) {
  static const char digits[] = "0123456789abcdef";
  char text[ID_HEX + 1];
  for (int i = 0; i < COMM_NCCL_ID_BYTES; i++) {
    text[2 * i] = digits[id[i] >> 4];
    text[2 * i + 1] = digits[id[i] & 15];
  }
  text[ID_HEX] = '\n';
  return nas_write_file_atomic(path, text, sizeof text, err);
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* Whether text (len bytes) is an id as id_publish writes it; fills id when it is. */
static bool id_parse(const char *text, size_t len, unsigned char *id) {
  if (len != ID_HEX + 1 || text[ID_HEX] != '\n') return false;
  for (int i = 0; i < COMM_NCCL_ID_BYTES; i++) {
    int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id[i] = (unsigned char)(hi << 4 | lo);
  }
  return true;
}

static int id_await(const char *path, double timeout_s, unsigned char *id, nas_err *err) {
  double deadline = nas_monotonic() + timeout_s;
  for (;;) {
    char *text = NULL;
    size_t len = 0;
    if (nas_read_file(path, &text, &len, NULL) == NAS_OK) {
      bool ok = id_parse(text, len, id);
      free(text);
      return ok ? NAS_OK : nas_errf(err, "%s does not hold an NCCL id", path);
    }
    if (nas_monotonic() >= deadline)
      return nas_errf(err, "timed out after %g s waiting for rank 0's NCCL id in %s (do all "
                      "ranks see that folder?)", timeout_s, path);
    nas_sleep(ID_LOOK_S);
  }
}

/* The id from rank 0 through a short-lived process group on this node. */
static int id_through_shm(const tr_comm_options *opts, unsigned char *id, nas_err *err) {
  tr_comm_options o = *opts;
  o.backend = TR_COMM_PROCESSES;
  o.stage_bytes = COMM_NCCL_ID_BYTES;
  if (strlen(opts->name) + sizeof ".nccl-id" > sizeof o.name)
    return nas_errf(err, "group name too long for the NCCL rendezvous");
  strcat(o.name, ".nccl-id");
  tr_comm *group;
  if (comm_shm_join(&o, &group, err) != NAS_OK) return NAS_ERR;
  /* the bytes travel as float32 values; a broadcast copies them without reading them */
  int rc = tr_comm_broadcast(group, TR_F32, id, COMM_NCCL_ID_BYTES / sizeof(float), 0, err);
  tr_comm_free(group);
  return rc;
}

/* Rank 0's id on every rank, through run_dir or shared memory. */
static int id_share(const tr_comm_options *opts, unsigned char *id, nas_err *err) {
  if (opts->rank == 0 && comm_nccl_make_id(id, err) != NAS_OK) return NAS_ERR;
  if (!opts->run_dir) return id_through_shm(opts, id, err);
  char *path = nas_asprintf("%s/nas-comm-%s.nccl-id", opts->run_dir, opts->name);
  if (!path) return nas_errf(err, "out of memory");
  int rc = opts->rank == 0 ? id_publish(path, id, err) : id_await(path, opts->timeout_s, id, err);
  free(path);
  return rc;
}

/* Rank 0: removes the id file, if there is one. */
static void id_remove(const tr_comm_options *opts) {
  if (opts->rank != 0 || !opts->run_dir) return;
  char *path = nas_asprintf("%s/nas-comm-%s.nccl-id", opts->run_dir, opts->name);
  if (path) unlink(path);
  free(path);
}

/* ---------------------------------------------------------------- backend */

int comm_nccl_join(const tr_comm_options *opts, tr_comm **out, nas_err *err) {
  int devices;
  if (comm_nccl_devices(&devices, err) != NAS_OK) return NAS_ERR;
  if (opts->nodes > 1 && !opts->run_dir)
    return nas_errf(err, "NCCL on %d nodes needs a run folder that every node sees, for the "
                    "rendezvous (run_dir)", opts->nodes);
  unsigned char id[COMM_NCCL_ID_BYTES] = {0};
  comm_nccl *nc = NULL;
  int rc = id_share(opts, id, err);
  if (rc == NAS_OK)
    rc = comm_nccl_new(id, opts->rank, opts->world, opts->local_rank, opts->timeout_s, &nc, err);
  id_remove(opts);
  tr_comm *comm = rc == NAS_OK ? calloc(1, sizeof *comm) : NULL;
  if (!comm) {
    comm_nccl_free(nc);
    return rc == NAS_OK ? nas_errf(err, "out of memory") : NAS_ERR;
  }
  *comm = (tr_comm){.backend = &nccl_backend, .rank = opts->rank, .world = opts->world, .impl = nc};
  *out = comm;
  return NAS_OK;
}

static void nccl_free(tr_comm *comm) {
  comm_nccl_free(comm->impl);
  free(comm);
}

static int nccl_run(tr_comm *comm, const comm_call *call, nas_err *err) {
  if (comm_check_args(call, comm->world, comm->rank, err) != NAS_OK) return NAS_ERR;
  comm_nccl *nc = comm->impl;
  bool f64 = call->dtype == TR_F64, avg = call->op == TR_REDUCE_AVG;
  switch (call->kind) {
  case COMM_ALL_REDUCE:
    return comm_nccl_all_reduce(nc, f64, call->send, call->recv, call->count, avg, err);
  case COMM_ALL_GATHER:
    return comm_nccl_all_gather(nc, f64, call->send, call->recv, call->count, err);
  case COMM_REDUCE_SCATTER:
    return comm_nccl_reduce_scatter(nc, f64, call->send, call->recv, call->count, avg, err);
  case COMM_BROADCAST:
    return comm_nccl_broadcast(nc, f64, call->recv, call->count, call->root, err);
  case COMM_BARRIER:
    return comm_nccl_barrier(nc, err);
  }
  return nas_errf(err, "unknown collective %d", (int)call->kind);
}
