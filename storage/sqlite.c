/* storage/sqlite.c: the SQLite backend of storage (URL sqlite:PATH).
 *
 * Several processes share one database file: the scheduler, and trials calling
 * `nas report`. So the file is in WAL mode (readers never block the writer), every
 * connection waits up to STORAGE_SQLITE_BUSY_MS for the write lock, and every write runs
 * in a BEGIN IMMEDIATE transaction: the lock is taken before anything is read, so a
 * read-check-write (trial numbering, state transitions) can never interleave with another
 * process's, and never fails half-way with SQLITE_BUSY.
 *
 * Invariants:
 * - Each storage operation that writes is exactly one transaction; on any failure it is
 *   rolled back whole.
 * - SQL text is constant; every value travels as a bound parameter.
 * - The schema only moves forward through `migrations` (version i → i+1), all pending
 *   steps in one transaction. A database from a newer nas is refused before anything is
 *   written to it.
 * - Times are REAL Unix seconds; NULL stands for "not yet" (read back as 0), for a final
 *   metric's step (METRIC_FINAL) and for a NaN metric value (SQLite stores NaN as NULL). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/backend.h"

/* How long a connection waits for another process's write to finish. Transactions here
 * last milliseconds, so ten seconds of waiting means something is stuck. */
#define STORAGE_SQLITE_BUSY_MS 10000
#define STORAGE_SQLITE_WAL_RETRY_MS 5

/* Statements kept prepared on a connection (SQLITE_PREPARE_PERSISTENT), so that a write
 * does not parse and plan the same SQL afresh each time (a server makes thousands a
 * second, several statements each). A statement is found again by the address of its SQL
 * text, checked against the text itself. One in use is never handed out twice: a nested
 * use of the same SQL gets a statement of its own, finalized when closed, as does any SQL
 * past the cache's room. */
enum { STMT_CACHE_MAX = 64 };
typedef struct {
  const char *sql[STMT_CACHE_MAX]; /* borrowed: the address the SQL was asked for by */
  sqlite3_stmt *kept[STMT_CACHE_MAX];
  bool in_use[STMT_CACHE_MAX];
  size_t n;
} stmt_cache;

typedef struct sqlite_conn {
  sqlite3 *db;
  stmt_cache *stmts; /* owned; changed through the const connections statements take */
  char *path; /* absolute path of the database file, for messages */
  dev_t dev;  /* identity of the file opened at path, to notice it deleted or replaced */
  ino_t ino;
  const char *request_key; /* borrowed: the idempotency key armed (storage.h), or NULL */
  bool grouped; /* inside storage_group_begin: each write is a savepoint of that transaction */
} sqlite_conn;

/* ---- schema ---------------------------------------------------------------------------
 * migrations[i] takes the schema from version i to i + 1. Append only: a released step is
 * never edited, since databases already made by it exist. */
static const char *const migrations[] = {
    /* 0 → 1: the first schema. */
    "CREATE TABLE schema_version ("
    "  one INTEGER PRIMARY KEY CHECK (one = 1),"
    "  version INTEGER NOT NULL);"
    "INSERT INTO schema_version (one, version) VALUES (1, 0);"
    "CREATE TABLE experiments ("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL UNIQUE,"
    "  spec_text TEXT NOT NULL,"
    "  spec_path TEXT NOT NULL,"
    "  run_root TEXT NOT NULL,"
    "  status TEXT NOT NULL,"
    "  created_at REAL NOT NULL);"
    "CREATE TABLE trials ("
    "  id INTEGER PRIMARY KEY,"
    "  experiment_id INTEGER NOT NULL REFERENCES experiments (id),"
    "  number INTEGER NOT NULL,"
    "  status TEXT NOT NULL CHECK (status IN"
    "    ('queued', 'running', 'completed', 'failed', 'timeout', 'stopped')),"
    "  params_json TEXT NOT NULL,"
    "  attempts INTEGER NOT NULL,"
    "  created_at REAL NOT NULL,"
    "  started_at REAL,"
    "  finished_at REAL,"
    "  job_id TEXT,"
    "  exit_code INTEGER,"
    "  error TEXT,"
    "  log_offset INTEGER NOT NULL,"
    "  UNIQUE (experiment_id, number));"
    "CREATE TABLE metrics ("
    "  id INTEGER PRIMARY KEY,"
    "  trial_id INTEGER NOT NULL REFERENCES trials (id),"
    "  name TEXT NOT NULL,"
    "  step INTEGER,"
    "  value REAL,"
    "  time REAL NOT NULL);"
    "CREATE INDEX metrics_by_trial ON metrics (trial_id);",
    /* 1 → 2: heartbeats of running trials; an index for claiming the oldest queued trial. */
    "ALTER TABLE trials ADD COLUMN heartbeat_at REAL;"
    "CREATE INDEX trials_queued ON trials (experiment_id, number) WHERE status = 'queued';",
    /* 2 → 3: the reference point each suggestion aimed at. */
    "ALTER TABLE trials ADD COLUMN reference_json TEXT;",
    /* 3 → 4: the lease of the one scheduler that runs an experiment. */
    "CREATE TABLE scheduler_leases ("
    "  experiment_id INTEGER PRIMARY KEY REFERENCES experiments (id),"
    "  token TEXT NOT NULL,"
    "  host TEXT NOT NULL,"
    "  pid INTEGER NOT NULL,"
    "  started_at REAL NOT NULL,"
    "  heartbeat_at REAL NOT NULL);",
    /* 4 → 5: idempotency keys of storage RPC requests (storage.h), each committed in the
     * transaction of its write, with the id that write made, took or changed. */
    "CREATE TABLE write_receipts ("
    "  token TEXT PRIMARY KEY,"
    "  result INTEGER,"
    "  at REAL NOT NULL);"
    "CREATE INDEX write_receipts_by_age ON write_receipts (at);",
    /* 5 → 6: the multi-fidelity rung of each trial (storage.h, trial_row.rung). */
    "ALTER TABLE trials ADD COLUMN rung INTEGER NOT NULL DEFAULT 0;",
    /* 6 → 7: receipts kept in their token's own b-tree (WITHOUT ROWID), so that a keyed
     * write adds two pages to its commit (the receipt, its age), not three (a rowid
     * table's row, its token's index, its age): a report through `nas serve` wrote 5 WAL
     * frames where a direct one writes 2 (bench/RESULTS.md, "One writer, where the time
     * goes"). */
    "CREATE TABLE write_receipts_by_token ("
    "  token TEXT PRIMARY KEY,"
    "  result INTEGER,"
    "  at REAL NOT NULL) WITHOUT ROWID;"
    "INSERT INTO write_receipts_by_token (token, result, at)"
    "  SELECT token, result, at FROM write_receipts;"
    "DROP TABLE write_receipts;"
    "ALTER TABLE write_receipts_by_token RENAME TO write_receipts;"
    "CREATE INDEX write_receipts_by_age ON write_receipts (at);",
};
#define SCHEMA_VERSION ((int64_t)(sizeof migrations / sizeof migrations[0]))

/* ---- errors, statements, transactions ------------------------------------------------- */

/* The database's own message and which database; storage.c adds the operation. */
static int db_fail(const sqlite_conn *c, nas_err *err) {
  return nas_errf(err, "%s (sqlite %s)", sqlite3_errmsg(c->db), c->path);
}

static int out_of_memory(nas_err *err) { return nas_errf(err, "out of memory"); }

/* Binds values to s's parameters 1, 2, … by the letters of types:
 *   t  const char *      text, NULL binds SQL NULL
 *   i  int64_t
 *   o  const int64_t *   optional integer, NULL binds SQL NULL
 *   d  double            (NaN is stored as NULL by SQLite) */
