/* scheduler/experiment.c: finding or creating the experiment a spec describes, and
 * refusing to continue one whose spec changed in ways that would mix incomparable trials;
 * what other commands do to an experiment outside its run: stop it, retry its failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optimizer/optimizer.h"
#include "runners/runner.h"
#include "scheduler/internal.h"

/* Whether every line of a spec_diff is about the budget or the webhooks (`notify`), the
 * sections that may change between runs of one experiment: neither changes what a trial
 * means. */
static bool only_changeable_changed(const char *diff) {
  for (const char *line = diff; *line;) {
    if (strncmp(line, "budget.", 7) != 0 && strncmp(line, "notify:", 7) != 0) return false;
    const char *nl = strchr(line, '\n');
    if (!nl) break;
    line = nl + 1;
  }
  return true;
}

int sched_experiment_spec(const experiment_row *exp, spec **out, nas_err *err) {
  char *dir = nas_dirname(exp->spec_path);
  int rc = dir ? spec_parse(exp->spec_text, exp->spec_path, dir, out, err)
               : nas_errf(err, "out of memory");
  free(dir);
  if (rc != NAS_OK)
    return nas_err_prefix(err, "experiment '%s': its stored spec no longer loads", exp->name);
  char *path = strdup(exp->spec_path); /* spec_parse records "<string>" */
  if (!path) {
    spec_free(*out);
    *out = NULL;
    return nas_errf(err, "out of memory");
  }
  free((*out)->path);
  (*out)->path = path;
  return NAS_OK;
}

/* spec_diff of the two specs with their storage lines' passwords masked: a new password
 * alone is not a change (passwords rotate), and the diff, which messages show, holds none.
 * Shallow copies with the storage line swapped, since spec_diff only reads; *diff is NULL
 * when the specs do not differ. */
static int diff_masked(const spec *stored, const spec *s, char **diff, nas_err *err) {
  spec old = *stored, new = *s;
  old.storage = storage_url_redacted(stored->storage);
  new.storage = storage_url_redacted(s->storage);
  int rc = old.storage && new.storage ? spec_diff(&old, &new, diff, err)
                                      : nas_errf(err, "out of memory");
  free(old.storage);
  free(new.storage);
  return rc;
}

/* Stores s in place of exp's spec, under the experiment's lease: a live scheduler runs on
 * with the spec it read, so a change stored beside it would be a budget that no command
 * runs with, spent by the next `nas resume` (a refused `nas run` must change nothing).
 * Refused at once while a run holds it; an ask (all that holds the lease of a spec that
 * runs nothing) holds it for an instant, and is waited for. */
static int store_changed_spec(const spec *s, storage *st, const experiment_row *exp,
                              const char *diff, nas_err *err) {
  sched_lease lease = {0};
  int rc = sched_lease_take_waiting(st, exp, &lease, spec_trial_runs(s) ? 0 : SCHED_ASK_WAIT_S,
                                    err);
  if (rc == NAS_OK) {
    nas_log("experiment '%s': spec changed:\n%s", exp->name, diff);
    rc = storage_experiment_set_spec(st, exp->id, s->text, err);
  }
  sched_lease_release(st, exp, &lease);
  return rc;
}

static int compare_with_stored(const spec *s, storage *st, const experiment_row *exp,
                               nas_err *err) {
  spec *stored = NULL;
  int rc = sched_experiment_spec(exp, &stored, err);
  if (rc != NAS_OK) return rc;
  char *diff = NULL;
  rc = diff_masked(stored, s, &diff, err);
  spec_free(stored);
  if (rc != NAS_OK || !diff) return rc;
  if (only_changeable_changed(diff)) {
    rc = store_changed_spec(s, st, exp, diff, err);
  } else {
    rc = nas_errc(err, NAS_EEXIST,
                  "experiment '%s' already exists with a different spec:\n%s"
                  "Only budget and notify may change between runs of one experiment: give the "
                  "experiment a new name, or undo the other changes.",
                  exp->name, diff);
  }
  free(diff);
  return rc;
}

/* A stopped experiment marked running again, as storing its spec once more asks (`nas
 * create`, POST /experiments; `nas run` marks it so itself): without this, one whose
 * trials `nas ask` hands out could never go on after `nas stop`. Not while a scheduler
 * still holds it: its `nas run` is to see the stop. */
static int reopen_stopped(storage *st, const experiment_row *exp, nas_err *err) {
  if (strcmp(exp->status, "stopped") != 0) return NAS_OK;
  sched_liveness scheduler;
  char *holder;
  if (sched_scheduler_state(st, exp, &scheduler, &holder, err) != NAS_OK) return NAS_ERR;
  free(holder);
  if (scheduler == SCHEDULER_ALIVE) return NAS_OK;
  return storage_experiment_set_status(st, exp->id, "running", NULL, err);
}

