/* Webhooks (notify/, `notify:` in a spec) against a real HTTP receiver in this process
 * (libmicrohttpd on 127.0.0.1) that can be slow, answer 500 or 404, or not be there at all:
 * the notifier on its own (retries, refusals, a full queue, posting that never waits), then
 * end to end through `nas run`: every trial end, the front and the finish arrive in JSON and
 * Slack form, a slow receiver does not slow the run, a dead one fails nothing and is logged
 * by its host alone; and trials driven by ask and tell, from the shell and through
 * `nas serve`, tell the same events. */
#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "common/common.h"
#include "notify/notify.h"
#include "scheduler/scheduler.h"
#include "spec/spec.h"
#include "storage/storage.h"
#include "tests/e2e.h"
#include "tests/serve.h"

/* ---- the receiver ----------------------------------------------------------------------- */

typedef struct {
  struct MHD_Daemon *daemon;
  int port;
  pthread_mutex_t lock;
  json_t *received;  /* [{"path", "body"}] of the requests answered 2xx, in arrival order */
  int arrived;       /* requests whose body has come, answered or not yet */
  int requests;      /* every request answered, whatever its answer */
  int fail_first;    /* answer 500 to this many first requests */
  int status;        /* the answer after those */
  double delay_s;    /* before each answer */
  bool held;         /* answers wait while set (receiver_hold) */
  pthread_cond_t released;
  pthread_cond_t progressed; /* a request arrived, or one was answered */
} receiver;

typedef struct {
  char *data;
  size_t len;
} upload;

static void record(receiver *rv, const char *path, const upload *body, int *status) {
  pthread_mutex_lock(&rv->lock);
  int n = ++rv->requests;
  *status = n <= rv->fail_first ? 500 : rv->status;
  json_t *parsed = json_loadb(body->data ? body->data : "", body->len, 0, NULL);
  if (*status < 300)
    json_array_append_new(rv->received, json_pack("{s:s, s:o*}", "path", path, "body", parsed));
  else
    json_decref(parsed);
  pthread_cond_broadcast(&rv->progressed);
  pthread_mutex_unlock(&rv->lock);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *size, void **con_cls) {
  (void)method, (void)version;
  receiver *rv = cls;
  upload *body = *con_cls;
  if (!body) {
    *con_cls = calloc(1, sizeof(upload));
    return *con_cls ? MHD_YES : MHD_NO;
  }
  if (*size > 0) {
    body->data = realloc(body->data, body->len + *size);
    memcpy(body->data + body->len, data, *size);
    body->len += *size;
    *size = 0;
    return MHD_YES;
  }
  pthread_mutex_lock(&rv->lock);
  rv->arrived++;
  pthread_cond_broadcast(&rv->progressed);
  pthread_mutex_unlock(&rv->lock);
  if (rv->delay_s > 0) nas_sleep(rv->delay_s);
  pthread_mutex_lock(&rv->lock);
  while (rv->held) pthread_cond_wait(&rv->released, &rv->lock);
  pthread_mutex_unlock(&rv->lock);
  int status;
  record(rv, url, body, &status);
  free(body->data);
  free(body);
  *con_cls = NULL;
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
  enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
  MHD_destroy_response(resp);
  return rc;
}

static receiver *receiver_start(int fail_first, int status, double delay_s) {
  receiver *rv = calloc(1, sizeof *rv);
  assert_non_null(rv);
  *rv = (receiver){.received = json_array(), .fail_first = fail_first, .status = status,
                   .delay_s = delay_s};
  pthread_mutex_init(&rv->lock, NULL);
  pthread_cond_init(&rv->released, NULL);
  pthread_cond_init(&rv->progressed, NULL);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  rv->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION,
                                0, NULL, NULL, on_request, rv, MHD_OPTION_SOCK_ADDR, &addr,
                                MHD_OPTION_END);
  assert_non_null(rv->daemon);
  rv->port = MHD_get_daemon_info(rv->daemon, MHD_DAEMON_INFO_BIND_PORT)->port;
  return rv;
}

/* Holds back every answer (held) or lets them go. */
static void receiver_hold(receiver *rv, bool held) {
  pthread_mutex_lock(&rv->lock);
  rv->held = held;
  pthread_cond_broadcast(&rv->released);
  pthread_mutex_unlock(&rv->lock);
}

/* Waits until at least `arrived` requests have arrived and `received` have been answered
 * 2xx; fails the test after 60 s (a machine however loaded has long done it by then). */
static void receiver_wait(receiver *rv, int arrived, size_t received) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 60;
  pthread_mutex_lock(&rv->lock);
  int rc = 0;
  while (rc == 0 && (rv->arrived < arrived || json_array_size(rv->received) < received))
    rc = pthread_cond_timedwait(&rv->progressed, &rv->lock, &until);
  int got_arrived = rv->arrived;
  size_t got_received = json_array_size(rv->received);
  pthread_mutex_unlock(&rv->lock);
  if (got_arrived < arrived || got_received < received)
    fail_msg("after 60 s the receiver has %d requests (want %d), %zu answered 2xx (want %zu)",
             got_arrived, arrived, got_received, received);
}

