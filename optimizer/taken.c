/* optimizer/taken.c: the assignments an optimizer must not propose again (taken.h).
 *
 * A taken set is an array of snapped points kept in lexicographic order, so membership is
 * a binary search; duplicates are harmless. Finding a free assignment first tries random
 * points, which is quick while the space has room; only when those keep colliding, in a
 * finite space (no continuous dimension) of at most enumerate_limit assignments, are all
 * assignments enumerated and a free one drawn uniformly.
 *
 * Randomness: attempt a for trial number k uses the mt19937 stream seeded by
 * design_stream_seed(spec.seed, k + 2^32·a), so suggestions depend on the trial number and
 * not on how calls are batched. */
#include <gsl/gsl_rng.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/design.h"
#include "optimizer/taken.h"

enum {
  random_attempts = 100,
  enumerate_limit = 1 << 16, /* assignments of a finite space worth listing */
};

struct taken_set {
  const space *sp; /* borrowed */
  size_t dim;
  double *rows; /* n×dim, sorted */
  size_t n, cap;
};

static int compare_rows(const double *a, const double *b, size_t dim) {
  for (size_t d = 0; d < dim; d++) {
    if (a[d] < b[d]) return -1;
    if (a[d] > b[d]) return 1;
  }
  return 0;
}

static int compare_rows_qsort(const void *a, const void *b, void *dim) {
  return compare_rows(a, b, *(const size_t *)dim);
}

