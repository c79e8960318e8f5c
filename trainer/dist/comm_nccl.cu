/* comm_nccl: the NCCL calls behind trainer/dist/comm_nccl.h. No kernels of its own: it sets the
 * device, queues NCCL operations on the communicator's stream and waits for them.
 *
 * Invariants:
 * - The communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call here can
 *   hang: creation and every operation are followed by polling NCCL's state and the stream
 *   until done, an error, or the timeout; on an error or timeout the communicator is
 *   aborted (which ends whatever it had in flight), and every later call fails saying so.
 * - Every call first makes the communicator's device current, so callers may switch devices
 *   freely between calls, and waits for all work already queued on that device, so inputs
 *   written by kernels on any stream are complete before NCCL reads them.
 * - Every CUDA and NCCL status is checked and turned into a message with the call's
 *   context; nothing here prints or aborts the process.
 * - NCCL is not linked: each communicator loads it for itself (trainer/cuda/cuda_dl.h) and calls
 *   it only through its own function table; comm_nccl_make_id, which runs before any
 *   communicator exists, loads it for that one call. */
#include <cuda_runtime.h>
#include <nccl.h>

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer/dist/comm_nccl.h"
#include "trainer/cuda/cuda_dl.h"

static_assert(sizeof(ncclUniqueId) == COMM_NCCL_ID_BYTES, "ncclUniqueId changed size");

/* The NCCL functions used here: (field of nccl_api, function of nccl.h). */
#define NCCL_FUNCTIONS(X)                                                                          \
  X(get_unique_id, ncclGetUniqueId)                                                                \
  X(init_rank_config, ncclCommInitRankConfig)                                                      \
  X(finalize, ncclCommFinalize)                                                                    \
  X(destroy, ncclCommDestroy)                                                                      \
  X(abort, ncclCommAbort)                                                                          \
  X(async_error, ncclCommGetAsyncError)                                                            \
  X(last_error, ncclGetLastError)                                                                  \
  X(error_string, ncclGetErrorString)                                                              \
  X(all_reduce, ncclAllReduce)                                                                     \
  X(all_gather, ncclAllGather)                                                                     \
  X(reduce_scatter, ncclReduceScatter)                                                             \
  X(broadcast, ncclBroadcast)                                                                      \
  X(send, ncclSend)                                                                                \
  X(recv, ncclRecv)

/* NCCL as loaded by one owner (a communicator, or comm_nccl_make_id for its call). */
typedef struct {
  void *lib; /* owned dlopen handle of libnccl; NULL when not loaded */
#define NCCL_FIELD(field, fn) decltype(&fn) field;
  NCCL_FUNCTIONS(NCCL_FIELD)
#undef NCCL_FIELD
} nccl_api;

struct comm_nccl {
  nccl_api nccl;       /* the library every call below goes through */
  ncclComm_t comm;     /* NULL once aborted after a failure */
  cudaStream_t stream; /* every operation of the communicator is queued here */
  float *scratch;      /* COMM_NCCL_HOST_BYTES of device memory: the barrier's all-reduce
                          (one float), host bytes of a send or receive */
  int device;
  int world;
  double timeout_s;
};

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Loads NCCL into api; on failure api->lib stays NULL and err says why. */
static int nccl_api_open(nccl_api *api, nas_err *err) {
  static const char *const sonames[] = {"libnccl.so.2", "libnccl.so", nullptr};
  char why[640];
  api->lib = cuda_dl_open("NCCL backend", sonames, why, sizeof why);
#define NCCL_BIND(field, fn)                                                                       \
  &&cuda_dl_sym(api->lib, "NCCL backend", CUDA_DL_NAME(fn), &api->field, why, sizeof why)
  if (api->lib NCCL_FUNCTIONS(NCCL_BIND)) return NAS_OK;
#undef NCCL_BIND
  if (api->lib) dlclose(api->lib);
  api->lib = NULL;
  return nas_errf(err, "%s", why);
}

static void nccl_api_close(nccl_api *api) {
  if (api->lib) dlclose(api->lib);
  api->lib = NULL;
}

static int cuda_fail(nas_err *err, const char *what, cudaError_t rc) {
  return nas_errf(err, "NCCL backend: %s: %s (%s)", what, cudaGetErrorString(rc),
                  cudaGetErrorName(rc));
}

