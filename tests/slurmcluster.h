/* A throwaway single-node Slurm cluster for a test binary (scripts/slurm-cluster.sh).
 *
 * test_slurm_cluster_start brings the cluster up in a fresh folder, points SLURM_CONF at
 * it and starts a guard: a process of its own session holding the read end of a pipe
 * whose write end only this process holds. However this process ends (a failed assert, a
 * crash, a kill), the pipe closes and the guard cancels the cluster's jobs and stops its
 * daemons; test_slurm_cluster_stop just closes the pipe and waits for the guard. */
#ifndef NAS_TEST_SLURMCLUSTER_H
#define NAS_TEST_SLURMCLUSTER_H

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>

#include "tests/testutil.h"

#define TEST_SLURM_SCRIPT "scripts/slurm-cluster.sh"

typedef struct {
  char *dir;     /* owned: the cluster's folder (slurm.conf, logs, state) */
  pid_t guard;   /* the guard process, 0 when none */
  int guard_fd;  /* write end of the guard's pipe, -1 when none */
  char why[512]; /* when start failed: what went wrong */
} test_slurm_cluster;

/* Starts the guard for c->dir; false when it cannot. */
static inline bool test_slurm_guard_start(test_slurm_cluster *c) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]), close(fds[1]);
    return false;
  }
  if (pid == 0) {
    setsid(); /* a Ctrl-C to the test's process group does not reach it */
    dup2(fds[0], 0);
    int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, 1);
    dup2(null_fd, 2);
    execl(TEST_SLURM_SCRIPT, TEST_SLURM_SCRIPT, "guard", c->dir, (char *)NULL);
    _exit(127);
  }
  close(fds[0]);
  c->guard = pid;
  c->guard_fd = fds[1];
  return true;
}

/* Brings a cluster up; on failure c->why says why and nothing is left running. */
static inline bool test_slurm_cluster_start(test_slurm_cluster *c) {
  *c = (test_slurm_cluster){.guard_fd = -1};
  if (geteuid() != 0) {
    snprintf(c->why, sizeof c->why, "not root (slurmd must run jobs as their user)");
    return false;
  }
  if (access(TEST_SLURM_SCRIPT, X_OK) != 0) {
    snprintf(c->why, sizeof c->why, "%s not found (run from the repository root)",
             TEST_SLURM_SCRIPT);
    return false;
  }
  c->dir = test_tmpdir();
  if (!c->dir || !test_slurm_guard_start(c)) {
    snprintf(c->why, sizeof c->why, "cannot make a folder or a guard process");
    return false;
  }
  char *argv[] = {TEST_SLURM_SCRIPT, "start", c->dir, NULL};
  char *output = NULL;
  int rc = test_run(NULL, argv, &output);
  if (rc != 0) {
    snprintf(c->why, sizeof c->why, "%s start failed (%d): %.400s", TEST_SLURM_SCRIPT, rc,
             output);
    free(output);
    return false;
  }
  free(output);
  char *conf = NULL;
  if (asprintf(&conf, "%s/slurm.conf", c->dir) < 0) return false;
  setenv("SLURM_CONF", conf, 1);
  free(conf);
  return true;
}

/* Stops the cluster (through its guard) and removes its folder. */
static inline void test_slurm_cluster_stop(test_slurm_cluster *c) {
  if (c->guard_fd >= 0) close(c->guard_fd);
  if (c->guard > 0)
    while (waitpid(c->guard, NULL, 0) < 0 && errno == EINTR) {
    }
  if (c->dir) test_rmtree(c->dir);
  free(c->dir);
  *c = (test_slurm_cluster){.guard_fd = -1};
}

#endif
