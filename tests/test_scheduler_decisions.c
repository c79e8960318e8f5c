/* The scheduler's decisions, run through sched_run with a scripted fake runner instead of
 * processes: how each way a job ends is judged, the failure-rate stop, retries of lost
 * jobs, the heartbeat timeout, `nas stop`, early stopping and the trial budget. Each test
 * takes milliseconds; test_e2e*.c run the same paths with real processes.
 *
 * The fake (fake_backend below, plugged in through sched_options.runner) starts no
 * process: each job follows the plan the test's script gives for its trial number and
 * attempt — stay running for some polls, write metric lines to its stdout.log as a real
 * trial prints them, then end in the scripted state — and it counts what it was asked. */
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>

#include "scheduler/scheduler.h"
#include "tests/testutil.h"

/* ---- the scripted fake runner ----------------------------------------------------------- */

/* How one job behaves. */
typedef struct {
  int polls;           /* polls it stays running before it ends; FOREVER: until stopped */
  job_state end;       /* how it ends: exited, signaled, timeout, lost, unreadable */
  int exit_code;       /* JOB_EXITED */
  const char *at_start; /* written to stdout.log when it starts (may be NULL) */
  const char *at_end;   /* written to stdout.log just before it ends (may be NULL) */
  const char *detail;   /* the runner's words on how it ended (may be NULL) */
  double wait_s;        /* seconds it first waits to start (in a queue), said to polls */
} fake_plan;

#define FOREVER (-1)
#define FINAL_LOSS "nas-metric {\"loss\": 1}\n"

/* The plan for attempt `attempt` (1, 2, …) of trial `number`. */
typedef fake_plan (*fake_script)(int number, int attempt);

typedef struct {
  int number, attempt; /* of the trial it runs, read from its NAS_ environment */
  char *run_dir;       /* owned */
  fake_plan plan;
  double started;      /* monotonic seconds of its start */
  int polls;           /* polls that saw it running */
  bool stop_asked;
  bool ended;
} fake_job;

#define FAKE_MAX_JOBS 64
/* A run still polling after this many polls (seconds at the tests' poll interval) has
 * missed the decision the test waits for: it fails rather than hangs. */
#define FAKE_MAX_POLLS 3000

typedef struct {
  fake_script script;
  fake_job jobs[FAKE_MAX_JOBS]; /* in start order; the handle is "fake:<index>" */
  size_t n_jobs;
  int polls;                    /* runner_poll calls */
  int stops;                    /* runner_stop calls */
  size_t running, most_running; /* jobs started and not seen ended: now, and at most */
  /* At this poll (0: never) it marks the experiment stopped, as `nas stop` from another
   * terminal does first. */
  int stop_experiment_at_poll;
  /* At this start (1: the first; 0: never) it raises SIGINT, as a Ctrl-C meanwhile. */
  size_t sigint_at_start;
  storage *st;
  int64_t experiment_id;
} fake_runner;

static int env_int(char *const *env, const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; env[i]; i++)
    if (strncmp(env[i], name, len) == 0 && env[i][len] == '=') return atoi(env[i] + len + 1);
  fail_msg("the job's environment lacks %s", name);
  return -1;
}

/* mkdir -p: the run folder a runner creates. */
static void mkdirs(const char *path) {
  char *dir = strdup(path);
  for (char *slash = strchr(dir + 1, '/');; slash = strchr(slash + 1, '/')) {
    if (slash) *slash = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fail_msg("mkdir %s: %s", dir, strerror(errno));
    if (!slash) break;
    *slash = '/';
  }
  free(dir);
}

static void log_append(const fake_job *job, const char *text) {
  if (!text) return;
  char *path;
  assert_true(asprintf(&path, "%s/stdout.log", job->run_dir) > 0);
  FILE *f = fopen(path, "a");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  free(path);
}

