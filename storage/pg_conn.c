/* storage/pg_conn.c: a PostgreSQL connection that outlives server restarts (see pg_conn.h).
 *
 * Invariants:
 * - A pg_conn either holds a connection that was working when last used, or none (pg is
 *   NULL); a statement that finds the connection broken drops it, and the next try of the
 *   operation connects afresh.
 * - The URI with its passwords reaches libpq only; every message names the server by the
 *   redacted URI and has the passwords scrubbed out of libpq's own text.
 * - A try's outcome is known (committed or rolled back) before the next try starts: after
 *   a lost try of a write with a receipt, its token is settled first (see pg_conn.h).
 * - Backoff: the first retry is immediate (a single dropped connection costs nothing), then
 *   25 ms doubling up to 1 s, until the budget is spent. */
#include "storage/pg_conn.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/backend.h"

#define PG_BACKOFF_FIRST_S 0.025
#define PG_BACKOFF_MAX_S 1.0
#define PG_CONNECT_TIMEOUT_S "5" /* libpq's connect_timeout, in seconds (docs/cli.md) */
/* A server that vanishes without closing the connection (its machine off, the network
 * cut) is noticed in about 25 s when the connection is idle (a keepalive after 10 s, then 3
 * every 5 s), and in 30 s when data sent goes unacknowledged, instead of the kernel's two
 * hours or some fifteen minutes: well within the default retry budget, which then
 * reconnects. A server busy with a long statement still answers both at the TCP level. */
#define PG_KEEPALIVES_IDLE_S "10"
#define PG_KEEPALIVES_INTERVAL_S "5"
#define PG_KEEPALIVES_COUNT "3"
#define PG_TCP_USER_TIMEOUT_MS "30000"

/* Connection settings placed before the URI, which may override them: a name to show in
 * pg_stat_activity, a bound on each connection attempt (PG_CONNECT_TIMEOUT_S) so that
 * a host that does not answer cannot take the whole retry budget in one go, nor keep a
 * person waiting on `nas status` long, and the bounds above on a connection whose server
 * vanished. */
static const char *const connect_keys[] = {"fallback_application_name", "connect_timeout",
                                           "keepalives_idle", "keepalives_interval",
                                           "keepalives_count", "tcp_user_timeout",
                                           "dbname", NULL};

/* ---- messages ---------------------------------------------------------------------------- */

/* libpq's message text on one line: runs of blanks (its messages end in "\n" and continue
 * lines with "\n\t") become one space. */
static void one_line(const char *text, char *out, size_t size) {
  size_t n = 0;
  bool blank = true; /* drop leading blanks */
  for (const char *s = text ? text : ""; *s && n + 1 < size; s++) {
    bool is_blank = *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r';
    if (is_blank && blank) continue;
    out[n++] = is_blank ? ' ' : *s;
    blank = is_blank;
  }
  while (n > 0 && out[n - 1] == ' ') n--;
  out[n] = '\0';
}

/* Replaces, in text (a buffer of size bytes), every occurrence of from by to; what does
 * not fit is cut. */
static void replace_all(char *text, size_t size, const char *from, const char *to) {
  size_t from_len = strlen(from), n = 0;
  if (!from_len) return;
  char *out = malloc(size);
  if (!out) {
    snprintf(text, size, "(message withheld: out of memory)");
    return;
  }
  for (const char *s = text; *s && n + 1 < size;) {
    bool hit = strncmp(s, from, from_len) == 0;
    const char *piece = hit ? to : s;
    size_t len = hit ? strlen(to) : 1;
    if (len > size - 1 - n) len = size - 1 - n;
    memcpy(out + n, piece, len);
    n += len;
    s += hit ? from_len : 1;
  }
  out[n] = '\0';
  memcpy(text, out, n + 1);
  free(out);
}

/* replace_all of the len bytes at secret by "***". */
static void replace_n(char *text, size_t size, const char *secret, size_t len) {
  char *from = strndup(secret, len);
  if (from) replace_all(text, size, from, "***");
  else snprintf(text, size, "(message withheld: out of memory)");
  free(from);
}

/* Replaces in text every value that libpq reads from the URI for a secret parameter
 * (decoded: its connection errors may quote it). */
