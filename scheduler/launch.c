/* scheduler/launch.c: turning a queued trial into a running job — its run folder, argv
 * with parameters substituted, environment — and recording the job id before anything
 * else happens with it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scheduler/internal.h"

char *sched_run_dir(const experiment_row *exp, int number, int attempt) {
  if (attempt <= 1) return nas_asprintf("%s/runs/%s/%d", exp->run_root, exp->name, number);
  return nas_asprintf("%s/runs/%s/%d.%d", exp->run_root, exp->name, number, attempt);
}

int sched_enqueue(sched *sc, trial_row *row, nas_err *err) {
  if (sc->n_queued == sc->cap_queued) {
    size_t cap = sc->cap_queued ? 2 * sc->cap_queued : 8;
    trial_row *bigger = realloc(sc->queued, cap * sizeof *bigger);
    if (!bigger) return nas_errf(err, "out of memory");
    sc->queued = bigger;
    sc->cap_queued = cap;
  }
  sc->queued[sc->n_queued++] = *row;
  memset(row, 0, sizeof *row);
  return NAS_OK;
}

/* NAS_PARAM_<NAME>=value (spec_param_env_name). */
static char *param_env(const char *name, const json_t *value) {
  char *text = spec_value_text(value), *var = spec_param_env_name(name);
  char *entry = text && var ? nas_asprintf("%s=%s", var, text) : NULL;
  free(text);
  free(var);
  return entry;
}

static void env_free(char **env) {
  for (size_t i = 0; env && env[i]; i++) free(env[i]);
  free(env);
}

/* "NAME=share" when several trials share the cores and neither the user's environment
 * nor the spec sets NAME: two trials each using every core's worth of OpenMP or OpenBLAS
 * threads run several times slower than with a share each (measured by the engine
 * benchmark: 16–24 k against 150 k MLP samples/s). NULL when not needed. */
static char *thread_default(const sched *sc, const char *name) {
  if (sc->s->budget.parallel < 2 || getenv(name)) return NULL;
  size_t len = strlen(name);
  for (size_t i = 0; i < sc->s->trial.n_env; i++)
    if (strncmp(sc->s->trial.env[i], name, len) == 0 && sc->s->trial.env[i][len] == '=')
      return NULL;
  long cores = sysconf(_SC_NPROCESSORS_ONLN), share = cores / sc->s->budget.parallel;
  return nas_asprintf("%s=%ld", name, share > 0 ? share : 1);
}

/* The trial's environment: thread shares, the token nas holds for a `nas serve` (a Slurm
 * trial gets it from env.sh alone: Slurm's commands run without it), the spec's `env`, then
 * what nas tells every trial (which wins over the spec when names clash). Owned,
 * NULL-terminated. */
static char **trial_env(const sched *sc, const trial_row *row, const json_t *params,
                        const char *run_dir) {
  size_t cap = sc->s->trial.n_env + json_object_size(params) + 12 + SCHED_HYPERBAND_ENV_MAX,
         n = 0;
  char **env = calloc(cap, sizeof *env);
  if (!env) return NULL;
  static const char *const pools[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  for (size_t i = 0; i < 2; i++) {
    char *entry = thread_default(sc, pools[i]);
    if (entry) env[n++] = entry;
  }
  const char *token = getenv("NAS_TOKEN");
  if (token) env[n++] = nas_asprintf("NAS_TOKEN=%s", token);
  for (size_t i = 0; i < sc->s->trial.n_env; i++) env[n++] = strdup(sc->s->trial.env[i]);
  char *params_text = json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS);
  env[n++] = nas_asprintf("NAS_TRIAL_ID=%lld", (long long)row->id);
  env[n++] = nas_asprintf("NAS_TRIAL_NUMBER=%d", row->number);
  env[n++] = nas_asprintf("NAS_ATTEMPT=%d", row->attempts + 1);
  env[n++] = nas_asprintf("NAS_EXPERIMENT=%s", sc->exp->name);
  env[n++] = nas_asprintf("NAS_STORAGE=%s", sc->storage_url);
  env[n++] = nas_asprintf("NAS_RUN_DIR=%s", run_dir);
  env[n++] = params_text ? nas_asprintf("NAS_PARAMS=%s", params_text) : NULL;
  free(params_text);
  sched_hyperband_env(sc, row, env, &n);
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

/* What the job executes: the spec's command with the parameters filled in, or for a
 * built-in trial this same nas binary as `nas worker --trial ID --storage URL`. A URL
 * with a password stays out of the arguments (others can read them); the worker then
 * takes it from NAS_STORAGE. Owned, NULL-terminated (spec_argv_free). */
static int trial_argv(const sched *sc, const trial_row *row, const json_t *params,
                      char ***argv, nas_err *err) {
  if (!sc->s->trial.builtin) return spec_render_argv(sc->s, params, argv, err);
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len < 0)
    return nas_errf(err, "cannot find the nas binary: /proc/self/exe: %s", strerror(errno));
  exe[len] = '\0';
  char *shown = storage_url_redacted(sc->storage_url);
  bool secret = !shown || strcmp(shown, sc->storage_url) != 0;
  free(shown);
  char *list[] = {strdup(exe), strdup("worker"), strdup("--trial"),
                  nas_asprintf("%lld", (long long)row->id), secret ? NULL : strdup("--storage"),
                  secret ? NULL : strdup(sc->storage_url), NULL};
  size_t n = secret ? 4 : 6;
  bool complete = true;
  for (size_t i = 0; i < n; i++) complete = complete && list[i];
  *argv = complete ? calloc(n + 1, sizeof **argv) : NULL;
  if (*argv) {
    memcpy(*argv, list, n * sizeof *list);
    return NAS_OK;
  }
  for (size_t i = 0; i < n; i++) free(list[i]);
  return nas_errf(err, "out of memory");
}

