/* cli/util.c: what every command shares — reading its options, error and usage messages,
 * where storage is, loading an experiment with its spec. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "metrics/metrics.h"
#include "scheduler/scheduler.h"

int cli_fail(const nas_err *err) {
  fprintf(stderr, "nas: %s\n", err->msg);
  return EXIT_FAILED;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "nas %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nTry 'nas %s --help'.\n", cmd);
  va_end(ap);
  return EXIT_USAGE;
}

char *cli_storage_flag(char *arg) {
  char *url = strdup(arg);
  if (url && storage_url_mask(arg))
    fprintf(stderr, "nas: warning: the password in --storage was visible to every user of "
                    "this machine (ps); keep it in ~/.pgpass (or $PGPASSFILE), or give the "
                    "URL in $NAS_STORAGE\n");
  return url;
}

const char *cli_storage_url(const char *flag) {
  if (flag) return flag;
  const char *env = getenv("NAS_STORAGE");
  return env && *env ? env : STORAGE_DEFAULT_URL;
}

const char *cli_spec_storage_url(const char *flag, const spec *s) {
  const char *env = getenv("NAS_STORAGE");
  return flag ? flag : env && *env ? env : s->storage;
}

/* The experiment name nearest to name when it is a likely typo, else NULL; owned. */
static char *nearest_experiment(storage *st, const char *name) {
  experiment_row *rows;
  size_t n;
  nas_err ignored;
  if (storage_experiment_list(st, &rows, &n, &ignored) != NAS_OK) return NULL;
  const char **names = calloc(n ? n : 1, sizeof *names);
  for (size_t i = 0; names && i < n; i++) names[i] = rows[i].name;
  const char *best = names ? nas_nearest(name, names, n) : NULL;
  char *found = best ? strdup(best) : NULL;
  free(names);
  experiment_rows_free(rows, n);
  return found;
}

static void no_such_experiment(storage *st, const char *url, const char *name, nas_err *err) {
  char *shown = storage_url_redacted(url), *hint = nearest_experiment(st, name);
  nas_errf(err, "no experiment '%s' in %s%s%s%s (see 'nas status' for the ones there)", name,
           shown ? shown : "storage", hint ? "; did you mean '" : "", hint ? hint : "",
           hint ? "'?" : "");
  free(shown);
  free(hint);
}

int cli_get_experiment(storage *st, const char *url, const char *name, experiment_row *exp,
                       nas_err *err) {
  int rc = storage_experiment_get(st, name, exp, err);
  if (rc != NAS_ENOTFOUND) return rc;
  no_such_experiment(st, url, name, err);
  return NAS_ERR;
}

int cli_load_experiment(storage *st, const char *url, const char *name, experiment_row *exp,
                        spec **s, nas_err *err) {
  *s = NULL;
  memset(exp, 0, sizeof *exp);
  int rc = cli_get_experiment(st, url, name, exp, err);
  if (rc == NAS_OK) rc = sched_experiment_spec(exp, s, err);
  if (rc == NAS_OK) return NAS_OK;
  experiment_row_clear(exp);
  return NAS_ERR;
}

int cli_open_experiment(const char *url, unsigned flags, const char *name, storage **st,
                        experiment_row *exp, spec **s, nas_err *err) {
  *st = NULL;
  *s = NULL;
  memset(exp, 0, sizeof *exp);
  if (storage_open_with(url, flags, st, err) != NAS_OK) return NAS_ERR;
  if (cli_load_experiment(*st, url, name, exp, s, err) == NAS_OK) return NAS_OK;
  storage_close(*st);
  *st = NULL;
  return NAS_ERR;
}

/* The two checks a line's names get from its JSON object: no name twice, and "step" is
 * the step (--step here), not a metric. */
static int metric_arg_check(const char *name, const metric_set *set, nas_err *err) {
  if (strcmp(name, "step") == 0)
    return nas_errf(err, "'step' is not a metric name: give the step with --step N");
  for (size_t i = 0; i < set->n; i++)
    if (strcmp(set->obs[i].name, name) == 0)
      return nas_errf(err, "metric \"%s\" is given twice", name);
  return NAS_OK;
}

int cli_parse_metric(const char *arg, int64_t step, metric_set *set, nas_err *err) {
  if (!spec_is_assignment(arg)) return nas_errf(err, "'%s' is not NAME=VALUE", arg);
  const char *eq = strchr(arg, '=');
  char *name = strndup(arg, (size_t)(eq - arg));
  if (!name) return nas_errf(err, "out of memory");
  double value;
  int rc = metric_arg_check(name, set, err);
  if (rc == NAS_OK) rc = metric_value_parse(name, eq + 1, &value, err);
  if (rc == NAS_OK) rc = metric_set_add(set, name, step, value, nas_now(), err);
  free(name);
  return rc;
}

bool cli_parse_count(const char *text, long low, long high, long *out) {
  char *end;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || end == text || *end || value < low || value > high) return false;
  *out = value;
  return true;
}

int cli_trial_number(const char *cmd, const char *text, int *number) {
  long value;
  if (!cli_parse_count(text, 0, INT_MAX, &value))
    return cli_usage_error(cmd, "'%s' is not a trial number", text);
  *number = (int)value;
  return -1;
}

int cli_step_option(const char *cmd, const char *arg, long long *step) {
  char *end;
  errno = 0;
  *step = strtoll(arg, &end, 10);
  bool integer = errno == 0 && end != arg && *end == '\0';
  nas_err err; /* a long long past 2^53 becomes a double of at least 2^53: still refused */
  if (metric_step_check(integer ? (double)*step : NAN, &err) == NAS_OK) return -1;
  return cli_usage_error(cmd, "--step '%s': %s", arg, err.msg);
}

