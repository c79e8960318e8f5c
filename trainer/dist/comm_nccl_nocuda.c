/* comm_nccl_nocuda: trainer/dist/comm_nccl.h in a build without CUDA (make CUDA=0, or no nvcc):
 * there is no device, so the first call of the NCCL backend (comm_nccl_devices) fails
 * saying why and no communicator is ever made; the others exist only to link. */
#include "trainer/dist/comm_nccl.h"

static int no_nccl(nas_err *err) {
  return nas_errf(err,
                  "NCCL backend: built without CUDA/NCCL (nvcc was not found, or make CUDA=0)");
}

int comm_nccl_devices(int *count, nas_err *err) {
  *count = 0;
  return no_nccl(err);
}

int comm_nccl_make_id(unsigned char id[COMM_NCCL_ID_BYTES], nas_err *err) {
  (void)id;
  return no_nccl(err);
}

int comm_nccl_new(const unsigned char id[COMM_NCCL_ID_BYTES], int rank, int world, int local_rank,
                  double timeout_s, comm_nccl **out, nas_err *err) {
  (void)id, (void)rank, (void)world, (void)local_rank, (void)timeout_s;
  *out = NULL;
  return no_nccl(err);
}

void comm_nccl_free(comm_nccl *nc) { (void)nc; }

int comm_nccl_all_reduce(comm_nccl *nc, bool f64, const void *send, void *recv, int64_t count,
                         bool avg, nas_err *err) {
  (void)nc, (void)f64, (void)send, (void)recv, (void)count, (void)avg;
  return no_nccl(err);
}

int comm_nccl_all_gather(comm_nccl *nc, bool f64, const void *send, void *recv, int64_t count,
                         nas_err *err) {
  (void)nc, (void)f64, (void)send, (void)recv, (void)count;
  return no_nccl(err);
}

int comm_nccl_reduce_scatter(comm_nccl *nc, bool f64, const void *send, void *recv,
                             int64_t count, bool avg, nas_err *err) {
  (void)nc, (void)f64, (void)send, (void)recv, (void)count, (void)avg;
  return no_nccl(err);
}

int comm_nccl_broadcast(comm_nccl *nc, bool f64, void *buf, int64_t count, int root,
                        nas_err *err) {
  (void)nc, (void)f64, (void)buf, (void)count, (void)root;
  return no_nccl(err);
}

int comm_nccl_barrier(comm_nccl *nc, nas_err *err) {
  (void)nc;
  return no_nccl(err);
}

int comm_nccl_send(comm_nccl *nc, const void *buf, int64_t bytes, int peer, bool host,
                   nas_err *err) {
  (void)nc, (void)buf, (void)bytes, (void)peer, (void)host;
  return no_nccl(err);
}

int comm_nccl_recv(comm_nccl *nc, void *buf, int64_t bytes, int peer, bool host,
                   nas_err *err) {
  (void)nc, (void)buf, (void)bytes, (void)peer, (void)host;
  return no_nccl(err);
}
