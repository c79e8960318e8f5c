/* serve/server.c: the HTTP side of `nas serve` on libmicrohttpd — listening, reading a
 * request's body within its limit, telling who the client is, answering, and one log line
 * per request (method, path, status, milliseconds; never a header, so never a token).
 *
 * libmicrohttpd calls the access handler several times per request: first with the
 * headers (the request's state is made, the client authorised and an oversized body
 * refused by its Content-Length, a refusal answered then, before any of the body is
 * read), then with each piece of the body, then once more with none, when the
 * request is answered. A thread pool serves connections; each handler takes a storage
 * connection of its own from the pool for the time it runs. A request whose write waits
 * for a group commit (commit.c) is suspended meanwhile, holding no thread, and answered
 * once resumed (the handler is called once more). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/internal.h"

enum {
  SERVE_CLIENT_TIMEOUT_S = 30,  /* a connection silent this long is closed */
  SERVE_CONNECTION_LIMIT = 256,
};

/* ---- replies -------------------------------------------------------------------------- */

void serve_reply(serve_request *req, int status, json_t *body) {
  json_decref(req->reply);
  req->status = status;
  req->reply = body;
}

int serve_fail(serve_request *req, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  serve_reply(req, status, json_pack("{s:s}", "error", msg));
  return NAS_ERR;
}

int serve_fail_err(serve_request *req, int code, const nas_err *err) {
  int status = code == NAS_ENOTFOUND ? MHD_HTTP_NOT_FOUND
               : code == NAS_EEXIST  ? MHD_HTTP_CONFLICT
                                     : MHD_HTTP_INTERNAL_SERVER_ERROR;
  return serve_fail(req, status, "%s", err->msg);
}

const char *serve_query(serve_request *req, const char *key) {
  return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

json_t *serve_body_json(serve_request *req) {
  if (req->body_len == 0) return json_object();
  json_error_t jerr;
  json_t *body = json_loadb(req->body, req->body_len, 0, &jerr);
  if (!body) {
    int line, column;
    nas_json_error_where(&jerr, &line, &column);
    serve_fail(req, MHD_HTTP_BAD_REQUEST, "the body is not JSON: %s at line %d column %d",
               jerr.text, line, column);
  } else if (!json_is_object(body)) {
    json_decref(body);
    body = NULL;
    serve_fail(req, MHD_HTTP_BAD_REQUEST, "the body must be a JSON object");
  }
  return body;
}

/* What every answer says besides its type: browsers take it for what its type says (never
 * sniff JSON into a page), and no other site may show it in a frame (clickjacking). */
static void add_safety_headers(struct MHD_Response *resp) {
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  MHD_add_response_header(resp, "Content-Security-Policy", "frame-ancestors 'none'");
}

static enum MHD_Result send_reply(serve_request *req) {
  json_t *body = req->reply ? req->reply : json_pack("{s:s}", "error", "no reply");
  char *text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(17));
  if (!req->reply) req->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
  if (!text) return MHD_NO;
  size_t len = strlen(text);
  text[len] = '\n'; /* the NUL's place: a newline ends the body, for people using curl */
  struct MHD_Response *resp = MHD_create_response_from_buffer(len + 1, text, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (req->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, req->allow);
  add_safety_headers(resp);
  enum MHD_Result rc = MHD_queue_response(req->conn, (unsigned)req->status, resp);
  MHD_destroy_response(resp);
  return rc;
}

/* A dashboard file: static bytes, never copied. */
static enum MHD_Result send_asset(serve_request *req) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(req->asset.size, (void *)req->asset.bytes,
                                                              MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, req->asset.type);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  add_safety_headers(resp);
  enum MHD_Result rc = MHD_queue_response(req->conn, (unsigned)req->status, resp);
  MHD_destroy_response(resp);
  return rc;
}

/* ---- who may do what ------------------------------------------------------------------ */

static bool client_is_loopback(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const struct sockaddr *sa = info ? info->client_addr : NULL;
  if (!sa) return false;
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return false;
}

