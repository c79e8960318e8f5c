/* scheduler/lease.c: one scheduler per experiment.
 *
 * Two schedulers of one experiment would each spend the whole budget (every configuration
 * run twice) and fight over its trials, so a scheduler holds the experiment's lease in
 * storage for as long as it runs: it takes the lease before it touches any trial, renews
 * it every SCHED_LEASE_RENEW_S seconds (also while the optimizer computes, through the
 * optimizer's keep-alive), and gives it back when it ends. A second scheduler is refused
 * with who holds the lease. A lease whose holder died is taken over: at once when the
 * holder ran on this host and its pid is gone, else once its heartbeat is older than
 * SCHED_LEASE_TIMEOUT_S. A scheduler that finds its lease taken over stops without
 * touching anything more. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "scheduler/internal.h"

#define SCHED_LEASE_RENEW_S 2.0

/* This host's name, as leases record it; "" when it cannot be read. */
static void host_name(char *out, size_t size) {
  if (gethostname(out, size) != 0) out[0] = '\0';
  out[size - 1] = '\0';
}

/* Whether pid has ended but is not reaped yet (Z, or X while it goes): a scheduler killed
 * with -9 whose parent does not wait for it (a container's first process that is no init)
 * stays such a zombie, which kill(pid, 0) still finds. The state is the field after the
 * command's name in /proc/PID/stat, a name that may hold ") ", hence the last one. */
static bool pid_is_zombie(pid_t pid) {
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t len = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[len] = '\0';
  const char *name_end = strrchr(stat, ')');
  return name_end && name_end[1] == ' ' && (name_end[2] == 'Z' || name_end[2] == 'X');
}

bool sched_lease_holder_dead(const storage_lease *lease, double now) {
  if (now - lease->heartbeat_at > SCHED_LEASE_TIMEOUT_S) return true;
  char here[256];
  host_name(here, sizeof here);
  if (strcmp(lease->host, here) != 0 || lease->pid <= 0) return false;
  /* A recycled pid keeps a dead holder's lease alive until the timeout: safe, only slow. */
  if (kill((pid_t)lease->pid, 0) != 0) return errno == ESRCH;
  return pid_is_zombie((pid_t)lease->pid);
}

/* "host h, pid p, running for …, last heartbeat … ago". Owned; NULL when out of memory. */
static char *lease_describe(const storage_lease *lease, double now) {
  return nas_asprintf("host %s, pid %lld, running for %.0f s, last heartbeat %.0f s ago",
                      lease->host, (long long)lease->pid, now - lease->started_at,
                      now - lease->heartbeat_at);
}

static int new_token(char token[SCHED_LEASE_TOKEN_LEN + 1], nas_err *err) {
  unsigned char bytes[SCHED_LEASE_TOKEN_LEN / 2];
  if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes)
    return nas_errf(err, "cannot draw a lease token: %s", strerror(errno));
  for (size_t i = 0; i < sizeof bytes; i++) sprintf(token + 2 * i, "%02x", bytes[i]);
  return NAS_OK;
}

/* The refusal when a live scheduler holds the lease. One that `nas stop` marked stopped is
 * only waiting for its trials to end (the runner's grace period): stopping it is done. */
static int refuse(const experiment_row *exp, const storage_lease *held, nas_err *err) {
  char *who = lease_describe(held, nas_now());
  int rc;
  if (exp->status && strcmp(exp->status, "stopped") == 0)
    rc = nas_errc(err, NAS_EEXIST,
                  "experiment '%s' is ending after 'nas stop': its scheduler (%s) waits for "
                  "its trials to stop (TERM, then KILL after the runner's grace period). Try "
                  "again once it has ended.",
                  exp->name, who ? who : "out of memory");
  else
    rc = nas_errc(err, NAS_EEXIST,
                  "experiment '%s' is being run by another scheduler (%s); only one may run "
                  "it at a time. Wait for it to end, or stop it with 'nas stop %s'. A "
                  "scheduler that died is taken over once its heartbeat is %.0f s old (at "
                  "once on the host it ran on).",
                  exp->name, who ? who : "out of memory", exp->name, SCHED_LEASE_TIMEOUT_S);
  free(who);
  return rc;
}

/* One try at taking the lease, replacing the holder when it is dead. NAS_EEXIST (with
 * *retry) when the lease changed hands between reading and swapping it. */
