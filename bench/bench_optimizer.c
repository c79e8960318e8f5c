/* bench/bench_optimizer.c: optimiser quality and cost for `nas` (BENCH.md section 1).
 *
 *   bench_optimizer run [--seeds N] [--q LIST] [--methods LIST] [--problems LIST]
 *                       [--gp-options ", key: value…"]
 *       runs nas's optimizers on the benchmark problems and prints CSV rows
 *       `problem,q,method,seed,evals,hv,tip` (hypervolume of the first `evals` evaluations,
 *       evals = 10, 20, … and the problem's budget; tip = 1/0 whether those evaluations
 *       reached the tip of the front's far piece, empty for problems without one) to stdout;
 *   bench_optimizer timing [--sizes LIST] [--repeats N] [--spaces LIST]
 *       times one gp suggestion (q = 1) after N random observations in each listed space
 *       (timing_space): "6" (the default) DTLZ2 (M = 2, d = 6); "20", "40" that many floats;
 *       "mixed" 40 floats, 5 categoricals of 4 choices and 5 ints (65 cube dimensions);
 *   bench_optimizer table FILE…
 *       reads such CSV files (nas's and Optuna's) and prints log10(max HV − HV), mean ± std
 *       over seeds, per problem, q and method at each checkpoint.
 *
 * Problems follow botorch.test_functions.multi_objective; all objectives are minimised.
 * Protocol: 2(d+1) Sobol points (gp's n_initial), then the method up to 50 evaluations,
 * sequentially (q = 1) or in batches (q = 4); seeds 0..N−1 as spec.seed. Problems taken
 * from BoTorch's tutorials keep the tutorial's protocol instead (their own initial design,
 * budget and q): C2-DTLZ2 (10 + 40, q = 2; its constraint is the outcome constraint
 * `c >= 0` on the slack metric c, and only feasible evaluations count in the hypervolume) and
 * the noisy BraninCurrin (6 + 80, q = 4; the optimizer sees noisy values, the hypervolume is
 * of the noise-free ones). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>

#include "optimizer/optimizer.h"

enum { MAX_BUDGET = 86, CHECK_EVERY = 10, MAX_M = 3, MAX_D = 6 };

typedef struct {
  const char *name;
  size_t d, m;
  double ref[MAX_M];
  double max_hv;
  void (*eval)(const double *x, double *f, double *slack); /* slack: feasible when >= 0 */
  size_t n_con;           /* 0 or 1 */
  size_t n_init, budget;  /* 0: 2(d+1) and 50 */
  size_t q;               /* 0: every q of --q */
  double noise_sd[MAX_M]; /* Gaussian noise added to what the optimizer sees */
  double tip_f2;          /* > 0: the far piece's tip is reached when some f2 <= this */
} problem;

static void branin_currin(const double *x, double *f, double *slack) {
  (void)slack;
  double u = 15 * x[0] - 5, v = 15 * x[1];
  double t = v - 5.1 / (4 * M_PI * M_PI) * u * u + 5 / M_PI * u - 6;
  f[0] = t * t + 10 * (1 - 1 / (8 * M_PI)) * cos(u) + 10;
  double a = x[0], factor = 1 - exp(-1 / (2 * x[1]));
  f[1] = factor * (2300 * a * a * a + 1900 * a * a + 2092 * a + 60) /
         (100 * a * a * a + 500 * a * a + 4 * a + 20);
}

/* ZDT1's and DTLZ7's g over d = 6: 1 + 9/5 Σ x1..x5. */
static double sum_g(const double *x) {
  double s = 0;
  for (size_t i = 1; i < 6; i++) s += x[i];
  return 1 + 9 * s / 5;
}

static void zdt1(const double *x, double *f, double *slack) {
  (void)slack;
  double g = sum_g(x);
  f[0] = x[0];
  f[1] = g * (1 - sqrt(x[0] / g));
}

