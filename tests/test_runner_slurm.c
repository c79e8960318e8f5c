/* Tests of the Slurm runner against a real single-node Slurm cluster started by the test
 * (tests/slurmcluster.h): exit codes, signals, a time limit, cancelling, holding, job
 * arrays, batched and paced polling, transient and permanent errors of Slurm's commands,
 * re-attaching from another process, and quoting of hostile argv, environment and paths.
 * Pure parts (quoting, state mapping, time limits, options) are tested without Slurm.
 *
 * Slurm's time limits are whole minutes and its controller checks them every 30 s, so the
 * one time-limit job is submitted first (group set-up) and checked last, while the other
 * tests run. Slurm's commands are reached through PATH wrappers that log every call (to
 * count squeue calls per poll) and fail on request (ctl/TOOL.fail holds how many calls
 * fail with "Socket timed out"; ctl/TOOL.lose makes one call do its work and then fail,
 * as when the controller's reply is lost; while ctl/TOOL.slow exists, each call first
 * creates ctl/TOOL.inside and waits 2 s).
 *
 * Without Slurm (no packages, not root) the tests are skipped with a loud message, and
 * fail when CI=true. */
#include "tests/testutil.h"

#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>

#include "metrics/metrics.h"
#include "runners/runner.h"
#include "runners/slurm_internal.h"
#include "tests/slurmcluster.h"

#define WAIT_LIMIT_S 60.0
static const char *const slurm_tools[] = {"sbatch", "squeue", "scontrol", "scancel"};

typedef struct {
  test_slurm_cluster cluster;
  bool up;
  char *base;          /* folder for the tests' folders and the wrappers */
  char *calls_log;     /* one line per Slurm command run through the wrappers */
  char *ctl;           /* the wrappers' fault switches */
  runner *limit_r;     /* the runner that submitted the time-limit job */
  char *limit_handle;  /* the time-limit job, submitted in the group set-up */
  char *limit_run_dir;
  double limit_submitted; /* monotonic */
} group;

typedef struct {
  group *g;
  char *dir; /* this test's folder */
  runner *r; /* poll_interval 0.2 s, retry_backoff 0.01 s */
  int n_runs;
} fixture;

/* ---- helpers ---- */

static char *path_join(const char *dir, const char *name) {
  char *path = NULL;
  assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
  return path;
}

/* The owned contents of dir/name ("" when missing). */
static char *file_text(const char *dir, const char *name) {
  char *path = path_join(dir, name), *text = NULL;
  if (nas_read_file(path, &text, NULL, NULL) != NAS_OK) text = strdup("");
  free(path);
  return text;
}

static bool file_exists(const char *dir, const char *name) {
  char *path = path_join(dir, name);
  bool exists = access(path, F_OK) == 0;
  free(path);
  return exists;
}

/* The absolute path of a program in PATH (owned), or NULL. */
static char *program_path(const char *name) {
  const char *path = getenv("PATH");
  char *copy = strdup(path ? path : "/usr/bin:/bin"), *save = NULL, *found = NULL;
  for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
    char *candidate = path_join(dir, name);
    if (access(candidate, X_OK) == 0) found = candidate;
    else free(candidate);
  }
  free(copy);
  return found;
}

/* Writes the logging, fault-injecting wrapper of tool into dir. */
static void wrapper_write(const group *g, const char *dir, const char *tool) {
  char *real = program_path(tool);
  assert_non_null(real);
  char *text = NULL;
  assert_true(asprintf(&text,
                       "#!/bin/sh\n"
                       "echo \"%s $*\" >>'%s'\n"
                       "ctl='%s'\n"
                       "if [ -s \"$ctl/%s.fail\" ]; then\n"
                       "  n=$(cat \"$ctl/%s.fail\"); echo $((n - 1)) >\"$ctl/%s.fail\"\n"
                       "  [ \"$n\" -le 1 ] && rm -f \"$ctl/%s.fail\"\n"
                       "  echo '%s: error: Socket timed out on send/recv operation' >&2\n"
                       "  exit 1\n"
                       "fi\n"
                       "if [ -e \"$ctl/%s.slow\" ]; then\n"
                       "  : >\"$ctl/%s.inside\"; sleep 2\n"
                       "fi\n"
                       "if [ -e \"$ctl/%s.lose\" ]; then\n"
                       "  rm -f \"$ctl/%s.lose\"\n"
                       "  '%s' \"$@\" >/dev/null 2>&1\n"
                       "  echo '%s: error: Socket timed out on send/recv operation' >&2\n"
                       "  exit 1\n"
                       "fi\n"
                       "exec '%s' \"$@\"\n",
                       tool, g->calls_log, g->ctl, tool, tool, tool, tool, tool, tool, tool,
                       tool, tool, real, tool, real) > 0);
  char *path = test_write(dir, tool, text);
  assert_int_equal(chmod(path, 0755), 0);
  free(path);
  free(text);
  free(real);
}

/* Puts the wrappers first in PATH. */
static void wrappers_install(group *g) {
  char *dir = path_join(g->base, "wrappers");
  g->calls_log = path_join(g->base, "calls.log");
  g->ctl = path_join(g->base, "ctl");
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(mkdir(g->ctl, 0755), 0);
  for (size_t i = 0; i < sizeof slurm_tools / sizeof *slurm_tools; i++)
    wrapper_write(g, dir, slurm_tools[i]);
  char *path = NULL;
  assert_true(asprintf(&path, "%s:%s", dir, getenv("PATH")) > 0);
  setenv("PATH", path, 1);
  free(path);
  free(dir);
}

/* Lines of the calls log that start with "TOOL ". */
static int calls_of(const group *g, const char *tool) {
  char *text = NULL;
  if (nas_read_file(g->calls_log, &text, NULL, NULL) != NAS_OK) return 0;
  int count = 0;
  size_t len = strlen(tool);
  for (char *line = text; *line;) {
    if (strncmp(line, tool, len) == 0 && line[len] == ' ') count++;
    char *eol = strchr(line, '\n');
    if (!eol) break;
    line = eol + 1;
  }
  free(text);
  return count;
}

/* The last line of the calls log that starts with "TOOL " (owned). */
static char *last_call_of(const group *g, const char *tool) {
  char *text = NULL, *last = NULL;
  if (nas_read_file(g->calls_log, &text, NULL, NULL) != NAS_OK) return strdup("");
  size_t len = strlen(tool);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
    if (strncmp(line, tool, len) == 0 && line[len] == ' ') last = line;
  char *copy = strdup(last ? last : "");
  free(text);
  return copy;
}

/* Makes the wrapper of tool fail the next n calls with a transient error. */
static void faults_set(const group *g, const char *tool, const char *kind, int n) {
  char name[64], count[16];
  snprintf(name, sizeof name, "%s.%s", tool, kind);
  snprintf(count, sizeof count, "%d\n", n);
  free(test_write(g->ctl, name, count));
}

static runner *runner_with(const char *options_json) {
  json_error_t jerr;
  json_t *options = json_loads(options_json, 0, &jerr);
  if (!options) fail_msg("bad test options %s: %s", options_json, jerr.text);
  runner *r = NULL;
  nas_err err;
  if (runner_create("slurm", options, &r, &err) != NAS_OK) fail_msg("runner_create: %s", err.msg);
  json_decref(options);
  return r;
}

/* An owned fresh run folder path (not created: the runner does that). */
static char *run_dir_new(fixture *f) {
  char name[32];
  snprintf(name, sizeof name, "runs/%d", f->n_runs++);
  return path_join(f->dir, name);
}

static char *start_on(runner *r, const char *run_dir, char *const *argv, const char *workdir,
                      char *const *env, double timeout_s) {
  runner_job job = {.argv = argv, .workdir = workdir, .run_dir = run_dir, .env = env,
                    .timeout_s = timeout_s};
  char *handle = NULL;
  nas_err err;
  if (runner_start(r, &job, &handle, &err) != NAS_OK) fail_msg("runner_start: %s", err.msg);
  return handle;
}

static char *start(fixture *f, const char *run_dir, char *const *argv, char *const *env) {
  return start_on(f->r, run_dir, argv, f->dir, env, 0);
}

static job_status poll1(runner *r, char *handle, char *run_dir) {
  job_status st;
  nas_err err;
  if (runner_poll(r, &handle, &run_dir, 1, &st, &err) != NAS_OK) fail_msg("poll: %s", err.msg);
  return st;
}

/* Polls until the job is no longer running; fails past limit_s seconds. */
static job_status wait_end(runner *r, char *handle, char *run_dir, double limit_s) {
  double until = nas_monotonic() + limit_s;
  for (;;) {
    job_status st = poll1(r, handle, run_dir);
    if (st.state != JOB_RUNNING) return st;
    if (nas_monotonic() > until) fail_msg("job %s still running after %.0f s", handle, limit_s);
    nas_sleep(0.05);
  }
}

