/* scheduler/views.c: an experiment's results as JSON, the one form both the CLI (`nas
 * status`, `nas pareto` and `nas trial` --format json, `nas export`) and `nas serve` give
 * out, so the two never disagree: the Pareto front with its reference point and
 * hypervolume, one trial (in brief, or in full with its curves, log tails and model), an
 * experiment's summary (and the list of them), and the whole experiment as an export.
 * Numbers never reported are null; objective values are in their own direction. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scheduler/internal.h"

json_t *sched_json_number(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *sched_point_json(const spec *s, const double *ref) {
  json_t *point = json_object();
  for (size_t j = 0; point && j < s->n_objectives; j++)
    json_object_set_new(point, s->objectives[j].name,
                        json_real(s->objectives[j].goal == GOAL_MAXIMIZE ? -ref[j] : ref[j]));
  return point;
}

static int cmp_by_key(const void *a, const void *b, void *ctx) {
  const double *key = ctx;
  double x = key[*(const size_t *)a], y = key[*(const size_t *)b];
  return (x > y) - (x < y);
}

/* One front row: trial, each objective, each parameter (null where inactive). */
static json_t *front_row(const spec *s, const sched_results *r, size_t i) {
  json_t *row = json_pack("{s:i}", "trial", r->trials[i].number);
  json_t *params = json_loads(r->trials[i].params_json, 0, NULL);
  for (size_t j = 0; row && j < s->n_objectives; j++)
    json_object_set_new(row, s->objectives[j].name, sched_json_number(r->values[i * r->n_metrics + j]));
  for (size_t p = 0; row && p < s->n_params; p++) {
    json_t *v = json_object_get(params, s->params[p].name);
    json_object_set_new(row, s->params[p].name, v ? json_incref(v) : json_null());
  }
  json_decref(params);
  return row;
}

json_t *sched_pareto_json(const spec *s, const experiment_row *exp, const sched_results *r,
                          nas_err *err) {
  size_t *front = NULL, n_front = 0;
  double hv, *ref = calloc(s->n_objectives ? s->n_objectives : 1, sizeof *ref);
  double *key = malloc((r->n_trials ? r->n_trials : 1) * sizeof *key);
  if (!ref || !key || sched_front(s, r, &front, &n_front, &hv, ref, err) != NAS_OK) {
    if (!ref || !key) nas_errf(err, "out of memory");
    free(ref), free(key);
    return NULL;
  }
  /* Sorted by the first objective, as a trade-off is read. */
  for (size_t i = 0; i < r->n_trials; i++) key[i] = r->values[i * r->n_metrics];
  qsort_r(front, n_front, sizeof *front, cmp_by_key, key);
  json_t *refs = sched_point_json(s, ref), *rows = json_array();
  for (size_t k = 0; rows && k < n_front; k++)
    json_array_append_new(rows, front_row(s, r, front[k]));
  json_t *out = json_pack("{s:s, s:o, s:o, s:o}", "experiment", exp->name, "hypervolume",
                          sched_json_number(hv),
                          "reference_point", refs, "front", rows);
  free(front), free(ref), free(key);
  if (!out) nas_errf(err, "out of memory");
  return out;
}

static json_t *time_or_null(double t) { return t > 0 ? json_real(t) : json_null(); }

/* Rows of Y (the completed feasible trials idx) replaced by the model's means, minimisation
 * convention; key[t] gets trial t's mean of the first objective, to sort by. */
static void use_model_means(const spec *s, const double *means, const size_t *idx, size_t n,
                            double *Y, double *key) {
  size_t m = s->n_objectives;
  for (size_t k = 0; k < n; k++) {
    pareto_objectives_to_min(s, means + idx[k] * m, Y + k * m);
    key[idx[k]] = means[idx[k] * m];
  }
}

static json_t *model_row(const spec *s, const sched_results *r, const double *means, size_t t) {
  json_t *row = front_row(s, r, t), *model = json_object();
  for (size_t j = 0; model && j < s->n_objectives; j++)
    json_object_set_new(model, s->objectives[j].name,
                        sched_json_number(means[t * s->n_objectives + j]));
  if (row && model && json_object_set_new(row, "model", model) == 0) return row;
  json_decref(row);
  return NULL;
}