static void receiver_stop(receiver *rv) {
  MHD_stop_daemon(rv->daemon);
  pthread_cond_destroy(&rv->progressed);
  pthread_cond_destroy(&rv->released);
  pthread_mutex_destroy(&rv->lock);
  json_decref(rv->received);
  free(rv);
}

/* A port of 127.0.0.1 where nothing listens. */
static int closed_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

/* The bodies received at path whose "event" is event (NULL: every body there). */
static size_t count_received(const receiver *rv, const char *path, const char *event) {
  size_t n = 0, i;
  json_t *r;
  json_array_foreach(rv->received, i, r) {
    if (strcmp(json_string_value(json_object_get(r, "path")), path) != 0) continue;
    const char *got = json_string_value(json_object_get(json_object_get(r, "body"), "event"));
    n += !event || (got && strcmp(got, event) == 0);
  }
  return n;
}

/* ---- the notifier on its own ---------------------------------------------------------------- */

/* A notifier with one JSON webhook, to a receiver of its own. */
typedef struct {
  receiver *rv;
  char url[64];
  notify_spec target;  /* its only webhook */
  notifier *nt;
} hooked;

static void hooked_start(hooked *h, int fail_first, int status, double delay_s,
                         unsigned events) {
  h->rv = receiver_start(fail_first, status, delay_s);
  snprintf(h->url, sizeof h->url, "http://127.0.0.1:%d/hook", h->rv->port);
  h->target = (notify_spec){.url = h->url, .events = events, .format = NOTIFY_JSON};
  nas_err err;
  if (notifier_start(&h->target, 1, &h->nt, &err) != NAS_OK) fail_msg("notifier_start: %s", err.msg);
  assert_non_null(h->nt);
}

/* Posts events numbered first..n-1 as trial_completed {"seq": i}; returns the seconds it
 * took. */
static double post_numbered_from(notifier *nt, int first, int n) {
  double start = nas_monotonic();
  for (int i = first; i < n; i++) {
    json_t *payload = json_pack("{s:i}", "seq", i);
    notifier_post(nt, NOTIFY_TRIAL_COMPLETED, payload, "text");
    json_decref(payload);
  }
  return nas_monotonic() - start;
}

static double post_numbered(notifier *nt, int n) { return post_numbered_from(nt, 0, n); }

/* Fills h's queue past its capacity behind a request the receiver holds: event 0 is
 * posted and awaited at the receiver (the webhook's thread has taken it off the queue),
 * then events 1..NOTIFY_QUEUE_CAP+9 are posted, of which 1..9, the oldest waiting, are
 * dropped. The receiver is left holding. */
static void overfill_behind_a_held_request(hooked *h) {
  receiver_hold(h->rv, true);
  post_numbered(h->nt, 1);
  receiver_wait(h->rv, 1, 0);
  post_numbered_from(h->nt, 1, NOTIFY_QUEUE_CAP + 10);
}

static void a_receiver_answering_500_twice_gets_the_event_on_the_third_try(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 2, 200, 0, NOTIFY_ALL_EVENTS);
  post_numbered(h.nt, 1);
  notifier_close(h.nt);
  assert_int_equal(h.rv->requests, 3);
  assert_int_equal(json_array_size(h.rv->received), 1);
  receiver_stop(h.rv);
}

static void a_receiver_refusing_with_404_is_not_asked_again(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 0, 404, 0, NOTIFY_ALL_EVENTS);
  post_numbered(h.nt, 1);
  notifier_close(h.nt);
  assert_int_equal(h.rv->requests, 1);
  receiver_stop(h.rv);
}

static void events_a_webhook_does_not_subscribe_to_are_not_sent(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 0, 200, 0, NOTIFY_EXPERIMENT_FINISHED);
  post_numbered(h.nt, 3); /* trial_completed */
  json_t *payload = json_pack("{s:s}", "event", "experiment_finished");
  notifier_post(h.nt, NOTIFY_EXPERIMENT_FINISHED, payload, "done");
  json_decref(payload);
  notifier_close(h.nt);
  assert_int_equal(h.rv->requests, 1);
  assert_int_equal(count_received(h.rv, "/hook", "experiment_finished"), 1);
  receiver_stop(h.rv);
}

/* 2 s per request: posting 20 events takes no time, and closing gives up after the flush
 * time rather than waiting 40 s. */
static void posting_never_waits_for_a_slow_receiver(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 0, 200, 2.0, NOTIFY_ALL_EVENTS);
  double posting = post_numbered(h.nt, 20);
  double start = nas_monotonic();
  notifier_close(h.nt);
  double closing = nas_monotonic() - start;
  print_message("posting 20 events: %.4f s; closing: %.2f s\n", posting, closing);
  assert_true(posting < 0.1);
  assert_true(closing < NOTIFY_FLUSH_S + 2.5);
  size_t got = json_array_size(h.rv->received);
  assert_true(got >= 2 && got < 20);
  receiver_stop(h.rv);
}