static int stmt_bindv(const sqlite_conn *c, sqlite3_stmt *s, nas_err *err, const char *types,
                      va_list ap) {
  for (int i = 1; types[i - 1]; i++) {
    int rc = SQLITE_OK;
    switch (types[i - 1]) {
      case 't': {
        const char *text = va_arg(ap, const char *);
        rc = text ? sqlite3_bind_text(s, i, text, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(s, i);
        break;
      }
      case 'i': rc = sqlite3_bind_int64(s, i, va_arg(ap, int64_t)); break;
      case 'o': {
        const int64_t *value = va_arg(ap, const int64_t *);
        rc = value ? sqlite3_bind_int64(s, i, *value) : sqlite3_bind_null(s, i);
        break;
      }
      case 'd': rc = sqlite3_bind_double(s, i, va_arg(ap, double)); break;
      default: return nas_errf(err, "internal error: bind type '%c'", types[i - 1]);
    }
    if (rc != SQLITE_OK) return db_fail(c, err);
  }
  return NAS_OK;
}

static int stmt_bind(const sqlite_conn *c, sqlite3_stmt *s, nas_err *err, const char *types,
                     ...) {
  va_list ap;
  va_start(ap, types);
  int rc = stmt_bindv(c, s, err, types, ap);
  va_end(ap);
  return rc;
}

/* A statement of sql: the kept one when it is free, else a new one, kept when there is
 * room. */
static int stmt_prepare(const sqlite_conn *c, const char *sql, sqlite3_stmt **out, nas_err *err) {
  stmt_cache *cache = c->stmts;
  for (size_t i = 0; i < cache->n; i++) {
    if (cache->sql[i] != sql || cache->in_use[i] || strcmp(sqlite3_sql(cache->kept[i]), sql) != 0)
      continue;
    cache->in_use[i] = true;
    *out = cache->kept[i];
    return NAS_OK;
  }
  bool keep = cache->n < STMT_CACHE_MAX;
  if (sqlite3_prepare_v3(c->db, sql, -1, keep ? SQLITE_PREPARE_PERSISTENT : 0, out, NULL) != SQLITE_OK)
    return db_fail(c, err);
  if (keep) {
    cache->sql[cache->n] = sql;
    cache->kept[cache->n] = *out;
    cache->in_use[cache->n++] = true;
  }
  return NAS_OK;
}

/* Done with s: a kept statement is reset for its next use, any other finalized. */
static void stmt_close(const sqlite_conn *c, sqlite3_stmt *s) {
  stmt_cache *cache = c->stmts;
  for (size_t i = 0; s && i < cache->n; i++) {
    if (cache->kept[i] != s) continue;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    cache->in_use[i] = false;
    return;
  }
  sqlite3_finalize(s);
}

/* Prepares sql and binds the values described by types (see stmt_bindv) into *out, to be
 * closed with stmt_close. */
static int stmt_openv(const sqlite_conn *c, sqlite3_stmt **out, nas_err *err, const char *sql,
                      const char *types, va_list ap) {
  sqlite3_stmt *s = NULL;
  if (stmt_prepare(c, sql, &s, err) != NAS_OK) return NAS_ERR;
  int rc = stmt_bindv(c, s, err, types, ap);
  if (rc != NAS_OK) {
    stmt_close(c, s);
    return rc;
  }
  *out = s;
  return NAS_OK;
}

static int stmt_open(const sqlite_conn *c, sqlite3_stmt **out, nas_err *err, const char *sql,
                     const char *types, ...) {
  va_list ap;
  va_start(ap, types);
  int rc = stmt_openv(c, out, err, sql, types, ap);
  va_end(ap);
  return rc;
}

/* 1 when a row is ready, 0 when the statement is done, NAS_ERR on failure. */
static int stmt_step(const sqlite_conn *c, sqlite3_stmt *s, nas_err *err) {
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) return 1;
  if (rc == SQLITE_DONE) return 0;
  return db_fail(c, err);
}

/* Runs a statement that returns no rows. */
static int run(const sqlite_conn *c, nas_err *err, const char *sql, const char *types, ...) {
  sqlite3_stmt *s = NULL;
  va_list ap;
  va_start(ap, types);
  int rc = stmt_openv(c, &s, err, sql, types, ap);
  va_end(ap);
  if (rc != NAS_OK) return rc;
  rc = stmt_step(c, s, err);
  stmt_close(c, s);
  return rc < 0 ? rc : NAS_OK;
}

/* Whether the query returns at least one row. */
static int exists(const sqlite_conn *c, bool *found, nas_err *err, const char *sql,
                  const char *types, ...) {
  sqlite3_stmt *s = NULL;
  va_list ap;
  va_start(ap, types);
  int rc = stmt_openv(c, &s, err, sql, types, ap);
  va_end(ap);
  if (rc != NAS_OK) return rc;
  rc = stmt_step(c, s, err);
  stmt_close(c, s);
  if (rc < 0) return rc;
  *found = rc == 1;
  return NAS_OK;
}

static int exec(const sqlite_conn *c, const char *sql, nas_err *err) {
  return sqlite3_exec(c->db, sql, NULL, NULL, NULL) == SQLITE_OK ? NAS_OK : db_fail(c, err);
}

/* Whether path still names the file this connection opened. A database deleted or
 * replaced under a running nas would otherwise take every later write into an unlinked
 * file, and the run would end "completed" with nothing stored. */
static int check_identity(const sqlite_conn *c, nas_err *err) {
  struct stat now;
  if (stat(c->path, &now) != 0) {
    return nas_errf(err, "the database file %s is gone (%s): it was deleted while nas was "
                    "using it; stopping, since nothing written now would be kept", c->path,
                    strerror(errno));
  }
  if (now.st_dev != c->dev || now.st_ino != c->ino) {
    return nas_errf(err, "the database file %s was replaced by another file while nas was "
                    "using it; stopping, since nothing written now would be kept", c->path);
  }
  return NAS_OK;
}

/* BEGIN IMMEDIATE: take the write lock now (waiting up to the busy timeout), so nothing
 * read inside the transaction can change before it commits. Every write checks first that
 * the file is still the one opened. */
static int tx_begin(const sqlite_conn *c, nas_err *err) {
  int rc = check_identity(c, err);
  if (rc != NAS_OK || !c->grouped) return rc == NAS_OK ? run(c, err, "BEGIN IMMEDIATE", "") : rc;
  /* Some failures (a full disk, an I/O error) roll back the whole transaction: the group
   * is lost then, and a savepoint opened now would run as a transaction of its own. */
  if (sqlite3_get_autocommit(c->db))
    return nas_errf(err, "the group's transaction on %s was rolled back", c->path);
  return run(c, err, "SAVEPOINT one_write", "");
}

/* Commits when rc is NAS_OK, else rolls back; returns rc, or the commit's failure. A
 * failed rollback is not reported over the error that caused it: SQLite then rolls the
 * transaction back itself when the connection closes. In a group, the write's savepoint
 * is released or rolled back instead, and the group's transaction goes on. */
