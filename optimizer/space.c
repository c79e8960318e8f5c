/* optimizer/space.c: the search space as a unit cube (space_* in optimizer.h and design.h).
 *
 * Each non-fixed parameter owns a block of dimensions: one for a float or an int, one per
 * choice for a categorical. A numeric parameter is an `axis`: a range, a scale (linear or
 * log) and, when discrete, a list of levels.
 *
 * Invariants:
 * - decode∘encode is the identity on every assignment decode can produce (so every
 *   suggestion reads back exactly), on ints, stepped values, choices, both ends of every
 *   range and on floats as people write them (below); hence space_snap is idempotent.
 * - Position 0 belongs to `low` alone and position 1 to `high` alone; positions of interior
 *   values lie strictly inside (0, 1).
 * - Inactive parameters sit at their pinned value: 0.5, or all zeros in a one-hot group.
 *
 * Why floats need care: a double per dimension cannot tell every double of a range apart
 * (there are more doubles in [1e-5, 1e-1] than in [0.5, 1]), so several values can share a
 * position: a class. Decode returns a canonical member of the class nearest to x, the one
 * with the shortest decimal form (0 when the class holds it), so every decoded value is a
 * fixed point of decode∘encode, and a value a person writes (0.001, 0, 3e-4) comes back as
 * itself. A value comes back changed only when a decimal with fewer digits lies within the
 * encoding's resolution of it (a few ulps of the range, or of the value on a log scale):
 * a random 17-digit double does, and returns as that neighbour. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/design.h"
#include "optimizer/optimizer.h"

/* A float or int parameter's range in the cube. */
typedef struct {
  double low, high; /* values at positions 0 and 1 (discrete: first and last level) */
  bool log;         /* positions are linear in log(value) */
  double t_low;     /* low on the position scale: log(low) or low */
  double t_span;    /* high - low on the position scale; 0 for a single value */
  size_t n_levels;  /* 0: continuous; else levels low + k·step, k < n_levels */
  double step;
  bool integer; /* values are integers, written as JSON integers */
} axis;

/* Where a parameter lives in the cube. */
typedef struct {
  size_t dim; /* first dimension; SIZE_MAX for fixed parameters */
  axis ax;    /* PARAM_FLOAT and PARAM_INT only */
} param_layout;

struct space {
  const spec *s;   /* borrowed */
  space_dim *dims; /* ndim entries */
  size_t ndim;
  param_layout *layout; /* s->n_params entries */
  size_t n_uniform;     /* non-fixed parameters */
};

static const double pinned_position = 0.5;

/* ---- doubles in order ----------------------------------------------------------------
 * order_key maps doubles to unsigned integers monotonically, adjacent doubles to adjacent
 * integers, so bisection over all the doubles of a range is integer arithmetic. (-0.0 and
 * 0.0 get adjacent keys; decode writes 0.0 for both.) */

static uint64_t order_key(double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  return bits >> 63 ? ~bits : bits | (UINT64_C(1) << 63);
}

