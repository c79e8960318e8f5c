/* serve/api.h: what the endpoint files of serve/ share (internal to serve/). */
#ifndef NAS_SERVE_API_H
#define NAS_SERVE_API_H

#include "scheduler/scheduler.h"
#include "serve/internal.h"

/* An experiment with its spec and, when asked for, its results. */
typedef struct {
  experiment_row exp;
  spec *s;
  sched_results r;
  bool has_results;
} api_experiment;

/* Loads experiment `name`; on failure the reply says why (404 when there is none). */
int api_load(serve_request *req, const char *name, api_experiment *out, bool with_results);
void api_unload(api_experiment *e);

/* api_trials.c: parts[0] is the experiment, parts[1] the trial number. */
int api_list_trials(serve_request *req, char **parts);
int api_get_trial(serve_request *req, char **parts);
int api_ask(serve_request *req, char **parts);
int api_report(serve_request *req, char **parts);
int api_complete(serve_request *req, char **parts);
int api_fail(serve_request *req, char **parts);
int api_heartbeat(serve_request *req, char **parts);

/* api_storage.c: parts[0] is the storage operation. */
int api_storage(serve_request *req, char **parts);

#endif
