/* storage/postgres.c: the PostgreSQL backend of storage (URL postgresql://… or postgres://…).
 *
 * What a team uses when workers on many machines report into one place. Every operation
 * goes through pg_run (pg_conn.h), which reconnects after a lost connection and makes sure
 * a write happens exactly once or is reported as failed.
 *
 * Invariants:
 * - Each storage operation is one transaction: a single statement (its own implicit
 *   transaction) or BEGIN … COMMIT. Writes that are not idempotent commit a receipt in
 *   that same transaction.
 * - SQL text is constant; every value travels as a parameter, a batch of observations as
 *   array parameters.
 * - The schema only moves forward through `migrations` (version i → i + 1), all pending
 *   steps in one transaction, serialised between processes by an advisory lock, with the
 *   same versions as the SQLite schema. A newer schema is refused before anything is written.
 * - A trial's state change locks its row (FOR UPDATE) before the state machine in
 *   storage.c judges it; creating a trial locks its experiment's row first, so concurrent
 *   creators get consecutive numbers; claiming skips rows other claimers hold (SKIP
 *   LOCKED), so no trial is ever taken twice.
 * - Times are double precision Unix seconds; NULL stands for "not yet" (read back as 0)
 *   and for a final metric's step (METRIC_FINAL). NaN and ±Infinity are stored as such. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/backend.h"
#include "storage/pg_conn.h"

/* ---- schema ---------------------------------------------------------------------------
 * migrations[i] takes the schema from version i to i + 1. Append only, as for SQLite. */
static const char *const migrations[] = {
    /* 0 → 1: the first schema, and the receipts of writes (pg_conn.h). */
    "CREATE TABLE schema_version ("
    "  one integer PRIMARY KEY CHECK (one = 1),"
    "  version bigint NOT NULL);"
    "INSERT INTO schema_version (one, version) VALUES (1, 0);"
    "CREATE TABLE experiments ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  name text NOT NULL UNIQUE,"
    "  spec_text text NOT NULL,"
    "  spec_path text NOT NULL,"
    "  run_root text NOT NULL,"
    "  status text NOT NULL,"
    "  created_at double precision NOT NULL);"
    "CREATE TABLE trials ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  experiment_id bigint NOT NULL REFERENCES experiments (id),"
    "  number integer NOT NULL,"
    "  status text NOT NULL CHECK (status IN"
    "    ('queued', 'running', 'completed', 'failed', 'timeout', 'stopped')),"
    "  params_json text NOT NULL,"
    "  attempts integer NOT NULL,"
    "  created_at double precision NOT NULL,"
    "  started_at double precision,"
    "  finished_at double precision,"
    "  job_id text,"
    "  exit_code integer,"
    "  error text,"
    "  log_offset bigint NOT NULL,"
    "  UNIQUE (experiment_id, number));"
    "CREATE TABLE metrics ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  trial_id bigint NOT NULL REFERENCES trials (id),"
    "  name text NOT NULL,"
    "  step bigint,"
    "  value double precision,"
    "  time double precision NOT NULL);"
    "CREATE INDEX metrics_by_trial ON metrics (trial_id);"
    "CREATE TABLE write_receipts ("
    "  token text PRIMARY KEY,"
    "  result bigint,"
    "  done boolean NOT NULL,"
    "  at double precision NOT NULL DEFAULT extract(epoch FROM now()));"
    "CREATE INDEX write_receipts_by_age ON write_receipts (at);",
    /* 1 → 2: heartbeats of running trials; an index for claiming the oldest queued trial. */
    "ALTER TABLE trials ADD COLUMN heartbeat_at double precision;"
    "CREATE INDEX trials_queued ON trials (experiment_id, number) WHERE status = 'queued';",
    /* 2 → 3: the reference point each suggestion aimed at. */
    "ALTER TABLE trials ADD COLUMN reference_json text;",
    /* 3 → 4: the lease of the one scheduler that runs an experiment. */
    "CREATE TABLE scheduler_leases ("
    "  experiment_id bigint PRIMARY KEY REFERENCES experiments (id),"
    "  token text NOT NULL,"
    "  host text NOT NULL,"
    "  pid bigint NOT NULL,"
    "  started_at double precision NOT NULL,"
    "  heartbeat_at double precision NOT NULL);",
    /* 4 → 5: idempotency keys of storage RPC requests (storage.h) are receipts too: they
     * share write_receipts, which version 1 made, so only its description changes. */
    "COMMENT ON TABLE write_receipts IS"
    " 'receipts of writes: per-try tokens (pg_conn.h) and idempotency keys of requests';",
    /* 5 → 6: the multi-fidelity rung of each trial (storage.h, trial_row.rung). */
    "ALTER TABLE trials ADD COLUMN rung integer NOT NULL DEFAULT 0;",
};
#define SCHEMA_VERSION ((int64_t)(sizeof migrations / sizeof migrations[0]))


/* The receipt of a single-statement write, as its last common table expressions (old
 * receipts pruned beside it): $1 is the array of tokens (pg_receipt_tokens), `rel` the rows
 * it made or took (the receipt records the id of one). */
#define RECEIPT_FROM(rel)                                                       \
  PG_RECEIPTS_PRUNE_CTE ","                                                     \
  " receipt AS (INSERT INTO write_receipts (token, result, done)"               \
  " SELECT tokens.token, id, true FROM " rel ", unnest($1::text[]) AS tokens (token))"

/* The INSERT of one trial's observations in their order (unnest keeps it, ORDINALITY
 * says it): `trial` is the SQL of the trial's id, `from` what the SELECT reads beside the
 * arrays ("" or "t,"), a b c d the parameter numbers of metric_columns' four arrays. */
#define METRICS_INSERT(trial, from, a, b, c, d)                                 \
  "INSERT INTO metrics (trial_id, name, step, value, time)"                     \
  " SELECT " trial ", o.name, o.step, o.value, o.time FROM " from               \
  " unnest($" #a "::text[], $" #b "::bigint[], $" #c "::float8[], $" #d "::float8[])" \
  "   WITH ORDINALITY AS o (name, step, value, time, i) ORDER BY o.i"

/* ---- rows ------------------------------------------------------------------------------ */

/* How to read one kind of row from a result, and how to free what a row owns. A reader
 * leaves its row cleared when it fails. */
typedef struct row_kind {
  size_t size;
  int (*read)(const PGresult *res, int row, void *out, nas_err *err);
  void (*clear)(void *row);
} row_kind;

static void rows_free(const row_kind *kind, void *rows, size_t n) {
  for (size_t i = 0; rows && i < n; i++) kind->clear((char *)rows + i * kind->size);
  free(rows);
}

#define EXPERIMENT_COLUMNS "id, name, spec_text, spec_path, run_root, status, created_at"

static int experiment_read(const PGresult *res, int row, void *out, nas_err *err) {
  experiment_row *e = out;
  memset(e, 0, sizeof *e);
  e->id = pg_int(res, row, 0);
  e->created_at = pg_double(res, row, 6);
  int rc = pg_text(res, row, 1, &e->name, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 2, &e->spec_text, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 3, &e->spec_path, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 4, &e->run_root, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 5, &e->status, err);
  if (rc != NAS_OK) experiment_row_clear(e);
  return rc;
}