/* DTLZ2 with M objectives over d inputs: g over the last d − M + 1. */
static void dtlz2(const double *x, size_t d, double *f, size_t m) {
  double g = 0;
  for (size_t i = m - 1; i < d; i++) g += (x[i] - 0.5) * (x[i] - 0.5);
  for (size_t j = 0; j < m; j++) {
    double v = 1 + g;
    for (size_t i = 0; i + 1 < m - j; i++) v *= cos(x[i] * M_PI / 2);
    if (j > 0) v *= sin(x[m - 1 - j] * M_PI / 2);
    f[j] = v;
  }
}

static void dtlz2_m2(const double *x, double *f, double *slack) {
  (void)slack;
  dtlz2(x, 6, f, 2);
}

static void dtlz2_m3(const double *x, double *f, double *slack) {
  (void)slack;
  dtlz2(x, 6, f, 3);
}

/* DTLZ7, M = 2, d = 6: f1 = x0, f2 = (1 + g) h with g = 1 + 9/5 Σ x1..x5 (BoTorch's form)
 * and h = 2 − f1/(1 + g) (1 + sin 3π f1). Its front is two pieces, f1 in [0, 0.2514] and
 * [0.6316, 0.8594]; the second one's tip, f2 = 2.307 at f1 = 0.8594, is the lowest f2. */
static void dtlz7(const double *x, double *f, double *slack) {
  (void)slack;
  double g = sum_g(x);
  f[0] = x[0];
  f[1] = (1 + g) * (2 - x[0] / (1 + g) * (1 + sin(3 * M_PI * x[0])));
}

/* C2-DTLZ2 (d = 4, M = 2) as BoTorch defines it (r = 0.2): DTLZ2 whose feasible region is
 * the neighbourhood of the front's middle and of its two ends, so the feasible front is
 * three arcs. The slack is −min(min_i [(f_i − 1)² + Σ_{j≠i} (f_j² − r²)],
 * Σ_j [(f_j − 1/√M)² − r²]). */
static void c2_dtlz2(const double *x, double *f, double *slack) {
  const double r2 = 0.2 * 0.2, centre = 1 / sqrt(2);
  dtlz2(x, 4, f, 2);
  double least = HUGE_VAL, middle = 0;
  for (size_t i = 0; i < 2; i++) {
    double v = (f[i] - 1) * (f[i] - 1) + (f[1 - i] * f[1 - i] - r2);
    least = fmin(least, v);
    middle += (f[i] - centre) * (f[i] - centre) - r2;
  }
  slack[0] = -fmin(least, middle);
}

/* The noisy problem's max HV and reference are the noise-free BraninCurrin's. */
static const problem problems[] = {
    {"BraninCurrin", 2, 2, {18, 6}, 59.36011874867746, branin_currin, .n_con = 0},
    {"ZDT1", 6, 2, {11, 11}, 120 + 2.0 / 3, zdt1, .n_con = 0},
    {"DTLZ2_M2", 6, 2, {1.1, 1.1}, 1.21 - M_PI / 4, dtlz2_m2, .n_con = 0},
    {"DTLZ2_M3", 6, 3, {1.1, 1.1, 1.1}, 1.331 - M_PI / 6, dtlz2_m3, .n_con = 0},
    /* max HV: the exact front (2·10⁶ points of f1) swept against r */
    {"DTLZ7", 6, 2, {15, 15}, 189.43077305224656, dtlz7, .tip_f2 = 2.5},
    /* BoTorch's max HV for C2DTLZ2 (from NSGA-II) */
    {"C2DTLZ2", 4, 2, {1.1, 1.1}, 0.3996406303723544, c2_dtlz2, .n_con = 1, .n_init = 10,
     .budget = 50, .q = 2},
    {"BraninCurrinNoisy", 2, 2, {18, 6}, 59.36011874867746, branin_currin, .n_init = 6,
     .budget = 86, .q = 4, .noise_sd = {15.19, 0.63}},
};
enum { n_problems = sizeof problems / sizeof problems[0] };

static size_t initial_size(const problem *p) { return p->n_init ? p->n_init : 2 * (p->d + 1); }
static size_t budget_of(const problem *p) { return p->budget ? p->budget : 50; }

/* ---- one optimisation run --------------------------------------------------------------- */

