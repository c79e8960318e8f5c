/* storage/http.c: the http backend of storage (URL http://HOST:PORT or https://HOST:PORT):
 * a `nas serve` in front of the real storage, for trials and workers on machines that
 * cannot reach the database. Each operation is one request of the storage RPC (rpc.h,
 * docs/storage-http.md), so every command works through it unchanged.
 *
 * The client is libcurl's easy interface, one handle per storage connection, so the TCP
 * (and TLS) connection is reused from one operation to the next. Each request waits at
 * most HTTP_CONNECT_TIMEOUT_S to connect and HTTP_TOTAL_TIMEOUT_S in all.
 *
 * Retries: a request that fails to connect, loses its connection, times out or is
 * answered 5xx is sent again, after a backoff that doubles from HTTP_BACKOFF_FIRST_S up to
 * HTTP_BACKOFF_MAX_S with random jitter (so that clients cut off together do not come back
 * together), for up to NAS_STORAGE_RETRY_S seconds (default 30; the first request of an
 * open only once with STORAGE_CONNECT_ONCE). Any other answer is final: the server's
 * error comes back with its code (NAS_ENOTFOUND, NAS_EEXIST) and message, after this
 * URL.
 *
 * Exactly once: a retried read, or idempotent write, does no harm. The writes that are not
 * idempotent (rpc.h says which) carry an Idempotency-Key header, random for each call of
 * the operation and the same on all its retries; the server commits the key in the same
 * transaction as the write and answers a repeated key from what it stored (storage.h), so
 * a report retried after a lost answer, or across a server killed and restarted, is
 * stored once. A key armed on this storage (a server whose own storage is another
 * server) is sent instead of a random one, so the key passes on to the server that keeps
 * the data; such a chain leaves the lookup to that last server (receipt_find finds
 * nothing here).
 *
 * Authentication: `Authorization: Bearer TOKEN` with the token from NAS_TOKEN, else from
 * the file named by NAS_TOKEN_FILE (its first line that is neither blank nor a # comment;
 * a file its group or others may read is refused, as `nas serve` refuses its token file);
 * never from the URL, which people see (a URL with user:password@ is refused). Without
 * either, no header is sent (a server without a token file serves loopback clients).
 * https:// verifies the server against the system's CA certificates, or against
 * NAS_CA_FILE (PEM) when set.
 *
 * Times: the server's storage reads its own clock; `now` from storage.c is not sent. */
#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "storage/backend.h"
#include "storage/rows_json.h"
#include "storage/rpc.h"

#define HTTP_CONNECT_TIMEOUT_S 5L
#define HTTP_TOTAL_TIMEOUT_S 30L
#define HTTP_BACKOFF_FIRST_S 0.025
#define HTTP_BACKOFF_MAX_S 1.0
#define HTTP_API_PREFIX "/api/v1/storage/"

typedef struct http_conn {
  CURL *curl;
  char *base;                 /* owned: the URL without a trailing '/' */
  char *shown;                /* owned: the URL as messages show it */
  char *auth;                 /* owned: "Authorization: Bearer TOKEN", or NULL */
  struct curl_slist *headers; /* owned: sent with every request */
  double retry_s;
  const char *request_key;    /* borrowed: the armed idempotency key, or NULL */
  const storage_watch *watch; /* borrowed: asked between retries; NULL when none is set */
  rows_json_doubles doubles;  /* how observations' doubles go: as the server says it reads */
  uint64_t jitter;            /* state of the backoff's random jitter */
  char *reply;                /* owned: the body of the last answer */
  size_t reply_len, reply_cap;
  char curl_error[CURL_ERROR_SIZE];
} http_conn;

/* ---- the answer's body ------------------------------------------------------------------- */

