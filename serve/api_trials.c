/* serve/api_trials.c: the trial endpoints — listing and reading trials, and ask/tell
 * (docs/api.md). Ask and tell are the scheduler's (scheduler/ask.c), the same calls as
 * `nas ask` and `nas tell`. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"

/* The most trials one page lists, and the default. */
enum { PAGE_MAX = 1000, PAGE_DEFAULT = 100 };

/* A count in a query argument (?key=N); a 400 reply when it is not one. */
static int query_count(serve_request *req, const char *key, long fallback, long *out) {
  const char *text = serve_query(req, key);
  *out = fallback;
  if (text && serve_parse_count(text, INT_MAX, out) != NAS_OK)
    return serve_fail(req, MHD_HTTP_BAD_REQUEST, "?%s=%s is not a count", key, text);
  return NAS_OK;
}

/* The trial number in a path segment; a 404 reply when it is not one. */
static int trial_number(serve_request *req, const char *text, int *out) {
  long v;
  if (serve_parse_count(text, INT_MAX, &v) != NAS_OK)
    return serve_fail(req, MHD_HTTP_NOT_FOUND, "'%s' is not a trial number", text);
  *out = (int)v;
  return NAS_OK;
}

int api_list_trials(serve_request *req, char **parts) {
  long offset, limit;
  const char *status = serve_query(req, "status");
  trial_status wanted = TRIAL_QUEUED;
  if (query_count(req, "offset", 0, &offset) != NAS_OK ||
      query_count(req, "limit", PAGE_DEFAULT, &limit) != NAS_OK)
    return NAS_ERR;
  if (status && trial_status_parse(status, &wanted) != NAS_OK)
    return serve_fail(req, MHD_HTTP_BAD_REQUEST, "?status=%s is not a trial status (queued, "
                      "running, completed, failed, timeout, stopped)", status);
  if (limit > PAGE_MAX) limit = PAGE_MAX;
  api_experiment e;
  if (api_load(req, parts[0], &e, true) != NAS_OK) return NAS_ERR;
  json_t *list = json_array();
  long matching = 0;
  for (size_t i = 0; list && i < e.r.n_trials; i++) {
    if (status && e.r.trials[i].status != wanted) continue;
    if (matching >= offset && matching < offset + limit)
      json_array_append_new(list, sched_trial_json(&e.r, i));
    matching++;
  }
  api_unload(&e);
  serve_reply(req, MHD_HTTP_OK,
              json_pack("{s:i, s:i, s:i, s:o}", "total", (int)matching, "offset", (int)offset,
                        "limit", (int)limit, "trials", list));
  return NAS_OK;
}

/* Reads the one trial (its row and its own observations), not the whole experiment. */
int api_get_trial(serve_request *req, char **parts) {
  int number = -1;
  api_experiment e;
  if (trial_number(req, parts[1], &number) != NAS_OK ||
      api_load(req, parts[0], &e, false) != NAS_OK)
    return NAS_ERR;
  sched_results one_trial;
  nas_err err;
  json_t *one = NULL;
  int rc = sched_results_of_trial(req->st, e.s, &e.exp, number, &one_trial, &err);
  if (rc == NAS_OK) {
    one = sched_trial_detail_json(req->st, &e.exp, &one_trial, 0, &err);
    sched_results_free(&one_trial);
    rc = one ? NAS_OK : NAS_ERR;
  }
  if (rc == NAS_OK) serve_reply(req, MHD_HTTP_OK, one);
  else serve_fail_err(req, rc, &err);
  api_unload(&e);
  return rc;
}

/* ---- ask and tell ------------------------------------------------------------------------ */

/* A scheduler failure as a reply: a trial that is not running, a budget spent or a
 * scheduler running the experiment are conflicts; a missing trial is 404. */
static int tell_failed(serve_request *req, int rc, const nas_err *err) {
  if (rc == NAS_EEXIST) return serve_fail(req, MHD_HTTP_CONFLICT, "%s", err->msg);
  if (rc == NAS_EINVAL) return serve_fail(req, MHD_HTTP_UNPROCESSABLE_CONTENT, "%s", err->msg);
  return serve_fail_err(req, rc, err);
}

