/* tests/fuzz/fuzz_metric_line.c: libFuzzer harness for the metric-line parser
 * (metric_line_parse, metrics/metrics.h), which reads whatever a trial prints.
 *
 * Each input is one line (up to its first NUL byte). The parser must say 1 (a metric line:
 * observations appended), 0 (not one: nothing appended) or NAS_ERR (malformed: a message
 * and nothing appended), and every observation must have a name and a step of METRIC_FINAL or more;
 * everything is freed, so LeakSanitizer reports a leak on any path. Built with ASan and
 * UBSan by `make fuzz` (Makefile), from the seed corpus in tests/fuzz/corpus/metric_line/;
 * `make test` runs it for a few seconds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/metrics.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *line = strndup((const char *)data, size);
  if (!line) return 0;
  metric_set set = {0};
  nas_err err = {{0}};
  int rc = metric_line_parse(line, 1.5, &set, &err);
  if (rc != 1 && rc != 0 && rc != NAS_ERR) abort();
  if (rc != 1 && set.n != 0) abort();
  if (rc == NAS_ERR && err.msg[0] == '\0') abort();
  for (size_t i = 0; i < set.n; i++)
    if (!set.obs[i].name || set.obs[i].step < METRIC_FINAL) abort();
  metric_set_free(&set);
  free(line);
  return 0;
}