static int fake_start(void *state, const runner_job *job, char **handle, nas_err *err) {
  (void)err;
  fake_runner *f = state;
  assert_true(f->n_jobs < FAKE_MAX_JOBS);
  fake_job *j = &f->jobs[f->n_jobs];
  *j = (fake_job){.number = env_int(job->env, "NAS_TRIAL_NUMBER"),
                  .attempt = env_int(job->env, "NAS_ATTEMPT"), .run_dir = strdup(job->run_dir)};
  j->plan = f->script(j->number, j->attempt);
  j->started = nas_monotonic();
  mkdirs(j->run_dir);
  log_append(j, j->plan.at_start);
  assert_true(asprintf(handle, "fake:%zu", f->n_jobs++) > 0);
  if (f->n_jobs == f->sigint_at_start) raise(SIGINT);
  if (++f->running > f->most_running) f->most_running = f->running;
  return NAS_OK;
}

static fake_job *job_of(fake_runner *f, const char *handle) {
  size_t i;
  assert_int_equal(sscanf(handle, "fake:%zu", &i), 1);
  assert_true(i < f->n_jobs);
  return &f->jobs[i];
}

/* One job's state now: a stopped job ends stopped, a job past its polls ends as planned. */
static job_status fake_job_poll(fake_job *j) {
  job_status st = {.state = JOB_RUNNING};
  if (j->stop_asked) {
    st.state = JOB_STOPPED;
  } else if (nas_monotonic() - j->started < j->plan.wait_s) {
    st.waiting = true;
  } else if (j->plan.polls != FOREVER && j->polls >= j->plan.polls) {
    if (!j->ended) log_append(j, j->plan.at_end);
    st = (job_status){.state = j->plan.end, .exit_code = j->plan.exit_code,
                      .signal = j->plan.end == JOB_SIGNALED ? 9 : 0};
    if (j->plan.end == JOB_UNREADABLE)
      snprintf(st.detail, sizeof st.detail, "exit.json is a folder");
    if (j->plan.detail) snprintf(st.detail, sizeof st.detail, "%s", j->plan.detail);
  } else {
    j->polls++;
  }
  j->ended = st.state != JOB_RUNNING;
  return st;
}

static int fake_poll(void *state, char *const *handles, char *const *run_dirs, size_t n,
                     job_status *out, nas_err *err) {
  (void)run_dirs;
  fake_runner *f = state;
  if (++f->polls > FAKE_MAX_POLLS)
    fail_msg("the scheduler still polls after %d polls", FAKE_MAX_POLLS);
  if (f->polls == f->stop_experiment_at_poll &&
      storage_experiment_set_status(f->st, f->experiment_id, "stopped", NULL, err) != NAS_OK)
    return NAS_ERR;
  for (size_t i = 0; i < n; i++) {
    fake_job *j = job_of(f, handles[i]);
    bool was_running = !j->ended;
    out[i] = fake_job_poll(j);
    if (was_running && j->ended) f->running--;
  }
  return NAS_OK;
}

static int fake_stop(void *state, const char *handle, const char *run_dir, nas_err *err) {
  (void)run_dir, (void)err;
  fake_runner *f = state;
  f->stops++;
  job_of(f, handle)->stop_asked = true;
  return NAS_OK;
}

/* The test owns the fake; the runner only borrows it. */
static void fake_free(void *state) { (void)state; }

static const runner_backend fake_backend = {
    .type = "fake", .free = fake_free, .start = fake_start, .poll = fake_poll,
    .stop = fake_stop};

/* ---- an experiment to run --------------------------------------------------------------- */

typedef struct {
  char *dir;        /* owned temporary folder: database and run folders */
  spec *s;
  storage *st;
  experiment_row exp;
  fake_runner fake;
  runner *rn;
  FILE *progress;   /* what sched_run shows, kept out of the test output */
} fixture;

static int teardown(void **state) {
  fixture *fx = *state;
  runner_free(fx->rn);
  for (size_t i = 0; i < fx->fake.n_jobs; i++) free(fx->fake.jobs[i].run_dir);
  experiment_row_clear(&fx->exp);
  storage_close(fx->st);
  spec_free(fx->s);
  if (fx->progress) fclose(fx->progress);
  test_rmtree(fx->dir);
  free(fx->dir);
  free(fx);
  return 0;
}

