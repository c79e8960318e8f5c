/* scheduler/events.c: what the loop tells the spec's webhooks (notify/notify.h), each
 * event as a JSON payload and a one-line text for chat:
 *
 *   {"event": "trial_completed" | "trial_failed", "experiment", "time", "trial": {…}}
 *   {"event": "front_changed", "experiment", "time",
 *    "front": {size, hypervolume, reference_point, trials}}
 *   {"event": "experiment_finished", "experiment", "time", "trials": {counts}, "front": {…}}
 *
 * "trial" has the shape `nas serve` gives a trial (sched_trial_json); "time" is Unix
 * seconds. The front is compared by its trials after each completed trial. Posting only
 * queues: nothing here waits on a receiver, and nothing here fails the run (a problem is
 * logged and the event left out). */
#include <stdlib.h>
#include <string.h>

#include "scheduler/internal.h"

/* Whether any webhook subscribes to event. */
static bool wanted(const sched *sc, notify_event event) {
  for (size_t i = 0; sc->notifier && i < sc->s->n_notify; i++)
    if (sc->s->notify[i].events & event) return true;
  return false;
}

static json_t *payload_new(const sched *sc, notify_event event) {
  return json_pack("{s:s, s:s, s:f}", "event", spec_notify_event_name(event), "experiment",
                   sc->exp->name, "time", nas_now());
}

/* Posts payload (taken over) with its text (taken over); either NULL means out of memory. */
static void post(sched *sc, notify_event event, json_t *payload, char *text) {
  if (payload && text) notifier_post(sc->notifier, event, payload, text);
  else nas_log("%s: %s not sent: out of memory", sc->exp->name, spec_notify_event_name(event));
  json_decref(payload);
  free(text);
}

/* payload with key set to value; both are taken over, and either NULL gives NULL. */
static json_t *with(json_t *payload, const char *key, json_t *value) {
  if (payload && value && json_object_set_new(payload, key, value) == 0) return payload;
  if (!payload) json_decref(value);
  json_decref(payload);
  return NULL;
}

/* ---- the front ------------------------------------------------------------------------- */

typedef struct {
  int64_t *ids;   /* owned: its trials' ids, in trial order */
  int *numbers;   /* owned: their numbers */
  size_t n;
  double hv;
  double *ref;    /* owned: the reference point hv is measured at (minimisation convention) */
} front_view;

static void front_view_free(front_view *f) {
  free(f->ids);
  free(f->numbers);
  free(f->ref);
}

static int front_now(sched *sc, front_view *f, nas_err *err) {
  memset(f, 0, sizeof *f);
  const sched_results *r = sched_results_now(sc, err);
  if (!r) return NAS_ERR;
  size_t *idx = NULL;
  f->ref = calloc(sc->s->n_objectives, sizeof *f->ref);
  int rc = f->ref ? sched_front(sc->s, r, &idx, &f->n, &f->hv, f->ref, err)
                  : nas_errf(err, "out of memory");
  if (rc != NAS_OK) {
    front_view_free(f);
    return rc;
  }
  f->ids = malloc((f->n ? f->n : 1) * sizeof *f->ids);
  f->numbers = malloc((f->n ? f->n : 1) * sizeof *f->numbers);
  for (size_t k = 0; f->ids && f->numbers && k < f->n; k++) {
    f->ids[k] = r->trials[idx[k]].id;
    f->numbers[k] = r->trials[idx[k]].number;
  }
  free(idx);
  if (f->ids && f->numbers) return NAS_OK;
  front_view_free(f);
  return nas_errf(err, "out of memory");
}

/* {"size", "hypervolume", "reference_point": {objective: value}, "trials": [numbers]}: the
 * point with the hypervolume, since without thresholds it is inferred from the trials so
 * far and moves as they come (as `nas pareto` gives them). */
static json_t *front_json(const spec *s, const front_view *f) {
  json_t *numbers = json_array();
  for (size_t k = 0; numbers && k < f->n; k++)
    json_array_append_new(numbers, json_integer(f->numbers[k]));
  return json_pack("{s:I, s:o, s:o, s:o}", "size", (json_int_t)f->n, "hypervolume",
                   sched_json_number(f->hv), "reference_point", sched_point_json(s, f->ref),
                   "trials", numbers);
}

/* Keeps f's trials as the front last announced. */
static void front_remember(sched *sc, front_view *f) {
  free(sc->front_ids);
  sc->front_ids = f->ids;
  sc->n_front_ids = f->n;
  f->ids = NULL;
}

static bool front_is_new(const sched *sc, const front_view *f) {
  return f->n != sc->n_front_ids ||
         (f->n > 0 && memcmp(f->ids, sc->front_ids, f->n * sizeof *f->ids) != 0);
}

/* Posts front_changed when the trials on the front are not those last announced. */
static void check_front(sched *sc) {
  front_view f;
  nas_err err;
  if (front_now(sc, &f, &err) != NAS_OK) {
    nas_log("%s: front_changed not sent: %s", sc->exp->name, err.msg);
    return;
  }
  if (front_is_new(sc, &f))
    post(sc, NOTIFY_FRONT_CHANGED,
         with(payload_new(sc, NOTIFY_FRONT_CHANGED), "front", front_json(sc->s, &f)),
         nas_asprintf("nas: %s: the Pareto front changed: %zu trial%s, hypervolume %.6g",
                      sc->exp->name, f.n, f.n == 1 ? "" : "s", f.hv));
  front_remember(sc, &f);
  front_view_free(&f);
}

