/* scheduler/dashboard.c: everything the dashboard draws for one experiment, in one compact
 * JSON answer (GET /api/v1/experiments/NAME/dashboard; `nas plot` inlines the very same into
 * its HTML file, so served pages and plot files draw from one form).
 *
 * Trials are columns (one array per field, in trial order) rather than an object per
 * trial: at 10 000 trials that is a third of the bytes and the browser reads it without
 * building an object per trial. Everything here is O(n log n) in the trials and linear in
 * the stored observations, so that a page stays fast while an experiment grows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"

/* The most points of the hypervolume history: enough for a smooth line at any size. */
enum { HISTORY_POINTS = 200 };

/* ---- trials as columns ------------------------------------------------------------------- */

json_t *sched_objectives_json(const spec *s) {
  json_t *list = json_array();
  for (size_t j = 0; list && j < s->n_objectives; j++)
    json_array_append_new(list, json_pack("{s:s, s:s}", "name", s->objectives[j].name, "goal",
                                          s->objectives[j].goal == GOAL_MAXIMIZE ? "maximize"
                                                                                  : "minimize"));
  return list;
}

/* {param: [value or null, …]} in trial order. */
static json_t *param_columns(const spec *s, const sched_results *r) {
  json_t *columns = json_object();
  for (size_t p = 0; columns && p < s->n_params; p++)
    json_object_set_new(columns, s->params[p].name, json_array());
  for (size_t i = 0; columns && i < r->n_trials; i++) {
    json_t *params = json_loads(r->trials[i].params_json, 0, NULL);
    for (size_t p = 0; p < s->n_params; p++) {
      json_t *v = json_object_get(params, s->params[p].name);
      json_array_append_new(json_object_get(columns, s->params[p].name), v ? json_incref(v) : json_null());
    }
    json_decref(params);
  }
  return columns;
}

/* {metric: [value or null, …]} in trial order. */
static json_t *metric_columns(const sched_results *r) {
  json_t *columns = json_object();
  for (size_t m = 0; columns && m < r->n_metrics; m++) {
    json_t *column = json_array();
    for (size_t i = 0; column && i < r->n_trials; i++)
      json_array_append_new(column, sched_json_number(r->values[i * r->n_metrics + m]));
    json_object_set_new(columns, r->metric_names[m], column);
  }
  return columns;
}

static json_t *trial_columns(const spec *s, const sched_results *r) {
  json_t *number = json_array(), *status = json_array(), *attempts = json_array();
  json_t *duration = json_array();
  for (size_t i = 0; i < r->n_trials; i++) {
    const trial_row *t = &r->trials[i];
    json_array_append_new(number, json_integer(t->number));
    json_array_append_new(status, json_string(trial_status_name(t->status)));
    json_array_append_new(attempts, json_integer(t->attempts));
    /* How long it ran, not when: a third of the bytes of two times, and what the table shows. */
    json_array_append_new(duration, t->started_at > 0 && t->finished_at > 0
                                        ? json_real(t->finished_at - t->started_at) : json_null());
  }
  json_t *columns = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "number", number, "status", status,
                               "attempts", attempts, "duration", duration, "metrics",
                               metric_columns(r), "params", param_columns(s, r));
  /* Hyperband's rungs only where there are any, so other experiments' answers stay as small. */
  if (columns && s->multi_fidelity.kind != MULTI_FIDELITY_NONE) {
    json_t *rung = json_array();
    for (size_t i = 0; i < r->n_trials; i++)
      json_array_append_new(rung, json_integer(r->trials[i].rung));
    json_object_set_new(columns, "rung", rung);
  }
  return columns;
}

/* ---- hypervolume over completed trials ------------------------------------------------------ */

/* Orders positions into idx (and so rows of Y) by when their trials finished. */
typedef struct {
  const sched_results *r;
  const size_t *idx;
} by_time;

