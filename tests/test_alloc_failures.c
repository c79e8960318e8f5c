/* Allocation-failure tests: every allocation of an operation made to fail in turn, once and
 * from there on (tests/failalloc.h), over storage (SQLite), spec loading, the scheduler's
 * views of results and the optimizers. Each run must end in success or an error with a
 * message, leak nothing, and leave stored data as it was (a failed write) or as asked (a
 * successful one), read back through a fresh connection. */
#include "tests/failalloc.h"

#include <inttypes.h>
#include <cblas.h>
#include <gsl/gsl_errno.h>
#include <math.h>
#include <nlopt.h>
#include <yaml.h>

#include "optimizer/optimizer.h"
#include "scheduler/scheduler.h"
#include "spec/spec.h"
#include "storage/storage.h"

/* Fails the test with err's message unless rc is NAS_OK. */
#define must(rc, err)                                         \
  do {                                                        \
    if ((rc) != NAS_OK) fail_msg("%s: %s", #rc, (err).msg);   \
  } while (0)

/* Most runs per mode of one case; keeps the binary within seconds. */
#define RUNS_STORAGE 100
#define RUNS_SPEC 1500
#define RUNS_OPTIMIZER 0

/* ---- storage ---------------------------------------------------------------------------- */

/* A SQLite storage in a fresh folder, reopened for every run so that each run's connection
 * (and what it caches) is made and closed within the run. */
typedef struct {
  char *dir;
  char *url;
  storage *st;       /* open between before and after */
  int64_t exp_id;    /* the experiment the trial cases use */
  int64_t trial_id;  /* the trial a case works on */
  int runs;          /* names the next experiment */
  size_t expected;   /* what after should find: rows, metrics, … */
} store_ctx;

static storage *open_storage(const char *url) {
  storage *st = NULL;
  nas_err err = {{0}};
  must(storage_open(url, &st, &err), err);
  return st;
}

static void store_init(store_ctx *c) {
  memset(c, 0, sizeof *c);
  c->dir = test_tmpdir();
  c->url = nas_asprintf("sqlite:%s/nas.db", c->dir);
  storage *st = open_storage(c->url);
  nas_err err = {{0}};
  must(storage_experiment_create(st, "base", "name: base\n", "/tmp/base.yaml", "/tmp", &c->exp_id,
                                 &err),
       err);
  storage_close(st);
}

static void store_destroy(store_ctx *c) {
  test_rmtree(c->dir);
  free(c->dir);
  free(c->url);
}

static void fill_storage(store_ctx *c);

/* Runs one storage operation through every failure point on a fresh storage (holding a
 * few finished trials when filled). */
static void run_store_case(const char *name, void (*before)(void *), int (*op)(void *, nas_err *),
                           void (*after)(void *, int), bool filled) {
  store_ctx c;
  store_init(&c);
  if (filled) fill_storage(&c);
  failalloc_case fc = {.name = name, .ctx = &c, .before = before, .op = op, .after = after,
                       .max_runs = RUNS_STORAGE};
  failalloc_run(&fc, NULL);
  store_destroy(&c);
}

static void store_before(void *ctx) {
  store_ctx *c = ctx;
  c->st = open_storage(c->url);
}

/* Closes the run's connection (a failed run may have left it mid-transaction); the checks
 * that follow read through a fresh one. */
static storage *store_reopen(store_ctx *c) {
  storage_close(c->st);
  c->st = NULL;
  return open_storage(c->url);
}

static size_t trial_count(storage *st, int64_t exp_id) {
  trial_row *rows = NULL;
  size_t n = 0;
  nas_err err = {{0}};
  must(storage_trial_list(st, exp_id, &rows, &n, &err), err);
  trial_rows_free(rows, n);
  return n;
}

static trial_row trial_get(storage *st, int64_t id) {
  trial_row row;
  nas_err err = {{0}};
  must(storage_trial_get(st, id, &row, &err), err);
  return row;
}

/* Opening a new file creates the schema; a failed open leaves a file that opens. */
static void open_new_before(void *ctx) {
  store_ctx *c = ctx;
  test_rmtree_child(c->dir, "new.db");
}

static int open_new_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  char *url = nas_asprintf("sqlite:%s/new.db", c->dir);
  if (!url) return nas_errf(err, "out of memory");
  int rc = storage_open(url, &c->st, err);
  free(url);
  if (rc == NAS_OK) storage_close(c->st);
  c->st = NULL;
  return rc;
}

static void open_new_after(void *ctx, int rc) {
  (void)rc;
  store_ctx *c = ctx;
  char *url = nas_asprintf("sqlite:%s/new.db", c->dir);
  storage *st = open_storage(url);
  experiment_row *rows = NULL;
  size_t n = 9;
  nas_err err = {{0}};
  must(storage_experiment_list(st, &rows, &n, &err), err);
  assert_int_equal(n, 0);
  experiment_rows_free(rows, n);
  storage_close(st);
  free(url);
}

static void storage_open_creates_a_schema_or_fails_cleanly(void **state) {
  (void)state;
  run_store_case("storage_open (new file)", open_new_before, open_new_op, open_new_after, false);
}

