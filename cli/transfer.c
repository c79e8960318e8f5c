/* cli/transfer.c: `nas export` (an experiment as one JSON document, or its trials as CSV)
 * and `nas import` (such a JSON document into a storage, as a new experiment).
 *
 * The JSON format is scheduler/views.c's sched_export_json, versioned and described in
 * docs/cli.md. Import cannot be one transaction (it goes through the storage API, call by
 * call), so it validates the whole file before its first write: after that only the
 * storage itself can fail, and then the message says what was left and how to recognise
 * it (the experiment stays "stopped" until its last trial is written). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"

/* The job id imported attempts are started with (nothing runs them). */
#define IMPORT_JOB_ID "import"
/* The most attempts an imported trial may have; its rung is at most its attempts. */
#define IMPORT_ATTEMPTS_MAX 1000000

/* ---- nas export -------------------------------------------------------------------------- */

static const char export_help[] =
    "usage: nas export EXPERIMENT [--format json|csv] [--with curves,timings] [--storage URL]\n\n"
    "Writes the experiment to stdout.\n"
    "  json (default)  the whole experiment, for 'nas import' or your own tools: its spec\n"
    "                  (storage password masked) and every trial with its parameters,\n"
    "                  metrics, status, error, attempts, rung and times; --with curves adds\n"
    "                  every intermediate value. The format is versioned (docs/cli.md).\n"
    "                  The spec's webhook URLs are in it: keep a file of it private.\n"
    "  csv             one row per trial: number, status, rung (multi-fidelity only),\n"
    "                  parameters, metrics, reference point, error (as 'nas trials --format\n"
    "                  csv'); --with timings adds created_at, started_at, finished_at\n"
    "                  (Unix seconds) and duration_s.\n";

typedef struct {
  char *storage; /* owned: --storage (cli_storage_flag), NULL when not given */
  out_format format;
  bool curves, timings;
  const char *experiment;
} export_args;

/* Reads --with's comma-separated list; NAS_ERR naming the first unknown item in *bad. */
static int parse_with(char *list, export_args *a, const char **bad) {
  for (char *save = NULL, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    if (strcmp(item, "curves") == 0) a->curves = true;
    else if (strcmp(item, "timings") == 0) a->timings = true;
    else {
      *bad = item;
      return NAS_ERR;
    }
  }
  return NAS_OK;
}

static int take_export_option(const char *cmd, int c, char *arg, void *ctx) {
  export_args *a = ctx;
  const char *bad;
  if (c == 'f' && (cli_parse_format(arg, &a->format) != NAS_OK || a->format == FORMAT_TABLE))
    return cli_usage_error(cmd, "unknown format '%s' (expected json or csv)", arg);
  if (c == 'w' && parse_with(arg, a, &bad) != NAS_OK)
    return cli_usage_error(cmd, "unknown --with item '%s' (expected curves, timings)", bad);
  return -1;
}

/* Returns -1 when the command should go on, else the exit status; a->storage is to be
 * freed either way. */
static int parse_export_args(int argc, char **argv, export_args *a) {
  static const struct option options[] = {{"format", required_argument, NULL, 'f'},
                                          {"with", required_argument, NULL, 'w'},
                                          {NULL, 0, NULL, 0}};
  memset(a, 0, sizeof *a);
  a->format = FORMAT_JSON;
  const cli_command cmd = {"export", export_help, options, NULL, take_export_option, a};
  int status = cli_parse_options(&cmd, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (argc - optind != 1) return cli_usage_error("export", "expected one EXPERIMENT");
  if (a->curves && a->format == FORMAT_CSV)
    return cli_usage_error("export", "curves are in the json export only (one row per trial in csv)");
  a->experiment = argv[optind];
  return -1;
}

static int write_export(const export_args *a, storage *st, const spec *s,
                        const experiment_row *exp, const sched_results *r, nas_err *err) {
  if (a->format == FORMAT_JSON) {
    json_t *doc = sched_export_json(st, s, exp, r, a->curves, err);
    if (!doc) return NAS_ERR;
    cli_print_json(doc);
    json_decref(doc);
    return NAS_OK;
  }
  cli_table t;
  int rc = cli_trials_table(s, r, FORMAT_CSV, a->timings, &t);
  if (rc == NAS_OK) cli_table_print(&t, FORMAT_CSV);
  cli_table_free(&t);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "out of memory");
}

