/* The run as seen from a terminal (issue "Managing experiments as users expect"): the
 * progress line counts ended trials and shows elapsed time and an ETA; trials stopped by
 * the wall-time budget say so; `nas stop` says what it did and leaves a finished
 * experiment finished; printed hints carry the --storage they need; `nas help CMD`, a
 * missing option value and a mistyped experiment name are answered helpfully; a seed gives
 * the same initial design whatever `parallel` is. The real bin/nas throughout. */
#include <pty.h>
#include <sys/wait.h>

#include "common/common.h"
#include "tests/e2e.h"

static const char sleepy_spec[] =
    "name: sleepy\n"
    "parameters: {x: {type: float, low: 0, high: 1}}\n"
    "objectives: [{name: y, goal: minimize}]\n"
    "trial: {command: [sleep, '30']}\n"
    "budget: {trials: 4, parallel: 2, wall_time: 1}\n"
    "runner: {type: local, kill_grace: 1}\n";

static const char quick_spec[] =
    "name: quick\n"
    "parameters: {x: {type: float, low: 0, high: 1}}\n"
    "objectives: [{name: y, goal: minimize}]\n"
    "trial: {command: [sh, -c, 'sleep 0.3; echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
    "optimizer: {type: random}\n"
    "budget: {trials: 4, parallel: 2}\n";

static void wall_time_stops_trials_and_says_so(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "sleepy.yaml", sleepy_spec);
  run_spec(f, spec);
  json_t *rows = trials_json(f, "sleepy");
  assert_int_equal(count_status(rows, "stopped"), 2);
  const char *error = json_string_value(json_object_get(json_array_get(rows, 0), "error"));
  if (!error || !strstr(error, "wall-time budget")) fail_msg("trial 0 says: %s", error ? error : "(null)");
  json_decref(rows);
  free(spec);
}

static void nas_stop_says_what_it_did_and_leaves_a_finished_experiment_finished(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "quick.yaml", quick_spec), *out;
  run_spec(f, spec);
  assert_int_equal(nas(f, &out, "stop", "quick", NULL), 0);
  assert_non_null(strstr(out, "finished already"));
  free(out);
  assert_int_equal(nas(f, &out, "status", "quick", "--format=json"), 0);
  assert_non_null(strstr(out, "\"finished\""));
  free(out);
  free(spec);
}

static void hints_carry_the_storage_they_need(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "sleepy.yaml", sleepy_spec), *out;
  assert_int_equal(nas(f, &out, "stop", "sleepy", NULL), 1); /* no database yet */
  free(out);
  pid_t pid = start_nas_run(f, spec);
  wait_until_running(f, "sleepy"); /* a fixed 0.4 s was too short under load: nothing stored */
  kill(pid, SIGINT);
  waitpid(pid, NULL, 0);
  /* `nas stop` prints the same hint as an interrupted run; f->db is not the default. */
  assert_int_equal(nas(f, &out, "stop", "sleepy", NULL), 0);
  char *want = nas_asprintf("nas resume sleepy --storage %s", f->db);
  if (!strstr(out, want)) fail_msg("no '%s' in: %s", want, out);
  free(want), free(out), free(spec);
}

static void help_missing_values_and_typos_are_answered(void **state) {
  fixture *f = *state;
  char *a, *b;
  const char *help[] = {test_nas_bin(), "help", "run", NULL}, *dash[] = {test_nas_bin(), "run", "--help", NULL};
  assert_int_equal(test_run(f->dir, (char *const *)help, &a), 0);
  assert_int_equal(test_run(f->dir, (char *const *)dash, &b), 0);
  assert_string_equal(a, b);
  free(a), free(b);
  /* `nas help --help` is help about help: the command list, as `nas --help` */
  const char *help_help[] = {test_nas_bin(), "help", "--help", NULL},
             *top[] = {test_nas_bin(), "--help", NULL};
  assert_int_equal(test_run(f->dir, (char *const *)help_help, &a), 0);
  assert_int_equal(test_run(f->dir, (char *const *)top, &b), 0);
  assert_string_equal(a, b);
  free(a), free(b);
  const char *missing[] = {test_nas_bin(), "trials", "quick", "--format", NULL};
  assert_int_equal(test_run(f->dir, (char *const *)missing, &a), 2);
  assert_non_null(strstr(a, "option '--format' needs a value"));
  free(a);
  char *spec = test_write(f->dir, "quick.yaml", quick_spec);
  assert_int_equal(nas(f, &a, "run", spec, "--no-progress"), 0);
  free(a);
  assert_int_equal(nas(f, &a, "pareto", "quikc", NULL), 1);
  assert_non_null(strstr(a, "did you mean 'quick'?"));
  free(a), free(spec);
}

