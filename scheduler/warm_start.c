/* scheduler/warm_start.c: observations imported from earlier experiments (`warm_start`).
 *
 * The completed trials of the experiments the spec names (in the same storage) whose
 * parameters fit this spec's space, once warm_start.fill has given values to parameters
 * they lack, and that reported every objective and constraint of this spec. They inform
 * the optimizer as observations and nothing else: they are not trials of this experiment,
 * so they take no part in its budget, its front, its patience or early stopping. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/scheduler.h"

void sched_imported_free(sched_imported *im) {
  for (size_t i = 0; im->params && i < im->n; i++) json_decref(im->params[i]);
  free(im->params);
  free(im->values);
  memset(im, 0, sizeof *im);
}

/* A trial's parameters with the fill values for those it lacks, when the result fits the
 * space of s; else NULL (owned). */
static json_t *fitted_params(const spec *s, const trial_row *t) {
  json_t *params = json_loads(t->params_json, 0, NULL);
  const char *name;
  json_t *value;
  json_object_foreach(s->warm_start.fill, name, value) {
    if (params && !json_object_get(params, name)) json_object_set(params, name, value);
  }
  nas_err why;
  if (params && spec_check_params(s, params, &why) == NAS_OK) return params;
  json_decref(params);
  return NULL;
}

static bool all_finite(const double *v, size_t k) {
  for (size_t j = 0; j < k; j++)
    if (!isfinite(v[j])) return false;
  return true;
}

/* Appends what fits of one earlier experiment's results (grown arrays in im). */
static int import_results(const spec *s, const sched_results *r, sched_imported *im,
                          nas_err *err) {
  size_t k = s->n_objectives + s->n_constraints;
  json_t **params = realloc(im->params, (im->n + r->n_trials + 1) * sizeof *params);
  if (params) im->params = params;
  double *values = realloc(im->values, (im->n + r->n_trials + 1) * (k ? k : 1) * sizeof *values);
  if (values) im->values = values;
  if (!params || !values) return nas_errf(err, "out of memory");
  for (size_t t = 0; t < r->n_trials; t++) {
    if (r->trials[t].status != TRIAL_COMPLETED) continue;
    /* metric_names begin with this spec's objectives, then its constraints (results.c). */
    const double *v = r->values + t * r->n_metrics;
    json_t *fitted = all_finite(v, k) ? fitted_params(s, &r->trials[t]) : NULL;
    if (!fitted) {
      im->skipped++;
      continue;
    }
    memcpy(im->values + im->n * k, v, k * sizeof *v);
    im->params[im->n++] = fitted;
  }
  return NAS_OK;
}

static int import_experiment(storage *st, const spec *s, const char *name, sched_imported *im,
                             nas_err *err) {
  experiment_row exp;
  int rc = storage_experiment_get(st, name, &exp, err);
  if (rc == NAS_ENOTFOUND)
    return nas_errf(err, "warm_start.from: there is no experiment '%s' in this storage", name);
  if (rc != NAS_OK) return rc;
  sched_results r;
  rc = sched_results_load(st, s, exp.id, &r, err);
  if (rc == NAS_OK) {
    rc = import_results(s, &r, im, err);
    sched_results_free(&r);
  }
  experiment_row_clear(&exp);
  return rc;
}

int sched_imported_load(storage *st, const spec *s, sched_imported *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  for (size_t i = 0; i < s->warm_start.n_from; i++) {
    if (import_experiment(st, s, s->warm_start.from[i], out, err) != NAS_OK) {
      sched_imported_free(out);
      return NAS_ERR;
    }
  }
  return NAS_OK;
}
