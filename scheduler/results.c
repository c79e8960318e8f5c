/* scheduler/results.c: an experiment's trials joined with their metric values, and the
 * Pareto front over them. Commands (status, trials, pareto) and the loop (observations
 * for the optimizer) all read results through here, so a metric means the same everywhere:
 * a trial's value of a metric is its last final report, else its report at the highest
 * step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"

static int name_index(char *const *names, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return (int)i;
  return -1;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends a copy of name to out's metric names unless it is there already. */
static int add_name(sched_results *out, const char *name, nas_err *err) {
  if (name_index(out->metric_names, out->n_metrics, name) >= 0) return NAS_OK;
  if (!(out->metric_names[out->n_metrics] = strdup(name))) return nas_errf(err, "out of memory");
  out->n_metrics++;
  return NAS_OK;
}

/* Objectives, then constraints, then every other name seen in rows, sorted. */
static int collect_names(const spec *s, const metric_row *rows, size_t n_rows,
                         sched_results *out, nas_err *err) {
  size_t cap = s->n_objectives + s->n_constraints + n_rows;
  out->metric_names = calloc(cap ? cap : 1, sizeof *out->metric_names);
  if (!out->metric_names) return nas_errf(err, "out of memory");
  int rc = NAS_OK;
  for (size_t i = 0; !rc && i < s->n_objectives; i++)
    rc = add_name(out, s->objectives[i].name, err);
  for (size_t i = 0; !rc && i < s->n_constraints; i++)
    rc = add_name(out, s->constraints[i].metric, err);
  size_t declared = out->n_metrics;
  for (size_t i = 0; !rc && i < n_rows; i++) rc = add_name(out, rows[i].name, err);
  if (!rc)
    qsort(out->metric_names + declared, out->n_metrics - declared, sizeof *out->metric_names,
          cmp_str);
  return rc;
}

/* Trial position (in r->trials) of each trial id, sorted by id for binary search. */
typedef struct {
  int64_t id;
  size_t pos;
} id_pos;

static int cmp_id_pos(const void *a, const void *b) {
  int64_t x = ((const id_pos *)a)->id, y = ((const id_pos *)b)->id;
  return (x > y) - (x < y);
}

static int trial_index(const id_pos *by_id, size_t n, int64_t trial_id) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (by_id[mid].id < trial_id) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && by_id[lo].id == trial_id ? (int)by_id[lo].pos : -1;
}

/* Fills values: final reports win over intermediate ones; among intermediates the
 * highest step wins; among equals the later report wins. */
static int fill_values(sched_results *r, const metric_row *rows, size_t n_rows,
                       nas_err *err) {
  size_t cells = r->n_trials * r->n_metrics;
  int64_t *best_step = malloc((cells ? cells : 1) * sizeof *best_step);
  id_pos *by_id = malloc((r->n_trials ? r->n_trials : 1) * sizeof *by_id);
  if (!best_step || !by_id) {
    free(best_step), free(by_id);
    return nas_errf(err, "out of memory");
  }
  for (size_t i = 0; i < r->n_trials; i++) by_id[i] = (id_pos){r->trials[i].id, i};
  qsort(by_id, r->n_trials, sizeof *by_id, cmp_id_pos);
  for (size_t i = 0; i < cells; i++) {
    r->values[i] = NAN;
    best_step[i] = INT64_MIN;
  }
  for (size_t i = 0; i < n_rows; i++) {
    int t = trial_index(by_id, r->n_trials, rows[i].trial_id);
    int m = name_index(r->metric_names, r->n_metrics, rows[i].name);
    if (t < 0 || m < 0) continue;
    size_t cell = (size_t)t * r->n_metrics + (size_t)m;
    int64_t rank = rows[i].step == METRIC_FINAL ? INT64_MAX : rows[i].step;
    if (rank >= best_step[cell]) {
      best_step[cell] = rank;
      r->values[cell] = rows[i].value;
    }
  }
  free(best_step), free(by_id);
  return NAS_OK;
}

