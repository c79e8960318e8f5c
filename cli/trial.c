/* cli/trial.c: one trial up close — `nas trial` (everything stored about it, and what its
 * run folder holds) and `nas logs` (its stdout.log or stderr.log, followed while it runs).
 * The full view is scheduler/views.c's sched_trial_detail_json, the same JSON as
 * GET /api/v1/experiments/EXP/trials/N; the text form is printed from it. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"

/* How often `nas logs --follow` looks at the log and at the trial's status, in seconds. */
#define FOLLOW_POLL_S 0.25

static const char trial_help[] =
    "usage: nas trial EXPERIMENT N [--format table|json] [--storage URL]\n\n"
    "Everything about trial number N: its status, attempts (with multi_fidelity its rung)\n"
    "and job, when it was created, started and finished (and how long it took), its\n"
    "parameters, every metric, the reference point it was suggested for, its curves (every\n"
    "intermediate value), its error, its run folder, the model a built-in trial saved\n"
    "there, and the last 4 KiB of its stdout.log and stderr.log. --format json gives the\n"
    "same JSON as 'nas serve' at GET /api/v1/experiments/EXPERIMENT/trials/N.\n";

static const char logs_help[] =
    "usage: nas logs EXPERIMENT N [--stderr] [--follow] [--storage URL]\n\n"
    "Prints trial N's stdout.log (with --stderr its stderr.log) from the run folder of its\n"
    "current attempt. With --follow (-f), keeps printing what the trial writes until it is\n"
    "no longer queued or running (a log cut short is read again from its start, and a new\n"
    "attempt's log is followed); Ctrl-C ends it with status 0. A trial handed out by\n"
    "'nas ask' runs outside nas and has no log.\n";

typedef struct {
  char *storage; /* owned: --storage (cli_storage_flag), NULL when not given */
  out_format format;
  bool stderr_log, follow;
  const char *experiment;
  int number;
} trial_args;

/* `nas trial`'s --format, `nas logs`'s --stderr and --follow. */
static int take_trial_option(const char *cmd, int c, char *arg, void *ctx) {
  trial_args *a = ctx;
  if (c == 'e') a->stderr_log = true;
  else if (c == 'f') a->follow = true;
  else if (cli_parse_format(arg, &a->format) != NAS_OK || a->format == FORMAT_CSV) /* --format */
    return cli_usage_error(cmd, "unknown format '%s' (expected table or json)", arg);
  return -1;
}

/* Parses `EXPERIMENT N` and the options of `nas trial` (logs: false) or `nas logs`. Returns
 * -1 when the command should go on, else the exit status; a->storage is to be freed. */
static int parse_trial_args(const char *cmd, const char *help, bool logs, int argc, char **argv,
                            trial_args *a) {
  static const struct option trial_options[] = {{"format", required_argument, NULL, 'F'},
                                                {NULL, 0, NULL, 0}};
  static const struct option logs_options[] = {{"stderr", no_argument, NULL, 'e'},
                                               {"follow", no_argument, NULL, 'f'},
                                               {NULL, 0, NULL, 0}};
  memset(a, 0, sizeof *a);
  const cli_command command = {cmd, help, logs ? logs_options : trial_options, logs ? "f" : NULL,
                               take_trial_option, a};
  int status = cli_parse_options(&command, argc, argv, &a->storage);
  if (status >= 0) return status;
  if (argc - optind != 2) return cli_usage_error(cmd, "expected EXPERIMENT and a trial number N");
  a->experiment = argv[optind];
  return cli_trial_number(cmd, argv[optind + 1], &a->number);
}

/* ---- nas trial --------------------------------------------------------------------------- */

static void print_time(const char *label, const json_t *when) {
  char text[32] = "-";
  if (json_is_number(when)) cli_format_time(json_number_value(when), text, sizeof text);
  printf("%-10s %s\n", label, text);
}