static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_non_null(fx->dir = test_tmpdir());
  assert_non_null(fx->progress = fopen("/dev/null", "w"));
  *state = fx;
  return 0;
}

/* Stores the experiment of a spec with one objective (loss) whose trial and budget
 * sections are given, and a fake runner following script. */
static void experiment(fixture *fx, fake_script script, const char *trial, const char *budget,
                       const char *extra) {
  char *text, *url;
  assert_true(asprintf(&text,
                       "name: t\nparameters:\n  x: {type: float, low: 0, high: 1}\n"
                       "objectives: [{name: loss, goal: minimize}]\n"
                       "optimizer: {type: random}\ntrial: %s\nbudget: %s\n%s\n",
                       trial, budget, extra) > 0);
  nas_err err;
  if (spec_parse(text, "t.yaml", fx->dir, &fx->s, &err) != NAS_OK) fail_msg("%s", err.msg);
  free(text);
  assert_true(asprintf(&url, "sqlite:%s/nas.db", fx->dir) > 0);
  if (storage_open(url, &fx->st, &err) != NAS_OK) fail_msg("%s", err.msg);
  free(url);
  int64_t id;
  if (storage_experiment_create(fx->st, fx->s->name, fx->s->text, fx->s->path, fx->dir, &id,
                                &err) != NAS_OK ||
      storage_experiment_get(fx->st, fx->s->name, &fx->exp, &err) != NAS_OK)
    fail_msg("%s", err.msg);
  fx->fake = (fake_runner){.script = script, .st = fx->st, .experiment_id = id};
  if (runner_from_backend(&fake_backend, &fx->fake, &fx->rn, &err) != NAS_OK)
    fail_msg("%s", err.msg);
}

/* Runs the experiment to its end; returns how it ended. */
static sched_outcome run(fixture *fx) {
  char *url;
  assert_true(asprintf(&url, "sqlite:%s/nas.db", fx->dir) > 0);
  sched_options opt = {.storage_url = url, .progress = fx->progress, .poll_interval = 0.001,
                       .runner = fx->rn};
  sched_outcome outcome;
  nas_err err;
  if (sched_run(fx->s, fx->st, &fx->exp, &opt, &outcome, &err) != NAS_OK)
    fail_msg("sched_run: %s", err.msg);
  free(url);
  return outcome;
}

/* The stored trials, ordered by number (owned: trial_rows_free). */
static trial_row *trials(fixture *fx, size_t *n) {
  trial_row *rows;
  nas_err err;
  if (storage_trial_list(fx->st, fx->exp.id, &rows, n, &err) != NAS_OK) fail_msg("%s", err.msg);
  return rows;
}

static void assert_experiment_status(fixture *fx, const char *status) {
  experiment_row now;
  nas_err err;
  if (storage_experiment_get(fx->st, fx->exp.name, &now, &err) != NAS_OK) fail_msg("%s", err.msg);
  assert_string_equal(now.status, status);
  experiment_row_clear(&now);
}

static void assert_error_contains(const trial_row *row, const char *part) {
  if (!row->error || !strstr(row->error, part))
    fail_msg("trial %d: error '%s' lacks '%s'", row->number, row->error ? row->error : "(none)",
             part);
}

/* ---- scripts ---------------------------------------------------------------------------- */

static fake_plan completes(void) {
  return (fake_plan){.polls = 1, .end = JOB_EXITED, .at_end = FINAL_LOSS};
}

static fake_plan fails(void) { return (fake_plan){.polls = 1, .end = JOB_EXITED, .exit_code = 1}; }

/* Trial 0 completes; 1 exits 3; 2 is killed by signal 9; 3 reaches its time limit; 4's
 * exit.json cannot be read; 5 exits 0 without its objective. */
static fake_plan one_of_each_end(int number, int attempt) {
  (void)attempt;
  fake_plan p = completes();
  switch (number) {
  case 1: p = (fake_plan){.polls = 1, .end = JOB_EXITED, .exit_code = 3}; break;
  case 2: p = (fake_plan){.polls = 1, .end = JOB_SIGNALED}; break;
  case 3: p = (fake_plan){.polls = 1, .end = JOB_TIMEOUT}; break;
  case 4: p = (fake_plan){.polls = 1, .end = JOB_UNREADABLE}; break;
  case 5: p = (fake_plan){.polls = 1, .end = JOB_EXITED}; break;
  }
  return p;
}