static int tx_end(const sqlite_conn *c, int rc, nas_err *err) {
  if (c->grouped) {
    if (sqlite3_get_autocommit(c->db))
      return rc != NAS_OK ? rc : nas_errf(err, "the group's transaction on %s was rolled back", c->path);
    if (rc != NAS_OK) sqlite3_exec(c->db, "ROLLBACK TO one_write", NULL, NULL, NULL);
    int released = run(c, rc == NAS_OK ? err : NULL, "RELEASE one_write", "");
    return rc == NAS_OK ? released : rc;
  }
  if (rc == NAS_OK) rc = run(c, err, "COMMIT", "");
  if (!sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* tx_end for a write that is not idempotent: when a request key is armed, commits it with
 * result (see storage.h) in the same transaction, and lets keys older than any retry go.
 * Two requests with the same key cannot both commit: the second's insert collides. */
static int tx_end_receipt(const sqlite_conn *c, int rc, int64_t result, nas_err *err) {
  if (rc == NAS_OK && c->request_key) {
    double now = nas_now();
    rc = run(c, err, "INSERT INTO write_receipts (token, result, at) VALUES (?, ?, ?)", "tid",
             c->request_key, result, now);
    if (rc == NAS_OK) {
      rc = run(c, err, "DELETE FROM write_receipts WHERE at < ?", "d",
               now - STORAGE_RECEIPT_KEEP_S);
    }
  }
  return tx_end(c, rc, err);
}

/* ---- rows ------------------------------------------------------------------------------ */

/* Owned copy of a text column in *out; NULL for SQL NULL. */
static int column_text(sqlite3_stmt *s, int col, char **out, nas_err *err) {
  const unsigned char *text = sqlite3_column_text(s, col);
  *out = NULL;
  if (!text) return sqlite3_column_type(s, col) == SQLITE_NULL ? NAS_OK : out_of_memory(err);
  size_t len = (size_t)sqlite3_column_bytes(s, col);
  *out = malloc(len + 1);
  if (!*out) return out_of_memory(err);
  memcpy(*out, text, len + 1);
  return NAS_OK;
}

/* A REAL column where NULL means "not yet": 0. */
static double column_time(sqlite3_stmt *s, int col) {
  return sqlite3_column_type(s, col) == SQLITE_NULL ? 0 : sqlite3_column_double(s, col);
}

/* How to read one kind of row from a result, and how to free an array of them. A reader
 * leaves its row cleared when it fails. */
typedef struct row_kind {
  size_t size;
  int (*read)(sqlite3_stmt *s, void *row, nas_err *err);
  void (*free_rows)(void *rows, size_t n);
} row_kind;

#define EXPERIMENT_COLUMNS "id, name, spec_text, spec_path, run_root, status, created_at"

static int experiment_read(sqlite3_stmt *s, void *row, nas_err *err) {
  experiment_row *e = row;
  memset(e, 0, sizeof *e);
  e->id = sqlite3_column_int64(s, 0);
  e->created_at = sqlite3_column_double(s, 6);
  int rc = column_text(s, 1, &e->name, err);
  if (rc == NAS_OK) rc = column_text(s, 2, &e->spec_text, err);
  if (rc == NAS_OK) rc = column_text(s, 3, &e->spec_path, err);
  if (rc == NAS_OK) rc = column_text(s, 4, &e->run_root, err);
  if (rc == NAS_OK) rc = column_text(s, 5, &e->status, err);
  if (rc != NAS_OK) experiment_row_clear(e);
  return rc;
}

static void experiment_free_rows(void *rows, size_t n) { experiment_rows_free(rows, n); }

static const row_kind experiment_kind = {sizeof(experiment_row), experiment_read,
                                         experiment_free_rows};

#define TRIAL_COLUMNS                                                                      \
  "id, experiment_id, number, status, params_json, attempts, created_at, started_at, "    \
  "finished_at, job_id, exit_code, error, log_offset, heartbeat_at, reference_json, rung"

static int trial_read(sqlite3_stmt *s, void *row, nas_err *err) {
  trial_row *t = row;
  memset(t, 0, sizeof *t);
  t->id = sqlite3_column_int64(s, 0);
  t->experiment_id = sqlite3_column_int64(s, 1);
  t->number = sqlite3_column_int(s, 2);
  const char *status = (const char *)sqlite3_column_text(s, 3);
  if (trial_status_parse(status, &t->status) != NAS_OK) {
    return nas_errf(err, "trial %" PRId64 " has unknown status '%s'", t->id,
                    status ? status : "(null)");
  }
  t->attempts = sqlite3_column_int(s, 5);
  t->created_at = sqlite3_column_double(s, 6);
  t->started_at = column_time(s, 7);
  t->finished_at = column_time(s, 8);
  t->has_exit_code = sqlite3_column_type(s, 10) != SQLITE_NULL;
  t->exit_code = sqlite3_column_int(s, 10);
  t->log_offset = sqlite3_column_int64(s, 12);
  t->heartbeat_at = column_time(s, 13);
  t->rung = sqlite3_column_int(s, 15);
  int rc = column_text(s, 4, &t->params_json, err);
  if (rc == NAS_OK) rc = column_text(s, 9, &t->job_id, err);
  if (rc == NAS_OK) rc = column_text(s, 11, &t->error, err);
  if (rc == NAS_OK) rc = column_text(s, 14, &t->reference_json, err);
  if (rc != NAS_OK) trial_row_clear(t);
  return rc;
}

static void trial_free_rows(void *rows, size_t n) { trial_rows_free(rows, n); }

static const row_kind trial_kind = {sizeof(trial_row), trial_read, trial_free_rows};

static int metric_read(sqlite3_stmt *s, void *row, nas_err *err) {
  metric_row *m = row;
  memset(m, 0, sizeof *m);
  m->id = sqlite3_column_int64(s, 0);
  m->trial_id = sqlite3_column_int64(s, 1);
  bool final = sqlite3_column_type(s, 3) == SQLITE_NULL;
  m->step = final ? METRIC_FINAL : sqlite3_column_int64(s, 3);
  m->value = sqlite3_column_type(s, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 4);
  m->time = sqlite3_column_double(s, 5);
  return column_text(s, 2, &m->name, err);
}

static void metric_free_rows(void *rows, size_t n) { metric_rows_free(rows, n); }

static const row_kind metric_kind = {sizeof(metric_row), metric_read, metric_free_rows};

/* The one row of a query into *row; NAS_ENOTFOUND (with `missing` as the message) when
 * there is none. */
static int query_row(const sqlite_conn *c, const row_kind *kind, void *row, const char *missing,
                     nas_err *err, const char *sql, const char *types, ...) {
  sqlite3_stmt *s = NULL;
  va_list ap;
  va_start(ap, types);
  int rc = stmt_openv(c, &s, err, sql, types, ap);
  va_end(ap);
  if (rc != NAS_OK) return rc;
  rc = stmt_step(c, s, err);
  if (rc == 1) rc = kind->read(s, row, err);
  else if (rc == 0) rc = nas_errc(err, NAS_ENOTFOUND, "%s", missing);
  stmt_close(c, s);
  return rc;
}

/* Appends every row of s to an owned array; *out is NULL when there are none. */
static int collect_rows(const sqlite_conn *c, sqlite3_stmt *s, const row_kind *kind, void **out,
                        size_t *n, nas_err *err) {
  char *rows = NULL;
  size_t count = 0, cap = 0;
  int rc;
  while ((rc = stmt_step(c, s, err)) == 1) {
    if (count == cap) {
      size_t bigger_cap = cap ? 2 * cap : 16;
      char *bigger = realloc(rows, bigger_cap * kind->size);
      if (!bigger) {
        rc = out_of_memory(err);
        break;
      }
      rows = bigger;
      cap = bigger_cap;
    }
    rc = kind->read(s, rows + count * kind->size, err);
    if (rc != NAS_OK) break;
    count++;
  }
  if (rc < 0) {
    kind->free_rows(rows, count);
    return rc;
  }
  *out = rows;
  *n = count;
  return NAS_OK;
}

static int query_rows(const sqlite_conn *c, const row_kind *kind, void **out, size_t *n,
                      nas_err *err, const char *sql, const char *types, ...) {
  sqlite3_stmt *s = NULL;
  va_list ap;
  va_start(ap, types);
  int rc = stmt_openv(c, &s, err, sql, types, ap);
  va_end(ap);
  if (rc != NAS_OK) return rc;
  rc = collect_rows(c, s, kind, out, n, err);
  stmt_close(c, s);
  return rc;
}

/* ---- opening: connection, schema check, migrations -------------------------------------- */

/* Reads the schema version: 0 for a database with nothing in it. A database holding
 * tables but no schema_version is someone else's, and is left alone. */
static int schema_version_read(const sqlite_conn *c, int64_t *version, nas_err *err) {
  sqlite3_stmt *s = NULL;
  int rc = stmt_open(c, &s, err,
                     "SELECT (SELECT count(*) FROM sqlite_master),"
                     " (SELECT count(*) FROM sqlite_master WHERE name = 'schema_version')",
                     "");
  if (rc == NAS_OK) rc = stmt_step(c, s, err);
  bool empty = rc == 1 && sqlite3_column_int64(s, 0) == 0;
  bool ours = rc == 1 && sqlite3_column_int64(s, 1) == 1;
  stmt_close(c, s);
  if (rc < 0) return rc;
  if (empty) {
    *version = 0;
    return NAS_OK;
  }
  if (!ours) return nas_errf(err, "%s is an SQLite database but not a nas storage", c->path);
  rc = stmt_open(c, &s, err, "SELECT version FROM schema_version", "");
  if (rc != NAS_OK) return rc;
  rc = stmt_step(c, s, err);
  *version = rc == 1 ? sqlite3_column_int64(s, 0) : 0;
  stmt_close(c, s);
  if (rc == 0) return nas_errf(err, "%s has an empty schema_version table", c->path);
  return rc < 0 ? rc : NAS_OK;
}

static int schema_version_check(const sqlite_conn *c, int64_t version, nas_err *err) {
  if (version <= SCHEMA_VERSION) return NAS_OK;
  return nas_errf(err, "%s has schema version %" PRId64 " but this nas knows versions up to %"
                  PRId64 "; use a newer nas", c->path, version, SCHEMA_VERSION);
}

/* Applies the pending migration steps in order, all in one transaction, so that no
 * process ever sees a schema half-way between two versions. The version is read again
 * inside the transaction: another process may have migrated the same file meanwhile, and
 * then there is nothing left to do. */
static int migrate(const sqlite_conn *c, nas_err *err) {
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  int64_t version = 0;
  rc = schema_version_read(c, &version, err);
  if (rc == NAS_OK) rc = schema_version_check(c, version, err);
  for (int64_t step = version; rc == NAS_OK && step < SCHEMA_VERSION; step++) {
    rc = exec(c, migrations[step], err);
  }
  if (rc == NAS_OK && version < SCHEMA_VERSION) {
    rc = run(c, err, "UPDATE schema_version SET version = ?", "i", SCHEMA_VERSION);
  }
  return tx_end(c, rc, err);
}

/* journal_mode answers with the mode it ended up in, which is not WAL where the file
 * system cannot share memory between processes (network file systems). Switching a new
 * file to WAL answers SQLITE_BUSY at once, without the busy handler, while another process
 * holds a lock on it (several processes creating the same storage); so it is tried again
 * for as long as the busy timeout. Once one process has switched, the others find WAL. */
static int use_wal(const sqlite_conn *c, nas_err *err) {
  sqlite3_stmt *s = NULL;
  int rc = stmt_open(c, &s, err, "PRAGMA journal_mode = WAL", "");
  int step = SQLITE_BUSY;
  for (int waited_ms = 0; rc == NAS_OK; waited_ms += STORAGE_SQLITE_WAL_RETRY_MS) {
    step = sqlite3_step(s);
    if (step != SQLITE_BUSY || waited_ms >= STORAGE_SQLITE_BUSY_MS) break;
    sqlite3_reset(s);
    sqlite3_sleep(STORAGE_SQLITE_WAL_RETRY_MS);
  }
  if (rc == NAS_OK) rc = step == SQLITE_ROW ? 1 : db_fail(c, err);
  const char *mode = rc == 1 ? (const char *)sqlite3_column_text(s, 0) : NULL;
  if (rc == 1 && (!mode || strcmp(mode, "wal") != 0)) {
    rc = nas_errf(err, "cannot use WAL journal mode for %s (got %s); is it on a network file "
                  "system?", c->path, mode ? mode : "nothing");
  }
  stmt_close(c, s);
  return rc < 0 ? rc : NAS_OK;
}

/* The folder must exist and the path must not be a folder, else SQLite only says
 * "unable to open database file"; with must_exist, the file must exist. */
static int check_path(const char *path, bool must_exist, nas_err *err) {
  char *dir = nas_dirname(path);
  if (!dir) return out_of_memory(err);
  struct stat st;
  int rc = NAS_OK;
  if (stat(dir, &st) != 0) rc = nas_errf(err, "folder %s: %s", dir, strerror(errno));
  else if (!S_ISDIR(st.st_mode)) rc = nas_errf(err, "%s is not a folder", dir);
  else if (stat(path, &st) != 0) {
    if (must_exist && errno == ENOENT)
      rc = nas_errf(err, "no database file %s ('nas run' creates it; is the path right?)", path);
  } else if (S_ISDIR(st.st_mode)) {
    rc = nas_errf(err, "%s is a folder, not a database file", path);
  }
  free(dir);
  return rc;
}

/* A new file is made here, not by SQLite (0644 less the umask: readable by everyone under
 * the usual 022), because the spec texts it holds may carry secrets (a Slack webhook URL
 * is one). Others get no access; the group gets what the umask gives it (0640 under 022,
 * 0660 under 002), since a team shares one file through its group and SQLite needs every
 * user of it to write it. SQLite gives the -wal, -shm and journal files it makes later the
 * database file's mode. An existing file is left as it is. */
static int create_file(const char *path, nas_err *err) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
  if (fd < 0 && errno != EEXIST) return nas_errf(err, "cannot create %s: %s", path, strerror(errno));
  if (fd >= 0) close(fd);
  return NAS_OK;
}

/* Connection settings, none of which writes to the file:
 * - no mutex: a connection is used by one thread at a time (nas serve hands each to one
 *   request thread, or to its committer), and SQLite's own lock around every call on it
 *   cost a quarter of reading an experiment's observations (bench/RESULTS.md, "Scale");
 * - foreign keys are off by default in SQLite and must be asked for per connection;
 * - the busy timeout makes a connection wait for the write lock instead of failing. */
static int connect(sqlite_conn *c, bool create, nas_err *err) {
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
  if (create && create_file(c->path, err) != NAS_OK) return NAS_ERR;
  if (sqlite3_open_v2(c->path, &c->db, flags, NULL) != SQLITE_OK) {
    return c->db ? db_fail(c, err) : out_of_memory(err);
  }
  if (sqlite3_busy_timeout(c->db, STORAGE_SQLITE_BUSY_MS) != SQLITE_OK) return db_fail(c, err);
  return exec(c, "PRAGMA foreign_keys = ON", err);
}

/* synchronous = FULL: with WAL, NORMAL loses the last commits on a power cut (never on a
 * process crash) while FULL loses none. Storage is the source of truth: a lost "trial 7
 * started as Slurm job 123" would leave a job running that no one knows about and a trial
 * launched twice. The cost is one fsync of the WAL per commit: about 0.4 ms per
 * transaction against 0.1 ms with NORMAL on an ext4 disk, small beside the seconds to
 * hours a trial runs. */
static int prepare_schema(const sqlite_conn *c, nas_err *err) {
  int64_t version = 0;
  int rc = schema_version_read(c, &version, err);
  if (rc == NAS_OK) rc = schema_version_check(c, version, err);
  if (rc == NAS_OK) rc = use_wal(c, err);
  if (rc == NAS_OK) rc = exec(c, "PRAGMA synchronous = FULL", err);
  /* Most opens (every `nas report`) find the schema current and take no write lock. */
  if (rc == NAS_OK && version < SCHEMA_VERSION) {
    if (version > 0) {
      nas_log("storage sqlite:%s: upgrading schema version %" PRId64 " to %" PRId64, c->path,
              version, SCHEMA_VERSION);
    }
    rc = migrate(c, err);
  }
  return rc;
}

/* SQLite has created the file by the time the connection is open. */
static int remember_identity(sqlite_conn *c, nas_err *err) {
  struct stat opened;
  if (stat(c->path, &opened) != 0) return nas_errf(err, "%s: %s", c->path, strerror(errno));
  c->dev = opened.st_dev;
  c->ino = opened.st_ino;
  return NAS_OK;
}

static void sqlite_close(void *conn) {
  sqlite_conn *c = conn;
  if (!c) return;
  /* Kept statements go first: SQLite does not close a connection that still has some. */
  for (size_t i = 0; c->stmts && i < c->stmts->n; i++) sqlite3_finalize(c->stmts->kept[i]);
  free(c->stmts);
  sqlite3_close(c->db);
  free(c->path);
  free(c);
}

static int sqlite_open(const char *target, unsigned flags, void **conn, nas_err *err) {
  sqlite_conn *c = calloc(1, sizeof *c);
  if (!c) return out_of_memory(err);
  c->path = nas_abspath(target, NULL);
  c->stmts = calloc(1, sizeof *c->stmts);
  bool must_exist = flags & STORAGE_MUST_EXIST;
  int rc = c->path && c->stmts ? check_path(c->path, must_exist, err) : out_of_memory(err);
  if (rc == NAS_OK) rc = connect(c, !must_exist, err);
  if (rc == NAS_OK) rc = remember_identity(c, err);
  if (rc == NAS_OK) rc = prepare_schema(c, err);
  if (rc != NAS_OK) {
    sqlite_close(c);
    return rc;
  }
  *conn = c;
  return NAS_OK;
}

/* ---- experiments --------------------------------------------------------------------- */

static int experiment_create_in_tx(const sqlite_conn *c, const char *name,
                                   const char *spec_text, const char *spec_path,
                                   const char *run_root, double now, int64_t *id,
                                   nas_err *err) {
  bool taken = false;
  int rc = exists(c, &taken, err, "SELECT 1 FROM experiments WHERE name = ?", "t", name);
  if (rc != NAS_OK) return rc;
  if (taken) return nas_errc(err, NAS_EEXIST, "an experiment of that name exists already");
  rc = run(c, err,
           "INSERT INTO experiments (name, spec_text, spec_path, run_root, status, created_at)"
           " VALUES (?, ?, ?, ?, ?, ?)",
           "tttttd", name, spec_text, spec_path, run_root, storage_experiment_statuses[0], now);
  if (rc == NAS_OK) *id = sqlite3_last_insert_rowid(c->db);
  return rc;
}

static int sqlite_experiment_create(void *conn, const char *name, const char *spec_text,
                                    const char *spec_path, const char *run_root, double now,
                                    int64_t *id, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_create_in_tx(c, name, spec_text, spec_path, run_root, now, id, err);
  return tx_end_receipt(c, rc, rc == NAS_OK ? *id : 0, err);
}

static int sqlite_experiment_get(void *conn, const char *name, experiment_row *out,
                                 nas_err *err) {
  return query_row(conn, &experiment_kind, out, "no such experiment", err,
                   "SELECT " EXPERIMENT_COLUMNS " FROM experiments WHERE name = ?", "t", name);
}

static int sqlite_experiment_list(void *conn, experiment_row **out, size_t *n, nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &experiment_kind, &rows, n, err,
                      "SELECT " EXPERIMENT_COLUMNS " FROM experiments ORDER BY id", "");
  if (rc == NAS_OK) *out = rows;
  return rc;
}

