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

#include <jansson.h>

#include "common/common.h"
#include "notify/notify.h"
#include "optimizer/optimizer.h"
#include "runners/runner.h"
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
  runner *runner;        /* borrowed: where trials run; NULL (what `nas run` passes) for the
                            runner the spec names, created and freed by sched_run. The
                            scheduler's unit tests pass a scripted fake here. */
  bool stop_only;        /* `nas stop` with no scheduler alive: re-attach to the running
                            trials, stop them, record how they ended, launch nothing */
  const char *storage_hint; /* " --storage URL" for the commands hints name, or NULL */
} sched_options;

/* Runs (or continues) the experiment exp, whose spec is s, until its budget is spent or
 * it is interrupted. SIGINT and SIGTERM are blocked for the duration and read by the loop,
 * and by st's watch while its server is out of reach (the second signal then ends that
 * wait: the run ends with NAS_ECANCELED, *outcome SCHED_INTERRUPTED and err saying what
 * was not stored, naming the trials it leaves): the first stops launching and lets
 * running trials finish, the second stops them. Runs
 * on the process's main thread: other threads hand these signals on to it. */
int sched_run(const spec *s, storage *st, const experiment_row *exp,
              const sched_options *opt, sched_outcome *outcome, nas_err *err);

/* ---- one scheduler per experiment (lease.c) ----------------------------------------------
 * sched_run holds the experiment's lease in storage while it runs and renews it every few
 * seconds; a second sched_run of the same experiment is refused. */

/* A lease not renewed for this long belongs to a scheduler that died (docs/cli.md). */
#define SCHED_LEASE_TIMEOUT_S 30.0

typedef enum {
  SCHEDULER_NONE,  /* no lease: nothing runs the experiment */
  SCHEDULER_ALIVE, /* a scheduler holds the lease and renews it */
  SCHEDULER_DEAD,  /* a lease is left by a scheduler that is gone; the next one takes it */
} sched_liveness;

/* Whether the holder of lease is gone: its heartbeat older than SCHED_LEASE_TIMEOUT_S at
 * Unix time now, or it ran on this host and its pid no longer exists. */
bool sched_lease_holder_dead(const storage_lease *lease, double now);
/* "none", "alive" or "dead", as `nas status` and the API's summary name it. Static. */
const char *sched_liveness_name(sched_liveness state);
/* Whether a scheduler runs exp; *text (owned, NULL for SCHEDULER_NONE) describes it. */
int sched_scheduler_state(storage *st, const experiment_row *exp, sched_liveness *state,
                          char **text, nas_err *err);

/* What sched_stop did. */
typedef struct {
  bool was_finished; /* the experiment had spent its budget: left as it was */
  size_t asked;      /* running trials whose jobs were asked to stop */
} sched_stopped;

/* Marks the experiment stopped (a live sched_run sees it and ends) and asks the runner
 * of every running trial to stop its job; a finished experiment stays finished. Trials
 * that could not be reached are reported on `report` (may be NULL), one line each. */
int sched_stop(const spec *s, storage *st, const experiment_row *exp, FILE *report,
               sched_stopped *done, nas_err *err);

/* Queues trials of exp again (`nas retry`): those numbered in numbers[0..n-1] (failed,
 * timed-out or stopped), or every failed and timed-out one when n is 0. They keep their
 * attempts and count once in the budget (they are the same trials); the next sched_run launches
 * them first. A number naming no trial, or a trial in any other status, refuses the whole
 * request before anything changes. Each trial queued again is reported on `report` (may be
 * NULL), one line each; *retried gets how many were. */
int sched_retry(storage *st, const experiment_row *exp, const int *numbers, size_t n,
                FILE *report, size_t *retried, nas_err *err);

/* ---- managing whole experiments (manage.c) ---------------------------------------------- */

/* runs/<name> under exp's run_root: the folder of all its trials' run folders. Owned. */
char *sched_experiment_runs_dir(const experiment_row *exp);
/* Deletes exp with its trials, metrics and lease (one transaction) and, with runs, its run
 * folder runs/<name>/ under its run_root (a link there is refused, never followed). Refused
 * while its scheduler runs. What was removed is said on report (may be NULL). */
