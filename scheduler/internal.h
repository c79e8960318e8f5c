/* scheduler/internal.h: the loop's state, shared by the files of scheduler/ only. */
#ifndef NAS_SCHEDULER_INTERNAL_H
#define NAS_SCHEDULER_INTERNAL_H

#include <signal.h>

#include "metrics/metrics.h"
#include "notify/notify.h"
#include "optimizer/optimizer.h"
#include "runners/runner.h"
#include "scheduler/scheduler.h"

/* Why the loop asked a job to stop, which decides what its trial becomes. */
typedef enum {
  STOP_NONE,
  STOP_REQUESTED, /* signal, `nas stop`, wall time: the trial ends stopped */
  STOP_EARLY,     /* early-stopping rule: stopped, with the verdict as its reason */
  STOP_SILENT,    /* no heartbeat for trial.heartbeat_timeout: lost, so retried */
} stop_reason;

/* A trial this process is watching: launched now or found running after a restart. */
typedef struct {
  trial_row row;        /* owned; status and log_offset kept current */
  char *run_dir;        /* owned */
  double last_heard;    /* Unix seconds of its last sign of life seen here */
  stop_reason stop;     /* why it was asked to stop, if it was */
  char *stop_why;       /* owned: what the trial will say it was stopped for (NULL: on request) */
  size_t next_rung;     /* ASHA: first rung not yet passed */
  char *log_problem;    /* owned: why its stdout.log could not be read at the last look;
                           NULL when it could */
  size_t bad_lines;     /* malformed metric lines read by this process, nothing recorded */
  char *first_bad;      /* owned: what was wrong with the first of them (NULL: none) */
} inflight;

/* Counts of trials per status, for progress and stopping decisions. */
typedef struct {
  int by_status[TRIAL_STATUS_COUNT];
  int total;
} trial_counts;

/* The experiment's lease as this scheduler holds it (lease.c). */
#define SCHED_LEASE_TOKEN_LEN 32
typedef struct {
  char token[SCHED_LEASE_TOKEN_LEN + 1]; /* random hex: this holder */
  char host[256];
  bool held;
  double renewed;                        /* monotonic seconds of the last renewal */
} sched_lease;

typedef struct {
  const spec *s;              /* borrowed */
  storage *st;                /* borrowed */
  const experiment_row *exp;  /* borrowed */
  const sched_options *opt;   /* borrowed */
  runner *rn;                 /* borrowed: opt->runner, or own_rn */
  runner *own_rn;             /* owned: the spec's runner; NULL when opt->runner is given */
  optimizer *opt_model;       /* owned */
  char *storage_url;          /* owned: absolute, handed to trials */
  inflight *jobs;             /* owned; n_jobs in flight */
  size_t n_jobs, cap_jobs;
  trial_row *queued;          /* owned: trials to launch before new ones (found queued at
                                 start-up, or requeued to retry), oldest first */
  size_t n_queued, cap_queued;
  trial_counts counts;
  trial_counts ended_here;    /* trials that ended for good during this sched_run, by
                                 status: what the failure rate is judged on */
  char *last_failure;         /* owned: "trial N: error" of the last of them that failed
                                 or timed out, which the failure-rate stop quotes (the
                                 trial that tips the rate may have completed); NULL: none */
  bool draining;              /* launch nothing more (first signal, wall time) */
  bool stopping;              /* running trials were told to stop */
  bool interrupted;           /* by a signal or `nas stop`: `nas resume` goes on */
  bool failed;                /* the run ended on an error: storage retries end at once */
  bool storage_given_up;      /* a second signal ended a wait for storage out of reach */
  sched_outcome outcome;      /* what ended (or is ending) the run */
  double early_checked;       /* monotonic time of the last early-stopping check */
  bool early_futile_said;     /* the warning that early stopping can never fire was shown */
  sched_results results;      /* owned: the results view as last loaded */
  bool results_fresh;         /* results match storage (statuses kept current in place) */
  sched_curve_set curves;     /* owned: early stopping's curves as last brought up to date */
  bool curves_fresh;          /* curves match storage but for the running trials' news */
  double deadline;            /* monotonic seconds; 0 = none */
  double started;             /* monotonic seconds when this run began */
  sigset_t waited;            /* signals the loop blocks and waits on */
  sigset_t old_mask;
  struct sigaction old_int, old_term; /* SIGINT's and SIGTERM's actions before the run */
  char *best_text;            /* owned: last summary shown, e.g. "front 4, HV 12.3" */
  int *cut_short;             /* owned: numbers of the trials this run stopped part way (a
                                 second Ctrl-C, `nas stop`, the wall time), in order */
  size_t n_cut_short;
  sched_lease lease;          /* this process's hold on the experiment */
  sched_imported imported;    /* owned: warm_start's observations, loaded once per run */
  double watch_checked;       /* monotonic: the optimizer's watch last looked at signals */
  double watch_stored;        /* … and at storage (`nas stop`, the lease) */
  bool watch_failed;          /* the watch gave up a suggestion for watch_err */
  nas_err watch_err;
  notifier *notifier;         /* owned: the spec's webhooks; NULL when it has none */
  int64_t *front_ids;         /* owned: trials on the front last announced (events.c) */
  size_t n_front_ids;
} sched;

/* views.c */
/* The last SCHED_LOG_TAIL_BYTES of run_dir/name, starting at a whole UTF-8 character, and
 * NUL-terminated (*len bytes before it); NULL when it cannot be read. Owned. */
char *sched_log_tail(const char *run_dir, const char *name, size_t *len);