static size_t reply_write(char *data, size_t size, size_t count, void *ctx) {
  http_conn *c = ctx;
  size_t len = size * count;
  if (c->reply_len + len + 1 > c->reply_cap) {
    size_t cap = 2 * (c->reply_len + len + 1);
    char *grown = realloc(c->reply, cap);
    if (!grown) return 0; /* libcurl fails the transfer (CURLE_WRITE_ERROR) */
    c->reply = grown;
    c->reply_cap = cap;
  }
  memcpy(c->reply + c->reply_len, data, len);
  c->reply_len += len;
  c->reply[c->reply_len] = '\0';
  return len;
}

/* ---- one request, with retries ------------------------------------------------------------- */

/* Whether a transfer's failure may be cured by sending it again. */
static bool curl_retryable(CURLcode rc) {
  return rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT ||
         rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING ||
         rc == CURLE_PARTIAL_FILE || rc == CURLE_COULDNT_RESOLVE_HOST;
}

/* A number in [0, 1) from the connection's xorshift state. */
static double jitter_next(http_conn *c) {
  c->jitter ^= c->jitter << 13;
  c->jitter ^= c->jitter >> 7;
  c->jitter ^= c->jitter << 17;
  return (double)(c->jitter >> 11) / 9007199254740992.0;
}

/* Waits before the next try (a delay drawn from [delay/2, delay)): NAS_OK, NAS_ERR when
 * that would pass the deadline, or NAS_ECANCELED when the caller's watch said stop. */
static int backoff_wait(http_conn *c, double deadline, double *delay) {
  double wait = *delay * (0.5 + 0.5 * jitter_next(c));
  if (nas_monotonic() + wait > deadline) return NAS_ERR;
  *delay = fmin(2 * *delay, HTTP_BACKOFF_MAX_S);
  return storage_backoff_sleep(c->watch, wait) ? NAS_OK : NAS_ECANCELED;
}

/* One try: the transfer's code, and the HTTP status when there was an answer. */
static CURLcode try_once(http_conn *c, const char *url, const char *body,
                         struct curl_slist *headers, long *status) {
  c->reply_len = 0;
  *status = 0;
  curl_easy_setopt(c->curl, CURLOPT_URL, url);
  curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, headers);
  CURLcode rc = curl_easy_perform(c->curl);
  if (rc == CURLE_OK) curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, status);
  return rc;
}

/* The failure an answer other than 200 carries: the server's code and message. */
static int answer_failure(const http_conn *c, long status, nas_err *err) {
  json_t *body = json_loadb(c->reply ? c->reply : "", c->reply_len, 0, NULL);
  const char *msg = json_string_value(json_object_get(body, "error"));
  const char *code = json_string_value(json_object_get(body, "code"));
  int rc;
  if (msg && code) rc = nas_errc(err, rows_json_code_parse(code), "%s", msg);
  else if (msg && (status == 401 || status == 403)) /* a CLI user sets no header */
    rc = nas_errf(err, "HTTP %ld: %s (nas sends the token in $NAS_TOKEN, else the one in the "
                  "file $NAS_TOKEN_FILE names)", status, msg);
  else if (msg) rc = nas_errf(err, "HTTP %ld: %s", status, msg);
  else rc = nas_errf(err, "HTTP %ld without a storage answer (is it a nas serve?)", status);
  json_decref(body);
  return rc;
}

/* POSTs args to operation op (once when once is set, else retrying within the budget);
 * on 200, *reply gets the answer's owned JSON object. Its errors do not name the server:
 * its callers do, once (call; storage_open for the "open" handshake). */