static double key_value(uint64_t key) {
  uint64_t bits = key >> 63 ? key & ~(UINT64_C(1) << 63) : ~key;
  double v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

/* ---- numeric axes ----------------------------------------------------------------------- */

static double axis_scale(const axis *ax, double v) { return ax->log ? log(v) : v; }

/* Position of value v in [low, high]: 0 and 1 only for the ends (interior positions are
 * clamped into (0, 1) so that the ends stay alone in their class), monotone in v. */
static double axis_position(const axis *ax, double v) {
  if (ax->t_span == 0) return pinned_position;
  if (v <= ax->low) return 0.0;
  if (v >= ax->high) return 1.0;
  double u = (axis_scale(ax, v) - ax->t_low) / ax->t_span;
  return fmin(fmax(u, DBL_TRUE_MIN), 1.0 - DBL_EPSILON / 2);
}

/* The value at position u by the plain inverse formula, clamped into range: a first guess
 * for continuous axes, exact only up to rounding. */
static double axis_value_guess(const axis *ax, double u) {
  double t = ax->t_low + u * ax->t_span;
  double v = ax->log ? exp(t) : t;
  return fmin(fmax(v, ax->low), ax->high);
}

/* A bracket of keys with position(below) < u <= position(above). */
typedef struct {
  uint64_t below, above;
} bracket;

/* Shrinks a bracket to adjacent keys: above becomes the first key at or past u. */
static void bisect_position(const axis *ax, double u, bracket *b) {
  while (b->above - b->below > 1) {
    uint64_t mid = b->below + (b->above - b->below) / 2;
    if (axis_position(ax, key_value(mid)) >= u)
      b->above = mid;
    else
      b->below = mid;
  }
}

/* The next probing distance: sixteen times wider, saturating. */
static uint64_t widen(uint64_t width) { return width > UINT64_MAX / 16 ? UINT64_MAX : width * 16; }

/* Tightens a bracket around the formula's guess by probing at widening distances, so
 * bisection usually starts a few doubles wide instead of 2^62. */
static void narrow_bracket(const axis *ax, double u, bracket *b) {
  uint64_t guess = order_key(axis_value_guess(ax, u));
  for (uint64_t width = 1; guess > b->below && width < guess - b->below; width = widen(width)) {
    uint64_t k = guess - width;
    if (axis_position(ax, key_value(k)) < u) {
      b->below = k;
      break;
    }
    if (k < b->above) b->above = k;
  }
  for (uint64_t width = 1; guess < b->above && width < b->above - guess; width = widen(width)) {
    uint64_t k = guess + width;
    if (axis_position(ax, key_value(k)) >= u) {
      b->above = k;
      break;
    }
    if (k > b->below) b->below = k;
  }
}

/* The smallest value whose position is >= u, for 0 < u <= 1, and the value before it. */
static double first_at_or_above(const axis *ax, double u, double *before) {
  bracket b = {order_key(ax->low), order_key(ax->high)};
  narrow_bracket(ax, u, &b);
  bisect_position(ax, u, &b);
  *before = key_value(b.below);
  return key_value(b.above);
}

/* The doubles at position w, 0 < w < 1: an interval [*first, *last] (positions are
 * monotone). */
static void position_class(const axis *ax, double w, double *first, double *last) {
  double ignored;
  *first = first_at_or_above(ax, w, &ignored);
  double next_w = nextafter(w, 2.0);
  if (next_w < 1)
    first_at_or_above(ax, next_w, last);
  else
    *last = key_value(order_key(ax->high) - 1); /* only high sits at 1 */
}

/* v to p significant decimal digits, read back. */
static double round_to_digits(double v, int p) {
  char text[40];
  snprintf(text, sizeof text, "%.*e", p - 1, v);
  return strtod(text, NULL);
}

/* The double in [a, b] with the shortest decimal form: 0 if it is inside, else the one
 * nearest the middle among the shortest. A p-digit decimal inside means one with more
 * digits too (the grids nest), and the p-digit decimal nearest the middle is inside
 * whenever any is, so the number of digits can be bisected. */
static double shortest_decimal(double a, double b) {
  if (a <= 0 && b >= 0) return 0.0;
  double middle = a + (b - a) / 2, best = middle;
  int fewest = 1, most = 17; /* 17 digits always read back as middle itself */
  while (fewest < most) {
    int p = (fewest + most) / 2;
    double candidate = round_to_digits(middle, p);
    if (candidate >= a && candidate <= b) {
      most = p;
      best = candidate;
    } else {
      fewest = p + 1;
    }
  }
  return best;
}

/* Decodes a continuous axis: the canonical member (shortest decimal) of the class of
 * positions nearest u. */
static double continuous_value(const axis *ax, double u) {
  if (ax->t_span == 0 || u <= 0) return ax->low;
  if (u >= 1) return ax->high;
  double before;
  double up = first_at_or_above(ax, u, &before);
  double w_up = axis_position(ax, up), w_before = axis_position(ax, before);
  double w = w_up - u <= u - w_before ? w_up : w_before;
  if (w <= 0) return ax->low;
  if (w >= 1) return ax->high;
  double first, last;
  position_class(ax, w, &first, &last);
  return shortest_decimal(first, last);
}

/* Level k by the grid formula: integers exactly; stepped floats rounded to 15 significant
 * digits when that moves them by a negligible part of the step, so a 0.1 grid gives 0.3
 * and not 0.30000000000000004. */
static double grid_value(const axis *ax, size_t k) {
  double v = ax->low + (double)k * ax->step;
  if (ax->integer || k == 0) return v;
  char text[32];
  snprintf(text, sizeof text, "%.15g", v);
  double nice = strtod(text, NULL);
  return fabs(nice - v) <= 1e-9 * ax->step ? nice : v;
}

/* Value of level k; the first level is low and the last high itself. */
static double level_value(const axis *ax, size_t k) {
  if (k == 0) return ax->low;
  return k + 1 == ax->n_levels ? ax->high : grid_value(ax, k);
}

static double level_position(const axis *ax, size_t k) {
  if (ax->n_levels == 1) return pinned_position;
  if (k == 0) return 0.0;
  if (k + 1 == ax->n_levels) return 1.0;
  if (!ax->log) return (double)k / (double)(ax->n_levels - 1);
  return axis_position(ax, level_value(ax, k));
}

static size_t clamp_level(const axis *ax, double k) {
  if (!(k > 0)) return 0;
  double last = (double)(ax->n_levels - 1);
  return k >= last ? ax->n_levels - 1 : (size_t)k;
}

/* The level nearest value v in the original space. */
static size_t level_of_value(const axis *ax, double v) {
  return clamp_level(ax, round((v - ax->low) / ax->step));
}

/* The level at position u: nearest on the position scale for linear axes; for log axes
 * the nearest in the original space to the value at u (log ints round like ints). Where
 * levels are dense (past ~1e14) exp(log(v)) misses v by more than half a level, so the
 * rounded guess is moved until u lies between its neighbours' positions, and on to the
 * last level of its position where several levels share one: a level's own position then
 * decodes to it, or to the level that stands for its class. */
static size_t level_at(const axis *ax, double u) {
  if (ax->n_levels == 1) return 0;
  if (!ax->log) return clamp_level(ax, round(u * (double)(ax->n_levels - 1)));
  size_t k = level_of_value(ax, axis_value_guess(ax, u));
  while (k > 0 && level_position(ax, k - 1) >= u) k--;
  while (k + 1 < ax->n_levels && level_position(ax, k + 1) <= fmax(u, level_position(ax, k))) k++;
  return k;
}

/* Sets up the axis of a float or int parameter. */
static int axis_init(const param_spec *p, axis *ax, nas_err *err) {
  *ax = (axis){.low = p->low, .high = p->high, .log = p->log, .integer = p->kind == PARAM_INT};
  if (!(p->low <= p->high) || !isfinite(p->low) || !isfinite(p->high))
    return nas_errf(err, "parameter '%s': bad range [%g, %g]", p->name, p->low, p->high);
  if (p->log && !(p->low > 0))
    return nas_errf(err, "parameter '%s': log scale needs low > 0, got %g", p->name, p->low);
  ax->step = p->step > 0 ? p->step : (ax->integer ? 1.0 : 0.0);
  if (ax->step > 0) {
    /* The tolerance keeps a top level that lands on high up to rounding (0.1..1 by 0.1). */
    double last = floor((p->high - p->low) / ax->step + (ax->integer ? 0 : 1e-9));
    if (!(last <= SPEC_MAX_STEPS))
      return nas_errf(err, "parameter '%s': too many values (step %g)", p->name, ax->step);
    ax->n_levels = (size_t)last + 1;
    double top = grid_value(ax, ax->n_levels - 1);
    ax->high = fabs(top - p->high) <= 1e-9 * ax->step ? p->high : fmin(top, p->high);
  }
  ax->t_low = axis_scale(ax, ax->low);
  ax->t_span = axis_scale(ax, ax->high) - ax->t_low;
  return 0;
}

/* ---- layout ----------------------------------------------------------------------------- */

static size_t param_ndim(const param_spec *p) {
  switch (p->kind) {
  case PARAM_FIXED: return 0;
  case PARAM_CATEGORICAL: return json_array_size(p->choices);
  default: return 1;
  }
}

static int layout_param(space *sp, size_t i, size_t *next_dim, nas_err *err) {
  const param_spec *p = &sp->s->params[i];
  param_layout *lay = &sp->layout[i];
  lay->dim = p->kind == PARAM_FIXED ? SIZE_MAX : *next_dim;
  if (p->kind == PARAM_FIXED) return 0;
  sp->n_uniform++;
  if (p->kind == PARAM_CATEGORICAL) {
    size_t n = json_array_size(p->choices);
    if (n == 0) return nas_errf(err, "parameter '%s': no choices", p->name);
    for (size_t c = 0; c < n; c++)
      sp->dims[*next_dim + c] =
          (space_dim){.kind = DIM_ONEHOT, .param = i, .n_levels = n, .group_start = *next_dim};
    *next_dim += n;
    return 0;
  }
  if (axis_init(p, &lay->ax, err) < 0) return NAS_ERR;
  bool discrete = lay->ax.n_levels > 0;
  sp->dims[*next_dim] = (space_dim){.kind = discrete ? DIM_DISCRETE : DIM_CONTINUOUS,
                                    .param = i,
                                    .n_levels = lay->ax.n_levels,
                                    .group_start = *next_dim};
  *next_dim += 1;
  return 0;
}

int space_create(const spec *s, space **out, nas_err *err) {
  *out = NULL;
  space *sp = calloc(1, sizeof *sp);
  if (!sp) return nas_errf(err, "space: out of memory");
  sp->s = s;
  for (size_t i = 0; i < s->n_params; i++) sp->ndim += param_ndim(&s->params[i]);
  sp->dims = calloc(sp->ndim ? sp->ndim : 1, sizeof *sp->dims);
  sp->layout = calloc(s->n_params ? s->n_params : 1, sizeof *sp->layout);
  if (!sp->dims || !sp->layout) {
    space_free(sp);
    return nas_errf(err, "space: out of memory");
  }
  size_t next_dim = 0;
  for (size_t i = 0; i < s->n_params; i++) {
    if (layout_param(sp, i, &next_dim, err) < 0) {
      space_free(sp);
      return NAS_ERR;
    }
  }
  *out = sp;
  return 0;
}

void space_free(space *sp) {
  if (!sp) return;
  free(sp->dims);
  free(sp->layout);
  free(sp);
}

size_t space_ndim(const space *sp) { return sp->ndim; }
const space_dim *space_dims(const space *sp) { return sp->dims; }
const spec *space_spec(const space *sp) { return sp->s; }
size_t space_uniform_dims(const space *sp) { return sp->n_uniform; }

/* ---- encode ------------------------------------------------------------------------------ */

/* Index of value among the choices: equal JSON, or equal numbers (3 matches 3.0). */
static int choice_index(const json_t *choices, const json_t *value) {
  for (size_t c = 0; c < json_array_size(choices); c++) {
    const json_t *choice = json_array_get(choices, c);
    if (json_equal(choice, value)) return (int)c;
    if (json_is_number(choice) && json_is_number(value) &&
        json_number_value(choice) == json_number_value(value))
      return (int)c;
  }
  return -1;
}

static int encode_numeric(const param_spec *p, const axis *ax, const json_t *value, double *x,
                          nas_err *err) {
  if (!json_is_number(value)) return nas_errf(err, "parameter '%s': expected a number", p->name);
  double v = json_number_value(value);
  if (!(v >= p->low && v <= p->high))
    return nas_errf(err, "parameter '%s': %g is outside [%g, %g]", p->name, v, p->low, p->high);
  if (ax->integer && v != floor(v))
    return nas_errf(err, "parameter '%s': %g is not an integer", p->name, v);
  *x = ax->n_levels ? level_position(ax, level_of_value(ax, v)) : axis_position(ax, v);
  return 0;
}

static int encode_categorical(const param_spec *p, const json_t *value, double *x, nas_err *err) {
  int c = choice_index(p->choices, value);
  if (c < 0) {
    char *text = json_dumps(value, JSON_ENCODE_ANY | JSON_COMPACT);
    nas_errf(err, "parameter '%s': %s is not one of its choices", p->name, text ? text : "value");
    free(text);
    return NAS_ERR;
  }
  memset(x, 0, json_array_size(p->choices) * sizeof *x);
  x[c] = 1.0;
  return 0;
}

static void pin_inactive(const param_spec *p, double *x) {
  if (p->kind == PARAM_CATEGORICAL)
    memset(x, 0, json_array_size(p->choices) * sizeof *x);
  else
    *x = pinned_position;
}

static bool param_active(const spec *s, size_t i, const json_t *params) {
  return !s->params[i].conditional || spec_param_active(s, i, params);
}

/* Parameter i (not fixed) at value into its coordinates of x. */
static int encode_value(const space *sp, size_t i, const json_t *value, double *x,
                        nas_err *err) {
  const param_spec *p = &sp->s->params[i];
  double *xi = x + sp->layout[i].dim;
  return p->kind == PARAM_CATEGORICAL ? encode_categorical(p, value, xi, err)
                                      : encode_numeric(p, &sp->layout[i].ax, value, xi, err);
}

int space_encode(const space *sp, const json_t *params, double *x, nas_err *err) {
  if (!json_is_object(params)) return nas_errf(err, "space: parameters are not an object");
  const spec *s = sp->s;
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    if (p->kind == PARAM_FIXED) continue;
    double *xi = x + sp->layout[i].dim;
    if (!param_active(s, i, params)) {
      pin_inactive(p, xi);
      continue;
    }
    const json_t *value = json_object_get(params, p->name);
    if (!value) return nas_errf(err, "parameter '%s' is missing", p->name);
    int rc = encode_value(sp, i, value, x, err);
    if (rc < 0) return rc;
  }
  return 0;
}