/* A queue of NOTIFY_QUEUE_CAP behind a receiver that answers nothing while they are
 * posted: the oldest waiting events (1..9) are dropped, and every other one arrives, in
 * order: 0 (in flight while the queue filled), then 10..NOTIFY_QUEUE_CAP+9. */
static void a_full_queue_drops_the_oldest_events(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 0, 200, 0, NOTIFY_ALL_EVENTS);
  overfill_behind_a_held_request(&h);
  receiver_hold(h.rv, false);
  receiver_wait(h.rv, 0, NOTIFY_QUEUE_CAP + 1);
  notifier_close(h.nt);
  assert_int_equal(json_array_size(h.rv->received), NOTIFY_QUEUE_CAP + 1);
  size_t i;
  json_t *r;
  json_array_foreach(h.rv->received, i, r) {
    json_int_t seq = json_integer_value(json_object_get(json_object_get(r, "body"), "seq"));
    assert_int_equal(seq, i == 0 ? 0 : (json_int_t)i + 9);
  }
  receiver_stop(h.rv);
}

/* Slack reads <…> as a link or a mention (<!channel> pings everyone) and & as the start of
 * an entity: text from users (an error message, a name) arrives as written. */
static void slack_text_escapes_what_slack_reads_as_markup(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 0, 200, 0, NOTIFY_ALL_EVENTS);
  h.target.format = NOTIFY_SLACK; /* read by notifier_post, on this thread */
  json_t *payload = json_object();
  notifier_post(h.nt, NOTIFY_TRIAL_FAILED, payload,
                "nas: e: trial 1 failed: loss <0 & <!channel> <http://x.example|here>");
  json_decref(payload);
  notifier_close(h.nt);
  assert_int_equal(json_array_size(h.rv->received), 1);
  const json_t *body = json_object_get(json_array_get(h.rv->received, 0), "body");
  assert_string_equal(json_string_value(json_object_get(body, "text")),
                      "nas: e: trial 1 failed: loss &lt;0 &amp; &lt;!channel&gt; "
                      "&lt;http://x.example|here&gt;");
  receiver_stop(h.rv);
}

