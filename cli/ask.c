/* cli/ask.c: `nas create`, `nas ask` and `nas tell` — an experiment driven from a shell
 * loop or any program, without a scheduler and without a server (scheduler/ask.c; the same
 * calls as the /ask and /trials/N/… endpoints of `nas serve`). */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "metrics/metrics.h"
#include "scheduler/scheduler.h"

static const char create_help[] =
    "usage: nas create FILE [--storage URL]\n\n"
    "Stores the experiment described by the YAML spec FILE without running it, to drive it\n"
    "with 'nas ask'/'nas tell' or through 'nas serve'. A spec for ask and tell needs no\n"
    "'trial' section. The same spec again is no error (a changed budget or notify section is\n"
    "stored); any other difference is refused.\n"
    "Stored in --storage, else $NAS_STORAGE, else the spec's 'storage:' (as 'nas run').\n";

static const char ask_help[] =
    "usage: nas ask EXPERIMENT [-n K] [--worker NAME] [--format table|csv|json] [--storage URL]\n\n"
    "Hands out K trials (default 1) to evaluate: trials handed out before and lost first,\n"
    "then new suggestions of the experiment's optimizer, within its trial budget. Prints\n"
    "each trial's number, attempt and parameters. Report with 'nas tell'; a trial with no\n"
    "report nor heartbeat for trial.heartbeat_timeout (default 10 minutes) is handed out\n"
    "again, as its next attempt.\n"
    "Exit status 1 when the budget is spent. The tell that ends the last trial of the\n"
    "budget marks the experiment finished; an ask that hands out a trial queued by\n"
    "'nas retry' or 'nas enqueue', or allowed by a budget 'nas create' raised, marks it\n"
    "running again.\n\n"
    "  -n K             how many trials, 1 to 1000 (default 1)\n"
    "  --worker NAME    who asks: the trials' job becomes ask:NAME (default ask:client),\n"
    "                   as 'nas trial' shows it\n";

static const char tell_help[] =
    "usage: nas tell EXPERIMENT TRIAL [--step N] [--complete | --fail MESSAGE]\n"
    "                [--attempt A] [NAME=VALUE …] [--storage URL]\n\n"
    "Stores metrics of trial number TRIAL, handed out by 'nas ask':\n"
    "  --step N          the values are intermediate, at step N; prints 'stop' when the\n"
    "                    early-stopping rule stops the trial there, else 'continue'\n"
    "  --complete        the values (if any) are final and the trial is done; every\n"
    "                    objective must have been reported\n"
    "  --fail MESSAGE    the trial failed (no NAME=VALUE with it)\n"
    "  --attempt A       the attempt 'nas ask' printed; the tell is refused when the\n"
    "                    trial was handed out again since (it runs another)\n"
    "Without --step, --complete or --fail the values are final and the trial goes on.\n"
    "A VALUE is a finite decimal number (3, -0.25, .5, 1e-3; not 0x10, inf or ' 1').\n";

/* Opens storage and experiment `name` with its spec, or prints why not. */
static int open_named(const char *url, const char *name, storage **st, experiment_row *exp,
                      spec **s) {
  nas_err err;
  return cli_open_experiment(cli_storage_url(url), STORAGE_MUST_EXIST, name, st, exp, s, &err) == NAS_OK
             ? NAS_OK
             : (cli_fail(&err), NAS_ERR);
}

static void close_named(storage *st, experiment_row *exp, spec *s) {
  spec_free(s);
  experiment_row_clear(exp);
  storage_close(st);
}

static int create_experiment(const char *path, const char *url) {
  spec *s = NULL;
  nas_err err;
  if (spec_load(path, &s, &err) != NAS_OK || sched_check_spec(s, &err) != NAS_OK) {
    spec_free(s);
    return cli_fail(&err);
  }
  storage *st = NULL;
  experiment_row exp = {0};
  int status = EXIT_DONE;
  if (storage_open(cli_spec_storage_url(url, s), &st, &err) != NAS_OK ||
      sched_prepare(s, st, &exp, &err) != NAS_OK)
    status = cli_fail(&err);
  else {
    char at[CLI_HINT_MAX];
    cli_storage_hint(cli_spec_storage_url(url, s), at, sizeof at);
    printf("experiment '%s' is ready: 'nas ask %s%s' hands out trials\n", exp.name, exp.name, at);
  }
  experiment_row_clear(&exp);
  storage_close(st);
  spec_free(s);
  return status;
}

int cmd_create(int argc, char **argv) {
  const cli_command cmd = {.name = "create", .help = create_help};
  char *url; /* owned (cli_storage_flag) */
  int status = cli_parse_options(&cmd, argc, argv, &url);
  if (status < 0 && optind != argc - 1) status = cli_usage_error("create", "expected exactly one FILE");
  if (status < 0) status = create_experiment(argv[optind], url);
  free(url);
  return status;
}

