/* scheduler/manage.c: what a person does to a whole experiment outside its run — delete
 * it, rename it, copy it (to the same storage or another), and queue known
 * configurations.
 *
 * Each refuses while a scheduler runs the experiment (its lease is alive): that process
 * holds the experiment's rows and run folders and would go on writing under the old name
 * or into rows that are gone. Storage changes are one transaction each (storage.h), but
 * for the copy of an experiment too large for one request, made in steps under a name that
 * says so until it is whole (sched_copy). Run
 * folders are touched only at runs/<name>/ under the experiment's run_root, where <name>
 * passed the name check (no '/', never '.' or '..'), and a symbolic link there is never
 * followed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "scheduler/scheduler.h"

char *sched_experiment_runs_dir(const experiment_row *exp) {
  return nas_asprintf("%s/runs/%s", exp->run_root, exp->name);
}

/* An error saying so when a scheduler (a live lease) runs exp; doing ("delete") names the
 * refused action. */
static int check_idle(storage *st, const experiment_row *exp, const char *doing, nas_err *err) {
  sched_liveness state;
  char *holder = NULL;
  int rc = sched_scheduler_state(st, exp, &state, &holder, err);
  if (rc == NAS_OK && state == SCHEDULER_ALIVE)
    rc = nas_errf(err, "cannot %s '%s' while its scheduler runs (%s); stop it first with "
                  "'nas stop %s'", doing, exp->name, holder, exp->name);
  free(holder);
  return rc;
}

/* Refuses when a trial of exp is running: its job writes into its run folder and reports
 * to its trial's row. */
static int check_none_running(storage *st, const experiment_row *exp, const char *doing,
                              nas_err *err) {
  trial_row *rows;
  size_t n, running = 0;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  for (size_t i = 0; i < n; i++) running += rows[i].status == TRIAL_RUNNING;
  trial_rows_free(rows, n);
  if (running == 0) return NAS_OK;
  return nas_errf(err, "cannot %s '%s' while %zu of its trials %s running; stop it with 'nas "
                  "stop %s' (or let them end) first", doing, exp->name, running,
                  running == 1 ? "is" : "are", exp->name);
}

/* ---- delete -------------------------------------------------------------------------- */

static int remove_inside(int dir_fd, const char *path, nas_err *err);

/* Removes name (a file, or a folder with all it holds) from the folder open as parent_fd;
 * a symbolic link is removed, never followed. */
static int remove_entry(int parent_fd, const char *parent, const char *name, nas_err *err) {
  if (unlinkat(parent_fd, name, 0) == 0) return NAS_OK;
  if (errno != EISDIR && errno != EPERM)
    return nas_errf(err, "cannot remove %s/%s: %s", parent, name, strerror(errno));
  char *path = nas_asprintf("%s/%s", parent, name);
  if (!path) return nas_errf(err, "out of memory");
  int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int rc = fd >= 0 ? remove_inside(fd, path, err)
                   : nas_errf(err, "cannot open %s: %s", path, strerror(errno));
  if (rc == NAS_OK && unlinkat(parent_fd, name, AT_REMOVEDIR) != 0)
    rc = nas_errf(err, "cannot remove %s: %s", path, strerror(errno));
  free(path);
  return rc;
}

/* Empties the folder open as dir_fd (which it closes). */
static int remove_inside(int dir_fd, const char *path, nas_err *err) {
  DIR *d = fdopendir(dir_fd);
  if (!d) {
    close(dir_fd);
    return nas_errf(err, "cannot read %s: %s", path, strerror(errno));
  }
  int rc = NAS_OK;
  struct dirent *entry;
  while (rc == NAS_OK && (errno = 0, entry = readdir(d)) != NULL) {
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    rc = remove_entry(dirfd(d), path, entry->d_name, err);
  }
  if (rc == NAS_OK && errno != 0) rc = nas_errf(err, "cannot read %s: %s", path, strerror(errno));
  closedir(d);
  return rc;
}