int sched_delete(storage *st, const experiment_row *exp, bool runs, FILE *report,
                 nas_err *err);
/* Renames exp (whose spec is s) to new_name: the stored spec's `name:` changes with it, and
 * runs/<old> becomes runs/<new> (put back if storage then refuses; if that fails too, the
 * error says where the folder is and which name storage kept). Refused while its
 * scheduler runs or a trial of it is running, and when new_name is taken (NAS_EEXIST). */
int sched_rename(storage *st, const spec *s, const experiment_row *exp, const char *new_name,
                 FILE *report, nas_err *err);
/* Stores a copy of exp (spec s, in storage from) named new_name in `to` (which may be
 * from): its trials with every field, their metrics and curves, its status and run_root, in
 * one transaction; not its lease nor its run folders. Refused while a trial is running.
 * An experiment more than one request to a `nas serve` holds (metric_report_full over its
 * trials and observations together) goes in steps instead (docs/cli.md, nas copy): under
 * the name NEW_NAME.incomplete, stopped, until all is stored and it takes new_name; a
 * failure on the way leaves it so, said in err. */
int sched_copy(storage *from, const spec *s, const experiment_row *exp, storage *to,
               const char *new_name, nas_err *err);
/* Stores the full assignment params (spec_check_params holds) as a queued trial of exp:
 * the next run launches it before any suggestion, and it counts in the budget. */
int sched_trial_enqueue(storage *st, const experiment_row *exp, const json_t *params,
                        trial_row *out, nas_err *err);
/* The last trial of exp numbered below `below` whose parameters are params (numbers
 * compared by value), into *number and *status; *number -1 when none. An enqueue that
 * repeats a configuration says so. */
int sched_trial_twin(storage *st, const experiment_row *exp, const json_t *params, int below,
                     int *number, trial_status *status, nas_err *err);

/* The run folder of a trial's attempt: runs/<experiment>/<number> for the first,
 * runs/<experiment>/<number>.<attempt> for later ones, under the experiment's run_root.
 * Owned. */
char *sched_run_dir(const experiment_row *exp, int number, int attempt);

/* The spec an experiment was stored with, parsed again (relative paths against the folder
 * of the file it came from; its path is that file's, for messages). */
int sched_experiment_spec(const experiment_row *exp, spec **out, nas_err *err);

/* Checks the runner's and the optimizer's options of s as those plug-ins read them, all
 * together (some hold only with others), and reports a refusal at the place of the option
 * that causes it ("exp.yaml:12:16: optimizer.n_initial: ..."). The spec module cannot
 * check them itself (the plug-ins depend on spec/, not the reverse). Call it before storing
 * anything of a spec: a stored experiment whose options are refused cannot be run. */
int sched_check_spec(const spec *s, nas_err *err);
/* Whether the spec's trials run something a runner can launch (else the experiment is for
 * ask and tell only); what `nas run` checks before storing anything, and sched_run again. */
int sched_check_runnable(const spec *s, nas_err *err);

/* Finds the experiment of spec s in st, creating it when new. An existing experiment
 * with a different spec is refused with the differences listed, except for changes
 * confined to `budget` and `notify`, which are stored and accepted; one stopped is marked
 * running again, unless a scheduler still holds it. A new experiment is
 * stored with the spec's `enqueue:` assignments as queued trials, in the same transaction,
 * so they are queued exactly once. */
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
  size_t room;           /* trials (and rows of values) allocated, for sched_results_put */
} sched_results;

int sched_results_load(storage *st, const spec *s, int64_t experiment_id,
                       sched_results *out, nas_err *err);
void sched_results_free(sched_results *r);
/* The same for trial `number` of exp alone (its row and its own observations, without
 * reading the rest of the experiment); NAS_ENOTFOUND when there is none. */
int sched_results_of_trial(storage *st, const spec *s, const experiment_row *exp, int number,
                           sched_results *out, nas_err *err);
/* Puts the trial of one (as sched_results_of_trial gives it) into r: in place of r's row of
 * that trial, or after r's last trial when it is numbered after it; one's trial row moves
 * into r. NAS_ENOTFOUND, r unchanged, when it fits neither way or one has a metric that r
 * has no column for: load r again then. */
