/* bench/bench_storage.c: `make bench-storage` (BENCH.md section 4, storage part).
 *
 * Metric observations per second into SQLite and PostgreSQL with 1, 8 and 32 writer
 * processes at once (each its own connection and its own running trial, as trials
 * reporting with `nas report` are), one observation per call and a batch of 64 per call
 * (the scheduler reading a log), with the p50 and p99 latency of a call; then the latency
 * of storage_trial_claim, p50 and p99, with 1 and 8 processes claiming from the same queue.
 *
 * Backend "http" (`make bench-serve`, bench/serve.sh) is the http storage backend in front
 * of a `nas serve` ($NAS_BIN, default bin/nas) of a fresh SQLite file, started here for each
 * run: the same numbers through the server, beside the direct ones; "http-pg" the same in
 * front of a fresh schema of the PostgreSQL server below. With it comes the ask
 * latency: with 50 and 200 completed trials, the optimizer's own time for one suggestion
 * (results loaded, gp created, one suggest), `sched_ask` on the file directly (`nas ask`),
 * and `POST /ask` to the server (libcurl), medians of ASK_REPEATS (default 10) asks each.
 *
 * PostgreSQL is a throwaway server started here (tests/pgserver.h), switched to durable
 * commits (fsync = on, full_page_writes = on) so that it is compared with SQLite at
 * synchronous = FULL on the same disk. SQLite files go under $TMPDIR (or /tmp).
 *
 * Knobs (environment): SECONDS_PER_RUN (default 2), CLAIM_TRIALS (default 1000),
 * BACKENDS (default "sqlite,postgresql"; also http, http-pg), PG_FSYNC=off to measure PostgreSQL as the tests
 * run it; WRITERS and BATCHES (e.g. "32" and "64": only those throughput runs),
 * CLAIM_TRIALS=0 and ASK_REPEATS=0 to leave out the claims and the asks. Processes start together at an agreed moment of the monotonic clock, which all
 * processes of the machine share, and count what they finished before the end. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/common.h"
#include "scheduler/scheduler.h"
#include "storage/storage.h"
#include "tests/pgserver.h"

enum { BATCH_BIG = 64, MAX_PROCS = 32 };

typedef struct bench {
  const char *backend; /* "sqlite", "postgresql", "http" or "http-pg" */
  pgserver *server;    /* for postgresql and http-pg */
  pid_t serve_pid;     /* for http: the `nas serve` of the current run, or 0 */
  char *dir;           /* owned folder for SQLite files */
  int made;            /* storages made so far; names the next one */
  double seconds;      /* length of one throughput run */
} bench;

/* ---- storages ---------------------------------------------------------------------------- */

/* Stops the http backend's server of the previous run. */
static void serve_stop(bench *b) {
  if (b->serve_pid <= 0) return;
  kill(b->serve_pid, SIGTERM);
  waitpid(b->serve_pid, NULL, 0);
  b->serve_pid = 0;
}

/* Starts `nas serve` of db on a free loopback port, logging to a file beside db; its URL. */
static char *serve_start(bench *b, const char *db, int n) {
  char *log = nas_asprintf("%s/serve-%d.log", b->dir, n);
  const char *bin = getenv("NAS_BIN") ? getenv("NAS_BIN") : "bin/nas";
  fflush(NULL);
  b->serve_pid = fork();
  if (b->serve_pid == 0) {
    FILE *out = freopen(log, "w", stderr);
    if (out) execl(bin, bin, "serve", "--storage", db, "--listen", "127.0.0.1:0", (char *)NULL);
    _exit(127);
  }
  int port = -1;
  for (int i = 0; i < 400 && port < 0 && waitpid(b->serve_pid, NULL, WNOHANG) == 0; i++) {
    nas_sleep(0.01);
    char *text = NULL;
    nas_err ignored;
    const char *at = nas_read_file(log, &text, NULL, &ignored) == NAS_OK
                         ? strstr(text, "listening on port ") : NULL;
    if (at) port = atoi(at + strlen("listening on port "));
    free(text);
  }
  if (port < 0) fprintf(stderr, "bench_storage: %s serve did not start (%s)\n", bin, log);
  free(log);
  return port < 0 ? NULL : nas_asprintf("http://127.0.0.1:%d", port);
}

