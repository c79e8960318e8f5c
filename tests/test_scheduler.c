/* Scheduler decisions that need no processes: early stopping on constructed learning
 * curves (median and ASHA, one and two objectives) and the patience rule. */
#include <math.h>

#include "scheduler/scheduler.h"
#include "tests/testutil.h"

static spec *load(const char *early_stopping, const char *objectives, const char *budget) {
  char *text;
  assert_true(asprintf(&text,
                       "name: t\nparameters:\n  x: {type: float, low: 0, high: 1}\n"
                       "objectives: %s\ntrial: {command: [run]}\nbudget: %s\n%s\n",
                       objectives, budget, early_stopping) > 0);
  spec *s;
  nas_err err;
  if (spec_parse(text, "t.yaml", "/tmp", &s, &err) != NAS_OK) fail_msg("%s", err.msg);
  free(text);
  return s;
}

/* A curve reporting value v(step) = start + slope·step at steps 1..n (one objective). */
static sched_curve line(int64_t id, size_t n, double start, double slope) {
  sched_curve c = {.trial_id = id, .n_steps = n};
  c.steps = malloc(n * sizeof *c.steps);
  c.values = malloc(n * sizeof *c.values);
  for (size_t k = 0; k < n; k++) {
    c.steps[k] = (int64_t)k + 1;
    c.values[k] = start + slope * (double)(k + 1);
  }
  return c;
}

static void free_curves(sched_curve *c, size_t n) {
  for (size_t i = 0; i < n; i++) free(c[i].steps), free(c[i].values);
}

/* Ten trials minimising a loss: eight good ones on the same descending curve and two
 * clearly bad ones stuck near 5; the median rule must stop exactly the two bad ones. (The
 * median rule stops whatever is worse than half of its peers, so good trials that differ
 * would lose their worse half too: that is the rule, not a fault.) */
static void median_rule_stops_the_clearly_bad_trials_and_no_others(void **state) {
  (void)state;
  spec *s = load("early_stopping: {rule: median, min_steps: 2, min_trials: 4}",
                 "[{name: loss, goal: minimize}]", "{trials: 10}");
  sched_curve curves[10];
  for (int i = 0; i < 8; i++) curves[i] = line(i, 6, 1.0, -0.1);
  curves[8] = line(8, 6, 5.0, 0.0);
  curves[9] = line(9, 6, 4.8, 0.01);
  for (size_t i = 0; i < 10; i++) {
    size_t rung = 0;
    sched_verdict v;
    sched_early_stop_judge(s, curves, 10, i, &rung, &v);
    assert_int_equal(v.stop, i >= 8);
    assert_int_equal(v.step, 6);
    assert_int_equal(v.compared, 9);
  }
  free_curves(curves, 10);
  spec_free(s);
}

static void median_rule_waits_for_min_steps_and_min_trials(void **state) {
  (void)state;
  spec *s = load("early_stopping: {rule: median, min_steps: 3, min_trials: 4}",
                 "[{name: loss, goal: minimize}]", "{trials: 10}");
  sched_curve curves[4] = {line(0, 2, 9, 0), line(1, 5, 1, 0), line(2, 5, 1, 0), line(3, 5, 1, 0)};
  size_t rung = 0;
  sched_verdict v;
  sched_early_stop_judge(s, curves, 4, 0, &rung, &v); /* step 2 < min_steps */
  assert_false(v.stop);
  free(curves[0].steps), free(curves[0].values);
  curves[0] = line(0, 4, 9, 0);
  sched_early_stop_judge(s, curves, 4, 0, &rung, &v); /* only 3 others at step 4 */
  assert_false(v.stop);
  assert_int_equal(v.compared, 3);
  free_curves(curves, 4);
  spec_free(s);
}

