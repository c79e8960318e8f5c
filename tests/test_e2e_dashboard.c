/* End-to-end: the dashboard in a real browser. Runs small experiments with the real bin/nas,
 * starts `nas serve`, loads its pages in Debian's headless Chromium and checks what they
 * drew (the data-* attributes the page's script sets after drawing) against the CLI: the
 * front has `nas pareto`'s points, the table every trial, a trial page its parameters,
 * the comparison `nas compare`'s fronts; and a `nas plot` file draws the same from disk. A
 * live page held open (scripts/browser.py) lives through its server killed and restarted.
 * Screenshots of each page are left in dashboard-screenshots/ beside this test's binary
 * (the path is printed) for a person to look at. Skipped, saying so, without chromium. */
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/common.h"
#include "tests/dashboard.h"
#include "tests/e2e.h"
#include "serve/serve.h"
#include "tests/serve.h"

/* Where screenshots go (set by main from argv[0]). */
static char screenshot_dir[4096];

/* Two objectives, trials that report y at steps 0-3 (a learning curve), and fail when
 * x > 0.85. Early stopping may stop some: the page must mark as many as are stopped. */
static char *dashboard_spec(fixture *f, const char *name, int seed) {
  char *text, *file;
  assert_true(asprintf(&text,
                       "name: %s\n"
                       "seed: %d\n"
                       "parameters:\n"
                       "  x: {type: float, low: 0, high: 1}\n"
                       "  act: {type: categorical, choices: [relu, tanh]}\n"
                       "objectives: [{name: y, goal: minimize}, {name: z, goal: minimize}]\n"
                       "trial:\n"
                       "  command: [sh, -c, 'echo out-{x}; for s in 0 1 2 3; do echo \"nas-metric "
                       "{{\\\"step\\\": $s, \\\"y\\\": $(awk \"BEGIN {{ print {x} + 1/($s+1) }}\")}}\"; done; "
                       "awk \"BEGIN {{ exit !({x} > 0.85) }}\" && exit 3; "
                       "echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": $(awk \"BEGIN {{ print 1 - sqrt({x}) + "
                       "0.15 * sin(17 * {x})^2 }}\")}}\"']\n"
                       "budget: {trials: 14, parallel: 3, max_failure_rate: 1}\n"
                       "early_stopping: {rule: median, objectives: [y], min_steps: 1, min_trials: 3}\n"
                       "optimizer: {type: random}\n",
                       name, seed) > 0);
  assert_true(asprintf(&file, "%s.yaml", name) > 0);
  char *path = test_write(f->dir, file, text);
  free(text), free(file);
  return path;
}

/* ---- the browser ------------------------------------------------------------------------ */

static bool have_chromium(void) {
  char *argv[] = {"sh", "-c", "command -v chromium", NULL}, *out;
  int rc = test_run(NULL, argv, &out);
  free(out);
  return rc == 0;
}

/* The DOM of url once its scripts have run (the page's own time, not the wall clock's). */
static char *dump_dom(fixture *f, const char *url) {
  char *profile = nas_asprintf("--user-data-dir=%s/chromium", f->dir), *out;
  char *argv[] = {"timeout", "90", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                  "--no-first-run", profile, "--virtual-time-budget=8000", "--dump-dom",
                  (char *)url, NULL};
  int rc = test_run(NULL, argv, &out);
  if (rc != 0) fail_msg("chromium --dump-dom %s exited %d: %s", url, rc, out);
  free(profile);
  return out;
}

/* Saves a screenshot of url as screenshot_dir/name.png and prints where. */
static void screenshot(fixture *f, const char *url, const char *name, int height) {
  char *profile = nas_asprintf("--user-data-dir=%s/chromium", f->dir);
  char *file = nas_asprintf("--screenshot=%s/%s.png", screenshot_dir, name);
  char *size = nas_asprintf("--window-size=1400,%d", height), *out;
  char *argv[] = {"timeout", "90", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                  "--no-first-run", "--hide-scrollbars", profile, "--virtual-time-budget=8000",
                  size, file, (char *)url, NULL};
  int rc = test_run(NULL, argv, &out);
  if (rc != 0) fail_msg("chromium --screenshot %s exited %d: %s", url, rc, out);
  printf("screenshot: %s/%s.png\n", screenshot_dir, name);
  free(profile), free(file), free(size), free(out);
}

/* The value of attribute attr of the element that has marker (e.g. `id="chart-front"`). */
static long dom_attr(const char *dom, const char *marker, const char *attr) {
  const char *at = strstr(dom, marker);
  if (!at) fail_msg("the page has no %s", marker);
  const char *open = at;
  while (open > dom && *open != '<') open--;
  const char *close = strchr(at, '>');
  char *key = nas_asprintf(" %s=\"", attr);
  const char *v = strstr(open, key);
  if (!v || v > close) fail_msg("%s has no %s", marker, attr);
  long value = strtol(v + strlen(key), NULL, 10);
  free(key);
  return value;
}

static size_t count_of(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *at = text; (at = strstr(at, needle)); at++) n++;
  return n;
}

