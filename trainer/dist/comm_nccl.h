/* comm_nccl: a plain C interface to NCCL for the NCCL backend of the collectives
 * (comm_nccl_join.c), implemented by trainer/dist/comm_nccl.cu with CUDA and by
 * trainer/dist/comm_nccl_nocuda.c without (every call then fails, saying so). No CUDA or NCCL
 * type crosses it, so C files include it without the toolkit's headers.
 *
 * Buffers are device memory of the communicator's device. Every call is host-synchronous:
 * it waits for the work already queued on the device, queues the NCCL operation on the
 * communicator's own stream and returns when it is done, so outputs are ready and inputs
 * free for any stream; no wait lasts longer than the communicator's timeout. */
#ifndef NAS_TRAINER_COMM_NCCL_H
#define NAS_TRAINER_COMM_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "common/common.h" /* a C header: inside extern "C" for C++ (nas_errf's linkage) */

/* Bytes of an ncclUniqueId. */
#define COMM_NCCL_ID_BYTES 128

typedef struct comm_nccl comm_nccl;

/* The number of CUDA devices this process sees (>= 1), or an error saying why none can be
 * used (no driver, no device, built without CUDA). */
int comm_nccl_devices(int *count, nas_err *err);
/* A fresh NCCL id (rank 0 makes it; every rank passes it to comm_nccl_new). Needs no
 * device. NCCL is not linked: this call and each communicator load it (libnccl.so.2) for
 * themselves, and fail "NCCL backend: cannot load libnccl.so.2: ..." where it is missing. */
int comm_nccl_make_id(unsigned char id[COMM_NCCL_ID_BYTES], nas_err *err);
/* This rank's communicator on device local_rank mod the visible devices; returns once all
 * world ranks have joined, or fails after timeout_s. *out is owned (comm_nccl_free). */
int comm_nccl_new(const unsigned char id[COMM_NCCL_ID_BYTES], int rank, int world, int local_rank,
                  double timeout_s, comm_nccl **out, nas_err *err);
void comm_nccl_free(comm_nccl *nc);

/* The collectives of trainer.h on device buffers of float32 (f64 false) or float64. */
int comm_nccl_all_reduce(comm_nccl *nc, bool f64, const void *send, void *recv, int64_t count,
                         bool avg, nas_err *err);
int comm_nccl_all_gather(comm_nccl *nc, bool f64, const void *send, void *recv, int64_t count,
                         nas_err *err);
int comm_nccl_reduce_scatter(comm_nccl *nc, bool f64, const void *send, void *recv,
                             int64_t count, bool avg, nas_err *err);
int comm_nccl_broadcast(comm_nccl *nc, bool f64, void *buf, int64_t count, int root,
                        nas_err *err);
int comm_nccl_barrier(comm_nccl *nc, nas_err *err);

/* Point to point (the pipeline's transport, trainer/dist/pipeline_nccl.c): bytes of buf
 * to rank peer, or from it, peer not this rank. buf is device memory of the communicator's
 * device, or with host set host memory of at most COMM_NCCL_HOST_BYTES, staged through the
 * communicator's own device buffer. Each returns once the peer has posted the matching
 * call and the bytes have moved (NCCL pairs two ranks' sends and receives in the order
 * they are posted), or fails after the communicator's timeout. */
#define COMM_NCCL_HOST_BYTES 256
int comm_nccl_send(comm_nccl *nc, const void *buf, int64_t bytes, int peer, bool host,
                   nas_err *err);
int comm_nccl_recv(comm_nccl *nc, void *buf, int64_t bytes, int peer, bool host,
                   nas_err *err);

#ifdef __cplusplus
}
#endif

#endif
