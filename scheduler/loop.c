/* scheduler/loop.c: the closed loop of one `nas run` / `nas resume`.
 *
 *   rebuild ← storage (running trials re-attached, queued ones launched)
 *   repeat: poll jobs → metrics and final states → storage
 *           suggestions ← optimizer(completed observations, pending trials)
 *           queued trial → storage, then job → runner, then job id → storage
 *           wait for a child to end, a signal, or the poll interval
 * until the trial budget is spent (or the wall time, or the user says stop). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "scheduler/internal.h"

/* ---- the results cache ------------------------------------------------------------------- */

const sched_results *sched_results_now(sched *sc, nas_err *err) {
  if (sc->results_fresh) return &sc->results;
  sched_results_free(&sc->results);
  if (sched_results_load(sc->st, sc->s, sc->exp->id, &sc->results, err) != NAS_OK) return NULL;
  sc->results_fresh = true;
  return &sc->results;
}

void sched_results_stale(sched *sc) { sc->results_fresh = false; }

void sched_results_refresh(sched *sc, const trial_row *row) {
  if (!sc->results_fresh) return;
  sched_results one;
  nas_err err; /* a trial the cache cannot take is read with the rest at the next use */
  if (sched_results_of_trial(sc->st, sc->s, sc->exp, row->number, &one, &err) != NAS_OK ||
      sched_results_put(&sc->results, &one, &err) != NAS_OK)
    sc->results_fresh = false;
  sched_results_free(&one);
}

void sched_results_set_status(sched *sc, int64_t trial_id, trial_status status) {
  for (size_t t = 0; sc->results_fresh && t < sc->results.n_trials; t++)
    if (sc->results.trials[t].id == trial_id) sc->results.trials[t].status = status;
}

/* ---- metrics and final states ---------------------------------------------------------- */

static void inflight_clear(inflight *job) {
  trial_row_clear(&job->row);
  free(job->run_dir);
  free(job->stop_why);
  free(job->log_problem);
  free(job->first_bad);
}

/* A log the trial made unreadable (a folder, a FIFO in its place, no permission) is the
 * trial's fault, not the loop's: said once in the progress output, and kept for the
 * trial's error should it end without its objectives. */
static void log_unreadable(sched *sc, inflight *job, const char *why) {
  if (job->log_problem && strcmp(job->log_problem, why) == 0) return;
  free(job->log_problem);
  job->log_problem = strdup(why);
  char *what = nas_asprintf("cannot read its log: %s", why);
  sched_progress_event(sc, &job->row, what ? what : why);
  free(what);
}

/* Says in the progress output what reading the log noticed besides metrics. */
static void log_notes_show(sched *sc, const inflight *job, const metric_log_notes *notes,
                           const char *log) {
  if (notes->shrank_from > 0) {
    char *what = nas_asprintf("truncated its log: %s is shorter than the %lld bytes already "
                              "read; reading it again from its start",
                              log, (long long)notes->shrank_from);
    sched_progress_event(sc, &job->row, what ? what : "truncated its log");
    free(what);
  }
  if (notes->bad > 0) {
    char *what = notes->bad == 1 ? NULL
                                 : nas_asprintf("%s (and %zu more malformed metric lines)",
                                                notes->first_bad.msg, notes->bad - 1);
    sched_progress_event(sc, &job->row, what ? what : notes->first_bad.msg);
    free(what);
  }
}

/* Stores one read's share of the metric lines the job printed since the last look, with
 * the offset it read to; *more is set when the read stopped at its bound with lines left.
 * A log that cannot be read fails nothing here (*more stays false). */
static int ingest_share(sched *sc, inflight *job, const char *log, bool ended, bool *news,
                        bool *more, nas_err *err) {
  metric_set set = {0};
  metric_log_notes notes = {0};
  int64_t offset = job->row.log_offset;
  nas_err why;
  *more = false;
  if ((ended ? metric_log_read_rest : metric_log_read)(log, &offset, &set, &notes, &why) != NAS_OK) {
    log_unreadable(sc, job, why.msg);
    return NAS_OK;
  }
  free(job->log_problem);
  job->log_problem = NULL;
  log_notes_show(sc, job, &notes, log);
  if (notes.bad > 0 && !job->first_bad) job->first_bad = strdup(notes.first_bad.msg);
  job->bad_lines += notes.bad;
  int rc = NAS_OK;
  if (offset != job->row.log_offset || notes.shrank_from > 0) {
    rc = storage_metrics_add(sc->st, job->row.id, set.obs, set.n, offset, err);
    if (rc == NAS_OK) job->row.log_offset = offset;
    if (set.n > 0) sched_results_refresh(sc, &job->row);
    job->last_heard = nas_now();
  }
  for (size_t i = 0; news && rc == NAS_OK && i < set.n; i++)
    *news |= set.obs[i].step != METRIC_FINAL;
  *more = rc == NAS_OK && notes.more;
  metric_set_free(&set);
  return rc;
}

/* Stores the metric lines the job printed since the last look; `ended` reads a last line
 * without its newline too, since the log will not grow any more. A backlog larger than
 * one read (metric_log_read's bound) is stored share by share, each report with its own
 * offset, so that each fits one storage request and no line is counted twice. Any new
 * output counts as a sign of life; *news (may be NULL) is set when intermediate values
 * arrived. Only storage errors are the loop's. */
static int ingest_metrics(sched *sc, inflight *job, bool ended, bool *news, nas_err *err) {
  char *log = nas_asprintf("%s/stdout.log", job->run_dir);
  if (!log) return nas_errf(err, "out of memory");
  bool more = true;
  int rc = NAS_OK;
  while (rc == NAS_OK && more) rc = ingest_share(sc, job, log, ended, news, &more, err);
  free(log);
  return rc;
}

