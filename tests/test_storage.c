/* Tests of storage/: experiments, trials, metrics, concurrency and URLs.
 *
 * The behaviour every backend must share runs once per entry of test_backends (each
 * test gets a fresh, empty storage from its backend's fresh_url); a second backend joins
 * by adding an entry. Tests that look inside an SQLite file, and those of URL handling,
 * run once. */
#include "tests/testutil.h"

#include <inttypes.h>
#include <math.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include "storage/storage.h"

/* ---- fixture --------------------------------------------------------------------------- */

typedef struct test_backend {
  const char *name;
  /* The owned URL of a fresh, empty storage whose files (if any) live under dir. */
  char *(*fresh_url)(const char *dir);
} test_backend;

static char *sqlite_fresh_url(const char *dir) { return nas_asprintf("sqlite:%s/nas.db", dir); }

static const test_backend test_backends[] = {{"sqlite", sqlite_fresh_url}};

typedef struct fixture {
  char *dir;   /* owned temporary folder */
  char *url;   /* owned URL of the storage under test */
  storage *st; /* open storage at url, or NULL */
} fixture;

/* Opens url or fails the test with the error's message. */
static storage *open_or_fail(const char *url) {
  nas_err err = {{0}};
  storage *st = NULL;
  if (storage_open(url, &st, &err) != NAS_OK) fail_msg("storage_open(%s): %s", url, err.msg);
  return st;
}

/* initial state: the test_backend to run against. */
static int setup(void **state) {
  const test_backend *backend = *state;
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->dir = test_tmpdir();
  assert_non_null(f->dir);
  f->url = backend ? backend->fresh_url(f->dir) : nas_asprintf("sqlite:%s/nas.db", f->dir);
  assert_non_null(f->url);
  f->st = open_or_fail(f->url);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  storage_close(f->st);
  test_rmtree(f->dir);
  free(f->dir);
  free(f->url);
  free(f);
  return 0;
}

static void reopen(fixture *f) {
  storage_close(f->st);
  f->st = open_or_fail(f->url);
}

static void assert_contains(const char *text, const char *part) {
  if (!strstr(text, part)) fail_msg("\"%s\" does not contain \"%s\"", text, part);
}

#define CHECK(call)                                   \
  do {                                                \
    nas_err check_err_ = {{0}};                       \
    nas_err *err = &check_err_;                       \
    if ((call) != NAS_OK) fail_msg("%s", err->msg);   \
  } while (0)

static int64_t make_experiment(fixture *f, const char *name) {
  int64_t id = -1;
  CHECK(storage_experiment_create(f->st, name, "objectives: [loss]\n", "/specs/exp.yaml",
                                  "/runs", &id, err));
  return id;
}

static trial_row make_trial(fixture *f, int64_t experiment_id, const char *params_json) {
  trial_row t;
  CHECK(storage_trial_create(f->st, experiment_id, params_json, &t, err));
  return t;
}

/* A trial of a new experiment "e", already started. */
static trial_row make_running_trial(fixture *f) {
  trial_row t = make_trial(f, make_experiment(f, "e"), "{}");
  CHECK(storage_trial_start(f->st, t.id, "job-1", err));
  return t;
}

static void assert_string_or_null_equal(const char *a, const char *b) {
  if (!a || !b) assert_ptr_equal(a, b);
  else assert_string_equal(a, b);
}

static void assert_trials_equal(const trial_row *a, const trial_row *b) {
  assert_int_equal(a->id, b->id);
  assert_int_equal(a->experiment_id, b->experiment_id);
  assert_int_equal(a->number, b->number);
  assert_int_equal(a->status, b->status);
  assert_string_equal(a->params_json, b->params_json);
  assert_int_equal(a->attempts, b->attempts);
  assert_true(a->created_at == b->created_at);
  assert_true(a->started_at == b->started_at);
  assert_true(a->finished_at == b->finished_at);
  assert_string_or_null_equal(a->job_id, b->job_id);
  assert_int_equal(a->has_exit_code, b->has_exit_code);
  if (a->has_exit_code) assert_int_equal(a->exit_code, b->exit_code);
  assert_string_or_null_equal(a->error, b->error);
  assert_int_equal(a->log_offset, b->log_offset);
}

/* ---- experiments ----------------------------------------------------------------------- */

static void fresh_storage_has_no_experiments(void **state) {
  fixture *f = *state;
  experiment_row *rows = NULL;
  size_t n = 99;
  CHECK(storage_experiment_list(f->st, &rows, &n, err));
  assert_int_equal(n, 0);
  experiment_rows_free(rows, n);
}

static void experiment_create_then_get_returns_every_field(void **state) {
  fixture *f = *state;
  const char *spec = "name: 'tëst \"quoted\"'\nobjectives: [loss] # ünïcödé ✓\n";
  double before = nas_now();
  int64_t id = -1;
  CHECK(storage_experiment_create(f->st, "tëst ✓", spec, "/home/a b/exp.yaml", "/home/a b",
                                  &id, err));
  experiment_row row;
  CHECK(storage_experiment_get(f->st, "tëst ✓", &row, err));
  assert_int_equal(row.id, id);
  assert_string_equal(row.name, "tëst ✓");
  assert_string_equal(row.spec_text, spec);
  assert_string_equal(row.spec_path, "/home/a b/exp.yaml");
  assert_string_equal(row.run_root, "/home/a b");
  assert_string_equal(row.status, "running");
  assert_true(row.created_at >= before - 1 && row.created_at <= nas_now() + 1);
  experiment_row_clear(&row);
  assert_null(row.name);
}