/* Runs argv as a Slurm job to its end. */
static job_status run_job(fixture *f, char *const *argv, char *const *env, char **run_dir_out) {
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, env);
  job_status st = wait_end(f->r, handle, run_dir, WAIT_LIMIT_S);
  free(handle);
  if (run_dir_out) *run_dir_out = run_dir;
  else free(run_dir);
  return st;
}

/* Waits until dir/name exists (a job wrote it); fails after limit_s. */
static void file_wait(const char *dir, const char *name, double limit_s) {
  double until = nas_monotonic() + limit_s;
  while (!file_exists(dir, name)) {
    if (nas_monotonic() > until) fail_msg("%s/%s never appeared", dir, name);
    nas_sleep(0.05);
  }
}

/* squeue's state word for a job, asked directly (owned). */
static char *slurm_state_word(const char *handle) {
  char *argv[] = {"squeue", "-h", "-t", "all", "-j", (char *)handle, "-o", "%T", NULL};
  char *out = NULL;
  test_run(NULL, argv, &out);
  out[strcspn(out, "\n")] = '\0';
  return out;
}

/* ---- fixtures ---- */

static int group_setup(void **state) {
  group *g = calloc(1, sizeof *g);
  *state = g;
  g->up = test_slurm_cluster_start(&g->cluster);
  if (!g->up) {
    bool ci = getenv("CI") && strcmp(getenv("CI"), "true") == 0;
    fprintf(stderr,
            "\n*** SLURM CLUSTER NOT STARTED: %s\n"
            "*** The Slurm runner tests %s. Install slurm-wlm and munge "
            "(scripts/deps.sh slurm) and run as root.\n\n",
            g->cluster.why, ci ? "FAIL (CI=true)" : "are SKIPPED");
    return ci ? -1 : 0;
  }
  g->base = test_tmpdir();
  wrappers_install(g);
  /* The one time-limit job: a 1 s limit is rounded up to Slurm's 1 minute. */
  g->limit_r = runner_with("{\"poll_interval\": 0.5}");
  g->limit_run_dir = path_join(g->base, "limit-run");
  char *argv[] = {"sh", "-c", "echo started; exec sleep 300", NULL};
  g->limit_submitted = nas_monotonic();
  g->limit_handle = start_on(g->limit_r, g->limit_run_dir, argv, g->base, NULL, 1);
  return 0;
}

