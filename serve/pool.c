/* serve/pool.c: storage connections for the request threads. A connection serves one
 * request at a time (an SQLite connection must not be shared between threads mid-statement,
 * a libpq one not at all); connections are opened on demand and kept for the next request,
 * at most `cap` of them idle. */
#include <stdlib.h>

#include "serve/internal.h"

int serve_pool_init(serve_pool *p, const char *url, size_t cap, nas_err *err) {
  *p = (serve_pool){.url = url, .cap = cap};
  p->free_list = calloc(cap, sizeof *p->free_list);
  if (!p->free_list) return nas_errf(err, "out of memory");
  pthread_mutex_init(&p->lock, NULL);
  /* One connection now: a wrong URL or an unreachable database is reported at start. */
  storage *first;
  if (storage_open(url, &first, err) != NAS_OK) {
    serve_pool_free(p);
    return NAS_ERR;
  }
  serve_pool_give(p, first);
  return NAS_OK;
}

void serve_pool_free(serve_pool *p) {
  for (size_t i = 0; i < p->n_free; i++) storage_close(p->free_list[i]);
  free(p->free_list);
  if (p->cap) pthread_mutex_destroy(&p->lock);
  *p = (serve_pool){0};
}

int serve_pool_take(serve_pool *p, storage **out, nas_err *err) {
  pthread_mutex_lock(&p->lock);
  *out = p->n_free > 0 ? p->free_list[--p->n_free] : NULL;
  pthread_mutex_unlock(&p->lock);
  return *out ? NAS_OK : storage_open(p->url, out, err);
}

void serve_pool_give(serve_pool *p, storage *st) {
  pthread_mutex_lock(&p->lock);
  bool kept = p->n_free < p->cap;
  if (kept) p->free_list[p->n_free++] = st;
  pthread_mutex_unlock(&p->lock);
  if (!kept) storage_close(st);
}

