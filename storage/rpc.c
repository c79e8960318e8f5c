/* storage/rpc.c: the server side of the storage RPC (see rpc.h).
 *
 * Each operation reads its arguments from the request's JSON, calls the storage_* function
 * of the same name (so the server applies exactly the checks and transactions a direct
 * client would), and writes its outputs as JSON with rows_json.c, the encoding http.c
 * reads. Exactly-once for retried writes (rpc.h): under a key, the server arms the key, so
 * that the write commits it in its own transaction (sqlite.c, postgres.c), and writes. A
 * key committed before (a retry of a write whose answer was lost, or of one still running
 * for a client that timed out) fails the write: its key collides with the stored one, or
 * the write itself fails first (the trial it would start is running already), and the
 * whole write is rolled back. Only then is the key looked up, and the stored result
 * replayed when found: the lookup is for retries, so a first request, the rule, makes no
 * read beyond its write (one transaction, not two; on PostgreSQL one round trip less). */
#include "storage/rpc.h"

#include <stdlib.h>
#include <string.h>

#include "storage/rows_json.h"

/* What a replayed request answers, from the id its key recorded. */
typedef enum {
  REPLAY_NOTHING, /* {} */
  REPLAY_ID,      /* {"id": id} */
  REPLAY_TRIAL,   /* {"trial": the trial's row now} */
  REPLAY_CHANGED, /* {"changed": whether its recorded result is not 0} */
} replay_kind;

struct storage_rpc_op {
  const char *name;
  bool writes;
  bool keyed;
  replay_kind replay;
  /* Reads args, runs the operation; on success *out (an object made by the caller) gets
   * the outputs. */
  int (*run)(storage *st, rows_json_reader *args, json_t *out, nas_err *err);
};

/* Sets out[key] to value (taking it); NAS_ERR when value is NULL (out of memory). */
static int put(json_t *out, const char *key, json_t *value, nas_err *err) {
  if (value && json_object_set_new(out, key, value) == 0) return NAS_OK;
  return nas_errf(err, "out of memory");
}

/* Puts rows (freed here) as out[key]. */
static int put_rows(json_t *out, const char *key, const rows_json_kind *kind, void *rows,
                    size_t n, nas_err *err) {
  json_t *array = rows_json_array(kind, rows, n);
  for (size_t i = 0; i < n; i++) kind->clear((char *)rows + i * kind->size);
  free(rows);
  return put(out, key, array, err);
}

/* Puts one row (cleared here) as out[key]. */
static int put_row(json_t *out, const char *key, const rows_json_kind *kind, void *row,
                   nas_err *err) {
  json_t *one = kind->to_json(row);
  kind->clear(row);
  return put(out, key, one, err);
}

/* ---- experiments ----------------------------------------------------------------------------- */

/* Says which formats beyond plain JSON this server reads, for the client to choose. */
static int open_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)st, (void)a;
  return put(out, "formats", json_pack("[s]", ROWS_JSON_BITS_FORMAT), err);
}

static int experiment_create_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  const char *name, *spec_text, *spec_path, *run_root;
  rows_json_text(a, "name", false, &name);
  rows_json_text(a, "spec_text", false, &spec_text);
  rows_json_text(a, "spec_path", false, &spec_path);
  rows_json_text(a, "run_root", false, &run_root);
  int64_t id = 0;
  int rc = a->rc != NAS_OK
               ? a->rc
               : storage_experiment_create(st, name, spec_text, spec_path, run_root, &id, err);
  return rc == NAS_OK ? put(out, "id", json_integer(id), err) : rc;
}

static int experiment_get_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  const char *name;
  rows_json_text(a, "name", false, &name);
  experiment_row e;
  int rc = a->rc != NAS_OK ? a->rc : storage_experiment_get(st, name, &e, err);
  return rc == NAS_OK ? put_row(out, "experiment", &rows_json_experiment, &e, err) : rc;
}

static int experiment_list_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)a;
  experiment_row *rows;
  size_t n;
  int rc = storage_experiment_list(st, &rows, &n, err);
  return rc == NAS_OK ? put_rows(out, "experiments", &rows_json_experiment, rows, n, err) : rc;
}

