/* cli/plot.c: `nas plot` — the dashboard's experiment (or comparison) page as one HTML file
 * that opens from disk with no server: serve_plot_write inlines the page's style, Chart.js,
 * its script and the data, which is the very JSON `nas serve` answers the page with
 * (sched_dashboard_json, or `nas compare`'s), so both draw through one path. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "scheduler/scheduler.h"
#include "serve/serve.h"

static const char plot_help[] =
    "usage: nas plot EXPERIMENT [EXPERIMENT …] --out FILE.html [--kind KIND] [--storage URL]\n\n"
    "Writes the dashboard's page of an experiment as one self-contained HTML file (data,\n"
    "script and Chart.js inlined) that any browser opens from disk, with no server: the\n"
    "Pareto front, hypervolume over completed trials, each objective over trials, learning\n"
    "curves, parallel coordinates and the trial table, as 'nas serve' shows them\n"
    "(docs/dashboard.md). With two experiments or more, the page compares them: their fronts\n"
    "and hypervolumes at one common reference point, as 'nas compare'.\n\n"
    "  --out FILE.html  where to write it (replaced whole, never half-written)\n"
    "  --kind KIND      one chart only: front, hypervolume, objectives, curves, parallel,\n"
    "                   table; or compare (the default with several experiments)\n"
    "  --storage URL    default: $NAS_STORAGE, else sqlite:nas.db\n";

static const char *const kinds[] = {"front", "hypervolume", "objectives", "curves", "parallel",
                                    "table", "compare"};

static bool kind_known(const char *kind) {
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if (strcmp(kind, kinds[i]) == 0) return true;
  return false;
}

/* window.NAS_DATA for one experiment's page. */
static json_t *experiment_data(storage *st, const char *url, const char *name, const char *kind,
                               nas_err *err) {
  experiment_row exp;
  spec *s;
  sched_results r;
  if (cli_load_experiment(st, url, name, &exp, &s, err) != NAS_OK) return NULL;
  json_t *dashboard = NULL, *curves = NULL;
  if (sched_results_load(st, s, exp.id, &r, err) == NAS_OK) {
    dashboard = sched_dashboard_json(st, s, &exp, &r, err);
    if (dashboard && !(curves = sched_curves_json(st, &exp, &r, err))) {
      json_decref(dashboard);
      dashboard = NULL;
    }
    sched_results_free(&r);
  }
  spec_free(s);
  experiment_row_clear(&exp);
  if (!dashboard) return NULL;
  /* The page fetches the curves after the rest; here they come with it. A plot file is
   * mailed beyond the storage's readers: the spec, which the page never shows and whose
   * webhook URLs may be credentials, stays out of it. */
  json_object_set_new(dashboard, "curves", curves);
  json_t *summary = json_object_get(dashboard, "experiment");
  json_object_del(summary, "spec");
  json_object_del(summary, "spec_path");
  json_t *data = json_pack("{s:s, s:s?, s:o}", "page", "experiment", "kind", kind, "dashboard", dashboard);
  if (!data) nas_errf(err, "out of memory");
  return data;
}

/* Writes the page to path atomically, with the mode any file written here gets (0644 less
 * the umask): it holds no secret (the spec stays out of it, experiment_data). */
static int write_page(const char *path, const json_t *data, nas_err *err) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  int rc = f ? serve_plot_write(f, data, err) : nas_errf(err, "out of memory");
  if (f && nas_memstream_close(f, &text, rc == NAS_OK ? err : NULL) != NAS_OK) rc = NAS_ERR;
  if (rc == NAS_OK) rc = nas_write_file_atomic(path, text, len, err);
  free(text);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "cannot write %s", path);
}

static int plot(const char *url, char **names, size_t n, const char *kind, const char *out,
                nas_err *err) {
  storage *st;
  if (storage_open_with(url, STORAGE_MUST_EXIST | STORAGE_CONNECT_ONCE, &st, err) != NAS_OK) return NAS_ERR;
  json_t *data = NULL, *compared = NULL;
  if (n == 1) {
    data = experiment_data(st, url, names[0], kind, err);
  } else if (cli_compare_json(st, url, names, n, &compared, err) == NAS_OK) {
    data = json_pack("{s:s, s:o}", "page", "compare", "compare", compared);
    if (!data) nas_errf(err, "out of memory");
  }
  storage_close(st);
  int rc = data ? write_page(out, data, err) : NAS_ERR;
  json_decref(data);
  return rc;
}

/* What `nas plot` was asked for, besides the experiments. */
typedef struct {
  const char *out;  /* --out FILE.html, or NULL */
  const char *kind; /* --kind KIND, or NULL */
} plot_args;

static int take_plot_option(const char *cmd, int c, char *arg, void *ctx) {
  plot_args *a = ctx;
  if (c == 'o') {
    a->out = arg;
  } else { /* --kind */
    a->kind = arg;
    if (!kind_known(arg))
      return cli_usage_error(cmd, "unknown kind '%s' (expected front, hypervolume, objectives, "
                             "curves, parallel, table or compare)", arg);
  }
  return -1;
}

int cmd_plot(int argc, char **argv) {
  static const struct option options[] = {{"out", required_argument, NULL, 'o'},
                                          {"kind", required_argument, NULL, 'k'},
                                          {NULL, 0, NULL, 0}};
  plot_args a = {0};
  const cli_command cmd = {"plot", plot_help, options, NULL, take_plot_option, &a};
  char *url; /* owned (cli_storage_flag) */
  int status = cli_parse_options(&cmd, argc, argv, &url);
  size_t n = argc > optind ? (size_t)(argc - optind) : 0;
  bool comparing = a.kind && strcmp(a.kind, "compare") == 0;
  if (status < 0 && n == 0) status = cli_usage_error("plot", "expected an experiment");
  else if (status < 0 && !a.out) status = cli_usage_error("plot", "expected --out FILE.html");
  else if (status < 0 && comparing && n < 2) status = cli_usage_error("plot", "--kind compare needs two experiments or more");
  else if (status < 0 && !comparing && a.kind && n > 1)
    status = cli_usage_error("plot", "--kind %s draws one experiment; several make a comparison", a.kind);
  if (status >= 0) {
    free(url);
    return status;
  }
  nas_err err;
  int rc = plot(cli_storage_url(url), argv + optind, n, comparing ? NULL : a.kind, a.out, &err);
  free(url);
  if (rc != NAS_OK) return cli_fail(&err);
  fprintf(stderr, "nas plot: wrote %s\n", a.out);
  return EXIT_DONE;
}
