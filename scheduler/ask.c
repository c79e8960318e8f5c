/* scheduler/ask.c: ask and tell — an experiment driven by the user's own training loop
 * (`nas ask`/`nas tell`, `nas serve`'s /ask, /report, /complete, /fail) instead of a runner.
 *
 * ask hands out running trials: queued ones first (requeued lost trials), then new
 * suggestions of the experiment's own optimizer, which sees every queued and running trial
 * as pending. It holds the experiment's lease while it suggests, so two askers never get
 * the same point and a live `nas run` of the experiment refuses it. A trial handed out is
 * kept alive by its reports and heartbeats; one silent for longer than
 * trial.heartbeat_timeout (default ASK_DEFAULT_TIMEOUT_S) is handled as a lost job is:
 * queued again until trial.max_attempts, then failed. tell stores what the loop measured,
 * answers whether the early-stopping rule stops the trial, and ends trials. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scheduler/internal.h"

/* A handed-out trial silent this long is lost, unless the spec sets trial.heartbeat_timeout. */
#define ASK_DEFAULT_TIMEOUT_S 600.0

int sched_trial_find(storage *st, const experiment_row *exp, int number, trial_row *out,
                     nas_err *err) {
  int rc = storage_trial_find(st, exp->id, number, out, err);
  if (rc == NAS_ENOTFOUND)
    return nas_errc(err, NAS_ENOTFOUND, "experiment '%s' has no trial %d", exp->name, number);
  return rc;
}

bool sched_asked(const trial_row *t) {
  return t->job_id && strncmp(t->job_id, SCHED_ASK_PREFIX, strlen(SCHED_ASK_PREFIX)) == 0;
}

bool sched_handed_out(const trial_row *t) { return t->status == TRIAL_RUNNING && sched_asked(t); }

/* events.c's context for the webhooks of one tell (nt borrowed, may be NULL): the front
 * before the trial ends is noted, so that its end can say whether it changed. */
static void tell_events_begin(sched *sc, storage *st, const spec *s, const experiment_row *exp,
                              notifier *nt) {
  memset(sc, 0, sizeof *sc);
  sc->st = st, sc->s = s, sc->exp = exp, sc->notifier = nt;
  if (nt) sched_events_note_front(sc);
}

/* Whether every trial the budget allows exists and has ended, as a run ends with its
 * budget spent (SCHED_FINISHED), by the experiment's trials as they are since the tell;
 * counts them into sc for experiment_finished. Storage counts them: every tell asks, and
 * the trials' rows are not needed. */
static int budget_spent_now(sched *sc, bool *spent, nas_err *err) {
  int64_t by_status[TRIAL_STATUS_COUNT];
  if (storage_trial_counts(sc->st, sc->exp->id, by_status, err) != NAS_OK) return NAS_ERR;
  memset(&sc->counts, 0, sizeof sc->counts);
  bool ended = true;
  for (int status = 0; status < TRIAL_STATUS_COUNT; status++) {
    sc->counts.by_status[status] = (int)by_status[status];
    sc->counts.total += (int)by_status[status];
    ended &= by_status[status] == 0 || trial_status_final((trial_status)status);
  }
  *spent = ended && sc->counts.total >= sc->s->budget.max_trials;
  return NAS_OK;
}

/* The one place an ask-and-tell experiment finishes: once a trial's end leaves the budget
 * spent and no trial queued or running, the experiment is marked finished and then
 * experiment_finished posted, so its status and the webhook always agree. Two last tells
 * at once both see every trial ended; only the one whose update changed the status posts.
 * A failure is logged, not returned: the trial's end is stored already. */
static void finish_if_spent(sched *sc) {
  nas_err err;
  bool spent = false, changed = false;
  int rc = budget_spent_now(sc, &spent, &err);
  if (rc == NAS_OK && !spent) return;
  if (rc == NAS_OK &&
      storage_experiment_set_status(sc->st, sc->exp->id, "finished", &changed, &err) == NAS_OK) {
    if (changed) sched_events_finished(sc);
    return;
  }
  nas_log("%s: its budget is spent but it is not marked finished: %s", sc->exp->name, err.msg);
}