static void experiment_create_with_taken_name_is_eexist(void **state) {
  fixture *f = *state;
  int64_t first = make_experiment(f, "same");
  nas_err err = {{0}};
  int64_t id = -7;
  assert_int_equal(storage_experiment_create(f->st, "same", "x", "/x", "/r", &id, &err),
                   NAS_EEXIST);
  assert_contains(err.msg, "'same'");
  assert_int_equal(id, -7);
  experiment_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_experiment_list(f->st, &rows, &n, err));
  assert_int_equal(n, 1);
  assert_int_equal(rows[0].id, first);
  experiment_rows_free(rows, n);
}

static void experiment_get_of_unknown_name_is_enotfound(void **state) {
  fixture *f = *state;
  make_experiment(f, "known");
  nas_err err = {{0}};
  experiment_row row;
  assert_int_equal(storage_experiment_get(f->st, "unknown", &row, &err), NAS_ENOTFOUND);
  assert_contains(err.msg, "'unknown'");
}

static void experiment_list_is_in_creation_order(void **state) {
  fixture *f = *state;
  const char *names[] = {"zeta", "alpha", "mid"};
  int64_t ids[3];
  for (int i = 0; i < 3; i++) ids[i] = make_experiment(f, names[i]);
  experiment_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_experiment_list(f->st, &rows, &n, err));
  assert_int_equal(n, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(rows[i].id, ids[i]);
    assert_string_equal(rows[i].name, names[i]);
  }
  experiment_rows_free(rows, n);
}

static void experiment_status_and_spec_can_be_changed(void **state) {
  fixture *f = *state;
  int64_t id = make_experiment(f, "e");
  CHECK(storage_experiment_set_status(f->st, id, "finished", err));
  CHECK(storage_experiment_set_spec(f->st, id, "objectives: [acc]\n", err));
  experiment_row row;
  CHECK(storage_experiment_get(f->st, "e", &row, err));
  assert_string_equal(row.status, "finished");
  assert_string_equal(row.spec_text, "objectives: [acc]\n");
  experiment_row_clear(&row);
}

static void experiment_changes_reject_unknown_ids_and_statuses(void **state) {
  fixture *f = *state;
  int64_t id = make_experiment(f, "e");
  nas_err err = {{0}};
  assert_int_equal(storage_experiment_set_status(f->st, id + 100, "stopped", &err), NAS_ENOTFOUND);
  assert_contains(err.msg, "experiment");
  assert_int_equal(storage_experiment_set_spec(f->st, id + 100, "x", &err), NAS_ENOTFOUND);
  assert_int_equal(storage_experiment_set_status(f->st, id, "paused", &err), NAS_ERR);
  assert_contains(err.msg, "'paused'");
  experiment_row row;
  CHECK(storage_experiment_get(f->st, "e", &row, err));
  assert_string_equal(row.status, "running");
  experiment_row_clear(&row);
}

/* ---- trials ------------------------------------------------------------------------------- */

static void trial_create_stores_a_queued_trial_and_returns_its_row(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "e");
  double before = nas_now();
  trial_row t = make_trial(f, exp, "{\"lr\": 0.1}");
  assert_true(t.id > 0);
  assert_int_equal(t.experiment_id, exp);
  assert_int_equal(t.number, 0);
  assert_int_equal(t.status, TRIAL_QUEUED);
  assert_string_equal(t.params_json, "{\"lr\": 0.1}");
  assert_int_equal(t.attempts, 0);
  assert_true(t.created_at >= before - 1 && t.created_at <= nas_now() + 1);
  assert_true(t.started_at == 0 && t.finished_at == 0);
  assert_null(t.job_id);
  assert_false(t.has_exit_code);
  assert_null(t.error);
  assert_int_equal(t.log_offset, 0);
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_trials_equal(&t, &got);
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void trial_numbers_count_from_zero_within_each_experiment(void **state) {
  fixture *f = *state;
  int64_t a = make_experiment(f, "a"), b = make_experiment(f, "b");
  int expect_a = 0, expect_b = 0;
  for (int i = 0; i < 7; i++) {
    bool in_a = i % 3 != 2;
    trial_row t = make_trial(f, in_a ? a : b, "{}");
    assert_int_equal(t.number, in_a ? expect_a++ : expect_b++);
    trial_row_clear(&t);
  }
}

static void trial_create_in_unknown_experiment_is_enotfound(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "e");
  nas_err err = {{0}};
  trial_row t;
  assert_int_equal(storage_trial_create(f->st, exp + 1000, "{}", &t, &err), NAS_ENOTFOUND);
  char id[32];
  snprintf(id, sizeof id, "%" PRId64, exp + 1000);
  assert_contains(err.msg, id);
}

static void trial_start_makes_it_running_with_job_and_attempt(void **state) {
  fixture *f = *state;
  trial_row t = make_trial(f, make_experiment(f, "e"), "{}");
  double before = nas_now();
  CHECK(storage_trial_start(f->st, t.id, "slurm:12345", err));
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.status, TRIAL_RUNNING);
  assert_int_equal(got.attempts, 1);
  assert_string_equal(got.job_id, "slurm:12345");
  assert_true(got.started_at >= before - 1 && got.started_at <= nas_now() + 1);
  assert_true(got.finished_at == 0);
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void trial_start_of_running_trial_fails_naming_trial_and_status(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  nas_err err = {{0}};
  assert_int_equal(storage_trial_start(f->st, t.id, "job-2", &err), NAS_ERR);
  char name[48];
  snprintf(name, sizeof name, "trial %" PRId64, t.id);
  assert_contains(err.msg, name);
  assert_contains(err.msg, "running");
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.attempts, 1);
  assert_string_equal(got.job_id, "job-1");
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void trial_start_and_finish_of_missing_trial_are_enotfound(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  nas_err err = {{0}};
  int64_t missing = t.id + 1000;
  char name[48];
  snprintf(name, sizeof name, "trial %" PRId64, missing);
  assert_int_equal(storage_trial_start(f->st, missing, "j", &err), NAS_ENOTFOUND);
  assert_contains(err.msg, name);
  assert_int_equal(storage_trial_finish(f->st, missing, TRIAL_FAILED, false, 0, NULL, &err),
                   NAS_ENOTFOUND);
  assert_contains(err.msg, name);
  trial_row got;
  assert_int_equal(storage_trial_get(f->st, missing, &got, &err), NAS_ENOTFOUND);
  assert_contains(err.msg, name);
  trial_row_clear(&t);
}

