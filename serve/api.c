/* serve/api.c: the routes of /api/v1/ and the read and manage endpoints (docs/api.md).
 * Each handler loads what it needs through storage and the scheduler's calls — the same
 * ones the CLI makes — and answers JSON; ask/tell lives in api_trials.c. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scheduler/scheduler.h"
#include "serve/api.h"

/* ---- loading an experiment ------------------------------------------------------------- */

int api_load(serve_request *req, const char *name, api_experiment *out, bool with_results) {
  nas_err err;
  memset(out, 0, sizeof *out);
  int rc = storage_experiment_get(req->st, name, &out->exp, &err);
  if (rc == NAS_ENOTFOUND) return serve_fail(req, MHD_HTTP_NOT_FOUND, "no experiment '%s'", name);
  if (rc != NAS_OK) return serve_fail_err(req, rc, &err);
  rc = sched_experiment_spec(&out->exp, &out->s, &err);
  if (rc == NAS_OK && with_results) {
    rc = sched_results_load(req->st, out->s, out->exp.id, &out->r, &err);
    out->has_results = rc == NAS_OK;
  }
  if (rc != NAS_OK) {
    api_unload(out);
    return serve_fail_err(req, rc, &err);
  }
  return NAS_OK;
}

void api_unload(api_experiment *e) {
  if (e->has_results) sched_results_free(&e->r);
  spec_free(e->s);
  experiment_row_clear(&e->exp);
  memset(e, 0, sizeof *e);
}

/* ---- experiments --------------------------------------------------------------------------- */

static int summary_of(serve_request *req, const char *name, json_t **out) {
  api_experiment e;
  nas_err err;
  if (api_load(req, name, &e, true) != NAS_OK) return NAS_ERR;
  *out = sched_experiment_json(req->st, e.s, &e.exp, &e.r, NULL, &err);
  api_unload(&e);
  return *out ? NAS_OK : serve_fail_err(req, NAS_ERR, &err);
}

static int list_experiments(serve_request *req, char **parts) {
  (void)parts;
  json_t *list;
  nas_err err;
  int rc = sched_experiment_list_json(req->st, &list, &err);
  if (rc != NAS_OK) return serve_fail_err(req, rc, &err);
  serve_reply(req, MHD_HTTP_OK, list);
  return NAS_OK;
}

static int get_experiment(serve_request *req, char **parts) {
  json_t *one;
  if (summary_of(req, parts[0], &one) != NAS_OK) return NAS_ERR;
  serve_reply(req, MHD_HTTP_OK, one);
  return NAS_OK;
}

/* The body is a YAML spec, checked as `nas run` checks one; its relative paths and run
 * folders are the server's current folder's: it is stored as if it were the file NAME.yaml
 * there, so whoever loads it later (`nas resume` in another folder) resolves them there too. */
static int create_experiment(serve_request *req, char **parts) {
  (void)parts;
  spec *s = NULL;
  nas_err err;
  const char *text = req->body ? req->body : "";
  if (spec_parse(text, "request.yaml", req->srv->cwd, &s, &err) != NAS_OK ||
      sched_check_spec(s, &err) != NAS_OK) {
    spec_free(s);
    return serve_fail(req, MHD_HTTP_BAD_REQUEST, "%s", err.msg);
  }
  char *path = nas_asprintf("%s/%s.yaml", req->srv->cwd, s->name);
  int rc = path ? NAS_OK : nas_errf(&err, "out of memory");
  if (path) free(s->path), s->path = path; /* spec_parse records "<string>" */
  experiment_row exp = {0};
  bool existed = rc == NAS_OK && storage_experiment_get(req->st, s->name, &exp, &err) == NAS_OK;
  experiment_row_clear(&exp);
  if (rc == NAS_OK) rc = sched_prepare(s, req->st, &exp, &err);
  if (rc == NAS_OK) {
    json_t *one;
    rc = summary_of(req, exp.name, &one);
    if (rc == NAS_OK) serve_reply(req, existed ? MHD_HTTP_OK : MHD_HTTP_CREATED, one);
  } else {
    serve_fail_err(req, rc, &err); /* NAS_EEXIST: a different spec under that name, 409 */
  }
  experiment_row_clear(&exp);
  spec_free(s);
  return rc;
}

static int stop_experiment(serve_request *req, char **parts) {
  api_experiment e;
  nas_err err;
  if (api_load(req, parts[0], &e, false) != NAS_OK) return NAS_ERR;
  sched_stopped done;
  int rc = sched_stop(e.s, req->st, &e.exp, NULL, &done, &err);
  api_unload(&e);
  if (rc != NAS_OK) return serve_fail_err(req, rc, &err);
  return get_experiment(req, parts);
}

static int get_pareto(serve_request *req, char **parts) {
  api_experiment e;
  nas_err err;
  if (api_load(req, parts[0], &e, true) != NAS_OK) return NAS_ERR;
  json_t *pareto = sched_pareto_json(e.s, &e.exp, &e.r, &err);
  api_unload(&e);
  if (!pareto) return serve_fail_err(req, NAS_ERR, &err);
  serve_reply(req, MHD_HTTP_OK, pareto);
  return NAS_OK;
}

/* What the dashboard draws for one experiment (scheduler/dashboard.c): all of it but the
 * learning curves, then those. */
static int get_dashboard_part(serve_request *req, const char *name, bool curves) {
  api_experiment e;
  nas_err err;
  if (api_load(req, name, &e, true) != NAS_OK) return NAS_ERR;
  json_t *data = curves ? sched_curves_json(req->st, &e.exp, &e.r, &err)
                        : sched_dashboard_json(req->st, e.s, &e.exp, &e.r, &err);
  api_unload(&e);
  if (!data) return serve_fail_err(req, NAS_ERR, &err);
  serve_reply(req, MHD_HTTP_OK, curves ? json_pack("{s:o}", "curves", data) : data);
  return NAS_OK;
}

