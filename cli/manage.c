/* cli/manage.c: `nas delete`, `nas rename`, `nas copy` and `nas enqueue` — what a person
 * does to a whole experiment between runs (the work is scheduler/manage.c's). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"

static const char delete_help[] =
    "usage: nas delete EXPERIMENT [--runs] [--yes] [--storage URL]\n\n"
    "Deletes an experiment from its storage: its trials, their metrics and its scheduler\n"
    "lease, in one transaction. Asks first, on the terminal (y or yes, in any case, deletes);\n"
    "without a terminal (a script) it refuses unless --yes is given. Refused while a\n"
    "scheduler runs the experiment.\n\n"
    "  --runs          also remove its run folders: runs/EXPERIMENT/ under the folder the\n"
    "                  experiment was first run from (symbolic links there are not followed)\n"
    "  --yes, -y       do not ask\n"
    "  --storage URL   default: $NAS_STORAGE, else sqlite:nas.db\n";

static const char rename_help[] =
    "usage: nas rename EXPERIMENT NEW_NAME [--storage URL]\n\n"
    "Renames an experiment. Its stored spec's `name:` changes with it (so a spec file with\n"
    "the new name continues it) and its run folder runs/EXPERIMENT/ becomes runs/NEW_NAME/.\n"
    "NEW_NAME follows the spec's name rule: a letter or digit, then letters, digits, '_',\n"
    "'.' or '-', at most 64 characters. Refused while a scheduler runs the experiment or a\n"
    "trial of it is running, and when NEW_NAME is taken.\n\n"
    "  --storage URL   default: $NAS_STORAGE, else sqlite:nas.db\n";

static const char copy_help[] =
    "usage: nas copy EXPERIMENT NEW_NAME [--storage URL] [--storage-to URL]\n\n"
    "Copies an experiment, with its trials (every field), their metrics and learning curves,\n"
    "into the same storage or, with --storage-to, another one (created when it is a new\n"
    "SQLite file; NEW_NAME may then be the same name). The copy's stored spec names it\n"
    "NEW_NAME; its run folders are not copied (the copy's next trials go to runs/NEW_NAME/).\n"
    "Refused while a trial of the experiment is running.\n\n"
    "  --storage URL      where EXPERIMENT is; default: $NAS_STORAGE, else sqlite:nas.db\n"
    "  --storage-to URL   where the copy goes; default: the same storage\n";

static const char enqueue_help[] =
    "usage: nas enqueue EXPERIMENT NAME=VALUE [NAME=VALUE …] [--storage URL]\n\n"
    "Queues one trial with the parameter values given: the next 'nas run' or 'nas resume'\n"
    "launches it before any suggestion of the optimizer (the next 'nas ask' hands it out\n"
    "first where the spec runs nothing), and it counts in budget.trials.\n"
    "Values are written as in YAML (3, 0.01, adam; quote text that looks like a number) and\n"
    "checked against the space: type, range, step, choices and conditions. Every active\n"
    "parameter needs a value except fixed ones, which are filled in. A configuration an\n"
    "earlier trial has is queued all the same (to measure it again), naming that trial.\n\n"
    "  --storage URL   default: $NAS_STORAGE, else sqlite:nas.db\n";

/* The options and operands of these commands. */
typedef struct {
  char *storage;    /* owned: --storage */
  char *storage_to; /* owned: --storage-to (copy) */
  bool yes, runs;   /* delete */
  char **args;      /* borrowed: the operands */
  int n_args;
} manage_args;

static void manage_args_free(manage_args *a) {
  free(a->storage);
  free(a->storage_to);
}

/* delete's --yes and --runs, copy's --storage-to (its password hidden from ps as well). */
static int take_manage_option(const char *cmd, int c, char *arg, void *ctx) {
  manage_args *a = ctx;
  if (c == 'y') {
    a->yes = true;
  } else if (c == 'r') {
    a->runs = true;
  } else { /* --storage-to */
    free(a->storage_to);
    if (!(a->storage_to = cli_storage_flag(arg))) return cli_usage_error(cmd, "out of memory");
  }
  return -1;
}