/* Removes runs/<name>/ of exp; *removed says whether there was one. */
static int remove_runs(const experiment_row *exp, bool *removed, nas_err *err) {
  char *runs = nas_asprintf("%s/runs", exp->run_root);
  if (!runs) return nas_errf(err, "out of memory");
  struct stat st;
  int rc = NAS_OK;
  *removed = false;
  int runs_fd = open(runs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (runs_fd < 0 && errno != ENOENT)
    rc = nas_errf(err, "cannot open %s: %s", runs, strerror(errno));
  else if (runs_fd >= 0 && fstatat(runs_fd, exp->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode))
      rc = nas_errf(err, "%s/%s is not a folder (a link or a file); left as it is", runs,
                    exp->name);
    else if ((rc = remove_entry(runs_fd, runs, exp->name, err)) == NAS_OK)
      *removed = true;
  }
  if (runs_fd >= 0) close(runs_fd);
  free(runs);
  return rc;
}

int sched_delete(storage *st, const experiment_row *exp, bool runs, FILE *report,
                 nas_err *err) {
  if (check_idle(st, exp, "delete", err) != NAS_OK) return NAS_ERR;
  if (storage_experiment_delete(st, exp->id, err) != NAS_OK) return NAS_ERR;
  if (report) fprintf(report, "nas: deleted experiment '%s' with its trials and metrics\n", exp->name);
  if (!runs) return NAS_OK;
  bool removed = false;
  if (remove_runs(exp, &removed, err) != NAS_OK)
    return nas_err_prefix(err, "experiment '%s' is deleted from storage, but its run folder "
                          "is not", exp->name);
  if (report && removed) fprintf(report, "nas: removed %s/runs/%s\n", exp->run_root, exp->name);
  else if (report) fprintf(report, "nas: %s/runs/%s did not exist\n", exp->run_root, exp->name);
  return NAS_OK;
}

/* ---- rename --------------------------------------------------------------------------- */

/* Renames runs/<old> to runs/<new> under exp's run_root when it exists; *moved says
 * whether it did. An existing runs/<new> is never replaced. */
static int move_runs(const experiment_row *exp, const char *new_name, bool back, bool *moved,
                     nas_err *err) {
  const char *from_name = back ? new_name : exp->name, *to_name = back ? exp->name : new_name;
  char *from = nas_asprintf("%s/runs/%s", exp->run_root, from_name);
  char *to = nas_asprintf("%s/runs/%s", exp->run_root, to_name);
  struct stat st;
  int rc = from && to ? NAS_OK : nas_errf(err, "out of memory");
  *moved = false;
  if (rc == NAS_OK && lstat(from, &st) == 0) {
    if (lstat(to, &st) == 0 || errno != ENOENT)
      rc = nas_errf(err, "%s exists already; move it away first", to);
    else if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) != 0)
      rc = nas_errf(err, "cannot rename %s to %s: %s", from, to, strerror(errno));
    else
      *moved = true;
  }
  free(from);
  free(to);
  return rc;
}

/* Puts runs/<new> back as runs/<old> after storage refused the rename (rc, err); when that
 * fails too, err says so and where the folder is, since storage still has the old name. */
static void undo_move(const experiment_row *exp, const char *new_name, int rc, nas_err *err) {
  nas_err undo;
  bool moved_back;
  if (move_runs(exp, new_name, true, &moved_back, &undo) == NAS_OK) return;
  nas_err refused = *err;
  nas_errc(err, rc, "%s; and its run folder could not be put back (%s): it is %s/runs/%s "
           "while the experiment is still named '%s'; move it back by hand", refused.msg,
           undo.msg, exp->run_root, new_name, exp->name);
}

/* NAS_OK when `to` has no experiment `name`, else NAS_EEXIST (or the storage's error). */
static int check_name_free(storage *to, const char *name, nas_err *err) {
  experiment_row existing;
  int rc = storage_experiment_get(to, name, &existing, err);
  if (rc == NAS_ENOTFOUND) return NAS_OK;
  if (rc != NAS_OK) return rc;
  experiment_row_clear(&existing);
  return nas_errc(err, NAS_EEXIST, "an experiment named '%s' exists already", name);
}