/* What this process writes to stderr while fn(arg) runs (owned). */
static char *stderr_of(void (*fn)(void *), void *arg) {
  char path[] = "/tmp/nas-notify-stderr-XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  assert_true(fd >= 0 && saved >= 0);
  fflush(stderr);
  dup2(fd, 2);
  fn(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  char *text;
  nas_err err;
  assert_int_equal(nas_read_file(path, &text, NULL, &err), NAS_OK);
  unlink(path);
  return text;
}

static void close_notifier(void *nt) { notifier_close(nt); }

/* Drops are logged at most every 10 s: those made since the last such line are told at
 * the close, so the log's count is the whole count. */
static void the_close_logs_every_event_a_full_queue_dropped(void **state) {
  (void)state;
  hooked h;
  hooked_start(&h, 0, 200, 0, NOTIFY_ALL_EVENTS);
  overfill_behind_a_held_request(&h); /* logs the first drop only */
  receiver_hold(h.rv, false);
  char *logged = stderr_of(close_notifier, h.nt);
  if (!strstr(logged, "dropped 9 events in all"))
    fail_msg("no total of the dropped events in:\n%s", logged);
  free(logged);
  receiver_stop(h.rv);
}

/* ---- end to end: nas run ------------------------------------------------------------------ */

/* Trials 3, 7, … (numbered from 0) fail (exit 3); the others report y = x. notify_yaml is
 * the `notify:` section (may be empty). */
static char *hooks_spec(fixture *f, const char *name, int trials, const char *notify_yaml) {
  char *text;
  assert_true(asprintf(&text,
                       "name: %s\n"
                       "parameters:\n"
                       "  x: {type: float, low: 0, high: 1}\n"
                       "objectives: [{name: y, goal: minimize}]\n"
                       "trial:\n"
                       "  command: [sh, -c, 'if [ $((NAS_TRIAL_NUMBER %% 4)) -eq 3 ]; then exit 3; "
                       "fi; echo \"nas-metric {{\\\"y\\\": {x}}}\"']\n"
                       "budget: {trials: %d, parallel: 2, max_failure_rate: 1}\n"
                       "optimizer: {type: random}\n"
                       "%s",
                       name, trials, notify_yaml) > 0);
  char *file = nas_asprintf("%s.yaml", name);
  char *path = test_write(f->dir, file, text);
  free(file);
  free(text);
  return path;
}

/* `nas run spec`; its output (owned) in *out, its wall time in *seconds. */
static int run_timed(fixture *f, const char *spec, char **out, double *seconds) {
  double start = nas_monotonic();
  int rc = nas(f, out, "run", spec, "--no-progress");
  *seconds = nas_monotonic() - start;
  return rc;
}

/* Checks a trial event's body; returns the trial's number. */
static json_int_t check_trial_payload(const json_t *body, const char *status) {
  assert_string_equal(json_string_value(json_object_get(body, "experiment")), "hooks");
  assert_true(json_is_number(json_object_get(body, "time")));
  const json_t *trial = json_object_get(body, "trial");
  assert_string_equal(json_string_value(json_object_get(trial, "status")), status);
  assert_true(json_is_number(json_object_get(json_object_get(trial, "params"), "x")));
  bool completed = strcmp(status, "completed") == 0;
  assert_int_equal(json_is_number(json_object_get(json_object_get(trial, "metrics"), "y")),
                   completed);
  assert_int_equal(json_is_string(json_object_get(trial, "error")), !completed);
  return json_integer_value(json_object_get(trial, "number"));
}

static void run_tells_each_trial_end_the_front_and_the_finish_in_both_formats(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *notify = nas_asprintf("notify:\n"
                              "  - url: http://127.0.0.1:%d/json\n"
                              "  - {url: \"http://127.0.0.1:%d/slack\", format: slack}\n",
                              rv->port, rv->port);
  char *spec = hooks_spec(f, "hooks", 10, notify), *out;
  double seconds;
  int rc = run_timed(f, spec, &out, &seconds);
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  json_t *rows = trials_json(f, "hooks");
  size_t completed = count_status(rows, "completed"), failed = count_status(rows, "failed");
  assert_int_equal(completed, 8); /* trials 3 and 7 fail */
  assert_int_equal(count_received(rv, "/json", "trial_completed"), completed);
  assert_int_equal(count_received(rv, "/json", "trial_failed"), failed);
  assert_int_equal(count_received(rv, "/json", "experiment_finished"), 1);
  size_t fronts = count_received(rv, "/json", "front_changed");
  assert_true(fronts >= 1 && fronts <= completed);
  size_t i;
  json_t *r;
  unsigned told = 0; /* trial numbers with an event, as bits */
  json_array_foreach(rv->received, i, r) {
    const json_t *body = json_object_get(r, "body");
    const char *path = json_string_value(json_object_get(r, "path"));
    const char *event = json_string_value(json_object_get(body, "event"));
    if (strcmp(path, "/slack") == 0) {
      const char *text = json_string_value(json_object_get(body, "text"));
      assert_non_null(text);
      assert_int_equal(strncmp(text, "nas: hooks", 10), 0);
      assert_int_equal(json_object_size(body), 1);
    } else if (strcmp(event, "trial_completed") == 0 || strcmp(event, "trial_failed") == 0) {
      json_int_t number =
          check_trial_payload(body, strcmp(event, "trial_failed") == 0 ? "failed" : "completed");
      assert_true(number >= 0 && number < 10 && !(told & (1u << number)));
      told |= 1u << number;
    } else {
      const json_t *front = json_object_get(body, "front");
      assert_true(json_integer_value(json_object_get(front, "size")) >= 1);
      assert_true(json_is_number(json_object_get(front, "hypervolume")));
      assert_int_equal(json_object_size(json_object_get(front, "reference_point")), 1);
    }
  }
  assert_int_equal(count_received(rv, "/slack", NULL),
                   count_received(rv, "/json", NULL));
  assert_int_equal(told, (1u << 10) - 1);
  /* The finish counts the trials. */
  const json_t *finished = NULL;
  json_array_foreach(rv->received, i, r) {
    const json_t *body = json_object_get(r, "body");
    const char *event = json_string_value(json_object_get(body, "event"));
    if (event && strcmp(event, "experiment_finished") == 0) finished = body;
  }
  assert_non_null(finished);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(finished, "trials"), "completed")),
                   8);
  /* Its front is nas pareto's: the hypervolume with the reference point it is measured at
   * (inferred from the trials so far, so it moves as they come; without it a receiver
   * cannot tell a smaller front from a further point). */
  json_t *pareto = nas_json(f, (char *[]){"pareto", "hooks", "--format", "json", "--storage", f->db, NULL});
  const json_t *front = json_object_get(finished, "front");
  assert_true(json_equal(json_object_get(front, "reference_point"), json_object_get(pareto, "reference_point")));
  assert_true(json_equal(json_object_get(front, "hypervolume"), json_object_get(pareto, "hypervolume")));
  json_decref(pareto), json_decref(rows);
  free(out), free(spec), free(notify);
  receiver_stop(rv);
}

/* 2 s per request and some 20 events: waiting on the receiver would add 40 s; the run
 * takes no longer than without webhooks, plus the bounded flush at its end. */
static void a_slow_receiver_does_not_slow_the_run(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 2.0);
  char *notify = nas_asprintf("notify: [{url: \"http://127.0.0.1:%d/slow\"}]\n", rv->port);
  char *plain = hooks_spec(f, "plain", 10, ""), *hooked = hooks_spec(f, "hooks", 10, notify);
  char *out;
  double without, with;
  assert_int_equal(run_timed(f, plain, &out, &without), 0);
  free(out);
  int rc = run_timed(f, hooked, &out, &with);
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  print_message("without webhooks %.2f s, with a 2 s receiver %.2f s\n", without, with);
  assert_true(with < without + NOTIFY_FLUSH_S + 3);
  assert_non_null(strstr(out, "undelivered events at exit"));
  assert_true(json_array_size(rv->received) >= 1);
  free(out), free(plain), free(hooked), free(notify);
  receiver_stop(rv);
}

