/* bench/bench_optimizer.c: optimiser quality and cost for `nas` (BENCH.md section 1).
 *
 *   bench_optimizer run [--seeds N] [--q LIST] [--methods LIST] [--problems LIST]
 *                       [--gp-options ", key: value…"]
 *       runs nas's optimizers on the benchmark problems and prints CSV rows
 *       `problem,q,method,seed,evals,hv` (hypervolume of the first `evals` evaluations,
 *       evals = 10, 20, …, 50) to stdout;
 *   bench_optimizer timing [--sizes LIST] [--repeats N]
 *       times one gp suggestion (q = 1) after N random observations of DTLZ2 (M = 2, d = 6);
 *   bench_optimizer table FILE…
 *       reads such CSV files (nas's and Optuna's) and prints log10(max HV − HV), mean ± std
 *       over seeds, per problem, q and method at each checkpoint.
 *
 * Problems follow botorch.test_functions.multi_objective; all objectives are minimised.
 * Protocol: 2(d+1) Sobol points (gp's n_initial), then the method up to 50 evaluations,
 * sequentially (q = 1) or in batches (q = 4); seeds 0..N−1 as spec.seed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gsl/gsl_rng.h>

#include "optimizer/optimizer.h"

enum { BUDGET = 50, CHECK_EVERY = 10, MAX_M = 3, MAX_D = 6 };

typedef struct {
  const char *name;
  size_t d, m;
  double ref[MAX_M];
  double max_hv;
  void (*eval)(const double *x, double *f);
} problem;

static void branin_currin(const double *x, double *f) {
  double u = 15 * x[0] - 5, v = 15 * x[1];
  double t = v - 5.1 / (4 * M_PI * M_PI) * u * u + 5 / M_PI * u - 6;
  f[0] = t * t + 10 * (1 - 1 / (8 * M_PI)) * cos(u) + 10;
  double a = x[0], factor = 1 - exp(-1 / (2 * x[1]));
  f[1] = factor * (2300 * a * a * a + 1900 * a * a + 2092 * a + 60) /
         (100 * a * a * a + 500 * a * a + 4 * a + 20);
}

static void zdt1(const double *x, double *f) {
  double s = 0;
  for (size_t i = 1; i < 6; i++) s += x[i];
  double g = 1 + 9 * s / 5;
  f[0] = x[0];
  f[1] = g * (1 - sqrt(x[0] / g));
}

/* DTLZ2 with M objectives over d = 6: g over the last d − M + 1 inputs. */
static void dtlz2(const double *x, double *f, size_t m) {
  double g = 0;
  for (size_t i = m - 1; i < 6; i++) g += (x[i] - 0.5) * (x[i] - 0.5);
  for (size_t j = 0; j < m; j++) {
    double v = 1 + g;
    for (size_t i = 0; i + 1 < m - j; i++) v *= cos(x[i] * M_PI / 2);
    if (j > 0) v *= sin(x[m - 1 - j] * M_PI / 2);
    f[j] = v;
  }
}

static void dtlz2_m2(const double *x, double *f) { dtlz2(x, f, 2); }
static void dtlz2_m3(const double *x, double *f) { dtlz2(x, f, 3); }

static const problem problems[] = {
    {"BraninCurrin", 2, 2, {18, 6}, 59.36011874867746, branin_currin},
    {"ZDT1", 6, 2, {11, 11}, 120 + 2.0 / 3, zdt1},
    {"DTLZ2_M2", 6, 2, {1.1, 1.1}, 1.21 - M_PI / 4, dtlz2_m2},
    {"DTLZ2_M3", 6, 3, {1.1, 1.1, 1.1}, 1.331 - M_PI / 6, dtlz2_m3},
};
enum { n_problems = sizeof problems / sizeof problems[0] };

/* ---- one optimisation run --------------------------------------------------------------- */

/* Method "gp-ref" is gp told the reference point as the objectives' thresholds; gp_extra
 * (e.g. ", kernel: rbf") is appended to gp's options. */