int cmd_export(int argc, char **argv) {
  export_args a;
  int status = parse_export_args(argc, argv, &a);
  if (status >= 0) {
    free(a.storage);
    return status;
  }
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(cli_storage_url(a.storage), STORAGE_MUST_EXIST, a.experiment, &st,
                          &exp, &s, &err) != NAS_OK) {
    free(a.storage);
    return cli_fail(&err);
  }
  sched_results r;
  int rc = sched_results_load(st, s, exp.id, &r, &err);
  if (rc == NAS_OK) {
    rc = write_export(&a, st, s, &exp, &r, &err);
    sched_results_free(&r);
  }
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  free(a.storage);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}

/* ---- nas import: reading and checking the file ------------------------------------------- */

static const char import_help[] =
    "usage: nas import FILE [--name NEW] [--storage URL]\n\n"
    "Stores the experiment of FILE (written by 'nas export --format json') as a new\n"
    "experiment: its spec, and every trial with its parameters, status, attempts, rung,\n"
    "error, metrics and intermediate values. An experiment of that name already in the\n"
    "storage is refused: give it another with --name. The whole file is checked before\n"
    "anything is stored. Trials get new times (the import's); a trial that was running is\n"
    "imported queued, since nothing runs it here. Like 'nas run' and 'nas create', import\n"
    "creates a missing SQLite file.\n";

typedef struct {
  const char *path;      /* the file, for messages; borrowed */
  json_t *doc;           /* owned: the whole document */
  const json_t *trials;  /* borrowed from doc */
  const char *status;    /* the experiment's status; borrowed from doc */
  char *name;            /* owned: the experiment's name here */
  char *spec_text;       /* owned: its spec, renamed when --name says */
  char *spec_path;       /* owned: where the spec was (relative paths in it start there) */
  char *run_root;        /* owned: the folder holding its runs/ */
  spec *s;               /* owned: spec_text parsed */
} import_file;

static void import_file_free(import_file *f) {
  json_decref(f->doc);
  free(f->name);
  free(f->spec_text);
  free(f->spec_path);
  free(f->run_root);
  spec_free(f->s);
}

/* "FILE: trials[i].field: what" */
static int bad_field(nas_err *err, const import_file *f, long trial, const char *field,
                     const char *what) {
  if (trial < 0) return nas_errf(err, "%s: %s: %s", f->path, field, what);
  return nas_errf(err, "%s: trials[%ld].%s: %s", f->path, trial, field, what);
}

/* Whether v is an object of numbers (and nulls, when nulls_too) under names that are not
 * empty (storage stores no metric without a name: refused here, before the first write). */
static bool object_of_numbers(const json_t *v, bool nulls_too) {
  if (!json_is_object(v)) return false;
  const char *key;
  json_t *item;
  json_object_foreach((json_t *)v, key, item)
    if (!*key || (!json_is_number(item) && !(nulls_too && json_is_null(item)))) return false;
  return true;
}

/* {metric: [[step >= 0, value or null, time], …]} */
static bool curves_valid(const json_t *curves) {
  if (!json_is_object(curves)) return false;
  const char *key;
  json_t *points, *p;
  size_t k;
  json_object_foreach((json_t *)curves, key, points) {
    if (!json_is_array(points) || !*key) return false;
    json_array_foreach(points, k, p) {
      const json_t *step = json_array_get(p, 0), *value = json_array_get(p, 1);
      if (json_array_size(p) != 3 || !json_is_integer(step) || json_integer_value(step) < 0 ||
          !(json_is_number(value) || json_is_null(value)) || !json_is_number(json_array_get(p, 2)))
        return false;
    }
  }
  return true;
}

/* The attempts a trial at its rung (multi-fidelity) has used at least: one per rung it
 * completed before being promoted, and one for its current rung unless it waits queued. */
static json_int_t attempts_to_reach(trial_status status, json_int_t rung) {
  return rung + (rung > 0 && status != TRIAL_QUEUED ? 1 : 0);
}

/* t's "rung" (absent in exports from before multi-fidelity: 0) against its attempts; t's
 * status and attempts are checked already. */
static int check_rung(const json_t *t) {
  const json_t *v = json_object_get(t, "rung");
  if (!v) return NAS_OK;
  trial_status status;
  trial_status_parse(json_string_value(json_object_get(t, "status")), &status);
  json_int_t rung = json_integer_value(v);
  /* bounded first: attempts_to_reach adds 1 */
  bool ok = json_is_integer(v) && rung >= 0 && rung <= IMPORT_ATTEMPTS_MAX &&
            attempts_to_reach(status, rung) <= json_integer_value(json_object_get(t, "attempts"));
  return ok ? NAS_OK : NAS_ERR;
}

