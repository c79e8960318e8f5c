/* fsdp_prefetch: one helper thread per rank that all-gathers a unit's full parameters
 * while the rank's main thread computes another unit (FSDP's forward and backward
 * prefetch, docs/engine-fsdp.md).
 *
 * Collectives block, so overlap needs a second thread, and a second communicator group:
 * the helper's gathers and the main thread's collectives (gathers of units that were not
 * prefetched, reduce-scatters) then form two call sequences that are each the same on
 * every rank, whatever the timing between the two threads.
 *
 * Invariants: the queue holds units in the order they were posted, each at most once (a
 * posted unit is QUEUED until the main thread waits for it); the helper touches only the
 * units it pops, and only their shard (read) and full data (written), which the main
 * thread leaves alone until it has waited. The lock guards the queue, stop and every
 * unit's pf_* fields; a gather itself runs unlocked. */
#include <pthread.h>
#include <stdlib.h>

#include "trainer/dist/fsdp_internal.h"

struct fsdp_prefetcher {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t changed; /* a unit was queued or finished, or stop was asked */
  tr_comm *comm;          /* borrowed: the prefetch group's communicator */
  tr_dtype dtype;
  fsdp_unit **queue; /* owned ring of capacity entries (borrowed units) */
  size_t capacity, head, len;
  bool stop; /* set by free: the helper leaves once the queue is empty */
};

/* Pops the next unit, or NULL once stop is set and nothing is left. Called locked. */
static fsdp_unit *next_unit(fsdp_prefetcher *p) {
  while (p->len == 0 && !p->stop) pthread_cond_wait(&p->changed, &p->lock);
  if (p->len == 0) return NULL;
  fsdp_unit *u = p->queue[p->head];
  p->head = (p->head + 1) % p->capacity;
  p->len--;
  return u;
}

static void *prefetcher_main(void *arg) {
  fsdp_prefetcher *p = arg;
  pthread_mutex_lock(&p->lock);
  for (fsdp_unit *u; (u = next_unit(p));) {
    pthread_mutex_unlock(&p->lock);
    nas_err err = {{0}};
    int rc = tr_comm_all_gather(p->comm, p->dtype, tr_data(u->flat), u->full->storage->data,
                                u->shard_numel, &err);
    pthread_mutex_lock(&p->lock);
    u->pf_rc = rc;
    if (rc) u->pf_err = err;
    u->pf_state = FSDP_PF_DONE;
    pthread_cond_broadcast(&p->changed);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

fsdp_prefetcher *fsdp_prefetcher_new(tr_comm *comm, tr_dtype dtype, size_t capacity,
                                     nas_err *err) {
  fsdp_prefetcher *p = calloc(1, sizeof *p);
  fsdp_unit **queue = calloc(capacity ? capacity : 1, sizeof *queue);
  if (!p || !queue) {
    free(p);
    free(queue);
    nas_errf(err, "fsdp prefetch: out of memory");
    return NULL;
  }
  *p = (fsdp_prefetcher){.comm = comm, .dtype = dtype, .queue = queue, .capacity = capacity};
  bool locked = pthread_mutex_init(&p->lock, NULL) == 0;
  bool signalled = locked && pthread_cond_init(&p->changed, NULL) == 0;
  if (signalled && pthread_create(&p->thread, NULL, prefetcher_main, p) == 0) return p;
  if (signalled) pthread_cond_destroy(&p->changed);
  if (locked) pthread_mutex_destroy(&p->lock);
  free(queue);
  free(p);
  nas_errf(err, "fsdp prefetch: cannot start the helper thread");
  return NULL;
}

void fsdp_prefetcher_free(fsdp_prefetcher *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = true;
  pthread_cond_broadcast(&p->changed);
  pthread_mutex_unlock(&p->lock);
  pthread_join(p->thread, NULL);
  pthread_cond_destroy(&p->changed);
  pthread_mutex_destroy(&p->lock);
  free(p->queue);
  free(p);
}

void fsdp_prefetcher_post(fsdp_prefetcher *p, fsdp_unit *u) {
  pthread_mutex_lock(&p->lock);
  /* each unit is queued at most once, so len < capacity here */
  p->queue[(p->head + p->len) % p->capacity] = u;
  p->len++;
  u->pf_state = FSDP_PF_QUEUED;
  pthread_cond_broadcast(&p->changed);
  pthread_mutex_unlock(&p->lock);
}

bool fsdp_prefetcher_pending(fsdp_prefetcher *p, const fsdp_unit *u) {
  pthread_mutex_lock(&p->lock);
  bool pending = u->pf_state != FSDP_PF_IDLE;
  pthread_mutex_unlock(&p->lock);
  return pending;
}

int fsdp_prefetcher_wait(fsdp_prefetcher *p, fsdp_unit *u, nas_err *err) {
  pthread_mutex_lock(&p->lock);
  while (u->pf_state == FSDP_PF_QUEUED) pthread_cond_wait(&p->changed, &p->lock);
  int rc = u->pf_rc;
  if (rc) nas_errf(err, "prefetch of unit %d: %s", u->index, u->pf_err.msg);
  u->pf_state = FSDP_PF_IDLE;
  pthread_mutex_unlock(&p->lock);
  return rc;
}