static void trial_finish_records_outcome_and_time(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  double before = nas_now();
  CHECK(storage_trial_finish(f->st, t.id, TRIAL_COMPLETED, true, 0, NULL, err));
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.status, TRIAL_COMPLETED);
  assert_true(got.finished_at >= before - 1 && got.finished_at <= nas_now() + 1);
  assert_true(got.started_at <= got.finished_at);
  assert_true(got.has_exit_code);
  assert_int_equal(got.exit_code, 0);
  assert_null(got.error);
  assert_string_equal(got.job_id, "job-1");
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void queued_trial_that_could_not_start_can_only_fail(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "e");
  trial_row t = make_trial(f, exp, "{}");
  nas_err err = {{0}};
  assert_int_equal(storage_trial_finish(f->st, t.id, TRIAL_STOPPED, false, 0, NULL, &err),
                   NAS_ERR);
  CHECK(storage_trial_finish(f->st, t.id, TRIAL_FAILED, false, 0, "cannot exec", err));
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.status, TRIAL_FAILED);
  assert_int_equal(got.attempts, 0);
  assert_string_equal(got.error, "cannot exec");
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void trial_finish_is_allowed_only_from_running(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "e");
  trial_row t = make_trial(f, exp, "{}");
  nas_err err = {{0}};
  assert_int_equal(storage_trial_finish(f->st, t.id, TRIAL_COMPLETED, true, 0, NULL, &err),
                   NAS_ERR);
  assert_contains(err.msg, "queued");
  CHECK(storage_trial_start(f->st, t.id, "j", err));
  CHECK(storage_trial_finish(f->st, t.id, TRIAL_FAILED, true, 2, "exit 2", err));
  assert_int_equal(storage_trial_finish(f->st, t.id, TRIAL_COMPLETED, true, 0, NULL, &err),
                   NAS_ERR);
  assert_contains(err.msg, "failed");
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.status, TRIAL_FAILED);
  assert_int_equal(got.exit_code, 2);
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void trial_finish_to_a_non_final_status_is_refused(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  nas_err err = {{0}};
  assert_int_equal(storage_trial_finish(f->st, t.id, TRIAL_QUEUED, false, 0, NULL, &err), NAS_ERR);
  assert_contains(err.msg, "queued");
  assert_int_equal(storage_trial_finish(f->st, t.id, TRIAL_RUNNING, false, 0, NULL, &err),
                   NAS_ERR);
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.status, TRIAL_RUNNING);
  trial_row_clear(&t);
  trial_row_clear(&got);
}

static void trial_retry_from_a_final_status_clears_the_previous_outcome(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  CHECK(storage_trial_finish(f->st, t.id, TRIAL_FAILED, true, 3, "node lost", err));
  CHECK(storage_trial_start(f->st, t.id, "job-2", err));
  trial_row got;
  CHECK(storage_trial_get(f->st, t.id, &got, err));
  assert_int_equal(got.status, TRIAL_RUNNING);
  assert_int_equal(got.attempts, 2);
  assert_int_equal(got.number, t.number);
  assert_string_equal(got.job_id, "job-2");
  assert_true(got.finished_at == 0);
  assert_false(got.has_exit_code);
  assert_null(got.error);
  trial_row_clear(&t);
  trial_row_clear(&got);
}

/* Each final status, with and without exit code and error text, survives the trip. */
static void trial_fields_round_trip_exactly(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "e");
  struct {
    trial_status status;
    bool has_exit_code;
    int exit_code;
    const char *error;
  } cases[] = {
      {TRIAL_COMPLETED, true, 0, NULL},
      {TRIAL_FAILED, true, -1, "it said \"no\" and 'bye'; DROP TABLE trials; --"},
      {TRIAL_FAILED, false, 0, "killed by signal 9 ✗ ünïcödé"},
      {TRIAL_TIMEOUT, true, 2147483647, "time limit 60 s"},
      {TRIAL_STOPPED, false, 0, NULL},
      {TRIAL_FAILED, true, 255, ""},
  };
  size_t n_cases = sizeof cases / sizeof cases[0];
  for (size_t i = 0; i < n_cases; i++) {
    trial_row t = make_trial(f, exp, "{\"name\": \"ñ \\\"q\\\" '\", \"x\": [1, 2]}");
    CHECK(storage_trial_start(f->st, t.id, "job 'ü' \"1\"", err));
    CHECK(storage_trial_finish(f->st, t.id, cases[i].status, cases[i].has_exit_code,
                               cases[i].exit_code, cases[i].error, err));
    trial_row got;
    CHECK(storage_trial_get(f->st, t.id, &got, err));
    assert_int_equal(got.status, cases[i].status);
    assert_int_equal(got.has_exit_code, cases[i].has_exit_code);
    if (cases[i].has_exit_code) assert_int_equal(got.exit_code, cases[i].exit_code);
    assert_string_or_null_equal(got.error, cases[i].error);
    assert_string_equal(got.params_json, t.params_json);
    assert_string_equal(got.job_id, "job 'ü' \"1\"");
    trial_row_clear(&t);
    trial_row_clear(&got);
  }
}

