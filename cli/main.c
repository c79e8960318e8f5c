/* cli/main.c: `nas COMMAND …` dispatch, --help and --version. */
#include <errno.h>
#include <gsl/gsl_errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#define NAS_VERSION "0.1.0"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "run an experiment from its YAML spec (continues it if it exists)"},
    {"resume", cmd_resume, "continue an interrupted experiment"},
    {"status", cmd_status, "list experiments, or show one experiment's progress"},
    {"trials", cmd_trials, "list an experiment's trials with parameters and metrics"},
    {"pareto", cmd_pareto, "show the Pareto front of an experiment and its hypervolume"},
    {"trial", cmd_trial, "show one trial: parameters, metrics, curves, times, logs, model"},
    {"logs", cmd_logs, "print a trial's stdout or stderr log; --follow while it runs"},
    {"compare", cmd_compare, "compare experiments' fronts and hypervolumes at one reference point"},
    {"plot", cmd_plot, "write an experiment's dashboard page as one HTML file (no server)"},
    {"export", cmd_export, "write an experiment as JSON (to import elsewhere) or CSV"},
    {"import", cmd_import, "store an experiment from an 'nas export' JSON file"},
    {"stop", cmd_stop, "stop a running experiment (from any terminal)"},
    {"retry", cmd_retry, "queue failed trials again, for the next resume to run"},
    {"enqueue", cmd_enqueue, "queue a trial with parameter values you choose"},
    {"rename", cmd_rename, "rename an experiment (its stored spec and run folder too)"},
    {"copy", cmd_copy, "copy an experiment, to the same storage or another"},
    {"delete", cmd_delete, "delete an experiment's trials and metrics (and run folders)"},
    {"report", cmd_report, "report metrics of the current trial from a script"},
    {"worker", cmd_worker, "run one built-in trial (what nas starts for trial.builtin)"},
    {"serve", cmd_serve, "serve the storage's experiments over HTTP (JSON API, ask/tell)"},
    {"create", cmd_create, "store an experiment without running it (for ask/tell)"},
    {"ask", cmd_ask, "hand out trials to evaluate in your own loop"},
    {"tell", cmd_tell, "report a handed-out trial's metrics, or end it"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: nas COMMAND [options]\n\n"
             "Multi-objective Bayesian optimisation of experiments, trials run by runners.\n\n"
             "commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'nas COMMAND --help' (or -h) describes one command. Storage: --storage URL, else "
             "$NAS_STORAGE, else sqlite:nas.db.\n");
}

/* A command's status, unless what it printed did not all reach stdout (a full disk, a
 * closed pipe with SIGPIPE ignored): `nas export EXP > backup.json` must not end 0 with half
 * a file. stdio keeps a failed write's error in the stream and retries its buffer on the
 * flush, which says why. */
static int with_stdout_written(int status) {
  bool failed_before = ferror(stdout);
  errno = 0;
  if (fflush(stdout) == 0 && !failed_before) return status;
  fprintf(stderr, "nas: cannot write the output to stdout%s%s\n", errno ? ": " : "",
          errno ? strerror(errno) : "");
  return status == EXIT_DONE ? EXIT_FAILED : status;
}

int main(int argc, char **argv) {
  /* GSL aborts the process on errors by default; every GSL call here checks its result. */
  gsl_set_error_handler_off();
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  if (strcmp(argv[1], "help") == 0 && argc > 2 && argv[2][0] != '-') {
    /* `nas help run` is `nas run --help` (`nas help --help` is `nas --help`, below). */
    char *help_argv[] = {argv[2], "--help", NULL};
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
      if (strcmp(argv[2], commands[i].name) == 0)
        return with_stdout_written(commands[i].run(2, help_argv));
    argv[1] = argv[2]; /* an unknown command: said as such below */
  } else if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
             strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return with_stdout_written(EXIT_DONE);
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("nas %s\n", NAS_VERSION);
    return with_stdout_written(EXIT_DONE);
  }
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (strcmp(argv[1], commands[i].name) == 0)
      return with_stdout_written(commands[i].run(argc - 1, argv + 1));
  fprintf(stderr, "nas: unknown command '%s'\n", argv[1]);
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (nas_edit_distance(argv[1], commands[i].name) <= 2)
      fprintf(stderr, "nas: did you mean '%s'?\n", commands[i].name);
  fprintf(stderr, "Try 'nas --help'.\n");
  return EXIT_USAGE;
}
