/* cli/run.c: `nas run FILE` and `nas resume EXPERIMENT`. */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "builtin/builtin.h"
#include "scheduler/scheduler.h"

static const char run_help[] =
    "usage: nas run FILE [--storage URL] [--no-progress]\n\n"
    "Runs the experiment described by the YAML spec FILE (format: docs/spec.md) until its\n"
    "budget is spent. If an experiment of that name already exists in the storage, it is\n"
    "continued: the spec must be the same, except for its budget and notify sections.\n\n"
    "  --storage URL   where trials are stored (sqlite:PATH, postgresql://… or http(s)://\n"
    "                  a nas serve); default:\n"
    "                  $NAS_STORAGE, else the spec's `storage`, else sqlite:nas.db. Keep a\n"
    "                  password out of it (ps shows arguments): ~/.pgpass or $NAS_STORAGE\n"
    "  --no-progress   plain log lines even on a terminal\n\n"
    "Ctrl-C once: launch no more trials and wait for the running ones; twice: stop them.\n"
    "Exit status: 0 budget spent, 1 error, 2 bad usage, 3 interrupted ('nas resume' goes on),\n"
    "4 stopped because more than budget.max_failure_rate of the trials that ended in this\n"
    "run failed.\n";

static const char resume_help[] =
    "usage: nas resume EXPERIMENT [--storage URL] [--no-progress]\n\n"
    "Continues an interrupted experiment from its storage: running trials are re-attached\n"
    "(or, when their process is gone, queued again until trial.max_attempts), queued ones\n"
    "are launched, and the optimizer goes on from everything stored. With its budget\n"
    "spent it says so and runs nothing: 'nas run' of the spec with a larger budget.trials\n"
    "runs more.\n\n"
    "  --storage URL   default: $NAS_STORAGE, else sqlite:nas.db\n"
    "  --no-progress   plain log lines even on a terminal\n"
    "Exit status: as for 'nas run'.\n";

typedef struct {
  char *storage;      /* owned: --storage (cli_storage_flag), NULL when not given */
  bool no_progress;
  const char *target; /* FILE or EXPERIMENT */
} run_args;

static int take_run_option(const char *cmd, int c, char *arg, void *ctx) {
  (void)cmd, (void)c, (void)arg; /* --no-progress, the only own option */
  ((run_args *)ctx)->no_progress = true;
  return -1;
}

/* Returns -1 when the command should go on, else the exit status; a->storage is to be
 * freed either way. */
static int parse_args(const char *cmd, const char *help, int argc, char **argv, run_args *a) {
  static const struct option options[] = {{"no-progress", no_argument, NULL, 'q'},
                                          {NULL, 0, NULL, 0}};
  memset(a, 0, sizeof *a);
  const cli_command command = {cmd, help, options, NULL, take_run_option, a};
  int status = cli_parse_options(&command, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (optind != argc - 1)
    return cli_usage_error(cmd, "expected exactly one %s", strcmp(cmd, "run") ? "EXPERIMENT" : "FILE");
  a->target = argv[optind];
  return -1;
}

static int run_experiment(const spec *s, storage *st, const experiment_row *exp,
                          const char *url, bool no_progress) {
  /* The GP's matrices are small: OpenBLAS threads cost more than they give here, and the
   * trials need the cores (measured: about half the speed with 2 threads on 2 cores). */
  openblas_set_num_threads(1);
  char at[CLI_HINT_MAX];
  cli_storage_hint(url, at, sizeof at);
  sched_options opt = {.storage_url = url, .progress = stderr,
                       .progress_tty = !no_progress && isatty(STDERR_FILENO),
                       .poll_interval = 0.2, .storage_hint = at};
  sched_outcome outcome;
  nas_err err;
  int rc = sched_run(s, st, exp, &opt, &outcome, &err);
  if (rc == NAS_ECANCELED) /* a second Ctrl-C ended its wait for storage: interrupted */
    fprintf(stderr, "nas: %s\n", err.msg);
  else if (rc != NAS_OK)
    return cli_fail(&err);
  switch (outcome) {
  case SCHED_INTERRUPTED:
    fprintf(stderr, "nas: interrupted; continue with: nas resume %s%s\n", exp->name, at);
    return EXIT_INTERRUPTED;
  case SCHED_TOO_MANY_FAILURES:
    fprintf(stderr, "nas: too many trials failed; see 'nas trials %s%s' for their errors, fix "
                    "the trial, then 'nas resume %s%s' (and 'nas retry %s --failed%s' to run "
                    "the failed ones again)\n", exp->name, at, exp->name, at, exp->name, at);
    return EXIT_TOO_MANY_FAILURES;
  case SCHED_FINISHED:
    break;
  }
  return EXIT_DONE;
}

int cmd_run(int argc, char **argv) {
  run_args a;
  int status = parse_args("run", run_help, argc, argv, &a);
  if (status >= 0) {
    free(a.storage);
    return status;
  }
  nas_err err;
  spec *s = NULL;
  if (spec_load(a.target, &s, &err) != NAS_OK || sched_check_spec(s, &err) != NAS_OK ||
      sched_check_runnable(s, &err) != NAS_OK || worker_builtin_check(s, &err) != NAS_OK) {
    /* options, the dataset and the device are checked before anything is stored */
    spec_free(s);
    free(a.storage);
    return cli_fail(&err);
  }
  const char *url = cli_spec_storage_url(a.storage, s);
  storage *st = NULL;
  experiment_row exp = {0};
  if (storage_open(url, &st, &err) != NAS_OK || sched_prepare(s, st, &exp, &err) != NAS_OK)
    status = cli_fail(&err);
  else
    status = run_experiment(s, st, &exp, url, a.no_progress);
  experiment_row_clear(&exp);
  storage_close(st);
  spec_free(s);
  free(a.storage);
  return status;
}

static int resume_experiment(const run_args *a) {
  const char *url = cli_storage_url(a->storage);
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(url, STORAGE_MUST_EXIST, a->target, &st, &exp, &s, &err) != NAS_OK)
    return cli_fail(&err);
  int status = worker_builtin_check(s, &err) == NAS_OK
                   ? run_experiment(s, st, &exp, url, a->no_progress)
                   : cli_fail(&err);
  experiment_row_clear(&exp);
  storage_close(st);
  spec_free(s);
  return status;
}

int cmd_resume(int argc, char **argv) {
  run_args a;
  int status = parse_args("resume", resume_help, argc, argv, &a);
  if (status < 0) status = resume_experiment(&a);
  free(a.storage);
  return status;
}
