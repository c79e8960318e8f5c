/* optimizer/hypervolume.c: the volume a set of points dominates up to a reference point
 * (hypervolume in optimizer.h), exactly.
 *
 * Only points strictly better than ref in every objective count (NaN never is). Then:
 * - m = 1: ref - min.
 * - m = 2: sort by the first objective and sum the staircase, O(n log n).
 * - m = 3: sweep over the third objective keeping the 2-D front of the points seen so far
 *   and its area (see the section "three objectives"), O(n log n).
 * - m >= 4: WFG (While, Bradstreet, Barone 2012): with the points sorted worst-first in the
 *   last objective, the part of point k's box that no later point covers is a slab of
 *   height ref_m - y_k,m over an (m-1)-dimensional region: k's own box minus the boxes of
 *   the later points bounded by k (componentwise max, "limited"), whose non-dominated
 *   subset's volume is again a hypervolume, computed the same way down to m = 3.
 * Out of memory: NaN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"

/* ---- two objectives ---------------------------------------------------------------------- */

static int compare_first(const void *a, const void *b) {
  const double *p = a, *q = b;
  if (p[0] != q[0]) return p[0] < q[0] ? -1 : 1;
  return (p[1] > q[1]) - (p[1] < q[1]);
}

/* pts: n×2, sorted in place. */
static double hv2(double *pts, size_t n, const double *ref) {
  qsort(pts, n, 2 * sizeof *pts, compare_first);
  double volume = 0, lowest = ref[1];
  for (size_t i = 0; i < n; i++) {
    const double *p = pts + 2 * i;
    if (p[1] >= lowest) continue; /* dominated by an earlier point */
    volume += (ref[0] - p[0]) * (lowest - p[1]);
    lowest = p[1];
  }
  return volume;
}

/* ---- three objectives ---------------------------------------------------------------------
 * Points are added in increasing z. Between two z values the dominated region's cross
 * section is the area A dominated by the (x, y) of the points added so far, so the volume is
 * the sum of A·Δz. The 2-D front of those points is kept sorted by x (y then decreases),
 * and A is updated as points enter: a new point q is either dominated by its predecessor in
 * x (A unchanged), or it adds the rectangle [qx, rx]×[qy, y_pred] minus what the points
 * after it already covered there; those that q dominates (y >= qy) leave the front. Each
 * point enters and leaves once, so the updates cost O(n) in all beyond the look-ups.
 * The front is a set of x-ranks (positions in the points sorted by (x, y), so equal x ties
 * break towards smaller y, which dominates) held in a 64-ary tree of bit words: membership,
 * predecessor and successor take O(log_64 n) word operations, hence O(n log n) in all,
 * dominated by the two sorts. */

enum { rank_set_max_levels = 12 }; /* 64^11 > 2^64 */

typedef struct {
  size_t levels;
  size_t n_words[rank_set_max_levels];
  uint64_t *words[rank_set_max_levels]; /* level 0: one bit per rank; level l+1: one bit
                                           per non-zero word of level l */
  uint64_t *block;                      /* owns all the words */
} rank_set;

static int rank_set_init(rank_set *s, size_t n) {
  size_t total = 0;
  s->levels = 0;
  for (size_t size = n;; size = (size + 63) / 64) {
    s->n_words[s->levels] = (size + 63) / 64;
    total += s->n_words[s->levels++];
    if (s->n_words[s->levels - 1] <= 1) break;
  }
  s->block = calloc(total, sizeof *s->block);
  if (!s->block) return NAS_ERR;
  for (size_t l = 0, offset = 0; l < s->levels; offset += s->n_words[l++])
    s->words[l] = s->block + offset;
  return 0;
}

static void rank_set_insert(rank_set *s, size_t key) {
  for (size_t l = 0; l < s->levels; l++, key /= 64) {
    uint64_t before = s->words[l][key / 64];
    s->words[l][key / 64] = before | UINT64_C(1) << (key % 64);
    if (before) return; /* the levels above knew this word already */
  }
}

static void rank_set_remove(rank_set *s, size_t key) {
  for (size_t l = 0; l < s->levels; l++, key /= 64) {
    s->words[l][key / 64] &= ~(UINT64_C(1) << (key % 64));
    if (s->words[l][key / 64]) return;
  }
}