json_t *sched_model_front_json(const spec *s, const sched_results *r, nas_err *err) {
  size_t m = s->n_objectives, n = 0, *idx = NULL;
  double *Y = NULL, *means = malloc((r->n_trials * m + 1) * sizeof *means);
  double *key = malloc((r->n_trials + 1) * sizeof *key);
  bool *on_front = malloc((r->n_trials + 1) * sizeof *on_front);
  json_t *rows = NULL;
  if (!means || !key || !on_front) nas_errf(err, "out of memory");
  else if (sched_model_means(s, r, means, err) == NAS_OK &&
           sched_completed_points(s, r, &Y, &idx, &n, err) == NAS_OK) {
    use_model_means(s, means, idx, n, Y, key);
    pareto_mask(Y, n, m, on_front);
    size_t f = 0;
    for (size_t k = 0; k < n; k++)
      if (on_front[k]) idx[f++] = idx[k];
    qsort_r(idx, f, sizeof *idx, cmp_by_key, key);
    rows = json_array();
    for (size_t k = 0; rows && k < f; k++)
      if (json_array_append_new(rows, model_row(s, r, means, idx[k])) != 0) {
        json_decref(rows);
        rows = NULL;
      }
    if (!rows) nas_errf(err, "out of memory");
  }
  free(means), free(key), free(on_front), free(Y), free(idx);
  return rows;
}

json_t *sched_trial_json(const sched_results *r, size_t i) {
  const trial_row *t = &r->trials[i];
  json_t *metrics = json_object();
  for (size_t m = 0; metrics && m < r->n_metrics; m++) {
    double v = r->values[i * r->n_metrics + m];
    if (!isnan(v)) json_object_set_new(metrics, r->metric_names[m], json_real(v));
  }
  json_t *params = json_loads(t->params_json, 0, NULL);
  json_t *reference = t->reference_json ? json_loads(t->reference_json, 0, NULL) : NULL;
  return json_pack("{s:i, s:s, s:o, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:i}", "number",
                   t->number, "status", trial_status_name(t->status), "params",
                   params ? params : json_object(), "metrics", metrics, "attempts",
                   t->attempts, "created_at", time_or_null(t->created_at), "started_at",
                   time_or_null(t->started_at), "finished_at", time_or_null(t->finished_at),
                   "error", t->error ? json_string(t->error) : json_null(), "reference_point",
                   reference ? reference : json_null(), "heartbeat_at",
                   time_or_null(t->heartbeat_at), "rung", t->rung);
}

static json_t *counts_json(const sched_results *r) {
  int by[TRIAL_STATUS_COUNT] = {0};
  for (size_t i = 0; i < r->n_trials; i++) by[r->trials[i].status]++;
  json_t *counts = json_object();
  for (int st = 0; counts && st < TRIAL_STATUS_COUNT; st++)
    json_object_set_new(counts, trial_status_name((trial_status)st), json_integer(by[st]));
  return counts;
}

/* text (owned, freed) with every occurrence of what replaced by with; NULL when out of
 * memory. */
static char *replaced_everywhere(char *text, const char *what, const char *with) {
  size_t what_len = strlen(what);
  for (char *at = text && what_len ? strstr(text, what) : NULL; at; ) {
    size_t offset = (size_t)(at - text) + strlen(with);
    char *next = nas_asprintf("%.*s%s%s", (int)(at - text), text, with, at + what_len);
    free(text);
    if (!(text = next)) return NULL;
    at = strstr(text + offset, what);
  }
  return text;
}

/* The spec's text as shown to anyone who may read the experiment (the API, the dashboard,
 * nas plot's page): its storage line's password masked, and its webhooks' URLs as
 * spec_url_shown gives them (a Slack webhook's path is its secret). Owned; NULL when out
 * of memory. */
