/* storage/pg_conn.h: a PostgreSQL connection that outlives server restarts (internal to
 * storage/, used by postgres.c).
 *
 * postgres.c describes each storage operation as a pg_op: one try of its whole
 * transaction. pg_run makes the try, and when the connection breaks it reconnects with
 * backoff and tries again, for up to retry_s seconds. A try that breaks after its commit
 * may have been sent has an unknown outcome; repeating it blindly could apply it twice. So
 * a write that is not idempotent commits a receipt in its own transaction: a row of
 * write_receipts named by a random token, new for each try. After such a break pg_run
 * settles the token before anything else:
 * - the receipt is there: the try committed; the operation's outcome is read back (the
 *   receipt holds the id of the row it made or took) and the operation succeeds;
 * - it is not: pg_run inserts the token itself as a tombstone. A try still in flight on the
 *   server (a network blip, not a restart) can then never commit, since its own receipt
 *   insert would collide; an insert of the token in progress makes the tombstone wait for
 *   its end. So the try did not and will not happen, and the next try (with a new token)
 *   is safe.
 * Sessions set idle_in_transaction_session_timeout, so that a transaction orphaned by a
 * network blip cannot hold its receipt (and its row locks) for more than a minute.
 *
 * An idempotency key armed on the connection (a request of the storage RPC, storage.h)
 * rides along: the try commits it as a second receipt row with the same result, so a key
 * is stored exactly when its write is.
 *
 * The schema must hold write_receipts (token text primary key, result bigint, done boolean
 * not null, at double precision, defaulting to the server's clock); see postgres.c. */
#ifndef NAS_STORAGE_PG_CONN_H
#define NAS_STORAGE_PG_CONN_H

#include <libpq-fe.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "storage/storage.h"

/* Outcomes of one try besides NAS_OK and the NAS_E* codes (which end the operation). */
enum {
  PG_LOST = -100,  /* the connection broke (or the server is out of reach): try again */
  PG_AGAIN = -101, /* the server rolled the try back (deadlock, serialization): try again */
};

typedef struct pg_conn {
  PGconn *pg;     /* NULL while there is no usable connection */
  char *uri;      /* owned: as given, password included; only ever handed to libpq */
  char *shown;    /* owned: the URI with any password masked, for messages */
  double retry_s; /* how long one operation keeps trying to reach the server */
  /* Borrowed: the idempotency key the next write with a receipt commits beside its own
   * token (storage.h); NULL when none is armed. */
  const char *request_key;
  const storage_watch *watch; /* borrowed: asked between retries; NULL when none is set */
} pg_conn;

/* Connects to uri: once when once is set, else retrying within the budget from
 * NAS_STORAGE_RETRY_S (which every later operation has either way). */
int pg_conn_open(const char *uri, bool once, pg_conn **out, nas_err *err);
void pg_conn_close(pg_conn *c);

/* ---- one try's statements ---------------------------------------------------------------- */

#define PG_PARAMS_MAX 16

/* A statement's parameters $1…$n, all sent as text. Text values are borrowed. */
typedef struct pg_params {
  int n;
  const char *text[PG_PARAMS_MAX]; /* the value, NULL for SQL NULL; unused for numbers */
  bool is_number[PG_PARAMS_MAX];   /* the value is number[i] */
  char number[PG_PARAMS_MAX][32];  /* numbers formatted as text */
} pg_params;

/* Sets parameters $first, $first + 1, … by the letters of types:
 *   t  const char *      text, NULL for SQL NULL
 *   i  int64_t
 *   o  const int64_t *   optional integer, NULL for SQL NULL
 *   d  double            (NaN and ±Infinity included)
 * Parameters below first are left as they are (a receipt token goes into $1 later). */
int pg_params_set(pg_params *p, int first, nas_err *err, const char *types, ...);
int pg_params_setv(pg_params *p, int first, nas_err *err, const char *types, va_list ap);
/* A double as PostgreSQL reads it back exactly: "%.17g", "NaN", "Infinity", "-Infinity". */
void pg_format_double(char out[32], double value);

/* Runs one parameterised statement (p may be NULL for none). *res, when res is not NULL,
 * gets the owned result. NAS_OK, NAS_ERR (the database's message and where it is),
 * PG_LOST or PG_AGAIN. */
int pg_exec(pg_conn *c, PGresult **res, nas_err *err, const char *sql, const pg_params *p);
/* Runs constant SQL holding several statements and no values (a migration step). */
int pg_exec_script(pg_conn *c, const char *sql, nas_err *err);

/* Begins a READ COMMITTED transaction, whatever the session's default level. */
int pg_tx_begin(pg_conn *c, nas_err *err);
/* Ends the transaction begun by pg_tx_begin: when rc is NAS_OK, records the receipt token
 * (when not NULL) with result and commits, else rolls back. Returns rc, or the failure of
 * the receipt or the commit. */
int pg_tx_end(pg_conn *c, int rc, const char *token, int64_t result, nas_err *err);

/* A common table expression, `pruned`, that every write with a receipt runs beside it: it
 * lets go of a few receipts older than STORAGE_RECEIPT_KEEP_S (backend.h), so that a
 * connection that stays open for days (a `nas serve`, a scheduler) keeps the table at a
 * day's receipts, not only an open does. A write adds at most two receipts and may take
 * up to eight old ones; SKIP LOCKED, so that concurrent writers never wait for each other's
 * pruning. */
#define PG_STRINGIFY(x) #x
#define PG_NUMBER_TEXT(x) PG_STRINGIFY(x)
#define PG_RECEIPTS_PRUNE_CTE                                                           \
  "pruned AS (DELETE FROM write_receipts WHERE token IN (SELECT token FROM write_receipts" \
  " WHERE at < extract(epoch FROM now()) - " PG_NUMBER_TEXT(STORAGE_RECEIPT_KEEP_S)      \
  " ORDER BY at LIMIT 8 FOR UPDATE SKIP LOCKED))"

/* The receipt tokens a try commits, as a text[] literal: its own token, and the armed
 * request key when there is one (keys are checked to hold only [A-Za-z0-9_-]). */
#define PG_RECEIPT_TOKENS_LEN 160
void pg_receipt_tokens(const pg_conn *c, const char *token, char out[PG_RECEIPT_TOKENS_LEN]);

/* Values of a result's fields; SQL NULL reads as 0 (pg_text: NULL). */
int64_t pg_int(const PGresult *res, int row, int col);
double pg_double(const PGresult *res, int row, int col);
int pg_text(const PGresult *res, int row, int col, char **out, nas_err *err);

/* ---- operations ---------------------------------------------------------------------------- */

typedef struct pg_op {
  /* One try of the whole operation as one transaction. token is NULL unless receipt is
   * set; then the try must commit it with pg_tx_end or in its single statement. */
  int (*attempt)(pg_conn *c, const char *token, void *ctx, nas_err *err);
  /* Called instead of a new try when a lost try turns out to have committed: result is
   * the id its receipt recorded. NULL when the operation has nothing to read back. */
  int (*recover)(pg_conn *c, int64_t result, void *ctx, nas_err *err);
  bool receipt; /* not idempotent: each try commits a receipt (see the top of this file) */
} pg_op;

/* Runs op until it succeeds or fails for good (the try's own code), retrying PG_LOST and
 * PG_AGAIN within the connection's budget. */
int pg_run(pg_conn *c, const pg_op *op, void *ctx, nas_err *err);

#endif
