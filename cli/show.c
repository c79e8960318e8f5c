/* cli/show.c: read-only commands — `nas status`, `nas trials`, `nas pareto`. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"

/* These commands only read: a missing database is a mistyped path, and a person waits on
 * them, so a server that does not answer fails after one connect_timeout. */
#define SHOW_OPEN (STORAGE_MUST_EXIST | STORAGE_CONNECT_ONCE)

typedef struct {
  char *storage; /* owned: --storage (cli_storage_flag), NULL when not given */
  out_format format;
  const char *experiment; /* NULL when not given */
  bool model;             /* nas pareto --model */
} show_args;

static int take_show_option(const char *cmd, int c, char *arg, void *ctx) {
  show_args *a = ctx;
  if (c == 'm') a->model = true;
  else return cli_format_option(cmd, arg, &a->format); /* --format */
  return -1;
}

/* Returns -1 when the command should go on, else the exit status; a->storage is to be
 * freed either way. --model is an option of `nas pareto` only. */
static int parse_args(const char *cmd, const char *help, bool need_experiment, int argc,
                      char **argv, show_args *a) {
  static const struct option options[] = {{"format", required_argument, NULL, 'f'},
                                          {NULL, 0, NULL, 0}};
  static const struct option pareto_options[] = {{"format", required_argument, NULL, 'f'},
                                                 {"model", no_argument, NULL, 'm'},
                                                 {NULL, 0, NULL, 0}};
  memset(a, 0, sizeof *a);
  const cli_command command = {cmd, help, strcmp(cmd, "pareto") == 0 ? pareto_options : options,
                               NULL, take_show_option, a};
  int status = cli_parse_options(&command, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (argc - optind > 1) return cli_usage_error(cmd, "too many arguments");
  if (need_experiment && optind == argc) return cli_usage_error(cmd, "expected EXPERIMENT");
  a->experiment = optind < argc ? argv[optind] : NULL;
  return -1;
}

/* A number cell, or null for NaN (never reported). */
static json_t *number_cell(double v) { return isnan(v) ? json_null() : json_real(v); }

static json_t *param_cell(const json_t *params, const char *name) {
  json_t *v = json_object_get(params, name);
  return v ? json_incref(v) : json_null();
}

/* ---- nas trials ------------------------------------------------------------------------- */

static const char trials_help[] =
    "usage: nas trials EXPERIMENT [--format table|csv|json] [--storage URL]\n\n"
    "Lists every trial of EXPERIMENT: number, status, with multi_fidelity the rung it\n"
    "trains to or last trained to, one column per parameter and per metric (named as in\n"
    "the spec; empty where inactive or never reported), and the error of failed trials.\n"
    "With several objectives, also the reference point the optimizer aimed the trial's\n"
    "hypervolume improvement at when it suggested it (empty for initial design points and\n"
    "optimizers without one). Numbers are exact in csv and json. A metric a trial\n"
    "reported beyond the spec's, named like a parameter or one of these columns (x,\n"
    "error), is headed 'NAME (metric)'.\n";

/* The recorded reference point (a JSON object of objective → value): the object itself in
 * JSON, else "name=value, …" in the spec's objective order (6 significant digits in a
 * table, exact in CSV); null when none was recorded. */
static json_t *reference_cell(const spec *s, const char *reference_json, out_format format) {
  json_t *ref = reference_json ? json_loads(reference_json, 0, NULL) : NULL;
  if (!ref || format == FORMAT_JSON) return ref ? ref : json_null();
  char *text = strdup("");
  for (size_t j = 0; text && j < s->n_objectives; j++) {
    const char *name = s->objectives[j].name;
    double v = json_number_value(json_object_get(ref, name));
    char *next = nas_asprintf("%s%s%s=%.*g", text, j ? ", " : "", name,
                              format == FORMAT_TABLE ? 6 : 17, v);
    free(text);
    text = next;
  }
  json_decref(ref);
  json_t *cell = text ? json_string(text) : json_null();
  free(text);
  return cell;
}

static int add_trial_row(cli_table *t, const spec *s, const sched_results *r, size_t i,
                         out_format format) {
  const trial_row *row = &r->trials[i];
  json_t *params = json_loads(row->params_json, 0, NULL);
  json_t *cells = json_array();
  json_array_append_new(cells, json_integer(row->number));
  json_array_append_new(cells, json_string(trial_status_name(row->status)));
  if (s->multi_fidelity.kind != MULTI_FIDELITY_NONE)
    json_array_append_new(cells, json_integer(row->rung));
  for (size_t p = 0; p < s->n_params; p++)
    json_array_append_new(cells, param_cell(params, s->params[p].name));
  for (size_t m = 0; m < r->n_metrics; m++)
    json_array_append_new(cells, number_cell(r->values[i * r->n_metrics + m]));
  if (s->n_objectives > 1)
    json_array_append_new(cells, reference_cell(s, row->reference_json, format));
  json_array_append_new(cells, row->error ? json_string(row->error) : json_null());
  json_decref(params);
  return cli_table_add_row(t, cells);
}

/* Unix seconds, or null when not yet. */
static json_t *time_cell(double t) { return t > 0 ? json_real(t) : json_null(); }

static int add_timing_cells(json_t *cells, const trial_row *row) {
  bool ran = row->started_at > 0 && row->finished_at > 0;
  int rc = json_array_append_new(cells, time_cell(row->created_at)) |
           json_array_append_new(cells, time_cell(row->started_at)) |
           json_array_append_new(cells, time_cell(row->finished_at)) |
           json_array_append_new(cells, ran ? json_real(row->finished_at - row->started_at) : json_null());
  return rc == 0 ? NAS_OK : NAS_ERR;
}

/* A metric's column. The spec keeps its objectives and constraints clear of the listing's
 * own columns and of the parameters, but a trial may report any other metric: one named
 * like those ("x", "error") is headed `NAME (metric)`, so that neither value hides the
 * other (a JSON row has one key per name). */
static int add_metric_column(cli_table *t, const spec *s, const char *name) {
  if (!spec_is_listing_column(name) && spec_param_index(s, name) < 0)
    return cli_table_add_column(t, name);
  char *heading = nas_asprintf("%s (metric)", name);
  int rc = heading ? cli_table_add_column(t, heading) : NAS_ERR;
  free(heading);
  return rc;
}

int cli_trials_table(const spec *s, const sched_results *r, out_format format, bool timings,
                     cli_table *t) {
  static const char *const head[] = {"trial", "status"};
  static const char *const times[] = {"created_at", "started_at", "finished_at", "duration_s"};
  int rc = cli_table_init(t, head, 2);
  if (rc == NAS_OK && s->multi_fidelity.kind != MULTI_FIDELITY_NONE)
    rc = cli_table_add_column(t, "rung");
  for (size_t p = 0; rc == NAS_OK && p < s->n_params; p++)
    rc = cli_table_add_column(t, s->params[p].name);
  for (size_t m = 0; rc == NAS_OK && m < r->n_metrics; m++)
    rc = add_metric_column(t, s, r->metric_names[m]);
  if (rc == NAS_OK && s->n_objectives > 1) rc = cli_table_add_column(t, "reference");
  if (rc == NAS_OK) rc = cli_table_add_column(t, "error");
  for (size_t c = 0; timings && rc == NAS_OK && c < 4; c++) rc = cli_table_add_column(t, times[c]);
  for (size_t i = 0; rc == NAS_OK && i < r->n_trials; i++) {
    rc = add_trial_row(t, s, r, i, format);
    if (rc == NAS_OK && timings)
      rc = add_timing_cells(json_array_get(t->rows, json_array_size(t->rows) - 1), &r->trials[i]);
  }
  return rc;
}

static int print_trials(const spec *s, const sched_results *r, out_format format) {
  cli_table t;
  int rc = cli_trials_table(s, r, format, false, &t);
  if (rc == NAS_OK) cli_table_print(&t, format);
  cli_table_free(&t);
  return rc;
}

/* What a command shows of one experiment, from its results (st: the storage they came from). */
typedef int show_fn(storage *st, const show_args *a, const spec *s, const experiment_row *exp,
                    const sched_results *r, nas_err *err);

/* Loads the experiment named in a and hands its results to show(). */
static int with_results(const show_args *a, show_fn *show) {
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(cli_storage_url(a->storage), SHOW_OPEN, a->experiment, &st, &exp, &s,
                          &err) != NAS_OK)
    return cli_fail(&err);
  sched_results r;
  int status = EXIT_DONE;
  if (sched_results_load(st, s, exp.id, &r, &err) != NAS_OK) {
    status = cli_fail(&err);
  } else {
    if (show(st, a, s, &exp, &r, &err) != NAS_OK) status = cli_fail(&err);
    sched_results_free(&r);
  }
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  return status;
}