/* The first objective the trial never reported, or NULL when it reported them all: from
 * storage, where `nas report` stores values that no log line brings. */
static const char *missing_objective(sched *sc, const trial_row *row, nas_err *err,
                                     int *rc) {
  sched_results r;
  *rc = sched_results_of_trial(sc->st, sc->s, sc->exp, row->number, &r, err);
  if (*rc != NAS_OK) return NULL;
  const char *missing = sched_results_missing_objective(sc->s, &r, row->id, NULL, 0);
  sched_results_free(&r);
  return missing;
}

/* A lost job (vanished, silent, its node failed) is no fault of the trial: it goes back
 * to the queue until it has had trial.max_attempts launches. */
static int judge_lost(const sched *sc, const inflight *job, const char *cause,
                      trial_status *status, char **why) {
  int attempts = job->row.attempts, most = sc->s->trial.max_attempts;
  *status = attempts < most ? TRIAL_QUEUED : TRIAL_FAILED;
  *why = attempts < most
             ? nas_asprintf("lost (%s); retrying, attempt %d of %d", cause, attempts + 1, most)
             : nas_asprintf("lost (%s) on each of its %d attempts", cause, attempts);
  return NAS_OK;
}

/* The last line of run_dir/stderr.log, where a failing command says why (a traceback's
 * last line, "cannot run …"), for the failure's reason: the part after the last newline or
 * carriage return (a progress bar's latest state), blanks trimmed, control characters as
 * '?', at most STDERR_QUOTE_BYTES. NULL when the log is empty or unreadable. Owned. */
#define STDERR_QUOTE_BYTES 200
static char *stderr_last_line(const char *run_dir) {
  size_t len;
  char *tail = sched_log_tail(run_dir, "stderr.log", &len);
  if (!tail) return NULL;
  while (len > 0 && strchr(" \t\r\n", tail[len - 1])) len--;
  size_t start = len;
  while (start > 0 && tail[start - 1] != '\n' && tail[start - 1] != '\r') start--;
  while (start < len && (tail[start] == ' ' || tail[start] == '\t')) start++;
  if (len - start > STDERR_QUOTE_BYTES) {
    len = start + STDERR_QUOTE_BYTES;
    while (len > start && ((unsigned char)tail[len] & 0xC0) == 0x80) len--; /* a cut character */
  }
  for (size_t i = start; i < len; i++)
    if ((unsigned char)tail[i] < 0x20 || tail[i] == 0x7f) tail[i] = '?';
  tail[len] = '\0';
  char *line = len > start ? nas_utf8_repaired(tail + start) : NULL;
  free(tail);
  return line;
}

/* what (owned, taken) followed by the quoted last line of stderr.log and where the log is:
 * `exited with status 3: "ValueError: bad shape" (last line of RUN/stderr.log)`. */
static char *with_stderr_quoted(char *what, const char *run_dir) {
  char *line = stderr_last_line(run_dir);
  char *why = line ? nas_asprintf("%s: \"%s\" (last line of %s/stderr.log)", what, line, run_dir)
                   : nas_asprintf("%s (%s/stderr.log is empty)", what, run_dir);
  free(line);
  free(what);
  return why;
}

/* Why a trial that exited 0 failed: an objective it never reported, and what may explain
 * it (a log that could not be read, metric lines that were malformed: a NaN loss). */
static char *objective_missing_why(const inflight *job, const char *missing) {
  char *malformed =
      job->bad_lines == 0 ? strdup("")
      : job->bad_lines == 1
          ? nas_asprintf("; 1 malformed metric line was not recorded: %s", job->first_bad)
          : nas_asprintf("; %zu malformed metric lines were not recorded, the first: %s",
                         job->bad_lines, job->first_bad);
  char *why = malformed ? nas_asprintf("exited 0 without reporting objective '%s' (print a line "
                                       "'nas-metric {\"%s\": VALUE}' or run 'nas report "
                                       "%s=VALUE')%s%s%s",
                                       missing, missing, missing, malformed,
                                       job->log_problem ? "; its log could not be read: " : "",
                                       job->log_problem ? job->log_problem : "")
                        : NULL;
  free(malformed);
  return why;
}

/* Decides a finished job's trial status and error text (owned, or NULL). */
static int judge(sched *sc, const inflight *job, const job_status *js, trial_status *status,
                 char **why, nas_err *err) {
  *why = NULL;
  switch (js->state) {
  case JOB_EXITED:
    if (js->exit_code != 0) {
      *status = TRIAL_FAILED;
      char *what = nas_asprintf("exited with status %d", js->exit_code);
      *why = what ? with_stderr_quoted(what, job->run_dir) : NULL;
      return NAS_OK;
    }
    int rc;
    const char *missing = missing_objective(sc, &job->row, err, &rc);
    if (rc != NAS_OK) return rc;
    *status = missing ? TRIAL_FAILED : TRIAL_COMPLETED;
    if (missing) *why = objective_missing_why(job, missing);
    return NAS_OK;
  case JOB_SIGNALED:
    *status = TRIAL_FAILED;
    char *what = nas_asprintf("killed by signal %d (%s)%s%s", js->signal,
                              strsignal(js->signal), js->detail[0] ? ": " : "", js->detail);
    *why = what ? with_stderr_quoted(what, job->run_dir) : NULL;
    return NAS_OK;
  case JOB_TIMEOUT:
    /* The runner's own words when it has them: its limit may not be trial.timeout
     * (Slurm's `time` option, a partition's default, minutes rounded up). */
    *status = TRIAL_TIMEOUT;
    *why = js->detail[0] ? nas_asprintf("stopped at its time limit: %s", js->detail)
                         : nas_asprintf("stopped at its time limit of %g s", sc->s->trial.timeout_s);
    return NAS_OK;
  case JOB_STOPPED:
    if (job->stop == STOP_SILENT) return judge_lost(sc, job, job->stop_why, status, why);
    *status = TRIAL_STOPPED;
    *why = strdup(job->stop_why ? job->stop_why : "stopped on request");
    return NAS_OK;
  case JOB_UNREADABLE:
    *status = TRIAL_FAILED;
    *why = nas_asprintf("ended, but how cannot be told: %s (nas writes it; the trial must "
                        "leave it alone)", js->detail);
    return NAS_OK;
  case JOB_LOST:
  case JOB_RUNNING:
    break;
  }
  return judge_lost(sc, job,
                    js->detail[0] ? js->detail : "its process vanished without leaving an exit status",
                    status, why);
}