/* An experiment is stored whole or not at all. */
static int experiment_create_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  char name[32];
  snprintf(name, sizeof name, "e%d", c->runs);
  int64_t id;
  return storage_experiment_create(c->st, name, "name: x\nseed: 3\n", "/tmp/x.yaml", "/tmp/runs",
                                   &id, err);
}

static void experiment_create_after(void *ctx, int rc) {
  store_ctx *c = ctx;
  storage *st = store_reopen(c);
  char name[32];
  snprintf(name, sizeof name, "e%d", c->runs++);
  experiment_row row;
  nas_err err = {{0}};
  int got = storage_experiment_get(st, name, &row, &err);
  if (rc == NAS_OK) {
    must(got, err);
    assert_string_equal(row.spec_text, "name: x\nseed: 3\n");
    assert_string_equal(row.spec_path, "/tmp/x.yaml");
    assert_string_equal(row.run_root, "/tmp/runs");
    experiment_row_clear(&row);
  } else {
    assert_int_equal(got, NAS_ENOTFOUND);
  }
  storage_close(st);
}

static void experiment_create_stores_all_or_nothing(void **state) {
  (void)state;
  run_store_case("storage_experiment_create", store_before, experiment_create_op,
                 experiment_create_after, false);
}

/* A trial is created whole (with the next number) or not at all. */
static void trial_create_before(void *ctx) {
  store_ctx *c = ctx;
  store_before(c);
  c->expected = trial_count(c->st, c->exp_id);
}

static int trial_create_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  trial_row row;
  int rc = storage_trial_create(c->st, c->exp_id, "{\"x\": 0.5, \"opt\": \"adam\"}",
                                "{\"loss\": 1.5}", &row, err);
  if (rc == NAS_OK) trial_row_clear(&row);
  return rc;
}

static void trial_create_after(void *ctx, int rc) {
  store_ctx *c = ctx;
  storage *st = store_reopen(c);
  trial_row *rows = NULL;
  size_t n = 0;
  nas_err err = {{0}};
  must(storage_trial_list(st, c->exp_id, &rows, &n, &err), err);
  assert_int_equal(n, c->expected + (rc == NAS_OK));
  if (rc == NAS_OK) {
    trial_row *last = &rows[n - 1];
    assert_int_equal(last->number, (int)n - 1);
    assert_int_equal(last->status, TRIAL_QUEUED);
    assert_non_null(strstr(last->params_json, "adam"));
    assert_non_null(last->reference_json);
  }
  trial_rows_free(rows, n);
  storage_close(st);
}

static void trial_create_stores_all_or_nothing(void **state) {
  (void)state;
  run_store_case("storage_trial_create", trial_create_before, trial_create_op, trial_create_after,
                 false);
}

/* Each run works on a trial of its own, made (and started, for finish and metrics) before. */
static void fresh_trial_before(void *ctx, bool started) {
  store_ctx *c = ctx;
  store_before(c);
  trial_row row;
  nas_err err = {{0}};
  must(storage_trial_create(c->st, c->exp_id, "{\"x\": 1}", NULL, &row, &err), err);
  c->trial_id = row.id;
  trial_row_clear(&row);
  if (started) must(storage_trial_start(c->st, c->trial_id, "job-0", &err), err);
}

static void queued_trial_before(void *ctx) { fresh_trial_before(ctx, false); }
static void running_trial_before(void *ctx) { fresh_trial_before(ctx, true); }

static int trial_start_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  return storage_trial_start(c->st, c->trial_id, "job-42", err);
}

static void trial_start_after(void *ctx, int rc) {
  store_ctx *c = ctx;
  storage *st = store_reopen(c);
  trial_row row = trial_get(st, c->trial_id);
  if (rc == NAS_OK) {
    assert_int_equal(row.status, TRIAL_RUNNING);
    assert_int_equal(row.attempts, 1);
    assert_string_equal(row.job_id, "job-42");
  } else {
    assert_int_equal(row.status, TRIAL_QUEUED);
    assert_int_equal(row.attempts, 0);
    assert_null(row.job_id);
  }
  trial_row_clear(&row);
  storage_close(st);
}

static void trial_start_changes_all_or_nothing(void **state) {
  (void)state;
  run_store_case("storage_trial_start", queued_trial_before, trial_start_op, trial_start_after,
                 false);
}

static int trial_finish_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  return storage_trial_finish(c->st, c->trial_id, TRIAL_FAILED, true, 3, "exited with status 3",
                              err);
}

static void trial_finish_after(void *ctx, int rc) {
  store_ctx *c = ctx;
  storage *st = store_reopen(c);
  trial_row row = trial_get(st, c->trial_id);
  if (rc == NAS_OK) {
    assert_int_equal(row.status, TRIAL_FAILED);
    assert_true(row.has_exit_code);
    assert_int_equal(row.exit_code, 3);
    assert_string_equal(row.error, "exited with status 3");
  } else {
    assert_int_equal(row.status, TRIAL_RUNNING);
    assert_false(row.has_exit_code);
    assert_null(row.error);
  }
  trial_row_clear(&row);
  storage_close(st);
}

