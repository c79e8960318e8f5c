/* scheduler/launch.c: turning a queued trial into a running job — its run folder, argv
 * with parameters substituted, environment — and recording the job id before anything
 * else happens with it. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/internal.h"

char *sched_run_dir(const sched *sc, int number) {
  return nas_asprintf("%s/runs/%s/%d", sc->exp->run_root, sc->exp->name, number);
}

/* NAS_PARAM_<NAME>: the name upper-cased, anything but letters and digits as '_'. */
static char *param_env(const char *name, const json_t *value) {
  char *text = spec_value_text(value);
  char *entry = text ? nas_asprintf("NAS_PARAM_%s=%s", name, text) : NULL;
  free(text);
  if (!entry) return NULL;
  for (char *p = entry + strlen("NAS_PARAM_"); *p != '='; p++)
    *p = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
  return entry;
}

static void env_free(char **env) {
  for (size_t i = 0; env && env[i]; i++) free(env[i]);
  free(env);
}

/* The trial's environment: the spec's `env`, then what nas tells every trial (which
 * wins over the spec when names clash). Owned, NULL-terminated. */
static char **trial_env(const sched *sc, const trial_row *row, const json_t *params,
                        const char *run_dir) {
  size_t cap = sc->s->trial.n_env + json_object_size(params) + 8, n = 0;
  char **env = calloc(cap, sizeof *env);
  if (!env) return NULL;
  for (size_t i = 0; i < sc->s->trial.n_env; i++) env[n++] = strdup(sc->s->trial.env[i]);
  char *params_text = json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS);
  env[n++] = nas_asprintf("NAS_TRIAL_ID=%lld", (long long)row->id);
  env[n++] = nas_asprintf("NAS_TRIAL_NUMBER=%d", row->number);
  env[n++] = nas_asprintf("NAS_EXPERIMENT=%s", sc->exp->name);
  env[n++] = nas_asprintf("NAS_STORAGE=%s", sc->storage_url);
  env[n++] = nas_asprintf("NAS_RUN_DIR=%s", run_dir);
  env[n++] = params_text ? nas_asprintf("NAS_PARAMS=%s", params_text) : NULL;
  free(params_text);
  const char *key;
  json_t *value;
  json_object_foreach((json_t *)params, key, value) env[n++] = param_env(key, value);
  for (size_t i = 0; i < n; i++)
    if (!env[i]) {
      env_free(env);
      return NULL;
    }
  return env;
}

/* Starts the job; on success *handle is owned by the caller. */
static int start_job(sched *sc, const trial_row *row, const json_t *params,
                     const char *run_dir, char **handle, nas_err *err) {
  char **argv = NULL, **env = NULL;
  if (spec_render_argv(sc->s, params, &argv, err) != NAS_OK) return NAS_ERR;
  env = trial_env(sc, row, params, run_dir);
  if (!env) {
    spec_argv_free(argv);
    return nas_errf(err, "out of memory");
  }
  runner_job job = {.argv = argv, .workdir = sc->s->trial.workdir, .run_dir = run_dir,
                    .env = env, .timeout_s = sc->s->trial.timeout_s};
  int rc = runner_start(sc->rn, &job, handle, err);
  spec_argv_free(argv);
  env_free(env);
  return rc;
}

/* Records a trial that could not even be started as failed, so it is never lost. */
static int record_launch_failure(sched *sc, trial_row *row, const char *why, nas_err *err) {
  if (storage_trial_finish(sc->st, row->id, TRIAL_FAILED, false, 0, why, err) != NAS_OK)
    return NAS_ERR;
  sched_count(sc, row->status, TRIAL_FAILED);
  row->status = TRIAL_FAILED;
  sched_progress_event(sc, row, why);
  return NAS_OK;
}

int sched_track(sched *sc, trial_row *row, char *run_dir, nas_err *err) {
  if (sc->n_jobs == sc->cap_jobs) {
    size_t cap = sc->cap_jobs ? sc->cap_jobs * 2 : 8;
    inflight *bigger = realloc(sc->jobs, cap * sizeof *bigger);
    if (!bigger) return nas_errf(err, "out of memory");
    sc->jobs = bigger;
    sc->cap_jobs = cap;
  }
  sc->jobs[sc->n_jobs++] = (inflight){.row = *row, .run_dir = run_dir};
  memset(row, 0, sizeof *row); /* ownership moved into the job list */
  return NAS_OK;
}

int sched_launch(sched *sc, trial_row *row, nas_err *err) {
  json_error_t jerr;
  json_t *params = json_loads(row->params_json, 0, &jerr);
  if (!params)
    return nas_errf(err, "trial %d: stored parameters are not JSON: %s", row->number,
                    jerr.text);
  char *run_dir = sched_run_dir(sc, row->number);
  char *handle = NULL;
  nas_err why;
  int rc = NAS_OK;
  if (!run_dir) {
    rc = nas_errf(err, "out of memory");
  } else if (start_job(sc, row, params, run_dir, &handle, &why) != NAS_OK) {
    rc = record_launch_failure(sc, row, why.msg, err);
  } else if (storage_trial_start(sc->st, row->id, handle, err) != NAS_OK) {
    /* The job runs but storage cannot say so: stop it rather than run it untracked. */
    runner_stop(sc->rn, handle, run_dir, NULL);
    rc = NAS_ERR;
  } else {
    sched_count(sc, row->status, TRIAL_RUNNING);
    row->status = TRIAL_RUNNING;
    row->attempts++;
    free(row->job_id);
    row->job_id = handle;
    handle = NULL;
    sched_progress_event(sc, row, NULL);
    rc = sched_track(sc, row, run_dir, err);
    if (rc == NAS_OK) run_dir = NULL;
  }
  free(handle);
  free(run_dir);
  json_decref(params);
  return rc;
}