/* Everything one job needs, built from its trial. */
typedef struct {
  json_t *params;  /* owned */
  char *run_dir;   /* owned until the trial is tracked */
  char **argv;     /* owned */
  char **env;      /* owned */
  runner_job job;  /* borrows the above */
} prepared;

static void prepared_free(prepared *p) {
  json_decref(p->params);
  free(p->run_dir);
  spec_argv_free(p->argv);
  env_free(p->env);
  memset(p, 0, sizeof *p);
}

/* Records a trial that could not even be started as failed, so it is never lost, and
 * counts it as any failed trial: a run whose jobs cannot start (a run folder that cannot
 * be made, sbatch refusing every job) stops at budget.max_failure_rate. */
static int record_launch_failure(sched *sc, trial_row *row, const char *why, nas_err *err) {
  if (storage_trial_finish(sc->st, row->id, TRIAL_FAILED, false, 0, why, err) != NAS_OK)
    return NAS_ERR;
  sched_count(sc, row->status, TRIAL_FAILED);
  row->status = TRIAL_FAILED;
  sched_results_set_status(sc, row->id, TRIAL_FAILED);
  sched_progress_event(sc, row, why);
  sched_events_trial_end(sc, row, why);
  return sched_trial_ended(sc, row->number, TRIAL_FAILED, why, err);
}

int sched_track(sched *sc, trial_row *row, char *run_dir, nas_err *err) {
  if (sc->n_jobs == sc->cap_jobs) {
    size_t cap = sc->cap_jobs ? sc->cap_jobs * 2 : 8;
    inflight *bigger = realloc(sc->jobs, cap * sizeof *bigger);
    if (!bigger) return nas_errf(err, "out of memory");
    sc->jobs = bigger;
    sc->cap_jobs = cap;
  }
  sc->jobs[sc->n_jobs++] = (inflight){.row = *row, .run_dir = run_dir, .last_heard = nas_now()};
  memset(row, 0, sizeof *row); /* ownership moved into the job list */
  return NAS_OK;
}

/* A retry reads a fresh log from its start: the stored offset goes back to 0 before the
 * job exists, so a crash in between cannot make the next process skip its first lines. */
static int reset_log_offset(sched *sc, trial_row *row, nas_err *err) {
  if (row->attempts == 0 || row->log_offset == 0) return NAS_OK;
  if (storage_metrics_add(sc->st, row->id, NULL, 0, 0, err) != NAS_OK) return NAS_ERR;
  row->log_offset = 0;
  return NAS_OK;
}

/* Builds a trial's job. Returns NAS_ERR for errors of the loop (storage, memory); a trial
 * whose job cannot be built gets *ready = false and the reason in why. */