static int group_teardown(void **state) {
  group *g = *state;
  runner_free(g->limit_r);
  test_slurm_cluster_stop(&g->cluster);
  if (g->base) test_rmtree(g->base);
  free(g->base), free(g->calls_log), free(g->ctl);
  free(g->limit_handle), free(g->limit_run_dir);
  free(g);
  return 0;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->g = *state;
  if (f->g->up) {
    f->dir = test_tmpdir();
    f->r = runner_with("{\"poll_interval\": 0.2, \"retry_backoff\": 0.01}");
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  runner_free(f->r);
  if (f->dir) test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* The fixture of a test that needs the cluster; skips the test when there is none. */
static fixture *cluster_fixture(void **state) {
  fixture *f = *state;
  if (!f->g->up) skip();
  return f;
}

/* ---- without Slurm: quoting, state mapping, time limits, options ---- */

/* What bash makes of the quoted word: printf %s WORD. */
static char *bash_reads(const char *word) {
  char *quoted = nas_shell_quote(word), *script = NULL, *out = NULL;
  assert_true(asprintf(&script, "printf %%s %s", quoted) > 0);
  char *argv[] = {"bash", "-c", script, NULL};
  assert_int_equal(test_run(NULL, argv, &out), 0);
  free(script);
  free(quoted);
  return out;
}

static void quoting_round_trips_hostile_and_random_bytes(void **state) {
  (void)state;
  const char *hostile[] = {"", "plain", "it's", "''", "'", "\"dq\" and \\back\\slash",
                           "$(touch pwned)", "`touch pwned`", "${HOME}", "a\nb\n",
                           "* ? [a-z]", "-n", "--", "!!", "tab\there", ";rm -rf x;|&",
                           "ünï ✓", "%s %d %%", "\\'\\''", "#comment", "~root", "a=b"};
  for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) {
    char *out = bash_reads(hostile[i]);
    assert_string_equal(out, hostile[i]);
    free(out);
  }
  unsigned seed = 7;
  for (int round = 0; round < 100; round++) {
    char word[48];
    size_t len = (size_t)(rand_r(&seed) % (int)(sizeof word - 1));
    for (size_t i = 0; i < len; i++) word[i] = (char)(1 + rand_r(&seed) % 255);
    word[len] = '\0';
    char *out = bash_reads(word);
    assert_memory_equal(out, word, len + 1);
    free(out);
  }
}

static void slurm_states_map_onto_job_states(void **state) {
  (void)state;
  struct {
    const char *state, *exit_code;
    job_state want;
    int code, sig;
    const char *detail; /* a word the detail holds, or NULL for none */
  } cases[] = {
      {"PENDING", "0", JOB_RUNNING, 0, 0, NULL},
      {"RUNNING", "0", JOB_RUNNING, 0, 0, NULL},
      {"CONFIGURING", "0", JOB_RUNNING, 0, 0, NULL},
      {"POWER_UP_NODE", "0", JOB_RUNNING, 0, 0, NULL}, /* its node boots (power saving) */
      {"COMPLETING", "0", JOB_RUNNING, 0, 0, NULL},
      {"SUSPENDED", "0", JOB_RUNNING, 0, 0, NULL},
      {"REQUEUED", "0", JOB_RUNNING, 0, 0, NULL},
      {"SOME_FUTURE_STATE", "0", JOB_RUNNING, 0, 0, NULL},
      {"COMPLETED", "0", JOB_EXITED, 0, 0, NULL},
      {"FAILED", "768", JOB_EXITED, 3, 0, NULL},  /* squeue: a raw wait status */
      {"FAILED", "3:0", JOB_EXITED, 3, 0, NULL},  /* scontrol's form */
      {"FAILED", "10", JOB_SIGNALED, 0, 10, NULL},
      {"FAILED", "0:9", JOB_SIGNALED, 0, 9, NULL},
      {"FAILED", "0", JOB_LOST, 0, 0, "FAILED"},  /* never ran its script */
      {"TIMEOUT", "15", JOB_TIMEOUT, 0, 0, "TIMEOUT"},
      {"DEADLINE", "0", JOB_TIMEOUT, 0, 0, "DEADLINE"},
      {"CANCELLED", "15", JOB_STOPPED, 0, 0, "CANCELLED"},
      {"OUT_OF_MEMORY", "0:125", JOB_SIGNALED, 0, SIGKILL, "more memory"},
      {"NODE_FAIL", "0", JOB_LOST, 0, 0, "NODE_FAIL"},
      {"PREEMPTED", "0", JOB_LOST, 0, 0, "PREEMPTED"},
      {"BOOT_FAIL", "0", JOB_LOST, 0, 0, "BOOT_FAIL"},
      {"REVOKED", "0", JOB_LOST, 0, 0, "REVOKED"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    job_status st = slurm_status_of("42_1", cases[i].state, cases[i].exit_code, "NodeDown");
    if (st.state != cases[i].want)
      fail_msg("%s %s: got %s", cases[i].state, cases[i].exit_code, job_state_name(st.state));
    bool waits = strcmp(cases[i].state, "PENDING") == 0 ||
                 strcmp(cases[i].state, "CONFIGURING") == 0 ||
                 strcmp(cases[i].state, "POWER_UP_NODE") == 0 ||
                 strcmp(cases[i].state, "SUSPENDED") == 0 || strcmp(cases[i].state, "REQUEUED") == 0;
    if (st.waiting != waits) fail_msg("%s: waiting is %d", cases[i].state, st.waiting);
    assert_int_equal(st.exit_code, cases[i].code);
    assert_int_equal(st.signal, cases[i].sig);
    if (cases[i].detail) {
      assert_non_null(strstr(st.detail, cases[i].detail));
      assert_non_null(strstr(st.detail, "42_1"));
      assert_non_null(strstr(st.detail, "NodeDown"));
    } else {
      assert_string_equal(st.detail, "");
    }
  }
}

static void squeue_lines_parse_into_sorted_rows(void **state) {
  (void)state;
  slurm_row *rows;
  size_t n;
  nas_err err;
  const char *text = "12_3|FAILED|768|NonZeroExitCode|\n"
                     "9|PENDING|0|JobHeldUser|\n"
                     "  10 |COMPLETED|0|None|\n";
  assert_int_equal(slurm_rows_parse(text, &rows, &n, &err), NAS_OK);
  assert_int_equal(n, 3);
  assert_string_equal(rows[0].id, "10");
  assert_string_equal(rows[1].id, "12_3");
  assert_string_equal(rows[2].id, "9");
  assert_int_equal(slurm_rows_find(rows, n, "12_3")->status.exit_code, 3);
  assert_true(slurm_rows_find(rows, n, "9")->held);
  assert_false(slurm_rows_find(rows, n, "10")->held);
  assert_null(slurm_rows_find(rows, n, "12"));
  slurm_rows_free(rows, n);
  assert_int_equal(slurm_rows_parse("", &rows, &n, &err), NAS_OK);
  assert_int_equal(n, 0);
  slurm_rows_free(rows, n);
  assert_int_equal(slurm_rows_parse("12_[0-3]|PENDING|0|None|\n", &rows, &n, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "12_[0-3]"));
}

/* A Slurm command that closes its stdout and stderr but keeps running (a stuck sbatch, a
 * site's wrapper leaving a helper behind) is killed at its time limit, not waited for
 * without end, and the error names the command and the limit. A fake squeue first on
 * PATH; no cluster needed. */
static void slurm_command_that_closes_its_output_and_hangs_is_killed_in_time(void **state) {
  (void)state;
  char *dir = test_tmpdir(), *pid_file = path_join(dir, "pid");
  char *script = NULL;
  assert_true(asprintf(&script, "#!/bin/sh\necho $$ >'%s'\nexec >&- 2>&-\nexec sleep 30\n",
                       pid_file) > 0);
  char *fake = test_write(dir, "squeue", script);
  assert_int_equal(chmod(fake, 0755), 0);
  char *old_path = strdup(getenv("PATH")), *path = NULL;
  assert_true(asprintf(&path, "%s:%s", dir, old_path) > 0);
  setenv("PATH", path, 1);
  slurm_retry retry = {.retries = 0, .backoff_s = 0.01, .timeout_s = 0.5};
  char *argv[] = {"squeue", "-h", NULL};
  slurm_output res;
  nas_err err;
  double t0 = nas_monotonic();
  assert_int_equal(slurm_cmd_run(&retry, argv, NULL, &res, &err), NAS_ERR);
  double took = nas_monotonic() - t0;
  setenv("PATH", old_path, 1);
  assert_true(took >= 0.5 && took < 5);
  assert_int_equal(res.status, -1);
  assert_non_null(strstr(err.msg, "squeue did not end within 0.5 s"));
  char *pid_text = file_text(dir, "pid");
  pid_t pid = (pid_t)atol(pid_text);
  assert_true(pid > 0);
  assert_int_equal(kill(pid, 0), -1); /* killed and reaped: no zombie either */
  slurm_output_free(&res);
  test_rmtree(dir);
  free(pid_text), free(old_path), free(path), free(fake), free(script), free(pid_file), free(dir);
}

static void slurm_time_limits_parse(void **state) {
  (void)state;
  struct {
    const char *text;
    double seconds;
  } good[] = {{"90", 5400}, {"1:30", 90}, {"1:30:00", 5400}, {"2-0", 172800},
              {"1-2:03", 93780}, {"1-02:03:04", 93784}, {"0", 0}};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    double s = -1;
    assert_int_equal(slurm_time_parse(good[i].text, &s), NAS_OK);
    assert_true(s == good[i].seconds);
  }
  /* numbers of more digits than a long holds too (read digit by digit, they once
   * overflowed it: undefined behaviour, caught by the sanitiser build) */
  const char *bad[] = {"", "1h", "1:2:3:4", "-5", "1-", "a-1", "1-2:3:4:5", "1.5", " 1",
                       "99999999999999999999", "1-99999999999999999999:00"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    double s;
    if (slurm_time_parse(bad[i], &s) == NAS_OK) fail_msg("'%s' parsed", bad[i]);
  }
  assert_true(slurm_handle_valid("12") && slurm_handle_valid("12_3"));
  assert_false(slurm_handle_valid("") || slurm_handle_valid("12_") || slurm_handle_valid("_3") ||
               slurm_handle_valid("12_3_4") || slurm_handle_valid("1;2") ||
               slurm_handle_valid("12:34"));
}

static void bad_options_are_errors_that_name_the_option(void **state) {
  (void)state;
  struct {
    const char *json, *word;
  } cases[] = {
      {"{\"partiton\": \"gpu\"}", "unknown option 'partiton'"},
      {"{\"cpus_per_task\": \"4\"}", "cpus_per_task"},
      {"{\"cpus_per_task\": 0}", "cpus_per_task"},
      {"{\"mem\": \"\"}", "mem"},
      {"{\"nodes\": [1, 2]}", "nodes"},
      {"{\"time\": \"1:2:3:4\"}", "option time"},
      {"{\"time\": -5}", "option time"},
      {"{\"sbatch_args\": \"--exclusive\"}", "sbatch_args"},
      {"{\"sbatch_args\": [1]}", "sbatch_args[0]"},
      {"{\"setup\": [\"ok\", false]}", "setup[1]"},
      {"{\"array\": \"yes\"}", "option array"},
      {"{\"poll_interval\": -1}", "poll_interval"},
      {"{\"retries\": -1}", "retries"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    json_t *options = json_loads(cases[i].json, 0, NULL);
    runner *r = NULL;
    nas_err err;
    assert_int_equal(runner_create("slurm", options, &r, &err), NAS_ERR);
    if (!strstr(err.msg, cases[i].word)) fail_msg("%s: message '%s'", cases[i].json, err.msg);
    assert_non_null(strstr(err.msg, "runner slurm"));
    assert_null(r);
    json_decref(options);
  }
  json_t *options = json_loads(
      "{\"partition\": \"gpu\", \"account\": \"a\", \"qos\": \"q\", \"time\": \"1-00:00:00\","
      " \"cpus_per_task\": 4, \"mem\": \"8G\", \"gpus\": 2, \"gres\": \"gpu:a100:1\","
      " \"nodes\": \"1-2\", \"sbatch_args\": [\"--exclusive\"], \"setup\": \"module load x\","
      " \"array\": true, \"poll_interval\": 30, \"retries\": 0, \"retry_backoff\": 2}",
      0, NULL);
  runner *r = NULL;
  nas_err err;
  if (runner_create("slurm", options, &r, &err) != NAS_OK) fail_msg("%s", err.msg);
  json_decref(options);
  runner_free(r);
  assert_int_equal(runner_create("slurm", NULL, &r, &err), NAS_OK);
  char *handle = "12:34", *run_dir = "/nonexistent";
  job_status st;
  assert_int_equal(runner_poll(r, &handle, &run_dir, 1, &st, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "malformed Slurm job handle '12:34'"));
  assert_int_equal(runner_stop(r, "abc", run_dir, &err), NAS_ERR);
  runner_free(r);
}

static void env_names_bash_cannot_export_are_refused_before_submitting(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  runner *r = runner_with("{}");
  char *argv[] = {"true", NULL}, *env[] = {"GOOD=1", "BAD-NAME=x", NULL};
  runner_job job = {.argv = argv, .workdir = dir, .run_dir = dir, .env = env};
  char *handle = NULL;
  nas_err err;
  assert_int_equal(runner_start(r, &job, &handle, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "'BAD-NAME'"));
  assert_null(handle);
  char *backslash = path_join(dir, "a\\b");
  job = (runner_job){.argv = argv, .workdir = dir, .run_dir = backslash};
  assert_int_equal(runner_start(r, &job, &handle, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "backslash"));
  free(backslash);
  runner_free(r);
  test_rmtree(dir);
  free(dir);
}

static unsigned file_mode(const char *dir, const char *name) {
  char *path = path_join(dir, name);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  free(path);
  return st.st_mode & 07777;
}

/* A trial's environment may hold a database password (NAS_STORAGE): job.sh, which Slurm
 * keeps and people pass around, holds none of its values and is its owner's alone; the
 * values are in env.sh beside it, which only its owner can read, and reach the command
 * exactly (job.sh run here by bash, as a Slurm node would). */
static void job_script_holds_no_secret_and_only_its_owner_reads_the_environment(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *url = "postgresql://nas:hunter2@db.example/nas?sslmode='require'";
  char *entry = NULL;
  assert_true(asprintf(&entry, "NAS_STORAGE=%s", url) > 0);
  char *argv[] = {"sh", "-c", "printf %s \"$NAS_STORAGE\"", NULL}, *env[] = {entry, NULL};
  slurm_task task = {.argv = argv, .workdir = dir, .run_dir = dir, .env = env,
                     .nas_bin = "/opt/nas/bin/nas", .nas_dir = "/opt/nas/bin"};
  char *path = NULL;
  nas_err err;
  if (slurm_job_script_write(&task, &path, &err) != NAS_OK) fail_msg("%s", err.msg);
  char *job = file_text(dir, "job.sh"), *vars = file_text(dir, "env.sh");
  assert_null(strstr(job, "hunter2"));
  assert_non_null(strstr(vars, "hunter2"));
  assert_int_equal(file_mode(dir, "job.sh"), 0700);
  assert_int_equal(file_mode(dir, "env.sh"), 0600);
  char *run[] = {"bash", path, NULL}, *out = NULL;
  assert_int_equal(test_run(dir, run, &out), 0);
  free(out);
  out = file_text(dir, "stdout.log");
  assert_string_equal(out, url);
  free(out), free(job), free(vars), free(path), free(entry);
  test_rmtree(dir);
  free(dir);
}

/* A trial calls `nas …` on the node: NAS_BIN names the nas that submitted it and its
 * folder comes first on PATH, ahead of what the setup lines and the trial's env put there. */
static void job_script_puts_the_nas_folder_first_on_path_after_setup(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  char *argv[] = {"sh", "-c", "printf '%s %s' \"$NAS_BIN\" \"$PATH\"", NULL};
  char *setup[] = {"PATH=/from/setup:$PATH"}, *env[] = {"NAS_T_OTHER=1", NULL};
  slurm_task task = {.argv = argv, .workdir = dir, .run_dir = dir, .env = env,
                     .setup = setup, .n_setup = 1, .nas_bin = "/opt/it's nas/nas",
                     .nas_dir = "/opt/it's nas"};
  char *path = NULL;
  nas_err err;
  if (slurm_job_script_write(&task, &path, &err) != NAS_OK) fail_msg("%s", err.msg);
  char *run[] = {"bash", path, NULL}, *out = NULL;
  assert_int_equal(test_run(dir, run, &out), 0);
  free(out);
  out = file_text(dir, "stdout.log");
  const char *want = "/opt/it's nas/nas /opt/it's nas:/from/setup:";
  assert_int_equal(strncmp(out, want, strlen(want)), 0);
  free(out), free(path);
  test_rmtree(dir);
  free(dir);
}

/* ---- with Slurm ---- */

static void successful_trial_leaves_metrics_logs_and_its_script(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"sh", "-c",
                  "echo 'nas-metric {\"acc\": 0.5, \"step\": 1}'; echo 'nas-metric {\"acc\": 0.75}';"
                  " echo to-stderr >&2",
                  NULL};
  char *run_dir;
  job_status st = run_job(f, argv, NULL, &run_dir);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 0);
  assert_string_equal(st.detail, "");
  char *log = path_join(run_dir, "stdout.log");
  metric_set set = {0};
  int64_t offset = 0;
  nas_err err;
  assert_int_equal(metric_log_read_rest(log, &offset, &set, NULL, &err), NAS_OK);
  assert_int_equal(set.n, 2);
  assert_true(set.obs[1].value == 0.75);
  metric_set_free(&set);
  char *errs = file_text(run_dir, "stderr.log"), *exit_json = file_text(run_dir, "exit.json");
  assert_string_equal(errs, "to-stderr\n");
  assert_non_null(strstr(exit_json, "\"state\": \"exited\", \"exit_code\": 0"));
  assert_true(file_exists(run_dir, "job.sh")); /* kept for the record */
  free(errs), free(exit_json), free(log), free(run_dir);
}