/* The owned URL of a new schema of the PostgreSQL server. */
static char *fresh_pg_url(bench *b, int n) {
  char sql[64], why[512];
  snprintf(sql, sizeof sql, "CREATE SCHEMA bench_%d", n);
  if (pgserver_exec(b->server, "postgres", sql, why, sizeof why) != 0) {
    fprintf(stderr, "bench_storage: %s\n", why);
    return NULL;
  }
  return nas_asprintf("postgresql://nas@127.0.0.1:%d/postgres?options=-csearch_path%%3Dbench_%d",
                      b->server->port, n);
}

/* The owned URL of a fresh storage: a new SQLite file, a new PostgreSQL schema, or a new
 * server of a new one of those. */
static char *fresh_url(bench *b) {
  int n = b->made++;
  bool served = strncmp(b->backend, "http", 4) == 0;
  bool pg = strcmp(b->backend, "postgresql") == 0 || strcmp(b->backend, "http-pg") == 0;
  char *db = pg ? fresh_pg_url(b, n) : nas_asprintf("sqlite:%s/bench-%d.db", b->dir, n);
  if (!served || !db) return db;
  serve_stop(b);
  char *url = serve_start(b, db, n);
  free(db);
  return url;
}

static storage *open_or_die(const char *url) {
  nas_err err = {{0}};
  storage *st = NULL;
  if (storage_open(url, &st, &err) != NAS_OK) {
    fprintf(stderr, "bench_storage: %s\n", err.msg);
    exit(1);
  }
  return st;
}

static void check(int rc, const nas_err *err) {
  if (rc == NAS_OK) return;
  fprintf(stderr, "bench_storage: %s\n", err->msg);
  exit(1);
}

/* ---- processes ----------------------------------------------------------------------------- */

/* What one process does; it writes its results to out_fd. */
typedef void (*proc_work)(const char *url, int64_t id, int batch, double start_at,
                          double end_at, int out_fd);

/* Runs n processes of work at once (process i gets ids[i]) and returns the read end of the
 * pipe they write to; the caller reads it to EOF and then calls wait_all. */
static int start_all(int n, proc_work work, const char *url, const int64_t *ids, int batch,
                     double start_at, double end_at, pid_t *pids) {
  int fds[2];
  if (pipe(fds) != 0) {
    perror("pipe");
    exit(1);
  }
  fflush(NULL);
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] < 0) {
      perror("fork");
      exit(1);
    }
    if (pids[i] == 0) {
      close(fds[0]);
      work(url, ids[i], batch, start_at, end_at, fds[1]);
      _exit(0);
    }
  }
  close(fds[1]);
  return fds[0];
}

static void wait_all(int n, const pid_t *pids) {
  for (int i = 0; i < n; i++) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "bench_storage: a process failed\n");
      exit(1);
    }
  }
}

static void sleep_until(double when) { nas_sleep(when - nas_monotonic()); }

/* ---- throughput ------------------------------------------------------------------------------ */

