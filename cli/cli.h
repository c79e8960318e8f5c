/* cli: the `nas` command. Each command is a function taking its own argv; only this
 * folder decides how a process ends and what goes to stdout. Exit codes (docs/cli.md):
 * 0 done, 1 failed, 2 bad usage, 3 interrupted (resume continues it), 4 stopped because
 * too many trials failed. */
#ifndef NAS_CLI_H
#define NAS_CLI_H

#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"
#include "metrics/metrics.h"
#include "scheduler/scheduler.h"
#include "spec/spec.h"
#include "storage/storage.h"

enum {
  EXIT_DONE = 0,
  EXIT_FAILED = 1,
  EXIT_USAGE = 2,
  EXIT_INTERRUPTED = 3,   /* a signal or `nas stop`; `nas resume` continues */
  EXIT_TOO_MANY_FAILURES = 4,
};

int cmd_run(int argc, char **argv);
int cmd_resume(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_trials(int argc, char **argv);
int cmd_pareto(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_retry(int argc, char **argv);
int cmd_enqueue(int argc, char **argv);
int cmd_delete(int argc, char **argv);
int cmd_rename(int argc, char **argv);
int cmd_copy(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_create(int argc, char **argv);
int cmd_ask(int argc, char **argv);
int cmd_tell(int argc, char **argv);
int cmd_trial(int argc, char **argv);
int cmd_logs(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_plot(int argc, char **argv);

/* Prints "nas: message" to stderr and returns EXIT_FAILED. */
int cli_fail(const nas_err *err);
/* Prints "nas CMD: message\nTry 'nas CMD --help'." and returns EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A command's own option c (its code in the command's tables) with its value arg (NULL for
 * a flag), taken into ctx; cmd names the command for messages. Returns -1 to go on, else
 * the exit status (a usage error). */
typedef int (*cli_take_option)(const char *cmd, int c, char *arg, void *ctx);

/* How a command reads its options: its own, and --storage URL and --help (-h), which every
 * command takes. A short option is one its --help names (tests/test_e2e.c checks). */
typedef struct {
  const char *name;             /* "ask": what usage errors name */
  const char *help;             /* what --help prints */
  const struct option *options; /* its own long options, {NULL}-terminated; NULL: none */
  const char *letters;          /* its own short options as getopt spells them ("n:"); NULL: none */
  cli_take_option take;         /* takes its own options; NULL when it has none */
  void *ctx;                    /* handed to take */
} cli_command;

/* Reads argv's options as getopt_long does (options may follow the operands, which it
 * leaves from argv[optind] on): --help prints cmd->help on stdout and ends the command
 * with EXIT_DONE; --storage URL sets *storage (owned, cli_storage_flag; a later one
 * replaces it); an unknown option, or one without its value, is a usage error; the
 * command's own go to cmd->take, in order. Returns -1 when the command should go on, else
 * its exit status; *storage (NULL when not given) is to be freed either way. */
int cli_parse_options(const cli_command *cmd, int argc, char **argv, char **storage);

/* The value of --storage (arg: optarg, inside this process's argv), owned. A password in
 * it is overwritten with '*' in argv itself, so that `ps` shows this process, and every
 * trial monitor it forks, without it, and a warning says where to keep it instead; the
 * copy returned keeps it. NULL when out of memory. */
char *cli_storage_flag(char *arg);
/* The storage URL for commands that name an experiment: --storage, else NAS_STORAGE,
 * else sqlite:nas.db. flag may be NULL. Borrowed. */
const char *cli_storage_url(const char *flag);
/* The storage URL for commands that store a spec's experiment (`nas run`, `nas create`):
 * --storage, else NAS_STORAGE, else the spec's own `storage:` (sqlite:nas.db when it has
 * none). Borrowed. */
const char *cli_spec_storage_url(const char *flag, const spec *s);
/* Opens storage as flags say (storage_open_with: every command but `nas run` gives
 * STORAGE_MUST_EXIST) and loads the named experiment with its spec (parsed from the
 * stored text). */
int cli_open_experiment(const char *url, unsigned flags, const char *name, storage **st,
                        experiment_row *exp, spec **s, nas_err *err);
/* The experiment row of that name in st (url: how it was named, for messages); a name not
 * there is an error naming the storage, with a did-you-mean when one is near. */
int cli_get_experiment(storage *st, const char *url, const char *name, experiment_row *exp,
                       nas_err *err);
/* The same in storage already open (url: how it was named, for messages). */
int cli_load_experiment(storage *st, const char *url, const char *name, experiment_row *exp,
                        spec **s, nas_err *err);
/* `nas compare`'s answer for experiments names[0..n) (cli/compare.c): sched_compare_json of
 * them, loaded from st (url: how it was named, for messages). *out owned. */
int cli_compare_json(storage *st, const char *url, char *const *names, size_t n, json_t **out,
                     nas_err *err);
/* The experiment with that id (NAS_ENOTFOUND when none). */
int cli_experiment_by_id(storage *st, int64_t id, experiment_row *out, nas_err *err);

/* The " --storage URL" a printed hint ("continue with: nas resume X") needs for a command
 * to find url again: "" when url is where commands look anyway ($NAS_STORAGE, else
 * sqlite:nas.db); a password shows masked. Written into out. */
enum { CLI_HINT_MAX = 1200 };
void cli_storage_hint(const char *url, char *out, size_t size);
/* The command that runs the queued trials of an experiment of spec s, for hints: "nas
 * resume" when its trials run a command or a built-in, else "nas ask" (which hands queued
 * trials out first; `nas resume` refuses a spec that runs nothing). */
const char *cli_queued_runner(const spec *s);
/* text as one word of a shell command in a printed hint: as it is when every character is
 * plainly safe, else quoted (nas_shell_quote). Owned; NULL when out of memory. */
char *cli_shell_word(const char *text);

/* Parses NAME=VALUE into set at step (METRIC_FINAL for final values), read and checked as
 * a metric line's values are (metric_value_parse: a JSON number), each NAME once, "step"
 * none of them. */
int cli_parse_metric(const char *arg, int64_t step, metric_set *set, nas_err *err);
/* Whether text is a whole number from low to high (into *out). */
bool cli_parse_count(const char *text, long low, long high, long *out);
/* A trial number operand (0, 1, …) into number: -1 to go on, else the usage error. */
int cli_trial_number(const char *cmd, const char *text, int *number);
/* --step N of `nas report` and `nas tell` (metric_step_check's) into step: -1 to go on,
 * else the usage error. */
int cli_step_option(const char *cmd, const char *arg, long long *step);

/* A hypervolume of `nas pareto`/`nas compare` JSON: null there stands for one past the
 * largest double (sched_json_number), shown as inf. */
double cli_hypervolume(const json_t *value);
/* Prints " NAME=VALUE" (6 significant digits), comma-separated, of the reference point ref
 * for each of objectives ([{"name", "goal"}], as in compare's JSON); the caller ends the
 * line. An objective whose point is inferred has none before a trial is on the front (the
 * JSON leaves it out): it shows as "NAME=?", with a note saying so. */
void cli_print_reference_point(FILE *f, const json_t *ref, const json_t *objectives);

/* Output of rows in one of three formats: an aligned table, CSV, or a JSON array. */
typedef enum { FORMAT_TABLE, FORMAT_CSV, FORMAT_JSON } out_format;
int cli_parse_format(const char *text, out_format *out);
/* --format's value for a command that takes all three: -1 to go on, else the usage error
 * naming a format it does not know. */
int cli_format_option(const char *cmd, const char *arg, out_format *out);

typedef struct {
  char **columns;  /* owned names */
  size_t n_columns;
  json_t *rows;    /* owned JSON array of arrays, n_columns cells each (null = empty) */
} cli_table;

int cli_table_init(cli_table *t, const char *const *columns, size_t n);
int cli_table_add_column(cli_table *t, const char *name);
/* Appends a row (steals the reference to row, a JSON array). */
int cli_table_add_row(cli_table *t, json_t *row);
void cli_table_print(const cli_table *t, out_format format);
void cli_table_free(cli_table *t);
/* The rows `nas trials` shows: trial, status, each parameter, each metric, the reference
 * point (with several objectives), the error; with timings also created_at, started_at,
 * finished_at (Unix seconds) and duration_s (`nas export --format csv --with timings`). */
int cli_trials_table(const spec *s, const sched_results *r, out_format format, bool timings,
                     cli_table *t);
/* text as a table or text view shows it (owned; NULL without memory): a string a client
 * stored (an error, a metric's name, a worker) may hold any character, and a newline would
 * start a false row or line and an escape sequence drive the terminal, so each control
 * character is written as \n, \t or \xHH, and each C1 control and direction override as
 * \uHHHH. JSON and CSV keep text exact. */
char *cli_text_shown(const char *text);
/* A JSON value on stdout as every --format json prints one: indented, exact numbers. */
void cli_print_json(const json_t *value);
/* Unix seconds as "2026-11-23T05:03:35Z" into buf (cap >= 21 bytes). */
void cli_format_time(double unix_s, char *buf, size_t cap);

#endif
