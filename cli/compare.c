/* cli/compare.c: `nas compare` — several experiments' fronts and hypervolumes measured
 * against one common reference point (worked out by sched_compare_json, scheduler/compare.c,
 * which `nas serve` and the dashboard use too), printed as a table, CSV or JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"

static const char compare_help[] =
    "usage: nas compare EXPERIMENT EXPERIMENT [EXPERIMENT …] [--format table|csv|json]\n"
    "                   [--storage URL]\n\n"
    "Compares experiments with the same objectives (names and goals): the hypervolume of\n"
    "each one's front at one common reference point (the objectives' thresholds where every\n"
    "experiment gives the same, else inferred from the values of all their trials, as\n"
    "'nas pareto' infers one), their front sizes, and the fronts side by side. In csv the\n"
    "rows are the fronts' trials, and the hypervolumes go to stderr.\n";

/* One compared experiment, as loaded. */
typedef struct {
  experiment_row exp;
  spec *s;            /* owned */
  sched_results r;
} compared;

static void compared_free(compared *c) {
  if (c->s) sched_results_free(&c->r);
  spec_free(c->s);
  experiment_row_clear(&c->exp);
}

static int load_compared(storage *st, const char *url, const char *name, compared *c,
                         nas_err *err) {
  memset(c, 0, sizeof *c);
  if (cli_load_experiment(st, url, name, &c->exp, &c->s, err) != NAS_OK) return NAS_ERR;
  if (sched_results_load(st, c->s, c->exp.id, &c->r, err) == NAS_OK) return NAS_OK;
  spec_free(c->s);
  c->s = NULL;
  return NAS_ERR;
}

/* The reference point and each experiment's hypervolume, for people. */
static void print_summary(const json_t *out, FILE *f) {
  const json_t *ref = json_object_get(out, "reference_point"), *e;
  fprintf(f, "reference point:");
  cli_print_reference_point(f, ref, json_object_get(out, "objectives"));
  fprintf(f, "\n");
  size_t k;
  json_array_foreach(json_object_get(out, "experiments"), k, e)
    fprintf(f, "%s: %lld trials, %lld on the front, hypervolume %.6g\n",
            json_string_value(json_object_get(e, "experiment")),
            (long long)json_integer_value(json_object_get(e, "trials")),
            (long long)json_integer_value(json_object_get(e, "front_size")),
            cli_hypervolume(json_object_get(e, "hypervolume")));
}

/* The fronts side by side: experiment, trial, each objective. */
static int fronts_table(const json_t *out, cli_table *t) {
  static const char *const head[] = {"experiment", "trial"};
  const json_t *objectives = json_object_get(out, "objectives"), *e, *row, *o;
  int rc = cli_table_init(t, head, 2);
  size_t k, i, j;
  json_array_foreach(objectives, j, o)
    if (rc == NAS_OK) rc = cli_table_add_column(t, json_string_value(json_object_get(o, "name")));
  json_array_foreach(json_object_get(out, "experiments"), k, e)
    json_array_foreach(json_object_get(e, "front"), i, row) {
      json_t *cells = json_pack("[O, O]", json_object_get(e, "experiment"), json_object_get(row, "trial"));
      json_array_foreach(objectives, j, o)
        if (cells) json_array_append(cells, json_object_get(row, json_string_value(json_object_get(o, "name"))));
      if (rc == NAS_OK) rc = cells ? cli_table_add_row(t, cells) : NAS_ERR;
      else json_decref(cells);
    }
  return rc;
}

static int print_comparison(const json_t *out, out_format format, nas_err *err) {
  if (format == FORMAT_JSON) {
    cli_print_json(out);
    return NAS_OK;
  }
  print_summary(out, format == FORMAT_TABLE ? stdout : stderr);
  if (format == FORMAT_TABLE) putchar('\n');
  cli_table t;
  int rc = fronts_table(out, &t);
  if (rc == NAS_OK) cli_table_print(&t, format);
  else nas_errf(err, "out of memory");
  cli_table_free(&t);
  return rc;
}

int cli_compare_json(storage *st, const char *url, char *const *names, size_t n, json_t **out,
                     nas_err *err) {
  compared *c = calloc(n, sizeof *c);
  sched_compared *view = calloc(n, sizeof *view);
  size_t loaded = 0;
  int rc = c && view ? NAS_OK : nas_errf(err, "out of memory");
  while (rc == NAS_OK && loaded < n) {
    rc = load_compared(st, url, names[loaded], &c[loaded], err);
    view[loaded] = (sched_compared){&c[loaded].exp, c[loaded].s, &c[loaded].r};
    loaded++; /* freed whether it loaded or not */
  }
  *out = rc == NAS_OK ? sched_compare_json(view, n, err) : NULL;
  for (size_t e = 0; e < loaded; e++) compared_free(&c[e]);
  free(c), free(view);
  return *out ? NAS_OK : NAS_ERR;
}

static int compare(storage *st, const char *url, char **names, size_t n, out_format format,
                   nas_err *err) {
  json_t *out;
  if (cli_compare_json(st, url, names, n, &out, err) != NAS_OK) return NAS_ERR;
  int rc = print_comparison(out, format, err);
  json_decref(out);
  return rc;
}

static int take_compare_option(const char *cmd, int c, char *arg, void *ctx) {
  (void)c; /* --format, its only own option */
  return cli_format_option(cmd, arg, ctx);
}

int cmd_compare(int argc, char **argv) {
  static const struct option options[] = {{"format", required_argument, NULL, 'f'},
                                          {NULL, 0, NULL, 0}};
  out_format format = FORMAT_TABLE;
  const cli_command cmd = {"compare", compare_help, options, NULL, take_compare_option, &format};
  char *url; /* owned (cli_storage_flag) */
  int status = cli_parse_options(&cmd, argc, argv, &url);
  if (status < 0 && argc - optind < 2)
    status = cli_usage_error("compare", "expected two experiments or more");
  if (status >= 0) {
    free(url);
    return status;
  }
  nas_err err;
  storage *st;
  const char *where = cli_storage_url(url);
  int rc = storage_open_with(where, STORAGE_MUST_EXIST | STORAGE_CONNECT_ONCE, &st, &err);
  if (rc == NAS_OK) {
    rc = compare(st, where, argv + optind, (size_t)(argc - optind), format, &err);
    storage_close(st);
  }
  free(url);
  return rc == NAS_OK ? EXIT_DONE : cli_fail(&err);
}