int cli_experiment_by_id(storage *st, int64_t id, experiment_row *out, nas_err *err) {
  experiment_row *rows;
  size_t n;
  if (storage_experiment_list(st, &rows, &n, err) != NAS_OK) return NAS_ERR;
  int rc = nas_errc(err, NAS_ENOTFOUND, "no experiment with id %lld", (long long)id);
  for (size_t i = 0; i < n && rc != NAS_OK; i++) {
    if (rows[i].id != id) continue;
    *out = rows[i];
    memset(&rows[i], 0, sizeof rows[i]); /* moved to out */
    rc = NAS_OK;
  }
  experiment_rows_free(rows, n);
  return rc;
}

const char *cli_queued_runner(const spec *s) {
  return spec_trial_runs(s) ? "nas resume" : "nas ask";
}

char *cli_shell_word(const char *text) {
  bool plain = *text && strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_/:.@=-+,%") == strlen(text);
  return plain ? strdup(text) : nas_shell_quote(text);
}

void cli_storage_hint(const char *url, char *out, size_t size) {
  out[0] = '\0';
  if (!url || strcmp(url, cli_storage_url(NULL)) == 0) return;
  char *shown = storage_url_redacted(url);
  char *word = shown ? cli_shell_word(shown) : NULL;
  if (word) snprintf(out, size, " --storage %s", word);
  free(word);
  free(shown);
}

/* Whether word is "--NAME=VALUE" for a long option of options that takes no value and
 * stands for letter (getopt_long's optopt then; NAME may be abbreviated, as it accepts). */
static bool value_given_to_flag(const char *word, int letter, const struct option *options) {
  const char *eq = strchr(word, '=');
  if (strncmp(word, "--", 2) != 0 || !eq) return false;
  size_t len = (size_t)(eq - word - 2);
  for (const struct option *o = options; o->name; o++)
    if (strncmp(o->name, word + 2, len) == 0 && o->has_arg == no_argument && o->val == letter)
      return true;
  return false;
}

/* The usage error for what getopt_long returned as c for an option it did not take: a
 * missing value (c == ':', with a leading ':' in the option string), a value given to a
 * long option that takes none ('--yes=no': optopt is that option's letter), or an unknown
 * option. An unknown letter is named by itself (optopt): inside a group such as '-xy',
 * optind has not yet moved past the group, so argv[optind - 1] would be the word before it. */
static int option_error(const char *cmd, int c, char *const argv[], const struct option *options) {
  const char *word = argv[optind - 1];
  if (c == ':') return cli_usage_error(cmd, "option '%s' needs a value", word);
  if (optopt && value_given_to_flag(word, optopt, options))
    return cli_usage_error(cmd, "option '%.*s' takes no value", (int)strcspn(word, "="), word);
  if (optopt) return cli_usage_error(cmd, "unknown option '-%c'", optopt);
  return cli_usage_error(cmd, "unknown option '%s'", word);
}

/* cmd's long options: --storage and --help, then its own. Owned; NULL when out of memory. */
static struct option *long_options(const cli_command *cmd) {
  size_t n = 0;
  while (cmd->options && cmd->options[n].name) n++;
  struct option *all = calloc(n + 3, sizeof *all); /* the zeroed last one ends the table */
  if (!all) return NULL;
  all[0] = (struct option){"storage", required_argument, NULL, 's'};
  all[1] = (struct option){"help", no_argument, NULL, 'h'};
  if (n) memcpy(all + 2, cmd->options, n * sizeof *all);
  return all;
}

static int take_storage(const char *cmd, char *arg, char **storage) {
  free(*storage);
  *storage = cli_storage_flag(arg);
  return *storage ? -1 : cli_usage_error(cmd, "out of memory");
}

int cli_parse_options(const cli_command *cmd, int argc, char **argv, char **storage) {
  *storage = NULL;
  struct option *options = long_options(cmd);
  /* The leading ':' makes getopt say ':' for a missing value, apart from '?'. */
  char *letters = nas_asprintf(":h%s", cmd->letters ? cmd->letters : "");
  int c, status = options && letters ? -1 : cli_usage_error(cmd->name, "out of memory");
  optind = 1;
  opterr = 0; /* the messages are ours */
  while (status < 0 && (c = getopt_long(argc, argv, letters, options, NULL)) != -1) {
    if (c == 'h') status = (fputs(cmd->help, stdout), EXIT_DONE);
    else if (c == 's') status = take_storage(cmd->name, optarg, storage);
    else if (c == ':' || c == '?' || !cmd->take) status = option_error(cmd->name, c, argv, options);
    else status = cmd->take(cmd->name, c, optarg, cmd->ctx);
  }
  free(options);
  free(letters);
  return status;
}

int cli_format_option(const char *cmd, const char *arg, out_format *out) {
  if (cli_parse_format(arg, out) == NAS_OK) return -1;
  return cli_usage_error(cmd, "unknown format '%s' (expected table, csv or json)", arg);
}

double cli_hypervolume(const json_t *value) {
  return json_is_null(value) ? HUGE_VAL : json_number_value(value);
}

void cli_print_reference_point(FILE *f, const json_t *ref, const json_t *objectives) {
  bool inferred_later = false;
  size_t j;
  const json_t *objective;
  json_array_foreach(objectives, j, objective) {
    const char *name = json_string_value(json_object_get(objective, "name"));
    const json_t *value = json_object_get(ref, name);
    fprintf(f, "%s %s=", j ? "," : "", name);
    if (value) {
      fprintf(f, "%.6g", json_number_value(value));
    } else {
      fputc('?', f);
      inferred_later = true;
    }
  }
  if (inferred_later) fprintf(f, "; ? is inferred once a trial is on the front");
}