static int experiment_set_status_run(storage *st, rows_json_reader *a, json_t *out,
                                     nas_err *err) {
  int64_t id;
  const char *status;
  rows_json_int(a, "id", &id);
  rows_json_text(a, "status", false, &status);
  bool changed = false;
  int rc = a->rc != NAS_OK ? a->rc : storage_experiment_set_status(st, id, status, &changed, err);
  return rc == NAS_OK ? put(out, "changed", json_boolean(changed), err) : rc;
}

static int experiment_set_spec_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t id;
  const char *spec_text;
  rows_json_int(a, "id", &id);
  rows_json_text(a, "spec_text", false, &spec_text);
  return a->rc != NAS_OK ? a->rc : storage_experiment_set_spec(st, id, spec_text, err);
}

static int experiment_delete_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t id;
  rows_json_int(a, "id", &id);
  return a->rc != NAS_OK ? a->rc : storage_experiment_delete(st, id, err);
}

static int experiment_rename_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t id;
  const char *new_name, *spec_text;
  rows_json_int(a, "id", &id);
  rows_json_text(a, "new_name", false, &new_name);
  rows_json_text(a, "spec_text", false, &spec_text);
  return a->rc != NAS_OK ? a->rc : storage_experiment_rename(st, id, new_name, spec_text, err);
}

/* The arguments are the image's fields (rows_json_image). */
static int experiment_import_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  rows_json_image_rows rows;
  int rc = rows_json_image_read(a->obj, &rows, err);
  if (rc != NAS_OK) return rc;
  storage_experiment_image img = rows_json_image_of(&rows);
  int64_t id = 0;
  rc = storage_experiment_import(st, &img, &id, err);
  rows_json_image_clear(&rows);
  return rc == NAS_OK ? put(out, "id", json_integer(id), err) : rc;
}

static int trials_import_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t experiment_id;
  trial_row *trials = NULL;
  size_t n = 0;
  rows_json_int(a, "experiment_id", &experiment_id);
  if (a->rc != NAS_OK) return a->rc;
  int rc = rows_json_array_read(&rows_json_trial, json_object_get(a->obj, "trials"),
                                (void **)&trials, &n, err);
  if (rc != NAS_OK) return nas_err_prefix(err, "field 'trials'");
  rc = storage_trials_import(st, experiment_id, trials, n, err);
  trial_rows_free(trials, n);
  return rc;
}

/* ---- trials ------------------------------------------------------------------------------------ */

static int trial_create_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id;
  const char *params_json, *reference_json;
  rows_json_int(a, "experiment_id", &experiment_id);
  rows_json_text(a, "params_json", false, &params_json);
  rows_json_text(a, "reference_json", true, &reference_json);
  trial_row t;
  int rc = a->rc != NAS_OK ? a->rc
                           : storage_trial_create(st, experiment_id, params_json,
                                                  reference_json, &t, err);
  return rc == NAS_OK ? put_row(out, "trial", &rows_json_trial, &t, err) : rc;
}

static int trial_start_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id;
  const char *job_id;
  rows_json_int(a, "trial_id", &trial_id);
  rows_json_text(a, "job_id", false, &job_id);
  return a->rc != NAS_OK ? a->rc : storage_trial_start(st, trial_id, job_id, err);
}

static int trial_claim_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id;
  const char *worker;
  rows_json_int(a, "experiment_id", &experiment_id);
  rows_json_text(a, "worker", false, &worker);
  trial_row t;
  int rc = a->rc != NAS_OK ? a->rc : storage_trial_claim(st, experiment_id, worker, &t, err);
  return rc == NAS_OK ? put_row(out, "trial", &rows_json_trial, &t, err) : rc;
}

static int trial_heartbeat_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id;
  rows_json_int(a, "trial_id", &trial_id);
  return a->rc != NAS_OK ? a->rc : storage_trial_heartbeat(st, trial_id, err);
}