static int get_dashboard(serve_request *req, char **parts) { return get_dashboard_part(req, parts[0], false); }
static int get_curves(serve_request *req, char **parts) { return get_dashboard_part(req, parts[0], true); }

/* The most experiments one comparison takes. */
enum { COMPARE_MAX = 16 };

/* ?experiments=A,B,…: their fronts at one reference point, as `nas compare` (compare.c). */
static int get_compare(serve_request *req, char **parts) {
  (void)parts;
  const char *list = serve_query(req, "experiments");
  char *names = list ? strdup(list) : NULL, *save = NULL;
  if (!names) return serve_fail(req, MHD_HTTP_BAD_REQUEST, "expected ?experiments=A,B,…");
  api_experiment e[COMPARE_MAX];
  sched_compared c[COMPARE_MAX];
  size_t n = 0;
  int rc = NAS_OK;
  for (char *name = strtok_r(names, ",", &save); rc == NAS_OK && name; name = strtok_r(NULL, ",", &save)) {
    if (n == COMPARE_MAX) rc = serve_fail(req, MHD_HTTP_BAD_REQUEST, "at most %d experiments compare at once", COMPARE_MAX);
    else if ((rc = api_load(req, name, &e[n], true)) == NAS_OK) c[n] = (sched_compared){&e[n].exp, e[n].s, &e[n].r}, n++;
  }
  if (rc == NAS_OK && n < 2) rc = serve_fail(req, MHD_HTTP_BAD_REQUEST, "expected two experiments or more in ?experiments=A,B");
  nas_err err;
  json_t *out = rc == NAS_OK ? sched_compare_json(c, n, &err) : NULL;
  /* Its one failure but memory: objectives that differ. */
  if (rc == NAS_OK && !out) rc = serve_fail(req, MHD_HTTP_UNPROCESSABLE_CONTENT, "%s", err.msg);
  if (out) serve_reply(req, MHD_HTTP_OK, out);
  for (size_t i = 0; i < n; i++) api_unload(&e[i]);
  free(names);
  return rc;
}

/* ---- routing ------------------------------------------------------------------------------ */

typedef struct {
  const char *method;
  const char *pattern;  /* path segments; "*" matches one segment, handed to the handler */
  serve_scope needs;
  int (*handle)(serve_request *req, char **parts);
} route;

static const route routes[] = {
    {"GET", "/api/v1/experiments", SCOPE_READ, list_experiments},
    {"POST", "/api/v1/experiments", SCOPE_WRITE, create_experiment},
    {"GET", "/api/v1/experiments/*", SCOPE_READ, get_experiment},
    {"POST", "/api/v1/experiments/*/stop", SCOPE_WRITE, stop_experiment},
    {"GET", "/api/v1/experiments/*/pareto", SCOPE_READ, get_pareto},
    {"GET", "/api/v1/experiments/*/dashboard", SCOPE_READ, get_dashboard},
    {"GET", "/api/v1/experiments/*/curves", SCOPE_READ, get_curves},
    {"GET", "/api/v1/compare", SCOPE_READ, get_compare},
    {"GET", "/api/v1/experiments/*/trials", SCOPE_READ, api_list_trials},
    {"GET", "/api/v1/experiments/*/trials/*", SCOPE_READ, api_get_trial},
    {"POST", "/api/v1/experiments/*/ask", SCOPE_WRITE, api_ask},
    {"POST", "/api/v1/experiments/*/trials/*/report", SCOPE_WRITE, api_report},
    {"POST", "/api/v1/experiments/*/trials/*/complete", SCOPE_WRITE, api_complete},
    {"POST", "/api/v1/experiments/*/trials/*/fail", SCOPE_WRITE, api_fail},
    {"POST", "/api/v1/experiments/*/trials/*/heartbeat", SCOPE_WRITE, api_heartbeat},
    /* The storage RPC (storage/rpc.h); writes need SCOPE_WRITE, checked per operation. */
    {"POST", "/api/v1/storage/*", SCOPE_READ, api_storage},
};

enum { max_parts = 4 };

/* Whether a request's method is the route's: HEAD is GET without the body (which
 * libmicrohttpd leaves out). */
static bool method_is(const char *method, const route *r) {
  return strcmp(r->method, method) == 0 || (strcmp(method, "HEAD") == 0 && strcmp(r->method, "GET") == 0);
}

void serve_route(serve_request *req) {
  bool takes_get = false, takes_post = false;
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
    char *path = strdup(req->path), *parts[max_parts];
    size_t n_parts;
    if (!path) {
      serve_fail(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
      return;
    }
    bool hit = serve_path_match(routes[i].pattern, path, parts, max_parts, &n_parts);
    takes_get |= hit && strcmp(routes[i].method, "GET") == 0;
    takes_post |= hit && strcmp(routes[i].method, "POST") == 0;
    if (hit && method_is(req->method, &routes[i])) {
      if (req->scope < routes[i].needs)
        serve_fail(req, MHD_HTTP_FORBIDDEN, "this token may only read");
      else
        routes[i].handle(req, parts);
      free(path);
      return;
    }
    free(path);
  }
  if (!takes_get && !takes_post) {
    serve_fail(req, MHD_HTTP_NOT_FOUND, "no such endpoint: %s (see docs/api.md)", req->path);
    return;
  }
  req->allow = takes_get && takes_post ? "GET, HEAD, POST" : takes_get ? "GET, HEAD" : "POST";
  serve_fail(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s is not allowed on %s (only %s)", req->method,
             req->path, req->allow);
}
