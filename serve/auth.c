/* serve/auth.c: the token file of `nas serve --token-file FILE`.
 *
 * One token per line, with its scope: `read TOKEN` or `write TOKEN` (blank lines and lines
 * starting with # are skipped). A write token may do everything, a read token only GET
 * requests. The file holds secrets, so one that its group or others may read is refused,
 * as ssh refuses such a key. Tokens are compared in constant time, all of them every time,
 * so neither a token's content nor which one matched shows in the answer's timing. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "serve/internal.h"

/* The shortest token accepted: 16 bytes of randomness written in hex. */
#define SERVE_TOKEN_MIN_LEN 32

int serve_read_secret(const char *path, char **text, nas_err *err) {
  /* O_NONBLOCK only to open: a FIFO without a writer would make open wait for one. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return nas_errf(err, "%s: %s", path, strerror(errno));
  char *buf = malloc(SERVE_SECRET_MOST + 1);
  size_t n = 0;
  int rc = !buf                          ? nas_errf(err, "%s: out of memory", path)
           : fcntl(fd, F_SETFL, 0) != 0 ? nas_errf(err, "%s: %s", path, strerror(errno))
                                         : NAS_OK;
  while (rc == NAS_OK && n <= SERVE_SECRET_MOST) {
    ssize_t got = read(fd, buf + n, SERVE_SECRET_MOST + 1 - n);
    if (got == 0) break;
    if (got > 0) n += (size_t)got;
    else if (errno != EINTR) rc = nas_errf(err, "%s: %s", path, strerror(errno));
  }
  close(fd);
  if (rc == NAS_OK && n > SERVE_SECRET_MOST)
    rc = nas_errf(err, "%s: larger than %u bytes, more than a file of secrets holds", path,
                  SERVE_SECRET_MOST);
  if (rc == NAS_OK) {
    buf[n] = '\0';
    *text = buf;
  } else if (buf) {
    memset(buf, 0, n);
    free(buf);
  }
  return rc;
}

static int add_token(serve_tokens *t, serve_scope scope, const char *token, size_t len) {
  char **tokens = realloc(t->tokens, (t->n + 1) * sizeof *tokens);
  if (!tokens) return NAS_ERR;
  t->tokens = tokens;
  serve_scope *scopes = realloc(t->scopes, (t->n + 1) * sizeof *scopes);
  if (!scopes) return NAS_ERR;
  t->scopes = scopes;
  if (!(t->tokens[t->n] = strndup(token, len))) return NAS_ERR;
  t->scopes[t->n++] = scope;
  return NAS_OK;
}

/* One line "SCOPE TOKEN" (already known not to be blank or a comment). */
static int parse_line(serve_tokens *t, const char *path, int number, char *line, nas_err *err) {
  char *scope_word = strtok(line, " \t"), *token = strtok(NULL, " \t"), *extra = strtok(NULL, " \t");
  serve_scope scope = SCOPE_NONE;
  if (scope_word && strcmp(scope_word, "read") == 0) scope = SCOPE_READ;
  if (scope_word && strcmp(scope_word, "write") == 0) scope = SCOPE_WRITE;
  if (scope == SCOPE_NONE || !token || extra)
    return nas_errf(err, "%s:%d: expected 'read TOKEN' or 'write TOKEN'", path, number);
  if (strlen(token) < SERVE_TOKEN_MIN_LEN)
    return nas_errf(err, "%s:%d: a token needs at least %d characters (e.g. 'openssl rand "
                    "-hex 16')", path, number, SERVE_TOKEN_MIN_LEN);
  return add_token(t, scope, token, strlen(token)) == NAS_OK ? NAS_OK
                                                             : nas_errf(err, "out of memory");
}

int serve_tokens_load(const char *path, serve_tokens *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  char *text;
  if (nas_check_private(path, "token file", err) != NAS_OK || serve_read_secret(path, &text, err) != NAS_OK)
    return NAS_ERR;
  int rc = NAS_OK, number = 0;
  for (char *line = text, *next; rc == NAS_OK && line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    number++;
    while (isspace((unsigned char)*line)) line++;
    size_t len = strlen(line);
    while (len > 0 && isspace((unsigned char)line[len - 1])) line[--len] = '\0';
    if (len > 0 && line[0] != '#') rc = parse_line(out, path, number, line, err);
  }
  memset(text, 0, strlen(text));
  free(text);
  if (rc == NAS_OK && out->n == 0) rc = nas_errf(err, "token file %s holds no token", path);
  if (rc != NAS_OK) serve_tokens_free(out);
  return rc;
}

void serve_tokens_free(serve_tokens *t) {
  for (size_t i = 0; i < t->n; i++) {
    memset(t->tokens[i], 0, strlen(t->tokens[i]));
    free(t->tokens[i]);
  }
  free(t->tokens);
  free(t->scopes);
  memset(t, 0, sizeof *t);
}

/* Whether a equals b (of length len_b), in time that depends on len_b only. */
static bool same_secret(const char *a, const char *b, size_t len_b) {
  size_t len_a = strlen(a);
  unsigned char diff = len_a != len_b;
  for (size_t i = 0; i < len_b; i++) diff |= (unsigned char)(a[i < len_a ? i : 0] ^ b[i]);
  return diff == 0;
}

serve_scope serve_tokens_scope(const serve_tokens *t, const char *authorization) {
  /* "Bearer", in any case (HTTP's schemes are case-insensitive), then spaces. */
  static const char bearer[] = "Bearer";
  if (!authorization || strncasecmp(authorization, bearer, sizeof bearer - 1) != 0 ||
      authorization[sizeof bearer - 1] != ' ')
    return SCOPE_NONE;
  const char *given = authorization + sizeof bearer - 1;
  while (*given == ' ') given++;
  size_t len = strlen(given);
  serve_scope scope = SCOPE_NONE;
  for (size_t i = 0; i < t->n; i++)
    if (same_secret(t->tokens[i], given, len) && t->scopes[i] > scope) scope = t->scopes[i];
  return scope;
}
