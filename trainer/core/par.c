/* par: the engine's own worker threads (tr_threadpool), and tn_par_run, which splits a piece of
 * work into parts over them, or over OpenMP's threads when the context has no pool.
 *
 * Why a pool of our own: an OpenMP parallel region costs libgomp two futex system calls
 * (it wakes the team's barrier every time, sleeping or not), and on this project's machines
 * (virtual CPUs where a system call and a wake-up cost microseconds) a region took 20-30 us
 * from start to end: the second thread began a GEMM half 10-15 us late and the end took as
 * long again. That is a tenth of a split 128x784x256 GEMM, and more than a whole batch-1
 * matrix-vector product. Here the caller publishes a job with one atomic store, workers
 * that are spinning see it within a cache-line transfer (~0.3 us), and completion is one
 * atomic counter: no system call while the threads are busy.
 *
 * Protocol. `word` holds the current job: its number (32 bits), its number of parts and a
 * bit per part already claimed (16 bits each). The caller publishes a job with part 0
 * already claimed (its own); every thread then claims parts by compare-and-swap on word,
 * its own part first (worker i part i + 1), then any part still unclaimed. Own parts first
 * keep each thread on the same slice of the data from job to job (a GEMM split by the
 * weight's rows, then the optimiser's update of those rows), so that slice stays in that
 * core's cache; taking other parts means the caller never waits for a worker that has not
 * started, only for parts a worker is running. A claim succeeds only on the word of its own
 * job, and a job's fn and arg are not replaced until all its parts are done, so a claimed
 * part always runs its job's function. `done` counts the parts workers finished; the
 * caller counts its own.
 *
 * Cost. Moving a cache line between these cores takes ~0.2 us (a ping-pong round trip
 * measured 0.45 us), as long as a batch-1 layer's half, so the hot path is laid out to move
 * few lines: word, done, fn and arg share one line, which a worker takes with its claim and
 * still holds when it counts its part done; the caller's own claim needs no atomic
 * operation; the caller publishes with a release store (an exchange would stall it until
 * the workers' copies of the line are invalidated). Idle workers spin a while, then sleep
 * on a futex (`epoch`, with a count of sleepers so that the caller makes the wake-up system
 * call only when someone sleeps). Without a full fence between publishing and reading
 * `sleepers`, a worker falling asleep just then can miss that job's wake-up: the caller
 * then runs the job's parts itself (it claims whatever is left) and wakes the worker on
 * the next job, so a missed wake-up costs one job's parallelism, never a hang.
 *
 * Invariants: one caller at a time (a pool belongs to one tr_ctx, used by one thread); a
 * part that calls the pool again runs that job inline (the pool is busy). Workers run
 * OpenMP loops on one thread (their own nthreads setting), so a pool never nests OpenMP
 * teams under its threads. */
#include <cblas.h>
#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "trainer/core/internal.h"

/* Spins of an idle worker before it sleeps: ~150 us here (a pause takes ~19 ns on an AMD
 * EPYC of family 26), longer than the gaps between the GEMMs of a training step or between
 * batch-1 inferences, short enough not to hold a core that other work could use. */
#define IDLE_SPINS (1 << 13)
#define MAX_THREADS 16 /* a part per thread, a bit per part in word */

/* A worker's start argument: its pool and its own part (worker i has part i + 1). */
typedef struct worker_arg {
  tr_threadpool *pool;
  int own;
} worker_arg;

struct tr_threadpool {
  /* The line workers watch, taken by the claims: the current job and its progress. */
  alignas(64) _Atomic uint64_t word; /* job number << 32 | parts << 16 | claimed parts */
  _Atomic int done;                   /* parts of the current job finished by workers */
  void (*fn)(void *arg, int part, int parts);
  void *_Atomic arg; /* atomic only so that a worker may prefetch it before its claim */
  alignas(64) _Atomic uint32_t epoch; /* the futex idle workers sleep on: the job number */
  _Atomic int sleepers;               /* workers asleep or about to be */
  _Atomic bool stop;
  alignas(64) uint32_t job; /* the caller's own: its count of jobs */
  bool busy;     /* a job is running: nested calls run inline */
  int threads;   /* workers + the caller */
  pthread_t *workers; /* owned, threads - 1 */
  worker_arg *args;   /* owned, one per worker */
};