static int call_with(http_conn *c, const char *op, const json_t *args, bool once,
                     json_t **reply, nas_err *err) {
  char key[STORAGE_TOKEN_LEN + 1] = "", key_header[32 + STORAGE_KEY_MAX];
  struct curl_slist key_node = {key_header, c->headers};
  const storage_rpc_op *rpc = storage_rpc_find(op);
  bool keyed = rpc && storage_rpc_keyed(rpc);
  if (keyed && !c->request_key && storage_random_token(key, err) != NAS_OK) return NAS_ERR;
  snprintf(key_header, sizeof key_header, "Idempotency-Key: %s",
           c->request_key ? c->request_key : key);
  char *url = nas_asprintf("%s" HTTP_API_PREFIX "%s", c->base, op);
  char *body = json_dumps(args, ROWS_JSON_DUMP_FLAGS);
  if (!url || !body) {
    free(url), free(body);
    return nas_errf(err, "out of memory");
  }
  double deadline = nas_monotonic() + (once ? 0 : c->retry_s), delay = HTTP_BACKOFF_FIRST_S;
  long status = 0;
  CURLcode rc;
  int waited = NAS_OK;
  for (;;) {
    rc = try_once(c, url, body, keyed ? &key_node : c->headers, &status);
    bool again = rc == CURLE_OK ? status >= 500 : curl_retryable(rc);
    if (!again || (waited = backoff_wait(c, deadline, &delay)) != NAS_OK) break;
  }
  free(url), free(body);
  int out;
  if (rc != CURLE_OK) {
    out = nas_errf(err, "%s", c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc));
  } else if (status != 200) {
    out = answer_failure(c, status, err);
  } else {
    json_error_t jerr;
    *reply = json_loadb(c->reply ? c->reply : "", c->reply_len, 0, &jerr);
    out = json_is_object(*reply) ? NAS_OK : nas_errf(err, "the answer is not a JSON object: %s",
                                                     jerr.text);
  }
  if (out != NAS_OK && waited == NAS_ECANCELED) return storage_given_up_on_request(err);
  if (out != NAS_OK && !once && curl_retryable(rc) && c->retry_s > 0)
    nas_err_prefix(err, "gave up after %g s of retries", c->retry_s);
  return out;
}

/* POSTs args (a JSON object, taken) to op; *reply (may be NULL when there is nothing to
 * read) gets the answer. */
static int call(http_conn *c, const char *op, json_t *args, json_t **reply, nas_err *err) {
  if (!args) return nas_errf(err, "out of memory");
  json_t *answer = NULL;
  int rc = call_with(c, op, args, false, &answer, err);
  if (rc != NAS_OK) nas_err_prefix(err, "%s", c->shown);
  json_decref(args);
  if (rc == NAS_OK && reply) *reply = answer;
  else json_decref(answer);
  return rc;
}

/* ---- opening --------------------------------------------------------------------------- */

/* The token in a token file's text: its first line that is neither blank nor a # comment,
 * without the blanks around it, as the Python client reads the same file. Points into
 * text, which it cuts there; NULL when there is none. */
static char *token_in_file_text(char *text) {
  char *line = text;
  while (*line) {
    size_t len = strcspn(line, "\r\n");
    char *next = line + len + strspn(line + len, "\r\n");
    line[len] = '\0';
    line += strspn(line, " \t");
    len = strlen(line);
    while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t')) line[--len] = '\0';
    if (len > 0 && line[0] != '#') return line;
    line = next;
  }
  return NULL;
}

/* The token from NAS_TOKEN, else from the file NAS_TOKEN_FILE names; NULL (and NAS_OK)
 * when neither is set. Owned. */
static int token_read(char **token, nas_err *err) {
  const char *env = getenv("NAS_TOKEN"), *file = getenv("NAS_TOKEN_FILE");
  *token = NULL;
  if (env && *env) return (*token = strdup(env)) ? NAS_OK : nas_errf(err, "out of memory");
  if (!file || !*file) return NAS_OK;
  char *text = NULL;
  size_t size;
  if (nas_check_private(file, "NAS_TOKEN_FILE", err) != NAS_OK) return NAS_ERR;
  if (nas_read_file(file, &text, &size, err) != NAS_OK)
    return nas_err_prefix(err, "NAS_TOKEN_FILE");
  const char *found = token_in_file_text(text);
  int rc = !found ? nas_errf(err, "NAS_TOKEN_FILE %s holds no token (a line that is neither "
                              "blank nor a # comment)", file)
           : (*token = strdup(found)) ? NAS_OK
                                      : nas_errf(err, "out of memory");
  memset(text, 0, size); /* a secret */
  free(text);
  return rc;
}

