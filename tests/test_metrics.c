/* Tests of the nas-metric line protocol: parsing single lines, and reading logs from an
 * offset (partial lines, CRLF, huge lines, binary garbage, missing files). */
#include "tests/testutil.h"

#include <sys/stat.h>

#include <math.h>

#include "metrics/metrics.h"

/* Parses line into a fresh set; the caller frees the set. */
static int parse(const char *line, metric_set *set, nas_err *err) {
  *set = (metric_set){0};
  return metric_line_parse(line, 1234.5, set, err);
}

/* Asserts that line is a malformed metric line whose message contains needle. */
static void assert_malformed(const char *line, const char *needle) {
  metric_set set;
  nas_err err = {{0}};
  int rc = parse(line, &set, &err);
  if (rc != NAS_ERR || !strstr(err.msg, needle))
    fail_msg("line %s: rc %d, message '%s', expected one containing '%s'", line, rc, err.msg,
             needle);
  assert_int_equal(set.n, 0);
  metric_set_free(&set);
}

static char *tmp_file(const char *dir, const char *text, size_t len) {
  char *path = NULL;
  assert_true(asprintf(&path, "%s/stdout.log", dir) > 0);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  fclose(f);
  return path;
}

static void append(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "ab");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  fclose(f);
}

static void final_line_gives_final_values(void **state) {
  (void)state;
  metric_set set;
  nas_err err;
  assert_int_equal(parse("nas-metric {\"accuracy\": 0.93, \"params\": 120000}", &set, &err), 1);
  assert_int_equal(set.n, 2);
  assert_string_equal(set.obs[0].name, "accuracy");
  assert_true(set.obs[0].value == 0.93);
  assert_int_equal(set.obs[0].step, METRIC_FINAL);
  assert_true(set.obs[0].time == 1234.5);
  assert_string_equal(set.obs[1].name, "params");
  assert_true(set.obs[1].value == 120000);
  metric_set_free(&set);
  assert_null(set.obs);
}

static void standard_error_is_stored_beside_its_metric_and_must_not_be_negative(void **state) {
  (void)state;
  metric_set set;
  nas_err err;
  assert_int_equal(parse("nas-metric {\"accuracy\": 0.91, \"accuracy_sem\": 0.004}", &set, &err),
                   1);
  assert_int_equal(set.n, 2);
  char *sem = metric_sem_name("accuracy");
  assert_string_equal(set.obs[1].name, sem);
  assert_true(set.obs[1].value == 0.004);
  free(sem);
  metric_set_free(&set);
  assert_malformed("nas-metric {\"accuracy\": 0.91, \"accuracy_sem\": -0.1}",
                   "\"accuracy_sem\" is a standard error");
  assert_int_equal(parse("nas-metric {\"_sem\": -1}", &set, &err), 1); /* no metric NAME */
  metric_set_free(&set);
}

static void step_gives_intermediate_values(void **state) {
  (void)state;
  metric_set set;
  nas_err err;
  assert_int_equal(parse("nas-metric {\"step\": 3, \"loss\": -1.5e-3}", &set, &err), 1);
  assert_int_equal(set.n, 1);
  assert_string_equal(set.obs[0].name, "loss");
  assert_int_equal(set.obs[0].step, 3);
  assert_true(set.obs[0].value == -1.5e-3);
  assert_int_equal(metric_line_parse("nas-metric {\"step\": 7.0, \"loss\": 1}", 0, &set, &err), 1);
  assert_int_equal(set.obs[1].step, 7);
  metric_set_free(&set);
}

/* A value is any JSON number, an integer past int64 included (Python prints a count of
 * 10^20 FLOPs as its digits, and `nas report` takes it too); a step is an integer a double
 * holds exactly, below 2^53, so that the step stored is the one printed. */
static void integers_of_any_size_are_values_and_steps_stay_exact(void **state) {
  (void)state;
  metric_set set;
  nas_err err;
  if (parse("nas-metric {\"flops\": 123456789012345678901}", &set, &err) != 1)
    fail_msg("%s", err.msg);
  assert_true(set.obs[0].value == 123456789012345678901.0);
  assert_int_equal(metric_line_parse("nas-metric {\"step\": 9007199254740991, \"a\": 1}", 0, &set,
                                     &err), 1);
  assert_true(set.obs[1].step == 9007199254740991LL);
  metric_set_free(&set);
  /* 2^53 + 1 would be stored as 2^53 */
  assert_malformed("nas-metric {\"step\": 9007199254740993, \"a\": 1}",
                   "\"step\" must be a whole number from 0 to 2^53 - 1 (9007199254740991)");
}

