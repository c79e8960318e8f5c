/* storage/rows_json.c: storage rows and arguments as JSON (see rows_json.h). */
#include "storage/rows_json.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- numbers ---------------------------------------------------------------------------- */

json_t *rows_json_double(double value) {
  if (isnan(value)) return json_string("NaN");
  if (isinf(value)) return json_string(value > 0 ? "Infinity" : "-Infinity");
  return json_real(value);
}

/* A number, or one of the strings rows_json_double writes; false when it is neither. */
static bool double_of(const json_t *v, double *out) {
  const char *text = json_string_value(v);
  if (json_is_number(v)) *out = json_number_value(v);
  else if (text && strcmp(text, "NaN") == 0) *out = NAN;
  else if (text && strcmp(text, "Infinity") == 0) *out = INFINITY;
  else if (text && strcmp(text, "-Infinity") == 0) *out = -INFINITY;
  else return false;
  return true;
}

/* ---- reading fields ------------------------------------------------------------------------ */

/* The value of key, or NULL after a failure (set here when it is missing and required). */
static const json_t *field(rows_json_reader *r, const char *key, bool required) {
  if (r->rc != NAS_OK) return NULL;
  const json_t *v = json_object_get(r->obj, key);
  if (!v && required) r->rc = nas_errf(r->err, "field '%s' is missing", key);
  return v;
}

static void wrong_type(rows_json_reader *r, const char *key, const char *expected) {
  r->rc = nas_errf(r->err, "field '%s' is not %s", key, expected);
}

void rows_json_int(rows_json_reader *r, const char *key, int64_t *out) {
  const json_t *v = field(r, key, true);
  if (v && json_is_integer(v)) *out = json_integer_value(v);
  else if (v) wrong_type(r, key, "an integer");
}

void rows_json_int32(rows_json_reader *r, const char *key, int *out) {
  int64_t wide = 0;
  rows_json_int(r, key, &wide);
  if (r->rc == NAS_OK && (wide < INT_MIN || wide > INT_MAX))
    r->rc = nas_errf(r->err, "field '%s' is out of range: %" PRId64, key, wide);
  else if (r->rc == NAS_OK)
    *out = (int)wide;
}

void rows_json_number(rows_json_reader *r, const char *key, double *out) {
  const json_t *v = field(r, key, true);
  if (v && !double_of(v, out)) wrong_type(r, key, "a number");
}

void rows_json_bool(rows_json_reader *r, const char *key, bool *out) {
  const json_t *v = field(r, key, true);
  if (v && json_is_boolean(v)) *out = json_is_true(v);
  else if (v) wrong_type(r, key, "true or false");
}

void rows_json_text(rows_json_reader *r, const char *key, bool nullable, const char **out) {
  const json_t *v = field(r, key, !nullable);
  *out = NULL;
  if (v && json_is_string(v)) *out = json_string_value(v);
  else if (v && !(nullable && json_is_null(v))) wrong_type(r, key, "a string");
}

void rows_json_strdup(rows_json_reader *r, const char *key, bool nullable, char **out) {
  const char *text = NULL;
  rows_json_text(r, key, nullable, &text);
  *out = text ? strdup(text) : NULL;
  if (text && !*out) r->rc = nas_errf(r->err, "out of memory");
}

/* Stored text as a JSON string. Text stored before storage refused what is not UTF-8
 * (storage.h) goes out with each bad byte as U+FFFD, rather than failing the whole answer
 * that holds its row. NULL when out of memory. */
static json_t *text_json(const char *text) {
  json_t *value = json_string(text);
  if (value || !text) return value;
  char *repaired = nas_utf8_repaired(text);
  value = repaired ? json_string(repaired) : NULL;
  free(repaired);
  return value;
}

/* A string that may be NULL, as JSON. */
static json_t *text_or_null(const char *text) { return text ? text_json(text) : json_null(); }

/* ---- rows ---------------------------------------------------------------------------------- */

static json_t *experiment_to_json(const void *row) {
  const experiment_row *e = row;
  return json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:o}", "id", (json_int_t)e->id, "name",
                   text_json(e->name), "spec_text", text_json(e->spec_text), "spec_path",
                   text_json(e->spec_path), "run_root", text_json(e->run_root), "status",
                   text_json(e->status), "created_at",
                   rows_json_double(e->created_at));
}

