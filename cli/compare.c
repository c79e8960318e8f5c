/* cli/compare.c: `nas compare` — several experiments' fronts and hypervolumes measured
 * against one reference point, so that the numbers can be compared (each experiment's own
 * `nas pareto` infers its own point, and hypervolumes at different points say nothing
 * about each other). The common point is what `nas pareto` would infer for one experiment
 * holding every compared trial: the thresholds where all the experiments give the same,
 * else from the union of their observed values (pareto_reference_point). An experiment compared
 * with itself therefore gets exactly its `nas pareto` hypervolume. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"

static const char compare_help[] =
    "usage: nas compare EXPERIMENT EXPERIMENT [EXPERIMENT …] [--format table|csv|json]\n"
    "                   [--storage URL]\n\n"
    "Compares experiments with the same objectives (names and goals): the hypervolume of\n"
    "each one's front at one common reference point (the objectives' thresholds where every\n"
    "experiment gives the same, else inferred from the values of all their trials, as\n"
    "'nas pareto' infers one), their front sizes, and the fronts side by side. In csv the\n"
    "rows are the fronts' trials, and the hypervolumes go to stderr.\n";

/* One compared experiment. */
typedef struct {
  experiment_row exp;
  spec *s;            /* owned */
  sched_results r;
  double *Y;          /* owned: its completed feasible trials, n × objectives (minimised) */
  size_t *idx, n;     /* owned: their positions in r */
  double hypervolume; /* at the common reference point */
  json_t *pareto;     /* owned: sched_pareto_json (its front rows) */
} compared;

static void compared_free(compared *c) {
  json_decref(c->pareto);
  free(c->Y), free(c->idx);
  if (c->s) sched_results_free(&c->r);
  spec_free(c->s);
  experiment_row_clear(&c->exp);
}

static int load_compared(storage *st, const char *url, const char *name, compared *c,
                         nas_err *err) {
  memset(c, 0, sizeof *c);
  if (cli_load_experiment(st, url, name, &c->exp, &c->s, err) != NAS_OK) return NAS_ERR;
  if (sched_results_load(st, c->s, c->exp.id, &c->r, err) != NAS_OK) {
    spec_free(c->s);
    c->s = NULL;
    return NAS_ERR;
  }
  if (sched_completed_points(c->s, &c->r, &c->Y, &c->idx, &c->n, err) != NAS_OK) return NAS_ERR;
  c->pareto = sched_pareto_json(c->s, &c->exp, &c->r, err);
  return c->pareto ? NAS_OK : NAS_ERR;
}

static const char *goal_name(objective_goal g) { return g == GOAL_MAXIMIZE ? "maximize" : "minimize"; }

/* Refuses experiments whose objectives differ from the first one's in number, name,
 * goal or order: their hypervolumes would measure different things. */
static int same_objectives(const compared *c, size_t n, nas_err *err) {
  const spec *first = c[0].s;
  for (size_t e = 1; e < n; e++) {
    const spec *s = c[e].s;
    if (s->n_objectives != first->n_objectives)
      return nas_errf(err, "'%s' has %zu objectives and '%s' %zu: only experiments with the "
                      "same objectives compare", c[0].exp.name, first->n_objectives,
                      c[e].exp.name, s->n_objectives);
    for (size_t j = 0; j < s->n_objectives; j++) {
      const objective_spec *a = &first->objectives[j], *b = &s->objectives[j];
      if (strcmp(a->name, b->name) != 0 || a->goal != b->goal)
        return nas_errf(err, "objective %zu of '%s' is %s (%s) and of '%s' %s (%s): only "
                        "experiments with the same objectives compare", j + 1, c[0].exp.name,
                        a->name, goal_name(a->goal), c[e].exp.name, b->name, goal_name(b->goal));
    }
  }
  return NAS_OK;
}

/* The common reference point (minimisation convention) into ref. */
static int common_reference(const compared *c, size_t n, double *ref, nas_err *err) {
  size_t m = c[0].s->n_objectives, total = 0;
  for (size_t e = 0; e < n; e++) total += c[e].n;
  double *Y = malloc((total ? total : 1) * m * sizeof *Y);
  objective_spec *objectives = malloc(m * sizeof *objectives);
  if (!Y || !objectives) {
    free(Y), free(objectives);
    return nas_errf(err, "out of memory");
  }
  for (size_t e = 0, at = 0; e < n; at += c[e].n * m, e++)
    memcpy(Y + at, c[e].Y, c[e].n * m * sizeof *Y);
  /* A threshold counts only when every experiment gives the same one; pareto_reference_point
   * infers the other coordinates. A shallow copy of the first spec says so. */
  memcpy(objectives, c[0].s->objectives, m * sizeof *objectives);
  for (size_t j = 0; j < m; j++)
    for (size_t e = 1; e < n; e++) {
      const objective_spec *o = &c[e].s->objectives[j];
      if (!o->has_threshold || o->threshold != objectives[j].threshold)
        objectives[j].has_threshold = false;
    }
  spec agreed = *c[0].s;
  agreed.objectives = objectives;
  pareto_reference_point(&agreed, Y, total, ref);
  free(Y), free(objectives);
  return NAS_OK;
}

/* {objective: value in its own direction} of a point in the minimisation convention. */
static json_t *point_json(const spec *s, const double *ref) {
  json_t *point = json_object();
  for (size_t j = 0; point && j < s->n_objectives; j++)
    json_object_set_new(point, s->objectives[j].name,
                        json_real(s->objectives[j].goal == GOAL_MAXIMIZE ? -ref[j] : ref[j]));
  return point;
}