static void scrub_decoded_secrets(const char *uri, char *text, size_t size) {
  PQconninfoOption *options = PQconninfoParse(uri, NULL);
  for (PQconninfoOption *o = options; o && o->keyword; o++) {
    if (storage_key_is_secret(o->keyword, strlen(o->keyword)) && o->val && o->val[0])
      replace_all(text, size, o->val, "***");
  }
  PQconninfoFree(options);
}

/* Replaces in text the password of the URI's user part and the value of every secret query
 * parameter, as written (libpq's parse errors quote a value they cannot decode). */
static void scrub_raw_secrets(const char *uri, char *text, size_t size) {
  const char *user = strstr(uri, "://") + 3;
  const char *at = memrchr(user, '@', strcspn(user, "?"));
  const char *colon = at ? memchr(user, ':', (size_t)(at - user)) : NULL;
  if (colon && at > colon + 1) replace_n(text, size, colon + 1, (size_t)(at - colon - 1));
  for (const char *s = uri; *s; s++) {
    size_t len = 0;
    const char *value = *s == '?' || *s == '&' ? storage_uri_secret_value(s + 1, &len) : NULL;
    if (value && len) replace_n(text, size, value, len);
  }
}

/* Masks in text whatever of the URI's secrets libpq may echo: the whole URI (its parse
 * errors quote it) and each password, as written and as decoded. */
static void scrub(const pg_conn *c, char *text, size_t size) {
  replace_all(text, size, c->uri, c->shown);
  scrub_raw_secrets(c->uri, text, size);
  scrub_decoded_secrets(c->uri, text, size);
}

/* Writes "PREFIX TEXT (postgresql URI)" into err and returns code. The text is scrubbed
 * whole before anything cuts it, so that no cut can leave a piece of a secret behind. */
static int fail_with(const pg_conn *c, int code, const char *prefix, const char *text,
                     nas_err *err) {
  size_t size = 2 * strlen(text ? text : "") + 256;
  char *line = malloc(size);
  if (!line) return nas_errc(err, code, "%s(message withheld: out of memory)", prefix);
  one_line(text, line, size);
  scrub(c, line, size);
  nas_errc(err, code, "%s%s (postgresql %s)", prefix, line, c->shown);
  free(line);
  return code;
}

/* ---- connecting -------------------------------------------------------------------------- */

static void conn_drop(pg_conn *c) {
  PQfinish(c->pg);
  c->pg = NULL;
}

/* One connection attempt: NAS_OK with *out set, or NAS_ERR. */
static int connect_once(pg_conn *c, const char *const *values, PGconn **out, nas_err *err) {
  PGconn *pg = PQconnectdbParams(connect_keys, values, 1);
  if (!pg) return nas_errf(err, "out of memory");
  if (PQstatus(pg) == CONNECTION_OK) {
    *out = pg;
    return NAS_OK;
  }
  int rc = fail_with(c, NAS_ERR, "", PQerrorMessage(pg), err);
  PQfinish(pg);
  return rc;
}

/* A failed connection is worth trying again later (PG_LOST) when the server did not
 * answer, or answered that it is starting or stopping (libpq gives no SQLSTATE for a
 * failed connection, so PQping asks). A server that accepts connections and still refuses
 * ours (password, missing database) will refuse the next one too: NAS_ERR. But the ping
 * may find the server accepting just after it refused us while it was starting, so the
 * refusal is final only when a second attempt meets it too. */
static int conn_connect(pg_conn *c, nas_err *err) {
  /* libpq before 12 knows no tcp_user_timeout and would refuse it; a NULL value is skipped. */
  const char *user_timeout = PQlibVersion() >= 120000 ? PG_TCP_USER_TIMEOUT_MS : NULL;
  const char *values[] = {"nas", PG_CONNECT_TIMEOUT_S, PG_KEEPALIVES_IDLE_S,
                          PG_KEEPALIVES_INTERVAL_S, PG_KEEPALIVES_COUNT, user_timeout,
                          c->uri, NULL};
  PGconn *pg = NULL;
  int rc = connect_once(c, values, &pg, err);
  /* Without a budget there is no retry to decide on: the ping would only wait as long
   * again for a server that does not answer. */
  if (rc != NAS_OK && c->retry_s > 0) {
    PGPing ping = PQpingParams(connect_keys, values, 1);
    if (ping == PQPING_NO_RESPONSE || ping == PQPING_REJECT) return PG_LOST;
    if (ping == PQPING_OK) rc = connect_once(c, values, &pg, err);
  }
  if (rc != NAS_OK) return rc;
  c->pg = pg;
  return pg_exec(c, NULL, err,
                 "SELECT set_config('idle_in_transaction_session_timeout', '60s', false)", NULL);
}