static char *spec_text_shown(const spec *s, const char *text) {
  char *shown = strdup(text), *masked = storage_url_redacted(s->storage);
  if (!masked) {
    free(shown);
    return NULL;
  }
  if (strcmp(masked, s->storage) != 0) shown = replaced_everywhere(shown, s->storage, masked);
  free(masked);
  for (size_t i = 0; shown && i < s->n_notify; i++) {
    char *url = spec_url_shown(s->notify[i].url);
    shown = url ? replaced_everywhere(shown, s->notify[i].url, url) : (free(shown), NULL);
    free(url);
  }
  return shown;
}

json_t *sched_experiment_json(storage *st, const spec *s, const experiment_row *exp,
                              const sched_results *r, const json_t *known_pareto, nas_err *err) {
  sched_liveness alive;
  char *holder;
  if (sched_scheduler_state(st, exp, &alive, &holder, err) != NAS_OK) return NULL;
  json_t *pareto = known_pareto ? json_incref((json_t *)known_pareto) : sched_pareto_json(s, exp, r, err);
  if (!pareto) {
    free(holder);
    return NULL;
  }
  size_t ended = 0;
  double updated = exp->created_at;
  for (size_t i = 0; i < r->n_trials; i++) {
    const trial_row *t = &r->trials[i];
    ended += trial_status_final(t->status);
    updated = fmax(updated, fmax(t->created_at, fmax(t->started_at, fmax(t->finished_at, t->heartbeat_at))));
  }
  /* One objective: its best value, the front's one row (null before any completes). */
  const json_t *first = json_array_get(json_object_get(pareto, "front"), 0);
  json_t *best = s->n_objectives == 1 && first
                     ? json_pack("{s:O}", s->objectives[0].name, json_object_get(first, s->objectives[0].name))
                     : json_null();
  char *text = spec_text_shown(s, exp->spec_text);
  json_t *out = !text ? NULL : json_pack(
      "{s:s, s:s, s:f, s:s, s:s, s:i, s:o, s:{s:i, s:i, s:f}, s:f, s:o, s:O, s:i, s:{s:s, s:o}}",
      "name", exp->name, "status", exp->status, "created_at", exp->created_at, "spec",
      text, "spec_path", exp->spec_path, "trials", (int)r->n_trials, "counts",
      counts_json(r), "progress", "ended", (int)ended, "budget", s->budget.max_trials,
      "fraction", s->budget.max_trials > 0 ? (double)ended / s->budget.max_trials : 0.0,
      "updated_at", updated, "best", best,
      "hypervolume", json_object_get(pareto, "hypervolume"), "front_size",
      (int)json_array_size(json_object_get(pareto, "front")), "scheduler", "state",
      sched_liveness_name(alive), "holder", holder ? json_string(holder) : json_null());
  if (!text) json_decref(best);
  json_decref(pareto);
  free(holder);
  free(text);
  if (!out) nas_errf(err, "out of memory");
  return out;
}

/* One experiment's entry in the list, from its row: its spec parsed once. One whose stored
 * spec does not load (written by another version of nas, or through the storage RPC) gets
 * what its row says, and why. */
static int experiment_list_entry(storage *st, const experiment_row *exp, json_t **out,
                                 nas_err *err) {
  spec *s = NULL;
  nas_err why;
  if (sched_experiment_spec(exp, &s, &why) != NAS_OK) {
    spec_free(s);
    *out = json_pack("{s:s, s:s, s:f, s:s}", "name", exp->name, "status", exp->status,
                     "created_at", exp->created_at, "error", why.msg);
    return *out ? NAS_OK : nas_errf(err, "out of memory");
  }
  sched_results r;
  int rc = sched_results_load(st, s, exp->id, &r, err);
  if (rc == NAS_OK) {
    *out = sched_experiment_json(st, s, exp, &r, NULL, err);
    if (!*out) rc = NAS_ERR;
    sched_results_free(&r);
  }
  spec_free(s);
  return rc;
}