/* The spec's webhooks for one command (NULL when it has none or they cannot start: the
 * command goes on without them, as a run does). Closed with notifier_close. */
static notifier *webhooks_start(const spec *s, const experiment_row *exp) {
  notifier *nt = NULL;
  nas_err why;
  if (notifier_start(s->notify, s->n_notify, &nt, &why) != NAS_OK)
    nas_log("%s: no webhooks: %s", exp->name, why.msg);
  return nt;
}

static int print_asked(const spec *s, const trial_row *rows, size_t n, out_format format) {
  cli_table t;
  static const char *const head[] = {"trial", "attempt"};
  int rc = cli_table_init(&t, head, 2);
  for (size_t p = 0; rc == NAS_OK && p < s->n_params; p++) rc = cli_table_add_column(&t, s->params[p].name);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    json_t *params = json_loads(rows[i].params_json, 0, NULL), *cells = json_array();
    json_array_append_new(cells, json_integer(rows[i].number));
    json_array_append_new(cells, json_integer(rows[i].attempts));
    for (size_t p = 0; p < s->n_params; p++) {
      json_t *v = json_object_get(params, s->params[p].name);
      json_array_append_new(cells, v ? json_incref(v) : json_null());
    }
    json_decref(params);
    rc = cli_table_add_row(&t, cells);
  }
  if (rc == NAS_OK) cli_table_print(&t, format);
  cli_table_free(&t);
  return rc;
}

/* What `nas ask` was asked for, besides the experiment. */
typedef struct {
  const char *worker; /* --worker NAME, or NULL */
  long n;             /* -n K */
  out_format format;
} ask_args;

static int take_ask_option(const char *cmd, int c, char *arg, void *ctx) {
  ask_args *a = ctx;
  if (c == 'w') a->worker = arg;
  else if (c == 'f') return cli_format_option(cmd, arg, &a->format);
  else if (!cli_parse_count(arg, 1, 1000, &a->n)) /* -n */
    return cli_usage_error(cmd, "-n wants a count from 1 to 1000, not '%s'", arg);
  return -1;
}

/* Hands out trials of experiment `name` in storage url (NULL: the default) and prints them. */
static int ask(const char *url, const char *name, const ask_args *a) {
  storage *st;
  experiment_row exp;
  spec *s;
  if (open_named(url, name, &st, &exp, &s) != NAS_OK) return EXIT_FAILED;
  trial_row *rows;
  size_t got;
  nas_err err;
  int status = EXIT_DONE;
  notifier *nt = webhooks_start(s, &exp);
  if (sched_ask(st, s, &exp, (size_t)a->n, a->worker, nt, &rows, &got, &err) != NAS_OK) {
    status = cli_fail(&err);
  } else {
    if (print_asked(s, rows, got, a->format) != NAS_OK) status = EXIT_FAILED;
    trial_rows_free(rows, got);
  }
  notifier_close(nt);
  close_named(st, &exp, s);
  return status;
}

int cmd_ask(int argc, char **argv) {
  static const struct option options[] = {{"worker", required_argument, NULL, 'w'},
                                          {"format", required_argument, NULL, 'f'},
                                          {NULL, 0, NULL, 0}};
  ask_args a = {.n = 1, .format = FORMAT_TABLE};
  const cli_command cmd = {"ask", ask_help, options, "n:", take_ask_option, &a};
  char *url; /* owned (cli_storage_flag) */
  int status = cli_parse_options(&cmd, argc, argv, &url);
  if (status < 0 && optind != argc - 1) status = cli_usage_error("ask", "expected exactly one EXPERIMENT");
  if (status < 0) status = ask(url, argv[optind], &a);
  free(url);
  return status;
}

/* What `nas tell` was asked to do. */
typedef struct {
  char *url;               /* owned (cli_storage_flag) */
  long long step;          /* METRIC_FINAL unless --step */
  bool complete;
  const char *fail;        /* --fail MESSAGE, or NULL */
  int attempt;             /* --attempt A, or 0: whichever attempt runs */
  const char *experiment;
  int number;
  int first_metric;        /* argv index of the first NAME=VALUE */
} tell_args;

static int take_tell_option(const char *cmd, int c, char *arg, void *ctx) {
  tell_args *a = ctx;
  long attempt;
  if (c == 'a' && !cli_parse_count(arg, 1, INT_MAX, &attempt))
    return cli_usage_error(cmd, "--attempt wants an attempt number (1, 2, …), not '%s'", arg);
  if (c == 'a') a->attempt = (int)attempt;
  else if (c == 'n') return cli_step_option(cmd, arg, &a->step);
  else if (c == 'c') a->complete = true;
  else a->fail = arg; /* --fail */
  return -1;
}

