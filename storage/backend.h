/* storage/backend.h: the table each storage backend fills (internal to storage/).
 *
 * storage.c parses the URL, picks the backend by its scheme, checks the arguments every
 * backend would check alike, reads the clock, and puts the operation ("start trial 7") in
 * front of any error message. A backend does the database work: each function that writes
 * runs as one transaction, and the transition rules below are applied inside it, so two
 * processes can never both move the same trial. Error messages from a backend say what
 * went wrong and, for database errors, the database's own message and where the database
 * is (never a password). */
#ifndef NAS_STORAGE_BACKEND_H
#define NAS_STORAGE_BACKEND_H

#include "storage/storage.h"

typedef struct storage_backend {
  const char *name; /* "sqlite", "postgresql": the URL schemes it serves map to it */
  /* Connects to target (sqlite: the file path as written in the URL; postgresql: the
   * whole libpq URI) as flags (STORAGE_MUST_EXIST, STORAGE_CONNECT_ONCE) say and brings
   * the schema to the current version. *conn is owned and released with close. */
  int (*open)(const char *target, unsigned flags, void **conn, nas_err *err);
  void (*close)(void *conn);

  /* As the storage_* functions of the same names; strings are non-NULL unless storage.h
   * says otherwise, `now` is the Unix time to record. */
  int (*experiment_create)(void *conn, const char *name, const char *spec_text,
                           const char *spec_path, const char *run_root, double now,
                           int64_t *id, nas_err *err);
  int (*experiment_get)(void *conn, const char *name, experiment_row *out, nas_err *err);
  int (*experiment_list)(void *conn, experiment_row **out, size_t *n, nas_err *err);
  /* Not idempotent in its answer (*changed): commits a receipt with *changed as result. */
  int (*experiment_set_status)(void *conn, int64_t id, const char *status, bool *changed,
                               nas_err *err);
  int (*experiment_set_spec)(void *conn, int64_t id, const char *spec_text, nas_err *err);
  int (*experiment_delete)(void *conn, int64_t id, nas_err *err);
  int (*experiment_rename)(void *conn, int64_t id, const char *new_name, const char *spec_text,
                           nas_err *err);
  /* img is checked by storage.c; obs[i] is img->metrics[i] as an observation and
   * metric_trial[i] the index into img->trials of its trial. */
  int (*experiment_import)(void *conn, const storage_experiment_image *img,
                           const metric_obs *obs, const size_t *metric_trial, int64_t *id,
                           nas_err *err);
  /* trials are checked by storage.c. */
  int (*trials_import)(void *conn, int64_t experiment_id, const trial_row *trials, size_t n,
                       nas_err *err);

  int (*trial_create)(void *conn, int64_t experiment_id, const char *params_json,
                      const char *reference_json, double now,
                      trial_row *out, nas_err *err);
  /* Must call storage_check_start on the trial's current status inside the transaction. */
  int (*trial_start)(void *conn, int64_t trial_id, const char *job_id, double now,
                     nas_err *err);
  /* Takes only a queued trial (no state check needed): oldest first, skipping rows other
   * transactions hold. Resets the attempt's fields exactly as trial_start does. */
  int (*trial_claim)(void *conn, int64_t experiment_id, const char *worker, double now,
                     trial_row *out, nas_err *err);
  /* Must call storage_check_heartbeat on the trial's current status inside the transaction. */
  int (*trial_heartbeat)(void *conn, int64_t trial_id, double now, nas_err *err);
  /* Must call storage_check_finish likewise; status is final (checked by storage.c). */
  int (*trial_finish)(void *conn, int64_t trial_id, trial_status status, bool has_exit_code,
                      int exit_code, const char *error, double now, nas_err *err);
  /* Must call storage_check_complete on the trial's status and attempts inside the
   * transaction that stores obs[0..n-1] (valid, as metrics_add's) and ends the trial. */
  int (*trial_complete)(void *conn, int64_t trial_id, int attempt, const metric_obs *obs,
                        size_t n, double now, nas_err *err);
  /* Must call storage_check_requeue likewise. */
  int (*trial_requeue)(void *conn, int64_t trial_id, nas_err *err);
  /* Must call storage_check_promote likewise; changes nothing unless the trial is completed
   * at rung (so a retried promotion succeeds without a receipt). */
  int (*trial_promote)(void *conn, int64_t trial_id, int rung, nas_err *err);
  int (*trial_get)(void *conn, int64_t trial_id, trial_row *out, nas_err *err);
  int (*trial_find)(void *conn, int64_t experiment_id, int number, trial_row *out,
                    nas_err *err);
  int (*trial_list)(void *conn, int64_t experiment_id, trial_row **out, size_t *n,
                    nas_err *err);
  /* by_status[s] (zeroed by the caller) gets how many of its trials have status s. */
  int (*trial_counts)(void *conn, int64_t experiment_id, int64_t *by_status, nas_err *err);

  /* obs[0..n-1] are valid (names non-empty, steps >= 0 or METRIC_FINAL). */
  int (*metrics_add)(void *conn, int64_t trial_id, const metric_obs *obs, size_t n,
                     int64_t new_log_offset, nas_err *err);
  int (*metrics_list)(void *conn, int64_t experiment_id, metric_row **out, size_t *n,
                      nas_err *err);
  int (*metrics_of_trial)(void *conn, int64_t trial_id, metric_row **out, size_t *n,
                          nas_err *err);

  /* The scheduler lease. Each is one statement or transaction; take, renew and release
   * are idempotent (a retried take finds its own token and succeeds). */
  int (*lease_take)(void *conn, int64_t experiment_id, const char *token, const char *host,
                    int64_t pid, const char *replaces, double now, nas_err *err);
  int (*lease_renew)(void *conn, int64_t experiment_id, const char *token, double now,
                     nas_err *err);
  int (*lease_release)(void *conn, int64_t experiment_id, const char *token, nas_err *err);
  int (*lease_get)(void *conn, int64_t experiment_id, storage_lease *out, nas_err *err);

  /* Idempotency keys (storage.h). arm makes the next write that is not idempotent
   * (experiment_create, experiment_delete, experiment_import, trials_import, trial_create,
   * trial_start, trial_claim, trial_finish, trial_complete, trial_requeue, metrics_add)
   * commit key, borrowed
   * until armed again, with its result (the id of the experiment or trial it made, deleted,
   * took, changed or added to) in its own transaction; NULL disarms.
   * receipt_find looks a committed key up. */
  void (*receipt_arm)(void *conn, const char *key);
  /* Optional (NULL: a backend that never waits for a server): keeps the watch, which
   * outlives the connection, for storage_backoff_sleep. */
  void (*set_watch)(void *conn, const storage_watch *watch);
  int (*receipt_find)(void *conn, const char *key, bool *found, int64_t *result, nas_err *err);

  /* Group commit (storage.h); NULL in a backend without it. group_begin opens one
   * transaction in which each later write runs as a savepoint, rolled back alone when it
   * fails; group_end commits the whole (commit true) or rolls it back. */
  int (*group_begin)(void *conn, nas_err *err);
  int (*group_end)(void *conn, bool commit, nas_err *err);
} storage_backend;