static int cmp_by_time(const void *a, const void *b, void *ctx) {
  const by_time *c = ctx;
  const trial_row *x = &c->r->trials[c->idx[*(const size_t *)a]];
  const trial_row *y = &c->r->trials[c->idx[*(const size_t *)b]];
  if (x->finished_at != y->finished_at) return x->finished_at < y->finished_at ? -1 : 1;
  return (x->number > y->number) - (x->number < y->number);
}

/* Keeps the non-dominated rows of Y (n × m) in place; returns how many. */
static size_t keep_front(double *Y, size_t n, size_t m, bool *mask) {
  pareto_mask(Y, n, m, mask);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (mask[i]) memmove(Y + kept++ * m, Y + i * m, m * sizeof *Y);
  return kept;
}

/* The hypervolume at ref after each of up to HISTORY_POINTS prefixes of the completed,
 * feasible trials in the order they finished: {"completed": [k…], "trial": [number of the
 * k-th…], "hypervolume": […]}. The front so far is carried from prefix to prefix, so each
 * step works on that front and the trials new since, never on every trial again. */
static json_t *hypervolume_history(const spec *s, const sched_results *r, const double *ref,
                                   nas_err *err) {
  size_t m = s->n_objectives, n, *idx;
  double *Y;
  if (sched_completed_points(s, r, &Y, &idx, &n, err) != NAS_OK) return NULL;
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  double *front = malloc((n ? n : 1) * m * sizeof *front);
  bool *mask = malloc((n ? n : 1) * sizeof *mask);
  json_t *done = json_array(), *trial = json_array(), *volume = json_array(), *out = NULL;
  int rc = order && front && mask && done && trial && volume ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) order[i] = i;
  if (rc == NAS_OK) qsort_r(order, n, sizeof *order, cmp_by_time, &(by_time){r, idx});
  size_t step = (n + HISTORY_POINTS - 1) / HISTORY_POINTS, n_front = 0;
  for (size_t k = 0; rc == NAS_OK && k < n; k++) {
    memcpy(front + n_front++ * m, Y + order[k] * m, m * sizeof *front);
    if ((k + 1) % step != 0 && k + 1 != n) continue;
    n_front = keep_front(front, n_front, m, mask);
    double hv = pareto_hypervolume(front, n_front, m, ref);
    if (isnan(hv)) rc = nas_errf(err, "hypervolume: out of memory");
    json_array_append_new(done, json_integer((json_int_t)(k + 1)));
    json_array_append_new(trial, json_integer(r->trials[idx[order[k]]].number));
    json_array_append_new(volume, sched_json_number(hv));
  }
  if (rc == NAS_OK && !(out = json_pack("{s:O, s:O, s:O}", "completed", done, "trial", trial,
                                        "hypervolume", volume)))
    nas_errf(err, "out of memory");
  json_decref(done), json_decref(trial), json_decref(volume);
  free(order), free(front), free(mask), free(Y), free(idx);
  return out;
}

/* ---- learning curves (a request of their own: most of the bytes, drawn after the rest) ------------------------------------------------------------------------- */

/* Trial ids with their positions in r, sorted by id, to find a row's trial in O(log n). */
typedef struct {
  int64_t id;
  size_t position;
} id_position;

static int cmp_id(const void *a, const void *b) {
  int64_t x = ((const id_position *)a)->id, y = ((const id_position *)b)->id;
  return (x > y) - (x < y);
}

/* Each trial's intermediate values of each metric, in the order reported (rows come
 * grouped by trial). */
