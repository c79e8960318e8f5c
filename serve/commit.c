/* serve/commit.c: group commit of the server's writes (SQLite, PostgreSQL).
 *
 * SQLite commits one transaction at a time, each with its own fsync, so writes arriving
 * together would otherwise wait for each other's flushes one by one; PostgreSQL flushes
 * concurrent commits together, but each transaction still costs its commit, its flush
 * and its round trips. Here a request thread hands its write in; the first thread to
 * find no group running becomes the leader: it takes every write handed in so far, runs
 * them on its own connection inside one transaction, each as a savepoint
 * (storage_group_begin: a write that fails is rolled back alone and answered with its own
 * error), commits once, and marks them done. Writes handed in meanwhile wait for the next
 * group, led by one of their threads. A request is answered only after its group
 * committed. When the group cannot begin or commit, its writes are made again one by one,
 * each in its own transaction, so one bad write or a failed commit never fails or loses
 * the others; a write that commits an idempotency key (storage.h) is replayed, not
 * repeated, when its key was committed. */
#include "serve/internal.h"

void serve_committer_init(serve_committer *c) {
  *c = (serve_committer){.queue_end = &c->queue};
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->finished, NULL);
}

void serve_committer_free(serve_committer *c) {
  pthread_cond_destroy(&c->finished);
  pthread_mutex_destroy(&c->lock);
}

/* Runs the writes of batch (a list) on st; returns the transactions committed. */
static unsigned long commit_batch(storage *st, serve_write *batch) {
  nas_err err;
  if (!batch->next) {
    batch->run(st, batch->arg);
    return 1;
  }
  if (storage_group_begin(st, &err) == NAS_OK) {
    for (serve_write *w = batch; w; w = w->next) w->run(st, w->arg);
    if (storage_group_end(st, true, &err) == NAS_OK) return 1;
  }
  unsigned long commits = 0;
  for (serve_write *w = batch; w; w = w->next, commits++) w->run(st, w->arg);
  return commits;
}

void serve_commit(serve_committer *c, storage *st, serve_write *w) {
  w->next = NULL;
  w->done = false;
  pthread_mutex_lock(&c->lock);
  *c->queue_end = w;
  c->queue_end = &w->next;
  while (!w->done) {
    if (c->leading) {
      pthread_cond_wait(&c->finished, &c->lock);
      continue;
    }
    c->leading = true;
    serve_write *batch = c->queue;
    c->queue = NULL;
    c->queue_end = &c->queue;
    pthread_mutex_unlock(&c->lock);
    unsigned long commits = commit_batch(st, batch);
    pthread_mutex_lock(&c->lock);
    /* Under the lock: a waiting thread sees done, and returns, only after it is released. */
    for (serve_write *b = batch; b; b = b->next) b->done = true, c->writes++;
    c->commits += commits;
    c->leading = false;
    pthread_cond_broadcast(&c->finished);
  }
  pthread_mutex_unlock(&c->lock);
}
