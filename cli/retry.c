/* cli/retry.c: `nas retry EXPERIMENT [N …|--failed]` — queues failed, timed-out or stopped
 * trials again (after the trial was fixed), for the next `nas resume` or `nas run` to launch. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"

static const char retry_help[] =
    "usage: nas retry EXPERIMENT N [N …] [--storage URL]\n"
    "       nas retry EXPERIMENT --failed [--storage URL]\n\n"
    "Queues the trials numbered N (as 'nas trials' shows them), or with --failed every\n"
    "failed and timed-out trial, to run again: once the trial is fixed, 'nas resume\n"
    "EXPERIMENT' (or 'nas run') launches them before any new trial ('nas ask' hands them\n"
    "out first where the spec runs nothing). Each stays the same trial, with its\n"
    "parameters and its attempts so far, and counts once in budget.trials.\n"
    "A number may also name a stopped trial (a second Ctrl-C, 'nas stop', the wall-time\n"
    "budget or early stopping cut it short); --failed leaves those. Naming a trial in any\n"
    "other status refuses the whole request and changes nothing.\n\n"
    "  --failed        every failed and timed-out trial\n"
    "  --storage URL   default: $NAS_STORAGE, else sqlite:nas.db\n";

typedef struct {
  char *storage; /* owned: --storage (cli_storage_flag), NULL when not given */
  bool failed;
  const char *experiment;
  int *numbers; /* owned */
  size_t n;
} retry_args;

static int take_retry_option(const char *cmd, int c, char *arg, void *ctx) {
  (void)cmd, (void)c, (void)arg; /* --failed, its only own option */
  ((retry_args *)ctx)->failed = true;
  return -1;
}

/* Returns -1 when the command should go on, else the exit status. */
static int parse_args(int argc, char **argv, retry_args *a) {
  static const struct option options[] = {{"failed", no_argument, NULL, 'f'}, {NULL, 0, NULL, 0}};
  const cli_command cmd = {"retry", retry_help, options, NULL, take_retry_option, a};
  int status = cli_parse_options(&cmd, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (optind >= argc) return cli_usage_error("retry", "expected an EXPERIMENT");
  a->experiment = argv[optind++];
  size_t n = (size_t)(argc - optind);
  if (a->failed == (n > 0))
    return cli_usage_error("retry", "name the trials to retry, or give --failed (not both)");
  a->numbers = calloc(n ? n : 1, sizeof *a->numbers);
  if (!a->numbers) return cli_usage_error("retry", "out of memory");
  for (; status < 0 && optind < argc; optind++)
    status = cli_trial_number("retry", argv[optind], &a->numbers[a->n++]);
  return status;
}

int cmd_retry(int argc, char **argv) {
  retry_args a = {0};
  int status = parse_args(argc, argv, &a);
  if (status >= 0) {
    free(a.numbers);
    free(a.storage);
    return status;
  }
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  size_t retried = 0;
  if (cli_open_experiment(cli_storage_url(a.storage), STORAGE_MUST_EXIST, a.experiment, &st,
                          &exp, &s, &err) != NAS_OK) {
    free(a.numbers);
    free(a.storage);
    return cli_fail(&err);
  }
  int rc = sched_retry(st, &exp, a.numbers, a.n, stdout, &retried, &err);
  if (rc == NAS_OK && retried == 0)
    fprintf(stderr, "nas: %s has no failed or timed-out trial to retry\n", exp.name);
  else if (rc == NAS_OK)
  {
    char at[CLI_HINT_MAX];
    cli_storage_hint(cli_storage_url(a.storage), at, sizeof at);
    fprintf(stderr, "nas: %zu trial%s queued; run them with: %s %s%s\n", retried,
            retried == 1 ? "" : "s", cli_queued_runner(s), exp.name, at);
  }
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  free(a.numbers);
  free(a.storage);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}
