/* scheduler/suggest.c: from stored results to new trials — completed trials become the
 * optimizer's observations, failed, timed-out and stopped ones observations without values
 * (tried: never suggested again, `nas retry` runs one again), queued and running ones its
 * pending points, and each suggestion is stored as a queued trial with the reference point
 * it aimed at. The loop of `nas run` and ask/tell (ask.c) both suggest through here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>

#include "scheduler/internal.h"

/* Ended trials as observations (values NaN unless completed), and the parameters of
 * pending ones. */
typedef struct {
  const sched_results *r;   /* borrowed */
  observation *obs;
  json_t **params;          /* owned, one per trial */
  double *values;           /* objectives then constraints, per observation; NaN unless completed */
  double *sems;             /* the objectives' standard errors (NAME_sem), per observation */
  const json_t **pending;
  size_t n_obs, n_pending;
} history;

static void history_free(history *h) {
  for (size_t i = 0; h->r && i < h->r->n_trials && h->params; i++) json_decref(h->params[i]);
  free(h->params), free(h->obs), free(h->values), free(h->sems), free(h->pending);
}

/* The imported observations after the experiment's own (borrowing their parameters). */
static void history_add_imported(const spec *s, const sched_imported *im, history *h) {
  size_t k = s->n_objectives + s->n_constraints;
  for (size_t i = 0; im && i < im->n; i++) {
    double *v = im->values + i * k;
    h->obs[h->n_obs++] = (observation){.params = im->params[i], .objectives = v,
                                       .constraints = v + s->n_objectives};
  }
}

/* sem_col[j]: the results column of objective j's standard error (NAME_sem), or -1. */
static int sem_columns(const spec *s, const sched_results *r, int *sem_col, nas_err *err) {
  for (size_t j = 0; j < s->n_objectives; j++) {
    char *name = metric_sem_name(s->objectives[j].name);
    if (!name) return nas_errf(err, "out of memory");
    sem_col[j] = sched_results_metric(r, name);
    free(name);
  }
  return NAS_OK;
}

/* Row t's standard errors into out (NaN where not reported). */
static void sems_of(const spec *s, const sched_results *r, size_t t, const int *sem_col,
                    double *out) {
  for (size_t j = 0; j < s->n_objectives; j++)
    out[j] = sem_col[j] < 0 ? NAN : r->values[t * r->n_metrics + (size_t)sem_col[j]];
}

static int history_load(const spec *s, const sched_results *r, const sched_imported *im,
                        history *h, nas_err *err) {
  memset(h, 0, sizeof *h);
  h->r = r;
  size_t n = h->r->n_trials ? h->r->n_trials : 1, k = s->n_objectives + s->n_constraints;
  h->params = calloc(n, sizeof *h->params);
  h->obs = calloc(n + (im ? im->n : 0), sizeof *h->obs);
  h->values = calloc(n * (k ? k : 1), sizeof *h->values);
  h->sems = calloc(n * s->n_objectives + 1, sizeof *h->sems);
  h->pending = calloc(n, sizeof *h->pending);
  int sem_col[s->n_objectives + 1];
  if (!h->params || !h->obs || !h->values || !h->sems || !h->pending ||
      sem_columns(s, r, sem_col, err) != NAS_OK) {
    history_free(h);
    return nas_errf(err, "out of memory");
  }
  for (size_t t = 0; t < h->r->n_trials; t++) {
    const trial_row *row = &h->r->trials[t];
    h->params[t] = json_loads(row->params_json, 0, NULL);
    if (!h->params[t]) {
      history_free(h);
      return nas_errf(err, "trial %d: stored parameters are not JSON", row->number);
    }
    /* an ended trial's assignment was tried, a failed one's too (an observation the models
     * learn nothing from), or a finite space would hand a failing assignment out again */
    if (!trial_status_final(row->status)) {
      h->pending[h->n_pending++] = h->params[t];
      continue;
    }
    /* metric_names begin with the objectives, then the constraints (results.c). */
    double *v = h->values + h->n_obs * k, *sem = h->sems + h->n_obs * s->n_objectives;
    bool completed = row->status == TRIAL_COMPLETED;
    for (size_t j = 0; j < k; j++) v[j] = completed ? h->r->values[t * h->r->n_metrics + j] : NAN;
    sems_of(s, h->r, t, sem_col, sem);
    h->obs[h->n_obs++] = (observation){.params = h->params[t], .objectives = v,
                                       .constraints = v + s->n_objectives,
                                       .objective_sems = completed ? sem : NULL};
  }
  history_add_imported(s, im, h);
  return NAS_OK;
}