static void trial_finish_changes_all_or_nothing(void **state) {
  (void)state;
  run_store_case("storage_trial_finish", running_trial_before, trial_finish_op, trial_finish_after,
                 false);
}

static int trial_claim_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  trial_row row;
  int rc = storage_trial_claim(c->st, c->exp_id, "worker-1", &row, err);
  if (rc == NAS_OK) {
    c->trial_id = row.id;
    trial_row_clear(&row);
  }
  return rc;
}

/* Claims the only queued trial: either it runs under the worker or it is still queued. */
static void trial_claim_after(void *ctx, int rc) {
  store_ctx *c = ctx;
  storage *st = store_reopen(c);
  trial_row *rows = NULL;
  size_t n = 0, queued = 0, claimed = 0;
  nas_err err = {{0}};
  must(storage_trial_list(st, c->exp_id, &rows, &n, &err), err);
  for (size_t i = 0; i < n; i++) {
    queued += rows[i].status == TRIAL_QUEUED;
    claimed += rows[i].job_id && strcmp(rows[i].job_id, "worker-1") == 0;
  }
  trial_rows_free(rows, n);
  assert_int_equal(queued, rc == NAS_OK ? 0 : 1);
  assert_int_equal(claimed, c->expected + (rc == NAS_OK));
  c->expected = claimed;
  if (rc != NAS_OK) { /* leave no queued trial behind for the next run's count */
    must(storage_trial_finish(st, c->trial_id, TRIAL_FAILED, false, 0, "test", &err), err);
  }
  storage_close(st);
}

static void trial_claim_takes_the_trial_or_leaves_it_queued(void **state) {
  (void)state;
  run_store_case("storage_trial_claim", queued_trial_before, trial_claim_op, trial_claim_after,
                 false);
}

static const metric_obs three_obs[] = {
    {"loss", 0, 2.5, 1000.0}, {"loss", 1, 1.25, 1001.0}, {"loss", METRIC_FINAL, 1.0, 1002.0}};

static int metrics_add_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  return storage_metrics_add(c->st, c->trial_id, three_obs, 3, 4096, err);
}

static void metrics_add_after(void *ctx, int rc) {
  store_ctx *c = ctx;
  storage *st = store_reopen(c);
  metric_row *rows = NULL;
  size_t n = 0, mine = 0;
  nas_err err = {{0}};
  must(storage_metrics_list(st, c->exp_id, &rows, &n, &err), err);
  for (size_t i = 0; i < n; i++) mine += rows[i].trial_id == c->trial_id;
  metric_rows_free(rows, n);
  trial_row row = trial_get(st, c->trial_id);
  assert_int_equal(mine, rc == NAS_OK ? 3 : 0);
  assert_int_equal(row.log_offset, rc == NAS_OK ? 4096 : 0);
  trial_row_clear(&row);
  storage_close(st);
}

static void metrics_add_stores_all_or_nothing(void **state) {
  (void)state;
  run_store_case("storage_metrics_add", running_trial_before, metrics_add_op, metrics_add_after,
                 false);
}

/* Listing: a storage with a few experiments, trials and metrics, read whole. */
static void fill_storage(store_ctx *c) {
  storage *st = open_storage(c->url);
  nas_err err = {{0}};
  for (int i = 0; i < 3; i++) {
    trial_row row;
    must(storage_trial_create(st, c->exp_id, "{\"x\": 0.25}", "{\"loss\": 2}", &row, &err), err);
    must(storage_trial_start(st, row.id, "job", &err), err);
    must(storage_metrics_add(st, row.id, three_obs, 3, 10, &err), err);
    must(storage_trial_finish(st, row.id, TRIAL_COMPLETED, true, 0, NULL, &err), err);
    trial_row_clear(&row);
  }
  storage_close(st);
}

static int list_all_op(void *ctx, nas_err *err) {
  store_ctx *c = ctx;
  experiment_row *exps = NULL;
  trial_row *trials = NULL;
  metric_row *metrics = NULL;
  size_t n_exps = 0, n_trials = 0, n_metrics = 0;
  int rc = storage_experiment_list(c->st, &exps, &n_exps, err);
  if (rc == NAS_OK) rc = storage_trial_list(c->st, c->exp_id, &trials, &n_trials, err);
  if (rc == NAS_OK) rc = storage_metrics_list(c->st, c->exp_id, &metrics, &n_metrics, err);
  if (rc == NAS_OK && (n_exps != 1 || n_trials != 3 || n_metrics != 9))
    rc = nas_errf(err, "listed %zu experiments, %zu trials, %zu metrics", n_exps, n_trials,
                  n_metrics);
  experiment_rows_free(exps, n_exps);
  trial_rows_free(trials, n_trials);
  metric_rows_free(metrics, n_metrics);
  return rc;
}

static void close_after(void *ctx, int rc) {
  (void)rc;
  store_ctx *c = ctx;
  storage_close(c->st);
  c->st = NULL;
}

