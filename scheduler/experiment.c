/* scheduler/experiment.c: finding or creating the experiment a spec describes, and
 * refusing to continue one whose spec changed in ways that would mix incomparable trials. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runners/runner.h"
#include "scheduler/scheduler.h"

/* Whether every line of a spec_diff is about the budget, the one section that may change
 * between runs of one experiment. */
static bool only_budget_changed(const char *diff) {
  for (const char *line = diff; *line;) {
    if (strncmp(line, "budget.", 7) != 0) return false;
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
  return NAS_OK;
}

static int compare_with_stored(const spec *s, storage *st, const experiment_row *exp,
                               nas_err *err) {
  spec *stored = NULL;
  int rc = sched_experiment_spec(exp, &stored, err);
  if (rc != NAS_OK) return rc;
  char *diff = NULL;
  rc = spec_diff(stored, s, &diff, err);
  spec_free(stored);
  if (rc != NAS_OK || !diff) return rc;
  if (only_budget_changed(diff)) {
    nas_log("experiment '%s': budget changed:\n%s", exp->name, diff);
    rc = storage_experiment_set_spec(st, exp->id, s->text, err);
  } else {
    rc = nas_errf(err,
                  "experiment '%s' already exists with a different spec:\n%s"
                  "Only the budget may change between runs of one experiment: give the "
                  "experiment a new name, or undo the other changes.",
                  exp->name, diff);
  }
  free(diff);
  return rc;
}

int sched_prepare(const spec *s, storage *st, experiment_row *exp, nas_err *err) {
  int rc = storage_experiment_get(st, s->name, exp, err);
  if (rc == NAS_OK) {
    rc = compare_with_stored(s, st, exp, err);
    experiment_row_clear(exp);
    return rc == NAS_OK ? storage_experiment_get(st, s->name, exp, err) : rc;
  }
  if (rc != NAS_ENOTFOUND) return rc;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return nas_errf(err, "cannot read the current folder");
  int64_t id;
  rc = storage_experiment_create(st, s->name, s->text, s->path, cwd, &id, err);
  return rc == NAS_OK ? storage_experiment_get(st, s->name, exp, err) : rc;
}

/* Asks the runner of each running trial's job to stop it. */
static int stop_running(const spec *s, storage *st, const experiment_row *exp, FILE *report,
                        nas_err *err) {
  trial_row *rows;
  size_t n;
  runner *rn = NULL;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  int rc = runner_create(s->runner.type, s->runner.options, &rn, err);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    if (rows[i].status != TRIAL_RUNNING || !rows[i].job_id) continue;
    char *run_dir = sched_run_dir(exp, rows[i].number, rows[i].attempts);
    nas_err why;
    if (!run_dir) rc = nas_errf(err, "out of memory");
    else if (runner_stop(rn, rows[i].job_id, run_dir, &why) != NAS_OK && report)
      fprintf(report, "nas: %s: trial %d: %s\n", exp->name, rows[i].number, why.msg);
    free(run_dir);
  }
  if (rn) runner_free(rn);
  trial_rows_free(rows, n);
  return rc;
}

int sched_stop(const spec *s, storage *st, const experiment_row *exp, FILE *report,
               nas_err *err) {
  if (storage_experiment_set_status(st, exp->id, "stopped", err) != NAS_OK) return NAS_ERR;
  return stop_running(s, st, exp, report, err);
}
