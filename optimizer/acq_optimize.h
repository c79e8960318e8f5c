/* optimizer/acq_optimize.h: maximising an acquisition function over the encoded search
 * space (internal to optimizer/; used by the gp backend).
 *
 * Raw samples (a randomised Sobol design over the space, plus Gaussian perturbations of
 * given centres such as the current front) are scored; the best distinct ones start
 * bound-constrained L-BFGS (NLopt) over the numeric dimensions of the parameters that are
 * active there and that no other parameter's condition depends on; each result is snapped
 * to a valid assignment (space_snap) and improved by a local search over its discrete
 * neighbours (one int/step level up or down, another choice of a categorical, which also
 * moves condition parents). The best result that is not taken wins. */
#ifndef NAS_OPTIMIZER_ACQ_OPTIMIZE_H
#define NAS_OPTIMIZER_ACQ_OPTIMIZE_H

#include <stdint.h>

#include "optimizer/acquisition.h"
#include "optimizer/backend.h"
#include "optimizer/taken.h"

typedef struct {
  const space *sp;
  acq_fn f;                /* the acquisition (log value, gradient) */
  void *ctx;
  size_t raw_samples;      /* Sobol points scored */
  size_t restarts;         /* local optimisations from the best of them */
  int max_evals;           /* per local optimisation */
  long seed;               /* the raw design's seed */
  const double *centres;   /* n_centres×space_ndim points to sample around (may be NULL) */
  size_t n_centres;
  const taken_set *taken;  /* assignments not to return */
  optimizer_cancel *cancel; /* NULL: never; once it says stop, every evaluation is skipped */
} acq_search;

/* Writes the best free snapped point found into x (space_ndim values) and its acquisition
 * value into *value. NAS_ENOTFOUND when every point it looked at is taken; NAS_ECANCELED
 * when s->cancel said stop. */
int acq_optimize(const acq_search *s, double *x, double *value, nas_err *err);

#endif