int api_ask(serve_request *req, char **parts) {
  json_t *body = serve_body_json(req);
  if (!body) return NAS_ERR;
  json_t *n_value = json_object_get(body, "n"), *worker = json_object_get(body, "worker");
  json_int_t n = n_value ? json_integer_value(n_value) : 1;
  if ((n_value && !json_is_integer(n_value)) || n < 1 || n > 1000 ||
      (worker && !json_is_string(worker))) {
    json_decref(body);
    return serve_fail(req, MHD_HTTP_UNPROCESSABLE_CONTENT,
                      "expected {\"n\": 1..1000, \"worker\": \"name\"} (both optional)");
  }
  api_experiment e;
  trial_row *rows = NULL;
  size_t got = 0;
  nas_err err;
  int rc = api_load(req, parts[0], &e, false);
  if (rc == NAS_OK) {
    rc = sched_ask(req->st, e.s, &e.exp, (size_t)n, json_string_value(worker),
                   serve_notifiers_get(&req->srv->notifiers, &e.exp), &rows, &got, &err);
    if (rc == NAS_ENOTFOUND) /* nothing left to hand out: the budget, or a finite space */
      serve_reply(req, MHD_HTTP_CONFLICT, json_pack("{s:s, s:b}", "error", err.msg, "done", 1));
    else if (rc != NAS_OK) tell_failed(req, rc, &err);
    api_unload(&e);
  }
  json_decref(body);
  if (rc != NAS_OK) return rc;
  json_t *list = json_array();
  for (size_t i = 0; i < got; i++)
    json_array_append_new(list, json_pack("{s:i, s:i, s:o}", "number", rows[i].number,
                                          "attempt", rows[i].attempts, "params",
                                          json_loads(rows[i].params_json, 0, NULL)));
  trial_rows_free(rows, got);
  serve_reply(req, MHD_HTTP_OK, json_pack("{s:o}", "trials", list));
  return NAS_OK;
}

/* The observations of a report body; a 422 reply when it holds none that fit. */
static int body_metrics(serve_request *req, const json_t *body, bool required, bool with_step,
                        metric_obs **obs, size_t *n) {
  char why[256];
  int64_t step = METRIC_FINAL;
  if ((with_step && serve_parse_step(body, &step, why, sizeof why) != NAS_OK) ||
      serve_parse_metrics(body, required, step, nas_now(), obs, n, why, sizeof why) != NAS_OK)
    return serve_fail(req, MHD_HTTP_UNPROCESSABLE_CONTENT, "%s", why);
  return NAS_OK;
}

/* The body's "attempt": the one the ask handed out, which a report, heartbeat, complete or
 * fail is for (a 409 when the trial was handed out again since); 0, whichever runs, when
 * absent (clients from before it was sent). A 422 reply when it is no attempt number. */
static int body_attempt(serve_request *req, const json_t *body, int *attempt) {
  const json_t *v = json_object_get(body, "attempt");
  *attempt = 0;
  if (!v || json_is_null(v)) return NAS_OK;
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT_MAX)
    return serve_fail(req, MHD_HTTP_UNPROCESSABLE_CONTENT,
                      "\"attempt\" must be an integer >= 1 (the one the ask answered)");
  *attempt = (int)json_integer_value(v);
  return NAS_OK;
}

/* What report, heartbeat, complete and fail share: the body, the trial number, the
 * attempt (body_attempt), the experiment. */
typedef struct {
  json_t *body;
  int number, attempt;
  api_experiment e;
} tell_call;

static int tell_begin(serve_request *req, char **parts, tell_call *c) {
  memset(c, 0, sizeof *c);
  if (trial_number(req, parts[1], &c->number) != NAS_OK || !(c->body = serve_body_json(req)))
    return NAS_ERR;
  if (body_attempt(req, c->body, &c->attempt) != NAS_OK ||
      api_load(req, parts[0], &c->e, false) != NAS_OK) {
    json_decref(c->body);
    return NAS_ERR;
  }
  return NAS_OK;
}

static void tell_end(tell_call *c) {
  api_unload(&c->e);
  json_decref(c->body);
}

/* A report for the group commit (commit.c): reports of many trials arriving together
 * are committed together. On the heap until answered, with what it borrows from. */
typedef struct {
  serve_write write;
  tell_call call;
  metric_obs *obs; /* owned; names borrowed from call.body */
  size_t n;
  notifier *nt;    /* borrowed: the experiment's webhooks (serve_notifiers_get), or NULL */
  bool stop;
  int rc;
  nas_err err;
} report_write;