static void other_lines_are_not_metric_lines(void **state) {
  (void)state;
  const char *lines[] = {"", "epoch 3 loss 0.2", "nas-metrics {\"a\": 1}", "xnas-metric {\"a\": 1}",
                         "# nas-metric {\"a\": 1}", "NAS-METRIC {\"a\": 1}"};
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    metric_set set;
    nas_err err;
    assert_int_equal(parse(lines[i], &set, &err), 0);
    assert_int_equal(set.n, 0);
    metric_set_free(&set);
  }
}

static void blanks_before_prefix_and_carriage_return_are_accepted(void **state) {
  (void)state;
  metric_set set;
  nas_err err;
  assert_int_equal(parse("  \tnas-metric\t{\"a\": 1}\r", &set, &err), 1);
  assert_int_equal(set.n, 1);
  assert_true(set.obs[0].value == 1);
  metric_set_free(&set);
}

static void malformed_lines_say_what_is_wrong(void **state) {
  (void)state;
  assert_malformed("nas-metric", "expected");
  assert_malformed("nas-metric {\"a\": 1", "malformed metric line");
  assert_malformed("nas-metric {\"a\": 1} trailing", "malformed metric line");
  assert_malformed("nas-metric [1, 2]", "an array, not a JSON object");
  assert_malformed("nas-metric {}", "no metric");
  assert_malformed("nas-metric {\"step\": 2}", "no metric");
  assert_malformed("nas-metric {\"acc\": \"0.9\"}", "metric \"acc\" is a string, not a number");
  assert_malformed("nas-metric {\"acc\": true}", "metric \"acc\" is a boolean");
  assert_malformed("nas-metric {\"acc\": null}", "metric \"acc\" is null");
  assert_malformed("nas-metric {\"acc\": {}}", "metric \"acc\" is an object");
  assert_malformed("nas-metric {\"\": 1}", "empty name");
  assert_malformed("nas-metric {\"a\": 1, \"a\": 2}", "duplicate object key");
  assert_malformed("nas-metric {\"bad\xff\": 1}", "unable to decode byte");
  assert_malformed("nas-metric {\"a\": 1e999}", "malformed metric line");
  assert_malformed("nas-metric {\"step\": -1, \"a\": 1}",
                   "\"step\" must be a whole number from 0 to 2^53 - 1 (9007199254740991)");
  assert_malformed("nas-metric {\"step\": 1.5, \"a\": 1}", "\"step\"");
  assert_malformed("nas-metric {\"step\": \"3\", \"a\": 1}", "\"step\"");
}

static void non_finite_values_are_malformed_and_name_the_metric(void **state) {
  (void)state;
  assert_malformed("nas-metric {\"ok\": 1, \"loss\": NaN}",
                   "metric \"loss\" is NaN, not a finite number");
  assert_malformed("nas-metric {\"loss\": Infinity}", "metric \"loss\" is Infinity");
  assert_malformed("nas-metric {\"loss\": -Infinity}", "metric \"loss\" is -Infinity");
  assert_malformed("nas-metric {\"loss\": nan}", "metric \"loss\" is nan");
  assert_malformed("nas-metric {\"loss\": -nan}", "metric \"loss\" is -nan");
  assert_malformed("nas-metric {\"loss\":inf}", "metric \"loss\" is inf");
  assert_malformed("nas-metric {\"loss\": \"NaN\"}", "metric \"loss\" is NaN");
}

/* Quoted everywhere before, `{nan: 1}` read as a metric named "nan". */
static void a_non_finite_word_as_a_key_is_malformed(void **state) {
  (void)state;
  assert_malformed("nas-metric {nan: 1}", "malformed metric line");
  assert_malformed("nas-metric {Infinity : 1}", "malformed metric line");
  assert_malformed("nas-metric {\"a\": 1, -inf: 2}", "malformed metric line");
  assert_malformed("nas-metric {\"a\": 1,\n\tNaN\t:2}", "malformed metric line");
  /* in value position they are still read, and named */
  assert_malformed("nas-metric {\"a\": nan}", "metric \"a\" is nan, not a finite number");
  assert_malformed("nas-metric {\"a\": 1, \"b\":-Infinity }", "metric \"b\" is -Infinity");
  assert_malformed("nas-metric {\"a\": [1, nan]}", "metric \"a\" is an array");
}

static void words_inside_strings_are_left_alone(void **state) {
  (void)state;
  metric_set set;
  nas_err err;
  assert_int_equal(parse("nas-metric {\"NaN count\": 3, \"x\\\" inf\": 4, \"infinity_\": 5}", &set,
                         &err), 1);
  assert_int_equal(set.n, 3);
  assert_string_equal(set.obs[0].name, "NaN count");
  assert_string_equal(set.obs[1].name, "x\" inf");
  assert_string_equal(set.obs[2].name, "infinity_");
  assert_true(set.obs[2].value == 5);
  metric_set_free(&set);
}