static int headers_make(http_conn *c, nas_err *err) {
  char *token = NULL;
  if (token_read(&token, err) != NAS_OK) return NAS_ERR;
  if (token) c->auth = nas_asprintf("Authorization: Bearer %s", token);
  if (token) memset(token, 0, strlen(token));
  bool lost = token && !c->auth; /* never sent without the token it was given */
  free(token);
  if (lost) return nas_errf(err, "out of memory");
  /* "Expect:" turns off libcurl's wait for "100 Continue" before larger bodies. */
  const char *fixed[] = {"Content-Type: application/json", "Expect:", c->auth};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
    if (!fixed[i]) continue;
    struct curl_slist *more = curl_slist_append(c->headers, fixed[i]);
    if (!more) return nas_errf(err, "out of memory");
    c->headers = more;
  }
  return NAS_OK;
}

static int curl_configure(http_conn *c, nas_err *err) {
  const char *ca = getenv("NAS_CA_FILE");
  bool ok = curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, reply_write) == CURLE_OK &&
            curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, c) == CURLE_OK &&
            curl_easy_setopt(c->curl, CURLOPT_ERRORBUFFER, c->curl_error) == CURLE_OK &&
            curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
            curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT, HTTP_CONNECT_TIMEOUT_S) == CURLE_OK &&
            curl_easy_setopt(c->curl, CURLOPT_TIMEOUT, HTTP_TOTAL_TIMEOUT_S) == CURLE_OK &&
            curl_easy_setopt(c->curl, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
            (!ca || !*ca || curl_easy_setopt(c->curl, CURLOPT_CAINFO, ca) == CURLE_OK);
  return ok ? NAS_OK : nas_errf(err, "libcurl refused an option (too old a libcurl?)");
}

static void http_close(void *conn) {
  http_conn *c = conn;
  if (!c) return;
  if (c->curl) curl_easy_cleanup(c->curl);
  curl_slist_free_all(c->headers);
  if (c->auth) memset(c->auth, 0, strlen(c->auth));
  free(c->auth);
  free(c->base);
  free(c->shown);
  free(c->reply);
  free(c);
  curl_global_cleanup();
}

/* The URL must name a server, and no credentials: those go in NAS_TOKEN. */
static int url_check(const char *target, nas_err *err) {
  const char *host = strstr(target, "://") + 3;
  size_t authority = strcspn(host, "/?#");
  if (authority == 0) return nas_errf(err, "no host in the URL (expected http://HOST:PORT)");
  if (memchr(host, '@', authority))
    return nas_errf(err, "credentials do not go in the URL, which others can see: put the token "
                         "in NAS_TOKEN or in a file named by NAS_TOKEN_FILE");
  if (strpbrk(host + authority, "?#"))
    return nas_errf(err, "a storage URL has no query or fragment");
  return NAS_OK;
}

/* Whether open's answer lists the bits format (servers before it answered {}). */
static bool server_reads_bits(const json_t *open_answer) {
  const json_t *formats = json_object_get(open_answer, "formats"), *format;
  size_t i;
  json_array_foreach(formats, i, format) {
    const char *name = json_string_value(format);
    if (name && strcmp(name, ROWS_JSON_BITS_FORMAT) == 0) return true;
  }
  return false;
}