static int trial_finish_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id;
  int exit_code = 0;
  const char *status_name, *error;
  bool has_exit_code = false;
  trial_status status = TRIAL_FAILED;
  rows_json_int(a, "trial_id", &trial_id);
  rows_json_text(a, "status", false, &status_name);
  rows_json_bool(a, "has_exit_code", &has_exit_code);
  if (has_exit_code) rows_json_int32(a, "exit_code", &exit_code);
  rows_json_text(a, "error", true, &error);
  if (a->rc == NAS_OK && trial_status_parse(status_name, &status) != NAS_OK)
    a->rc = nas_errf(err, "field 'status' is not a trial status: '%s'", status_name);
  return a->rc != NAS_OK ? a->rc
                         : storage_trial_finish(st, trial_id, status, has_exit_code,
                                                exit_code, error, err);
}

static int trial_complete_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id;
  int attempt;
  rows_json_int(a, "trial_id", &trial_id);
  rows_json_int32(a, "attempt", &attempt);
  metric_obs *obs = NULL;
  size_t n = 0;
  if (a->rc != NAS_OK) return a->rc;
  int rc = rows_json_observations_read(json_object_get(a->obj, "observations"), &obs, &n, err);
  if (rc == NAS_OK) rc = storage_trial_complete(st, trial_id, attempt, obs, n, err);
  free(obs);
  return rc;
}

static int trial_requeue_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id;
  rows_json_int(a, "trial_id", &trial_id);
  return a->rc != NAS_OK ? a->rc : storage_trial_requeue(st, trial_id, err);
}

static int trial_promote_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id;
  int rung;
  rows_json_int(a, "trial_id", &trial_id);
  rows_json_int32(a, "rung", &rung);
  return a->rc != NAS_OK ? a->rc : storage_trial_promote(st, trial_id, rung, err);
}

static int trial_get_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t trial_id;
  rows_json_int(a, "trial_id", &trial_id);
  trial_row t;
  int rc = a->rc != NAS_OK ? a->rc : storage_trial_get(st, trial_id, &t, err);
  return rc == NAS_OK ? put_row(out, "trial", &rows_json_trial, &t, err) : rc;
}

static int trial_find_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id;
  int number;
  rows_json_int(a, "experiment_id", &experiment_id);
  rows_json_int32(a, "number", &number);
  if (a->rc == NAS_OK && number < 0) a->rc = nas_errf(err, "field 'number' is not a trial number");
  trial_row t;
  int rc = a->rc != NAS_OK ? a->rc : storage_trial_find(st, experiment_id, number, &t, err);
  return rc == NAS_OK ? put_row(out, "trial", &rows_json_trial, &t, err) : rc;
}

static int trial_counts_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id, by_status[TRIAL_STATUS_COUNT];
  rows_json_int(a, "experiment_id", &experiment_id);
  int rc = a->rc != NAS_OK ? a->rc : storage_trial_counts(st, experiment_id, by_status, err);
  json_t *counts = rc == NAS_OK ? json_object() : NULL;
  for (int s = 0; counts && s < TRIAL_STATUS_COUNT; s++)
    if (json_object_set_new(counts, trial_status_name((trial_status)s),
                            json_integer((json_int_t)by_status[s])) != 0) {
      json_decref(counts);
      counts = NULL;
    }
  if (rc == NAS_OK && (!counts || json_object_set_new(out, "counts", counts) != 0))
    rc = nas_errf(err, "out of memory");
  return rc;
}

static int trial_list_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id;
  rows_json_int(a, "experiment_id", &experiment_id);
  trial_row *rows;
  size_t n;
  int rc = a->rc != NAS_OK ? a->rc : storage_trial_list(st, experiment_id, &rows, &n, err);
  return rc == NAS_OK ? put_rows(out, "trials", &rows_json_trial, rows, n, err) : rc;
}

/* ---- metrics ---------------------------------------------------------------------------------- */

static int metrics_add_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t trial_id, new_log_offset;
  rows_json_int(a, "trial_id", &trial_id);
  rows_json_int(a, "new_log_offset", &new_log_offset);
  metric_obs *obs = NULL;
  size_t n = 0;
  if (a->rc != NAS_OK) return a->rc;
  int rc = rows_json_observations_read(json_object_get(a->obj, "observations"), &obs, &n, err);
  if (rc == NAS_OK) rc = storage_metrics_add(st, trial_id, obs, n, new_log_offset, err);
  free(obs);
  return rc;
}

