/* The dataset cache (trainer/nn/data_cache.c): built once and then mapped, by one builder
 * among processes racing for it, rebuilt when the file is truncated, its header damaged,
 * its data overwritten or the source changed, found where the environment says, and
 * mapped in well under 50 ms. */
#include "tests/testutil.h"

#include <sys/stat.h>

#include "common/common.h"
#include "trainer/nn/data_cache.h"

/* The builder: reads the CSV source into one part and its first `head` examples into a
 * second, and appends a byte to `builds` (a file, so that forked builders count too). */
typedef struct {
  const char *source, *builds;
  int64_t head;
} builder;

static int build(tr_ctx *ctx, void *arg, tr_cache_content *out, nas_err *err) {
  builder *b = arg;
  int fd = open(b->builds, O_WRONLY | O_APPEND | O_CREAT, 0600);
  if (fd < 0 || write(fd, "b", 1) != 1) return nas_errf(err, "cannot count the build");
  close(fd);
  if (tr_csv_load(ctx, b->source, -1, &out->parts[0]) != NAS_OK)
    return nas_errf(err, "%s", ctx->err.msg);
  tr_dataset *head = &out->parts[1];
  *head = (tr_dataset){tr_from_data(ctx, TR_F32, 2, (int64_t[]){b->head, out->parts[0].x->shape[1]},
                                    tr_f32(out->parts[0].x)),
                       malloc(sizeof(int32_t) * (size_t)b->head), b->head, 3};
  memcpy(head->y, out->parts[0].y, sizeof(int32_t) * (size_t)b->head);
  out->nparts = 2;
  out->meta[0] = -2.5;
  return NAS_OK;
}

typedef struct {
  char *dir, *source, *builds, *cache_dir;
  builder b;
  tr_cache_request req;
} fixture;

/* The source's CSV text for scale into text (room for 4096 bytes); its length. Fixed-width
 * numbers, so every scale below 10 gives a file of the same size. */
static size_t source_text(double scale, char *text) {
  size_t used = 0;
  for (int r = 0; r < 50; r++)
    used += (size_t)snprintf(text + used, 4096 - used, "%07.3f,%07.3f,%07.3f,%d\n", r * scale,
                             r * scale + 1, -r * scale, r % 3);
  return used;
}

static void write_source(fixture *f, double scale) {
  char text[4096];
  size_t used = source_text(scale, text);
  nas_err err;
  assert_int_equal(nas_write_file_atomic(f->source, text, used, &err), NAS_OK);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = test_tmpdir();
  assert_true(asprintf(&f->source, "%s/data.csv", f->dir) > 0);
  assert_true(asprintf(&f->builds, "%s/builds", f->dir) > 0);
  assert_true(asprintf(&f->cache_dir, "%s/cache", f->dir) > 0);
  write_source(f, 1.0);
  f->b = (builder){f->source, f->builds, 7};
  f->req = (tr_cache_request){f->cache_dir, "data.csv", f->source, "head 7", build, &f->b};
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  test_rmtree(f->dir);
  free(f->dir), free(f->source), free(f->builds), free(f->cache_dir);
  free(f);
  return 0;
}

static long builds(fixture *f) {
  struct stat st;
  return stat(f->builds, &st) == 0 ? (long)st.st_size : 0;
}

/* Opens the cache and checks the content is the source's (values r*scale, r*scale+1,
 * -r*scale, labels r % 3; the head part its first 7 rows); returns whether it built. */
static bool open_and_check(fixture *f, double scale) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_data_cache *cache;
  tr_cache_content c;
  bool built;
  nas_err err;
  if (tr_data_cache_open(&ctx, &f->req, &cache, &c, &built, &err) != NAS_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(c.nparts, 2);
  assert_int_equal(c.parts[0].n, 50);
  assert_int_equal(c.parts[0].x->ndim, 2);
  assert_int_equal(c.parts[0].x->shape[1], 3);
  assert_int_equal(c.parts[0].nclasses, 3);
  assert_int_equal(c.parts[1].n, 7);
  assert_true(c.meta[0] == -2.5);
  for (int r = 0; r < 50; r++) {
    assert_true(tr_get(c.parts[0].x, r * 3 + 1) == r * scale + 1);
    assert_true(tr_get(c.parts[0].x, r * 3 + 2) == -r * scale);
    assert_int_equal(c.parts[0].y[r], r % 3);
  }
  for (int r = 0; r < 7; r++) assert_true(tr_get(c.parts[1].x, r * 3) == r * scale);
  tr_dataset_free(&c.parts[0]);
  tr_dataset_free(&c.parts[1]);
  tr_data_cache_close(cache);
  return built;
}