static void failing_trial_reports_its_exit_code(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"sh", "-c", "echo failing >&2; exit 3", NULL};
  char *run_dir;
  job_status st = run_job(f, argv, NULL, &run_dir);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 3);
  char *errs = file_text(run_dir, "stderr.log");
  assert_string_equal(errs, "failing\n");
  free(errs), free(run_dir);
}

static void trial_killed_by_a_signal_is_signaled(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"sh", "-c", "kill -USR1 $$", NULL};
  char *run_dir;
  job_status st = run_job(f, argv, NULL, &run_dir);
  assert_int_equal(st.state, JOB_SIGNALED);
  assert_int_equal(st.signal, SIGUSR1);
  char *exit_json = file_text(run_dir, "exit.json");
  assert_non_null(strstr(exit_json, "\"state\": \"signaled\""));
  free(exit_json), free(run_dir);
}

static void stop_cancels_a_running_job(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"sh", "-c", "touch started; exec sleep 300", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start(f, run_dir, argv, NULL);
  file_wait(f->dir, "started", WAIT_LIMIT_S);
  assert_int_equal(poll1(f->r, handle, run_dir).state, JOB_RUNNING);
  nas_err err;
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK);
  job_status st = wait_end(f->r, handle, run_dir, WAIT_LIMIT_S);
  assert_int_equal(st.state, JOB_STOPPED);
  assert_non_null(strstr(st.detail, "CANCELLED"));
  assert_int_equal(runner_stop(f->r, handle, run_dir, &err), NAS_OK); /* ended: no error */
  assert_int_equal(poll1(f->r, handle, run_dir).state, JOB_STOPPED);
  free(handle), free(run_dir);
}

static void missing_command_or_workdir_exits_127(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"nas-no-such-command", NULL};
  char *run_dir;
  job_status st = run_job(f, argv, NULL, &run_dir);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 127);
  char *errs = file_text(run_dir, "stderr.log");
  assert_non_null(strstr(errs, "nas-no-such-command"));
  free(errs), free(run_dir);

  char *missing = path_join(f->dir, "no-such-workdir");
  char *ls[] = {"ls", NULL};
  run_dir = run_dir_new(f);
  char *handle = start_on(f->r, run_dir, ls, missing, NULL, 0);
  st = wait_end(f->r, handle, run_dir, WAIT_LIMIT_S);
  assert_int_equal(st.exit_code, 127);
  errs = file_text(run_dir, "stderr.log");
  assert_non_null(strstr(errs, "nas: cannot enter workdir"));
  free(errs), free(handle), free(run_dir), free(missing);
}

static void hostile_argv_env_and_paths_round_trip_exactly(void **state) {
  fixture *f = cluster_fixture(state);
  const char *words[] = {"it's", "\"dq\"", "$(touch pwned)", "`touch pwned`", "a\nb",
                         "* ?", "", "-n", "\\back\\slash", "!!", "%j %x %%", "ünï ✓",
                         ";rm -rf x;|&", "'\\''"};
  enum { N = sizeof words / sizeof *words };
  char *argv[N + 3] = {"printf", "[%s]\\n"};
  char expected[1024] = "";
  for (size_t i = 0; i < N; i++) {
    argv[i + 2] = (char *)words[i];
    strcat(expected, "["), strcat(expected, words[i]), strcat(expected, "]\n");
  }
  argv[N + 2] = NULL;
  /* A workdir and run folder with quotes, spaces, '%' (sbatch's pattern sign) and '$'. */
  char *workdir = path_join(f->dir, "work it's $(x) %j");
  assert_int_equal(mkdir(workdir, 0755), 0);
  char *run_dir = path_join(f->dir, "run \"dir\" %a %% $HOME");
  char *handle = start_on(f->r, run_dir, argv, workdir, NULL, 0);
  job_status st = wait_end(f->r, handle, run_dir, WAIT_LIMIT_S);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 0);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, expected);
  free(out), free(handle), free(run_dir);

  char *env[] = {"NAS_T_NASTY=$(touch pwned) it's \"x\"\n`y` %j \\", "NAS_T_EMPTY=",
                 "NAS_T_EQ=a=b=c", NULL};
  char *show[] = {"sh", "-c", "printf '[%s]' \"$NAS_T_NASTY\" \"$NAS_T_EMPTY\" \"$NAS_T_EQ\"; pwd",
                  NULL};
  run_dir = run_dir_new(f);
  handle = start_on(f->r, run_dir, show, workdir, env, 0);
  assert_int_equal(wait_end(f->r, handle, run_dir, WAIT_LIMIT_S).exit_code, 0);
  out = file_text(run_dir, "stdout.log");
  char *want = NULL;
  assert_true(asprintf(&want, "[$(touch pwned) it's \"x\"\n`y` %%j \\][][a=b=c]%s\n", workdir) > 0);
  assert_string_equal(out, want);
  assert_false(file_exists(workdir, "pwned"));
  assert_false(file_exists(f->dir, "pwned"));
  free(want), free(out), free(handle), free(run_dir), free(workdir);
}

static void environment_and_setup_reach_the_job_in_order(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"setup\": [\"export NAS_T_A=setup "
                          "NAS_T_B=setup\", \"NAS_T_C=not-exported\"]}");
  setenv("NAS_T_INHERITED", "from-caller", 1);
  char *env[] = {"NAS_T_B=trial", "NAS_T_D=first", "NAS_T_D=last", NULL};
  char *argv[] = {"sh", "-c",
                  "echo \"$NAS_T_INHERITED $NAS_T_A $NAS_T_B ${NAS_T_C-unset} $NAS_T_D\"", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start_on(r, run_dir, argv, f->dir, env, 0);
  assert_int_equal(wait_end(r, handle, run_dir, WAIT_LIMIT_S).exit_code, 0);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "from-caller setup trial unset last\n");
  unsetenv("NAS_T_INHERITED");
  free(out), free(handle), free(run_dir);
  runner_free(r);
}

/* The caller's NAS_STORAGE (a database password) and NAS_TOKEN never reach Slurm, which
 * keeps a job's environment in its controller's state and may keep it in accounting: the
 * job's setup lines do not see them, and the trial gets its own from env.sh. */