/* metric_check: what `nas report`/`nas tell` values pass as well as a line's. */
static void metric_check_wants_a_utf8_name_and_a_finite_value(void **state) {
  (void)state;
  nas_err err;
  const char *good[] = {"a", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    assert_int_equal(metric_check(good[i], 1, &err), NAS_OK);
  const char *bad[] = {"\xff",         "\x80",     "a\xc3",         "\xc0\x80" /* overlong */,
                       "\xe0\x80\xaf", "\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80",
                       "\xf5\x80\x80\x80", "\xe2\x82"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(metric_check(bad[i], 1, &err), NAS_ERR);
    assert_string_equal(err.msg, "a metric's name is not valid UTF-8");
  }
  assert_int_equal(metric_check("", 1, &err), NAS_ERR);
  assert_int_equal(metric_check("a", NAN, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "not a finite number"));
  assert_int_equal(metric_check("a", -INFINITY, &err), NAS_ERR);
  assert_int_equal(metric_check("a_sem", -0.5, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "standard error"));
  assert_int_equal(metric_check("a_sem", 0, &err), NAS_OK);
  assert_int_equal(metric_check("_sem", -1, &err), NAS_OK); /* NAME_sem needs a NAME */
}

static void set_grows_and_owns_names(void **state) {
  (void)state;
  metric_set set = {0};
  char name[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof name, "m%d", i);
    assert_int_equal(metric_set_add(&set, name, i, i * 0.5, 0, NULL), NAS_OK);
  }
  name[0] = 'x'; /* the set holds its own copies */
  assert_int_equal(set.n, 1000);
  assert_string_equal(set.obs[999].name, "m999");
  assert_true(set.obs[999].value == 499.5);
  metric_set_free(&set);
  assert_int_equal(set.n, 0);
}

static void missing_log_reads_as_empty(void **state) {
  (void)state;
  metric_set set = {0};
  int64_t offset = 0;
  metric_log_notes notes = {0};
  nas_err err;
  assert_int_equal(metric_log_read("/nonexistent/nas/stdout.log", &offset, &set, &notes, &err),
                   NAS_OK);
  assert_int_equal(offset, 0);
  assert_int_equal(set.n, 0);
  assert_int_equal(notes.bad, 0);
}