static void listing_fails_cleanly(void **state) {
  (void)state;
  run_store_case("storage lists", store_before, list_all_op, close_after, true);
}

/* ---- spec ------------------------------------------------------------------------------- */

/* A spec with every section: conditions both ways, constraints, early stopping with rungs,
 * environment, runner and optimizer options, budget with patience. */
static const char full_spec[] =
    "name: full\n"
    "seed: 11\n"
    "storage: sqlite:full.db\n"
    "parameters:\n"
    "  opt: {type: categorical, choices: [sgd, adam, adamw]}\n"
    "  beta: {type: float, low: 0.8, high: 0.999, when: {param: opt, in: [adam, adamw]}}\n"
    "  layers: {type: int, low: 1, high: 4}\n"
    "  width4: {type: int, low: 8, high: 64, step: 8, when: \"layers >= 4\"}\n"
    "  lr: {type: float, low: 1e-4, high: 1e-1, log: true}\n"
    "  tag: {type: fixed, value: v1}\n"
    "objectives:\n"
    "  - {name: loss, goal: minimize, threshold: 2}\n"
    "  - {name: size, goal: minimize}\n"
    "constraints:\n"
    "  - \"latency_ms <= 5\"\n"
    "  - \"accuracy >= 0.5\"\n"
    "trial:\n"
    "  command: [./train, \"--opt={opt}\", \"--lr={lr}\", \"--tag={tag}\", \"{{literal}}\"]\n"
    "  env: {OMP_NUM_THREADS: \"1\", MODE: fast}\n"
    "  timeout: 90s\n"
    "  max_attempts: 2\n"
    "budget: {trials: 30, parallel: 3, wall_time: 1h, patience: {trials: 5, min_improvement: "
    "0.01}}\n"
    "runner: {type: local}\n"
    "optimizer: {type: gp, n_initial: 6}\n"
    "early_stopping: {rule: asha, objectives: [loss], min_steps: 2, reduction_factor: 2, "
    "min_trials: 3}\n"
    "notify: [{url: \"https://hooks.example.com/T0/SECRET\", on: [trial_failed], format: slack}]\n";

typedef struct {
  const char *text;
  const char *name;
  const char *expect_error; /* text the message must hold for an invalid spec, else NULL */
  spec *reference;          /* parsed without failures */
  spec *parsed;             /* the run's result, for after */
} spec_ctx;

static int spec_parse_op(void *ctx, nas_err *err) {
  spec_ctx *c = ctx;
  int rc = spec_parse(c->text, c->name, "/tmp", &c->parsed, err);
  if (!c->expect_error || rc == NAS_OK) return rc;
  /* An invalid spec must be refused for its own fault, or for want of memory. */
  if (strstr(err->msg, c->expect_error)) return NAS_OK;
  if (!strstr(err->msg, "out of memory") && !strstr(err->msg, strerror(ENOMEM)))
    fail_msg("%s: unexpected error: %s", c->name, err->msg);
  return rc;
}

static void spec_parse_after(void *ctx, int rc) {
  spec_ctx *c = ctx;
  if (c->expect_error) {
    assert_null(c->parsed);
    return;
  }
  if (rc != NAS_OK) {
    assert_null(c->parsed);
    return;
  }
  char *diff = NULL;
  nas_err err = {{0}};
  must(spec_diff(c->reference, c->parsed, &diff, &err), err);
  if (diff) fail_msg("%s parsed differently:\n%s", c->name, diff);
  spec_free(c->parsed);
  c->parsed = NULL;
}

static void run_spec_case(const char *text, const char *name, const char *expect_error) {
  spec_ctx c = {text, name, expect_error, NULL, NULL};
  nas_err err = {{0}};
  if (!expect_error) must(spec_parse(text, name, "/tmp", &c.reference, &err), err);
  /* libyaml 0.2.5's loader leaks a node's item stack when adding the node fails. */
  failalloc_case fc = {.name = name, .ctx = &c, .op = spec_parse_op, .after = spec_parse_after,
                       .max_runs = RUNS_SPEC, .leaky_library = (const void *)yaml_parser_load};
  failalloc_run(&fc, NULL);
  spec_free(c.reference);
}

static void spec_parse_of_the_digits_example_fails_cleanly(void **state) {
  (void)state;
  char *text = NULL;
  nas_err err = {{0}};
  must(nas_read_file("examples/digits-nas.yaml", &text, NULL, &err), err);
  run_spec_case(text, "digits-nas.yaml", NULL);
  free(text);
}

static void spec_parse_of_every_section_fails_cleanly(void **state) {
  (void)state;
  run_spec_case(full_spec, "full.yaml", NULL);
}

static void spec_parse_of_an_invalid_spec_reports_its_error_or_out_of_memory(void **state) {
  (void)state;
  static const char misspelt[] =
      "name: bad\n"
      "parameters:\n"
      "  x: {type: float, low: 0, high: 1}\n"
      "  y: {type: int, low: 1, high: 5, when: \"x >= 0.5\"}\n"
      "objectives: [{name: loss, goal: minimize}]\n"
      "trial: {command: [run, \"{x}\"], timout: 5s}\n";
  run_spec_case(misspelt, "misspelt.yaml", "unknown key 'timout'");
}