static void callers_secrets_reach_the_job_from_env_sh_alone(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"setup\": \"echo setup sees "
                          "${NAS_STORAGE-unset} ${NAS_TOKEN-unset}\"}");
  setenv("NAS_STORAGE", "postgresql://nas:pw-of-caller@db/x", 1);
  setenv("NAS_TOKEN", "token-of-caller", 1);
  char *env[] = {"NAS_STORAGE=postgresql://nas:pw-of-trial@db/x", "NAS_TOKEN=token-of-trial",
                 NULL};
  char *argv[] = {"sh", "-c", "echo trial sees $NAS_STORAGE $NAS_TOKEN", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start_on(r, run_dir, argv, f->dir, env, 0);
  unsetenv("NAS_STORAGE");
  unsetenv("NAS_TOKEN");
  assert_int_equal(wait_end(r, handle, run_dir, WAIT_LIMIT_S).exit_code, 0);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "setup sees unset unset\n"
                           "trial sees postgresql://nas:pw-of-trial@db/x token-of-trial\n");
  free(out), free(handle), free(run_dir);
  runner_free(r);
}

/* ntasks: 2 with srun: the command runs once per task, each seeing its own rank. */
static void srun_runs_the_command_once_per_task(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"ntasks\": 2, \"srun\": true}");
  char *argv[] = {"sh", "-c", "echo \"task $SLURM_PROCID of $SLURM_NTASKS\"", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start_on(r, run_dir, argv, f->dir, NULL, 0);
  assert_int_equal(wait_end(r, handle, run_dir, WAIT_LIMIT_S).exit_code, 0);
  char *out = file_text(run_dir, "stdout.log");
  bool in_order = strcmp(out, "task 0 of 2\ntask 1 of 2\n") == 0;
  bool reversed = strcmp(out, "task 1 of 2\ntask 0 of 2\n") == 0;
  if (!in_order && !reversed) fail_msg("stdout.log: '%s'", out);
  free(out), free(handle), free(run_dir);
  runner_free(r);
}

static void job_array_runs_each_trial_in_its_own_run_dir(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"array\": true}");
  enum { N = 3 };
  runner_job jobs[N];
  char *run_dirs[N], *handles[N], envs[N][32];
  char *argv[] = {"sh", "-c", "echo task $NAS_T_I; exit $NAS_T_I", NULL};
  char *env[N][3];
  for (int i = 0; i < N; i++) {
    run_dirs[i] = run_dir_new(f);
    snprintf(envs[i], sizeof envs[i], "NAS_T_I=%d", i);
    env[i][0] = envs[i], env[i][1] = "NAS_EXPERIMENT=arr", env[i][2] = NULL;
    jobs[i] = (runner_job){.argv = argv, .workdir = f->dir, .run_dir = run_dirs[i],
                           .env = env[i], .timeout_s = 30 * (i + 1)};
  }
  int sbatch_before = calls_of(f->g, "sbatch");
  nas_err err;
  if (runner_start_batch(r, jobs, N, handles, &err) != NAS_OK) fail_msg("%s", err.msg);
  assert_int_equal(calls_of(f->g, "sbatch"), sbatch_before + 1);
  char *call = last_call_of(f->g, "sbatch");
  assert_non_null(strstr(call, "--array=0-2"));
  assert_non_null(strstr(call, "--time=2")); /* the longest limit, 90 s, in minutes */
  assert_non_null(strstr(call, "--job-name=nas-arr"));
  free(call);
  job_status st[N];
  double until = nas_monotonic() + WAIT_LIMIT_S;
  for (;;) {
    assert_int_equal(runner_poll(r, handles, run_dirs, N, st, &err), NAS_OK);
    if (st[0].state != JOB_RUNNING && st[1].state != JOB_RUNNING && st[2].state != JOB_RUNNING)
      break;
    assert_true(nas_monotonic() < until);
    nas_sleep(0.05);
  }
  const char *id_end = strchr(handles[0], '_');
  assert_non_null(id_end);
  for (int i = 0; i < N; i++) {
    char want[32];
    snprintf(want, sizeof want, "%.*s_%d", (int)(id_end - handles[0]), handles[0], i);
    assert_string_equal(handles[i], want);
    assert_int_equal(st[i].state, JOB_EXITED);
    assert_int_equal(st[i].exit_code, i);
    char *out = file_text(run_dirs[i], "stdout.log");
    snprintf(want, sizeof want, "task %d\n", i);
    assert_string_equal(out, want);
    free(out);
  }
  assert_true(file_exists(run_dirs[0], "array/array.sh"));
  for (int i = 0; i < N; i++) free(handles[i]), free(run_dirs[i]);
  runner_free(r);
}

/* What Slurm itself says about task i of an array (here the notice of a cancel) goes to
 * trial i's stderr.log through array/i.log, not to one file shared by every task. */
static void slurm_messages_of_an_array_task_land_in_its_trials_stderr_log(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"array\": true}");
  char *sleeper[] = {"sh", "-c", "touch started; exec sleep 300", NULL};
  char *quick[] = {"true", NULL};
  char *run_dirs[2] = {run_dir_new(f), run_dir_new(f)}, *handles[2];
  runner_job jobs[2] = {{.argv = sleeper, .workdir = f->dir, .run_dir = run_dirs[0]},
                        {.argv = quick, .workdir = f->dir, .run_dir = run_dirs[1]}};
  nas_err err;
  if (runner_start_batch(r, jobs, 2, handles, &err) != NAS_OK) fail_msg("%s", err.msg);
  file_wait(f->dir, "started", WAIT_LIMIT_S);
  assert_int_equal(runner_stop(r, handles[0], run_dirs[0], &err), NAS_OK);
  assert_int_equal(wait_end(r, handles[0], run_dirs[0], WAIT_LIMIT_S).state, JOB_STOPPED);
  assert_int_equal(wait_end(r, handles[1], run_dirs[1], WAIT_LIMIT_S).state, JOB_EXITED);
  char *errs = file_text(run_dirs[0], "stderr.log");
  if (!strstr(errs, "CANCELLED")) fail_msg("trial 0's stderr.log: '%s'", errs);
  assert_false(file_exists(run_dirs[0], "array/%a.log"));
  free(errs);
  for (int i = 0; i < 2; i++) free(handles[i]), free(run_dirs[i]);
  runner_free(r);
}

/* An exit.json beside a job that Slurm says waits to start was left by an earlier run of
 * the job (requeued after a preemption): it does not make polls ask Slurm every 0.5 s for
 * as long as the job waits. */
static void old_exit_json_of_a_job_waiting_to_start_does_not_speed_up_polling(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 30}");
  char *argv[] = {"true", NULL};
  char *run_dir = run_dir_new(f), *handle = NULL;
  runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
  nas_err err;
  if (runner_start_held(r, &job, &handle, &err) != NAS_OK) fail_msg("%s", err.msg);
  free(test_write(run_dir, "exit.json",
                  "{\"state\": \"signaled\", \"exit_code\": 0, \"signal\": 15}\n"));
  int before = calls_of(f->g, "squeue");
  for (double until = nas_monotonic() + 2.5; nas_monotonic() < until; nas_sleep(0.05))
    assert_int_equal(poll1(r, handle, run_dir).state, JOB_RUNNING);
  int asked = calls_of(f->g, "squeue") - before;
  if (asked > 1) fail_msg("%d squeue calls in 2.5 s for a job waiting in the queue", asked);
  assert_int_equal(runner_stop(r, handle, run_dir, &err), NAS_OK);
  free(handle), free(run_dir);
  runner_free(r);
}

/* Writes the spec text to the fixture's folder, runs `nas run` on it (storage in that
 * folder) and returns what `nas trials NAME --format FORMAT` prints (owned). */
static char *experiment_run(fixture *f, const char *name, const char *yaml, const char *format) {
  char *db = NULL, *out = NULL;
  char *spec = test_write(f->dir, "exp.yaml", yaml);
  assert_true(asprintf(&db, "sqlite:%s/nas.db", f->dir) > 0);
  char *run[] = {(char *)test_nas_bin(), "run", spec, "--storage", db, "--no-progress", NULL};
  int rc = test_run(f->dir, run, &out);
  if (rc != 0) fail_msg("nas run exited %d: %s", rc, out);
  free(out);
  char *trials[] = {(char *)test_nas_bin(), "trials", (char *)name, "--storage", db,
                    "--format", (char *)format, NULL};
  assert_int_equal(test_run(f->dir, trials, &out), 0);
  free(spec), free(db);
  return out;
}

/* The whole product on Slurm: `nas run` of an experiment whose trials go out as one job
 * array per launch round, some succeeding and some failing, all recorded. */
/* The token nas run holds for a nas serve reaches its Slurm trials (from env.sh: Slurm's
 * commands run without it), so that their reports get through. */
