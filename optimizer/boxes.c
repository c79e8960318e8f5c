/* optimizer/boxes.c: disjoint-box decomposition of the region a front leaves non-dominated,
 * and hypervolume improvement over it, exact and log-smoothed (see boxes.h).
 *
 * Decomposition by slicing: sort the points by the last objective, a_1 ≤ … ≤ a_k. In the
 * slab a_i ≤ z_m < a_{i+1} exactly the points 1..i can dominate z, so the slab's part of
 * the region is the (m−1)-objective region of their projections, times [a_i, a_{i+1}); below
 * a_1 nothing dominates. A point whose projection is weakly dominated by an earlier one
 * leaves the projected region unchanged, so it opens no new slab. In one objective the
 * region is the single interval (−∞, min(r, min P)). Slabs are disjoint and so are the
 * boxes inside each, so the boxes are disjoint. */
#include "optimizer/boxes.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void box_list_clear(box_list *b) {
  free(b->lower);
  free(b->upper);
  b->lower = b->upper = NULL;
  b->n = b->cap = 0;
}

/* The state of one decomposition: the points, and the bounds fixed by the slabs of the
 * objectives above the one being sliced. */
typedef struct {
  const double *P;
  size_t m;
  const double *ref;
  double *lo, *up; /* m: bounds of the current slab in objectives >= the current level */
  box_list *out;
  nas_err *err;
} slicer;

static int emit_box(slicer *s) {
  box_list *b = s->out;
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    double *lower = realloc(b->lower, cap * b->m * sizeof *lower);
    if (!lower) return nas_errf(s->err, "boxes: out of memory for %zu boxes", cap);
    b->lower = lower;
    double *upper = realloc(b->upper, cap * b->m * sizeof *upper);
    if (!upper) return nas_errf(s->err, "boxes: out of memory for %zu boxes", cap);
    b->upper = upper;
    b->cap = cap;
  }
  memcpy(b->lower + b->n * b->m, s->lo, b->m * sizeof *s->lo);
  memcpy(b->upper + b->n * b->m, s->up, b->m * sizeof *s->up);
  b->n++;
  return NAS_OK;
}

/* Whether point q weakly dominates point p in the first `dims` objectives. */
static bool weakly_dominates(const double *q, const double *p, size_t dims) {
  for (size_t j = 0; j < dims; j++)
    if (q[j] > p[j]) return false;
  return true;
}

/* Sorts idx[0..k) by objective `obj` of the points (insertion sort: fronts are small). */
static void sort_by(const double *P, size_t m, size_t obj, size_t *idx, size_t k) {
  for (size_t i = 1; i < k; i++) {
    size_t v = idx[i], j = i;
    while (j > 0 && P[idx[j - 1] * m + obj] > P[v * m + obj]) {
      idx[j] = idx[j - 1];
      j--;
    }
    idx[j] = v;
  }
}

static int slice(slicer *s, const size_t *idx, size_t k, size_t level);

/* The slab [from, to) of objective level−1, holding the active points. */
static int slab(slicer *s, const size_t *active, size_t n_active, size_t level, double from,
                double to) {
  if (!(from < to)) return NAS_OK;
  s->lo[level - 1] = from;
  s->up[level - 1] = to;
  return slice(s, active, n_active, level - 1);
}

/* Boxes of the region left by points idx[0..k) in objectives 0..level−1. */
static int slice(slicer *s, const size_t *idx, size_t k, size_t level) {
  size_t obj = level - 1;
  if (level == 1) {
    double top = s->ref[0];
    for (size_t i = 0; i < k; i++) top = fmin(top, s->P[idx[i] * s->m]);
    s->lo[0] = -HUGE_VAL;
    s->up[0] = top;
    return emit_box(s);
  }
  size_t *order = malloc((2 * k + 1) * sizeof *order), *active = order + k, n_active = 0;
  if (!order) return nas_errf(s->err, "boxes: out of memory");
  memcpy(order, idx, k * sizeof *idx);
  sort_by(s->P, s->m, obj, order, k);
  double from = -HUGE_VAL;
  int rc = NAS_OK;
  for (size_t i = 0; i < k && rc == NAS_OK; i++) {
    const double *p = s->P + order[i] * s->m;
    bool covered = false;
    for (size_t a = 0; a < n_active && !covered; a++)
      covered = weakly_dominates(s->P + active[a] * s->m, p, obj);
    if (covered) continue;
    rc = slab(s, active, n_active, level, from, p[obj]);
    from = p[obj];
    active[n_active++] = order[i];
  }
  if (rc == NAS_OK) rc = slab(s, active, n_active, level, from, s->ref[obj]);
  free(order);
  return rc;
}

int box_decompose(const double *P, size_t k, size_t m, const double *ref, box_list *out,
                  nas_err *err) {
  out->m = m;
  size_t *inside = malloc((k + 1) * sizeof *inside), n_inside = 0;
  double *bounds = malloc(2 * m * sizeof *bounds);
  if (!inside || !bounds) {
    free(inside);
    free(bounds);
    return nas_errf(err, "boxes: out of memory for %zu points", k);
  }
  for (size_t i = 0; i < k; i++) {
    bool below = true;
    for (size_t j = 0; j < m; j++) below = below && P[i * m + j] < ref[j];
    if (below) inside[n_inside++] = i;
  }
  slicer s = {.P = P, .m = m, .ref = ref, .lo = bounds, .up = bounds + m, .out = out, .err = err};
  int rc = slice(&s, inside, n_inside, m);
  free(inside);
  free(bounds);
  return rc;
}