/* A job the runner cannot start (sbatch without a cluster: SLURM_CONF names no file, or no
 * sbatch at all) fails its trial before it runs; that is told too. */
static void a_trial_that_cannot_be_launched_is_told_as_failed(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *notify = nas_asprintf("runner: {type: slurm}\n"
                              "notify: [{url: \"http://127.0.0.1:%d/failed\", on: [trial_failed]}]\n",
                              rv->port);
  char *spec = hooks_spec(f, "hooks", 2, notify), *out;
  const char *conf = getenv("SLURM_CONF");
  char *saved = conf ? strdup(conf) : NULL;
  setenv("SLURM_CONF", "/nonexistent/slurm.conf", 1);
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (saved) setenv("SLURM_CONF", saved, 1);
  else unsetenv("SLURM_CONF");
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  assert_int_equal(count_received(rv, "/failed", "trial_failed"), 2);
  size_t i;
  json_t *r;
  json_array_foreach(rv->received, i, r) {
    const json_t *trial = json_object_get(json_object_get(r, "body"), "trial");
    assert_int_equal(json_integer_value(json_object_get(trial, "attempts")), 0);
  }
  free(saved), free(out), free(spec), free(notify);
  receiver_stop(rv);
}

static void a_receiver_failing_twice_gets_the_finish_after_retries(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(2, 200, 0);
  char *notify = nas_asprintf("notify: [{url: \"http://127.0.0.1:%d/flaky\", "
                              "on: [experiment_finished]}]\n", rv->port);
  char *spec = hooks_spec(f, "hooks", 2, notify), *out;
  double seconds;
  int rc = run_timed(f, spec, &out, &seconds);
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  assert_int_equal(rv->requests, 3);
  assert_int_equal(count_received(rv, "/flaky", "experiment_finished"), 1);
  assert_null(strstr(out, "not delivered"));
  free(out), free(spec), free(notify);
  receiver_stop(rv);
}

static void a_receiver_that_is_down_fails_nothing_and_is_logged_by_host_only(void **state) {
  fixture *f = *state;
  int port = closed_port();
  char *notify = nas_asprintf("notify: [{url: \"http://127.0.0.1:%d/services/SECRET-TOKEN\", "
                              "format: slack}]\n", port);
  char *spec = hooks_spec(f, "hooks", 2, notify), *out;
  double seconds;
  int rc = run_timed(f, spec, &out, &seconds);
  if (rc != 0) fail_msg("nas run failed (%d): %s", rc, out);
  char *logged = nas_asprintf("notify http://127.0.0.1:%d/…: ", port);
  const char *line = strstr(out, logged);
  if (!line) fail_msg("no line '%s' in:\n%s", logged, out);
  assert_non_null(strstr(line, " not delivered (4 attempts): Failed to connect"));
  assert_null(strstr(out, "SECRET"));
  assert_true(seconds < 20);
  free(logged), free(out), free(spec), free(notify);
}

/* Webhooks may change between runs, like the budget; the change is listed without the
 * hidden part of a URL. */
static void notify_may_change_between_runs_and_its_secret_is_never_shown(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *before = nas_asprintf("notify: [{url: \"http://127.0.0.1:%d/SECRET-A\"}]\n", rv->port);
  char *after = nas_asprintf("notify: [{url: \"http://127.0.0.1:%d/SECRET-B\", "
                             "on: [experiment_finished]}]\n", rv->port);
  char *spec = hooks_spec(f, "hooks", 1, before), *out;
  assert_int_equal(nas(f, &out, "run", spec, "--no-progress"), 0);
  free(out), free(spec);
  spec = hooks_spec(f, "hooks", 2, after);
  int rc = nas(f, &out, "run", spec, "--no-progress");
  if (rc != 0) fail_msg("second nas run failed (%d): %s", rc, out);
  assert_non_null(strstr(out, "notify: [http://127.0.0.1:"));
  assert_null(strstr(out, "SECRET"));
  assert_int_equal(count_received(rv, "/SECRET-B", NULL), 1);
  free(out), free(spec), free(before), free(after);
  receiver_stop(rv);
}

/* ---- end to end: ask and tell ------------------------------------------------------------- */

/* A spec for ask and tell (no trial section) of 3 trials, posting every event as JSON to
 * the receiver's /name. */
static char *told_spec(const char *name, int port) {
  return nas_asprintf("name: %s\n"
                      "parameters: {x: {type: float, low: 0, high: 1}}\n"
                      "objectives: [{name: y, goal: minimize}]\n"
                      "optimizer: {type: sobol}\n"
                      "budget: {trials: 3}\n"
                      "notify: [{url: \"http://127.0.0.1:%d/%s\"}]\n",
                      name, port, name);
}

/* Trial 1 failed, 0 and 2 completed: each end, the front (at least the first completed
 * trial's) and the finish (after the last end) reached /name. */
