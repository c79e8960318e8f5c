/* storage: the one place experiments, trials and metric observations live.
 *
 * Storage is the source of truth: the scheduler writes every decision here before acting
 * on it, so a crash at any instant loses nothing and resume is "open, rebuild, continue".
 * Backends sit behind this interface, chosen by the URL:
 *   sqlite:PATH            (relative PATH is relative to the current directory)
 *   postgresql://… or postgres://…  (libpq connection URI; every libpq option, TLS ones
 *                          included, passes through untouched)
 *   http://HOST:PORT or https://HOST:PORT  (a `nas serve` in front of one of the above,
 *                          for machines that cannot reach the database; storage/http.c,
 *                          docs/storage-http.md. Its token comes from NAS_TOKEN or the file
 *                          named by NAS_TOKEN_FILE, never from the URL)
 * Every state change of a trial is one transaction. Several processes may use the same
 * storage at once (the scheduler, workers claiming trials, trials reporting with
 * `nas report`), on one machine (SQLite) or many (PostgreSQL).
 *
 * Text is stored as UTF-8 only (PostgreSQL refuses other bytes, and rows go out as JSON):
 * a write whose text is not well-formed UTF-8 is refused naming that text, except a trial's
 * error, which is stored with each bad byte replaced by U+FFFD, so that an outcome is
 * never lost to the bytes of what ended the trial.
 *
 * A schema older than the binary's is migrated on open (in one transaction, with a line
 * on stderr when an existing storage is upgraded); a newer one is refused.
 *
 * PostgreSQL connection loss (server restart, network blip): every operation retries with
 * backoff and reconnects for up to NAS_STORAGE_RETRY_S seconds (environment, read at open;
 * default 30, 0 = no retries), the first connection included unless opened with
 * STORAGE_CONNECT_ONCE. Each connection attempt waits at most connect_timeout seconds for
 * the server (5 unless the URL sets it), so a server that does not answer costs one
 * attempt that long, not the whole budget; a server that vanishes mid-operation without
 * closing the connection is noticed by TCP keepalives and a TCP user timeout (pg_conn.c)
 * in about 25 s, and counts as a lost connection. An operation then either
 * happened exactly once or returned an error: writes that are not idempotent commit a
 * receipt in the same transaction as the write, and after a connection lost while the
 * outcome was unknown the receipt is looked up (and fenced off when missing) before the
 * operation is tried again. Only when the server stays out of reach for the whole budget
 * after the outcome became unknown does the error say that the write may have happened.
 * A caller's watch (storage_set_watch) can end the retries early (Ctrl-C in `nas run`).
 *
 * Over HTTP the same holds end to end: the client retries lost connections and 5xx
 * answers within NAS_STORAGE_RETRY_S, and names each write that is not idempotent with an
 * idempotency key that the server commits in the write's own transaction (below), so a
 * retried write is stored once, even across a server killed and restarted. */
#ifndef NAS_STORAGE_H
#define NAS_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define STORAGE_DEFAULT_URL "sqlite:nas.db"

typedef struct storage storage;

typedef enum {
  TRIAL_QUEUED = 0, /* created with its parameters, not launched yet */
  TRIAL_RUNNING,    /* launched; job_id names the runner's handle */
  TRIAL_COMPLETED,  /* exited 0 and reported every objective */
  TRIAL_FAILED,     /* non-zero exit, signal, lost, missing objective, launch error */
  TRIAL_TIMEOUT,    /* killed at its time limit */
  TRIAL_STOPPED,    /* stopped by the user or by early stopping; its data is kept */
} trial_status;
#define TRIAL_STATUS_COUNT 6

/* "queued", "running", …; and back. */
const char *trial_status_name(trial_status status);
int trial_status_parse(const char *name, trial_status *out);
/* Whether no further change is expected (completed, failed, timeout, stopped). */
bool trial_status_final(trial_status status);

typedef struct {
  int64_t id;
  char *name;          /* unique within the storage */
  char *spec_text;     /* the YAML text it was started from */
  char *spec_path;     /* absolute path of that file when it started */
  char *run_root;      /* absolute folder holding runs/<name>/<trial>/ */
  char *status;        /* "running", "finished", "stopped" */
  double created_at;   /* Unix seconds */
} experiment_row;

