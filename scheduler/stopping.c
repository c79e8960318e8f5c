/* scheduler/stopping.c: the patience rule — stop when the Pareto front has stopped
 * improving. The hypervolume of all completed, feasible trials is compared with that of
 * the same set without the last `patience_trials` of them (by trial number), both against
 * the current reference point, so the two numbers are comparable. */
#include <stdlib.h>

#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"

bool sched_patience_spent(const spec *s, const sched_results *r, double *before, double *now) {
  size_t n, window = (size_t)s->budget.patience_trials, m = s->n_objectives, *idx;
  double *Y, *ref;
  *before = *now = 0;
  if (window == 0 || sched_completed_points(s, r, &Y, &idx, &n, NULL) != NAS_OK) return false;
  bool spent = false;
  if (n > window && (ref = malloc(m * sizeof *ref))) {
    pareto_reference_point(s, Y, n, ref);
    *now = pareto_hypervolume(Y, n, m, ref);
    *before = pareto_hypervolume(Y, n - window, m, ref);
    spent = *now - *before <= s->budget.patience_min_improvement * *now;
    free(ref);
  }
  free(Y), free(idx);
  return spent;
}