static void experiment_clear(void *row) { experiment_row_clear(row); }

static const row_kind experiment_kind = {sizeof(experiment_row), experiment_read,
                                         experiment_clear};

#define TRIAL_COLUMNS                                                                      \
  "id, experiment_id, number, status, params_json, attempts, created_at, started_at, "    \
  "finished_at, job_id, exit_code, error, log_offset, heartbeat_at, reference_json, rung"

static int trial_read(const PGresult *res, int row, void *out, nas_err *err) {
  trial_row *t = out;
  memset(t, 0, sizeof *t);
  t->id = pg_int(res, row, 0);
  t->experiment_id = pg_int(res, row, 1);
  t->number = (int)pg_int(res, row, 2);
  const char *status = PQgetvalue(res, row, 3);
  if (trial_status_parse(status, &t->status) != NAS_OK) {
    return nas_errf(err, "trial %" PRId64 " has unknown status '%s'", t->id, status);
  }
  t->attempts = (int)pg_int(res, row, 5);
  t->created_at = pg_double(res, row, 6);
  t->started_at = pg_double(res, row, 7);
  t->finished_at = pg_double(res, row, 8);
  t->has_exit_code = !PQgetisnull(res, row, 10);
  t->exit_code = (int)pg_int(res, row, 10);
  t->log_offset = pg_int(res, row, 12);
  t->heartbeat_at = pg_double(res, row, 13);
  t->rung = (int)pg_int(res, row, 15);
  int rc = pg_text(res, row, 4, &t->params_json, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 9, &t->job_id, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 11, &t->error, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 14, &t->reference_json, err);
  if (rc != NAS_OK) trial_row_clear(t);
  return rc;
}

static void trial_clear(void *row) { trial_row_clear(row); }

static const row_kind trial_kind = {sizeof(trial_row), trial_read, trial_clear};

static int metric_read(const PGresult *res, int row, void *out, nas_err *err) {
  metric_row *m = out;
  memset(m, 0, sizeof *m);
  m->id = pg_int(res, row, 0);
  m->trial_id = pg_int(res, row, 1);
  m->step = PQgetisnull(res, row, 3) ? METRIC_FINAL : pg_int(res, row, 3);
  m->value = pg_double(res, row, 4);
  m->time = pg_double(res, row, 5);
  return pg_text(res, row, 2, &m->name, err);
}

static void metric_clear(void *row) {
  metric_row *m = row;
  free(m->name);
  m->name = NULL;
}

static const row_kind metric_kind = {sizeof(metric_row), metric_read, metric_clear};

/* A row of one id: what an INSERT or UPDATE … RETURNING id says it touched. */
static int id_read(const PGresult *res, int row, void *out, nas_err *err) {
  (void)err;
  *(int64_t *)out = pg_int(res, row, 0);
  return NAS_OK;
}

static void id_clear(void *row) { (void)row; }

static const row_kind id_kind = {sizeof(int64_t), id_read, id_clear};

/* Every row of res as an owned array (NULL when there are none). */
static int rows_read(const PGresult *res, const row_kind *kind, void **out, size_t *n,
                     nas_err *err) {
  size_t count = (size_t)PQntuples(res);
  char *rows = count ? calloc(count, kind->size) : NULL;
  if (count && !rows) return nas_errf(err, "out of memory");
  for (size_t i = 0; i < count; i++) {
    int rc = kind->read(res, (int)i, rows + i * kind->size, err);
    if (rc != NAS_OK) {
      rows_free(kind, rows, i);
      return rc;
    }
  }
  *out = rows;
  *n = count;
  return NAS_OK;
}

/* ---- single-statement operations ---------------------------------------------------------- */

/* An operation that is one statement: a read, an idempotent write, or a write with a
 * receipt (then its $1 is the token, and its other values start at $2). */
typedef struct statement {
  const char *sql;
  pg_params params;
  const row_kind *kind; /* how to read the rows it returns */
  void *rows;           /* owned: the rows of the try that succeeded */
  size_t n;
  bool recovered;       /* a lost try committed: rows is empty, recovered_id says what */
  int64_t recovered_id; /* the id its receipt recorded */
  char tokens[PG_RECEIPT_TOKENS_LEN]; /* $1 of a write with a receipt */
} statement;

static int statement_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  statement *s = ctx;
  if (token) {
    pg_receipt_tokens(c, token, s->tokens);
    s->params.text[0] = s->tokens;
  }
  PGresult *res = NULL;
  int rc = pg_exec(c, &res, err, s->sql, &s->params);
  if (rc == NAS_OK) rc = rows_read(res, s->kind, &s->rows, &s->n, err);
  PQclear(res);
  return rc;
}

static int statement_recover(pg_conn *c, int64_t result, void *ctx, nas_err *err) {
  (void)c, (void)err;
  statement *s = ctx;
  s->recovered = true;
  s->recovered_id = result;
  return NAS_OK;
}

/* Runs s; the caller frees s->rows afterwards (statement_free). */
static int statement_run(pg_conn *c, statement *s, bool receipt, nas_err *err) {
  static const pg_op plain = {.attempt = statement_attempt};
  static const pg_op with_receipt = {.attempt = statement_attempt,
                                     .recover = statement_recover,
                                     .receipt = true};
  return pg_run(c, receipt ? &with_receipt : &plain, s, err);
}

static void statement_free(statement *s) {
  rows_free(s->kind, s->rows, s->n);
  s->rows = NULL;
  s->n = 0;
}

/* Moves the first row of s into *row and frees the rest; NAS_ENOTFOUND with `missing` as
 * the message when there is none. */
static int statement_take_first(statement *s, void *row, const char *missing, nas_err *err) {
  if (s->n == 0) return nas_errc(err, NAS_ENOTFOUND, "%s", missing);
  memcpy(row, s->rows, s->kind->size);
  memset(s->rows, 0, s->kind->size);
  statement_free(s);
  return NAS_OK;
}

/* Runs sql, without a receipt, with the values described by types (see pg_params_set). */
static int statement_runv(pg_conn *c, statement *s, nas_err *err, const char *types,
                          va_list ap) {
  int rc = pg_params_setv(&s->params, 1, err, types, ap);
  return rc == NAS_OK ? statement_run(c, s, false, err) : rc;
}

/* Every row a read returns, as an owned array. */
static int query_rows(pg_conn *c, const row_kind *kind, void **out, size_t *n, nas_err *err,
                      const char *sql, const char *types, ...) {
  statement s = {.sql = sql, .kind = kind};
  va_list ap;
  va_start(ap, types);
  int rc = statement_runv(c, &s, err, types, ap);
  va_end(ap);
  if (rc != NAS_OK) return rc;
  *out = s.rows;
  *n = s.n;
  return NAS_OK;
}

/* The one row a read returns into *row; NAS_ENOTFOUND (with `missing` as the message)
 * when there is none. */
static int query_row(pg_conn *c, const row_kind *kind, void *row, const char *missing,
                     nas_err *err, const char *sql, const char *types, ...) {
  statement s = {.sql = sql, .kind = kind};
  va_list ap;
  va_start(ap, types);
  int rc = statement_runv(c, &s, err, types, ap);
  va_end(ap);
  if (rc == NAS_OK) rc = statement_take_first(&s, row, missing, err);
  statement_free(&s);
  return rc;
}