static int show_trials(storage *st, const show_args *a, const spec *s,
                       const experiment_row *exp, const sched_results *r, nas_err *err) {
  (void)st, (void)exp;
  return print_trials(s, r, a->format) == NAS_OK ? NAS_OK : nas_errf(err, "out of memory");
}

int cmd_trials(int argc, char **argv) {
  show_args a;
  int status = parse_args("trials", trials_help, true, argc, argv, &a);
  if (status < 0) status = with_results(&a, show_trials);
  free(a.storage);
  return status;
}

/* ---- nas pareto ------------------------------------------------------------------------- */

static const char pareto_help[] =
    "usage: nas pareto EXPERIMENT [--model] [--format table|csv|json] [--storage URL]\n\n"
    "Shows the completed trials that meet every constraint, are within every objective's\n"
    "threshold (the worst value worth having) and that no other such trial dominates\n"
    "(better or equal in every objective, better in one), sorted by the first objective,\n"
    "with the hypervolume they dominate up to the reference point (the objectives'\n"
    "thresholds, else inferred from the observed values); an empty front of completed\n"
    "trials says which of these left them out. The front is of the experiment's own\n"
    "trials: observations a spec's warm_start imports are not on it.\n\n"
    "These are observed readings: with noisy metrics the front favours lucky draws. --model\n"
    "adds the front of the model's estimates: the gp optimizer's posterior mean of each\n"
    "objective at each such trial's parameters (reported NAME_sem standard errors and the\n"
    "spec's noise: taken as known noise), with the readings beside them; in JSON, as\n"
    "\"model_front\" (front rows with \"model\": {objective: posterior mean}); in csv,\n"
    "both fronts in one table whose first column, front, says observed or model. The GPs\n"
    "are fitted to every completed trial, at a cost cubic in their number: about 15 s with\n"
    "1000, hours past a few thousand.\n";