typedef struct {
  int64_t id;            /* unique within the storage */
  int64_t experiment_id;
  int number;            /* 0, 1, 2, … within the experiment, in creation order */
  trial_status status;
  char *params_json;     /* JSON object of the active parameters' values */
  int attempts;          /* launches so far */
  double created_at, started_at, finished_at; /* Unix seconds; 0 when not yet */
  char *job_id;          /* runner handle of the current attempt; NULL before launch */
  bool has_exit_code;
  int exit_code;
  char *error;           /* why it failed; NULL when it did not */
  int64_t log_offset;    /* bytes of the current attempt's stdout.log already read */
  double heartbeat_at;   /* Unix seconds of the current attempt's last heartbeat; 0 when none */
  char *reference_json;  /* JSON object: the reference point (objective name → value, in the
                            objectives' own direction) the optimizer aimed its hypervolume
                            improvement at when it suggested this trial; NULL when none */
  int rung;              /* multi-fidelity (spec multi_fidelity): the rung of its bracket it
                            trains to next, or last trained to; 0 for every other trial */
} trial_row;

#define METRIC_FINAL (-1) /* step of a final (not intermediate) observation */

/* One observation as reported by a trial. `name` is borrowed. */
typedef struct {
  const char *name;
  int64_t step;   /* >= 0 for intermediate values, METRIC_FINAL for final ones */
  double value;
  double time;    /* Unix seconds when it was reported */
} metric_obs;

/* One stored observation; `name` is owned by the row. */
typedef struct {
  int64_t id;
  int64_t trial_id;
  char *name;
  int64_t step;
  double value;
  double time;
} metric_row;

/* Opens (creating when missing) the storage at url and brings its schema to the current
 * version; a schema newer than this binary knows is an error. */
int storage_open(const char *url, storage **out, nas_err *err);
/* How storage_open_with opens, beyond storage_open (flags = 0). */
enum {
  /* A missing sqlite file is an error naming its path, not a new empty database (a typo
   * in a path must not make one): for every command that reads or changes what exists
   * (all but `nas run`, `nas create`, `nas import` and `nas serve`). */
  STORAGE_MUST_EXIST = 1u << 0,
  /* PostgreSQL: the first connection is tried once, for at most connect_timeout, instead
   * of for NAS_STORAGE_RETRY_S: for commands a person waits on. */
  STORAGE_CONNECT_ONCE = 1u << 1,
};
int storage_open_with(const char *url, unsigned flags, storage **out, nas_err *err);
void storage_close(storage *st);
/* While its server is out of reach (PostgreSQL, http), an operation waits between
 * retries; a watch lets the caller end that wait: cancelled(ctx) is asked at least every
 * STORAGE_WATCH_S seconds of it, and once it says true the operation gives up at once
 * with NAS_ECANCELED ("given up on request while the storage was out of reach"). SQLite
 * has no server to wait for and never asks. A zero watch (the default) never gives up. */
typedef struct {
  bool (*cancelled)(void *ctx);
  void *ctx;
} storage_watch;
#define STORAGE_WATCH_S 0.05
void storage_set_watch(storage *st, storage_watch watch);
/* The URL with a relative sqlite path made absolute (to hand to trials). Owned. */
char *storage_url_absolute(const char *url);
/* The URL as it may be shown: any password replaced by "***". Owned. */
char *storage_url_redacted(const char *url);
/* Overwrites every password in url, in place, with as many '*' (so that a process can
 * hide one in its own argv, which `ps` shows). Returns whether there was one. */
bool storage_url_mask(char *url);

/* Experiments. create returns NAS_EEXIST when the name is taken; get returns
 * NAS_ENOTFOUND when there is none. Rows are filled with owned strings. */
int storage_experiment_create(storage *st, const char *name, const char *spec_text,
                              const char *spec_path, const char *run_root, int64_t *id,
                              nas_err *err);
int storage_experiment_get(storage *st, const char *name, experiment_row *out, nas_err *err);
int storage_experiment_list(storage *st, experiment_row **out, size_t *n, nas_err *err);
/* *changed (may be NULL): whether the experiment had another status, so that of callers
 * setting the same status at once exactly one hears true (an ask-and-tell experiment
 * finishes once, however many last tells race). */
int storage_experiment_set_status(storage *st, int64_t id, const char *status, bool *changed,
                                  nas_err *err);
int storage_experiment_set_spec(storage *st, int64_t id, const char *spec_text, nas_err *err);
/* Deletes the experiment, its trials, their metrics and its scheduler lease, in one
 * transaction. NAS_ENOTFOUND when no experiment has that id. Run folders are the
 * caller's. */
int storage_experiment_delete(storage *st, int64_t id, nas_err *err);
/* Gives the experiment a new name and, in the same transaction, its spec text (which
 * names it). NAS_EEXIST when another experiment has new_name, NAS_ENOTFOUND when no
 * experiment has that id. */
int storage_experiment_rename(storage *st, int64_t id, const char *new_name,
                              const char *spec_text, nas_err *err);
void experiment_row_clear(experiment_row *row);
void experiment_rows_free(experiment_row *rows, size_t n);

/* Trials. create stores a queued trial and gives it the next number; reference_json (NULL:
 * none) is kept as trial_row.reference_json says. */