/* Keeps the error of a trial that failed or timed out, for check_failure_rate; only the
 * quote is lost when memory runs out. */
static void note_failure(sched *sc, int number, trial_status status, const char *why) {
  if (status != TRIAL_FAILED && status != TRIAL_TIMEOUT) return;
  char *said = nas_asprintf("trial %d: %s", number, why ? why : "no error recorded");
  if (!said) return;
  free(sc->last_failure);
  sc->last_failure = said;
}

/* Too many failures: launch nothing more and end with a failure outcome. Only trials that
 * ended in this run count: the failures of an earlier run (before the trial was fixed)
 * must not stop the next one. */
static void check_failure_rate(sched *sc) {
  const int *by = sc->ended_here.by_status;
  int failed = by[TRIAL_FAILED] + by[TRIAL_TIMEOUT];
  int ended = sc->ended_here.total;
  double rate = sc->s->budget.max_failure_rate;
  if (sc->outcome == SCHED_TOO_MANY_FAILURES || rate >= 1 || ended < 5 ||
      failed <= rate * ended)
    return;
  nas_log("%s: %d of the %d trials that ended in this run failed, more than "
          "budget.max_failure_rate %g allows; launching no more (last error: %s)",
          sc->exp->name, failed, ended, rate,
          sc->last_failure ? sc->last_failure : "none recorded");
  sc->draining = true;
  sc->outcome = SCHED_TOO_MANY_FAILURES;
}

/* Patience: the front stopped improving. */
static int check_patience(sched *sc, nas_err *err) {
  if (sc->s->budget.patience_trials == 0 || sc->draining) return NAS_OK;
  const sched_results *r = sched_results_now(sc, err);
  if (!r) return NAS_ERR;
  double before, now;
  if (sched_patience_spent(sc->s, r, &before, &now)) {
    nas_log("%s: hypervolume %.6g → %.6g over the last %d completed trials, less than "
            "budget.patience allows; launching no more",
            sc->exp->name, before, now, sc->s->budget.patience_trials);
    sc->draining = true;
  }
  return NAS_OK;
}

int sched_trial_ended(sched *sc, int number, trial_status status, const char *why,
                      nas_err *err) {
  note_failure(sc, number, status, why);
  check_failure_rate(sc);
  return check_patience(sc, err);
}

/* Keeps the number of a trial stopped part way, for cut_short_say (only a hint is lost
 * when memory runs out). */
static void note_cut_short(sched *sc, int number) {
  int *grown = realloc(sc->cut_short, (sc->n_cut_short + 1) * sizeof *grown);
  if (!grown) return;
  sc->cut_short = grown;
  sc->cut_short[sc->n_cut_short++] = number;
}

static int ascending(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* numbers[0..n-1] as text: "3, 4 and 5" in prose, else "3 4 5" (arguments). Owned, or NULL
 * when out of memory. */
static char *numbers_text(const int *numbers, size_t n, bool prose) {
  char *text = NULL;
  size_t len;
  FILE *out = open_memstream(&text, &len);
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++)
    fprintf(out, "%s%d", i == 0 ? "" : !prose ? " " : i + 1 == n ? " and " : ", ", numbers[i]);
  return nas_memstream_close(out, &text, NULL) == NAS_OK ? text : NULL;
}

/* Trials stopped part way count in budget.trials and nothing runs them again unless asked:
 * names them ("trials 3, 4 and 5 were …") and the `nas retry` that queues them. */
static void cut_short_say(sched *sc) {
  size_t n = sc->n_cut_short;
  if (n == 0) return;
  qsort(sc->cut_short, n, sizeof *sc->cut_short, ascending);
  char *listed = numbers_text(sc->cut_short, n, true);
  char *args = numbers_text(sc->cut_short, n, false);
  if (listed && args)
    nas_log("%s: trial%s %s %s stopped part way and count in budget.trials; 'nas retry %s %s%s' "
            "queues %s to run again first", sc->exp->name, n == 1 ? "" : "s", listed,
            n == 1 ? "was" : "were", sc->exp->name, args,
            sc->opt->storage_hint ? sc->opt->storage_hint : "", n == 1 ? "it" : "them");
  free(listed);
  free(args);
}

/* A run that ends on an error (its storage out of reach past its retries, or a second
 * Ctrl-C while it waited for it) leaves its trials running, or asked to stop, their ends
 * unrecorded: says so, and what records them, since the summary above counts them nowhere. */