/* Runs an UPDATE of one experiment's column in its own transaction; NAS_ENOTFOUND when
 * no row has that id. */
static int experiment_update(const sqlite_conn *c, const char *sql, const char *value,
                             int64_t id, nas_err *err) {
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = run(c, err, sql, "ti", value, id);
  if (rc == NAS_OK && sqlite3_changes(c->db) == 0) {
    rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  }
  return tx_end(c, rc, err);
}

/* The update applies only to another status, so sqlite3_changes says whether this call
 * changed it; the write lock (BEGIN IMMEDIATE) orders racing callers. */
static int sqlite_experiment_set_status(void *conn, int64_t id, const char *status,
                                        bool *changed, nas_err *err) {
  const sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  bool found = true;
  rc = run(c, err, "UPDATE experiments SET status = ?1 WHERE id = ?2 AND status <> ?1", "ti",
           status, id);
  *changed = rc == NAS_OK && sqlite3_changes(c->db) == 1;
  if (rc == NAS_OK && !*changed)
    rc = exists(c, &found, err, "SELECT 1 FROM experiments WHERE id = ?", "i", id);
  if (rc == NAS_OK && !found) rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  return tx_end_receipt(c, rc, *changed, err);
}

static int sqlite_experiment_set_spec(void *conn, int64_t id, const char *spec_text,
                                      nas_err *err) {
  return experiment_update(conn, "UPDATE experiments SET spec_text = ? WHERE id = ?", spec_text,
                           id, err);
}