int sched_results_put(sched_results *r, sched_results *one, nas_err *err);
/* Index of metric name in r, or -1. */
int sched_results_metric(const sched_results *r, const char *name);
/* The first objective of s that neither trial trial_id's results in r nor obs (final
 * values about to be stored with it; NULL when n is 0) hold, or NULL when it has them all.
 * Points into s. */
const char *sched_results_missing_objective(const spec *s, const sched_results *r,
                                            int64_t trial_id, const metric_obs *obs, size_t n);
/* Whether trial r->trials[t] met every outcome constraint. */
bool sched_results_feasible(const spec *s, const sched_results *r, size_t t);
/* Whether trial r->trials[t] is within every objective threshold the spec gives (the worst
 * values still worth having): only such trials are on a front. */
bool sched_results_within_thresholds(const spec *s, const sched_results *r, size_t t);

/* The completed trials that meet every constraint, as rows of Y (n × n_objectives,
 * minimisation convention, in trial order) with their indices into r->trials. Owned. */
int sched_completed_points(const spec *s, const sched_results *r, double **Y, size_t **idx,
                           size_t *n, nas_err *err);

/* The completed, feasible trials on the Pareto front that are within every objective
 * threshold given (indices into r->trials, in trial order), with the hypervolume of the front and the reference point it used (ref has
 * s->n_objectives entries, minimisation convention). Owned *idx. */
int sched_front(const spec *s, const sched_results *r, size_t **idx, size_t *n,
                double *hv, double *ref, nas_err *err);

/* Why sched_front finds no trial although trials completed: none met the constraints, or
 * none that did is within the objectives' thresholds ("2 trials completed; none is within
 * the objectives' thresholds: a <= -5"), naming a constraint's metric that no trial
 * reported. NULL when the front has a trial, no trial
 * completed, or memory runs out. Owned. */
char *sched_front_empty_why(const spec *s, const sched_results *r);

/* ---- multi-fidelity (hyperband.c) ------------------------------------------------------
 * spec.multi_fidelity's Hyperband: trials are dealt, by number, into brackets s = s_max …
 * 0, round after round; bracket s starts n_0 trials at r_0 epochs, and rung i keeps
 * n_i = n_0 / eta^i of them (the best, by dominance over the objectives) for r_i epochs,
 * r_s being max_epochs. A promoted trial goes on from the weights its last rung saved. */
typedef struct {
  int bracket;      /* s */
  int first_number; /* number of its first trial */
  int n_trials;     /* n_0: the trials it starts */
  int n_rungs;      /* s + 1 */
} sched_bracket;

/* s_max: the largest s with min_epochs·eta^s <= max_epochs. */
int sched_hyperband_top(const multi_fidelity_spec *mf);
/* The bracket trial `number` belongs to. */
void sched_hyperband_bracket_of(const multi_fidelity_spec *mf, int number, sched_bracket *out);
/* n_i and r_i of bracket s's rung i. */
int sched_hyperband_trials(const multi_fidelity_spec *mf, int s, int rung);
int sched_hyperband_epochs(const multi_fidelity_spec *mf, int s, int rung);
/* The epochs trial `number` trained in its run at `rung` (from the previous rung's weights). */
int sched_hyperband_epochs_run(const multi_fidelity_spec *mf, int number, int rung);
/* The epochs a trial trains on average, rungs together, over one round of brackets. */
double sched_hyperband_epochs_per_trial(const multi_fidelity_spec *mf);

/* ---- warm start (warm_start.c) ------------------------------------------------------------ */

/* Observations imported from the experiments spec.warm_start names: their completed trials
 * that fit this space (spec_check_params, after warm_start.fill) and reported every
 * objective and constraint of this spec. Not trials of this experiment: no budget, front
 * or stopping rule counts them. */
typedef struct {
  json_t **params;   /* owned: n full assignments of this space */
  double *values;    /* n × (objectives, then constraints): the metric values as reported */
  size_t n;
  size_t skipped;    /* completed trials left out: they did not fit, or lacked a metric */
} sched_imported;

/* Loads them (none when the spec has no warm_start); an error naming an experiment that is
 * not in st. */
int sched_imported_load(storage *st, const spec *s, sched_imported *out, nas_err *err);
void sched_imported_free(sched_imported *im);

