/* cli/report.c: `nas report NAME=VALUE …` — metrics from a trial's shell script, stored
 * directly (the same effect as printing a nas-metric line). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "metrics/metrics.h"

static const char report_help[] =
    "usage: nas report NAME=VALUE [NAME=VALUE …] [--step N] [--trial ID] [--storage URL]\n\n"
    "Stores metric values for the running trial, as printing\n"
    "  nas-metric {\"NAME\": VALUE, \"step\": N}\n"
    "on its stdout would. Without --step the values are final; with it, intermediate\n"
    "values at step N (early stopping reads these). The trial and storage default to\n"
    "$NAS_TRIAL_ID and $NAS_STORAGE, which nas sets for every trial it launches.\n";

static int parse_long(const char *text, long long *out) {
  char *end;
  errno = 0;
  *out = strtoll(text, &end, 10);
  return errno == 0 && end != text && *end == '\0' ? NAS_OK : NAS_ERR;
}

/* Parses NAME=VALUE into set. */
static int parse_pair(const char *arg, int64_t step, metric_set *set, nas_err *err) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg) return nas_errf(err, "'%s' is not NAME=VALUE", arg);
  char *end;
  double value = strtod(eq + 1, &end);
  if (end == eq + 1 || *end != '\0' || !isfinite(value))
    return nas_errf(err, "'%s': the value is not a finite number", arg);
  char *name = strndup(arg, (size_t)(eq - arg));
  int rc = name ? metric_set_add(set, name, step, value, nas_now(), err)
                : nas_errf(err, "out of memory");
  free(name);
  return rc;
}

int cmd_report(int argc, char **argv) {
  static const struct option options[] = {{"step", required_argument, NULL, 'n'},
                                          {"trial", required_argument, NULL, 't'},
                                          {"storage", required_argument, NULL, 's'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  long long step = METRIC_FINAL, trial = -1;
  const char *trial_text = getenv("NAS_TRIAL_ID"), *url = NULL;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "n:t:s:h", options, NULL)) != -1) {
    if (c == 'h') {
      fputs(report_help, stdout);
      return EXIT_DONE;
    } else if (c == 'n') {
      if (parse_long(optarg, &step) != NAS_OK || step < 0)
        return cli_usage_error("report", "--step wants a non-negative integer, not '%s'", optarg);
    } else if (c == 't') {
      trial_text = optarg;
    } else if (c == 's') {
      url = optarg;
    } else {
      return cli_usage_error("report", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind == argc) return cli_usage_error("report", "expected NAME=VALUE");
  if (!trial_text || parse_long(trial_text, &trial) != NAS_OK)
    return cli_usage_error("report", "no trial: run it inside a trial (NAS_TRIAL_ID) or "
                                     "give --trial ID");
  metric_set set = {0};
  nas_err err;
  int rc = NAS_OK;
  for (int i = optind; rc == NAS_OK && i < argc; i++) rc = parse_pair(argv[i], step, &set, &err);
  if (rc != NAS_OK) {
    metric_set_free(&set);
    return cli_usage_error("report", "%s", err.msg);
  }
  storage *st = NULL;
  rc = storage_open(cli_storage_url(url), &st, &err);
  if (rc == NAS_OK) rc = storage_metrics_add(st, trial, set.obs, set.n, -1, &err);
  /* A report is a sign of life too (trial.heartbeat_timeout); only running trials take one. */
  nas_err ignored;
  if (rc == NAS_OK) storage_trial_heartbeat(st, trial, &ignored);
  storage_close(st);
  metric_set_free(&set);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}