static int metrics_list_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id;
  rows_json_int(a, "experiment_id", &experiment_id);
  metric_row *rows;
  size_t n;
  int rc = a->rc != NAS_OK ? a->rc : storage_metrics_list(st, experiment_id, &rows, &n, err);
  return rc == NAS_OK ? put_rows(out, "metrics", &rows_json_metric, rows, n, err) : rc;
}

static int metrics_of_trial_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t trial_id;
  rows_json_int(a, "trial_id", &trial_id);
  metric_row *rows;
  size_t n;
  int rc = a->rc != NAS_OK ? a->rc : storage_metrics_of_trial(st, trial_id, &rows, &n, err);
  return rc == NAS_OK ? put_rows(out, "metrics", &rows_json_metric, rows, n, err) : rc;
}

/* ---- the scheduler lease -------------------------------------------------------------------- */

static int lease_take_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t experiment_id, pid;
  const char *token, *host, *replaces;
  rows_json_int(a, "experiment_id", &experiment_id);
  rows_json_text(a, "token", false, &token);
  rows_json_text(a, "host", false, &host);
  rows_json_int(a, "pid", &pid);
  rows_json_text(a, "replaces", true, &replaces);
  return a->rc != NAS_OK
             ? a->rc
             : storage_lease_take(st, experiment_id, token, host, pid, replaces, err);
}

/* renew and release take the same arguments. */
static int lease_token_args(rows_json_reader *a, int64_t *experiment_id, const char **token) {
  rows_json_int(a, "experiment_id", experiment_id);
  rows_json_text(a, "token", false, token);
  return a->rc;
}

static int lease_renew_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t experiment_id;
  const char *token;
  return lease_token_args(a, &experiment_id, &token) != NAS_OK
             ? a->rc
             : storage_lease_renew(st, experiment_id, token, err);
}

static int lease_release_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  (void)out;
  int64_t experiment_id;
  const char *token;
  return lease_token_args(a, &experiment_id, &token) != NAS_OK
             ? a->rc
             : storage_lease_release(st, experiment_id, token, err);
}

static int lease_get_run(storage *st, rows_json_reader *a, json_t *out, nas_err *err) {
  int64_t experiment_id;
  rows_json_int(a, "experiment_id", &experiment_id);
  storage_lease l;
  int rc = a->rc != NAS_OK ? a->rc : storage_lease_get(st, experiment_id, &l, err);
  return rc == NAS_OK ? put_row(out, "lease", &rows_json_lease, &l, err) : rc;
}

/* ---- the table ------------------------------------------------------------------------------- */

/* "open" answers {"formats": [...]} once the request is authorised and the server has a
 * storage connection: the http backend opens with it. */