/* Reads cmd's options into a (cmd's ctx) and the operands after them. Returns -1 when the
 * command should go on, else the exit status. */
static int parse_args(const cli_command *cmd, int argc, char **argv, manage_args *a) {
  int status = cli_parse_options(cmd, argc, argv, &a->storage);
  a->args = argv + optind;
  a->n_args = argc - optind;
  return status;
}

/* What a command does to the experiment a->args[0], loaded with its spec. */
typedef int (*experiment_action)(const manage_args *a, storage *st, const experiment_row *exp,
                                 const spec *s, nas_err *err);

/* Opens the experiment named first among the operands, acts on it, and ends the command. */
static int with_experiment(const manage_args *a, experiment_action act) {
  nas_err err;
  storage *st;
  experiment_row exp;
  spec *s;
  if (cli_open_experiment(cli_storage_url(a->storage), STORAGE_MUST_EXIST, a->args[0], &st,
                          &exp, &s, &err) != NAS_OK)
    return cli_fail(&err);
  int rc = act(a, st, &exp, s, &err);
  spec_free(s);
  experiment_row_clear(&exp);
  storage_close(st);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}

/* ---- delete --------------------------------------------------------------------------- */

/* Asks on the terminal whether to delete exp; without one, refuses (a script must say
 * --yes). *go gets the answer. */
static int confirm_delete(storage *st, const experiment_row *exp, bool runs, bool *go,
                          nas_err *err) {
  *go = false;
  if (!isatty(STDIN_FILENO))
    return nas_errf(err, "not deleting '%s': no terminal to ask on; give --yes to delete "
                    "without asking", exp->name);
  trial_row *rows;
  size_t n;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK) return NAS_ERR;
  trial_rows_free(rows, n);
  fprintf(stderr, "Delete experiment '%s' with its %zu trial%s and their metrics", exp->name,
          n, n == 1 ? "" : "s");
  if (runs) fprintf(stderr, ", and the folder %s/runs/%s", exp->run_root, exp->name);
  fputs("? [y/N] ", stderr);
  char answer[16] = "";
  if (fgets(answer, sizeof answer, stdin))
    *go = strcasecmp(answer, "y\n") == 0 || strcasecmp(answer, "yes\n") == 0;
  if (!*go) fprintf(stderr, "nas: nothing deleted\n");
  return NAS_OK;
}

static int delete_experiment(const manage_args *a, storage *st, const experiment_row *exp,
                             const spec *s, nas_err *err) {
  (void)s;
  bool go = a->yes;
  int rc = go ? NAS_OK : confirm_delete(st, exp, a->runs, &go, err);
  return rc == NAS_OK && go ? sched_delete(st, exp, a->runs, stderr, err) : rc;
}

int cmd_delete(int argc, char **argv) {
  static const struct option options[] = {{"yes", no_argument, NULL, 'y'},
                                          {"runs", no_argument, NULL, 'r'},
                                          {NULL, 0, NULL, 0}};
  manage_args a = {0};
  const cli_command cmd = {"delete", delete_help, options, "y", take_manage_option, &a};
  int status = parse_args(&cmd, argc, argv, &a);
  if (status < 0 && a.n_args != 1)
    status = cli_usage_error("delete", "expected exactly one EXPERIMENT");
  if (status < 0) status = with_experiment(&a, delete_experiment);
  manage_args_free(&a);
  return status;
}

/* ---- rename --------------------------------------------------------------------------- */

static int rename_experiment(const manage_args *a, storage *st, const experiment_row *exp,
                             const spec *s, nas_err *err) {
  return sched_rename(st, s, exp, a->args[1], stderr, err);
}