static void slurm_trials_get_the_token_of_nas_run(void **state) {
  fixture *f = cluster_fixture(state);
  setenv("NAS_TOKEN", "token-for-trials", 1);
  char *out = experiment_run(f, "tokened",
                             "name: tokened\n"
                             "parameters: {x: {type: float, low: 0, high: 1}}\n"
                             "objectives: [{name: y, goal: minimize}]\n"
                             "trial: {command: [sh, -c, 'test \"$NAS_TOKEN\" = token-for-trials "
                             "|| exit 5; echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                             "budget: {trials: 1}\n"
                             "runner: {type: slurm, poll_interval: 0.2}\n",
                             "csv");
  unsetenv("NAS_TOKEN");
  if (!strstr(out, ",completed,")) fail_msg("%s", out);
  free(out);
}

static void experiment_runs_through_slurm_as_job_arrays(void **state) {
  fixture *f = cluster_fixture(state);
  int sbatch_before = calls_of(f->g, "sbatch");
  char *out = experiment_run(f, "onslurm",
                             "name: onslurm\n"
                             "seed: 5\n"
                             "parameters:\n"
                             "  mode: {type: categorical, choices: [ok, fail]}\n"
                             "  x: {type: float, low: 0, high: 1}\n"
                             "objectives: [{name: y, goal: minimize}]\n"
                             "trial: {command: [sh, -c, 'if [ {mode} = fail ]; then exit 3; fi; "
                             "echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                             "budget: {trials: 4, parallel: 4, max_failure_rate: 1}\n"
                             "optimizer: {type: random}\n"
                             "runner: {type: slurm, array: true, poll_interval: 0.2}\n",
                             "csv");
  assert_int_equal(calls_of(f->g, "sbatch"), sbatch_before + 1); /* one array of 4 */
  int completed = 0, failed = 0;
  for (char *line = strchr(out, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
    completed += strncmp(strchr(line, ',') + 1, "completed,", 10) == 0;
    if (strncmp(strchr(line, ',') + 1, "failed,", 7) == 0) {
      failed++;
      assert_non_null(strstr(line, "status 3"));
    }
  }
  assert_int_equal(completed + failed, 4);
  free(out);
}

/* Runs `nas run` of one 4-second trial (budget 3, one at a time) in a process group of its
 * own, as a shell runs a foreground job, and sends sig to it (to_group: to its whole
 * group, as Ctrl-C does) while a squeue it runs takes 2 s; asserts that the signal only
 * stopped the launches: the run ends with status 3 once trial 0 has completed. */
static void signal_during_a_slow_squeue(fixture *f, bool to_group, int sig) {
  char *spec = test_write(f->dir, "sig.yaml",
                          "name: sig\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'sleep 4; echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 3, parallel: 1}\n"
                          "runner: {type: slurm, poll_interval: 0.2}\n");
  char *db = NULL, *log = path_join(f->dir, "run.log");
  assert_true(asprintf(&db, "sqlite:%s/nas.db", f->dir) > 0);
  int sbatch_before = calls_of(f->g, "sbatch");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || chdir(f->dir) != 0) _exit(126);
    dup2(fd, 1), dup2(fd, 2);
    execl(test_nas_bin(), test_nas_bin(), "run", spec, "--storage", db, "--no-progress",
          (char *)NULL);
    _exit(127);
  }
  setpgid(pid, pid);
  double until = nas_monotonic() + WAIT_LIMIT_S;
  while (calls_of(f->g, "sbatch") == sbatch_before && nas_monotonic() < until) nas_sleep(0.05);
  free(test_write(f->g->ctl, "squeue.slow", ""));
  file_wait(f->g->ctl, "squeue.inside", WAIT_LIMIT_S);
  assert_int_equal(kill(to_group ? -pid : pid, sig), 0);
  test_rmtree_child(f->g->ctl, "squeue.slow");
  test_rmtree_child(f->g->ctl, "squeue.inside");
  int status;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (nas_monotonic() > until) kill(pid, SIGKILL);
    nas_sleep(0.05);
  }
  char *out = file_text(f->dir, "run.log");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 3)
    fail_msg("nas run ended %s %d: %s", WIFEXITED(status) ? "with status" : "by signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), out);
  char *trials[] = {(char *)test_nas_bin(), "trials", "sig", "--storage", db, "--format", "csv",
                    NULL};
  free(out);
  assert_int_equal(test_run(f->dir, trials, &out), 0);
  if (!strstr(out, "\n0,completed,") || strstr(out, "\n1,")) fail_msg("trials: %s", out);
  free(out), free(db), free(log), free(spec);
}

/* A SIGTERM that arrives while the loop is busy (not waiting for signals) is still the
 * loop's to handle, whichever thread of the process the kernel hands it to. */
static void sigterm_while_a_slurm_command_runs_lets_running_trials_finish(void **state) {
  signal_during_a_slow_squeue(cluster_fixture(state), false, SIGTERM);
}

/* Ctrl-C reaches every process of the terminal's foreground group; the Slurm command
 * running then is not killed by it (so the run neither fails nor loses its job). */
static void first_ctrl_c_during_a_slurm_command_lets_running_trials_finish(void **state) {
  signal_during_a_slow_squeue(cluster_fixture(state), true, SIGINT);
}

/* Runs experiment `name` of one built-in trial (builtin: its mapping's settings) as two
 * srun tasks; asserts it completed with a fair accuracy, and that one task alone (rank or
 * stage 0) reported the last epoch. */
static void assert_two_tasks_train_one_trial(fixture *f, const char *name,
                                             const char *builtin) {
  char *yaml = NULL;
  assert_true(asprintf(&yaml,
                       "name: %s\n"
                       "objectives: [{name: accuracy, goal: maximize}]\n"
                       "parameters: {lr: {type: float, low: 0.003, high: 0.03, log: true}}\n"
                       "trial:\n"
                       "  builtin: {model: mlp, dataset: digits, epochs: 2, batch_size: 32,\n"
                       "            width: 32, limit_train: 512, %s}\n"
                       "budget: {trials: 1}\n"
                       "optimizer: {type: random}\n"
                       "runner: {type: slurm, ntasks: 2, srun: true, poll_interval: 0.2}\n",
                       name, builtin) > 0);
  char *out = experiment_run(f, name, yaml, "json");
  json_t *rows = json_loads(out, 0, NULL);
  assert_non_null(rows);
  json_t *trial = json_array_get(rows, 0);
  if (strcmp(json_string_value(json_object_get(trial, "status")), "completed") != 0)
    fail_msg("trial: %s", out);
  assert_true(json_number_value(json_object_get(trial, "accuracy")) > 0.5);
  char *log = NULL;
  assert_true(asprintf(&log, "%s/runs/%s/0", f->dir, name) > 0);
  char *text = file_text(log, "stdout.log");
  char *first = strstr(text, "epoch 2/2"); /* one task alone reports */
  assert_non_null(first);
  assert_null(strstr(first + 1, "epoch 2/2"));
  json_decref(rows);
  free(text), free(log), free(out), free(yaml);
}

/* A built-in trial with devices: 2 run as two srun tasks: the tasks form one group by
 * themselves (SLURM_PROCID, SLURM_NTASKS), train one model together, and rank 0 alone
 * stores the metrics. */
static void builtin_trial_trains_across_two_srun_tasks(void **state) {
  assert_two_tasks_train_one_trial(cluster_fixture(state), "ranks", "devices: 2");
}

/* A built-in trial with pipeline: {stages: 2} run as two srun tasks: each task is a stage,
 * the stages meet over shared memory, and stage 0 alone stores the metrics. */
static void builtin_pipeline_trial_runs_its_stages_as_srun_tasks(void **state) {
  assert_two_tasks_train_one_trial(cluster_fixture(state), "stages",
                                   "pipeline: {stages: 2, chunks: 4, balance: time}");
}

static void batch_without_array_starts_one_job_each(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"true", NULL};
  char *run_dirs[2] = {run_dir_new(f), run_dir_new(f)}, *handles[2];
  runner_job jobs[2] = {{.argv = argv, .workdir = f->dir, .run_dir = run_dirs[0]},
                        {.argv = argv, .workdir = f->dir, .run_dir = run_dirs[1]}};
  int sbatch_before = calls_of(f->g, "sbatch");
  nas_err err;
  assert_int_equal(runner_start_batch(f->r, jobs, 2, handles, &err), NAS_OK);
  assert_int_equal(calls_of(f->g, "sbatch"), sbatch_before + 2);
  for (int i = 0; i < 2; i++) {
    assert_null(strchr(handles[i], '_'));
    assert_int_equal(wait_end(f->r, handles[i], run_dirs[i], WAIT_LIMIT_S).state, JOB_EXITED);
    free(handles[i]), free(run_dirs[i]);
  }
}

