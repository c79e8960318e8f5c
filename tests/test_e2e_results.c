/* End-to-end: seeing results with the real bin/nas on SQLite — one trial in full (`nas
 * trial`), its logs (`nas logs`, followed while it runs, through a truncation and a
 * Ctrl-C), an experiment exported and imported into a second storage with nothing changed
 * that listings show, bad import files refused before anything is stored, `nas
 * compare` agreeing with `nas pareto`, and `nas pareto --model` weighing noisy readings. */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/common.h"
#include "tests/e2e.h"

/* Trials with two objectives that print a line to each log and report a curve (acc at
 * steps 0, 1, 2); those with x > 0.75 then fail with status 3. */
static char *curves_spec(fixture *f, const char *name, int seed) {
  char *text, *file;
  assert_true(asprintf(&text,
                       "name: %s\n"
                       "seed: %d\n"
                       "parameters:\n"
                       "  x: {type: float, low: 0, high: 1}\n"
                       "objectives: [{name: y, goal: minimize}, {name: z, goal: minimize}]\n"
                       "trial:\n"
                       "  command: [sh, -c, 'echo hello-out; echo warn-err >&2; for s in 0 1 2; do "
                       "echo \"nas-metric {{\\\"step\\\": $s, \\\"acc\\\": {x}}}\"; done; "
                       "awk \"BEGIN {{ exit !({x} > 0.75) }}\" && exit 3; "
                       "echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": $(awk \"BEGIN {{ print 1 - {x} }}\")}}\"']\n"
                       "budget: {trials: 8, parallel: 4, max_failure_rate: 1}\n"
                       "optimizer: {type: random}\n",
                       name, seed) > 0);
  assert_true(asprintf(&file, "%s.yaml", name) > 0);
  char *path = test_write(f->dir, file, text);
  free(text), free(file);
  return path;
}

/* Runs `nas ARGS…`, expecting exit status want and `expected` in its output. */
static void expect_refusal(fixture *f, char *const *args, int want, const char *expected) {
  char *argv[16] = {(char *)test_nas_bin()}, *out;
  size_t n = 1;
  while (*args) argv[n++] = *args++;
  argv[n] = NULL;
  int rc = test_run(f->dir, argv, &out);
  if (rc != want || !strstr(out, expected))
    fail_msg("nas %s exited %d (want %d) without '%s': %s", argv[1], rc, want, expected, out);
  free(out);
}

static void trial_shows_everything_about_one_trial(void **state) {
  fixture *f = *state;
  char *spec = curves_spec(f, "curves", 1);
  run_spec(f, spec);
  json_t *t = nas_json(f, (char *[]){"trial", "curves", "0", "--storage", f->db, "--format", "json", NULL});
  double x = num(json_object_get(t, "params"), "x");
  assert_int_equal(json_integer_value(json_object_get(t, "number")), 0);
  assert_int_equal(json_integer_value(json_object_get(t, "attempts")), 1);
  const json_t *acc = json_object_get(json_object_get(t, "intermediate"), "acc");
  assert_int_equal(json_array_size(acc), 3);
  for (size_t s = 0; s < 3; s++) {
    assert_int_equal(json_integer_value(json_array_get(json_array_get(acc, s), 0)), (json_int_t)s);
    assert_true(json_number_value(json_array_get(json_array_get(acc, s), 1)) == x);
  }
  if (x > 0.75) assert_non_null(strstr(json_string_value(json_object_get(t, "error")), "status 3"));
  else assert_true(num(json_object_get(t, "metrics"), "y") == x);
  assert_true(num(t, "started_at") <= num(t, "finished_at"));
  assert_true(num(t, "created_at") <= num(t, "started_at"));
  assert_non_null(strstr(json_string_value(json_object_get(t, "stdout_tail")), "hello-out"));
  assert_string_equal(json_string_value(json_object_get(t, "stderr_tail")), "warn-err\n");
  const char *run_dir = json_string_value(json_object_get(t, "run_dir"));
  assert_string_equal(run_dir + strlen(run_dir) - strlen("/runs/curves/0"), "/runs/curves/0");
  assert_true(json_is_null(json_object_get(t, "model"))); /* a command trial saves none */
  json_decref(t);

  char *out;
  char *text_args[] = {(char *)test_nas_bin(), "trial", "curves", "0", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, text_args, &out), 0);
  assert_non_null(strstr(out, "trial 0 of curves:"));
  assert_non_null(strstr(out, "curves (step: value)"));
  assert_non_null(strstr(out, "duration"));
  assert_non_null(strstr(out, "warn-err"));
  free(out);

  expect_refusal(f, (char *[]){"trial", "curves", "8", "--storage", f->db, NULL}, 1,
                 "experiment 'curves' has no trial 8 (its trials are 0 to 7)");
  expect_refusal(f, (char *[]){"trial", "nope", "0", "--storage", f->db, NULL}, 1, "no experiment 'nope'");
  expect_refusal(f, (char *[]){"trial", "curves", "x", "--storage", f->db, NULL}, 2, "not a trial number");
  expect_refusal(f, (char *[]){"logs", "curves", "9", "--storage", f->db, NULL}, 1,
                 "experiment 'curves' has no trial 9");
  free(spec);
}

/* A training log of 2 GiB (sparse: no disk) ending in text, shown by `nas trial` limited to
 * 1 GiB of address space (where it can start so): the view shows the log's last 4 KiB, read alone (reading the
 * whole log first would fail, and the server answers this view for any reader). */
static void a_huge_log_is_shown_by_its_tail_alone(void **state) {
  fixture *f = *state;
  char *spec = curves_spec(f, "curves", 1);
  run_spec(f, spec);
  char *log = nas_asprintf("%s/runs/curves/0/stdout.log", f->dir);
  FILE *out = fopen(log, "r+");
  assert_non_null(out);
  assert_int_equal(ftruncate(fileno(out), (off_t)2 << 30), 0);
  assert_int_equal(fseeko(out, 0, SEEK_END), 0);
  for (int i = 0; i < 5000; i++) fputc('x', out);
  fputs("tail-end\n", out);
  assert_int_equal(fclose(out), 0);
  /* Not under AddressSanitizer, which reserves terabytes of address space at start. */
  char *text;
  char *probe[] = {"sh", "-c", "ulimit -v 1048576 && exec \"$0\" --help", (char *)test_nas_bin(), NULL};
  bool limited = test_run(f->dir, probe, &text) == 0;
  free(text);
  char *argv[] = {"sh", "-c", limited ? "ulimit -v 1048576 && exec \"$0\" \"$@\"" : "exec \"$0\" \"$@\"",
                  (char *)test_nas_bin(), "trial", "curves", "0", "--storage", f->db, "--format", "json", NULL};
  assert_int_equal(test_run(f->dir, argv, &text), 0);
  json_t *t = json_loads(text, 0, NULL);
  assert_non_null(t);
  const char *tail = json_string_value(json_object_get(t, "stdout_tail"));
  if (!tail) fail_msg("no stdout_tail: %s", text);
  assert_int_equal(strlen(tail), 4096);
  assert_string_equal(tail + 4096 - 9, "tail-end\n");
  json_decref(t);
  assert_int_equal(truncate(log, 0), 0);
  free(text), free(log), free(spec);
}

static void logs_follow_a_running_trial_through_a_truncation_to_its_end(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "tail.yaml",
                          "name: tail\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial:\n"
                          "  command: [sh, -c, 'echo before-before-before; echo err-line >&2; sleep 1; "
                          ": > \"$NAS_RUN_DIR/stdout.log\"; echo after; sleep 1; echo done-now']\n"
                          "budget: {trials: 1, max_failure_rate: 1}\n"
                          "optimizer: {type: random}\n");
  pid_t run = start_nas_run(f, spec);
  wait_until_running(f, "tail");
  char *out;
  char *follow[] = {(char *)test_nas_bin(), "logs", "tail", "0", "--follow", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, follow, &out), 0); /* returns: the trial ended */
  char *before = strstr(out, "before-before-before"), *cut = strstr(out, "was truncated");
  char *after = strstr(out, "after\n"), *end = strstr(out, "done-now");
  if (!before || !cut || !after || !end || !(before < cut && cut < after && after < end))
    fail_msg("followed log out of order: %s", out);
  free(out);
  int status;
  assert_int_equal(waitpid(run, &status, 0), run);

  char *once[] = {(char *)test_nas_bin(), "logs", "tail", "0", "--stderr", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, once, &out), 0);
  assert_string_equal(out, "err-line\n");
  free(out);
  free(spec);
}

/* A trial can put anything in its run folder: a FIFO in place of its log is refused at
 * once (opening it waited for a writer for ever, with Ctrl-C blocked under --follow), and
 * the trial view shows no tail for it. A queued trial, which has no job, shows none. */
