/* storage/rows_json.h: storage rows and arguments as JSON, the one encoding of the storage
 * RPC (internal to storage/: rpc.c serves it, http.c is its client).
 *
 * Every field of a row travels under its C name. Doubles go with 17 significant digits, so
 * they read back bit for bit, and the values JSON has no numbers for as strings: "NaN",
 * "Infinity", "-Infinity". Optional strings are JSON null when absent. */
#ifndef NAS_STORAGE_ROWS_JSON_H
#define NAS_STORAGE_ROWS_JSON_H

#include <jansson.h>

#include "storage/storage.h"

/* How json_dumps writes a message of the RPC. */
#define ROWS_JSON_DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(17))

/* A double as JSON (NULL only when out of memory). */
json_t *rows_json_double(double value);

/* Reads the fields of one JSON object; the first failure is kept (rc, and err's message
 * naming the field) and every later read does nothing, so a caller reads every field and
 * checks rc once. */
typedef struct {
  const json_t *obj; /* borrowed */
  nas_err *err;
  int rc;
} rows_json_reader;

void rows_json_int(rows_json_reader *r, const char *key, int64_t *out);
/* An integer that fits an int (trial numbers, rungs, attempts, exit codes): one beyond it
 * is refused, never cut to another value. */
void rows_json_int32(rows_json_reader *r, const char *key, int *out);
void rows_json_number(rows_json_reader *r, const char *key, double *out);
void rows_json_bool(rows_json_reader *r, const char *key, bool *out);
/* Borrowed from the JSON; with nullable, null (or a missing key) reads as NULL. */
void rows_json_text(rows_json_reader *r, const char *key, bool nullable, const char **out);
/* Owned copy, as rows_json_text. */
void rows_json_strdup(rows_json_reader *r, const char *key, bool nullable, char **out);

/* One kind of row: its size, its JSON form, and how to free what a row owns. */
typedef struct rows_json_kind {
  size_t size;
  json_t *(*to_json)(const void *row);
  int (*from_json)(const json_t *obj, void *row, nas_err *err); /* leaves it cleared on failure */
  void (*clear)(void *row);
} rows_json_kind;

extern const rows_json_kind rows_json_experiment, rows_json_trial, rows_json_metric,
    rows_json_lease;

/* rows[0..n-1] as a JSON array (NULL when out of memory). */
json_t *rows_json_array(const rows_json_kind *kind, const void *rows, size_t n);
/* A JSON array into an owned array of rows (NULL when empty). */
int rows_json_array_read(const rows_json_kind *kind, const json_t *array, void **rows, size_t *n,
                         nas_err *err);

/* A whole experiment (storage_experiment_image) as {"exp", "trials", "metrics"}: its
 * experiment row and arrays of its rows (NULL when out of memory). */
json_t *rows_json_image(const storage_experiment_image *img);
/* Such an object read back into owned rows (cleared on failure), and the image of them
 * (borrowing them). */
typedef struct {
  experiment_row exp;
  trial_row *trials;
  size_t n_trials;
  metric_row *metrics;
  size_t n_metrics;
} rows_json_image_rows;
int rows_json_image_read(const json_t *obj, rows_json_image_rows *out, nas_err *err);
storage_experiment_image rows_json_image_of(const rows_json_image_rows *rows);
void rows_json_image_clear(rows_json_image_rows *rows);

/* How the columns of doubles travel: arrays of JSON numbers (what every server reads), or
 * strings of the values' bits (what servers that say so in `open`'s answer read). */
typedef enum { ROWS_JSON_DOUBLES_NUMBERS, ROWS_JSON_DOUBLES_BITS } rows_json_doubles;
/* The name of the bits format in `open`'s answer ("formats"). */
#define ROWS_JSON_BITS_FORMAT "binary64-hex"

/* Observations as columns, {"name": [...], "step": [...], "value": ..., "time": ...}
 * (each value once, under no key of its own: a report of 64 observations is read in less
 * than half the time of 64 row objects); "value" and "time" are arrays of numbers, or with
 * ROWS_JSON_DOUBLES_BITS strings of 16 hex digits a value (its IEEE 754 binary64 bits,
 * most significant first). NULL when out of memory. */
json_t *rows_json_observations(const metric_obs *obs, size_t n, rows_json_doubles doubles);
/* Such columns (either form of doubles), or an array of rows {name, step, value, time}
 * (what clients sent before the columns), into an owned array; names are borrowed from the
 * JSON. */
int rows_json_observations_read(const json_t *v, metric_obs **obs, size_t *n, nas_err *err);

/* The storage codes by name ("ENOTFOUND", "EEXIST", "ERR"), and back (unknown: NAS_ERR). */
const char *rows_json_code_name(int code);
int rows_json_code_parse(const char *name);

#endif