static int experiment_delete_in_tx(const sqlite_conn *c, int64_t id, nas_err *err) {
  bool found = false;
  int rc = exists(c, &found, err, "SELECT 1 FROM experiments WHERE id = ?", "i", id);
  if (rc == NAS_OK && !found) rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  if (rc == NAS_OK)
    rc = run(c, err,
             "DELETE FROM metrics WHERE trial_id IN (SELECT id FROM trials WHERE experiment_id = ?)",
             "i", id);
  if (rc == NAS_OK) rc = run(c, err, "DELETE FROM trials WHERE experiment_id = ?", "i", id);
  if (rc == NAS_OK)
    rc = run(c, err, "DELETE FROM scheduler_leases WHERE experiment_id = ?", "i", id);
  if (rc == NAS_OK) rc = run(c, err, "DELETE FROM experiments WHERE id = ?", "i", id);
  return rc;
}

static int sqlite_experiment_delete(void *conn, int64_t id, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_delete_in_tx(c, id, err);
  return tx_end_receipt(c, rc, id, err);
}

static int experiment_rename_in_tx(const sqlite_conn *c, int64_t id, const char *new_name,
                                   const char *spec_text, nas_err *err) {
  bool taken = false;
  int rc = exists(c, &taken, err, "SELECT 1 FROM experiments WHERE name = ? AND id <> ?", "ti",
                  new_name, id);
  if (rc == NAS_OK && taken)
    rc = nas_errc(err, NAS_EEXIST, "an experiment of that name exists already");
  if (rc == NAS_OK)
    rc = run(c, err, "UPDATE experiments SET name = ?, spec_text = ? WHERE id = ?", "tti",
             new_name, spec_text, id);
  if (rc == NAS_OK && sqlite3_changes(c->db) == 0)
    rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  return rc;
}

static int sqlite_experiment_rename(void *conn, int64_t id, const char *new_name,
                                    const char *spec_text, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = experiment_rename_in_tx(c, id, new_name, spec_text, err);
  return tx_end(c, rc, err);
}

/* One trial of an image, every field as it was; times of 0 ("not yet") stored as NULL. */
static int trial_import(const sqlite_conn *c, int64_t experiment_id, const trial_row *t,
                        int64_t *id, nas_err *err) {
  int64_t exit_code = t->exit_code;
  int rc = run(c, err,
               "INSERT INTO trials (experiment_id, number, status, params_json, attempts,"
               " created_at, started_at, finished_at, job_id, exit_code, error, log_offset,"
               " heartbeat_at, reference_json, rung)"
               " VALUES (?, ?, ?, ?, ?, ?, nullif(?, 0), nullif(?, 0), ?, ?, ?, ?,"
               " nullif(?, 0), ?, ?)",
               "iittidddtotidti", experiment_id, (int64_t)t->number,
               trial_status_name(t->status), t->params_json, (int64_t)t->attempts, t->created_at,
               t->started_at, t->finished_at, t->job_id, t->has_exit_code ? &exit_code : NULL,
               t->error, t->log_offset, t->heartbeat_at, t->reference_json, (int64_t)t->rung);
  if (rc == NAS_OK) *id = sqlite3_last_insert_rowid(c->db);
  return rc;
}

