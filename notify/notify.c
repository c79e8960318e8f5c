/* notify/notify.c: the webhook threads — one per webhook, each draining a bounded ring of
 * request bodies with one reused libcurl handle (so its connection is kept alive), trying
 * a failed request again with backoff, and giving up on what is left a bounded time after
 * notifier_close. The ring, the closing flag and the deadline are guarded by the
 * notifier's one mutex; a thread holds it only to take or wait, never over a request. */
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "notify/notify.h"

#define BACKOFF_FIRST_S 0.5
#define BACKOFF_MAX_S 8.0
/* Seconds between log lines about the events one webhook dropped for a full queue. */
#define DROP_LOG_EVERY_S 10.0

typedef struct {
  char *body;          /* owned request body */
  notify_event event;
} queued_event;

typedef struct notifier notifier;

/* One webhook: its queue and its thread. */
typedef struct {
  notifier *nt;              /* the notifier it belongs to */
  const notify_spec *spec;   /* borrowed */
  char *shown;               /* owned: the URL as logs show it */
  queued_event *queue;       /* owned ring of NOTIFY_QUEUE_CAP; `count` from `head` */
  size_t head, count;
  size_t dropped;            /* events dropped for a full queue */
  size_t dropped_told;       /* `dropped` as the log last told it */
  double drop_logged;        /* monotonic time drops were last logged; 0 = never */
  struct curl_slist *headers; /* owned */
  char curl_error[CURL_ERROR_SIZE];
  pthread_t thread;
  bool started;
} webhook;

struct notifier {
  webhook *hooks;            /* owned; n_hooks */
  size_t n_hooks;
  pthread_mutex_t lock;
  pthread_cond_t wake;       /* an event was queued, or closing began (CLOCK_MONOTONIC) */
  bool closing;
  double deadline;           /* monotonic seconds: once closing, what is left then is given up */
};

typedef enum {
  POST_OK,
  POST_RETRY,   /* no answer, a timeout, HTTP 5xx, 408 or 429: worth another try */
  POST_REFUSED, /* any other answer: another try would get the same */
} post_result;

/* A log line written whole although other threads write to stderr too. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  flockfile(stderr);
  nas_log("%s", line);
  funlockfile(stderr);
}

/* ---- waiting, under the lock ------------------------------------------------------------ */

static bool past_deadline_locked(const notifier *nt) {
  return nt->closing && nas_monotonic() >= nt->deadline;
}

static void wait_until_locked(notifier *nt, double until) {
  struct timespec ts = {.tv_sec = (time_t)until,
                        .tv_nsec = (long)((until - (double)(time_t)until) * 1e9)};
  pthread_cond_timedwait(&nt->wake, &nt->lock, &ts);
}

/* Waits seconds before the next try; false (at once) when closing would give up first. */
static bool wait_backoff(notifier *nt, double seconds) {
  double until = nas_monotonic() + seconds;
  bool go_on = true;
  pthread_mutex_lock(&nt->lock);
  while (go_on && nas_monotonic() < until) {
    go_on = !(nt->closing && until > nt->deadline);
    if (go_on) wait_until_locked(nt, until);
  }
  pthread_mutex_unlock(&nt->lock);
  return go_on;
}

/* libcurl's progress callback: a request in flight is cut short once closing gave up. */
static int cut_short(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                     curl_off_t ulnow) {
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  notifier *nt = ctx;
  pthread_mutex_lock(&nt->lock);
  bool give_up = past_deadline_locked(nt);
  pthread_mutex_unlock(&nt->lock);
  return give_up;
}

/* ---- one request ------------------------------------------------------------------------ */

/* The receiver's answer is not read (libcurl would print it to stdout otherwise). */
static size_t discard(char *data, size_t size, size_t n, void *ctx) {
  (void)data, (void)ctx;
  return size * n;
}

/* What stays the same for every request of w. */
static CURL *webhook_curl(webhook *w) {
  CURL *curl = curl_easy_init();
  if (!curl) return NULL;
  curl_easy_setopt(curl, CURLOPT_URL, w->spec->url);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, w->headers);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "nas");
  /* Signals belong to the scheduler's loop; libcurl must not touch them from here. */
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)(NOTIFY_TIMEOUT_S * 1000));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)(NOTIFY_CONNECT_S * 1000));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, w->curl_error);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, cut_short);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, w->nt);
  return curl;
}

/* POSTs body once; when it fails, problem (cap bytes) says why. libcurl's messages name
 * the host and port, never the path. */