/* The stored experiment of spec s, its spec checked against s, opened again if stopped. */
static int prepare_existing(const spec *s, storage *st, experiment_row *exp, nas_err *err) {
  int rc = compare_with_stored(s, st, exp, err);
  if (rc == NAS_OK) rc = reopen_stopped(st, exp, err);
  experiment_row_clear(exp);
  return rc == NAS_OK ? storage_experiment_get(st, s->name, exp, err) : rc;
}

typedef int (*options_validator)(const char *type, const json_t *options, nas_err *err);

/* Whether the options of p without key pass validate. */
static bool valid_without(const plugin_spec *p, const char *key, options_validator validate) {
  json_t *rest = json_deep_copy(p->options);
  nas_err ignored;
  bool valid =
      rest && json_object_del(rest, key) == 0 && validate(p->type, rest, &ignored) == NAS_OK;
  json_decref(rest);
  return valid;
}

/* err, already set, prefixed with key's place in the spec. */
static int at_option(const plugin_spec *p, const char *section, const char *key, nas_err *err) {
  const char *where = json_string_value(json_object_get(p->where, key));
  return nas_err_prefix(err, "%s: %s.%s", where ? where : "spec", section, key);
}

/* Checks a plug-in's options as the plug-in will take them: all together, since some hold
 * only with others (the local runner's gpus_per_trial given alone means gpus: auto). A
 * refusal is named at the option that causes it: the one without which the rest pass,
 * else the first that fails on its own, else the section. */
static int check_plugin(const plugin_spec *p, const char *section, options_validator validate,
                        nas_err *err) {
  if (validate(p->type, p->options, err) == NAS_OK) return NAS_OK;
  const char *key;
  json_t *value;
  json_object_foreach(p->options, key, value) {
    if (valid_without(p, key, validate)) return at_option(p, section, key, err);
  }
  json_object_foreach(p->options, key, value) {
    json_t *alone = json_pack("{sO}", key, value);
    nas_err alone_err;
    int rc = alone ? validate(p->type, alone, &alone_err) : nas_errf(&alone_err, "out of memory");
    json_decref(alone);
    if (rc != NAS_OK) {
      *err = alone_err;
      return at_option(p, section, key, err);
    }
  }
  return nas_err_prefix(err, "%s", section);
}

int sched_check_spec(const spec *s, nas_err *err) {
  int rc = check_plugin(&s->runner, "runner", runner_validate_options, err);
  return rc ? rc : check_plugin(&s->optimizer, "optimizer", optimizer_validate_options, err);
}

int sched_check_runnable(const spec *s, nas_err *err) {
  if (spec_trial_runs(s)) return NAS_OK;
  /* Named by the experiment: a stored spec (nas resume) may name a file long gone. */
  return nas_errf(err, "experiment '%s': the spec's trial section runs nothing (neither "
                  "trial.command nor trial.builtin), so there is nothing for 'nas run' to "
                  "launch; hand its trials out with 'nas ask'/'nas tell' or 'nas serve' "
                  "(docs/api.md)", s->name);
}

/* Stores a new experiment of s with its `enqueue:` assignments as queued trials. */
static int create_with_enqueued(const spec *s, storage *st, const char *run_root,
                                int64_t *id, nas_err *err) {
  size_t n = json_array_size(s->enqueue);
  double now = nas_now();
  experiment_row exp = {.name = s->name, .spec_text = s->text, .spec_path = s->path,
                        .run_root = (char *)run_root,
                        .status = "running", .created_at = now};
  trial_row *trials = calloc(n, sizeof *trials);
  int rc = trials ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    trials[i] = (trial_row){.number = (int)i, .status = TRIAL_QUEUED, .created_at = now};
    trials[i].params_json = json_dumps(json_array_get(s->enqueue, i),
                                       JSON_COMPACT | JSON_SORT_KEYS);
    if (!trials[i].params_json) rc = nas_errf(err, "out of memory");
  }
  storage_experiment_image img = {.exp = &exp, .trials = trials, .n_trials = n};
  if (rc == NAS_OK) rc = storage_experiment_import(st, &img, id, err);
  trial_rows_free(trials, trials ? n : 0);
  return rc;
}

int sched_prepare(const spec *s, storage *st, experiment_row *exp, nas_err *err) {
  int rc = storage_experiment_get(st, s->name, exp, err);
  if (rc == NAS_OK) return prepare_existing(s, st, exp, err);
  if (rc != NAS_ENOTFOUND) return rc;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return nas_errf(err, "cannot read the current folder");
  int64_t id;
  rc = s->enqueue ? create_with_enqueued(s, st, cwd, &id, err)
                  : storage_experiment_create(st, s->name, s->text, s->path, cwd, &id, err);
  /* Another process created it meanwhile: the same as finding it (the lease then decides
   * which of the two runs it). */
  if (rc == NAS_EEXIST && storage_experiment_get(st, s->name, exp, err) == NAS_OK)
    return prepare_existing(s, st, exp, err);
  return rc == NAS_OK ? storage_experiment_get(st, s->name, exp, err) : rc;
}