static void a_log_that_is_not_a_file_is_refused_not_waited_on(void **state) {
  fixture *f = *state;
  char *spec = curves_spec(f, "curves", 1);
  run_spec(f, spec);
  char *log = nas_asprintf("%s/runs/curves/0/stdout.log", f->dir);
  assert_int_equal(unlink(log), 0);
  assert_int_equal(mkfifo(log, 0600), 0);
  char *out;
  char *logs[] = {"timeout", "10", (char *)test_nas_bin(), "logs", "curves", "0", "--storage", f->db, NULL};
  int rc = test_run(f->dir, logs, &out);
  if (rc == 124 || !strstr(out, "not a regular file")) fail_msg("nas logs exited %d: %s", rc, out);
  free(out);
  char *trial[] = {"timeout", "10", (char *)test_nas_bin(), "trial", "curves", "0", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, trial, &out), 0);
  free(out);
  expect_refusal(f, (char *[]){"enqueue", "curves", "x=0.5", "--storage", f->db, NULL}, 0, "");
  char *queued[] = {(char *)test_nas_bin(), "trial", "curves", "8", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, queued, &out), 0);
  if (strstr(out, "(null)") || !strstr(out, "queued")) fail_msg("nas trial of a queued trial: %s", out);
  free(out), free(log), free(spec);
}

static void logs_follow_ends_cleanly_on_ctrl_c(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "slow.yaml",
                          "name: slow\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo started; sleep 30']}\n"
                          "budget: {trials: 1, max_failure_rate: 1}\n"
                          "optimizer: {type: random}\n");
  pid_t run = start_nas_run(f, spec);
  wait_until_running(f, "slow");
  pid_t logs = fork();
  assert_true(logs >= 0);
  if (logs == 0) {
    if (chdir(f->dir) != 0) _exit(126);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1), dup2(null, 2);
    execl(test_nas_bin(), test_nas_bin(), "logs", "slow", "0", "-f", "--storage", f->db, (char *)NULL);
    _exit(127);
  }
  nas_sleep_ms(500);
  double asked = nas_now();
  kill(logs, SIGINT);
  int status;
  assert_int_equal(waitpid(logs, &status, 0), logs);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_true(nas_now() - asked < 2);
  kill(run, SIGINT), nas_sleep_ms(200), kill(run, SIGINT); /* the second stops the trial */
  assert_int_equal(waitpid(run, &status, 0), run);
  free(spec);
}

/* The trials of an export with what an import cannot keep taken out: the times, which the
 * importing storage sets. */
static json_t *trials_without_times(json_t *export_doc) {
  json_t *trials = json_incref(json_object_get(export_doc, "trials")), *t;
  size_t i;
  json_array_foreach(trials, i, t) {
    json_object_del(t, "created_at");
    json_object_del(t, "started_at");
    json_object_del(t, "finished_at");
    json_object_del(t, "heartbeat_at");
  }
  return trials;
}

static void export_then_import_into_another_storage_keeps_what_listings_show(void **state) {
  fixture *f = *state;
  char *spec = curves_spec(f, "trip", 2), *second;
  run_spec(f, spec);
  json_t *rows = trials_json(f, "trip");
  assert_true(count_status(rows, "failed") > 0 && count_status(rows, "completed") > 0);
  json_decref(rows);
  assert_true(asprintf(&second, "sqlite:%s/second.db", f->dir) > 0);
  json_t *exported = nas_json(f, (char *[]){"export", "trip", "--with", "curves", "--storage", f->db, NULL});
  assert_string_equal(json_string_value(json_object_get(exported, "format")), "nas-experiment");
  assert_int_equal(json_integer_value(json_object_get(exported, "version")), 1);
  char *text = json_dumps(exported, JSON_REAL_PRECISION(17));
  free(test_write(f->dir, "trip.json", text));
  free(text);

  char *out;
  char *import[] = {(char *)test_nas_bin(), "import", "trip.json", "--storage", second, NULL};
  assert_int_equal(test_run(f->dir, import, &out), 0);
  free(out);
  const char *views[][2] = {{"trials", "--format=json"}, {"pareto", "--format=json"}};
  for (size_t v = 0; v < 2; v++) {
    json_t *here = nas_json(f, (char *[]){(char *)views[v][0], "trip", (char *)views[v][1], "--storage", f->db, NULL});
    json_t *there = nas_json(f, (char *[]){(char *)views[v][0], "trip", (char *)views[v][1], "--storage", second, NULL});
    if (!json_equal(here, there)) fail_msg("nas %s differs after import", views[v][0]);
    json_decref(here), json_decref(there);
  }
  /* Exported again: the same trials, attempts, errors and curves; only the times are new. */
  json_t *again = nas_json(f, (char *[]){"export", "trip", "--with", "curves", "--storage", second, NULL});
  json_t *a = trials_without_times(exported), *b = trials_without_times(again);
  assert_true(json_equal(a, b));
  json_decref(a), json_decref(b), json_decref(again);

  /* The name is taken now; --name gives another, and its spec says that name. */
  assert_int_equal(test_run(f->dir, import, &out), 1);
  assert_non_null(strstr(out, "already has an experiment 'trip'"));
  assert_non_null(strstr(out, "--name"));
  free(out);
  char *renamed[] = {(char *)test_nas_bin(), "import", "trip.json", "--name", "trip2", "--storage", second, NULL};
  assert_int_equal(test_run(f->dir, renamed, &out), 0);
  free(out);
  json_t *copy = nas_json(f, (char *[]){"export", "trip2", "--storage", second, NULL});
  assert_non_null(strstr(json_string_value(json_object_get(json_object_get(copy, "experiment"), "spec")),
                         "name: trip2\n"));
  json_decref(copy);

  /* CSV: one row per trial, with the times when asked. */
  char *csv[] = {(char *)test_nas_bin(), "export", "trip", "--format", "csv", "--with", "timings", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, csv, &out), 0);
  assert_true(strncmp(out, "trial,status,x,y,z,acc,reference,error,created_at,started_at,finished_at,duration_s\n", 84) == 0);
  size_t lines = 0;
  for (const char *p = out; *p; p++) lines += *p == '\n';
  assert_int_equal(lines, 9);
  free(out);
  json_decref(exported);
  free(second), free(spec);
}

/* The exported trial of number n. */
static json_t *exported_trial(json_t *doc, json_int_t n) {
  json_t *t = json_array_get(json_object_get(doc, "trials"), (size_t)n);
  assert_int_equal(json_integer_value(json_object_get(t, "number")), n);
  return t;
}

/* Hyperband from 1 to 3 epochs, eta 3, over three trials: the best (lowest y = x) trains
 * on to rung 1. `nas trials` and `nas trial` show each trial's rung; an export imported
 * into another storage keeps it, also for a trial promoted and not yet started (queued at
 * rung 1 after one attempt), and a rung the attempts cannot have reached is refused. */
static void rungs_are_shown_and_kept_by_export_then_import(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "rungs.yaml",
                          "name: rungs\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 3, parallel: 3}\n"
                          "optimizer: {type: random}\n"
                          "multi_fidelity: {kind: hyperband, min_epochs: 1, max_epochs: 3, eta: 3}\n"),
       *second, *out;
  run_spec(f, spec);
  json_t *rows = trials_json(f, "rungs");
  json_int_t best = 0;
  for (json_int_t n = 1; n < 3; n++)
    if (num(row_of(rows, n), "x") < num(row_of(rows, best), "x")) best = n;
  for (json_int_t n = 0; n < 3; n++)
    assert_int_equal(num(row_of(rows, n), "rung"), n == best ? 1 : 0);
  json_decref(rows);
  char best_text[24];
  snprintf(best_text, sizeof best_text, "%lld", (long long)best);
  char *show[] = {(char *)test_nas_bin(), "trial", "rungs", best_text, "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, show, &out), 0);
  assert_non_null(strstr(out, "completed, 2 attempt(s), rung 1"));
  free(out);
  /* the dashboard's data (here inlined into a plot file) has the rung column too */
  char *page = NULL, *plot_file = nas_asprintf("%s/rungs.html", f->dir);
  char *plot[] = {(char *)test_nas_bin(), "plot", "rungs", "--storage", f->db, "--out", plot_file,
                  NULL};
  assert_int_equal(test_run(f->dir, plot, &out), 0);
  free(out);
  assert_int_equal(nas_read_file(plot_file, &page, NULL, NULL), NAS_OK);
  assert_non_null(strstr(page, "\\\"rung\\\":[")); /* quotes escaped: JSON in a string */
  free(page);
  free(plot_file);

  json_t *exported = nas_json(f, (char *[]){"export", "rungs", "--storage", f->db, NULL});
  assert_int_equal(json_integer_value(json_object_get(exported_trial(exported, best), "rung")), 1);
  json_t *waiting = exported_trial(exported, best == 0 ? 1 : 0); /* promoted, not started */
  json_object_set_new(waiting, "status", json_string("queued"));
  json_object_set_new(waiting, "rung", json_integer(1));
  char *text = json_dumps(exported, JSON_REAL_PRECISION(17));
  free(test_write(f->dir, "rungs.json", text));
  free(text);
  assert_true(asprintf(&second, "sqlite:%s/second.db", f->dir) > 0);
  char *import[] = {(char *)test_nas_bin(), "import", "rungs.json", "--storage", second, NULL};
  assert_int_equal(test_run(f->dir, import, &out), 0);
  free(out);
  json_t *again = nas_json(f, (char *[]){"export", "rungs", "--storage", second, NULL});
  json_t *a = trials_without_times(exported), *b = trials_without_times(again);
  if (!json_equal(a, b)) fail_msg("rungs differ after import");
  json_decref(a), json_decref(b), json_decref(again);

  json_object_set_new(exported_trial(exported, best), "rung", json_integer(2)); /* 2 attempts */
  text = json_dumps(exported, 0);
  free(test_write(f->dir, "rungs.json", text));
  free(text);
  expect_refusal(f, (char *[]){"import", "rungs.json", "--name", "r2", "--storage", second, NULL}, 1,
                 "rung: must be a count");
  /* the rung's attempts were counted as rung + 1, which overflowed into an accepted rung */
  json_object_set_new(exported_trial(exported, best), "rung", json_integer(INT64_MAX));
  text = json_dumps(exported, 0);
  free(test_write(f->dir, "rungs.json", text));
  free(text);
  expect_refusal(f, (char *[]){"import", "rungs.json", "--name", "r3", "--storage", second, NULL}, 1,
                 "rung: must be a count");
  json_decref(exported);
  free(second), free(spec);
}