static int nccl_fail(const nccl_api *api, nas_err *err, const char *what, ncclResult_t rc,
                     ncclComm_t comm) {
  const char *detail = comm ? api->last_error(comm) : "";
  return nas_errf(err, "NCCL backend: %s: %s%s%s", what, api->error_string(rc),
                  detail && *detail ? ": " : "", detail ? detail : "");
}

/* Aborts the communicator after a failure: whatever it has in flight ends, and later calls
 * fail at once. */
static void nccl_abort(comm_nccl *nc) {
  if (!nc->comm) return;
  nc->nccl.abort(nc->comm);
  nc->comm = NULL;
}

/* Waits until the communicator has no call in progress (a non-blocking communicator may
 * return ncclInProgress from any call), failing on an error or at deadline. */
static int nccl_settle(comm_nccl *nc, double deadline, const char *what, nas_err *err) {
  for (;;) {
    ncclResult_t state;
    ncclResult_t rc = nc->nccl.async_error(nc->comm, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return NAS_OK;
    if (state != ncclInProgress) {
      nccl_fail(&nc->nccl, err, what, state, nc->comm);
      nccl_abort(nc);
      return NAS_ERR;
    }
    if (monotonic_s() >= deadline) {
      nccl_abort(nc);
      return nas_errf(err, "NCCL backend: %s: timed out after %g s waiting for the other %d ranks",
                      what, nc->timeout_s, nc->world - 1);
    }
    sched_yield();
  }
}

/* Waits until the communicator's stream has done its work; a peer's failure shows up as
 * NCCL's asynchronous error, a dead peer as the deadline passing. */
static int nccl_wait_stream(comm_nccl *nc, double deadline, const char *what, nas_err *err) {
  for (;;) {
    cudaError_t q = cudaStreamQuery(nc->stream);
    if (q == cudaSuccess) return NAS_OK;
    if (q != cudaErrorNotReady) {
      cuda_fail(err, what, q);
      nccl_abort(nc);
      return NAS_ERR;
    }
    if (nccl_settle(nc, deadline, what, err) != NAS_OK) return NAS_ERR;
    if (monotonic_s() >= deadline) {
      nccl_abort(nc);
      return nas_errf(err, "NCCL backend: %s: timed out after %g s waiting for the other %d ranks",
                      what, nc->timeout_s, nc->world - 1);
    }
    sched_yield();
  }
}

/* Before an operation: the communicator is alive, its device current and idle. */
static int nccl_begin(comm_nccl *nc, const char *what, nas_err *err) {
  if (!nc->comm)
    return nas_errf(err, "NCCL backend: %s: the communicator was aborted after an earlier failure",
                    what);
  cudaError_t rc = cudaSetDevice(nc->device);
  if (rc == cudaSuccess) rc = cudaDeviceSynchronize();
  return rc == cudaSuccess ? NAS_OK : cuda_fail(err, what, rc);
}

/* After queueing an operation that returned queued: waits for it to be done. */
static int nccl_finish(comm_nccl *nc, ncclResult_t queued, const char *what, nas_err *err) {
  if (queued != ncclSuccess && queued != ncclInProgress) {
    nccl_fail(&nc->nccl, err, what, queued, nc->comm);
    nccl_abort(nc);
    return NAS_ERR;
  }
  double deadline = monotonic_s() + nc->timeout_s;
  if (nccl_settle(nc, deadline, what, err) != NAS_OK) return NAS_ERR;
  return nccl_wait_stream(nc, deadline, what, err);
}

static ncclDataType_t nccl_type(bool f64) { return f64 ? ncclFloat64 : ncclFloat32; }

/* ---------------------------------------------------------------- communicators */

extern "C" int comm_nccl_devices(int *count, nas_err *err) {
  *count = 0;
  cudaError_t rc = cudaGetDeviceCount(count);
  if (rc != cudaSuccess) {
    *count = 0;
    cudaGetLastError(); /* clear it: this is not a sticky error */
    return nas_errf(err, "NCCL backend: no usable CUDA device (no GPU or no driver here?): "
                    "cudaGetDeviceCount: %s", cudaGetErrorString(rc));
  }
  if (*count < 1) return nas_errf(err, "NCCL backend: no CUDA device");
  return NAS_OK;
}

extern "C" int comm_nccl_make_id(unsigned char id[COMM_NCCL_ID_BYTES], nas_err *err) {
  nccl_api api;
  if (nccl_api_open(&api, err) != NAS_OK) return NAS_ERR;
  ncclUniqueId uid;
  ncclResult_t rc = api.get_unique_id(&uid);
  int status = rc == ncclSuccess ? NAS_OK : nccl_fail(&api, err, "ncclGetUniqueId", rc, NULL);
  if (status == NAS_OK) memcpy(id, &uid, sizeof uid);
  nccl_api_close(&api);
  return status;
}

/* Device, stream and scratch of a new communicator. */
static int nccl_device_setup(comm_nccl *nc, int local_rank, nas_err *err) {
  int devices;
  if (comm_nccl_devices(&devices, err) != NAS_OK) return NAS_ERR;
  nc->device = local_rank % devices;
  cudaError_t rc = cudaSetDevice(nc->device);
  if (rc != cudaSuccess) return cuda_fail(err, "cudaSetDevice", rc);
  rc = cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking);
  if (rc != cudaSuccess) return cuda_fail(err, "cudaStreamCreate", rc);
  rc = cudaMalloc(reinterpret_cast<void **>(&nc->scratch), COMM_NCCL_HOST_BYTES);
  return rc == cudaSuccess ? NAS_OK : cuda_fail(err, "cudaMalloc", rc);
}

