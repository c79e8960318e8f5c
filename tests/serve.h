/* tests/serve.h: a real `nas serve` for end-to-end tests, on 127.0.0.1 and a free port, and
 * requests to it made with the curl program. */
#ifndef NAS_TESTS_SERVE_H
#define NAS_TESTS_SERVE_H

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <jansson.h>

#include "common/common.h"
#include "tests/testutil.h"

typedef struct {
  pid_t pid;
  int port;
  char *log;  /* owned path of its stderr */
} test_server;

/* Starts `nas serve --storage DB --listen LISTEN [EXTRA…]` in dir; waits until it
 * listens. Returns false (and leaves the log) when it exits instead. */
static inline bool test_server_start_on(test_server *srv, const char *dir, const char *db,
                                        const char *listen, const char *const *extra) {
  srv->log = nas_asprintf("%s/serve-XXXXXX.log", dir);
  int log_fd = mkstemps(srv->log, 4); /* a name of its own for each server's log */
  assert_true(log_fd >= 0);
  close(log_fd);
  srv->port = -1;
  srv->pid = fork();
  assert_true(srv->pid >= 0);
  if (srv->pid == 0) {
    /* A test that fails half-way takes its server with it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd = open(srv->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || chdir(dir) != 0) _exit(126);
    dup2(fd, 1), dup2(fd, 2);
    const char *argv[16] = {test_nas_bin(), "serve", "--storage", db, "--listen", listen};
    for (size_t i = 0; extra && extra[i] && i < 9; i++) argv[6 + i] = extra[i];
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 200 && srv->port < 0; i++) {
    nas_sleep(0.025);
    char *text = NULL;
    nas_err ignored;
    if (nas_read_file(srv->log, &text, NULL, &ignored) == NAS_OK) {
      const char *at = strstr(text, "listening on port ");
      if (at) srv->port = atoi(at + strlen("listening on port "));
    }
    free(text);
    if (waitpid(srv->pid, NULL, WNOHANG) == srv->pid) return false;
  }
  return srv->port > 0;
}

/* On 127.0.0.1 and a free port. */
static inline bool test_server_start(test_server *srv, const char *dir, const char *db,
                                     const char *const *extra) {
  return test_server_start_on(srv, dir, db, "127.0.0.1:0", extra);
}

/* Kills the server with SIGKILL, as a crash would, and reaps it; its log stays. */
static inline void test_server_kill(test_server *srv) {
  kill(srv->pid, SIGKILL);
  waitpid(srv->pid, NULL, 0);
}

/* Stops the server with SIGTERM; returns its exit status. */
static inline int test_server_stop(test_server *srv) {
  kill(srv->pid, SIGTERM);
  int status = 0;
  waitpid(srv->pid, &status, 0);
  free(srv->log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Stops the server (test_server_stop, which must exit 0) and reads its group commit line,
 * "nas serve: N writes committed in M transactions", into *writes and *commits; fails the
 * test when there is none. */
static inline void test_server_stop_reading_commits(test_server *srv, unsigned long *writes,
                                                    unsigned long *commits) {
  char *log = strdup(srv->log), *text = NULL;
  assert_int_equal(test_server_stop(srv), 0);
  nas_err err;
  assert_int_equal(nas_read_file(log, &text, NULL, &err), NAS_OK);
  const char *line = strstr(text, " writes committed in ");
  while (line && line > text && line[-1] != '\n') line--;
  if (!line || sscanf(line, "nas serve: %lu writes committed in %lu transactions", writes,
                      commits) != 2)
    fail_msg("no group commit line in the server's log: %s", text);
  free(text), free(log);
}

/* METHOD path [body] with the extra request headers ("Name: value", NULL-terminated, or
 * NULL); returns the parsed JSON reply (owned) and its HTTP status in *code. */
static inline json_t *test_http_with(const test_server *srv, const char *method, const char *path,
                                     const char *body, const char *const *headers, int *code) {
  char *url = nas_asprintf("http://127.0.0.1:%d%s", srv->port, path);
  const char *argv[32] = {"curl", "-s", "-S", "-w", "\n%{http_code}", "-X", method, url};
  size_t n = 8;
  for (size_t i = 0; headers && headers[i] && n < 26; i++) argv[n++] = "-H", argv[n++] = headers[i];
  if (body) argv[n++] = "--data-binary", argv[n++] = body;
  char *out;
  assert_int_equal(test_run(NULL, (char *const *)argv, &out), 0);
  char *last = strrchr(out, '\n');
  assert_non_null(last);
  *code = atoi(last + 1);
  *last = '\0';
  json_t *reply = json_loads(out, 0, NULL);
  if (!reply) fail_msg("%s %s: reply is not JSON: %s", method, path, out);
  free(out), free(url);
  return reply;
}

/* METHOD path [body] with an optional bearer token (test_http_with). */
static inline json_t *test_http(const test_server *srv, const char *method, const char *path,
                                const char *body, const char *token, int *code) {
  char *auth = token ? nas_asprintf("Authorization: Bearer %s", token) : NULL;
  const char *headers[] = {auth, NULL};
  json_t *reply = test_http_with(srv, method, path, body, headers, code);
  free(auth);
  return reply;
}

#endif
