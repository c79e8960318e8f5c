/* optimizer/acq_optimize.c: maximising an acquisition over the encoded space (see
 * acq_optimize.h).
 *
 * Invariants: every point this file evaluates for a final answer is snapped (a valid
 * assignment, compared with the taken set by its exact encoding); the gradient phase only
 * moves numeric dimensions of active parameters that are no condition's parent, so a
 * relaxed point never changes which parameters are active; discrete choices, parents
 * included, change only in the neighbourhood search, which evaluates snapped points. */
#include "optimizer/acq_optimize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <nlopt.h>

#include "optimizer/design.h"

enum { neighbourhood_rounds = 10 };
static const double UNUSABLE = -1e300; /* NLopt's stand-in for a non-finite acquisition */
static const uint64_t AROUND_STREAM = UINT64_C(0x5a3c000000000000);

/* Scratch shared by one search. */
typedef struct {
  const acq_search *s;
  size_t dim;
  bool *is_parent;   /* per spec parameter: some condition depends on it */
  double *trial;     /* dim: a neighbour being tried */
  /* gradient phase */
  size_t *free_dims;
  size_t n_free;
  double *full, *full_grad; /* dim */
  double best_value;
  double *best_x;    /* dim: best point the gradient phase evaluated */
} search_work;

/* The search's one way to evaluate the acquisition; once the watch says stop, nothing is
 * evaluated any more and every loop of the search runs out at once. */
static double acq_value(const acq_search *s, const double *x, double *grad) {
  if (optimizer_cancelled(s->cancel)) {
    if (grad) memset(grad, 0, space_ndim(s->sp) * sizeof *grad);
    return UNUSABLE;
  }
  double v = s->f(s->ctx, x, grad);
  return isfinite(v) ? v : UNUSABLE;
}

static bool same_point(const double *a, const double *b, size_t dim) {
  return memcmp(a, b, dim * sizeof *a) == 0;
}

/* ---- raw samples ----------------------------------------------------------------------- */

/* Gaussian perturbations of the centres in their numeric dimensions, alternating a small
 * and a wider spread; categorical choices stay the centre's. */
static int sample_around(const acq_search *s, double *X, size_t n, nas_err *err) {
  size_t dim = space_ndim(s->sp);
  const space_dim *dims = space_dims(s->sp);
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  if (!rng) return nas_errf(err, "acquisition search: out of memory");
  gsl_rng_set(rng, design_stream_seed(s->seed, AROUND_STREAM));
  for (size_t i = 0; i < n; i++) {
    double *x = X + i * dim, sigma = i % 2 ? 0.1 : 0.02;
    memcpy(x, s->centres + (i % s->n_centres) * dim, dim * sizeof *x);
    for (size_t d = 0; d < dim; d++)
      if (dims[d].kind != DIM_ONEHOT)
        x[d] = fmin(fmax(x[d] + gsl_ran_gaussian_ziggurat(rng, sigma), 0.0), 1.0);
  }
  gsl_rng_free(rng);
  return NAS_OK;
}

/* n_raw Sobol points then the perturbed centres, all snapped: *X owned, *n its rows. */
static int raw_points(const acq_search *s, double **X, size_t *n, nas_err *err) {
  size_t dim = space_ndim(s->sp), n_u = space_uniform_dims(s->sp);
  size_t n_raw = s->raw_samples, n_around = s->n_centres ? s->raw_samples / 4 : 0;
  double *pts = malloc(((n_raw + n_around) * dim + 1) * sizeof *pts);
  double *u = malloc((n_raw * n_u + 1) * sizeof *u);
  int rc = pts && u ? NAS_OK : nas_errf(err, "acquisition search: out of memory");
  if (rc == NAS_OK && n_u > 0) rc = design_sobol(n_u, s->seed, 0, n_raw, u, err);
  for (size_t i = 0; rc == NAS_OK && i < n_raw; i++)
    space_from_uniform(s->sp, u + i * n_u, pts + i * dim);
  if (rc == NAS_OK) rc = sample_around(s, pts + n_raw * dim, n_around, err);
  for (size_t i = 0; rc == NAS_OK && i < n_raw + n_around; i++)
    rc = space_snap(s->sp, pts + i * dim, err);
  free(u);
  if (rc != NAS_OK) {
    free(pts);
    return rc;
  }
  *X = pts;
  *n = n_raw + n_around;
  return NAS_OK;
}