/* printf(format, text) with text as cli_text_shown shows it: what a client stored. */
static void print_shown(const char *format, const char *text) {
  char *shown = cli_text_shown(text);
  printf(format, shown ? shown : "?");
  free(shown);
}

/* "name  value" lines of a JSON object, under a heading; nothing when it is empty. */
static void print_values(const char *heading, const json_t *values) {
  if (json_object_size(values) == 0) return;
  printf("%s\n", heading);
  const char *name;
  const json_t *v;
  json_object_foreach((json_t *)values, name, v) {
    char *text = json_is_real(v) ? nas_asprintf("%.6g", json_real_value(v)) : spec_value_text(v);
    print_shown("  %-16s", name);
    print_shown(" %s\n", text ? text : "?");
    free(text);
  }
}

/* One line per metric: "name  step: value, step: value, …". */
static void print_curves(const json_t *curves) {
  if (json_object_size(curves) == 0) return;
  printf("curves (step: value)\n");
  const char *name;
  const json_t *points;
  json_object_foreach((json_t *)curves, name, points) {
    print_shown("  %-16s", name);
    size_t k;
    const json_t *p;
    json_array_foreach(points, k, p)
      printf("%s%lld: %.6g", k ? ", " : " ", (long long)json_integer_value(json_array_get(p, 0)),
             json_number_value(json_array_get(p, 1)));
    putchar('\n');
  }
}

static void print_tail(const char *name, const json_t *tail) {
  const char *text = json_string_value(tail);
  if (!text) printf("%s: none\n", name);
  else if (!*text) printf("%s: empty\n", name);
  else printf("%s (last %d bytes at most)\n%s%s", name, SCHED_LOG_TAIL_BYTES, text,
              text[strlen(text) - 1] == '\n' ? "" : "\n");
}