/* ---- suggestions (suggest.c) -------------------------------------------------------------- */

/* How many trials the budget allows in all, as far as can be told: budget.trials, or under
 * budget.wall_time fewer when `parallel` slots fit fewer in one run at the median duration
 * of the trials completed so far (none yet: budget.trials); under Hyperband at the median
 * duration of an epoch times the epochs a trial trains on average over a round of
 * brackets. sched_suggest hands it to the optimizer (optimizer_set_trials_expected). */
size_t sched_trials_expected(const spec *s, const sched_results *r);

/* Asks opt for n trials given the results r (completed trials observed, queued and running
 * ones pending) and the imported observations (may be NULL), and stores them queued in
 * exp, each with the reference point it aimed at; *rows gets them (owned, n of them).
 * NAS_ENOTFOUND when a finite space is used up, NAS_ECANCELED when opt's watch gave up. */
int sched_suggest(storage *st, const spec *s, const experiment_row *exp, optimizer *opt,
                  const sched_results *r, const sched_imported *imported, size_t n,
                  trial_row **rows, nas_err *err);

/* ---- ask and tell (ask.c) ---------------------------------------------------------------
 * An experiment driven by the user's own loop: ask hands out running trials, tell stores
 * their metrics and ends them. Handed-out trials carry job ids starting SCHED_ASK_PREFIX;
 * one silent for longer than trial.heartbeat_timeout (default 10 minutes) is handed out
 * again (until trial.max_attempts) by a later ask. */
#define SCHED_ASK_PREFIX "ask:"

/* Whether trial t was last handed out by an asker (its job id starts SCHED_ASK_PREFIX),
 * whatever its status now: it ran in the asker's own loop, not as a runner's job. */
bool sched_asked(const trial_row *t);

/* Trial `number` of exp (owned row); NAS_ENOTFOUND when there is none. */
int sched_trial_find(storage *st, const experiment_row *exp, int number, trial_row *out,
                     nas_err *err);
/* Hands out up to n trials to worker (a name for people; may be NULL): queued ones first,
 * then new suggestions, within the trial budget; *out gets *n_out started rows (owned).
 * NAS_ENOTFOUND when the budget is spent, NAS_EEXIST when a scheduler runs the experiment
 * or it is stopped. A finished experiment that hands out a trial (queued by retry or
 * enqueue, or within a raised budget) is marked running again. A silent trial failed for
 * good on the way is ended as sched_tell_fail ends one (nt: NULL for no webhooks). */
int sched_ask(storage *st, const spec *s, const experiment_row *exp, size_t n,
              const char *worker, notifier *nt, trial_row **out, size_t *n_out, nas_err *err);
/* Stores metrics of running trial `number` (intermediate ones with steps >= 0) as a sign
 * of life; *stop says whether the early-stopping rule stopped the trial (it is then ended
 * as stopped). NAS_EEXIST for a trial that is not running, NAS_ENOTFOUND for none.
 * attempt as sched_tell_complete says: an asker whose attempt was handed out again must
 * neither write into the new attempt's learning curve nor keep it alive. */
int sched_tell_report(storage *st, const spec *s, const experiment_row *exp, int number,
                      int attempt, const metric_obs *obs, size_t n, bool *stop, nas_err *err);
/* What trial `number`, just ended as stopped by a report's early-stopping verdict
 * (sched_tell_report's *stop), means for the experiment: when it was the last of the
 * budget to end, the experiment is marked finished and experiment_finished posted to nt
 * (borrowed; NULL: no webhooks; a stopped trial has no event of its own). Called once the
 * report is stored; failures are logged. */
void sched_tell_stopped_end(storage *st, const spec *s, const experiment_row *exp,
                            int number, notifier *nt);
/* Stores the final metrics (may be none) and ends the trial completed; NAS_EINVAL, and the
 * trial left running, when an objective was never reported. attempt: the one the asker was
 * handed (trial_row.attempts), or 0 for whichever runs; NAS_EEXIST, naming both, when the
 * trial was handed out again since and runs another. When it was the last trial of
 * the budget to end (none queued or running), the experiment is marked finished. With a
 * notifier (borrowed, started from s's notify: section; NULL for none) the end is posted
 * as a run posts it: trial_completed, front_changed when the trial joined the front,
 * experiment_finished when the experiment finished. */