static int check_trial(const import_file *f, const json_t *t, size_t i, nas_err *err) {
  long at = (long)i;
  trial_status status;
  const json_t *v;
  if (!json_is_object(t)) return bad_field(err, f, -1, "trials", "every trial must be an object");
  if (json_integer_value(json_object_get(t, "number")) != (json_int_t)i ||
      !json_is_integer(json_object_get(t, "number")))
    return bad_field(err, f, at, "number", "trials must be numbered 0, 1, 2, … in order");
  if (trial_status_parse(json_string_value(json_object_get(t, "status")), &status) != NAS_OK)
    return bad_field(err, f, at, "status", "not a trial status (queued, running, completed, "
                                           "failed, timeout, stopped)");
  if (!json_is_object(v = json_object_get(t, "params")))
    return bad_field(err, f, at, "params", "must be an object");
  nas_err why;
  if (spec_check_params(f->s, v, &why) != NAS_OK) return bad_field(err, f, at, "params", why.msg);
  if (!object_of_numbers(json_object_get(t, "metrics"), true))
    return bad_field(err, f, at, "metrics", "must be an object of numbers under non-empty names");
  v = json_object_get(t, "attempts");
  if (!json_is_integer(v) || json_integer_value(v) < 0 ||
      json_integer_value(v) > IMPORT_ATTEMPTS_MAX)
    return bad_field(err, f, at, "attempts", "must be a count");
  if (check_rung(t) != NAS_OK)
    return bad_field(err, f, at, "rung", "must be a count, and a trial at rung r > 0 must have "
                                         "run r attempts before its last (r when queued)");
  v = json_object_get(t, "error");
  if (v && !json_is_null(v) && !json_is_string(v))
    return bad_field(err, f, at, "error", "must be a string or null");
  v = json_object_get(t, "reference_point");
  if (v && !json_is_null(v) && !object_of_numbers(v, false))
    return bad_field(err, f, at, "reference_point",
                     "must be an object of numbers under non-empty names, or null");
  v = json_object_get(t, "intermediate");
  if (v && !curves_valid(v))
    return bad_field(err, f, at, "intermediate", "must map metric names to [[step, value, time], …]");
  return NAS_OK;
}

/* The spec text with its top-level `name:` line saying name; NULL when it has none. */
static char *renamed_spec(const char *text, const char *name) {
  const char *line = text;
  while (strncmp(line, "name:", 5) != 0) {
    const char *nl = strchr(line, '\n');
    if (!nl) return NULL;
    line = nl + 1;
  }
  return nas_asprintf("%.*sname: %s%s", (int)(line - text), text, name, strchrnul(line, '\n'));
}

/* The experiment section: name (or new_name), status, spec (parsed), where it was. */
static int check_experiment(import_file *f, const char *new_name, nas_err *err) {
  const json_t *e = json_object_get(f->doc, "experiment");
  const char *name = json_string_value(json_object_get(e, "name"));
  const char *text = json_string_value(json_object_get(e, "spec"));
  const char *spec_path = json_string_value(json_object_get(e, "spec_path"));
  const char *run_root = json_string_value(json_object_get(e, "run_root"));
  f->status = json_string_value(json_object_get(e, "status"));
  if (!name || !*name) return bad_field(err, f, -1, "experiment.name", "a name is needed");
  if (!text) return bad_field(err, f, -1, "experiment.spec", "the spec's text is needed");
  if (!f->status || (strcmp(f->status, "running") != 0 && strcmp(f->status, "finished") != 0 &&
                     strcmp(f->status, "stopped") != 0))
    return bad_field(err, f, -1, "experiment.status", "must be running, finished or stopped");
  char *cwd = getcwd(NULL, 0);
  f->spec_path = spec_path ? strdup(spec_path) : nas_abspath(f->path, NULL);
  f->run_root = run_root ? strdup(run_root) : cwd ? strdup(cwd) : NULL;
  f->name = strdup(new_name ? new_name : name);
  f->spec_text = new_name ? renamed_spec(text, new_name) : strdup(text);
  free(cwd);
  if (!f->spec_path || !f->run_root || !f->name) return nas_errf(err, "out of memory");
  if (!f->spec_text)
    return nas_errf(err, "--name: the spec in %s has no line 'name: …' to change", f->path);
  char *dir = nas_dirname(f->spec_path);
  int rc = dir ? spec_parse(f->spec_text, f->spec_path, dir, &f->s, err) : nas_errf(err, "out of memory");
  free(dir);
  if (rc != NAS_OK) return nas_err_prefix(err, "%s: experiment.spec", f->path);
  if (strcmp(f->s->name, f->name) != 0)
    return nas_errf(err, "%s: the spec's name '%s' is not the experiment's '%s'%s", f->path,
                    f->s->name, f->name, new_name ? " (--name could not change it)" : "");
  return NAS_OK;
}