static void first_open_builds_and_later_ones_map_the_same_data(void **state) {
  fixture *f = *state;
  assert_true(open_and_check(f, 1.0));
  assert_false(open_and_check(f, 1.0));
  assert_int_equal(builds(f), 1);
  /* another key is another file */
  f->req.key = "head 7, other settings";
  assert_true(open_and_check(f, 1.0));
  assert_int_equal(builds(f), 2);
}

static void racing_builders_build_once_and_all_read_whole_data(void **state) {
  fixture *f = *state;
  enum { RACERS = 4 };
  pid_t pids[RACERS];
  for (int i = 0; i < RACERS; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      open_and_check(f, 1.0); /* a failed check aborts the child */
      _exit(0);
    }
  }
  for (int i = 0; i < RACERS; i++) {
    int status;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  assert_int_equal(builds(f), 1);
  assert_false(open_and_check(f, 1.0));
}

static void truncated_or_damaged_cache_file_is_rebuilt(void **state) {
  fixture *f = *state;
  assert_true(open_and_check(f, 1.0));
  char *file = tr_data_cache_path(&f->req);
  struct stat st;
  assert_int_equal(stat(file, &st), 0);
  assert_int_equal(truncate(file, st.st_size / 2), 0);
  assert_true(open_and_check(f, 1.0));
  assert_int_equal(truncate(file, 0), 0);
  assert_true(open_and_check(f, 1.0));
  /* a changed byte in the header's texts fails its checksum */
  int fd = open(file, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, "X", 1, 200), 1);
  close(fd);
  assert_true(open_and_check(f, 1.0));
  assert_false(open_and_check(f, 1.0));
  free(file);
}

/* Data overwritten in place — header intact, size and inode kept — fails the data's
 * checksum, which is read once per cache file: a marker then records the file's identity,
 * and a write into the file (a new ctime) makes the next open read the data again. */
static void overwritten_data_of_the_same_size_is_rebuilt(void **state) {
  fixture *f = *state;
  assert_true(open_and_check(f, 1.0));
  char *file = tr_data_cache_path(&f->req), *marker;
  assert_true(asprintf(&marker, "%s.verified", file) > 0);
  assert_int_equal(access(marker, F_OK), 0); /* verified on reading back what was built */
  assert_false(open_and_check(f, 1.0));
  struct stat st;
  assert_int_equal(stat(file, &st), 0);
  nas_sleep_ms(20); /* a ctime after the build's, on a coarse clock too */
  unsigned char junk[64]; /* 64 bytes: more than any padding between parts */
  memset(junk, 0x7f, sizeof junk);
  int fd = open(file, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, junk, sizeof junk, st.st_size / 2), (ssize_t)sizeof junk);
  close(fd);
  assert_true(open_and_check(f, 1.0));
  assert_false(open_and_check(f, 1.0));
  assert_int_equal(builds(f), 2);
  free(file), free(marker);
}

static void changed_source_makes_the_cache_stale(void **state) {
  fixture *f = *state;
  assert_true(open_and_check(f, 1.0));
  write_source(f, 2.0); /* a new file renamed over the old: new inode and mtime */
  assert_true(open_and_check(f, 2.0));
  assert_false(open_and_check(f, 2.0));
  /* the same inode rewritten in place with only its mtime changed */
  struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  assert_int_equal(utimensat(AT_FDCWD, f->source, times, 0), 0);
  assert_true(open_and_check(f, 2.0));
  assert_int_equal(builds(f), 3);
}

/* What `cp -p` does onto an existing file: the same inode rewritten in place at the same
 * size, then its old mtime set back. Only the ctime tells, and it is part of the identity. */