int sched_tell_complete(storage *st, const spec *s, const experiment_row *exp, int number,
                        int attempt, const metric_obs *obs, size_t n, notifier *nt,
                        nas_err *err);
/* Ends the running trial failed with why (may be NULL); attempt, the experiment finished
 * and trial_failed (and experiment_finished) posted as sched_tell_complete says. */
int sched_tell_fail(storage *st, const spec *s, const experiment_row *exp, int number,
                    int attempt, const char *why, notifier *nt, nas_err *err);
/* A sign of life of the running trial; attempt as sched_tell_report says. */
int sched_tell_heartbeat(storage *st, const experiment_row *exp, int number, int attempt,
                         nas_err *err);

/* ---- results as JSON (views.c): what `nas pareto --format json` and `nas serve` give out */

/* v as a JSON real, or null where it is not finite (JSON has no inf nor NaN: a
 * hypervolume of readings near 1e300 overflows a double). Owned. */
json_t *sched_json_number(double v);
/* A reference point ref (one value per objective, in the minimisation convention) as
 * {objective: value}, each value in its objective's own direction. Owned; NULL when out of
 * memory. */
json_t *sched_point_json(const spec *s, const double *ref);
/* {"experiment", "hypervolume" (null past the largest double), "reference_point":
 * {objective: value}, "front": [{"trial", each objective, each parameter}]}, the front
 * sorted by the first objective. Owned. */
json_t *sched_pareto_json(const spec *s, const experiment_row *exp, const sched_results *r,
                          nas_err *err);
/* The gp model's posterior means of the objectives at each trial's parameters
 * (optimizer_model_means; means: n_trials × n_objectives, NaN for trials not completed). */
int sched_model_means(const spec *s, const sched_results *r, double *means, nas_err *err);
/* `nas pareto --model`: the front of the model's posterior means over the completed trials
 * that meet every constraint, as sched_pareto_json's front rows (observed values) with
 * "model": {objective: posterior mean}, sorted by the first objective's mean. Owned. */
json_t *sched_model_front_json(const spec *s, const sched_results *r, nas_err *err);
/* One trial r->trials[i]: number, status, params, metrics (final values), attempts,
 * times, error, reference point, rung (multi-fidelity; 0 for every other trial). Owned;
 * NULL when out of memory. */
json_t *sched_trial_json(const sched_results *r, size_t i);
/* The bytes of stdout.log and stderr.log a trial in full carries. */
#define SCHED_LOG_TAIL_BYTES 4096
/* One trial in full (`nas trial`, GET …/trials/N): sched_trial_json's fields and job_id,
 * intermediate ({metric: [[step, value, time], …]}), run_dir (its current attempt's run
 * folder), stdout_tail and stderr_tail (the last SCHED_LOG_TAIL_BYTES of each log, null
 * when unreadable), model ({"weights": path, "about": model.json} when a built-in trial
 * saved one there, else null). Owned. */
json_t *sched_trial_detail_json(storage *st, const experiment_row *exp, const sched_results *r,
                                size_t i, nas_err *err);
/* The whole experiment as `nas export` writes it (docs/cli.md, "nas export"): {"format":
 * SCHED_EXPORT_FORMAT, "version": SCHED_EXPORT_VERSION, "exported_at", "experiment": {name,
 * status, created_at, spec (its storage password masked), spec_path, run_root}, "trials":
 * [sched_trial_json, with "intermediate" when curves]}. Owned. */
#define SCHED_EXPORT_FORMAT "nas-experiment"
#define SCHED_EXPORT_VERSION 1
json_t *sched_export_json(storage *st, const spec *s, const experiment_row *exp,
                          const sched_results *r, bool curves, nas_err *err);
/* An experiment's summary: status, spec, counts by status, progress against the budget,
 * when it last changed, hypervolume and front size (and the best value of one objective),
 * and whether a scheduler runs it. known_pareto: sched_pareto_json of the same results
 * when the caller has it (the front is then not worked out again), else NULL. Owned. */
json_t *sched_experiment_json(storage *st, const spec *s, const experiment_row *exp,
                              const sched_results *r, const json_t *known_pareto, nas_err *err);