static post_result post_once(webhook *w, CURL *curl, const char *body, char *problem,
                             size_t cap) {
  if (!curl) {
    snprintf(problem, cap, "out of memory");
    return POST_REFUSED;
  }
  w->curl_error[0] = '\0';
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
  CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  if (rc == CURLE_ABORTED_BY_CALLBACK) {
    snprintf(problem, cap, "cut short at exit");
    return POST_REFUSED;
  }
  if (rc != CURLE_OK) {
    snprintf(problem, cap, "%s", w->curl_error[0] ? w->curl_error : curl_easy_strerror(rc));
    return POST_RETRY;
  }
  if (status >= 200 && status < 300) return POST_OK;
  snprintf(problem, cap, "HTTP %ld", status);
  return status >= 500 || status == 408 || status == 429 ? POST_RETRY : POST_REFUSED;
}

/* Posts one event, trying again after BACKOFF_FIRST_S, doubling, while it is worth it. */
static void deliver(webhook *w, CURL *curl, const queued_event *ev) {
  char problem[CURL_ERROR_SIZE + 64];
  double backoff = BACKOFF_FIRST_S;
  int attempts = 1;
  post_result result;
  while ((result = post_once(w, curl, ev->body, problem, sizeof problem)) == POST_RETRY &&
         attempts < NOTIFY_ATTEMPTS && wait_backoff(w->nt, backoff)) {
    attempts++;
    backoff = backoff * 2 < BACKOFF_MAX_S ? backoff * 2 : BACKOFF_MAX_S;
  }
  if (result != POST_OK)
    say("notify %s: %s not delivered (%d %s): %s", w->shown,
        spec_notify_event_name(ev->event), attempts, attempts == 1 ? "attempt" : "attempts",
        problem);
}

static void *webhook_main(void *arg) {
  webhook *w = arg;
  notifier *nt = w->nt;
  CURL *curl = webhook_curl(w);
  pthread_mutex_lock(&nt->lock);
  while (true) {
    while (w->count == 0 && !nt->closing) pthread_cond_wait(&nt->wake, &nt->lock);
    if (w->count == 0 || past_deadline_locked(nt)) break;
    queued_event ev = w->queue[w->head];
    w->head = (w->head + 1) % NOTIFY_QUEUE_CAP;
    w->count--;
    pthread_mutex_unlock(&nt->lock);
    deliver(w, curl, &ev);
    free(ev.body);
    pthread_mutex_lock(&nt->lock);
  }
  pthread_mutex_unlock(&nt->lock);
  curl_easy_cleanup(curl);
  return NULL;
}

/* ---- queueing --------------------------------------------------------------------------- */

/* Appends to w's queue (lock held), dropping the oldest event when it is full; returns how
 * many it dropped so far when that is due to be logged, else 0. */
static size_t enqueue_locked(webhook *w, notify_event event, char *body) {
  size_t to_log = 0;
  if (w->count == NOTIFY_QUEUE_CAP) {
    free(w->queue[w->head].body);
    w->head = (w->head + 1) % NOTIFY_QUEUE_CAP;
    w->count--;
    w->dropped++;
    double now = nas_monotonic();
    if (w->drop_logged == 0 || now - w->drop_logged >= DROP_LOG_EVERY_S) {
      w->drop_logged = now;
      to_log = w->dropped_told = w->dropped;
    }
  }
  w->queue[(w->head + w->count) % NOTIFY_QUEUE_CAP] = (queued_event){body, event};
  w->count++;
  return to_log;
}

/* text with Slack's three control characters escaped (its mrkdwn reads <…> as a link or
 * a mention, <!channel> pinging everyone, and & as an entity), so that an error message
 * or a name arrives as written; owned, NULL when out of memory. */
static char *slack_escaped(const char *text) {
  size_t len = 0;
  for (const char *p = text; *p; p++) len += *p == '&' ? 5 : *p == '<' || *p == '>' ? 4 : 1;
  char *out = malloc(len + 1), *o = out;
  for (const char *p = text; out && *p; p++) {
    const char *entity = *p == '&' ? "&amp;" : *p == '<' ? "&lt;" : *p == '>' ? "&gt;" : NULL;
    if (entity) o = stpcpy(o, entity);
    else *o++ = *p;
  }
  if (out) *o = '\0';
  return out;
}

/* The request body of event for w's format; owned, NULL when out of memory. */
static char *event_body(const webhook *w, const json_t *payload, const char *text) {
  if (w->spec->format == NOTIFY_JSON) return json_dumps(payload, JSON_COMPACT);
  char *escaped = slack_escaped(text);
  json_t *slack = escaped ? json_pack("{s:s}", "text", escaped) : NULL;
  char *body = slack ? json_dumps(slack, JSON_COMPACT) : NULL;
  json_decref(slack);
  free(escaped);
  return body;
}