static fake_plan every_trial_completes(int number, int attempt) {
  (void)number, (void)attempt;
  return completes();
}

static fake_plan every_trial_fails(int number, int attempt) {
  (void)number, (void)attempt;
  return fails();
}

static fake_plan every_other_trial_fails(int number, int attempt) {
  (void)attempt;
  return number % 2 ? fails() : completes();
}

/* Trial 1's first job vanishes; everything else completes. */
static fake_plan trial_1_lost_once(int number, int attempt) {
  if (number == 1 && attempt == 1) return (fake_plan){.polls = 1, .end = JOB_LOST};
  return completes();
}

static fake_plan silent_forever(int number, int attempt) {
  (void)number, (void)attempt;
  return (fake_plan){.polls = FOREVER};
}

/* Every trial reports loss 1 at steps 1–3 at once, then completes a few polls later;
 * trial 4 reports 5 instead. */
static fake_plan trial_4_learns_badly(int number, int attempt) {
  (void)attempt;
  fake_plan p = completes();
  p.polls = 20;
  p.at_start = number == 4 ? "nas-metric {\"loss\": 5, \"step\": 1}\n"
                             "nas-metric {\"loss\": 5, \"step\": 2}\n"
                             "nas-metric {\"loss\": 5, \"step\": 3}\n"
                           : "nas-metric {\"loss\": 1, \"step\": 1}\n"
                             "nas-metric {\"loss\": 1, \"step\": 2}\n"
                             "nas-metric {\"loss\": 1, \"step\": 3}\n";
  return p;
}

static fake_plan runs_until_stopped(int number, int attempt) {
  (void)number, (void)attempt;
  return (fake_plan){.polls = FOREVER, .at_start = "nas-metric {\"loss\": 2, \"step\": 1}\n"};
}

/* ---- judging how a job ended ------------------------------------------------------------ */