/* Maximised accuracy: ASHA with η = 3 keeps the best third at each rung. */
static void asha_keeps_the_best_third_at_each_rung(void **state) {
  (void)state;
  spec *s = load("early_stopping: {rule: asha, rungs: [2, 4], min_trials: 3, reduction_factor: 3}",
                 "[{name: accuracy, goal: maximize}]", "{trials: 10}");
  sched_curve curves[6];
  for (int i = 0; i < 6; i++) curves[i] = line(i, 4, 0.1 * i, 0.01); /* trial 5 best */
  /* Curves hold the minimisation convention: maximised accuracy is negated. */
  for (int i = 0; i < 6; i++)
    for (size_t k = 0; k < 4; k++) curves[i].values[k] = -curves[i].values[k];
  int stopped = 0;
  for (size_t i = 0; i < 6; i++) {
    size_t rung = 0;
    sched_verdict v;
    sched_early_stop_judge(s, curves, 6, i, &rung, &v);
    stopped += v.stop;
    assert_int_equal(v.stop, i < 4); /* best two of six survive: 1/η of them */
    if (!v.stop) assert_int_equal(rung, 2); /* passed both rungs */
  }
  assert_int_equal(stopped, 4);
  free_curves(curves, 6);
  spec_free(s);
}

/* Two objectives: a trial is worse only when others dominate it; a trade-off survives. */
static void two_objective_rule_stops_only_dominated_trials(void **state) {
  (void)state;
  spec *s = load("early_stopping: {rule: median, min_steps: 1, min_trials: 3}",
                 "[{name: loss, goal: minimize}, {name: size, goal: minimize}]", "{trials: 9}");
  double points[5][2] = {{1, 5}, {2, 4}, {3, 3}, {5, 1}, {6, 6}}; /* last one dominated */
  sched_curve curves[5];
  for (int i = 0; i < 5; i++) {
    curves[i] = (sched_curve){.trial_id = i, .n_steps = 1};
    curves[i].steps = malloc(sizeof *curves[i].steps);
    curves[i].values = malloc(2 * sizeof *curves[i].values);
    curves[i].steps[0] = 1;
    curves[i].values[0] = points[i][0];
    curves[i].values[1] = points[i][1];
  }
  for (size_t i = 0; i < 5; i++) {
    size_t rung = 0;
    sched_verdict v;
    sched_early_stop_judge(s, curves, 5, i, &rung, &v);
    assert_int_equal(v.stop, i == 4);
  }
  free_curves(curves, 5);
  spec_free(s);
}

static void results_with(const spec *s, sched_results *r, const double *values, size_t n) {
  memset(r, 0, sizeof *r);
  r->n_trials = n;
  r->trials = calloc(n, sizeof *r->trials);
  r->n_metrics = s->n_objectives;
  r->values = malloc(n * r->n_metrics * sizeof *r->values);
  memcpy(r->values, values, n * r->n_metrics * sizeof *values);
  for (size_t i = 0; i < n; i++) r->trials[i].status = TRIAL_COMPLETED, r->trials[i].number = (int)i;
  r->metric_names = calloc(r->n_metrics, sizeof *r->metric_names);
  for (size_t j = 0; j < r->n_metrics; j++) r->metric_names[j] = strdup(s->objectives[j].name);
}

static void patience_is_spent_when_the_front_stops_growing(void **state) {
  (void)state;
  spec *s = load("", "[{name: a, goal: minimize, threshold: 10}, {name: b, goal: minimize, threshold: 10}]",
                 "{trials: 20, patience: {trials: 3, min_improvement: 0.01}}");
  /* A front that improves, then three trials that add nothing to it. */
  double improving[] = {5, 5, 4, 4, 3, 3, 2, 2, 9, 9, 8, 8, 7, 7};
  sched_results r;
  double before, now;
  results_with(s, &r, improving, 4);
  assert_false(sched_patience_spent(s, &r, &before, &now)); /* still growing */
  sched_results_free(&r);
  results_with(s, &r, improving, 7);
  assert_true(sched_patience_spent(s, &r, &before, &now));
  assert_true(before == now);
  assert_true(now == 64); /* (10-2)² */
  sched_results_free(&r);
  spec_free(s);
}

/* Without a wall-time budget the trials expected are budget.trials; with one, as many as
 * `parallel` slots fit at the median duration of the completed trials (a failed one and
 * one still running say nothing of it), unless budget.trials is fewer. */