static void trial_list_holds_one_experiment_ordered_by_number(void **state) {
  fixture *f = *state;
  int64_t a = make_experiment(f, "a"), b = make_experiment(f, "b");
  trial_row made[5];
  for (int i = 0; i < 5; i++) made[i] = make_trial(f, a, i % 2 ? "{\"odd\": true}" : "{}");
  trial_row other = make_trial(f, b, "{}");
  CHECK(storage_trial_start(f->st, made[3].id, "j3", err));
  CHECK(storage_trial_finish(f->st, made[3].id, TRIAL_COMPLETED, true, 0, NULL, err));
  trial_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_trial_list(f->st, a, &rows, &n, err));
  assert_int_equal(n, 5);
  for (int i = 0; i < 5; i++) {
    trial_row expect;
    CHECK(storage_trial_get(f->st, made[i].id, &expect, err));
    assert_int_equal(rows[i].number, i);
    assert_trials_equal(&rows[i], &expect);
    trial_row_clear(&expect);
    trial_row_clear(&made[i]);
  }
  trial_rows_free(rows, n);
  CHECK(storage_trial_list(f->st, b + 100, &rows, &n, err));
  assert_int_equal(n, 0);
  trial_rows_free(rows, n);
  trial_row_clear(&other);
}

/* ---- metrics ---------------------------------------------------------------------------- */

static void metrics_keep_steps_finals_and_special_values(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  metric_obs obs[] = {
      {"loss", 0, 2.5, 1000.25},
      {"loss", 1, 1.25, 1001.5},
      {"accuracy ✓", METRIC_FINAL, 0.875, 1002.0},
      {"loss", METRIC_FINAL, NAN, 1003.0},
      {"flops", METRIC_FINAL, INFINITY, 1004.0},
      {"big step", INT64_C(1) << 40, -1e-300, 1005.0},
  };
  size_t n_obs = sizeof obs / sizeof obs[0];
  CHECK(storage_metrics_add(f->st, t.id, obs, n_obs, -1, err));
  metric_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_metrics_list(f->st, t.experiment_id, &rows, &n, err));
  assert_int_equal(n, n_obs);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(rows[i].trial_id, t.id);
    assert_string_equal(rows[i].name, obs[i].name);
    assert_int_equal(rows[i].step, obs[i].step);
    if (isnan(obs[i].value)) assert_true(isnan(rows[i].value));
    else assert_true(rows[i].value == obs[i].value);
    assert_true(rows[i].time == obs[i].time);
    if (i > 0) assert_true(rows[i].id > rows[i - 1].id);
  }
  metric_rows_free(rows, n);
  trial_row_clear(&t);
}

static void metrics_list_orders_by_trial_then_insertion(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "e"), other = make_experiment(f, "other");
  trial_row t0 = make_trial(f, exp, "{}"), t1 = make_trial(f, exp, "{}");
  trial_row elsewhere = make_trial(f, other, "{}");
  metric_obs a = {"m", 0, 1, 1}, b = {"m", 1, 2, 2}, c = {"m", 0, 3, 3}, d = {"z", 0, 4, 4};
  CHECK(storage_metrics_add(f->st, t1.id, &a, 1, -1, err));
  CHECK(storage_metrics_add(f->st, t0.id, &b, 1, -1, err));
  CHECK(storage_metrics_add(f->st, elsewhere.id, &d, 1, -1, err));
  CHECK(storage_metrics_add(f->st, t1.id, &c, 1, -1, err));
  CHECK(storage_metrics_add(f->st, t0.id, &a, 1, -1, err));
  metric_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_metrics_list(f->st, exp, &rows, &n, err));
  assert_int_equal(n, 4);
  int64_t trial_ids[] = {t0.id, t0.id, t1.id, t1.id};
  double values[] = {2, 1, 1, 3};
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(rows[i].trial_id, trial_ids[i]);
    assert_true(rows[i].value == values[i]);
  }
  metric_rows_free(rows, n);
  CHECK(storage_metrics_list(f->st, other + 100, &rows, &n, err));
  assert_int_equal(n, 0);
  metric_rows_free(rows, n);
  trial_row_clear(&t0);
  trial_row_clear(&t1);
  trial_row_clear(&elsewhere);
}

static int64_t log_offset_of(fixture *f, int64_t trial_id) {
  trial_row t;
  CHECK(storage_trial_get(f->st, trial_id, &t, err));
  int64_t offset = t.log_offset;
  trial_row_clear(&t);
  return offset;
}

static size_t metric_count(fixture *f, int64_t experiment_id) {
  metric_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_metrics_list(f->st, experiment_id, &rows, &n, err));
  metric_rows_free(rows, n);
  return n;
}

static void metrics_add_moves_the_log_offset_only_when_asked(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  metric_obs obs = {"loss", 0, 1.0, 1.0};
  CHECK(storage_metrics_add(f->st, t.id, &obs, 1, 120, err));
  assert_int_equal(log_offset_of(f, t.id), 120);
  CHECK(storage_metrics_add(f->st, t.id, &obs, 1, -1, err));
  assert_int_equal(log_offset_of(f, t.id), 120);
  CHECK(storage_metrics_add(f->st, t.id, NULL, 0, 4000000000, err));
  assert_int_equal(log_offset_of(f, t.id), 4000000000);
  assert_int_equal(metric_count(f, t.experiment_id), 2);
  trial_row_clear(&t);
}

static void metrics_add_with_a_bad_observation_stores_nothing(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  metric_obs bad_step[] = {{"loss", 0, 1, 1}, {"loss", -5, 1, 1}};
  metric_obs no_name[] = {{"loss", 0, 1, 1}, {"", 1, 1, 1}};
  nas_err err = {{0}};
  assert_int_equal(storage_metrics_add(f->st, t.id, bad_step, 2, 50, &err), NAS_ERR);
  assert_contains(err.msg, "-5");
  assert_int_equal(storage_metrics_add(f->st, t.id, no_name, 2, 50, &err), NAS_ERR);
  assert_int_equal(metric_count(f, t.experiment_id), 0);
  assert_int_equal(log_offset_of(f, t.id), 0);
  trial_row_clear(&t);
}