int storage_trial_create(storage *st, int64_t experiment_id, const char *params_json,
                         const char *reference_json, trial_row *out, nas_err *err);
/* queued (or a retried final trial) → running: attempts + 1, job_id and started_at set.
 * Every start begins a new attempt from a clean slate: exit code, error, finished_at and
 * heartbeat_at are cleared and log_offset goes back to 0, because a retry writes a fresh
 * log in a new run folder (metrics already stored from earlier attempts stay). */
int storage_trial_start(storage *st, int64_t trial_id, const char *job_id, nas_err *err);
/* Atomically takes the oldest (lowest number) queued trial of the experiment and starts it
 * as storage_trial_start would, with job_id = worker; *out gets the started row. Trials
 * another process is claiming at the same moment are skipped, never taken twice.
 * NAS_ENOTFOUND when the experiment has no queued trial (or does not exist). */
int storage_trial_claim(storage *st, int64_t experiment_id, const char *worker, trial_row *out,
                        nas_err *err);
/* Records that a running trial is alive: heartbeat_at = now. NAS_ENOTFOUND for an unknown
 * trial; an error naming the status for a trial that is not running. */
int storage_trial_heartbeat(storage *st, int64_t trial_id, nas_err *err);
/* running → a final status, with exit code (when has_exit_code) and error text (or NULL);
 * also queued → failed, for a trial whose job could not be started at all; and running →
 * queued, to retry a trial whose job was lost (error says why; attempts are kept). */
int storage_trial_finish(storage *st, int64_t trial_id, trial_status status,
                         bool has_exit_code, int exit_code, const char *error, nas_err *err);
/* running → completed with its final observations obs[0..n-1] (n may be 0), in one
 * transaction, and only while the trial still runs attempt `attempt` (the one the caller
 * read): of two completions of one trial exactly one stores its values, and a completion
 * of an attempt since handed out again stores nothing. NAS_EEXIST, naming its status or
 * attempt, when it does not run that attempt; NAS_ENOTFOUND for an unknown trial. */
int storage_trial_complete(storage *st, int64_t trial_id, int attempt, const metric_obs *obs,
                           size_t n, nas_err *err);
/* failed or timeout → queued, to run the trial again (`nas retry`): its attempts are kept
 * (it is the same trial, counted once in the budget) and the last attempt's exit code,
 * error and finished_at cleared. An error naming the status for any other trial. */
int storage_trial_requeue(storage *st, int64_t trial_id, nas_err *err);
/* completed at rung → queued at rung + 1, to train on from its saved weights (multi-fidelity
 * promotion; attempts are kept, exit code, error and finished_at cleared). Idempotent: a
 * trial already queued at rung + 1 is left as it is. An error naming the status for a
 * trial that is neither. */
int storage_trial_promote(storage *st, int64_t trial_id, int rung, nas_err *err);
int storage_trial_get(storage *st, int64_t trial_id, trial_row *out, nas_err *err);
/* Trial `number` of an experiment, read by its (experiment, number) index instead of
 * listing every trial; NAS_ENOTFOUND when it has none. */
int storage_trial_find(storage *st, int64_t experiment_id, int number, trial_row *out,
                       nas_err *err);
/* All trials of an experiment ordered by number. */
int storage_trial_list(storage *st, int64_t experiment_id, trial_row **out, size_t *n,
                       nas_err *err);
/* How many trials of an experiment have each status, counted by storage (for a budget
 * that needs no trial's row). */
int storage_trial_counts(storage *st, int64_t experiment_id,
                         int64_t by_status[TRIAL_STATUS_COUNT], nas_err *err);
void trial_row_clear(trial_row *row);
void trial_rows_free(trial_row *rows, size_t n);

/* Adds n observations of one trial in one transaction, and in the same transaction sets
 * the trial's log_offset to new_log_offset when that is >= 0, so a log line is never
 * counted twice nor lost across a crash. */
int storage_metrics_add(storage *st, int64_t trial_id, const metric_obs *obs, size_t n,
                        int64_t new_log_offset, nas_err *err);
/* Every observation of an experiment's trials, ordered by trial then insertion. */
int storage_metrics_list(storage *st, int64_t experiment_id, metric_row **out, size_t *n,
                         nas_err *err);
/* Every observation of one trial, in insertion order (by its index, not the experiment's
 * whole list). */
int storage_metrics_of_trial(storage *st, int64_t trial_id, metric_row **out, size_t *n,
                             nas_err *err);
void metric_rows_free(metric_row *rows, size_t n);

/* ---- a whole experiment at once ------------------------------------------------------
 * What `nas copy` writes, and `nas run` for a spec with trials to enqueue: an experiment
 * with its trials and their metrics, stored in one transaction (all of it, or nothing). */