/* Asks the runner of each running trial's job to stop it; *asked counts them. A trial
 * handed out by `nas ask` has no job (its job id names its asker): its asker ends it. */
static int stop_running(const spec *s, storage *st, const experiment_row *exp, FILE *report,
                        size_t *asked, nas_err *err) {
  trial_row *rows;
  size_t n;
  runner *rn = NULL;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  int rc = runner_create(s->runner.type, s->runner.options, &rn, err);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    if (rows[i].status != TRIAL_RUNNING || !rows[i].job_id || sched_handed_out(&rows[i]))
      continue;
    char *run_dir = sched_run_dir(exp, rows[i].number, rows[i].attempts);
    nas_err why;
    if (!run_dir) rc = nas_errf(err, "out of memory");
    else if (runner_stop(rn, rows[i].job_id, run_dir, &why) != NAS_OK && report)
      fprintf(report, "nas: %s: trial %d: %s\n", exp->name, rows[i].number, why.msg);
    else ++*asked;
    free(run_dir);
  }
  if (rn) runner_free(rn);
  trial_rows_free(rows, n);
  return rc;
}

int sched_stop(const spec *s, storage *st, const experiment_row *exp, FILE *report,
               sched_stopped *done, nas_err *err) {
  *done = (sched_stopped){.was_finished = strcmp(exp->status, "finished") == 0};
  if (done->was_finished) return NAS_OK;
  if (storage_experiment_set_status(st, exp->id, "stopped", NULL, err) != NAS_OK) return NAS_ERR;
  return stop_running(s, st, exp, report, &done->asked, err);
}

/* What `--failed` (no numbers) queues again: trials that ended by a fault. */
static bool retryable(trial_status status) {
  return status == TRIAL_FAILED || status == TRIAL_TIMEOUT;
}

/* What a number may name besides: a stopped trial (a second Ctrl-C, `nas stop`, the wall-time
 * budget, early stopping) did not fail, so --failed leaves it, but its work was cut short, and
 * one stopped by an interrupt has no other way back into the budget it counts in. */
static bool retryable_by_number(trial_status status) {
  return retryable(status) || status == TRIAL_STOPPED;
}

/* The row of trial `number` in rows (ordered by number), or NULL. */
static const trial_row *trial_numbered(const trial_row *rows, size_t n, int number) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].number == number) return &rows[i];
  return NULL;
}

/* Checks every number asked for before anything changes. */
static int retry_check(const experiment_row *exp, const trial_row *rows, size_t n_rows,
                       const int *numbers, size_t n, nas_err *err) {
  for (size_t i = 0; i < n; i++) {
    const trial_row *row = trial_numbered(rows, n_rows, numbers[i]);
    if (!row)
      return nas_errf(err, "experiment '%s' has no trial %d (its trials are 0 to %zu)",
                      exp->name, numbers[i], n_rows ? n_rows - 1 : 0);
    if (!retryable_by_number(row->status))
      return nas_errf(err, "trial %d of '%s' is %s; only failed, timed-out or stopped trials "
                      "can be retried", numbers[i], exp->name, trial_status_name(row->status));
    for (size_t j = 0; j < i; j++)
      if (numbers[j] == numbers[i]) return nas_errf(err, "trial %d is named twice", numbers[i]);
  }
  return NAS_OK;
}

static int retry_one(storage *st, const experiment_row *exp, const trial_row *row, FILE *report,
                     nas_err *err) {
  if (storage_trial_requeue(st, row->id, err) != NAS_OK) return NAS_ERR;
  if (report)
    fprintf(report, "%s: trial %d queued again (was %s after %d attempt%s)\n", exp->name,
            row->number, trial_status_name(row->status), row->attempts,
            row->attempts == 1 ? "" : "s");
  return NAS_OK;
}

int sched_retry(storage *st, const experiment_row *exp, const int *numbers, size_t n,
                FILE *report, size_t *retried, nas_err *err) {
  trial_row *rows;
  size_t n_rows;
  *retried = 0;
  if (storage_trial_list(st, exp->id, &rows, &n_rows, err) != NAS_OK) return NAS_ERR;
  int rc = retry_check(exp, rows, n_rows, numbers, n, err);
  for (size_t i = 0; rc == NAS_OK && i < (n ? n : n_rows); i++) {
    const trial_row *row = n ? trial_numbered(rows, n_rows, numbers[i]) : &rows[i];
    if (!n && !retryable(row->status)) continue; /* with no numbers given: the others */
    rc = retry_one(st, exp, row, report, err);
    if (rc == NAS_OK) ++*retried;
  }
  trial_rows_free(rows, n_rows);
  return rc;
}