/* `nas ARGS… --storage DB` on a terminal of its own in the fixture's folder, its user
 * typing `typed` (NULL: nothing; the terminal holds it until nas reads); all the terminal
 * showed until nas ended (owned). */
static char *nas_on_terminal(fixture *f, char *const *args, const char *typed) {
  char *argv[16] = {(char *)test_nas_bin()};
  size_t n = 1;
  while (*args && n < 13) argv[n++] = *args++;
  argv[n++] = "--storage", argv[n++] = f->db, argv[n] = NULL;
  int master;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  assert_true(pid >= 0);
  if (pid == 0) {
    if (chdir(f->dir) != 0) _exit(126);
    execv(argv[0], argv);
    _exit(127);
  }
  if (typed) assert_true(write(master, typed, strlen(typed)) == (ssize_t)strlen(typed));
  size_t cap = 65536, len = 0;
  char *screen = malloc(cap);
  assert_non_null(screen);
  ssize_t got;
  while (len < cap - 1 && (got = read(master, screen + len, cap - 1 - len)) > 0) len += (size_t)got;
  screen[len] = '\0';
  waitpid(pid, NULL, 0);
  close(master);
  return screen;
}

static void progress_line_shows_ended_counts_elapsed_and_eta(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "quick.yaml", quick_spec);
  char *screen = nas_on_terminal(f, (char *[]){"run", spec, NULL}, NULL);
  if (!strstr(screen, "4 of 4 ended") || !strstr(screen, ", ETA ") || !strstr(screen, "2 of 4 ended"))
    fail_msg("progress line: %s", screen);
  free(screen), free(spec);
}

/* `nas delete name` on a terminal whose user types answer; what the terminal showed
 * (owned). */
static char *delete_answering(fixture *f, const char *name, const char *answer) {
  char *typed = nas_asprintf("%s\n", answer);
  char *screen = nas_on_terminal(f, (char *[]){"delete", (char *)name, NULL}, typed);
  free(typed);
  return screen;
}

/* docs/cli.md, nas delete: the question takes y or yes in any case (Y, YES were read as
 * no); anything else deletes nothing. */
static void delete_takes_yes_in_any_case_and_nothing_else(void **state) {
  fixture *f = *state;
  static const struct {
    const char *answer;
    bool deletes;
  } cases[] = {{"y", true}, {"Y", true}, {"yes", true}, {"YES", true}, {"Yes", true},
               {"", false}, {"n", false}, {"NO", false}, {"yess", false}, {"y es", false}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *text = nas_asprintf("name: gone%zu\n"
                              "parameters: {x: {type: float, low: 0, high: 1}}\n"
                              "objectives: [{name: y, goal: minimize}]\n"
                              "budget: {trials: 1}\n", i);
    char *file = nas_asprintf("gone%zu.yaml", i), *name = nas_asprintf("gone%zu", i), *out;
    char *spec = test_write(f->dir, file, text);
    nas_ok(f, "create", spec, NULL);
    char *screen = delete_answering(f, name, cases[i].answer);
    if (!strstr(screen, "[y/N]")) fail_msg("no question on the terminal: %s", screen);
    int rc = nas(f, &out, "status", name, NULL);
    if ((rc == 1) != cases[i].deletes)
      fail_msg("answering '%s': nas status %s exited %d: %s\n(the terminal: %s)", cases[i].answer,
               name, rc, out, screen);
    free(out), free(screen), free(spec), free(name), free(file), free(text);
  }
}

/* The trials' parameters in number order, as one text. */
static char *params_of(fixture *f, const char *name) {
  json_t *rows = trials_json(f, name);
  char *text = strdup("");
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    char *next = nas_asprintf("%s%.17g/%lld;", text, json_number_value(json_object_get(row, "x")),
                              (long long)json_integer_value(json_object_get(row, "k")));
    free(text);
    text = next;
  }
  json_decref(rows);
  return text;
}

