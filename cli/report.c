/* cli/report.c: `nas report NAME=VALUE …` — metrics from a trial's shell script, stored
 * directly (the same effect as printing a nas-metric line), or given by hand to a trial
 * named by experiment and number; a finished trial's results change only with --force. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "metrics/metrics.h"

static const char report_help[] =
    "usage: nas report NAME=VALUE [NAME=VALUE …] [--step N]\n"
    "                  [[--experiment NAME] --trial NUMBER] [--force] [--storage URL]\n\n"
    "Stores metric values for a trial, as printing\n"
    "  nas-metric {\"NAME\": VALUE, \"step\": N}\n"
    "on its stdout would. Without --step the values are final; with it, intermediate\n"
    "values at step N, a whole number from 0 to 2^53 - 1 (early stopping reads these).\n"
    "A VALUE is a finite decimal number (3, -0.25, .5, 1e-3; not 0x10, inf or ' 1').\n\n"
    "  --trial NUMBER       the trial of that number (as 'nas trials' lists them) in the\n"
    "                       experiment --experiment names, default $NAS_EXPERIMENT; without\n"
    "                       --trial: the trial running this command ($NAS_TRIAL_ID)\n"
    "  --force              also change a finished trial's results (refused otherwise)\n"
    "  --storage URL        default: $NAS_STORAGE, else sqlite:nas.db\n"
    "nas sets NAS_TRIAL_ID, NAS_EXPERIMENT and NAS_STORAGE for every trial it launches.\n";

typedef struct {
  long long step;
  const char *experiment; /* --experiment; NULL when not given */
  const char *number;     /* --trial NUMBER as given; NULL when not given */
  int trial;              /* … as a number (checked by parse_args) */
  bool force;
  char *storage;          /* owned: --storage (cli_storage_flag), NULL when not given */
} report_args;

static int parse_long(const char *text, long long *out) {
  char *end;
  errno = 0;
  *out = strtoll(text, &end, 10);
  return errno == 0 && end != text && *end == '\0' ? NAS_OK : NAS_ERR;
}

static int take_report_option(const char *cmd, int c, char *arg, void *ctx) {
  report_args *a = ctx;
  if (c == 'n') return cli_step_option(cmd, arg, &a->step);
  if (c == 'e') a->experiment = arg;
  else if (c == 't') a->number = arg;
  else a->force = true; /* --force */
  return -1;
}

/* Returns -1 when the command should go on, else the exit status; a->storage is to be
 * freed either way. */
static int parse_args(int argc, char **argv, report_args *a) {
  static const struct option options[] = {{"step", required_argument, NULL, 'n'},
                                          {"experiment", required_argument, NULL, 'e'},
                                          {"trial", required_argument, NULL, 't'},
                                          {"force", no_argument, NULL, 'f'},
                                          {NULL, 0, NULL, 0}};
  *a = (report_args){.step = METRIC_FINAL};
  const cli_command cmd = {"report", report_help, options, NULL, take_report_option, a};
  int status = cli_parse_options(&cmd, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (optind == argc) return cli_usage_error("report", "expected NAME=VALUE");
  if (a->experiment && !a->number)
    return cli_usage_error("report", "--experiment needs --trial NUMBER");
  if (a->number && (status = cli_trial_number("report", a->number, &a->trial)) >= 0) return status;
  if (a->number && !a->experiment && !(a->experiment = getenv("NAS_EXPERIMENT")))
    return cli_usage_error("report", "--trial %s: name its experiment with --experiment NAME",
                           a->number);
  if (!a->number && !getenv("NAS_TRIAL_ID"))
    return cli_usage_error("report", "no trial: run it inside a trial (NAS_TRIAL_ID) or give "
                                     "--experiment NAME --trial NUMBER");
  return -1;
}

/* The trial of that number in the named experiment, and the experiment. */
static int trial_by_number(storage *st, const report_args *a, trial_row *out,
                           experiment_row *exp, nas_err *err) {
  int rc = cli_get_experiment(st, cli_storage_url(a->storage), a->experiment, exp, err);
  trial_row *rows = NULL;
  size_t n = 0;
  if (rc == NAS_OK) rc = storage_trial_list(st, exp->id, &rows, &n, err);
  if (rc != NAS_OK) return rc;
  rc = nas_errf(err, "experiment '%s' has no trial %d (see 'nas trials %s')", a->experiment,
                a->trial, a->experiment);
  for (size_t i = 0; i < n && rc != NAS_OK; i++) {
    if (rows[i].number != a->trial) continue;
    *out = rows[i];
    memset(&rows[i], 0, sizeof rows[i]); /* moved to out */
    rc = NAS_OK;
  }
  trial_rows_free(rows, n);
  return rc;
}

/* The trial --trial or NAS_TRIAL_ID names, and its experiment. */
static int trial_find(storage *st, const report_args *a, trial_row *out, experiment_row *exp,
                      nas_err *err) {
  if (a->number) return trial_by_number(st, a, out, exp, err);
  const char *id_text = getenv("NAS_TRIAL_ID");
  long long id;
  if (parse_long(id_text, &id) != NAS_OK)
    return nas_errf(err, "NAS_TRIAL_ID='%s' is not a trial id", id_text);
  int rc = storage_trial_get(st, id, out, err);
  return rc == NAS_OK ? cli_experiment_by_id(st, out->experiment_id, exp, err) : rc;
}

/* A finished trial's results were final when the scheduler judged it: changing them takes
 * --force. (A trial that finishes between this check and the write is not caught; the
 * check is against mistakes, such as a wrong trial number, not against races.) */
static int check_open(const report_args *a, const trial_row *t, const experiment_row *exp,
                      nas_err *err) {
  if (a->force || !trial_status_final(t->status)) return NAS_OK;
  return nas_errf(err, "trial %d of experiment '%s' is %s: its results are final (give "
                  "--force to change them)", t->number, exp->name, trial_status_name(t->status));
}

static int report(const report_args *a, const metric_set *set, nas_err *err) {
  storage *st = NULL;
  trial_row t = {0};
  experiment_row exp = {0};
  int rc = storage_open_with(cli_storage_url(a->storage), STORAGE_MUST_EXIST, &st, err);
  if (rc == NAS_OK) rc = trial_find(st, a, &t, &exp, err);
  if (rc == NAS_OK) rc = check_open(a, &t, &exp, err);
  if (rc == NAS_OK) rc = storage_metrics_add(st, t.id, set->obs, set->n, -1, err);
  /* A report is a sign of life too (trial.heartbeat_timeout); only running trials take one. */
  nas_err ignored;
  if (rc == NAS_OK) storage_trial_heartbeat(st, t.id, &ignored);
  trial_row_clear(&t);
  experiment_row_clear(&exp);
  storage_close(st);
  return rc;
}

int cmd_report(int argc, char **argv) {
  report_args a;
  int status = parse_args(argc, argv, &a);
  metric_set set = {0};
  nas_err err;
  for (int i = optind; status < 0 && i < argc; i++)
    if (cli_parse_metric(argv[i], a.step, &set, &err) != NAS_OK)
      status = cli_usage_error("report", "%s", err.msg);
  if (status < 0) status = report(&a, &set, &err) == NAS_OK ? EXIT_DONE : cli_fail(&err);
  metric_set_free(&set);
  free(a.storage);
  return status;
}