/* Adds batches of observations to its trial until end_at; writes the seconds each call took. */
static void writer(const char *url, int64_t trial_id, int batch, double start_at, double end_at,
                   int out_fd) {
  storage *st = open_or_die(url);
  metric_obs obs[BATCH_BIG];
  int64_t added = 0;
  nas_err err = {{0}};
  sleep_until(start_at);
  while (nas_monotonic() < end_at) {
    for (int k = 0; k < batch; k++) obs[k] = (metric_obs){"loss", added + k, 0.5, nas_now()};
    double began = nas_monotonic();
    check(storage_metrics_add(st, trial_id, obs, (size_t)batch, -1, &err), &err);
    double took = nas_monotonic() - began;
    if (write(out_fd, &took, sizeof took) != sizeof took) _exit(1);
    added += batch;
  }
  storage_close(st);
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct latency {
  size_t n;
  double p50_ms, p99_ms, per_s;
} latency;

/* The latency of n calls (sorted here) made in `wall` seconds. */
static latency latency_of(double *took, size_t n, double wall) {
  latency out = {n, 0, 0, 0};
  qsort(took, n, sizeof *took, compare_doubles);
  if (n) {
    out.p50_ms = 1e3 * took[n / 2];
    out.p99_ms = 1e3 * took[(size_t)(0.99 * (double)(n - 1))];
    out.per_s = (double)n / wall;
  }
  return out;
}

/* Reads the seconds each call took, written as doubles, until in closes. Owned. */
static double *read_took(int in, size_t *n) {
  size_t cap = 4096;
  double *took = malloc(cap * sizeof *took);
  *n = 0;
  while (took && read(in, &took[*n], sizeof *took) == sizeof *took) {
    if (++*n == cap) took = realloc(took, (cap *= 2) * sizeof *took);
  }
  close(in);
  if (!took) {
    fprintf(stderr, "bench_storage: out of memory\n");
    exit(1);
  }
  return took;
}

/* Calls per second (per_s) and their latency, of `writers` processes adding `batch`
 * observations per call. */
static latency throughput(bench *b, int writers, int batch) {
  char *url = fresh_url(b);
  storage *st = open_or_die(url);
  nas_err err = {{0}};
  int64_t experiment = 0, trials[MAX_PROCS] = {0};
  check(storage_experiment_create(st, "bench", "x", "/x", "/r", &experiment, &err), &err);
  for (int i = 0; i < writers; i++) {
    trial_row t;
    check(storage_trial_create(st, experiment, "{}", NULL, &t, &err), &err);
    check(storage_trial_start(st, t.id, "bench", &err), &err);
    trials[i] = t.id;
    trial_row_clear(&t);
  }
  storage_close(st);
  pid_t pids[MAX_PROCS];
  /* Time for every process to connect before the clock starts. */
  double start_at = nas_monotonic() + 0.5 + 0.02 * writers, end_at = start_at + b->seconds;
  int in = start_all(writers, writer, url, trials, batch, start_at, end_at, pids);
  size_t n = 0;
  double *took = read_took(in, &n);
  wait_all(writers, pids);
  free(url);
  latency out = latency_of(took, n, b->seconds);
  free(took);
  return out;
}

/* ---- claim latency --------------------------------------------------------------------------- */

/* Claims trials until none is queued; writes the seconds each claim took. */
static void claimer(const char *url, int64_t experiment, int batch, double start_at,
                    double end_at, int out_fd) {
  (void)batch, (void)end_at;
  storage *st = open_or_die(url);
  nas_err err = {{0}};
  sleep_until(start_at);
  for (;;) {
    trial_row t;
    double began = nas_monotonic();
    int rc = storage_trial_claim(st, experiment, "bench", &t, &err);
    double took = nas_monotonic() - began;
    if (rc == NAS_ENOTFOUND) break;
    check(rc, &err);
    trial_row_clear(&t);
    if (write(out_fd, &took, sizeof took) != sizeof took) _exit(1);
  }
  storage_close(st);
}

/* Latency of claims by `claimers` processes emptying a queue of `queued` trials. */
static latency claim_latency(bench *b, int claimers, int queued) {
  char *url = fresh_url(b);
  storage *st = open_or_die(url);
  nas_err err = {{0}};
  int64_t experiment = 0;
  check(storage_experiment_create(st, "bench", "x", "/x", "/r", &experiment, &err), &err);
  for (int i = 0; i < queued; i++) {
    trial_row t;
    check(storage_trial_create(st, experiment, "{}", NULL, &t, &err), &err);
    trial_row_clear(&t);
  }
  storage_close(st);
  int64_t ids[MAX_PROCS] = {0};
  for (int i = 0; i < claimers; i++) ids[i] = experiment;
  pid_t pids[MAX_PROCS];
  double start_at = nas_monotonic() + 0.5;
  int in = start_all(claimers, claimer, url, ids, 0, start_at, 0, pids);
  size_t n = 0;
  double *took = read_took(in, &n);
  wait_all(claimers, pids);
  latency out = latency_of(took, n, nas_monotonic() - start_at);
  free(took);
  free(url);
  return out;
}

/* ---- main ---------------------------------------------------------------------------------------- */

static double env_number(const char *name, double fallback) {
  const char *text = getenv(name);
  return text && text[0] ? strtod(text, NULL) : fallback;
}

/* Whether the comma-separated list names name. */
static bool wanted(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *at = list; (at = strstr(at, name)); at += len)
    if ((at == list || at[-1] == ',') && (at[len] == ',' || at[len] == '\0')) return true;
  return false;
}

/* Whether the throughput run of `writers` writers and `batch` observations a call is
 * asked for: WRITERS and BATCHES are lists such as "1,32" (unset: all). */