static int metrics_insert(const sqlite_conn *c, int64_t trial_id, const metric_obs *obs,
                          size_t n, nas_err *err);

static int experiment_import_in_tx(const sqlite_conn *c, const storage_experiment_image *img,
                                   const metric_obs *obs, const size_t *metric_trial,
                                   int64_t *trial_ids, int64_t *id, nas_err *err) {
  const experiment_row *e = img->exp;
  bool taken = false;
  int rc = exists(c, &taken, err, "SELECT 1 FROM experiments WHERE name = ?", "t", e->name);
  if (rc == NAS_OK && taken)
    rc = nas_errc(err, NAS_EEXIST, "an experiment of that name exists already");
  if (rc == NAS_OK)
    rc = run(c, err,
             "INSERT INTO experiments (name, spec_text, spec_path, run_root, status, created_at)"
             " VALUES (?, ?, ?, ?, ?, ?)",
             "tttttd", e->name, e->spec_text, e->spec_path, e->run_root, e->status,
             e->created_at);
  if (rc == NAS_OK) *id = sqlite3_last_insert_rowid(c->db);
  for (size_t i = 0; rc == NAS_OK && i < img->n_trials; i++)
    rc = trial_import(c, *id, &img->trials[i], &trial_ids[i], err);
  for (size_t i = 0, end; rc == NAS_OK && i < img->n_metrics; i = end) {
    for (end = i + 1; end < img->n_metrics && metric_trial[end] == metric_trial[i]; end++) {}
    rc = metrics_insert(c, trial_ids[metric_trial[i]], obs + i, end - i, err);
  }
  return rc;
}

static int sqlite_experiment_import(void *conn, const storage_experiment_image *img,
                                    const metric_obs *obs, const size_t *metric_trial,
                                    int64_t *id, nas_err *err) {
  sqlite_conn *c = conn;
  int64_t *trial_ids = calloc(img->n_trials ? img->n_trials : 1, sizeof *trial_ids);
  if (!trial_ids) return out_of_memory(err);
  int rc = tx_begin(c, err);
  if (rc == NAS_OK) {
    rc = experiment_import_in_tx(c, img, obs, metric_trial, trial_ids, id, err);
    rc = tx_end_receipt(c, rc, rc == NAS_OK ? *id : 0, err);
  }
  free(trial_ids);
  return rc;
}

static int sqlite_trials_import(void *conn, int64_t experiment_id, const trial_row *trials,
                                size_t n, nas_err *err) {
  sqlite_conn *c = conn;
  bool found = false;
  int64_t id;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = exists(c, &found, err, "SELECT 1 FROM experiments WHERE id = ?", "i", experiment_id);
  if (rc == NAS_OK && !found) rc = nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  for (size_t i = 0; rc == NAS_OK && i < n; i++)
    rc = trial_import(c, experiment_id, &trials[i], &id, err);
  return tx_end_receipt(c, rc, experiment_id, err);
}

/* ---- trials ------------------------------------------------------------------------------ */

static int trial_get(const sqlite_conn *c, int64_t trial_id, trial_row *out, nas_err *err) {
  return query_row(c, &trial_kind, out, "no such trial", err,
                   "SELECT " TRIAL_COLUMNS " FROM trials WHERE id = ?", "i", trial_id);
}

/* Hands a row read inside a transaction to the caller only once the transaction has
 * committed (rc is tx_end's result); else frees it. */
static int row_after_commit(int rc, trial_row *row, trial_row *out) {
  if (rc == NAS_OK) *out = *row;
  else trial_row_clear(row);
  return rc;
}

/* The number is computed in the INSERT itself, inside the write lock, so two processes
 * creating trials at once get consecutive numbers and never the same one. */
static int trial_create_in_tx(const sqlite_conn *c, int64_t experiment_id,
                              const char *params_json, const char *reference_json, double now,
                              trial_row *out, nas_err *err) {
  bool found = false;
  int rc = exists(c, &found, err, "SELECT 1 FROM experiments WHERE id = ?", "i", experiment_id);
  if (rc != NAS_OK) return rc;
  if (!found) return nas_errc(err, NAS_ENOTFOUND, "no such experiment");
  rc = run(c, err,
           "INSERT INTO trials (experiment_id, number, status, params_json, attempts,"
           " created_at, log_offset, reference_json)"
           " SELECT ?1, coalesce(max(number) + 1, 0), 'queued', ?2, 0, ?3, 0, ?4"
           " FROM trials WHERE experiment_id = ?1",
           "itdt", experiment_id, params_json, now, reference_json);
  if (rc != NAS_OK) return rc;
  return trial_get(c, sqlite3_last_insert_rowid(c->db), out, err);
}

static int sqlite_trial_create(void *conn, int64_t experiment_id, const char *params_json,
                               const char *reference_json, double now, trial_row *out,
                               nas_err *err) {
  sqlite_conn *c = conn;
  trial_row made = {0};
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_create_in_tx(c, experiment_id, params_json, reference_json, now, &made, err);
  return row_after_commit(tx_end_receipt(c, rc, made.id, err), &made, out);
}

static int trial_status_read(const sqlite_conn *c, int64_t trial_id, trial_status *status,
                             nas_err *err) {
  trial_row row;
  int rc = trial_get(c, trial_id, &row, err);
  if (rc != NAS_OK) return rc;
  *status = row.status;
  trial_row_clear(&row);
  return NAS_OK;
}

/* A new attempt: everything about the previous one is cleared (see storage.h). */
static int attempt_begin(const sqlite_conn *c, int64_t trial_id, const char *job_id, double now,
                         nas_err *err) {
  return run(c, err,
             "UPDATE trials SET status = 'running', attempts = attempts + 1, job_id = ?,"
             " started_at = ?, finished_at = NULL, exit_code = NULL, error = NULL,"
             " log_offset = 0, heartbeat_at = NULL WHERE id = ?",
             "tdi", job_id, now, trial_id);
}

static int trial_start_in_tx(const sqlite_conn *c, int64_t trial_id, const char *job_id,
                             double now, nas_err *err) {
  trial_status current;
  int rc = trial_status_read(c, trial_id, &current, err);
  if (rc == NAS_OK) rc = storage_check_start(current, err);
  if (rc != NAS_OK) return rc;
  return attempt_begin(c, trial_id, job_id, now, err);
}

static int sqlite_trial_start(void *conn, int64_t trial_id, const char *job_id, double now,
                              nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_start_in_tx(c, trial_id, job_id, now, err);
  return tx_end_receipt(c, rc, trial_id, err);
}

/* The write lock taken by BEGIN IMMEDIATE makes pick-then-start atomic: no other process
 * can pick the same trial in between. */
static int trial_claim_in_tx(const sqlite_conn *c, int64_t experiment_id, const char *worker,
                             double now, trial_row *out, nas_err *err) {
  trial_row oldest;
  int rc = query_row(c, &trial_kind, &oldest, "no queued trial", err,
                     "SELECT " TRIAL_COLUMNS " FROM trials WHERE experiment_id = ?"
                     " AND status = 'queued' ORDER BY number LIMIT 1",
                     "i", experiment_id);
  if (rc != NAS_OK) return rc;
  int64_t trial_id = oldest.id;
  trial_row_clear(&oldest);
  rc = attempt_begin(c, trial_id, worker, now, err);
  if (rc == NAS_OK) rc = trial_get(c, trial_id, out, err);
  return rc;
}

static int sqlite_trial_claim(void *conn, int64_t experiment_id, const char *worker, double now,
                              trial_row *out, nas_err *err) {
  sqlite_conn *c = conn;
  trial_row claimed = {0};
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_claim_in_tx(c, experiment_id, worker, now, &claimed, err);
  return row_after_commit(tx_end_receipt(c, rc, claimed.id, err), &claimed, out);
}