/* ---- decode ------------------------------------------------------------------------------ */

/* Argmax of a one-hot group; ties go to the lowest index. */
static size_t onehot_argmax(const double *x, size_t n) {
  size_t best = 0;
  for (size_t c = 1; c < n; c++)
    if (x[c] > x[best]) best = c;
  return best;
}

static json_t *decode_numeric(const axis *ax, double u) {
  if (ax->n_levels) {
    double v = level_value(ax, level_at(ax, u));
    return ax->integer ? json_integer((json_int_t)v) : json_real(v);
  }
  return json_real(continuous_value(ax, u));
}

/* The owned JSON value parameter i takes at x. */
static json_t *decode_value(const space *sp, size_t i, const double *x) {
  const param_spec *p = &sp->s->params[i];
  switch (p->kind) {
  case PARAM_FIXED: return json_deep_copy(p->fixed);
  case PARAM_CATEGORICAL: {
    size_t n = json_array_size(p->choices);
    return json_deep_copy(json_array_get(p->choices, onehot_argmax(x + sp->layout[i].dim, n)));
  }
  default: return decode_numeric(&sp->layout[i].ax, x[sp->layout[i].dim]);
  }
}

int space_decode(const space *sp, const double *x, json_t **params, nas_err *err) {
  *params = NULL;
  for (size_t d = 0; d < sp->ndim; d++)
    if (isnan(x[d])) return nas_errf(err, "space: coordinate %zu is NaN", d);
  json_t *obj = json_object();
  if (!obj) return nas_errf(err, "space: out of memory");
  const spec *s = sp->s;
  for (size_t i = 0; i < s->n_params; i++) {
    if (!param_active(s, i, obj)) continue; /* parents come first: obj holds them already */
    if (json_object_set_new(obj, s->params[i].name, decode_value(sp, i, x)) < 0) {
      json_decref(obj);
      return nas_errf(err, "space: out of memory decoding '%s'", s->params[i].name);
    }
  }
  *params = obj;
  return 0;
}

