/* cli/stop.c: `nas stop EXPERIMENT` — from any terminal, whether or not its scheduler
 * still runs: the experiment is marked stopped in storage (a live scheduler sees that and
 * ends) and every running trial's job is asked to stop through its runner. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"

static const char stop_help[] =
    "usage: nas stop EXPERIMENT [--storage URL]\n\n"
    "Stops an experiment: launches no more trials and stops the running ones (TERM, then\n"
    "KILL after the runner's grace period); they are recorded as stopped, with their data\n"
    "(by the experiment's scheduler, or, when none is alive, by this command, which then\n"
    "waits for them).\n"
    "'nas resume EXPERIMENT' continues it later; one whose trials 'nas ask' hands out (its\n"
    "spec runs nothing) is opened again by 'nas create' of its spec.\n";

/* What `nas stop` did to an experiment whose trials `nas ask` hands out (its spec runs
 * nothing, so `nas resume` refuses it), and what opens it again (at: the storage hint). */
static void print_asked_stop(const experiment_row *exp, const char *at) {
  char *spec = cli_shell_word(exp->spec_path);
  printf("%s: marked stopped: 'nas ask' hands out no more trials (those handed out may still "
         "be told); 'nas create %s%s' opens it again\n", exp->name, spec ? spec : exp->spec_path,
         at);
  free(spec);
}

/* Whether a live scheduler runs exp (one whose trials `nas ask` hands out has none). */
static int scheduler_alive(storage *st, const experiment_row *exp, bool *alive, nas_err *err) {
  sched_liveness state;
  char *holder;
  if (sched_scheduler_state(st, exp, &state, &holder, err) != NAS_OK) return NAS_ERR;
  free(holder);
  *alive = state == SCHEDULER_ALIVE;
  return NAS_OK;
}

/* With no scheduler alive (killed, or the machine rebooted), nothing would record how the
 * stopped trials ended, and `nas resume` would launch more: a scheduler of its own that
 * launches nothing re-attaches to them, stops them and records them. *recorded is false
 * when a scheduler started meanwhile (it records them). */
static int record_stopped(const spec *s, storage *st, const experiment_row *exp,
                          const char *url, const char *at, bool *recorded, nas_err *err) {
  sched_options opt = {.storage_url = url, .progress = stderr, .poll_interval = 0.2,
                       .stop_only = true, .storage_hint = at};
  sched_outcome outcome;
  int rc = sched_run(s, st, exp, &opt, &outcome, err);
  *recorded = rc == NAS_OK;
  return rc == NAS_EEXIST ? NAS_OK : rc;
}

static int stop_experiment(const char *url, const char *name) {
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(cli_storage_url(url), STORAGE_MUST_EXIST, name, &st, &exp, &s,
                          &err) != NAS_OK)
    return cli_fail(&err);
  char at[CLI_HINT_MAX];
  cli_storage_hint(cli_storage_url(url), at, sizeof at);
  sched_stopped done;
  bool alive = true, recorded = false;
  int rc = spec_trial_runs(s) ? scheduler_alive(st, &exp, &alive, &err) : NAS_OK;
  if (rc == NAS_OK) rc = sched_stop(s, st, &exp, stderr, &done, &err);
  if (rc == NAS_OK && !alive && done.asked > 0)
    rc = record_stopped(s, st, &exp, cli_storage_url(url), at, &recorded, &err);
  if (rc == NAS_OK && done.was_finished)
    printf("%s: finished already (its budget is spent); nothing to stop\n", exp.name);
  else if (rc == NAS_OK && recorded)
    printf("%s: marked stopped; no scheduler was running it, so this stopped its %zu running "
           "trial%s and recorded how they ended (above); 'nas resume %s%s' continues it\n",
           exp.name, done.asked, done.asked == 1 ? "" : "s", exp.name, at);
  else if (rc == NAS_OK && spec_trial_runs(s))
    printf("%s: marked stopped (a running 'nas run' sees it within a second and ends once its "
           "trials have stopped); asked %zu running trial%s to stop; then 'nas resume %s%s' "
           "continues it\n", exp.name, done.asked,
           done.asked == 1 ? "" : "s", exp.name, at);
  else if (rc == NAS_OK) /* trials handed out by ask only: nas resume would refuse it */
    print_asked_stop(&exp, at);
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}

int cmd_stop(int argc, char **argv) {
  const cli_command cmd = {.name = "stop", .help = stop_help};
  char *url; /* owned: --storage */
  int status = cli_parse_options(&cmd, argc, argv, &url);
  if (status < 0 && optind != argc - 1)
    status = cli_usage_error("stop", "expected exactly one EXPERIMENT");
  if (status < 0) status = stop_experiment(url, argv[optind]);
  free(url);
  return status;
}
