/* cli/ask.c: `nas create`, `nas ask` and `nas tell` — an experiment driven from a shell
 * loop or any program, without a scheduler and without a server (scheduler/ask.c; the same
 * calls as the /ask and /trials/N/… endpoints of `nas serve`). */
#include <errno.h>
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
    "'trial' section. The same spec again is no error; a different one is refused.\n"
    "Stored in --storage, else $NAS_STORAGE, else the spec's 'storage:' (as 'nas run').\n";

static const char ask_help[] =
    "usage: nas ask EXPERIMENT [-n K] [--worker NAME] [--format table|csv|json] [--storage URL]\n\n"
    "Hands out K trials (default 1) to evaluate: trials handed out before and lost first,\n"
    "then new suggestions of the experiment's optimizer, within its trial budget. Prints\n"
    "each trial's number and parameters. Report with 'nas tell'; a trial with no report nor\n"
    "heartbeat for trial.heartbeat_timeout (default 10 minutes) is handed out again.\n"
    "Exit status 1 when the budget is spent.\n";

static const char tell_help[] =
    "usage: nas tell EXPERIMENT TRIAL [--step N] [--complete | --fail MESSAGE]\n"
    "                [NAME=VALUE …] [--storage URL]\n\n"
    "Stores metrics of trial number TRIAL, handed out by 'nas ask':\n"
    "  --step N          the values are intermediate, at step N; prints 'stop' when the\n"
    "                    early-stopping rule stops the trial there, else 'continue'\n"
    "  --complete        the values (if any) are final and the trial is done; every\n"
    "                    objective must have been reported\n"
    "  --fail MESSAGE    the trial failed\n"
    "Without --step, --complete or --fail the values are final and the trial goes on.\n";

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
  else
    printf("experiment '%s' is ready: 'nas ask %s' hands out trials\n", exp.name, exp.name);
  experiment_row_clear(&exp);
  storage_close(st);
  spec_free(s);
  return status;
}

