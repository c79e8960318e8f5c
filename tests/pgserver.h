/* tests/pgserver.h: a throwaway PostgreSQL 15 server for test binaries and benchmarks.
 *
 * pgserver_start makes a temporary folder owned by the `postgres` user (PostgreSQL refuses
 * to run as root; when we are not root, the binaries run as ourselves), runs initdb there
 * (trust authentication, superuser `nas`, no fsync: the data is thrown away), and starts
 * the server on 127.0.0.1 at a free port with its unix socket in the same folder. Binaries
 * come from NAS_PG_BINDIR, else Debian's /usr/lib/postgresql/15/bin.
 *
 * Cleaning up never depends on the test reaching its end: a watchdog process, detached
 * from the terminal's signals, waits on a pipe that only this process holds open; when
 * the pipe closes (pgserver_stop, or this process dying in any way, even by SIGKILL) it
 * stops the server and removes the folder. pgserver_stop closes the pipe and waits.
 *
 * Commands run without a shell (fork and exec with argv); their output goes to
 * <dir>/commands.log and the server's to <dir>/server.log, whose tails explain a failure.
 * Functions return 0 on success, else -1 with the reason in why. */
#ifndef NAS_TESTS_PGSERVER_H
#define NAS_TESTS_PGSERVER_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PGSERVER_DEFAULT_BINDIR "/usr/lib/postgresql/15/bin"

typedef struct pgserver {
  char dir[256];      /* temporary folder: data/, the socket, logs */
  char bindir[256];   /* where initdb and pg_ctl are */
  int port;           /* on 127.0.0.1 */
  bool as_postgres;   /* we are root: run the binaries as the postgres user */
  pid_t watchdog;     /* stops the server and removes dir once watchdog_fd closes */
  int watchdog_fd;    /* write end of the watchdog's pipe, or -1 */
} pgserver;

/* Whether a server that cannot start is a failure (CI=true) rather than a reason to skip. */
static inline bool pgserver_required(void) {
  const char *ci = getenv("CI");
  return ci && strcmp(ci, "true") == 0;
}

static inline int pgserver_fail(char *why, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int pgserver_fail(char *why, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, size, fmt, ap);
  va_end(ap);
  return -1;
}

/* The last bytes of dir/name, on one line, into out. */
static inline void pgserver_log_tail(const pgserver *srv, const char *name, char *out,
                                     size_t size) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", srv->dir, name);
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  long keep = (long)size - 1;
  if (fseek(f, -keep, SEEK_END) != 0) rewind(f);
  size_t n = fread(out, 1, size - 1, f);
  out[n] = '\0';
  fclose(f);
  for (char *s = out; *s; s++) {
    if (*s == '\n' || *s == '\t') *s = ' ';
  }
}

/* Runs bindir/program with args (NULL-terminated) as the server's user, output appended to
 * commands.log; 0 when it exits 0. */