static void each_way_a_job_ends_is_judged_into_its_trial_status(void **state) {
  fixture *fx = *state;
  experiment(fx, one_of_each_end, "{command: [run]}",
             "{trials: 6, parallel: 6, max_failure_rate: 1}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 6);
  assert_int_equal(rows[0].status, TRIAL_COMPLETED);
  assert_null(rows[0].error);
  assert_int_equal(rows[1].status, TRIAL_FAILED);
  assert_error_contains(&rows[1], "exited with status 3");
  assert_int_equal(rows[2].status, TRIAL_FAILED);
  assert_error_contains(&rows[2], "killed by signal 9");
  assert_int_equal(rows[3].status, TRIAL_TIMEOUT);
  assert_error_contains(&rows[3], "time limit");
  assert_int_equal(rows[4].status, TRIAL_FAILED);
  assert_error_contains(&rows[4], "ended, but how cannot be told: exit.json is a folder");
  assert_int_equal(rows[5].status, TRIAL_FAILED);
  assert_error_contains(&rows[5], "exited 0 without reporting objective 'loss'");
  assert_int_equal(fx->fake.n_jobs, 6); /* none retried: only lost jobs are */
  trial_rows_free(rows, n);
  assert_experiment_status(fx, "finished");
}

/* A limit the spec did not set (Slurm's `time` option, no trial.timeout): the trial's
 * error gives the runner's words, not a limit of 0 s. */
static fake_plan ends_at_slurms_time_limit(int number, int attempt) {
  (void)number, (void)attempt;
  return (fake_plan){.polls = 1, .end = JOB_TIMEOUT, .detail = "Slurm job 7 ended TIMEOUT"};
}

static void a_time_limit_the_runner_set_is_told_in_the_runners_words(void **state) {
  fixture *fx = *state;
  experiment(fx, ends_at_slurms_time_limit, "{command: [run]}", "{trials: 1}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(rows[0].status, TRIAL_TIMEOUT);
  assert_error_contains(&rows[0], "time limit: Slurm job 7 ended TIMEOUT");
  if (strstr(rows[0].error, "0 s")) fail_msg("error: %s", rows[0].error);
  trial_rows_free(rows, n);
}

/* ---- the failure rate ------------------------------------------------------------------- */

static void more_failures_than_max_failure_rate_stop_launching_after_five_ended(void **state) {
  fixture *fx = *state;
  experiment(fx, every_trial_fails, "{command: [run]}",
             "{trials: 20, parallel: 1, max_failure_rate: 0.5}", "");
  assert_int_equal(run(fx), SCHED_TOO_MANY_FAILURES);
  assert_int_equal(fx->fake.n_jobs, 5); /* judged from 5 ended trials on */
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 5);
  for (size_t i = 0; i < n; i++) assert_int_equal(rows[i].status, TRIAL_FAILED);
  trial_rows_free(rows, n);
  assert_experiment_status(fx, "stopped"); /* `nas resume` may carry on */
}

static void failures_within_max_failure_rate_let_the_budget_run_out(void **state) {
  fixture *fx = *state;
  experiment(fx, every_other_trial_fails, "{command: [run]}",
             "{trials: 10, parallel: 1, max_failure_rate: 0.5}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  assert_int_equal(fx->fake.n_jobs, 10);
  assert_experiment_status(fx, "finished");
}

/* ---- lost jobs, heartbeats, retries ----------------------------------------------------- */

static void a_lost_job_is_requeued_and_retried_in_a_new_run_folder(void **state) {
  fixture *fx = *state;
  experiment(fx, trial_1_lost_once, "{command: [run], max_attempts: 3}",
             "{trials: 3, parallel: 1}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 3); /* 4 jobs, 3 trials: a retry is the same trial */
  for (size_t i = 0; i < n; i++) assert_int_equal(rows[i].status, TRIAL_COMPLETED);
  assert_int_equal(rows[1].attempts, 2);
  trial_rows_free(rows, n);
  assert_int_equal(fx->fake.n_jobs, 4);
  const fake_job *retry = &fx->fake.jobs[2]; /* requeued trials launch before new ones */
  assert_int_equal(retry->number, 1);
  assert_int_equal(retry->attempt, 2);
  const char *tail = strrchr(retry->run_dir, '/');
  assert_string_equal(tail, "/1.2");
}

static void a_trial_that_reports_no_heartbeat_is_handled_as_lost(void **state) {
  fixture *fx = *state;
  experiment(fx, silent_forever, "{command: [run], max_attempts: 2, heartbeat_timeout: 0.05}",
             "{trials: 1, parallel: 1}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  /* Each silent attempt was asked to stop, then retried until max_attempts. */
  assert_int_equal(fx->fake.n_jobs, 2);
  assert_int_equal(fx->fake.stops, 2);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 1);
  assert_int_equal(rows[0].status, TRIAL_FAILED);
  assert_int_equal(rows[0].attempts, 2);
  assert_error_contains(&rows[0], "lost (no output nor heartbeat for");
  assert_error_contains(&rows[0], "on each of its 2 attempts");
  trial_rows_free(rows, n);
}

/* A job that waits to start (pending in Slurm's queue) far longer than heartbeat_timeout,
 * then prints its result. */
static fake_plan waits_in_the_queue_then_completes(int number, int attempt) {
  (void)number, (void)attempt;
  fake_plan p = completes();
  p.wait_s = 0.5;
  return p;
}

static void waiting_in_a_queue_is_no_silence(void **state) {
  fixture *fx = *state;
  experiment(fx, waits_in_the_queue_then_completes,
             "{command: [run], max_attempts: 1, heartbeat_timeout: 0.1}", "{trials: 1}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  size_t n;
  trial_row *rows = trials(fx, &n);
  if (rows[0].status != TRIAL_COMPLETED) fail_msg("trial 0: %s", rows[0].error);
  trial_rows_free(rows, n);
  assert_int_equal(fx->fake.n_jobs, 1);
  assert_int_equal(fx->fake.stops, 0);
}

/* ---- stopping --------------------------------------------------------------------------- */

static void nas_stop_stops_the_running_trials_and_ends_the_run_interrupted(void **state) {
  fixture *fx = *state;
  experiment(fx, runs_until_stopped, "{command: [run]}", "{trials: 5, parallel: 2}", "");
  fx->fake.stop_experiment_at_poll = 3;
  assert_int_equal(run(fx), SCHED_INTERRUPTED);
  assert_int_equal(fx->fake.n_jobs, 2); /* nothing launched after the stop */
  assert_int_equal(fx->fake.stops, 2);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 2);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(rows[i].status, TRIAL_STOPPED);
    assert_error_contains(&rows[i], "stopped by 'nas stop'");
  }
  trial_rows_free(rows, n);
  assert_experiment_status(fx, "stopped");
}

/* A Ctrl-C while a round of launches is under way: the rest of the round is not launched
 * (those trials stay queued, for `nas resume`), and the one started finishes. */
static void first_ctrl_c_during_a_launch_round_launches_no_more_of_it(void **state) {
  fixture *fx = *state;
  experiment(fx, every_trial_completes, "{command: [run]}", "{trials: 8, parallel: 4}", "");
  fx->fake.sigint_at_start = 1;
  assert_int_equal(run(fx), SCHED_INTERRUPTED);
  assert_int_equal(fx->fake.n_jobs, 1);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 4);
  assert_int_equal(rows[0].status, TRIAL_COMPLETED);
  for (size_t i = 1; i < n; i++) assert_int_equal(rows[i].status, TRIAL_QUEUED);
  trial_rows_free(rows, n);
}

static void early_stopping_stops_the_trial_whose_curve_is_worse_than_the_median(void **state) {
  fixture *fx = *state;
  experiment(fx, trial_4_learns_badly, "{command: [run]}", "{trials: 5, parallel: 5}",
             "early_stopping: {rule: median, min_steps: 1, min_trials: 3}");
  assert_int_equal(run(fx), SCHED_FINISHED);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 5);
  for (size_t i = 0; i < 4; i++) assert_int_equal(rows[i].status, TRIAL_COMPLETED);
  assert_int_equal(rows[4].status, TRIAL_STOPPED);
  assert_error_contains(&rows[4], "stopped early at step 3: 4 of the 4 trials there did better");
  trial_rows_free(rows, n);
  assert_int_equal(fx->fake.stops, 1);
}