/* Method "gp-ref" is gp told the reference point as the objectives' thresholds, "gp-noise"
 * gp told the objectives' noise (`noise:`, the problem's noise sd; 0 for the noise-free
 * ones), "gp-noise-ref" both (what the BoTorch tutorials tell their optimizers),
 * "gp-follow" gp with the option `reference: follow`; gp_extra (e.g. ", kernel: rbf") is
 * appended to gp's options. */
static char *problem_yaml(const problem *p, const char *method, long seed, const char *gp_extra) {
  char params[512] = "", objectives[512] = "", options[128] = "";
  bool both = strcmp(method, "gp-noise-ref") == 0;
  bool with_ref = both || strcmp(method, "gp-ref") == 0;
  bool with_noise = both || strcmp(method, "gp-noise") == 0;
  bool with_follow = strcmp(method, "gp-follow") == 0;
  const char *type = with_ref || with_noise || with_follow ? "gp" : method;
  for (size_t i = 0; i < p->d; i++) {
    size_t used = strlen(params);
    snprintf(params + used, sizeof params - used, "  x%zu: {type: float, low: 0, high: 1}\n", i);
  }
  for (size_t j = 0; j < p->m; j++) {
    size_t used = strlen(objectives);
    char threshold[48] = "", noise[48] = "";
    if (with_ref) snprintf(threshold, sizeof threshold, ", threshold: %.17g", p->ref[j]);
    if (with_noise) snprintf(noise, sizeof noise, ", noise: %.17g", p->noise_sd[j]);
    snprintf(objectives + used, sizeof objectives - used,
             "  - {name: f%zu, goal: minimize%s%s}\n", j, threshold, noise);
  }
  if (strcmp(type, "gp") == 0)
    snprintf(options, sizeof options, ", n_initial: %zu%s%s", initial_size(p),
             with_follow ? ", reference: follow" : "", gp_extra ? gp_extra : "");
  return nas_asprintf("name: bench\nseed: %ld\nparameters:\n%sobjectives:\n%s%s"
                      "trial: {command: [x]}\nbudget: {trials: %zu}\n"
                      "optimizer: {type: %s%s}\n",
                      seed, params, objectives, p->n_con ? "constraints: [\"c >= 0\"]\n" : "",
                      budget_of(p), type, options);
}

typedef struct {
  spec *s;
  optimizer *opt;
  gsl_rng *noise;
  size_t n;
  json_t *params[MAX_BUDGET];
  double Y[MAX_BUDGET * MAX_M];    /* what the optimizer sees (noisy where the problem is) */
  double Ytrue[MAX_BUDGET * MAX_M]; /* noise-free; NaN rows where infeasible */
  double C[MAX_BUDGET];            /* slacks */
} run_state;

static int run_open(run_state *r, const problem *p, const char *method, long seed,
                    const char *gp_extra, nas_err *err) {
  memset(r, 0, sizeof *r);
  r->noise = gsl_rng_alloc(gsl_rng_mt19937);
  if (!r->noise) return nas_errf(err, "out of memory");
  gsl_rng_set(r->noise, (unsigned long)seed * 7919 + 17);
  char *yaml = problem_yaml(p, method, seed, gp_extra);
  int rc = yaml ? spec_parse(yaml, "<bench>", "/tmp", &r->s, err) : nas_errf(err, "out of memory");
  free(yaml);
  return rc < 0 ? rc : optimizer_create(r->s, &r->opt, err);
}

static void run_close(run_state *r) {
  for (size_t i = 0; i < r->n; i++) json_decref(r->params[i]);
  optimizer_free(r->opt);
  spec_free(r->s);
  gsl_rng_free(r->noise);
}

/* Evaluates params into row r->n: true values (NaN when infeasible, so that the hypervolume
 * skips them), the values the optimizer sees, the slack. */