static bool case_wanted(int writers, int batch) {
  char w[16], k[16];
  snprintf(w, sizeof w, "%d", writers);
  snprintf(k, sizeof k, "%d", batch);
  const char *ws = getenv("WRITERS"), *ks = getenv("BATCHES");
  return (!ws || !ws[0] || wanted(ws, w)) && (!ks || !ks[0] || wanted(ks, k));
}

static void run_backend(bench *b, int claim_trials) {
  const int writer_counts[] = {1, 8, 32}, batches[] = {1, BATCH_BIG};
  for (size_t w = 0; w < 3; w++) {
    for (size_t k = 0; k < 2; k++) {
      if (!case_wanted(writer_counts[w], batches[k])) continue;
      latency l = throughput(b, writer_counts[w], batches[k]);
      printf("| %-10s | metrics_add | %2d writers | batch %2d | %10.0f obs/s | p50 %.3f ms, "
             "p99 %.3f ms |\n", b->backend, writer_counts[w], batches[k],
             l.per_s * batches[k], l.p50_ms, l.p99_ms);
      fflush(stdout);
    }
  }
  const int claimer_counts[] = {1, 8};
  for (size_t c = 0; claim_trials > 0 && c < 2; c++) {
    latency l = claim_latency(b, claimer_counts[c], claim_trials);
    printf("| %-10s | trial_claim | %2d claimers | %zu claims | p50 %.3f ms, p99 %.3f ms, "
           "%.0f claims/s |\n",
           b->backend, claimer_counts[c], l.n, l.p50_ms, l.p99_ms, l.per_s);
    fflush(stdout);
  }
}

/* Durable commits, as a production server has them (the test settings turn them off). */
/* ---- ask latency --------------------------------------------------------------------------- */

static const char ask_spec[] =
    "name: asked\n"
    "seed: 5\n"
    "parameters:\n"
    "  a: {type: float, low: 0, high: 1}\n"
    "  b: {type: float, low: 0, high: 1}\n"
    "  c: {type: float, low: 0, high: 1}\n"
    "  d: {type: float, low: 0, high: 1}\n"
    "objectives: [{name: f1, goal: minimize}, {name: f2, goal: minimize}]\n"
    "budget: {trials: 100000}\n";

/* Stores n completed trials at random points of two smooth objectives. */
static int fill_observations(storage *st, const experiment_row *exp, int n, nas_err *err) {
  unsigned seed = 7;
  for (int i = 0; i < n; i++) {
    double x[4];
    for (int k = 0; k < 4; k++) x[k] = rand_r(&seed) / (double)RAND_MAX;
    char *params = nas_asprintf("{\"a\":%.17g,\"b\":%.17g,\"c\":%.17g,\"d\":%.17g}", x[0], x[1], x[2], x[3]);
    metric_obs obs[2] = {{"f1", METRIC_FINAL, x[0] + 0.1 * x[2], nas_now()},
                         {"f2", METRIC_FINAL, 1 - sqrt(x[0]) + x[1] * x[3], nas_now()}};
    trial_row t;
    int rc = storage_trial_create(st, exp->id, params, NULL, &t, err);
    free(params);
    if (rc == NAS_OK) rc = storage_trial_start(st, t.id, "bench", err);
    if (rc == NAS_OK) rc = storage_metrics_add(st, t.id, obs, 2, -1, err);
    if (rc == NAS_OK) rc = storage_trial_finish(st, t.id, TRIAL_COMPLETED, true, 0, NULL, err);
    trial_row_clear(&t);
    if (rc != NAS_OK) return rc;
  }
  return NAS_OK;
}

