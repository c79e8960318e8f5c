/* storage: the public face of storage/ (see storage.h).
 *
 * Picks the backend from the URL's scheme, checks the arguments once for every backend,
 * reads the clock, and names the operation in front of any error ("start trial 7: …").
 * Also holds what needs no database: trial status names, the trial state machine the
 * backends apply inside their transactions, row clean-up, and URL rewriting.
 * Invariants: a storage handle always has a backend and an open connection; URLs shown
 * to people pass through storage_url_redacted first, so no password reaches a message. */
#include "storage/storage.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <errno.h>

#include "storage/backend.h"

struct storage {
  const storage_backend *backend; /* borrowed, static */
  void *conn;                     /* owned by the backend */
  bool bare_errors;               /* failures without the operation in front (storage.h) */
  char *request_key;              /* owned: the armed idempotency key, or NULL */
  storage_watch watch;            /* handed to the backend by address */
};

/* Every backend this binary has, looked up by name from the URL's scheme. */
static const storage_backend *const storage_backends[] = {
    &storage_sqlite_backend, &storage_postgres_backend, &storage_http_backend};

static const char *const accepted_urls =
    "sqlite:PATH, sqlite:///ABSOLUTE/PATH, postgresql://… or postgres://…, http://HOST:PORT or "
    "https://HOST:PORT (a nas serve)";

const char *const storage_experiment_statuses[STORAGE_EXPERIMENT_STATUS_COUNT] = {
    "running", "finished", "stopped"};

/* ---- trial statuses ----------------------------------------------------------------- */

static const char *const trial_status_names[TRIAL_STATUS_COUNT] = {
    "queued", "running", "completed", "failed", "timeout", "stopped"};

const char *trial_status_name(trial_status status) {
  if ((unsigned)status >= TRIAL_STATUS_COUNT) return "unknown";
  return trial_status_names[status];
}

int trial_status_parse(const char *name, trial_status *out) {
  for (int i = 0; name && i < TRIAL_STATUS_COUNT; i++) {
    if (strcmp(name, trial_status_names[i]) == 0) {
      *out = (trial_status)i;
      return NAS_OK;
    }
  }
  return NAS_ERR;
}

bool trial_status_final(trial_status status) {
  return status == TRIAL_COMPLETED || status == TRIAL_FAILED || status == TRIAL_TIMEOUT ||
         status == TRIAL_STOPPED;
}

/* A final trial may start again: that is a retry (a new attempt of the same number). */
int storage_check_start(trial_status current, nas_err *err) {
  if (current == TRIAL_QUEUED || trial_status_final(current)) return NAS_OK;
  return nas_errf(err, "it is %s; only a queued trial, or a finished one to retry it, can start",
                  trial_status_name(current));
}

int storage_check_finish(trial_status current, trial_status to, nas_err *err) {
  /* A queued trial can only fail: its job could not be started at all. */
  if (current == TRIAL_RUNNING || (current == TRIAL_QUEUED && to == TRIAL_FAILED)) return NAS_OK;
  return nas_errf(err, "it is %s, not running", trial_status_name(current));
}

/* Only the attempt in progress beats: a late heartbeat of a finished attempt must not make
 * the trial look alive. */
int storage_check_heartbeat(trial_status current, nas_err *err) {
  if (current == TRIAL_RUNNING) return NAS_OK;
  return nas_errf(err, "it is %s, not running", trial_status_name(current));
}

/* A completion names the attempt it ends: one of an attempt since lost and handed out again
 * must not end (nor store values on) the attempt that now runs. */
int storage_check_complete(trial_status current, int attempts, int attempt, nas_err *err) {
  if (current != TRIAL_RUNNING)
    return nas_errc(err, NAS_EEXIST, "it is %s, not running", trial_status_name(current));
  if (attempts != attempt)
    return nas_errc(err, NAS_EEXIST, "it runs attempt %d, not attempt %d", attempts, attempt);
  return NAS_OK;
}

/* Only a trial that ended badly is run again; a completed or stopped one keeps its data. */
int storage_check_requeue(trial_status current, nas_err *err) {
  if (current == TRIAL_FAILED || current == TRIAL_TIMEOUT || current == TRIAL_STOPPED)
    return NAS_OK;
  return nas_errf(err, "it is %s; only a failed, timed-out or stopped trial can be retried",
                  trial_status_name(current));
}

/* A promotion takes a completed trial; a queued one is a promotion already made. */
int storage_check_promote(trial_status current, nas_err *err) {
  if (current == TRIAL_COMPLETED || current == TRIAL_QUEUED) return NAS_OK;
  return nas_errf(err, "it is %s; only a completed trial can be promoted",
                  trial_status_name(current));
}