extern const storage_backend storage_sqlite_backend;
extern const storage_backend storage_postgres_backend;
extern const storage_backend storage_http_backend;

/* How long an operation keeps retrying a storage server it cannot reach: NAS_STORAGE_RETRY_S
 * (seconds, 0 to STORAGE_RETRY_MAX_S; default STORAGE_RETRY_DEFAULT_S), read at open. */
#define STORAGE_RETRY_DEFAULT_S 30.0
/* Receipts and idempotency keys are deleted after a day, so no budget may come near that. */
#define STORAGE_RETRY_MAX_S 3600.0
#define STORAGE_RECEIPT_KEEP_S 86400
int storage_retry_budget(double *seconds, nas_err *err);
/* Sleeps seconds before a retry, asking watch (may be NULL) every STORAGE_WATCH_S; false
 * as soon as it says stop. */
bool storage_backoff_sleep(const storage_watch *watch, double seconds);
/* Puts in front of err (the last try's failure) that the retries were given up on
 * request; returns NAS_ECANCELED. */
int storage_given_up_on_request(nas_err *err);

/* Whether a connection parameter named key (len bytes, decoded) holds a secret: password,
 * sslpassword, any name ending in "password", in "token" (a dashboard link's token) or in
 * "secret" (libpq 18's oauth_client_secret); case aside: masking too much is harmless. */
bool storage_key_is_secret(const char *key, size_t len);
/* For a URI query parameter starting at param (just past its '?' or '&'): when its
 * percent-decoded key is secret, its value as written (*len bytes, up to the next '&' or
 * '#'), else NULL. The one rule of what redaction masks and what pg_conn scrubs from
 * libpq's messages. */
const char *storage_uri_secret_value(const char *param, size_t *len);

/* 128 random bits in hex: receipt tokens and idempotency keys. */
#define STORAGE_TOKEN_LEN 32
int storage_random_token(char out[STORAGE_TOKEN_LEN + 1], nas_err *err);

/* The trial state machine, shared by every backend so the rules cannot drift apart.
 * Each returns NAS_OK when a trial in `current` may make the move, else NAS_ERR with a
 * message naming the current status. */
int storage_check_start(trial_status current, nas_err *err);
int storage_check_finish(trial_status current, trial_status to, nas_err *err);
int storage_check_heartbeat(trial_status current, nas_err *err);
/* NAS_EEXIST unless the trial is running attempt `attempt` (it has made `attempts`). */
int storage_check_complete(trial_status current, int attempts, int attempt, nas_err *err);
int storage_check_requeue(trial_status current, nas_err *err);
int storage_check_promote(trial_status current, nas_err *err);

/* The one statement that takes a lease in both backends, with the placeholders for
 * (experiment id, token, host, pid, now, replaces): inserts it, or overwrites a lease that
 * the taker holds already or that it replaces; else changes nothing. */
#define LEASE_TAKE_SQL(id, token, host, pid, now, replaces)                                  \
  "INSERT INTO scheduler_leases (experiment_id, token, host, pid, started_at, heartbeat_at)" \
  " VALUES (" id ", " token ", " host ", " pid ", " now ", " now ")"                         \
  " ON CONFLICT (experiment_id) DO UPDATE SET token = excluded.token,"                       \
  " host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,"             \
  " heartbeat_at = excluded.heartbeat_at"                                                    \
  " WHERE scheduler_leases.token = " token " OR scheduler_leases.token = " replaces

/* The experiment statuses storage accepts ("running", "finished", "stopped"); a new
 * experiment starts as the first. */
#define STORAGE_EXPERIMENT_STATUS_COUNT 3
extern const char *const storage_experiment_statuses[STORAGE_EXPERIMENT_STATUS_COUNT];

#endif