static json_t *curves_of(const sched_results *r, const metric_row *rows, size_t n, nas_err *err) {
  id_position *ids = malloc((r->n_trials ? r->n_trials : 1) * sizeof *ids);
  json_t *curves = json_object();
  if (!ids || !curves) {
    free(ids), json_decref(curves);
    nas_errf(err, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < r->n_trials; i++) ids[i] = (id_position){r->trials[i].id, i};
  qsort(ids, r->n_trials, sizeof *ids, cmp_id);
  for (size_t k = 0; k < n; k++) {
    const metric_row *row = &rows[k];
    if (row->step == METRIC_FINAL) continue;
    const id_position *at = bsearch(&(id_position){row->trial_id, 0}, ids, r->n_trials, sizeof *ids, cmp_id);
    if (!at) continue;
    json_t *metric = json_object_get(curves, row->name);
    if (!metric) {
      metric = json_pack("{s:[], s:[], s:[]}", "trial", "steps", "values");
      json_object_set_new(curves, row->name, metric);
    }
    json_t *trials = json_object_get(metric, "trial"), *steps = json_object_get(metric, "steps");
    json_t *values = json_object_get(metric, "values");
    size_t last = json_array_size(trials);
    int number = r->trials[at->position].number;
    /* Rows come grouped by trial: a curve goes on while its metric's last trial is this one. */
    if (last == 0 || json_integer_value(json_array_get(trials, last - 1)) != number) {
      json_array_append_new(trials, json_integer(number));
      json_array_append_new(steps, json_array());
      json_array_append_new(values, json_array());
      last++;
    }
    json_array_append_new(json_array_get(steps, last - 1), json_integer(row->step));
    json_array_append_new(json_array_get(values, last - 1), sched_json_number(row->value));
  }
  free(ids);
  return curves;
}

/* ---- the whole answer ------------------------------------------------------------------------ */

/* The reference point of a sched_pareto_json answer, in the minimisation convention. */
static void pareto_reference(const spec *s, const json_t *pareto, double *ref) {
  const json_t *point = json_object_get(pareto, "reference_point");
  for (size_t j = 0; j < s->n_objectives; j++) {
    const json_t *v = json_object_get(point, s->objectives[j].name);
    ref[j] = json_is_number(v) ? json_number_value(v) : NAN;
    if (s->objectives[j].goal == GOAL_MAXIMIZE) ref[j] = -ref[j];
  }
}

json_t *sched_dashboard_json(storage *st, const spec *s, const experiment_row *exp,
                             const sched_results *r, nas_err *err) {
  double *ref = calloc(s->n_objectives ? s->n_objectives : 1, sizeof *ref);
  json_t *pareto = ref ? sched_pareto_json(s, exp, r, err) : NULL;
  if (!pareto) {
    if (!ref) nas_errf(err, "out of memory");
    free(ref);
    return NULL;
  }
  pareto_reference(s, pareto, ref);
  json_t *summary = NULL, *history = NULL, *out = NULL;
  if (!(summary = sched_experiment_json(st, s, exp, r, pareto, err)) ||
      !(history = hypervolume_history(s, r, ref, err))) {
    json_decref(summary), json_decref(pareto);
  } else {
    json_t *params = json_array(), *metrics = json_array();
    for (size_t p = 0; params && p < s->n_params; p++) json_array_append_new(params, json_string(s->params[p].name));
    for (size_t m = 0; metrics && m < r->n_metrics; m++) json_array_append_new(metrics, json_string(r->metric_names[m]));
    out = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:f}", "experiment", summary,
                    "objectives", sched_objectives_json(s), "params", params, "metrics", metrics,
                    "trials", trial_columns(s, r), "pareto", pareto, "hypervolume_history",
                    history, "generated_at", nas_now());
    if (!out) nas_errf(err, "out of memory");
  }
  free(ref);
  return out;
}

json_t *sched_curves_json(storage *st, const experiment_row *exp, const sched_results *r,
                          nas_err *err) {
  metric_row *rows = NULL;
  size_t n = 0;
  if (storage_metrics_list(st, exp->id, &rows, &n, err) != NAS_OK) return NULL;
  json_t *curves = curves_of(r, rows, n, err);
  metric_rows_free(rows, n);
  return curves;
}