/* ---- URLs ---------------------------------------------------------------------------- */

/* The sqlite file path inside url, or NULL when url is not an sqlite URL. The
 * "sqlite://" form must go on with an absolute path (sqlite:///abs/path); a bare
 * "sqlite://rel" yields "" so that it fails as an empty path would. */
static const char *sqlite_url_path(const char *url) {
  if (strncmp(url, "sqlite://", 9) == 0) return url[9] == '/' ? url + 9 : "";
  if (strncmp(url, "sqlite:", 7) == 0) return url + 7;
  return NULL;
}

static bool is_postgres_url(const char *url) {
  return strncmp(url, "postgresql://", 13) == 0 || strncmp(url, "postgres://", 11) == 0;
}

static bool is_http_url(const char *url) {
  return strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0;
}

static const storage_backend *backend_named(const char *name) {
  for (size_t i = 0; i < sizeof storage_backends / sizeof storage_backends[0]; i++) {
    if (strcmp(storage_backends[i]->name, name) == 0) return storage_backends[i];
  }
  return NULL;
}

/* The backend for url and the target string it opens (borrowed from url). */
static int url_backend(const char *url, const storage_backend **backend, const char **target,
                       nas_err *err) {
  const char *path = sqlite_url_path(url);
  if (path) {
    if (path[0] == '\0') {
      return nas_errf(err, "no database path (expected sqlite:PATH or sqlite:///ABSOLUTE/PATH)");
    }
    *backend = backend_named("sqlite");
    *target = path;
    return NAS_OK;
  }
  if (is_postgres_url(url) || is_http_url(url)) {
    *backend = backend_named(is_http_url(url) ? "http" : "postgresql");
    *target = url;
    return NAS_OK;
  }
  return nas_errf(err, "not a storage URL; accepted forms: %s", accepted_urls);
}

char *storage_url_absolute(const char *url) {
  const char *path = sqlite_url_path(url);
  if (!path || path[0] == '\0') return strdup(url);
  char *abs = nas_abspath(path, NULL);
  char *out = abs ? nas_asprintf("sqlite:%s", abs) : NULL;
  free(abs);
  return out;
}

/* Redaction errs toward hiding too much: an odd URL may lose more than its password, but
 * a password never shows. */

/* Writes a password of len bytes in its masked form. */
typedef void (*secret_put)(FILE *out, size_t len);

static void secret_put_hidden(FILE *out, size_t len) {
  (void)len;
  fputs("***", out);
}

/* As many '*' as the password has bytes: the text keeps its length. */
static void secret_put_starred(FILE *out, size_t len) {
  for (size_t i = 0; i < len; i++) fputc('*', out);
}

static bool key_ends_in(const char *key, size_t len, const char *suffix) {
  size_t suffix_len = strlen(suffix);
  return len >= suffix_len && strncasecmp(key + len - suffix_len, suffix, suffix_len) == 0;
}

bool storage_key_is_secret(const char *key, size_t len) {
  return key_ends_in(key, len, "password") || key_ends_in(key, len, "token") ||
         key_ends_in(key, len, "secret");
}

/* Whether a query parameter's key (len bytes, percent-encoded as libpq reads it) names a
 * secret once decoded. Only its last decoded bytes matter, so no copy is made. A key that
 * is not valid percent-encoding counts as secret: libpq refuses it, and guessing what it
 * meant could show a password. */
static bool uri_key_is_secret(const char *key, size_t len) {
  char tail[8]; /* the last decoded bytes, as many as "password" has */
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    char decoded = key[i];
    if (decoded == '%') {
      if (i + 2 >= len || !isxdigit((unsigned char)key[i + 1]) ||
          !isxdigit((unsigned char)key[i + 2]))
        return true;
      char hex[3] = {key[i + 1], key[i + 2], '\0'};
      decoded = (char)strtol(hex, NULL, 16);
      i += 2;
    }
    if (n == sizeof tail) memmove(tail, tail + 1, --n);
    tail[n++] = decoded;
  }
  return storage_key_is_secret(tail, n);
}

const char *storage_uri_secret_value(const char *param, size_t *len) {
  size_t key_len = strcspn(param, "=&#");
  if (param[key_len] != '=' || !uri_key_is_secret(param, key_len)) return NULL;
  const char *value = param + key_len + 1;
  *len = strcspn(value, "&#");
  return value;
}

/* URI form: scheme://user:password@host…?password=…&…. The user part ends at the last
 * '@' (an unencoded '@' or '/' inside a password must not end it early); from its first
 * ':' on it is the password. The values of secret query parameters (see
 * storage_uri_secret_value) are masked too, and those of the fragment (a dashboard link,
 * http://HOST/#token=…, given as a storage URL). */
