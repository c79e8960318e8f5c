/* optimizer/sobol.c: the `sobol` optimizer: trial number k gets point k of the design of
 * design_sobol (a Sobol sequence, randomly shifted by spec.seed) over one coordinate per
 * non-fixed parameter, mapped onto the space by space_from_uniform. When that assignment is
 * already observed, pending or suggested (a finite space, or a resumed experiment), the
 * trial falls back to random draws from its own streams (taken_fresh).
 * It keeps no state but the space and takes no options. */
#include <stdlib.h>

#include "optimizer/backend.h"
#include "optimizer/design.h"
#include "optimizer/options.h"
#include "optimizer/taken.h"

typedef struct {
  const space *sp; /* borrowed */
} sobol_state;

static int sobol_create(const space *sp, const json_t *options, void **state, nas_err *err) {
  if (optimizer_check_options("sobol", options, NULL, err) < 0) return NAS_ERR;
  sobol_state *ss = malloc(sizeof *ss);
  if (!ss) return nas_errf(err, "optimizer sobol: out of memory");
  ss->sp = sp;
  *state = ss;
  return 0;
}

static void sobol_free(void *state) { free(state); }

/* The design's points first .. first+n-1 as points of the cube (n×space_ndim, owned). */
static int sobol_candidates(const space *sp, size_t first, size_t n, double **out, nas_err *err) {
  size_t n_u = space_uniform_dims(sp), dim = space_ndim(sp);
  double *u = malloc((n * n_u + 1) * sizeof *u);
  double *x = malloc((n * dim + 1) * sizeof *x);
  int rc = u && x ? 0 : nas_errf(err, "optimizer sobol: out of memory");
  if (rc == 0 && n_u > 0) rc = design_sobol(n_u, space_spec(sp)->seed, first, n, u, err);
  for (size_t i = 0; rc == 0 && i < n; i++) space_from_uniform(sp, u + i * n_u, x + i * dim);
  free(u);
  if (rc < 0) {
    free(x);
    return rc;
  }
  *out = x;
  return 0;
}

static int sobol_suggest(void *state, const observation *obs, size_t n_obs,
                         const json_t *const *pending, size_t n_pending, size_t n, int first_number,
                         json_t **out, double *refs, nas_err *err) {
  (void)refs; /* a design aims at no reference point */
  const sobol_state *ss = state;
  double *candidates;
  if (sobol_candidates(ss->sp, (size_t)first_number, n, &candidates, err) < 0) return NAS_ERR;
  int rc = taken_suggest(ss->sp, space_spec(ss->sp)->seed, obs, n_obs, pending, n_pending, n,
                         first_number, candidates, out, err);
  free(candidates);
  return rc;
}

const optimizer_backend optimizer_sobol_backend = {
    .type = "sobol",
    .create = sobol_create,
    .free = sobol_free,
    .suggest = sobol_suggest,
};