static int experiment_from_json(const json_t *obj, void *row, nas_err *err) {
  experiment_row *e = row;
  rows_json_reader r = {obj, err, NAS_OK};
  memset(e, 0, sizeof *e);
  rows_json_int(&r, "id", &e->id);
  rows_json_strdup(&r, "name", false, &e->name);
  rows_json_strdup(&r, "spec_text", false, &e->spec_text);
  rows_json_strdup(&r, "spec_path", false, &e->spec_path);
  rows_json_strdup(&r, "run_root", false, &e->run_root);
  rows_json_strdup(&r, "status", false, &e->status);
  rows_json_number(&r, "created_at", &e->created_at);
  if (r.rc != NAS_OK) experiment_row_clear(e);
  return r.rc;
}

static void experiment_clear(void *row) { experiment_row_clear(row); }

const rows_json_kind rows_json_experiment = {sizeof(experiment_row), experiment_to_json,
                                             experiment_from_json, experiment_clear};

static json_t *trial_to_json(const void *row) {
  const trial_row *t = row;
  return json_pack(
      "{s:I, s:I, s:i, s:s, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:o, s:o, s:i}", "id",
      (json_int_t)t->id, "experiment_id", (json_int_t)t->experiment_id, "number", t->number,
      "status", trial_status_name(t->status), "params_json", text_json(t->params_json), "attempts",
      t->attempts, "created_at", rows_json_double(t->created_at), "started_at",
      rows_json_double(t->started_at), "finished_at", rows_json_double(t->finished_at),
      "job_id", text_or_null(t->job_id), "exit_code",
      t->has_exit_code ? json_integer(t->exit_code) : json_null(), "error",
      text_or_null(t->error), "log_offset", (json_int_t)t->log_offset, "heartbeat_at",
      rows_json_double(t->heartbeat_at), "reference_json", text_or_null(t->reference_json), "rung",
      t->rung);
}

static int trial_from_json(const json_t *obj, void *row, nas_err *err) {
  trial_row *t = row;
  rows_json_reader r = {obj, err, NAS_OK};
  const char *status = NULL;
  memset(t, 0, sizeof *t);
  rows_json_int(&r, "id", &t->id);
  rows_json_int(&r, "experiment_id", &t->experiment_id);
  rows_json_int32(&r, "number", &t->number);
  rows_json_text(&r, "status", false, &status);
  if (r.rc == NAS_OK && trial_status_parse(status, &t->status) != NAS_OK)
    r.rc = nas_errf(err, "field 'status' is not a trial status: '%s'", status);
  rows_json_strdup(&r, "params_json", false, &t->params_json);
  rows_json_int32(&r, "attempts", &t->attempts);
  rows_json_number(&r, "created_at", &t->created_at);
  rows_json_number(&r, "started_at", &t->started_at);
  rows_json_number(&r, "finished_at", &t->finished_at);
  rows_json_strdup(&r, "job_id", true, &t->job_id);
  const json_t *code = field(&r, "exit_code", true);
  t->has_exit_code = code && !json_is_null(code);
  if (t->has_exit_code) rows_json_int32(&r, "exit_code", &t->exit_code);
  rows_json_strdup(&r, "error", true, &t->error);
  rows_json_int(&r, "log_offset", &t->log_offset);
  rows_json_number(&r, "heartbeat_at", &t->heartbeat_at);
  rows_json_strdup(&r, "reference_json", true, &t->reference_json);
  if (field(&r, "rung", false)) rows_json_int32(&r, "rung", &t->rung); /* absent from older servers */
  if (r.rc != NAS_OK) trial_row_clear(t);
  return r.rc;
}

static void trial_clear(void *row) { trial_row_clear(row); }

const rows_json_kind rows_json_trial = {sizeof(trial_row), trial_to_json, trial_from_json,
                                        trial_clear};

static json_t *metric_to_json(const void *row) {
  const metric_row *m = row;
  return json_pack("{s:I, s:I, s:o, s:I, s:o, s:o}", "id", (json_int_t)m->id, "trial_id",
                   (json_int_t)m->trial_id, "name", text_json(m->name), "step",
                   (json_int_t)m->step,
                   "value", rows_json_double(m->value), "time", rows_json_double(m->time));
}

static void metric_clear(void *row) {
  metric_row *m = row;
  free(m->name);
  m->name = NULL;
}