static void left_running_say(const sched *sc) {
  size_t n = sc->n_jobs;
  if (n == 0) return;
  bool one = n == 1;
  nas_log("%s: %zu trial%s %s, %s not stored yet; once the storage answers, "
          "'nas resume %s%s' re-attaches to %s and records how %s ended", sc->exp->name, n,
          one ? "" : "s", sc->stopping ? "asked to stop" : "left running",
          one ? "its end" : "their ends", sc->exp->name,
          sc->opt->storage_hint ? sc->opt->storage_hint : "", one ? "it" : "them",
          one ? "it" : "they");
}

/* Brings trial_id's curve in the loop's set up to date from its own observations; what
 * the set cannot take this way is loaded with the rest at the next check. */
static void curves_refresh(sched *sc, int64_t trial_id) {
  if (!sc->curves_fresh) return;
  metric_row *rows;
  size_t n;
  bool stale = false;
  nas_err err;
  if (storage_metrics_of_trial(sc->st, trial_id, &rows, &n, &err) != NAS_OK) {
    sc->curves_fresh = false;
    return;
  }
  if (sched_curve_set_put(sc->s, &sc->curves, trial_id, rows, n, &stale, &err) != NAS_OK || stale)
    sc->curves_fresh = false;
  metric_rows_free(rows, n);
}

static int finish_job(sched *sc, size_t i, const job_status *js, nas_err *err) {
  inflight *job = &sc->jobs[i];
  trial_status status;
  char *why = NULL;
  int rc = judge(sc, job, js, &status, &why, err);
  if (rc == NAS_OK)
    rc = storage_trial_finish(sc->st, job->row.id, status, js->state == JOB_EXITED,
                              js->exit_code, why, err);
  if (rc != NAS_OK) {
    free(why);
    return nas_err_prefix(err, "trial %d", job->row.number);
  }
  sched_count(sc, job->row.status, status);
  if (status == TRIAL_STOPPED && job->stop == STOP_REQUESTED) note_cut_short(sc, job->row.number);
  job->row.status = status;
  sched_results_refresh(sc, &job->row);
  curves_refresh(sc, job->row.id);
  sched_progress_event(sc, &job->row, why);
  sched_events_trial_end(sc, &job->row, why);
  rc = status == TRIAL_QUEUED ? sched_enqueue(sc, &job->row, err) : NAS_OK;
  int number = job->row.number;
  inflight_clear(job);
  sc->jobs[i] = sc->jobs[--sc->n_jobs];
  if (rc == NAS_OK && trial_status_final(status))
    rc = sched_trial_ended(sc, number, status, why, err);
  free(why);
  return rc;
}

/* Seconds between early-stopping checks when no new log lines arrived. */
#define EARLY_STOP_RECHECK_S 2.0

/* Asks a running job to stop, remembering why (owned text, may be NULL). */
static void stop_job(sched *sc, inflight *job, stop_reason reason, char *why) {
  nas_err err;
  /* The loop goes on: a job that did not hear will still end or time out, and polls see it. */
  if (runner_stop(sc->rn, job->row.job_id, job->run_dir, &err) != NAS_OK)
    nas_log("%s: trial %d: could not stop job %s: %s", sc->exp->name, job->row.number,
            job->row.job_id, err.msg);
  job->stop = reason;
  free(job->stop_why);
  job->stop_why = why;
}

/* When the job last showed life: output seen here, or a heartbeat stored by the trial
 * itself (`nas report`, `nas worker`), re-read only when the first looks stale. */
static double last_sign_of_life(sched *sc, inflight *job, double timeout, double now) {
  if (now - job->last_heard <= timeout) return job->last_heard;
  trial_row fresh;
  nas_err ignored;
  if (storage_trial_get(sc->st, job->row.id, &fresh, &ignored) == NAS_OK) {
    job->row.heartbeat_at = fresh.heartbeat_at;
    trial_row_clear(&fresh);
  }
  return job->row.heartbeat_at > job->last_heard ? job->row.heartbeat_at : job->last_heard;
}

/* A trial silent for longer than trial.heartbeat_timeout is treated as lost; the time its
 * job waited to start (in Slurm's queue) is no silence. */
static void check_heartbeats(sched *sc) {
  double timeout = sc->s->trial.heartbeat_timeout_s, now = nas_now();
  if (timeout <= 0) return;
  for (size_t i = 0; i < sc->n_jobs; i++) {
    inflight *job = &sc->jobs[i];
    if (job->stop != STOP_NONE) continue;
    double heard = last_sign_of_life(sc, job, timeout, now);
    if (now - heard > timeout)
      stop_job(sc, job, STOP_SILENT, nas_asprintf("no output nor heartbeat for %.0f s", now - heard));
  }
}

static int find_curve(const sched_curve *curves, size_t n, int64_t trial_id) {
  for (size_t i = 0; i < n; i++)
    if (curves[i].trial_id == trial_id) return (int)i;
  return -1;
}

/* Early stopping that can never fire is said once rather than left to be found out. */
static void early_futile_say(sched *sc, const char *why) {
  if (sc->early_futile_said) return;
  sc->early_futile_said = true;
  nas_log("%s: early_stopping can never stop a trial: %s", sc->exp->name, why);
}

/* What a command trial reports is known only once trials have ended: min_trials of them
 * completed without a single judged value at a step means the rule has nothing to judge. */
static void early_futile_check_curves(sched *sc, size_t n_curves) {
  const early_stop_spec *es = &sc->s->early_stopping;
  int completed = sc->counts.by_status[TRIAL_COMPLETED];
  if (n_curves > 0 || completed < es->min_trials) return;
  char why[256];
  const char *name = sc->s->objectives[es->objectives[0]].name;
  snprintf(why, sizeof why, "%d trials completed and none reported a judged objective with a "
           "step (e.g. 'nas-metric {\"%s\": VALUE, \"step\": N}' while it runs)", completed,
           name);
  early_futile_say(sc, why);
}

