/* metrics: what a trial measures and how it reports it.
 *
 * Any program reports metrics by printing lines to its stdout:
 *   nas-metric {"accuracy": 0.93, "step": 3}
 *   nas-metric {"accuracy": 0.95, "params": 120000}
 * A line with "step" (a non-negative integer) holds intermediate values at that step; one
 * without holds final values. Every other key is a metric name with a number value. A
 * metric named NAME_sem is the standard error of metric NAME's reading (≥ 0), e.g.
 *   nas-metric {"accuracy": 0.91, "accuracy_sem": 0.004}
 * stored like any metric; the gp optimizer models it as the known noise of NAME. Lines
 * that are not metric lines are ignored; a malformed metric line is reported, never fatal.
 * `nas report NAME=VALUE … [--step N]` does the same from a shell script. */
#ifndef NAS_METRICS_H
#define NAS_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "storage/storage.h"

#define METRIC_LINE_PREFIX "nas-metric "
#define METRIC_SEM_SUFFIX "_sem"

/* "NAME_sem" for metric NAME: owned, NULL when out of memory. */
char *metric_sem_name(const char *metric);

/* The most observations one storage report carries (a share of a trial's log, of a copied
 * experiment's metrics), some 60 bytes each besides their names, and about the most bytes
 * of their names (of their metric lines, for a log): together well under the 4 MiB an http
 * request may hold (docs/storage-http.md). */
#define METRIC_REPORT_MAX 8192
#define METRIC_REPORT_NAME_BYTES (1024 * 1024)
/* Whether a report of n observations (or rows) holding text_bytes bytes of names (or of
 * other texts) has reached those bounds, so takes no more: the one rule for every bounded
 * write, a log's share (metric_log_read) as a copy's shares of trials and observations
 * (sched_copy). */
bool metric_report_full(size_t n, size_t text_bytes);

/* Observations parsed from text; names are owned by the set. */
typedef struct {
  metric_obs *obs;
  size_t n, cap;
} metric_set;

void metric_set_free(metric_set *set);
/* Appends one observation (name copied). */
int metric_set_add(metric_set *set, const char *name, int64_t step, double value,
                   double time, nas_err *err);

/* Whether step, read from wherever it was given (a metric line's "step", `nas report
 * --step`, an HTTP report's "step"), is one: a whole number from 0 to 2^53 - 1, every one of
 * which a double holds exactly (a metric line's numbers are read as doubles, so 2^53 + 1
 * would be stored as 2^53). NAS_ERR with the one message that says so otherwise. */
int metric_step_check(double step, nas_err *err);

/* The checks every reported metric passes, from a line or from `nas report`/`nas tell`:
 * a name that is not empty and is valid UTF-8, a finite value, >= 0 for a NAME_sem.
 * NAS_ERR with a message naming the metric when one fails. */
int metric_check(const char *name, double value, nas_err *err);
/* Reads text, the value of metric name from a command line (`nas report NAME=VALUE`, `nas
 * tell`): a decimal number alone (a sign, a point without digits on one side and an
 * exponent allowed, as people type them: "+1", ".5", "1E3"; no hexadecimal, no blanks, no
 * "1e"), passing metric_check. NAS_ERR with a message naming the metric otherwise. */
int metric_value_parse(const char *name, const char *text, double *value, nas_err *err);

/* Parses one line (without its newline). Returns 1 and appends to set when it is a metric
 * line, 0 when it is not one, NAS_ERR (with a message) when it is a malformed one. */
int metric_line_parse(const char *line, double time, metric_set *set, nas_err *err);

/* What reading a log noticed besides its metrics. Start it zeroed. */
typedef struct {
  size_t bad;          /* malformed metric lines, added to by every read */
  nas_err first_bad;   /* the first one's message, from the last read that found any */
  int64_t shrank_from; /* > 0 when the log was shorter than the offset the last read was
                          given (the trial truncated it): that offset. The read then started
                          again at 0, where the log's new content begins */
  bool more;           /* the read stopped at its bound (some 8192 observations or 1 MiB of
                          metric lines) with the log read no further than *offset: read
                          again from there for the rest */
} metric_log_notes;