static int http_open(const char *target, unsigned flags, void **conn, nas_err *err) {
  if (url_check(target, err) != NAS_OK) return NAS_ERR;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return nas_errf(err, "libcurl cannot start");
  http_conn *c = calloc(1, sizeof *c);
  if (!c) {
    curl_global_cleanup();
    return nas_errf(err, "out of memory");
  }
  char seed[STORAGE_TOKEN_LEN + 1];
  c->base = strdup(target);
  c->shown = storage_url_redacted(target);
  c->curl = curl_easy_init();
  int rc = c->base && c->shown && c->curl ? NAS_OK : nas_errf(err, "out of memory");
  if (rc == NAS_OK) {
    size_t len = strlen(c->base);
    while (len > 0 && c->base[len - 1] == '/') c->base[--len] = '\0';
    rc = storage_retry_budget(&c->retry_s, err);
  }
  if (rc == NAS_OK) rc = storage_random_token(seed, err);
  if (rc == NAS_OK) c->jitter = strtoull(seed + 16, NULL, 16) | 1;
  if (rc == NAS_OK) rc = headers_make(c, err);
  if (rc == NAS_OK) rc = curl_configure(c, err);
  json_t *args = rc == NAS_OK ? json_object() : NULL, *reply = NULL;
  if (rc == NAS_OK) rc = call_with(c, "open", args, flags & STORAGE_CONNECT_ONCE, &reply, err);
  if (rc == NAS_OK && server_reads_bits(reply)) c->doubles = ROWS_JSON_DOUBLES_BITS;
  json_decref(args);
  json_decref(reply);
  if (rc != NAS_OK) {
    http_close(c);
    return rc;
  }
  *conn = c;
  return NAS_OK;
}

/* ---- reading answers ---------------------------------------------------------------------- */

/* reply[key] as one row of kind into row; reply is freed. */
static int take_row(http_conn *c, json_t *reply, const char *key, const rows_json_kind *kind,
                    void *row, nas_err *err) {
  int rc = kind->from_json(json_object_get(reply, key), row, err);
  json_decref(reply);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "%s: the answer's '%s'", c->shown, key);
}

static int take_rows(http_conn *c, json_t *reply, const char *key, const rows_json_kind *kind,
                     void **rows, size_t *n, nas_err *err) {
  int rc = rows_json_array_read(kind, json_object_get(reply, key), rows, n, err);
  json_decref(reply);
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "%s: the answer's '%s'", c->shown, key);
}

/* An operation whose answer is one row under key. */
static int call_row(http_conn *c, const char *op, json_t *args, const char *key,
                    const rows_json_kind *kind, void *row, nas_err *err) {
  json_t *reply = NULL;
  int rc = call(c, op, args, &reply, err);
  return rc == NAS_OK ? take_row(c, reply, key, kind, row, err) : rc;
}

static int call_rows(http_conn *c, const char *op, json_t *args, const char *key,
                     const rows_json_kind *kind, void **rows, size_t *n, nas_err *err) {
  json_t *reply = NULL;
  int rc = call(c, op, args, &reply, err);
  return rc == NAS_OK ? take_rows(c, reply, key, kind, rows, n, err) : rc;
}

/* An operation whose answer is {"id"}. */
static int call_id(http_conn *c, const char *op, json_t *args, int64_t *id, nas_err *err) {
  json_t *reply = NULL;
  int rc = call(c, op, args, &reply, err);
  if (rc != NAS_OK) return rc;
  rows_json_reader r = {reply, err, NAS_OK};
  rows_json_int(&r, "id", id);
  json_decref(reply);
  return r.rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "%s: the answer", c->shown);
}

/* ---- experiments --------------------------------------------------------------------------- */

static int http_experiment_create(void *conn, const char *name, const char *spec_text,
                                  const char *spec_path, const char *run_root, double now,
                                  int64_t *id, nas_err *err) {
  (void)now;
  return call_id(conn, "experiment_create",
                 json_pack("{s:s, s:s, s:s, s:s}", "name", name, "spec_text", spec_text,
                           "spec_path", spec_path, "run_root", run_root),
                 id, err);
}

static int http_experiment_get(void *conn, const char *name, experiment_row *out, nas_err *err) {
  return call_row(conn, "experiment_get", json_pack("{s:s}", "name", name), "experiment",
                  &rows_json_experiment, out, err);
}