/* ---- opening: schema check and migrations ------------------------------------------------ */

/* The schema version: 0 when the current schema holds no table at all. Tables without
 * schema_version belong to someone else and are left alone. */
static int schema_version_read_in(pg_conn *c, int64_t *version, nas_err *err) {
  PGresult *res = NULL;
  int rc = pg_exec(c, &res, err,
                   "SELECT count(*), count(*) FILTER (WHERE tablename = 'schema_version')"
                   " FROM pg_catalog.pg_tables WHERE schemaname = current_schema()",
                   NULL);
  if (rc != NAS_OK) return rc;
  bool empty = pg_int(res, 0, 0) == 0, ours = pg_int(res, 0, 1) == 1;
  PQclear(res);
  *version = 0;
  if (empty) return NAS_OK;
  if (!ours) {
    return nas_errf(err, "%s holds tables but is not a nas storage (no schema_version)",
                    c->shown);
  }
  rc = pg_exec(c, &res, err, "SELECT version FROM schema_version", NULL);
  if (rc != NAS_OK) return rc;
  if (PQntuples(res) != 1) rc = nas_errf(err, "%s has an empty schema_version table", c->shown);
  else *version = pg_int(res, 0, 0);
  PQclear(res);
  return rc;
}

static int schema_version_check(const pg_conn *c, int64_t version, nas_err *err) {
  if (version <= SCHEMA_VERSION) return NAS_OK;
  return nas_errf(err, "%s has schema version %" PRId64 " but this nas knows versions up to %"
                  PRId64 "; use a newer nas", c->shown, version, SCHEMA_VERSION);
}

static int schema_version_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  (void)token;
  return schema_version_read_in(c, ctx, err);
}

/* Key of the advisory lock that serialises migrations in one database: "nas-sch" read as
 * a big-endian integer. */
#define MIGRATION_LOCK_KEY "31069394749842280"

/* Applies the pending migration steps in order, all in one transaction, so that no
 * process ever sees a schema half-way between two versions. The version is read under the
 * lock: another process may have migrated meanwhile, and then there is nothing left to do.
 * A lost connection rolls everything back, so trying again is safe. */
static int migrate_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  (void)token, (void)ctx;
  int64_t version = 0;
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = pg_exec(c, NULL, err, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ")", NULL);
  if (rc == NAS_OK) rc = schema_version_read_in(c, &version, err);
  if (rc == NAS_OK) rc = schema_version_check(c, version, err);
  for (int64_t step = version; rc == NAS_OK && step < SCHEMA_VERSION; step++) {
    rc = pg_exec_script(c, migrations[step], err);
  }
  if (rc == NAS_OK && version < SCHEMA_VERSION) {
    pg_params p = {0};
    rc = pg_params_set(&p, 1, err, "i", SCHEMA_VERSION);
    if (rc == NAS_OK) rc = pg_exec(c, NULL, err, "UPDATE schema_version SET version = $1", &p);
  }
  return pg_tx_end(c, rc, NULL, 0, err);
}

static int prepare_schema(pg_conn *c, nas_err *err) {
  const pg_op read_version = {.attempt = schema_version_attempt};
  int64_t version = 0;
  int rc = pg_run(c, &read_version, &version, err);
  if (rc == NAS_OK) rc = schema_version_check(c, version, err);
  if (rc != NAS_OK || version == SCHEMA_VERSION) return rc;
  if (version > 0) {
    nas_log("storage %s: upgrading schema version %" PRId64 " to %" PRId64, c->shown, version,
            SCHEMA_VERSION);
  }
  const pg_op migrate = {.attempt = migrate_attempt};
  return pg_run(c, &migrate, NULL, err);
}

/* Receipts outlive any retry that could look them up by far; old ones go at each open (all
 * of them) and beside each write with a receipt (a few: PG_RECEIPTS_PRUNE_CTE). Pruning
 * at open is housekeeping, so its failure is let pass: a connection that may only read (a
 * hot standby, a role granted SELECT alone) cannot delete, and still opens to read. */
static void receipts_prune(pg_conn *c) {
  void *rows = NULL;
  size_t n = 0;
  nas_err ignored;
  if (query_rows(c, &id_kind, &rows, &n, &ignored,
                 "WITH pruned AS (DELETE FROM write_receipts"
                 "   WHERE at < extract(epoch FROM now()) - $1)"
                 " SELECT 0",
                 "i", (int64_t)STORAGE_RECEIPT_KEEP_S) == NAS_OK)
    free(rows);
}

static void postgres_close(void *conn) { pg_conn_close(conn); }

static int postgres_open(const char *target, unsigned flags, void **conn, nas_err *err) {
  pg_conn *c = NULL;
  int rc = pg_conn_open(target, flags & STORAGE_CONNECT_ONCE, &c, err);
  if (rc == NAS_OK) rc = prepare_schema(c, err);
  if (rc == NAS_OK) receipts_prune(c);
  if (rc != NAS_OK) {
    pg_conn_close(c);
    return rc;
  }
  *conn = c;
  return NAS_OK;
}

/* ---- experiments --------------------------------------------------------------------- */

static int postgres_experiment_create(void *conn, const char *name, const char *spec_text,
                                      const char *spec_path, const char *run_root, double now,
                                      int64_t *id, nas_err *err) {
  statement s = {
      .kind = &id_kind,
      .sql = "WITH made AS ("
             "  INSERT INTO experiments (name, spec_text, spec_path, run_root, status, created_at)"
             "  VALUES ($2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING RETURNING id),"
             " " RECEIPT_FROM("made") " SELECT id FROM made"};
  int rc = pg_params_set(&s.params, 2, err, "tttttd", name, spec_text, spec_path, run_root,
                         storage_experiment_statuses[0], now);
  if (rc == NAS_OK) rc = statement_run(conn, &s, true, err);
  if (rc == NAS_OK && s.recovered) *id = s.recovered_id;
  else if (rc == NAS_OK && s.n == 1) *id = *(int64_t *)s.rows;
  else if (rc == NAS_OK) rc = nas_errc(err, NAS_EEXIST, "an experiment of that name exists already");
  statement_free(&s);
  return rc;
}

static int postgres_experiment_get(void *conn, const char *name, experiment_row *out,
                                   nas_err *err) {
  return query_row(conn, &experiment_kind, out, "no such experiment", err,
                   "SELECT " EXPERIMENT_COLUMNS " FROM experiments WHERE name = $1", "t", name);
}

static int postgres_experiment_list(void *conn, experiment_row **out, size_t *n, nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &experiment_kind, &rows, n, err,
                     "SELECT " EXPERIMENT_COLUMNS " FROM experiments ORDER BY id", "");
  if (rc == NAS_OK) *out = rows;
  return rc;
}

/* An UPDATE of one experiment's column; setting a value twice changes nothing, so it needs
 * no receipt. NAS_ENOTFOUND when no row has that id. */
static int experiment_update(pg_conn *c, const char *sql, const char *value, int64_t id,
                             nas_err *err) {
  void *rows = NULL;
  size_t n = 0;
  int rc = query_rows(c, &id_kind, &rows, &n, err, sql, "ti", value, id);
  free(rows);
  if (rc == NAS_OK && n == 0) rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  return rc;
}