/* Reads and checks the whole file: nothing is stored from a file that fails here. */
static int read_import_file(const char *path, const char *new_name, import_file *f, nas_err *err) {
  memset(f, 0, sizeof *f);
  f->path = path;
  json_error_t jerr;
  /* jansson reads a folder as an empty file; a pipe (/dev/stdin, <(…)) is fine. */
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return nas_errf(err, "%s: a folder; give a file 'nas export --format json' wrote", path);
  if (!(f->doc = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr))) {
    if (access(path, R_OK) != 0) return nas_errf(err, "%s: %s", path, strerror(errno));
    int line, column;
    nas_json_error_where(&jerr, &line, &column);
    return nas_errf(err, "%s:%d:%d: not JSON: %s", path, line, column, jerr.text);
  }
  const char *format = json_string_value(json_object_get(f->doc, "format"));
  const json_t *version = json_object_get(f->doc, "version");
  if (!format || strcmp(format, SCHED_EXPORT_FORMAT) != 0)
    return bad_field(err, f, -1, "format", "not \"" SCHED_EXPORT_FORMAT "\": this is not a file "
                                           "'nas export --format json' wrote");
  if (!json_is_integer(version) || json_integer_value(version) != SCHED_EXPORT_VERSION)
    return nas_errf(err, "%s: version %s: this nas reads version %d", path,
                    json_is_integer(version) ? "is newer or unknown" : "is missing",
                    SCHED_EXPORT_VERSION);
  f->trials = json_object_get(f->doc, "trials");
  if (!json_is_array(f->trials)) return bad_field(err, f, -1, "trials", "must be an array");
  if (check_experiment(f, new_name, err) != NAS_OK) return NAS_ERR;
  for (size_t i = 0; i < json_array_size(f->trials); i++)
    if (check_trial(f, json_array_get(f->trials, i), i, err) != NAS_OK) return NAS_ERR;
  return NAS_OK;
}

/* ---- nas import: storing ------------------------------------------------------------------ */

/* The trial's intermediate values, then its final metrics at its finishing time. Names are
 * borrowed from t. Owned array. */
static metric_obs *trial_observations(const json_t *t, size_t *n) {
  const json_t *curves = json_object_get(t, "intermediate"), *metrics = json_object_get(t, "metrics");
  const json_t *finished = json_object_get(t, "finished_at");
  double final_time = json_is_number(finished) ? json_number_value(finished) : nas_now();
  size_t cap = json_object_size(metrics) + 1, k;
  const char *name;
  json_t *points, *p, *value;
  json_object_foreach((json_t *)curves, name, points) cap += json_array_size(points);
  metric_obs *obs = malloc(cap * sizeof *obs);
  *n = 0;
  if (!obs) return NULL;
  json_object_foreach((json_t *)curves, name, points) json_array_foreach(points, k, p) {
    if (json_is_null(json_array_get(p, 1))) continue; /* never a number: nothing to store */
    obs[(*n)++] = (metric_obs){name, json_integer_value(json_array_get(p, 0)),
                               json_number_value(json_array_get(p, 1)),
                               json_number_value(json_array_get(p, 2))};
  }
  json_object_foreach((json_t *)metrics, name, value)
    if (json_is_number(value))
      obs[(*n)++] = (metric_obs){name, METRIC_FINAL, json_number_value(value), final_time};
  return obs;
}

/* Brings a new queued trial to status through its attempts, as the storage API allows:
 * each attempt is started and ended (earlier ones queued again, the last with the status
 * and error); a trial that was running is left queued. A trial at rung > 0 (multi-fidelity)
 * completed each rung below and was promoted: those are the `rung` attempts before its
 * last, or its last `rung` when it waits queued (check_rung saw there are enough). */
static int replay_attempts(storage *st, int64_t id, trial_status status, int attempts, int rung,
                           const char *error, nas_err *err) {
  int first_promoted = attempts - (int)attempts_to_reach(status, rung) + 1;
  if (status == TRIAL_RUNNING) status = TRIAL_QUEUED;
  if (attempts == 0 && status == TRIAL_FAILED) /* its job never started */
    return storage_trial_finish(st, id, status, false, 0, error, err);
  if (attempts == 0 && status != TRIAL_QUEUED) attempts = 1;
  for (int k = 1; k <= attempts; k++) {
    bool promoted = k >= first_promoted && k < first_promoted + rung, last = k == attempts;
    trial_status to = promoted ? TRIAL_COMPLETED : last ? status : TRIAL_QUEUED;
    if (storage_trial_start(st, id, IMPORT_JOB_ID, err) != NAS_OK ||
        storage_trial_finish(st, id, to, false, 0,
                             promoted ? NULL : last ? error : "an earlier attempt", err) != NAS_OK ||
        (promoted && storage_trial_promote(st, id, k - first_promoted, err) != NAS_OK))
      return NAS_ERR;
  }
  return NAS_OK;
}