/* Posts the end of trial t as status (ended NULL: it did not end), finishes the experiment
 * when that was the last trial of its budget, and frees sc. */
static void tell_events_end(sched *sc, const trial_row *ended, trial_status status,
                            const char *why) {
  if (ended) {
    trial_row row = *ended;
    row.status = status;
    if (sc->notifier) sched_events_told(sc, &row, why);
    finish_if_spent(sc);
  }
  sched_events_release(sc);
}

/* Requeues (or fails, after max_attempts) the handed-out trials that went silent; a failed
 * one is told to the webhooks (nt, may be NULL) as a run tells a lost job's failure. */
static int expire_silent(storage *st, const spec *s, const experiment_row *exp, notifier *nt,
                         nas_err *err) {
  double timeout = s->trial.heartbeat_timeout_s > 0 ? s->trial.heartbeat_timeout_s : ASK_DEFAULT_TIMEOUT_S;
  double now = nas_now();
  trial_row *rows;
  size_t n;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  int rc = NAS_OK;
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    const trial_row *t = &rows[i];
    double heard = t->heartbeat_at > t->started_at ? t->heartbeat_at : t->started_at;
    if (!sched_handed_out(t) || now - heard <= timeout) continue;
    bool again = t->attempts < s->trial.max_attempts;
    char *why = nas_asprintf("lost (no report nor heartbeat for %.0f s)%s", now - heard,
                             again ? "; handed out again" : "");
    sched sc;
    tell_events_begin(&sc, st, s, exp, again ? NULL : nt);
    rc = why ? storage_trial_finish(st, t->id, again ? TRIAL_QUEUED : TRIAL_FAILED, false, 0,
                                    why, err)
             : nas_errf(err, "out of memory");
    tell_events_end(&sc, rc == NAS_OK ? t : NULL, TRIAL_FAILED, why);
    free(why);
  }
  trial_rows_free(rows, n);
  return rc;
}

/* How many more trials the budget allows, queued ones aside; counted by storage, so that
 * an ask of an experiment whose budget is spent reads no trial. */
static int budget_left(storage *st, const spec *s, const experiment_row *exp, size_t *left,
                       nas_err *err) {
  int64_t by_status[TRIAL_STATUS_COUNT], total = 0;
  if (storage_trial_counts(st, exp->id, by_status, err) != NAS_OK) return NAS_ERR;
  for (int status = 0; status < TRIAL_STATUS_COUNT; status++) total += by_status[status];
  *left = total < s->budget.max_trials ? (size_t)(s->budget.max_trials - total) : 0;
  return NAS_OK;
}

/* Suggests up to `wanted` new trials, no more than the budget leaves, and starts them for
 * worker into out[*n_out…]. NAS_ENOTFOUND (nothing stored) when a finite space has fewer
 * fresh assignments than that. */
static int suggest_fresh(storage *st, const spec *s, const experiment_row *exp, size_t wanted,
                         const char *worker, trial_row *out, size_t *n_out, nas_err *err) {
  size_t left;
  if (budget_left(st, s, exp, &left, err) != NAS_OK) return NAS_ERR;
  size_t fresh = wanted < left ? wanted : left;
  if (fresh == 0) return NAS_OK;
  sched_results r;
  if (sched_results_load(st, s, exp->id, &r, err) != NAS_OK) return NAS_ERR;
  optimizer *opt = NULL;
  trial_row *made = NULL;
  sched_imported imported = {0};
  int rc = optimizer_create(s, &opt, err);
  if (rc == NAS_OK) rc = sched_imported_load(st, s, &imported, err);
  if (rc == NAS_OK) rc = sched_suggest(st, s, exp, opt, &r, &imported, fresh, &made, err);
  sched_imported_free(&imported);
  for (size_t i = 0; rc == NAS_OK && i < fresh; i++) {
    rc = storage_trial_start(st, made[i].id, worker, err);
    if (rc == NAS_OK) rc = storage_trial_get(st, made[i].id, &out[(*n_out)++], err);
  }
  if (made) trial_rows_free(made, fresh);
  optimizer_free(opt);
  sched_results_free(&r);
  return rc;
}