/* Fails unless the page drew `page` (no error). */
static void expect_ready(const char *dom, const char *page) {
  char *ready = nas_asprintf("data-ready=\"%s\"", page);
  if (!strstr(dom, ready)) fail_msg("the page did not draw %s:\n%.3000s", page, dom);
  free(ready);
}

/* ---- tests --------------------------------------------------------------------------------- */

typedef struct {
  fixture *f;
  test_server srv;
} served;

static void serve_two(void **state, served *s) {
  s->f = *state;
  char *a = dashboard_spec(s->f, "dash", 1), *b = dashboard_spec(s->f, "dash2", 2);
  run_spec(s->f, a);
  run_spec(s->f, b);
  free(a), free(b);
  assert_true(test_server_start(&s->srv, s->f->dir, s->f->db, NULL));
}

static char *page_url(const served *s, const char *fragment) {
  return nas_asprintf("http://127.0.0.1:%d/%s", s->srv.port, fragment);
}

/* GET path's status, Content-Type and body (curl, no JSON). */
static char *http_raw(const test_server *srv, const char *path, int *code, char **type) {
  char *url = nas_asprintf("http://127.0.0.1:%d%s", srv->port, path), *out;
  char *argv[] = {"curl", "-s", "-S", "-w", "\n%{http_code} %{content_type}", url, NULL};
  assert_int_equal(test_run(NULL, argv, &out), 0);
  char *last = strrchr(out, '\n');
  assert_non_null(last);
  *last = '\0';
  *code = atoi(last + 1);
  *type = strdup(strchr(last + 1, ' ') + 1);
  free(url);
  return out;
}

static void dashboard_data_and_files_are_served_without_a_browser(void **state) {
  served s;
  serve_two(state, &s);
  json_t *pareto = nas_json(s.f, (char *[]){"pareto", "dash", "--storage", s.f->db, "--format", "json", NULL});
  json_t *trials = nas_json(s.f, (char *[]){"trials", "dash", "--storage", s.f->db, "--format", "json", NULL});
  check_dashboard_api(&s.srv, "dash", pareto, json_array_size(trials), "y");
  int code;
  char *type, *body = http_raw(&s.srv, "/", &code, &type);
  assert_int_equal(code, 200);
  assert_string_equal(type, "text/html; charset=utf-8");
  assert_non_null(strstr(body, "static/app.js"));
  free(body), free(type);
  body = http_raw(&s.srv, "/static/chart.js", &code, &type);
  assert_int_equal(code, 200);
  assert_non_null(strstr(body, "Chart.js v")); /* Debian's, built in */
  free(body), free(type);
  body = http_raw(&s.srv, "/static/nope.js", &code, &type);
  assert_int_equal(code, 404);
  free(body), free(type);
  json_decref(pareto), json_decref(trials);
  assert_int_equal(test_server_stop(&s.srv), 0);
}

static void experiment_page_draws_what_the_cli_reports(void **state) {
  if (!have_chromium()) skip();
  served s;
  serve_two(state, &s);
  json_t *pareto = nas_json(s.f, (char *[]){"pareto", "dash", "--storage", s.f->db, "--format", "json", NULL});
  json_t *trials = nas_json(s.f, (char *[]){"trials", "dash", "--storage", s.f->db, "--format", "json", NULL});
  size_t n_front = json_array_size(json_object_get(pareto, "front")), n_trials = json_array_size(trials);
  assert_true(n_front > 0);

  char *url = page_url(&s, "#/e/dash");
  char *dom = dump_dom(s.f, url);
  expect_ready(dom, "experiment");
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-front"), (long)n_front);
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-points"), (long)count_status(trials, "completed"));
  assert_int_equal(dom_attr(dom, "id=\"trials\"", "data-rows"), (long)n_trials);
  assert_int_equal(count_of(dom, "<tr data-trial="), n_trials);
  assert_int_equal(dom_attr(dom, "id=\"chart-curves\"", "data-curves"), (long)n_trials);
  assert_int_equal(dom_attr(dom, "id=\"chart-curves\"", "data-stopped"), (long)count_status(trials, "stopped"));
  assert_int_equal(dom_attr(dom, "id=\"chart-hypervolume\"", "data-points"), (long)count_status(trials, "completed"));
  assert_int_equal(dom_attr(dom, "id=\"chart-parallel\"", "data-points"), (long)count_status(trials, "completed"));
  screenshot(s.f, url, "experiment", 2300);
  free(dom), free(url);

  url = page_url(&s, "#/");
  dom = dump_dom(s.f, url);
  expect_ready(dom, "experiments");
  assert_non_null(strstr(dom, "data-experiment=\"dash\""));
  assert_non_null(strstr(dom, "data-experiment=\"dash2\""));
  /* No scheduler runs them: the list says so in the word of `nas status` and the
   * experiment's page, not a word of its own. */
  assert_int_equal(count_of(dom, "<span class=\"badge none\">none</span>"), 2);
  screenshot(s.f, url, "experiments", 500);
  free(dom), free(url);
  json_decref(pareto), json_decref(trials);
  assert_int_equal(test_server_stop(&s.srv), 0);
}