int sched_rename(storage *st, const spec *s, const experiment_row *exp, const char *new_name,
                 FILE *report, nas_err *err) {
  char *text = NULL;
  bool moved = false;
  int rc = check_idle(st, exp, "rename", err);
  /* before the run folder, whose clash would say less; the storage's own refusal names the
   * experiment by its id */
  if (rc == NAS_OK && (rc = check_name_free(st, new_name, err)) != NAS_OK)
    nas_err_prefix(err, "cannot rename '%s' to '%s'", exp->name, new_name);
  if (rc == NAS_OK) rc = check_none_running(st, exp, "rename", err);
  if (rc == NAS_OK) rc = spec_text_renamed(s, new_name, &text, err);
  if (rc == NAS_OK) rc = move_runs(exp, new_name, false, &moved, err);
  if (rc == NAS_OK) rc = storage_experiment_rename(st, exp->id, new_name, text, err);
  if (rc != NAS_OK && moved) undo_move(exp, new_name, rc, err);
  if (rc == NAS_OK && report) {
    fprintf(report, "nas: renamed '%s' to '%s'", exp->name, new_name);
    if (moved) fprintf(report, ", and its run folder to %s/runs/%s", exp->run_root, new_name);
    fputc('\n', report);
  }
  free(text);
  return rc;
}

/* ---- copy ----------------------------------------------------------------------------- */

/* What the name of a copy made in steps ends with until the copy is whole. */
#define COPY_INCOMPLETE_SUFFIX ".incomplete"

/* Bytes of the texts a trial row carries. */
static size_t trial_text_bytes(const trial_row *t) {
  return strlen(t->params_json) + (t->reference_json ? strlen(t->reference_json) : 0) +
         (t->job_id ? strlen(t->job_id) : 0) + (t->error ? strlen(t->error) : 0);
}

/* Whether img goes in one request to a `nas serve`: its trials and observations together
 * are not a full report (metric_report_full), its spec's text included. */
static bool copy_fits_one_report(const storage_experiment_image *img) {
  size_t bytes = strlen(img->exp->spec_text);
  for (size_t i = 0; i < img->n_trials; i++) bytes += trial_text_bytes(&img->trials[i]);
  for (size_t i = 0; i < img->n_metrics; i++) bytes += strlen(img->metrics[i].name);
  return !metric_report_full(img->n_trials + img->n_metrics, bytes);
}

/* Adds trials to experiment id of `to`, a share at a time: each as many as one report
 * carries (metric_report_full), in one transaction. */
static int copy_trials(storage *to, int64_t id, const trial_row *trials, size_t n,
                       nas_err *err) {
  size_t from = 0;
  while (from < n) {
    size_t end = from, bytes = 0;
    while (end < n && !metric_report_full(end - from, bytes))
      bytes += trial_text_bytes(&trials[end++]);
    if (storage_trials_import(to, id, trials + from, end - from, err) != NAS_OK)
      return nas_err_prefix(err, "stored %zu of %zu trials", from, n);
    from = end;
  }
  return NAS_OK;
}

/* The copy's id of the trial that has id `id` in the experiment copied, or -1. */
static int64_t copied_trial_id(const trial_row *trials, size_t n_trials, const trial_row *copied,
                               size_t n_copied, int64_t id) {
  for (size_t t = 0; t < n_trials; t++)
    for (size_t c = 0; trials[t].id == id && c < n_copied; c++)
      if (copied[c].number == trials[t].number) return copied[c].id;
  return -1;
}

/* Adds metrics[from..] of one trial to trial id of `to` in one report, as many as one
 * report carries (metric_report_full); *next gets the index after the last one added.
 * Names are borrowed. */