/* The optimizer's own time for one suggestion, as ask makes it (nothing stored). */
static double optimizer_ms(storage *st, const spec *s, const experiment_row *exp, nas_err *err) {
  double t0 = nas_monotonic();
  sched_results r;
  optimizer *opt = NULL;
  json_t *out[1] = {NULL};
  if (sched_results_load(st, s, exp->id, &r, err) != NAS_OK) return -1;
  size_t n = 0;
  observation *obs = calloc(r.n_trials + 1, sizeof *obs);
  json_t **params = calloc(r.n_trials + 1, sizeof *params);
  for (size_t i = 0; obs && params && i < r.n_trials; i++) {
    if (r.trials[i].status != TRIAL_COMPLETED) continue;
    params[n] = json_loads(r.trials[i].params_json, 0, NULL);
    obs[n] = (observation){.params = params[n], .objectives = r.values + i * r.n_metrics};
    n++;
  }
  int rc = obs && params ? optimizer_create(s, &opt, err) : NAS_ERR;
  if (rc == NAS_OK) rc = optimizer_suggest(opt, obs, n, NULL, 0, 1, (int)r.n_trials, out, NULL, err);
  double ms = (nas_monotonic() - t0) * 1e3;
  json_decref(out[0]);
  optimizer_free(opt);
  for (size_t i = 0; params && i < n; i++) json_decref(params[i]);
  free(obs), free(params);
  sched_results_free(&r);
  return rc == NAS_OK ? ms : -1;
}

/* Ends the newest handed-out trial completed, so the next ask sees one more observation. */
static int complete_newest(storage *st, const spec *s, const experiment_row *exp, nas_err *err) {
  trial_row *rows;
  size_t n;
  if (storage_trial_list(st, exp->id, &rows, &n, err) != NAS_OK || n == 0) return NAS_ERR;
  metric_obs obs[2] = {{"f1", METRIC_FINAL, 0.5, nas_now()}, {"f2", METRIC_FINAL, 0.5, nas_now()}};
  int rc = sched_tell_complete(st, s, exp, rows[n - 1].number, 0, obs, 2, NULL, err);
  trial_rows_free(rows, n);
  return rc;
}

static size_t discard_body(char *data, size_t size, size_t n, void *ctx) {
  (void)data, (void)ctx;
  return size * n;
}

/* One POST /ask through an open libcurl handle, in ms; -1 on failure. */
static double http_ask_ms(CURL *curl, const char *url) {
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "{\"n\": 1}");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body);
  double t0 = nas_monotonic();
  long code = 0;
  if (curl_easy_perform(curl) != CURLE_OK) return -1;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  return code == 200 ? (nas_monotonic() - t0) * 1e3 : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* Medians of the three ways of asking with n_obs completed trials. */
static void ask_latency(bench *b, int n_obs, int repeats) {
  char *db = nas_asprintf("sqlite:%s/ask-%d.db", b->dir, n_obs);
  storage *st = NULL;
  spec *s = NULL;
  experiment_row exp = {0};
  nas_err err = {{0}};
  int rc = storage_open(db, &st, &err);
  if (rc == NAS_OK) rc = spec_parse(ask_spec, "ask.yaml", b->dir, &s, &err);
  if (rc == NAS_OK) rc = sched_prepare(s, st, &exp, &err);
  if (rc == NAS_OK) rc = fill_observations(st, &exp, n_obs, &err);
  char *base = rc == NAS_OK ? serve_start(b, db, 1000 + n_obs) : NULL;
  char *url = base ? nas_asprintf("%s/api/v1/experiments/asked/ask", base) : NULL;
  CURL *curl = url ? curl_easy_init() : NULL;
  double own[64], direct[64], served[64];
  if (repeats > 64) repeats = 64;
  for (int i = 0; curl && i < repeats; i++) {
    trial_row *rows = NULL;
    size_t got = 0;
    own[i] = optimizer_ms(st, s, &exp, &err);
    double t0 = nas_monotonic();
    rc = sched_ask(st, s, &exp, 1, "bench", NULL, &rows, &got, &err);
    direct[i] = (nas_monotonic() - t0) * 1e3;
    trial_rows_free(rows, got);
    if (rc == NAS_OK) rc = complete_newest(st, s, &exp, &err);
    served[i] = rc == NAS_OK ? http_ask_ms(curl, url) : -1;
    if (rc == NAS_OK) rc = complete_newest(st, s, &exp, &err);
    if (rc != NAS_OK || own[i] < 0 || served[i] < 0) {
      fprintf(stderr, "bench_storage: ask %d with %d observations failed: %s\n", i, n_obs, err.msg);
      curl_easy_cleanup(curl);
      curl = NULL;
    }
  }
  if (curl) {
    double o = median(own, repeats), d = median(direct, repeats), h = median(served, repeats);
    printf("| ask | %3d observations | optimizer %.1f ms | sched_ask %.1f ms | POST /ask %.1f ms |"
           " added by the server %.1f ms |\n", n_obs, o, d, h, h - o);
    curl_easy_cleanup(curl);
  }
  serve_stop(b);
  free(url), free(base), free(db);
  experiment_row_clear(&exp);
  spec_free(s);
  storage_close(st);
}