/* An experiment whose stored spec no longer loads (here written through the storage RPC)
 * is a row that says why; the page still lists the others. */
static void experiments_page_lists_one_whose_spec_no_longer_loads(void **state) {
  if (!have_chromium()) skip();
  served s;
  serve_two(state, &s);
  int code;
  json_t *made = test_http(&s.srv, "POST", "/api/v1/storage/experiment_create",
                           "{\"name\": \"broken\", \"spec_text\": \"name: broken\\nfoo: 1\\n\", "
                           "\"spec_path\": \"/nowhere/broken.yaml\", \"run_root\": \"/nowhere\"}",
                           NULL, &code);
  assert_int_equal(code, 200);
  json_decref(made);
  char *url = page_url(&s, "#/"), *dom = dump_dom(s.f, url);
  expect_ready(dom, "experiments");
  assert_int_equal(dom_attr(dom, "id=\"experiments\"", "data-rows"), 3);
  assert_non_null(strstr(dom, "data-experiment=\"dash2\""));
  assert_non_null(strstr(dom, "data-experiment=\"broken\" data-error"));
  assert_non_null(strstr(dom, "unknown key 'foo'"));
  screenshot(s.f, url, "experiments-unloadable", 500);
  free(dom), free(url);
  assert_int_equal(test_server_stop(&s.srv), 0);
}

static void trial_page_shows_its_parameters_metrics_and_logs(void **state) {
  if (!have_chromium()) skip();
  served s;
  serve_two(state, &s);
  json_t *t = nas_json(s.f, (char *[]){"trial", "dash", "2", "--storage", s.f->db, "--format", "json", NULL});
  const json_t *params = json_object_get(t, "params");
  char *url = page_url(&s, "#/e/dash/t/2");
  char *dom = dump_dom(s.f, url);
  expect_ready(dom, "trial");
  assert_int_equal(dom_attr(dom, "id=\"trial-params\"", "data-count"), (long)json_object_size(params));
  assert_non_null(strstr(dom, "<dt data-name=\"x\">x</dt>"));
  char *act = nas_asprintf("<dd>%s</dd>", json_string_value(json_object_get(params, "act")));
  assert_non_null(strstr(dom, act));
  assert_int_equal(dom_attr(dom, "id=\"trial-curve\"", "data-curves"), 1);
  assert_non_null(strstr(dom, "out-")); /* its stdout's tail */
  screenshot(s.f, url, "trial", 1100);
  free(act), free(dom), free(url);
  json_decref(t);

  url = page_url(&s, "#/e/dash/t/99");
  dom = dump_dom(s.f, url);
  expect_ready(dom, "error");
  assert_non_null(strstr(dom, "experiment 'dash' has no trial 99"));
  free(dom), free(url);
  /* A hand-made link with a malformed %-escape: an error shown, not "Loading…" for ever. */
  url = page_url(&s, "#/e/%zz");
  dom = dump_dom(s.f, url);
  expect_ready(dom, "error");
  assert_non_null(strstr(dom, "%zz"));
  free(dom), free(url);
  assert_int_equal(test_server_stop(&s.srv), 0);
}

static void compare_page_draws_nas_compare_fronts(void **state) {
  if (!have_chromium()) skip();
  served s;
  serve_two(state, &s);
  json_t *c = nas_json(s.f, (char *[]){"compare", "dash", "dash2", "--storage", s.f->db, "--format", "json", NULL});
  char *url = page_url(&s, "#/compare/dash,dash2");
  char *dom = dump_dom(s.f, url);
  expect_ready(dom, "compare");
  size_t i, total = 0;
  json_t *e;
  json_array_foreach(json_object_get(c, "experiments"), i, e) {
    char *marker = nas_asprintf("data-experiment=\"%s\"", json_string_value(json_object_get(e, "experiment")));
    assert_int_equal(dom_attr(dom, marker, "data-front"), (long)json_integer_value(json_object_get(e, "front_size")));
    total += (size_t)json_integer_value(json_object_get(e, "front_size"));
    free(marker);
  }
  assert_int_equal(dom_attr(dom, "id=\"chart-compare\"", "data-points"), (long)total);
  screenshot(s.f, url, "compare", 800);
  free(dom), free(url);
  json_decref(c);
  assert_int_equal(test_server_stop(&s.srv), 0);
}

/* With a token file the page is served to anyone but its data is not: without a token it
 * draws a form that asks for one; a token carried in the fragment (#…?token=T) is taken
 * into the tab's sessionStorage and the page draws; a refused one brings the form back,
 * saying so. The token never appears in the page. */