static char *problem_yaml(const problem *p, const char *method, long seed, const char *gp_extra) {
  char params[512] = "", objectives[512] = "", options[128] = "";
  bool with_ref = strcmp(method, "gp-ref") == 0;
  const char *type = with_ref ? "gp" : method;
  for (size_t i = 0; i < p->d; i++) {
    size_t used = strlen(params);
    snprintf(params + used, sizeof params - used, "  x%zu: {type: float, low: 0, high: 1}\n", i);
  }
  for (size_t j = 0; j < p->m; j++) {
    size_t used = strlen(objectives);
    char threshold[48] = "";
    if (with_ref) snprintf(threshold, sizeof threshold, ", threshold: %.17g", p->ref[j]);
    snprintf(objectives + used, sizeof objectives - used, "  - {name: f%zu, goal: minimize%s}\n",
             j, threshold);
  }
  if (strcmp(type, "gp") == 0)
    snprintf(options, sizeof options, ", n_initial: %zu%s", 2 * (p->d + 1),
             gp_extra ? gp_extra : "");
  return nas_asprintf("name: bench\nseed: %ld\nparameters:\n%sobjectives:\n%s"
                      "trial: {command: [x]}\nbudget: {trials: %d}\n"
                      "optimizer: {type: %s%s}\n",
                      seed, params, objectives, BUDGET, type, options);
}

typedef struct {
  spec *s;
  optimizer *opt;
  size_t n;
  json_t *params[BUDGET];
  double Y[BUDGET * MAX_M];
} run_state;

static int run_open(run_state *r, const problem *p, const char *method, long seed,
                    const char *gp_extra, nas_err *err) {
  memset(r, 0, sizeof *r);
  char *yaml = problem_yaml(p, method, seed, gp_extra);
  int rc = yaml ? spec_parse(yaml, "<bench>", "/tmp", &r->s, err) : nas_errf(err, "out of memory");
  free(yaml);
  return rc < 0 ? rc : optimizer_create(r->s, &r->opt, err);
}

static void run_close(run_state *r) {
  for (size_t i = 0; i < r->n; i++) json_decref(r->params[i]);
  optimizer_free(r->opt);
  spec_free(r->s);
}

static void evaluate(const problem *p, const json_t *params, double *f) {
  double x[MAX_D];
  for (size_t i = 0; i < p->d; i++) {
    char name[16];
    snprintf(name, sizeof name, "x%zu", i);
    x[i] = json_number_value(json_object_get(params, name));
  }
  p->eval(x, f);
}

static int run_batch(run_state *r, const problem *p, size_t q, nas_err *err) {
  observation obs[BUDGET];
  for (size_t i = 0; i < r->n; i++) obs[i] = (observation){r->params[i], r->Y + i * p->m, NULL};
  json_t *out[BUDGET];
  if (optimizer_suggest(r->opt, obs, r->n, NULL, 0, q, (int)r->n, out, NULL, err) < 0) return NAS_ERR;
  for (size_t i = 0; i < q; i++) {
    evaluate(p, out[i], r->Y + r->n * p->m);
    r->params[r->n++] = out[i];
  }
  return NAS_OK;
}

/* Batches of q after the initial design, which is asked for as one batch for every method
 * (gp's design is the sobol optimizer's, so the start is the same for both). */
static int run_one(const problem *p, const char *method, long seed, size_t q,
                   const char *gp_extra, nas_err *err) {
  run_state r;
  int rc = run_open(&r, p, method, seed, gp_extra, err);
  size_t n_init = 2 * (p->d + 1);
  while (rc == NAS_OK && r.n < BUDGET) {
    size_t k = r.n < n_init ? n_init - r.n : q;
    if (k > BUDGET - r.n) k = BUDGET - r.n;
    rc = run_batch(&r, p, k, err);
  }
  for (size_t evals = CHECK_EVERY; rc == NAS_OK && evals <= BUDGET; evals += CHECK_EVERY)
    printf("%s,%zu,%s,%ld,%zu,%.12g\n", p->name, q, method, seed, evals,
           pareto_hypervolume(r.Y, evals, p->m, p->ref));
  fflush(stdout);
  run_close(&r);
  return rc;
}

/* ---- command lines ---------------------------------------------------------------------- */

static bool listed(const char *list, const char *item) {
  if (!list) return true;
  size_t len = strlen(item);
  for (const char *at = list; (at = strstr(at, item)); at += len)
    if ((at == list || at[-1] == ',') && (at[len] == ',' || at[len] == '\0')) return true;
  return false;
}

