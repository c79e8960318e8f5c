/* serve/internal.h: what the files of serve/ share (internal to serve/). */
#ifndef NAS_SERVE_INTERNAL_H
#define NAS_SERVE_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "serve/serve.h"
#include "notify/notify.h"
#include "storage/storage.h"

/* What a token (or, without a token file, a loopback client) may do. */
typedef enum { SCOPE_NONE = 0, SCOPE_READ, SCOPE_WRITE } serve_scope;

/* The tokens of a token file (auth.c). */
typedef struct {
  char **tokens;        /* owned */
  serve_scope *scopes;
  size_t n;
} serve_tokens;

/* A file of secrets (a token file, a TLS key) into an owned NUL-terminated *text: at most
 * SERVE_SECRET_MOST bytes, so a device such as /dev/zero is refused, not read for ever; a
 * FIFO is read without waiting for a writer (none: it is empty), a pipe as from <(…) to its
 * end. */
#define SERVE_SECRET_MOST (1u << 20)
int serve_read_secret(const char *path, char **text, nas_err *err);
int serve_tokens_load(const char *path, serve_tokens *out, nas_err *err);
void serve_tokens_free(serve_tokens *t);
/* The scope of the bearer token in an Authorization header value (NULL when absent):
 * SCOPE_NONE when it matches no token. Every token is compared in constant time. */
serve_scope serve_tokens_scope(const serve_tokens *t, const char *authorization);

/* Storage connections, one per request in flight (pool.c). */
typedef struct {
  const char *url;      /* borrowed */
  storage **free_list;  /* owned connections not in use */
  size_t n_free, cap;
  pthread_mutex_t lock;
} serve_pool;

int serve_pool_init(serve_pool *p, const char *url, size_t cap, nas_err *err);
void serve_pool_free(serve_pool *p);
/* A connection of its own for one request (opened when none is free). */
int serve_pool_take(serve_pool *p, storage **out, nas_err *err);
void serve_pool_give(serve_pool *p, storage *st);

struct serve_request;

/* One write handed to the group commit (commit.c): run makes it on the storage it is
 * given, keeping its outcome in arg; it may run twice (once in a group that failed to
 * commit, then alone), so it replaces any outcome of an earlier run. answer then sets the
 * request's reply from that outcome and frees arg (which holds this write), on the
 * request's own thread. */
typedef struct serve_write {
  void (*run)(storage *st, void *arg);
  void (*answer)(struct serve_request *req, void *arg);
  void *arg;
  struct MHD_Connection *suspended; /* the request's, while it waits suspended in the queue */
  struct serve_write *next;         /* in the queue or the group */
} serve_write;

/* The writes waiting for a group, the one group running, and the committer thread, which
 * runs the groups of suspended requests on a storage connection of its own. */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t changed;       /* a group ended, writes were handed over, or stopping */
  serve_write *queue, **queue_end;
  bool leading;                 /* a group runs now, or the queue is handed over to run */
  bool handed;                  /* the queue is the committer thread's to run */
  bool stopping;                /* no more suspending: each request waits in its thread */
  unsigned clients;             /* client connections open now (serve_committer_count) */
  storage *st;                  /* the committer thread's, from the pool */
  pthread_t thread;
  unsigned long writes, commits; /* so far; the stop line says them */
} serve_committer;

/* Starts the committer thread on a connection taken from pool. */
int serve_committer_start(serve_committer *c, serve_pool *pool, nas_err *err);
/* Runs what is queued (resuming its requests) and ends the thread, before the daemon
 * stops; writes handed in later are made in their request's thread. Gives the connection
 * back to pool. */
void serve_committer_stop(serve_committer *c, serve_pool *pool);
/* Once no request thread is left (the daemon stopped). */
void serve_committer_free(serve_committer *c);
/* Counts a client connection opened (opened true) or closed: with one open, a write is
 * made in its request's thread; with more, through the committer (serve_submit). */
void serve_committer_count(serve_committer *c, bool opened);
/* Makes w (its arg owned by the caller's request state, which it must not touch after
 * this call): through the group commit where the storage groups writes, else at once on
 * req->st. With one client connection open and no group running, w is made now in this
 * thread, on req->st, and answered; else the request is suspended with w in the queue
 * (req->waiting), to be answered when the committer thread has committed w's group and
 * resumed it. */
void serve_submit(struct serve_request *req, serve_write *w);

/* The webhooks of experiments told through the server (notifiers.c). */
typedef struct serve_notifier serve_notifier;
typedef struct {
  pthread_mutex_t lock;
  serve_notifier *all; /* owned: one per experiment and spec told so far */
  size_t n, cap;
} serve_notifiers;

void serve_notifiers_init(serve_notifiers *ns);
/* Flushes (notifier_close) and frees every notifier. */
void serve_notifiers_free(serve_notifiers *ns);
/* The notifier of exp's spec, started at the first call; borrowed until the server stops.
 * NULL when the spec has no webhooks (or they cannot start: logged). */