/* The metric names and values of out, whose trials are loaded, from the observations
 * rows (freed here); out is freed on failure. */
static int results_fill(sched_results *out, const spec *s, metric_row *rows, size_t n_rows,
                        nas_err *err) {
  int rc = collect_names(s, rows, n_rows, out, err);
  size_t cells = out->n_trials * out->n_metrics;
  if (rc == NAS_OK && !(out->values = malloc((cells ? cells : 1) * sizeof *out->values)))
    rc = nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = fill_values(out, rows, n_rows, err);
  out->room = out->n_trials;
  metric_rows_free(rows, n_rows);
  if (rc != NAS_OK) sched_results_free(out);
  return rc;
}

int sched_results_load(storage *st, const spec *s, int64_t experiment_id,
                       sched_results *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  metric_row *rows = NULL;
  size_t n_rows = 0;
  if (storage_trial_list(st, experiment_id, &out->trials, &out->n_trials, err) != NAS_OK ||
      storage_metrics_list(st, experiment_id, &rows, &n_rows, err) != NAS_OK) {
    sched_results_free(out);
    return NAS_ERR;
  }
  return results_fill(out, s, rows, n_rows, err);
}

int sched_results_of_trial(storage *st, const spec *s, const experiment_row *exp, int number,
                           sched_results *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  trial_row *t = calloc(1, sizeof *t);
  if (!t) return nas_errf(err, "out of memory");
  int rc = sched_trial_find(st, exp, number, t, err);
  if (rc != NAS_OK) {
    free(t);
    return rc;
  }
  out->trials = t;
  out->n_trials = 1;
  metric_row *rows = NULL;
  size_t n_rows = 0;
  if (storage_metrics_of_trial(st, t->id, &rows, &n_rows, err) != NAS_OK) {
    sched_results_free(out);
    return NAS_ERR;
  }
  return results_fill(out, s, rows, n_rows, err);
}

void sched_results_free(sched_results *r) {
  trial_rows_free(r->trials, r->n_trials);
  for (size_t i = 0; i < r->n_metrics; i++) free(r->metric_names[i]);
  free(r->metric_names);
  free(r->values);
  memset(r, 0, sizeof *r);
}

/* Position of the trial numbered number in r (trials in number order), or where it would go. */
static size_t number_position(const sched_results *r, int number) {
  size_t lo = 0, hi = r->n_trials;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->trials[mid].number < number) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Room for one trial more in r, doubling. */
static int grow_room(sched_results *r, nas_err *err) {
  if (r->n_trials < r->room) return NAS_OK;
  size_t room = r->room ? 2 * r->room : 16, cells = room * (r->n_metrics ? r->n_metrics : 1);
  trial_row *trials = realloc(r->trials, room * sizeof *trials);
  if (trials) r->trials = trials;
  double *values = trials ? realloc(r->values, cells * sizeof *values) : NULL;
  if (!values) return nas_errf(err, "out of memory for %zu trials' results", room);
  r->values = values;
  r->room = room;
  return NAS_OK;
}

int sched_results_put(sched_results *r, sched_results *one, nas_err *err) {
  if (one->n_trials != 1) return NAS_ENOTFOUND;
  for (size_t m = 0; m < one->n_metrics; m++)
    if (sched_results_metric(r, one->metric_names[m]) < 0) return NAS_ENOTFOUND;
  const trial_row *t = &one->trials[0];
  size_t at = number_position(r, t->number);
  bool known = at < r->n_trials && r->trials[at].id == t->id;
  if (!known && at < r->n_trials) return NAS_ENOTFOUND;
  if (!known && grow_room(r, err) != NAS_OK) return NAS_ERR;
  if (known) trial_row_clear(&r->trials[at]);
  else r->n_trials++;
  r->trials[at] = *t;
  one->n_trials = 0; /* its row is r's now */
  double *row = r->values + at * r->n_metrics;
  for (size_t j = 0; j < r->n_metrics; j++) row[j] = NAN;
  for (size_t m = 0; m < one->n_metrics; m++)
    row[sched_results_metric(r, one->metric_names[m])] = one->values[m];
  return NAS_OK;
}