/* Claims up to n queued trials and suggests the rest; *out gets up to n started rows. */
static int hand_out(storage *st, const spec *s, const experiment_row *exp, size_t n,
                    const char *worker, trial_row *out, size_t *n_out, nas_err *err) {
  int rc = NAS_OK;
  *n_out = 0;
  while (*n_out < n && (rc = storage_trial_claim(st, exp->id, worker, &out[*n_out], err)) == NAS_OK)
    (*n_out)++;
  if (rc != NAS_ENOTFOUND && rc != NAS_OK) return rc;
  size_t wanted = n - *n_out;
  rc = wanted > 0 ? suggest_fresh(st, s, exp, wanted, worker, out, n_out, err) : NAS_OK;
  /* A finite space may have fewer fresh assignments than asked for: then as many as it
   * has, one at a time, each suggestion seeing the ones before it as pending. */
  if (rc == NAS_ENOTFOUND && wanted > 1) {
    size_t before;
    do {
      before = *n_out;
      rc = suggest_fresh(st, s, exp, 1, worker, out, n_out, err);
    } while (rc == NAS_OK && *n_out > before && *n_out < n);
  }
  /* Trials handed out already are the asker's (claimed ones are running now): an ask that
   * found fewer than it wanted answers with those. */
  return rc == NAS_ENOTFOUND && *n_out > 0 ? NAS_OK : rc;
}

/* A finished experiment that hands out a trial again (one queued by `nas retry` or `nas
 * enqueue`, or a new one within a budget `nas create` raised) runs again, as `nas resume`
 * marks a finished experiment running; its last trial's end finishes it once more. */
static int reopen_finished(storage *st, const experiment_row *exp, nas_err *err) {
  if (strcmp(exp->status, "finished") != 0) return NAS_OK;
  return storage_experiment_set_status(st, exp->id, "running", NULL, err);
}

int sched_ask(storage *st, const spec *s, const experiment_row *exp, size_t n,
              const char *worker, notifier *nt, trial_row **out, size_t *n_out, nas_err *err) {
  *out = NULL;
  *n_out = 0;
  if (strcmp(exp->status, "stopped") == 0)
    return nas_errc(err, NAS_EEXIST, "experiment '%s' is stopped; nothing is handed out until "
                    "its spec is stored again, which opens it ('nas create %s', or POST "
                    "/api/v1/experiments)", exp->name, exp->spec_path);
  char *who = nas_asprintf("%s%s", SCHED_ASK_PREFIX, worker && *worker ? worker : "client");
  trial_row *rows = calloc(n ? n : 1, sizeof *rows);
  sched_lease lease = {0};
  int rc = who && rows ? sched_lease_take_waiting(st, exp, &lease, SCHED_ASK_WAIT_S, err)
                       : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = expire_silent(st, s, exp, nt, err);
  if (rc == NAS_OK) rc = hand_out(st, s, exp, n, who, rows, n_out, err);
  if (rc == NAS_OK && *n_out > 0) rc = reopen_finished(st, exp, err);
  sched_lease_release(st, exp, &lease);
  free(who);
  if (rc != NAS_OK) {
    trial_rows_free(rows, *n_out);
    *n_out = 0;
    return rc;
  }
  if (*n_out == 0 && n > 0) {
    free(rows);
    return nas_errc(err, NAS_ENOTFOUND, "experiment '%s' has spent its budget of %d trials "
                    "(raise budget.trials and create it again, or queue trials with retry or "
                    "enqueue)", exp->name, s->budget.max_trials);
  }
  *out = rows;
  return NAS_OK;
}

/* The refusal of a tell of attempt `attempt` of handed-out trial t, which runs another. */
static int other_attempt(const experiment_row *exp, const trial_row *t, int attempt,
                         nas_err *err) {
  if (attempt < t->attempts)
    return nas_errc(err, NAS_EEXIST, "trial %d of '%s' runs attempt %d, not attempt %d: it "
                    "was handed out again after attempt %d went silent or was retried; nothing "
                    "was stored", t->number, exp->name, t->attempts, attempt, attempt);
  return nas_errc(err, NAS_EEXIST, "trial %d of '%s' runs attempt %d, not attempt %d, which "
                  "was never handed out; nothing was stored", t->number, exp->name,
                  t->attempts, attempt);
}