/* Every trial's curve as storage holds it: loaded once, then only the running trials'
 * read again (an ended trial's curve was brought up to date as it ended). */
static int curves_now(sched *sc, nas_err *err) {
  for (size_t i = 0; sc->curves_fresh && i < sc->n_jobs; i++) curves_refresh(sc, sc->jobs[i].row.id);
  if (sc->curves_fresh) return NAS_OK;
  sched_curve_set_free(&sc->curves);
  if (sched_curve_set_load(sc->st, sc->s, sc->exp->id, &sc->curves, err) != NAS_OK) return NAS_ERR;
  sc->curves_fresh = true;
  return NAS_OK;
}

/* Applies the early-stopping rule to every running trial. */
static int check_early_stopping(sched *sc, nas_err *err) {
  if (curves_now(sc, err) != NAS_OK) return NAS_ERR;
  const sched_curve *curves = sc->curves.curves;
  size_t n = sc->curves.n;
  early_futile_check_curves(sc, n);
  for (size_t i = 0; i < sc->n_jobs; i++) {
    inflight *job = &sc->jobs[i];
    int c = find_curve(curves, n, job->row.id);
    if (job->stop != STOP_NONE || c < 0) continue;
    sched_verdict v;
    sched_early_stop_judge(sc->s, curves, n, (size_t)c, &job->next_rung, &v);
    if (v.stop)
      stop_job(sc, job, STOP_EARLY,
               nas_asprintf("stopped early at step %lld: %zu of the %zu trials there did better",
                            (long long)v.step, v.better, v.compared));
  }
  return NAS_OK;
}

/* Polls every job once; stores new metrics of running ones, finishes ended ones, then
 * applies heartbeats and early stopping to those still running. */
static int poll_jobs(sched *sc, nas_err *err) {
  size_t n = sc->n_jobs;
  if (n == 0) return NAS_OK;
  char **handles = malloc(n * sizeof *handles), **dirs = malloc(n * sizeof *dirs);
  job_status *states = malloc(n * sizeof *states);
  int rc = handles && dirs && states ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    handles[i] = sc->jobs[i].row.job_id;
    dirs[i] = sc->jobs[i].run_dir;
  }
  if (rc == NAS_OK) rc = runner_poll(sc->rn, handles, dirs, n, states, err);
  bool news = false;
  /* Every job's new lines first, the last ones of ended jobs included; then each ended
   * job is judged by what storage holds of it (values stored by `nas report` included). */
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    bool running = states[i].state == JOB_RUNNING;
    if (states[i].waiting) sc->jobs[i].last_heard = nas_now(); /* silence counts once it runs */
    rc = ingest_metrics(sc, &sc->jobs[i], !running, running ? &news : NULL, err);
  }
  /* Walk backwards: finish_job moves the last job into the finished one's place. */
  for (size_t i = n; rc == NAS_OK && i-- > 0;)
    if (states[i].state != JOB_RUNNING) rc = finish_job(sc, i, &states[i], err);
  free(handles), free(dirs), free(states);
  if (rc != NAS_OK) return rc;
  check_heartbeats(sc);
  /* Values stored directly (`nas worker`, `nas report --step`) bring no log lines: look
   * at least every few seconds too. */
  if (sc->s->early_stopping.rule == EARLY_STOP_NONE) return NAS_OK;
  double now = nas_monotonic();
  if (!news && now - sc->early_checked < EARLY_STOP_RECHECK_S) return NAS_OK;
  sc->early_checked = now;
  return check_early_stopping(sc, err);
}

/* ---- suggestions and launches ----------------------------------------------------------- */

/* Whether `nas stop` from another terminal has marked the experiment stopped. */
static int stop_requested(sched *sc, bool *yes, nas_err *err) {
  experiment_row now;
  if (storage_experiment_get(sc->st, sc->exp->name, &now, err) != NAS_OK) return NAS_ERR;
  *yes = strcmp(now.status, "stopped") == 0;
  experiment_row_clear(&now);
  return NAS_OK;
}

/* How often a long suggestion looks for a pending signal, and for `nas stop` and the
 * lease in storage. */
#define WATCH_SIGNALS_S 0.05
#define WATCH_STORAGE_S 1.0

/* Whether a SIGINT or SIGTERM waits for the loop to read it (wait_for_event). */
static bool stop_signal_pending(void) {
  sigset_t pending;
  return sigpending(&pending) == 0 &&
         (sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1);
}

/* The optimizer's watch (optimizer_watch): a suggestion is given up for a pending SIGINT or
 * SIGTERM (the loop reads it right after), a `nas stop`, or a lease that can no longer be
 * kept; meanwhile the lease is renewed, so a long suggestion is not taken for a death. */
static bool suggestion_cancelled(void *ctx) {
  sched *sc = ctx;
  double now = nas_monotonic();
  if (now - sc->watch_checked < WATCH_SIGNALS_S) return false;
  sc->watch_checked = now;
  if (stop_signal_pending()) return true;
  if (now - sc->watch_stored < WATCH_STORAGE_S) return false;
  sc->watch_stored = now;
  bool stop = false;
  if (sched_lease_keep(sc->st, sc->exp, &sc->lease, &sc->watch_err) != NAS_OK ||
      stop_requested(sc, &stop, &sc->watch_err) != NAS_OK) {
    sc->watch_failed = true;
    return true;
  }
  return stop;
}