/* Says that a front holds this experiment's own trials only, when warm_start imported
 * observations that are not on it. */
static void print_warm_start_note(FILE *f, const spec *s) {
  if (s->warm_start.n_from == 0) return;
  fputs("(own trials only: the observations warm_start imported from", f);
  for (size_t i = 0; i < s->warm_start.n_from; i++)
    fprintf(f, "%s %s", i ? "," : "", s->warm_start.from[i]);
  fputs(" inform the optimizer and are not on this front)\n", f);
}

/* Says why a front is empty although trials completed (their readings are not shown
 * otherwise, and "0 trials on the front" reads as if none had). */
static void print_empty_front_note(FILE *f, const spec *s, const sched_results *r) {
  char *why = sched_front_empty_why(s, r);
  if (why) fprintf(f, "(%s)\n", why);
  free(why);
}

static void print_front_summary(const spec *s, const sched_results *r, const json_t *pareto,
                                out_format format) {
  if (format == FORMAT_JSON) return;
  FILE *f = format == FORMAT_TABLE ? stdout : stderr;
  const json_t *ref = json_object_get(pareto, "reference_point");
  fprintf(f, "%s: %zu trials on the front; hypervolume %.6g (reference point",
          json_string_value(json_object_get(pareto, "experiment")),
          json_array_size(json_object_get(pareto, "front")),
          cli_hypervolume(json_object_get(pareto, "hypervolume")));
  json_t *objectives = sched_objectives_json(s); /* NULL (out of memory): none shown */
  cli_print_reference_point(f, ref, objectives);
  fprintf(f, ")\n");
  json_decref(objectives);
  print_empty_front_note(f, s, r);
  print_warm_start_note(f, s);
}