/* An import file with one thing wrong (its name is taken too, but the file is checked
 * first); nothing is stored from it. */
static void bad_import_files_are_refused_before_anything_is_stored(void **state) {
  fixture *f = *state;
  char *spec = curves_spec(f, "good", 3);
  run_spec(f, spec);
  json_t *doc = nas_json(f, (char *[]){"export", "good", "--storage", f->db, NULL});
  struct {
    const char *edit, *expected, *text; /* text: the file, instead of an edit of doc */
  } cases[] = {
      {"not json", "bad.json:1:", "{\"format\": oops}"},
      /* cut short: the error is where the input ends, just past its last character (it
       * was reported at column 0 of the line after a last newline) */
      {"cut after a newline", "bad.json:2:1: not JSON", "{\"format\": \"nas-experiment\",\n"},
      {"cut inside a line", "bad.json:2:12: not JSON", "{\"format\": 1,\n \"b\": [1, 2"},
      {"empty", "bad.json:1:1: not JSON", ""},
      {"format", "format: not \"nas-experiment\"", NULL},
      {"version", "this nas reads version 1", NULL},
      {"status", "trials[2].status: not a trial status", NULL},
      {"params", "trials[1].params:", NULL},
      {"spec", "experiment.spec", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    json_t *bad = json_deep_copy(doc);
    json_t *trials = json_object_get(bad, "trials");
    if (strcmp(cases[i].edit, "format") == 0) json_object_set_new(bad, "format", json_string("csv"));
    if (strcmp(cases[i].edit, "version") == 0) json_object_set_new(bad, "version", json_integer(2));
    if (strcmp(cases[i].edit, "status") == 0)
      json_object_set_new(json_array_get(trials, 2), "status", json_string("done"));
    if (strcmp(cases[i].edit, "params") == 0)
      json_object_set_new(json_object_get(json_array_get(trials, 1), "params"), "x", json_real(7));
    if (strcmp(cases[i].edit, "spec") == 0)
      json_object_set_new(json_object_get(bad, "experiment"), "spec", json_string("name: bad\nparameters: 3\n"));
    char *text = cases[i].text ? strdup(cases[i].text) : json_dumps(bad, 0);
    free(test_write(f->dir, "bad.json", text));
    expect_refusal(f, (char *[]){"import", "bad.json", "--storage", f->db, NULL}, 1, cases[i].expected);
    free(text);
    json_decref(bad);
  }
  /* A metric without a name passed the check, and storage refused it only after the
   * experiment was created, leaving it incomplete. */
  json_t *unnamed = json_deep_copy(doc);
  json_object_set_new(json_array_get(json_object_get(unnamed, "trials"), 0), "metrics",
                      json_pack("{s:i}", "", 1));
  char *text = json_dumps(unnamed, 0);
  free(test_write(f->dir, "bad.json", text));
  expect_refusal(f, (char *[]){"import", "bad.json", "--name", "fresh", "--storage", f->db, NULL}, 1,
                 "trials[0].metrics: must be an object of numbers under non-empty names");
  free(text);
  json_decref(unnamed);
  /* A folder read as an empty file: "folder:1:1: not JSON: … near end of file". */
  char *folder = nas_asprintf("%s/exports", f->dir);
  assert_int_equal(mkdir(folder, 0700), 0);
  expect_refusal(f, (char *[]){"import", "exports", "--name", "fresh", "--storage", f->db, NULL}, 1,
                 "exports: a folder; give a file 'nas export --format json' wrote");
  free(folder);
  json_t *status = nas_json(f, (char *[]){"status", "--format", "json", "--storage", f->db, NULL});
  assert_int_equal(json_array_size(json_object_get(status, "experiments")), 1); /* only "good" */
  json_decref(status);
  json_decref(doc);
  free(spec);
}

/* Five known trials on the line z = 1 − y, read exactly (standard error 0.001) except the
 * one at x = 0.5, whose z reads a lucky 0.1 with a standard error of 0.5. */
static char *noisy_spec(fixture *f) {
  free(test_write(f->dir, "report.sh",
                  "lucky=$(awk \"BEGIN { print ($1 == 0.5) }\")\n"
                  "if [ \"$lucky\" = 1 ]; then z=0.1; sem=0.5; "
                  "else z=$(awk \"BEGIN { print 1 - $1 }\"); sem=0.001; fi\n"
                  "echo \"nas-metric {\\\"y\\\": $1, \\\"z\\\": $z, \\\"z_sem\\\": $sem}\"\n"));
  return test_write(f->dir, "noisy.yaml",
                    "name: noisy\n"
                    "parameters:\n"
                    "  x: {type: float, low: 0, high: 1}\n"
                    "objectives: [{name: y, goal: minimize, noise: 0.001}, {name: z, goal: minimize}]\n"
                    "trial: {command: [sh, report.sh, '{x}']}\n"
                    "budget: {trials: 5}\n"
                    "enqueue: [{x: 0.1}, {x: 0.3}, {x: 0.5}, {x: 0.7}, {x: 0.9}]\n"
                    "optimizer: {type: random}\n");
}

static void pareto_model_shows_the_front_of_the_posterior_means(void **state) {
  fixture *f = *state;
  char *spec = noisy_spec(f);
  run_spec(f, spec);
  json_t *trial = nas_json(f, (char *[]){"trial", "noisy", "2", "--format", "json", "--storage", f->db, NULL});
  assert_true(num(json_object_get(trial, "metrics"), "z_sem") == 0.5); /* stored, shown */
  json_decref(trial);
  json_t *p = nas_json(f, (char *[]){"pareto", "noisy", "--model", "--format", "json", "--storage", f->db, NULL});
  /* Observed: the lucky reading dominates the trials at 0.7 and 0.9. */
  assert_int_equal(json_array_size(json_object_get(p, "front")), 3);
  /* The model weighs that reading by its standard error: z near 0.5 there, all five on
   * its front, the observed values beside the means. */
  json_t *model = json_object_get(p, "model_front");
  assert_int_equal(json_array_size(model), 5);
  json_t *row = json_array_get(model, 2);
  assert_true(num(row, "x") == 0.5 && num(row, "z") == 0.1);
  double z = num(json_object_get(row, "model"), "z");
  assert_true(z > 0.35 && z < 0.65);
  assert_true(fabs(num(json_object_get(json_array_get(model, 0), "model"), "z") - 0.9) < 0.01);
  json_decref(p);
  char *out;
  char *table[] = {(char *)test_nas_bin(), "pareto", "noisy", "--model", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, table, &out), 0);
  assert_non_null(strstr(out, "model: 5 trials on the front of the posterior means"));
  assert_non_null(strstr(out, "z (model)"));
  free(out);
  expect_refusal(f, (char *[]){"trials", "noisy", "--model", "--storage", f->db, NULL}, 2, "model");
  free(spec);
}