/* Rendering a trial's command line and comparing specs. */
typedef struct {
  spec *s;
  spec *other;
  json_t *params;
} render_ctx;

static int render_and_diff_op(void *ctx, nas_err *err) {
  render_ctx *c = ctx;
  char **argv = NULL;
  int rc = spec_render_argv(c->s, c->params, &argv, err);
  if (rc != NAS_OK) return rc;
  bool rendered = strcmp(argv[1], "--opt=adam") == 0 && strcmp(argv[4], "{literal}") == 0;
  spec_argv_free(argv);
  if (!rendered) fail_msg("rendered wrongly");
  char *diff = NULL;
  rc = spec_diff(c->s, c->other, &diff, err);
  if (rc != NAS_OK) return rc;
  bool differs = diff && strstr(diff, "budget") != NULL;
  free(diff);
  if (!differs) fail_msg("diff misses the budget change");
  return NAS_OK;
}

static void spec_render_and_diff_fail_cleanly(void **state) {
  (void)state;
  render_ctx c = {0};
  nas_err err = {{0}};
  must(spec_parse(full_spec, "full.yaml", "/tmp", &c.s, &err), err);
  char *changed = strdup(full_spec);
  memcpy(strstr(changed, "trials: 30"), "trials: 40", 10);
  must(spec_parse(changed, "full.yaml", "/tmp", &c.other, &err), err);
  free(changed);
  json_error_t jerr;
  c.params = json_loads("{\"opt\": \"adam\", \"beta\": 0.9, \"layers\": 2, \"lr\": 0.01, "
                        "\"tag\": \"v1\"}",
                        0, &jerr);
  failalloc_case fc = {.name = "spec_render_argv + spec_diff", .ctx = &c,
                       .op = render_and_diff_op, .max_runs = RUNS_SPEC};
  failalloc_run(&fc, NULL);
  json_decref(c.params);
  spec_free(c.s);
  spec_free(c.other);
}

/* ---- scheduler -------------------------------------------------------------------------- */

/* An experiment of full_spec with completed trials (every objective and constraint, and
 * intermediate losses), a failed one and a running one; the reference views are loaded
 * once without failures. */
typedef struct {
  store_ctx store;
  spec *s;
  sched_results results;
  size_t front_n;
  double front_hv;
  size_t n_curves;
  const char *stored_text; /* sched_prepare cases: the text the experiment is stored with */
  bool refused;            /* and whether the change must be refused */
  int saved_stderr;        /* sched_prepare logs; its lines are dropped during the runs */
} sched_ctx;

static void add_finished_trial(storage *st, int64_t exp_id, int k, trial_status status) {
  trial_row row;
  nas_err err = {{0}};
  must(storage_trial_create(st, exp_id, "{\"opt\": \"sgd\", \"layers\": 2, \"lr\": 0.01, "
                            "\"tag\": \"v1\"}", NULL, &row, &err), err);
  must(storage_trial_start(st, row.id, "job", &err), err);
  metric_obs obs[] = {{"loss", 2, 3.0 - k * 0.25, 1.0}, {"loss", 4, 2.0 - k * 0.25, 2.0},
                      {"loss", METRIC_FINAL, 1.5 - k * 0.25, 3.0},
                      {"size", METRIC_FINAL, 10.0 + k * k, 3.0},
                      {"latency_ms", METRIC_FINAL, k == 3 ? 9.0 : 2.0, 3.0},
                      {"accuracy", METRIC_FINAL, 0.75, 3.0}};
  must(storage_metrics_add(st, row.id, obs, 6, -1, &err), err);
  if (status != TRIAL_RUNNING)
    must(storage_trial_finish(st, row.id, status, true, 0, NULL, &err), err);
  trial_row_clear(&row);
}

static void sched_init(sched_ctx *c) {
  memset(c, 0, sizeof *c);
  store_init(&c->store);
  nas_err err = {{0}};
  must(spec_parse(full_spec, "full.yaml", "/tmp", &c->s, &err), err);
  storage *st = open_storage(c->store.url);
  for (int k = 0; k < 5; k++) add_finished_trial(st, c->store.exp_id, k, TRIAL_COMPLETED);
  add_finished_trial(st, c->store.exp_id, 5, TRIAL_FAILED);
  add_finished_trial(st, c->store.exp_id, 6, TRIAL_RUNNING);
  must(sched_results_load(st, c->s, c->store.exp_id, &c->results, &err), err);
  size_t *idx = NULL;
  double ref[2];
  must(sched_front(c->s, &c->results, &idx, &c->front_n, &c->front_hv, ref, &err), err);
  free(idx);
  sched_curve *curves = NULL;
  must(sched_curves_load(st, c->s, c->store.exp_id, &curves, &c->n_curves, &err), err);
  sched_curves_free(curves, c->n_curves);
  storage_close(st);
}