/* From a set bit at level `level`, goes down to the smallest (or largest) rank below it. */
static size_t rank_set_descend(const rank_set *s, size_t level, size_t key, bool largest) {
  while (level-- > 0) {
    uint64_t w = s->words[level][key];
    key = key * 64 + (size_t)(largest ? 63 - __builtin_clzll(w) : __builtin_ctzll(w));
  }
  return key;
}

/* The smallest member > key. */
static bool rank_set_next(const rank_set *s, size_t key, size_t *out) {
  size_t want = key + 1; /* at each level: the smallest index worth looking at */
  for (size_t l = 0; l < s->levels; l++, want = want / 64 + 1) {
    if (want / 64 >= s->n_words[l]) return false;
    uint64_t bits =
        want % 64 ? s->words[l][want / 64] & (~UINT64_C(0) << (want % 64)) : s->words[l][want / 64];
    if (bits) {
      *out = rank_set_descend(s, l, want / 64 * 64 + (size_t)__builtin_ctzll(bits), false);
      return true;
    }
  }
  return false;
}

/* The largest member < key. */
static bool rank_set_prev(const rank_set *s, size_t key, size_t *out) {
  if (key == 0) return false;
  size_t want = key - 1; /* at each level: the largest index worth looking at */
  for (size_t l = 0; l < s->levels; l++) {
    uint64_t keep = want % 64 == 63 ? ~UINT64_C(0) : (UINT64_C(1) << (want % 64 + 1)) - 1;
    uint64_t bits = s->words[l][want / 64] & keep;
    if (bits) {
      *out = rank_set_descend(s, l, want / 64 * 64 + (size_t)(63 - __builtin_clzll(bits)), true);
      return true;
    }
    if (want / 64 == 0) return false;
    want = want / 64 - 1;
  }
  return false;
}

/* The 2-D front of the sweep: ranks in a set, coordinates by rank, and its area. */
typedef struct {
  rank_set members;
  const double *x, *y; /* by rank */
  const double *ref;
  double area;
} front2;

/* Adds the point of rank r to the front, updating the area. */
static void front2_add(front2 *f, size_t r) {
  double qx = f->x[r], qy = f->y[r];
  size_t k;
  double top = f->ref[1];
  if (rank_set_prev(&f->members, r, &k)) {
    if (f->y[k] <= qy) return; /* dominated: x[k] <= qx too */
    top = f->y[k];
  }
  /* What the points after q already cover of [qx, rx]×[qy, top], as a staircase. */
  double covered = 0, ceiling = top;
  while (rank_set_next(&f->members, r, &k) && f->y[k] >= qy) {
    covered += (f->ref[0] - f->x[k]) * (ceiling - f->y[k]);
    ceiling = f->y[k];
    rank_set_remove(&f->members, k);
  }
  if (rank_set_next(&f->members, r, &k)) covered += (f->ref[0] - f->x[k]) * (ceiling - qy);
  f->area += (f->ref[0] - qx) * (top - qy) - covered;
  rank_set_insert(&f->members, r);
}

static int compare_third(const void *a, const void *b) {
  const double *p = a, *q = b;
  return (p[2] > q[2]) - (p[2] < q[2]);
}

/* Orders indices by (x, y) of the rows of a 3-column matrix: qsort_r context. */
static int compare_xy(const void *a, const void *b, void *rows) {
  const double *p = (const double *)rows + 3 * *(const size_t *)a;
  const double *q = (const double *)rows + 3 * *(const size_t *)b;
  if (p[0] != q[0]) return p[0] < q[0] ? -1 : 1;
  return (p[1] > q[1]) - (p[1] < q[1]);
}

/* pts: n×3, sorted in place by z. */
static double hv3(double *pts, size_t n, const double *ref) {
  qsort(pts, n, 3 * sizeof *pts, compare_third);
  size_t *by_xy = malloc((n + 1) * sizeof *by_xy), *rank = malloc((n + 1) * sizeof *rank);
  double *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y);
  front2 f = {.x = x, .y = y, .ref = ref};
  double volume = NAN;
  if (by_xy && rank && x && y && rank_set_init(&f.members, n) == 0) {
    for (size_t i = 0; i < n; i++) by_xy[i] = i;
    qsort_r(by_xy, n, sizeof *by_xy, compare_xy, pts);
    for (size_t r = 0; r < n; r++) {
      rank[by_xy[r]] = r;
      x[r] = pts[3 * by_xy[r]];
      y[r] = pts[3 * by_xy[r] + 1];
    }
    volume = 0;
    for (size_t i = 0; i < n; i++) {
      front2_add(&f, rank[i]);
      double next_z = i + 1 < n ? pts[3 * (i + 1) + 2] : ref[2];
      volume += f.area * (next_z - pts[3 * i + 2]);
    }
    free(f.members.block);
  }
  free(by_xy);
  free(rank);
  free(x);
  free(y);
  return volume;
}

