/* metrics/latency.c: request latency measured the way a serving system measures it
 * (docs/metrics.md): one request at a time, a monotonic wall clock around each whole
 * request, warm-up requests not counted, nearest-rank percentiles of the rest.
 *
 * Percentiles are read from the sorted times, never interpolated, so each reported value
 * is one a request really took, and p50 <= p99 <= max always holds. */
#include <math.h>
#include <stdlib.h>

#include "metrics/metrics.h"

double metric_percentile(const double *sorted, size_t n, double p) {
  /* p·n first: for whole p and n it is exact, so a whole rank stays whole (p/100·n would
   * make 7% of 100 come out as 7.000000000000001, rank 8) */
  double rank = ceil(p * (double)n / 100.0);
  size_t index = rank < 1 ? 0 : (size_t)rank - 1;
  return sorted[index < n ? index : n - 1];
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Times runs requests into ms (milliseconds each), between (may be NULL) after each. */
static int time_requests(metric_request_fn request, metric_between_fn between, void *arg,
                         int runs, double *ms, nas_err *err) {
  for (int i = 0; i < runs; i++) {
    double start = nas_monotonic();
    if (request(arg, err) != NAS_OK) return nas_err_prefix(err, "latency: request %d", i + 1);
    ms[i] = (nas_monotonic() - start) * 1e3;
    if (between) between(arg);
  }
  return NAS_OK;
}

int metric_latency_measure(metric_request_fn request, void *arg, int warmup, int runs,
                           metric_latency *out, nas_err *err) {
  return metric_latency_measure_between(request, NULL, arg, warmup, runs, out, err);
}

int metric_latency_measure_between(metric_request_fn request, metric_between_fn between,
                                   void *arg, int warmup, int runs, metric_latency *out,
                                   nas_err *err) {
  if (runs < 1) return nas_errf(err, "latency: %d timed requests; at least 1 is needed", runs);
  for (int i = 0; i < warmup; i++) {
    if (request(arg, err) != NAS_OK) return nas_err_prefix(err, "latency: warm-up request");
    if (between) between(arg);
  }
  double *ms = malloc(sizeof *ms * (size_t)runs);
  if (!ms) return nas_errf(err, "latency: out of memory");
  int rc = time_requests(request, between, arg, runs, ms, err);
  if (rc == NAS_OK) {
    qsort(ms, (size_t)runs, sizeof *ms, compare_doubles);
    double sum = 0;
    for (int i = 0; i < runs; i++) sum += ms[i];
    *out = (metric_latency){.runs = runs,
                            .p50_ms = metric_percentile(ms, (size_t)runs, 50),
                            .p99_ms = metric_percentile(ms, (size_t)runs, 99),
                            .mean_ms = sum / runs,
                            .min_ms = ms[0],
                            .max_ms = ms[runs - 1]};
  }
  free(ms);
  return rc;
}