int sched_results_metric(const sched_results *r, const char *name) {
  return name_index(r->metric_names, r->n_metrics, name);
}

const char *sched_results_missing_objective(const spec *s, const sched_results *r,
                                            int64_t trial_id, const metric_obs *obs, size_t n) {
  for (size_t i = 0; i < r->n_trials; i++) {
    if (r->trials[i].id != trial_id) continue;
    for (size_t j = 0; j < s->n_objectives; j++) {
      bool told = !isnan(r->values[i * r->n_metrics + j]); /* objectives come first */
      for (size_t k = 0; k < n && !told; k++)
        told = obs[k].step == METRIC_FINAL && strcmp(obs[k].name, s->objectives[j].name) == 0;
      if (!told) return s->objectives[j].name;
    }
  }
  return NULL;
}

/* Whether trial t is within every objective threshold the user gave (the worst values
 * still of interest). */
bool sched_results_within_thresholds(const spec *s, const sched_results *r, size_t t) {
  for (size_t j = 0; j < s->n_objectives; j++) {
    const objective_spec *o = &s->objectives[j];
    double v = r->values[t * r->n_metrics + j]; /* objectives come first */
    if (o->has_threshold && (o->goal == GOAL_MINIMIZE ? v > o->threshold : v < o->threshold))
      return false;
  }
  return true;
}

bool sched_results_feasible(const spec *s, const sched_results *r, size_t t) {
  for (size_t c = 0; c < s->n_constraints; c++) {
    int m = sched_results_metric(r, s->constraints[c].metric);
    double v = m < 0 ? NAN : r->values[t * r->n_metrics + (size_t)m];
    if (isnan(v)) return false;
    if (s->constraints[c].op == CONSTRAINT_LE ? v > s->constraints[c].bound
                                              : v < s->constraints[c].bound)
      return false;
  }
  return true;
}

/* "a <= -5, b >= 3": the thresholds given, as the worst values still worth having. Owned;
 * NULL when memory runs out. */
static char *thresholds_text(const spec *s) {
  char *text = strdup("");
  for (size_t j = 0; text && j < s->n_objectives; j++) {
    const objective_spec *o = &s->objectives[j];
    if (!o->has_threshold) continue;
    char *longer = nas_asprintf("%s%s%s %s %.6g", text, *text ? ", " : "", o->name,
                                o->goal == GOAL_MINIMIZE ? "<=" : ">=", o->threshold);
    free(text);
    text = longer;
  }
  return text;
}

/* Whether a completed trial of r reported metric m. */
static bool metric_reported(const sched_results *r, size_t m) {
  for (size_t t = 0; t < r->n_trials; t++)
    if (r->trials[t].status == TRIAL_COMPLETED && !isnan(r->values[t * r->n_metrics + m]))
      return true;
  return false;
}

/* ": no trial reported 'latncy_ms' (did you mean 'latency_ms'?), which 'latncy_ms <= 5'
 * needs" for the first constraint whose metric no completed trial reported (a typo in the
 * spec makes every trial infeasible), else "". Owned; NULL when memory runs out. */
static char *unreported_constraint_text(const spec *s, const sched_results *r) {
  for (size_t c = 0; c < s->n_constraints; c++) {
    const constraint_spec *k = &s->constraints[c];
    int m = sched_results_metric(r, k->metric);
    if (m >= 0 && metric_reported(r, (size_t)m)) continue;
    const char **reported = malloc((r->n_metrics ? r->n_metrics : 1) * sizeof *reported);
    if (!reported) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < r->n_metrics; i++)
      if (metric_reported(r, i)) reported[n++] = r->metric_names[i];
    const char *near = nas_nearest(k->metric, reported, n);
    char *text = nas_asprintf(": no trial reported '%s'%s%s%s, which '%s %s %.6g' needs",
                              k->metric, near ? " (did you mean '" : "", near ? near : "",
                              near ? "'?)" : "", k->metric, k->op == CONSTRAINT_LE ? "<=" : ">=",
                              k->bound);
    free(reported);
    return text;
  }
  return strdup("");
}