int sched_experiment_list_json(storage *st, json_t **out, nas_err *err) {
  experiment_row *rows;
  size_t n;
  *out = NULL;
  int rc = storage_experiment_list(st, &rows, &n, err);
  if (rc != NAS_OK) return rc;
  json_t *list = json_array();
  if (!list) rc = nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    json_t *one = NULL;
    rc = experiment_list_entry(st, &rows[i], &one, err);
    if (rc == NAS_OK && json_array_append_new(list, one) != 0) rc = nas_errf(err, "out of memory");
  }
  experiment_rows_free(rows, n);
  if (rc == NAS_OK && !(*out = json_pack("{s:o}", "experiments", list)))
    return nas_errf(err, "out of memory"); /* json_pack took list even so */
  if (rc != NAS_OK) json_decref(list);
  return rc;
}

/* ---- one trial in full ----------------------------------------------------------------- */

/* The intermediate values among rows (observations of one trial, or of several: rows of
 * other trials are skipped): {metric: [[step, value, time], …]} in the order reported. */
static json_t *intermediate_json(const metric_row *rows, size_t n, int64_t trial_id) {
  json_t *curves = json_object();
  for (size_t i = 0; curves && i < n; i++) {
    if (rows[i].trial_id != trial_id || rows[i].step == METRIC_FINAL) continue;
    json_t *points = json_object_get(curves, rows[i].name);
    if (!points) json_object_set_new(curves, rows[i].name, points = json_array());
    json_array_append_new(points, json_pack("[I, o, f]", (json_int_t)rows[i].step,
                                            sched_json_number(rows[i].value), rows[i].time));
  }
  return curves;
}

/* Only the tail is read: a training log may hold gigabytes, and the server answers this
 * for any reader. */
char *sched_log_tail(const char *run_dir, const char *name, size_t *len) {
  char *path = nas_asprintf("%s/%s", run_dir, name), *text = malloc(SCHED_LOG_TAIL_BYTES + 1);
  int fd = -1;
  int64_t size = 0;
  nas_err ignored;
  ssize_t got = -1;
  if (path && text && nas_open_regular(path, &fd, &size, &ignored) == NAS_OK) {
    int64_t from = size > SCHED_LOG_TAIL_BYTES ? size - SCHED_LOG_TAIL_BYTES : 0;
    got = pread(fd, text, SCHED_LOG_TAIL_BYTES, (off_t)from);
    close(fd);
  }
  free(path);
  if (got < 0) {
    free(text);
    return NULL;
  }
  size_t start = 0;
  while (start < (size_t)got && ((unsigned char)text[start] & 0xC0) == 0x80)
    start++; /* a cut character */
  *len = (size_t)got - start;
  memmove(text, text + start, *len);
  text[*len] = '\0';
  return text;
}

/* The tail of run_dir/name as a JSON string, or null when it cannot be read or is not text. */
static json_t *log_tail(const char *run_dir, const char *name) {
  size_t len;
  char *text = sched_log_tail(run_dir, name, &len);
  json_t *tail = text ? json_stringn(text, len) : NULL; /* NULL when not UTF-8 */
  free(text);
  return tail ? tail : json_null();
}

/* model.json's content, or NULL: only a regular file of at most 1 MiB is read, since a
 * trial may leave anything in its run folder (a FIFO there blocked the reader for ever). */
static json_t *model_about(const char *path) {
  int fd;
  int64_t size;
  nas_err ignored;
  if (nas_open_regular(path, &fd, &size, &ignored) != NAS_OK) return NULL;
  json_t *about = size <= (1 << 20) ? json_loadfd(fd, 0, NULL) : NULL;
  close(fd);
  return about;
}

/* The model a built-in trial saved in its run folder: {"weights": path of weights.nasw,
 * "about": model.json's content}, or null when there is none. */
static json_t *saved_model(const char *run_dir) {
  char *weights = nas_asprintf("%s/weights.nasw", run_dir);
  char *about_path = nas_asprintf("%s/model.json", run_dir);
  json_t *model = NULL;
  if (weights && about_path && access(weights, F_OK) == 0) {
    json_t *about = model_about(about_path);
    model = json_pack("{s:s, s:o}", "weights", weights, "about", about ? about : json_null());
  }
  free(weights);
  free(about_path);
  return model ? model : json_null();
}

