/* serve/commit.c: group commit of the server's writes on SQLite.
 *
 * SQLite commits one transaction at a time, each with its own fsync, so writes arriving
 * together would otherwise wait for each other's flushes one by one (PostgreSQL commits
 * concurrent sessions side by side and shares their flushes itself: its writes are not
 * grouped, see server.c). Here a request hands its write in. When no group runs, the
 * request's thread makes the write at once on its own connection, as long as its client
 * is the only one connected (a lone writer waits for nothing more than its own commit).
 * Otherwise the request is suspended (libmicrohttpd's suspend/resume: it holds no request
 * thread while it waits) and its write queued; the queue is handed to the committer
 * thread, which takes every write queued so far, runs them on its own connection inside
 * one transaction, each as a savepoint (storage_group_begin: a write that fails is rolled
 * back alone and answered with its own error), commits once, resumes their requests, and
 * goes on with the writes queued meanwhile. So a group holds every write that arrived
 * while the one before committed, however few request threads there are. A request is
 * answered only after its group committed. When the group cannot begin or commit, its
 * writes are made again one by one, each in its own transaction, so one bad write or a
 * failed commit never fails or loses the others; a write that commits an idempotency key
 * (storage.h) is replayed, not repeated, when its key was committed.
 *
 * Why not commit in the request's thread whenever no group runs: libmicrohttpd ties each
 * connection to the request thread that accepted it, and a burst of connections can all
 * land on one thread. That thread would then commit its clients' writes one after the
 * other, each client waiting behind the others' commits, and no write would ever find a
 * group to join; suspended instead, the thread goes on reading its other clients' writes
 * while a group commits.
 *
 * Invariant, under the lock: the queue is empty unless leading, so a write that finds no
 * group running has nothing to join. */
#include <string.h>

#include "serve/internal.h"

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

/* Commits the queue, group after group, until no write is left in it; called with the
 * lock held by the thread it was handed to, and ends the lead. */
static void commit_queue(serve_committer *c) {
  while (c->queue) {
    serve_write *batch = c->queue;
    c->queue = NULL;
    c->queue_end = &c->queue;
    pthread_mutex_unlock(&c->lock);
    unsigned long commits = commit_batch(c->st, batch);
    pthread_mutex_lock(&c->lock);
    c->commits += commits;
    for (serve_write *w = batch; w; w = w->next) c->writes++;
    pthread_mutex_unlock(&c->lock);
    /* Once resumed, a request may be answered and freed at once: next is read first. */
    for (serve_write *w = batch, *next; w; w = next) {
      next = w->next;
      MHD_resume_connection(w->suspended);
    }
    pthread_mutex_lock(&c->lock);
  }
  c->leading = false;
  pthread_cond_broadcast(&c->changed);
}

/* The committer thread: runs what is handed to it; ends once stopping with no group left. */
static void *committer_main(void *arg) {
  serve_committer *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->handed && !(c->stopping && !c->leading)) pthread_cond_wait(&c->changed, &c->lock);
    if (!c->handed) break;
    c->handed = false;
    commit_queue(c);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

void serve_committer_free(serve_committer *c) {
  pthread_cond_destroy(&c->changed);
  pthread_mutex_destroy(&c->lock);
}

int serve_committer_start(serve_committer *c, serve_pool *pool, nas_err *err) {
  *c = (serve_committer){.queue_end = &c->queue};
  storage *st;
  if (serve_pool_take(pool, &st, err) != NAS_OK) return NAS_ERR;
  c->st = st;
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->changed, NULL);
  int rc = pthread_create(&c->thread, NULL, committer_main, c);
  if (rc == 0) return NAS_OK;
  serve_committer_free(c);
  serve_pool_give(pool, c->st);
  return nas_errf(err, "cannot start the committer thread: %s", strerror(rc));
}

void serve_committer_stop(serve_committer *c, serve_pool *pool) {
  pthread_mutex_lock(&c->lock);
  c->stopping = true;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->lock);
  pthread_join(c->thread, NULL);
  serve_pool_give(pool, c->st);
  c->st = NULL;
}

void serve_committer_count(serve_committer *c, bool opened) {
  pthread_mutex_lock(&c->lock);
  c->clients = opened ? c->clients + 1 : c->clients - 1;
  pthread_mutex_unlock(&c->lock);
}

/* Suspends conn with w queued; called with the lock held. */
static void queue_suspended(serve_committer *c, serve_write *w, struct MHD_Connection *conn) {
  /* Suspended before it is queued, so the committer never resumes it first. */
  MHD_suspend_connection(conn);
  w->suspended = conn;
  *c->queue_end = w;
  c->queue_end = &w->next;
}

/* Makes w now in this thread when its client is the only one and no group runs (or when
 * stopping, once the group running ended): true. Else suspends conn with w queued, for
 * the group running or, when none runs, for the committer thread: false. */
static bool commit_or_queue(serve_committer *c, storage *st, serve_write *w,
                            struct MHD_Connection *conn) {
  w->next = NULL;
  w->suspended = NULL;
  pthread_mutex_lock(&c->lock);
  if (!c->stopping && (c->leading || c->clients > 1)) {
    queue_suspended(c, w, conn);
    if (!c->leading) {
      c->leading = c->handed = true;
      pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return false;
  }
  while (c->leading) pthread_cond_wait(&c->changed, &c->lock);
  c->leading = true;
  pthread_mutex_unlock(&c->lock);
  unsigned long commits = commit_batch(st, w);
  pthread_mutex_lock(&c->lock);
  c->writes++;
  c->commits += commits;
  /* Writes queued meanwhile go to the committer thread: this request is answered now. */
  if (c->queue) c->handed = true;
  else c->leading = false;
  /* Only the committer thread (handed writes, or stopping) and, when stopping, request
   * threads wait for this: a lone writer wakes no thread. */
  if (c->handed || c->stopping) pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->lock);
  return true;
}

void serve_submit(serve_request *req, serve_write *w) {
  if (!req->srv->grouped_writes) {
    w->run(req->st, w->arg);
    w->answer(req, w->arg);
  } else if (commit_or_queue(&req->srv->committer, req->st, w, req->conn)) {
    w->answer(req, w->arg);
  } else {
    req->waiting = w;
  }
}