static int store_trial(storage *st, int64_t experiment_id, const json_t *t, nas_err *err) {
  const json_t *reference = json_object_get(t, "reference_point");
  char *params = json_dumps(json_object_get(t, "params"), JSON_COMPACT | JSON_PRESERVE_ORDER);
  char *ref = json_is_object(reference) ? json_dumps(reference, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  size_t n = 0;
  metric_obs *obs = trial_observations(t, &n);
  trial_row row = {0};
  trial_status status;
  trial_status_parse(json_string_value(json_object_get(t, "status")), &status); /* checked */
  int rc = params && obs && (ref || !json_is_object(reference)) ? NAS_OK : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = storage_trial_create(st, experiment_id, params, ref, &row, err);
  if (rc == NAS_OK && row.number != json_integer_value(json_object_get(t, "number")))
    rc = nas_errf(err, "the storage numbered it %d: the experiment already had trials", row.number);
  if (rc == NAS_OK && n > 0) rc = storage_metrics_add(st, row.id, obs, n, -1, err);
  if (rc == NAS_OK)
    rc = replay_attempts(st, row.id, status, (int)json_integer_value(json_object_get(t, "attempts")),
                         (int)json_integer_value(json_object_get(t, "rung")),
                         json_string_value(json_object_get(t, "error")), err);
  trial_row_clear(&row);
  free(params), free(ref), free(obs);
  return rc;
}

/* Stores f as a new experiment. It stays "stopped" (no scheduler nor ask takes it up)
 * until its last trial is stored; then it gets the status of the file. */
static int store_import(storage *st, const import_file *f, const char *url, nas_err *err) {
  int64_t id;
  int rc = storage_experiment_create(st, f->name, f->spec_text, f->spec_path, f->run_root, &id, err);
  if (rc == NAS_EEXIST) {
    char *shown = storage_url_redacted(url);
    nas_errf(err, "%s already has an experiment '%s': import it under another name with "
             "--name NEW", shown ? shown : "the storage", f->name);
    free(shown);
  }
  if (rc != NAS_OK) return NAS_ERR;
  rc = storage_experiment_set_status(st, id, "stopped", NULL, err);
  size_t n = json_array_size(f->trials), i = 0;
  while (rc == NAS_OK && i < n)
    if ((rc = store_trial(st, id, json_array_get(f->trials, i), err)) == NAS_OK) i++;
  if (rc == NAS_OK) rc = storage_experiment_set_status(st, id, f->status, NULL, err);
  if (rc != NAS_OK)
    return nas_err_prefix(err, "import of %s stopped at trial %zu of %zu, leaving experiment '%s' "
                          "incomplete (status stopped, %zu trials): delete it with 'nas "
                          "delete %s' and import again, or import again with --name NEW", f->path,
                          i, n, f->name, i, f->name);
  printf("imported experiment '%s' with %zu trials from %s\n", f->name, n, f->path);
  return NAS_OK;
}

static int take_import_option(const char *cmd, int c, char *arg, void *ctx) {
  (void)cmd, (void)c; /* --name, its only own option */
  *(const char **)ctx = arg;
  return -1;
}

int cmd_import(int argc, char **argv) {
  static const struct option options[] = {{"name", required_argument, NULL, 'n'}, {NULL, 0, NULL, 0}};
  const char *new_name = NULL;
  const cli_command cmd = {"import", import_help, options, NULL, take_import_option, &new_name};
  char *url; /* owned (cli_storage_flag) */
  int status = cli_parse_options(&cmd, argc, argv, &url);
  if (status < 0 && argc - optind != 1) status = cli_usage_error("import", "expected one FILE");
  if (status >= 0) {
    free(url);
    return status;
  }
  nas_err err;
  import_file f;
  storage *st = NULL;
  int rc = read_import_file(argv[optind], new_name, &f, &err);
  if (rc == NAS_OK) rc = storage_open(cli_storage_url(url), &st, &err);
  if (rc == NAS_OK) rc = store_import(st, &f, cli_storage_url(url), &err);
  storage_close(st);
  import_file_free(&f);
  free(url);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}