/* Returns -1 when the command should go on, else the exit status; a->url is to be freed
 * either way. */
static int parse_tell(int argc, char **argv, tell_args *a) {
  static const struct option options[] = {{"step", required_argument, NULL, 'n'},
                                          {"complete", no_argument, NULL, 'c'},
                                          {"fail", required_argument, NULL, 'x'},
                                          {"attempt", required_argument, NULL, 'a'},
                                          {NULL, 0, NULL, 0}};
  *a = (tell_args){.step = METRIC_FINAL};
  const cli_command cmd = {"tell", tell_help, options, NULL, take_tell_option, a};
  int status = cli_parse_options(&cmd, argc, argv, &a->url);
  if (status >= 0) return status;
  if (argc - optind < 2) return cli_usage_error("tell", "expected EXPERIMENT TRIAL");
  a->experiment = argv[optind];
  if ((status = cli_trial_number("tell", argv[optind + 1], &a->number)) >= 0) return status;
  a->first_metric = optind + 2;
  if ((a->complete || a->fail) && a->step != METRIC_FINAL)
    return cli_usage_error("tell", "--step reports intermediate values; it goes with neither "
                                   "--complete nor --fail");
  if (a->complete && a->fail) return cli_usage_error("tell", "--complete or --fail, not both");
  /* A failed trial takes no final values (sched_tell_fail stores none): refused rather
   * than dropped unseen. */
  if (a->fail && a->first_metric < argc)
    return cli_usage_error("tell", "--fail takes no NAME=VALUE; report values first with "
                                   "'nas tell %s %s NAME=VALUE …', then --fail", a->experiment,
                           argv[optind + 1]);
  if (a->fail && !nas_is_utf8(a->fail)) /* it is stored, and shown as JSON and CSV */
    return cli_usage_error("tell", "--fail's message is not valid UTF-8");
  if (!a->complete && !a->fail && a->first_metric == argc)
    return cli_usage_error("tell", "nothing to tell: give NAME=VALUE, --complete or --fail");
  return -1;
}

/* Ends the trial as a told; the spec's webhooks hear of it before the command exits
 * (notifier_close waits at most NOTIFY_FLUSH_S), and cannot fail it. */
static int tell_end(storage *st, const spec *s, const experiment_row *exp, const tell_args *a,
                    const metric_set *set, nas_err *err) {
  notifier *nt = webhooks_start(s, exp);
  int rc = a->fail ? sched_tell_fail(st, s, exp, a->number, a->attempt, a->fail, nt, err)
                   : sched_tell_complete(st, s, exp, a->number, a->attempt, set->obs, set->n,
                                         nt, err);
  notifier_close(nt);
  return rc;
}

static int tell_it(storage *st, const spec *s, const experiment_row *exp, const tell_args *a,
                   const metric_set *set, nas_err *err) {
  if (a->fail || a->complete) return tell_end(st, s, exp, a, set, err);
  bool stop = false;
  int rc = sched_tell_report(st, s, exp, a->number, a->attempt, set->obs, set->n, &stop, err);
  if (rc == NAS_OK && stop) { /* early stopping ended the trial: maybe the experiment too */
    notifier *nt = webhooks_start(s, exp);
    sched_tell_stopped_end(st, s, exp, a->number, nt);
    notifier_close(nt);
  }
  if (rc == NAS_OK && a->step != METRIC_FINAL) puts(stop ? "stop" : "continue");
  return rc;
}

int cmd_tell(int argc, char **argv) {
  tell_args a;
  int status = parse_tell(argc, argv, &a);
  if (status >= 0) {
    free(a.url);
    return status;
  }
  metric_set set = {0};
  nas_err err;
  int rc = NAS_OK;
  for (int i = a.first_metric; rc == NAS_OK && i < argc; i++)
    rc = cli_parse_metric(argv[i], a.step, &set, &err);
  if (rc != NAS_OK) {
    metric_set_free(&set);
    free(a.url);
    return cli_usage_error("tell", "%s", err.msg);
  }
  storage *st;
  experiment_row exp;
  spec *s;
  status = EXIT_FAILED;
  if (open_named(a.url, a.experiment, &st, &exp, &s) == NAS_OK) {
    status = tell_it(st, s, &exp, &a, &set, &err) == NAS_OK ? EXIT_DONE : cli_fail(&err);
    close_named(st, &exp, s);
  }
  metric_set_free(&set);
  free(a.url);
  return status;
}