/* ---- ranking --------------------------------------------------------------------------- */

typedef struct {
  double value;
  size_t index;
} ranked;

static int by_value_desc(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->value != y->value) return x->value > y->value ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index; /* stable: deterministic order */
}

static ranked *rank_points(const acq_search *s, const double *X, size_t n) {
  ranked *r = malloc((n + 1) * sizeof *r);
  if (!r) return NULL;
  size_t dim = space_ndim(s->sp);
  for (size_t i = 0; i < n; i++) r[i] = (ranked){acq_value(s, X + i * dim, NULL), i};
  qsort(r, n, sizeof *r, by_value_desc);
  return r;
}

/* ---- gradient phase -------------------------------------------------------------------- */

static double nlopt_objective(unsigned n, const double *z, double *grad, void *data) {
  search_work *w = data;
  for (size_t k = 0; k < n; k++) w->full[w->free_dims[k]] = z[k];
  double v = acq_value(w->s, w->full, grad ? w->full_grad : NULL);
  for (size_t k = 0; grad && k < n; k++)
    grad[k] = v == UNUSABLE ? 0.0 : w->full_grad[w->free_dims[k]];
  if (v > w->best_value) {
    w->best_value = v;
    memcpy(w->best_x, w->full, w->dim * sizeof *w->full);
  }
  return v;
}

/* The dimensions the gradient phase may move at x: numeric, active, not a parent. */
static int find_free_dims(search_work *w, const double *x, nas_err *err) {
  const space *sp = w->s->sp;
  const spec *sc = space_spec(sp);
  const space_dim *dims = space_dims(sp);
  json_t *params;
  if (space_decode(sp, x, &params, err) != NAS_OK) return NAS_ERR;
  w->n_free = 0;
  for (size_t d = 0; d < w->dim; d++) {
    const param_spec *p = &sc->params[dims[d].param];
    if (dims[d].kind != DIM_ONEHOT && !w->is_parent[dims[d].param] &&
        json_object_get(params, p->name))
      w->free_dims[w->n_free++] = d;
  }
  json_decref(params);
  return NAS_OK;
}

/* L-BFGS over the free dimensions from x; x receives the best point seen. */
static int climb(search_work *w, double *x, nas_err *err) {
  if (find_free_dims(w, x, err) != NAS_OK) return NAS_ERR;
  if (w->n_free == 0) return NAS_OK;
  unsigned n = (unsigned)w->n_free;
  double z[n], lower[n], upper[n], value;
  for (unsigned k = 0; k < n; k++) {
    z[k] = x[w->free_dims[k]];
    lower[k] = 0.0;
    upper[k] = 1.0;
  }
  nlopt_opt nl = nlopt_create(NLOPT_LD_LBFGS, n);
  if (!nl) return nas_errf(err, "acquisition search: cannot create an NLopt optimiser");
  nlopt_set_lower_bounds(nl, lower);
  nlopt_set_upper_bounds(nl, upper);
  nlopt_set_max_objective(nl, nlopt_objective, w);
  nlopt_set_maxeval(nl, w->s->max_evals > 0 ? w->s->max_evals : 100);
  nlopt_set_ftol_rel(nl, 1e-9);
  nlopt_set_xtol_abs1(nl, 1e-7);
  memcpy(w->full, x, w->dim * sizeof *x);
  w->best_value = -HUGE_VAL;
  /* Whatever else it returns, best_x holds the best point seen. */
  nlopt_result result = nlopt_optimize(nl, z, &value);
  nlopt_destroy(nl);
  if (result == NLOPT_OUT_OF_MEMORY) return nas_errf(err, "acquisition search: out of memory");
  if (w->best_value > -HUGE_VAL) memcpy(x, w->best_x, w->dim * sizeof *x);
  return NAS_OK;
}

/* ---- neighbourhood search -------------------------------------------------------------- */

/* The nearest snapped point one level up (dir = 1) or down (−1) in discrete dimension d of
 * x (snapped) into w->trial; *found is false when there is none. Log-scaled levels are
 * unevenly spaced, hence growing steps. */