static void sched_destroy(sched_ctx *c) {
  sched_results_free(&c->results);
  spec_free(c->s);
  store_destroy(&c->store);
}

static void sched_before(void *ctx) { store_before(&((sched_ctx *)ctx)->store); }
static void sched_after(void *ctx, int rc) { close_after(&((sched_ctx *)ctx)->store, rc); }

static bool same_values(const sched_results *a, const sched_results *b) {
  if (a->n_trials != b->n_trials || a->n_metrics != b->n_metrics) return false;
  for (size_t i = 0; i < a->n_trials * a->n_metrics; i++) {
    bool both_nan = isnan(a->values[i]) && isnan(b->values[i]);
    if (!both_nan && a->values[i] != b->values[i]) return false;
  }
  return true;
}

static int results_load_op(void *ctx, nas_err *err) {
  sched_ctx *c = ctx;
  sched_results r;
  int rc = sched_results_load(c->store.st, c->s, c->store.exp_id, &r, err);
  if (rc != NAS_OK) return rc;
  bool same = same_values(&r, &c->results);
  sched_results_free(&r);
  if (!same) fail_msg("sched_results_load read different values");
  return NAS_OK;
}

static int curves_load_op(void *ctx, nas_err *err) {
  sched_ctx *c = ctx;
  sched_curve *curves = NULL;
  size_t n = 0;
  int rc = sched_curves_load(c->store.st, c->s, c->store.exp_id, &curves, &n, err);
  if (rc != NAS_OK) return rc;
  sched_curves_free(curves, n);
  if (n != c->n_curves) fail_msg("sched_curves_load read %zu curves, not %zu", n, c->n_curves);
  return NAS_OK;
}

/* The loop's curves: loaded, then one trial's put back from its own observations. */
static int curve_set_op(void *ctx, nas_err *err) {
  sched_ctx *c = ctx;
  sched_curve_set set;
  int rc = sched_curve_set_load(c->store.st, c->s, c->store.exp_id, &set, err);
  if (rc != NAS_OK) return rc;
  if (set.n == 0) fail_msg("sched_curve_set_load read no curve");
  int64_t trial_id = set.curves[0].trial_id;
  metric_row *rows = NULL;
  size_t n_rows = 0;
  bool stale = false;
  rc = storage_metrics_of_trial(c->store.st, trial_id, &rows, &n_rows, err);
  if (rc == NAS_OK) {
    rc = sched_curve_set_put(c->s, &set, trial_id, rows, n_rows, &stale, err);
    metric_rows_free(rows, n_rows);
  }
  size_t n = set.n;
  sched_curve_set_free(&set);
  if (rc == NAS_OK && (stale || n != c->n_curves))
    fail_msg("the curve set holds %zu curves%s, not %zu", n, stale ? " (stale)" : "", c->n_curves);
  return rc;
}

static void results_and_curves_load_fail_cleanly(void **state) {
  (void)state;
  sched_ctx c;
  sched_init(&c);
  failalloc_case load = {.name = "sched_results_load", .ctx = &c, .before = sched_before,
                         .op = results_load_op, .after = sched_after, .max_runs = RUNS_STORAGE};
  failalloc_run(&load, NULL);
  failalloc_case curves = {.name = "sched_curves_load", .ctx = &c, .before = sched_before,
                           .op = curves_load_op, .after = sched_after, .max_runs = RUNS_STORAGE};
  failalloc_run(&curves, NULL);
  failalloc_case set = {.name = "sched_curve_set_put", .ctx = &c, .before = sched_before,
                        .op = curve_set_op, .after = sched_after, .max_runs = RUNS_STORAGE};
  failalloc_run(&set, NULL);
  sched_destroy(&c);
}

static int front_op(void *ctx, nas_err *err) {
  sched_ctx *c = ctx;
  size_t *idx = NULL, n = 0;
  double hv, ref[2];
  int rc = sched_front(c->s, &c->results, &idx, &n, &hv, ref, err);
  if (rc != NAS_OK) return rc;
  free(idx);
  if (n != c->front_n || hv != c->front_hv)
    fail_msg("front of %zu trials with hypervolume %g, not %zu with %g", n, hv, c->front_n,
             c->front_hv);
  return NAS_OK;
}

static void front_fails_cleanly(void **state) {
  (void)state;
  sched_ctx c;
  sched_init(&c);
  failalloc_case fc = {.name = "sched_front", .ctx = &c, .op = front_op};
  failalloc_run(&fc, NULL);
  sched_destroy(&c);
}

/* sched_prepare on a storage holding the experiment with stored_text (none when NULL). */
static void prepare_before(void *ctx) {
  sched_ctx *c = ctx;
  for (const char *const *f = (const char *const[]){"nas.db", "nas.db-wal", "nas.db-shm", NULL};
       *f; f++)
    test_rmtree_child(c->store.dir, *f);
  store_before(&c->store);
  if (c->stored_text) {
    int64_t id;
    nas_err err = {{0}};
    must(storage_experiment_create(c->store.st, c->s->name, c->stored_text, "/tmp/full.yaml",
                                   "/tmp", &id, &err),
         err);
  }
  fflush(stderr);
  c->saved_stderr = dup(2);
  int devnull = open("/dev/null", O_WRONLY);
  dup2(devnull, 2);
  close(devnull);
}