static int make_durable(pgserver *server, char *why, size_t size) {
  if (pgserver_exec(server, "postgres", "ALTER SYSTEM SET fsync = on", why, size) != 0 ||
      pgserver_exec(server, "postgres", "ALTER SYSTEM SET full_page_writes = on", why, size) != 0 ||
      pgserver_down(server, "fast", why, size) != 0) {
    return -1;
  }
  return pgserver_up(server, why, size);
}

static void print_machine(void) {
  char model[256] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  for (char line[512]; f && fgets(line, sizeof line, f);) {
    if (strncmp(line, "model name", 10) == 0) {
      snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
      model[strcspn(model, "\n")] = '\0';
      break;
    }
  }
  if (f) fclose(f);
  double load[3] = {0};
  getloadavg(load, 3);
  char stamp[32];
  time_t now = time(NULL);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%MZ", gmtime(&now));
  printf("machine: %ld cores, %s; load average %.2f at start; date %s\n",
         sysconf(_SC_NPROCESSORS_ONLN), model, load[0], stamp);
}

/* A folder of its own for b's files (SQLite files, server logs); removed by dir_remove. */
static int dir_make(bench *b) {
  const char *tmp = getenv("TMPDIR");
  b->dir = nas_asprintf("%s/nas-bench-XXXXXX", tmp ? tmp : "/tmp");
  if (mkdtemp(b->dir)) return 0;
  perror(b->dir);
  return -1;
}

static void dir_remove(bench *b) {
  char *rm[] = {"rm", "-rf", "--", b->dir, NULL};
  pid_t pid = fork();
  if (pid == 0) {
    execvp("rm", rm);
    _exit(127);
  }
  waitpid(pid, NULL, 0);
  free(b->dir);
  b->dir = NULL;
}

int main(void) {
  bench base = {.seconds = env_number("SECONDS_PER_RUN", 2)};
  int claim_trials = (int)env_number("CLAIM_TRIALS", 1000);
  const char *backends = getenv("BACKENDS") ? getenv("BACKENDS") : "sqlite,postgresql";
  const char *pg_fsync = getenv("PG_FSYNC") ? getenv("PG_FSYNC") : "on";
  print_machine();
  printf("%.1f s per throughput run, %d queued trials per claim run, PostgreSQL fsync %s\n\n",
         base.seconds, claim_trials, pg_fsync);
  const char *const file_backends[] = {"sqlite", "http"};
  for (size_t i = 0; i < 2; i++) {
    if (!wanted(backends, file_backends[i])) continue;
    bench b = base;
    b.backend = file_backends[i];
    if (dir_make(&b) != 0) return 1;
    run_backend(&b, claim_trials);
    serve_stop(&b);
    if (strcmp(b.backend, "http") == 0) {
      int repeats = (int)env_number("ASK_REPEATS", 10);
      if (repeats > 0) ask_latency(&b, 50, repeats);
      if (repeats > 0) ask_latency(&b, 200, repeats);
    }
    dir_remove(&b);
  }
  const char *const pg_backends[] = {"postgresql", "http-pg"};
  if (wanted(backends, pg_backends[0]) || wanted(backends, pg_backends[1])) {
    pgserver server;
    char why[1024];
    if (pgserver_start(&server, why, sizeof why) != 0) {
      fprintf(stderr, "bench_storage: no PostgreSQL server: %s\n", why);
      return 1;
    }
    int rc = strcmp(pg_fsync, "off") == 0 ? 0 : make_durable(&server, why, sizeof why);
    if (rc != 0) fprintf(stderr, "bench_storage: %s\n", why);
    int made = 0; /* schemas made so far on this server: the next one's number */
    for (size_t i = 0; rc == 0 && i < 2; i++) {
      if (!wanted(backends, pg_backends[i])) continue;
      bench b = base;
      b.backend = pg_backends[i];
      b.server = &server;
      b.made = made;
      if ((rc = dir_make(&b)) != 0) break;
      run_backend(&b, claim_trials);
      serve_stop(&b);
      dir_remove(&b);
      made = b.made;
    }
    pgserver_stop(&server);
    if (rc != 0) return 1;
  }
  return 0;
}