static int level_neighbour(search_work *w, const double *x, size_t d, int dir, bool *found,
                           nas_err *err) {
  const space_dim *dims = space_dims(w->s->sp);
  double spacing = 1.0 / (double)(dims[d].n_levels > 1 ? dims[d].n_levels - 1 : 1);
  *found = false;
  for (double mult = 0.6; !*found && mult <= 8; mult *= 2) {
    memcpy(w->trial, x, w->dim * sizeof *x);
    w->trial[d] = fmin(fmax(x[d] + dir * mult * spacing, 0.0), 1.0);
    if (space_snap_near(w->s->sp, x, w->trial, err) != NAS_OK) return NAS_ERR;
    *found = !same_point(w->trial, x, w->dim);
  }
  return NAS_OK;
}

/* x (snapped) with choice `choice` of the one-hot group starting at dimension `group`,
 * snapped, into w->trial; *found is false when that is x itself. */
static int choice_neighbour(search_work *w, const double *x, size_t group, size_t choice,
                            bool *found, nas_err *err) {
  const space_dim *dims = space_dims(w->s->sp);
  memcpy(w->trial, x, w->dim * sizeof *x);
  memset(w->trial + group, 0, dims[group].n_levels * sizeof *x);
  w->trial[group + choice] = 1.0;
  if (space_snap_near(w->s->sp, x, w->trial, err) != NAS_OK) return NAS_ERR;
  *found = !same_point(w->trial, x, w->dim);
  return NAS_OK;
}

/* Scores w->trial and keeps it in best when it beats *best_value. */
static void consider(search_work *w, double *best, double *best_value) {
  double v = acq_value(w->s, w->trial, NULL);
  if (v > *best_value) {
    *best_value = v;
    memcpy(best, w->trial, w->dim * sizeof *best);
  }
}

/* Best neighbour of x that beats *value, into x (*improved says whether one did). */
static int improve_once(search_work *w, double *x, double *value, double *best, bool *improved,
                        nas_err *err) {
  const space_dim *dims = space_dims(w->s->sp);
  double best_value = *value;
  bool found;
  for (size_t d = 0; d < w->dim; d++) {
    if (dims[d].kind == DIM_DISCRETE)
      for (int dir = -1; dir <= 1; dir += 2) {
        if (level_neighbour(w, x, d, dir, &found, err) != NAS_OK) return NAS_ERR;
        if (found) consider(w, best, &best_value);
      }
    if (dims[d].kind == DIM_ONEHOT && dims[d].group_start == d)
      for (size_t c = 0; c < dims[d].n_levels; c++) {
        if (choice_neighbour(w, x, d, c, &found, err) != NAS_OK) return NAS_ERR;
        if (found) consider(w, best, &best_value);
      }
  }
  *improved = best_value > *value;
  if (*improved) {
    memcpy(x, best, w->dim * sizeof *x);
    *value = best_value;
  }
  return NAS_OK;
}

static bool has_discrete_dims(const space *sp) {
  for (size_t d = 0; d < space_ndim(sp); d++)
    if (space_dims(sp)[d].kind != DIM_CONTINUOUS) return true;
  return false;
}

/* One local optimisation from x (snapped): gradient phase, snap, neighbourhood search. */
static int optimise_from(search_work *w, double *x, double *value, nas_err *err) {
  if (climb(w, x, err) != NAS_OK || space_snap(w->s->sp, x, err) != NAS_OK) return NAS_ERR;
  *value = acq_value(w->s, x, NULL);
  if (!has_discrete_dims(w->s->sp)) return NAS_OK;
  double *best = malloc(w->dim * sizeof *best);
  if (!best) return nas_errf(err, "acquisition search: out of memory");
  bool improved = true;
  int rc = NAS_OK;
  for (int round = 0; rc == NAS_OK && improved && round < neighbourhood_rounds; round++)
    rc = improve_once(w, x, value, best, &improved, err);
  free(best);
  return rc;
}

/* ---- the search ------------------------------------------------------------------------ */