/* One status change: what to set, and what the try found. */
typedef struct status_change {
  int64_t id;
  const char *status; /* borrowed */
  bool changed;       /* the try (or the lost try that committed) changed the status */
} status_change;

/* Reads the status under the row's lock and updates it only when it differs, so the
 * finding (no such experiment, the same status, another one) and the update are one
 * decision: a racing caller waits for the lock, then finds the status set. A try that
 * finds no experiment rolls back, its receipt (and idempotency key) with it. */
static int status_change_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  status_change *sc = ctx;
  pg_params p = {0};
  PGresult *res = NULL;
  int rc = pg_params_set(&p, 1, err, "ti", sc->status, sc->id);
  if (rc == NAS_OK) rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = pg_exec(c, &res, err, "SELECT status <> $1 FROM experiments WHERE id = $2 FOR UPDATE",
               &p);
  if (rc == NAS_OK && PQntuples(res) == 0) rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  sc->changed = rc == NAS_OK && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
  PQclear(res);
  if (sc->changed)
    rc = pg_exec(c, NULL, err, "UPDATE experiments SET status = $1 WHERE id = $2", &p);
  return pg_tx_end(c, rc, token, sc->changed, err);
}

static int status_change_recover(pg_conn *c, int64_t result, void *ctx, nas_err *err) {
  (void)c, (void)err;
  ((status_change *)ctx)->changed = result != 0;
  return NAS_OK;
}

/* The receipt records whether the try changed the status, for a retry to read back. */
static int postgres_experiment_set_status(void *conn, int64_t id, const char *status,
                                          bool *changed, nas_err *err) {
  static const pg_op op = {
      .attempt = status_change_attempt, .recover = status_change_recover, .receipt = true};
  status_change sc = {.id = id, .status = status};
  int rc = pg_run(conn, &op, &sc, err);
  *changed = rc == NAS_OK && sc.changed;
  return rc;
}

static int postgres_experiment_set_spec(void *conn, int64_t id, const char *spec_text,
                                        nas_err *err) {
  return experiment_update(conn,
                           "UPDATE experiments SET spec_text = $1 WHERE id = $2 RETURNING id",
                           spec_text, id, err);
}

/* Locks the experiment's row (so no trial is created in it meanwhile); NAS_ENOTFOUND when
 * there is none. */
static int experiment_lock(pg_conn *c, int64_t id, nas_err *err) {
  pg_params p = {0};
  PGresult *res = NULL;
  int rc = pg_params_set(&p, 1, err, "i", id);
  if (rc == NAS_OK)
    rc = pg_exec(c, &res, err, "SELECT 1 FROM experiments WHERE id = $1 FOR UPDATE", &p);
  if (rc == NAS_OK && PQntuples(res) == 0) rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  PQclear(res);
  return rc;
}

/* After the experiment's row (no new trial), its trials' rows are locked FOR UPDATE, which
 * conflicts with the KEY SHARE lock that the foreign-key check of a new metric takes on
 * its trial: a metric being added meanwhile either committed before the lock was granted,
 * and the DELETE of metrics (a statement begun later, so seeing it) takes it along, or
 * waits for this transaction and then finds its trial gone. Without the lock, a metric
 * committed between the two DELETEs failed the delete of its trial. */
static int experiment_delete_in_tx(pg_conn *c, int64_t id, nas_err *err) {
  static const char *const steps[] = {
      "SELECT 1 FROM trials WHERE experiment_id = $1 FOR UPDATE",
      "DELETE FROM metrics WHERE trial_id IN (SELECT id FROM trials WHERE experiment_id = $1)",
      "DELETE FROM trials WHERE experiment_id = $1",
      "DELETE FROM scheduler_leases WHERE experiment_id = $1",
      "DELETE FROM experiments WHERE id = $1",
  };
  pg_params p = {0};
  int rc = pg_params_set(&p, 1, err, "i", id);
  if (rc == NAS_OK) rc = experiment_lock(c, id, err);
  for (size_t i = 0; rc == NAS_OK && i < sizeof steps / sizeof *steps; i++)
    rc = pg_exec(c, NULL, err, steps[i], &p);
  return rc;
}

static int experiment_delete_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  int64_t id = *(const int64_t *)ctx;
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_delete_in_tx(c, id, err);
  return pg_tx_end(c, rc, token, id, err);
}

/* A second try after a commit that was lost would find nothing to delete: a receipt. */
static int postgres_experiment_delete(void *conn, int64_t id, nas_err *err) {
  static const pg_op op = {.attempt = experiment_delete_attempt, .receipt = true};
  return pg_run(conn, &op, &id, err);
}

typedef struct {
  int64_t id;
  const char *new_name, *spec_text;
} rename_ctx;

static int experiment_rename_in_tx(pg_conn *c, const rename_ctx *r, nas_err *err) {
  pg_params taken = {0}, update = {0};
  PGresult *res = NULL;
  int rc = pg_params_set(&taken, 1, err, "ti", r->new_name, r->id);
  if (rc == NAS_OK) rc = pg_params_set(&update, 1, err, "tti", r->new_name, r->spec_text, r->id);
  if (rc == NAS_OK) rc = experiment_lock(c, r->id, err);
  if (rc == NAS_OK)
    rc = pg_exec(c, &res, err, "SELECT 1 FROM experiments WHERE name = $1 AND id <> $2", &taken);
  if (rc == NAS_OK && PQntuples(res) > 0)
    rc = nas_errc(err, NAS_EEXIST, "an experiment of that name exists already");
  PQclear(res);
  if (rc == NAS_OK)
    rc = pg_exec(c, NULL, err, "UPDATE experiments SET name = $1, spec_text = $2 WHERE id = $3",
                 &update);
  return rc;
}

static int experiment_rename_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  (void)token;
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_rename_in_tx(c, ctx, err);
  return pg_tx_end(c, rc, NULL, 0, err);
}

/* Setting the same name and text twice is one rename: no receipt. */
static int postgres_experiment_rename(void *conn, int64_t id, const char *new_name,
                                      const char *spec_text, nas_err *err) {
  static const pg_op op = {.attempt = experiment_rename_attempt};
  rename_ctx r = {id, new_name, spec_text};
  return pg_run(conn, &op, &r, err);
}

typedef struct {
  const storage_experiment_image *img;
  const metric_obs *obs;
  const size_t *metric_trial;
  int64_t *trial_ids; /* the new id of each of img->trials */
  int64_t *id;
} import_ctx;

/* The id of the one row a statement RETURNING id gave, or NAS_EEXIST with `taken`. */
static int exec_returning_id(pg_conn *c, const char *sql, const pg_params *p, int64_t *id,
                             const char *taken, nas_err *err) {
  PGresult *res = NULL;
  int rc = pg_exec(c, &res, err, sql, p);
  if (rc == NAS_OK && PQntuples(res) != 1) rc = nas_errc(err, NAS_EEXIST, "%s", taken);
  else if (rc == NAS_OK) *id = pg_int(res, 0, 0);
  PQclear(res);
  return rc;
}