/* The handed-out trial `number`, refusing one that is not running, one that runs as a
 * runner's job (its job reports for itself, and `nas run` ends it: a trial ended under it
 * made that run fail when its job ended), and one that runs another attempt than the
 * asker's (attempt > 0; 0: any): the asker's went silent or was retried and the trial was
 * handed out again, to an asker whose attempt the old one's values must not end. */
static int running_trial(storage *st, const experiment_row *exp, int number, int attempt,
                         trial_row *t, nas_err *err) {
  int rc = sched_trial_find(st, exp, number, t, err);
  if (rc != NAS_OK) return rc;
  if (sched_handed_out(t) && (attempt <= 0 || attempt == t->attempts)) return NAS_OK;
  if (sched_handed_out(t))
    rc = other_attempt(exp, t, attempt, err);
  else if (t->status == TRIAL_RUNNING)
    rc = nas_errc(err, NAS_EEXIST, "trial %d of '%s' runs as job %s of 'nas run', not handed "
                  "out by ask: its job reports its metrics and 'nas run' ends it; nothing was "
                  "stored", number, exp->name, t->job_id ? t->job_id : "(none)");
  else
    rc = nas_errc(err, NAS_EEXIST, "trial %d of '%s' is %s, not running; nothing was stored",
                  number, exp->name, trial_status_name(t->status));
  trial_row_clear(t);
  return rc;
}

/* Judges the trial by the early-stopping rule; ends it stopped when the rule says so. */
static int judge_early(storage *st, const spec *s, const experiment_row *exp,
                       const trial_row *t, bool *stop, nas_err *err) {
  sched_curve *curves;
  size_t n, rung = 0;
  if (sched_curves_load(st, s, exp->id, &curves, &n, err) != NAS_OK) return NAS_ERR;
  sched_verdict v = {0};
  for (size_t i = 0; i < n; i++)
    if (curves[i].trial_id == t->id) sched_early_stop_judge(s, curves, n, i, &rung, &v);
  sched_curves_free(curves, n);
  *stop = v.stop;
  if (!v.stop) return NAS_OK;
  char *why = nas_asprintf("stopped early at step %" PRId64 ": %zu of the %zu trials there did better",
                           v.step, v.better, v.compared);
  int rc = why ? storage_trial_finish(st, t->id, TRIAL_STOPPED, false, 0, why, err)
               : nas_errf(err, "out of memory");
  free(why);
  return rc;
}

int sched_tell_report(storage *st, const spec *s, const experiment_row *exp, int number,
                      int attempt, const metric_obs *obs, size_t n, bool *stop, nas_err *err) {
  trial_row t;
  *stop = false;
  int rc = running_trial(st, exp, number, attempt, &t, err);
  if (rc != NAS_OK) return rc;
  rc = storage_metrics_add(st, t.id, obs, n, -1, err);
  if (rc == NAS_OK) rc = storage_trial_heartbeat(st, t.id, err);
  bool intermediate = false;
  for (size_t i = 0; i < n; i++) intermediate |= obs[i].step != METRIC_FINAL;
  if (rc == NAS_OK && intermediate && s->early_stopping.rule != EARLY_STOP_NONE)
    rc = judge_early(st, s, exp, &t, stop, err);
  trial_row_clear(&t);
  return rc;
}

void sched_tell_stopped_end(storage *st, const spec *s, const experiment_row *exp,
                            int number, notifier *nt) {
  trial_row t;
  nas_err err;
  if (sched_trial_find(st, exp, number, &t, &err) != NAS_OK) {
    nas_log("%s: trial %d stopped; whether it finished the experiment is unknown: %s",
            exp->name, number, err.msg);
    return;
  }
  sched sc;
  tell_events_begin(&sc, st, s, exp, nt);
  tell_events_end(&sc, &t, TRIAL_STOPPED, t.error);
  trial_row_clear(&t);
}

/* The name in obs that looks like a misspelling of objective, or NULL: a metric of any
 * name is stored (docs/metrics-protocol.md), so nothing else points out 'los=0.5'. */