static int work_alloc(search_work *w, const acq_search *s) {
  const spec *sc = space_spec(s->sp);
  w->s = s;
  w->dim = space_ndim(s->sp);
  w->is_parent = calloc(sc->n_params + 1, sizeof *w->is_parent);
  w->trial = malloc((w->dim + 1) * sizeof *w->trial);
  w->free_dims = malloc((w->dim + 1) * sizeof *w->free_dims);
  w->full = malloc((w->dim + 1) * sizeof *w->full);
  w->full_grad = malloc((w->dim + 1) * sizeof *w->full_grad);
  w->best_x = malloc((w->dim + 1) * sizeof *w->best_x);
  if (!w->is_parent || !w->trial || !w->free_dims || !w->full || !w->full_grad || !w->best_x)
    return NAS_ERR;
  for (size_t i = 0; i < sc->n_params; i++)
    if (sc->params[i].conditional) w->is_parent[sc->params[i].cond.parent] = true;
  return NAS_OK;
}

static void work_free(search_work *w) {
  free(w->is_parent);
  free(w->trial);
  free(w->free_dims);
  free(w->full);
  free(w->full_grad);
  free(w->best_x);
}

/* Local optimisations from the best distinct raw points; results (restarts×dim) and their
 * values go to opt/opt_value, *n_opt counts them. */
static int optimise_starts(search_work *w, const double *X, const ranked *r, size_t n_raw,
                           double *opt, double *opt_value, size_t *n_opt, nas_err *err) {
  size_t dim = w->dim;
  *n_opt = 0;
  for (size_t i = 0; i < n_raw && *n_opt < w->s->restarts; i++) {
    const double *start = X + r[i].index * dim;
    bool repeat = false;
    for (size_t k = 0; k < i && !repeat; k++) repeat = same_point(X + r[k].index * dim, start, dim);
    if (repeat) continue;
    double *x = opt + *n_opt * dim;
    memcpy(x, start, dim * sizeof *x);
    if (optimise_from(w, x, &opt_value[*n_opt], err) != NAS_OK) return NAS_ERR;
    (*n_opt)++;
  }
  return NAS_OK;
}

/* The best free point among the optimised results, else among the raw points. */
static int pick_free(const acq_search *s, const double *opt, const double *opt_value,
                     size_t n_opt, const double *X, const ranked *r, size_t n_raw, double *x,
                     double *value) {
  size_t dim = space_ndim(s->sp);
  const double *best = NULL;
  for (size_t k = 0; k < n_opt; k++)
    if (!taken_contains(s->taken, opt + k * dim) && (!best || opt_value[k] > *value)) {
      best = opt + k * dim;
      *value = opt_value[k];
    }
  for (size_t i = 0; !best && i < n_raw; i++)
    if (!taken_contains(s->taken, X + r[i].index * dim)) {
      best = X + r[i].index * dim;
      *value = r[i].value;
    }
  if (!best) return NAS_ENOTFOUND;
  memcpy(x, best, dim * sizeof *x);
  return NAS_OK;
}

int acq_optimize(const acq_search *s, double *x, double *value, nas_err *err) {
  search_work w = {0};
  double *X = NULL, *opt = NULL, *opt_value = NULL;
  ranked *r = NULL;
  size_t n_raw = 0, n_opt = 0, dim = space_ndim(s->sp);
  int rc = work_alloc(&w, s) == NAS_OK ? NAS_OK
                                        : nas_errf(err, "acquisition search: out of memory");
  if (rc == NAS_OK) rc = raw_points(s, &X, &n_raw, err);
  if (rc == NAS_OK) {
    r = rank_points(s, X, n_raw);
    opt = malloc((s->restarts * dim + 1) * sizeof *opt);
    opt_value = malloc((s->restarts + 1) * sizeof *opt_value);
    if (!r || !opt || !opt_value) rc = nas_errf(err, "acquisition search: out of memory");
  }
  if (rc == NAS_OK) rc = optimise_starts(&w, X, r, n_raw, opt, opt_value, &n_opt, err);
  if (rc == NAS_OK && optimizer_cancelled(s->cancel))
    rc = nas_errc(err, NAS_ECANCELED, "acquisition search given up on request");
  if (rc == NAS_OK) rc = pick_free(s, opt, opt_value, n_opt, X, r, n_raw, x, value);
  work_free(&w);
  free(X);
  free(r);
  free(opt);
  free(opt_value);
  return rc;
}