/* {"reference_point", "experiments": [{experiment, trials, front_size, hypervolume, front}]} */
static json_t *comparison_json(const compared *c, size_t n, const double *ref) {
  json_t *list = json_array();
  for (size_t e = 0; list && e < n; e++) {
    const json_t *front = json_object_get(c[e].pareto, "front");
    json_array_append_new(list, json_pack("{s:s, s:i, s:i, s:f, s:O}", "experiment", c[e].exp.name,
                                          "trials", (int)c[e].r.n_trials, "front_size",
                                          (int)json_array_size(front), "hypervolume",
                                          c[e].hypervolume, "front", front));
  }
  return json_pack("{s:o, s:o}", "reference_point", point_json(c[0].s, ref), "experiments", list);
}

/* The reference point and each experiment's hypervolume, for people. */
static void print_summary(const spec *s, const json_t *out, FILE *f) {
  const json_t *ref = json_object_get(out, "reference_point"), *e;
  fprintf(f, "reference point:");
  for (size_t j = 0; j < s->n_objectives; j++)
    fprintf(f, "%s %s=%.6g", j ? "," : "", s->objectives[j].name,
            json_number_value(json_object_get(ref, s->objectives[j].name)));
  fprintf(f, "\n");
  size_t k;
  json_array_foreach(json_object_get(out, "experiments"), k, e)
    fprintf(f, "%s: %lld trials, %lld on the front, hypervolume %.6g\n",
            json_string_value(json_object_get(e, "experiment")),
            (long long)json_integer_value(json_object_get(e, "trials")),
            (long long)json_integer_value(json_object_get(e, "front_size")),
            json_number_value(json_object_get(e, "hypervolume")));
}

/* The fronts side by side: experiment, trial, each objective. */
static int fronts_table(const spec *s, const json_t *out, cli_table *t) {
  static const char *const head[] = {"experiment", "trial"};
  int rc = cli_table_init(t, head, 2);
  for (size_t j = 0; rc == NAS_OK && j < s->n_objectives; j++)
    rc = cli_table_add_column(t, s->objectives[j].name);
  size_t k, i;
  const json_t *e, *row;
  json_array_foreach(json_object_get(out, "experiments"), k, e)
    json_array_foreach(json_object_get(e, "front"), i, row) {
      json_t *cells = json_pack("[O, O]", json_object_get(e, "experiment"), json_object_get(row, "trial"));
      for (size_t j = 0; cells && j < s->n_objectives; j++)
        json_array_append(cells, json_object_get(row, s->objectives[j].name));
      if (rc == NAS_OK) rc = cells ? cli_table_add_row(t, cells) : NAS_ERR;
      else json_decref(cells);
    }
  return rc;
}

static int print_comparison(const compared *c, size_t n, const double *ref, out_format format,
                            nas_err *err) {
  json_t *out = comparison_json(c, n, ref);
  if (!out) return nas_errf(err, "out of memory");
  int rc = NAS_OK;
  if (format == FORMAT_JSON) {
    cli_print_json(out);
  } else {
    print_summary(c[0].s, out, format == FORMAT_TABLE ? stdout : stderr);
    if (format == FORMAT_TABLE) putchar('\n');
    cli_table t;
    rc = fronts_table(c[0].s, out, &t);
    if (rc == NAS_OK) cli_table_print(&t, format);
    else nas_errf(err, "out of memory");
    cli_table_free(&t);
  }
  json_decref(out);
  return rc;
}

static int compare(storage *st, const char *url, char **names, size_t n, out_format format,
                   nas_err *err) {
  compared *c = calloc(n, sizeof *c);
  size_t loaded = 0;
  int rc = c ? NAS_OK : nas_errf(err, "out of memory");
  while (rc == NAS_OK && loaded < n) {
    rc = load_compared(st, url, names[loaded], &c[loaded], err);
    loaded++; /* freed whether it loaded or not */
  }
  double *ref = rc == NAS_OK ? calloc(c[0].s->n_objectives, sizeof *ref) : NULL;
  if (rc == NAS_OK && !ref) rc = nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = same_objectives(c, n, err);
  if (rc == NAS_OK) rc = common_reference(c, n, ref, err);
  for (size_t e = 0; rc == NAS_OK && e < n; e++) {
    c[e].hypervolume = pareto_hypervolume(c[e].Y, c[e].n, c[e].s->n_objectives, ref);
    if (isnan(c[e].hypervolume)) rc = nas_errf(err, "hypervolume of '%s': out of memory", names[e]);
  }
  if (rc == NAS_OK) rc = print_comparison(c, n, ref, format, err);
  for (size_t e = 0; e < loaded; e++) compared_free(&c[e]);
  free(c), free(ref);
  return rc;
}

int cmd_compare(int argc, char **argv) {
  static const struct option options[] = {{"storage", required_argument, NULL, 's'},
                                          {"format", required_argument, NULL, 'f'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  char *url = NULL; /* owned (cli_storage_flag) */
  out_format format = FORMAT_TABLE;
  optind = 1;
  opterr = 0;
  int c, status = -1;
  while (status < 0 && (c = getopt_long(argc, argv, ":s:f:h", options, NULL)) != -1) {
    if (c == 'h') {
      fputs(compare_help, stdout);
      status = EXIT_DONE;
    } else if (c == 's') {
      free(url);
      if (!(url = cli_storage_flag(optarg))) status = cli_usage_error("compare", "out of memory");
    } else if (c == 'f') {
      if (cli_parse_format(optarg, &format) != NAS_OK)
        status = cli_usage_error("compare", "unknown format '%s' (expected table, csv or json)", optarg);
    } else {
      status = cli_option_error("compare", c, argv);
    }
  }
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