static void trials_expected_follow_the_budget_and_the_median_duration(void **state) {
  (void)state;
  spec *counted = load("", "[{name: a, goal: minimize}]", "{trials: 40, parallel: 2}");
  spec *timed =
      load("", "[{name: a, goal: minimize}]", "{trials: 1000, parallel: 2, wall_time: 1h}");
  spec *few = load("", "[{name: a, goal: minimize}]", "{trials: 12, parallel: 2, wall_time: 1h}");
  double values[4] = {1, 2, 3, 4};
  double durations[4] = {600, 300, 5, 900}; /* the 5 s trial failed */
  sched_results r;
  results_with(timed, &r, values, 4);
  assert_int_equal(sched_trials_expected(counted, &r), 40);
  assert_int_equal(sched_trials_expected(timed, &r), 1000); /* no durations yet */
  for (size_t i = 0; i < 4; i++) {
    r.trials[i].started_at = 1000;
    r.trials[i].finished_at = 1000 + durations[i];
  }
  r.trials[2].status = TRIAL_FAILED;
  assert_int_equal(sched_trials_expected(timed, &r), 12); /* 2 × 3600 / 600 */
  r.trials[3].status = TRIAL_RUNNING;
  r.trials[3].finished_at = 0;
  assert_int_equal(sched_trials_expected(timed, &r), 16); /* 2 × 3600 / 450 */
  assert_int_equal(sched_trials_expected(few, &r), 12);
  sched_results_free(&r);
  spec_free(counted), spec_free(timed), spec_free(few);
}

static void front_leaves_out_trials_beyond_a_threshold(void **state) {
  (void)state;
  spec *s = load("", "[{name: a, goal: minimize, threshold: 10}, {name: b, goal: maximize}]",
                 "{trials: 5}");
  /* Trial 1 is not dominated (best b) but its a is worse than the threshold. */
  double values[] = {2, 5, 12, 9, 3, 1};
  sched_results r;
  results_with(s, &r, values, 3);
  size_t *front, n;
  double hv, ref[2];
  nas_err err;
  assert_int_equal(sched_front(s, &r, &front, &n, &hv, ref, &err), NAS_OK);
  assert_int_equal(n, 1);
  assert_int_equal(front[0], 0);
  free(front);
  sched_results_free(&r);
  spec_free(s);
}

/* A SQLite storage in dir holding s as experiment "t" (its id in *exp). */
static storage *stored_experiment(const spec *s, const char *dir, int64_t *exp) {
  char *url;
  assert_true(asprintf(&url, "sqlite:%s/nas.db", dir) > 0);
  storage *st;
  nas_err err;
  if (storage_open(url, &st, &err) != NAS_OK ||
      storage_experiment_create(st, "t", s->text, "/tmp/t.yaml", dir, exp, &err) != NAS_OK)
    fail_msg("%s", err.msg);
  free(url);
  return st;
}

/* The built-in NAS case: accuracy after every epoch, params only at the end (of the trials
 * that finished). Curves come from real storage; params, never reported with a step, must
 * not keep the median rule from stopping the one clearly bad trial. */
static void final_only_objective_leaves_early_stopping_to_the_others(void **state) {
  (void)state;
  spec *s = load("early_stopping: {rule: median, min_steps: 1, min_trials: 4}",
                 "[{name: accuracy, goal: maximize}, {name: params, goal: minimize}]",
                 "{trials: 10}");
  char *dir = test_tmpdir();
  int64_t exp;
  storage *st = stored_experiment(s, dir, &exp);
  nas_err err;
  int64_t ids[6];
  for (int i = 0; i < 6; i++) {
    trial_row t;
    if (storage_trial_create(st, exp, "{}", NULL, &t, &err) != NAS_OK) fail_msg("%s", err.msg);
    ids[i] = t.id;
    trial_row_clear(&t);
    double accuracy = i == 5 ? 0.1 : 0.9; /* trial 5 is the bad one, still running */
    metric_obs obs[4] = {{"accuracy", 1, accuracy, 1}, {"accuracy", 2, accuracy, 2},
                         {"accuracy", 3, accuracy, 3}, {"params", METRIC_FINAL, 1000 + i, 4}};
    if (storage_metrics_add(st, ids[i], obs, i == 5 ? 3 : 4, -1, &err) != NAS_OK)
      fail_msg("%s", err.msg);
  }
  sched_curve *curves;
  size_t n;
  if (sched_curves_load(st, s, exp, &curves, &n, &err) != NAS_OK) fail_msg("%s", err.msg);
  assert_int_equal(n, 6);
  for (size_t i = 0; i < n; i++) {
    size_t rung = 0;
    sched_verdict v;
    sched_early_stop_judge(s, curves, n, i, &rung, &v);
    assert_int_equal(v.compared, 5);
    assert_int_equal(v.stop, curves[i].trial_id == ids[5]);
  }
  sched_curves_free(curves, n);
  storage_close(st);
  test_rmtree(dir);
  free(dir);
  spec_free(s);
}