static int experiment_insert(pg_conn *c, const experiment_row *e, int64_t *id, nas_err *err) {
  pg_params p = {0};
  int rc = pg_params_set(&p, 1, err, "tttttd", e->name, e->spec_text, e->spec_path, e->run_root,
                         e->status, e->created_at);
  if (rc != NAS_OK) return rc;
  return exec_returning_id(c,
                           "INSERT INTO experiments (name, spec_text, spec_path, run_root,"
                           " status, created_at) VALUES ($1, $2, $3, $4, $5, $6)"
                           " ON CONFLICT (name) DO NOTHING RETURNING id",
                           &p, id, "an experiment of that name exists already", err);
}

/* One trial of an image, every field as it was; times of 0 ("not yet") stored as NULL. */
static int trial_import(pg_conn *c, int64_t experiment_id, const trial_row *t, int64_t *id,
                        nas_err *err) {
  pg_params p = {0};
  int64_t exit_code = t->exit_code;
  int rc = pg_params_set(&p, 1, err, "iittidddtotidti", experiment_id, (int64_t)t->number,
                         trial_status_name(t->status), t->params_json, (int64_t)t->attempts,
                         t->created_at, t->started_at, t->finished_at, t->job_id,
                         t->has_exit_code ? &exit_code : NULL, t->error, t->log_offset,
                         t->heartbeat_at, t->reference_json, (int64_t)t->rung);
  if (rc != NAS_OK) return rc;
  return exec_returning_id(c,
                           "INSERT INTO trials (experiment_id, number, status, params_json,"
                           " attempts, created_at, started_at, finished_at, job_id, exit_code,"
                           " error, log_offset, heartbeat_at, reference_json, rung)"
                           " VALUES ($1, $2, $3, $4, $5, $6, nullif($7::float8, 0),"
                           " nullif($8::float8, 0), $9, $10, $11, $12, nullif($13::float8, 0),"
                           " $14, $15) RETURNING id",
                           &p, id, "trial not stored", err);
}

static int metric_columns(const metric_obs *obs, size_t n, char *columns[4], nas_err *err);

/* The n observations of one trial, in their order, as one statement. */
static int metrics_import(pg_conn *c, int64_t trial_id, const metric_obs *obs, size_t n,
                          nas_err *err) {
  char *columns[4];
  pg_params p = {0};
  int rc = metric_columns(obs, n, columns, err);
  if (rc != NAS_OK) return rc;
  rc = pg_params_set(&p, 1, err, "itttt", trial_id, columns[0], columns[1], columns[2],
                     columns[3]);
  if (rc == NAS_OK)
    rc = pg_exec(c, NULL, err, METRICS_INSERT("$1", "", 2, 3, 4, 5), &p);
  for (int k = 0; k < 4; k++) free(columns[k]);
  return rc;
}

static int experiment_import_in_tx(pg_conn *c, const import_ctx *x, nas_err *err) {
  const storage_experiment_image *img = x->img;
  int rc = experiment_insert(c, img->exp, x->id, err);
  for (size_t i = 0; rc == NAS_OK && i < img->n_trials; i++)
    rc = trial_import(c, *x->id, &img->trials[i], &x->trial_ids[i], err);
  for (size_t i = 0, end; rc == NAS_OK && i < img->n_metrics; i = end) {
    for (end = i + 1; end < img->n_metrics && x->metric_trial[end] == x->metric_trial[i]; end++) {}
    rc = metrics_import(c, x->trial_ids[x->metric_trial[i]], x->obs + i, end - i, err);
  }
  return rc;
}

static int experiment_import_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  import_ctx *x = ctx;
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_import_in_tx(c, x, err);
  return pg_tx_end(c, rc, token, *x->id, err);
}

static int experiment_import_recover(pg_conn *c, int64_t result, void *ctx, nas_err *err) {
  (void)c, (void)err;
  *((import_ctx *)ctx)->id = result;
  return NAS_OK;
}

static int postgres_experiment_import(void *conn, const storage_experiment_image *img,
                                      const metric_obs *obs, const size_t *metric_trial,
                                      int64_t *id, nas_err *err) {
  static const pg_op op = {.attempt = experiment_import_attempt,
                           .recover = experiment_import_recover,
                           .receipt = true};
  int64_t *trial_ids = calloc(img->n_trials ? img->n_trials : 1, sizeof *trial_ids);
  if (!trial_ids) return nas_errf(err, "out of memory");
  import_ctx x = {img, obs, metric_trial, trial_ids, id};
  int rc = pg_run(conn, &op, &x, err);
  free(trial_ids);
  return rc;
}

typedef struct {
  int64_t experiment_id;
  const trial_row *trials;
  size_t n;
} trials_import_ctx;

static int trials_import_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  const trials_import_ctx *x = ctx;
  int64_t id;
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_lock(c, x->experiment_id, err);
  for (size_t i = 0; rc == NAS_OK && i < x->n; i++)
    rc = trial_import(c, x->experiment_id, &x->trials[i], &id, err);
  return pg_tx_end(c, rc, token, x->experiment_id, err);
}

/* A second try after a commit that was lost would find the numbers taken: a receipt. */
static int postgres_trials_import(void *conn, int64_t experiment_id, const trial_row *trials,
                                  size_t n, nas_err *err) {
  static const pg_op op = {.attempt = trials_import_attempt, .receipt = true};
  trials_import_ctx x = {experiment_id, trials, n};
  return pg_run(conn, &op, &x, err);
}

/* ---- trials ------------------------------------------------------------------------------ */

static int trial_get(pg_conn *c, int64_t trial_id, trial_row *out, nas_err *err) {
  return query_row(c, &trial_kind, out, "no such trial", err,
                   "SELECT " TRIAL_COLUMNS " FROM trials WHERE id = $1", "i", trial_id);
}

/* What starting an attempt sets (see storage.h), with the job id and the start time in
 * the parameters named. */
#define NEW_ATTEMPT(job, now)                                                              \
  "status = 'running', attempts = attempts + 1, job_id = " job ", started_at = " now ","  \
  " finished_at = NULL, exit_code = NULL, error = NULL, log_offset = 0, heartbeat_at = NULL"

typedef struct trial_create_ctx {
  int64_t experiment_id;
  const char *params_json, *reference_json;
  double now;
  trial_row *out;
} trial_create_ctx;

/* The experiment's row is locked before the next number is read: a concurrent creator
 * waits, and then reads a number past ours (each statement of a READ COMMITTED transaction
 * sees what committed before it began). FOR NO KEY UPDATE leaves the foreign-key checks of
 * other inserts unblocked. */
static int trial_create_in_tx(pg_conn *c, const trial_create_ctx *t, PGresult **made,
                              nas_err *err) {
  pg_params lock = {0}, insert = {0};
  PGresult *res = NULL;
  int rc = pg_params_set(&lock, 1, err, "i", t->experiment_id);
  if (rc == NAS_OK) {
    rc = pg_params_set(&insert, 1, err, "itdt", t->experiment_id, t->params_json, t->now,
                       t->reference_json);
  }
  if (rc == NAS_OK) {
    rc = pg_exec(c, &res, err, "SELECT 1 FROM experiments WHERE id = $1 FOR NO KEY UPDATE",
                 &lock);
  }
  if (rc != NAS_OK) return rc;
  bool found = PQntuples(res) == 1;
  PQclear(res);
  if (!found) return nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  return pg_exec(c, made, err,
                 "INSERT INTO trials (experiment_id, number, status, params_json, attempts,"
                 " created_at, log_offset, reference_json)"
                 " SELECT $1, coalesce(max(number) + 1, 0), 'queued', $2, 0, $3, 0, $4"
                 " FROM trials WHERE experiment_id = $1 RETURNING " TRIAL_COLUMNS,
                 &insert);
}