static void token_file_page_asks_for_a_token_and_draws_with_it(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  char *spec = dashboard_spec(f, "dash", 1);
  run_spec(f, spec);
  const char *reader = "r1d2a3s4h5b6o7a8r9d0t1o2k3e4n5x6y7z8";
  char *text = nas_asprintf("read %s\n", reader), *tokens = test_write(f->dir, "tokens", text);
  chmod(tokens, 0600);
  const char *extra[] = {"--token-file", tokens, NULL};
  served s = {.f = f};
  assert_true(test_server_start(&s.srv, f->dir, f->db, extra));
  int code;
  char *type, *body = http_raw(&s.srv, "/api/v1/experiments/dash/dashboard", &code, &type);
  assert_int_equal(code, 401);
  free(body), free(type);
  body = http_raw(&s.srv, "/", &code, &type);
  assert_int_equal(code, 200); /* the page itself holds no data */
  free(body), free(type);
  json_t *pareto = nas_json(f, (char *[]){"pareto", "dash", "--storage", f->db, "--format", "json", NULL});

  char *url = page_url(&s, "#/e/dash"), *dom = dump_dom(f, url);
  expect_ready(dom, "token");
  assert_non_null(strstr(dom, "id=\"token-form\""));
  assert_null(strstr(dom, "id=\"token-refused\""));
  screenshot(f, url, "token", 500);
  free(dom), free(url);

  url = page_url(&s, "#/e/dash?token=not-a-token-of-this-server-000000000");
  dom = dump_dom(f, url);
  expect_ready(dom, "token");
  assert_non_null(strstr(dom, "That token was refused."));
  free(dom), free(url);

  char *fragment = nas_asprintf("#/e/dash?token=%s", reader);
  url = page_url(&s, fragment);
  dom = dump_dom(f, url);
  expect_ready(dom, "experiment");
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-front"),
                   (long)json_array_size(json_object_get(pareto, "front")));
  assert_null(strstr(dom, reader));
  free(dom), free(url), free(fragment);
  json_decref(pareto);
  free(text), free(tokens), free(spec);
  assert_int_equal(test_server_stop(&s.srv), 0);
}

/* ---- a page that lives through a server restart ---------------------------------------- */

/* A page held open in Chromium by scripts/browser.py, which answers one line per command. */
typedef struct {
  pid_t pid;
  FILE *to, *from;
} browser;

static void browser_open(browser *b, fixture *f, const char *url) {
  int in[2], out[2];
  /* close-on-exec: a server started later must not hold the pipes (the script would never
   * see the end of its input) */
  assert_int_equal(pipe2(in, O_CLOEXEC), 0);
  assert_int_equal(pipe2(out, O_CLOEXEC), 0);
  char *profile = nas_asprintf("%s/chromium", f->dir);
  b->pid = fork();
  assert_true(b->pid >= 0);
  if (b->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* a test that fails half-way takes it along */
    dup2(in[0], 0), dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    execlp("python3", "python3", "scripts/browser.py", profile, url, (char *)NULL);
    _exit(127);
  }
  close(in[0]), close(out[1]);
  free(profile);
  b->to = fdopen(in[1], "w");
  b->from = fdopen(out[0], "r");
  assert_true(b->to && b->from);
}

/* Sends one command line; its answer (owned, without the newline). */
static char *browser_ask(browser *b, const char *command) {
  fprintf(b->to, "%s\n", command);
  fflush(b->to);
  char *line = NULL;
  size_t cap = 0;
  ssize_t len = getline(&line, &cap, b->from);
  if (len <= 0) fail_msg("scripts/browser.py gave no answer to: %s", command);
  line[strcspn(line, "\n")] = '\0';
  return line;
}

/* Waits up to seconds for the JavaScript expression to be truthy; its value as JSON. */
static char *browser_wait(browser *b, int seconds, const char *expression) {
  char *command = nas_asprintf("wait %d %s", seconds, expression);
  char *answer = browser_ask(b, command);
  if (strcmp(answer, "timeout") == 0) fail_msg("not within %d s: %s", seconds, expression);
  free(command);
  return answer;
}