/* Counts the lines of text and checks that each has as many fields (commas) as the first. */
static size_t csv_lines_of_one_width(const char *text) {
  size_t lines = 0, width = 0;
  for (const char *line = text; *line; lines++) {
    const char *end = strchr(line, '\n');
    assert_non_null(end);
    size_t commas = 0;
    for (const char *p = line; p < end; p++) commas += *p == ',';
    if (lines == 0) width = commas;
    if (commas != width) fail_msg("line %zu has %zu commas, the header %zu: %s", lines, commas, width, text);
    line = end + 1;
  }
  return lines;
}

/* Both fronts in CSV are one table (a "front" column tells them apart), not two tables
 * of different columns one after the other, which no CSV reader takes. */
static void pareto_model_in_csv_is_one_table(void **state) {
  fixture *f = *state;
  char *spec = noisy_spec(f);
  run_spec(f, spec);
  char *out, *argv[] = {"sh", "-c", "\"$0\" pareto noisy --model --format csv --storage \"$1\" 2>/dev/null",
                        (char *)test_nas_bin(), f->db, NULL};
  assert_int_equal(test_run(f->dir, argv, &out), 0);
  assert_int_equal(strncmp(out, "front,trial,y (model),z (model),y,z,x\n", 37), 0);
  assert_int_equal(csv_lines_of_one_width(out), 1 + 3 + 5); /* the header, observed, model */
  assert_non_null(strstr(out, "\nobserved,2,,,0.5,0.1,0.5\n"));
  const char *model = strstr(out, "\nmodel,2,");
  assert_non_null(model); /* its posterior mean of y, told y's noise of 0.001: the reading */
  assert_true(fabs(strtod(model + strlen("\nmodel,2,"), NULL) - 0.5) < 1e-6);
  free(out);
  free(spec);
}

static void compare_with_itself_gives_the_pareto_hypervolume(void **state) {
  fixture *f = *state;
  char *one = curves_spec(f, "one", 4), *two = curves_spec(f, "two", 5);
  run_spec(f, one);
  run_spec(f, two);
  json_t *pareto = nas_json(f, (char *[]){"pareto", "one", "--format", "json", "--storage", f->db, NULL});
  json_t *self = nas_json(f, (char *[]){"compare", "one", "one", "--format", "json", "--storage", f->db, NULL});
  json_t *list = json_object_get(self, "experiments");
  assert_int_equal(json_array_size(list), 2);
  for (size_t e = 0; e < 2; e++) {
    json_t *entry = json_array_get(list, e);
    assert_true(num(entry, "hypervolume") == num(pareto, "hypervolume"));
    assert_true(json_equal(json_object_get(entry, "front"), json_object_get(pareto, "front")));
  }
  assert_true(json_equal(json_object_get(self, "reference_point"), json_object_get(pareto, "reference_point")));
  json_decref(self);

  /* Two experiments: one reference point for both, at least as far out as each one's own. */
  json_t *both = nas_json(f, (char *[]){"compare", "one", "two", "--format", "json", "--storage", f->db, NULL});
  json_t *ref = json_object_get(both, "reference_point");
  assert_true(num(ref, "y") >= num(json_object_get(pareto, "reference_point"), "y"));
  assert_true(num(json_array_get(json_object_get(both, "experiments"), 0), "hypervolume") >=
              num(pareto, "hypervolume"));
  json_decref(both);
  json_decref(pareto);
  char *out;
  char *table[] = {(char *)test_nas_bin(), "compare", "one", "two", "--storage", f->db, NULL};
  assert_int_equal(test_run(f->dir, table, &out), 0);
  assert_non_null(strstr(out, "reference point: y="));
  assert_non_null(strstr(out, "experiment  trial"));
  free(out);

  char *other = test_write(f->dir, "other.yaml",
                           "name: other\n"
                           "parameters: {x: {type: float, low: 0, high: 1}}\n"
                           "objectives: [{name: y, goal: minimize}, {name: z, goal: maximize}]\n"
                           "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": {x}}}\"']}\n"
                           "budget: {trials: 2}\n"
                           "optimizer: {type: random}\n");
  run_spec(f, other);
  expect_refusal(f, (char *[]){"compare", "one", "other", "--storage", f->db, NULL}, 1,
                 "objective 2 of 'one' is z (minimize) and of 'other' z (maximize)");
  expect_refusal(f, (char *[]){"compare", "one", "nope", "--storage", f->db, NULL}, 1, "no experiment 'nope'");
  expect_refusal(f, (char *[]){"compare", "one", "--storage", f->db, NULL}, 2, "two experiments or more");
  free(one), free(two), free(other);
}

static void new_commands_have_help_and_refuse_bad_usage(void **state) {
  fixture *f = *state;
  const char *cmds[] = {"trial", "logs", "export", "import", "compare"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    expect_refusal(f, (char *[]){(char *)cmds[i], "--help", NULL}, 0, "usage: nas");
    expect_refusal(f, (char *[]){(char *)cmds[i], "--bogus", NULL}, 2, "unknown option");
  }
  expect_refusal(f, (char *[]){"export", "e", "--with", "colors", NULL}, 2, "unknown --with item 'colors'");
  expect_refusal(f, (char *[]){"export", "e", "--format", "csv", "--with", "curves", NULL}, 2,
                 "json export only");
  expect_refusal(f, (char *[]){"import", "missing.json", NULL}, 1, "missing.json: No such file");
  /* A trial id that is no id is named as given (it said "no trial: give --trial ID"). */
  expect_refusal(f, (char *[]){"worker", "--trial", "abc", NULL}, 2,
                 "nas worker: --trial 'abc' is not a trial id (a whole number from 1)");
  setenv("NAS_TRIAL_ID", "0", 1);
  expect_refusal(f, (char *[]){"worker", NULL}, 2,
                 "nas worker: NAS_TRIAL_ID '0' is not a trial id (a whole number from 1)");
  unsetenv("NAS_TRIAL_ID");
  expect_refusal(f, (char *[]){"worker", NULL}, 2, "nas worker: no trial: give --trial ID");
}

/* Each command knows only its own options: one of another command's is unknown, named as
 * given (not by its value, as when the commands' option tables were shared). */
static void an_option_another_command_takes_is_unknown_by_its_own_name(void **state) {
  fixture *f = *state;
  expect_refusal(f, (char *[]){"logs", "e", "0", "--format", "json", NULL}, 2,
                 "nas logs: unknown option '--format'");
  expect_refusal(f, (char *[]){"delete", "e", "--storage-to", "other.db", NULL}, 2,
                 "nas delete: unknown option '--storage-to'");
  expect_refusal(f, (char *[]){"rename", "e", "f", "--runs", NULL}, 2,
                 "nas rename: unknown option '--runs'");
  /* and an abbreviation is read among the command's own options only */
  expect_refusal(f, (char *[]){"trial", "e", "0", "--fo", NULL}, 2,
                 "nas trial: option '--fo' needs a value");
  /* A value given to an option that takes none names that option (it said "unknown
   * option '-h'" for --help=x, and '-y' for --yes=no). */
  expect_refusal(f, (char *[]){"status", "--help=x", NULL}, 2, "nas status: option '--help' takes no value");
  expect_refusal(f, (char *[]){"delete", "e", "--yes=no", NULL}, 2, "nas delete: option '--yes' takes no value");
  expect_refusal(f, (char *[]){"pareto", "e", "--mod=1", NULL}, 2, "nas pareto: option '--mod' takes no value");
  expect_refusal(f, (char *[]){"delete", "e", "--runs", "-zy", NULL}, 2, "nas delete: unknown option '-z'");
}

/* NAME.yaml in the fixture's folder: a spec of one parameter and one objective, without
 * a trial section (for `nas create`). Owned path. */
static char *ask_tell_spec(fixture *f, const char *name) {
  char *text, *file;
  assert_true(asprintf(&text,
                       "name: %s\n"
                       "parameters: {x: {type: float, low: 0, high: 1}}\n"
                       "objectives: [{name: y, goal: minimize}]\n"
                       "budget: {trials: 2}\n",
                       name) > 0);
  assert_true(asprintf(&file, "%s.yaml", name) > 0);
  char *path = test_write(f->dir, file, text);
  free(text), free(file);
  return path;
}

/* getopt leaves optind on a group of letters until its last one, so an unknown letter
 * inside '-xy' was named by the word before the group. */
static void an_unknown_letter_in_a_group_is_named_itself(void **state) {
  fixture *f = *state;
  expect_refusal(f, (char *[]){"rename", "e", "-bad", NULL}, 2, "nas rename: unknown option '-b'");
  expect_refusal(f, (char *[]){"trials", "e", "-x", NULL}, 2, "nas trials: unknown option '-x'");
}

/* docs/cli.md: a mistyped experiment name gets a did-you-mean, from every command;
 * `nas status EXPERIMENT` and `nas report --experiment` gave none. */