static int prepare_op(void *ctx, nas_err *err) {
  sched_ctx *c = ctx;
  experiment_row exp;
  int rc = sched_prepare(c->s, c->store.st, &exp, err);
  if (rc == NAS_OK) experiment_row_clear(&exp);
  return rc;
}

/* Afterwards the experiment holds the new spec when prepare succeeded, the old one (or
 * none) when it refused the change, and one of the two when it failed: the failure may
 * come after the write, in reading the experiment back. */
static void prepare_after(void *ctx, int rc) {
  sched_ctx *c = ctx;
  dup2(c->saved_stderr, 2);
  close(c->saved_stderr);
  storage *st = store_reopen(&c->store);
  experiment_row row;
  nas_err err = {{0}};
  int got = storage_experiment_get(st, c->s->name, &row, &err);
  if (rc == NAS_OK || c->stored_text) must(got, err);
  if (got == NAS_OK) {
    bool is_new = strcmp(row.spec_text, c->s->text) == 0;
    bool is_old = c->stored_text && strcmp(row.spec_text, c->stored_text) == 0;
    if (c->refused ? !is_old : rc == NAS_OK ? !is_new : !is_new && !is_old)
      fail_msg("stored spec after rc %d:\n%s", rc, row.spec_text);
    experiment_row_clear(&row);
  } else {
    assert_int_equal(got, NAS_ENOTFOUND);
  }
  storage_close(st);
}

/* An experiment whose stored spec differs beyond the budget must be refused, whatever
 * fails: accepting it would mix trials of two specs. */
static int prepare_refused_op(void *ctx, nas_err *err) {
  int rc = prepare_op(ctx, err);
  if (rc == NAS_OK) fail_msg("a spec with another seed was accepted");
  return strstr(err->msg, "already exists with a different spec") ? NAS_OK : rc;
}

static void run_prepare_case(const char *name, const char *stored_text, bool refused) {
  sched_ctx c;
  sched_init(&c);
  c.stored_text = stored_text;
  c.refused = refused;
  failalloc_case fc = {.name = name, .ctx = &c, .before = prepare_before,
                       .op = refused ? prepare_refused_op : prepare_op,
                       .after = prepare_after, .max_runs = RUNS_STORAGE};
  failalloc_run(&fc, NULL);
  sched_destroy(&c);
}

static void prepare_creates_the_experiment_or_nothing(void **state) {
  (void)state;
  run_prepare_case("sched_prepare (new experiment)", NULL, false);
}

static void prepare_stores_a_budget_change_or_keeps_the_old_spec(void **state) {
  (void)state;
  char *old = strdup(full_spec);
  memcpy(strstr(old, "trials: 30"), "trials: 10", 10);
  memcpy(strstr(old, "SECRET"), "OTHER!", 6); /* a webhook change hidden in messages */
  run_prepare_case("sched_prepare (budget and notify changed)", old, false);
  free(old);
}

static void prepare_refuses_another_spec_even_out_of_memory(void **state) {
  (void)state;
  char *old = strdup(full_spec);
  memcpy(strstr(old, "seed: 11"), "seed: 12", 8);
  run_prepare_case("sched_prepare (spec changed)", old, true);
  free(old);
}

/* ---- optimizer -------------------------------------------------------------------------- */

/* A small mixed space with two objectives and a constraint, a few observations and one
 * pending trial; the suggestions made without failures are the reference every successful
 * run must reproduce (suggestions are deterministic). */
#define OPT_OBS 8
#define OPT_Q 2

typedef struct {
  spec *s;
  json_t *params[OPT_OBS];
  double obj[OPT_OBS][2], con[OPT_OBS][1];
  observation obs[OPT_OBS];
  json_t *pending;
  json_t *reference[OPT_Q]; /* made without failures */
  json_t *out[OPT_Q];       /* a run's suggestions, for suggest_after */
} opt_ctx;

static const char opt_spec_format[] =
    "name: opt\n"
    "seed: 5\n"
    "parameters:\n"
    "  x: {type: float, low: 0, high: 1}\n"
    "  n: {type: int, low: 1, high: 8}\n"
    "  act: {type: categorical, choices: [relu, tanh]}\n"
    "objectives: [{name: a, goal: minimize}, {name: b, goal: maximize}]\n"
    "constraints: [\"c <= 0.8\"]\n"
    "trial: {command: [run]}\n"
    "budget: {trials: 20}\n"
    "optimizer: %s\n";

static int suggest_op(void *ctx, nas_err *err) {
  opt_ctx *c = ctx;
  optimizer *opt = NULL;
  int rc = optimizer_create(c->s, &opt, err);
  double refs[OPT_Q * 2];
  const json_t *pending[] = {c->pending};
  if (rc == NAS_OK)
    rc = optimizer_suggest(opt, c->obs, OPT_OBS, pending, 1, OPT_Q, OPT_OBS + 1, c->out, refs,
                           err);
  optimizer_free(opt);
  return rc;
}