static int prepare(sched *sc, trial_row *row, prepared *p, bool *ready, nas_err *why,
                   nas_err *err) {
  json_error_t jerr;
  memset(p, 0, sizeof *p);
  *ready = false;
  if (!(p->params = json_loads(row->params_json, 0, &jerr)))
    return nas_errf(err, "trial %d: stored parameters are not JSON: %s", row->number, jerr.text);
  if (reset_log_offset(sc, row, err) != NAS_OK) return NAS_ERR;
  if (!(p->run_dir = sched_run_dir(sc->exp, row->number, row->attempts + 1)))
    return nas_errf(err, "out of memory");
  if (trial_argv(sc, row, p->params, &p->argv, why) != NAS_OK) return NAS_OK;
  if (!(p->env = trial_env(sc, row, p->params, p->run_dir))) return nas_errf(err, "out of memory");
  p->job = (runner_job){.argv = p->argv, .workdir = sc->s->trial.workdir, .run_dir = p->run_dir,
                        .env = p->env, .timeout_s = sc->s->trial.timeout_s};
  *ready = true;
  return NAS_OK;
}

/* Stores a started job's handle (taking it over), releases the job when it was started
 * held — only now that storage knows it, so a crash before this point leaves a held job
 * that never runs and that the next poll finds lost, then retries — and tracks the trial. */
static int record_start(sched *sc, trial_row *row, prepared *p, char *handle, bool held,
                        nas_err *err) {
  if (storage_trial_start(sc->st, row->id, handle, err) != NAS_OK) {
    runner_stop(sc->rn, handle, p->run_dir, NULL); /* a held job never runs, then */
    free(handle);
    return NAS_ERR;
  }
  nas_err why;
  if (held && runner_release(sc->rn, handle, &why) != NAS_OK)
    nas_log("%s: trial %d: %s", sc->exp->name, row->number, why.msg);
  sched_count(sc, row->status, TRIAL_RUNNING);
  row->status = TRIAL_RUNNING;
  sched_results_set_status(sc, row->id, TRIAL_RUNNING);
  row->attempts++;
  free(row->job_id);
  row->job_id = handle;
  sched_progress_event(sc, row, NULL);
  if (sched_track(sc, row, p->run_dir, err) != NAS_OK) return NAS_ERR;
  p->run_dir = NULL; /* now the job list's */
  return NAS_OK;
}

int sched_launch(sched *sc, trial_row *row, nas_err *err) {
  prepared p;
  bool ready;
  nas_err why;
  char *handle = NULL;
  int rc = prepare(sc, row, &p, &ready, &why, err);
  if (rc == NAS_OK && ready && runner_start_held(sc->rn, &p.job, &handle, &why) != NAS_OK)
    ready = false;
  if (rc == NAS_OK)
    rc = ready ? record_start(sc, row, &p, handle, true, err)
               : record_launch_failure(sc, row, why.msg, err);
  prepared_free(&p);
  return rc;
}

int sched_launch_batch(sched *sc, trial_row *rows, size_t n, nas_err *err) {
  prepared *p = calloc(n, sizeof *p);
  runner_job *jobs = calloc(n, sizeof *jobs);
  char **handles = calloc(n, sizeof *handles);
  size_t *which = calloc(n, sizeof *which), k = 0;
  int rc = p && jobs && handles && which ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    bool ready;
    nas_err why;
    rc = prepare(sc, &rows[i], &p[i], &ready, &why, err);
    if (rc == NAS_OK && !ready) rc = record_launch_failure(sc, &rows[i], why.msg, err);
    if (rc == NAS_OK && ready) which[k] = i, jobs[k++] = p[i].job;
  }
  nas_err why;
  bool started = rc == NAS_OK && k > 0 && runner_start_batch(sc->rn, jobs, k, handles, &why) == NAS_OK;
  for (size_t j = 0; rc == NAS_OK && j < k; j++) {
    rc = started ? record_start(sc, &rows[which[j]], &p[which[j]], handles[j], false, err)
                 : record_launch_failure(sc, &rows[which[j]], why.msg, err);
    handles[j] = NULL;
  }
  for (size_t j = 0; handles && j < k; j++) free(handles[j]);
  for (size_t i = 0; p && i < n; i++) prepared_free(&p[i]);
  free(p), free(jobs), free(handles), free(which);
  return rc;
}