/* Asserts that every curve of a fresh load judges the same against the curves kept. */
static void assert_same_verdicts(const spec *s, const sched_curve_set *kept,
                                 const sched_curve *fresh, size_t n) {
  assert_int_equal(kept->n, n);
  for (size_t i = 0; i < n; i++) {
    size_t k = 0, rung_fresh = 0, rung_kept = 0;
    while (k < kept->n && kept->curves[k].trial_id != fresh[i].trial_id) k++;
    assert_true(k < kept->n);
    sched_verdict a, b;
    sched_early_stop_judge(s, fresh, n, i, &rung_fresh, &a);
    sched_early_stop_judge(s, kept->curves, kept->n, k, &rung_kept, &b);
    assert_int_equal(a.stop, b.stop);
    assert_int_equal(a.step, b.step);
    assert_int_equal(a.better, b.better);
    assert_int_equal(a.compared, b.compared);
  }
}

/* A recorded sequence of reports (trials at different paces, steps skipped, the same step
 * reported twice, loss only from the 40th report on): after each one, the curves kept one
 * trial at a time (as the loop keeps them) give every trial the verdict a fresh load gives. */
static void curves_kept_one_trial_at_a_time_judge_as_a_fresh_load(void **state) {
  (void)state;
  spec *s = load("early_stopping: {rule: median, min_steps: 2, min_trials: 3}",
                 "[{name: accuracy, goal: maximize}, {name: loss, goal: minimize}]",
                 "{trials: 12}");
  char *dir = test_tmpdir();
  int64_t exp, ids[8];
  storage *st = stored_experiment(s, dir, &exp);
  nas_err err;
  for (int i = 0; i < 8; i++) {
    trial_row t;
    if (storage_trial_create(st, exp, "{}", NULL, &t, &err) != NAS_OK) fail_msg("%s", err.msg);
    ids[i] = t.id;
    trial_row_clear(&t);
  }
  sched_curve_set kept;
  if (sched_curve_set_load(st, s, exp, &kept, &err) != NAS_OK) fail_msg("%s", err.msg);
  int64_t steps[8] = {0};
  unsigned seed = 7;
  int reloads = 0;
  for (int report = 0; report < 120; report++) {
    seed = seed * 1103515245u + 12345u;
    int i = (int)(seed >> 16) % 8;
    steps[i] += 1 + (int)(seed >> 8) % 2 * (report % 3 == 0); /* sometimes a step skipped */
    double accuracy = 0.1 * (i % 4) + 0.001 * (double)((seed >> 4) % 97);
    metric_obs obs[3] = {{"accuracy", steps[i], accuracy, 1}, {"loss", steps[i], 1 - accuracy, 2},
                         {"accuracy", steps[i], accuracy / 2, 3}};
    size_t n_obs = report < 40 ? 1 : report % 5 == 0 ? 3 : 2;
    if (storage_metrics_add(st, ids[i], obs, n_obs, -1, &err) != NAS_OK) fail_msg("%s", err.msg);
    metric_row *rows;
    size_t n_rows;
    bool stale;
    if (storage_metrics_of_trial(st, ids[i], &rows, &n_rows, &err) != NAS_OK ||
        sched_curve_set_put(s, &kept, ids[i], rows, n_rows, &stale, &err) != NAS_OK)
      fail_msg("%s", err.msg);
    metric_rows_free(rows, n_rows);
    if (stale) { /* loss, reported for the first time: the loop loads them all again */
      reloads++;
      sched_curve_set_free(&kept);
      if (sched_curve_set_load(st, s, exp, &kept, &err) != NAS_OK) fail_msg("%s", err.msg);
    }
    sched_curve *fresh;
    size_t n;
    if (sched_curves_load(st, s, exp, &fresh, &n, &err) != NAS_OK) fail_msg("%s", err.msg);
    assert_same_verdicts(s, &kept, fresh, n);
    sched_curves_free(fresh, n);
  }
  assert_int_equal(reloads, 1);
  sched_curve_set_free(&kept);
  storage_close(st);
  test_rmtree(dir);
  free(dir);
  spec_free(s);
}