extern "C" int comm_nccl_new(const unsigned char id[COMM_NCCL_ID_BYTES], int rank, int world,
                             int local_rank, double timeout_s, comm_nccl **out, nas_err *err) {
  *out = NULL;
  comm_nccl *nc = static_cast<comm_nccl *>(calloc(1, sizeof *nc));
  if (!nc) return nas_errf(err, "NCCL backend: out of memory");
  nc->world = world;
  nc->timeout_s = timeout_s;
  int rc = nccl_api_open(&nc->nccl, err);
  if (rc == NAS_OK) rc = nccl_device_setup(nc, local_rank, err);
  if (rc == NAS_OK) {
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t made = nc->nccl.init_rank_config(&nc->comm, world, uid, rank, &config);
    if (made != ncclSuccess && made != ncclInProgress) {
      rc = nccl_fail(&nc->nccl, err, "ncclCommInitRank", made, nc->comm);
      nccl_abort(nc);
    } else {
      rc = nccl_settle(nc, monotonic_s() + timeout_s, "joining the communicator", err);
    }
  }
  if (rc != NAS_OK) {
    comm_nccl_free(nc);
    return NAS_ERR;
  }
  *out = nc;
  return NAS_OK;
}

extern "C" void comm_nccl_free(comm_nccl *nc) {
  if (!nc) return;
  if (nc->comm) {
    /* finalize flushes and lets the peers finish with us; a failure there aborts instead */
    double deadline = monotonic_s() + nc->timeout_s;
    nas_err ignored;
    ncclResult_t rc = nc->nccl.finalize(nc->comm);
    if ((rc == ncclSuccess || rc == ncclInProgress) &&
        nccl_settle(nc, deadline, "finalize", &ignored) == NAS_OK)
      nc->nccl.destroy(nc->comm);
    else
      nccl_abort(nc);
  }
  if (nc->scratch) cudaFree(nc->scratch);
  if (nc->stream) cudaStreamDestroy(nc->stream);
  nccl_api_close(&nc->nccl);
  free(nc);
}

/* ---------------------------------------------------------------- collectives */

extern "C" int comm_nccl_all_reduce(comm_nccl *nc, bool f64, const void *send, void *recv,
                                    int64_t count, bool avg, nas_err *err) {
  if (nccl_begin(nc, "all_reduce", err) != NAS_OK) return NAS_ERR;
  ncclResult_t rc = nc->nccl.all_reduce(send, recv, (size_t)count, nccl_type(f64),
                                        avg ? ncclAvg : ncclSum, nc->comm, nc->stream);
  return nccl_finish(nc, rc, "all_reduce", err);
}

extern "C" int comm_nccl_all_gather(comm_nccl *nc, bool f64, const void *send, void *recv,
                                    int64_t count, nas_err *err) {
  if (nccl_begin(nc, "all_gather", err) != NAS_OK) return NAS_ERR;
  ncclResult_t rc =
      nc->nccl.all_gather(send, recv, (size_t)count, nccl_type(f64), nc->comm, nc->stream);
  return nccl_finish(nc, rc, "all_gather", err);
}