int cmd_rename(int argc, char **argv) {
  manage_args a = {0};
  const cli_command cmd = {.name = "rename", .help = rename_help};
  int status = parse_args(&cmd, argc, argv, &a);
  if (status < 0 && a.n_args != 2)
    status = cli_usage_error("rename", "expected an EXPERIMENT and its NEW_NAME");
  if (status < 0) status = with_experiment(&a, rename_experiment);
  manage_args_free(&a);
  return status;
}

/* ---- copy ----------------------------------------------------------------------------- */

static int copy_experiment(const manage_args *a, storage *st, const experiment_row *exp,
                           const spec *s, nas_err *err) {
  storage *to = NULL;
  int rc = a->storage_to ? storage_open(a->storage_to, &to, err) : NAS_OK;
  if (rc == NAS_OK) rc = sched_copy(st, s, exp, to ? to : st, a->args[1], err);
  if (rc == NAS_OK) {
    char *where = a->storage_to ? storage_url_redacted(a->storage_to) : NULL;
    fprintf(stderr, "nas: copied '%s' to '%s'%s%s\n", exp->name, a->args[1],
            where ? " in " : "", where ? where : "");
    free(where);
  }
  storage_close(to);
  return rc;
}

int cmd_copy(int argc, char **argv) {
  static const struct option options[] = {{"storage-to", required_argument, NULL, 't'},
                                          {NULL, 0, NULL, 0}};
  manage_args a = {0};
  const cli_command cmd = {"copy", copy_help, options, NULL, take_manage_option, &a};
  int status = parse_args(&cmd, argc, argv, &a);
  if (status < 0 && a.n_args != 2)
    status = cli_usage_error("copy", "expected an EXPERIMENT and the NEW_NAME of its copy");
  if (status < 0) status = with_experiment(&a, copy_experiment);
  manage_args_free(&a);
  return status;
}

/* ---- enqueue -------------------------------------------------------------------------- */

static int enqueue_trial(const manage_args *a, storage *st, const experiment_row *exp,
                         const spec *s, nas_err *err) {
  json_t *params = NULL;
  trial_row row = {0};
  int rc = spec_assignment_parse(s, a->args + 1, (size_t)(a->n_args - 1), &params, err);
  if (rc != NAS_OK) nas_err_prefix(err, "experiment '%s'", exp->name);
  if (rc == NAS_OK) rc = sched_trial_enqueue(st, exp, params, &row, err);
  int twin = -1;
  trial_status twin_status = TRIAL_QUEUED;
  nas_err ignored; /* the note on a repeat is a courtesy: the trial is queued either way */
  if (rc == NAS_OK && sched_trial_twin(st, exp, params, row.number, &twin, &twin_status,
                                       &ignored) != NAS_OK)
    twin = -1;
  if (rc == NAS_OK) {
    char at[CLI_HINT_MAX];
    cli_storage_hint(cli_storage_url(a->storage), at, sizeof at);
    fprintf(stderr, "nas: trial %d of %s queued with %s; run it with: %s %s%s\n",
            row.number, exp->name, row.params_json, cli_queued_runner(s), exp->name, at);
    if (twin >= 0)
      fprintf(stderr, "(trial %d, %s, has the same parameters: this trial runs them again)\n",
              twin, trial_status_name(twin_status));
  }
  trial_row_clear(&row);
  json_decref(params);
  return rc;
}

int cmd_enqueue(int argc, char **argv) {
  manage_args a = {0};
  const cli_command cmd = {.name = "enqueue", .help = enqueue_help};
  int status = parse_args(&cmd, argc, argv, &a);
  if (status < 0 && a.n_args < 2)
    status = cli_usage_error("enqueue", "expected an EXPERIMENT and NAME=VALUE for its parameters");
  for (int i = 1; status < 0 && i < a.n_args; i++)
    if (!spec_is_assignment(a.args[i]))
      status = cli_usage_error("enqueue", "'%s' is not NAME=VALUE", a.args[i]);
  if (status < 0) status = with_experiment(&a, enqueue_trial);
  manage_args_free(&a);
  return status;
}