notifier *serve_notifiers_get(serve_notifiers *ns, const experiment_row *exp);

/* The server's state, shared by every request thread; immutable after start but the pool
 * and the committer. */
typedef struct {
  const serve_options *opt;
  serve_tokens tokens;   /* empty without a token file */
  bool open_to_loopback; /* no token file: loopback clients get write scope */
  serve_pool pool;
  char *cwd;             /* owned: where experiments created over HTTP keep their runs */
  /* The server's storage RPC writes and reports go through the group commit: many writes
   * per commit (one flush). On SQLite, which takes one writer at a time and makes the
   * others sleep and retry (its busy handler backs off up to 100 ms), it also keeps those
   * sleeps out of the tail latency. Where storage_can_group (SQLite). */
  bool grouped_writes;
  unsigned threads;      /* request threads (serve_options.threads, else its default) */
  serve_committer committer;
  serve_notifiers notifiers;
  atomic_bool mhd_spoke;  /* libmicrohttpd said something: its first message is kept */
  char mhd_message[256];  /* why it could not start, when it could not */
} serve_ctx;

/* One of the dashboard's files built into the binary (assets.c). */
typedef struct {
  const char *type;  /* its Content-Type */
  const char *bytes; /* static, followed by a NUL */
  size_t size;
} serve_asset;

/* The file called name ("index.html", "app.css", "app.js", "chart.js"); false when none. */
bool serve_asset_find(const char *name, serve_asset *out);

/* One request, from its first byte to its log line. */
typedef struct serve_request {
  serve_ctx *srv;
  struct MHD_Connection *conn;
  const char *method;    /* borrowed from MHD for the request's life */
  char *path;            /* owned */
  char *body;            /* owned, NUL-terminated */
  size_t body_len;
  bool body_too_big;
  double started;        /* monotonic seconds */
  storage *st;           /* taken from the pool while the handler runs */
  serve_scope scope;     /* what the client may do (set before the handler runs) */
  int status;            /* of the reply */
  const char *allow;     /* static: a 405's Allow header, the methods its path takes */
  json_t *reply;         /* owned until sent */
  serve_asset asset;     /* a dashboard file to answer instead, when asset.bytes */
  serve_write *waiting;  /* the write it is suspended for (serve_submit), until answered */
} serve_request;

/* The largest body accepted; more is answered 413. */
#define SERVE_BODY_LIMIT (4u << 20)

/* Sets the reply (taking the reference to body). */
void serve_reply(serve_request *req, int status, json_t *body);
/* Sets an error reply {"error": "..."}; returns NAS_ERR for `return serve_fail(…)`. */
int serve_fail(serve_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Maps a storage/scheduler failure to its status: NAS_ENOTFOUND 404, NAS_EEXIST 409,
 * anything else 500. */
int serve_fail_err(serve_request *req, int code, const nas_err *err);
/* A query argument (?key=value), or NULL. */
const char *serve_query(serve_request *req, const char *key);
/* The body as a JSON object (an empty body is {}); a 400 reply and NULL when it is not. */
json_t *serve_body_json(serve_request *req);

/* ---- reading what clients send (parse.c; pure, fuzzed by tests/fuzz/fuzz_request.c) ---- */

/* Whether path matches pattern, whose "*" segments match one segment each; parts[] get
 * those segments (cut out of path in place, so only on a match). */
bool serve_path_match(const char *pattern, char *path, char **parts, size_t max_parts,
                      size_t *n_parts);
/* Whether a Host header names this machine's loopback (127.0.0.0/8, [::1] or localhost,
 * with or without a port). */
bool serve_host_is_loopback(const char *host);
/* Whether an Origin header is this server as the client addressed it (scheme, then the
 * Host header's name and port); false without a host. */
bool serve_origin_is_host(const char *origin, const char *host);
/* A decimal count from 0 to max, digits only. */
int serve_parse_count(const char *text, long max, long *out);
/* body's "step": an integer that passes metric_step_check (an intermediate report), else
 * METRIC_FINAL. */
int serve_parse_step(const json_t *body, int64_t *step, char *why, size_t why_size);
/* body's "metrics" object of numbers as observations at step, reported at time now; names
 * are borrowed from body, *obs is owned. NAS_ERR with why when it is not such an object
 * (absent is fine unless required). */
int serve_parse_metrics(const json_t *body, bool required, int64_t step, double now,
                        metric_obs **obs, size_t *n, char *why, size_t why_size);

/* A dashboard page or file (web.c): sets req->asset and returns true when req asks for
 * one (GET / and /static/NAME). They hold no data, so need no token. */
bool serve_web_route(serve_request *req);

/* The routes (api.c): answers req, whose scope the caller has worked out (req->scope). */
void serve_route(serve_request *req);

#endif