static void source_rewritten_in_place_with_its_mtime_set_back_makes_the_cache_stale(
    void **state) {
  fixture *f = *state;
  assert_true(open_and_check(f, 1.0));
  struct stat before, after;
  assert_int_equal(stat(f->source, &before), 0);
  nas_sleep_ms(20); /* a ctime after the first write's, on a coarse clock too */
  char text[4096];
  size_t used = source_text(2.0, text);
  int fd = open(f->source, O_WRONLY | O_TRUNC);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, used), (ssize_t)used);
  close(fd);
  struct timespec times[2] = {{0, UTIME_OMIT}, before.st_mtim};
  assert_int_equal(utimensat(AT_FDCWD, f->source, times, 0), 0);
  assert_int_equal(stat(f->source, &after), 0);
  assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size);
  assert_true(after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
              after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
  assert_true(open_and_check(f, 2.0));
  assert_false(open_and_check(f, 2.0));
  assert_int_equal(builds(f), 2);
}

static int failing_build(tr_ctx *ctx, void *arg, tr_cache_content *out, nas_err *err) {
  (void)ctx, (void)arg, (void)out;
  return nas_errf(err, "data.csv:3: not a number");
}

static void failing_builder_leaves_no_file_and_its_own_error(void **state) {
  fixture *f = *state;
  f->req.build = failing_build;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_data_cache *cache = (tr_data_cache *)f;
  tr_cache_content c;
  nas_err err;
  assert_int_equal(tr_data_cache_open(&ctx, &f->req, &cache, &c, NULL, &err), NAS_ERR);
  assert_null(cache);
  assert_string_equal(err.msg, "data.csv:3: not a number");
  char *listing = NULL, *argv[] = {"ls", f->cache_dir, NULL};
  assert_int_equal(test_run(f->dir, argv, &listing), 0);
  assert_null(strstr(listing, ".nascache\n")); /* only the lock file is there */
  assert_null(strstr(listing, ".tmp."));
  free(listing);
}

static void cache_folder_follows_the_environment(void **state) {
  (void)state;
  nas_err err;
  setenv("NAS_CACHE_DIR", "/c/own", 1);
  setenv("XDG_CACHE_HOME", "/c/xdg", 1);
  setenv("HOME", "/c/home", 1);
  char *dir = tr_data_cache_dir(&err);
  assert_string_equal(dir, "/c/own");
  free(dir);
  unsetenv("NAS_CACHE_DIR");
  dir = tr_data_cache_dir(&err);
  assert_string_equal(dir, "/c/xdg/nas");
  free(dir);
  unsetenv("XDG_CACHE_HOME");
  dir = tr_data_cache_dir(&err);
  assert_string_equal(dir, "/c/home/.cache/nas");
  free(dir);
  unsetenv("HOME");
  assert_null(tr_data_cache_dir(&err));
  assert_non_null(strstr(err.msg, "NAS_CACHE_DIR"));
}

/* A current cache is open() + mmap + a header check: far below the 50 ms budget. */
static void mapping_a_current_cache_takes_under_50_ms(void **state) {
  fixture *f = *state;
  open_and_check(f, 1.0);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  double start = nas_monotonic();
  tr_data_cache *cache;
  tr_cache_content c;
  bool built;
  nas_err err;
  assert_int_equal(tr_data_cache_open(&ctx, &f->req, &cache, &c, &built, &err), NAS_OK);
  double seconds = nas_monotonic() - start;
  print_message("mapped in %.3f ms\n", seconds * 1e3);
  assert_false(built);
  assert_true(seconds < 0.05);
  for (size_t i = 0; i < c.nparts; i++) tr_dataset_free(&c.parts[i]);
  tr_data_cache_close(cache);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(first_open_builds_and_later_ones_map_the_same_data, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(racing_builders_build_once_and_all_read_whole_data, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(truncated_or_damaged_cache_file_is_rebuilt, setup, teardown),
      cmocka_unit_test_setup_teardown(overwritten_data_of_the_same_size_is_rebuilt, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(changed_source_makes_the_cache_stale, setup, teardown),
      cmocka_unit_test_setup_teardown(
          source_rewritten_in_place_with_its_mtime_set_back_makes_the_cache_stale, setup, teardown),
      cmocka_unit_test_setup_teardown(mapping_a_current_cache_takes_under_50_ms, setup, teardown),
      cmocka_unit_test_setup_teardown(failing_builder_leaves_no_file_and_its_own_error, setup,
                                      teardown),
      cmocka_unit_test(cache_folder_follows_the_environment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
