/* optimizer/pareto.c: Pareto fronts, non-dominated sorting and reference points
 * (pareto_mask, pareto_ranks, pareto_reference_point in optimizer.h): two objectives by a
 * sort and a sweep, O(n log n); more by the pairwise test.
 *
 * Rows are points to be minimised. Row a dominates row b when a <= b in every objective and
 * a < b in at least one; so identical rows do not dominate each other and both stay on the
 * front. A row with a NaN is never on a front, dominates nothing and gets rank -1.
 * Invariant: nothing here depends on the order of the rows except the order of the output. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "optimizer/optimizer.h"

static bool row_has_nan(const double *y, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (isnan(y[j])) return true;
  return false;
}

static bool dominates(const double *a, const double *b, size_t m) {
  bool strictly = false;
  for (size_t j = 0; j < m; j++) {
    if (a[j] > b[j]) return false;
    if (a[j] < b[j]) strictly = true;
  }
  return strictly;
}

/* Whether row i of Y is on the front: no NaN and no valid row dominates it. */
static bool on_front(const double *Y, size_t n, size_t m, size_t i) {
  if (row_has_nan(Y + i * m, m)) return false;
  for (size_t k = 0; k < n; k++)
    if (k != i && !row_has_nan(Y + k * m, m) && dominates(Y + k * m, Y + i * m, m)) return false;
  return true;
}

/* ---- the front of two objectives in O(n log n) ------------------------------------------
 * Sorted by the first objective, then the second, a row is dominated exactly when a row of
 * a smaller first value has a second value <= its own (strictly better in the first), or a
 * row of the same first value has a smaller second value (strictly better in the second).
 * So one sweep over the groups of equal first values keeps, in each group, the rows at the
 * group's least second value when that value is below every earlier group's. Equal rows
 * stay together, as in the pairwise test. */

typedef struct {
  double first, second;
  size_t row;
} point2;

static int cmp_point2(const void *a, const void *b) {
  const point2 *x = a, *y = b;
  if (x->first != y->first) return x->first < y->first ? -1 : 1;
  return (x->second > y->second) - (x->second < y->second);
}

/* mask for m = 2; false when out of memory (mask then untouched). */
static bool front_of_two(const double *Y, size_t n, bool *mask) {
  point2 *points = malloc((n ? n : 1) * sizeof *points);
  if (!points) return false;
  size_t n_valid = 0;
  for (size_t i = 0; i < n; i++) {
    mask[i] = false;
    if (!row_has_nan(Y + 2 * i, 2)) points[n_valid++] = (point2){Y[2 * i], Y[2 * i + 1], i};
  }
  qsort(points, n_valid, sizeof *points, cmp_point2);
  double best_before = INFINITY; /* least second value of the groups so far */
  bool any_before = false;       /* (INFINITY cannot say "none": a row may hold it) */
  for (size_t g = 0; g < n_valid;) {
    double least = points[g].second; /* sorted: the group's first row holds its least */
    bool kept = !any_before || least < best_before;
    size_t k = g;
    for (; k < n_valid && points[k].first == points[g].first; k++)
      mask[points[k].row] = kept && points[k].second == least;
    best_before = fmin(best_before, least);
    any_before = true;
    g = k;
  }
  free(points);
  return true;
}

void pareto_mask(const double *Y, size_t n, size_t m, bool *mask) {
  if (m == 2 && front_of_two(Y, n, mask)) return;
  for (size_t i = 0; i < n; i++) mask[i] = on_front(Y, n, m, i);
}

/* ---- non-dominated sorting ----------------------------------------------------------------
 * Deb's fast non-dominated sort: one O(n² m) pass records, for each row, which rows it
 * dominates (a bit matrix, n²/8 bytes) and how many rows dominate it; the fronts are then
 * peeled off by counting down, O(n²) in all. */

typedef struct {
  size_t n, words_per_row;
  uint64_t *bits; /* bits[i·words_per_row …]: rows that row i dominates */
  size_t *n_dominators;
} dominance;

static int dominance_build(const double *Y, size_t n, size_t m, const bool *valid, dominance *d,
                           nas_err *err) {
  d->n = n;
  d->words_per_row = (n + 63) / 64;
  if (n && d->words_per_row > SIZE_MAX / sizeof(uint64_t) / n)
    return nas_errf(err, "pareto_ranks: %zu rows are too many", n);
  d->bits = calloc(n * d->words_per_row + 1, sizeof *d->bits);
  d->n_dominators = calloc(n + 1, sizeof *d->n_dominators);
  if (!d->bits || !d->n_dominators) {
    free(d->bits);
    free(d->n_dominators);
    return nas_errf(err, "pareto_ranks: out of memory for %zu rows", n);
  }
  for (size_t i = 0; i < n; i++) {
    for (size_t k = i + 1; valid[i] && k < n; k++) {
      if (!valid[k]) continue;
      size_t winner = i, loser = k;
      if (!dominates(Y + i * m, Y + k * m, m)) {
        if (!dominates(Y + k * m, Y + i * m, m)) continue;
        winner = k;
        loser = i;
      }
      d->bits[winner * d->words_per_row + loser / 64] |= UINT64_C(1) << (loser % 64);
      d->n_dominators[loser]++;
    }
  }
  return 0;
}