static int conn_ensure(pg_conn *c, nas_err *err) {
  if (c->pg && PQstatus(c->pg) == CONNECTION_OK) return NAS_OK;
  conn_drop(c);
  return conn_connect(c, err);
}

void pg_conn_close(pg_conn *c) {
  if (!c) return;
  conn_drop(c);
  free(c->uri);
  free(c->shown);
  free(c);
}

static int nothing_to_do(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  (void)c, (void)token, (void)ctx, (void)err;
  return NAS_OK;
}

/* libpq ends the user name and password at the first '@' or '/', where storage_url_redacted
 * (like any URL reader) takes the last '@': unencoded in a password, either would make libpq
 * connect elsewhere and show the rest of the password as a host name. */
static int uri_check(const pg_conn *c, nas_err *err) {
  const char *user = strstr(c->uri, "://") + 3;
  const char *at = memrchr(user, '@', strcspn(user, "?"));
  size_t len = at ? (size_t)(at - user) : 0;
  if (memchr(user, '@', len) || memchr(user, '/', len)) {
    return nas_errf(err, "the user name or password holds '@' or '/'; write them as %%40 and "
                    "%%2F in the URL");
  }
  char *message = NULL;
  PQconninfoOption *options = PQconninfoParse(c->uri, &message);
  int rc = NAS_OK;
  if (!options) {
    rc = fail_with(c, NAS_ERR, "not a PostgreSQL URL: ", message ? message : "out of memory",
                   err);
  }
  PQfreemem(message);
  PQconninfoFree(options);
  return rc;
}

int pg_conn_open(const char *uri, bool once, pg_conn **out, nas_err *err) {
  pg_conn *c = calloc(1, sizeof *c);
  if (!c) return nas_errf(err, "out of memory");
  c->uri = strdup(uri);
  c->shown = storage_url_redacted(uri);
  int rc = c->uri && c->shown ? uri_check(c, err) : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = storage_retry_budget(&c->retry_s, err);
  /* An operation with nothing to do: pg_run connects before each try. */
  const pg_op connect_only = {.attempt = nothing_to_do};
  double budget = c->retry_s;
  if (once) c->retry_s = 0;
  if (rc == NAS_OK) rc = pg_run(c, &connect_only, NULL, err);
  c->retry_s = budget;
  if (rc != NAS_OK) {
    pg_conn_close(c);
    return rc;
  }
  *out = c;
  return NAS_OK;
}

/* ---- statements -------------------------------------------------------------------------- */

void pg_format_double(char out[32], double value) {
  if (isnan(value)) snprintf(out, 32, "NaN");
  else if (isinf(value)) snprintf(out, 32, "%sInfinity", value < 0 ? "-" : "");
  else snprintf(out, 32, "%.17g", value);
}

int pg_params_setv(pg_params *p, int first, nas_err *err, const char *types, va_list ap) {
  int count = (int)strlen(types);
  if (first < 1 || first - 1 + count > PG_PARAMS_MAX) {
    return nas_errf(err, "internal error: parameters $%d…$%d", first, first - 1 + count);
  }
  for (int k = 0; k < count; k++) {
    int i = first - 1 + k;
    p->is_number[i] = types[k] != 't';
    switch (types[k]) {
      case 't': p->text[i] = va_arg(ap, const char *); break;
      case 'i': snprintf(p->number[i], 32, "%" PRId64, va_arg(ap, int64_t)); break;
      case 'o': {
        const int64_t *value = va_arg(ap, const int64_t *);
        p->is_number[i] = value != NULL;
        p->text[i] = NULL;
        if (value) snprintf(p->number[i], 32, "%" PRId64, *value);
        break;
      }
      case 'd': pg_format_double(p->number[i], va_arg(ap, double)); break;
      default: return nas_errf(err, "internal error: parameter type '%c'", types[k]);
    }
  }
  if (first - 1 + count > p->n) p->n = first - 1 + count;
  return NAS_OK;
}

int pg_params_set(pg_params *p, int first, nas_err *err, const char *types, ...) {
  va_list ap;
  va_start(ap, types);
  int rc = pg_params_setv(p, first, err, types, ap);
  va_end(ap);
  return rc;
}