static void evaluate(run_state *r, const problem *p, const json_t *params) {
  double x[MAX_D], *f = r->Ytrue + r->n * p->m, *seen = r->Y + r->n * p->m;
  for (size_t i = 0; i < p->d; i++) {
    char name[24]; /* "x" and any size_t */
    snprintf(name, sizeof name, "x%zu", i);
    x[i] = json_number_value(json_object_get(params, name));
  }
  r->C[r->n] = 0;
  p->eval(x, f, &r->C[r->n]);
  for (size_t j = 0; j < p->m; j++)
    seen[j] = f[j] + (p->noise_sd[j] > 0 ? gsl_ran_gaussian(r->noise, p->noise_sd[j]) : 0);
  if (p->n_con && r->C[r->n] < 0)
    for (size_t j = 0; j < p->m; j++) f[j] = NAN;
}

static int run_batch(run_state *r, const problem *p, size_t q, nas_err *err) {
  observation obs[MAX_BUDGET];
  for (size_t i = 0; i < r->n; i++)
    obs[i] = (observation){r->params[i], r->Y + i * p->m, p->n_con ? &r->C[i] : NULL, NULL};
  json_t *out[MAX_BUDGET];
  if (optimizer_suggest(r->opt, obs, r->n, NULL, 0, q, (int)r->n, out, NULL, err) < 0) return NAS_ERR;
  for (size_t i = 0; i < q; i++) {
    evaluate(r, p, out[i]);
    r->params[r->n++] = out[i];
  }
  return NAS_OK;
}

/* "1" or "0": whether the first n evaluations reached the far tip (feasible, true values);
 * "" for problems without one. */
static const char *tip_reached(const problem *p, const double *Ytrue, size_t n) {
  if (p->tip_f2 <= 0) return "";
  for (size_t i = 0; i < n; i++)
    if (Ytrue[i * p->m + 1] <= p->tip_f2) return "1";
  return "0";
}

/* Batches of q after the initial design, which is asked for as one batch for every method
 * (gp's design is the sobol optimizer's, so the start is the same for both). */