static int http_experiment_list(void *conn, experiment_row **out, size_t *n, nas_err *err) {
  return call_rows(conn, "experiment_list", json_object(), "experiments", &rows_json_experiment,
                   (void **)out, n, err);
}

/* A server older than "changed" answers {}: its callers all hear true, as they did. */
static int http_experiment_set_status(void *conn, int64_t id, const char *status,
                                      bool *changed, nas_err *err) {
  json_t *reply = NULL;
  int rc = call(conn, "experiment_set_status",
                json_pack("{s:I, s:s}", "id", (json_int_t)id, "status", status), &reply, err);
  const json_t *said = json_object_get(reply, "changed");
  *changed = rc == NAS_OK && (said ? json_is_true(said) : true);
  json_decref(reply);
  return rc;
}

static int http_experiment_set_spec(void *conn, int64_t id, const char *spec_text,
                                    nas_err *err) {
  return call(conn, "experiment_set_spec",
              json_pack("{s:I, s:s}", "id", (json_int_t)id, "spec_text", spec_text), NULL, err);
}

static int http_experiment_delete(void *conn, int64_t id, nas_err *err) {
  return call(conn, "experiment_delete", json_pack("{s:I}", "id", (json_int_t)id), NULL, err);
}

static int http_experiment_rename(void *conn, int64_t id, const char *new_name,
                                  const char *spec_text, nas_err *err) {
  return call(conn, "experiment_rename",
              json_pack("{s:I, s:s, s:s}", "id", (json_int_t)id, "new_name", new_name,
                        "spec_text", spec_text),
              NULL, err);
}

/* Sends the image alone: the server's storage.c derives obs and metric_trial again. */
static int http_experiment_import(void *conn, const storage_experiment_image *img,
                                  const metric_obs *obs, const size_t *metric_trial,
                                  int64_t *id, nas_err *err) {
  (void)obs, (void)metric_trial;
  return call_id(conn, "experiment_import", rows_json_image(img), id, err);
}

static int http_trials_import(void *conn, int64_t experiment_id, const trial_row *trials,
                              size_t n, nas_err *err) {
  return call(conn, "trials_import",
              json_pack("{s:I, s:o}", "experiment_id", (json_int_t)experiment_id, "trials",
                        rows_json_array(&rows_json_trial, trials, n)),
              NULL, err);
}

/* ---- trials -------------------------------------------------------------------------------- */

static int http_trial_create(void *conn, int64_t experiment_id, const char *params_json,
                             const char *reference_json, double now, trial_row *out,
                             nas_err *err) {
  (void)now;
  return call_row(conn, "trial_create",
                  json_pack("{s:I, s:s, s:o}", "experiment_id", (json_int_t)experiment_id,
                            "params_json", params_json, "reference_json",
                            reference_json ? json_string(reference_json) : json_null()),
                  "trial", &rows_json_trial, out, err);
}

static int http_trial_start(void *conn, int64_t trial_id, const char *job_id, double now,
                            nas_err *err) {
  (void)now;
  return call(conn, "trial_start",
              json_pack("{s:I, s:s}", "trial_id", (json_int_t)trial_id, "job_id", job_id), NULL,
              err);
}

static int http_trial_claim(void *conn, int64_t experiment_id, const char *worker, double now,
                            trial_row *out, nas_err *err) {
  (void)now;
  return call_row(conn, "trial_claim",
                  json_pack("{s:I, s:s}", "experiment_id", (json_int_t)experiment_id, "worker",
                            worker),
                  "trial", &rows_json_trial, out, err);
}

static int http_trial_heartbeat(void *conn, int64_t trial_id, double now, nas_err *err) {
  (void)now;
  return call(conn, "trial_heartbeat", json_pack("{s:I}", "trial_id", (json_int_t)trial_id),
              NULL, err);
}