static void redact_uri(FILE *out, const char *url, secret_put put) {
  const char *auth = strstr(url, "://") + 3;
  const char *at = strrchr(auth, '@');
  const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
  const char *s = url;
  if (colon) {
    fwrite(url, 1, (size_t)(colon + 1 - url), out);
    put(out, (size_t)(at - colon - 1));
    s = at;
  }
  while (*s) {
    bool param_start = s > url && (s[-1] == '?' || s[-1] == '&' || s[-1] == '#');
    size_t len = 0;
    const char *value = param_start ? storage_uri_secret_value(s, &len) : NULL;
    if (value) {
      fwrite(s, 1, (size_t)(value - s), out);
      put(out, len);
      s = value + len;
    } else {
      fputc(*s++, out);
    }
  }
}

/* The end of a conninfo value starting at s: 'quoted' with backslash escapes, or up to
 * the next blank (backslash escapes too). */
static const char *conninfo_value_end(const char *s) {
  if (*s == '\'') {
    for (s++; *s && *s != '\''; s++) {
      if (*s == '\\' && s[1]) s++;
    }
    return *s ? s + 1 : s;
  }
  for (; *s && *s != ' ' && *s != '\t' && *s != '\n'; s++) {
    if (*s == '\\' && s[1]) s++;
  }
  return s;
}

/* key=value form ("host=h password='p w' dbname=d"): the value of a secret key is masked;
 * when the text stops following the grammar, all the rest is. */
static void redact_conninfo(FILE *out, const char *s, secret_put put) {
  while (*s) {
    size_t blanks = strspn(s, " \t\n");
    fwrite(s, 1, blanks, out);
    s += blanks;
    if (!*s) break;
    size_t key_len = strcspn(s, "= \t\n");
    const char *eq = s + key_len + strspn(s + key_len, " \t\n");
    if (key_len == 0 || *eq != '=') {
      fputs("***", out);
      return;
    }
    const char *value = eq + 1 + strspn(eq + 1, " \t\n");
    const char *end = conninfo_value_end(value);
    fwrite(s, 1, (size_t)(value - s), out);
    if (storage_key_is_secret(s, key_len)) put(out, (size_t)(end - value));
    else fwrite(value, 1, (size_t)(end - value), out);
    s = end;
  }
}

/* The URL with every password written by put. Owned; NULL when out of memory. */
static char *url_masked(const char *url, secret_put put) {
  if (sqlite_url_path(url) || (!strstr(url, "://") && !strchr(url, '='))) return strdup(url);
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  if (!out) return NULL;
  if (strstr(url, "://")) redact_uri(out, url, put);
  else redact_conninfo(out, url, put);
  return nas_memstream_close(out, &buf, NULL) == NAS_OK ? buf : NULL;
}

char *storage_url_redacted(const char *url) { return url_masked(url, secret_put_hidden); }

bool storage_url_mask(char *url) {
  char *starred = url_masked(url, secret_put_starred);
  bool masked = !starred || strcmp(starred, url) != 0;
  if (starred && strlen(starred) == strlen(url)) memcpy(url, starred, strlen(url));
  else if (masked) memset(url, '*', strlen(url)); /* out of memory: hide it all */
  free(starred);
  return masked;
}

/* ---- open and close ------------------------------------------------------------------ */

int storage_open(const char *url, storage **out, nas_err *err) {
  return storage_open_with(url, 0, out, err);
}

int storage_open_with(const char *url, unsigned flags, storage **out, nas_err *err) {
  if (!url) return nas_errf(err, "open storage: no URL");
  const storage_backend *backend = NULL;
  const char *target = NULL;
  storage *st = NULL;
  int rc = url_backend(url, &backend, &target, err);
  if (rc == NAS_OK) {
    st = calloc(1, sizeof *st);
    rc = st ? NAS_OK : nas_errf(err, "out of memory");
  }
  if (rc == NAS_OK) {
    st->backend = backend;
    rc = backend->open(target, flags, &st->conn, err);
  }
  if (rc != NAS_OK) {
    free(st);
    char *shown = storage_url_redacted(url);
    nas_err_prefix(err, "storage %s", shown ? shown : "(out of memory)");
    free(shown);
    return rc;
  }
  *out = st;
  return NAS_OK;
}

void storage_close(storage *st) {
  if (!st) return;
  st->backend->close(st->conn);
  free(st->request_key);
  free(st);
}