/* lease.c */
/* Takes exp's lease into *mine, taking over a dead holder's; refuses with who holds it. */
int sched_lease_take(storage *st, const experiment_row *exp, sched_lease *mine, nas_err *err);
/* How long a process waits for an ask of the same experiment to finish with the lease. */
#define SCHED_ASK_WAIT_S 5.0
/* sched_lease_take, trying again for up to wait_s seconds while another process holds the
 * lease (an ask holds it for an instant). */
int sched_lease_take_waiting(storage *st, const experiment_row *exp, sched_lease *mine,
                             double wait_s, nas_err *err);
/* Renews the lease when due; an error when another process has taken it over. */
int sched_lease_keep(storage *st, const experiment_row *exp, sched_lease *mine, nas_err *err);
/* Gives the lease up (when held). */
void sched_lease_release(storage *st, const experiment_row *exp, sched_lease *mine);

/* launch.c */
/* Appends a trial to the launch queue (taking over row's contents). */
int sched_enqueue(sched *sc, trial_row *row, nas_err *err);
/* Launches a queued trial: job started, job id stored, trial tracked. A job that cannot
 * start is recorded as a failed trial (not an error of the loop). row's contents move
 * into the job list on success. */
int sched_launch(sched *sc, trial_row *row, nas_err *err);
/* Launches n queued trials as one batch (runner_start_batch: one Slurm job array). Batch
 * jobs are not held, so a crash between submitting and storing their handles can run
 * them twice; the spec asks for this trade (`runner: {array: true}`). */
int sched_launch_batch(sched *sc, trial_row *rows, size_t n, nas_err *err);
/* Adds a running trial to the job list, taking over row's contents and run_dir. */
int sched_track(sched *sc, trial_row *row, char *run_dir, nas_err *err);

/* loop.c: the checks that follow every trial that ended for good — failed to start,
 * judged after its job, or stopped — trial `number` having ended `status` with error why
 * (may be NULL): the failure rate (budget.max_failure_rate) and patience. */
int sched_trial_ended(sched *sc, int number, trial_status status, const char *why,
                      nas_err *err);

/* results cache (loop.c): one load serves every reader until storage changes. */
/* The current results, loaded when stale; NULL on error. Borrowed. */
const sched_results *sched_results_now(sched *sc, nas_err *err);
/* Storage changed in a way the cache cannot follow (trials queued again by a promotion). */
void sched_results_stale(sched *sc);
/* Trial row (new, or with new values or a new end) is read again from storage into the
 * cache, alone: reloading the whole experiment at each trial's end made a run quadratic in
 * its trials (bench/RESULTS.md, "Scale"). The cache goes stale when it cannot take it. */
void sched_results_refresh(sched *sc, const trial_row *row);
/* A trial's status changed: updated in the cache when it holds the trial. */
void sched_results_set_status(sched *sc, int64_t trial_id, trial_status status);

/* hyperband.c: multi-fidelity (scheduler.h). */
/* Promotes, for every bracket whose rung has ended (each trial in it completed, failed or
 * stopped) and is not yet decided, its best trials to the next rung: stored, then queued to
 * launch first. Deciding again after a crash picks the same trials. Nothing while draining. */
int sched_hyperband_promote(sched *sc, nas_err *err);
/* Appends to env (at *n) what a trial of multi-fidelity needs to know: NAS_EPOCHS,
 * NAS_FIRST_EPOCH, NAS_MAX_EPOCHS, NAS_SAVE_DIR and NAS_RESUME_DIR (docs/spec.md); none
 * without multi_fidelity. Entries are owned by env (NULL when out of memory). */
void sched_hyperband_env(const sched *sc, const trial_row *row, char **env, size_t *n);
#define SCHED_HYPERBAND_ENV_MAX 5

/* events.c: webhooks (notify/notify.h); none of these can fail the run. */
/* Starts the spec's webhooks, if any, and notes the current front. */
void sched_events_start(sched *sc);
/* A trial ended as row->status says (why: its error, may be NULL): trial_completed or
 * trial_failed, then front_changed when the trials on the front changed. */
void sched_events_trial_end(sched *sc, const trial_row *row, const char *why);
/* The run ended with its budget spent: experiment_finished (counts as in sc->counts). */
void sched_events_finished(sched *sc);
/* Flushes (at most NOTIFY_FLUSH_S) and stops the webhooks. */
void sched_events_stop(sched *sc);
/* Notes the current front, so that the next trial_end can tell whether it changed. */
void sched_events_note_front(sched *sc);
/* ask/tell (ask.c), on a context holding only st, s, exp and a borrowed notifier: a trial
 * ended by a tell, as sched_events_trial_end (storage has changed since the front was
 * noted). ask.c decides whether the experiment finished with it. */
void sched_events_told(sched *sc, const trial_row *row, const char *why);
/* Frees what events.c and the results cache hold, leaving the notifier open. */
void sched_events_release(sched *sc);

/* ask.c: whether t is running in the hands of an asker (`nas ask`, `nas serve`), not as a
 * runner's job: its job id starts SCHED_ASK_PREFIX. */
bool sched_handed_out(const trial_row *t);

/* progress.c */
/* Shows a trial's new state; what (may be NULL) says why it ended, or for a running
 * trial replaces "started" (e.g. "re-attached"). */
void sched_progress_event(sched *sc, const trial_row *row, const char *what);
void sched_progress_tick(sched *sc);
void sched_progress_done(sched *sc);
/* "f1=1.23 f2=4.5": the objective values of trial trial_id in r (empty when r lacks it);
 * cap bytes at buf. */
void sched_objectives_text(const sched *sc, const sched_results *r, int64_t trial_id,
                           char *buf, size_t cap);
/* A trial moved from one status to another (from TRIAL_STATUS_COUNT: newly counted, as
 * at start-up); keeps sc->counts and sc->ended_here. */
void sched_count(sched *sc, trial_status from, trial_status to);

#endif
