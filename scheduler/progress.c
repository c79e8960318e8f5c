/* scheduler/progress.c: what `nas run` shows while it works. On a terminal, finished
 * trials scroll by above one status line that is rewritten in place; otherwise every
 * event is a plain timestamped log line, which suits files and CI logs. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/internal.h"

void sched_count(sched *sc, trial_status from, trial_status to) {
  if (from == TRIAL_STATUS_COUNT) sc->counts.total++;
  else sc->counts.by_status[from]--;
  sc->counts.by_status[to]++;
  if (from != TRIAL_STATUS_COUNT && trial_status_final(to)) { /* not one found at start-up */
    sc->ended_here.by_status[to]++;
    sc->ended_here.total++;
  }
}

static FILE *out(const sched *sc) { return sc->opt->progress ? sc->opt->progress : stderr; }

void sched_objectives_text(const sched *sc, const sched_results *r, int64_t trial_id,
                           char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t t = 0; t < r->n_trials; t++) {
    if (r->trials[t].id != trial_id) continue;
    for (size_t j = 0; j < sc->s->n_objectives && len < cap; j++)
      len += (size_t)snprintf(buf + len, cap - len, "%s%s=%.6g", j ? " " : "",
                              r->metric_names[j], r->values[t * r->n_metrics + j]);
  }
}

/* "f1=1.23 f2=4.5" for a trial, and the front summary kept in sc->best_text. */
static char *describe_result(sched *sc, const trial_row *row) {
  nas_err err;
  const sched_results *r = sched_results_now(sc, &err);
  if (!r) return NULL;
  char buf[512];
  sched_objectives_text(sc, r, row->id, buf, sizeof buf);
  size_t *front, n_front;
  double hv, ref[16];
  if (sc->s->n_objectives <= 16 && sched_front(sc->s, r, &front, &n_front, &hv, ref, &err) == NAS_OK) {
    free(sc->best_text);
    if (sc->s->n_objectives == 1 && n_front > 0)
      sc->best_text = nas_asprintf("best %s=%.6g (trial %d)", r->metric_names[0],
                                   r->values[front[0] * r->n_metrics], r->trials[front[0]].number);
    else
      sc->best_text = nas_asprintf("front %zu, HV %.6g", n_front, hv);
    free(front);
  }
  return strdup(buf);
}

static void clear_status_line(const sched *sc) {
  if (sc->opt->progress_tty) fputs("\r\033[K", out(sc));
}

void sched_progress_event(sched *sc, const trial_row *row, const char *what) {
  char *detail = NULL;
  if (row->status == TRIAL_COMPLETED) detail = describe_result(sc, row);
  clear_status_line(sc);
  char stamp[32] = "";
  if (!sc->opt->progress_tty) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ ", &tm);
  }
  /* "trial 3 started", "trial 3 re-attached", "trial 3 failed: exited with status 2",
   * "trial 3 completed: f1=… f2=…". */
  bool running = row->status == TRIAL_RUNNING;
  const char *label = running ? (what ? what : "started") : trial_status_name(row->status);
  const char *reason = running ? NULL : what;
  fprintf(out(sc), "%snas: %s: trial %d %s%s%s%s%s\n", stamp, sc->exp->name, row->number, label,
          reason ? ": " : "", reason ? reason : "", detail && *detail ? ": " : "",
          detail ? detail : "");
  free(detail);
  sched_progress_tick(sc);
}

/* "45s", "3m05s", "2h07m". */
static void format_duration(double seconds, char *out, size_t size) {
  long s = seconds > 0 ? (long)(seconds + 0.5) : 0;
  if (s < 60) snprintf(out, size, "%lds", s);
  else if (s < 3600) snprintf(out, size, "%ldm%02lds", s / 60, s % 60);
  else snprintf(out, size, "%ldh%02ldm", s / 3600, s % 3600 / 60);
}

/* The time left: trials still to end at the pace of this run so far (none yet: unknown),
 * and never past the wall-time budget. Negative when unknown. */
static double eta_seconds(const sched *sc, int ended, double elapsed) {
  int left = sc->s->budget.max_trials - ended;
  double eta = sc->ended_here.total > 0 ? elapsed / sc->ended_here.total * (left > 0 ? left : 0) : -1;
  if (sc->deadline > 0) {
    double wall_left = sc->deadline - nas_monotonic();
    if (eta < 0 || wall_left < eta) eta = wall_left > 0 ? wall_left : 0;
  }
  return eta;
}

void sched_progress_tick(sched *sc) {
  if (!sc->opt->progress_tty) return;
  const int *by = sc->counts.by_status;
  int failed = by[TRIAL_FAILED] + by[TRIAL_TIMEOUT];
  int ended = by[TRIAL_COMPLETED] + failed + by[TRIAL_STOPPED];
  double elapsed = nas_monotonic() - sc->started;
  char spent[48], left[48] = "?";
  format_duration(elapsed, spent, sizeof spent);
  double eta = eta_seconds(sc, ended, elapsed);
  if (eta >= 0) format_duration(eta, left, sizeof left);
  fprintf(out(sc), "\r\033[K%s: %d of %d ended · %d running · %d completed · %d failed",
          sc->exp->name, ended, sc->s->budget.max_trials, by[TRIAL_RUNNING],
          by[TRIAL_COMPLETED], failed);
  if (by[TRIAL_STOPPED]) fprintf(out(sc), " · %d stopped", by[TRIAL_STOPPED]);
  fprintf(out(sc), " · %s, ETA %s", spent, left);
  if (sc->best_text) fprintf(out(sc), " · %s", sc->best_text);
  fflush(out(sc));
}

/* Says why the front is empty when trials completed (a constraint whose metric no trial
 * reports, a threshold none reaches): "front 0" alone reads as if nothing had. Only from
 * results known current, since the run may be ending because storage is out of reach. */
static void empty_front_say(const sched *sc) {
  char *why = sc->results_fresh ? sched_front_empty_why(sc->s, &sc->results) : NULL;
  if (why) fprintf(out(sc), "nas: %s: the front is empty: %s\n", sc->exp->name, why);
  free(why);
}

void sched_progress_done(sched *sc) {
  clear_status_line(sc);
  const int *by = sc->counts.by_status;
  fprintf(out(sc), "nas: %s: %d trials: %d completed, %d failed, %d timed out, %d stopped%s%s\n",
          sc->exp->name, sc->counts.total, by[TRIAL_COMPLETED], by[TRIAL_FAILED],
          by[TRIAL_TIMEOUT], by[TRIAL_STOPPED], sc->best_text ? "; " : "",
          sc->best_text ? sc->best_text : "");
  empty_front_say(sc);
}