static const storage_rpc_op ops[] = {
    {"open", false, false, REPLAY_NOTHING, open_run},
    {"experiment_create", true, true, REPLAY_ID, experiment_create_run},
    {"experiment_get", false, false, REPLAY_NOTHING, experiment_get_run},
    {"experiment_list", false, false, REPLAY_NOTHING, experiment_list_run},
    {"experiment_set_status", true, true, REPLAY_CHANGED, experiment_set_status_run},
    {"experiment_set_spec", true, false, REPLAY_NOTHING, experiment_set_spec_run},
    {"experiment_delete", true, true, REPLAY_NOTHING, experiment_delete_run},
    {"experiment_rename", true, false, REPLAY_NOTHING, experiment_rename_run},
    {"experiment_import", true, true, REPLAY_ID, experiment_import_run},
    {"trials_import", true, true, REPLAY_NOTHING, trials_import_run},
    {"trial_create", true, true, REPLAY_TRIAL, trial_create_run},
    {"trial_start", true, true, REPLAY_NOTHING, trial_start_run},
    {"trial_claim", true, true, REPLAY_TRIAL, trial_claim_run},
    {"trial_heartbeat", true, false, REPLAY_NOTHING, trial_heartbeat_run},
    {"trial_finish", true, true, REPLAY_NOTHING, trial_finish_run},
    {"trial_complete", true, true, REPLAY_NOTHING, trial_complete_run},
    {"trial_requeue", true, true, REPLAY_NOTHING, trial_requeue_run},
    {"trial_promote", true, false, REPLAY_NOTHING, trial_promote_run},
    {"trial_get", false, false, REPLAY_NOTHING, trial_get_run},
    {"trial_find", false, false, REPLAY_NOTHING, trial_find_run},
    {"trial_list", false, false, REPLAY_NOTHING, trial_list_run},
    {"trial_counts", false, false, REPLAY_NOTHING, trial_counts_run},
    {"metrics_add", true, true, REPLAY_NOTHING, metrics_add_run},
    {"metrics_list", false, false, REPLAY_NOTHING, metrics_list_run},
    {"metrics_of_trial", false, false, REPLAY_NOTHING, metrics_of_trial_run},
    {"lease_take", true, false, REPLAY_NOTHING, lease_take_run},
    {"lease_renew", true, false, REPLAY_NOTHING, lease_renew_run},
    {"lease_release", true, false, REPLAY_NOTHING, lease_release_run},
    {"lease_get", false, false, REPLAY_NOTHING, lease_get_run},
};

const storage_rpc_op *storage_rpc_find(const char *name) {
  for (size_t i = 0; name && i < sizeof ops / sizeof *ops; i++)
    if (strcmp(ops[i].name, name) == 0) return &ops[i];
  return NULL;
}

bool storage_rpc_writes(const storage_rpc_op *op) { return op->writes; }

bool storage_rpc_keyed(const storage_rpc_op *op) { return op->keyed; }

/* ---- serving ------------------------------------------------------------------------------------ */

/* The reply of a request whose key a write committed with result. */
static int replay(storage *st, const storage_rpc_op *op, int64_t result, json_t *out,
                  nas_err *err) {
  if (op->replay == REPLAY_ID) return put(out, "id", json_integer(result), err);
  if (op->replay == REPLAY_CHANGED) return put(out, "changed", json_boolean(result != 0), err);
  if (op->replay == REPLAY_NOTHING) return NAS_OK;
  trial_row t;
  int rc = storage_trial_get(st, result, &t, err);
  return rc == NAS_OK ? put_row(out, "trial", &rows_json_trial, &t, err) : rc;
}

/* Runs op under key, armed for the write; a failed write whose key was committed before
 * is answered from it (see the top of this file). */
static int run_keyed(storage *st, const storage_rpc_op *op, const char *key,
                     rows_json_reader *args, json_t *out, nas_err *err) {
  int rc = storage_receipt_arm(st, key, err);
  if (rc != NAS_OK) return rc;
  rc = op->run(st, args, out, err);
  storage_receipt_arm(st, NULL, NULL);
  if (rc == NAS_OK) return NAS_OK;
  bool found = false;
  int64_t result = 0;
  nas_err again;
  if (storage_receipt_find(st, key, &found, &result, &again) == NAS_OK && found) {
    json_object_clear(out);
    return replay(st, op, result, out, err);
  }
  return rc;
}

int storage_rpc_serve(storage *st, const storage_rpc_op *op, const char *key,
                      const json_t *args, json_t **reply) {
  nas_err err = {{0}};
  json_t *out = json_object();
  int rc = out ? NAS_OK : nas_errf(&err, "out of memory");
  rows_json_reader reader = {args, &err, NAS_OK};
  if (rc == NAS_OK && !json_is_object(args)) rc = nas_errf(&err, "the body must be a JSON object");
  if (rc == NAS_OK) {
    storage_bare_errors(st, true);
    rc = op->keyed && key ? run_keyed(st, op, key, &reader, out, &err)
                          : op->run(st, &reader, out, &err);
    storage_bare_errors(st, false);
  }
  if (rc == NAS_OK) {
    *reply = out;
    return NAS_OK;
  }
  json_decref(out);
  *reply = json_pack("{s:s, s:s}", "error", err.msg, "code", rows_json_code_name(rc));
  return rc;
}