static int trial_heartbeat_in_tx(const sqlite_conn *c, int64_t trial_id, double now,
                                 nas_err *err) {
  trial_status current;
  int rc = trial_status_read(c, trial_id, &current, err);
  if (rc == NAS_OK) rc = storage_check_heartbeat(current, err);
  if (rc != NAS_OK) return rc;
  return run(c, err, "UPDATE trials SET heartbeat_at = ? WHERE id = ?", "di", now, trial_id);
}

static int sqlite_trial_heartbeat(void *conn, int64_t trial_id, double now, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_heartbeat_in_tx(c, trial_id, now, err);
  return tx_end(c, rc, err);
}

/* Records a trial's end (after its caller checked that it may end so). */
static int trial_set_ended(const sqlite_conn *c, int64_t trial_id, trial_status status,
                           const int64_t *exit_code, const char *error, double now,
                           nas_err *err) {
  return run(c, err,
             "UPDATE trials SET status = ?, finished_at = ?, exit_code = ?, error = ?"
             " WHERE id = ?",
             "tdoti", trial_status_name(status), now, exit_code, error, trial_id);
}

static int trial_finish_in_tx(const sqlite_conn *c, int64_t trial_id, trial_status status,
                              const int64_t *exit_code, const char *error, double now,
                              nas_err *err) {
  trial_status current;
  int rc = trial_status_read(c, trial_id, &current, err);
  if (rc == NAS_OK) rc = storage_check_finish(current, status, err);
  if (rc != NAS_OK) return rc;
  return trial_set_ended(c, trial_id, status, exit_code, error, now, err);
}

static int sqlite_trial_finish(void *conn, int64_t trial_id, trial_status status,
                               bool has_exit_code, int exit_code, const char *error, double now,
                               nas_err *err) {
  sqlite_conn *c = conn;
  int64_t code = exit_code;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_finish_in_tx(c, trial_id, status, has_exit_code ? &code : NULL, error, now, err);
  return tx_end_receipt(c, rc, trial_id, err);
}

/* The write lock taken by BEGIN IMMEDIATE makes check-then-write atomic: of two
 * completions of one attempt exactly one finds it running and stores its values. */
static int trial_complete_in_tx(const sqlite_conn *c, int64_t trial_id, int attempt,
                                const metric_obs *obs, size_t n, double now, nas_err *err) {
  trial_row row;
  int rc = trial_get(c, trial_id, &row, err);
  if (rc != NAS_OK) return rc;
  rc = storage_check_complete(row.status, row.attempts, attempt, err);
  trial_row_clear(&row);
  if (rc == NAS_OK) rc = metrics_insert(c, trial_id, obs, n, err);
  if (rc != NAS_OK) return rc;
  return trial_set_ended(c, trial_id, TRIAL_COMPLETED, NULL, NULL, now, err);
}

static int sqlite_trial_complete(void *conn, int64_t trial_id, int attempt,
                                 const metric_obs *obs, size_t n, double now, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_complete_in_tx(c, trial_id, attempt, obs, n, now, err);
  return tx_end_receipt(c, rc, trial_id, err);
}

static int trial_requeue_in_tx(const sqlite_conn *c, int64_t trial_id, nas_err *err) {
  trial_status current;
  int rc = trial_status_read(c, trial_id, &current, err);
  if (rc == NAS_OK) rc = storage_check_requeue(current, err);
  if (rc != NAS_OK) return rc;
  return run(c, err,
             "UPDATE trials SET status = 'queued', finished_at = NULL, exit_code = NULL,"
             " error = NULL WHERE id = ?",
             "i", trial_id);
}

static int sqlite_trial_requeue(void *conn, int64_t trial_id, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_requeue_in_tx(c, trial_id, err);
  return tx_end_receipt(c, rc, trial_id, err);
}

static int trial_promote_in_tx(const sqlite_conn *c, int64_t trial_id, int rung, nas_err *err) {
  trial_status current;
  int rc = trial_status_read(c, trial_id, &current, err);
  if (rc == NAS_OK) rc = storage_check_promote(current, err);
  if (rc != NAS_OK) return rc;
  return run(c, err,
             "UPDATE trials SET status = 'queued', rung = rung + 1, finished_at = NULL,"
             " exit_code = NULL, error = NULL WHERE id = ? AND status = 'completed' AND rung = ?",
             "ii", trial_id, (int64_t)rung);
}

static int sqlite_trial_promote(void *conn, int64_t trial_id, int rung, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = trial_promote_in_tx(c, trial_id, rung, err);
  return tx_end(c, rc, err);
}

static int sqlite_trial_get(void *conn, int64_t trial_id, trial_row *out, nas_err *err) {
  return trial_get(conn, trial_id, out, err);
}

static int sqlite_trial_find(void *conn, int64_t experiment_id, int number, trial_row *out,
                             nas_err *err) {
  return query_row(conn, &trial_kind, out, "no such trial", err,
                   "SELECT " TRIAL_COLUMNS " FROM trials WHERE experiment_id = ? AND number = ?",
                   "ii", experiment_id, (int64_t)number);
}

static int sqlite_trial_list(void *conn, int64_t experiment_id, trial_row **out, size_t *n,
                             nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &trial_kind, &rows, n, err,
                      "SELECT " TRIAL_COLUMNS " FROM trials WHERE experiment_id = ?"
                      " ORDER BY number",
                      "i", experiment_id);
  if (rc == NAS_OK) *out = rows;
  return rc;
}

static int sqlite_trial_counts(void *conn, int64_t experiment_id, int64_t *by_status,
                               nas_err *err) {
  const sqlite_conn *c = conn;
  sqlite3_stmt *s = NULL;
  int rc = stmt_open(c, &s, err,
                     "SELECT status, count(*) FROM trials WHERE experiment_id = ? GROUP BY status",
                     "i", experiment_id);
  if (rc != NAS_OK) return rc;
  while ((rc = stmt_step(c, s, err)) == 1) {
    const char *name = (const char *)sqlite3_column_text(s, 0);
    trial_status status;
    if (trial_status_parse(name, &status) != NAS_OK) {
      rc = nas_errf(err, "a trial has unknown status '%s'", name ? name : "(null)");
      break;
    }
    by_status[status] = sqlite3_column_int64(s, 1);
  }
  stmt_close(c, s);
  return rc < 0 ? rc : NAS_OK;
}

/* ---- metrics ------------------------------------------------------------------------------ */

static int metrics_insert(const sqlite_conn *c, int64_t trial_id, const metric_obs *obs,
                          size_t n, nas_err *err) {
  sqlite3_stmt *s = NULL;
  int rc = stmt_open(c, &s, err,
                     "INSERT INTO metrics (trial_id, name, step, value, time)"
                     " VALUES (?, ?, ?, ?, ?)",
                     "");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    bool final = obs[i].step == METRIC_FINAL;
    rc = stmt_bind(c, s, err, "itodd", trial_id, obs[i].name, final ? NULL : &obs[i].step,
                   obs[i].value, obs[i].time);
    if (rc == NAS_OK) rc = stmt_step(c, s, err);
    if (rc >= 0 && sqlite3_reset(s) != SQLITE_OK) rc = db_fail(c, err);
  }
  stmt_close(c, s);
  return rc < 0 ? rc : NAS_OK;
}

static int metrics_add_in_tx(const sqlite_conn *c, int64_t trial_id, const metric_obs *obs,
                             size_t n, int64_t new_log_offset, nas_err *err) {
  bool found = false;
  int rc = exists(c, &found, err, "SELECT 1 FROM trials WHERE id = ?", "i", trial_id);
  if (rc != NAS_OK) return rc;
  if (!found) return nas_errc(err, NAS_ENOTFOUND, "no such trial");
  rc = metrics_insert(c, trial_id, obs, n, err);
  if (rc == NAS_OK && new_log_offset >= 0) {
    rc = run(c, err, "UPDATE trials SET log_offset = ? WHERE id = ?", "ii", new_log_offset,
             trial_id);
  }
  return rc;
}