static int http_trial_finish(void *conn, int64_t trial_id, trial_status status,
                             bool has_exit_code, int exit_code, const char *error, double now,
                             nas_err *err) {
  (void)now;
  return call(conn, "trial_finish",
              json_pack("{s:I, s:s, s:b, s:i, s:o}", "trial_id", (json_int_t)trial_id, "status",
                        trial_status_name(status), "has_exit_code", has_exit_code, "exit_code",
                        exit_code, "error", error ? json_string(error) : json_null()),
              NULL, err);
}

static int http_trial_complete(void *conn, int64_t trial_id, int attempt,
                               const metric_obs *obs, size_t n, double now, nas_err *err) {
  (void)now;
  http_conn *c = conn;
  return call(c, "trial_complete",
              json_pack("{s:I, s:i, s:o}", "trial_id", (json_int_t)trial_id, "attempt", attempt,
                        "observations", rows_json_observations(obs, n, c->doubles)),
              NULL, err);
}

static int http_trial_requeue(void *conn, int64_t trial_id, nas_err *err) {
  return call(conn, "trial_requeue", json_pack("{s:I}", "trial_id", (json_int_t)trial_id), NULL,
              err);
}

static int http_trial_promote(void *conn, int64_t trial_id, int rung, nas_err *err) {
  return call(conn, "trial_promote",
              json_pack("{s:I, s:i}", "trial_id", (json_int_t)trial_id, "rung", rung), NULL, err);
}

static int http_trial_get(void *conn, int64_t trial_id, trial_row *out, nas_err *err) {
  return call_row(conn, "trial_get", json_pack("{s:I}", "trial_id", (json_int_t)trial_id),
                  "trial", &rows_json_trial, out, err);
}

static int http_trial_find(void *conn, int64_t experiment_id, int number, trial_row *out,
                           nas_err *err) {
  return call_row(conn, "trial_find",
                  json_pack("{s:I, s:i}", "experiment_id", (json_int_t)experiment_id, "number",
                            number),
                  "trial", &rows_json_trial, out, err);
}

static int http_trial_list(void *conn, int64_t experiment_id, trial_row **out, size_t *n,
                           nas_err *err) {
  return call_rows(conn, "trial_list",
                   json_pack("{s:I}", "experiment_id", (json_int_t)experiment_id), "trials",
                   &rows_json_trial, (void **)out, n, err);
}

static int http_trial_counts(void *conn, int64_t experiment_id, int64_t *by_status,
                             nas_err *err) {
  json_t *reply = NULL;
  int rc = call(conn, "trial_counts",
                json_pack("{s:I}", "experiment_id", (json_int_t)experiment_id), &reply, err);
  if (rc != NAS_OK) return rc;
  rows_json_reader counts = {.obj = json_object_get(reply, "counts"), .err = err};
  if (!json_is_object(counts.obj)) counts.rc = nas_errf(err, "the answer has no 'counts' object");
  for (int s = 0; s < TRIAL_STATUS_COUNT; s++)
    rows_json_int(&counts, trial_status_name((trial_status)s), &by_status[s]);
  json_decref(reply);
  return counts.rc;
}

/* ---- metrics ------------------------------------------------------------------------------- */

static int http_metrics_add(void *conn, int64_t trial_id, const metric_obs *obs, size_t n,
                            int64_t new_log_offset, nas_err *err) {
  http_conn *c = conn;
  return call(c, "metrics_add",
              json_pack("{s:I, s:o, s:I}", "trial_id", (json_int_t)trial_id, "observations",
                        rows_json_observations(obs, n, c->doubles), "new_log_offset",
                        (json_int_t)new_log_offset),
              NULL, err);
}

static int http_metrics_list(void *conn, int64_t experiment_id, metric_row **out, size_t *n,
                             nas_err *err) {
  return call_rows(conn, "metrics_list",
                   json_pack("{s:I}", "experiment_id", (json_int_t)experiment_id), "metrics",
                   &rows_json_metric, (void **)out, n, err);
}

