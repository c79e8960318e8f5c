/* scheduler/compare.c: several experiments' fronts and hypervolumes measured against one
 * reference point, so that the numbers can be compared (each experiment's own `nas pareto`
 * infers its own point, and hypervolumes at different points say nothing about each
 * other). `nas compare` prints it, `nas serve` answers it and the dashboard draws it.
 * The common point is what `nas pareto` would infer for one experiment holding every
 * compared trial: the thresholds where all the experiments give the same, else from the
 * union of their observed values (pareto_reference_point). An experiment compared with itself
 * therefore gets exactly its `nas pareto` hypervolume. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"

/* What is worked out for one compared experiment. */
typedef struct {
  double *Y;          /* owned: its completed feasible trials, n × objectives (minimised) */
  size_t *idx, n;     /* owned: their positions in r */
  json_t *pareto;     /* owned: sched_pareto_json (its front rows) */
} compared_points;

static void points_free(compared_points *p) {
  json_decref(p->pareto);
  free(p->Y), free(p->idx);
}

static const char *goal_name(objective_goal g) { return g == GOAL_MAXIMIZE ? "maximize" : "minimize"; }

/* Refuses experiments whose objectives differ from the first one's in number, name,
 * goal or order: their hypervolumes would measure different things. */
static int same_objectives(const sched_compared *c, size_t n, nas_err *err) {
  const spec *first = c[0].s;
  for (size_t e = 1; e < n; e++) {
    const spec *s = c[e].s;
    if (s->n_objectives != first->n_objectives)
      return nas_errf(err, "'%s' has %zu objectives and '%s' %zu: only experiments with the "
                      "same objectives compare", c[0].exp->name, first->n_objectives,
                      c[e].exp->name, s->n_objectives);
    for (size_t j = 0; j < s->n_objectives; j++) {
      const objective_spec *a = &first->objectives[j], *b = &s->objectives[j];
      if (strcmp(a->name, b->name) != 0 || a->goal != b->goal)
        return nas_errf(err, "objective %zu of '%s' is %s (%s) and of '%s' %s (%s): only "
                        "experiments with the same objectives compare", j + 1, c[0].exp->name,
                        a->name, goal_name(a->goal), c[e].exp->name, b->name, goal_name(b->goal));
    }
  }
  return NAS_OK;
}

/* The common reference point (minimisation convention) into ref. */
static int common_reference(const sched_compared *c, const compared_points *p, size_t n,
                            double *ref, nas_err *err) {
  size_t m = c[0].s->n_objectives, total = 0;
  for (size_t e = 0; e < n; e++) total += p[e].n;
  double *Y = malloc((total ? total : 1) * m * sizeof *Y);
  objective_spec *objectives = malloc(m * sizeof *objectives);
  if (!Y || !objectives) {
    free(Y), free(objectives);
    return nas_errf(err, "out of memory");
  }
  for (size_t e = 0, at = 0; e < n; at += p[e].n * m, e++)
    memcpy(Y + at, p[e].Y, p[e].n * m * sizeof *Y);
  /* A threshold counts only when every experiment gives the same one; pareto_reference_point
   * infers the other coordinates. A shallow copy of the first spec says so. */
  memcpy(objectives, c[0].s->objectives, m * sizeof *objectives);
  for (size_t j = 0; j < m; j++)
    for (size_t e = 1; e < n; e++) {
      const objective_spec *o = &c[e].s->objectives[j];
      if (!o->has_threshold || o->threshold != objectives[j].threshold)
        objectives[j].has_threshold = false;
    }
  spec agreed = *c[0].s;
  agreed.objectives = objectives;
  pareto_reference_point(&agreed, Y, total, ref);
  free(Y), free(objectives);
  return NAS_OK;
}

/* The hypervolume at ref of p's trials within c's own thresholds, those its front is made
 * of: trials past them count for nothing in `nas pareto`, so they must not here either
 * (the common point ignores thresholds the experiments disagree on). NaN when out of
 * memory. */
static double front_hypervolume(const sched_compared *c, const compared_points *p,
                                const double *ref) {
  size_t m = c->s->n_objectives, k = 0;
  double *Y = malloc((p->n ? p->n : 1) * m * sizeof *Y);
  if (!Y) return NAN;
  for (size_t i = 0; i < p->n; i++)
    if (sched_results_within_thresholds(c->s, c->r, p->idx[i]))
      memcpy(Y + k++ * m, p->Y + i * m, m * sizeof *Y);
  double hv = pareto_hypervolume(Y, k, m, ref);
  free(Y);
  return hv;
}

/* Each experiment's entry at the common point ref. */
static int compared_json(const sched_compared *c, const compared_points *p, size_t n,
                         const double *ref, json_t *list, nas_err *err) {
  for (size_t e = 0; e < n; e++) {
    double hv = front_hypervolume(&c[e], &p[e], ref);
    if (isnan(hv)) return nas_errf(err, "hypervolume of '%s': out of memory", c[e].exp->name);
    const json_t *front = json_object_get(p[e].pareto, "front");
    if (json_array_append_new(list, json_pack("{s:s, s:i, s:i, s:o, s:O}", "experiment",
                                              c[e].exp->name, "trials", (int)c[e].r->n_trials,
                                              "front_size", (int)json_array_size(front),
                                              "hypervolume", sched_json_number(hv), "front",
                                              front)) != 0)
      return nas_errf(err, "out of memory");
  }
  return NAS_OK;
}

json_t *sched_compare_json(const sched_compared *c, size_t n, nas_err *err) {
  if (n == 0) {
    nas_errf(err, "no experiment to compare");
    return NULL;
  }
  compared_points *p = calloc(n, sizeof *p);
  double *ref = calloc(c[0].s->n_objectives ? c[0].s->n_objectives : 1, sizeof *ref);
  json_t *list = json_array(), *out = NULL;
  int rc = p && ref && list ? same_objectives(c, n, err) : nas_errf(err, "out of memory");
  for (size_t e = 0; rc == NAS_OK && e < n; e++) {
    rc = sched_completed_points(c[e].s, c[e].r, &p[e].Y, &p[e].idx, &p[e].n, err);
    if (rc == NAS_OK && !(p[e].pareto = sched_pareto_json(c[e].s, c[e].exp, c[e].r, err)))
      rc = NAS_ERR;
  }
  if (rc == NAS_OK) rc = common_reference(c, p, n, ref, err);
  if (rc == NAS_OK) rc = compared_json(c, p, n, ref, list, err);
  if (rc == NAS_OK) {
    out = json_pack("{s:o, s:o, s:O}", "objectives", sched_objectives_json(c[0].s),
                    "reference_point", sched_point_json(c[0].s, ref), "experiments", list);
    if (!out) nas_errf(err, "out of memory");
  }
  for (size_t e = 0; p && e < n; e++) points_free(&p[e]);
  free(p), free(ref);
  json_decref(list);
  return out;
}