double box_hvi(const box_list *b, size_t first, size_t count, const double *y) {
  double total = 0;
  for (size_t k = first; k < first + count; k++) {
    double vol = 1;
    for (size_t j = 0; j < b->m && vol > 0; j++)
      vol *= fmax(0.0, b->upper[k * b->m + j] - fmax(b->lower[k * b->m + j], y[j]));
    total += vol;
  }
  return total;
}

/* τ·sp(t/τ) and d log(τ·sp(t/τ))/dt = 1/√(τ² + t²); for t < 0 in the cancellation-free
 * form sp(s) = 1/(2(√(1 + s²) − s)). */
static double smooth_relu(double t, double tau, double *dlog) {
  double q = hypot(tau, t);
  *dlog = 1.0 / q;
  return t >= 0 ? 0.5 * (t + q) : 0.5 * tau * tau / (q - t);
}

/* The upper bound of box k in objective j: its own, or cap[j] when that is lower (cap NULL:
 * none); *moves is whether the bound is the cap and the cap moves with y (dcap). */
static double box_upper(const box_list *b, size_t k, size_t j, const box_cap *cap,
                        bool *moves) {
  double up = b->upper[k * b->m + j];
  *moves = false;
  if (!cap || !(cap->upper[j] < up)) return up;
  *moves = cap->moves[j];
  return cap->upper[j];
}

/* The factor of box k in objective j at y (smoothed), its d log/dt into *dlog and dt/dy_j
 * into *slope. */
static double box_factor(const box_list *b, size_t k, size_t j, const double *y,
                         const box_cap *cap, double tau, double *dlog, double *slope) {
  bool moves, clipped = y[j] > b->lower[k * b->m + j]; /* y sets this side of the overlap */
  double up = box_upper(b, k, j, cap, &moves);
  *slope = (moves ? 1.0 : 0.0) - (clipped ? 1.0 : 0.0);
  return smooth_relu(up - (clipped ? y[j] : b->lower[k * b->m + j]), tau, dlog);
}

/* The sum of the boxes' smoothed volumes, accumulated in linear space: every factor is at
 * least about τ²/(4|t|), so for m ≤ 4 and sane outcomes the products stay far above the
 * underflow limit; box_log_hvi falls back to log space if they ever do not. */
static double smoothed_volume(const box_list *b, size_t first, size_t count, const double *y,
                              const box_cap *cap, double tau, double *grad) {
  size_t m = b->m;
  double total = 0, dlog[m > 0 ? m : 1], slope[m > 0 ? m : 1];
  for (size_t k = first; k < first + count; k++) {
    double vol = 1;
    for (size_t j = 0; j < m; j++) vol *= box_factor(b, k, j, y, cap, tau, &dlog[j], &slope[j]);
    total += vol;
    for (size_t j = 0; grad && j < m; j++) grad[j] += vol * dlog[j] * slope[j];
  }
  return total;
}

/* Log of box k's smoothed volume; dv (m) receives its gradient in y. */
static double box_log_volume(const box_list *b, size_t k, const double *y, const box_cap *cap,
                             double tau, double *dv) {
  double v = 0, dlog, slope;
  for (size_t j = 0; j < b->m; j++) {
    v += log(box_factor(b, k, j, y, cap, tau, &dlog, &slope));
    dv[j] = dlog * slope;
  }
  return v;
}

/* The same sum as log-sum-exp of the boxes' log volumes (gradient weighted by softmax). */
static double smoothed_log_volume(const box_list *b, size_t first, size_t count,
                                  const double *y, const box_cap *cap, double tau,
                                  double *grad) {
  size_t m = b->m;
  double max = -HUGE_VAL, sum = 0, dv[m > 0 ? m : 1];
  for (size_t k = first; k < first + count; k++)
    max = fmax(max, box_log_volume(b, k, y, cap, tau, dv));
  for (size_t k = first; k < first + count; k++) {
    double w = exp(box_log_volume(b, k, y, cap, tau, dv) - max);
    sum += w;
    for (size_t j = 0; grad && j < m; j++) grad[j] += w * dv[j];
  }
  for (size_t j = 0; grad && j < m; j++) grad[j] /= sum;
  return max + log(sum);
}

double box_log_hvi_capped(const box_list *b, size_t first, size_t count, const double *y,
                          const box_cap *cap, double tau, double *grad) {
  if (grad) memset(grad, 0, b->m * sizeof *grad);
  if (count == 0) return -HUGE_VAL;
  double total = smoothed_volume(b, first, count, y, cap, tau, grad);
  if (total > 0 && isfinite(total)) {
    for (size_t j = 0; grad && j < b->m; j++) grad[j] /= total;
    return log(total);
  }
  if (grad) memset(grad, 0, b->m * sizeof *grad);
  return smoothed_log_volume(b, first, count, y, cap, tau, grad);
}

double box_log_hvi(const box_list *b, size_t first, size_t count, const double *y, double tau,
                   double *grad) {
  return box_log_hvi_capped(b, first, count, y, NULL, tau, grad);
}