json_t *sched_trial_detail_json(storage *st, const experiment_row *exp, const sched_results *r,
                                size_t i, nas_err *err) {
  const trial_row *t = &r->trials[i];
  metric_row *rows;
  size_t n;
  if (storage_metrics_of_trial(st, t->id, &rows, &n, err) != NAS_OK) return NULL;
  json_t *one = sched_trial_json(r, i);
  char *run_dir = sched_run_dir(exp, t->number, t->attempts > 0 ? t->attempts : 1);
  if (one && run_dir) {
    json_object_set_new(one, "job_id", t->job_id ? json_string(t->job_id) : json_null());
    json_object_set_new(one, "intermediate", intermediate_json(rows, n, t->id));
    json_object_set_new(one, "run_dir", json_string(run_dir));
    json_object_set_new(one, "stdout_tail", log_tail(run_dir, "stdout.log"));
    json_object_set_new(one, "stderr_tail", log_tail(run_dir, "stderr.log"));
    json_object_set_new(one, "model", saved_model(run_dir));
  } else {
    json_decref(one);
    one = NULL;
    nas_errf(err, "out of memory");
  }
  free(run_dir);
  metric_rows_free(rows, n);
  return one;
}

/* ---- the whole experiment, for nas export ------------------------------------------------ */

/* Trial position of id in r (trials are few next to observations), or n_trials. */
static size_t trial_position(const sched_results *r, int64_t id) {
  size_t i = 0;
  while (i < r->n_trials && r->trials[i].id != id) i++;
  return i;
}

/* Sets "intermediate" on every trial of list (r's order): rows come grouped by trial, so
 * each group is read once. */
static int add_curves(json_t *list, const sched_results *r, const metric_row *rows, size_t n) {
  for (size_t i = 0; i < r->n_trials; i++)
    if (json_object_set_new(json_array_get(list, i), "intermediate", json_object()) != 0) return NAS_ERR;
  for (size_t from = 0, to; from < n; from = to) {
    for (to = from; to < n && rows[to].trial_id == rows[from].trial_id;) to++;
    size_t t = trial_position(r, rows[from].trial_id);
    if (t < r->n_trials &&
        json_object_set_new(json_array_get(list, t), "intermediate",
                            intermediate_json(rows + from, to - from, rows[from].trial_id)) != 0)
      return NAS_ERR;
  }
  return NAS_OK;
}

json_t *sched_export_json(storage *st, const spec *s, const experiment_row *exp,
                          const sched_results *r, bool curves, nas_err *err) {
  metric_row *rows = NULL;
  size_t n = 0;
  if (curves && storage_metrics_list(st, exp->id, &rows, &n, err) != NAS_OK) return NULL;
  json_t *list = json_array();
  for (size_t i = 0; list && i < r->n_trials; i++)
    if (json_array_append_new(list, sched_trial_json(r, i)) != 0) {
      json_decref(list);
      list = NULL;
    }
  if (list && curves && add_curves(list, r, rows, n) != NAS_OK) {
    json_decref(list);
    list = NULL;
  }
  metric_rows_free(rows, n);
  char *text = spec_text_shown(s, exp->spec_text);
  json_t *out = NULL;
  if (list && text) out = json_pack(
      "{s:s, s:i, s:f, s:{s:s, s:s, s:f, s:s, s:s, s:s}, s:o}", "format", SCHED_EXPORT_FORMAT,
      "version", SCHED_EXPORT_VERSION, "exported_at", nas_now(), "experiment", "name",
      exp->name, "status", exp->status, "created_at", exp->created_at, "spec", text,
      "spec_path", exp->spec_path, "run_root", exp->run_root, "trials", list);
  else json_decref(list);
  free(text);
  if (!out) nas_errf(err, "out of memory");
  return out;
}