static void seed_gives_the_same_initial_design_whatever_parallel(void **state) {
  fixture *f = *state;
  char *designs[2];
  for (int p = 0; p < 2; p++) {
    char *text = nas_asprintf("name: design%d\nseed: 11\n"
                              "parameters: {x: {type: float, low: 0, high: 1}, k: {type: int, low: 1, high: 9}}\n"
                              "objectives: [{name: y, goal: minimize}]\n"
                              "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                              "optimizer: {type: gp, n_initial: 5}\n"
                              "budget: {trials: 5, parallel: %d}\n", p, p ? 4 : 1);
    char *spec = test_write(f->dir, "design.yaml", text), *out, name[32];
    assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 0);
    free(out), free(spec), free(text);
    snprintf(name, sizeof name, "design%d", p);
    designs[p] = params_of(f, name);
  }
  assert_string_equal(designs[0], designs[1]);
  free(designs[0]), free(designs[1]);
}

/* A string a client stored (a --fail message or an HTTP client's "error", a metric's name
 * from a report, a --worker) reached the terminal as it came: a newline started a false
 * row of `nas trials` and a false line of `nas trial`, an escape sequence drove the
 * terminal, a right-to-left override showed the rest of the row reversed and a C1 control
 * (U+009B, an 8-bit CSI) began a sequence too. The table and text views show each control
 * character escaped; JSON and CSV keep the text exact. */
static void control_characters_stored_by_clients_are_shown_escaped(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "told.yaml",
                          "name: told\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "budget: {trials: 2}\n"), *out;
  nas_ok(f, "create", spec, NULL);
  char *const steps[][8] = {
      {"ask", "told", "--worker", "w\x1b]0;title\x07", NULL},
      {"tell", "told", "0", "--fail", "bad\nfake row\x1b[31mred\xe2\x80\xae" "ever\xc2\x9b" "2J", NULL},
      {"ask", "told", NULL},
      {"tell", "told", "1", "l\x1b[2Jz=1", NULL},
  };
  for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
    char *argv[12] = {(char *)test_nas_bin()};
    size_t n = 1;
    for (size_t k = 0; steps[i][k]; k++) argv[n++] = steps[i][k];
    argv[n++] = "--storage", argv[n++] = f->db, argv[n] = NULL;
    if (test_run(f->dir, argv, &out) != 0) fail_msg("nas %s: %s", argv[1], out);
    free(out);
  }
  const char *failed = "bad\\nfake row\\x1b[31mred\\u202eever\\u009b2J";
  const char *shown[][2] = {{"trials", failed}, {"trials", "l\\x1b[2Jz"}, {"trial", failed},
                            {"trial", "ask:w\\x1b]0;title\\x07"}};
  for (size_t i = 0; i < sizeof shown / sizeof *shown; i++) {
    bool one = strcmp(shown[i][0], "trial") == 0;
    char *argv[] = {(char *)test_nas_bin(), (char *)shown[i][0], "told", one ? "0" : "--storage",
                    one ? "--storage" : f->db, one ? f->db : NULL, NULL};
    assert_int_equal(test_run(f->dir, argv, &out), 0);
    if (!strstr(out, shown[i][1]) || strchr(out, '\x1b') || strstr(out, "\nfake row") ||
        strstr(out, "\xe2\x80\xae") || strstr(out, "\xc2\x9b"))
      fail_msg("nas %s told: wanted '%s' and no control character: %s", shown[i][0], shown[i][1], out);
    free(out);
  }
  json_t *rows = trials_json(f, "told"); /* exact in JSON */
  assert_string_equal(json_string_value(json_object_get(json_array_get(rows, 0), "error")),
                      "bad\nfake row\x1b[31mred\xe2\x80\xae" "ever\xc2\x9b" "2J");
  assert_non_null(json_object_get(json_array_get(rows, 1), "l\x1b[2Jz"));
  json_decref(rows);
  free(spec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(wall_time_stops_trials_and_says_so, setup, teardown),
      cmocka_unit_test_setup_teardown(nas_stop_says_what_it_did_and_leaves_a_finished_experiment_finished, setup, teardown),
      cmocka_unit_test_setup_teardown(hints_carry_the_storage_they_need, setup, teardown),
      cmocka_unit_test_setup_teardown(help_missing_values_and_typos_are_answered, setup, teardown),
      cmocka_unit_test_setup_teardown(progress_line_shows_ended_counts_elapsed_and_eta, setup, teardown),
      cmocka_unit_test_setup_teardown(delete_takes_yes_in_any_case_and_nothing_else, setup, teardown),
      cmocka_unit_test_setup_teardown(seed_gives_the_same_initial_design_whatever_parallel, setup, teardown),
      cmocka_unit_test_setup_teardown(control_characters_stored_by_clients_are_shown_escaped, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
