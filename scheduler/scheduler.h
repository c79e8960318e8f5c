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
  SCHED_FINISHED = 0,      /* a budget is spent: trials, wall time, patience, or the space */
  SCHED_INTERRUPTED,       /* stopped by a signal or `nas stop`; `nas resume` carries on */
  SCHED_TOO_MANY_FAILURES, /* more than budget.max_failure_rate of ended trials failed */
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

/* Marks the experiment stopped (a live sched_run sees it and ends) and asks the runner
 * of every running trial to stop its job. Trials that could not be reached are reported
 * on `report` (may be NULL), one line each. */
int sched_stop(const spec *s, storage *st, const experiment_row *exp, FILE *report,
               nas_err *err);

/* The run folder of a trial's attempt: runs/<experiment>/<number> for the first,
 * runs/<experiment>/<number>.<attempt> for later ones, under the experiment's run_root.
 * Owned. */
char *sched_run_dir(const experiment_row *exp, int number, int attempt);

/* The spec an experiment was stored with, parsed again (relative paths against the folder
 * of the file it came from). */
int sched_experiment_spec(const experiment_row *exp, spec **out, nas_err *err);

/* Checks the runner's and the optimizer's options of s as those plug-ins read them, each
 * option on its own first, so that a bad one is reported at the place it was written
 * ("exp.yaml:12:16: optimizer.n_initial: ..."), then all together. The spec module cannot
 * check them itself (the plug-ins depend on spec/, not the reverse). Call it before storing
 * anything of a spec: a stored experiment whose options are refused cannot be run. */
int sched_check_spec(const spec *s, nas_err *err);

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

/* The completed trials that meet every constraint, as rows of Y (n × n_objectives,
 * minimisation convention, in trial order) with their indices into r->trials. Owned. */
int sched_completed_points(const spec *s, const sched_results *r, double **Y, size_t **idx,
                           size_t *n, nas_err *err);

/* The completed, feasible trials on the Pareto front that are within every objective
 * threshold given (indices into r->trials, in trial order), with the hypervolume of the front and the reference point it used (ref has
 * s->n_objectives entries, minimisation convention). Owned *idx. */
int sched_front(const spec *s, const sched_results *r, size_t **idx, size_t *n,
                double *hv, double *ref, nas_err *err);

/* ---- early stopping ---------------------------------------------------------------------
 * A trial's learning curve: the steps at which it reported intermediate values of the
 * judged objectives (spec.early_stopping.objectives) and, for each step, the value of each
 * at that step (its last report at or before it), in the minimisation convention; NaN
 * until first reported. */
typedef struct {
  int64_t trial_id;
  size_t n_steps;
  int64_t *steps;   /* ascending */
  double *values;   /* n_steps × spec.early_stopping.n_objectives */
} sched_curve;

/* Every trial's curve (trials with no intermediate values have none). Owned. */
int sched_curves_load(storage *st, const spec *s, int64_t experiment_id, sched_curve **out,
                      size_t *n, nas_err *err);
void sched_curves_free(sched_curve *curves, size_t n);

typedef struct {
  bool stop;          /* the trial should stop */
  int64_t step;       /* the step it was judged at */
  size_t better;      /* other trials that did better there (dominated it) */
  size_t compared;    /* other trials that had reached that step */
} sched_verdict;

/* Judges curves[candidate] against the others by spec.early_stopping's rule. For ASHA,
 * *next_rung (start at 0) is the first rung not yet passed and moves past those the trial
 * survives. A decision needs min_trials other trials at the step; without them the trial
 * goes on. */
void sched_early_stop_judge(const spec *s, const sched_curve *curves, size_t n,
                            size_t candidate, size_t *next_rung, sched_verdict *out);

/* Whether the hypervolume of the front grew by less than budget.patience_min_improvement
 * (a share of the current hypervolume) over the last budget.patience_trials completed
 * trials; *before and *now get the two hypervolumes. */
bool sched_patience_spent(const spec *s, const sched_results *r, double *before, double *now);

#endif
