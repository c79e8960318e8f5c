/* cli/util.c: what every command shares — error and usage messages, where storage is,
 * loading an experiment with its spec. */
#include <getopt.h>
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

int cli_load_experiment(storage *st, const char *url, const char *name, experiment_row *exp,
                        spec **s, nas_err *err) {
  *s = NULL;
  memset(exp, 0, sizeof *exp);
  int rc = storage_experiment_get(st, name, exp, err);
  if (rc == NAS_ENOTFOUND) no_such_experiment(st, url, name, err);
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

int cli_parse_metric(const char *arg, int64_t step, metric_set *set, nas_err *err) {
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

void cli_storage_hint(const char *url, char *out, size_t size) {
  out[0] = '\0';
  if (!url || strcmp(url, cli_storage_url(NULL)) == 0) return;
  char *shown = storage_url_redacted(url);
  if (!shown) return;
  /* Quoted for the shell unless every character is plainly safe. */
  bool plain = strspn(shown, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "_/:.@=-+,%") == strlen(shown) && !strchr(shown, '\'');
  snprintf(out, size, plain ? " --storage %s" : " --storage '%s'", shown);
  free(shown);
}

int cli_option_error(const char *cmd, int c, char *const argv[]) {
  /* With a leading ':' in the option string getopt says ':' for a missing value. */
  if (c == ':') return cli_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
  return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
}