static void status_and_report_suggest_the_experiment_a_typo_meant(void **state) {
  fixture *f = *state;
  char *spec = ask_tell_spec(f, "near");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  expect_refusal(f, (char *[]){"status", "neer", "--storage", f->db, NULL}, 1,
                 "no experiment 'neer' in sqlite:");
  expect_refusal(f, (char *[]){"status", "neer", "--storage", f->db, NULL}, 1, "did you mean 'near'?");
  expect_refusal(f, (char *[]){"report", "y=1", "--experiment", "neer", "--trial", "0", "--storage",
                               f->db, NULL},
                 1, "did you mean 'near'?");
  free(spec);
}

/* docs/cli.md: the commands nas's hints name carry --storage when the storage is not the
 * default one; `nas create`, `nas enqueue` and `nas status EXPERIMENT` left it out. */
static void hints_carry_the_storage_when_it_is_not_the_default(void **state) {
  fixture *f = *state;
  char *spec = ask_tell_spec(f, "hint");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0,
                 "'nas ask hint --storage sqlite:");
  expect_refusal(f, (char *[]){"enqueue", "hint", "x=0.5", "--storage", f->db, NULL}, 0,
                 "run it with: nas ask hint --storage sqlite:");
  expect_refusal(f, (char *[]){"status", "hint", "--storage", f->db, NULL}, 0,
                 "'nas pareto hint --storage sqlite:");
  free(spec);
}

/* Empty values were read as 0 by `nas tell` alone. A step is one by the same check and with
 * the same message wherever it is given: `nas report --step` took steps up to 2^63 - 1, which
 * a metric line refuses from 2^53 on. */
static void tell_refuses_an_empty_step_or_trial_number_as_the_others_do(void **state) {
  fixture *f = *state;
  expect_refusal(f, (char *[]){"tell", "e", "", "y=1", NULL}, 2,
                 "nas tell: '' is not a trial number");
  expect_refusal(f, (char *[]){"trial", "e", "", NULL}, 2, "nas trial: '' is not a trial number");
  expect_refusal(f, (char *[]){"tell", "e", "0", "--step", "", "y=1", NULL}, 2,
                 "nas tell: --step '': \"step\" must be a whole number from 0 to 2^53 - 1");
  expect_refusal(f, (char *[]){"report", "y=1", "--step", "", NULL}, 2,
                 "nas report: --step '': \"step\" must be a whole number from 0 to 2^53 - 1");
  expect_refusal(f, (char *[]){"report", "y=1", "--step", "9007199254740992", NULL}, 2,
                 "nas report: --step '9007199254740992': \"step\" must be a whole number from 0 "
                 "to 2^53 - 1 (9007199254740991)");
  expect_refusal(f, (char *[]){"tell", "e", "0", "--step", "9223372036854775807", "y=1", NULL}, 2,
                 "nas tell: --step '9223372036854775807': \"step\" must be a whole number");
  /* report's --trial too, as bad usage (exit 2) before any storage is opened */
  const char *bad[] = {"12abc", "-1", "", "99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *want = nas_asprintf("nas report: '%s' is not a trial number", bad[i]);
    expect_refusal(f, (char *[]){"report", "y=1", "--experiment", "e", "--trial", (char *)bad[i], NULL},
                   2, want);
    free(want);
  }
}

/* The values were parsed and then dropped unseen: a failed trial stores none. */
static void tell_refuses_values_with_fail(void **state) {
  fixture *f = *state;
  expect_refusal(f, (char *[]){"tell", "e", "0", "--fail", "diverged", "loss=3", NULL}, 2,
                 "nas tell: --fail takes no NAME=VALUE");
  /* the message is stored and shown as JSON and CSV, where other bytes cannot go */
  expect_refusal(f, (char *[]){"tell", "e", "0", "--fail", "x\xff", NULL}, 2,
                 "nas tell: --fail's message is not valid UTF-8");
}

/* `nas tell --attempt` tells only the attempt `nas ask` printed: a trial failed, queued
 * again by `nas retry` and handed out as attempt 2 is neither ended nor reported to by
 * attempt 1's asker. */
static void tell_with_an_attempt_ends_only_that_attempt(void **state) {
  fixture *f = *state;
  char *spec = ask_tell_spec(f, "again");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  expect_refusal(f, (char *[]){"ask", "again", "--format", "csv", "--storage", f->db, NULL}, 0,
                 "trial,attempt,x\n0,1,");
  expect_refusal(f, (char *[]){"tell", "again", "0", "--attempt", "1", "--fail", "boom", "--storage", f->db, NULL}, 0, "");
  expect_refusal(f, (char *[]){"retry", "again", "0", "--storage", f->db, NULL}, 0, "queued again");
  expect_refusal(f, (char *[]){"ask", "again", "--format", "csv", "--storage", f->db, NULL}, 0, "\n0,2,");
  expect_refusal(f, (char *[]){"tell", "again", "0", "--attempt", "1", "--complete", "y=1", "--storage", f->db, NULL},
                 1, "nas: trial 0 of 'again' runs attempt 2, not attempt 1: it was handed out again");
  expect_refusal(f, (char *[]){"tell", "again", "0", "--attempt", "1", "--step", "0", "y=1", "--storage", f->db, NULL},
                 1, "nas: trial 0 of 'again' runs attempt 2, not attempt 1");
  expect_refusal(f, (char *[]){"tell", "again", "0", "--attempt", "2", "--step", "0", "y=3", "--storage", f->db, NULL}, 0, "continue");
  expect_refusal(f, (char *[]){"tell", "again", "0", "--attempt", "2", "--complete", "y=2", "--storage", f->db, NULL}, 0, "");
  json_t *t = nas_json(f, (char *[]){"trial", "again", "0", "--storage", f->db, "--format", "json", NULL});
  assert_true(num(json_object_get(t, "metrics"), "y") == 2);
  json_decref(t);
  expect_refusal(f, (char *[]){"tell", "again", "0", "--attempt", "0", "--complete", NULL}, 2,
                 "nas tell: --attempt wants an attempt number (1, 2, …), not '0'");
  free(spec);
}

/* `nas report`/`nas tell` values were checked less than a metric line's: a negative
 * standard error, a metric called "step", a name given twice or not UTF-8 were stored. */