static const char *misspelt_as(const char *objective, const metric_obs *obs, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (nas_nearest(obs[k].name, &objective, 1)) return obs[k].name;
  return NULL;
}

/* Refuses a completion that would leave an objective unreported, before anything is
 * stored: a client that sends the whole set again must not store the rest twice. */
static int check_complete(storage *st, const spec *s, const experiment_row *exp,
                          const trial_row *t, const metric_obs *obs, size_t n, nas_err *err) {
  sched_results r;
  if (sched_results_of_trial(st, s, exp, t->number, &r, err) != NAS_OK) return NAS_ERR;
  const char *missing = sched_results_missing_objective(s, &r, t->id, obs, n);
  const char *given = missing ? misspelt_as(missing, obs, n) : NULL;
  int rc = NAS_OK;
  if (given)
    rc = nas_errc(err, NAS_EINVAL, "trial %d of '%s' has not reported objective '%s' (given: "
                  "'%s'; did you mean '%s'?); report it, or end the trial as failed; nothing "
                  "was stored", t->number, exp->name, missing, given, missing);
  else if (missing)
    rc = nas_errc(err, NAS_EINVAL, "trial %d of '%s' has not reported objective '%s'; report "
                  "it, or end the trial as failed; nothing was stored", t->number, exp->name,
                  missing);
  sched_results_free(&r);
  return rc;
}

/* The error of a completion that lost its trial (attempt t) after it was read: another
 * completion or end came first, or the attempt went silent and the trial was handed out
 * again. Worded as running_trial words a trial that was not running to begin with. */
static int complete_lost(storage *st, const experiment_row *exp, const trial_row *t,
                         nas_err *err) {
  trial_row now;
  int rc = running_trial(st, exp, t->number, 0, &now, err);
  if (rc != NAS_OK) return rc;
  rc = nas_errc(err, NAS_EEXIST, "trial %d of '%s' was handed out again (attempt %d) after "
                "attempt %d went silent; nothing was stored", t->number, exp->name,
                now.attempts, t->attempts);
  trial_row_clear(&now);
  return rc;
}

int sched_tell_complete(storage *st, const spec *s, const experiment_row *exp, int number,
                        int attempt, const metric_obs *obs, size_t n, notifier *nt,
                        nas_err *err) {
  trial_row t;
  int rc = running_trial(st, exp, number, attempt, &t, err);
  if (rc != NAS_OK) return rc;
  if ((rc = check_complete(st, s, exp, &t, obs, n, err)) != NAS_OK) {
    trial_row_clear(&t);
    return rc;
  }
  sched sc;
  tell_events_begin(&sc, st, s, exp, nt);
  rc = storage_trial_complete(st, t.id, t.attempts, obs, n, err);
  if (rc == NAS_EEXIST) rc = complete_lost(st, exp, &t, err);
  tell_events_end(&sc, rc == NAS_OK ? &t : NULL, TRIAL_COMPLETED, NULL);
  trial_row_clear(&t);
  return rc;
}

int sched_tell_fail(storage *st, const spec *s, const experiment_row *exp, int number,
                    int attempt, const char *why, notifier *nt, nas_err *err) {
  trial_row t;
  int rc = running_trial(st, exp, number, attempt, &t, err);
  if (rc != NAS_OK) return rc;
  const char *error = why && *why ? why : "failed (reported by the client)";
  sched sc;
  tell_events_begin(&sc, st, s, exp, nt);
  rc = storage_trial_finish(st, t.id, TRIAL_FAILED, false, 0, error, err);
  tell_events_end(&sc, rc == NAS_OK ? &t : NULL, TRIAL_FAILED, error);
  trial_row_clear(&t);
  return rc;
}

int sched_tell_heartbeat(storage *st, const experiment_row *exp, int number, int attempt,
                         nas_err *err) {
  trial_row t;
  int rc = running_trial(st, exp, number, attempt, &t, err);
  if (rc != NAS_OK) return rc;
  rc = storage_trial_heartbeat(st, t.id, err);
  trial_row_clear(&t);
  return rc;
}