static const char *flag(int argc, char **argv, const char *name) {
  for (int i = 2; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return NULL;
}

static int cmd_run(int argc, char **argv) {
  const char *seeds_arg = flag(argc, argv, "--seeds"), *qs = flag(argc, argv, "--q");
  const char *methods = flag(argc, argv, "--methods"), *names = flag(argc, argv, "--problems");
  const char *gp_extra = flag(argc, argv, "--gp-options");
  long seeds = seeds_arg ? atol(seeds_arg) : 10;
  const char *all_methods[] = {"gp", "gp-ref", "sobol", "random"};
  const size_t q_values[] = {1, 4};
  nas_err err = {{0}};
  printf("problem,q,method,seed,evals,hv\n");
  for (size_t pi = 0; pi < n_problems; pi++)
    for (size_t qi = 0; qi < 2; qi++)
      for (size_t mi = 0; mi < 4; mi++)
        for (long seed = 0; seed < seeds; seed++) {
          char qtext[8];
          snprintf(qtext, sizeof qtext, "%zu", q_values[qi]);
          if (!listed(names, problems[pi].name) || !listed(qs, qtext) ||
              !listed(methods, all_methods[mi]))
            continue;
          if (run_one(&problems[pi], all_methods[mi], seed, q_values[qi], gp_extra, &err) < 0) {
            fprintf(stderr, "bench_optimizer: %s %s seed %ld: %s\n", problems[pi].name,
                    all_methods[mi], seed, err.msg);
            return 1;
          }
        }
  return 0;
}

/* Seconds of CPU used by this process (all its threads). */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One gp suggestion after n random observations of DTLZ2 (M = 2, d = 6): wall seconds
 * (negative on failure) and CPU seconds into *cpu. */
static double time_suggestion(size_t n, long seed, double *cpu, nas_err *err) {
  const problem *p = &problems[2];
  run_state r;
  double *Y = malloc(n * p->m * sizeof *Y), elapsed = -1;
  json_t **params = calloc(n, sizeof *params);
  observation *obs = malloc(n * sizeof *obs);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  if (!Y || !params || !obs || !rng || run_open(&r, p, "gp", seed, NULL, err) < 0) goto done;
  gsl_rng_set(rng, (unsigned long)seed + 1);
  for (size_t i = 0; i < n; i++) {
    params[i] = json_object();
    double x[MAX_D];
    for (size_t k = 0; k < p->d; k++) {
      char name[16];
      snprintf(name, sizeof name, "x%zu", k);
      x[k] = gsl_rng_uniform(rng);
      json_object_set_new(params[i], name, json_real(x[k]));
    }
    p->eval(x, Y + i * p->m);
    obs[i] = (observation){params[i], Y + i * p->m, NULL};
  }
  json_t *out[1];
  double t0 = nas_monotonic(), c0 = cpu_seconds();
  if (optimizer_suggest(r.opt, obs, n, NULL, 0, 1, (int)n, out, NULL, err) == NAS_OK) {
    elapsed = nas_monotonic() - t0;
    *cpu = cpu_seconds() - c0;
    json_decref(out[0]);
  }
  run_close(&r);
done:
  for (size_t i = 0; params && i < n; i++) json_decref(params[i]);
  free(params);
  free(Y);
  free(obs);
  gsl_rng_free(rng);
  return elapsed;
}

static int cmd_timing(int argc, char **argv) {
  const char *sizes = flag(argc, argv, "--sizes"), *repeats_arg = flag(argc, argv, "--repeats");
  const size_t all_sizes[] = {50, 100, 200, 500};
  int repeats = repeats_arg ? atoi(repeats_arg) : 3;
  nas_err err = {{0}};
  printf("| observations | wall s, mean of %d | min | max | CPU s, mean |\n", repeats);
  printf("|---|---|---|---|---|\n");
  for (size_t i = 0; i < 4; i++) {
    char text[16];
    snprintf(text, sizeof text, "%zu", all_sizes[i]);
    if (!listed(sizes, text)) continue;
    double sum = 0, lo = HUGE_VAL, hi = 0, cpu_sum = 0;
    for (int r = 0; r < repeats; r++) {
      double cpu = 0, t = time_suggestion(all_sizes[i], r, &cpu, &err);
      if (t < 0) {
        fprintf(stderr, "bench_optimizer: timing at %zu: %s\n", all_sizes[i], err.msg);
        return 1;
      }
      sum += t;
      cpu_sum += cpu;
      lo = fmin(lo, t);
      hi = fmax(hi, t);
    }
    printf("| %zu | %.3f | %.3f | %.3f | %.3f |\n", all_sizes[i], sum / repeats, lo, hi,
           cpu_sum / repeats);
    fflush(stdout);
  }
  return 0;
}

/* ---- the table -------------------------------------------------------------------------- */

enum { MAX_ROWS = 4096, N_CHECKS = BUDGET / CHECK_EVERY };

typedef struct {
  char problem[32], method[32];
  size_t q, n[N_CHECKS];
  double sum[N_CHECKS], sum2[N_CHECKS];
} series;

static const problem *find_problem(const char *name) {
  for (size_t i = 0; i < n_problems; i++)
    if (strcmp(problems[i].name, name) == 0) return &problems[i];
  return NULL;
}

static series *find_series(series *all, size_t *n, const char *prob, size_t q, const char *method) {
  for (size_t i = 0; i < *n; i++)
    if (!strcmp(all[i].problem, prob) && all[i].q == q && !strcmp(all[i].method, method))
      return &all[i];
  if (*n == MAX_ROWS) return NULL;
  series *s = &all[(*n)++];
  memset(s, 0, sizeof *s);
  snprintf(s->problem, sizeof s->problem, "%s", prob);
  snprintf(s->method, sizeof s->method, "%s", method);
  s->q = q;
  return s;
}

static int read_csv(const char *path, series *all, size_t *n) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return 1;
  }
  char line[256], prob[32], method[32];
  size_t q, evals;
  long seed;
  double hv;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%31[^,],%zu,%31[^,],%ld,%zu,%lf", prob, &q, method, &seed, &evals, &hv) != 6)
      continue; /* the header */
    const problem *p = find_problem(prob);
    series *s = p ? find_series(all, n, prob, q, method) : NULL;
    if (!s || evals % CHECK_EVERY || evals == 0 || evals > BUDGET) continue;
    double v = log10(fmax(p->max_hv - hv, 1e-10));
    s->n[evals / CHECK_EVERY - 1]++;
    s->sum[evals / CHECK_EVERY - 1] += v;
    s->sum2[evals / CHECK_EVERY - 1] += v * v;
  }
  fclose(f);
  return 0;
}