static void report_and_tell_check_values_as_a_metric_line_does(void **state) {
  fixture *f = *state;
  struct {
    const char *a, *b, *expected;
  } cases[] = {
      {"accuracy_sem=-1", NULL, "metric \"accuracy_sem\" is a standard error, so it must be >= 0"},
      {"step=3", NULL, "'step' is not a metric name: give the step with --step N"},
      {"a=1", "a=2", "metric \"a\" is given twice"},
      {"\xff\xfe=1", NULL, "a metric's name is not valid UTF-8"},
      {"a=nan", NULL, "metric \"a\" is nan, not a finite number"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *a = (char *)cases[i].a, *b = (char *)cases[i].b;
    expect_refusal(f, (char *[]){"report", a, "--experiment", "e", "--trial", "0", b, NULL}, 2,
                   cases[i].expected);
    expect_refusal(f, (char *[]){"tell", "e", "0", a, b, NULL}, 2, cases[i].expected);
  }
}

/* `nas report`/`nas tell` values were read by strtod alone, which takes hexadecimal (0x10
 * was stored as 16), "1e" (as 1) and blanks before the number. Decimal numbers as people
 * type them are taken: ".5", "5.", "+1", "1E3". */
static void report_and_tell_take_only_decimal_numbers(void **state) {
  fixture *f = *state;
  struct {
    const char *arg, *expected;
  } cases[] = {
      {"acc=0x10", "metric \"acc\" is '0x10', not a number (a decimal number: 3, -0.25, .5"},
      {"acc=1e", "metric \"acc\" is '1e', not a number"},
      {"acc= 1", "metric \"acc\" is ' 1', not a number"},
      {"acc=1 ", "metric \"acc\" is '1 ', not a number"},
      {"acc=.", "metric \"acc\" is '.', not a number"},
      {"acc=1.2.3", "metric \"acc\" is '1.2.3', not a number"},
      {"acc=", "metric \"acc\" is '', not a number"},
      {"acc=-inf", "metric \"acc\" is -inf, not a finite number"},
      {"acc=1e999", "metric \"acc\" is inf, not a finite number"},
      {"acc=\"1\"", "metric \"acc\" is '\"1\"', not a number"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *arg = (char *)cases[i].arg;
    expect_refusal(f, (char *[]){"report", arg, "--experiment", "e", "--trial", "0", NULL}, 2,
                   cases[i].expected);
    expect_refusal(f, (char *[]){"tell", "e", "0", arg, NULL}, 2, cases[i].expected);
  }
}

/* Writes the spec text to file in the fixture folder and stores it with `nas create`;
 * returns the file's owned path. */
static char *create_spec(fixture *f, const char *file, const char *text) {
  char *spec = test_write(f->dir, file, text);
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  return spec;
}

/* Asks and tells `n` trials of experiment `name`, each told `values` (NAME=VALUE words,
 * then NULL); every ask's output must be JSON alone. */
static void ask_and_tell(fixture *f, const char *name, size_t n, char *const *values) {
  for (size_t i = 0; i < n; i++) {
    json_t *asked = nas_json(f, (char *[]){"ask", (char *)name, "--format", "json", "--storage", f->db, NULL});
    assert_int_equal(json_array_size(asked), 1);
    char number[32];
    snprintf(number, sizeof number, "%lld", (long long)num(json_array_get(asked, 0), "trial"));
    json_decref(asked);
    char *argv[16] = {"tell", (char *)name, number, "--complete", "--storage", f->db};
    for (size_t k = 0; values[k] && k < 9; k++) argv[6 + k] = values[k];
    expect_refusal(f, argv, 0, "");
  }
}

/* The state `nas status` shows of experiment name. */
static void expect_state(fixture *f, const char *name, const char *state) {
  json_t *summary = nas_json(f, (char *[]){"status", (char *)name, "--format", "json", "--storage", f->db, NULL});
  const char *shown = json_string_value(json_object_get(summary, "status"));
  if (!shown || strcmp(shown, state) != 0) fail_msg("%s is %s, not %s", name, shown ? shown : "?", state);
  json_decref(summary);
}

/* An ask-and-tell experiment stayed "running" after the last trial of its budget ended
 * (while experiment_finished was posted). It finishes then, and a trial queued again by
 * `nas retry` or `nas enqueue`, or a budget `nas create` raised, reopens it at the next
 * ask, as `nas resume` reopens a finished run. */
static void ask_and_tell_finishes_when_its_budget_is_spent_and_reopens_for_more(void **state) {
  fixture *f = *state;
  char *spec = ask_tell_spec(f, "done");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  ask_and_tell(f, "done", 1, (char *[]){"y=1", NULL});
  expect_state(f, "done", "running");
  expect_refusal(f, (char *[]){"ask", "done", "--storage", f->db, NULL}, 0, "1 ");
  expect_refusal(f, (char *[]){"tell", "done", "1", "--fail", "boom", "--storage", f->db, NULL}, 0, "");
  expect_state(f, "done", "finished");
  expect_refusal(f, (char *[]){"ask", "done", "--storage", f->db, NULL}, 1, "has spent its budget of 2 trials");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  expect_state(f, "done", "finished");
  expect_refusal(f, (char *[]){"retry", "done", "1", "--storage", f->db, NULL}, 0, "queued again");
  expect_refusal(f, (char *[]){"ask", "done", "--storage", f->db, NULL}, 0, "1 ");
  expect_state(f, "done", "running");
  expect_refusal(f, (char *[]){"tell", "done", "1", "--complete", "y=2", "--storage", f->db, NULL}, 0, "");
  expect_state(f, "done", "finished");
  expect_refusal(f, (char *[]){"enqueue", "done", "x=0.25", "--storage", f->db, NULL}, 0, "queued");
  ask_and_tell(f, "done", 1, (char *[]){"y=3", NULL});
  expect_state(f, "done", "finished");
  free(spec);
}

/* A trial handed out by `nas ask` runs in the asker's own loop, which nas keeps no log
 * of: `nas logs` said it had no log "yet", and --follow waited for one for ever. */
static void logs_of_an_asked_trial_say_it_runs_outside_nas(void **state) {
  fixture *f = *state;
  char *spec = ask_tell_spec(f, "asked");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  expect_refusal(f, (char *[]){"ask", "asked", "--storage", f->db, NULL}, 0, "0 ");
  const char *said = "trial 0 of 'asked' (running) has no log: it was handed out by 'nas ask' "
                     "and runs outside nas";
  expect_refusal(f, (char *[]){"logs", "asked", "0", "--storage", f->db, NULL}, 1, said);
  expect_refusal(f, (char *[]){"logs", "asked", "0", "--follow", "--storage", f->db, NULL}, 1, said);
  expect_refusal(f, (char *[]){"tell", "asked", "0", "--complete", "y=1", "--storage", f->db, NULL}, 0, "");
  expect_refusal(f, (char *[]){"logs", "asked", "0", "--stderr", "--storage", f->db, NULL}, 1,
                 "trial 0 of 'asked' (completed) has no log: it was handed out by 'nas ask'");
  expect_refusal(f, (char *[]){"enqueue", "asked", "x=0.5", "--storage", f->db, NULL}, 0, "queued");
  expect_refusal(f, (char *[]){"logs", "asked", "1", "--storage", f->db, NULL}, 1,
                 "trial 1 of 'asked' (queued) has no log: the trials of 'asked' are handed out by "
                 "'nas ask' and run outside nas");
  free(spec);
}

/* With no trial meeting the constraints the optimizer's baseline is empty; a BLAS call on
 * it printed " ** On entry to DTRMV parameter number 6 had an illegal value" to stdout,
 * into `nas ask --format json`'s output. */
static void ask_prints_only_json_when_no_trial_meets_the_constraints(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "never.yaml",
                          "name: never\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}, {name: z, goal: maximize}]\n"
                          "constraints: ['lat <= 5']\n"
                          "budget: {trials: 20}\n"
                          "optimizer: {type: gp, n_initial: 2}\n");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  ask_and_tell(f, "never", 4, (char *[]){"y=1", "z=2", "lat=10", NULL});
  free(spec);
}

/* Decimal numbers as people type them are values: ".5", "+1", "1E3", "5.". */
static void tell_takes_decimal_numbers_as_typed(void **state) {
  fixture *f = *state;
  char *spec = create_spec(f, "typed.yaml",
                           "name: typed\n"
                           "parameters: {x: {type: float, low: 0, high: 1}}\n"
                           "objectives: [{name: a, goal: minimize}, {name: b, goal: maximize}]\n"
                           "budget: {trials: 5}\n");
  ask_and_tell(f, "typed", 1, (char *[]){"a=.5", "b=+1", "c=1E3", "d=5.", NULL});
  json_t *trial = nas_json(f, (char *[]){"trial", "typed", "0", "--format", "json", "--storage", f->db, NULL});
  json_t *metrics = json_object_get(trial, "metrics");
  assert_true(num(metrics, "a") == 0.5 && num(metrics, "b") == 1);
  assert_true(num(metrics, "c") == 1000 && num(metrics, "d") == 5);
  json_decref(trial);
  free(spec);
}

/* Trials read without error (`NAME_sem=0`) beside others the model fits a noise to: the
 * posterior covariance of the noise-free points is zero up to round-off, which came out
 * negative beyond the factorisation's jitter and failed every later ask ("4x4 covariance
 * matrix is not positive definite"). */
static void ask_goes_on_after_readings_told_with_a_standard_error_of_zero(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "exact.yaml",
                          "name: exact\n"
                          "seed: 1\n"
                          "parameters:\n"
                          "  x: {type: float, low: 0, high: 1}\n"
                          "  y: {type: float, low: 1e-3, high: 10, log: true}\n"
                          "objectives: [{name: a, goal: minimize}, {name: b, goal: maximize}]\n"
                          "budget: {trials: 20}\n"
                          "optimizer: {type: gp, n_initial: 3}\n"
                          "enqueue: [{x: 0.8, y: 0.002}, {x: 0.05, y: 2}, {x: 0.55, y: 0.02},"
                          " {x: 0.05, y: 0.008}, {x: 0.63, y: 2}, {x: 0, y: 8.7}, {x: 0.54, y: 8.7},"
                          " {x: 0, y: 10}]\n");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  for (int t = 0; t < 10; t++) {
    json_t *asked = nas_json(f, (char *[]){"ask", "exact", "--format", "json", "--storage", f->db, NULL});
    const json_t *row = json_array_get(asked, 0);
    char number[32], a[64], b[64];
    snprintf(number, sizeof number, "%lld", (long long)num(row, "trial"));
    snprintf(a, sizeof a, "a=%.17g", num(row, "x"));
    snprintf(b, sizeof b, "b=%.17g", num(row, "y"));
    json_decref(asked);
    bool exact = t % 2 == 1;
    expect_refusal(f, (char *[]){"tell", "exact", number, "--complete", a, b, "--storage", f->db,
                                 exact ? "a_sem=0" : NULL, "b_sem=0", NULL},
                   0, "");
  }
  free(spec);
}

/* Two objectives over ranges near 1e300 (diverged readings) have a hypervolume past the
 * largest double: JSON cannot hold inf, and `nas pareto`, `nas compare` and `nas plot`
 * failed with "out of memory". It is null in JSON and inf in tables, as `nas status`
 * says. */