static int metric_from_json(const json_t *obj, void *row, nas_err *err) {
  metric_row *m = row;
  rows_json_reader r = {obj, err, NAS_OK};
  memset(m, 0, sizeof *m);
  rows_json_int(&r, "id", &m->id);
  rows_json_int(&r, "trial_id", &m->trial_id);
  rows_json_strdup(&r, "name", false, &m->name);
  rows_json_int(&r, "step", &m->step);
  rows_json_number(&r, "value", &m->value);
  rows_json_number(&r, "time", &m->time);
  if (r.rc != NAS_OK) metric_clear(m);
  return r.rc;
}

const rows_json_kind rows_json_metric = {sizeof(metric_row), metric_to_json, metric_from_json,
                                         metric_clear};

static json_t *lease_to_json(const void *row) {
  const storage_lease *l = row;
  return json_pack("{s:o, s:o, s:I, s:o, s:o}", "token", text_json(l->token), "host",
                   text_json(l->host), "pid",
                   (json_int_t)l->pid, "started_at", rows_json_double(l->started_at),
                   "heartbeat_at", rows_json_double(l->heartbeat_at));
}

static int lease_from_json(const json_t *obj, void *row, nas_err *err) {
  storage_lease *l = row;
  rows_json_reader r = {obj, err, NAS_OK};
  memset(l, 0, sizeof *l);
  rows_json_strdup(&r, "token", false, &l->token);
  rows_json_strdup(&r, "host", false, &l->host);
  rows_json_int(&r, "pid", &l->pid);
  rows_json_number(&r, "started_at", &l->started_at);
  rows_json_number(&r, "heartbeat_at", &l->heartbeat_at);
  if (r.rc != NAS_OK) storage_lease_clear(l);
  return r.rc;
}

static void lease_clear(void *row) { storage_lease_clear(row); }

const rows_json_kind rows_json_lease = {sizeof(storage_lease), lease_to_json, lease_from_json,
                                        lease_clear};

json_t *rows_json_array(const rows_json_kind *kind, const void *rows, size_t n) {
  json_t *array = json_array();
  for (size_t i = 0; array && i < n; i++) {
    if (json_array_append_new(array, kind->to_json((const char *)rows + i * kind->size)) != 0) {
      json_decref(array);
      array = NULL;
    }
  }
  return array;
}

int rows_json_array_read(const rows_json_kind *kind, const json_t *array, void **rows, size_t *n,
                         nas_err *err) {
  if (!json_is_array(array)) return nas_errf(err, "expected an array of rows");
  size_t count = json_array_size(array);
  char *out = count ? calloc(count, kind->size) : NULL;
  if (count && !out) return nas_errf(err, "out of memory");
  for (size_t i = 0; i < count; i++) {
    if (kind->from_json(json_array_get(array, i), out + i * kind->size, err) != NAS_OK) {
      for (size_t k = 0; k < i; k++) kind->clear(out + k * kind->size);
      free(out);
      return nas_err_prefix(err, "row %zu", i);
    }
  }
  *rows = out;
  *n = count;
  return NAS_OK;
}

/* ---- a whole experiment ------------------------------------------------------------------ */

json_t *rows_json_image(const storage_experiment_image *img) {
  return json_pack("{s:o, s:o, s:o}", "exp", rows_json_experiment.to_json(img->exp), "trials",
                   rows_json_array(&rows_json_trial, img->trials, img->n_trials), "metrics",
                   rows_json_array(&rows_json_metric, img->metrics, img->n_metrics));
}

int rows_json_image_read(const json_t *obj, rows_json_image_rows *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  int rc = rows_json_experiment.from_json(json_object_get(obj, "exp"), &out->exp, err);
  if (rc != NAS_OK) return nas_err_prefix(err, "field 'exp'");
  rc = rows_json_array_read(&rows_json_trial, json_object_get(obj, "trials"),
                            (void **)&out->trials, &out->n_trials, err);
  if (rc != NAS_OK) nas_err_prefix(err, "field 'trials'");
  if (rc == NAS_OK) {
    rc = rows_json_array_read(&rows_json_metric, json_object_get(obj, "metrics"),
                              (void **)&out->metrics, &out->n_metrics, err);
    if (rc != NAS_OK) nas_err_prefix(err, "field 'metrics'");
  }
  if (rc != NAS_OK) rows_json_image_clear(out);
  return rc;
}