int cmd_create(int argc, char **argv) {
  static const struct option options[] = {{"storage", required_argument, NULL, 's'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  char *url = NULL; /* owned (cli_storage_flag) */
  optind = 1;
  opterr = 0;
  int c, status = -1;
  while (status < 0 && (c = getopt_long(argc, argv, ":s:h", options, NULL)) != -1) {
    if (c == 'h') status = (fputs(create_help, stdout), EXIT_DONE);
    else if (c == 's') free(url), url = cli_storage_flag(optarg);
    else status = cli_option_error("create", c, argv);
  }
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
  static const char *const head[] = {"trial"};
  int rc = cli_table_init(&t, head, 1);
  for (size_t p = 0; rc == NAS_OK && p < s->n_params; p++) rc = cli_table_add_column(&t, s->params[p].name);
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    json_t *params = json_loads(rows[i].params_json, 0, NULL), *cells = json_array();
    json_array_append_new(cells, json_integer(rows[i].number));
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

int cmd_ask(int argc, char **argv) {
  static const struct option options[] = {{"storage", required_argument, NULL, 's'},
                                          {"worker", required_argument, NULL, 'w'},
                                          {"format", required_argument, NULL, 'f'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  const char *worker = NULL;
  char *url = NULL; /* owned (cli_storage_flag) */
  long n = 1;
  out_format format = FORMAT_TABLE;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":s:w:f:n:h", options, NULL)) != -1) {
    char *end;
    if (c != 's' && c != 'w' && c != 'f' && c != 'n') free(url); /* every other case returns */
    switch (c) {
    case 'h': fputs(ask_help, stdout); return EXIT_DONE;
    case 's':
      free(url);
      if (!(url = cli_storage_flag(optarg))) return cli_usage_error("ask", "out of memory");
      break;
    case 'w': worker = optarg; break;
    case 'f':
      if (cli_parse_format(optarg, &format) != NAS_OK)
        return free(url), cli_usage_error("ask", "unknown format '%s' (expected table, csv or json)", optarg);
      break;
    case 'n':
      errno = 0;
      n = strtol(optarg, &end, 10);
      if (errno || *end || n < 1 || n > 1000)
        return free(url), cli_usage_error("ask", "-n wants a count from 1 to 1000, not '%s'", optarg);
      break;
    default: return cli_option_error("ask", c, argv);
    }
  }
  if (optind != argc - 1) return free(url), cli_usage_error("ask", "expected exactly one EXPERIMENT");
  storage *st;
  experiment_row exp;
  spec *s;
  int opened = open_named(url, argv[optind], &st, &exp, &s);
  free(url);
  if (opened != NAS_OK) return EXIT_FAILED;
  trial_row *rows;
  size_t got;
  nas_err err;
  int status = EXIT_DONE;
  notifier *nt = webhooks_start(s, &exp);
  if (sched_ask(st, s, &exp, (size_t)n, worker, nt, &rows, &got, &err) != NAS_OK) {
    status = cli_fail(&err);
  } else {
    if (print_asked(s, rows, got, format) != NAS_OK) status = EXIT_FAILED;
    trial_rows_free(rows, got);
  }
  notifier_close(nt);
  close_named(st, &exp, s);
  return status;
}

/* What `nas tell` was asked to do. */
typedef struct {
  char *url;               /* owned (cli_storage_flag) */
  long long step;          /* METRIC_FINAL unless --step */
  bool complete;
  const char *fail;        /* --fail MESSAGE, or NULL */
  const char *experiment;
  int number;
  int first_metric;        /* argv index of the first NAME=VALUE */
} tell_args;

/* Returns -1 when the command should go on, else the exit status. */
static int parse_tell(int argc, char **argv, tell_args *a) {
  static const struct option options[] = {{"storage", required_argument, NULL, 's'},
                                          {"step", required_argument, NULL, 'n'},
                                          {"complete", no_argument, NULL, 'c'},
                                          {"fail", required_argument, NULL, 'x'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  *a = (tell_args){.step = METRIC_FINAL};
  optind = 1;
  opterr = 0;
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, ":s:n:cx:h", options, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(tell_help, stdout); return EXIT_DONE;
    case 's':
      free(a->url);
      if (!(a->url = cli_storage_flag(optarg))) return cli_usage_error("tell", "out of memory");
      break;
    case 'c': a->complete = true; break;
    case 'x': a->fail = optarg; break;
    case 'n':
      errno = 0;
      a->step = strtoll(optarg, &end, 10);
      if (errno || *end || a->step < 0)
        return cli_usage_error("tell", "--step wants a non-negative integer, not '%s'", optarg);
      break;
    default: return cli_option_error("tell", c, argv);
    }
  }
  if (argc - optind < 2) return cli_usage_error("tell", "expected EXPERIMENT TRIAL");
  a->experiment = argv[optind];
  errno = 0;
  long number = strtol(argv[optind + 1], &end, 10);
  if (errno || *end || number < 0 || number > INT_MAX)
    return cli_usage_error("tell", "'%s' is not a trial number", argv[optind + 1]);
  a->number = (int)number;
  a->first_metric = optind + 2;
  if ((a->complete || a->fail) && a->step != METRIC_FINAL)
    return cli_usage_error("tell", "--step reports intermediate values; it goes with neither "
                                   "--complete nor --fail");
  if (a->complete && a->fail) return cli_usage_error("tell", "--complete or --fail, not both");
  if (!a->complete && !a->fail && a->first_metric == argc)
    return cli_usage_error("tell", "nothing to tell: give NAME=VALUE, --complete or --fail");
  return -1;
}

/* Ends the trial as a told; the spec's webhooks hear of it before the command exits
 * (notifier_close waits at most NOTIFY_FLUSH_S), and cannot fail it. */
static int tell_end(storage *st, const spec *s, const experiment_row *exp, const tell_args *a,
                    const metric_set *set, nas_err *err) {
  notifier *nt = webhooks_start(s, exp);
  int rc = a->fail ? sched_tell_fail(st, s, exp, a->number, a->fail, nt, err)
                   : sched_tell_complete(st, s, exp, a->number, set->obs, set->n, nt, err);
  notifier_close(nt);
  return rc;
}

static int tell_it(storage *st, const spec *s, const experiment_row *exp, const tell_args *a,
                   const metric_set *set, nas_err *err) {
  if (a->fail || a->complete) return tell_end(st, s, exp, a, set, err);
  bool stop = false;
  int rc = sched_tell_report(st, s, exp, a->number, set->obs, set->n, &stop, err);
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