static int http_metrics_of_trial(void *conn, int64_t trial_id, metric_row **out, size_t *n,
                                 nas_err *err) {
  return call_rows(conn, "metrics_of_trial", json_pack("{s:I}", "trial_id", (json_int_t)trial_id),
                   "metrics", &rows_json_metric, (void **)out, n, err);
}

/* ---- the scheduler lease ------------------------------------------------------------------- */

static int http_lease_take(void *conn, int64_t experiment_id, const char *token,
                           const char *host, int64_t pid, const char *replaces, double now,
                           nas_err *err) {
  (void)now;
  return call(conn, "lease_take",
              json_pack("{s:I, s:s, s:s, s:I, s:o}", "experiment_id", (json_int_t)experiment_id,
                        "token", token, "host", host, "pid", (json_int_t)pid, "replaces",
                        replaces ? json_string(replaces) : json_null()),
              NULL, err);
}

static int http_lease_renew(void *conn, int64_t experiment_id, const char *token, double now,
                            nas_err *err) {
  (void)now;
  return call(conn, "lease_renew",
              json_pack("{s:I, s:s}", "experiment_id", (json_int_t)experiment_id, "token", token),
              NULL, err);
}

static int http_lease_release(void *conn, int64_t experiment_id, const char *token,
                              nas_err *err) {
  return call(conn, "lease_release",
              json_pack("{s:I, s:s}", "experiment_id", (json_int_t)experiment_id, "token", token),
              NULL, err);
}

static int http_lease_get(void *conn, int64_t experiment_id, storage_lease *out, nas_err *err) {
  return call_row(conn, "lease_get",
                  json_pack("{s:I}", "experiment_id", (json_int_t)experiment_id), "lease",
                  &rows_json_lease, out, err);
}

/* ---- idempotency keys -------------------------------------------------------------------- */

static void http_set_watch(void *conn, const storage_watch *watch) {
  http_conn *c = conn;
  c->watch = watch;
}

static void http_receipt_arm(void *conn, const char *key) {
  http_conn *c = conn;
  c->request_key = key;
}

/* The server that keeps the data looks keys up (see the top of this file). */
static int http_receipt_find(void *conn, const char *key, bool *found, int64_t *result,
                             nas_err *err) {
  (void)conn, (void)key, (void)err;
  *found = false;
  *result = 0;
  return NAS_OK;
}

const storage_backend storage_http_backend = {
    .name = "http",
    .open = http_open,
    .close = http_close,
    .experiment_create = http_experiment_create,
    .experiment_get = http_experiment_get,
    .experiment_list = http_experiment_list,
    .experiment_set_status = http_experiment_set_status,
    .experiment_set_spec = http_experiment_set_spec,
    .experiment_delete = http_experiment_delete,
    .experiment_rename = http_experiment_rename,
    .experiment_import = http_experiment_import,
    .trials_import = http_trials_import,
    .trial_create = http_trial_create,
    .trial_start = http_trial_start,
    .trial_claim = http_trial_claim,
    .trial_heartbeat = http_trial_heartbeat,
    .trial_finish = http_trial_finish,
    .trial_complete = http_trial_complete,
    .trial_requeue = http_trial_requeue,
    .trial_promote = http_trial_promote,
    .trial_get = http_trial_get,
    .trial_find = http_trial_find,
    .trial_list = http_trial_list,
    .trial_counts = http_trial_counts,
    .metrics_add = http_metrics_add,
    .metrics_list = http_metrics_list,
    .metrics_of_trial = http_metrics_of_trial,
    .lease_take = http_lease_take,
    .lease_renew = http_lease_renew,
    .lease_release = http_lease_release,
    .lease_get = http_lease_get,
    .receipt_arm = http_receipt_arm,
    .set_watch = http_set_watch,
    .receipt_find = http_receipt_find,
};