static void each_poll_asks_slurm_at_most_once_for_all_jobs(void **state) {
  fixture *f = cluster_fixture(state);
  enum { N = 8 };
  char *handles[N], *run_dirs[N], scripts[N][48];
  for (int i = 0; i < N; i++) {
    snprintf(scripts[i], sizeof scripts[i], "sleep 0.%d; exit %d", 2 + i, i);
    char *argv[] = {"sh", "-c", scripts[i], NULL};
    run_dirs[i] = run_dir_new(f);
    handles[i] = start(f, run_dirs[i], argv, NULL);
  }
  job_status st[N];
  int polls = 0, queries = 0, scontrol_before = calls_of(f->g, "scontrol");
  double until = nas_monotonic() + WAIT_LIMIT_S;
  for (int running = N; running > 0; polls++) {
    int before = calls_of(f->g, "squeue");
    nas_err err;
    assert_int_equal(runner_poll(f->r, handles, run_dirs, N, st, &err), NAS_OK);
    int made = calls_of(f->g, "squeue") - before;
    assert_true(made <= 1);
    queries += made;
    running = 0;
    for (int i = 0; i < N; i++) running += st[i].state == JOB_RUNNING;
    if (made && polls == 0) { /* the first asks about all of them at once */
      char *call = last_call_of(f->g, "squeue");
      for (int i = 0; i < N; i++) assert_non_null(strstr(call, handles[i]));
      free(call);
    }
    assert_true(nas_monotonic() < until);
    nas_sleep(0.02);
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(st[i].state, JOB_EXITED);
    assert_int_equal(st[i].exit_code, i);
    free(handles[i]), free(run_dirs[i]);
  }
  assert_true(queries < polls); /* paced: not every poll asks */
  assert_int_equal(calls_of(f->g, "scontrol"), scontrol_before);
  print_message("    %d polls, %d squeue calls for %d jobs\n", polls, queries, N);
}

static void end_is_learnt_from_exit_json_long_before_the_poll_interval(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 60}");
  char *argv[] = {"sh", "-c", "sleep 1", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start_on(r, run_dir, argv, f->dir, NULL, 0);
  int before = calls_of(f->g, "squeue");
  double t0 = nas_monotonic();
  assert_int_equal(poll1(r, handle, run_dir).state, JOB_RUNNING);
  for (int i = 0; i < 5; i++) assert_int_equal(poll1(r, handle, run_dir).state, JOB_RUNNING);
  assert_int_equal(calls_of(f->g, "squeue") - before, 1); /* paced by poll_interval */
  job_status st = wait_end(r, handle, run_dir, 30);
  double took = nas_monotonic() - t0;
  assert_int_equal(st.state, JOB_EXITED);
  assert_true(took < 10);
  assert_true(calls_of(f->g, "squeue") - before <= 20); /* not one per poll (~200) */
  free(handle), free(run_dir);
  runner_free(r);
}

/* A scheduler that submits one job (held when `held`) in a child process and dies at
 * once; its handle comes back through a pipe into handle (cap bytes). */
static void submit_from_a_process_that_dies(fixture *f, char *run_dir, char **argv, bool held,
                                            char *handle, size_t cap) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t starter = fork();
  assert_true(starter >= 0);
  if (starter == 0) {
    runner *r = NULL;
    runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
    char *got = NULL;
    if (runner_create("slurm", NULL, &r, NULL) != NAS_OK ||
        (held ? runner_start_held : runner_start)(r, &job, &got, NULL) != NAS_OK)
      _exit(1);
    ssize_t w = write(fds[1], got, strlen(got));
    _exit(w > 0 ? 0 : 1);
  }
  close(fds[1]);
  memset(handle, 0, cap);
  assert_true(read(fds[0], handle, cap - 1) > 0);
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(starter, &status, 0), starter);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void another_process_reattaches_by_handle(void **state) {
  fixture *f = cluster_fixture(state);
  char *run_dir = run_dir_new(f);
  char handle[64];
  char *argv[] = {"sh", "-c", "sleep 2; exit 4", NULL};
  submit_from_a_process_that_dies(f, run_dir, argv, false, handle, sizeof handle);
  assert_int_equal(poll1(f->r, handle, run_dir).state, JOB_RUNNING);
  job_status st = wait_end(f->r, handle, run_dir, WAIT_LIMIT_S);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 4);
  free(run_dir);
}

static void job_slurm_forgot_is_read_from_exit_json_or_lost(void **state) {
  fixture *f = cluster_fixture(state);
  char *run_dir = path_join(f->dir, "forgotten");
  assert_int_equal(mkdir(run_dir, 0755), 0);
  char handle[] = "987654"; /* never submitted to this cluster */
  job_status st = poll1(f->r, handle, run_dir);
  assert_int_equal(st.state, JOB_LOST);
  assert_non_null(strstr(st.detail, "987654"));
  free(test_write(run_dir, "exit.json", "{\"state\": \"exited\", \"exit_code\": 7, \"signal\": 0}\n"));
  char task[] = "987654_2";
  st = poll1(f->r, task, run_dir);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 7);
  assert_non_null(strstr(st.detail, "no longer knows"));
  free(run_dir);
}

static void held_job_runs_only_once_released(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"sh", "-c", "echo ran", NULL};
  char *run_dir = run_dir_new(f);
  runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
  char *handle = NULL;
  nas_err err;
  if (runner_start_held(f->r, &job, &handle, &err) != NAS_OK) fail_msg("%s", err.msg);
  nas_sleep(1.5); /* long enough for an idle node to have run it, were it not held */
  assert_int_equal(poll1(f->r, handle, run_dir).state, JOB_RUNNING);
  char *word = slurm_state_word(handle);
  assert_string_equal(word, "PENDING");
  free(word);
  assert_false(file_exists(run_dir, "exit.json"));
  assert_int_equal(runner_release(f->r, handle, &err), NAS_OK);
  job_status st = wait_end(f->r, handle, run_dir, WAIT_LIMIT_S);
  assert_int_equal(st.state, JOB_EXITED);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "ran\n");
  free(out), free(handle), free(run_dir);
}

/* A release the controller never answers (retries spent) gives the job up: the next poll
 * cancels it and says lost, so the scheduler runs the trial again instead of waiting on a
 * job held forever. */
static void held_job_that_cannot_be_released_is_cancelled_and_lost(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"sh", "-c", "echo ran", NULL};
  char *run_dir = run_dir_new(f), *handle = NULL;
  runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
  nas_err err;
  if (runner_start_held(f->r, &job, &handle, &err) != NAS_OK) fail_msg("%s", err.msg);
  faults_set(f->g, "scontrol", "fail", 5); /* the fixture's runner tries 1 + 4 times */
  assert_int_equal(runner_release(f->r, handle, &err), NAS_ERR);
  job_status st = wait_end(f->r, handle, run_dir, 10);
  assert_int_equal(st.state, JOB_LOST);
  assert_non_null(strstr(st.detail, "never released"));
  char *word = slurm_state_word(handle);
  assert_string_equal(word, "CANCELLED");
  free(word);
  free(handle), free(run_dir);
}

/* A start that submitted a held job and ended before the job's id was stored anywhere (nas
 * killed between sbatch and storage) leaves a job nobody knows of: starting the trial again
 * in the same run folder finds it by its submission mark and cancels it. */
static void held_job_nobody_recorded_is_cancelled_when_its_trial_starts_again(void **state) {
  fixture *f = cluster_fixture(state);
  char *run_dir = run_dir_new(f);
  char orphan[64];
  char *argv[] = {"sh", "-c", "echo ran", NULL};
  submit_from_a_process_that_dies(f, run_dir, argv, true, orphan, sizeof orphan);
  char *handle = start(f, run_dir, argv, NULL);
  assert_int_equal(wait_end(f->r, handle, run_dir, WAIT_LIMIT_S).state, JOB_EXITED);
  char *word = slurm_state_word(orphan);
  assert_string_equal(word, "CANCELLED");
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "ran\n");
  free(out), free(word), free(handle), free(run_dir);
}

static void held_job_whose_starter_died_is_cancelled_and_lost(void **state) {
  fixture *f = cluster_fixture(state);
  char *run_dir = run_dir_new(f);
  char handle[64];
  char *argv[] = {"sh", "-c", "echo ran", NULL};
  submit_from_a_process_that_dies(f, run_dir, argv, true, handle, sizeof handle);
  job_status st = poll1(f->r, handle, run_dir);
  assert_int_equal(st.state, JOB_LOST);
  assert_non_null(strstr(st.detail, "never released"));
  char *word = slurm_state_word(handle);
  assert_string_equal(word, "CANCELLED");
  free(word);
  runner *fresh = runner_with("{}"); /* yet another process would say the same */
  assert_int_equal(poll1(fresh, handle, run_dir).state, JOB_LOST);
  runner_free(fresh);
  char *out = file_text(run_dir, "stdout.log");
  assert_string_equal(out, "");
  free(out), free(run_dir);
}