/* Successful suggestions are those made without failures, except where NLopt ran short:
 * its L-BFGS then keeps fewer corrections and goes on, to a slightly different optimum. */
static void suggest_after(void *ctx, int rc) {
  opt_ctx *c = ctx;
  bool absorbed = failalloc_failed_in((const void *)nlopt_create);
  for (size_t i = 0; rc == NAS_OK && i < OPT_Q; i++) {
    if (!json_equal(c->out[i], c->reference[i]) && !absorbed) {
      char *got = json_dumps(c->out[i], JSON_COMPACT);
      fail_msg("suggestion %zu is %s, unlike the one made without failures", i, got);
    }
  }
  for (size_t i = 0; i < OPT_Q; i++) {
    json_decref(c->out[i]);
    c->out[i] = NULL;
  }
}

static void run_optimizer_case(const char *name, const char *optimizer_yaml, long max_runs) {
  opt_ctx c = {0};
  char yaml[1024];
  snprintf(yaml, sizeof yaml, opt_spec_format, optimizer_yaml);
  nas_err err = {{0}};
  must(spec_parse(yaml, "opt.yaml", "/tmp", &c.s, &err), err);
  for (size_t i = 0; i < OPT_OBS; i++) {
    double x = (double)i / OPT_OBS;
    c.params[i] = json_pack("{s:f, s:i, s:s}", "x", x, "n", (int)(1 + i % 8), "act",
                            i % 2 ? "relu" : "tanh");
    c.obj[i][0] = (x - 0.3) * (x - 0.3) + 0.01 * (double)i;
    c.obj[i][1] = x + 0.1 * (double)(i % 3);
    c.con[i][0] = x;
    c.obs[i] = (observation){c.params[i], c.obj[i], c.con[i], NULL};
  }
  c.pending = json_pack("{s:f, s:i, s:s}", "x", 0.55, "n", 3, "act", "relu");
  must(suggest_op(&c, &err), err);
  memcpy(c.reference, c.out, sizeof c.out);
  /* OpenBLAS exits the process when its own allocation fails; its are spared. */
  failalloc_case fc = {.name = name, .ctx = &c, .op = suggest_op, .after = suggest_after,
                       .max_runs = max_runs, .spared_library = (const void *)cblas_dgemm};
  failalloc_run(&fc, NULL);
  for (size_t i = 0; i < OPT_Q; i++) json_decref(c.reference[i]);
  for (size_t i = 0; i < OPT_OBS; i++) json_decref(c.params[i]);
  json_decref(c.pending);
  spec_free(c.s);
}

static void random_and_sobol_suggestions_fail_cleanly(void **state) {
  (void)state;
  run_optimizer_case("optimizer random", "{type: random}", RUNS_SPEC);
  run_optimizer_case("optimizer sobol", "{type: sobol}", RUNS_SPEC);
}

static void gp_suggestions_fail_cleanly(void **state) {
  (void)state;
  run_optimizer_case("optimizer gp",
                     "{type: gp, n_initial: 4, raw_samples: 32, restarts: 2, mc_samples: 16, "
                     "fit_restarts: 0}",
                     RUNS_OPTIMIZER);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(storage_open_creates_a_schema_or_fails_cleanly),
      cmocka_unit_test(experiment_create_stores_all_or_nothing),
      cmocka_unit_test(trial_create_stores_all_or_nothing),
      cmocka_unit_test(trial_start_changes_all_or_nothing),
      cmocka_unit_test(trial_finish_changes_all_or_nothing),
      cmocka_unit_test(trial_claim_takes_the_trial_or_leaves_it_queued),
      cmocka_unit_test(metrics_add_stores_all_or_nothing),
      cmocka_unit_test(listing_fails_cleanly),
      cmocka_unit_test(spec_parse_of_the_digits_example_fails_cleanly),
      cmocka_unit_test(spec_parse_of_every_section_fails_cleanly),
      cmocka_unit_test(spec_parse_of_an_invalid_spec_reports_its_error_or_out_of_memory),
      cmocka_unit_test(spec_render_and_diff_fail_cleanly),
      cmocka_unit_test(results_and_curves_load_fail_cleanly),
      cmocka_unit_test(front_fails_cleanly),
      cmocka_unit_test(prepare_creates_the_experiment_or_nothing),
      cmocka_unit_test(prepare_stores_a_budget_change_or_keeps_the_old_spec),
      cmocka_unit_test(prepare_refuses_another_spec_even_out_of_memory),
      cmocka_unit_test(random_and_sobol_suggestions_fail_cleanly),
      cmocka_unit_test(gp_suggestions_fail_cleanly),
  };
  if (failalloc_unavailable()) return 0;
  gsl_set_error_handler_off(); /* as bin/nas does: GSL reports errors by return value */
  /* FAILALLOC_TEST=pattern runs only the tests it names (for debugging). */
  if (getenv("FAILALLOC_TEST")) cmocka_set_test_filter(getenv("FAILALLOC_TEST"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