static int copy_metrics_share(storage *to, int64_t id, const metric_row *metrics, size_t n,
                              size_t from, size_t *next, nas_err *err) {
  size_t end = from, name_bytes = 0;
  while (end < n && !metric_report_full(end - from, name_bytes) &&
         metrics[end].trial_id == metrics[from].trial_id)
    name_bytes += strlen(metrics[end++].name);
  metric_obs *obs = malloc((end - from) * sizeof *obs);
  if (!obs) return nas_errf(err, "out of memory");
  for (size_t i = from; i < end; i++)
    obs[i - from] = (metric_obs){metrics[i].name, metrics[i].step, metrics[i].value,
                                 metrics[i].time};
  int rc = storage_metrics_add(to, id, obs, end - from, -1, err);
  free(obs);
  if (rc == NAS_OK) *next = end;
  return rc;
}

/* Adds the metrics of the copied trials to experiment id of `to` (each trial's in their
 * order), a report at a time. */
static int copy_metrics(storage *to, int64_t id, const trial_row *trials, size_t n_trials,
                        const metric_row *metrics, size_t n_metrics, nas_err *err) {
  trial_row *copied = NULL;
  size_t n_copied = 0, i = 0;
  int rc = storage_trial_list(to, id, &copied, &n_copied, err);
  while (rc == NAS_OK && i < n_metrics) {
    int64_t copy_id = copied_trial_id(trials, n_trials, copied, n_copied, metrics[i].trial_id);
    rc = copy_id >= 0 ? copy_metrics_share(to, copy_id, metrics, n_metrics, i, &i, err)
                      : nas_errf(err, "trial id %lld was not copied",
                                 (long long)metrics[i].trial_id);
  }
  trial_rows_free(copied, n_copied);
  if (rc != NAS_OK)
    return nas_err_prefix(err, "stored %zu of %zu observations", i, n_metrics);
  return NAS_OK;
}

/* Stores the experiment of img, without its trials and metrics, under its name while
 * incomplete (stopped: no scheduler nor ask takes it up); *name gets that name (owned). */
static int copy_store_head(storage *to, const spec *s, const experiment_row *exp, char **name,
                           int64_t *id, nas_err *err) {
  int keep = NAS_EXPERIMENT_NAME_MAX - (int)strlen(COPY_INCOMPLETE_SUFFIX);
  char *text = NULL;
  *name = nas_asprintf("%.*s" COPY_INCOMPLETE_SUFFIX, keep, exp->name);
  int rc = *name ? spec_text_renamed(s, *name, &text, err) : nas_errf(err, "out of memory");
  experiment_row head = *exp;
  head.name = *name, head.spec_text = text, head.status = "stopped";
  if (rc == NAS_OK)
    rc = storage_experiment_import(to, &(storage_experiment_image){&head, NULL, 0, NULL, 0}, id,
                                   err);
  if (rc == NAS_EEXIST)
    nas_err_prefix(err, "a copy that stopped part way left '%s': delete it with 'nas delete %s' "
                   "and copy again", *name, *name);
  free(text);
  return rc;
}

/* Stores img, more than one request to a `nas serve` holds, in steps (docs/cli.md, nas
 * copy): the experiment under a name that says it is incomplete (copy_store_head), its
 * trials and then their observations a report at a time, its status, and last its name
 * and spec in one transaction. So an experiment under the copy's name is always whole; a
 * failure on the way leaves the incomplete one, and says so. */
static int copy_store_in_steps(storage *to, const spec *s, const storage_experiment_image *img,
                               nas_err *err) {
  const experiment_row *exp = img->exp;
  char *name = NULL;
  int64_t id;
  int rc = check_name_free(to, exp->name, err);
  if (rc != NAS_OK) nas_err_prefix(err, "store experiment '%s'", exp->name);
  if (rc == NAS_OK) rc = copy_store_head(to, s, exp, &name, &id, err);
  if (rc != NAS_OK) {
    free(name);
    return rc;
  }
  rc = copy_trials(to, id, img->trials, img->n_trials, err);
  if (rc == NAS_OK)
    rc = copy_metrics(to, id, img->trials, img->n_trials, img->metrics, img->n_metrics, err);
  if (rc == NAS_OK) rc = storage_experiment_set_status(to, id, exp->status, NULL, err);
  if (rc == NAS_OK) rc = storage_experiment_rename(to, id, exp->name, exp->spec_text, err);
  if (rc != NAS_OK)
    nas_err_prefix(err, "copy '%s' is incomplete, stored as experiment '%s' (never under '%s'): "
                   "delete it with 'nas delete %s' and copy again", exp->name, name, exp->name,
                   name);
  free(name);
  return rc;
}