static void a_hypervolume_past_the_largest_double_is_null_in_json_and_inf_in_tables(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "vast.yaml",
                          "name: vast\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: a, goal: minimize}, {name: b, goal: maximize}]\n"
                          "budget: {trials: 3}\n"
                          "enqueue: [{x: 0.1}, {x: 0.2}]\n");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  expect_refusal(f, (char *[]){"ask", "vast", "-n", "2", "--storage", f->db, NULL}, 0, "0.2");
  expect_refusal(f, (char *[]){"tell", "vast", "0", "--complete", "a=1e300", "b=1", "--storage", f->db, NULL}, 0, "");
  expect_refusal(f, (char *[]){"tell", "vast", "1", "--complete", "a=-1e300", "b=-1e300", "--storage", f->db, NULL}, 0, "");
  json_t *p = nas_json(f, (char *[]){"pareto", "vast", "--format", "json", "--storage", f->db, NULL});
  assert_true(json_is_null(json_object_get(p, "hypervolume")));
  assert_int_equal(json_array_size(json_object_get(p, "front")), 2);
  json_decref(p);
  expect_refusal(f, (char *[]){"pareto", "vast", "--storage", f->db, NULL}, 0, "hypervolume inf");
  json_t *c = nas_json(f, (char *[]){"compare", "vast", "vast", "--format", "json", "--storage", f->db, NULL});
  assert_true(json_is_null(json_object_get(json_array_get(json_object_get(c, "experiments"), 0), "hypervolume")));
  json_decref(c);
  expect_refusal(f, (char *[]){"compare", "vast", "vast", "--storage", f->db, NULL}, 0, "hypervolume inf");
  expect_refusal(f, (char *[]){"plot", "vast", "--out", "vast.html", "--storage", f->db, NULL}, 0, "");
  free(spec);
}

/* A new SQLite file holds the spec, whose webhook URLs may be secrets: others get no access
 * to it (the group what the umask gives, for a team sharing it). A plot file holds no
 * secret and gets 0644 less the umask as any output does (it was 0644 whatever the umask). */
static void a_new_storage_file_keeps_others_out_and_a_plot_file_takes_the_umask(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "private.yaml",
                          "name: private\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "budget: {trials: 2}\n");
  char *db = nas_asprintf("sqlite:%s/private.db", f->dir);
  mode_t before = umask(002);
  expect_refusal(f, (char *[]){"create", spec, "--storage", db, NULL}, 0, "is ready");
  expect_refusal(f, (char *[]){"plot", "private", "--out", "private.html", "--storage", db, NULL}, 0, "");
  umask(027);
  expect_refusal(f, (char *[]){"plot", "private", "--out", "closed.html", "--storage", db, NULL}, 0, "");
  umask(before);
  assert_int_equal(test_mode_of(f->dir, "private.db"), 0660);
  assert_int_equal(test_mode_of(f->dir, "private.html"), 0644);
  assert_int_equal(test_mode_of(f->dir, "closed.html"), 0640);
  free(spec), free(db);
}

/* A metric name not in the spec is a metric like any other (docs/metrics-protocol.md), so
 * a misspelt objective is stored as one; a completion that then misses the objective said
 * so without naming the misspelt name it was given. */
static void complete_without_an_objective_names_the_likely_misspelling(void **state) {
  fixture *f = *state;
  char *spec = create_spec(f, "typo.yaml", "{name: typo, parameters: {x: {type: float, low: 0, high: 1}},\n"
                                           " objectives: [{name: loss, goal: minimize}], budget: {trials: 1}}\n");
  expect_refusal(f, (char *[]){"ask", "typo", "--storage", f->db, NULL}, 0, "0 ");
  expect_refusal(f, (char *[]){"tell", "typo", "0", "--complete", "los=0.5", "--storage", f->db, NULL}, 1,
                 "trial 0 of 'typo' has not reported objective 'loss' (given: 'los'; did you mean "
                 "'loss'?); report it, or end the trial as failed; nothing was stored");
  expect_refusal(f, (char *[]){"tell", "typo", "0", "--complete", "acc=0.5", "--storage", f->db, NULL}, 1,
                 "trial 0 of 'typo' has not reported objective 'loss'; report it");
  expect_refusal(f, (char *[]){"tell", "typo", "0", "--complete", "loss=0.5", "--storage", f->db, NULL}, 0, "");
  free(spec);
}

/* Before a trial is on the front, an objective without a threshold has no reference point
 * yet: JSON leaves it out, and `nas pareto` and `nas compare` said "b=0", a point nothing
 * had inferred. */
static void pareto_says_which_reference_point_is_not_inferred_yet(void **state) {
  fixture *f = *state;
  static const char rest[] = "parameters: {x: {type: float, low: 0, high: 1}}\n"
                             "objectives: [{name: a, goal: minimize, threshold: 2}, {name: b, goal: minimize}]\n"
                             "budget: {trials: 2}\n";
  char *text = nas_asprintf("name: early\n%s", rest), *spec = create_spec(f, "early.yaml", text);
  char *other_text = nas_asprintf("name: other\n%s", rest);
  char *other = create_spec(f, "other.yaml", other_text);
  expect_refusal(f, (char *[]){"compare", "early", "other", "--storage", f->db, NULL}, 0,
                 "reference point: a=2, b=?; ? is inferred once a trial is on the front\n");
  const char *said = "early: 0 trials on the front; hypervolume 0 (reference point a=2, b=?; "
                     "? is inferred once a trial is on the front)";
  expect_refusal(f, (char *[]){"pareto", "early", "--storage", f->db, NULL}, 0, said);
  expect_refusal(f, (char *[]){"pareto", "early", "--format", "csv", "--storage", f->db, NULL}, 0, said);
  json_t *front = nas_json(f, (char *[]){"pareto", "early", "--format", "json", "--storage", f->db, NULL});
  assert_null(json_object_get(json_object_get(front, "reference_point"), "b"));
  json_decref(front);
  ask_and_tell(f, "early", 1, (char *[]){"a=1", "b=3", NULL});
  expect_refusal(f, (char *[]){"pareto", "early", "--storage", f->db, NULL}, 0,
                 "(reference point a=2, b=3)\n");
  free(text), free(spec), free(other_text), free(other);
}

/* An experiment whose thresholds no trial reaches has an empty front, yet compared with
 * one without thresholds (the common point then inferred) it was given the hypervolume of
 * trials its front leaves out: "0 on the front, hypervolume 0.57". */
static void compare_measures_only_the_trials_on_each_front(void **state) {
  fixture *f = *state;
  static const char rest[] = "parameters: {x: {type: float, low: 0, high: 1}}\n"
                             "budget: {trials: 2}\n";
  char *strict_text = nas_asprintf("name: strict\n%sobjectives: [{name: a, goal: minimize, "
                                   "threshold: -5}, {name: b, goal: minimize}]\n", rest);
  char *free_text = nas_asprintf("name: loose\n%sobjectives: [{name: a, goal: minimize}, "
                                 "{name: b, goal: minimize}]\n", rest);
  char *strict = create_spec(f, "strict.yaml", strict_text), *loose = create_spec(f, "loose.yaml", free_text);
  ask_and_tell(f, "strict", 2, (char *[]){"a=1", "b=2", NULL});
  ask_and_tell(f, "loose", 1, (char *[]){"a=2", "b=1", NULL});
  json_t *both = nas_json(f, (char *[]){"compare", "strict", "loose", "--format", "json", "--storage", f->db, NULL});
  json_t *first = json_array_get(json_object_get(both, "experiments"), 0);
  assert_string_equal(json_string_value(json_object_get(first, "experiment")), "strict");
  assert_int_equal(num(first, "front_size"), 0);
  if (num(first, "hypervolume") != 0) fail_msg("an empty front measured %g", num(first, "hypervolume"));
  assert_true(num(json_array_get(json_object_get(both, "experiments"), 1), "hypervolume") > 0);
  json_decref(both);
  free(strict_text), free(free_text), free(strict), free(loose);
}

/* Completed trials and an empty front: `nas pareto` and `nas status` said "0 trials on the
 * front" and no more, as if nothing had completed, when no trial met the constraints or
 * every one was past an objective's threshold (the worst value worth having). */
static void an_empty_front_of_completed_trials_says_why(void **state) {
  fixture *f = *state;
  char *spec = create_spec(f, "far.yaml",
                           "name: far\n"
                           "parameters: {x: {type: float, low: 0, high: 1}}\n"
                           "objectives: [{name: a, goal: minimize, threshold: -5}, {name: b, goal: maximize}]\n"
                           "constraints: ['lat <= 5']\n"
                           "budget: {trials: 4}\n");
  ask_and_tell(f, "far", 1, (char *[]){"a=1", "b=2", "lat=10", NULL});
  const char *infeasible = "(1 trial completed; none meets every constraint)";
  expect_refusal(f, (char *[]){"pareto", "far", "--storage", f->db, NULL}, 0, infeasible);
  expect_refusal(f, (char *[]){"status", "far", "--storage", f->db, NULL}, 0, infeasible);
  ask_and_tell(f, "far", 1, (char *[]){"a=1", "b=2", "lat=1", NULL});
  const char *past = "(2 trials completed; none of those that meet every constraint is within "
                     "the objectives' thresholds: a <= -5)";
  expect_refusal(f, (char *[]){"pareto", "far", "--storage", f->db, NULL}, 0, past);
  expect_refusal(f, (char *[]){"pareto", "far", "--format", "csv", "--storage", f->db, NULL}, 0, past);
  expect_refusal(f, (char *[]){"status", "far", "--storage", f->db, NULL}, 0, past);
  free(spec);
}