/* Asks the optimizer for n trials and stores them queued; *rows gets them (owned). */
static int suggest_trials(sched *sc, size_t n, trial_row **rows, nas_err *err) {
  const sched_results *r = sched_results_now(sc, err);
  if (!r) return NAS_ERR;
  int rc = sched_suggest(sc->st, sc->s, sc->exp, sc->opt_model, r, &sc->imported, n, rows, err);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) sched_results_refresh(sc, &(*rows)[i]);
  if (rc != NAS_OK) sched_results_stale(sc); /* some may be stored */
  for (size_t i = 0; rc == NAS_OK && i < n; i++) sched_count(sc, TRIAL_STATUS_COUNT, TRIAL_QUEUED);
  return rc;
}

/* budget.parallel, capped by what the runner can run at once (the local runner's GPUs). */
static int parallel_limit(const sched *sc) {
  size_t capacity = runner_capacity(sc->rn);
  int parallel = sc->s->budget.parallel;
  return capacity > 0 && capacity < (size_t)parallel ? (int)capacity : parallel;
}

static size_t launch_room(const sched *sc) {
  if (sc->draining) return 0;
  int left = sc->s->budget.max_trials - sc->counts.total;
  int free_slots = parallel_limit(sc) - (int)sc->n_jobs;
  int n = left < free_slots ? left : free_slots;
  return n > 0 ? (size_t)n : 0;
}

/* Launches trials left queued by an earlier process, oldest first, as room allows. A signal
 * meanwhile ends the round: the first one means "launch nothing more". */
static int launch_queued(sched *sc, nas_err *err) {
  int rc = NAS_OK;
  while (rc == NAS_OK && sc->n_queued > 0 && !sc->draining &&
         (int)sc->n_jobs < parallel_limit(sc) && !stop_signal_pending()) {
    trial_row row = sc->queued[0];
    memmove(sc->queued, sc->queued + 1, --sc->n_queued * sizeof *sc->queued);
    rc = sched_launch(sc, &row, err);
    trial_row_clear(&row);
  }
  return rc;
}

static int launch_new(sched *sc, nas_err *err) {
  if (launch_queued(sc, err) != NAS_OK) return NAS_ERR;
  size_t n = sc->n_queued ? 0 : launch_room(sc);
  if (n == 0) return NAS_OK;
  trial_row *rows;
  int rc = suggest_trials(sc, n, &rows, err);
  /* A finite space may have fewer fresh assignments than free slots: ask one by one. */
  if (rc == NAS_ENOTFOUND && n > 1) rc = suggest_trials(sc, n = 1, &rows, err);
  /* Given up for a signal or `nas stop`: the loop handles those next. */
  if (rc == NAS_ECANCELED && !sc->watch_failed) return NAS_OK;
  if (rc == NAS_ECANCELED) {
    *err = sc->watch_err;
    return NAS_ERR;
  }
  if (rc == NAS_ENOTFOUND) {
    nas_log("%s: %s; ending the experiment once running trials finish", sc->exp->name, err->msg);
    sc->draining = true;
    return NAS_OK;
  }
  if (rc != NAS_OK) return NAS_ERR;
  if (n > 1 && json_is_true(json_object_get(sc->s->runner.options, "array")))
    rc = sched_launch_batch(sc, rows, n, err);
  else
    for (size_t i = 0; i < n && rc == NAS_OK; i++) /* a signal keeps the rest queued */
      rc = stop_signal_pending() ? sched_enqueue(sc, &rows[i], err)
                                 : sched_launch(sc, &rows[i], err);
  trial_rows_free(rows, n);
  return rc;
}

/* ---- start-up: rebuild from storage ----------------------------------------------------- */

/* Whether the budget is spent with no trial running or queued: a resume has nothing to do.
 * (With multi_fidelity, promotions of its trials to their next rungs may still be due.) */
static bool nothing_left(const sched *sc) {
  return sc->s->multi_fidelity.kind == MULTI_FIDELITY_NONE &&
         sc->counts.total >= sc->s->budget.max_trials && sc->n_queued == 0 &&
         sc->counts.by_status[TRIAL_RUNNING] == 0 && sc->counts.by_status[TRIAL_QUEUED] == 0;
}

/* Counts every stored trial, re-attaches to the running ones and keeps the queued ones
 * (created before a crash, or retried, never launched) to be launched first as room
 * allows. A trial handed out by `nas ask` counts as running (it takes its share of the
 * budget) but is no job of the runner's: its asker ends it by a tell. Warns first when the
 * spec's early stopping can never fire. */