static int sqlite_metrics_add(void *conn, int64_t trial_id, const metric_obs *obs, size_t n,
                              int64_t new_log_offset, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  rc = metrics_add_in_tx(c, trial_id, obs, n, new_log_offset, err);
  return tx_end_receipt(c, rc, trial_id, err);
}

static int sqlite_metrics_list(void *conn, int64_t experiment_id, metric_row **out, size_t *n,
                               nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &metric_kind, &rows, n, err,
                      "SELECT m.id, m.trial_id, m.name, m.step, m.value, m.time"
                      " FROM metrics m JOIN trials t ON t.id = m.trial_id"
                      " WHERE t.experiment_id = ? ORDER BY t.number, m.id",
                      "i", experiment_id);
  if (rc == NAS_OK) *out = rows;
  return rc;
}

static int sqlite_metrics_of_trial(void *conn, int64_t trial_id, metric_row **out, size_t *n,
                                   nas_err *err) {
  void *rows = NULL;
  int rc = query_rows(conn, &metric_kind, &rows, n, err,
                      "SELECT id, trial_id, name, step, value, time FROM metrics"
                      " WHERE trial_id = ? ORDER BY id", "i", trial_id);
  if (rc == NAS_OK) *out = rows;
  return rc;
}

/* ---- the scheduler lease ---------------------------------------------------------------- */

#define LEASE_COLUMNS "token, host, pid, started_at, heartbeat_at"

static int lease_read(sqlite3_stmt *s, void *row, nas_err *err) {
  storage_lease *l = row;
  memset(l, 0, sizeof *l);
  l->pid = sqlite3_column_int64(s, 2);
  l->started_at = sqlite3_column_double(s, 3);
  l->heartbeat_at = sqlite3_column_double(s, 4);
  int rc = column_text(s, 0, &l->token, err);
  if (rc == NAS_OK) rc = column_text(s, 1, &l->host, err);
  if (rc != NAS_OK) storage_lease_clear(l);
  return rc;
}

static void lease_free_rows(void *rows, size_t n) {
  storage_lease *leases = rows;
  for (size_t i = 0; i < n; i++) storage_lease_clear(&leases[i]);
  free(rows);
}

static const row_kind lease_kind = {sizeof(storage_lease), lease_read, lease_free_rows};

/* One write statement in its own transaction; *changed gets the rows it changed. */
static int write_counted(const sqlite_conn *c, int *changed, nas_err *err, const char *sql,
                         const char *types, ...) {
  int rc = tx_begin(c, err);
  if (rc != NAS_OK) return rc;
  sqlite3_stmt *s = NULL;
  va_list ap;
  va_start(ap, types);
  rc = stmt_openv(c, &s, err, sql, types, ap);
  va_end(ap);
  if (rc == NAS_OK) {
    rc = stmt_step(c, s, err);
    stmt_close(c, s);
  }
  if (rc >= 0) {
    rc = NAS_OK;
    *changed = sqlite3_changes(c->db);
  }
  return tx_end(c, rc, err);
}

static int sqlite_lease_take(void *conn, int64_t experiment_id, const char *token,
                             const char *host, int64_t pid, const char *replaces, double now,
                             nas_err *err) {
  int changed = 0;
  int rc = write_counted(conn, &changed, err, LEASE_TAKE_SQL("?1", "?2", "?3", "?4", "?5", "?6"),
                         "ittidt", experiment_id, token, host, pid, now, replaces);
  if (rc == NAS_OK && changed == 0) rc = nas_errc(err, NAS_EEXIST, "another scheduler holds it");
  return rc;
}

static int sqlite_lease_renew(void *conn, int64_t experiment_id, const char *token, double now,
                              nas_err *err) {
  int changed = 0;
  int rc = write_counted(conn, &changed, err,
                         "UPDATE scheduler_leases SET heartbeat_at = ?"
                         " WHERE experiment_id = ? AND token = ?",
                         "dit", now, experiment_id, token);
  if (rc == NAS_OK && changed == 0) rc = nas_errc(err, NAS_ENOTFOUND, "this process no longer holds it");
  return rc;
}

static int sqlite_lease_release(void *conn, int64_t experiment_id, const char *token,
                                nas_err *err) {
  int changed = 0;
  return write_counted(conn, &changed, err,
                       "DELETE FROM scheduler_leases WHERE experiment_id = ? AND token = ?",
                       "it", experiment_id, token);
}

static int sqlite_lease_get(void *conn, int64_t experiment_id, storage_lease *out,
                            nas_err *err) {
  return query_row(conn, &lease_kind, out, "no scheduler holds it", err,
                   "SELECT " LEASE_COLUMNS " FROM scheduler_leases WHERE experiment_id = ?",
                   "i", experiment_id);
}

/* ---- idempotency keys ------------------------------------------------------------------- */

static void sqlite_receipt_arm(void *conn, const char *key) {
  sqlite_conn *c = conn;
  c->request_key = key;
}

static int sqlite_receipt_find(void *conn, const char *key, bool *found, int64_t *result,
                               nas_err *err) {
  const sqlite_conn *c = conn;
  sqlite3_stmt *s = NULL;
  int rc = stmt_open(c, &s, err, "SELECT result FROM write_receipts WHERE token = ?", "t", key);
  if (rc == NAS_OK) rc = stmt_step(c, s, err);
  *found = rc == 1;
  *result = rc == 1 ? sqlite3_column_int64(s, 0) : 0;
  stmt_close(c, s);
  return rc < 0 ? rc : NAS_OK;
}

/* ---- group commit ------------------------------------------------------------------------ */

static int sqlite_group_begin(void *conn, nas_err *err) {
  sqlite_conn *c = conn;
  int rc = tx_begin(c, err);
  c->grouped = rc == NAS_OK;
  return rc;
}

static int sqlite_group_end(void *conn, bool commit, nas_err *err) {
  sqlite_conn *c = conn;
  c->grouped = false;
  if (!commit) {
    if (!sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    return NAS_OK;
  }
  if (sqlite3_get_autocommit(c->db))
    return nas_errf(err, "the group's transaction on %s was rolled back", c->path);
  return tx_end(c, NAS_OK, err);
}

const storage_backend storage_sqlite_backend = {
    .name = "sqlite",
    .open = sqlite_open,
    .close = sqlite_close,
    .experiment_create = sqlite_experiment_create,
    .experiment_get = sqlite_experiment_get,
    .experiment_list = sqlite_experiment_list,
    .experiment_set_status = sqlite_experiment_set_status,
    .experiment_set_spec = sqlite_experiment_set_spec,
    .experiment_delete = sqlite_experiment_delete,
    .experiment_rename = sqlite_experiment_rename,
    .experiment_import = sqlite_experiment_import,
    .trials_import = sqlite_trials_import,
    .trial_create = sqlite_trial_create,
    .trial_start = sqlite_trial_start,
    .trial_claim = sqlite_trial_claim,
    .trial_heartbeat = sqlite_trial_heartbeat,
    .trial_finish = sqlite_trial_finish,
    .trial_complete = sqlite_trial_complete,
    .trial_requeue = sqlite_trial_requeue,
    .trial_promote = sqlite_trial_promote,
    .trial_get = sqlite_trial_get,
    .trial_find = sqlite_trial_find,
    .trial_counts = sqlite_trial_counts,
    .trial_list = sqlite_trial_list,
    .metrics_add = sqlite_metrics_add,
    .metrics_list = sqlite_metrics_list,
    .metrics_of_trial = sqlite_metrics_of_trial,
    .lease_take = sqlite_lease_take,
    .lease_renew = sqlite_lease_renew,
    .lease_release = sqlite_lease_release,
    .lease_get = sqlite_lease_get,
    .receipt_arm = sqlite_receipt_arm,
    .receipt_find = sqlite_receipt_find,
    .group_begin = sqlite_group_begin,
    .group_end = sqlite_group_end,
};