static int trial_create_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  trial_create_ctx *t = ctx;
  PGresult *made = NULL;
  trial_row row = {0};
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_create_in_tx(c, t, &made, err);
  if (rc == NAS_OK) rc = trial_read(made, 0, &row, err);
  PQclear(made);
  rc = pg_tx_end(c, rc, token, row.id, err);
  if (rc == NAS_OK) *t->out = row;
  else trial_row_clear(&row);
  return rc;
}

static int trial_create_recover(pg_conn *c, int64_t result, void *ctx, nas_err *err) {
  trial_create_ctx *t = ctx;
  return trial_get(c, result, t->out, err);
}

static int postgres_trial_create(void *conn, int64_t experiment_id, const char *params_json,
                                 const char *reference_json, double now, trial_row *out,
                                 nas_err *err) {
  static const pg_op op = {.attempt = trial_create_attempt,
                           .recover = trial_create_recover,
                           .receipt = true};
  trial_create_ctx t = {experiment_id, params_json, reference_json, now, out};
  return pg_run(conn, &op, &t, err);
}

/* A change of one trial judged by the state machine: its row is locked, its status
 * checked, then update_sql ($1 is the trial id) runs, all in one transaction. */
typedef struct transition {
  int64_t trial_id;
  trial_status to; /* the final status, for finish */
  int attempt;     /* the attempt a completion ends */
  int attempts;    /* the trial's attempts as locked, for allowed */
  int (*allowed)(const struct transition *t, trial_status current, nas_err *err);
  const char *update_sql;
  pg_params params;
} transition;

static int transition_in_tx(pg_conn *c, transition *t, nas_err *err) {
  pg_params lock = {0};
  PGresult *res = NULL;
  int rc = pg_params_set(&lock, 1, err, "i", t->trial_id);
  if (rc == NAS_OK) rc = pg_params_set(&t->params, 1, err, "i", t->trial_id);
  if (rc == NAS_OK) {
    rc = pg_exec(c, &res, err, "SELECT status, attempts FROM trials WHERE id = $1 FOR UPDATE",
                 &lock);
  }
  if (rc != NAS_OK) return rc;
  trial_status current = TRIAL_QUEUED;
  if (PQntuples(res) == 0) rc = nas_errc(err, NAS_ENOTFOUND, "no such trial");
  else if (trial_status_parse(PQgetvalue(res, 0, 0), &current) != NAS_OK) {
    rc = nas_errf(err, "trial %" PRId64 " has unknown status '%s'", t->trial_id,
                  PQgetvalue(res, 0, 0));
  } else {
    t->attempts = atoi(PQgetvalue(res, 0, 1));
  }
  PQclear(res);
  if (rc == NAS_OK) rc = t->allowed(t, current, err);
  if (rc == NAS_OK) rc = pg_exec(c, NULL, err, t->update_sql, &t->params);
  return rc;
}

static int transition_attempt(pg_conn *c, const char *token, void *ctx, nas_err *err) {
  transition *t = ctx;
  int rc = pg_tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = transition_in_tx(c, t, err);
  return pg_tx_end(c, rc, token, t->trial_id, err);
}

/* Starting and finishing are not idempotent (a second try would find the trial moved on
 * and fail), so they carry receipts; a heartbeat set twice is one heartbeat. */
static const pg_op transition_op = {.attempt = transition_attempt, .receipt = true};
static const pg_op idempotent_transition_op = {.attempt = transition_attempt};

static int start_allowed(const transition *t, trial_status current, nas_err *err) {
  (void)t;
  return storage_check_start(current, err);
}

static int postgres_trial_start(void *conn, int64_t trial_id, const char *job_id, double now,
                                nas_err *err) {
  transition t = {.trial_id = trial_id,
                  .allowed = start_allowed,
                  .update_sql = "UPDATE trials SET " NEW_ATTEMPT("$2", "$3") " WHERE id = $1"};
  int rc = pg_params_set(&t.params, 2, err, "td", job_id, now);
  return rc == NAS_OK ? pg_run(conn, &transition_op, &t, err) : rc;
}

static int finish_allowed(const transition *t, trial_status current, nas_err *err) {
  return storage_check_finish(current, t->to, err);
}

static int postgres_trial_finish(void *conn, int64_t trial_id, trial_status status,
                                 bool has_exit_code, int exit_code, const char *error,
                                 double now, nas_err *err) {
  transition t = {.trial_id = trial_id,
                  .to = status,
                  .allowed = finish_allowed,
                  .update_sql = "UPDATE trials SET status = $2, finished_at = $3,"
                                " exit_code = $4, error = $5 WHERE id = $1"};
  int64_t code = exit_code;
  int rc = pg_params_set(&t.params, 2, err, "tdot", trial_status_name(status), now,
                         has_exit_code ? &code : NULL, error);
  return rc == NAS_OK ? pg_run(conn, &transition_op, &t, err) : rc;
}

static int complete_allowed(const transition *t, trial_status current, nas_err *err) {
  return storage_check_complete(current, t->attempts, t->attempt, err);
}

static int metric_columns(const metric_obs *obs, size_t n, char *columns[4], nas_err *err);

/* The trial's row is locked and checked first (transition), so the values are stored only
 * by the completion that ends it. */
static int postgres_trial_complete(void *conn, int64_t trial_id, int attempt,
                                   const metric_obs *obs, size_t n, double now, nas_err *err) {
  char *columns[4];
  int rc = metric_columns(obs, n, columns, err);
  if (rc != NAS_OK) return rc;
  transition t = {.trial_id = trial_id,
                  .attempt = attempt,
                  .allowed = complete_allowed,
                  .update_sql =
                      "WITH ended AS (UPDATE trials SET status = 'completed', finished_at = $2,"
                      "   exit_code = NULL, error = NULL WHERE id = $1) "
                      METRICS_INSERT("$1::bigint", "", 3, 4, 5, 6)};
  rc = pg_params_set(&t.params, 2, err, "dtttt", now, columns[0], columns[1], columns[2],
                     columns[3]);
  if (rc == NAS_OK) rc = pg_run(conn, &transition_op, &t, err);
  for (int k = 0; k < 4; k++) free(columns[k]);
  return rc;
}

static int requeue_allowed(const transition *t, trial_status current, nas_err *err) {
  (void)t;
  return storage_check_requeue(current, err);
}

static int postgres_trial_requeue(void *conn, int64_t trial_id, nas_err *err) {
  transition t = {.trial_id = trial_id,
                  .allowed = requeue_allowed,
                  .update_sql = "UPDATE trials SET status = 'queued', finished_at = NULL,"
                                " exit_code = NULL, error = NULL WHERE id = $1"};
  return pg_run(conn, &transition_op, &t, err);
}

static int promote_allowed(const transition *t, trial_status current, nas_err *err) {
  (void)t;
  return storage_check_promote(current, err);
}