storage_experiment_image rows_json_image_of(const rows_json_image_rows *rows) {
  return (storage_experiment_image){&rows->exp, rows->trials, rows->n_trials, rows->metrics,
                                    rows->n_metrics};
}

void rows_json_image_clear(rows_json_image_rows *rows) {
  experiment_row_clear(&rows->exp);
  trial_rows_free(rows->trials, rows->n_trials);
  metric_rows_free(rows->metrics, rows->n_metrics);
  memset(rows, 0, sizeof *rows);
}

/* ---- observations ---------------------------------------------------------------------------- */

/* The columns of observations: each holds one field of every observation, in order. */
enum { OBS_NAME, OBS_STEP, OBS_VALUE, OBS_TIME, OBS_COLUMNS };
static const struct {
  const char *key;
  const char *expected; /* what each of its values must be, for messages */
} obs_columns[OBS_COLUMNS] = {{"name", "a string"}, {"step", "an integer"},
                              {"value", "a number"}, {"time", "a number"}};

/* Digits of one double in a column of bits (bits_column). */
#define BINARY64_HEX_LEN 16

/* o's double in column c (OBS_VALUE or OBS_TIME), and where reading puts it. */
static double obs_double(const metric_obs *o, size_t c) {
  return c == OBS_VALUE ? o->value : o->time;
}

static double *obs_double_slot(metric_obs *o, size_t c) {
  return c == OBS_VALUE ? &o->value : &o->time;
}

/* o's field in column c, as JSON (NULL when out of memory). */
static json_t *obs_cell(const metric_obs *o, size_t c) {
  switch (c) {
  case OBS_NAME: return json_string(o->name);
  case OBS_STEP: return json_integer((json_int_t)o->step);
  default: return rows_json_double(obs_double(o, c));
  }
}

/* A column of doubles as one string: each value's IEEE 754 binary64 bits as 16 lower-case
 * hex digits, most significant first. Exact like %.17g, and it skips the decimal
 * conversion both ways (glibc's exact printf and strtod were most of a 64-observation
 * report's JSON time); NULL when out of memory. */
static json_t *bits_column(const metric_obs *obs, size_t n, size_t c) {
  static const char digits[] = "0123456789abcdef";
  char *text = malloc(n * BINARY64_HEX_LEN + 1);
  if (!text) return NULL;
  for (size_t i = 0; i < n; i++) {
    double value = obs_double(&obs[i], c);
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    for (int k = BINARY64_HEX_LEN - 1; k >= 0; k--, bits >>= 4)
      text[i * BINARY64_HEX_LEN + (size_t)k] = digits[bits & 0xf];
  }
  json_t *column = json_stringn(text, n * BINARY64_HEX_LEN);
  free(text);
  return column;
}

static json_t *array_column(const metric_obs *obs, size_t n, size_t c) {
  json_t *column = json_array();
  for (size_t i = 0; column && i < n; i++) {
    if (json_array_append_new(column, obs_cell(&obs[i], c)) != 0) {
      json_decref(column);
      column = NULL;
    }
  }
  return column;
}

json_t *rows_json_observations(const metric_obs *obs, size_t n, rows_json_doubles doubles) {
  json_t *cols = json_object();
  for (size_t c = 0; cols && c < OBS_COLUMNS; c++) {
    bool bits = doubles == ROWS_JSON_DOUBLES_BITS && (c == OBS_VALUE || c == OBS_TIME);
    json_t *column = bits ? bits_column(obs, n, c) : array_column(obs, n, c);
    if (json_object_set_new(cols, obs_columns[c].key, column) != 0) {
      json_decref(cols);
      cols = NULL;
    }
  }
  return cols;
}

/* Sets o's field in column c from v; false when v is not what the column holds. */
static bool obs_cell_read(const json_t *v, size_t c, metric_obs *o) {
  switch (c) {
  case OBS_NAME: return (o->name = json_string_value(v)) != NULL;
  case OBS_STEP:
    if (!json_is_integer(v)) return false;
    o->step = json_integer_value(v);
    return true;
  default: return double_of(v, obs_double_slot(o, c));
  }
}

/* The value of one hex digit, or -1. */
static int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

