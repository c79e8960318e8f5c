/* serve: `nas serve`, the HTTP service over one storage.
 *
 * A JSON API under /api/v1/ (docs/api.md): experiments, trials, Pareto fronts, creating and
 * stopping experiments, and ask/tell; and the dashboard at / (docs/dashboard.md), whose
 * files are built into the binary (assets.c, web.c). The server holds no state of its own: every request
 * reads and writes through the storage interface and the scheduler's calls, exactly as the
 * CLI does, so a server, `nas run` and the CLI on one storage always agree.
 *
 * HTTP itself is libmicrohttpd's (no parsing here). Requests are served by a pool of
 * threads (serve_options.threads), each with a storage connection of its own; bodies are
 * limited in size and slow clients in time. Without a token file only loopback clients are served; with one, every
 * request carries `Authorization: Bearer TOKEN` with a read or write scope. */
#ifndef NAS_SERVE_H
#define NAS_SERVE_H

#include <jansson.h>
#include <stdio.h>

#include "common/common.h"

/* Request threads: each serves one request at a time on a storage connection of its own
 * (so the server holds at most that many, and one more for the committer on SQLite). The
 * server groups the writes of SQLite (commit.c), one group at a time. An SQLite file is on this machine, where a
 * read takes microseconds, so a few threads do; a PostgreSQL server may be a network hop
 * away, and more threads keep more reads (and asks) going while others wait on it. */
enum {
  SERVE_THREADS_SQLITE = 4, /* default on SQLite */
  SERVE_THREADS_OTHER = 16, /* default elsewhere (PostgreSQL) */
  SERVE_THREADS_MOST = 64,  /* kept well below PostgreSQL's max_connections (100) */
};

typedef struct {
  const char *storage_url; /* borrowed */
  unsigned threads;        /* 1 … SERVE_THREADS_MOST; 0: the default for the storage */
  const char *listen;      /* "HOST:PORT"; port 0 picks a free one (default 127.0.0.1:8470) */
  const char *token_file;  /* NULL: no tokens, loopback clients only */
  const char *tls_cert;    /* PEM files; both or neither */
  const char *tls_key;
  FILE *log;               /* one line per request; borrowed */
  /* Called once the server listens, with the port it got (may be NULL). */
  void (*on_listening)(void *ctx, int port);
  void *on_listening_ctx;
} serve_options;

/* Serves until SIGINT or SIGTERM (blocked in the calling thread and waited for), then stops
 * accepting, lets requests in flight finish, and returns. */
int serve_run(const serve_options *opt, nas_err *err);

/* `nas plot`: writes the dashboard's page as one self-contained HTML file that opens from
 * disk with no server, its style, Chart.js and script inlined and data as window.NAS_DATA:
 * {"page": "experiment", "kind": null or one chart's name, "dashboard": the answer of GET
 * …/dashboard with "curves" (…/curves's) added} or {"page": "compare", "compare": the
 * answer of GET /api/v1/compare}. */
int serve_plot_write(FILE *f, const json_t *data, nas_err *err);

#endif