/* The columns of a front's table: (with label: front,) trial, (with model: each objective's
 * posterior mean,) the objectives as observed, the parameters. */
static int pareto_columns(const spec *s, bool model, bool label, cli_table *t) {
  static const char *const head[] = {"front", "trial"};
  int rc = cli_table_init(t, head + !label, label ? 2 : 1);
  for (size_t j = 0; model && rc == NAS_OK && j < s->n_objectives; j++) {
    char *name = nas_asprintf("%s (model)", s->objectives[j].name);
    rc = name ? cli_table_add_column(t, name) : NAS_ERR;
    free(name);
  }
  for (size_t j = 0; rc == NAS_OK && j < s->n_objectives; j++)
    rc = cli_table_add_column(t, s->objectives[j].name);
  for (size_t p = 0; rc == NAS_OK && p < s->n_params; p++)
    rc = cli_table_add_column(t, s->params[p].name);
  return rc;
}

/* Appends front's rows to t (made by pareto_columns): label in the first column when
 * given; a posterior mean from the row's "model", empty where it has none. */
static int pareto_rows(const spec *s, const json_t *front, bool model, const char *label,
                       cli_table *t) {
  size_t k, first = (label ? 2 : 1), means_end = first + (model ? s->n_objectives : 0);
  const json_t *row;
  json_array_foreach(front, k, row) {
    json_t *cells = json_array();
    if (label) json_array_append_new(cells, json_string(label));
    for (size_t c = first - 1; c < t->n_columns; c++) {
      bool mean = c >= first && c < means_end;
      const json_t *from = mean ? json_object_get(row, "model") : row;
      const char *key = mean ? s->objectives[c - first].name : t->columns[c];
      const json_t *cell = json_object_get(from, key);
      json_array_append_new(cells, cell ? json_incref((json_t *)cell) : json_null());
    }
    if (cli_table_add_row(t, cells) != NAS_OK) return NAS_ERR;
  }
  return NAS_OK;
}

/* The front's rows as a table (pareto_columns without a label). */
static int pareto_table(const spec *s, const json_t *front, bool model, cli_table *t) {
  int rc = pareto_columns(s, model, false, t);
  return rc == NAS_OK ? pareto_rows(s, front, model, NULL, t) : rc;
}

/* The front of the model's posterior means, after the observed one (--model), in a table. */
static int print_model_front(const spec *s, const json_t *model_front) {
  printf("\nmodel: %zu trials on the front of the posterior means (what the model "
         "expects at each trial's parameters, known noise included; the observed readings "
         "beside them)\n", json_array_size(model_front));
  cli_table t;
  int rc = pareto_table(s, model_front, true, &t);
  if (rc == NAS_OK) cli_table_print(&t, FORMAT_TABLE);
  cli_table_free(&t);
  return rc;
}

/* Both fronts as one CSV table (--model --format csv), so that it reads as one: a "front"
 * column says observed or model, and the posterior means are empty on observed rows. */
static int print_fronts_csv(const spec *s, const json_t *front, const json_t *model_front) {
  cli_table t;
  int rc = pareto_columns(s, true, true, &t);
  if (rc == NAS_OK) rc = pareto_rows(s, front, true, "observed", &t);
  if (rc == NAS_OK) rc = pareto_rows(s, model_front, true, "model", &t);
  if (rc == NAS_OK) cli_table_print(&t, FORMAT_CSV);
  cli_table_free(&t);
  return rc;
}

static int show_pareto(storage *st, const show_args *a, const spec *s,
                       const experiment_row *exp, const sched_results *r, nas_err *err) {
  (void)st;
  json_t *pareto = sched_pareto_json(s, exp, r, err);
  json_t *model = pareto && a->model ? sched_model_front_json(s, r, err) : NULL;
  if (!pareto || (a->model && !model)) {
    json_decref(pareto);
    return nas_err_prefix(err, "pareto");
  }
  int rc = NAS_OK;
  print_front_summary(s, r, pareto, a->format);
  if (a->format == FORMAT_JSON) {
    if (model) json_object_set(pareto, "model_front", model);
    cli_print_json(pareto);
  } else if (model && a->format == FORMAT_CSV) {
    rc = print_fronts_csv(s, json_object_get(pareto, "front"), model);
  } else {
    cli_table t;
    rc = pareto_table(s, json_object_get(pareto, "front"), false, &t);
    if (rc == NAS_OK) cli_table_print(&t, a->format);
    cli_table_free(&t);
    if (rc == NAS_OK && model) rc = print_model_front(s, model);
  }
  json_decref(model);
  json_decref(pareto);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "out of memory");
}