/* A column of doubles written by bits_column into column c of out[0..count-1]. */
static int bits_column_read(const json_t *column, metric_obs *out, size_t count, size_t c,
                            nas_err *err) {
  const char *text = json_string_value(column);
  if (json_string_length(column) != count * BINARY64_HEX_LEN)
    return nas_errf(err, "column '%s' is not %zu hex digits (%zu binary64 values)",
                    obs_columns[c].key, count * BINARY64_HEX_LEN, count);
  for (size_t i = 0; i < count; i++) {
    uint64_t bits = 0;
    for (size_t k = 0; k < BINARY64_HEX_LEN; k++) {
      int digit = hex_digit(text[i * BINARY64_HEX_LEN + k]);
      if (digit < 0)
        return nas_errf(err, "observation %zu: field '%s' is not 16 lower-case hex digits", i,
                        obs_columns[c].key);
      bits = bits << 4 | (uint64_t)digit;
    }
    memcpy(obs_double_slot(&out[i], c), &bits, sizeof bits);
  }
  return NAS_OK;
}

static int array_column_read(const json_t *column, metric_obs *out, size_t count, size_t c,
                             nas_err *err) {
  if (!json_is_array(column) || json_array_size(column) != count)
    return nas_errf(err, "column '%s' is not an array of %zu values", obs_columns[c].key, count);
  for (size_t i = 0; i < count; i++) {
    if (!obs_cell_read(json_array_get(column, i), c, &out[i]))
      return nas_errf(err, "observation %zu: field '%s' is not %s", i, obs_columns[c].key,
                      obs_columns[c].expected);
  }
  return NAS_OK;
}

/* Observations as columns: arrays of count values under every column's key, the doubles'
 * columns either such arrays or bits_column's strings. */
static int observation_columns_read(const json_t *cols, metric_obs *out, size_t count,
                                    nas_err *err) {
  for (size_t c = 0; c < OBS_COLUMNS; c++) {
    const json_t *column = json_object_get(cols, obs_columns[c].key);
    bool bits = (c == OBS_VALUE || c == OBS_TIME) && json_is_string(column);
    int rc = bits ? bits_column_read(column, out, count, c, err)
                  : array_column_read(column, out, count, c, err);
    if (rc != NAS_OK) return rc;
  }
  return NAS_OK;
}

/* Observations as an array of rows {name, step, value, time}: what clients before the
 * columns sent. */
static int observation_rows_read(const json_t *array, metric_obs *out, size_t count,
                                 nas_err *err) {
  for (size_t i = 0; i < count; i++) {
    rows_json_reader r = {json_array_get(array, i), err, NAS_OK};
    rows_json_text(&r, "name", false, &out[i].name);
    rows_json_int(&r, "step", &out[i].step);
    rows_json_number(&r, "value", &out[i].value);
    rows_json_number(&r, "time", &out[i].time);
    if (r.rc != NAS_OK) return nas_err_prefix(err, "observation %zu", i);
  }
  return NAS_OK;
}

int rows_json_observations_read(const json_t *v, metric_obs **obs, size_t *n, nas_err *err) {
  bool rows = json_is_array(v);
  if (!rows && !json_is_object(v))
    return nas_errf(err, "field 'observations' is neither columns nor an array of rows");
  size_t count = rows ? json_array_size(v) : json_array_size(json_object_get(v, obs_columns[OBS_NAME].key));
  metric_obs *out = calloc(count ? count : 1, sizeof *out);
  if (!out) return nas_errf(err, "out of memory");
  int rc = rows ? observation_rows_read(v, out, count, err)
                : observation_columns_read(v, out, count, err);
  if (rc != NAS_OK) {
    free(out);
    return nas_err_prefix(err, "field 'observations'");
  }
  *obs = out;
  *n = count;
  return NAS_OK;
}

/* ---- codes ------------------------------------------------------------------------------------ */

static const struct {
  int code;
  const char *name;
} codes[] = {{NAS_ENOTFOUND, "ENOTFOUND"}, {NAS_EEXIST, "EEXIST"}, {NAS_ECANCELED, "ECANCELED"}};

const char *rows_json_code_name(int code) {
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
    if (codes[i].code == code) return codes[i].name;
  return "ERR";
}

int rows_json_code_parse(const char *name) {
  for (size_t i = 0; name && i < sizeof codes / sizeof *codes; i++)
    if (strcmp(codes[i].name, name) == 0) return codes[i].code;
  return NAS_ERR;
}