/* ---- four or more objectives: WFG --------------------------------------------------------- */

static bool weakly_dominates(const double *a, const double *b, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (a[j] > b[j]) return false;
  return true;
}

/* Keeps the non-dominated rows of pts (n×m) in place, one of each set of equal rows;
 * returns how many. O(n² m). */
static size_t keep_nondominated(double *pts, size_t n, size_t m) {
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    const double *p = pts + i * m;
    bool dominated = false;
    /* Rows before i that were dropped are dominated by a kept one, so comparing with the
     * kept rows and the rows after i suffices. */
    for (size_t k = 0; k < kept && !dominated; k++) dominated = weakly_dominates(pts + k * m, p, m);
    for (size_t k = i + 1; k < n && !dominated; k++)
      dominated = weakly_dominates(pts + k * m, p, m) && !weakly_dominates(p, pts + k * m, m);
    if (!dominated) memmove(pts + kept++ * m, p, m * sizeof *p);
  }
  return kept;
}

static int compare_last_desc(const void *a, const void *b, void *m) {
  double p = ((const double *)a)[*(size_t *)m - 1], q = ((const double *)b)[*(size_t *)m - 1];
  return (p < q) - (p > q);
}

static double box_volume(const double *p, const double *ref, size_t m) {
  double v = 1;
  for (size_t j = 0; j < m; j++) v *= ref[j] - p[j];
  return v;
}

/* Hypervolume of pts (n×m, non-dominated, reordered in place) for m >= 3. scratch holds
 * n·(m-1) doubles for each of the levels below m down to 3 (the limited sets). */
static double wfg(double *pts, size_t n, size_t m, const double *ref, double *scratch) {
  if (m == 3) return hv3(pts, n, ref);
  size_t mm = m;
  qsort_r(pts, n, m * sizeof *pts, compare_last_desc, &mm);
  double volume = 0, *limited = scratch, *deeper = scratch + n * (m - 1);
  for (size_t k = 0; k < n; k++) {
    const double *p = pts + k * m;
    size_t n_limited = 0;
    for (size_t i = k + 1; i < n; i++, n_limited++)
      for (size_t j = 0; j + 1 < m; j++)
        limited[n_limited * (m - 1) + j] = fmax(p[j], pts[i * m + j]);
    n_limited = keep_nondominated(limited, n_limited, m - 1);
    double covered = n_limited ? wfg(limited, n_limited, m - 1, ref, deeper) : 0;
    volume += (ref[m - 1] - p[m - 1]) * (box_volume(p, ref, m - 1) - covered);
  }
  return volume;
}

/* ---- entry --------------------------------------------------------------------------------- */

static bool strictly_inside(const double *y, const double *ref, size_t m) {
  for (size_t j = 0; j < m; j++)
    if (!(y[j] < ref[j])) return false;
  return true;
}

static double hypervolume_of(double *pts, size_t n, size_t m, const double *ref) {
  if (m == 1) {
    double best = pts[0];
    for (size_t i = 1; i < n; i++) best = fmin(best, pts[i]);
    return ref[0] - best;
  }
  if (m == 2) return hv2(pts, n, ref);
  if (m == 3) return hv3(pts, n, ref);
  n = keep_nondominated(pts, n, m);
  double *scratch = malloc((n * (m - 1) * (m - 3) + 1) * sizeof *scratch);
  double volume = scratch ? wfg(pts, n, m, ref, scratch) : NAN;
  free(scratch);
  return volume;
}

double pareto_hypervolume(const double *Y, size_t n, size_t m, const double *ref) {
  if (m == 0) return 0;
  double *pts = malloc((n * m + 1) * sizeof *pts);
  if (!pts) return NAN;
  size_t inside = 0;
  for (size_t i = 0; i < n; i++)
    if (strictly_inside(Y + i * m, ref, m)) memcpy(pts + inside++ * m, Y + i * m, m * sizeof *pts);
  double volume = inside ? hypervolume_of(pts, inside, m, ref) : 0;
  free(pts);
  return volume;
}