int cmd_pareto(int argc, char **argv) {
  show_args a;
  int status = parse_args("pareto", pareto_help, true, argc, argv, &a);
  if (status < 0) status = with_results(&a, show_pareto);
  free(a.storage);
  return status;
}

/* ---- nas status ------------------------------------------------------------------------- */

static const char status_help[] =
    "usage: nas status [EXPERIMENT] [--format table|csv|json] [--storage URL]\n\n"
    "Without EXPERIMENT: every experiment in the storage with its trial counts.\n"
    "With one: its trial counts by status, then (in the table format) its scheduler and\n"
    "the front's size and hypervolume (and, when it is empty though trials completed, why);\n"
    "'nas pareto EXPERIMENT' gives the front in every format.\n"
    "The scheduler column says whether a scheduler ('nas run'/'nas resume') runs the\n"
    "experiment now: alive, none, or dead (it stopped renewing its lease; the next\n"
    "'nas resume' takes over).\n"
    "--format json prints what 'nas serve' answers at GET /api/v1/experiments\n"
    "({\"experiments\": [summary, …]}), or with EXPERIMENT at GET\n"
    "/api/v1/experiments/EXPERIMENT (its summary: name, status, created_at, trials,\n"
    "counts by status, progress, best, hypervolume, front_size, scheduler; docs/api.md).\n";

static json_t *count_cells(const experiment_row *exp, const trial_row *rows, size_t n,
                           sched_liveness scheduler) {
  int by[TRIAL_STATUS_COUNT] = {0};
  for (size_t i = 0; i < n; i++) by[rows[i].status]++;
  char created[32];
  cli_format_time(exp->created_at, created, sizeof created);
  json_t *cells = json_pack("[s, s, i]", exp->name, exp->status, (int)n);
  for (int st = 0; st < TRIAL_STATUS_COUNT; st++) json_array_append_new(cells, json_integer(by[st]));
  json_array_append_new(cells, json_string(created));
  json_array_append_new(cells, json_string(sched_liveness_name(scheduler)));
  return cells;
}

static int status_table(cli_table *t) {
  static const char *const head[] = {"experiment", "state", "trials"};
  int rc = cli_table_init(t, head, 3);
  for (int st = 0; rc == NAS_OK && st < TRIAL_STATUS_COUNT; st++)
    rc = cli_table_add_column(t, trial_status_name((trial_status)st));
  if (rc == NAS_OK) rc = cli_table_add_column(t, "created");
  return rc == NAS_OK ? cli_table_add_column(t, "scheduler") : rc;
}

static int add_status_row(storage *st, cli_table *t, const experiment_row *exp, nas_err *err) {
  trial_row *rows;
  size_t n;
  sched_liveness scheduler;
  char *holder;
  if (sched_scheduler_state(st, exp, &scheduler, &holder, err) != NAS_OK) return NAS_ERR;
  free(holder);
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  int rc = cli_table_add_row(t, count_cells(exp, rows, n, scheduler));
  trial_rows_free(rows, n);
  return rc == NAS_OK ? NAS_OK : nas_errf(err, "out of memory");
}

/* One line under a single experiment's status: who runs it (at: cli_storage_hint's). */
static void print_scheduler_line(storage *st, const experiment_row *exp, const char *at) {
  nas_err err;
  sched_liveness scheduler;
  char *holder = NULL;
  if (sched_scheduler_state(st, exp, &scheduler, &holder, &err) != NAS_OK) return;
  if (scheduler == SCHEDULER_ALIVE) printf("scheduler: alive (%s)\n", holder);
  else if (scheduler == SCHEDULER_DEAD)
    printf("scheduler: dead (%s); 'nas resume %s%s' takes over\n", holder, exp->name, at);
  else printf("scheduler: none\n");
  free(holder);
}