static int run_one(const problem *p, const char *method, long seed, size_t q,
                   const char *gp_extra, nas_err *err) {
  run_state r;
  int rc = run_open(&r, p, method, seed, gp_extra, err);
  size_t n_init = initial_size(p), budget = budget_of(p);
  while (rc == NAS_OK && r.n < budget) {
    size_t k = r.n < n_init ? n_init - r.n : q;
    if (k > budget - r.n) k = budget - r.n;
    rc = run_batch(&r, p, k, err);
  }
  for (size_t evals = CHECK_EVERY; rc == NAS_OK && evals < budget + CHECK_EVERY;
       evals += CHECK_EVERY) {
    size_t upto = evals < budget ? evals : budget;
    printf("%s,%zu,%s,%ld,%zu,%.12g,%s\n", p->name, q, method, seed, upto,
           pareto_hypervolume(r.Ytrue, upto, p->m, p->ref), tip_reached(p, r.Ytrue, upto));
  }
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

/* One problem at one q: every listed method and seed. */
static int run_problem(const problem *p, size_t q, const char *methods, long seeds,
                       const char *gp_extra) {
  const char *all_methods[] = {"gp",        "gp-ref", "gp-noise", "gp-noise-ref",
                               "gp-follow", "sobol",  "random"};
  nas_err err = {{0}};
  for (size_t mi = 0; mi < sizeof all_methods / sizeof *all_methods; mi++)
    for (long seed = 0; seed < seeds && listed(methods, all_methods[mi]); seed++)
      if (run_one(p, all_methods[mi], seed, q, gp_extra, &err) < 0) {
        fprintf(stderr, "bench_optimizer: %s %s seed %ld: %s\n", p->name, all_methods[mi], seed,
                err.msg);
        return 1;
      }
  return 0;
}

/* A problem with a q of its own (a tutorial's protocol) runs at that q whatever --q says. */
static int cmd_run(int argc, char **argv) {
  const char *seeds_arg = flag(argc, argv, "--seeds"), *qs = flag(argc, argv, "--q");
  const char *methods = flag(argc, argv, "--methods"), *names = flag(argc, argv, "--problems");
  const char *gp_extra = flag(argc, argv, "--gp-options");
  long seeds = seeds_arg ? atol(seeds_arg) : 10;
  const size_t q_values[] = {1, 4};
  printf("problem,q,method,seed,evals,hv,tip\n");
  for (size_t pi = 0; pi < n_problems; pi++) {
    const problem *p = &problems[pi];
    if (!listed(names, p->name)) continue;
    for (size_t qi = 0; qi < 2 && !p->q; qi++) {
      char qtext[8];
      snprintf(qtext, sizeof qtext, "%zu", q_values[qi]);
      if (listed(qs, qtext) && run_problem(p, q_values[qi], methods, seeds, gp_extra)) return 1;
    }
    if (p->q && run_problem(p, p->q, methods, seeds, gp_extra)) return 1;
  }
  return 0;
}

/* Seconds of CPU used by this process (all its threads). */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- suggestion time -------------------------------------------------------------------- */

/* A search space the timing measures: n_float floats in [0, 1], n_cat categoricals of
 * CAT_CHOICES choices (one-hot: CAT_CHOICES cube dimensions each), n_int ints 0..INT_HIGH.
 * "6" is the benchmark's DTLZ2 (M = 2, d = 6), as the timing measured before it had spaces;
 * the wider ones are what NAS spaces look like (20–60 parameters, many discrete). */
enum { CAT_CHOICES = 4, INT_HIGH = 7, MAX_TIMING_PARAMS = 64 };

typedef struct {
  const char *name;
  size_t n_float, n_cat, n_int;
} timing_space;

static const timing_space timing_spaces[] = {
    {"6", 6, 0, 0}, {"20", 20, 0, 0}, {"40", 40, 0, 0}, {"mixed", 40, 5, 5}};
enum { n_timing_spaces = sizeof timing_spaces / sizeof timing_spaces[0] };

static size_t timing_dims(const timing_space *ts) {
  return ts->n_float + ts->n_cat * CAT_CHOICES + ts->n_int;
}

/* gp's spec over the space (objectives f0, f1), the same for "6" as run's DTLZ2_M2 but for
 * n_initial, which only says from how many observations on gp models (so every size the
 * timing lists is a modelled suggestion). */
static char *timing_yaml(const timing_space *ts, long seed) {
  size_t len = 96 * (ts->n_float + ts->n_cat + ts->n_int) + 1;
  char *params = malloc(len);
  if (!params) return NULL;
  size_t used = 0;
  for (size_t i = 0; i < ts->n_float; i++)
    used += snprintf(params + used, len - used, "  x%zu: {type: float, low: 0, high: 1}\n", i);
  for (size_t i = 0; i < ts->n_cat; i++)
    used += snprintf(params + used, len - used,
                     "  c%zu: {type: categorical, choices: [a, b, c, d]}\n", i);
  for (size_t i = 0; i < ts->n_int; i++)
    used += snprintf(params + used, len - used, "  i%zu: {type: int, low: 0, high: %d}\n", i,
                     INT_HIGH);
  char *yaml = nas_asprintf("name: bench\nseed: %ld\nparameters:\n%sobjectives:\n"
                            "  - {name: f0, goal: minimize}\n  - {name: f1, goal: minimize}\n"
                            "trial: {command: [x]}\nbudget: {trials: 50}\n"
                            "optimizer: {type: gp, n_initial: 10}\n",
                            seed, params);
  free(params);
  return yaml;
}

/* A random assignment of the space into params and its outcomes into f: DTLZ2 (M = 2) over
 * the floats, plus a tenth per categorical not at its first choice and a fiftieth per unit
 * an int is from 3 (so that the discrete parameters matter to the model). */
static void random_assignment(const timing_space *ts, gsl_rng *rng, json_t *params, double *f) {
  double x[MAX_TIMING_PARAMS], extra = 0;
  char name[32];
  for (size_t k = 0; k < ts->n_float; k++) {
    snprintf(name, sizeof name, "x%zu", k);
    x[k] = gsl_rng_uniform(rng);
    json_object_set_new(params, name, json_real(x[k]));
  }
  for (size_t k = 0; k < ts->n_cat; k++) {
    unsigned long c = gsl_rng_uniform_int(rng, CAT_CHOICES);
    snprintf(name, sizeof name, "c%zu", k);
    json_object_set_new(params, name, json_stringn(&"abcd"[c], 1));
    extra += c > 0 ? 0.1 : 0.0;
  }
  for (size_t k = 0; k < ts->n_int; k++) {
    long v = (long)gsl_rng_uniform_int(rng, INT_HIGH + 1);
    snprintf(name, sizeof name, "i%zu", k);
    json_object_set_new(params, name, json_integer(v));
    extra += 0.02 * (double)labs(v - 3);
  }
  dtlz2(x, ts->n_float, f, 2);
  f[0] += extra;
  f[1] += extra;
}

/* One gp suggestion (q = 1) after n random observations of the space: wall seconds
 * (negative on failure) and CPU seconds into *cpu. */
static double time_suggestion(const timing_space *ts, size_t n, long seed, double *cpu,
                              nas_err *err) {
  spec *s = NULL;
  optimizer *opt = NULL;
  double *Y = malloc(2 * n * sizeof *Y), elapsed = -1;
  json_t **params = calloc(n, sizeof *params);
  observation *obs = malloc(n * sizeof *obs);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  char *yaml = timing_yaml(ts, seed);
  if (!Y || !params || !obs || !rng || !yaml) {
    nas_errf(err, "out of memory");
    goto done;
  }
  if (spec_parse(yaml, "<bench>", "/tmp", &s, err) < 0 || optimizer_create(s, &opt, err) < 0)
    goto done;
  gsl_rng_set(rng, (unsigned long)seed + 1);
  for (size_t i = 0; i < n; i++) {
    params[i] = json_object();
    random_assignment(ts, rng, params[i], Y + 2 * i);
    obs[i] = (observation){params[i], Y + 2 * i, NULL, NULL};
  }
  json_t *out[1];
  double t0 = nas_monotonic(), c0 = cpu_seconds();
  if (optimizer_suggest(opt, obs, n, NULL, 0, 1, (int)n, out, NULL, err) == NAS_OK) {
    elapsed = nas_monotonic() - t0;
    *cpu = cpu_seconds() - c0;
    json_decref(out[0]);
  }
done:
  optimizer_free(opt);
  spec_free(s);
  free(yaml);
  for (size_t i = 0; params && i < n; i++) json_decref(params[i]);
  free(params);
  free(Y);
  free(obs);
  gsl_rng_free(rng);
  return elapsed;
}

/* One row of the timing table: repeats suggestions, seeds 0..repeats−1. */
static int time_row(const timing_space *ts, size_t n, int repeats, nas_err *err) {
  double sum = 0, lo = HUGE_VAL, hi = 0, cpu_sum = 0;
  for (int r = 0; r < repeats; r++) {
    double cpu = 0, t = time_suggestion(ts, n, r, &cpu, err);
    if (t < 0) return nas_err_prefix(err, "space %s at %zu observations", ts->name, n);
    sum += t;
    cpu_sum += cpu;
    lo = fmin(lo, t);
    hi = fmax(hi, t);
  }
  printf("| %s | %zu | %zu | %.3f | %.3f | %.3f | %.3f |\n", ts->name, timing_dims(ts), n,
         sum / repeats, lo, hi, cpu_sum / repeats);
  fflush(stdout);
  return NAS_OK;
}

static int cmd_timing(int argc, char **argv) {
  const char *sizes = flag(argc, argv, "--sizes"), *repeats_arg = flag(argc, argv, "--repeats");
  const char *spaces = flag(argc, argv, "--spaces");
  const size_t all_sizes[] = {50, 100, 200, 500};
  int repeats = repeats_arg ? atoi(repeats_arg) : 3;
  if (repeats < 1) repeats = 1;
  nas_err err = {{0}};
  printf("| space | cube dims | observations | wall s, mean of %d | min | max | CPU s, mean |\n",
         repeats);
  printf("|---|---|---|---|---|---|---|\n");
  for (size_t si = 0; si < n_timing_spaces; si++) {
    if (!listed(spaces ? spaces : "6", timing_spaces[si].name)) continue;
    for (size_t i = 0; i < 4; i++) {
      char text[16];
      snprintf(text, sizeof text, "%zu", all_sizes[i]);
      if (listed(sizes, text) && time_row(&timing_spaces[si], all_sizes[i], repeats, &err)) {
        fprintf(stderr, "bench_optimizer: timing: %s\n", err.msg);
        return 1;
      }
    }
  }
  return 0;
}

/* ---- the table -------------------------------------------------------------------------- */

/* Checkpoints @10 … @50 and the problem's budget ("end"; the same as @50 for most). */
enum { MAX_ROWS = 4096, N_SHOWN = 5, N_CHECKS = N_SHOWN + 1 };

typedef struct {
  char problem[32], method[32];
  size_t q, n[N_CHECKS];
  double sum[N_CHECKS], sum2[N_CHECKS];
  size_t tips, tip_runs; /* runs that reached the far tip by the end, runs that report it */
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

static void add_check(series *s, size_t c, double v) {
  s->n[c]++;
  s->sum[c] += v;
  s->sum2[c] += v * v;
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
  int tip_at = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%31[^,],%zu,%31[^,],%ld,%zu,%lf%n", prob, &q, method, &seed, &evals, &hv,
               &tip_at) != 6)
      continue; /* the header */
    const problem *p = find_problem(prob);
    series *s = p ? find_series(all, n, prob, q, method) : NULL;
    if (!s || evals == 0) continue;
    double v = log10(fmax(p->max_hv - hv, 1e-10));
    if (evals % CHECK_EVERY == 0 && evals / CHECK_EVERY <= N_SHOWN)
      add_check(s, evals / CHECK_EVERY - 1, v);
    if (evals != budget_of(p)) continue;
    add_check(s, N_SHOWN, v);
    if (line[tip_at] == ',' && (line[tip_at + 1] == '0' || line[tip_at + 1] == '1')) {
      s->tip_runs++;
      s->tips += line[tip_at + 1] == '1';
    }
  }
  fclose(f);
  return 0;
}