static int cmd_table(int argc, char **argv) {
  static series all[MAX_ROWS];
  size_t n = 0;
  for (int i = 2; i < argc; i++)
    if (read_csv(argv[i], all, &n)) return 1;
  printf("| problem | q | method | seeds | @10 | @20 | @30 | @40 | @50 |\n");
  printf("|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < n; i++) {
    series *s = &all[i];
    printf("| %s | %zu | %s | %zu |", s->problem, s->q, s->method, s->n[N_CHECKS - 1]);
    for (size_t c = 0; c < N_CHECKS; c++) {
      double k = (double)s->n[c], mean = k ? s->sum[c] / k : NAN;
      double var = k > 1 ? (s->sum2[c] - k * mean * mean) / (k - 1) : 0;
      printf(" %.2f ± %.2f |", mean, sqrt(fmax(var, 0)));
    }
    printf("\n");
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : "";
  if (strcmp(cmd, "run") == 0) return cmd_run(argc, argv);
  if (strcmp(cmd, "timing") == 0) return cmd_timing(argc, argv);
  if (strcmp(cmd, "table") == 0) return cmd_table(argc, argv);
  fprintf(stderr,
          "usage: bench_optimizer run [--seeds N] [--q 1,4] [--methods gp,gp-ref,sobol,random]\n"
          "                           [--problems NAMES] [--gp-options TEXT]\n"
          "       bench_optimizer timing [--sizes 50,100,200,500] [--repeats N]\n"
          "       bench_optimizer table FILE...\n");
  return 2;
}