/* Stores img in `to`: in one transaction when it goes in one request to a `nas serve`,
 * else in steps. */
static int copy_store(storage *to, const spec *s, const storage_experiment_image *img,
                      nas_err *err) {
  int64_t id;
  if (copy_fits_one_report(img)) return storage_experiment_import(to, img, &id, err);
  return copy_store_in_steps(to, s, img, err);
}

int sched_copy(storage *from, const spec *s, const experiment_row *exp, storage *to,
               const char *new_name, nas_err *err) {
  experiment_row copy = *exp;
  trial_row *trials = NULL;
  metric_row *metrics = NULL;
  size_t n_trials = 0, n_metrics = 0;
  char *text = NULL;
  int rc = check_none_running(from, exp, "copy", err);
  /* The same name is fine in another storage (import refuses it in the same one). */
  if (rc == NAS_OK && strcmp(new_name, exp->name) == 0)
    rc = (text = strdup(exp->spec_text)) ? NAS_OK : nas_errf(err, "out of memory");
  else if (rc == NAS_OK)
    rc = spec_text_renamed(s, new_name, &text, err);
  if (rc == NAS_OK) rc = storage_trial_list(from, exp->id, &trials, &n_trials, err);
  if (rc == NAS_OK) rc = storage_metrics_list(from, exp->id, &metrics, &n_metrics, err);
  if (rc == NAS_OK) {
    copy.name = (char *)new_name;
    copy.spec_text = text;
    rc = copy_store(to, s,
                    &(storage_experiment_image){&copy, trials, n_trials, metrics, n_metrics}, err);
  }
  free(text);
  trial_rows_free(trials, n_trials);
  metric_rows_free(metrics, n_metrics);
  return rc;
}

/* ---- known configurations -------------------------------------------------------------- */

/* Whether assignments a and b give every parameter the same value, numbers by value (a
 * float written 1 by hand is 1.0 as an optimizer stores it). */
static bool same_assignment(const json_t *a, const json_t *b) {
  if (json_object_size(a) != json_object_size(b)) return false;
  const char *name;
  const json_t *value;
  json_object_foreach((json_t *)a, name, value) {
    const json_t *other = json_object_get(b, name);
    bool numbers = json_is_number(value) && json_is_number(other);
    if (!other || (numbers ? json_number_value(value) != json_number_value(other)
                           : !json_equal((json_t *)value, (json_t *)other)))
      return false;
  }
  return true;
}

int sched_trial_twin(storage *st, const experiment_row *exp, const json_t *params, int below,
                     int *number, trial_status *status, nas_err *err) {
  trial_row *rows;
  size_t n;
  *number = -1;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  for (size_t i = 0; i < n && rows[i].number < below; i++) {
    json_t *theirs = json_loads(rows[i].params_json, 0, NULL);
    if (theirs && same_assignment(params, theirs)) {
      *number = rows[i].number;
      *status = rows[i].status;
    }
    json_decref(theirs);
  }
  trial_rows_free(rows, n);
  return NAS_OK;
}

int sched_trial_enqueue(storage *st, const experiment_row *exp, const json_t *params,
                        trial_row *out, nas_err *err) {
  char *text = json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS);
  int rc = text ? storage_trial_create(st, exp->id, text, NULL, out, err)
                : nas_errf(err, "out of memory");
  free(text);
  return rc;
}