int sched_model_means(const spec *s, const sched_results *r, double *means, nas_err *err) {
  history h;
  size_t m = s->n_objectives;
  if (history_load(s, r, NULL, &h, err) != NAS_OK) return NAS_ERR;
  double *per_obs = malloc((h.n_obs * m + 1) * sizeof *per_obs);
  int rc = per_obs ? optimizer_model_means(s, h.obs, h.n_obs, per_obs, err)
                   : nas_errf(err, "out of memory");
  for (size_t t = 0, k = 0; rc == NAS_OK && t < r->n_trials; t++) { /* history_load's order */
    bool completed = r->trials[t].status == TRIAL_COMPLETED;
    for (size_t j = 0; j < m; j++) means[t * m + j] = completed ? per_obs[k * m + j] : NAN;
    k += trial_status_final(r->trials[t].status);
  }
  free(per_obs);
  history_free(&h);
  return rc;
}

/* The reference point ref (minimisation convention) as the trial records it: a JSON object
 * of objective name → value in the objective's own direction; NULL text when ref is NaN
 * (no reference). *text is owned; false when out of memory. */
static bool reference_text(const spec *s, const double *ref, char **text) {
  *text = NULL;
  if (isnan(ref[0])) return true;
  json_t *obj = json_object();
  for (size_t j = 0; obj && j < s->n_objectives; j++) {
    double raw = s->objectives[j].goal == GOAL_MAXIMIZE ? -ref[j] : ref[j];
    if (json_object_set_new(obj, s->objectives[j].name, json_real(raw)) != 0) {
      json_decref(obj);
      obj = NULL;
    }
  }
  *text = obj ? json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
  json_decref(obj);
  return *text != NULL;
}

/* What a trial's run is measured in: one trial, or under Hyperband one epoch (a rung's run
 * trains only the epochs past the previous rung's, and most runs are short first rungs, so
 * trials' durations alone would count a promoted trial's later rungs as nothing). */
static double units_run(const spec *s, const trial_row *row) {
  if (s->multi_fidelity.kind != MULTI_FIDELITY_HYPERBAND) return 1;
  return sched_hyperband_epochs_run(&s->multi_fidelity, row->number, row->rung);
}

static double units_per_trial(const spec *s) {
  if (s->multi_fidelity.kind != MULTI_FIDELITY_HYPERBAND) return 1;
  return sched_hyperband_epochs_per_trial(&s->multi_fidelity);
}

size_t sched_trials_expected(const spec *s, const sched_results *r) {
  size_t expected = (size_t)s->budget.max_trials;
  if (s->budget.max_wall_s <= 0 || r->n_trials == 0) return expected;
  /* Out of memory leaves the trial budget: an estimate all the same. */
  double *unit_seconds = malloc(r->n_trials * sizeof *unit_seconds);
  size_t n = 0;
  for (size_t t = 0; unit_seconds && t < r->n_trials; t++) {
    const trial_row *row = &r->trials[t];
    if (row->status == TRIAL_COMPLETED && row->started_at > 0 && row->finished_at > row->started_at)
      unit_seconds[n++] = (row->finished_at - row->started_at) / units_run(s, row);
  }
  if (n > 0) {
    gsl_sort(unit_seconds, 1, n);
    double trial_s = gsl_stats_median_from_sorted_data(unit_seconds, 1, n) * units_per_trial(s);
    double fit = ceil(s->budget.parallel * s->budget.max_wall_s / trial_s);
    if (fit < (double)expected) expected = (size_t)fit;
  }
  free(unit_seconds);
  return expected;
}

int sched_suggest(storage *st, const spec *s, const experiment_row *exp, optimizer *opt,
                  const sched_results *r, const sched_imported *imported, size_t n,
                  trial_row **rows, nas_err *err) {
  history h;
  if (history_load(s, r, imported, &h, err) != NAS_OK) return NAS_ERR;
  size_t m = s->n_objectives;
  json_t **suggested = calloc(n, sizeof *suggested);
  double *refs = malloc(n * m * sizeof *refs);
  *rows = calloc(n, sizeof **rows);
  int rc = suggested && refs && *rows ? NAS_OK : nas_errf(err, "out of memory");
  optimizer_set_trials_expected(opt, sched_trials_expected(s, r));
  if (rc == NAS_OK)
    rc = optimizer_suggest(opt, h.obs, h.n_obs, h.pending, h.n_pending, n, (int)r->n_trials,
                           suggested, refs, err);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    char *text = json_dumps(suggested[i], JSON_COMPACT | JSON_SORT_KEYS), *ref = NULL;
    rc = text && reference_text(s, refs + i * m, &ref)
             ? storage_trial_create(st, exp->id, text, ref, &(*rows)[i], err)
             : nas_errf(err, "out of memory");
    free(text);
    free(ref);
  }
  for (size_t i = 0; suggested && i < n; i++) json_decref(suggested[i]);
  free(suggested);
  free(refs);
  history_free(&h);
  if (rc != NAS_OK) {
    trial_rows_free(*rows, n);
    *rows = NULL;
  }
  return rc;
}
