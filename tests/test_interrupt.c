/* A long suggestion never holds a scheduler hostage: the GP's fitting and acquisition
 * search ask the optimizer's watch as they go, give up with NAS_ECANCELED when it says
 * stop, and `nas run` answers SIGINT within a second even while one suggestion would take
 * many seconds. */
#include <sys/wait.h>

#include "common/common.h"
#include "optimizer/optimizer.h"
#include "tests/e2e.h"

/* Three objectives over six floats, a batch of four picks with pending trials, and the
 * acquisition options at their caps: one suggestion takes about 25 s on a 2-core machine. */
static const char slow_gp_spec[] =
    "name: slowgp\n"
    "seed: 3\n"
    "parameters:\n"
    "  a: {type: float, low: 0, high: 1}\n"
    "  b: {type: float, low: 0, high: 1}\n"
    "  c: {type: float, low: 0, high: 1}\n"
    "  d: {type: float, low: 0, high: 1}\n"
    "  e: {type: float, low: 0, high: 1}\n"
    "  f: {type: float, low: 0, high: 1}\n"
    "objectives: [{name: y, goal: minimize}, {name: z, goal: minimize}, {name: w, goal: minimize}]\n"
    "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {a}, \\\"z\\\": {b}, \\\"w\\\": {c}}}\"']}\n"
    "optimizer: {type: gp, n_initial: 4, raw_samples: 8192, restarts: 64, mc_samples: 1024}\n"
    "budget: {trials: 12, parallel: 8}\n";

typedef struct {
  int calls;
  int stop_after; /* answer stop from this call on; 0: never */
} counting_watch;

static bool count_and_judge(void *ctx) {
  counting_watch *w = ctx;
  w->calls++;
  return w->stop_after > 0 && w->calls >= w->stop_after;
}

/* Suggests one point after three observations with the given watch; returns the code. */
static int suggest_watched(counting_watch *w, json_t **out) {
  spec *s;
  optimizer *opt;
  nas_err err;
  if (spec_parse(slow_gp_spec, "<test>", "/tmp", &s, &err) != NAS_OK) fail_msg("%s", err.msg);
  /* Quick options: this checks the protocol, not the speed. */
  json_object_set_new(s->optimizer.options, "raw_samples", json_integer(64));
  json_object_set_new(s->optimizer.options, "restarts", json_integer(2));
  json_object_set_new(s->optimizer.options, "n_initial", json_integer(2));
  assert_int_equal(optimizer_create(s, &opt, &err), NAS_OK);
  optimizer_set_watch(opt, (optimizer_watch){.cancelled = count_and_judge, .ctx = w});
  json_t *params[3];
  double values[3][3] = {{0.2, 0.8, 0.5}, {0.5, 0.5, 0.1}, {0.9, 0.1, 0.7}};
  observation obs[3];
  for (int i = 0; i < 3; i++) {
    params[i] = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "a", values[i][0], "b",
                          values[i][1], "c", values[i][2], "d", 0.5, "e", 0.5, "f", 0.5);
    obs[i] = (observation){.params = params[i], .objectives = values[i]};
  }
  int rc = optimizer_suggest(opt, obs, 3, NULL, 0, 1, 3, out, NULL, &err);
  for (int i = 0; i < 3; i++) json_decref(params[i]);
  optimizer_free(opt);
  spec_free(s);
  return rc;
}

static void suggestion_asks_its_watch_and_gives_up_when_told(void **state) {
  (void)state;
  json_t *out[1];
  counting_watch never = {0};
  assert_int_equal(suggest_watched(&never, out), NAS_OK);
  assert_true(never.calls > 10);
  json_decref(out[0]);
  /* Told to stop part-way through the acquisition search, and at the very start. */
  for (int stop_after = never.calls / 2; stop_after >= 1; stop_after = stop_after > 1 ? 1 : 0) {
    counting_watch soon = {.stop_after = stop_after};
    assert_int_equal(suggest_watched(&soon, out), NAS_ECANCELED);
    assert_null(out[0]);
    assert_int_equal(soon.calls, stop_after); /* sticky: never asked again once it said stop */
  }
}

static void sigint_during_a_long_suggestion_ends_the_run_at_once(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "slowgp.yaml", slow_gp_spec);
  pid_t pid = start_nas_run(f, spec);
  /* The design trials end within a second; then the first GP suggestion starts. */
  nas_sleep(3);
  double signalled = nas_now();
  kill(pid, SIGINT);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  double took = nas_now() - signalled;
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 3);
  if (took > 1.5) fail_msg("nas run took %.1f s to answer SIGINT", took);
  json_t *rows = trials_json(f, "slowgp");
  assert_int_equal(json_array_size(rows), 8); /* the design, and nothing of the suggestion */
  json_decref(rows);
  free(spec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(suggestion_asks_its_watch_and_gives_up_when_told),
      cmocka_unit_test_setup_teardown(sigint_during_a_long_suggestion_ends_the_run_at_once, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