/* "2 trials completed; none meets every constraint", and which metric was never reported
 * (trials: "trial" or "trials", as completed says). */
static char *none_feasible_text(const spec *s, const sched_results *r, size_t completed,
                                const char *trials) {
  char *unreported = unreported_constraint_text(s, r);
  char *why = unreported ? nas_asprintf("%zu %s completed; none meets every constraint%s",
                                        completed, trials, unreported)
                         : NULL;
  free(unreported);
  return why;
}

char *sched_front_empty_why(const spec *s, const sched_results *r) {
  size_t completed = 0, feasible = 0;
  for (size_t t = 0; t < r->n_trials; t++) {
    if (r->trials[t].status != TRIAL_COMPLETED) continue;
    completed++;
    if (!sched_results_feasible(s, r, t)) continue;
    feasible++;
    if (sched_results_within_thresholds(s, r, t)) return NULL; /* so is a trial that dominates it */
  }
  if (completed == 0) return NULL;
  const char *trials = completed == 1 ? "trial" : "trials";
  if (feasible == 0) return none_feasible_text(s, r, completed, trials);
  char *thresholds = thresholds_text(s);
  char *why = thresholds ? nas_asprintf("%zu %s completed; none %sis within the objectives' "
                                        "thresholds: %s", completed, trials,
                                        feasible < completed ? "of those that meet every "
                                                               "constraint " : "",
                                        thresholds)
                         : NULL;
  free(thresholds);
  return why;
}

int sched_completed_points(const spec *s, const sched_results *r, double **Y, size_t **idx,
                           size_t *n, nas_err *err) {
  size_t m = s->n_objectives, cap = r->n_trials ? r->n_trials : 1;
  *Y = calloc(cap * m, sizeof **Y);
  *idx = malloc(cap * sizeof **idx);
  *n = 0;
  if (!*Y || !*idx) {
    free(*Y), free(*idx);
    *Y = NULL, *idx = NULL;
    return nas_errf(err, "out of memory");
  }
  for (size_t t = 0; t < r->n_trials; t++) {
    if (r->trials[t].status != TRIAL_COMPLETED || !sched_results_feasible(s, r, t)) continue;
    pareto_objectives_to_min(s, r->values + t * r->n_metrics, *Y + *n * m); /* objectives first */
    (*idx)[(*n)++] = t;
  }
  return NAS_OK;
}

int sched_front(const spec *s, const sched_results *r, size_t **idx, size_t *n, double *hv,
                double *ref, nas_err *err) {
  size_t m = s->n_objectives, k;
  double *Y;
  size_t *cand;
  if (sched_completed_points(s, r, &Y, &cand, &k, err) != NAS_OK) return NAS_ERR;
  bool *on_front = malloc((k ? k : 1) * sizeof *on_front);
  if (!on_front) {
    free(Y), free(cand);
    return nas_errf(err, "out of memory");
  }
  pareto_mask(Y, k, m, on_front);
  pareto_reference_point(s, Y, k, ref);
  *hv = pareto_hypervolume(Y, k, m, ref);
  if (isnan(*hv)) { /* hypervolume's only failure */
    free(Y), free(cand), free(on_front);
    return nas_errf(err, "hypervolume of the front: out of memory");
  }
  size_t f = 0;
  for (size_t i = 0; i < k; i++)
    if (on_front[i] && sched_results_within_thresholds(s, r, cand[i])) cand[f++] = cand[i];
  *idx = cand;
  *n = f;
  free(Y), free(on_front);
  return NAS_OK;
}