static void assert_told(const receiver *rv, const char *name) {
  char *path = nas_asprintf("/%s", name);
  assert_int_equal(count_received(rv, path, "trial_completed"), 2);
  assert_int_equal(count_received(rv, path, "trial_failed"), 1);
  size_t fronts = count_received(rv, path, "front_changed");
  assert_true(fronts >= 1 && fronts <= 2);
  assert_int_equal(count_received(rv, path, "experiment_finished"), 1);
  size_t i;
  json_t *r;
  json_array_foreach(rv->received, i, r) {
    const json_t *body = json_object_get(r, "body");
    if (strcmp(json_string_value(json_object_get(body, "event")), "trial_failed") != 0) continue;
    const json_t *trial = json_object_get(body, "trial");
    assert_int_equal(json_integer_value(json_object_get(trial, "number")), 1);
    assert_string_equal(json_string_value(json_object_get(trial, "error")), "broke");
  }
  free(path);
}

/* `nas ARGV…` in the fixture's folder with its storage; the exit status. */
static int nas_args(fixture *f, char **out, const char *const *args) {
  const char *argv[16] = {test_nas_bin()};
  size_t n = 1;
  while (args[n - 1] && n < 13) argv[n] = args[n - 1], n++;
  argv[n++] = "--storage", argv[n++] = f->db, argv[n] = NULL;
  return test_run(f->dir, (char *const *)argv, out);
}

static void ask_and_tell_from_the_shell_tell_each_end_the_front_and_the_finish(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *text = told_spec("told", rv->port), *spec = test_write(f->dir, "told.yaml", text), *out;
  nas_ok(f, "create", spec, NULL);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(nas(f, &out, "ask", "told", "--format=json"), 0);
    json_t *asked = json_loads(out, 0, NULL);
    free(out);
    const json_t *row = json_array_get(asked, 0);
    char number[16], y[64];
    snprintf(number, sizeof number, "%d", (int)json_integer_value(json_object_get(row, "trial")));
    snprintf(y, sizeof y, "y=%g", json_number_value(json_object_get(row, "x")));
    const char *fail[] = {"tell", "told", number, "--fail", "broke", NULL};
    const char *complete[] = {"tell", "told", number, "--complete", y, NULL};
    int rc = nas_args(f, &out, i == 1 ? fail : complete);
    if (rc != 0) fail_msg("nas tell exited %d: %s", rc, out);
    free(out);
    json_decref(asked);
  }
  assert_told(rv, "told");
  free(spec), free(text);
  receiver_stop(rv);
}

/* The server keeps a notifier per experiment: a tell queues its events and returns. */
static void ask_and_tell_through_the_server_tell_each_end_the_front_and_the_finish(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *spec = told_spec("served", rv->port);
  test_server srv;
  assert_true(test_server_start(&srv, f->dir, f->db, NULL));
  int code;
  json_decref(test_http(&srv, "POST", "/api/v1/experiments", spec, NULL, &code));
  assert_int_equal(code, 201);
  for (int i = 0; i < 3; i++) {
    json_t *asked = test_http(&srv, "POST", "/api/v1/experiments/served/ask", "{}", NULL, &code);
    assert_int_equal(code, 200);
    const json_t *row = json_array_get(json_object_get(asked, "trials"), 0);
    int number = (int)json_integer_value(json_object_get(row, "number"));
    double x = json_number_value(json_object_get(json_object_get(row, "params"), "x"));
    char *path = nas_asprintf("/api/v1/experiments/served/trials/%d/%s", number,
                              i == 1 ? "fail" : "complete");
    char *body = i == 1 ? strdup("{\"error\": \"broke\"}")
                        : nas_asprintf("{\"metrics\": {\"y\": %.17g}}", x);
    json_decref(test_http(&srv, "POST", path, body, NULL, &code));
    assert_int_equal(code, 200);
    free(path), free(body);
    json_decref(asked);
  }
  assert_int_equal(test_server_stop(&srv), 0); /* flushes the webhooks */
  assert_told(rv, "served");
  free(spec);
  receiver_stop(rv);
}

/* A spec for ask and tell of 2 trials whose early-stopping rule stops a trial reporting
 * worse than the median of the others at step 1, posting every event to /name. */
static char *stopping_spec(const char *name, int port) {
  return nas_asprintf("name: %s\n"
                      "parameters: {x: {type: float, low: 0, high: 1}}\n"
                      "objectives: [{name: y, goal: minimize}]\n"
                      "optimizer: {type: sobol}\n"
                      "early_stopping: {rule: median, min_steps: 1, min_trials: 1}\n"
                      "budget: {trials: 2}\n"
                      "notify: [{url: \"http://127.0.0.1:%d/%s\"}]\n",
                      name, port, name);
}

/* The state `nas status` shows of experiment name is finished, as experiment_finished
 * said (ask-and-tell experiments stayed "running" after it). */
static void expect_finished(fixture *f, const char *name) {
  json_t *summary = nas_json(f, (char *[]){"status", (char *)name, "--format", "json", "--storage", f->db, NULL});
  const char *state = json_string_value(json_object_get(summary, "status"));
  if (!state || strcmp(state, "finished") != 0) fail_msg("%s is %s, not finished", name, state ? state : "?");
  json_decref(summary);
}