/* ---- trials ---------------------------------------------------------------------------- */

/* The ended trial as `nas serve` shows one, with what this process knows newer than the
 * results cache: its error and its end. NULL when r lacks it or out of memory. */
static json_t *ended_trial_json(const sched_results *r, const trial_row *row, const char *why) {
  json_t *trial = NULL;
  for (size_t t = 0; !trial && t < r->n_trials; t++)
    if (r->trials[t].id == row->id) trial = sched_trial_json(r, t);
  if (trial && json_is_null(json_object_get(trial, "finished_at")))
    json_object_set_new(trial, "finished_at", json_real(nas_now()));
  if (trial && why) json_object_set_new(trial, "error", json_string(why));
  return trial;
}

static char *trial_text(sched *sc, const sched_results *r, const trial_row *row,
                        const char *why) {
  char objectives[512] = "";
  if (row->status == TRIAL_COMPLETED)
    sched_objectives_text(sc, r, row->id, objectives, sizeof objectives);
  const char *detail = row->status == TRIAL_COMPLETED ? objectives : why ? why : "";
  return nas_asprintf("nas: %s: trial %d %s%s%s", sc->exp->name, row->number,
                      trial_status_name(row->status), detail[0] ? ": " : "", detail);
}

void sched_events_trial_end(sched *sc, const trial_row *row, const char *why) {
  bool failed = row->status == TRIAL_FAILED || row->status == TRIAL_TIMEOUT;
  notify_event event = failed ? NOTIFY_TRIAL_FAILED : NOTIFY_TRIAL_COMPLETED;
  if (!failed && row->status != TRIAL_COMPLETED) return;
  bool front = !failed && wanted(sc, NOTIFY_FRONT_CHANGED);
  if (!wanted(sc, event) && !front) return;
  nas_err err;
  const sched_results *r = sched_results_now(sc, &err);
  if (!r) {
    nas_log("%s: trial %d: %s not sent: %s", sc->exp->name, row->number,
            spec_notify_event_name(event), err.msg);
    return;
  }
  if (wanted(sc, event))
    post(sc, event, with(payload_new(sc, event), "trial", ended_trial_json(r, row, why)),
         trial_text(sc, r, row, why));
  if (front) check_front(sc);
}

/* ---- the run --------------------------------------------------------------------------- */

static json_t *counts_json(const sched *sc) {
  const int *by = sc->counts.by_status;
  return json_pack("{s:i, s:i, s:i, s:i, s:i}", "total", sc->counts.total, "completed",
                   by[TRIAL_COMPLETED], "failed", by[TRIAL_FAILED], "timeout",
                   by[TRIAL_TIMEOUT], "stopped", by[TRIAL_STOPPED]);
}

void sched_events_finished(sched *sc) {
  if (!wanted(sc, NOTIFY_EXPERIMENT_FINISHED)) return;
  front_view f;
  nas_err err;
  if (front_now(sc, &f, &err) != NAS_OK) {
    nas_log("%s: experiment_finished not sent: %s", sc->exp->name, err.msg);
    return;
  }
  const int *by = sc->counts.by_status;
  json_t *payload = with(payload_new(sc, NOTIFY_EXPERIMENT_FINISHED), "trials", counts_json(sc));
  post(sc, NOTIFY_EXPERIMENT_FINISHED, with(payload, "front", front_json(sc->s, &f)),
       nas_asprintf("nas: %s finished: %d trials: %d completed, %d failed, %d timed out, "
                    "%d stopped; front of %zu trial%s, hypervolume %.6g",
                    sc->exp->name, sc->counts.total, by[TRIAL_COMPLETED], by[TRIAL_FAILED],
                    by[TRIAL_TIMEOUT], by[TRIAL_STOPPED], f.n, f.n == 1 ? "" : "s", f.hv));
  front_view_free(&f);
}

void sched_events_start(sched *sc) {
  nas_err err;
  if (notifier_start(sc->s->notify, sc->s->n_notify, &sc->notifier, &err) != NAS_OK) {
    nas_log("%s: no webhooks in this run: %s", sc->exp->name, err.msg);
    return;
  }
  sched_events_note_front(sc);
}

void sched_events_note_front(sched *sc) {
  if (!wanted(sc, NOTIFY_FRONT_CHANGED)) return;
  front_view f;
  nas_err err;
  if (front_now(sc, &f, &err) != NAS_OK) {
    nas_log("%s: the front so far is unknown (%s); the first completed trial announces it",
            sc->exp->name, err.msg);
    return;
  }
  front_remember(sc, &f);
  front_view_free(&f);
}

/* ---- ask and tell ---------------------------------------------------------------------- */

void sched_events_told(sched *sc, const trial_row *row, const char *why) {
  sched_results_stale(sc);
  sched_events_trial_end(sc, row, why);
}

void sched_events_release(sched *sc) {
  sched_results_free(&sc->results);
  sc->results_fresh = false;
  free(sc->front_ids);
  sc->front_ids = NULL;
  sc->n_front_ids = 0;
}

void sched_events_stop(sched *sc) {
  notifier_close(sc->notifier);
  sc->notifier = NULL;
  free(sc->front_ids);
  sc->front_ids = NULL;
  sc->n_front_ids = 0;
}