static void metrics_add_to_unknown_trial_is_enotfound(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  metric_obs obs = {"loss", 0, 1.0, 1.0};
  nas_err err = {{0}};
  assert_int_equal(storage_metrics_add(f->st, t.id + 1000, &obs, 1, 10, &err), NAS_ENOTFOUND);
  char name[48];
  snprintf(name, sizeof name, "trial %" PRId64, t.id + 1000);
  assert_contains(err.msg, name);
  trial_row_clear(&t);
}

/* ---- persistence and concurrency ------------------------------------------------------ */

static void reopening_keeps_everything(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  trial_row queued = make_trial(f, t.experiment_id, "{\"b\": 2}");
  metric_obs obs[] = {{"loss", 0, 0.5, 10}, {"loss", METRIC_FINAL, 0.25, 11}};
  CHECK(storage_metrics_add(f->st, t.id, obs, 2, 77, err));
  CHECK(storage_trial_finish(f->st, t.id, TRIAL_TIMEOUT, false, 0, "limit", err));
  trial_row before[2];
  CHECK(storage_trial_get(f->st, t.id, &before[0], err));
  CHECK(storage_trial_get(f->st, queued.id, &before[1], err));
  reopen(f);
  experiment_row e;
  CHECK(storage_experiment_get(f->st, "e", &e, err));
  assert_int_equal(e.id, t.experiment_id);
  assert_string_equal(e.spec_text, "objectives: [loss]\n");
  trial_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_trial_list(f->st, e.id, &rows, &n, err));
  assert_int_equal(n, 2);
  assert_trials_equal(&rows[0], &before[0]);
  assert_trials_equal(&rows[1], &before[1]);
  metric_row *metrics = NULL;
  size_t n_metrics = 0;
  CHECK(storage_metrics_list(f->st, e.id, &metrics, &n_metrics, err));
  assert_int_equal(n_metrics, 2);
  assert_int_equal(metrics[1].step, METRIC_FINAL);
  assert_true(metrics[1].value == 0.25);
  metric_rows_free(metrics, n_metrics);
  trial_rows_free(rows, n);
  experiment_row_clear(&e);
  trial_row_clear(&before[0]);
  trial_row_clear(&before[1]);
  trial_row_clear(&t);
  trial_row_clear(&queued);
}

enum { WORKERS = 2, TRIALS_PER_WORKER = 100, METRICS_PER_TRIAL = 5 };

/* One process's share: TRIALS_PER_WORKER trials, each created, started, given
 * METRICS_PER_TRIAL observations one transaction at a time, and completed. */
static int worker_run(const char *url, int64_t experiment_id, int worker, nas_err *err) {
  storage *st = NULL;
  int rc = storage_open(url, &st, err);
  for (int i = 0; rc == NAS_OK && i < TRIALS_PER_WORKER; i++) {
    char params[64], job[32];
    snprintf(params, sizeof params, "{\"worker\": %d, \"i\": %d}", worker, i);
    snprintf(job, sizeof job, "w%d-%d", worker, i);
    trial_row t;
    rc = storage_trial_create(st, experiment_id, params, &t, err);
    if (rc != NAS_OK) break;
    rc = storage_trial_start(st, t.id, job, err);
    for (int k = 0; rc == NAS_OK && k < METRICS_PER_TRIAL; k++) {
      metric_obs obs = {"loss", k, worker * 1000 + i, nas_now()};
      rc = storage_metrics_add(st, t.id, &obs, 1, 10 * (k + 1), err);
    }
    if (rc == NAS_OK) rc = storage_trial_finish(st, t.id, TRIAL_COMPLETED, true, 0, NULL, err);
    trial_row_clear(&t);
  }
  storage_close(st);
  return rc;
}

/* Forks n children that each run work(url, experiment_id, index); fails the test when one
 * does not succeed. Children leave with _exit so that they run no test machinery. */