/* The last trial of the budget to end is stopped by early stopping at a report: that ends
 * the experiment, and its finish is told (it was told only when a tell completed or failed
 * the last trial), from the shell and through the server alike. */
static void a_last_trial_stopped_early_tells_the_finish(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *text = stopping_spec("early", rv->port), *spec = test_write(f->dir, "early.yaml", text), *out;
  nas_ok(f, "create", spec, NULL);
  const char *ask[] = {"ask", "early", "-n", "2", NULL};
  const char *curve[] = {"tell", "early", "0", "--step", "1", "y=0.1", NULL};
  const char *first[] = {"tell", "early", "0", "--complete", NULL};
  const char *worse[] = {"tell", "early", "1", "--step", "1", "y=5", NULL};
  assert_int_equal(nas_args(f, &out, ask), 0);
  free(out);
  assert_int_equal(nas_args(f, &out, curve), 0);
  free(out);
  assert_int_equal(nas_args(f, &out, first), 0);
  free(out);
  assert_int_equal(nas_args(f, &out, worse), 0);
  assert_non_null(strstr(out, "stop"));
  free(out);
  assert_int_equal(count_received(rv, "/early", "experiment_finished"), 1);
  expect_finished(f, "early");

  char *served = stopping_spec("early-served", rv->port);
  test_server srv;
  assert_true(test_server_start(&srv, f->dir, f->db, NULL));
  int code;
  json_decref(test_http(&srv, "POST", "/api/v1/experiments", served, NULL, &code));
  assert_int_equal(code, 201);
  json_decref(test_http(&srv, "POST", "/api/v1/experiments/early-served/ask", "{\"n\": 2}", NULL, &code));
  assert_int_equal(code, 200);
  json_decref(test_http(&srv, "POST", "/api/v1/experiments/early-served/trials/0/report",
                        "{\"metrics\": {\"y\": 0.1}, \"step\": 1}", NULL, &code));
  assert_int_equal(code, 200);
  json_decref(test_http(&srv, "POST", "/api/v1/experiments/early-served/trials/0/complete",
                        "{}", NULL, &code));
  assert_int_equal(code, 200);
  json_t *stop = test_http(&srv, "POST", "/api/v1/experiments/early-served/trials/1/report",
                           "{\"metrics\": {\"y\": 5}, \"step\": 1}", NULL, &code);
  assert_int_equal(code, 200);
  assert_true(json_is_true(json_object_get(stop, "stop")));
  json_decref(stop);
  assert_int_equal(test_server_stop(&srv), 0); /* flushes the webhooks */
  assert_int_equal(count_received(rv, "/early-served", "experiment_finished"), 1);
  expect_finished(f, "early-served");
  free(spec), free(text), free(served);
  receiver_stop(rv);
}

/* Two last tells at once: each stores its trial's end, then sees every trial ended and
 * finishes the experiment. Played here in the order that raced — one tell whole, then the
 * other's finishing step (what sched_tell_stopped_end runs after its trial's end) —
 * experiment_finished is posted once, by the tell that changed the status. */
static void two_last_tells_at_once_finish_the_experiment_once(void **state) {
  fixture *f = *state;
  hooked h;
  hooked_start(&h, 0, 200, 0, NOTIFY_ALL_EVENTS);
  char *text = stopping_spec("racing", h.rv->port), *file = test_write(f->dir, "racing.yaml", text);
  nas_ok(f, "create", file, NULL);
  storage *st = NULL;
  spec *s = NULL;
  experiment_row exp;
  trial_row *asked = NULL;
  size_t n_asked = 0;
  nas_err err = {{0}};
  if (storage_open(f->db, &st, &err) != NAS_OK || storage_experiment_get(st, "racing", &exp, &err) ||
      spec_parse(exp.spec_text, "racing.yaml", f->dir, &s, &err) ||
      sched_ask(st, s, &exp, 2, NULL, NULL, &asked, &n_asked, &err))
    fail_msg("%s", err.msg);
  assert_int_equal(n_asked, 2);
  for (int t = 0; t < 2; t++) {
    metric_obs y = {"y", METRIC_FINAL, t + 1.0, nas_now()};
    if (sched_tell_complete(st, s, &exp, t, 0, &y, 1, h.nt, &err) != NAS_OK) fail_msg("%s", err.msg);
  }
  sched_tell_stopped_end(st, s, &exp, 0, h.nt); /* the first tell's finish, come late */
  notifier_close(h.nt);
  assert_int_equal(count_received(h.rv, "/hook", "experiment_finished"), 1);
  expect_finished(f, "racing");
  trial_rows_free(asked, n_asked);
  experiment_row_clear(&exp);
  spec_free(s);
  storage_close(st);
  free(file), free(text);
  receiver_stop(h.rv);
}

/* Experiments told through one server, their webhooks all stalled: stopping the server
 * gives their events NOTIFY_FLUSH_S together, not one after the other. */