/* Conditional, so a second try changes nothing: no receipt needed. */
static int postgres_trial_promote(void *conn, int64_t trial_id, int rung, nas_err *err) {
  transition t = {.trial_id = trial_id,
                  .allowed = promote_allowed,
                  .update_sql = "UPDATE trials SET status = 'queued', rung = rung + 1,"
                                " finished_at = NULL, exit_code = NULL, error = NULL"
                                " WHERE id = $1 AND status = 'completed' AND rung = $2"};
  int rc = pg_params_set(&t.params, 2, err, "i", (int64_t)rung);
  return rc == NAS_OK ? pg_run(conn, &idempotent_transition_op, &t, err) : rc;
}

static int heartbeat_allowed(const transition *t, trial_status current, nas_err *err) {
  (void)t;
  return storage_check_heartbeat(current, err);
}

static int postgres_trial_heartbeat(void *conn, int64_t trial_id, double now, nas_err *err) {
  transition t = {.trial_id = trial_id,
                  .allowed = heartbeat_allowed,
                  .update_sql = "UPDATE trials SET heartbeat_at = $2 WHERE id = $1"};
  int rc = pg_params_set(&t.params, 2, err, "d", now);
  return rc == NAS_OK ? pg_run(conn, &idempotent_transition_op, &t, err) : rc;
}

/* One statement picks and starts the oldest queued trial. SKIP LOCKED passes over rows
 * that other claimers hold; a row another claimer started since this statement's snapshot
 * is re-checked once locked and no longer matches status = 'queued'. */
static int postgres_trial_claim(void *conn, int64_t experiment_id, const char *worker,
                                double now, trial_row *out, nas_err *err) {
  statement s = {
      .kind = &trial_kind,
      .sql = "WITH claimed AS ("
             "  UPDATE trials SET " NEW_ATTEMPT("$3", "$4") " WHERE id = ("
             "    SELECT id FROM trials WHERE experiment_id = $2 AND status = 'queued'"
             "    ORDER BY number LIMIT 1 FOR UPDATE SKIP LOCKED)"
             "  RETURNING " TRIAL_COLUMNS "),"
             " " RECEIPT_FROM("claimed") " SELECT " TRIAL_COLUMNS " FROM claimed"};
  int rc = pg_params_set(&s.params, 2, err, "itd", experiment_id, worker, now);
  if (rc == NAS_OK) rc = statement_run(conn, &s, true, err);
  if (rc == NAS_OK && s.recovered) rc = trial_get(conn, s.recovered_id, out, err);
  else if (rc == NAS_OK) rc = statement_take_first(&s, out, "no queued trial", err);
  statement_free(&s);
  return rc;
}

static int postgres_trial_get(void *conn, int64_t trial_id, trial_row *out, nas_err *err) {
  return trial_get(conn, trial_id, out, err);
}

static int postgres_trial_find(void *conn, int64_t experiment_id, int number, trial_row *out,
                               nas_err *err) {
  return query_row(conn, &trial_kind, out, "no such trial", err,
                   "SELECT " TRIAL_COLUMNS " FROM trials WHERE experiment_id = $1 AND number = $2",
                   "ii", experiment_id, (int64_t)number);
}

static int postgres_trial_list(void *conn, int64_t experiment_id, trial_row **out, size_t *n,
                               nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &trial_kind, &rows, n, err,
                     "SELECT " TRIAL_COLUMNS " FROM trials WHERE experiment_id = $1"
                     " ORDER BY number",
                     "i", experiment_id);
  if (rc == NAS_OK) *out = rows;
  return rc;
}

/* One status's count of trials, as trial_counts reads it. */
typedef struct {
  trial_status status;
  int64_t n;
} status_count;

static int status_count_read(const PGresult *res, int row, void *out, nas_err *err) {
  status_count *sc = out;
  const char *name = PQgetvalue(res, row, 0);
  if (trial_status_parse(name, &sc->status) != NAS_OK)
    return nas_errf(err, "a trial has unknown status '%s'", name);
  sc->n = pg_int(res, row, 1);
  return NAS_OK;
}

static void status_count_clear(void *row) { (void)row; }

static const row_kind status_count_kind = {sizeof(status_count), status_count_read,
                                           status_count_clear};

static int postgres_trial_counts(void *conn, int64_t experiment_id, int64_t *by_status,
                                 nas_err *err) {
  void *rows = NULL;
  size_t n = 0;
  int rc = query_rows(conn, &status_count_kind, &rows, &n, err,
                      "SELECT status, count(*) FROM trials WHERE experiment_id = $1"
                      " GROUP BY status",
                      "i", experiment_id);
  const status_count *counts = rows;
  for (size_t i = 0; rc == NAS_OK && i < n; i++) by_status[counts[i].status] = counts[i].n;
  rows_free(&status_count_kind, rows, n);
  return rc;
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* Appends text to a PostgreSQL array literal as a quoted element. */
static void array_put_text(FILE *out, const char *text) {
  fputc('"', out);
  for (const char *s = text; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    fputc(*s, out);
  }
  fputc('"', out);
}

/* The observations as four array literals, one per column (names, steps, values, times),
 * each owned in columns[]. */
static int metric_columns(const metric_obs *obs, size_t n, char *columns[4], nas_err *err) {
  FILE *out[4] = {NULL};
  size_t len[4];
  int rc = NAS_OK;
  for (int k = 0; k < 4; k++) {
    columns[k] = NULL;
    out[k] = open_memstream(&columns[k], &len[k]);
    if (!out[k]) rc = nas_errf(err, "out of memory");
  }
  for (size_t i = 0; i < n && rc == NAS_OK; i++) {
    const char *sep = i ? "," : "{";
    char value[32], time[32];
    pg_format_double(value, obs[i].value);
    pg_format_double(time, obs[i].time);
    fputs(sep, out[0]);
    array_put_text(out[0], obs[i].name);
    if (obs[i].step == METRIC_FINAL) fprintf(out[1], "%sNULL", sep);
    else fprintf(out[1], "%s%" PRId64, sep, obs[i].step);
    fprintf(out[2], "%s%s", sep, value);
    fprintf(out[3], "%s%s", sep, time);
  }
  for (int k = 0; k < 4; k++) {
    if (out[k]) fputs(n ? "}" : "{}", out[k]);
    int closed = out[k] ? nas_memstream_close(out[k], &columns[k], rc ? NULL : err) : NAS_OK;
    if (rc == NAS_OK) rc = closed;
  }
  if (rc != NAS_OK) {
    for (int k = 0; k < 4; k++) free(columns[k]);
  }
  return rc;
}

/* One statement does it all: checks the trial exists, inserts the whole batch in order
 * (unnest keeps it), moves the log offset when asked, and commits the receipt. */
static int postgres_metrics_add(void *conn, int64_t trial_id, const metric_obs *obs, size_t n,
                                int64_t new_log_offset, nas_err *err) {
  char *columns[4];
  int rc = metric_columns(obs, n, columns, err);
  if (rc != NAS_OK) return rc;
  statement s = {
      .kind = &id_kind,
      .sql = "WITH t AS (SELECT id FROM trials WHERE id = $2),"
             " moved AS (UPDATE trials SET log_offset = $7"
             "   WHERE id = $2 AND $7::bigint >= 0),"
             " added AS (" METRICS_INSERT("t.id", "t,", 3, 4, 5, 6) "),"
             " " RECEIPT_FROM("t") " SELECT id FROM t"};
  rc = pg_params_set(&s.params, 2, err, "itttti", trial_id, columns[0], columns[1],
                     columns[2], columns[3], new_log_offset);
  if (rc == NAS_OK) rc = statement_run(conn, &s, true, err);
  if (rc == NAS_OK && !s.recovered && s.n == 0) rc = nas_errc(err, NAS_ENOTFOUND, "no such trial");
  statement_free(&s);
  for (int k = 0; k < 4; k++) free(columns[k]);
  return rc;
}

static int postgres_metrics_list(void *conn, int64_t experiment_id, metric_row **out, size_t *n,
                                 nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &metric_kind, &rows, n, err,
                     "SELECT m.id, m.trial_id, m.name, m.step, m.value, m.time"
                     " FROM metrics m JOIN trials t ON t.id = m.trial_id"
                     " WHERE t.experiment_id = $1 ORDER BY t.number, m.id",
                     "i", experiment_id);
  if (rc == NAS_OK) *out = rows;
  return rc;
}