/* ---- the budget ------------------------------------------------------------------------- */

static void the_budget_launches_exactly_its_trials_never_more_at_once_than_parallel(
    void **state) {
  fixture *fx = *state;
  experiment(fx, every_trial_completes, "{command: [run]}", "{trials: 7, parallel: 3}", "");
  assert_int_equal(run(fx), SCHED_FINISHED);
  assert_int_equal(fx->fake.n_jobs, 7);
  assert_int_equal(fx->fake.most_running, 3);
  size_t n;
  trial_row *rows = trials(fx, &n);
  assert_int_equal(n, 7);
  for (size_t i = 0; i < n; i++) assert_int_equal(rows[i].status, TRIAL_COMPLETED);
  trial_rows_free(rows, n);
  assert_experiment_status(fx, "finished");
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(each_way_a_job_ends_is_judged_into_its_trial_status),
      T(a_time_limit_the_runner_set_is_told_in_the_runners_words),
      T(more_failures_than_max_failure_rate_stop_launching_after_five_ended),
      T(failures_within_max_failure_rate_let_the_budget_run_out),
      T(a_lost_job_is_requeued_and_retried_in_a_new_run_folder),
      T(a_trial_that_reports_no_heartbeat_is_handled_as_lost),
      T(waiting_in_a_queue_is_no_silence),
      T(nas_stop_stops_the_running_trials_and_ends_the_run_interrupted),
      T(first_ctrl_c_during_a_launch_round_launches_no_more_of_it),
      T(early_stopping_stops_the_trial_whose_curve_is_worse_than_the_median),
      T(the_budget_launches_exactly_its_trials_never_more_at_once_than_parallel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
