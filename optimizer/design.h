/* optimizer/design.h: space-filling designs and how they land in a search space (internal
 * to optimizer/).
 *
 * Used by the random and sobol optimizers and by the gp backend for its initial design and
 * its raw acquisition samples. Every function is pure: point k of a design is the same
 * whichever batch it is asked for in.
 *
 * design.c implements design_*; space.c implements space_uniform_dims,
 * space_from_uniform and space_from_levels. */
#ifndef NAS_OPTIMIZER_DESIGN_H
#define NAS_OPTIMIZER_DESIGN_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "optimizer/optimizer.h"

/* Points first .. first+n-1 of a randomised low-discrepancy sequence in [0,1)^dim, written
 * row-major into out (n×dim). dim <= 40: GSL's Sobol sequence; dim > 40: a Halton sequence
 * with random digit permutations. Both are randomised by a Cranley-Patterson shift (a
 * uniform vector added modulo 1) drawn from seed; another seed gives another design.
 * Cost O((first + n)·dim): the sequence is regenerated from its start. dim >= 1. */
int design_sobol(size_t dim, long seed, size_t first, size_t n, double *out, nas_err *err);

/* A well-mixed 64-bit seed for gsl_rng_set from a base seed and a stream number (e.g.
 * spec.seed and a trial number): nearby inputs give unrelated outputs. */
uint64_t design_stream_seed(long seed, uint64_t stream);

/* Number of uniform coordinates space_from_uniform reads: one per non-fixed parameter. */
size_t space_uniform_dims(const space *sp);
/* Maps u[space_uniform_dims] in [0,1) to a point x[space_ndim] of the cube such that a
 * uniform u gives: floats uniform (in log space when `log`), ints and steps uniform among
 * their values (log ints uniform in log space), categoricals uniform among their choices.
 * Dimensions of parameters that turn out inactive are set too; decode ignores them. */
void space_from_uniform(const space *sp, const double *u, double *x);

/* Maps one level per non-fixed parameter (a choice index, or the index of an int's or a
 * stepped float's value; continuous parameters have none and must not occur) to x. */
void space_from_levels(const space *sp, const size_t *levels, double *x);

#endif
