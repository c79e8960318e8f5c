/* libFuzzer harness for what `nas serve` reads from a request itself (libmicrohttpd parses
 * the HTTP): the Authorization header against the server's tokens, the path against the
 * API's route patterns, counts in it, JSON bodies as reports, and the first line again as
 * a Host and an Origin header (serve/parse.c, serve/auth.c). Input: the header value, a
 * newline, the path, a newline, the body. It checks the contracts: a scope only for the
 * exact token, parts only on a match and each one segment of the path, observations only
 * from an object of numbers, an origin the server's only when it is the host after a
 * scheme, and no leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const patterns[] = {
    "/api/v1/experiments", "/api/v1/experiments/*", "/api/v1/experiments/*/trials/*",
    "/api/v1/experiments/*/trials/*/report", "/api/v1/*/*/*/*/*"};

static const char reader[] = "read-token-0123456789abcdef0123456789";
static const char writer[] = "write-token-0123456789abcdef012345678";

static void check_auth(const char *header) {
  char *tokens[] = {(char *)reader, (char *)writer};
  serve_scope scopes[] = {SCOPE_READ, SCOPE_WRITE};
  serve_tokens t = {.tokens = tokens, .scopes = scopes, .n = 2};
  serve_scope got = serve_tokens_scope(&t, header);
  /* The scheme in any case, one space or more, then exactly the token. */
  const char *given = strncasecmp(header, "Bearer ", 7) == 0 ? header + 7 : NULL;
  while (given && *given == ' ') given++;
  bool is_reader = given && strcmp(given, reader) == 0;
  bool is_writer = given && strcmp(given, writer) == 0;
  if (got != (is_writer ? SCOPE_WRITE : is_reader ? SCOPE_READ : SCOPE_NONE)) abort();
}

static void check_path(const char *path) {
  for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
    char *copy = strdup(path), *parts[4];
    size_t n = 0;
    if (!copy) return;
    if (serve_path_match(patterns[i], copy, parts, 4, &n)) {
      for (size_t k = 0; k < n; k++)
        if (!parts[k][0] || strchr(parts[k], '/')) abort();
    }
    free(copy);
    long count;
    if (serve_parse_count(path, 1000, &count) == NAS_OK && (count < 0 || count > 1000)) abort();
  }
}

static void check_site(const char *header) {
  serve_host_is_loopback(header);
  char *origin = malloc(strlen(header) + 8);
  if (!origin) return;
  strcpy(origin, "http://"), strcat(origin, header);
  if (!serve_origin_is_host(origin, header)) abort();
  if (serve_origin_is_host(header, header) || serve_origin_is_host(origin, NULL)) abort();
  free(origin);
}

static void check_body(const char *body, size_t len) {
  json_t *json = json_loadb(body, len, 0, NULL);
  if (!json) return;
  char why[256] = "";
  int64_t step;
  metric_obs *obs = NULL;
  size_t n = 0;
  if (serve_parse_step(json, &step, why, sizeof why) == NAS_OK &&
      serve_parse_metrics(json, true, step, 1.0, &obs, &n, why, sizeof why) == NAS_OK) {
    if (n == 0 || n != json_object_size(json_object_get(json, "metrics"))) abort();
    for (size_t i = 0; i < n; i++)
      if (!obs[i].name[0] || obs[i].step != step) abort();
  } else if (!why[0] || obs) {
    abort();
  }
  free(obs);
  json_decref(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = strndup((const char *)data, size);
  if (!text) return 0;
  char *path = strchr(text, '\n');
  char *body = path ? strchr(path + 1, '\n') : NULL;
  if (path) *path++ = '\0';
  if (body) *body++ = '\0';
  check_auth(text);
  check_site(text);
  if (path) check_path(path);
  if (body) check_body(body, strlen(body));
  free(text);
  return 0;
}