/* A constraint on a metric no trial reports (a typo: latncy_ms) made every trial
 * infeasible without a word: the run ended with "front 0, HV 0" and nothing else. */
static void a_run_whose_front_is_empty_says_which_constraint_no_trial_reported(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "typo.yaml",
                          "name: typo\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "constraints: ['latncy_ms <= 5']\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}, \\\"latency_ms\\\": 1}}\"']}\n"
                          "budget: {trials: 2}\n");
  const char *why = "2 trials completed; none meets every constraint: no trial reported "
                    "'latncy_ms' (did you mean 'latency_ms'?), which 'latncy_ms <= 5' needs";
  char *said = nas_asprintf("nas: typo: the front is empty: %s\n", why);
  expect_refusal(f, (char *[]){"run", spec, "--no-progress", "--storage", f->db, NULL}, 0, said);
  expect_refusal(f, (char *[]){"pareto", "typo", "--storage", f->db, NULL}, 0, why);
  free(said);
  free(spec);
}

/* A trial may report metrics besides the spec's objectives, named as it likes: one named
 * like a parameter ("x") or a listing's own column ("error", "trial") took that key of a
 * `nas trials --format json` row, hiding the parameter's value, the error or the trial's
 * number, and the table and CSV had two columns of one name. */
static void a_metric_named_like_a_column_is_listed_beside_it(void **state) {
  fixture *f = *state;
  char *spec = create_spec(f, "extra.yaml", "{name: extra, parameters: {x: {type: float, low: 0, high: 1}},\n"
                                            " objectives: [{name: y, goal: minimize}], budget: {trials: 1}}\n");
  ask_and_tell(f, "extra", 1, (char *[]){"y=0.3", "x=5", "error=0.5", "trial=9", NULL});
  json_t *rows = nas_json(f, (char *[]){"trials", "extra", "--format", "json", "--storage", f->db, NULL});
  const json_t *row = json_array_get(rows, 0);
  assert_int_equal(num(row, "trial"), 0);
  assert_true(num(row, "x") >= 0 && num(row, "x") <= 1);
  assert_true(json_is_null(json_object_get(row, "error")));
  assert_true(num(row, "x (metric)") == 5 && num(row, "error (metric)") == 0.5 && num(row, "trial (metric)") == 9);
  expect_refusal(f, (char *[]){"trials", "extra", "--format", "csv", "--storage", f->db, NULL}, 0,
                 "trial,status,x,y,error (metric),trial (metric),x (metric),error\n");
  json_decref(rows);
  free(spec);
}

/* Readings of ±1.7e308 span more than the largest double: the inferred reference point
 * came out inf, which a trial's stored reference (JSON) cannot hold, and `nas ask` failed
 * with "out of memory" after storing the first of its trials. */
static void ask_goes_on_after_readings_spanning_more_than_the_largest_double(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "span.yaml",
                          "name: span\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: a, goal: minimize}, {name: b, goal: minimize}]\n"
                          "budget: {trials: 10}\n"
                          "optimizer: {type: gp, n_initial: 2}\n"
                          "enqueue: [{x: 0.1}, {x: 0.4}, {x: 0.7}]\n");
  expect_refusal(f, (char *[]){"create", spec, "--storage", f->db, NULL}, 0, "is ready");
  expect_refusal(f, (char *[]){"ask", "span", "-n", "3", "--storage", f->db, NULL}, 0, "0.7");
  expect_refusal(f, (char *[]){"tell", "span", "0", "--complete", "a=1.7e308", "b=1", "--storage", f->db, NULL}, 0, "");
  expect_refusal(f, (char *[]){"tell", "span", "1", "--complete", "a=-1.7e308", "b=2", "--storage", f->db, NULL}, 0, "");
  expect_refusal(f, (char *[]){"tell", "span", "2", "--complete", "a=-1.7e308", "b=3", "--storage", f->db, NULL}, 0, "");
  json_t *asked = nas_json(f, (char *[]){"ask", "span", "-n", "2", "--format", "json", "--storage", f->db, NULL});
  assert_int_equal(json_array_size(asked), 2);
  json_decref(asked);
  json_t *rows = trials_json(f, "span");
  assert_true(num(json_object_get(row_of(rows, 4), "reference"), "a") <= DBL_MAX);
  json_decref(rows);
  free(spec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(trial_shows_everything_about_one_trial, setup, teardown),
      cmocka_unit_test_setup_teardown(a_huge_log_is_shown_by_its_tail_alone, setup, teardown),
      cmocka_unit_test_setup_teardown(a_log_that_is_not_a_file_is_refused_not_waited_on, setup, teardown),
      cmocka_unit_test_setup_teardown(logs_follow_a_running_trial_through_a_truncation_to_its_end, setup, teardown),
      cmocka_unit_test_setup_teardown(logs_follow_ends_cleanly_on_ctrl_c, setup, teardown),
      cmocka_unit_test_setup_teardown(export_then_import_into_another_storage_keeps_what_listings_show, setup, teardown),
      cmocka_unit_test_setup_teardown(rungs_are_shown_and_kept_by_export_then_import, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_import_files_are_refused_before_anything_is_stored, setup, teardown),
      cmocka_unit_test_setup_teardown(compare_with_itself_gives_the_pareto_hypervolume, setup, teardown),
      cmocka_unit_test_setup_teardown(compare_measures_only_the_trials_on_each_front, setup, teardown),
      cmocka_unit_test_setup_teardown(pareto_model_shows_the_front_of_the_posterior_means, setup, teardown),
      cmocka_unit_test_setup_teardown(pareto_model_in_csv_is_one_table, setup, teardown),
      cmocka_unit_test_setup_teardown(ask_prints_only_json_when_no_trial_meets_the_constraints, setup, teardown),
      cmocka_unit_test_setup_teardown(tell_takes_decimal_numbers_as_typed, setup, teardown),
      cmocka_unit_test_setup_teardown(logs_of_an_asked_trial_say_it_runs_outside_nas, setup, teardown),
      cmocka_unit_test_setup_teardown(ask_and_tell_finishes_when_its_budget_is_spent_and_reopens_for_more,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(ask_goes_on_after_readings_told_with_a_standard_error_of_zero, setup, teardown),
      cmocka_unit_test_setup_teardown(ask_goes_on_after_readings_spanning_more_than_the_largest_double, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_new_storage_file_keeps_others_out_and_a_plot_file_takes_the_umask,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_hypervolume_past_the_largest_double_is_null_in_json_and_inf_in_tables,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(pareto_says_which_reference_point_is_not_inferred_yet, setup, teardown),
      cmocka_unit_test_setup_teardown(an_empty_front_of_completed_trials_says_why, setup, teardown),
      cmocka_unit_test_setup_teardown(a_run_whose_front_is_empty_says_which_constraint_no_trial_reported, setup, teardown),
      cmocka_unit_test_setup_teardown(complete_without_an_objective_names_the_likely_misspelling, setup, teardown),
      cmocka_unit_test_setup_teardown(new_commands_have_help_and_refuse_bad_usage, setup, teardown),
      cmocka_unit_test_setup_teardown(an_option_another_command_takes_is_unknown_by_its_own_name, setup, teardown),
      cmocka_unit_test_setup_teardown(an_unknown_letter_in_a_group_is_named_itself, setup, teardown),
      cmocka_unit_test_setup_teardown(status_and_report_suggest_the_experiment_a_typo_meant, setup, teardown),
      cmocka_unit_test_setup_teardown(hints_carry_the_storage_when_it_is_not_the_default, setup, teardown),
      cmocka_unit_test_setup_teardown(tell_refuses_an_empty_step_or_trial_number_as_the_others_do, setup, teardown),
      cmocka_unit_test_setup_teardown(tell_refuses_values_with_fail, setup, teardown),
      cmocka_unit_test_setup_teardown(tell_with_an_attempt_ends_only_that_attempt, setup, teardown),
      cmocka_unit_test_setup_teardown(report_and_tell_check_values_as_a_metric_line_does, setup, teardown),
      cmocka_unit_test_setup_teardown(report_and_tell_take_only_decimal_numbers, setup, teardown),
      cmocka_unit_test_setup_teardown(a_metric_named_like_a_column_is_listed_beside_it, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
