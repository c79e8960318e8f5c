/* Helpers for end-to-end tests: a temporary folder with its own SQLite storage, running
 * the real bin/nas there, and reading its JSON output. */
#ifndef NAS_TESTS_E2E_H
#define NAS_TESTS_E2E_H

#include <jansson.h>
#include <signal.h>

#include "common/common.h"
#include "tests/testutil.h"

typedef struct {
  char *dir;    /* temporary working folder of the test */
  char *db;     /* "sqlite:<dir>/nas.db"; NULL: $NAS_STORAGE says */
} fixture;

static inline int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = test_tmpdir();
  assert_non_null(f->dir);
  assert_true(asprintf(&f->db, "sqlite:%s/nas.db", f->dir) > 0);
  *state = f;
  return 0;
}

static inline int teardown(void **state) {
  fixture *f = *state;
  test_rmtree(f->dir);
  free(f->dir);
  free(f->db);
  free(f);
  return 0;
}

static inline const char *examples_bin(void) {
  const char *dir = getenv("NAS_EXAMPLES_BIN");
  return dir ? dir : "bin";
}

/* Runs `nas CMD [ARG] [--storage DB] [EXTRA]` in the fixture folder; returns the exit
 * status. */
static inline int nas(fixture *f, char **output, const char *cmd, const char *arg, const char *extra) {
  char *argv[7];
  size_t n = 0;
  argv[n++] = (char *)test_nas_bin(), argv[n++] = (char *)cmd;
  if (arg) argv[n++] = (char *)arg;
  if (f->db) argv[n++] = "--storage", argv[n++] = f->db;
  if (extra) argv[n++] = (char *)extra;
  argv[n] = NULL;
  return test_run(f->dir, argv, output);
}

/* nas(f, …, cmd, arg, extra) that must exit 0: fails the test with its output otherwise. */
static inline void nas_ok(fixture *f, const char *cmd, const char *arg, const char *extra) {
  char *out;
  int rc = nas(f, &out, cmd, arg, extra);
  if (rc != 0) fail_msg("nas %s %s exited %d: %s", cmd, arg ? arg : "", rc, out);
  free(out);
}

/* `nas run SPEC --no-progress` in the fixture folder; fails the test unless it exits 0. */
static inline void run_spec(fixture *f, const char *spec) {
  nas_ok(f, "run", spec, "--no-progress");
}

/* Runs argv (NULL-terminated, after "nas") in the fixture folder; parses stdout as JSON. */
static inline json_t *nas_json(fixture *f, char *const *args) {
  char *argv[16] = {(char *)test_nas_bin()}, *out;
  size_t n = 1;
  while (*args) argv[n++] = *args++;
  argv[n] = NULL;
  int rc = test_run(f->dir, argv, &out);
  if (rc != 0) fail_msg("nas %s exited %d: %s", argv[1], rc, out);
  json_error_t jerr;
  json_t *v = json_loads(out, 0, &jerr);
  if (!v) fail_msg("nas %s printed no JSON (%s): %s", argv[1], jerr.text, out);
  free(out);
  return v;
}

/* `nas trials NAME --format json`, parsed. */
static inline json_t *trials_json(fixture *f, const char *name) {
  char *out;
  assert_int_equal(nas(f, &out, "trials", name, "--format=json"), 0);
  json_error_t jerr;
  json_t *rows = json_loads(out, 0, &jerr);
  if (!rows) fail_msg("trials output is not JSON (%s): %s", jerr.text, out);
  free(out);
  assert_true(json_is_array(rows));
  return rows;
}

static inline size_t count_status(const json_t *rows, const char *status) {
  size_t n = 0, i;
  json_t *row;
  json_array_foreach(rows, i, row)
    n += strcmp(json_string_value(json_object_get(row, "status")), status) == 0;
  return n;
}

/* The row of trial `number` in `nas trials` JSON. */
static inline const json_t *row_of(const json_t *rows, json_int_t number) {
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row)
    if (json_integer_value(json_object_get(row, "trial")) == number) return row;
  fail_msg("no trial %lld", (long long)number);
  return NULL;
}

static inline double num(const json_t *row, const char *key) {
  const json_t *v = json_object_get(row, key);
  assert_true(json_is_number(v));
  return json_number_value(v);
}

/* Starts `nas run` in the background; returns its pid. */
static inline pid_t start_nas_run(fixture *f, const char *spec) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (chdir(f->dir) != 0) _exit(126);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1), dup2(null, 2);
    execl(test_nas_bin(), test_nas_bin(), "run", spec, "--storage", f->db, "--no-progress",
          (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Waits (up to 10 s) until experiment name has n trials running at once: its scheduler has
 * stored them and is well under way, whatever the machine's load. */
static inline void wait_until_n_running(fixture *f, const char *name, size_t n) {
  for (int i = 0; i < 200; i++) {
    char *out = NULL;
    json_t *rows = nas(f, &out, "trials", name, "--format=json") == 0 ? json_loads(out, 0, NULL) : NULL;
    bool running = rows && count_status(rows, "running") >= n;
    json_decref(rows);
    free(out);
    if (running) return;
    nas_sleep(0.05);
  }
  fail_msg("experiment %s never had %zu trials running", name, n);
}

static inline void wait_until_running(fixture *f, const char *name) { wait_until_n_running(f, name, 1); }

#endif