static void transient_errors_are_retried_with_backoff(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"retries\": 3, \"retry_backoff\": 0.05}");
  char *argv[] = {"true", NULL};
  char *run_dir = run_dir_new(f);
  int sbatch_before = calls_of(f->g, "sbatch"), squeue_before = calls_of(f->g, "squeue");
  faults_set(f->g, "sbatch", "fail", 2);
  double t0 = nas_monotonic();
  char *handle = start_on(r, run_dir, argv, f->dir, NULL, 0);
  assert_true(nas_monotonic() - t0 >= 0.05 + 0.1); /* waited, doubling */
  faults_set(f->g, "squeue", "fail", 2);
  assert_int_equal(wait_end(r, handle, run_dir, WAIT_LIMIT_S).state, JOB_EXITED);
  /* 2 failed submissions and the good one; each failure was followed by a look for a
   * job that the failed attempt might have submitted after all. */
  assert_int_equal(calls_of(f->g, "sbatch") - sbatch_before, 3);
  assert_true(calls_of(f->g, "squeue") - squeue_before >= 2 + 2 + 1);
  free(handle);

  runner *impatient = runner_with("{\"retries\": 1, \"retry_backoff\": 0.01}");
  faults_set(f->g, "sbatch", "fail", 5);
  runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
  nas_err err;
  handle = NULL;
  assert_int_equal(runner_start(impatient, &job, &handle, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "Socket timed out"));
  assert_non_null(strstr(err.msg, "after retries"));
  assert_null(handle);
  char *ctl_file = path_join(f->g->ctl, "sbatch.fail");
  unlink(ctl_file);
  free(ctl_file);
  runner_free(impatient);
  free(run_dir);
  runner_free(r);
}

static void lost_sbatch_answer_does_not_submit_twice(void **state) {
  fixture *f = cluster_fixture(state);
  char *argv[] = {"true", NULL}, *env[] = {"NAS_EXPERIMENT=lost-answer", "NAS_TRIAL_NUMBER=5",
                                           NULL};
  char *run_dir = run_dir_new(f);
  faults_set(f->g, "sbatch", "lose", 1);
  int sbatch_before = calls_of(f->g, "sbatch");
  char *handle = start(f, run_dir, argv, env);
  assert_int_equal(calls_of(f->g, "sbatch") - sbatch_before, 1); /* found, not resubmitted */
  char *list[] = {"squeue", "-h", "-t", "all", "-n", "nas-lost-answer-5", "-o", "%i", NULL};
  char *out = NULL;
  assert_int_equal(test_run(NULL, list, &out), 0);
  char *want = NULL;
  assert_true(asprintf(&want, "%s\n", handle) > 0);
  assert_string_equal(out, want);
  assert_int_equal(wait_end(f->r, handle, run_dir, WAIT_LIMIT_S).state, JOB_EXITED);
  free(want), free(out), free(handle), free(run_dir);
}

static void permanent_errors_carry_slurms_message_without_retrying(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"partition\": \"no-such-partition\", \"retry_backoff\": 0.01}");
  char *argv[] = {"true", NULL};
  char *run_dir = run_dir_new(f);
  runner_job job = {.argv = argv, .workdir = f->dir, .run_dir = run_dir};
  int before = calls_of(f->g, "sbatch");
  char *handle = NULL;
  nas_err err;
  assert_int_equal(runner_start(r, &job, &handle, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "invalid partition"));
  assert_non_null(strstr(err.msg, "cannot submit true"));
  assert_int_equal(calls_of(f->g, "sbatch") - before, 1);
  runner_free(r);
  free(run_dir);
}

static void unreachable_controller_during_a_poll_is_no_news(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0, \"retries\": 1, \"retry_backoff\": 0.01}");
  char *argv[] = {"sh", "-c", "exit 6", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start_on(r, run_dir, argv, f->dir, NULL, 0);
  file_wait(run_dir, "exit.json", WAIT_LIMIT_S);
  faults_set(f->g, "squeue", "fail", 4);
  assert_int_equal(poll1(r, handle, run_dir).state, JOB_RUNNING); /* 2 failures */
  assert_int_equal(poll1(r, handle, run_dir).state, JOB_RUNNING); /* 2 more */
  job_status st = wait_end(r, handle, run_dir, WAIT_LIMIT_S);
  assert_int_equal(st.state, JOB_EXITED);
  assert_int_equal(st.exit_code, 6);
  free(handle), free(run_dir);
  runner_free(r);
}

/* Last but one: the group's job, submitted first, has met its 1-minute limit by now. */
static void job_over_its_time_limit_ends_in_timeout(void **state) {
  fixture *f = cluster_fixture(state);
  group *g = f->g;
  job_status st = wait_end(g->limit_r, g->limit_handle, g->limit_run_dir, 150);
  double took = nas_monotonic() - g->limit_submitted;
  assert_int_equal(st.state, JOB_TIMEOUT);
  assert_non_null(strstr(st.detail, "TIMEOUT"));
  char *out = file_text(g->limit_run_dir, "stdout.log");
  assert_string_equal(out, "started\n");
  free(out);
  char *errs = file_text(g->limit_run_dir, "stderr.log");
  assert_non_null(strstr(errs, "DUE TO TIME LIMIT")); /* slurmstepd's own words */
  free(errs);
  assert_true(took >= 60);
  print_message("    a 1-minute Slurm time limit ended the job %.1f s after submission\n", took);
}

/* Last: a node going down kills its jobs (the cluster's only node comes back after). */
static void job_on_a_failed_node_is_lost(void **state) {
  fixture *f = cluster_fixture(state);
  runner *r = runner_with("{\"poll_interval\": 0.2, \"sbatch_args\": [\"--no-requeue\"]}");
  char *argv[] = {"sh", "-c", "touch started; exec sleep 300", NULL};
  char *run_dir = run_dir_new(f);
  char *handle = start_on(r, run_dir, argv, f->dir, NULL, 0);
  file_wait(f->dir, "started", WAIT_LIMIT_S);
  char *down[] = {"scontrol", "update", "nodename=localhost", "state=down", "reason=nas-test",
                  NULL};
  assert_int_equal(test_run(NULL, down, NULL), 0);
  job_status st = wait_end(r, handle, run_dir, WAIT_LIMIT_S);
  char *resume[] = {"scontrol", "update", "nodename=localhost", "state=resume", NULL};
  test_run(NULL, resume, NULL);
  assert_int_equal(st.state, JOB_LOST);
  assert_non_null(strstr(st.detail, "NODE_FAIL"));
  free(handle), free(run_dir);
  runner_free(r);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(quoting_round_trips_hostile_and_random_bytes),
      T(experiment_runs_through_slurm_as_job_arrays),
      T(sigterm_while_a_slurm_command_runs_lets_running_trials_finish),
      T(first_ctrl_c_during_a_slurm_command_lets_running_trials_finish),
      T(slurm_states_map_onto_job_states),
      T(squeue_lines_parse_into_sorted_rows),
      T(slurm_time_limits_parse),
      T(slurm_command_that_closes_its_output_and_hangs_is_killed_in_time),
      T(bad_options_are_errors_that_name_the_option),
      T(env_names_bash_cannot_export_are_refused_before_submitting),
      T(job_script_holds_no_secret_and_only_its_owner_reads_the_environment),
      T(job_script_puts_the_nas_folder_first_on_path_after_setup),
      T(successful_trial_leaves_metrics_logs_and_its_script),
      T(failing_trial_reports_its_exit_code),
      T(trial_killed_by_a_signal_is_signaled),
      T(stop_cancels_a_running_job),
      T(missing_command_or_workdir_exits_127),
      T(hostile_argv_env_and_paths_round_trip_exactly),
      T(environment_and_setup_reach_the_job_in_order),
      T(callers_secrets_reach_the_job_from_env_sh_alone),
      T(slurm_trials_get_the_token_of_nas_run),
      T(srun_runs_the_command_once_per_task),
      T(builtin_trial_trains_across_two_srun_tasks),
      T(builtin_pipeline_trial_runs_its_stages_as_srun_tasks),
    T(job_array_runs_each_trial_in_its_own_run_dir),
      T(slurm_messages_of_an_array_task_land_in_its_trials_stderr_log),
      T(batch_without_array_starts_one_job_each),
      T(each_poll_asks_slurm_at_most_once_for_all_jobs),
      T(end_is_learnt_from_exit_json_long_before_the_poll_interval),
      T(old_exit_json_of_a_job_waiting_to_start_does_not_speed_up_polling),
      T(another_process_reattaches_by_handle),
      T(job_slurm_forgot_is_read_from_exit_json_or_lost),
      T(held_job_runs_only_once_released),
      T(held_job_whose_starter_died_is_cancelled_and_lost),
      T(held_job_that_cannot_be_released_is_cancelled_and_lost),
      T(held_job_nobody_recorded_is_cancelled_when_its_trial_starts_again),
      T(transient_errors_are_retried_with_backoff),
      T(lost_sbatch_answer_does_not_submit_twice),
      T(permanent_errors_carry_slurms_message_without_retrying),
      T(unreachable_controller_during_a_poll_is_no_news),
      T(job_over_its_time_limit_ends_in_timeout),
      T(job_on_a_failed_node_is_lost),
  };
#undef T
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