static int take_once(storage *st, const experiment_row *exp, sched_lease *mine, bool *retry,
                     nas_err *err) {
  int rc = storage_lease_take(st, exp->id, mine->token, mine->host, (int64_t)getpid(), NULL, err);
  if (rc != NAS_EEXIST) return rc;
  storage_lease held;
  rc = storage_lease_get(st, exp->id, &held, err);
  if (rc == NAS_ENOTFOUND) *retry = true; /* released meanwhile */
  if (rc != NAS_OK) return rc;
  if (!sched_lease_holder_dead(&held, nas_now())) {
    rc = refuse(exp, &held, err);
  } else {
    char *who = lease_describe(&held, nas_now());
    rc = storage_lease_take(st, exp->id, mine->token, mine->host, (int64_t)getpid(), held.token,
                            err);
    if (rc == NAS_OK)
      nas_log("%s: taking over from a scheduler that is gone (%s)", exp->name,
              who ? who : "out of memory");
    *retry = rc == NAS_EEXIST;
    free(who);
  }
  storage_lease_clear(&held);
  return rc;
}

int sched_lease_take(storage *st, const experiment_row *exp, sched_lease *mine, nas_err *err) {
  host_name(mine->host, sizeof mine->host);
  if (new_token(mine->token, err) != NAS_OK) return NAS_ERR;
  int rc = NAS_ERR;
  bool retry = true;
  /* Each retry means another process moved the lease meanwhile; a few are plenty. */
  for (int tries = 0; retry && tries < 3; tries++) {
    retry = false;
    rc = take_once(st, exp, mine, &retry, err);
  }
  if (retry) return nas_errf(err, "experiment '%s': its lease keeps changing hands", exp->name);
  if (rc != NAS_OK) return rc;
  mine->held = true;
  mine->renewed = nas_monotonic();
  return NAS_OK;
}

int sched_lease_take_waiting(storage *st, const experiment_row *exp, sched_lease *mine,
                             double wait_s, nas_err *err) {
  double until = nas_monotonic() + wait_s;
  int rc;
  while ((rc = sched_lease_take(st, exp, mine, err)) == NAS_EEXIST && nas_monotonic() < until)
    nas_sleep(0.02);
  return rc;
}

int sched_lease_keep(storage *st, const experiment_row *exp, sched_lease *mine, nas_err *err) {
  if (!mine->held || nas_monotonic() - mine->renewed < SCHED_LEASE_RENEW_S) return NAS_OK;
  int rc = storage_lease_renew(st, exp->id, mine->token, err);
  if (rc == NAS_ENOTFOUND) {
    mine->held = false;
    return nas_errf(err, "experiment '%s': another scheduler took this one's lease over (it "
                    "was silent for more than %.0f s); stopping here and launching nothing "
                    "more, the other scheduler carries on", exp->name, SCHED_LEASE_TIMEOUT_S);
  }
  if (rc == NAS_OK) mine->renewed = nas_monotonic();
  return rc;
}

void sched_lease_release(storage *st, const experiment_row *exp, sched_lease *mine) {
  if (!mine->held) return;
  nas_err err;
  /* A lease left behind only delays the next scheduler until its holder is seen dead. */
  if (storage_lease_release(st, exp->id, mine->token, &err) != NAS_OK)
    nas_log("%s: could not release the lease; it expires on its own %g s after its last "
            "renewal, at once for a 'nas resume' on this host (%s)", exp->name,
            SCHED_LEASE_TIMEOUT_S, err.msg);
  mine->held = false;
}

const char *sched_liveness_name(sched_liveness state) {
  static const char *const names[] = {"none", "alive", "dead"};
  return names[state];
}

int sched_scheduler_state(storage *st, const experiment_row *exp, sched_liveness *state,
                          char **text, nas_err *err) {
  storage_lease lease;
  *text = NULL;
  int rc = storage_lease_get(st, exp->id, &lease, err);
  if (rc == NAS_ENOTFOUND) {
    *state = SCHEDULER_NONE;
    return NAS_OK;
  }
  if (rc != NAS_OK) return rc;
  double now = nas_now();
  *state = sched_lease_holder_dead(&lease, now) ? SCHEDULER_DEAD : SCHEDULER_ALIVE;
  *text = lease_describe(&lease, now);
  storage_lease_clear(&lease);
  return *text ? NAS_OK : nas_errf(err, "out of memory");
}