static void run_in_children(int n, int (*work)(const char *, int64_t, int, nas_err *),
                            const char *url, int64_t experiment_id) {
  pid_t pids[8];
  fflush(NULL);
  for (int w = 0; w < n; w++) {
    pids[w] = fork();
    assert_true(pids[w] >= 0);
    if (pids[w] == 0) {
      nas_err err = {{0}};
      int rc = work(url, experiment_id, w, &err);
      if (rc != NAS_OK) fprintf(stderr, "child %d: %s\n", w, err.msg);
      _exit(rc == NAS_OK ? 0 : 1);
    }
  }
  int failures = 0;
  for (int w = 0; w < n; w++) {
    int status = 0;
    assert_int_equal(waitpid(pids[w], &status, 0), pids[w]);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  assert_int_equal(failures, 0);
}

static void two_processes_writing_at_once_lose_nothing(void **state) {
  fixture *f = *state;
  int64_t exp = make_experiment(f, "busy");
  /* A connection must not cross fork(); each child opens its own. */
  storage_close(f->st);
  f->st = NULL;
  run_in_children(WORKERS, worker_run, f->url, exp);
  f->st = open_or_fail(f->url);

  trial_row *trials = NULL;
  size_t n = 0;
  CHECK(storage_trial_list(f->st, exp, &trials, &n, err));
  assert_int_equal(n, WORKERS * TRIALS_PER_WORKER);
  int next_i[WORKERS] = {0};
  for (size_t k = 0; k < n; k++) {
    int worker = -1, i = -1;
    assert_int_equal(sscanf(trials[k].params_json, "{\"worker\": %d, \"i\": %d}", &worker, &i), 2);
    assert_int_equal(trials[k].number, (int)k); /* unique and contiguous */
    assert_true(worker >= 0 && worker < WORKERS);
    assert_int_equal(i, next_i[worker]++); /* each worker's trials in its own order */
    assert_int_equal(trials[k].status, TRIAL_COMPLETED);
    assert_int_equal(trials[k].attempts, 1);
    assert_int_equal(trials[k].log_offset, 10 * METRICS_PER_TRIAL);
  }
  metric_row *metrics = NULL;
  size_t n_metrics = 0;
  CHECK(storage_metrics_list(f->st, exp, &metrics, &n_metrics, err));
  assert_int_equal(n_metrics, WORKERS * TRIALS_PER_WORKER * METRICS_PER_TRIAL);
  for (size_t m = 0; m < n_metrics; m++) {
    const trial_row *t = &trials[m / METRICS_PER_TRIAL];
    assert_int_equal(metrics[m].trial_id, t->id);
    assert_int_equal(metrics[m].step, (int64_t)(m % METRICS_PER_TRIAL));
  }
  metric_rows_free(metrics, n_metrics);
  trial_rows_free(trials, n);
}

/* ---- SQLite specifics -------------------------------------------------------------------- */

/* Runs sql on the database file with SQLite directly (the test's own view of the file). */
static void sqlite_exec_on(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) fail_msg("%s: %s", sql, msg);
  assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* The first column of the first row of sql, as owned text. */
static char *sqlite_query_text(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  char *text = strdup((const char *)sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  sqlite3_close(db);
  return text;
}

static char *db_path(const fixture *f) { return nas_asprintf("%s/nas.db", f->dir); }

static char *file_bytes(const char *path, size_t *len) {
  nas_err err = {{0}};
  char *data = NULL;
  if (nas_read_file(path, &data, len, &err) != NAS_OK) fail_msg("%s", err.msg);
  return data;
}

/* Opening path as storage fails with a message containing `part`, and the file's bytes
 * stay as they were. */
static void assert_open_refused_untouched(const char *path, const char *part) {
  size_t len_before = 0, len_after = 0;
  char *before = file_bytes(path, &len_before);
  char *url = nas_asprintf("sqlite:%s", path);
  nas_err err = {{0}};
  storage *st = NULL;
  assert_int_equal(storage_open(url, &st, &err), NAS_ERR);
  assert_null(st);
  assert_contains(err.msg, part);
  assert_contains(err.msg, path);
  char *after = file_bytes(path, &len_after);
  assert_int_equal(len_before, len_after);
  assert_memory_equal(before, after, len_before);
  free(before);
  free(after);
  free(url);
}

static void sqlite_file_is_in_wal_mode_with_a_schema_version(void **state) {
  fixture *f = *state;
  char *path = db_path(f);
  char *mode = sqlite_query_text(path, "PRAGMA journal_mode");
  assert_string_equal(mode, "wal");
  char *version = sqlite_query_text(path, "SELECT count(*) || ':' || version FROM schema_version");
  assert_string_equal(version, "1:1");
  free(mode);
  free(version);
  free(path);
}

static void sqlite_newer_schema_is_refused_and_the_file_left_untouched(void **state) {
  fixture *f = *state;
  make_experiment(f, "kept");
  storage_close(f->st);
  f->st = NULL;
  char *path = db_path(f);
  sqlite_exec_on(path, "UPDATE schema_version SET version = 999");
  assert_open_refused_untouched(path, "999");
  nas_err err = {{0}};
  storage *st = NULL;
  assert_int_equal(storage_open(f->url, &st, &err), NAS_ERR);
  assert_contains(err.msg, "up to 1");
  char *name = sqlite_query_text(path, "SELECT name FROM experiments");
  assert_string_equal(name, "kept");
  free(name);
  free(path);
}

static void sqlite_file_that_is_not_a_database_is_refused_untouched(void **state) {
  fixture *f = *state;
  char text[8192];
  for (size_t i = 0; i < sizeof text - 1; i++) text[i] = (char)('a' + i % 26);
  text[sizeof text - 1] = '\0';
  char *path = test_write(f->dir, "notes.txt", text);
  assert_open_refused_untouched(path, "not a database");
  free(path);
}

static void sqlite_database_of_another_program_is_refused_untouched(void **state) {
  fixture *f = *state;
  char *path = nas_asprintf("%s/other.db", f->dir);
  sqlite_exec_on(path, "CREATE TABLE photos (id INTEGER PRIMARY KEY, file TEXT);"
                       "INSERT INTO photos (file) VALUES ('cat.jpg')");
  assert_open_refused_untouched(path, "not a nas storage");
  free(path);
}

static void sqlite_path_in_a_missing_folder_is_refused_naming_it(void **state) {
  fixture *f = *state;
  char *missing = nas_asprintf("%s/no/such", f->dir);
  char *url = nas_asprintf("sqlite:%s/nas.db", missing);
  nas_err err = {{0}};
  storage *st = NULL;
  assert_int_equal(storage_open(url, &st, &err), NAS_ERR);
  assert_contains(err.msg, missing);
  assert_contains(err.msg, "No such file or directory");
  struct stat sb;
  assert_int_not_equal(stat(missing, &sb), 0);
  free(url);
  free(missing);
}

static void sqlite_url_forms_open_the_same_file(void **state) {
  fixture *f = *state;
  make_experiment(f, "shared");
  char *triple = nas_asprintf("sqlite://%s/nas.db", f->dir);
  char *dotted = nas_asprintf("sqlite:%s/./x/../nas.db", f->dir);
  const char *urls[] = {triple, dotted};
  for (size_t i = 0; i < 2; i++) {
    storage *st = open_or_fail(urls[i]);
    experiment_row e;
    CHECK(storage_experiment_get(st, "shared", &e, err));
    experiment_row_clear(&e);
    storage_close(st);
  }
  free(triple);
  free(dotted);
}

static void sqlite_relative_path_is_relative_to_the_current_folder(void **state) {
  fixture *f = *state;
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(f->dir), 0);
  storage *st = open_or_fail("sqlite:nas.db");
  assert_int_equal(chdir(cwd), 0);
  make_experiment(f, "via absolute");
  experiment_row *rows = NULL;
  size_t n = 0;
  CHECK(storage_experiment_list(st, &rows, &n, err));
  assert_int_equal(n, 1);
  experiment_rows_free(rows, n);
  storage_close(st);
}

static void urls_that_are_not_storage_are_refused_listing_accepted_forms(void **state) {
  (void)state;
  const char *bad[] = {"mysql://u:hunter2@h/db", "nas.db", "sqlite:", "sqlite://relative.db", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    nas_err err = {{0}};
    storage *st = NULL;
    assert_int_equal(storage_open(bad[i], &st, &err), NAS_ERR);
    assert_null(st);
    assert_contains(err.msg, "sqlite:");
    assert_null(strstr(err.msg, "hunter2"));
  }
}

static void postgresql_urls_say_the_backend_is_not_built_without_the_password(void **state) {
  (void)state;
  const char *urls[] = {"postgresql://nas:hunter2@db.example/nas",
                        "postgres://h/db?password=hunter2"};
  for (size_t i = 0; i < 2; i++) {
    nas_err err = {{0}};
    storage *st = NULL;
    assert_int_equal(storage_open(urls[i], &st, &err), NAS_ERR);
    assert_contains(err.msg, "PostgreSQL backend not built yet");
    assert_contains(err.msg, "***");
    assert_null(strstr(err.msg, "hunter2"));
  }
}

/* Two processes opening the same new file at once: one creates the schema, the other
 * finds it made; neither fails. */
static int open_close(const char *url, int64_t experiment_id, int worker, nas_err *err) {
  (void)experiment_id;
  (void)worker;
  storage *st = NULL;
  int rc = storage_open(url, &st, err);
  storage_close(st);
  return rc;
}

static void two_processes_creating_the_same_storage_at_once_both_succeed(void **state) {
  fixture *f = *state;
  for (int round = 0; round < 5; round++) {
    char *url = nas_asprintf("sqlite:%s/fresh%d.db", f->dir, round);
    run_in_children(4, open_close, url, 0);
    storage *st = open_or_fail(url);
    storage_close(st);
    free(url);
  }
}

/* Fault injection: the third insert of a batch fails inside SQLite; the batch's first two
 * rows and its log_offset move must vanish with it. */
static void metrics_add_failing_midway_stores_nothing(void **state) {
  fixture *f = *state;
  trial_row t = make_running_trial(f);
  char *path = db_path(f);
  sqlite_exec_on(path, "CREATE TRIGGER boom BEFORE INSERT ON metrics WHEN NEW.name = 'boom'"
                       " BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
  metric_obs obs[] = {{"loss", 0, 1, 1}, {"loss", 1, 2, 2}, {"boom", 2, 3, 3}};
  nas_err err = {{0}};
  assert_int_equal(storage_metrics_add(f->st, t.id, obs, 3, 999, &err), NAS_ERR);
  assert_contains(err.msg, "injected failure");
  assert_contains(err.msg, path);
  assert_int_equal(metric_count(f, t.experiment_id), 0);
  assert_int_equal(log_offset_of(f, t.id), 0);
  CHECK(storage_metrics_add(f->st, t.id, obs, 2, 20, err));
  assert_int_equal(metric_count(f, t.experiment_id), 2);
  assert_int_equal(log_offset_of(f, t.id), 20);
  free(path);
  trial_row_clear(&t);
}

/* ---- no storage needed -------------------------------------------------------------------- */

static void trial_status_names_round_trip(void **state) {
  (void)state;
  for (int i = 0; i < TRIAL_STATUS_COUNT; i++) {
    trial_status parsed = TRIAL_QUEUED;
    assert_int_equal(trial_status_parse(trial_status_name((trial_status)i), &parsed), NAS_OK);
    assert_int_equal(parsed, i);
  }
  trial_status untouched = TRIAL_STOPPED;
  assert_int_equal(trial_status_parse("done", &untouched), NAS_ERR);
  assert_int_equal(trial_status_parse(NULL, &untouched), NAS_ERR);
  assert_int_equal(untouched, TRIAL_STOPPED);
  assert_string_equal(trial_status_name(TRIAL_TIMEOUT), "timeout");
  assert_false(trial_status_final(TRIAL_QUEUED));
  assert_false(trial_status_final(TRIAL_RUNNING));
  assert_true(trial_status_final(TRIAL_COMPLETED) && trial_status_final(TRIAL_FAILED) &&
              trial_status_final(TRIAL_TIMEOUT) && trial_status_final(TRIAL_STOPPED));
}

static void assert_redacted(const char *url, const char *expect) {
  char *shown = storage_url_redacted(url);
  assert_non_null(shown);
  assert_string_equal(shown, expect);
  free(shown);
}

static void redacted_urls_hide_passwords_in_uri_form(void **state) {
  (void)state;
  assert_redacted("postgresql://nas:s3cret@db:5432/exp", "postgresql://nas:***@db:5432/exp");
  assert_redacted("postgres://nas:p@ss/w:rd@db/exp", "postgres://nas:***@db/exp");
  assert_redacted("postgresql://nas@db/exp", "postgresql://nas@db/exp");
  assert_redacted("postgresql://db/exp?user=nas&password=s3cret&sslmode=require",
                  "postgresql://db/exp?user=nas&password=***&sslmode=require");
  assert_redacted("postgresql://db?password=a@b", "postgresql://db?password=***");
  assert_redacted("postgresql:///exp?host=/run/pg", "postgresql:///exp?host=/run/pg");
  assert_redacted("sqlite:/tmp/pass:word@x.db", "sqlite:/tmp/pass:word@x.db");
  assert_redacted("sqlite:nas.db", "sqlite:nas.db");
}

static void redacted_urls_hide_passwords_in_key_value_form(void **state) {
  (void)state;
  assert_redacted("host=db password=s3cret dbname=exp", "host=db password=*** dbname=exp");
  assert_redacted("password = 's3 cr\\'et' user=nas", "password = *** user=nas");
  assert_redacted("host=db  user=nas", "host=db  user=nas");
  assert_redacted("passwords=x password='' x=1", "passwords=x password=*** x=1");
  assert_redacted("host=db password", "host=db ***");
  assert_redacted("host='a b' password=x\\ y", "host='a b' password=***");
}

static void absolute_urls_resolve_relative_sqlite_paths(void **state) {
  (void)state;
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  struct {
    const char *url, *expect_suffix;
  } cases[] = {{"sqlite:nas.db", "/nas.db"}, {"sqlite:./a/../b/nas.db", "/b/nas.db"}};
  for (size_t i = 0; i < 2; i++) {
    char *abs = storage_url_absolute(cases[i].url);
    char *expect = nas_asprintf("sqlite:%s%s", strcmp(cwd, "/") ? cwd : "", cases[i].expect_suffix);
    assert_string_equal(abs, expect);
    free(abs);
    free(expect);
  }
  const char *unchanged[] = {"sqlite:/abs/nas.db", "postgresql://u:p@h/db", "sqlite:"};
  for (size_t i = 0; i < 3; i++) {
    char *abs = storage_url_absolute(unchanged[i]);
    assert_string_equal(abs, unchanged[i]);
    free(abs);
  }
  char *triple = storage_url_absolute("sqlite:///abs/./nas.db");
  assert_string_equal(triple, "sqlite:/abs/nas.db");
  free(triple);
}

/* ---- main ------------------------------------------------------------------------------ */

#define FIXTURE_TEST(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
  int failed = 0;
  for (size_t b = 0; b < sizeof test_backends / sizeof test_backends[0]; b++) {
    struct CMUnitTest tests[] = {
        FIXTURE_TEST(fresh_storage_has_no_experiments),
        FIXTURE_TEST(experiment_create_then_get_returns_every_field),
        FIXTURE_TEST(experiment_create_with_taken_name_is_eexist),
        FIXTURE_TEST(experiment_get_of_unknown_name_is_enotfound),
        FIXTURE_TEST(experiment_list_is_in_creation_order),
        FIXTURE_TEST(experiment_status_and_spec_can_be_changed),
        FIXTURE_TEST(experiment_changes_reject_unknown_ids_and_statuses),
        FIXTURE_TEST(trial_create_stores_a_queued_trial_and_returns_its_row),
        FIXTURE_TEST(trial_numbers_count_from_zero_within_each_experiment),
        FIXTURE_TEST(trial_create_in_unknown_experiment_is_enotfound),
        FIXTURE_TEST(trial_start_makes_it_running_with_job_and_attempt),
        FIXTURE_TEST(trial_start_of_running_trial_fails_naming_trial_and_status),
        FIXTURE_TEST(trial_start_and_finish_of_missing_trial_are_enotfound),
        FIXTURE_TEST(trial_finish_records_outcome_and_time),
        FIXTURE_TEST(trial_finish_is_allowed_only_from_running),
        FIXTURE_TEST(queued_trial_that_could_not_start_can_only_fail),
        FIXTURE_TEST(trial_finish_to_a_non_final_status_is_refused),
        FIXTURE_TEST(trial_retry_from_a_final_status_clears_the_previous_outcome),
        FIXTURE_TEST(trial_fields_round_trip_exactly),
        FIXTURE_TEST(trial_list_holds_one_experiment_ordered_by_number),
        FIXTURE_TEST(metrics_keep_steps_finals_and_special_values),
        FIXTURE_TEST(metrics_list_orders_by_trial_then_insertion),
        FIXTURE_TEST(metrics_add_moves_the_log_offset_only_when_asked),
        FIXTURE_TEST(metrics_add_with_a_bad_observation_stores_nothing),
        FIXTURE_TEST(metrics_add_to_unknown_trial_is_enotfound),
        FIXTURE_TEST(reopening_keeps_everything),
        FIXTURE_TEST(two_processes_writing_at_once_lose_nothing),
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
      tests[i].initial_state = (void *)&test_backends[b];
    }
    failed += _cmocka_run_group_tests(test_backends[b].name, tests,
                                      sizeof tests / sizeof tests[0], NULL, NULL);
  }
  /* NULL initial state: setup makes a plain sqlite storage. */
  const struct CMUnitTest sqlite_tests[] = {
      FIXTURE_TEST(sqlite_file_is_in_wal_mode_with_a_schema_version),
      FIXTURE_TEST(sqlite_newer_schema_is_refused_and_the_file_left_untouched),
      FIXTURE_TEST(sqlite_file_that_is_not_a_database_is_refused_untouched),
      FIXTURE_TEST(sqlite_database_of_another_program_is_refused_untouched),
      FIXTURE_TEST(sqlite_path_in_a_missing_folder_is_refused_naming_it),
      FIXTURE_TEST(sqlite_url_forms_open_the_same_file),
      FIXTURE_TEST(sqlite_relative_path_is_relative_to_the_current_folder),
      FIXTURE_TEST(two_processes_creating_the_same_storage_at_once_both_succeed),
      FIXTURE_TEST(metrics_add_failing_midway_stores_nothing),
  };
  failed += cmocka_run_group_tests_name("sqlite specifics", sqlite_tests, NULL, NULL);
  const struct CMUnitTest plain_tests[] = {
      cmocka_unit_test(trial_status_names_round_trip),
      cmocka_unit_test(urls_that_are_not_storage_are_refused_listing_accepted_forms),
      cmocka_unit_test(postgresql_urls_say_the_backend_is_not_built_without_the_password),
      cmocka_unit_test(redacted_urls_hide_passwords_in_uri_form),
      cmocka_unit_test(redacted_urls_hide_passwords_in_key_value_form),
      cmocka_unit_test(absolute_urls_resolve_relative_sqlite_paths),
  };
  failed += cmocka_run_group_tests_name("storage urls", plain_tests, NULL, NULL);
  return failed;
}