static void report_write_run(storage *st, void *arg) {
  report_write *w = arg;
  const tell_call *c = &w->call;
  w->rc = sched_tell_report(st, c->e.s, &c->e.exp, c->number, c->attempt, w->obs, w->n,
                            &w->stop, &w->err);
}

/* What a trial a report stopped means for its experiment (finished? webhooks), once the
 * report is committed: not in report_write_run, which a group that fails runs again (and
 * whose first run rolled back). A resumed request has given its connection back: it takes
 * one for this. */
static void report_write_tell_stop(serve_request *req, const report_write *w) {
  storage *st = req->st;
  nas_err err;
  if (!st && serve_pool_take(&req->srv->pool, &st, &err) != NAS_OK) {
    nas_log("%s: trial %d stopped; whether it finished the experiment is unknown: %s",
            w->call.e.exp.name, w->call.number, err.msg);
    return;
  }
  sched_tell_stopped_end(st, w->call.e.s, &w->call.e.exp, w->call.number, w->nt);
  if (st != req->st) serve_pool_give(&req->srv->pool, st);
}

static void report_write_answer(serve_request *req, void *arg) {
  report_write *w = arg;
  if (w->rc == NAS_OK && w->stop) report_write_tell_stop(req, w);
  if (w->rc == NAS_OK) serve_reply(req, MHD_HTTP_OK, json_pack("{s:b}", "stop", w->stop));
  else tell_failed(req, w->rc, &w->err);
  free(w->obs);
  tell_end(&w->call);
  free(w);
}

int api_report(serve_request *req, char **parts) {
  report_write *w = calloc(1, sizeof *w);
  if (!w) return serve_fail(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
  if (tell_begin(req, parts, &w->call) != NAS_OK) {
    free(w);
    return NAS_ERR;
  }
  if (body_metrics(req, w->call.body, true, true, &w->obs, &w->n) != NAS_OK) {
    tell_end(&w->call);
    free(w);
    return NAS_ERR;
  }
  w->nt = serve_notifiers_get(&req->srv->notifiers, &w->call.e.exp);
  w->write = (serve_write){.run = report_write_run, .answer = report_write_answer, .arg = w};
  serve_submit(req, &w->write);
  return NAS_OK;
}

int api_complete(serve_request *req, char **parts) {
  tell_call c;
  if (tell_begin(req, parts, &c) != NAS_OK) return NAS_ERR;
  metric_obs *obs = NULL;
  size_t n = 0;
  nas_err err;
  int rc = body_metrics(req, c.body, false, false, &obs, &n);
  if (rc == NAS_OK) {
    rc = sched_tell_complete(req->st, c.e.s, &c.e.exp, c.number, c.attempt, obs, n,
                             serve_notifiers_get(&req->srv->notifiers, &c.e.exp), &err);
    if (rc == NAS_OK)
      serve_reply(req, MHD_HTTP_OK,
                  json_pack("{s:i, s:s}", "number", c.number, "status", "completed"));
    else
      tell_failed(req, rc, &err);
  }
  free(obs);
  tell_end(&c);
  return rc;
}

int api_fail(serve_request *req, char **parts) {
  tell_call c;
  if (tell_begin(req, parts, &c) != NAS_OK) return NAS_ERR;
  const json_t *why = json_object_get(c.body, "error");
  nas_err err;
  int rc = why && !json_is_string(why)
               ? serve_fail(req, MHD_HTTP_UNPROCESSABLE_CONTENT, "\"error\" must be a string")
               : sched_tell_fail(req->st, c.e.s, &c.e.exp, c.number, c.attempt,
                                 json_string_value(why),
                                 serve_notifiers_get(&req->srv->notifiers, &c.e.exp), &err);
  if (rc == NAS_OK)
    serve_reply(req, MHD_HTTP_OK,
                json_pack("{s:i, s:s}", "number", c.number, "status", "failed"));
  else if (!req->reply)
    tell_failed(req, rc, &err);
  tell_end(&c);
  return rc;
}

int api_heartbeat(serve_request *req, char **parts) {
  tell_call c;
  if (tell_begin(req, parts, &c) != NAS_OK) return NAS_ERR;
  nas_err err;
  int rc = sched_tell_heartbeat(req->st, &c.e.exp, c.number, c.attempt, &err);
  if (rc == NAS_OK) serve_reply(req, MHD_HTTP_OK, json_pack("{s:i}", "number", c.number));
  else tell_failed(req, rc, &err);
  tell_end(&c);
  return rc;
}
