/* bench/bench_util.h: what the engine's benchmarks share: the median of timed samples
 * (a busy shared machine stretches some samples a lot, the median little). */
#ifndef NAS_BENCH_UTIL_H
#define NAS_BENCH_UTIL_H

#include <stdlib.h>

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of the n samples (sorted in place). */
static inline double bench_median(double *samples, size_t n) {
  qsort(samples, n, sizeof *samples, bench_cmp_double);
  return (samples[(n - 1) / 2] + samples[n / 2]) / 2;
}

#endif