/* One line under a single experiment's status: the front so far (at: cli_storage_hint's). */
static void print_front_line(storage *st, const experiment_row *exp, const char *at) {
  nas_err err;
  spec *s = NULL;
  sched_results r;
  if (sched_experiment_spec(exp, &s, &err) != NAS_OK ||
      sched_results_load(st, s, exp->id, &r, &err) != NAS_OK) {
    spec_free(s);
    return;
  }
  size_t *front, n_front;
  double hv, *ref = calloc(s->n_objectives, sizeof *ref);
  if (ref && sched_front(s, &r, &front, &n_front, &hv, ref, &err) == NAS_OK) {
    printf("front: %zu trials, hypervolume %.6g ('nas pareto %s%s' lists them)\n", n_front, hv,
           exp->name, at);
    print_empty_front_note(stdout, s, &r);
    print_warm_start_note(stdout, s);
    free(front);
  }
  free(ref);
  sched_results_free(&r);
  spec_free(s);
}

/* `nas status EXPERIMENT --format json`: its summary, as GET /api/v1/experiments/NAME. */
static int show_summary(storage *st, const show_args *a, const spec *s,
                        const experiment_row *exp, const sched_results *r, nas_err *err) {
  (void)a;
  json_t *summary = sched_experiment_json(st, s, exp, r, NULL, err);
  if (!summary) return NAS_ERR;
  cli_print_json(summary);
  json_decref(summary);
  return NAS_OK;
}

/* `nas status --format json`: every summary, as GET /api/v1/experiments. */
static int print_summaries(const show_args *a) {
  nas_err err;
  storage *st;
  json_t *list = NULL;
  if (storage_open_with(cli_storage_url(a->storage), SHOW_OPEN, &st, &err) != NAS_OK)
    return cli_fail(&err);
  int rc = sched_experiment_list_json(st, &list, &err);
  storage_close(st);
  if (rc != NAS_OK) return cli_fail(&err);
  cli_print_json(list);
  json_decref(list);
  return EXIT_DONE;
}

int cmd_status(int argc, char **argv) {
  show_args a;
  int status = parse_args("status", status_help, false, argc, argv, &a);
  if (status < 0 && a.format == FORMAT_JSON)
    status = a.experiment ? with_results(&a, show_summary) : print_summaries(&a);
  if (status >= 0) {
    free(a.storage);
    return status;
  }
  nas_err err;
  storage *st;
  if (storage_open_with(cli_storage_url(a.storage), SHOW_OPEN, &st, &err) != NAS_OK) {
    free(a.storage);
    return cli_fail(&err);
  }
  experiment_row *exps = NULL;
  size_t n = 0;
  cli_table t;
  int rc = status_table(&t);
  if (rc == NAS_OK && a.experiment) {
    exps = calloc(1, sizeof *exps);
    rc = exps ? cli_get_experiment(st, cli_storage_url(a.storage), a.experiment, exps, &err)
              : nas_errf(&err, "out of memory");
    n = rc == NAS_OK ? 1 : 0;
  } else if (rc == NAS_OK) {
    rc = storage_experiment_list(st, &exps, &n, &err);
  }
  for (size_t i = 0; rc == NAS_OK && i < n; i++) rc = add_status_row(st, &t, &exps[i], &err);
  if (rc == NAS_OK) cli_table_print(&t, a.format);
  else status = cli_fail(&err);
  if (rc == NAS_OK && a.experiment && a.format == FORMAT_TABLE) {
    char at[CLI_HINT_MAX];
    cli_storage_hint(cli_storage_url(a.storage), at, sizeof at);
    print_scheduler_line(st, &exps[0], at);
    print_front_line(st, &exps[0], at);
  }
  cli_table_free(&t);
  experiment_rows_free(exps, n);
  storage_close(st);
  free(a.storage);
  return rc == NAS_OK ? EXIT_DONE : status;
}
