/* scheduler: the closed loop that runs an experiment — suggest, record, launch, poll,
 * record — and the view of results every command shares.
 *
 * Every decision is written to storage before it is acted on (trial created queued →
 * launched → job id stored → polled → final status and metrics stored), so the loop holds
 * nothing it could not rebuild: sched_run on an experiment that was interrupted attaches
 * to its running jobs, launches its queued trials and carries on. */
#ifndef NAS_SCHEDULER_H
#define NAS_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/common.h"
#include "spec/spec.h"
#include "storage/storage.h"

/* How sched_run ended; the CLI maps these to exit codes (docs/cli.md). */
typedef enum {
  SCHED_FINISHED = 0,   /* the budget (trials or wall time) is spent */
  SCHED_INTERRUPTED,    /* stopped by SIGINT/SIGTERM; `nas resume` carries on */
} sched_outcome;

typedef struct {
  const char *storage_url; /* the URL st was opened with; trials get its absolute form */
  FILE *progress;        /* where progress goes (stderr by default); borrowed */
  bool progress_tty;     /* rewrite one status line instead of printing log lines */
  double poll_interval;  /* seconds between polls of running trials; default 0.2 */
} sched_options;

/* Runs (or continues) the experiment exp, whose spec is s, until its budget is spent or
 * it is interrupted. SIGINT and SIGTERM are blocked for the duration and read by the loop:
 * the first stops launching and lets running trials finish, the second stops them. */
int sched_run(const spec *s, storage *st, const experiment_row *exp,
              const sched_options *opt, sched_outcome *outcome, nas_err *err);

/* Finds the experiment of spec s in st, creating it when new. An existing experiment
 * with a different spec is refused with the differences listed, except for changes
 * confined to `budget`, which are stored and accepted. */
int sched_prepare(const spec *s, storage *st, experiment_row *exp, nas_err *err);

/* An experiment's trials with their metric values, as every command shows them. */
typedef struct {
  trial_row *trials;     /* ordered by number */
  size_t n_trials;
  char **metric_names;   /* objectives in spec order, then constraints, then any other
                            reported metric in name order */
  size_t n_metrics;
  double *values;        /* n_trials × n_metrics: the final value (else the value at the
                            highest step) of each metric; NaN where never reported */
} sched_results;

int sched_results_load(storage *st, const spec *s, int64_t experiment_id,
                       sched_results *out, nas_err *err);
void sched_results_free(sched_results *r);
/* Index of metric name in r, or -1. */
int sched_results_metric(const sched_results *r, const char *name);

/* The completed, feasible trials on the Pareto front (indices into r->trials, in trial
 * order), with the hypervolume of the front and the reference point it used (ref has
 * s->n_objectives entries, minimisation convention). Owned *idx. */
int sched_front(const spec *s, const sched_results *r, size_t **idx, size_t *n,
                double *hv, double *ref, nas_err *err);

#endif