static uint32_t word_job(uint64_t w) { return (uint32_t)(w >> 32); }
static int word_parts(uint64_t w) { return (int)((w >> 16) & 0xffff); }

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Claims a part of the job in word, `own` if it is free, else the first free one; -1 when
 * all are claimed. *parts gets the job's number of parts. */
static int claim_part(tr_threadpool *p, int own, int *parts) {
  uint64_t w = atomic_load_explicit(&p->word, memory_order_acquire);
  for (;;) {
    *parts = word_parts(w);
    uint32_t free_parts = ~(uint32_t)w & ((1u << *parts) - 1);
    if (!free_parts) return -1;
    int part = own < *parts && (free_parts >> own & 1) ? own : __builtin_ctz(free_parts);
    if (atomic_compare_exchange_weak_explicit(&p->word, &w, w | 1u << part, memory_order_acq_rel,
                                              memory_order_acquire))
      return part;
  }
}

/* Claims and runs parts of the job in word until none is left, `own` first; returns how
 * many it ran. */
static int run_parts(tr_threadpool *p, int own) {
  int part, parts, ran = 0;
  while ((part = claim_part(p, own, &parts)) >= 0) {
    p->fn(atomic_load_explicit(&p->arg, memory_order_relaxed), part, parts);
    ran++;
  }
  return ran;
}

/* Waits until word holds another job than `seen` (or the pool stops): spinning first, then
 * asleep on epoch. The seq_cst order of sleepers++, the re-check of word, and the caller's
 * store of word and epoch then load of sleepers makes sure no wake-up is missed. */
static void wait_for_job(tr_threadpool *p, uint32_t seen) {
  for (int spins = 0;; spins++) {
    if (word_job(atomic_load_explicit(&p->word, memory_order_acquire)) != seen ||
        atomic_load_explicit(&p->stop, memory_order_acquire))
      return;
    if (spins < IDLE_SPINS) {
      cpu_relax();
      continue;
    }
    uint32_t epoch = atomic_load(&p->epoch);
    atomic_fetch_add(&p->sleepers, 1);
    if (word_job(atomic_load(&p->word)) == seen && !atomic_load(&p->stop))
      futex_wait(&p->epoch, epoch);
    atomic_fetch_sub(&p->sleepers, 1);
    spins = 0;
  }
}

static void *worker_main(void *arg) {
  tr_threadpool *p = ((worker_arg *)arg)->pool;
  int own = ((worker_arg *)arg)->own;
  omp_set_num_threads(1); /* this thread's own setting: no OpenMP team under a worker */
  uint32_t seen = 0;
  while (!atomic_load_explicit(&p->stop, memory_order_acquire)) {
    wait_for_job(p, seen);
    seen = word_job(atomic_load_explicit(&p->word, memory_order_acquire));
    /* the job's argument (a struct the caller just wrote) is another line to fetch: start
     * that while the claim takes word's line */
    __builtin_prefetch(atomic_load_explicit(&p->arg, memory_order_relaxed));
    int ran = run_parts(p, own);
    if (ran) atomic_fetch_add_explicit(&p->done, ran, memory_order_release);
  }
  return NULL;
}

/* Frees the memory of a pool whose workers are stopped (or were never started). */
static void pool_release(tr_threadpool *p) {
  if (!p) return;
  free(p->workers);
  free(p->args);
  free(p);
}

static void pool_stop(tr_threadpool *p, int started) {
  atomic_store(&p->stop, true);
  atomic_fetch_add(&p->epoch, 1);
  futex_wake_all(&p->epoch);
  for (int i = 0; i < started; i++) pthread_join(p->workers[i], NULL);
}