bool storage_backoff_sleep(const storage_watch *watch, double seconds) {
  double until = nas_monotonic() + seconds;
  for (;;) {
    if (watch && watch->cancelled && watch->cancelled(watch->ctx)) return false;
    double left = until - nas_monotonic();
    if (left <= 0) return true;
    nas_sleep(fmin(left, STORAGE_WATCH_S));
  }
}

int storage_given_up_on_request(nas_err *err) {
  nas_err_prefix(err, "given up on request while the storage was out of reach");
  return NAS_ECANCELED;
}

int storage_retry_budget(double *seconds, nas_err *err) {
  const char *text = getenv("NAS_STORAGE_RETRY_S");
  *seconds = STORAGE_RETRY_DEFAULT_S;
  if (!text) return NAS_OK;
  char *end = NULL;
  errno = 0;
  double value = strtod(text, &end);
  if (errno || end == text || *end || !(value >= 0 && value <= STORAGE_RETRY_MAX_S)) {
    return nas_errf(err, "NAS_STORAGE_RETRY_S='%s' is not a number of seconds from 0 to %g",
                    text, STORAGE_RETRY_MAX_S);
  }
  *seconds = value;
  return NAS_OK;
}

int storage_random_token(char out[STORAGE_TOKEN_LEN + 1], nas_err *err) {
  unsigned char bytes[STORAGE_TOKEN_LEN / 2];
  if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes) {
    return nas_errf(err, "cannot draw a random token: %s", strerror(errno));
  }
  for (size_t i = 0; i < sizeof bytes; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
  return NAS_OK;
}

/* ---- idempotency keys and bare errors (the storage RPC) ------------------------------- */

void storage_bare_errors(storage *st, bool bare) { st->bare_errors = bare; }