int space_snap(const space *sp, double *x, nas_err *err) {
  json_t *params;
  if (space_decode(sp, x, &params, err) < 0) return NAS_ERR;
  int rc = space_encode(sp, params, x, err);
  json_decref(params);
  return rc;
}

/* The one expensive part of a snap is decoding floats (their shortest decimal), so a point
 * that differs from a snapped one in a few coordinates (a neighbour in a local search)
 * snaps only the parameters whose coordinates differ: a snap treats each parameter on its
 * own but for activity, and a snapped parameter is its own snap. With conditions a change
 * can switch other parameters on or off, so there the whole point is snapped. */
int space_snap_near(const space *sp, const double *ref, double *x, nas_err *err) {
  const spec *s = sp->s;
  for (size_t i = 0; i < s->n_params; i++)
    if (s->params[i].conditional) return space_snap(sp, x, err);
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    size_t at = sp->layout[i].dim, nd = param_ndim(p);
    if (nd == 0 || memcmp(x + at, ref + at, nd * sizeof *x) == 0) continue;
    for (size_t k = at; k < at + nd; k++)
      if (isnan(x[k])) return nas_errf(err, "space: coordinate %zu is NaN", k);
    json_t *value = decode_value(sp, i, x);
    if (!value) return nas_errf(err, "space: out of memory decoding '%s'", p->name);
    int rc = encode_value(sp, i, value, x, err);
    json_decref(value);
    if (rc < 0) return rc;
  }
  return NAS_OK;
}