/* Connection-exception class 08, and the server stopping or starting (57P01 admin
 * shutdown, 57P02 crash shutdown, 57P03 cannot connect now). */
static bool is_connection_state(const char *state) {
  return state && (strncmp(state, "08", 2) == 0 || strcmp(state, "57P01") == 0 ||
                   strcmp(state, "57P02") == 0 || strcmp(state, "57P03") == 0);
}

/* Serialization failure and deadlock: the server rolled back the whole transaction. */
static bool is_retryable_state(const char *state) {
  return state && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0);
}

/* NAS_OK for a result that succeeded, else the code that says what to do about it. */
static int result_check(pg_conn *c, const PGresult *res, nas_err *err) {
  ExecStatusType status = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return NAS_OK;
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  const char *text = primary ? primary : PQerrorMessage(c->pg);
  if (PQstatus(c->pg) != CONNECTION_OK || is_connection_state(state)) {
    int rc = fail_with(c, PG_LOST, "connection lost: ", text, err);
    conn_drop(c);
    return rc;
  }
  if (is_retryable_state(state)) return fail_with(c, PG_AGAIN, "", text, err);
  if (!res) return nas_errf(err, "out of memory");
  return fail_with(c, NAS_ERR, "", text, err);
}

int pg_exec(pg_conn *c, PGresult **res, nas_err *err, const char *sql, const pg_params *p) {
  if (!c->pg) return fail_with(c, PG_LOST, "", "not connected", err);
  const char *values[PG_PARAMS_MAX];
  int n = p ? p->n : 0;
  for (int i = 0; i < n; i++) values[i] = p->is_number[i] ? p->number[i] : p->text[i];
  PGresult *r = PQexecParams(c->pg, sql, n, NULL, values, NULL, NULL, 0);
  int rc = result_check(c, r, err);
  if (rc == NAS_OK && res) *res = r;
  else PQclear(r);
  return rc;
}

int pg_exec_script(pg_conn *c, const char *sql, nas_err *err) {
  if (!c->pg) return fail_with(c, PG_LOST, "", "not connected", err);
  PGresult *r = PQexec(c->pg, sql);
  int rc = result_check(c, r, err);
  PQclear(r);
  return rc;
}

void pg_receipt_tokens(const pg_conn *c, const char *token, char out[PG_RECEIPT_TOKENS_LEN]) {
  if (c->request_key) snprintf(out, PG_RECEIPT_TOKENS_LEN, "{%s,%s}", token, c->request_key);
  else snprintf(out, PG_RECEIPT_TOKENS_LEN, "{%s}", token);
}

/* Every transaction of ours is written for READ COMMITTED: each statement sees what
 * committed before it began, so a statement run after waiting for a lock (the experiment's
 * row before numbering a trial, the advisory lock before reading the schema version) sees
 * the work of whoever held it. The level is named because the database, the role or the
 * URL's options may make another one the default. */
int pg_tx_begin(pg_conn *c, nas_err *err) {
  return pg_exec(c, NULL, err, "BEGIN ISOLATION LEVEL READ COMMITTED", NULL);
}

int pg_tx_end(pg_conn *c, int rc, const char *token, int64_t result, nas_err *err) {
  if (rc == NAS_OK && token) {
    pg_params p = {0};
    char tokens[PG_RECEIPT_TOKENS_LEN];
    pg_receipt_tokens(c, token, tokens);
    rc = pg_params_set(&p, 1, err, "ti", tokens, result);
    if (rc == NAS_OK) {
      rc = pg_exec(c, NULL, err,
                   "WITH " PG_RECEIPTS_PRUNE_CTE " INSERT INTO write_receipts (token, result, done)"
                   " SELECT unnest($1::text[]), $2, true", &p);
    }
  }
  if (rc == NAS_OK) rc = pg_exec(c, NULL, err, "COMMIT", NULL);
  /* A failed rollback is not reported over the error that caused it: the server rolls
   * the transaction back itself when the connection ends. */
  if (c->pg && PQtransactionStatus(c->pg) != PQTRANS_IDLE) PQclear(PQexec(c->pg, "ROLLBACK"));
  return rc;
}

