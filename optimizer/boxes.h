/* optimizer/boxes.h: the region a Pareto front does not dominate, as disjoint boxes, and the
 * hypervolume improvement of a point computed over them (internal to optimizer/).
 *
 * All objectives are minimised. For a front P and reference point r, the non-dominated
 * region is {z < r : no p in P has p ≤ z}; it is cut into disjoint axis-aligned boxes
 * [lower, upper) whose lower bounds may be −∞. The hypervolume improvement of y is then
 *   HVI(y) = Σ_boxes Π_j max(0, upper_j − max(lower_j, y_j)),
 * which box_log_hvi smooths in log space (Ament et al. 2023) so that its gradient never
 * vanishes, even where y improves nothing. */
#ifndef NAS_OPTIMIZER_BOXES_H
#define NAS_OPTIMIZER_BOXES_H

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

typedef struct {
  size_t m;      /* objectives */
  size_t n;      /* boxes */
  size_t cap;    /* allocated boxes */
  double *lower; /* n×m; -HUGE_VAL where unbounded */
  double *upper; /* n×m */
} box_list;

/* Appends to out (whose m must equal m; zero-initialise it before the first call) the boxes
 * of the region that the k points of P (k×m) leave non-dominated below ref. Points not
 * strictly below ref in every objective dominate nothing there and are ignored; dominated
 * points are allowed. Built by slicing along the last objective and recursing on the
 * others, O(k^(m−1)) boxes at most (fine for the m ≤ 4 it serves). */
int box_decompose(const double *P, size_t k, size_t m, const double *ref, box_list *out,
                  nas_err *err);
void box_list_clear(box_list *b);

/* Exact HVI(y) over boxes first..first+count−1 of b. */
double box_hvi(const box_list *b, size_t first, size_t count, const double *y);

/* Smoothed log HVI(y) over boxes first..first+count−1: each factor max(0, t) becomes
 * τ·sp(t/τ) with sp(s) = (s + √(1 + s²))/2, a smooth ReLU whose tail decays like 1/|s|
 * (so log sp(s) = asinh(s) − log 2 and its slope 1/√(1 + s²) never vanishes); the boxes'
 * volumes are summed by log-sum-exp. grad (m values, or NULL) receives ∂/∂y. Returns
 * -HUGE_VAL when count is 0. */
double box_log_hvi(const box_list *b, size_t first, size_t count, const double *y, double tau,
                   double *grad);

/* Upper bounds that clip every box (the reference point of a hypervolume improvement, when
 * the boxes were built against a farther one), and per objective whether the bound moves
 * with y (∂upper_j/∂y_j = 1, else 0). */
typedef struct {
  const double *upper; /* m */
  const bool *moves;   /* m */
} box_cap;

/* box_log_hvi over the boxes clipped to cap->upper (cap NULL: as box_log_hvi). */
double box_log_hvi_capped(const box_list *b, size_t first, size_t count, const double *y,
                          const box_cap *cap, double tau, double *grad);

#endif