/* t as text; with its rung when the experiment trains by multi-fidelity rungs. */
static void print_trial_text(const char *experiment, bool rungs, const json_t *t) {
  const json_t *job = json_object_get(t, "job_id"), *error = json_object_get(t, "error");
  printf("trial %lld of %s: %s, %lld attempt(s)",
         (long long)json_integer_value(json_object_get(t, "number")), experiment,
         json_string_value(json_object_get(t, "status")),
         (long long)json_integer_value(json_object_get(t, "attempts")));
  if (rungs) printf(", rung %lld", (long long)json_integer_value(json_object_get(t, "rung")));
  print_shown(json_is_string(job) ? ", job %s\n" : "%s\n", json_is_string(job) ? json_string_value(job) : "");
  print_time("created", json_object_get(t, "created_at"));
  print_time("started", json_object_get(t, "started_at"));
  print_time("finished", json_object_get(t, "finished_at"));
  const json_t *started = json_object_get(t, "started_at"), *ended = json_object_get(t, "finished_at");
  if (json_is_number(started) && json_is_number(ended))
    printf("%-10s %.3f s\n", "duration", json_number_value(ended) - json_number_value(started));
  if (json_is_string(error)) print_shown("error      %s\n", json_string_value(error));
  print_values("parameters", json_object_get(t, "params"));
  print_values("metrics", json_object_get(t, "metrics"));
  print_values("reference point", json_object_get(t, "reference_point"));
  print_curves(json_object_get(t, "intermediate"));
  const json_t *run_dir = json_object_get(t, "run_dir");
  if (json_is_string(run_dir)) printf("run folder %s\n", json_string_value(run_dir));
  const json_t *model = json_object_get(t, "model");
  if (json_is_object(model)) {
    char *about = json_dumps(json_object_get(model, "about"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    printf("model      %s\n  model.json: %s\n", json_string_value(json_object_get(model, "weights")),
           about ? about : "unreadable");
    free(about);
  }
  print_tail("stdout.log", json_object_get(t, "stdout_tail"));
  print_tail("stderr.log", json_object_get(t, "stderr_tail"));
}

/* The error for a trial number exp does not have, naming the numbers it has. */
static int no_such_trial(storage *st, const experiment_row *exp, int number, nas_err *err) {
  trial_row *trials;
  size_t n;
  if (storage_trial_list(st, exp->id, &trials, &n, err) != NAS_OK) return NAS_ERR;
  trial_rows_free(trials, n);
  if (n == 0)
    return nas_errc(err, NAS_ENOTFOUND, "experiment '%s' has no trial %d (it has none yet)",
                    exp->name, number);
  return nas_errc(err, NAS_ENOTFOUND, "experiment '%s' has no trial %d (its trials are 0 to %zu)",
                  exp->name, number, n - 1);
}

static int show_trial(const trial_args *a) {
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(cli_storage_url(a->storage), STORAGE_MUST_EXIST | STORAGE_CONNECT_ONCE,
                          a->experiment, &st, &exp, &s, &err) != NAS_OK)
    return cli_fail(&err);
  /* The trial's own rows, as nas serve reads them, not the whole experiment. */
  sched_results r;
  json_t *detail = NULL;
  int rc = sched_results_of_trial(st, s, &exp, a->number, &r, &err);
  if (rc == NAS_ENOTFOUND) no_such_trial(st, &exp, a->number, &err);
  if (rc == NAS_OK) {
    if ((detail = sched_trial_detail_json(st, &exp, &r, 0, &err))) {
      if (a->format == FORMAT_JSON) cli_print_json(detail);
      else print_trial_text(exp.name, s->multi_fidelity.kind != MULTI_FIDELITY_NONE, detail);
    }
    sched_results_free(&r);
  }
  int status = detail ? EXIT_DONE : cli_fail(&err);
  json_decref(detail);
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  return status;
}

int cmd_trial(int argc, char **argv) {
  trial_args a;
  int status = parse_trial_args("trial", trial_help, false, argc, argv, &a);
  if (status < 0) status = show_trial(&a);
  free(a.storage);
  return status;
}

/* ---- nas logs ---------------------------------------------------------------------------- */

/* Writes what path holds from *offset on to stdout and moves *offset to its end. A file
 * now shorter than *offset was cut short (or replaced): it is read again from its start.
 * A file that does not exist yet holds nothing. */
static int copy_new(const char *path, off_t *offset, nas_err *err) {
  int fd;
  int64_t size;
  int rc = nas_open_regular(path, &fd, &size, err);
  if (rc != NAS_OK) return rc;
  if (size < *offset) {
    fprintf(stderr, "nas: %s was truncated; reading it again from its start\n", path);
    *offset = 0;
  }
  char buf[65536];
  ssize_t got;
  while ((got = pread(fd, buf, sizeof buf, *offset)) > 0) {
    fwrite(buf, 1, (size_t)got, stdout);
    *offset += got;
  }
  int saved = errno;
  close(fd);
  fflush(stdout);
  return got < 0 ? nas_errf(err, "%s: %s", path, strerror(saved)) : NAS_OK;
}

/* The log file of the trial's current attempt. Owned; NULL when out of memory. */
static char *log_path(const experiment_row *exp, const trial_row *t, bool stderr_log) {
  char *dir = sched_run_dir(exp, t->number, t->attempts > 0 ? t->attempts : 1);
  char *path = dir ? nas_asprintf("%s/%s", dir, stderr_log ? "stderr.log" : "stdout.log") : NULL;
  free(dir);
  return path;
}

/* Waits up to seconds for SIGINT or SIGTERM (blocked by the caller); whether one came. */
static bool interrupted_within(const sigset_t *signals, double seconds) {
  struct timespec wait = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  return sigtimedwait(signals, NULL, &wait) > 0;
}

/* Prints the log of trial `id` as it grows until the trial is neither queued nor running,
 * or a signal in `signals` comes. The status is read before the log each round, so
 * everything the trial wrote before it ended is printed. */
static int follow_log(storage *st, const experiment_row *exp, int64_t id, bool stderr_log,
                      const sigset_t *signals, nas_err *err) {
  trial_row t;
  char *current = NULL;
  off_t offset = 0;
  int rc = NAS_OK;
  for (;;) {
    if ((rc = storage_trial_get(st, id, &t, err)) != NAS_OK) break;
    bool live = t.status == TRIAL_QUEUED || t.status == TRIAL_RUNNING;
    char *path = log_path(exp, &t, stderr_log);
    trial_row_clear(&t);
    if (!path) {
      rc = nas_errf(err, "out of memory");
      break;
    }
    if (current && strcmp(current, path) != 0) {
      fprintf(stderr, "nas: a new attempt: following %s\n", path);
      offset = 0;
    }
    free(current);
    current = path;
    rc = copy_new(current, &offset, err);
    if (rc == NAS_ENOTFOUND) rc = NAS_OK; /* not started yet */
    if (rc != NAS_OK || !live || interrupted_within(signals, FOLLOW_POLL_S)) break;
  }
  free(current);
  return rc;
}

static int print_log_once(const experiment_row *exp, const trial_row *t, bool stderr_log,
                          nas_err *err) {
  char *path = log_path(exp, t, stderr_log);
  off_t offset = 0;
  int rc = path ? copy_new(path, &offset, err) : nas_errf(err, "out of memory");
  if (rc == NAS_ENOTFOUND)
    nas_errf(err, "trial %d of '%s' (%s) has no %s yet", t->number, exp->name,
             trial_status_name(t->status), path);
  free(path);
  return rc;
}

/* Prints t's log once, or follows it (a->follow). */
static int print_log(storage *st, const experiment_row *exp, const trial_args *a,
                     const trial_row *t, nas_err *err) {
  if (!a->follow) return print_log_once(exp, t, a->stderr_log, err);
  /* Ctrl-C ends following between two reads, never in the middle of one. */
  sigset_t signals, before;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigprocmask(SIG_BLOCK, &signals, &before);
  int rc = follow_log(st, exp, t->id, a->stderr_log, &signals, err);
  sigprocmask(SIG_SETMASK, &before, NULL);
  return rc;
}

/* Refuses the logs of a trial that runs outside nas, in an asker's own loop: one handed
 * out by `nas ask`, or any trial of a spec that runs nothing. nas keeps no log of those,
 * and one would never come. */
static int check_logged(const experiment_row *exp, const spec *s, const trial_row *t,
                        nas_err *err) {
  if (sched_asked(t))
    return nas_errf(err, "trial %d of '%s' (%s) has no log: it was handed out by 'nas ask' "
                    "and runs outside nas, in its asker's own loop", t->number, exp->name,
                    trial_status_name(t->status));
  if (!spec_trial_runs(s))
    return nas_errf(err, "trial %d of '%s' (%s) has no log: the trials of '%s' are handed "
                    "out by 'nas ask' and run outside nas, in their askers' own loops",
                    t->number, exp->name, trial_status_name(t->status), exp->name);
  return NAS_OK;
}

static int show_logs(const trial_args *a) {
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(cli_storage_url(a->storage), STORAGE_MUST_EXIST, a->experiment, &st,
                          &exp, &s, &err) != NAS_OK)
    return cli_fail(&err);
  trial_row t;
  int rc = sched_trial_find(st, &exp, a->number, &t, &err);
  if (rc == NAS_OK) {
    rc = check_logged(&exp, s, &t, &err);
    if (rc == NAS_OK) rc = print_log(st, &exp, a, &t, &err);
    trial_row_clear(&t);
  }
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}

int cmd_logs(int argc, char **argv) {
  trial_args a;
  int status = parse_trial_args("logs", logs_help, true, argc, argv, &a);
  if (status < 0) status = show_logs(&a);
  free(a.storage);
  return status;
}