int64_t pg_int(const PGresult *res, int row, int col) {
  return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/* float8's text output is the shortest that reads back exactly, NaN and Infinity
 * included, all of which strtod reads. */
double pg_double(const PGresult *res, int row, int col) {
  return PQgetisnull(res, row, col) ? 0 : strtod(PQgetvalue(res, row, col), NULL);
}

int pg_text(const PGresult *res, int row, int col, char **out, nas_err *err) {
  *out = NULL;
  if (PQgetisnull(res, row, col)) return NAS_OK;
  *out = strdup(PQgetvalue(res, row, col));
  return *out ? NAS_OK : nas_errf(err, "out of memory");
}

/* ---- operations ----------------------------------------------------------------------------- */

typedef enum {
  PHASE_TRY,     /* the next step is a try of the operation */
  PHASE_SETTLE,  /* a try with the current token may have committed: find out first */
  PHASE_RECOVER, /* it did: read back its outcome */
} run_phase;

/* Learns whether the lost try with token committed (see pg_conn.h): *phase becomes
 * PHASE_RECOVER with *result from its receipt, or PHASE_TRY with a new token. */
static int settle(pg_conn *c, char *token, run_phase *phase, int64_t *result, nas_err *err) {
  pg_params p = {0};
  PGresult *res = NULL;
  int rc = pg_params_set(&p, 1, err, "t", token);
  if (rc == NAS_OK) {
    rc = pg_exec(c, &res, err,
                 "INSERT INTO write_receipts (token, done) VALUES ($1, false)"
                 " ON CONFLICT (token) DO NOTHING RETURNING token",
                 &p);
  }
  if (rc != NAS_OK) return rc;
  bool fenced = PQntuples(res) == 1;
  PQclear(res);
  if (fenced) {
    *phase = PHASE_TRY;
    return storage_random_token(token, err);
  }
  rc = pg_exec(c, &res, err, "SELECT result FROM write_receipts WHERE token = $1 AND done", &p);
  if (rc != NAS_OK) return rc;
  if (PQntuples(res) == 1) {
    *result = pg_int(res, 0, 0);
    *phase = PHASE_RECOVER;
  } else {
    rc = nas_errf(err, "internal error: receipt %s is neither committed nor fenced", token);
  }
  PQclear(res);
  return rc;
}

typedef struct backoff {
  double deadline; /* monotonic seconds after which no retry starts */
  double delay;    /* the next wait */
} backoff;

/* Waits before the next retry: NAS_OK, NAS_ERR when that would pass the deadline, or
 * NAS_ECANCELED when the caller's watch said stop meanwhile. */
static int backoff_wait(const pg_conn *c, backoff *b, nas_err *err) {
  if (nas_monotonic() + b->delay > b->deadline) return NAS_ERR;
  bool slept = storage_backoff_sleep(c->watch, b->delay);
  b->delay = b->delay == 0 ? PG_BACKOFF_FIRST_S : fmin(2 * b->delay, PG_BACKOFF_MAX_S);
  return slept ? NAS_OK : storage_given_up_on_request(err);
}

static int give_up(const pg_conn *c, bool unsettled, nas_err *err) {
  if (unsettled) {
    nas_err_prefix(err, "the connection broke after the write was sent and the server stayed "
                        "out of reach for %g s, so whether it was stored is unknown", c->retry_s);
  } else {
    nas_err_prefix(err, "gave up after %g s of retries", c->retry_s);
  }
  return NAS_ERR;
}

int pg_run(pg_conn *c, const pg_op *op, void *ctx, nas_err *err) {
  backoff b = {.deadline = nas_monotonic() + c->retry_s, .delay = 0};
  char token[STORAGE_TOKEN_LEN + 1] = "";
  run_phase phase = PHASE_TRY;
  int64_t result = 0;
  if (op->receipt && storage_random_token(token, err) != NAS_OK) return NAS_ERR;
  for (;;) {
    int rc = conn_ensure(c, err);
    if (rc == NAS_OK && phase == PHASE_SETTLE) rc = settle(c, token, &phase, &result, err);
    if (rc == NAS_OK && phase == PHASE_TRY) {
      rc = op->attempt(c, op->receipt ? token : NULL, ctx, err);
      if (rc == PG_LOST && op->receipt) phase = PHASE_SETTLE;
    }
    if (rc == NAS_OK && phase == PHASE_RECOVER && op->recover) {
      rc = op->recover(c, result, ctx, err);
    }
    if (rc != PG_LOST && rc != PG_AGAIN) return rc;
    rc = backoff_wait(c, &b, err);
    if (rc == NAS_ECANCELED) return rc;
    if (rc != NAS_OK) return give_up(c, phase == PHASE_SETTLE, err);
  }
}
