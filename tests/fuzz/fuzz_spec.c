/* tests/fuzz/fuzz_spec.c: libFuzzer harness for the spec parser.
 *
 * Each input is the text of a spec file (up to its first NUL byte: spec_load refuses NULs
 * before parsing). spec_parse must come back, with a spec or with an error whose message
 * says something, and a spec that loaded must diff as equal to itself; everything is
 * freed, so LeakSanitizer reports a leak on any path. Built with ASan and UBSan by
 * `make fuzz` (Makefile), which starts from the seed corpus in tests/fuzz/corpus/spec/
 * (the examples and specs of the tests); `make test` runs it for a few seconds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = strndup((const char *)data, size);
  if (!text) return 0;
  spec *s = NULL;
  nas_err err = {{0}};
  int rc = spec_parse(text, "fuzz.yaml", "/nonexistent/fuzz", &s, &err);
  if ((rc == NAS_OK) != (s != NULL) || (rc != NAS_OK && err.msg[0] == '\0')) abort();
  if (s) {
    char *diff = NULL;
    if (spec_diff(s, s, &diff, &err) == NAS_OK && diff) abort(); /* a spec equals itself */
    free(diff);
    spec_free(s);
  }
  free(text);
  return 0;
}