/* Asserts that a and b hold the same trials (ids, numbers, statuses) and values. */
static void assert_same_results(const sched_results *a, const sched_results *b) {
  assert_int_equal(a->n_trials, b->n_trials);
  assert_int_equal(a->n_metrics, b->n_metrics);
  for (size_t m = 0; m < a->n_metrics; m++)
    assert_string_equal(a->metric_names[m], b->metric_names[m]);
  for (size_t t = 0; t < a->n_trials; t++) {
    assert_int_equal(a->trials[t].id, b->trials[t].id);
    assert_int_equal(a->trials[t].number, b->trials[t].number);
    assert_int_equal(a->trials[t].status, b->trials[t].status);
    for (size_t m = 0; m < a->n_metrics; m++) {
      double x = a->values[t * a->n_metrics + m], y = b->values[t * b->n_metrics + m];
      assert_true(isnan(x) ? isnan(y) : x == y);
    }
  }
}

/* Puts trial `number` of exp, read back alone, into r; returns what sched_results_put says. */
static int put_trial(storage *st, const spec *s, const experiment_row *exp, int number,
                     sched_results *r) {
  sched_results one;
  nas_err err;
  if (sched_results_of_trial(st, s, exp, number, &one, &err) != NAS_OK) fail_msg("%s", err.msg);
  int rc = sched_results_put(r, &one, &err);
  sched_results_free(&one);
  return rc;
}

/* The loop keeps its results by reading back only the trial that changed: a new trial
 * goes after the last, new values and a new status replace its row, and what it cannot
 * place (a metric it has no column for) it refuses, so that the whole is loaded again. */