/* Every experiment's summary (sched_experiment_json), in creation order: {"experiments":
 * [...]}, what `nas status --format json` prints and GET /api/v1/experiments answers. One
 * whose stored spec no longer loads is listed as {"name", "status", "created_at", "error"}
 * so that it does not hide the others. Into an owned *out; the code of a storage failure. */
int sched_experiment_list_json(storage *st, json_t **out, nas_err *err);

/* ---- the dashboard's data (dashboard.c): GET …/dashboard and `nas plot` ---------------- */

/* What the dashboard draws for one experiment (docs/api.md, "The dashboard's data"): its
 * summary, objectives, parameter and metric names, the trials as columns, its Pareto
 * front and the hypervolume after each part of its completed trials. O(n log n) in the
 * trials. Owned. */
json_t *sched_dashboard_json(storage *st, const spec *s, const experiment_row *exp,
                             const sched_results *r, nas_err *err);
/* Every intermediate value of r's trials, {metric: {"trial": [number…], "steps": [[step…]…],
 * "values": [[value…]…]}}, for the learning curves. Linear in the observations. Owned. */
json_t *sched_curves_json(storage *st, const experiment_row *exp, const sched_results *r,
                          nas_err *err);
/* [{"name", "goal": "minimize" | "maximize"}] of s's objectives. Owned. */
json_t *sched_objectives_json(const spec *s);

/* ---- comparing experiments (compare.c): `nas compare`, GET /api/v1/compare ----------- */

/* One experiment to compare (borrowed). */
typedef struct {
  const experiment_row *exp;
  const spec *s;
  const sched_results *r;
} sched_compared;

/* The experiments' fronts and hypervolumes at one common reference point (the objectives'
 * thresholds where every experiment gives the same, else inferred from the values of all
 * their trials): {"objectives", "reference_point": {objective: value}, "experiments": [{experiment,
 * trials, front_size, hypervolume, front}]}. Refuses experiments whose objectives differ
 * in number, names, goals or order. Owned. */
json_t *sched_compare_json(const sched_compared *c, size_t n, nas_err *err);

/* ---- early stopping ---------------------------------------------------------------------
 * A trial's learning curve: the steps at which it reported intermediate values of the
 * judged objectives (spec.early_stopping.objectives) and, for each step, the value of each
 * at that step (its last report at or before it), in the minimisation convention; NaN
 * until first reported. A judged objective that no trial reports with a step (a built-in
 * trial's params, reported only at the end) is 0 in every curve: it takes no part in the
 * comparison, and the objectives reported per step decide. */
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

/* Curves kept up to date one trial at a time, as the loop judges its running trials: a
 * report then costs that trial's observations, not the experiment's. */
typedef struct {
  sched_curve *curves; /* owned: as sched_curves_load gives them, in any order */
  size_t n, room;      /* curves held, and allocated */
  bool *reported;      /* owned: per judged objective, whether some curve reports it */
} sched_curve_set;

int sched_curve_set_load(storage *st, const spec *s, int64_t experiment_id,
                         sched_curve_set *out, nas_err *err);
/* Replaces trial_id's curve in set by one built from rows (all its observations, in
 * storage's order; reordered), as a fresh load would give it. *stale: the trial reports a
 * judged objective no other trial reported, which the others' curves left out (see
 * sched_curve), so set is unchanged and only a load brings it up to date. */
int sched_curve_set_put(const spec *s, sched_curve_set *set, int64_t trial_id,
                        metric_row *rows, size_t n_rows, bool *stale, nas_err *err);
void sched_curve_set_free(sched_curve_set *set);

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

/* Whether spec.early_stopping can never stop a trial, judged from the spec alone: a
 * built-in trial reports only METRIC_PER_EPOCH with a step, and none of the judged
 * objectives is it; or the budget has fewer trials than min_trials + 1. When so, why
 * (cap bytes) says which. */
bool sched_early_stop_futile(const spec *s, char *why, size_t cap);

/* Whether the hypervolume of the front grew by less than budget.patience_min_improvement
 * (a share of the current hypervolume) over the last budget.patience_trials completed
 * trials; *before and *now get the two hypervolumes. */
bool sched_patience_spent(const spec *s, const sched_results *r, double *before, double *now);

#endif