static int cmd_table(int argc, char **argv) {
  static series all[MAX_ROWS];
  size_t n = 0;
  for (int i = 2; i < argc; i++)
    if (read_csv(argv[i], all, &n)) return 1;
  printf("| problem | q | method | seeds | @10 | @20 | @30 | @40 | @50 | end | far tip |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < n; i++) {
    series *s = &all[i];
    printf("| %s | %zu | %s | %zu |", s->problem, s->q, s->method, s->n[N_CHECKS - 1]);
    for (size_t c = 0; c < N_CHECKS; c++) {
      double k = (double)s->n[c], mean = k ? s->sum[c] / k : NAN;
      double var = k > 1 ? (s->sum2[c] - k * mean * mean) / (k - 1) : 0;
      printf(" %.2f ± %.2f |", mean, sqrt(fmax(var, 0)));
    }
    if (s->tip_runs) printf(" %zu/%zu |\n", s->tips, s->tip_runs);
    else printf(" |\n");
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : "";
  if (strcmp(cmd, "run") == 0) return cmd_run(argc, argv);
  if (strcmp(cmd, "timing") == 0) return cmd_timing(argc, argv);
  if (strcmp(cmd, "table") == 0) return cmd_table(argc, argv);
  fprintf(stderr,
          "usage: bench_optimizer run [--seeds N] [--q 1,4]\n"
          "                           [--methods gp,gp-ref,gp-noise,gp-noise-ref,\n"
          "                                      gp-follow,sobol,random]\n"
          "                           [--problems NAMES] [--gp-options TEXT]\n"
          "       bench_optimizer timing [--sizes 50,100,200,500] [--repeats N]\n"
          "                              [--spaces 6,20,40,mixed]\n"
          "           (spaces: 6 = DTLZ2 d = 6, the default; 20, 40 floats; mixed = 40 floats,\n"
          "            5 categoricals of 4 choices, 5 ints)\n"
          "       bench_optimizer table FILE...\n");
  return 2;
}
