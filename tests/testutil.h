/* Helpers shared by the cmocka test binaries: temporary folders, files, running bin/nas. */
#ifndef NAS_TESTUTIL_H
#define NAS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

/* Fails unless actual lies within tolerance of expected, in double precision. cmocka 1.1.5's
 * assert_float_equal converts both to float (so a tolerance under about 1e-7 of the values
 * checks nothing) and passes a NaN (its comparisons are false both ways); this fails on a NaN. */
#define assert_near(actual, expected, tolerance)                                             \
  test_assert_near((actual), (expected), (tolerance), #actual, __FILE__, __LINE__)

static inline void test_assert_near(double actual, double expected, double tolerance,
                                    const char *what, const char *file, int line) {
  if (fabs(actual - expected) <= tolerance) return;
  print_error("%s is %.17g, expected %.17g within %g\n", what, actual, expected, tolerance);
  _fail(file, line);
}

/* An owned fresh folder under $TMPDIR (or /tmp). */
static inline char *test_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  char *templ = NULL;
  if (asprintf(&templ, "%s/nas-test-XXXXXX", base ? base : "/tmp") < 0) return NULL;
  if (!mkdtemp(templ)) {
    free(templ);
    return NULL;
  }
  return templ;
}

/* Removes a folder made by test_tmpdir and everything in it. */
static inline void test_rmtree(const char *dir) {
  pid_t pid = fork();
  if (pid == 0) {
    execlp("rm", "rm", "-rf", "--", dir, (char *)NULL);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
}

/* Removes dir/name and everything in it. */
static inline void test_rmtree_child(const char *dir, const char *name) {
  char *path = NULL;
  if (asprintf(&path, "%s/%s", dir, name) < 0) return;
  test_rmtree(path);
  free(path);
}

/* Writes text to dir/name; returns the owned path. */
static inline char *test_write(const char *dir, const char *name, const char *text) {
  char *path = NULL;
  if (asprintf(&path, "%s/%s", dir, name) < 0) return NULL;
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

/* The permission bits of dir/name, or -1 when there is none. */
static inline int test_mode_of(const char *dir, const char *name) {
  char *path = NULL;
  struct stat st;
  int mode = asprintf(&path, "%s/%s", dir, name) >= 0 && stat(path, &st) == 0
                 ? (int)(st.st_mode & 07777) : -1;
  free(path);
  return mode;
}

/* Runs argv (no shell) in dir with stdout+stderr captured into *output (owned, may be
 * NULL); returns the exit status, or 128+signal. */
static inline int test_run(const char *dir, char *const argv[], char **output) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    if (dir && chdir(dir) != 0) _exit(126);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while ((r = read(fds[0], buf + n, cap - n - 1)) > 0) {
    n += (size_t)r;
    if (cap - n < 1024) buf = realloc(buf, cap *= 2);
  }
  buf[n] = '\0';
  close(fds[0]);
  int status;
  waitpid(pid, &status, 0);
  if (output) *output = buf;
  else free(buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Sleeps for ms milliseconds. */
static inline void nas_sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Path of the nas binary under test (NAS_BIN, set by `make test`). */
static inline const char *test_nas_bin(void) {
  const char *bin = getenv("NAS_BIN");
  return bin ? bin : "bin/nas";
}

#endif