static inline int pgserver_run(const pgserver *srv, const char *program, const char *const *args) {
  char bin[512], log[512];
  snprintf(bin, sizeof bin, "%s/%s", srv->bindir, program);
  snprintf(log, sizeof log, "%s/commands.log", srv->dir);
  const char *argv[32];
  int n = 0;
  if (srv->as_postgres) {
    argv[n++] = "runuser";
    argv[n++] = "-u";
    argv[n++] = "postgres";
    argv[n++] = "--";
  }
  argv[n++] = bin;
  for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    /* pg_ctl start leaves the server running as a daemon: it must not inherit (and hold
     * open for its whole life) the caller's pipes and sockets. */
    closefrom(3);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* A TCP port on 127.0.0.1 that nothing listens on right now. */
static inline int pgserver_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
      getsockname(fd, (struct sockaddr *)&addr, &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

/* Settings appended to postgresql.conf: where to listen, and no durability (the data is
 * thrown away; WAL is still written, so a crash of the server alone loses no commit). */
static inline int pgserver_configure(const pgserver *srv, char *why, size_t size) {
  char path[512];
  snprintf(path, sizeof path, "%s/data/postgresql.conf", srv->dir);
  FILE *f = fopen(path, "a");
  if (!f) return pgserver_fail(why, size, "%s: %s", path, strerror(errno));
  fprintf(f,
          "\n# tests/pgserver.h\n"
          "listen_addresses = '127.0.0.1'\n"
          "port = %d\n"
          "unix_socket_directories = '%s'\n"
          "fsync = off\n"
          "full_page_writes = off\n",
          srv->port, srv->dir);
  return fclose(f) == 0 ? 0 : pgserver_fail(why, size, "%s: %s", path, strerror(errno));
}

/* Starts the stopped server and waits until it accepts connections. */
static inline int pgserver_up(pgserver *srv, char *why, size_t size) {
  char data[300], log[300];
  snprintf(data, sizeof data, "%s/data", srv->dir);
  snprintf(log, sizeof log, "%s/server.log", srv->dir);
  const char *args[] = {"-D", data, "-l", log, "-w", "-t", "60", "start", NULL};
  if (pgserver_run(srv, "pg_ctl", args) == 0) return 0;
  char tail[400];
  pgserver_log_tail(srv, "server.log", tail, sizeof tail);
  return pgserver_fail(why, size, "pg_ctl start failed; server.log ends: %s", tail);
}

/* Stops the server: mode "fast" (sessions are ended, transactions rolled back) or
 * "immediate" (a crash: the next start recovers from the WAL). */
static inline int pgserver_down(pgserver *srv, const char *mode, char *why, size_t size) {
  char data[300];
  snprintf(data, sizeof data, "%s/data", srv->dir);
  const char *args[] = {"-D", data, "-m", mode, "-w", "stop", NULL};
  if (pgserver_run(srv, "pg_ctl", args) == 0) return 0;
  return pgserver_fail(why, size, "pg_ctl stop -m %s failed (see %s/commands.log)", mode,
                       srv->dir);
}

/* The watchdog: waits for every write end of the pipe to close, then cleans up. It leaves
 * the terminal's process group and ignores its signals, so that a Ctrl-C that kills the
 * test still finds it there to stop the server. */
static inline void pgserver_watch(pgserver *srv, int read_fd) {
  setsid();
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  char byte;
  for (;;) {
    ssize_t got = read(read_fd, &byte, 1);
    if (got == 0 || (got < 0 && errno != EINTR)) break;
  }
  char why[64];
  pgserver_down(srv, "immediate", why, sizeof why);
  const char *rm[] = {"rm", "-rf", "--", srv->dir, NULL};
  pid_t pid = fork();
  if (pid == 0) {
    execvp("rm", (char *const *)rm);
    _exit(127);
  }
  if (pid > 0) waitpid(pid, NULL, 0);
  _exit(0);
}

static inline int pgserver_start_watchdog(pgserver *srv, char *why, size_t size) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return pgserver_fail(why, size, "pipe: %s", strerror(errno));
  fflush(NULL);
  srv->watchdog = fork();
  if (srv->watchdog < 0) return pgserver_fail(why, size, "fork: %s", strerror(errno));
  if (srv->watchdog == 0) {
    close(fds[1]);
    pgserver_watch(srv, fds[0]);
  }
  close(fds[0]);
  srv->watchdog_fd = fds[1];
  return 0;
}

/* Makes the folder and the cluster in it. */
static inline int pgserver_init(pgserver *srv, char *why, size_t size) {
  const char *base = getenv("TMPDIR");
  char dir[sizeof srv->dir];
  snprintf(dir, sizeof dir, "%s/nas-pg-XXXXXX", base && base[0] ? base : "/tmp");
  if (!mkdtemp(dir)) return pgserver_fail(why, size, "mkdtemp %s: %s", dir, strerror(errno));
  memcpy(srv->dir, dir, sizeof dir); /* from here on, stopping removes it */
  if (srv->as_postgres) {
    struct passwd *pw = getpwnam("postgres");
    if (!pw) return pgserver_fail(why, size, "we are root and there is no postgres user");
    if (chown(srv->dir, pw->pw_uid, pw->pw_gid) != 0) {
      return pgserver_fail(why, size, "chown %s: %s", srv->dir, strerror(errno));
    }
  }
  char data[300];
  snprintf(data, sizeof data, "%s/data", srv->dir);
  const char *args[] = {"-D", data, "-A", "trust", "-U", "nas", "-E", "UTF8", "--locale=C",
                        "--no-sync", "--no-instructions", NULL};
  if (pgserver_run(srv, "initdb", args) != 0) {
    char tail[400];
    pgserver_log_tail(srv, "commands.log", tail, sizeof tail);
    return pgserver_fail(why, size, "initdb failed: %s", tail);
  }
  return 0;
}

/* Stops the server and removes its folder (through the watchdog when there is one). */
static inline void pgserver_stop(pgserver *srv) {
  if (srv->watchdog_fd >= 0) {
    close(srv->watchdog_fd);
    srv->watchdog_fd = -1;
    waitpid(srv->watchdog, NULL, 0);
    return;
  }
  if (!srv->dir[0]) return;
  char why[64];
  pgserver_down(srv, "immediate", why, sizeof why);
  const char *rm[] = {"rm", "-rf", "--", srv->dir, NULL};
  pid_t pid = fork();
  if (pid == 0) {
    execvp("rm", (char *const *)rm);
    _exit(127);
  }
  if (pid > 0) waitpid(pid, NULL, 0);
}

static inline int pgserver_start(pgserver *srv, char *why, size_t size) {
  memset(srv, 0, sizeof *srv);
  srv->watchdog_fd = -1;
  const char *bindir = getenv("NAS_PG_BINDIR");
  snprintf(srv->bindir, sizeof srv->bindir, "%s", bindir ? bindir : PGSERVER_DEFAULT_BINDIR);
  srv->as_postgres = geteuid() == 0;
  char initdb[300];
  snprintf(initdb, sizeof initdb, "%s/initdb", srv->bindir);
  if (access(initdb, X_OK) != 0) {
    return pgserver_fail(why, size, "no PostgreSQL binaries: %s: %s (install postgresql-15, "
                         "e.g. `make deps-test`, or set NAS_PG_BINDIR)", initdb, strerror(errno));
  }
  srv->port = pgserver_free_port();
  int rc = srv->port > 0 ? 0 : pgserver_fail(why, size, "no free TCP port on 127.0.0.1");
  if (rc == 0) rc = pgserver_init(srv, why, size);
  if (rc == 0) rc = pgserver_configure(srv, why, size);
  if (rc == 0) rc = pgserver_up(srv, why, size);
  if (rc == 0) rc = pgserver_start_watchdog(srv, why, size);
  if (rc != 0) pgserver_stop(srv);
  return rc;
}

/* The owned URL of database dbname on the server, with password in it when not NULL (the
 * server trusts every local connection and never asks for it). */
static inline char *pgserver_url(const pgserver *srv, const char *dbname, const char *password) {
  char *url = NULL;
  int n = password ? asprintf(&url, "postgresql://nas:%s@127.0.0.1:%d/%s", password, srv->port,
                              dbname)
                   : asprintf(&url, "postgresql://nas@127.0.0.1:%d/%s", srv->port, dbname);
  return n < 0 ? NULL : url;
}

/* Runs sql (constant text, or names made with PQescapeIdentifier) in database dbname. */
static inline int pgserver_exec(const pgserver *srv, const char *dbname, const char *sql,
                                char *why, size_t size) {
  char *url = pgserver_url(srv, dbname, NULL);
  PGconn *pg = url ? PQconnectdb(url) : NULL;
  free(url);
  int rc = 0;
  if (!pg || PQstatus(pg) != CONNECTION_OK) {
    rc = pgserver_fail(why, size, "connect: %s", pg ? PQerrorMessage(pg) : "out of memory");
  } else {
    PGresult *res = PQexec(pg, sql);
    ExecStatusType status = PQresultStatus(res);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      rc = pgserver_fail(why, size, "%s: %s", sql, PQresultErrorMessage(res));
    }
    PQclear(res);
  }
  PQfinish(pg);
  return rc;
}

#endif