static int postgres_metrics_of_trial(void *conn, int64_t trial_id, metric_row **out, size_t *n,
                                     nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &metric_kind, &rows, n, err,
                     "SELECT id, trial_id, name, step, value, time FROM metrics"
                     " WHERE trial_id = $1 ORDER BY id", "i", trial_id);
  if (rc == NAS_OK) *out = rows;
  return rc;
}

/* ---- the scheduler lease ---------------------------------------------------------------- */

#define LEASE_COLUMNS "token, host, pid, started_at, heartbeat_at"

static int lease_read(const PGresult *res, int row, void *out, nas_err *err) {
  storage_lease *l = out;
  memset(l, 0, sizeof *l);
  l->pid = pg_int(res, row, 2);
  l->started_at = pg_double(res, row, 3);
  l->heartbeat_at = pg_double(res, row, 4);
  int rc = pg_text(res, row, 0, &l->token, err);
  if (rc == NAS_OK) rc = pg_text(res, row, 1, &l->host, err);
  if (rc != NAS_OK) storage_lease_clear(l);
  return rc;
}

static void lease_clear(void *row) { storage_lease_clear(row); }

static const row_kind lease_kind = {sizeof(storage_lease), lease_read, lease_clear};

/* Every lease write is idempotent (see backend.h), so none needs a receipt: the rows
 * RETURNING gives say whether it took effect. */
static int lease_write(pg_conn *c, size_t *changed, nas_err *err, const char *sql,
                       const char *types, ...) {
  statement s = {.sql = sql, .kind = &id_kind};
  va_list ap;
  va_start(ap, types);
  int rc = statement_runv(c, &s, err, types, ap);
  va_end(ap);
  *changed = s.n;
  statement_free(&s);
  return rc;
}

static int postgres_lease_take(void *conn, int64_t experiment_id, const char *token,
                               const char *host, int64_t pid, const char *replaces, double now,
                               nas_err *err) {
  size_t changed = 0;
  int rc = lease_write(conn, &changed, err,
                       LEASE_TAKE_SQL("$1", "$2", "$3", "$4", "$5", "$6") " RETURNING experiment_id",
                       "ittidt", experiment_id, token, host, pid, now, replaces);
  if (rc == NAS_OK && changed == 0) rc = nas_errc(err, NAS_EEXIST, "another scheduler holds it");
  return rc;
}

static int postgres_lease_renew(void *conn, int64_t experiment_id, const char *token,
                                double now, nas_err *err) {
  size_t changed = 0;
  int rc = lease_write(conn, &changed, err,
                       "UPDATE scheduler_leases SET heartbeat_at = $1"
                       " WHERE experiment_id = $2 AND token = $3 RETURNING experiment_id",
                       "dit", now, experiment_id, token);
  if (rc == NAS_OK && changed == 0) rc = nas_errc(err, NAS_ENOTFOUND, "this process no longer holds it");
  return rc;
}

static int postgres_lease_release(void *conn, int64_t experiment_id, const char *token,
                                  nas_err *err) {
  size_t changed = 0;
  return lease_write(conn, &changed, err,
                     "DELETE FROM scheduler_leases WHERE experiment_id = $1 AND token = $2"
                     " RETURNING experiment_id",
                     "it", experiment_id, token);
}

static int postgres_lease_get(void *conn, int64_t experiment_id, storage_lease *out,
                              nas_err *err) {
  return query_row(conn, &lease_kind, out, "no scheduler holds it", err,
                   "SELECT " LEASE_COLUMNS " FROM scheduler_leases WHERE experiment_id = $1",
                   "i", experiment_id);
}

/* ---- idempotency keys ------------------------------------------------------------------- */

static void postgres_receipt_arm(void *conn, const char *key) {
  pg_conn *c = conn;
  c->request_key = key;
}

static void postgres_set_watch(void *conn, const storage_watch *watch) {
  pg_conn *c = conn;
  c->watch = watch;
}

static int postgres_receipt_find(void *conn, const char *key, bool *found, int64_t *result,
                                 nas_err *err) {
  int64_t *rows = NULL;
  size_t n = 0;
  int rc = query_rows(conn, &id_kind, (void **)&rows, &n, err,
                      "SELECT result FROM write_receipts WHERE token = $1 AND done", "t", key);
  *found = rc == NAS_OK && n == 1;
  *result = *found ? rows[0] : 0;
  free(rows);
  return rc;
}

const storage_backend storage_postgres_backend = {
    .name = "postgresql",
    .open = postgres_open,
    .close = postgres_close,
    .experiment_create = postgres_experiment_create,
    .experiment_get = postgres_experiment_get,
    .experiment_list = postgres_experiment_list,
    .experiment_set_status = postgres_experiment_set_status,
    .experiment_set_spec = postgres_experiment_set_spec,
    .experiment_delete = postgres_experiment_delete,
    .experiment_rename = postgres_experiment_rename,
    .experiment_import = postgres_experiment_import,
    .trials_import = postgres_trials_import,
    .trial_create = postgres_trial_create,
    .trial_start = postgres_trial_start,
    .trial_claim = postgres_trial_claim,
    .trial_heartbeat = postgres_trial_heartbeat,
    .trial_finish = postgres_trial_finish,
    .trial_complete = postgres_trial_complete,
    .trial_requeue = postgres_trial_requeue,
    .trial_promote = postgres_trial_promote,
    .trial_get = postgres_trial_get,
    .trial_find = postgres_trial_find,
    .trial_counts = postgres_trial_counts,
    .trial_list = postgres_trial_list,
    .metrics_add = postgres_metrics_add,
    .metrics_list = postgres_metrics_list,
    .metrics_of_trial = postgres_metrics_of_trial,
    .lease_take = postgres_lease_take,
    .lease_renew = postgres_lease_renew,
    .lease_release = postgres_lease_release,
    .lease_get = postgres_lease_get,
    .receipt_arm = postgres_receipt_arm,
    .set_watch = postgres_set_watch,
    .receipt_find = postgres_receipt_find,
};