/* Reads the complete lines of the file at path from byte offset *offset on, appends every
 * metric line to set and advances *offset past the last complete line (a partial last
 * line is left for the next call). One call reads a bounded share, whole lines only, so
 * that its observations and *offset fit one storage report; notes->more says when it
 * stopped early. Malformed lines and a truncated log are noted in notes
 * (may be NULL). A missing file reads as empty; anything but a regular file (a folder, a
 * FIFO, a device the trial put there) is an error, never waited on. On failure (I/O,
 * memory) set, *offset and notes are left as they were. */
int metric_log_read(const char *path, int64_t *offset, metric_set *set, metric_log_notes *notes,
                    nas_err *err);
/* Same for a log that will not grow any more (its job has ended): once a read gets to the
 * end (notes->more false), a last line without its newline is read too, and *offset ends at
 * the end of the file. */
int metric_log_read_rest(const char *path, int64_t *offset, metric_set *set,
                         metric_log_notes *notes, nas_err *err);

/* ---- standard metrics (docs/metrics.md) -----------------------------------------------
 * What built-in trials report, by these names and in these units; a trial of its own that
 * measures the same things should report them the same way, so fronts compare. */
#define METRIC_ACCURACY "accuracy"           /* share of validation examples right, 0..1 */
#define METRIC_TEST_ACCURACY "test_accuracy" /* same on the dataset's test split, if any */
#define METRIC_PARAMS "params"               /* trainable parameters, a count */
#define METRIC_MODEL_BYTES "model_bytes"     /* bytes of parameters and buffers as stored */
#define METRIC_FLOPS "flops"                 /* floating-point operations of one example's
                                                forward pass (2 per multiply-add) */
#define METRIC_LATENCY_P50 "latency_ms_p50"  /* batch-1 request latency, milliseconds, */
#define METRIC_LATENCY_P99 "latency_ms_p99"  /* median and 99th percentile */
#define METRIC_TRAIN_SECONDS "train_seconds" /* wall-clock seconds of training, validation
                                                passes included */
/* The one metric built-in trials also report after every epoch, as an intermediate value at
 * step = epoch: the only one early stopping can judge them on. */
#define METRIC_PER_EPOCH METRIC_ACCURACY

/* ---- latency ----------------------------------------------------------------------------
 * Measured as a serving system measures it: one request at a time at batch 1, the wall
 * clock (monotonic) around each whole request, after warm-up requests that are not
 * counted, then percentiles of the per-request times. The caller fixes the thread count
 * before measuring (built-in trials use one thread). */
enum { METRIC_LATENCY_WARMUP = 100, METRIC_LATENCY_RUNS = 1000 };

/* One request: the work to time, once. Returns NAS_OK or an error with a message. */
typedef int (*metric_request_fn)(void *arg, nas_err *err);

typedef struct {
  int runs;                       /* timed requests */
  double p50_ms, p99_ms;          /* nearest-rank percentiles */
  double mean_ms, min_ms, max_ms;
} metric_latency;

/* Runs warmup untimed requests, then runs timed ones (runs >= 1), and summarises them. */
int metric_latency_measure(metric_request_fn request, void *arg, int warmup, int runs,
                           metric_latency *out, nas_err *err);
/* What runs between requests, outside the timed part: what a measurement of minutes must
 * still do, such as a trial's heartbeat. */
typedef void (*metric_between_fn)(void *arg);
/* The same, calling between (may be NULL) with arg after every request, warm-up ones too. */
int metric_latency_measure_between(metric_request_fn request, metric_between_fn between,
                                   void *arg, int warmup, int runs, metric_latency *out,
                                   nas_err *err);
/* The p-th percentile (0 < p <= 100) of n >= 1 ascending values by the nearest-rank rule:
 * the smallest value with at least p% of the values at or below it. */
double metric_percentile(const double *sorted, size_t n, double p);

#endif