static void browser_close(browser *b) {
  fclose(b->to);
  fclose(b->from);
  int status = 0;
  waitpid(b->pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* What the page's header says, once <body data-live> is state. */
static char *live_mark_once(browser *b, int seconds, const char *state) {
  char *expression = nas_asprintf("document.body.dataset.live === '%s' && "
                                  "document.getElementById('live').textContent", state);
  char *mark = browser_wait(b, seconds, expression);
  free(expression);
  return mark;
}

/* The front's points on the page, once it shows `points`. */
static void wait_front_points(browser *b, int seconds, int points) {
  char *expression = nas_asprintf("document.body.dataset.ready === 'experiment' && "
                                  "document.getElementById('chart-front').dataset.points === '%d'",
                                  points);
  free(browser_wait(b, seconds, expression));
  free(expression);
}

/* Waits for the page to retry, its header saying `says`, with its front of `points` still
 * drawn; saves it as screenshot_dir/NAME.png. The header's text (owned). */
static char *expect_retrying(browser *b, const char *says, int points, const char *name) {
  char *mark = live_mark_once(b, 20, "retrying");
  if (!strstr(mark, says)) fail_msg("the page says %s", mark);
  wait_front_points(b, 1, points);
  char *shot = nas_asprintf("screenshot %s/%s.png", screenshot_dir, name);
  char *answer = browser_ask(b, shot);
  assert_string_equal(answer, "ok");
  printf("screenshot: %s/%s.png\n", screenshot_dir, name);
  free(answer), free(shot);
  return mark;
}

/* Trial `number` of ask/tell experiment `name` asked, told y at step 0 (a learning curve)
 * and told completed. */
static void ask_and_complete(fixture *f, const char *name, int number) {
  char trial[16], y[32], z[32];
  snprintf(trial, sizeof trial, "%d", number);
  snprintf(y, sizeof y, "y=%g", 0.1 * (number + 1));
  snprintf(z, sizeof z, "z=%g", 1 - 0.1 * (number + 1));
  json_decref(nas_json(f, (char *[]){"ask", (char *)name, "--format", "json", "--storage", f->db, NULL}));
  char *step[] = {(char *)test_nas_bin(), "tell", (char *)name, trial, "--step", "0", y, "--storage",
                  f->db, NULL}, *out;
  if (test_run(f->dir, step, &out) != 0) fail_msg("nas tell --step: %s", out);
  free(out);
  char *end[] = {(char *)test_nas_bin(), "tell", (char *)name, trial, "--complete", y, z, "--storage",
                 f->db, NULL};
  if (test_run(f->dir, end, &out) != 0) fail_msg("nas tell: %s", out);
  free(out);
}

/* The spec of ask/tell experiment `name` (two objectives, 10 trials), created with 3
 * trials completed. */
static char *live_experiment(fixture *f, const char *name) {
  char *text = nas_asprintf("name: %s\n"
                            "parameters: {x: {type: float, low: 0, high: 1}}\n"
                            "objectives: [{name: y, goal: minimize}, {name: z, goal: minimize}]\n"
                            "optimizer: {type: random}\n"
                            "budget: {trials: 10}\n", name);
  char *file = nas_asprintf("%s.yaml", name), *out;
  char *spec = test_write(f->dir, file, text);
  if (nas(f, &out, "create", spec, NULL) != 0) fail_msg("nas create: %s", out);
  free(out), free(file), free(text);
  for (int i = 0; i < 3; i++) ask_and_complete(f, name, i);
  return spec;
}

/* docs/dashboard.md, live updates: a live page whose server goes away (killed, restarting,
 * a network hiccup) keeps what it shows, says "connection lost, retrying…" with the time of
 * its last update, and tries again with a growing pause; once the server answers again
 * on its port, it polls and draws as before (a trial told meanwhile appears). A 404 (the
 * experiment deleted) still ends the page. It stopped for good, blank, after one failed
 * poll. */
static void live_page_retries_through_a_server_restart_and_resumes(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  char *spec = live_experiment(f, "live"), *out;
  served s = {.f = f};
  assert_true(test_server_start(&s.srv, f->dir, f->db, NULL));
  char *url = page_url(&s, "#/e/live"), *listen = nas_asprintf("127.0.0.1:%d", s.srv.port);
  browser b;
  browser_open(&b, f, url);
  wait_front_points(&b, 60, 3);
  free(browser_wait(&b, 5, "document.getElementById('live').textContent.startsWith('● live')"));

  test_server_kill(&s.srv); /* as a crash would; the page polls every 3 s */
  free(s.srv.log);
  char *mark = expect_retrying(&b, "connection lost, retrying", 3, "retrying");
  if (!strstr(mark, "last update 20")) fail_msg("the page says %s", mark);
  free(mark);

  ask_and_complete(f, "live", 3);
  assert_true(test_server_start_on(&s.srv, f->dir, f->db, listen, NULL));
  wait_front_points(&b, 45, 4); /* retries at 3, 6, 12… s after the first failure */
  free(live_mark_once(&b, 1, "live"));

  if (nas(f, &out, "delete", "live", "--yes") != 0) fail_msg("nas delete: %s", out);
  free(out);
  free(browser_wait(&b, 10, "document.body.dataset.ready === 'error' && document.body.dataset.live === ''"));
  browser_close(&b);
  assert_int_equal(test_server_stop(&s.srv), 0);
  free(url), free(listen), free(spec);
}

/* Sends `fault TEXT ANSWER COUNT` to scripts/browser.py: the page's next COUNT requests
 * whose URL holds TEXT get ANSWER (an HTTP status, or "reset") instead of the server's. */
static void browser_fault(browser *b, const char *text, const char *answer, int count) {
  char *command = nas_asprintf("fault %s %s %d", text, answer, count);
  char *reply = browser_ask(b, command);
  assert_string_equal(reply, "ok");
  free(reply), free(command);
}

/* docs/dashboard.md, live updates: a 500 (a database busy, a server restarting) is retried
 * as a lost connection is, saying the server's error; a 4xx still ends the page. And a
 * page whose first learning-curves request was lost (the connection dropped while it was
 * in flight) draws its curves once the server answers again: the card stayed "Loading…",
 * since the next answer was the same data and nothing was drawn again; a 500 ended the
 * page. */
static void live_page_retries_a_server_error_and_loads_curves_lost_on_the_way(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  char *spec = live_experiment(f, "flaky");
  served s = {.f = f};
  assert_true(test_server_start(&s.srv, f->dir, f->db, NULL));
  char *url = page_url(&s, "#/e/flaky"), *navigate = nas_asprintf("navigate %s", url);
  browser b;
  browser_open(&b, f, "about:blank");
  browser_fault(&b, "/curves", "reset", 1);
  free(browser_ask(&b, navigate));
  /* drawn but for its curves, so not ready */
  char *mark = live_mark_once(&b, 60, "retrying");
  if (!strstr(mark, "connection lost, retrying")) fail_msg("the page says %s", mark);
  free(mark);
  free(browser_wait(&b, 30, "document.body.dataset.live === 'live' && "
                            "document.getElementById('chart-curves').dataset.curves === '3'"));
  wait_front_points(&b, 1, 3);

  browser_fault(&b, "/dashboard", "500", 2);
  free(expect_retrying(&b, "server error (injected by scripts/browser.py), retrying", 3, "server-error"));
  ask_and_complete(f, "flaky", 3);
  wait_front_points(&b, 45, 4); /* retries at 3, then 6 s */
  free(live_mark_once(&b, 1, "live"));

  browser_fault(&b, "/dashboard", "409", 1);
  char *error = browser_wait(&b, 10, "document.body.dataset.ready === 'error' && document.body.dataset.live === '' && "
                                     "document.getElementById('app').textContent");
  assert_non_null(strstr(error, "injected by scripts/browser.py"));
  free(error);
  browser_close(&b);
  assert_int_equal(test_server_stop(&s.srv), 0);
  free(url), free(navigate), free(spec);
}

static void plot_file_draws_from_disk_without_a_server(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  char *spec = dashboard_spec(f, "dash", 1), *out;
  run_spec(f, spec);
  json_t *pareto = nas_json(f, (char *[]){"pareto", "dash", "--storage", f->db, "--format", "json", NULL});
  char *file = nas_asprintf("%s/dash.html", f->dir);
  char *argv[] = {(char *)test_nas_bin(), "plot", "dash", "--storage", f->db, "--out", file, NULL};
  if (test_run(f->dir, argv, &out) != 0) fail_msg("nas plot failed: %s", out);
  free(out);
  char *url = nas_asprintf("file://%s", file);
  char *dom = dump_dom(f, url);
  expect_ready(dom, "experiment");
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-front"),
                   (long)json_array_size(json_object_get(pareto, "front")));
  assert_null(strstr(dom, "static/")); /* nothing is fetched: every file is inlined */
  screenshot(f, url, "plot", 2300);
  free(dom), free(url);

  /* --kind: that chart alone. */
  char *kind_argv[] = {(char *)test_nas_bin(), "plot", "dash", "--storage", f->db, "--out", file,
                       "--kind", "front", NULL};
  assert_int_equal(test_run(f->dir, kind_argv, NULL), 0);
  url = nas_asprintf("file://%s", file);
  dom = dump_dom(f, url);
  assert_non_null(strstr(dom, "id=\"chart-front\""));
  assert_null(strstr(dom, "id=\"chart-parallel\""));
  free(dom), free(url), free(file), free(spec);
  json_decref(pareto);
}

/* Data inlined into a plot file is text of the script, never markup: a parameter value
 * that reads as a closing tag stays inside the data. */
static void plot_data_cannot_close_its_script(void **state) {
  fixture *f = *state;
  char *spec = test_write(f->dir, "tags.yaml",
                          "name: tags\n"
                          "parameters:\n"
                          "  x: {type: float, low: 0, high: 1}\n"
                          "  tag: {type: categorical, choices: ['</script><b>bold', '<!--']}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 4}\n"
                          "optimizer: {type: random}\n"
                          "notify: [{url: 'http://127.0.0.1:9/hooks/SECRET-PATH', on: [trial_failed]}]\n");
  run_spec(f, spec);
  char *file = nas_asprintf("%s/tags.html", f->dir), *page = NULL;
  char *argv[] = {(char *)test_nas_bin(), "plot", "tags", "--storage", f->db, "--out", file, NULL};
  assert_int_equal(test_run(f->dir, argv, NULL), 0);
  assert_int_equal(nas_read_file(file, &page, NULL, NULL), NAS_OK);
  assert_null(strstr(page, "</script><b>"));
  assert_null(strstr(page, "<!--"));
  assert_non_null(strstr(page, "\\u003c/script>\\u003cb>bold"));
  /* The spec (a webhook URL may be a credential) stays out of a file that is mailed. */
  assert_null(strstr(page, "SECRET-PATH"));
  /* Its three inlined scripts (data, app.js, Chart.js) are the only ones closed. */
  assert_int_equal(count_of(page, "</script>"), 3);
  free(page), free(file), free(spec);
}

/* The DOM of `nas plot NAME --kind KIND`'s file (NAME.html in the fixture folder) once drawn;
 * *url (owned) is its file:// address. */
static char *plot_dom(fixture *f, const char *name, const char *kind, char **url) {
  char *file = nas_asprintf("%s/%s.html", f->dir, name);
  char *argv[] = {(char *)test_nas_bin(), "plot", (char *)name, "--storage", f->db, "--out", file,
                  "--kind", (char *)kind, NULL};
  assert_int_equal(test_run(f->dir, argv, NULL), 0);
  *url = nas_asprintf("file://%s", file);
  free(file);
  return dump_dom(f, *url);
}

/* A plot file's data is parsed as JSON, as the served page's: a metric named "__proto__"
 * is a metric there too (as a script's object literal it set the prototype and vanished). */
static void plot_keeps_a_metric_named_proto(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  char *spec = test_write(f->dir, "proto.yaml",
                          "name: proto\n"
                          "parameters: {x: {type: float, low: 0, high: 1}}\n"
                          "objectives: [{name: y, goal: minimize}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"step\\\": 0, \\\"__proto__\\\": {x}}}\"; "
                          "echo \"nas-metric {{\\\"y\\\": {x}}}\"']}\n"
                          "budget: {trials: 3}\n"
                          "optimizer: {type: random}\n");
  run_spec(f, spec);
  char *url, *dom = plot_dom(f, "proto", "curves", &url);
  assert_int_equal(dom_attr(dom, "id=\"chart-curves\"", "data-curves"), 3);
  free(dom), free(url), free(spec);
}

/* The front's chart holds every completed trial within its axes: here the trials off the
 * front, in the order they ran, begin and end inside the range of the front and the
 * reference point, and the largest y lies between (the chart took its x axis from the
 * first and last of them, and left that trial out). */
static void front_chart_holds_every_trial(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  char *spec = test_write(f->dir, "spread.yaml",
                          "name: spread\n"
                          "parameters:\n"
                          "  x: {type: float, low: 0, high: 1}\n"
                          "  off: {type: int, low: 0, high: 1}\n"
                          "objectives: [{name: y, goal: minimize, threshold: 0.8}, {name: z, goal: minimize, threshold: 2}]\n"
                          "trial: {command: [sh, -c, 'echo \"nas-metric {{\\\"y\\\": {x}, \\\"z\\\": "
                          "$(awk \"BEGIN {{ print 1 - {x} + {off} }}\")}}\"']}\n"
                          "enqueue: [{x: 0.3, off: 0}, {x: 0.7, off: 0}, {x: 0.5, off: 1}, {x: 0.9, off: 1},\n"
                          "          {x: 0.6, off: 1}]\n"
                          "budget: {trials: 5}\n");
  run_spec(f, spec);
  char *url, *dom = plot_dom(f, "spread", "front", &url);
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-front"), 2);
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-points"), 5);
  assert_int_equal(dom_attr(dom, "id=\"chart-front\"", "data-offscale"), 0);
  screenshot(f, url, "front-spread", 500);
  free(dom), free(url), free(spec);
}

/* The data of an experiment page (…/dashboard's answer) with n completed trials of one
 * parameter x and one objective y. */
static json_t *many_trials_dashboard(size_t n) {
  json_t *number = json_array(), *status = json_array(), *ones = json_array(), *none = json_array();
  json_t *x = json_array(), *y = json_array();
  for (size_t i = 0; i < n; i++) {
    json_array_append_new(number, json_integer((json_int_t)i));
    json_array_append_new(status, json_string("completed"));
    json_array_append_new(ones, json_integer(1));
    json_array_append_new(none, json_null());
    json_array_append_new(x, json_real((double)(i % 1000) / 1000));
    json_array_append_new(y, json_real((double)(i % 997) / 997));
  }
  return json_pack(
      "{s:{s:s, s:s, s:i, s:{s:i, s:i, s:i, s:i, s:i}, s:{s:i}, s:n, s:f, s:i, s:{s:s}}, s:[{s:s, s:s}],"
      " s:[s], s:[s],"
      " s:{s:o, s:o, s:o, s:o, s:{s:o}, s:{s:o}}, s:{s:[], s:{}}, s:{s:[], s:[], s:[]}, s:{}}",
      "experiment", "name", "many", "status", "finished", "trials", (int)n, "counts", "completed", (int)n,
      "running", 0, "failed", 0, "timeout", 0, "stopped", 0,
      "progress", "budget", (int)n, "best", "hypervolume", 0.0, "front_size", 0, "scheduler", "state", "none",
      "objectives", "name", "y", "goal", "minimize", "params", "x", "metrics", "y",
      "trials", "number", number, "status", status, "attempts", ones, "duration", none,
      "metrics", "y", y, "params", "x", x,
      "pareto", "front", "reference_point",
      "hypervolume_history", "completed", "trial", "hypervolume", "curves");
}

/* 150 000 trials (cheap ones asked for and told from a loop, say) draw: a
 * parameter's range was found with Math.min(...values), whose arguments overflow the
 * script's stack from about 125 000 values on, so the whole page was an error. */
static void parallel_coordinates_draw_150_000_trials(void **state) {
  if (!have_chromium()) skip();
  fixture *f = *state;
  const size_t n = 150000;
  json_t *data = json_pack("{s:s, s:s, s:o}", "page", "experiment", "kind", "parallel",
                           "dashboard", many_trials_dashboard(n));
  char *file = nas_asprintf("%s/many.html", f->dir);
  FILE *out = fopen(file, "w");
  assert_non_null(out);
  nas_err err;
  assert_int_equal(serve_plot_write(out, data, &err), NAS_OK);
  fclose(out);
  char *url = nas_asprintf("file://%s", file), *dom = dump_dom(f, url);
  expect_ready(dom, "experiment");
  assert_int_equal(dom_attr(dom, "id=\"chart-parallel\"", "data-points"), (long)n);
  free(dom), free(url), free(file);
  json_decref(data);
}

static void plot_refuses_bad_usage(void **state) {
  fixture *f = *state;
  char *spec = dashboard_spec(f, "dash", 1), *out;
  run_spec(f, spec);
  struct {
    char *args[8];
    int status;
    const char *says;
  } cases[] = {
      {{"plot", "dash", NULL}, 2, "expected --out FILE.html"},
      {{"plot", "--out", "x.html", NULL}, 2, "expected an experiment"},
      {{"plot", "dash", "--out", "x.html", "--kind", "pie", NULL}, 2, "unknown kind 'pie'"},
      {{"plot", "dash", "--out", "x.html", "--kind", "compare", NULL}, 2, "needs two experiments"},
      {{"plot", "nope", "--out", "x.html", NULL}, 1, "no experiment 'nope'"},
      {{"plot", "dash", "--out", "/nonexistent-dir/x.html", NULL}, 1, "cannot write /nonexistent-dir/x.html"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *argv[12] = {(char *)test_nas_bin()};
    size_t n = 1;
    for (char **a = cases[i].args; *a; a++) argv[n++] = *a;
    argv[n++] = "--storage", argv[n++] = f->db, argv[n] = NULL;
    int rc = test_run(f->dir, argv, &out);
    if (rc != cases[i].status || !strstr(out, cases[i].says))
      fail_msg("case %zu: exit %d (want %d), output without '%s': %s", i, rc, cases[i].status, cases[i].says, out);
    free(out);
  }
  struct stat st;
  char *refused = nas_asprintf("%s/x.html", f->dir);
  assert_int_not_equal(stat(refused, &st), 0); /* nothing written where refused */
  free(refused), free(spec);
}

int main(int argc, char **argv) {
  (void)argc;
  char *self = strdup(argv[0]), *dir = realpath(dirname(self), NULL);
  snprintf(screenshot_dir, sizeof screenshot_dir, "%s/dashboard-screenshots", dir ? dir : ".");
  free(self), free(dir);
  mkdir(screenshot_dir, 0755);
  if (!have_chromium())
    printf("test_e2e_dashboard: chromium is not installed (scripts/deps.sh browser): the "
           "browser tests are skipped\n");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(dashboard_data_and_files_are_served_without_a_browser, setup, teardown),
      cmocka_unit_test_setup_teardown(experiment_page_draws_what_the_cli_reports, setup, teardown),
      cmocka_unit_test_setup_teardown(experiments_page_lists_one_whose_spec_no_longer_loads, setup, teardown),
      cmocka_unit_test_setup_teardown(trial_page_shows_its_parameters_metrics_and_logs, setup, teardown),
      cmocka_unit_test_setup_teardown(compare_page_draws_nas_compare_fronts, setup, teardown),
      cmocka_unit_test_setup_teardown(token_file_page_asks_for_a_token_and_draws_with_it, setup, teardown),
      cmocka_unit_test_setup_teardown(live_page_retries_through_a_server_restart_and_resumes, setup, teardown),
      cmocka_unit_test_setup_teardown(live_page_retries_a_server_error_and_loads_curves_lost_on_the_way,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(plot_file_draws_from_disk_without_a_server, setup, teardown),
      cmocka_unit_test_setup_teardown(plot_data_cannot_close_its_script, setup, teardown),
      cmocka_unit_test_setup_teardown(plot_keeps_a_metric_named_proto, setup, teardown),
      cmocka_unit_test_setup_teardown(front_chart_holds_every_trial, setup, teardown),
      cmocka_unit_test_setup_teardown(parallel_coordinates_draw_150_000_trials, setup, teardown),
      cmocka_unit_test_setup_teardown(plot_refuses_bad_usage, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