static const char *header(struct MHD_Connection *conn, const char *name) {
  return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

/* Whether a browser may have sent the request from a page of another site (cross-site
 * request forgery): its Origin, which browsers send with every cross-site request and with
 * same-site writes, is not this server; or, with no token file, where the loopback client
 * alone is the credential, it is addressed to a name that is not loopback's (a page whose
 * own name was made to resolve to 127.0.0.1: DNS rebinding). A 403 reply when so. */
static bool from_another_site(serve_request *req) {
  const char *host = header(req->conn, MHD_HTTP_HEADER_HOST), *origin = header(req->conn, "Origin");
  if (origin && !serve_origin_is_host(origin, host)) {
    serve_fail(req, MHD_HTTP_FORBIDDEN, "requests from another site (Origin: %.100s) are refused",
               origin);
    return true;
  }
  if (req->srv->open_to_loopback && host && !serve_host_is_loopback(host)) {
    serve_fail(req, MHD_HTTP_FORBIDDEN, "this server has no token file and answers only requests "
               "addressed to 127.0.0.1, [::1] or localhost, not '%.100s'", host);
    return true;
  }
  return false;
}

/* The request's scope into req->scope; a 401/403 reply and false when it may do nothing. */
static bool authorise(serve_request *req) {
  serve_ctx *srv = req->srv;
  req->scope = SCOPE_NONE;
  if (from_another_site(req)) return false;
  if (srv->open_to_loopback) {
    req->scope = client_is_loopback(req->conn) ? SCOPE_WRITE : SCOPE_NONE;
    if (req->scope == SCOPE_NONE)
      serve_fail(req, MHD_HTTP_FORBIDDEN, "this server has no token file and serves loopback "
                                          "clients only");
    return req->scope != SCOPE_NONE;
  }
  const char *auth = header(req->conn, MHD_HTTP_HEADER_AUTHORIZATION);
  req->scope = serve_tokens_scope(&srv->tokens, auth);
  if (req->scope == SCOPE_NONE)
    serve_fail(req, MHD_HTTP_UNAUTHORIZED, auth ? "the bearer token is not valid"
                                                : "missing 'Authorization: Bearer TOKEN'");
  return req->scope != SCOPE_NONE;
}

/* ---- the request's life ---------------------------------------------------------------- */

static serve_request *request_new(serve_ctx *srv, struct MHD_Connection *conn, const char *url,
                                  const char *method) {
  serve_request *req = calloc(1, sizeof *req);
  if (!req) return NULL;
  *req = (serve_request){.srv = srv, .conn = conn, .method = method, .path = strdup(url),
                         .started = nas_monotonic(), .status = MHD_HTTP_OK};
  if (!req->path) {
    free(req);
    return NULL;
  }
  return req;
}

static void request_free(serve_request *req) {
  json_decref(req->reply);
  free(req->path);
  free(req->body);
  free(req);
}

/* Whether the announced body is larger than the limit (then it is not read at all). */
static bool announced_too_big(struct MHD_Connection *conn) {
  const char *length = header(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
  return length && strtoull(length, NULL, 10) > SERVE_BODY_LIMIT;
}

/* On a request's headers, before a byte of its body is read: whether to read it and answer
 * later. A dashboard file is for anyone (its body is never kept); any other request is
 * authorised first and its announced body's size checked, a refusal answered at once. */
static bool admit(serve_request *req) {
  if (serve_web_route(req)) return true;
  if (!authorise(req)) return false;
  if (!announced_too_big(req->conn)) return true;
  serve_fail(req, MHD_HTTP_CONTENT_TOO_LARGE, "the body is larger than %u bytes", SERVE_BODY_LIMIT);
  return false;
}

static void take_body(serve_request *req, const char *data, size_t size) {
  if (req->body_too_big || req->body_len + size > SERVE_BODY_LIMIT) {
    req->body_too_big = true;
    return;
  }
  char *grown = realloc(req->body, req->body_len + size + 1);
  if (!grown) {
    req->body_too_big = true; /* answered as too big: no memory to hold it */
    return;
  }
  memcpy(grown + req->body_len, data, size);
  req->body = grown;
  req->body_len += size;
  req->body[req->body_len] = '\0';
}

/* An admitted request, once its body is read. */
static void answer(serve_request *req) {
  nas_err err;
  if (req->body_too_big) {
    serve_fail(req, MHD_HTTP_CONTENT_TOO_LARGE, "the body is larger than %u bytes", SERVE_BODY_LIMIT);
    return;
  }
  if (serve_pool_take(&req->srv->pool, &req->st, &err) != NAS_OK) {
    serve_fail(req, MHD_HTTP_SERVICE_UNAVAILABLE, "%s", err.msg);
    return;
  }
  serve_route(req);
  serve_pool_give(&req->srv->pool, req->st);
  req->st = NULL;
}

/* The reply of a request whose write it was suspended for is done. */
static enum MHD_Result answer_waiting(serve_request *req) {
  serve_write *w = req->waiting;
  req->waiting = NULL;
  w->answer(req, w->arg);
  return send_reply(req);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state) {
  (void)version;
  serve_request *req = *state;
  if (!req) {
    if (!(*state = request_new(cls, conn, url, method))) return MHD_NO;
    req = *state;
    return admit(req) ? MHD_YES : send_reply(req);
  }
  if (*upload_size > 0) {
    if (!req->asset.bytes) take_body(req, upload_data, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (req->waiting) return answer_waiting(req);
  if (req->asset.bytes) return send_asset(req);
  answer(req);
  /* A request suspended for its write's group commit is answered when resumed. */
  return req->waiting ? MHD_YES : send_reply(req);
}

/* The method or path as the log shows it (owned; NULL without memory): libmicrohttpd has
 * decoded the path's %XX escapes and takes any byte in a method, so a control byte (a
 * newline would forge a log line, an escape sequence would drive the terminal showing it)
 * is escaped again. */
static char *log_text(const char *text) {
  char *shown = malloc(3 * strlen(text) + 1), *at = shown;
  for (const unsigned char *c = (const unsigned char *)text; shown && *c; c++)
    at += *c < 0x20 || *c == 0x7f ? sprintf(at, "%%%02X", *c) : sprintf(at, "%c", *c);
  if (shown) *at = '\0';
  return shown;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state,
                         enum MHD_RequestTerminationCode why) {
  (void)conn;
  serve_ctx *srv = cls;
  serve_request *req = *state;
  if (!req) return;
  /* Resumed but ended before it was answered: its write's state is freed. */
  if (req->waiting) req->waiting->answer(req, req->waiting->arg);
  double ms = (nas_monotonic() - req->started) * 1e3;
  char *method = srv->opt->log ? log_text(req->method) : NULL;
  char *path = srv->opt->log ? log_text(req->path) : NULL;
  if (srv->opt->log) /* one call: the lines of concurrent requests never interleave */
    fprintf(srv->opt->log, "%s %s %d %.1f ms%s\n", method ? method : "(method)",
            path ? path : "(path)", req->status, ms,
            why == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
  free(method);
  free(path);
  request_free(req);
  *state = NULL;
}

/* ---- start and stop ---------------------------------------------------------------------- */

/* HOST:PORT (HOST may be a name, an IPv4 address or [IPv6]; PORT 0 to 65535) into an
 * address to bind. The port is checked here: getaddrinfo takes any number and keeps its
 * low 16 bits, so 99999 would listen on 34463. */
/* Where the server listens: --listen, else loopback on nas's port. */
static const char *listen_address(const serve_options *opt) {
  return opt->listen ? opt->listen : "127.0.0.1:8470";
}

static int parse_listen(const char *listen, struct sockaddr_storage *addr, nas_err *err) {
  const char *colon = strrchr(listen, ':');
  if (!colon || colon == listen || !colon[1])
    return nas_errf(err, "--listen '%s': expected HOST:PORT, e.g. 127.0.0.1:8470", listen);
  long port;
  if (serve_parse_count(colon + 1, 65535, &port) != NAS_OK)
    return nas_errf(err, "--listen '%s': the port must be a number from 0 to 65535", listen);
  char host[256];
  size_t len = (size_t)(colon - listen);
  if (listen[0] == '[' && colon[-1] == ']') listen++, len -= 2;
  if (len >= sizeof host) return nas_errf(err, "--listen '%s': host name too long", listen);
  memcpy(host, listen, len);
  host[len] = '\0';
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *found = NULL;
  int rc = getaddrinfo(host, colon + 1, &hints, &found);
  if (rc != 0) return nas_errf(err, "--listen '%s': %s", listen, gai_strerror(rc));
  memcpy(addr, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  return NAS_OK;
}

static int bound_port(struct MHD_Daemon *d) {
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  return info ? info->port : -1;
}

/* Counts the client connections where writes are grouped (commit.c decides by it). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_state,
                          enum MHD_ConnectionNotificationCode what) {
  (void)conn;
  (void)socket_state;
  serve_ctx *srv = cls;
  if (srv->grouped_writes)
    serve_committer_count(&srv->committer, what == MHD_CONNECTION_NOTIFY_STARTED);
}

/* libmicrohttpd's first message, which says why it could not start (a certificate it
 * cannot use, an address taken): kept for the error. Later ones, about clients, are not
 * logged: a client could flood the log with them. */
static void on_mhd_message(void *cls, const char *fmt, va_list ap) {
  serve_ctx *srv = cls;
  if (atomic_exchange(&srv->mhd_spoke, true)) return;
  vsnprintf(srv->mhd_message, sizeof srv->mhd_message, fmt, ap);
  size_t len = strlen(srv->mhd_message);
  while (len > 0 && (srv->mhd_message[len - 1] == '\n' || srv->mhd_message[len - 1] == '.'))
    srv->mhd_message[--len] = '\0'; /* the error's own sentence ends it */
}

/* Decodes the %XX escapes of a path or query argument in place, as libmicrohttpd does,
 * but leaves one with an escaped NUL as it came: every handler reads C strings, so a NUL
 * would end the path early and the request would be answered for another one. */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *text) {
  (void)cls, (void)conn;
  return strstr(text, "%00") ? strlen(text) : MHD_http_unescape(text);
}

static struct MHD_Daemon *start_daemon(serve_ctx *srv, const struct sockaddr_storage *addr,
                                       char *cert, char *key) {
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  if (addr->ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  if (cert) flags |= MHD_USE_TLS;
  uint16_t port = ntohs(addr->ss_family == AF_INET6
                            ? ((const struct sockaddr_in6 *)addr)->sin6_port
                            : ((const struct sockaddr_in *)addr)->sin_port);
  return MHD_start_daemon(
      flags, port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_message, srv,
      MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
      MHD_OPTION_THREAD_POOL_SIZE, srv->threads, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)SERVE_CLIENT_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)SERVE_CONNECTION_LIMIT, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
      cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, cert, MHD_OPTION_HTTPS_MEM_KEY, key,
      MHD_OPTION_END);
}

/* Blocks until SIGINT or SIGTERM. */
static void wait_for_stop(void) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  int sig = 0;
  while (sigwait(&stop, &sig) != 0 || (sig != SIGINT && sig != SIGTERM)) {
  }
}

/* The PEM file at path (--tls-cert or --tls-key, named by option) into an owned *text,
 * read as serve_read_secret reads (a pipe, as from <(…), is fine; /dev/zero is not). */
static int read_pem(const char *option, const char *path, char **text, nas_err *err) {
  int rc = serve_read_secret(path, text, err);
  if (rc == NAS_OK && !strstr(*text, "-----BEGIN ")) {
    memset(*text, 0, strlen(*text));
    free(*text);
    *text = NULL;
    rc = nas_errf(err, "%s holds no PEM block ('-----BEGIN …')", path);
  }
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "%s", option);
}

static int read_tls(const serve_options *opt, char **cert, char **key, nas_err *err) {
  *cert = *key = NULL;
  if (!opt->tls_cert && !opt->tls_key) return NAS_OK;
  if (!opt->tls_cert || !opt->tls_key)
    return nas_errf(err, "--tls-cert and --tls-key go together");
  if (read_pem("--tls-cert", opt->tls_cert, cert, err) != NAS_OK) return NAS_ERR;
  if (read_pem("--tls-key", opt->tls_key, key, err) != NAS_OK) {
    free(*cert);
    *cert = NULL;
    return NAS_ERR;
  }
  return NAS_OK;
}

/* Tokens sent over plain HTTP can be read by anyone on the network between client and
 * server: says so when the server takes tokens, has no TLS and listens beyond loopback. */
static void warn_of_tokens_in_clear(const serve_options *opt, const char *cert) {
  const char *listen = listen_address(opt);
  if (!opt->log || !opt->token_file || cert || serve_host_is_loopback(listen)) return;
  fprintf(opt->log, "nas serve: warning: listening on %s without --tls-cert and --tls-key: "
                    "tokens cross the network in clear text\n", listen);
}

/* Serves at addr (with TLS when cert, key are given: PEM texts) until SIGINT or SIGTERM. */
static int serve_with(serve_ctx *srv, const struct sockaddr_storage *addr, char *cert, char *key,
                      nas_err *err) {
  const serve_options *opt = srv->opt;
  /* Signals are waited for here; the request threads inherit the mask and never see them. */
  sigset_t stop, old;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, &old);
  /* The committer (a thread and one more storage connection) only where writes are grouped. */
  int rc = srv->grouped_writes ? serve_committer_start(&srv->committer, &srv->pool, err) : NAS_OK;
  if (rc == NAS_OK) {
    struct MHD_Daemon *d = start_daemon(srv, addr, cert, key);
    if (d) {
      warn_of_tokens_in_clear(opt, cert);
      if (opt->on_listening) opt->on_listening(opt->on_listening_ctx, bound_port(d));
      wait_for_stop();
    } else {
      const char *listen = listen_address(opt);
      rc = !srv->mhd_spoke ? nas_errf(err, "cannot listen on %s: %s", listen, strerror(errno))
           : cert ? nas_errf(err, "cannot serve HTTPS on %s with --tls-cert %s and --tls-key %s "
                              "(a PEM certificate and its private key): %s", listen,
                              opt->tls_cert, opt->tls_key, srv->mhd_message)
                  : nas_errf(err, "cannot listen on %s: %s", listen, srv->mhd_message);
    }
    /* Every suspended request is resumed before the daemon stops, as libmicrohttpd needs. */
    if (srv->grouped_writes) serve_committer_stop(&srv->committer, &srv->pool);
    if (d) MHD_stop_daemon(d);
    if (srv->grouped_writes) serve_committer_free(&srv->committer);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int serve_run(const serve_options *opt, nas_err *err) {
  if (opt->threads > SERVE_THREADS_MOST)
    return nas_errf(err, "%u request threads: at most %d", opt->threads, SERVE_THREADS_MOST);
  serve_ctx srv = {.opt = opt, .open_to_loopback = !opt->token_file};
  srv.cwd = getcwd(NULL, 0);
  if (!srv.cwd) return nas_errf(err, "cannot read the current folder: %s", strerror(errno));
  /* Every option is checked before the storage is opened: a mistyped one must not leave
   * a new, empty SQLite file behind. */
  struct sockaddr_storage addr = {0};
  char *cert = NULL, *key = NULL;
  int rc = parse_listen(listen_address(opt), &addr, err);
  if (rc == NAS_OK) rc = read_tls(opt, &cert, &key, err);
  if (rc == NAS_OK && opt->token_file) rc = serve_tokens_load(opt->token_file, &srv.tokens, err);
  /* Room for one idle connection per thread of the most allowed: the threads in use
   * bound the connections open, since each holds at most one. */
  if (rc == NAS_OK) rc = serve_pool_init(&srv.pool, opt->storage_url, SERVE_THREADS_MOST, err);
  storage *first = NULL;
  if (rc == NAS_OK) rc = serve_pool_take(&srv.pool, &first, err);
  if (rc == NAS_OK) {
    /* Grouped where the storage can (SQLite): on PostgreSQL, writes of 8 and 32 clients
     * grouped through one committer ran 2.4-2.9x slower than a transaction per request
     * thread (bench/RESULTS.md, "Storage through `nas serve`"). */
    srv.grouped_writes = storage_can_group(first);
    bool on_sqlite = strcmp(storage_backend_name(first), "sqlite") == 0;
    serve_pool_give(&srv.pool, first);
    srv.threads = opt->threads ? opt->threads
                  : on_sqlite  ? SERVE_THREADS_SQLITE
                               : SERVE_THREADS_OTHER;
    if (opt->log) fprintf(opt->log, "nas serve: %u request threads\n", srv.threads);
    serve_notifiers_init(&srv.notifiers);
    rc = serve_with(&srv, &addr, cert, key, err);
    serve_notifiers_free(&srv.notifiers);
    if (opt->log && srv.grouped_writes && rc == NAS_OK) /* it served */
      fprintf(opt->log, "nas serve: %lu writes committed in %lu transactions\n",
              srv.committer.writes, srv.committer.commits);
    serve_pool_free(&srv.pool);
  }
  serve_tokens_free(&srv.tokens);
  free(cert);
  if (key) memset(key, 0, strlen(key));
  free(key);
  free(srv.cwd);
  return rc;
}