typedef struct {
  const experiment_row *exp; /* every field but id */
  const trial_row *trials;   /* every field but id and experiment_id; numbers unique */
  size_t n_trials;
  const metric_row *metrics; /* every field but id; trial_id is the id of one of trials
                                (as read from the experiment copied) */
  size_t n_metrics;
} storage_experiment_image;

/* Stores img as a new experiment; *id gets its id. NAS_EEXIST when its name is taken. */
int storage_experiment_import(storage *st, const storage_experiment_image *img, int64_t *id,
                              nas_err *err);
/* Adds trials[0..n-1] (as an image's: every field but id and experiment_id as it was) to
 * experiment experiment_id in one transaction: what `nas copy` stores a share at a time
 * when an image is more than one request to a `nas serve` holds. A number the experiment
 * has already is refused and nothing is stored; NAS_ENOTFOUND when no experiment has that
 * id. */
int storage_trials_import(storage *st, int64_t experiment_id, const trial_row *trials, size_t n,
                          nas_err *err);

/* ---- the scheduler lease --------------------------------------------------------------
 * One scheduler per experiment: a process that runs an experiment holds its lease, a row
 * naming the holder (host, pid, when it started) and a heartbeat it renews while it runs.
 * Storage only records and swaps leases; deciding that a holder is dead (its heartbeat too
 * old, or its pid gone on this host) is the scheduler's (scheduler.h). */
typedef struct {
  char *token;         /* the holder's secret-free random identity; proves ownership */
  char *host;          /* host name of the holder */
  int64_t pid;         /* its process id on that host */
  double started_at;   /* Unix seconds when it took the lease */
  double heartbeat_at; /* Unix seconds of its last renewal */
} storage_lease;

/* Takes the experiment's lease for (token, host, pid) when there is none, when it holds
 * it already, or when the current lease's token equals `replaces` (a lease its caller
 * judged dead: compare-and-swap, so two processes taking over the same dead lease cannot
 * both win). NAS_EEXIST when another lease is held. */
int storage_lease_take(storage *st, int64_t experiment_id, const char *token, const char *host,
                       int64_t pid, const char *replaces, nas_err *err);
/* heartbeat_at = now for the lease held by token; NAS_ENOTFOUND when token no longer
 * holds it (another process took it over). */
int storage_lease_renew(storage *st, int64_t experiment_id, const char *token, nas_err *err);
/* Gives the lease up; nothing happens when token does not hold it. */
int storage_lease_release(storage *st, int64_t experiment_id, const char *token, nas_err *err);
/* The current lease; NAS_ENOTFOUND when no one holds it. */
int storage_lease_get(storage *st, int64_t experiment_id, storage_lease *out, nas_err *err);
void storage_lease_clear(storage_lease *lease);

/* ---- idempotency keys: the server side of the storage RPC (serve/api_storage.c) ---------
 * A client that lost the answer to a write sends it again under the same key. Armed on a
 * storage, a key is committed by the next write that is not idempotent (experiment_create,
 * experiment_set_status, experiment_delete, experiment_import, trials_import,
 * trial_create, trial_start, trial_claim, trial_finish, trial_complete, trial_requeue,
 * metrics_add) in that
 * write's own transaction, with the id of the experiment or trial it made, took, changed
 * or added to (experiment_set_status: 1 when it changed the status, else 0); two writes
 * under one key cannot both commit. Keys are kept for a day. */
#define STORAGE_KEY_MAX 64
/* Arms key (copied) until armed again; NULL disarms. The caller makes one write under it. */
int storage_receipt_arm(storage *st, const char *key, nas_err *err);
/* Whether a write committed key, and the id it recorded. */
int storage_receipt_find(storage *st, const char *key, bool *found, int64_t *result,
                         nas_err *err);
/* The backend's name: "sqlite", "postgresql" or "http". */
const char *storage_backend_name(const storage *st);
/* When bare, failures of st's operations carry the backend's message alone, without the
 * operation in front ("start trial 7: "): the RPC client's own storage.c adds it. */
void storage_bare_errors(storage *st, bool bare);

/* ---- group commit: several writes in one transaction (serve/commit.c) ------------------
 * Between storage_group_begin and storage_group_end every write of st runs inside one
 * transaction, each as a savepoint of its own: a write that fails is rolled back alone and
 * the others stay; storage_group_end(commit = true) makes them all durable at once, with
 * one commit (one fsync) for the lot. Only where storage_can_group says so (SQLite, whose
 * one writer at a time would otherwise pay an fsync per write; PostgreSQL commits
 * concurrent sessions side by side and shares their flushes itself). A failed commit loses
 * the whole group: its writes are then to be made again one by one. */
bool storage_can_group(const storage *st);
int storage_group_begin(storage *st, nas_err *err);
int storage_group_end(storage *st, bool commit, nas_err *err);

#endif