/* ---- designs ----------------------------------------------------------------------------- */

/* The level a uniform u in [0,1) picks when every level is equally likely. */
static size_t uniform_choice(double u, size_t n) {
  double k = floor(u * (double)n);
  return k >= (double)n ? n - 1 : (k > 0 ? (size_t)k : 0);
}

void space_from_uniform(const space *sp, const double *u, double *x) {
  const spec *s = sp->s;
  size_t j = 0;
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    if (p->kind == PARAM_FIXED) continue;
    double *xi = x + sp->layout[i].dim, ui = fmin(fmax(u[j++], 0.0), 1.0);
    const axis *ax = &sp->layout[i].ax;
    if (p->kind == PARAM_CATEGORICAL) {
      size_t n = json_array_size(p->choices);
      memset(xi, 0, n * sizeof *xi);
      xi[uniform_choice(ui, n)] = 1.0;
    } else if (ax->n_levels && !ax->log) {
      *xi = level_position(ax, uniform_choice(ui, ax->n_levels));
    } else {
      *xi = ui;
    }
  }
}

void space_from_levels(const space *sp, const size_t *levels, double *x) {
  const spec *s = sp->s;
  size_t j = 0;
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    if (p->kind == PARAM_FIXED) continue;
    double *xi = x + sp->layout[i].dim;
    size_t level = levels[j++];
    if (p->kind == PARAM_CATEGORICAL) {
      memset(xi, 0, json_array_size(p->choices) * sizeof *xi);
      xi[level] = 1.0;
    } else {
      *xi = level_position(&sp->layout[i].ax, level);
    }
  }
}