void notifier_post(notifier *nt, notify_event event, const json_t *payload, const char *text) {
  for (size_t i = 0; nt && i < nt->n_hooks; i++) {
    webhook *w = &nt->hooks[i];
    if (!(w->spec->events & event)) continue;
    char *body = event_body(w, payload, text);
    if (!body) {
      say("notify %s: %s dropped: out of memory", w->shown, spec_notify_event_name(event));
      continue;
    }
    pthread_mutex_lock(&nt->lock);
    size_t dropped = enqueue_locked(w, event, body);
    pthread_cond_broadcast(&nt->wake);
    pthread_mutex_unlock(&nt->lock);
    if (dropped)
      say("notify %s: %d events wait for a slow receiver; dropped the oldest (%zu so far)",
          w->shown, NOTIFY_QUEUE_CAP, dropped);
  }
}

/* ---- start and close -------------------------------------------------------------------- */

static int webhook_init(notifier *nt, webhook *w, const notify_spec *spec, nas_err *err) {
  w->nt = nt;
  w->spec = spec;
  w->shown = spec_url_shown(spec->url);
  w->queue = calloc(NOTIFY_QUEUE_CAP, sizeof *w->queue);
  struct curl_slist *with_type = curl_slist_append(NULL, "Content-Type: application/json");
  /* No "Expect: 100-continue" round trip before a larger body. */
  w->headers = with_type ? curl_slist_append(with_type, "Expect:") : NULL;
  if (!w->headers) curl_slist_free_all(with_type);
  if (!w->shown || !w->queue || !w->headers) return nas_errf(err, "out of memory");
  return NAS_OK;
}

/* Starts w's thread with every signal blocked: signals are the scheduler loop's to wait
 * for, and one delivered to this thread instead would be lost to it. */
static int webhook_thread_start(webhook *w, nas_err *err) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&w->thread, NULL, webhook_main, w);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) return nas_errf(err, "cannot start a thread: %s", strerror(rc));
  w->started = true;
  return NAS_OK;
}

static int notifier_sync_init(notifier *nt, nas_err *err) {
  pthread_condattr_t attr;
  int rc = pthread_condattr_init(&attr);
  if (rc == 0) rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  if (rc == 0) rc = pthread_cond_init(&nt->wake, &attr);
  pthread_condattr_destroy(&attr);
  if (rc == 0 && (rc = pthread_mutex_init(&nt->lock, NULL)) != 0) pthread_cond_destroy(&nt->wake);
  return rc == 0 ? NAS_OK : nas_errf(err, "cannot make a lock: %s", strerror(rc));
}

int notifier_start(const notify_spec *targets, size_t n, notifier **out, nas_err *err) {
  *out = NULL;
  if (n == 0) return NAS_OK;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return nas_errf(err, "notify: libcurl cannot start");
  notifier *nt = calloc(1, sizeof *nt);
  if (!nt || notifier_sync_init(nt, err) != NAS_OK) {
    if (!nt) nas_errf(err, "out of memory");
    free(nt);
    curl_global_cleanup();
    return nas_err_prefix(err, "notify");
  }
  int rc = (nt->hooks = calloc(n, sizeof *nt->hooks)) ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    nt->n_hooks = i + 1;
    rc = webhook_init(nt, &nt->hooks[i], &targets[i], err);
  }
  for (size_t i = 0; rc == NAS_OK && i < n; i++) rc = webhook_thread_start(&nt->hooks[i], err);
  if (rc != NAS_OK) {
    notifier_close(nt);
    return nas_err_prefix(err, "notify");
  }
  *out = nt;
  return NAS_OK;
}

static void webhook_free(webhook *w) {
  if (w->dropped > w->dropped_told) /* drops after the last line about them */
    say("notify %s: dropped %zu events in all for a full queue", w->shown, w->dropped);
  if (w->count > 0)
    say("notify %s: gave up %zu undelivered events at exit (waited %g s)", w->shown, w->count,
        NOTIFY_FLUSH_S);
  for (; w->count > 0; w->count--, w->head = (w->head + 1) % NOTIFY_QUEUE_CAP)
    free(w->queue[w->head].body);
  free(w->queue);
  free(w->shown);
  curl_slist_free_all(w->headers);
}

void notifier_begin_close(notifier *nt) {
  if (!nt) return;
  pthread_mutex_lock(&nt->lock);
  if (!nt->closing) {
    nt->closing = true;
    nt->deadline = nas_monotonic() + NOTIFY_FLUSH_S;
  }
  pthread_cond_broadcast(&nt->wake);
  pthread_mutex_unlock(&nt->lock);
}

void notifier_close(notifier *nt) {
  if (!nt) return;
  notifier_begin_close(nt);
  for (size_t i = 0; i < nt->n_hooks; i++)
    if (nt->hooks[i].started) pthread_join(nt->hooks[i].thread, NULL);
  for (size_t i = 0; i < nt->n_hooks; i++) webhook_free(&nt->hooks[i]);
  free(nt->hooks);
  pthread_cond_destroy(&nt->wake);
  pthread_mutex_destroy(&nt->lock);
  free(nt);
  curl_global_cleanup();
}