/* NAS_OK when key is 1 to STORAGE_KEY_MAX of [A-Za-z0-9_-]. */
static int key_check(const char *key, nas_err *err) {
  size_t len = key ? strlen(key) : 0;
  bool plain = len >= 1 && len <= STORAGE_KEY_MAX &&
               strspn(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == len;
  if (plain) return NAS_OK;
  return nas_errf(err, "an idempotency key has 1 to %d of the characters A-Z a-z 0-9 _ -",
                  STORAGE_KEY_MAX);
}

void storage_set_watch(storage *st, storage_watch watch) {
  st->watch = watch;
  if (st->backend->set_watch) st->backend->set_watch(st->conn, &st->watch);
}

int storage_receipt_arm(storage *st, const char *key, nas_err *err) {
  if (key && key_check(key, err) != NAS_OK) return NAS_ERR;
  char *copy = key ? strdup(key) : NULL;
  if (key && !copy) return nas_errf(err, "out of memory");
  st->backend->receipt_arm(st->conn, copy);
  free(st->request_key);
  st->request_key = copy;
  return NAS_OK;
}

int storage_receipt_find(storage *st, const char *key, bool *found, int64_t *result,
                         nas_err *err) {
  *found = false;
  *result = 0;
  if (key_check(key, err) != NAS_OK) return NAS_ERR;
  return st->backend->receipt_find(st->conn, key, found, result, err);
}

const char *storage_backend_name(const storage *st) { return st->backend->name; }

bool storage_can_group(const storage *st) { return st->backend->group_begin != NULL; }

int storage_group_begin(storage *st, nas_err *err) {
  if (!storage_can_group(st))
    return nas_errf(err, "%s storage cannot group writes", st->backend->name);
  int rc = st->backend->group_begin(st->conn, err);
  if (rc != NAS_OK) nas_err_prefix(err, "begin a group of writes");
  return rc;
}

int storage_group_end(storage *st, bool commit, nas_err *err) {
  int rc = st->backend->group_end(st->conn, commit, err);
  if (rc != NAS_OK) nas_err_prefix(err, "commit a group of writes");
  return rc;
}

/* ---- operations ---------------------------------------------------------------------- */

/* Puts the operation in front of a failure's message and passes rc through (nas_err_prefix
 * alone would turn NAS_ENOTFOUND into NAS_ERR). */
static int in_context(const storage *st, int rc, nas_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int in_context(const storage *st, int rc, nas_err *err, const char *fmt, ...) {
  if (rc >= 0 || st->bare_errors) return rc;
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  nas_err_prefix(err, "%s", what);
  return rc;
}

/* Text is stored only as well-formed UTF-8: PostgreSQL refuses other bytes, and every row
 * goes out as JSON (the storage RPC, exports, the dashboard), which cannot carry them; one
 * such row stored would fail every listing that holds it. NULL passes. what_fmt names the
 * text ("spec path is"). */
static int check_text(const char *text, nas_err *err, const char *what_fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int check_text(const char *text, nas_err *err, const char *what_fmt, ...) {
  if (!text || nas_is_utf8(text)) return NAS_OK;
  char what[128];
  va_list ap;
  va_start(ap, what_fmt);
  vsnprintf(what, sizeof what, what_fmt, ap);
  va_end(ap);
  return nas_errf(err, "%s not valid UTF-8", what);
}

static int check_experiment_texts(const char *spec_text, const char *spec_path,
                                  const char *run_root, nas_err *err) {
  int rc = check_text(spec_text, err, "its spec text is");
  if (rc == NAS_OK) rc = check_text(spec_path, err, "its spec path is");
  if (rc == NAS_OK) rc = check_text(run_root, err, "its run root is");
  return rc;
}

int storage_experiment_create(storage *st, const char *name, const char *spec_text,
                              const char *spec_path, const char *run_root, int64_t *id,
                              nas_err *err) {
  if (!name) return nas_errf(err, "create experiment: no name");
  if (nas_check_experiment_name(name, err) != NAS_OK)
    return nas_err_prefix(err, "create experiment");
  if (!spec_text || !spec_path || !run_root) {
    return nas_errf(err, "create experiment '%s': spec text, spec path and run root are required",
                    name);
  }
  int rc = check_experiment_texts(spec_text, spec_path, run_root, err);
  if (rc == NAS_OK)
    rc = st->backend->experiment_create(st->conn, name, spec_text, spec_path, run_root,
                                        nas_now(), id, err);
  return in_context(st, rc, err, "create experiment '%s'", name);
}

int storage_experiment_get(storage *st, const char *name, experiment_row *out, nas_err *err) {
  if (!name) return nas_errf(err, "get experiment: no name");
  return in_context(st, st->backend->experiment_get(st->conn, name, out, err), err,
                    "get experiment '%s'", name);
}

int storage_experiment_list(storage *st, experiment_row **out, size_t *n, nas_err *err) {
  return in_context(st, st->backend->experiment_list(st->conn, out, n, err), err,
                    "list experiments");
}

static int check_experiment_status(const char *status, nas_err *err) {
  for (size_t i = 0; status && i < STORAGE_EXPERIMENT_STATUS_COUNT; i++)
    if (strcmp(status, storage_experiment_statuses[i]) == 0) return NAS_OK;
  return nas_errf(err, "'%s' is not running, finished or stopped", status ? status : "(null)");
}

int storage_experiment_set_status(storage *st, int64_t id, const char *status, bool *changed,
                                  nas_err *err) {
  if (check_experiment_status(status, err) != NAS_OK)
    return nas_err_prefix(err, "set status of experiment %" PRId64, id);
  bool ignored;
  return in_context(st,
                    st->backend->experiment_set_status(st->conn, id, status,
                                                       changed ? changed : &ignored, err),
                    err,
                    "set status of experiment %" PRId64, id);
}

int storage_experiment_set_spec(storage *st, int64_t id, const char *spec_text, nas_err *err) {
  if (!spec_text) return nas_errf(err, "set spec of experiment %" PRId64 ": no text", id);
  int rc = check_text(spec_text, err, "its spec text is");
  if (rc == NAS_OK) rc = st->backend->experiment_set_spec(st->conn, id, spec_text, err);
  return in_context(st, rc, err, "set spec of experiment %" PRId64, id);
}

/* Observation i names a metric and has a step >= 0 or METRIC_FINAL, and a finite time
 * (SQLite cannot store a NaN one, which PostgreSQL would). */
static int check_observation(size_t i, const char *name, int64_t step, double time,
                             nas_err *err) {
  if (!name || !name[0]) return nas_errf(err, "observation %zu has no name", i);
  if (check_text(name, err, "observation %zu's name is", i) != NAS_OK) return NAS_ERR;
  if (step < 0 && step != METRIC_FINAL) {
    return nas_errf(err, "observation %zu (%s) has step %" PRId64 "; steps are >= 0, or "
                    "METRIC_FINAL for a final value", i, name, step);
  }
  if (!isfinite(time))
    return nas_errf(err, "observation %zu (%s) has time %g; times are finite Unix seconds", i,
                    name, time);
  return NAS_OK;
}

int storage_experiment_delete(storage *st, int64_t id, nas_err *err) {
  return in_context(st, st->backend->experiment_delete(st->conn, id, err), err,
                    "delete experiment %" PRId64, id);
}

int storage_experiment_rename(storage *st, int64_t id, const char *new_name,
                              const char *spec_text, nas_err *err) {
  if (!new_name || !spec_text)
    return nas_errf(err, "rename experiment %" PRId64 ": no new name or spec text", id);
  if (nas_check_experiment_name(new_name, err) != NAS_OK)
    return nas_err_prefix(err, "rename experiment %" PRId64, id);
  int rc = check_text(spec_text, err, "its spec text is");
  if (rc == NAS_OK) rc = st->backend->experiment_rename(st->conn, id, new_name, spec_text, err);
  return in_context(st, rc, err, "rename experiment %" PRId64 " to '%s'", id, new_name);
}

/* The index into img->trials of each metric's trial (owned), or an error naming the first
 * metric whose trial is not in the image. */
static int image_metric_trials(const storage_experiment_image *img, size_t *index,
                               nas_err *err) {
  size_t t = 0; /* metrics usually come grouped by trial: look where the last one was first */
  for (size_t i = 0; i < img->n_metrics; i++) {
    int64_t want = img->metrics[i].trial_id;
    if (t >= img->n_trials || img->trials[t].id != want)
      for (t = 0; t < img->n_trials && img->trials[t].id != want; t++) {}
    if (t == img->n_trials)
      return nas_errf(err, "metric %zu belongs to trial %" PRId64 ", which is not copied", i,
                      want);
    index[i] = t;
  }
  return NAS_OK;
}

static int check_trial_texts(const char *params_json, const char *reference_json,
                             nas_err *err) {
  int rc = check_text(params_json, err, "its parameters are");
  if (rc == NAS_OK) rc = check_text(reference_json, err, "its reference point is");
  return rc;
}

/* The texts of trials an image (or a share of one) stores. */
static int image_trials_check(const trial_row *trials, size_t n, nas_err *err) {
  for (size_t i = 0; i < n; i++) {
    const trial_row *t = &trials[i];
    if (!t->params_json) return nas_errf(err, "trial %zu has no parameters", i);
    int rc = check_trial_texts(t->params_json, t->reference_json, err);
    if (rc == NAS_OK) rc = check_text(t->job_id, err, "its job id is");
    if (rc == NAS_OK) rc = check_text(t->error, err, "its error is");
    if (rc != NAS_OK) return nas_err_prefix(err, "trial %zu", i);
  }
  return NAS_OK;
}

static int image_check(const storage_experiment_image *img, nas_err *err) {
  const experiment_row *e = img->exp;
  if (!e || !e->name || !e->spec_text || !e->spec_path || !e->run_root || !e->status)
    return nas_errf(err, "the experiment lacks its name, spec, run root or status");
  if (nas_check_experiment_name(e->name, err) != NAS_OK) return NAS_ERR;
  int rc = check_experiment_texts(e->spec_text, e->spec_path, e->run_root, err);
  if (rc == NAS_OK) rc = check_experiment_status(e->status, err);
  if (rc == NAS_OK) rc = image_trials_check(img->trials, img->n_trials, err);
  if (rc != NAS_OK) return rc;
  for (size_t i = 0; i < img->n_metrics; i++)
    if (check_observation(i, img->metrics[i].name, img->metrics[i].step, img->metrics[i].time,
                          err) != NAS_OK)
      return NAS_ERR;
  return NAS_OK;
}

int storage_experiment_import(storage *st, const storage_experiment_image *img, int64_t *id,
                              nas_err *err) {
  size_t n = img->n_metrics ? img->n_metrics : 1;
  size_t *metric_trial = calloc(n, sizeof *metric_trial);
  metric_obs *obs = calloc(n, sizeof *obs);
  int rc = metric_trial && obs ? image_check(img, err) : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = image_metric_trials(img, metric_trial, err);
  for (size_t i = 0; rc == NAS_OK && i < img->n_metrics; i++) {
    const metric_row *m = &img->metrics[i];
    obs[i] = (metric_obs){.name = m->name, .step = m->step, .value = m->value, .time = m->time};
  }
  if (rc == NAS_OK)
    rc = st->backend->experiment_import(st->conn, img, obs, metric_trial, id, err);
  free(metric_trial);
  free(obs);
  return in_context(st, rc, err, "store experiment '%s'",
                    img->exp && img->exp->name ? img->exp->name : "(no name)");
}

int storage_trials_import(storage *st, int64_t experiment_id, const trial_row *trials, size_t n,
                          nas_err *err) {
  int rc = image_trials_check(trials, n, err);
  if (rc == NAS_OK) rc = st->backend->trials_import(st->conn, experiment_id, trials, n, err);
  return in_context(st, rc, err, "store %zu trials in experiment %" PRId64, n, experiment_id);
}

int storage_trial_create(storage *st, int64_t experiment_id, const char *params_json,
                         const char *reference_json, trial_row *out, nas_err *err) {
  if (!params_json) {
    return nas_errf(err, "create trial in experiment %" PRId64 ": no parameters", experiment_id);
  }
  int rc = check_trial_texts(params_json, reference_json, err);
  if (rc == NAS_OK)
    rc = st->backend->trial_create(st->conn, experiment_id, params_json, reference_json,
                                   nas_now(), out, err);
  return in_context(st, rc, err, "create trial in experiment %" PRId64, experiment_id);
}

int storage_trial_start(storage *st, int64_t trial_id, const char *job_id, nas_err *err) {
  if (!job_id) return nas_errf(err, "start trial %" PRId64 ": no job id", trial_id);
  int rc = check_text(job_id, err, "its job id is");
  if (rc == NAS_OK) rc = st->backend->trial_start(st->conn, trial_id, job_id, nas_now(), err);
  return in_context(st, rc, err, "start trial %" PRId64, trial_id);
}

int storage_trial_claim(storage *st, int64_t experiment_id, const char *worker, trial_row *out,
                        nas_err *err) {
  if (!worker || !worker[0]) {
    return nas_errf(err, "claim a trial of experiment %" PRId64 ": no worker name", experiment_id);
  }
  int rc = check_text(worker, err, "the worker's name is");
  if (rc == NAS_OK)
    rc = st->backend->trial_claim(st->conn, experiment_id, worker, nas_now(), out, err);
  return in_context(st, rc, err, "claim a trial of experiment %" PRId64 " for %s", experiment_id,
                    worker);
}

int storage_trial_heartbeat(storage *st, int64_t trial_id, nas_err *err) {
  return in_context(st, st->backend->trial_heartbeat(st->conn, trial_id, nas_now(), err), err,
                    "heartbeat of trial %" PRId64, trial_id);
}

int storage_trial_finish(storage *st, int64_t trial_id, trial_status status,
                         bool has_exit_code, int exit_code, const char *error, nas_err *err) {
  if (!trial_status_final(status) && status != TRIAL_QUEUED) {
    return nas_errf(err, "finish trial %" PRId64 ": %s is not a final status", trial_id,
                    trial_status_name(status));
  }
  /* The error comes from whatever ended the trial (a runner's output, a path): its outcome is
   * stored whatever bytes that holds, made UTF-8 (check_text says why). */
  char *repaired = NULL;
  if (error && !nas_is_utf8(error)) {
    if (!(repaired = nas_utf8_repaired(error)))
      return nas_errf(err, "finish trial %" PRId64 ": out of memory", trial_id);
    error = repaired;
  }
  int rc = st->backend->trial_finish(st->conn, trial_id, status, has_exit_code, exit_code, error,
                                     nas_now(), err);
  free(repaired);
  return in_context(st, rc, err, "finish trial %" PRId64 " as %s", trial_id,
                    trial_status_name(status));
}

int storage_trial_requeue(storage *st, int64_t trial_id, nas_err *err) {
  return in_context(st, st->backend->trial_requeue(st->conn, trial_id, err), err,
                    "retry trial %" PRId64, trial_id);
}

int storage_trial_promote(storage *st, int64_t trial_id, int rung, nas_err *err) {
  return in_context(st, st->backend->trial_promote(st->conn, trial_id, rung, err), err,
                    "promote trial %" PRId64 " from rung %d", trial_id, rung);
}

int storage_trial_get(storage *st, int64_t trial_id, trial_row *out, nas_err *err) {
  return in_context(st, st->backend->trial_get(st->conn, trial_id, out, err), err,
                    "get trial %" PRId64, trial_id);
}

int storage_trial_find(storage *st, int64_t experiment_id, int number, trial_row *out,
                       nas_err *err) {
  return in_context(st, st->backend->trial_find(st->conn, experiment_id, number, out, err), err,
                    "get trial %d of experiment %" PRId64, number, experiment_id);
}

int storage_trial_counts(storage *st, int64_t experiment_id,
                         int64_t by_status[TRIAL_STATUS_COUNT], nas_err *err) {
  memset(by_status, 0, TRIAL_STATUS_COUNT * sizeof *by_status);
  return in_context(st, st->backend->trial_counts(st->conn, experiment_id, by_status, err), err,
                    "count the trials of experiment %" PRId64, experiment_id);
}

int storage_trial_list(storage *st, int64_t experiment_id, trial_row **out, size_t *n,
                       nas_err *err) {
  return in_context(st, st->backend->trial_list(st->conn, experiment_id, out, n, err), err,
                    "list trials of experiment %" PRId64, experiment_id);
}

static int check_observations(const metric_obs *obs, size_t n, nas_err *err) {
  for (size_t i = 0; i < n; i++)
    if (check_observation(i, obs[i].name, obs[i].step, obs[i].time, err) != NAS_OK)
      return NAS_ERR;
  return NAS_OK;
}

int storage_trial_complete(storage *st, int64_t trial_id, int attempt, const metric_obs *obs,
                           size_t n, nas_err *err) {
  int rc = check_observations(obs, n, err);
  if (rc == NAS_OK)
    rc = st->backend->trial_complete(st->conn, trial_id, attempt, obs, n, nas_now(), err);
  return in_context(st, rc, err, "complete trial %" PRId64 " (attempt %d)", trial_id, attempt);
}

int storage_metrics_add(storage *st, int64_t trial_id, const metric_obs *obs, size_t n,
                        int64_t new_log_offset, nas_err *err) {
  int rc = check_observations(obs, n, err);
  if (rc == NAS_OK) rc = st->backend->metrics_add(st->conn, trial_id, obs, n, new_log_offset, err);
  return in_context(st, rc, err, "add metrics to trial %" PRId64, trial_id);
}

int storage_metrics_list(storage *st, int64_t experiment_id, metric_row **out, size_t *n,
                         nas_err *err) {
  return in_context(st, st->backend->metrics_list(st->conn, experiment_id, out, n, err), err,
                    "list metrics of experiment %" PRId64, experiment_id);
}

int storage_metrics_of_trial(storage *st, int64_t trial_id, metric_row **out, size_t *n,
                             nas_err *err) {
  return in_context(st, st->backend->metrics_of_trial(st->conn, trial_id, out, n, err), err,
                    "list metrics of trial %" PRId64, trial_id);
}

/* ---- the scheduler lease ------------------------------------------------------------- */

int storage_lease_take(storage *st, int64_t experiment_id, const char *token, const char *host,
                       int64_t pid, const char *replaces, nas_err *err) {
  if (!token || !token[0] || !host) {
    return nas_errf(err, "take the lease of experiment %" PRId64 ": no holder", experiment_id);
  }
  int rc = check_text(token, err, "the holder's token is");
  if (rc == NAS_OK) rc = check_text(host, err, "the holder's host name is");
  if (rc == NAS_OK) rc = check_text(replaces, err, "the token it replaces is");
  if (rc == NAS_OK)
    rc = st->backend->lease_take(st->conn, experiment_id, token, host, pid, replaces, nas_now(),
                                 err);
  return in_context(st, rc, err, "take the lease of experiment %" PRId64, experiment_id);
}

int storage_lease_renew(storage *st, int64_t experiment_id, const char *token, nas_err *err) {
  if (!token) return nas_errf(err, "renew the lease of experiment %" PRId64 ": no token", experiment_id);
  return in_context(st, st->backend->lease_renew(st->conn, experiment_id, token, nas_now(), err),
                    err, "renew the lease of experiment %" PRId64, experiment_id);
}

int storage_lease_release(storage *st, int64_t experiment_id, const char *token, nas_err *err) {
  if (!token) return NAS_OK;
  return in_context(st, st->backend->lease_release(st->conn, experiment_id, token, err), err,
                    "release the lease of experiment %" PRId64, experiment_id);
}

int storage_lease_get(storage *st, int64_t experiment_id, storage_lease *out, nas_err *err) {
  return in_context(st, st->backend->lease_get(st->conn, experiment_id, out, err), err,
                    "read the lease of experiment %" PRId64, experiment_id);
}

/* ---- rows ---------------------------------------------------------------------------- */

void experiment_row_clear(experiment_row *row) {
  if (!row) return;
  free(row->name);
  free(row->spec_text);
  free(row->spec_path);
  free(row->run_root);
  free(row->status);
  memset(row, 0, sizeof *row);
}

void experiment_rows_free(experiment_row *rows, size_t n) {
  for (size_t i = 0; rows && i < n; i++) experiment_row_clear(&rows[i]);
  free(rows);
}

void trial_row_clear(trial_row *row) {
  if (!row) return;
  free(row->params_json);
  free(row->job_id);
  free(row->error);
  free(row->reference_json);
  memset(row, 0, sizeof *row);
}

void trial_rows_free(trial_row *rows, size_t n) {
  for (size_t i = 0; rows && i < n; i++) trial_row_clear(&rows[i]);
  free(rows);
}

void storage_lease_clear(storage_lease *lease) {
  if (!lease) return;
  free(lease->token);
  free(lease->host);
  memset(lease, 0, sizeof *lease);
}

void metric_rows_free(metric_row *rows, size_t n) {
  for (size_t i = 0; rows && i < n; i++) free(rows[i].name);
  free(rows);
}
