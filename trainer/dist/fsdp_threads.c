/* fsdp_threads: runs one function per rank on `world` threads of this process, with each
 * rank's communicators in two groups (main traffic and prefetch), and collects the first
 * error: the driver behind FSDP's tests, its benchmark and multi-rank built-in trials.
 *
 * Invariants: either every rank's function runs or none does. Threads wait at a start gate
 * until all were created; if one cannot be created, the others are released without
 * running (a rank missing from the group would leave the rest waiting in their first
 * collective forever). A rank whose function returns leaves both groups, so a rank that
 * fails alone fails the collectives that wait for it instead of hanging them. The groups
 * are freed only after every thread has been joined. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "trainer/dist.h"
#include "trainer/dist/comm_internal.h"
#include "trainer/core/internal.h"

/* Where the threads wait until the driver knows whether all of them exist. */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t opened;
  int state; /* 0: closed, 1: run, -1: abandon */
} start_gate;

typedef struct {
  tr_fsdp_rank env;
  tr_fsdp_rank_fn fn;
  void *arg;
  int omp_threads;  /* this rank's share of the OpenMP threads */
  start_gate *gate; /* borrowed */
  int rc;
  nas_err err;
} rank_job;

static int gate_init(start_gate *g) {
  g->state = 0;
  if (pthread_mutex_init(&g->lock, NULL) != 0) return NAS_ERR;
  if (pthread_cond_init(&g->opened, NULL) == 0) return NAS_OK;
  pthread_mutex_destroy(&g->lock);
  return NAS_ERR;
}

static void gate_destroy(start_gate *g) {
  pthread_cond_destroy(&g->opened);
  pthread_mutex_destroy(&g->lock);
}

static int gate_wait(start_gate *g) {
  pthread_mutex_lock(&g->lock);
  while (g->state == 0) pthread_cond_wait(&g->opened, &g->lock);
  int state = g->state;
  pthread_mutex_unlock(&g->lock);
  return state;
}

static void gate_open(start_gate *g, int state) {
  pthread_mutex_lock(&g->lock);
  g->state = state;
  pthread_cond_broadcast(&g->opened);
  pthread_mutex_unlock(&g->lock);
}

static void *rank_main(void *arg) {
  rank_job *job = arg;
  if (gate_wait(job->gate) < 0) return NULL;
  /* the ICV of this thread only: ranks split the cores instead of each taking them all */
  omp_set_num_threads(job->omp_threads);
  job->rc = job->fn(&job->env, job->arg, &job->err);
  /* a rank that fails alone would otherwise leave the others waiting in a collective */
  const char *failure = job->rc ? job->err.msg : NULL;
  comm_threads_leave(job->env.comm, failure);
  comm_threads_leave(job->env.prefetch_comm, failure);
  return NULL;
}

/* Starts one thread per job, joins them all; the first failing rank's message into err. */
static int run_jobs(rank_job *jobs, int world, nas_err *err) {
  start_gate gate;
  pthread_t *threads = calloc((size_t)world, sizeof *threads);
  if (!threads || gate_init(&gate)) {
    free(threads);
    return nas_errf(err, "fsdp threads: out of memory or synchronisation objects");
  }
  int started = 0;
  for (; started < world; started++) {
    jobs[started].gate = &gate;
    if (pthread_create(&threads[started], NULL, rank_main, &jobs[started]) != 0) break;
  }
  gate_open(&gate, started == world ? 1 : -1);
  for (int r = 0; r < started; r++) pthread_join(threads[r], NULL);
  gate_destroy(&gate);
  free(threads);
  if (started < world)
    return nas_errf(err, "fsdp threads: could only start %d of %d rank threads", started, world);
  for (int r = 0; r < world; r++)
    if (jobs[r].rc) return nas_errf(err, "rank %d: %s", r, jobs[r].err.msg);
  return NAS_OK;
}

int tr_fsdp_run_threads(int world, tr_fsdp_rank_fn fn, void *arg, nas_err *err) {
  if (world < 1) return nas_errf(err, "fsdp threads: world size must be at least 1, got %d", world);
  if (!fn) return nas_errf(err, "fsdp threads: no rank function");
  tr_comm_group *main_group = tr_comm_group_new(world, err);
  if (!main_group) return NAS_ERR;
  tr_comm_group *prefetch_group = tr_comm_group_new(world, err);
  rank_job *jobs = calloc((size_t)world, sizeof *jobs);
  int rc = NAS_ERR;
  if (!jobs) nas_errf(err, "fsdp threads: out of memory");
  if (prefetch_group && jobs) {
    int share = omp_get_max_threads() / world;
    for (int r = 0; r < world; r++) {
      jobs[r] = (rank_job){.fn = fn, .arg = arg, .omp_threads = share > 0 ? share : 1};
      jobs[r].env = (tr_fsdp_rank){.rank = r,
                                   .world = world,
                                   .comm = tr_comm_group_comm(main_group, r, err),
                                   .prefetch_comm = tr_comm_group_comm(prefetch_group, r, err)};
    }
    rc = run_jobs(jobs, world, err);
  }
  free(jobs);
  tr_comm_group_free(prefetch_group);
  tr_comm_group_free(main_group);
  return rc;
}
