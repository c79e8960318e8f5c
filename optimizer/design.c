/* optimizer/design.c: randomised quasi-random designs in the unit cube (design_* in
 * design.h).
 *
 * Up to 40 dimensions the points come from GSL's Sobol generator (gsl_qrng_sobol, whose
 * sequence starts at (0.5, …, 0.5); GSL does not check the 40-dimension limit itself).
 * Beyond 40: a Halton sequence, dimension j in base prime_j, with each dimension's digits
 * 1..b-1 randomly permuted (0 stays 0, so the infinite trailing zeros add nothing). The
 * permutations break the correlation between neighbouring large primes that puts the early
 * points of plain Halton on a few lines.
 * Both designs are then shifted by one uniform vector modulo 1 (Cranley-Patterson), so each
 * point is uniform on the cube while the set keeps its low discrepancy.
 *
 * Invariant: all the randomness of a design comes from one mt19937 stream seeded by
 * design_stream_seed(seed, design_shift_stream), drawn in a fixed order (the shift, then
 * the permutations dimension by dimension), so a design depends on (dim, seed) alone. */
#include <gsl/gsl_qrng.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <stdlib.h>

#include "optimizer/design.h"

enum { sobol_max_dim = 40 };

/* The stream a design's randomness comes from; trial-number streams (< 2^63) never reach it. */
static const uint64_t design_shift_stream = UINT64_MAX;

/* splitmix64's finaliser: a bijection of 64-bit words that mixes every input bit into
 * every output bit. */
static uint64_t mix64(uint64_t z) {
  z += UINT64_C(0x9E3779B97F4A7C15);
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

uint64_t design_stream_seed(long seed, uint64_t stream) {
  return mix64(mix64((uint64_t)seed) ^ stream);
}

/* Raw Sobol points first .. first+n-1 into out (n×dim). */
static int sobol_points(size_t dim, size_t first, size_t n, double *out, nas_err *err) {
  gsl_qrng *q = gsl_qrng_alloc(gsl_qrng_sobol, (unsigned)dim);
  if (!q) return nas_errf(err, "design: cannot make a %zu-dimensional Sobol generator", dim);
  for (size_t k = 0; k < first; k++) gsl_qrng_get(q, out); /* out is scratch until first */
  for (size_t k = 0; k < n; k++) gsl_qrng_get(q, out + k * dim);
  gsl_qrng_free(q);
  return 0;
}

static bool is_prime(unsigned long p) {
  for (unsigned long d = 2; d * d <= p; d++)
    if (p % d == 0) return false;
  return p >= 2;
}

/* Radical inverse of index in base b with digit permutation perm (perm[0] == 0). */
static double permuted_radical_inverse(uint64_t index, unsigned long b, const unsigned *perm) {
  double value = 0, scale = 1.0 / (double)b;
  for (; index > 0; index /= b, scale /= (double)b) value += perm[index % b] * scale;
  return value;
}

/* Permuted Halton points first .. first+n-1 (index k+1, skipping the all-zero point),
 * permutations drawn from rng dimension by dimension. */
static int halton_points(size_t dim, size_t first, size_t n, gsl_rng *rng, double *out,
                         nas_err *err) {
  unsigned long prime = 1;
  unsigned *perm = NULL;
  for (size_t j = 0; j < dim; j++) {
    do prime++;
    while (!is_prime(prime));
    unsigned *grown = realloc(perm, prime * sizeof *perm);
    if (!grown) {
      free(perm);
      return nas_errf(err, "design: out of memory");
    }
    perm = grown;
    for (unsigned d = 0; d < prime; d++) perm[d] = d;
    gsl_ran_shuffle(rng, perm + 1, prime - 1, sizeof *perm);
    for (size_t k = 0; k < n; k++)
      out[k * dim + j] = permuted_radical_inverse(first + k + 1, prime, perm);
  }
  free(perm);
  return 0;
}

int design_sobol(size_t dim, long seed, size_t first, size_t n, double *out, nas_err *err) {
  if (dim == 0) return nas_errf(err, "design: dimension must be at least 1");
  if (n == 0) return 0;
  gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
  double *shift = malloc(dim * sizeof *shift);
  if (!rng || !shift) {
    gsl_rng_free(rng);
    free(shift);
    return nas_errf(err, "design: out of memory");
  }
  gsl_rng_set(rng, design_stream_seed(seed, design_shift_stream));
  for (size_t j = 0; j < dim; j++) shift[j] = gsl_rng_uniform(rng);
  int rc = dim <= sobol_max_dim ? sobol_points(dim, first, n, out, err)
                                : halton_points(dim, first, n, rng, out, err);
  for (size_t i = 0; rc == 0 && i < n * dim; i++) {
    double v = out[i] + shift[i % dim];
    out[i] = v >= 1.0 ? v - 1.0 : v; /* exact: v < 2 */
  }
  gsl_rng_free(rng);
  free(shift);
  return rc;
}