extern "C" int comm_nccl_reduce_scatter(comm_nccl *nc, bool f64, const void *send, void *recv,
                                        int64_t count, bool avg, nas_err *err) {
  if (nccl_begin(nc, "reduce_scatter", err) != NAS_OK) return NAS_ERR;
  ncclResult_t rc = nc->nccl.reduce_scatter(send, recv, (size_t)count, nccl_type(f64),
                                            avg ? ncclAvg : ncclSum, nc->comm, nc->stream);
  return nccl_finish(nc, rc, "reduce_scatter", err);
}

extern "C" int comm_nccl_broadcast(comm_nccl *nc, bool f64, void *buf, int64_t count, int root,
                                   nas_err *err) {
  if (nccl_begin(nc, "broadcast", err) != NAS_OK) return NAS_ERR;
  ncclResult_t rc =
      nc->nccl.broadcast(buf, buf, (size_t)count, nccl_type(f64), root, nc->comm, nc->stream);
  return nccl_finish(nc, rc, "broadcast", err);
}

extern "C" int comm_nccl_barrier(comm_nccl *nc, nas_err *err) {
  if (nccl_begin(nc, "barrier", err) != NAS_OK) return NAS_ERR;
  ncclResult_t rc = nc->nccl.all_reduce(nc->scratch, nc->scratch, 1, ncclFloat32, ncclSum,
                                        nc->comm, nc->stream);
  return nccl_finish(nc, rc, "barrier", err);
}

/* ---------------------------------------------------------------- point to point */

/* Checks what NCCL cannot: a peer in the communicator, a size that fits. */
static int check_peer(const comm_nccl *nc, int peer, int64_t bytes, bool host, const char *what,
                      nas_err *err) {
  if (peer < 0 || peer >= nc->world)
    return nas_errf(err, "NCCL backend: %s: peer %d is not in [0, %d)", what, peer, nc->world);
  if (bytes < 0 || (host && bytes > COMM_NCCL_HOST_BYTES))
    return nas_errf(err, "NCCL backend: %s: %lld bytes%s", what, (long long)bytes,
                    host ? " of host memory (at most COMM_NCCL_HOST_BYTES)" : "");
  return NAS_OK;
}

extern "C" int comm_nccl_send(comm_nccl *nc, const void *buf, int64_t bytes, int peer, bool host,
                              nas_err *err) {
  if (check_peer(nc, peer, bytes, host, "send", err) != NAS_OK ||
      nccl_begin(nc, "send", err) != NAS_OK)
    return NAS_ERR;
  if (host) { /* queued on the communicator's stream, so the send reads it complete */
    cudaError_t copied = cudaMemcpyAsync(nc->scratch, buf, (size_t)bytes, cudaMemcpyHostToDevice,
                                         nc->stream);
    if (copied != cudaSuccess) return cuda_fail(err, "send: bytes to the device", copied);
    buf = nc->scratch;
  }
  ncclResult_t rc = nc->nccl.send(buf, (size_t)bytes, ncclUint8, peer, nc->comm, nc->stream);
  return nccl_finish(nc, rc, "send", err);
}

extern "C" int comm_nccl_recv(comm_nccl *nc, void *buf, int64_t bytes, int peer, bool host,
                              nas_err *err) {
  if (check_peer(nc, peer, bytes, host, "recv", err) != NAS_OK ||
      nccl_begin(nc, "recv", err) != NAS_OK)
    return NAS_ERR;
  ncclResult_t rc = nc->nccl.recv(host ? nc->scratch : buf, (size_t)bytes, ncclUint8, peer,
                                  nc->comm, nc->stream);
  int status = nccl_finish(nc, rc, "recv", err);
  if (status != NAS_OK || !host) return status;
  /* the stream is done (nccl_finish), and a copy to pageable host memory waits for itself */
  cudaError_t copied = cudaMemcpy(buf, nc->scratch, (size_t)bytes, cudaMemcpyDeviceToHost);
  return copied == cudaSuccess ? NAS_OK : cuda_fail(err, "recv: bytes to the host", copied);
}