static int rebuild(sched *sc, nas_err *err) {
  char why[256];
  if (!sc->opt->stop_only && sched_early_stop_futile(sc->s, why, sizeof why))
    early_futile_say(sc, why);
  trial_row *rows;
  size_t n;
  if (storage_trial_list(sc->st, sc->exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  int rc = NAS_OK;
  for (size_t i = 0; i < n && rc == NAS_OK; i++) {
    sched_count(sc, TRIAL_STATUS_COUNT, rows[i].status);
    if (rows[i].status == TRIAL_RUNNING && sched_handed_out(&rows[i])) {
      sched_progress_event(sc, &rows[i], "handed out by 'nas ask'");
    } else if (rows[i].status == TRIAL_RUNNING) {
      sched_progress_event(sc, &rows[i], "re-attached");
      char *run_dir = sched_run_dir(sc->exp, rows[i].number, rows[i].attempts);
      rc = run_dir ? sched_track(sc, &rows[i], run_dir, err) : nas_errf(err, "out of memory");
      if (rc != NAS_OK) free(run_dir);
    } else if (rows[i].status == TRIAL_QUEUED) {
      rc = sched_enqueue(sc, &rows[i], err);
    }
  }
  trial_rows_free(rows, n);
  if (rc == NAS_OK && !sc->opt->stop_only && nothing_left(sc))
    nas_log("%s: its budget of %d trials (budget.trials) is spent; nothing to run (to run more, "
            "give 'nas run' its spec with a larger budget.trials)",
            sc->exp->name, sc->s->budget.max_trials);
  return rc;
}

/* ---- signals, waiting, stopping -------------------------------------------------------- */

/* Asks every running job to stop; why is what its trial will say ("stopped on request"
 * when NULL). */
static void stop_all(sched *sc, const char *why) {
  for (size_t i = 0; i < sc->n_jobs; i++)
    if (sc->jobs[i].stop != STOP_SILENT)
      stop_job(sc, &sc->jobs[i], STOP_REQUESTED, why ? strdup(why) : NULL);
  sc->stopping = true;
}

/* First SIGINT/SIGTERM: launch nothing more, let running trials finish. Second: stop them. */
static void on_signal(sched *sc, int sig) {
  sc->interrupted = true;
  if (!sc->draining) {
    sc->draining = true;
    nas_log("%s: launching no new trials; waiting for %zu running (signal again to stop "
            "them)", strsignal(sig), sc->n_jobs);
  } else if (!sc->stopping) {
    nas_log("%s: stopping %zu running trials", strsignal(sig), sc->n_jobs);
    stop_all(sc, NULL);
  }
}

/* The storage's watch (storage_watch), asked while its server is out of reach: each
 * SIGINT or SIGTERM is read and handled at once, as the loop would, so that none waits for
 * the retries nor merges with the next; the wait ends at a signal that leaves the trials
 * stopped (the second: nothing is left to wait for), and at once after the run failed
 * (releasing the lease tries once: it expires on its own). */
static bool storage_wait_cancelled(void *ctx) {
  sched *sc = ctx;
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  const struct timespec now = {0};
  bool heard = false;
  for (int sig; (sig = sigtimedwait(&stops, NULL, &now)) > 0; heard = true) on_signal(sc, sig);
  sc->storage_given_up |= heard && sc->stopping;
  return (heard && sc->stopping) || sc->failed;
}

/* SIGINT and SIGTERM sent to the process go to any of its threads that does not block
 * them, and libraries start threads before main whose masks the loop cannot set
 * (OpenBLAS's pool, at load): there the default action ended the process at once,
 * whatever the loop was doing (a slow squeue, a suggestion). While the loop runs, this
 * handler, which only such a thread ever runs, hands the signal on to the main thread
 * (sched_run's), which blocks it and waits for it. */
static void signal_forward(int sig) {
  int saved_errno = errno;
  if (gettid() != getpid()) tgkill(getpid(), getpid(), sig);
  errno = saved_errno;
}

/* Installs signal_forward for sig, keeping its action in *old; a signal the caller
 * ignores (a job started in the background, nohup) stays ignored. */
static void signal_forward_install(int sig, struct sigaction *old) {
  sigaction(sig, NULL, old);
  if (old->sa_handler == SIG_IGN) return;
  struct sigaction forward = {.sa_handler = signal_forward, .sa_flags = SA_RESTART};
  sigfillset(&forward.sa_mask);
  sigaction(sig, &forward, NULL);
}

/* Sleeps until a child process ends (a job may be done), a signal arrives, or the poll
 * interval passes. Every signal waited on is blocked, so none is lost between checks. */
static void wait_for_event(sched *sc) {
  double interval = sc->opt->poll_interval > 0 ? sc->opt->poll_interval : 0.2;
  struct timespec ts = {.tv_sec = (time_t)interval,
                        .tv_nsec = (long)((interval - (double)(time_t)interval) * 1e9)};
  int sig = sigtimedwait(&sc->waited, NULL, &ts);
  if (sig == SIGINT || sig == SIGTERM) on_signal(sc, sig);
}

static void check_deadline(sched *sc) {
  if (sc->deadline <= 0 || nas_monotonic() < sc->deadline || sc->stopping) return;
  nas_log("wall-time budget of %g s spent: stopping %zu running trials",
          sc->s->budget.max_wall_s, sc->n_jobs);
  sc->draining = true;
  char *why = nas_asprintf("stopped when the wall-time budget (budget.wall_time, %g s) was spent",
                           sc->s->budget.max_wall_s);
  stop_all(sc, why);
  free(why);
}

static int check_stop_request(sched *sc, nas_err *err) {
  bool stop = false;
  if (sc->stopping) return NAS_OK;
  if (stop_requested(sc, &stop, err) != NAS_OK) return NAS_ERR;
  if (stop) {
    nas_log("%s: stopped by 'nas stop': stopping %zu running trials", sc->exp->name, sc->n_jobs);
    sc->interrupted = sc->draining = true;
    stop_all(sc, "stopped by 'nas stop'");
  }
  return NAS_OK;
}

static bool done(const sched *sc) {
  if (sc->n_jobs > 0) return false;
  return sc->draining || (sc->counts.total >= sc->s->budget.max_trials && sc->n_queued == 0);
}

static int loop(sched *sc, nas_err *err) {
  while (true) {
    if (sched_lease_keep(sc->st, sc->exp, &sc->lease, err) != NAS_OK || poll_jobs(sc, err) != NAS_OK ||
        check_stop_request(sc, err) != NAS_OK)
      return NAS_ERR;
    check_deadline(sc);
    /* Promotions first: a promoted trial is launched before new suggestions. */
    if (sched_hyperband_promote(sc, err) != NAS_OK || launch_new(sc, err) != NAS_OK)
      return NAS_ERR;
    sched_progress_tick(sc);
    if (done(sc)) return NAS_OK;
    wait_for_event(sc);
  }
}

/* ---- set-up and tear-down --------------------------------------------------------------- */

static void sched_free(sched *sc) {
  sched_events_stop(sc);
  for (size_t i = 0; i < sc->n_jobs; i++) inflight_clear(&sc->jobs[i]);
  free(sc->jobs);
  sched_results_free(&sc->results);
  sched_curve_set_free(&sc->curves);
  sched_imported_free(&sc->imported);
  trial_rows_free(sc->queued, sc->n_queued);
  optimizer_free(sc->opt_model);
  runner_free(sc->own_rn);
  free(sc->storage_url);
  free(sc->best_text);
  free(sc->last_failure);
  free(sc->cut_short);
  /* A signal still pending meets signal_forward on this thread, which drops it: the run
   * has ended and says how. */
  storage_set_watch(sc->st, (storage_watch){0});
  pthread_sigmask(SIG_SETMASK, &sc->old_mask, NULL);
  sigaction(SIGINT, &sc->old_int, NULL);
  sigaction(SIGTERM, &sc->old_term, NULL);
}

/* warm_start's observations, said once in the progress output. */
static int load_imported(sched *sc, nas_err *err) {
  const warm_start_spec *w = &sc->s->warm_start;
  if (w->n_from == 0) return NAS_OK;
  if (sched_imported_load(sc->st, sc->s, &sc->imported, err) != NAS_OK) return NAS_ERR;
  nas_log("%s: warm start: %zu observations imported from %zu earlier experiment%s (%zu "
          "completed trials did not fit this space or lacked a metric); they inform the "
          "optimizer and count in no budget", sc->exp->name, sc->imported.n, w->n_from,
          w->n_from == 1 ? "" : "s", sc->imported.skipped);
  return NAS_OK;
}

static int sched_init(sched *sc, const spec *s, storage *st, const experiment_row *exp,
                      const sched_options *opt, nas_err *err) {
  memset(sc, 0, sizeof *sc);
  sc->s = s, sc->st = st, sc->exp = exp, sc->opt = opt;
  sigemptyset(&sc->waited);
  sigaddset(&sc->waited, SIGINT);
  sigaddset(&sc->waited, SIGTERM);
  sigaddset(&sc->waited, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &sc->waited, &sc->old_mask);
  signal_forward_install(SIGINT, &sc->old_int);
  signal_forward_install(SIGTERM, &sc->old_term);
  sc->started = nas_monotonic();
  if (s->budget.max_wall_s > 0) sc->deadline = sc->started + s->budget.max_wall_s;
  sc->storage_url = storage_url_absolute(opt->storage_url);
  if (!sc->storage_url) return nas_errf(err, "out of memory");
  if (!opt->runner &&
      runner_create(s->runner.type, s->runner.options, &sc->own_rn, err) != NAS_OK)
    return nas_err_prefix(err, "runner '%s'", s->runner.type);
  sc->rn = opt->runner ? opt->runner : sc->own_rn;
  if (optimizer_create(s, &sc->opt_model, err) != NAS_OK)
    return nas_err_prefix(err, "optimizer '%s'", s->optimizer.type);
  optimizer_set_watch(sc->opt_model, (optimizer_watch){.cancelled = suggestion_cancelled, .ctx = sc});
  storage_set_watch(st, (storage_watch){.cancelled = storage_wait_cancelled, .ctx = sc});
  return sc->opt->stop_only ? NAS_OK : load_imported(sc, err);
}

/* The run itself, once this process holds the experiment's lease. */
static int run_held(sched *sc, nas_err *err) {
  int rc = sc->opt->stop_only
               ? NAS_OK /* it stays stopped */
               : storage_experiment_set_status(sc->st, sc->exp->id, "running", NULL, err);
  if (rc == NAS_OK) rc = rebuild(sc, err);
  if (rc == NAS_OK && sc->opt->stop_only) {
    sc->interrupted = sc->draining = true;
    stop_all(sc, "stopped by 'nas stop'");
  }
  if (rc == NAS_OK) sched_events_start(sc);
  if (rc == NAS_OK) rc = loop(sc, err);
  /* The user ended the wait for storage: the run was interrupted, as `nas run` then says
   * (err keeps why it could not record the trials' ends). */
  if (rc != NAS_OK && sc->storage_given_up) rc = NAS_ECANCELED;
  if (sc->interrupted) sc->outcome = SCHED_INTERRUPTED;
  if (rc == NAS_OK)
    rc = storage_experiment_set_status(sc->st, sc->exp->id,
                                       sc->outcome == SCHED_FINISHED ? "finished" : "stopped", NULL,
                                       err);
  if (rc == NAS_OK && sc->outcome == SCHED_FINISHED) sched_events_finished(sc);
  sched_progress_done(sc); /* clears a terminal's status line first */
  cut_short_say(sc);
  if (rc != NAS_OK && !sc->opt->stop_only) left_running_say(sc);
  return rc;
}

int sched_run(const spec *s, storage *st, const experiment_row *exp,
              const sched_options *opt, sched_outcome *outcome, nas_err *err) {
  sched sc;
  int rc = sched_check_runnable(s, err);
  if (rc != NAS_OK) return rc;
  rc = sched_init(&sc, s, st, exp, opt, err);
  if (rc == NAS_OK) rc = sched_lease_take(st, exp, &sc.lease, err);
  if (rc == NAS_OK) rc = run_held(&sc, err);
  *outcome = sc.outcome;
  sc.failed = rc != NAS_OK;
  sched_lease_release(st, exp, &sc.lease);
  sched_free(&sc);
  return rc;
}