static void dominance_free(dominance *d) {
  free(d->bits);
  free(d->n_dominators);
}

/* Gives rank r to the rows of front[0..n_front), and writes the next front, the rows whose
 * last dominator is in this one, into next; returns its size. */
static size_t peel_front(dominance *d, const size_t *front, size_t n_front, int r, int *rank,
                         size_t *next) {
  size_t n_next = 0;
  for (size_t f = 0; f < n_front; f++) {
    size_t i = front[f];
    rank[i] = r;
    const uint64_t *row = d->bits + i * d->words_per_row;
    for (size_t w = 0; w < d->words_per_row; w++) {
      for (uint64_t bits = row[w]; bits; bits &= bits - 1) {
        size_t k = w * 64 + (size_t)__builtin_ctzll(bits);
        if (--d->n_dominators[k] == 0) next[n_next++] = k;
      }
    }
  }
  return n_next;
}

int pareto_ranks(const double *Y, size_t n, size_t m, int *rank, nas_err *err) {
  bool *valid = malloc(n + 1);
  size_t *front = malloc((n + 1) * sizeof *front), *next = malloc((n + 1) * sizeof *next);
  dominance d = {0};
  int rc = valid && front && next ? 0 : nas_errf(err, "pareto_ranks: out of memory");
  for (size_t i = 0; rc == 0 && i < n; i++) valid[i] = !row_has_nan(Y + i * m, m);
  if (rc == 0) rc = dominance_build(Y, n, m, valid, &d, err);
  if (rc == 0) {
    size_t n_front = 0;
    for (size_t i = 0; i < n; i++) {
      rank[i] = -1;
      if (valid[i] && d.n_dominators[i] == 0) front[n_front++] = i;
    }
    for (int r = 0; n_front > 0; r++) {
      n_front = peel_front(&d, front, n_front, r, rank, next);
      size_t *swap = front;
      front = next;
      next = swap;
    }
    dominance_free(&d);
  }
  free(valid);
  free(front);
  free(next);
  return rc;
}

/* ---- reference point ----------------------------------------------------------------------
 * Per objective: the threshold when the spec gives one (negated for maximised objectives).
 * Otherwise the nadir of the front (the worst value among front rows) pushed out by 10% of
 * the range of the observed values; when all observed values are equal the push is
 * 1e-6·(1 + |nadir|), so that the front still has a volume. Only rows whose values are all
 * finite take part; with none, the coordinate is NaN (no reference yet). */

static bool row_finite(const double *y, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (!isfinite(y[j])) return false;
  return true;
}

/* Whether finite row i is on the front of the finite rows. */
static bool on_finite_front(const double *Y, size_t n, size_t m, size_t i) {
  for (size_t k = 0; k < n; k++)
    if (k != i && row_finite(Y + k * m, m) && dominates(Y + k * m, Y + i * m, m)) return false;
  return true;
}

/* The inferred coordinate j (nadir + margin) and its margin, into *margin. */
static double inferred_reference(const double *Y, size_t n, size_t m, size_t j, double *margin) {
  double low = INFINITY, high = -INFINITY, nadir = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    if (!row_finite(Y + i * m, m)) continue;
    double v = Y[i * m + j];
    low = fmin(low, v);
    high = fmax(high, v);
    if (v > nadir && on_finite_front(Y, n, m, i)) nadir = v;
  }
  *margin = NAN;
  if (!(low <= high)) return NAN;
  double range = pareto_range(low, high);
  *margin = range > 0 ? 0.1 * range : 1e-6 * (1 + fabs(nadir));
  return fmin(nadir + *margin, DBL_MAX); /* finite: a stored reference is JSON */
}

double pareto_range(double low, double high) { return fmin(high - low, DBL_MAX); }

void pareto_reference_margins(const spec *s, const double *Y, size_t n, double *ref,
                              double *margin) {
  size_t m = s->n_objectives;
  for (size_t j = 0; j < m; j++) {
    const objective_spec *o = &s->objectives[j];
    if (o->has_threshold) {
      ref[j] = o->goal == GOAL_MAXIMIZE ? -o->threshold : o->threshold;
      margin[j] = 0;
    } else {
      ref[j] = inferred_reference(Y, n, m, j, &margin[j]);
    }
  }
}

void pareto_reference_point(const spec *s, const double *Y, size_t n, double *ref) {
  double margin[s->n_objectives + 1];
  pareto_reference_margins(s, Y, n, ref, margin);
}
