/* scheduler/views.c: an experiment's results as JSON, the one form both the CLI (`nas
 * pareto --format json`) and `nas serve` give out, so the two never disagree: the Pareto
 * front with its reference point and hypervolume, one trial, and an experiment's summary.
 * Numbers never reported are null; objective values are in their own direction. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/scheduler.h"

static json_t *number_or_null(double v) { return isnan(v) ? json_null() : json_real(v); }

/* An objective's value in its own direction from the minimisation convention. */
static double own_direction(const spec *s, size_t j, double v) {
  return s->objectives[j].goal == GOAL_MAXIMIZE ? -v : v;
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
    json_object_set_new(row, s->objectives[j].name, number_or_null(r->values[i * r->n_metrics + j]));
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
  json_t *refs = json_object(), *rows = json_array();
  for (size_t j = 0; refs && j < s->n_objectives; j++)
    json_object_set_new(refs, s->objectives[j].name, json_real(own_direction(s, j, ref[j])));
  for (size_t k = 0; rows && k < n_front; k++)
    json_array_append_new(rows, front_row(s, r, front[k]));
  json_t *out = json_pack("{s:s, s:f, s:o, s:o}", "experiment", exp->name, "hypervolume", hv,
                          "reference_point", refs, "front", rows);
  free(front), free(ref), free(key);
  if (!out) nas_errf(err, "out of memory");
  return out;
}

static json_t *time_or_null(double t) { return t > 0 ? json_real(t) : json_null(); }

json_t *sched_trial_json(const sched_results *r, size_t i) {
  const trial_row *t = &r->trials[i];
  json_t *metrics = json_object();
  for (size_t m = 0; metrics && m < r->n_metrics; m++) {
    double v = r->values[i * r->n_metrics + m];
    if (!isnan(v)) json_object_set_new(metrics, r->metric_names[m], json_real(v));
  }
  json_t *params = json_loads(t->params_json, 0, NULL);
  json_t *reference = t->reference_json ? json_loads(t->reference_json, 0, NULL) : NULL;
  return json_pack("{s:i, s:s, s:o, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "number",
                   t->number, "status", trial_status_name(t->status), "params",
                   params ? params : json_object(), "metrics", metrics, "attempts",
                   t->attempts, "created_at", time_or_null(t->created_at), "started_at",
                   time_or_null(t->started_at), "finished_at", time_or_null(t->finished_at),
                   "error", t->error ? json_string(t->error) : json_null(), "reference_point",
                   reference ? reference : json_null(), "heartbeat_at",
                   time_or_null(t->heartbeat_at));
}

static json_t *counts_json(const sched_results *r) {
  int by[TRIAL_STATUS_COUNT] = {0};
  for (size_t i = 0; i < r->n_trials; i++) by[r->trials[i].status]++;
  json_t *counts = json_object();
  for (int st = 0; counts && st < TRIAL_STATUS_COUNT; st++)
    json_object_set_new(counts, trial_status_name((trial_status)st), json_integer(by[st]));
  return counts;
}

static const char *const liveness_names[] = {"none", "alive", "dead"};

/* The spec's text with the password of its storage line masked (the text is shown to
 * anyone who may read the experiment). Owned; NULL when out of memory. */
static char *spec_text_shown(const spec *s, const char *text) {
  char *masked = storage_url_redacted(s->storage);
  const char *at = masked && strcmp(masked, s->storage) != 0 ? strstr(text, s->storage) : NULL;
  char *shown = at ? nas_asprintf("%.*s%s%s", (int)(at - text), text, masked,
                                  at + strlen(s->storage))
                   : strdup(text);
  free(masked);
  return shown;
}

json_t *sched_experiment_json(storage *st, const spec *s, const experiment_row *exp,
                              const sched_results *r, nas_err *err) {
  sched_liveness alive;
  char *holder;
  if (sched_scheduler_state(st, exp, &alive, &holder, err) != NAS_OK) return NULL;
  json_t *pareto = sched_pareto_json(s, exp, r, err);
  if (!pareto) {
    free(holder);
    return NULL;
  }
  size_t ended = 0;
  for (size_t i = 0; i < r->n_trials; i++) ended += trial_status_final(r->trials[i].status);
  char *text = spec_text_shown(s, exp->spec_text);
  json_t *out = !text ? NULL : json_pack(
      "{s:s, s:s, s:f, s:s, s:s, s:i, s:o, s:{s:i, s:i, s:f}, s:O, s:i, s:{s:s, s:o}}",
      "name", exp->name, "status", exp->status, "created_at", exp->created_at, "spec",
      text, "spec_path", exp->spec_path, "trials", (int)r->n_trials, "counts",
      counts_json(r), "progress", "ended", (int)ended, "budget", s->budget.max_trials,
      "fraction", s->budget.max_trials > 0 ? (double)ended / s->budget.max_trials : 0.0,
      "hypervolume", json_object_get(pareto, "hypervolume"), "front_size",
      (int)json_array_size(json_object_get(pareto, "front")), "scheduler", "state",
      liveness_names[alive], "holder", holder ? json_string(holder) : json_null());
  json_decref(pareto);
  free(holder);
  free(text);
  if (!out) nas_errf(err, "out of memory");
  return out;
}