static void results_kept_one_trial_at_a_time_equal_a_fresh_load(void **state) {
  (void)state;
  spec *s = load("", "[{name: y, goal: minimize}, {name: z, goal: minimize}]", "{trials: 40}");
  char *dir = test_tmpdir();
  experiment_row exp;
  storage *st = stored_experiment(s, dir, &exp.id);
  nas_err err;
  if (storage_experiment_get(st, "t", &exp, &err) != NAS_OK) fail_msg("%s", err.msg);
  trial_row first; /* reports a metric the others do not: their cells of it stay NaN */
  metric_obs acc = {"acc", 1, 0.9, 1};
  if (storage_trial_create(st, exp.id, "{}", NULL, &first, &err) != NAS_OK ||
      storage_metrics_add(st, first.id, &acc, 1, -1, &err) != NAS_OK)
    fail_msg("%s", err.msg);
  trial_row_clear(&first);
  sched_results kept, fresh;
  if (sched_results_load(st, s, exp.id, &kept, &err) != NAS_OK) fail_msg("%s", err.msg);
  for (int i = 0; i < 20; i++) { /* beyond the first room of 16 */
    trial_row t;
    if (storage_trial_create(st, exp.id, "{\"x\": 0.5}", NULL, &t, &err) != NAS_OK)
      fail_msg("%s", err.msg);
    assert_int_equal(put_trial(st, s, &exp, t.number, &kept), NAS_OK);
    metric_obs obs[2] = {{"y", 1, 2.0 + i, 1}, {"y", METRIC_FINAL, 1.0 + i, 2}};
    if (storage_trial_start(st, t.id, "job", &err) != NAS_OK ||
        storage_metrics_add(st, t.id, obs, i % 2 ? 2 : 1, -1, &err) != NAS_OK ||
        storage_trial_finish(st, t.id, TRIAL_COMPLETED, true, 0, NULL, &err) != NAS_OK)
      fail_msg("%s", err.msg);
    assert_int_equal(put_trial(st, s, &exp, t.number, &kept), NAS_OK);
    trial_row_clear(&t);
  }
  if (sched_results_load(st, s, exp.id, &fresh, &err) != NAS_OK) fail_msg("%s", err.msg);
  assert_same_results(&kept, &fresh);
  assert_true(kept.values[4 * kept.n_metrics] == 4.0); /* trial 4's final value */
  assert_true(kept.values[5 * kept.n_metrics] == 6.0); /* trial 5's, at its highest step */
  metric_obs other = {"loss", 1, 0.5, 3};
  if (storage_metrics_add(st, kept.trials[7].id, &other, 1, -1, &err) != NAS_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(put_trial(st, s, &exp, 7, &kept), NAS_ENOTFOUND);
  assert_same_results(&kept, &fresh); /* unchanged */
  trial_row t20, t21; /* a trial numbered before one it holds, which it never saw */
  if (storage_trial_create(st, exp.id, "{}", NULL, &t20, &err) != NAS_OK ||
      storage_trial_create(st, exp.id, "{}", NULL, &t21, &err) != NAS_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(put_trial(st, s, &exp, t21.number, &kept), NAS_OK);
  assert_int_equal(put_trial(st, s, &exp, t20.number, &kept), NAS_ENOTFOUND);
  assert_int_equal(kept.n_trials, 22);
  trial_row_clear(&t20), trial_row_clear(&t21);
  sched_results_free(&kept);
  sched_results_free(&fresh);
  experiment_row_clear(&exp);
  storage_close(st);
  test_rmtree(dir);
  free(dir);
  spec_free(s);
}

/* A rule that can never fire is told from the spec where it can be: built-in trials report
 * only accuracy per epoch; a budget too small for min_trials. */
static void early_stopping_that_can_never_fire_is_told_from_the_spec(void **state) {
  (void)state;
  const char *builtin = "name: b\nparameters:\n  width: {type: int, low: 8, high: 16}\n"
                        "objectives: [{name: accuracy, goal: maximize}, {name: params, goal: minimize}]\n"
                        "trial: {builtin: {model: mlp, dataset: digits}}\n"
                        "budget: {trials: 10}\n";
  char why[256] = "";
  for (int judged_accuracy = 0; judged_accuracy < 2; judged_accuracy++) {
    char *text;
    assert_true(asprintf(&text, "%searly_stopping: {rule: median, objectives: [%s]}\n", builtin,
                         judged_accuracy ? "accuracy, params" : "params") > 0);
    spec *s;
    nas_err err;
    if (spec_parse(text, "b.yaml", "/tmp", &s, &err) != NAS_OK) fail_msg("%s", err.msg);
    assert_int_equal(sched_early_stop_futile(s, why, sizeof why), !judged_accuracy);
    if (!judged_accuracy) assert_non_null(strstr(why, "only 'accuracy' per epoch"));
    spec_free(s);
    free(text);
  }
  spec *s = load("early_stopping: {rule: median, min_trials: 4}",
                 "[{name: loss, goal: minimize}]", "{trials: 4}");
  assert_true(sched_early_stop_futile(s, why, sizeof why));
  assert_non_null(strstr(why, "min_trials 4"));
  spec_free(s);
  s = load("early_stopping: {rule: median, min_trials: 4}", "[{name: loss, goal: minimize}]",
           "{trials: 5}");
  assert_false(sched_early_stop_futile(s, why, sizeof why)); /* a command: known only later */
  spec_free(s);
}

/* Plug-in options are checked before anything is stored, each at its place. Some hold only
 * together: gpus_per_trial alone means gpus: auto, which a machine without an NVIDIA GPU
 * refuses, so checking it alone refused a spec with a list of devices; a pair that is
 * wrong together is named at the option that breaks it. */
static void plugin_options_that_hold_only_together_are_checked_together(void **state) {
  (void)state;
  const char *base = "name: g\nparameters: {x: {type: float, low: 0, high: 1}}\n"
                     "objectives: [{name: y, goal: minimize}]\n"
                     "trial: {command: [run]}\nbudget: {trials: 4}\n";
  const struct {
    const char *runner, *error; /* error NULL: the spec passes */
  } cases[] = {
      {"runner: {type: local, gpus: [0, 1], gpus_per_trial: 2}\n", NULL},
      {"runner: {type: local, gpus: [0], gpus_per_trial: 2}\n",
       "g.yaml:6:50: runner.gpus_per_trial: runner local: option gpus_per_trial: 2, but only 1 GPU"},
      {"runner: {type: local, gpus: [0, 1], gpus_per_trial: 2, kill_grace: -1}\n",
       "g.yaml:6:68: runner.kill_grace: runner local: option kill_grace: expected"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *text;
    assert_true(asprintf(&text, "%s%s", base, cases[i].runner) > 0);
    spec *s;
    nas_err err = {{0}};
    if (spec_parse(text, "g.yaml", "/tmp", &s, &err) != NAS_OK) fail_msg("%s", err.msg);
    int rc = sched_check_spec(s, &err);
    if (!cases[i].error && rc != NAS_OK) fail_msg("%s: refused: %s", cases[i].runner, err.msg);
    if (cases[i].error && (rc == NAS_OK || !strstr(err.msg, cases[i].error)))
      fail_msg("%s: expected '%s', got '%s'", cases[i].runner, cases[i].error,
               rc == NAS_OK ? "no error" : err.msg);
    spec_free(s);
    free(text);
  }
}

/* A stored spec knows the file it came from (it was "<string>"), and `nas resume` of an
 * ask-and-tell experiment names the experiment when refusing to run it. */
static void stored_spec_is_named_by_its_file(void **state) {
  (void)state;
  experiment_row exp = {.name = "asked",
                        .spec_text = "name: asked\nparameters: {x: {type: float, low: 0, high: 1}}\n"
                                     "objectives: [{name: y, goal: minimize}]\nbudget: {trials: 2}\n",
                        .spec_path = "/home/me/asked.yaml"};
  spec *s;
  nas_err err;
  if (sched_experiment_spec(&exp, &s, &err) != NAS_OK) fail_msg("%s", err.msg);
  assert_string_equal(s->path, "/home/me/asked.yaml");
  assert_int_equal(sched_check_runnable(s, &err), NAS_ERR);
  if (!strstr(err.msg, "experiment 'asked': ")) fail_msg("not named by its experiment: %s", err.msg);
  spec_free(s);
}

/* Hyperband with eta 3 from 1 epoch: bracket s starts n_0 trials at r_0 epochs and keeps a
 * third of them at each rung for three times the epochs. */
static void hyperband_brackets_for_eta_3_from_1_to_9_and_27_epochs(void **state) {
  (void)state;
  multi_fidelity_spec nine = {MULTI_FIDELITY_HYPERBAND, 1, 9, 3};
  assert_int_equal(sched_hyperband_top(&nine), 2);
  /* s = 2: 9 trials × 1 epoch → 3 × 3 → 1 × 9; s = 1: 5 × 3 → 1 × 9; s = 0: 3 × 9. */
  static const int trials9[3][3] = {{3, 0, 0}, {5, 1, 0}, {9, 3, 1}};
  static const int epochs9[3][3] = {{9, 0, 0}, {3, 9, 0}, {1, 3, 9}};
  for (int s = 0; s <= 2; s++)
    for (int i = 0; i <= s; i++) {
      assert_int_equal(sched_hyperband_trials(&nine, s, i), trials9[s][i]);
      assert_int_equal(sched_hyperband_epochs(&nine, s, i), epochs9[s][i]);
    }
  multi_fidelity_spec many = {MULTI_FIDELITY_HYPERBAND, 1, 27, 3};
  assert_int_equal(sched_hyperband_top(&many), 3);
  /* s = 3: 27 × 1 → 9 × 3 → 3 × 9 → 1 × 27; s = 2: 12 × 3 → 4 × 9 → 1 × 27;
   * s = 1: 6 × 9 → 2 × 27; s = 0: 4 × 27. */
  static const int trials27[4][4] = {{4}, {6, 2}, {12, 4, 1}, {27, 9, 3, 1}};
  static const int epochs27[4][4] = {{27}, {9, 27}, {3, 9, 27}, {1, 3, 9, 27}};
  for (int s = 0; s <= 3; s++)
    for (int i = 0; i <= s; i++) {
      assert_int_equal(sched_hyperband_trials(&many, s, i), trials27[s][i]);
      assert_int_equal(sched_hyperband_epochs(&many, s, i), epochs27[s][i]);
    }
}

/* Trials are dealt by number: s_max's first, then the next brackets, round after round. */
static void hyperband_deals_trials_into_brackets_by_number(void **state) {
  (void)state;
  multi_fidelity_spec nine = {MULTI_FIDELITY_HYPERBAND, 1, 9, 3};
  static const struct { int number, bracket, first; } cases[] = {
      {0, 2, 0}, {8, 2, 0}, {9, 1, 9}, {13, 1, 9}, {14, 0, 14}, {16, 0, 14}, {17, 2, 17}, {40, 2, 34}, {45, 1, 43}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    sched_bracket b;
    sched_hyperband_bracket_of(&nine, cases[k].number, &b);
    assert_int_equal(b.bracket, cases[k].bracket);
    assert_int_equal(b.first_number, cases[k].first);
    assert_int_equal(b.n_rungs, cases[k].bracket + 1);
    assert_int_equal(b.n_trials, sched_hyperband_trials(&nine, b.bracket, 0));
  }
}

/* Under Hyperband a trial's run trains the epochs past its previous rung's; over a round of
 * brackets (1 to 9 epochs, eta 3) a trial trains (9·1 + 3·2 + 1·6 + 5·3 + 1·6 + 3·9) / 17
 * = 69/17 epochs; the trials expected under a wall-time budget are counted in such trials,
 * at the median time of an epoch. */
static void hyperband_trials_expected_count_epochs_per_trial(void **state) {
  (void)state;
  multi_fidelity_spec nine = {MULTI_FIDELITY_HYPERBAND, 1, 9, 3};
  assert_int_equal(sched_hyperband_epochs_run(&nine, 0, 0), 1);
  assert_int_equal(sched_hyperband_epochs_run(&nine, 0, 1), 2);
  assert_int_equal(sched_hyperband_epochs_run(&nine, 0, 2), 6);
  assert_int_equal(sched_hyperband_epochs_run(&nine, 9, 0), 3);
  assert_int_equal(sched_hyperband_epochs_run(&nine, 14, 0), 9);
  assert_true(fabs(sched_hyperband_epochs_per_trial(&nine) - 69.0 / 17) < 1e-12);
  spec *timed =
      load("", "[{name: a, goal: minimize}]", "{trials: 1000, parallel: 2, wall_time: 1h}");
  timed->multi_fidelity = nine;
  double values[3] = {1, 2, 3};
  sched_results r;
  results_with(timed, &r, values, 3);
  /* Trial 0 at rung 1 (2 epochs in 200 s), trials 1 and 2 at rung 0 (1 epoch, 100 s). */
  for (size_t i = 0; i < 3; i++) r.trials[i].started_at = 1000, r.trials[i].finished_at = 1100;
  r.trials[0].rung = 1;
  r.trials[0].finished_at = 1200;
  assert_int_equal(sched_trials_expected(timed, &r), 18); /* ceil(7200 / (100 · 69/17)) */
  sched_results_free(&r);
  spec_free(timed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(median_rule_stops_the_clearly_bad_trials_and_no_others),
      cmocka_unit_test(median_rule_waits_for_min_steps_and_min_trials),
      cmocka_unit_test(asha_keeps_the_best_third_at_each_rung),
      cmocka_unit_test(two_objective_rule_stops_only_dominated_trials),
      cmocka_unit_test(patience_is_spent_when_the_front_stops_growing),
      cmocka_unit_test(trials_expected_follow_the_budget_and_the_median_duration),
      cmocka_unit_test(hyperband_trials_expected_count_epochs_per_trial),
      cmocka_unit_test(front_leaves_out_trials_beyond_a_threshold),
      cmocka_unit_test(final_only_objective_leaves_early_stopping_to_the_others),
      cmocka_unit_test(results_kept_one_trial_at_a_time_equal_a_fresh_load),
      cmocka_unit_test(curves_kept_one_trial_at_a_time_judge_as_a_fresh_load),
      cmocka_unit_test(early_stopping_that_can_never_fire_is_told_from_the_spec),
      cmocka_unit_test(hyperband_brackets_for_eta_3_from_1_to_9_and_27_epochs),
      cmocka_unit_test(hyperband_deals_trials_into_brackets_by_number),
      cmocka_unit_test(plugin_options_that_hold_only_together_are_checked_together),
      cmocka_unit_test(stored_spec_is_named_by_its_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