/* Index of the first row >= x. */
static size_t lower_bound(const taken_set *t, const double *x) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (compare_rows(t->rows + mid * t->dim, x, t->dim) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

bool taken_contains(const taken_set *t, const double *x) {
  size_t i = lower_bound(t, x);
  return i < t->n && compare_rows(t->rows + i * t->dim, x, t->dim) == 0;
}

static int reserve_rows(taken_set *t, size_t n, nas_err *err) {
  if (n <= t->cap) return 0;
  size_t cap = t->cap ? t->cap : 16;
  while (cap < n) cap *= 2;
  double *rows = realloc(t->rows, (cap * t->dim + 1) * sizeof *rows);
  if (!rows) return nas_errf(err, "optimizer: out of memory for %zu taken assignments", n);
  t->rows = rows;
  t->cap = cap;
  return 0;
}

int taken_add(taken_set *t, const double *x, nas_err *err) {
  if (reserve_rows(t, t->n + 1, err) < 0) return NAS_ERR;
  size_t i = lower_bound(t, x);
  memmove(t->rows + (i + 1) * t->dim, t->rows + i * t->dim, (t->n - i) * t->dim * sizeof *x);
  memcpy(t->rows + i * t->dim, x, t->dim * sizeof *x);
  t->n++;
  return 0;
}

/* Appends the snapped encoding of params unless it does not encode. Snapping an encoded
 * point fails only for want of memory, which is an error: a point left out could be
 * suggested again. */
static int append_assignment(taken_set *t, const json_t *params, nas_err *err) {
  if (reserve_rows(t, t->n + 1, err) < 0) return NAS_ERR;
  double *row = t->rows + t->n * t->dim;
  nas_err ignored;
  if (space_encode(t->sp, params, row, &ignored) < 0) return 0;
  if (space_snap(t->sp, row, err) < 0) return NAS_ERR;
  t->n++;
  return 0;
}

int taken_create(const space *sp, const observation *obs, size_t n_obs,
                 const json_t *const *pending, size_t n_pending, taken_set **out, nas_err *err) {
  *out = NULL;
  taken_set *t = calloc(1, sizeof *t);
  if (!t) return nas_errf(err, "optimizer: out of memory");
  t->sp = sp;
  t->dim = space_ndim(sp);
  int rc = reserve_rows(t, n_obs + n_pending + 1, err);
  for (size_t i = 0; rc == 0 && i < n_obs; i++) rc = append_assignment(t, obs[i].params, err);
  for (size_t i = 0; rc == 0 && i < n_pending; i++) rc = append_assignment(t, pending[i], err);
  if (rc < 0) {
    taken_free(t);
    return rc;
  }
  qsort_r(t->rows, t->n, t->dim * sizeof *t->rows, compare_rows_qsort, &t->dim);
  *out = t;
  return 0;
}

void taken_free(taken_set *t) {
  if (!t) return;
  free(t->rows);
  free(t);
}

static gsl_rng *stream_rng(long seed, int number, unsigned attempt, nas_err *err) {
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  if (!rng) {
    nas_errf(err, "optimizer: out of memory for a random generator");
    return NULL;
  }
  gsl_rng_set(rng, design_stream_seed(seed, (uint64_t)(unsigned)number | (uint64_t)attempt << 32));
  return rng;
}

int taken_random_point(const space *sp, long seed, int number, unsigned attempt, double *x,
                       nas_err *err) {
  size_t n_u = space_uniform_dims(sp);
  double *u = malloc((n_u + 1) * sizeof *u);
  gsl_rng *rng = u ? stream_rng(seed, number, attempt, err) : NULL;
  if (!rng) {
    free(u);
    return u ? NAS_ERR : nas_errf(err, "optimizer: out of memory");
  }
  for (size_t j = 0; j < n_u; j++) u[j] = gsl_rng_uniform(rng);
  space_from_uniform(sp, u, x);
  gsl_rng_free(rng);
  free(u);
  return 0;
}

/* ---- finite spaces ------------------------------------------------------------------------ */

/* Number of levels of each non-fixed parameter into radix; false when some parameter is
 * continuous or the product passes enumerate_limit (*count then undefined). */
static bool finite_radices(const space *sp, size_t *radix, size_t *count) {
  const space_dim *dims = space_dims(sp);
  size_t j = 0;
  *count = 1;
  for (size_t d = 0; d < space_ndim(sp); d++) {
    if (dims[d].kind == DIM_CONTINUOUS) return false;
    if (dims[d].kind == DIM_ONEHOT && dims[d].group_start != d) continue;
    radix[j++] = dims[d].n_levels;
    if (dims[d].n_levels > enumerate_limit / *count) return false;
    *count *= dims[d].n_levels;
  }
  return true;
}

/* Advances a mixed-radix counter; false once it wraps around. */
static bool next_levels(size_t *levels, const size_t *radix, size_t n) {
  for (size_t j = 0; j < n; j++) {
    if (++levels[j] < radix[j]) return true;
    levels[j] = 0;
  }
  return false;
}

/* Sorts n rows and drops repeats; returns how many distinct rows remain. */
static size_t sort_unique(double *rows, size_t n, size_t dim) {
  qsort_r(rows, n, dim * sizeof *rows, compare_rows_qsort, &dim);
  size_t unique = 0;
  for (size_t i = 0; i < n; i++)
    if (unique == 0 || compare_rows(rows + (unique - 1) * dim, rows + i * dim, dim))
      memmove(rows + unique++ * dim, rows + i * dim, dim * sizeof *rows);
  return unique;
}

/* Lists every assignment of a finite space into rows (count level lists, snapped, then
 * deduplicated: inactive parameters make several level lists one assignment), and keeps
 * the free ones first. *n_all gets the number of distinct assignments, *n_free the free. */
static int list_free(const taken_set *t, const size_t *radix, size_t n_radix, size_t count,
                     double *rows, size_t *n_all, size_t *n_free, nas_err *err) {
  size_t *levels = calloc(n_radix + 1, sizeof *levels);
  if (!levels) return nas_errf(err, "optimizer: out of memory");
  size_t n = 0;
  int rc = 0;
  do {
    space_from_levels(t->sp, levels, rows + n * t->dim);
    rc = space_snap(t->sp, rows + n * t->dim, err);
    n++;
  } while (rc == 0 && n < count && next_levels(levels, radix, n_radix));
  free(levels);
  if (rc < 0) return rc;
  *n_all = sort_unique(rows, n, t->dim);
  *n_free = 0;
  for (size_t i = 0; i < *n_all; i++)
    if (!taken_contains(t, rows + i * t->dim))
      memmove(rows + (*n_free)++ * t->dim, rows + i * t->dim, t->dim * sizeof *rows);
  return 0;
}

/* The fallback once random points keep colliding: a uniform pick among the free
 * assignments of a small finite space. */
static int take_listed(taken_set *t, long seed, int number, double *x, nas_err *err) {
  size_t n_u = space_uniform_dims(t->sp), count;
  size_t *radix = malloc((n_u + 1) * sizeof *radix);
  if (!radix) return nas_errf(err, "optimizer: out of memory");
  if (!finite_radices(t->sp, radix, &count)) {
    free(radix);
    return nas_errc(err, NAS_ENOTFOUND,
                    "optimizer: found no assignment that is not observed or pending in "
                    "%d random tries",
                    random_attempts);
  }
  double *rows = malloc((count * t->dim + 1) * sizeof *rows);
  size_t n_all = 0, n_free = 0;
  int rc = rows ? list_free(t, radix, n_u, count, rows, &n_all, &n_free, err)
                : nas_errf(err, "optimizer: out of memory");
  if (rc == 0 && n_free == 0)
    rc = nas_errc(err, NAS_ENOTFOUND,
                  "optimizer: search space exhausted: all %zu of its assignments are "
                  "observed (failed trials included: 'nas retry' runs one again) or pending",
                  n_all);
  gsl_rng *rng = rc == 0 ? stream_rng(seed, number, random_attempts, err) : NULL;
  if (rc == 0 && !rng) rc = NAS_ERR;
  if (rc == 0) {
    memcpy(x, rows + gsl_rng_uniform_int(rng, n_free) * t->dim, t->dim * sizeof *x);
    rc = taken_add(t, x, err);
  }
  gsl_rng_free(rng);
  free(rows);
  free(radix);
  return rc;
}

int taken_fresh(taken_set *t, long seed, int number, const double *candidate, double *x,
                nas_err *err) {
  for (unsigned attempt = 0; attempt < random_attempts; attempt++) {
    if (attempt == 0 && candidate)
      memmove(x, candidate, t->dim * sizeof *x);
    else if (taken_random_point(t->sp, seed, number, attempt, x, err) < 0)
      return NAS_ERR;
    if (space_snap(t->sp, x, err) < 0) return NAS_ERR;
    if (!taken_contains(t, x)) return taken_add(t, x, err);
  }
  return take_listed(t, seed, number, x, err);
}

int taken_suggest(const space *sp, long seed, const observation *obs, size_t n_obs,
                  const json_t *const *pending, size_t n_pending, size_t n, int first_number,
                  const double *candidates, json_t **out, nas_err *err) {
  size_t dim = space_ndim(sp);
  taken_set *t;
  if (taken_create(sp, obs, n_obs, pending, n_pending, &t, err) < 0) return NAS_ERR;
  double *x = malloc((dim + 1) * sizeof *x);
  int rc = x ? 0 : nas_errf(err, "optimizer: out of memory");
  size_t done = 0;
  for (; rc == 0 && done < n; done++) {
    int number = first_number + (int)done;
    const double *candidate = candidates ? candidates + done * dim : NULL;
    rc = taken_fresh(t, seed, number, candidate, x, err);
    if (rc == 0) rc = space_decode(sp, x, &out[done], err);
    if (rc < 0) nas_err_prefix(err, "trial %d", number);
  }
  for (size_t i = 0; rc < 0 && i < done; i++) {
    json_decref(out[i]);
    out[i] = NULL;
  }
  free(x);
  taken_free(t);
  return rc;
}