tr_threadpool *tr_threadpool_new(int threads, nas_err *err) {
  if (threads < 1 || threads > MAX_THREADS) {
    nas_errf(err, "threadpool: %d threads (1 to %d)", threads, MAX_THREADS);
    return NULL;
  }
  tr_threadpool *p = calloc(1, sizeof *p);
  if (p) {
    p->workers = calloc((size_t)threads, sizeof *p->workers);
    p->args = calloc((size_t)threads, sizeof *p->args);
  }
  if (!p || !p->workers || !p->args) {
    pool_release(p);
    nas_errf(err, "threadpool: out of memory");
    return NULL;
  }
  p->threads = threads;
  for (int i = 0; i < threads - 1; i++) {
    p->args[i] = (worker_arg){p, i + 1};
    if (pthread_create(&p->workers[i], NULL, worker_main, &p->args[i]) != 0) {
      pool_stop(p, i);
      pool_release(p);
      nas_errf(err, "threadpool: cannot start thread %d of %d", i + 2, threads);
      return NULL;
    }
  }
  return p;
}

void tr_threadpool_free(tr_threadpool *p) {
  if (!p) return;
  pool_stop(p, p->threads - 1);
  pool_release(p);
}

/* fn(arg, part, parts) for every part in [0, threads): the caller takes part 0, and any
 * part no worker has started by the time it is done with its own. */
static void pool_run(tr_threadpool *p, void (*fn)(void *arg, int part, int parts), void *arg) {
  int parts = p->threads;
  p->busy = true;
  p->fn = fn;
  atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  p->job++;
  atomic_store_explicit(&p->word, (uint64_t)p->job << 32 | (uint64_t)parts << 16 | 1u,
                        memory_order_release);
  atomic_store_explicit(&p->epoch, p->job, memory_order_relaxed);
  if (atomic_load_explicit(&p->sleepers, memory_order_relaxed) > 0) futex_wake_all(&p->epoch);
  fn(arg, 0, parts);
  int by_workers = parts - 1 - run_parts(p, 0);
  while (atomic_load_explicit(&p->done, memory_order_acquire) < by_workers) cpu_relax();
  p->busy = false;
}

/* ---------------------------------------------------------------- splitting work */

int tn_par_parts(const tr_ctx *ctx) {
  if (ctx && ctx->threads) /* BLAS on several threads has the cores (see tn_par_threads) */
    return ctx->threads->busy || openblas_get_num_threads() > 1 ? 1 : ctx->threads->threads;
  return omp_in_parallel() ? 1 : tn_par_threads();
}

void tn_par_run(const tr_ctx *ctx, void (*fn)(void *arg, int part, int parts), void *arg) {
  int parts = tn_par_parts(ctx);
  if (parts < 2) {
    fn(arg, 0, 1);
  } else if (ctx && ctx->threads) {
    pool_run(ctx->threads, fn, arg);
  } else {
#pragma omp parallel num_threads(parts)
    fn(arg, omp_get_thread_num(), omp_get_num_threads());
  }
}

void tn_pool_run_from(const tr_ctx *ctx, int64_t work, int64_t min_work,
                      void (*fn)(void *arg, int part, int parts), void *arg) {
  if (ctx && ctx->threads && work >= min_work)
    tn_par_run(ctx, fn, arg);
  else
    fn(arg, 0, 1);
}

/* Where part `part` of n starts: at its even share, moved to the nearest multiple of 16
 * when there are enough items for that (the last part ends at n whatever). */
static int64_t part_start(int64_t n, int part, int parts) {
  if (part >= parts) return n;
  int64_t even = n * part / parts;
  return n < 16 * (int64_t)parts ? even : (even + 8) / 16 * 16;
}

void tn_par_range(int64_t n, int part, int parts, int64_t *lo, int64_t *hi) {
  *lo = part_start(n, part, parts);
  *hi = part_start(n, part + 1, parts);
}
