/* scheduler/early_stop.c: stopping trials whose intermediate values are clearly worse
 * than their peers' at the same step.
 *
 * "Worse" is dominance over the judged objectives (for one objective: strictly worse), so
 * the same rules serve one or many objectives:
 *   median  at the trial's latest step s >= min_steps: stop when more than half of the
 *           other trials that reached s dominate its values at s.
 *   asha    at each rung r the trial reaches: continue only if fewer than (n+1)/η of the
 *           n other trials that reached r dominate it (it is among the best 1/η).
 * Values at a step are the last reports at or before it, so trials reporting at different
 * steps still compare. Nothing is decided with fewer than min_trials others. Judged
 * objectives that no trial reports per step are left out (see sched_curve). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/metrics.h"
#include "scheduler/scheduler.h"

/* Index of the last step <= step, or -1. */
static long step_index(const sched_curve *c, int64_t step) {
  long lo = 0, hi = (long)c->n_steps - 1, found = -1;
  while (lo <= hi) {
    long mid = (lo + hi) / 2;
    if (c->steps[mid] <= step) found = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  return found;
}

/* The curve's values at step (NULL when it has not reported every judged objective by
 * then); borrowed. */
static const double *values_at(const sched_curve *c, int64_t step, size_t m) {
  long k = step_index(c, step);
  if (k < 0) return NULL;
  const double *v = c->values + (size_t)k * m;
  for (size_t j = 0; j < m; j++)
    if (isnan(v[j])) return NULL;
  return v;
}

static bool dominates(const double *a, const double *b, size_t m) {
  bool better = false;
  for (size_t j = 0; j < m; j++) {
    if (a[j] > b[j]) return false;
    better |= a[j] < b[j];
  }
  return better;
}

/* Compares the candidate with every other curve that reached step. */
static void compare_at(const sched_curve *curves, size_t n, size_t candidate, int64_t step,
                       size_t m, sched_verdict *v) {
  const double *mine = values_at(&curves[candidate], step, m);
  v->step = step;
  v->better = v->compared = 0;
  if (!mine) return;
  for (size_t i = 0; i < n; i++) {
    if (i == candidate || curves[i].n_steps == 0 || curves[i].steps[curves[i].n_steps - 1] < step)
      continue;
    const double *theirs = values_at(&curves[i], step, m);
    if (!theirs) continue;
    v->compared++;
    v->better += dominates(theirs, mine, m);
  }
}

bool sched_early_stop_futile(const spec *s, char *why, size_t cap) {
  const early_stop_spec *es = &s->early_stopping;
  if (es->rule == EARLY_STOP_NONE) return false;
  if (es->min_trials >= s->budget.max_trials) {
    snprintf(why, cap, "a decision needs min_trials %d other trials at a step, and "
             "budget.trials is %d", es->min_trials, s->budget.max_trials);
    return true;
  }
  if (!s->trial.builtin) return false; /* what a command reports is known only from its trials */
  for (size_t j = 0; j < es->n_objectives; j++)
    if (strcmp(s->objectives[es->objectives[j]].name, METRIC_PER_EPOCH) == 0) return false;
  snprintf(why, cap, "built-in trials report only '%s' per epoch, and early_stopping.objectives "
           "leaves it out", METRIC_PER_EPOCH);
  return true;
}

void sched_early_stop_judge(const spec *s, const sched_curve *curves, size_t n,
                            size_t candidate, size_t *next_rung, sched_verdict *out) {
  const early_stop_spec *es = &s->early_stopping;
  const sched_curve *c = &curves[candidate];
  memset(out, 0, sizeof *out);
  if (es->rule == EARLY_STOP_NONE || c->n_steps == 0) return;
  int64_t latest = c->steps[c->n_steps - 1];
  if (latest < es->min_steps) return;
  size_t m = es->n_objectives, min_trials = (size_t)es->min_trials;
  if (es->rule == EARLY_STOP_MEDIAN) {
    compare_at(curves, n, candidate, latest, m, out);
    out->stop = out->compared >= min_trials && 2 * out->better > out->compared;
    return;
  }
  while (*next_rung < es->n_rungs && es->rungs[*next_rung] <= latest) {
    compare_at(curves, n, candidate, es->rungs[*next_rung], m, out);
    if (out->compared < min_trials) return; /* judged here once enough peers arrive */
    if ((double)out->better >= (double)(out->compared + 1) / es->reduction_factor) {
      out->stop = true;
      return;
    }
    (*next_rung)++;
  }
}

/* ---- curves from storage ---------------------------------------------------------------- */

static int judged_index(const spec *s, const char *name) {
  const early_stop_spec *es = &s->early_stopping;
  for (size_t j = 0; j < es->n_objectives; j++)
    if (strcmp(s->objectives[es->objectives[j]].name, name) == 0) return (int)j;
  return -1;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Builds one trial's curve from its rows [from, to) (intermediate, judged ones). */
static int build_curve(const spec *s, const metric_row *rows, size_t from, size_t to,
                       sched_curve *c) {
  size_t m = s->early_stopping.n_objectives, n = 0;
  c->steps = malloc((to - from) * sizeof *c->steps);
  if (!c->steps) return NAS_ERR;
  for (size_t i = from; i < to; i++) c->steps[n++] = rows[i].step;
  qsort(c->steps, n, sizeof *c->steps, cmp_i64);
  size_t unique = 0;
  for (size_t i = 0; i < n; i++)
    if (unique == 0 || c->steps[unique - 1] != c->steps[i]) c->steps[unique++] = c->steps[i];
  c->n_steps = unique;
  c->values = malloc((unique ? unique : 1) * m * sizeof *c->values);
  if (!c->values) return NAS_ERR;
  for (size_t k = 0; k < unique * m; k++) c->values[k] = NAN;
  for (size_t i = from; i < to; i++) { /* later rows win at the same step */
    long k = step_index(c, rows[i].step);
    c->values[(size_t)k * m + (size_t)judged_index(s, rows[i].name)] = rows[i].value;
  }
  for (size_t k = 1; k < unique; k++) /* carry the last report forward */
    for (size_t j = 0; j < m; j++)
      if (isnan(c->values[k * m + j])) c->values[k * m + j] = c->values[(k - 1) * m + j];
  for (size_t k = 0; k < unique * m; k++) /* minimisation convention */
    if (s->objectives[s->early_stopping.objectives[k % m]].goal == GOAL_MAXIMIZE)
      c->values[k] = -c->values[k];
  return NAS_OK;
}

/* Whether curve c reports judged objective j (of m) at some step. */
static bool curve_reports(const sched_curve *c, size_t j, size_t m) {
  for (size_t k = 0; k < c->n_steps; k++)
    if (!isnan(c->values[k * m + j])) return true;
  return false;
}

static void curve_left_out(sched_curve *c, size_t j, size_t m) {
  for (size_t k = 0; k < c->n_steps; k++) c->values[k * m + j] = 0;
}

/* Makes each judged objective that no curve reports 0 everywhere (see sched_curve);
 * reported[j] (NULL: not wanted) says whether some curve reports objective j. */
static void unreported_left_out(sched_curve *curves, size_t n, size_t m, bool *reported) {
  for (size_t j = 0; j < m; j++) {
    bool some = false;
    for (size_t i = 0; i < n && !some; i++) some = curve_reports(&curves[i], j, m);
    for (size_t i = 0; i < n && !some; i++) curve_left_out(&curves[i], j, m);
    if (reported) reported[j] = some;
  }
}

static void curve_clear(sched_curve *c) {
  free(c->steps);
  free(c->values);
  c->steps = NULL;
  c->values = NULL;
  c->n_steps = 0;
}

/* Moves the judged intermediate rows of rows[0..n) to its front, in order; their count. */
static size_t judged_rows_first(const spec *s, metric_row *rows, size_t n) {
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (rows[i].step != METRIC_FINAL && judged_index(s, rows[i].name) >= 0) {
      metric_row tmp = rows[kept];
      rows[kept++] = rows[i];
      rows[i] = tmp;
    }
  return kept;
}

/* sched_curves_load, and reported[j] (NULL: not wanted) whether any curve reports
 * judged objective j. */
static int curves_load(storage *st, const spec *s, int64_t experiment_id, sched_curve **out,
                       size_t *n, bool *reported, nas_err *err) {
  metric_row *rows;
  size_t n_rows;
  *out = NULL;
  *n = 0;
  if (storage_metrics_list(st, experiment_id, &rows, &n_rows, err) != NAS_OK) return NAS_ERR;
  size_t kept = judged_rows_first(s, rows, n_rows);
  sched_curve *curves = calloc(kept ? kept : 1, sizeof *curves);
  int rc = curves ? NAS_OK : nas_errf(err, "out of memory");
  size_t count = 0;
  for (size_t from = 0; rc == NAS_OK && from < kept;) { /* rows come grouped by trial */
    size_t to = from;
    while (to < kept && rows[to].trial_id == rows[from].trial_id) to++;
    curves[count].trial_id = rows[from].trial_id;
    if (build_curve(s, rows, from, to, &curves[count++]) != NAS_OK)
      rc = nas_errf(err, "out of memory");
    from = to;
  }
  metric_rows_free(rows, n_rows);
  if (rc != NAS_OK) {
    sched_curves_free(curves, count);
    return rc;
  }
  unreported_left_out(curves, count, s->early_stopping.n_objectives, reported);
  *out = curves;
  *n = count;
  return NAS_OK;
}

int sched_curves_load(storage *st, const spec *s, int64_t experiment_id, sched_curve **out,
                      size_t *n, nas_err *err) {
  return curves_load(st, s, experiment_id, out, n, NULL, err);
}

void sched_curves_free(sched_curve *curves, size_t n) {
  for (size_t i = 0; curves && i < n; i++) curve_clear(&curves[i]);
  free(curves);
}

/* ---- curves kept one trial at a time ---------------------------------------------------- */

int sched_curve_set_load(storage *st, const spec *s, int64_t experiment_id,
                         sched_curve_set *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  out->reported = calloc(s->early_stopping.n_objectives + 1, sizeof *out->reported);
  if (!out->reported) return nas_errf(err, "out of memory");
  int rc = curves_load(st, s, experiment_id, &out->curves, &out->n, out->reported, err);
  if (rc != NAS_OK) sched_curve_set_free(out);
  out->room = out->n;
  return rc;
}

/* Puts curve c (owned) in trial_id's place in set, or adds it; one without steps only
 * frees what the trial had, as a load keeps no curve for a trial without values. */
static int curve_place(sched_curve_set *set, sched_curve *c, nas_err *err) {
  size_t at = 0;
  while (at < set->n && set->curves[at].trial_id != c->trial_id) at++;
  if (at < set->n) {
    curve_clear(&set->curves[at]);
    set->curves[at] = *c;
    if (c->n_steps == 0) set->curves[at] = set->curves[--set->n]; /* order decides nothing */
    return NAS_OK;
  }
  if (c->n_steps == 0) {
    curve_clear(c);
    return NAS_OK;
  }
  if (set->n == set->room) { /* doubled, so that adding the trials one by one stays linear */
    size_t room = set->room ? 2 * set->room : 16;
    sched_curve *grown = realloc(set->curves, room * sizeof *grown);
    if (!grown) {
      curve_clear(c);
      return nas_errf(err, "out of memory");
    }
    set->curves = grown;
    set->room = room;
  }
  set->curves[set->n++] = *c;
  return NAS_OK;
}

/* Whether curve c reports an objective no curve of set but its own trial's reported: the
 * others then hold 0 where a load would give their values, and only a load can tell. */
static bool reports_new_objective(const sched_curve_set *set, const sched_curve *c, size_t m) {
  bool others = false;
  for (size_t i = 0; i < set->n && !others; i++) others = set->curves[i].trial_id != c->trial_id;
  for (size_t j = 0; others && j < m; j++)
    if (!set->reported[j] && curve_reports(c, j, m)) return true;
  return false;
}

int sched_curve_set_put(const spec *s, sched_curve_set *set, int64_t trial_id,
                        metric_row *rows, size_t n_rows, bool *stale, nas_err *err) {
  size_t m = s->early_stopping.n_objectives, kept = judged_rows_first(s, rows, n_rows);
  sched_curve c = {.trial_id = trial_id};
  *stale = false;
  if (kept > 0 && build_curve(s, rows, 0, kept, &c) != NAS_OK) {
    curve_clear(&c);
    return nas_errf(err, "out of memory");
  }
  if (reports_new_objective(set, &c, m)) {
    curve_clear(&c);
    *stale = true;
    return NAS_OK;
  }
  for (size_t j = 0; j < m; j++) {
    set->reported[j] |= curve_reports(&c, j, m);
    if (!set->reported[j]) curve_left_out(&c, j, m);
  }
  return curve_place(set, &c, err);
}

void sched_curve_set_free(sched_curve_set *set) {
  sched_curves_free(set->curves, set->n);
  free(set->reported);
  memset(set, 0, sizeof *set);
}