static void partial_last_line_waits_for_its_newline(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *text = "hello\nnas-metric {\"a\": 1}\nnas-metric {\"b\":";
  char *path = tmp_file(dir, text, strlen(text));
  metric_set set = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 1);
  assert_int_equal(offset, strlen("hello\nnas-metric {\"a\": 1}\n"));
  assert_int_equal(metric_log_read(path, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 1); /* still unfinished */
  append(path, " 2, \"step\": 4}\nbye\n", strlen(" 2, \"step\": 4}\nbye\n"));
  assert_int_equal(metric_log_read(path, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 2);
  assert_string_equal(set.obs[1].name, "b");
  assert_int_equal(set.obs[1].step, 4);
  assert_true(set.obs[1].value == 2);
  assert_int_equal(offset, strlen(text) + strlen(" 2, \"step\": 4}\nbye\n"));
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void read_rest_takes_the_unfinished_last_line(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *text = "nas-metric {\"a\": 1}\nnas-metric {\"b\": 2}";
  char *path = tmp_file(dir, text, strlen(text));
  metric_set set = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read_rest(path, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 2);
  assert_string_equal(set.obs[1].name, "b");
  assert_int_equal(offset, strlen(text));
  assert_int_equal(metric_log_read_rest(path, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 2); /* nothing is read twice */
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* Reads the log at path share by share to its end as metric_log_read_rest; the number
 * of reads it took. Each but the last stops early (notes.more), none takes a line twice. */
static size_t read_in_shares(const char *path, int64_t *offset, metric_set *set) {
  metric_log_notes notes = {.more = true};
  nas_err err;
  size_t reads = 0;
  while (notes.more) {
    int64_t before = *offset;
    assert_int_equal(metric_log_read_rest(path, offset, set, &notes, &err), NAS_OK);
    assert_true(*offset > before || !notes.more);
    reads++;
  }
  return reads;
}

static void a_backlog_is_read_in_bounded_shares_each_line_once(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  enum { LINES = 20000 };
  char *path = tmp_file(dir, "", 0);
  for (int i = 0; i < LINES; i++) {
    char line[64];
    int len = snprintf(line, sizeof line, "nas-metric {\"m\": 1, \"step\": %d}\n", i);
    append(path, line, (size_t)len);
  }
  append(path, "nas-metric {\"z\": 2}", strlen("nas-metric {\"z\": 2}"));
  metric_set set = {0};
  metric_log_notes notes = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read_rest(path, &offset, &set, &notes, &err), NAS_OK);
  assert_true(notes.more);
  assert_true(set.n > 0 && set.n < LINES);
  assert_true(read_in_shares(path, &offset, &set) >= 2);
  assert_int_equal(set.n, LINES + 1);
  for (int i = 0; i < LINES; i++) assert_int_equal(set.obs[i].step, i);
  assert_string_equal(set.obs[LINES].name, "z"); /* the unfinished line comes last, once */
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(offset, st.st_size);
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* Few observations with long names are bounded too: by the bytes of their lines. */
static void long_metric_lines_are_read_in_bounded_shares(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  enum { LINES = 24, NAME_LEN = 60000 };
  char *line = malloc(NAME_LEN + 64);
  assert_non_null(line);
  char *path = tmp_file(dir, "", 0);
  for (int i = 0; i < LINES; i++) {
    int len = sprintf(line, "nas-metric {\"%0*d\": 1}\n", NAME_LEN, i);
    append(path, line, (size_t)len);
  }
  free(line);
  metric_set set = {0};
  metric_log_notes notes = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_true(notes.more);
  assert_true(set.n < LINES);
  read_in_shares(path, &offset, &set);
  assert_int_equal(set.n, LINES);
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void crlf_lines_are_read(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *text = "start\r\nnas-metric {\"a\": 1, \"step\": 0}\r\nnas-metric {\"a\": 2}\r\n";
  char *path = tmp_file(dir, text, strlen(text));
  metric_set set = {0};
  int64_t offset = 0;
  metric_log_notes notes = {0};
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(notes.bad, 0);
  assert_int_equal(set.n, 2);
  assert_int_equal(set.obs[0].step, 0);
  assert_int_equal(set.obs[1].step, METRIC_FINAL);
  assert_int_equal(offset, strlen(text));
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void malformed_lines_are_counted_and_the_first_reported(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *text = "nas-metric {\"a\": 1}\nnas-metric {\"loss\": NaN}\nnas-metric oops\n"
                     "nas-metric {\"b\": 2}\n";
  char *path = tmp_file(dir, text, strlen(text));
  metric_set set = {0};
  int64_t offset = 0;
  metric_log_notes notes = {.bad = 1}; /* counts add up */
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(notes.bad, 3);
  assert_int_equal(set.n, 2);
  assert_non_null(strstr(notes.first_bad.msg, "byte 20: metric \"loss\" is NaN"));
  assert_non_null(strstr(notes.first_bad.msg, path));
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void huge_lines_are_skipped_without_harm(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  size_t huge = 300 * 1024;
  char *text = malloc(3 * huge);
  size_t n = 0;
  n += (size_t)sprintf(text + n, "nas-metric {\"pad\": \"");
  memset(text + n, 'x', huge); /* a metric line too long to hold */
  n += huge;
  n += (size_t)sprintf(text + n, "\", \"a\": 1}\n");
  memset(text + n, 'y', huge); /* an ordinary line as long */
  n += huge;
  n += (size_t)sprintf(text + n, "\nnas-metric {\"b\": 2}\n");
  char *path = tmp_file(dir, text, n);
  metric_set set = {0};
  int64_t offset = 0;
  metric_log_notes notes = {0};
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(notes.bad, 1); /* the ordinary long line is not a metric line */
  assert_non_null(strstr(notes.first_bad.msg, "longer than"));
  assert_int_equal(set.n, 1);
  assert_string_equal(set.obs[0].name, "b");
  assert_int_equal(offset, n);
  metric_set_free(&set);
  free(text);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void binary_garbage_does_not_hide_metric_lines(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  char text[8192];
  size_t n = 0;
  unsigned seed = 7;
  for (; n < 6000; n++) text[n] = (char)(rand_r(&seed) & 0xff);
  n += (size_t)sprintf(text + n, "\nnas-metric {\"a\": 1}\n");
  memcpy(text + n, "nas-metric {\"z\":\0 1}\n", 21); /* a NUL inside a metric line */
  n += 21;
  memcpy(text + n, "nas-metric {\"bad\xff\": 1}\n", 23); /* not UTF-8 */
  n += 23;
  char *path = tmp_file(dir, text, n);
  metric_set set = {0};
  int64_t offset = 0;
  metric_log_notes notes = {0};
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(set.n, 1);
  assert_string_equal(set.obs[0].name, "a");
  assert_int_equal(notes.bad, 2);
  assert_non_null(strstr(notes.first_bad.msg, "NUL"));
  assert_int_equal(offset, n);
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void unreadable_log_is_an_error_and_changes_nothing(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  metric_set set = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read(dir, &offset, &set, NULL, &err), NAS_ERR); /* a folder */
  assert_non_null(strstr(err.msg, dir));
  assert_int_equal(offset, 0);
  offset = -1;
  assert_int_equal(metric_log_read(dir, &offset, &set, NULL, &err), NAS_ERR);
  assert_int_equal(set.n, 0);
  test_rmtree(dir);
  free(dir);
}

/* A trial that truncates its log (`: > stdout.log`) goes on writing from byte 0 (its
 * stdout is opened for appending): the lines after the cut are read, and the cut noted. */
static void truncated_log_is_read_again_from_its_start(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *before = "nas-metric {\"a\": 1, \"step\": 1}\nnas-metric {\"a\": 2, \"step\": 2}\n";
  char *path = tmp_file(dir, before, strlen(before));
  metric_set set = {0};
  int64_t offset = 0;
  metric_log_notes notes = {0};
  nas_err err;
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(set.n, 2);
  assert_int_equal(notes.shrank_from, 0);
  int64_t read_before = offset;
  const char *after = "nas-metric {\"a\": 3, \"step\": 3}\n";
  free(tmp_file(dir, after, strlen(after))); /* the same file, cut and written anew */
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(notes.shrank_from, read_before);
  assert_int_equal(set.n, 3);
  assert_true(set.obs[2].value == 3);
  assert_int_equal(offset, strlen(after));
  assert_int_equal(metric_log_read(path, &offset, &set, &notes, &err), NAS_OK);
  assert_int_equal(notes.shrank_from, 0); /* only the read that met the cut says so */
  assert_int_equal(set.n, 3);
  metric_set_free(&set);
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* What a trial can put in place of its log: a FIFO must not block the reader (the alarm
 * ends a test that hangs), a device is not read without end; both are errors. */
static void fifo_or_device_in_place_of_the_log_is_refused_at_once(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *fifo;
  assert_true(asprintf(&fifo, "%s/stdout.log", dir) > 0);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  metric_set set = {0};
  int64_t offset = 0;
  nas_err err;
  alarm(5);
  assert_int_equal(metric_log_read(fifo, &offset, &set, NULL, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "not a regular file"));
  assert_int_equal(metric_log_read_rest("/dev/zero", &offset, &set, NULL, &err), NAS_ERR);
  alarm(0);
  assert_int_equal(set.n, 0);
  assert_int_equal(offset, 0);
  free(fifo);
  test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(final_line_gives_final_values),
      cmocka_unit_test(standard_error_is_stored_beside_its_metric_and_must_not_be_negative),
      cmocka_unit_test(step_gives_intermediate_values),
      cmocka_unit_test(integers_of_any_size_are_values_and_steps_stay_exact),
      cmocka_unit_test(other_lines_are_not_metric_lines),
      cmocka_unit_test(blanks_before_prefix_and_carriage_return_are_accepted),
      cmocka_unit_test(metric_check_wants_a_utf8_name_and_a_finite_value),
      cmocka_unit_test(malformed_lines_say_what_is_wrong),
      cmocka_unit_test(non_finite_values_are_malformed_and_name_the_metric),
      cmocka_unit_test(a_non_finite_word_as_a_key_is_malformed),
      cmocka_unit_test(words_inside_strings_are_left_alone),
      cmocka_unit_test(set_grows_and_owns_names),
      cmocka_unit_test(missing_log_reads_as_empty),
      cmocka_unit_test(partial_last_line_waits_for_its_newline),
      cmocka_unit_test(read_rest_takes_the_unfinished_last_line),
      cmocka_unit_test(a_backlog_is_read_in_bounded_shares_each_line_once),
      cmocka_unit_test(long_metric_lines_are_read_in_bounded_shares),
      cmocka_unit_test(crlf_lines_are_read),
      cmocka_unit_test(malformed_lines_are_counted_and_the_first_reported),
      cmocka_unit_test(huge_lines_are_skipped_without_harm),
      cmocka_unit_test(binary_garbage_does_not_hide_metric_lines),
      cmocka_unit_test(unreadable_log_is_an_error_and_changes_nothing),
      cmocka_unit_test(truncated_log_is_read_again_from_its_start),
      cmocka_unit_test(fifo_or_device_in_place_of_the_log_is_refused_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