static void a_server_stops_within_one_flush_time_whatever_the_stalled_webhooks(void **state) {
  fixture *f = *state;
  enum { EXPERIMENTS = 3 };
  receiver *rv = receiver_start(0, 200, 0);
  receiver_hold(rv, true);
  test_server srv;
  assert_true(test_server_start(&srv, f->dir, f->db, NULL));
  for (int e = 0; e < EXPERIMENTS; e++) {
    char name[32];
    snprintf(name, sizeof name, "stalled%d", e);
    char *spec = told_spec(name, rv->port);
    int code;
    json_decref(test_http(&srv, "POST", "/api/v1/experiments", spec, NULL, &code));
    assert_int_equal(code, 201);
    char *ask = nas_asprintf("/api/v1/experiments/%s/ask", name);
    char *fail = nas_asprintf("/api/v1/experiments/%s/trials/0/fail", name);
    json_decref(test_http(&srv, "POST", ask, "{}", NULL, &code));
    assert_int_equal(code, 200);
    json_decref(test_http(&srv, "POST", fail, "{\"error\": \"broke\"}", NULL, &code));
    assert_int_equal(code, 200);
    free(spec), free(ask), free(fail);
  }
  double start = nas_monotonic();
  assert_int_equal(test_server_stop(&srv), 0);
  double stopping = nas_monotonic() - start;
  print_message("stopping with %d stalled webhooks: %.2f s\n", EXPERIMENTS, stopping);
  assert_true(stopping < NOTIFY_FLUSH_S + 2.5);
  receiver_hold(rv, false);
  receiver_stop(rv);
}

/* A handed-out trial silent past its heartbeat timeout with no attempts left is failed by
 * the next ask, and told as trial_failed (a lost scheduler job's failure is); it was the
 * budget's only trial, so the experiment's finish is told too. */
static void a_handed_out_trial_lost_for_good_is_told_as_failed(void **state) {
  fixture *f = *state;
  receiver *rv = receiver_start(0, 200, 0);
  char *text = nas_asprintf("name: lost\n"
                            "parameters: {x: {type: float, low: 0, high: 1}}\n"
                            "objectives: [{name: y, goal: minimize}]\n"
                            "trial: {heartbeat_timeout: 1s, max_attempts: 1}\n"
                            "budget: {trials: 1}\n"
                            "notify: [{url: \"http://127.0.0.1:%d/lost\"}]\n", rv->port);
  char *spec = test_write(f->dir, "lost.yaml", text), *out;
  nas_ok(f, "create", spec, NULL);
  nas_ok(f, "ask", "lost", NULL);
  nas_sleep(1.5);
  assert_int_equal(nas(f, &out, "ask", "lost", NULL), 1);
  assert_non_null(strstr(out, "spent its budget"));
  free(out);
  assert_int_equal(count_received(rv, "/lost", "trial_failed"), 1);
  assert_int_equal(count_received(rv, "/lost", "experiment_finished"), 1);
  assert_int_equal(count_received(rv, "/lost", "trial_completed"), 0);
  expect_finished(f, "lost");
  free(spec), free(text);
  receiver_stop(rv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_receiver_answering_500_twice_gets_the_event_on_the_third_try),
      cmocka_unit_test(a_receiver_refusing_with_404_is_not_asked_again),
      cmocka_unit_test(events_a_webhook_does_not_subscribe_to_are_not_sent),
      cmocka_unit_test(posting_never_waits_for_a_slow_receiver),
      cmocka_unit_test(a_full_queue_drops_the_oldest_events),
      cmocka_unit_test(slack_text_escapes_what_slack_reads_as_markup),
      cmocka_unit_test(the_close_logs_every_event_a_full_queue_dropped),
      cmocka_unit_test_setup_teardown(run_tells_each_trial_end_the_front_and_the_finish_in_both_formats,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(a_slow_receiver_does_not_slow_the_run, setup, teardown),
      cmocka_unit_test_setup_teardown(a_trial_that_cannot_be_launched_is_told_as_failed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_receiver_failing_twice_gets_the_finish_after_retries,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          a_receiver_that_is_down_fails_nothing_and_is_logged_by_host_only, setup, teardown),
      cmocka_unit_test_setup_teardown(
          notify_may_change_between_runs_and_its_secret_is_never_shown, setup, teardown),
      cmocka_unit_test_setup_teardown(
          ask_and_tell_from_the_shell_tell_each_end_the_front_and_the_finish, setup, teardown),
      cmocka_unit_test_setup_teardown(a_last_trial_stopped_early_tells_the_finish, setup, teardown),
      cmocka_unit_test_setup_teardown(two_last_tells_at_once_finish_the_experiment_once, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          ask_and_tell_through_the_server_tell_each_end_the_front_and_the_finish, setup, teardown),
      cmocka_unit_test_setup_teardown(
          a_server_stops_within_one_flush_time_whatever_the_stalled_webhooks, setup, teardown),
      cmocka_unit_test_setup_teardown(a_handed_out_trial_lost_for_good_is_told_as_failed, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
