/* The collectives of trainer.h on CPU ranks, threads of one group and forked processes
 * that join by name (the process backend, over shared memory): each collective against a
 * serial reference computed here (exact equality: sums are taken in rank order), for 1 to
 * 4 ranks, many rounds in a row to shake out races, with buffers moved through shared
 * memory in one piece or in many; the barrier orders memory; mismatched calls fail on
 * every rank alike without a deadlock and leave the group usable. Processes: a rank that
 * exits or stops calling makes the others fail with a message that names it, instead of
 * hanging; joins time out; a segment left by a killed launch is replaced; nothing is left
 * in /dev/shm. Groups formed from NAS_* and from srun's SLURM_* variables.
 *
 * Ranks report failures instead of asserting (cmocka's asserts must run on the main
 * thread of the parent process): each counts its own and keeps the first message, and the
 * main thread asserts after joining the threads or reading the processes' reports. */
#include "tests/testutil.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#include "trainer/dist.h"
#include "trainer/trainer.h"

#define ROUNDS 200
/* Rounds for process ranks: 64 go once through every combination of setup_for's dtype,
 * reduce op, in-place flag and count; their barriers cost context switches between
 * processes, so fewer rounds than threads. */
#define PROC_ROUNDS 64
#define MAX_WORLD 4
#define SHM_DIR "/dev/shm"

/* Counts that cover empty, fewer elements than ranks, uneven chunks, and more than one
 * reduction block (2048 floats). */
static const int64_t counts[] = {0, 1, 3, 4, 7, 33, 257, 2053};
#define N_COUNTS ((int)(sizeof counts / sizeof counts[0]))

/* ---------------------------------------------------------------- ranks */

typedef struct rank_job rank_job;
typedef void (*rank_body)(rank_job *job);

struct rank_job {
  tr_comm *comm;
  int rank, world;
  int rounds; /* rounds the collective bodies run */
  rank_body body;
  void *shared;     /* the test's state seen by all ranks */
  int failures;
  char first[1200]; /* the first failure's message */
  char note[1200];  /* what a body tells the test (an error message it got) */
};

static void job_fail(rank_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_fail(rank_job *job, const char *fmt, ...) {
  if (job->failures++ > 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(job->first, sizeof job->first, fmt, ap);
  va_end(ap);
}

static void assert_no_failures(const rank_job *jobs, int world, const char *how) {
  for (int r = 0; r < world; r++) {
    if (jobs[r].failures)
      print_error("%s world %d rank %d: %d failures, first: %s\n", how, world, r,
                  jobs[r].failures, jobs[r].first);
    assert_int_equal(jobs[r].failures, 0);
  }
}

static void *rank_main(void *arg) {
  rank_job *job = arg;
  job->body(job);
  return NULL;
}

/* Runs body on world threads, one per rank of a fresh group; asserts no rank failed. */
static void run_threads(int world, rank_body body, void *shared) {
  nas_err err = {{0}};
  tr_comm_group *group = tr_comm_group_new(world, &err);
  assert_non_null(group);
  rank_job jobs[MAX_WORLD] = {{0}};
  pthread_t threads[MAX_WORLD];
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){.comm = tr_comm_group_comm(group, r, &err),
                         .rank = r,
                         .world = world,
                         .rounds = ROUNDS,
                         .body = body,
                         .shared = shared};
    assert_non_null(jobs[r].comm);
    assert_int_equal(tr_comm_backend_of(jobs[r].comm), TR_COMM_THREADS);
    assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &jobs[r]), 0);
  }
  for (int r = 0; r < world; r++) assert_int_equal(pthread_join(threads[r], NULL), 0);
  tr_comm_group_free(group);
  assert_no_failures(jobs, world, "threads");
}

/* How a forked rank finds its group. */
typedef enum { JOIN_BY_NAME, JOIN_NAS_ENV, JOIN_SLURM_ENV } join_how;

typedef struct {
  join_how how;
  int rounds;
  size_t stage_bytes; /* 0: the backend's default */
  double timeout_s;   /* 0: the backend's default */
  int absent;         /* this rank is not started (-1: all are) */
  int parent;         /* the rank the test process plays itself (-1: the last), so that
                         its leak check covers the join and free of a rank */
  double rank0_delay; /* seconds rank 0 waits before it joins */
  char name[64];      /* the group name (the NAS_COMM_ID of the env variants) */
} proc_setup;

/* Unique among this test binary's groups and any other process's. */
static void unique_name(char *name, size_t cap, const char *tag) {
  snprintf(name, cap, "test-%d-%s-%llx", (int)getpid(), tag,
           (unsigned long long)(nas_monotonic() * 1e9));
}

static proc_setup procs(int rounds, size_t stage_bytes, const char *tag) {
  proc_setup ps = {.how = JOIN_BY_NAME, .rounds = rounds, .stage_bytes = stage_bytes,
                   .absent = -1, .parent = -1};
  unique_name(ps.name, sizeof ps.name, tag);
  return ps;
}

/* The environment srun or a launcher would give rank. */
static void set_rank_env(const proc_setup *ps, int rank, int world) {
  char text[16];
  if (ps->how == JOIN_NAS_ENV) {
    snprintf(text, sizeof text, "%d", rank);
    setenv("NAS_RANK", text, 1);
    snprintf(text, sizeof text, "%d", world);
    setenv("NAS_WORLD", text, 1);
    setenv("NAS_COMM_ID", ps->name, 1);
    return;
  }
  unsetenv("NAS_RANK");
  snprintf(text, sizeof text, "%d", rank);
  setenv("SLURM_PROCID", text, 1);
  setenv("SLURM_LOCALID", text, 1);
  snprintf(text, sizeof text, "%d", world);
  setenv("SLURM_NTASKS", text, 1);
  setenv("SLURM_NNODES", "1", 1);
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("NAS_COMM_ID", ps->name, 1); /* keeps this job step apart from other tests' */
}

static void env_clear(void);

/* Plays job->rank of the process group ps names: joins, runs body, lets go. */
static void play_rank(rank_job *job, rank_body body, const proc_setup *ps) {
  if (job->rank == 0 && ps->rank0_delay > 0) nas_sleep(ps->rank0_delay);
  tr_comm_options o = {.backend = TR_COMM_PROCESSES,
                       .rank = job->rank,
                       .world = job->world,
                       .local_rank = job->rank,
                       .nodes = 1,
                       .timeout_s = ps->timeout_s,
                       .stage_bytes = ps->stage_bytes};
  snprintf(o.name, sizeof o.name, "%s", ps->name);
  nas_err err = {{0}};
  int rc;
  if (ps->how == JOIN_BY_NAME) {
    rc = tr_comm_join(&o, &job->comm, &err);
  } else {
    set_rank_env(ps, job->rank, job->world);
    rc = tr_comm_init_env(&o, &job->comm, &err);
    env_clear();
  }
  if (rc != NAS_OK) {
    job_fail(job, "join: %s", err.msg);
    return;
  }
  if (tr_comm_rank(job->comm) != job->rank || tr_comm_world(job->comm) != job->world ||
      tr_comm_backend_of(job->comm) != TR_COMM_PROCESSES)
    job_fail(job, "joined as rank %d of %d", tr_comm_rank(job->comm), tr_comm_world(job->comm));
  if (body) body(job);
  tr_comm_free(job->comm);
  job->comm = NULL;
}

/* A forked rank: plays its rank, writes its job (failures, messages) to fd and ends
 * without the leak check (which costs ~80 ms a process under ASan: the test process's own
 * rank covers the same paths). */
static void child_rank(rank_job *job, rank_body body, const proc_setup *ps, int fd) {
  play_rank(job, body, ps);
  ssize_t written = write(fd, job, sizeof *job);
  _exit(written == (ssize_t)sizeof *job ? 0 : 1);
}

/* Forks the ranks of world (but ps->absent and the one the test process plays), plays
 * that one, and fills jobs with everyone's reports. A rank that exits without a report
 * counts as a failure. */
static void run_procs_report(int world, rank_body body, void *shared, const proc_setup *ps,
                             rank_job *jobs) {
  int parent = ps->parent >= 0 ? ps->parent : world - 1;
  int fds[MAX_WORLD];
  pid_t pids[MAX_WORLD] = {0};
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){.rank = r, .world = world, .rounds = ps->rounds, .body = body,
                         .shared = shared};
    if (r == ps->absent || r == parent) continue;
    int pipe_fds[2];
    assert_int_equal(pipe(pipe_fds), 0);
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) {
      close(pipe_fds[0]);
      child_rank(&jobs[r], body, ps, pipe_fds[1]);
    }
    close(pipe_fds[1]);
    fds[r] = pipe_fds[0];
  }
  if (parent != ps->absent) play_rank(&jobs[parent], body, ps);
  for (int r = 0; r < world; r++) {
    if (!pids[r]) continue;
    ssize_t got = read(fds[r], &jobs[r], sizeof jobs[r]);
    close(fds[r]);
    int status;
    assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
    if (got != (ssize_t)sizeof jobs[r]) {
      jobs[r] = (rank_job){.rank = r, .world = world, .failures = 1};
      snprintf(jobs[r].first, sizeof jobs[r].first, "exited (status %d) without a report", status);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      job_fail(&jobs[r], "exited with status %d", status);
    }
  }
}

/* Names in /dev/shm that start with the segment name of group. */
static int shm_leftovers(const char *group) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "nas-comm-%s", group);
  DIR *dir = opendir(SHM_DIR);
  assert_non_null(dir);
  int found = 0;
  for (struct dirent *e; (e = readdir(dir));)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      print_error("left in %s: %s\n", SHM_DIR, e->d_name);
      found++;
    }
  closedir(dir);
  return found;
}

/* Runs body on world forked ranks of a fresh process group; asserts no rank failed and
 * nothing is left in /dev/shm. */
static void run_procs(int world, rank_body body, void *shared, const proc_setup *ps) {
  rank_job jobs[MAX_WORLD];
  run_procs_report(world, body, shared, ps, jobs);
  assert_no_failures(jobs, world, "processes");
  assert_int_equal(shm_leftovers(ps->name), 0);
}

/* ---------------------------------------------------------------- data and references */

/* Rank's input element i in round `round`: a hashed value whose magnitude spans 2^-20 to
 * 2^20, so that summing in another order gives other bits. */
static double input(int rank, int round, int64_t i) {
  uint64_t h = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)round * 0xBF58476D1CE4E5B9ull ^
               (uint64_t)i * 0x94D049BB133111EBull;
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 29;
  double unit = (double)(h >> 11) * 0x1p-53 * 2 - 1;
  return ldexp(unit, (int)(h % 41) - 20);
}

static void fill(tr_dtype dtype, void *buf, int64_t n, int rank, int round, int64_t from) {
  for (int64_t j = 0; j < n; j++) {
    if (dtype == TR_F32)
      ((float *)buf)[j] = (float)input(rank, round, from + j);
    else
      ((double *)buf)[j] = input(rank, round, from + j);
  }
}

static double element(tr_dtype dtype, const void *buf, int64_t j) {
  return dtype == TR_F32 ? ((const float *)buf)[j] : ((const double *)buf)[j];
}

/* The serial reference: element i summed over ranks 0, 1, ... in dtype, then averaged. */
static double reference(tr_dtype dtype, int world, int round, int64_t i, tr_reduce_op op) {
  if (dtype == TR_F32) {
    float acc = (float)input(0, round, i);
    for (int r = 1; r < world; r++) acc += (float)input(r, round, i);
    return op == TR_REDUCE_AVG ? acc / (float)world : acc;
  }
  double acc = input(0, round, i);
  for (int r = 1; r < world; r++) acc += input(r, round, i);
  return op == TR_REDUCE_AVG ? acc / world : acc;
}

/* What each round exercises: both dtypes, both reduce ops, in place or not, every count. */
typedef struct {
  tr_dtype dtype;
  tr_reduce_op op;
  bool in_place;
  int64_t count;
  size_t size;
} round_setup;

static round_setup setup_for(int round) {
  round_setup s = {.dtype = round & 1 ? TR_F64 : TR_F32,
                   .op = round & 2 ? TR_REDUCE_AVG : TR_REDUCE_SUM,
                   .in_place = round & 4,
                   .count = counts[(round / 8 + round) % N_COUNTS]};
  s.size = tr_dtype_size(s.dtype);
  return s;
}

static void *alloc_elems(int64_t n, size_t size) { return malloc((size_t)(n > 0 ? n : 1) * size); }

/* ---------------------------------------------------------------- collectives */

static void all_reduce_body(rank_job *job) {
  for (int round = 0; round < job->rounds; round++) {
    round_setup s = setup_for(round);
    void *send = alloc_elems(s.count, s.size);
    void *recv = s.in_place ? send : alloc_elems(s.count, s.size);
    fill(s.dtype, send, s.count, job->rank, round, 0);
    nas_err err = {{0}};
    if (tr_comm_all_reduce(job->comm, s.dtype, send, recv, s.count, s.op, &err) != NAS_OK)
      job_fail(job, "round %d: %s", round, err.msg);
    for (int64_t j = 0; j < s.count; j++)
      if (element(s.dtype, recv, j) != reference(s.dtype, job->world, round, j, s.op))
        job_fail(job, "round %d element %lld differs from the rank-order sum", round, (long long)j);
    if (!s.in_place) free(recv);
    free(send);
  }
}

static void all_gather_body(rank_job *job) {
  for (int round = 0; round < job->rounds; round++) {
    round_setup s = setup_for(round);
    void *recv = alloc_elems(s.count * job->world, s.size);
    void *send = s.in_place ? (char *)recv + (size_t)(job->rank * s.count) * s.size
                            : alloc_elems(s.count, s.size);
    fill(s.dtype, send, s.count, job->rank, round, 0);
    nas_err err = {{0}};
    if (tr_comm_all_gather(job->comm, s.dtype, send, recv, s.count, &err) != NAS_OK)
      job_fail(job, "round %d: %s", round, err.msg);
    for (int r = 0; r < job->world; r++)
      for (int64_t j = 0; j < s.count; j++) {
        double want = s.dtype == TR_F32 ? (float)input(r, round, j) : input(r, round, j);
        if (element(s.dtype, recv, r * s.count + j) != want)
          job_fail(job, "round %d: chunk %d element %lld is not rank %d's", round, r, (long long)j,
                   r);
      }
    if (!s.in_place) free(send);
    free(recv);
  }
}

static void reduce_scatter_body(rank_job *job) {
  for (int round = 0; round < job->rounds; round++) {
    round_setup s = setup_for(round);
    int64_t total = s.count * job->world, mine = job->rank * s.count;
    void *send = alloc_elems(total, s.size);
    void *recv = s.in_place ? (char *)send + (size_t)mine * s.size : alloc_elems(s.count, s.size);
    fill(s.dtype, send, total, job->rank, round, 0);
    nas_err err = {{0}};
    if (tr_comm_reduce_scatter(job->comm, s.dtype, send, recv, s.count, s.op, &err) != NAS_OK)
      job_fail(job, "round %d: %s", round, err.msg);
    for (int64_t j = 0; j < s.count; j++)
      if (element(s.dtype, recv, j) != reference(s.dtype, job->world, round, mine + j, s.op))
        job_fail(job, "round %d element %lld differs from the rank-order sum", round, (long long)j);
    if (!s.in_place) free(recv);
    free(send);
  }
}

static void broadcast_body(rank_job *job) {
  for (int round = 0; round < job->rounds; round++) {
    round_setup s = setup_for(round);
    int root = round % job->world;
    void *buf = alloc_elems(s.count, s.size);
    fill(s.dtype, buf, s.count, job->rank, round, 0);
    nas_err err = {{0}};
    if (tr_comm_broadcast(job->comm, s.dtype, buf, s.count, root, &err) != NAS_OK)
      job_fail(job, "round %d: %s", round, err.msg);
    for (int64_t j = 0; j < s.count; j++) {
      double want = s.dtype == TR_F32 ? (float)input(root, round, j) : input(root, round, j);
      if (element(s.dtype, buf, j) != want)
        job_fail(job, "round %d element %lld is not root %d's", round, (long long)j, root);
    }
    free(buf);
  }
}

/* Every collective body on 1 to 4 thread ranks, and on 1 to 4 process ranks whose buffers
 * go through shared memory in one piece (the default stage) or in many (64-byte stages:
 * 16 floats or 8 doubles a round, shared out among the chunks of a reduce-scatter). */
static void run_everywhere(rank_body body) {
  for (int world = 1; world <= MAX_WORLD; world++) {
    run_threads(world, body, NULL);
    proc_setup whole = procs(PROC_ROUNDS, 0, "whole");
    run_procs(world, body, NULL, &whole);
    proc_setup pieces = procs(PROC_ROUNDS / 2, 64, "pieces");
    run_procs(world, body, NULL, &pieces);
  }
}

static void all_reduce_equals_rank_order_sum_for_1_to_4_ranks(void **state) {
  (void)state;
  run_everywhere(all_reduce_body);
}

static void all_gather_concatenates_in_rank_order_for_1_to_4_ranks(void **state) {
  (void)state;
  run_everywhere(all_gather_body);
}

static void reduce_scatter_gives_each_rank_its_summed_chunk_for_1_to_4_ranks(void **state) {
  (void)state;
  run_everywhere(reduce_scatter_body);
}

static void broadcast_copies_the_root_to_every_rank_for_1_to_4_ranks(void **state) {
  (void)state;
  run_everywhere(broadcast_body);
}

/* The exact checks above mean something only if another summation order gives other bits
 * on this data. */
static void reference_data_is_sensitive_to_summation_order(void **state) {
  (void)state;
  int differ = 0;
  for (int64_t i = 0; i < 1000; i++) {
    float forward = 0, backward = 0;
    for (int r = 0; r < MAX_WORLD; r++) forward += (float)input(r, 0, i);
    for (int r = MAX_WORLD - 1; r >= 0; r--) backward += (float)input(r, 0, i);
    differ += forward != backward;
  }
  assert_true(differ > 10);
}

/* ---------------------------------------------------------------- barrier */

/* Each rank stamps its slot with the round, then after the barrier every slot must show
 * that round (the last rank to arrive included: nobody left early); a second barrier keeps
 * the next round's stamps from landing before everyone has looked. Plain, unsynchronised
 * memory (shared between processes for process ranks): the barrier alone must order it
 * (a thread sanitizer run checks exactly that for threads). */
static void barrier_body(rank_job *job) {
  int *stamps = job->shared;
  nas_err err = {{0}};
  for (int round = 0; round < job->rounds * 5; round++) {
    stamps[job->rank] = round;
    if (tr_comm_barrier(job->comm, &err) != NAS_OK) job_fail(job, "%s", err.msg);
    for (int r = 0; r < job->world; r++)
      if (stamps[r] != round)
        job_fail(job, "round %d: rank %d's stamp %d seen after the barrier", round, r, stamps[r]);
    if (tr_comm_barrier(job->comm, &err) != NAS_OK) job_fail(job, "%s", err.msg);
  }
}

static void barrier_makes_every_rank_writes_visible_before_anyone_passes(void **state) {
  (void)state;
  int *stamps = mmap(NULL, MAX_WORLD * sizeof *stamps, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(stamps != MAP_FAILED);
  for (int world = 1; world <= MAX_WORLD; world++) {
    memset(stamps, 0, MAX_WORLD * sizeof *stamps);
    run_threads(world, barrier_body, stamps);
    memset(stamps, 0, MAX_WORLD * sizeof *stamps);
    proc_setup ps = procs(PROC_ROUNDS, 0, "barrier");
    run_procs(world, barrier_body, stamps, &ps);
  }
  munmap(stamps, MAX_WORLD * sizeof *stamps);
}

/* ---------------------------------------------------------------- mismatched calls */

/* How the last rank's call goes wrong in mismatch_body. */
typedef enum { WRONG_COUNT, WRONG_COLLECTIVE, WRONG_ROOT, WRONG_DTYPE } wrong_kind;

typedef struct {
  wrong_kind wrong;
  const char *expect; /* in every rank's message */
} mismatch_case;

/* Every rank calls all_reduce (broadcast for WRONG_ROOT) on 8 floats except the last,
 * which gets one argument wrong; all must fail with the same message, and an all_reduce
 * right after must work again. */
static void mismatch_body(rank_job *job) {
  const mismatch_case *mc = job->shared;
  float buf[9] = {0};
  bool odd = job->rank == job->world - 1;
  nas_err err = {{0}};
  int rc;
  if (mc->wrong == WRONG_COLLECTIVE && odd)
    rc = tr_comm_barrier(job->comm, &err);
  else if (mc->wrong == WRONG_ROOT)
    rc = tr_comm_broadcast(job->comm, TR_F32, buf, 8, odd ? job->world : 0, &err);
  else if (mc->wrong == WRONG_DTYPE && odd)
    rc = tr_comm_all_reduce(job->comm, TR_F64, buf, buf, 4, TR_REDUCE_SUM, &err);
  else
    rc = tr_comm_all_reduce(job->comm, TR_F32, buf, buf, odd && mc->wrong == WRONG_COUNT ? 9 : 8,
                            TR_REDUCE_SUM, &err);
  if (rc != NAS_ERR) job_fail(job, "mismatched call succeeded");
  if (!strstr(err.msg, mc->expect))
    job_fail(job, "message \"%s\" lacks \"%s\"", err.msg, mc->expect);
  snprintf(job->note, sizeof job->note, "%s", err.msg);
  for (int i = 0; i < 8; i++) buf[i] = (float)(job->rank + 1);
  if (tr_comm_all_reduce(job->comm, TR_F32, buf, buf, 8, TR_REDUCE_SUM, &err) != NAS_OK)
    job_fail(job, "group unusable after a mismatch: %s", err.msg);
  if (buf[7] != (float)(job->world * (job->world + 1) / 2))
    job_fail(job, "all_reduce after a mismatch gave %g", (double)buf[7]);
}

static void mismatched_calls_fail_on_every_rank_without_deadlock(void **state) {
  (void)state;
  const mismatch_case cases[] = {
      {WRONG_COUNT, "passed count 9, rank 0 8"},
      {WRONG_COLLECTIVE, "called barrier while rank 0 called all_reduce"},
      {WRONG_ROOT, "passed root"},
      {WRONG_DTYPE, "passed dtype float64, rank 0 float32"},
  };
  for (int world = 2; world <= MAX_WORLD; world++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      run_threads(world, mismatch_body, (void *)&cases[c]);
      /* processes: the same message on every rank, word for word */
      proc_setup ps = procs(0, 0, "mismatch");
      rank_job jobs[MAX_WORLD];
      run_procs_report(world, mismatch_body, (void *)&cases[c], &ps, jobs);
      assert_no_failures(jobs, world, "processes");
      for (int r = 1; r < world; r++) assert_string_equal(jobs[r].note, jobs[0].note);
    }
}

static void bad_group_arguments_are_errors(void **state) {
  (void)state;
  nas_err err = {{0}};
  assert_null(tr_comm_group_new(0, &err));
  assert_non_null(strstr(err.msg, "at least 1"));
  tr_comm_group *group = tr_comm_group_new(2, &err);
  assert_non_null(group);
  assert_null(tr_comm_group_comm(group, 2, &err));
  assert_non_null(strstr(err.msg, "rank 2"));
  tr_comm *c1 = tr_comm_group_comm(group, 1, &err);
  assert_int_equal(tr_comm_rank(c1), 1);
  assert_int_equal(tr_comm_world(c1), 2);
  tr_comm_free(c1); /* ignored: the group owns it */
  tr_comm_group_free(group);
  /* one rank alone: negative count is refused and the group goes on */
  group = tr_comm_group_new(1, &err);
  assert_non_null(group);
  assert_null(tr_comm_group_comm(NULL, 0, &err));
  tr_comm *c0 = tr_comm_group_comm(group, 0, &err);
  assert_non_null(c0);
  double x = 2;
  assert_int_equal(tr_comm_all_reduce(c0, TR_F64, &x, &x, -1, TR_REDUCE_SUM, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "count -1"));
  assert_int_equal(tr_comm_all_reduce(c0, TR_F64, &x, &x, 1, TR_REDUCE_AVG, &err), NAS_OK);
  assert_true(x == 2);
  tr_comm_group_free(group);
}

/* Options no group can have are refused at once, before anything waits or is created. */
static void bad_join_options_are_refused_without_waiting(void **state) {
  (void)state;
  struct {
    tr_comm_options o;
    const char *expect;
  } cases[] = {
      {{.backend = TR_COMM_PROCESSES, .world = 0, .nodes = 1, .name = "x"}, "at least 1"},
      {{.backend = TR_COMM_PROCESSES, .rank = 2, .world = 2, .nodes = 1, .name = "x"},
       "rank 2 is not in [0, 2)"},
      {{.backend = TR_COMM_PROCESSES, .world = 1, .nodes = 1, .name = "a/b"}, "group name"},
      {{.backend = TR_COMM_PROCESSES, .world = 1, .nodes = 1, .name = ""}, "group name"},
      {{.backend = TR_COMM_PROCESSES, .world = 2, .nodes = 2, .name = "x"}, "use the NCCL backend"},
      {{.backend = TR_COMM_PROCESSES, .world = 1, .nodes = 1, .name = "x",
        .stage_bytes = (size_t)1 << 40},
       "stage_bytes"},
      {{.backend = TR_COMM_THREADS, .world = 1, .nodes = 1, .name = "x"}, "tr_comm_group_new"},
      /* NAS_WORLD may say so: the segment's size would wrap around */
      {{.backend = TR_COMM_PROCESSES, .world = 1 << 30, .nodes = 1, .name = "x"},
       "1073741824 ranks"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    nas_err err = {{0}};
    tr_comm *comm = NULL;
    double start = nas_monotonic();
    assert_int_equal(tr_comm_join(&cases[c].o, &comm, &err), NAS_ERR);
    assert_null(comm);
    if (!strstr(err.msg, cases[c].expect)) print_error("case %zu: %s\n", c, err.msg);
    assert_non_null(strstr(err.msg, cases[c].expect));
    assert_true(nas_monotonic() - start < 0.5);
  }
  assert_int_equal(shm_leftovers("x"), 0);
}

/* ---------------------------------------------------------------- ranks that fail */

/* The last rank does not come to the all_reduce: it leaves (exit_early), or stalls until
 * the others have failed and then calls it late. The others must fail, not hang, with a
 * message naming it; the late call and every later one fail with that same message. */
typedef struct {
  bool exit_early;
  int failed; /* ranks whose all_reduce has failed (shared between the processes) */
} absence;

/* A mapping all forked ranks share, for an absence. */
static absence *absence_new(bool exit_early) {
  absence *a = mmap(NULL, sizeof *a, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(a != MAP_FAILED);
  *a = (absence){.exit_early = exit_early};
  return a;
}

static void absent_last_rank_body(rank_job *job) {
  absence *a = job->shared;
  bool last = job->rank == job->world - 1;
  if (last && a->exit_early) return; /* the child exits right after */
  for (int i = 0; last && i < 1000; i++) {
    if (__atomic_load_n(&a->failed, __ATOMIC_ACQUIRE) == job->world - 1) break;
    nas_sleep_ms(10);
  }
  float buf[4] = {1, 2, 3, 4};
  nas_err err = {{0}};
  double start = nas_monotonic();
  if (tr_comm_all_reduce(job->comm, TR_F32, buf, buf, 4, TR_REDUCE_SUM, &err) == NAS_OK)
    job_fail(job, "all_reduce succeeded without the last rank");
  __atomic_add_fetch(&a->failed, 1, __ATOMIC_RELEASE);
  snprintf(job->note, sizeof job->note, "%s", err.msg);
  if (nas_monotonic() - start > 5) job_fail(job, "took %g s to fail", nas_monotonic() - start);
  nas_err again = {{0}};
  if (tr_comm_barrier(job->comm, &again) == NAS_OK || strcmp(again.msg, err.msg) != 0)
    job_fail(job, "after the failure a barrier gave \"%s\", not \"%s\"", again.msg, err.msg);
}

static void a_rank_that_exits_makes_the_others_fail_at_once(void **state) {
  (void)state;
  absence *a = absence_new(true);
  proc_setup ps = procs(0, 0, "exits");
  ps.timeout_s = 60; /* noticed by its pid, long before this */
  ps.parent = 0;     /* the last rank exits: a child plays it */
  rank_job jobs[3];
  run_procs_report(3, absent_last_rank_body, a, &ps, jobs);
  munmap(a, sizeof *a);
  assert_no_failures(jobs, 3, "processes");
  assert_non_null(strstr(jobs[0].note, "all_reduce: rank 2 (pid "));
  assert_non_null(strstr(jobs[0].note, ") exited while the others waited for it"));
  assert_string_equal(jobs[1].note, jobs[0].note);
  assert_int_equal(shm_leftovers(ps.name), 0);
}

static void a_rank_that_stops_calling_times_the_others_out(void **state) {
  (void)state;
  absence *a = absence_new(false);
  proc_setup ps = procs(0, 0, "stalls");
  ps.timeout_s = 0.3;
  rank_job jobs[3];
  run_procs_report(3, absent_last_rank_body, a, &ps, jobs);
  munmap(a, sizeof *a);
  assert_no_failures(jobs, 3, "processes");
  assert_non_null(
      strstr(jobs[0].note, "all_reduce: timed out after 0.3 s waiting for rank 2 (pid "));
  for (int r = 1; r < 3; r++) assert_string_equal(jobs[r].note, jobs[0].note);
}

static void joining_times_out_naming_who_did_not_come(void **state) {
  (void)state;
  proc_setup ps = procs(0, 0, "nojoin");
  ps.timeout_s = 0.3;
  rank_job jobs[2];
  ps.absent = 1; /* rank 0 waits for rank 1 */
  ps.parent = 0;
  run_procs_report(2, NULL, NULL, &ps, jobs);
  assert_non_null(strstr(jobs[0].first, "joining: timed out after 0.3 s waiting for rank 1 (not "
                                        "joined)"));
  assert_non_null(strstr(jobs[0].first, ps.name));
  ps.absent = 0; /* rank 1 waits for rank 0's segment */
  ps.parent = 1;
  run_procs_report(2, NULL, NULL, &ps, jobs);
  assert_non_null(strstr(jobs[1].first, "timed out after 0.3 s waiting for rank 0 to create "
                                        SHM_DIR "/nas-comm-"));
  assert_int_equal(shm_leftovers(ps.name), 0);
}

/* Leaves the segment of a launch of group name that was killed while it gathered: its
 * rank 0, forked, made the segment and waited for a rank 1 until killed. */
static void leave_a_killed_launch(const char *name) {
  char path[256];
  snprintf(path, sizeof path, SHM_DIR "/nas-comm-%s", name);
  fflush(stdout);
  fflush(stderr);
  pid_t killed = fork();
  assert_true(killed >= 0);
  if (killed == 0) {
    tr_comm_options o = {.backend = TR_COMM_PROCESSES, .world = 2, .nodes = 1, .timeout_s = 30};
    snprintf(o.name, sizeof o.name, "%s", name);
    tr_comm *comm;
    _exit(tr_comm_join(&o, &comm, NULL) == NAS_OK ? 0 : 1); /* killed while it waits */
  }
  for (int i = 0; i < 500 && access(path, F_OK) != 0; i++) nas_sleep_ms(10);
  assert_int_equal(access(path, F_OK), 0);
  assert_int_equal(kill(killed, SIGKILL), 0);
  assert_int_equal(waitpid(killed, NULL, 0), killed);
  assert_int_equal(access(path, F_OK), 0); /* stale */
}

/* A launch killed while it gathered leaves its segment behind; the next launch of that
 * name (its rank 1 first, meeting the stale segment) must form its group all the same. */
static void a_segment_left_by_a_killed_launch_is_replaced(void **state) {
  (void)state;
  proc_setup ps = procs(4, 0, "stale");
  leave_a_killed_launch(ps.name);
  ps.rank0_delay = 0.3;
  run_procs(2, all_reduce_body, NULL, &ps);
}

/* The stale segment was made for another world size: the new launch's ranks skip it all
 * the same instead of taking it for a group that disagrees with them. */
static void a_segment_left_by_a_killed_launch_of_another_size_is_replaced(void **state) {
  (void)state;
  proc_setup ps = procs(4, 0, "stale-size");
  leave_a_killed_launch(ps.name);
  ps.rank0_delay = 0.3;
  ps.timeout_s = 5; /* rank 0 waits this long for ranks that failed before they joined */
  run_procs(3, all_reduce_body, NULL, &ps);
}

/* Names are unique to a launch, so no later launch replaces that segment; the next rank 0
 * of any group removes it. */
static void a_segment_left_by_a_killed_launch_is_removed_by_the_next_group(void **state) {
  (void)state;
  char orphan[64];
  unique_name(orphan, sizeof orphan, "orphan");
  leave_a_killed_launch(orphan);
  proc_setup ps = procs(1, 0, "after-orphan");
  run_procs(2, all_reduce_body, NULL, &ps);
  assert_int_equal(shm_leftovers(orphan), 0);
}

/* ---------------------------------------------------------------- environment */

static const char *const env_vars[] = {"NAS_RANK",     "NAS_WORLD",     "NAS_COMM_ID",
                                       "SLURM_PROCID", "SLURM_NTASKS",  "SLURM_LOCALID",
                                       "SLURM_NNODES", "SLURM_JOB_ID", "SLURM_STEP_ID"};

static void env_clear(void) {
  for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++) unsetenv(env_vars[i]);
}

/* Sets "NAME=value" pairs, after clearing every variable tr_comm_env reads. */
static void env_set(const char *const *pairs) {
  env_clear();
  for (; *pairs; pairs++) {
    char name[64];
    const char *eq = strchr(*pairs, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - *pairs), *pairs);
    setenv(name, eq + 1, 1);
  }
}

static int env_setup(void **state) {
  (void)state;
  env_clear();
  return 0;
}

static void nas_variables_give_rank_world_and_name(void **state) {
  (void)state;
  env_set((const char *[]){"NAS_RANK=1", "NAS_WORLD=3", "NAS_COMM_ID=trial-7.a", NULL});
  tr_comm_options o = {.backend = TR_COMM_NCCL, .timeout_s = 5};
  nas_err err = {{0}};
  assert_int_equal(tr_comm_env(&o, &err), NAS_OK);
  assert_int_equal(o.rank, 1);
  assert_int_equal(o.world, 3);
  assert_int_equal(o.local_rank, 1);
  assert_int_equal(o.nodes, 1);
  assert_string_equal(o.name, "trial-7.a");
  assert_int_equal(o.backend, TR_COMM_NCCL); /* the caller's fields stay */
  assert_true(o.timeout_s == 5);
  env_clear();
}

static void slurm_variables_name_the_group_by_job_step(void **state) {
  (void)state;
  const char *task[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_NNODES=2",
                        "SLURM_JOB_ID=77", "SLURM_STEP_ID=3", NULL};
  env_set(task);
  tr_comm_options o = {0};
  nas_err err = {{0}};
  assert_int_equal(tr_comm_env(&o, &err), NAS_OK);
  assert_int_equal(o.rank, 2);
  assert_int_equal(o.world, 4);
  assert_int_equal(o.local_rank, 0);
  assert_int_equal(o.nodes, 2);
  assert_string_equal(o.name, "slurm-77.3");
  setenv("NAS_COMM_ID", "cluster-b", 1);
  assert_int_equal(tr_comm_env(&o, &err), NAS_OK);
  assert_string_equal(o.name, "cluster-b-slurm-77.3");
  /* NAS_RANK wins: a launcher's own processes inside a Slurm task */
  setenv("NAS_RANK", "0", 1);
  setenv("NAS_WORLD", "1", 1);
  assert_int_equal(tr_comm_env(&o, &err), NAS_OK);
  assert_int_equal(o.world, 1);
  assert_string_equal(o.name, "cluster-b");
  env_clear();
}

static void missing_or_malformed_variables_are_named(void **state) {
  (void)state;
  struct {
    const char *env[8];
    const char *expect;
  } cases[] = {
      {{NULL}, "neither NAS_RANK"},
      {{"NAS_RANK=0", NULL}, "NAS_WORLD is not set"},
      {{"NAS_RANK=2", "NAS_WORLD=2", "NAS_COMM_ID=x", NULL},
       "NAS_RANK=\"2\" is not an integer in [0, 1]"},
      {{"NAS_RANK=0", "NAS_WORLD=2x", "NAS_COMM_ID=x", NULL}, "NAS_WORLD=\"2x\""},
      {{"NAS_RANK=0", "NAS_WORLD=2", NULL}, "NAS_COMM_ID is not set"},
      {{"NAS_RANK=0", "NAS_WORLD=2", "NAS_COMM_ID=../etc", NULL}, "group name \"../etc\""},
      {{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=5", NULL}, "not from the batch script"},
      {{"SLURM_PROCID=0", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0", NULL}, "SLURM_NTASKS is not set"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    env_set(cases[c].env);
    tr_comm_options o = {0};
    nas_err err = {{0}};
    assert_int_equal(tr_comm_env(&o, &err), NAS_ERR);
    if (!strstr(err.msg, cases[c].expect)) print_error("case %zu: %s\n", c, err.msg);
    assert_non_null(strstr(err.msg, cases[c].expect));
    tr_comm *comm;
    assert_int_equal(tr_comm_init_env(NULL, &comm, &err), NAS_ERR);
    assert_null(comm);
  }
  env_clear();
}

/* A Slurm step across nodes cannot use the CPU backend: refused at once, not a timeout. */
static void processes_from_a_step_on_two_nodes_are_refused(void **state) {
  (void)state;
  env_set((const char *[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                           "SLURM_NNODES=2", "SLURM_JOB_ID=9", "SLURM_STEP_ID=1", NULL});
  tr_comm *comm;
  nas_err err = {{0}};
  assert_int_equal(tr_comm_init_env(NULL, &comm, &err), NAS_ERR);
  assert_non_null(strstr(err.msg, "2 nodes"));
  assert_non_null(strstr(err.msg, "NCCL"));
  env_clear();
}

static void ranks_form_a_group_from_nas_variables(void **state) {
  (void)state;
  for (int world = 1; world <= 3; world += 2) {
    proc_setup ps = procs(PROC_ROUNDS / 4, 0, "nasenv");
    ps.how = JOIN_NAS_ENV;
    run_procs(world, all_reduce_body, NULL, &ps);
  }
}

static void ranks_form_a_group_from_slurm_variables(void **state) {
  (void)state;
  proc_setup ps = procs(PROC_ROUNDS / 4, 0, "slurmenv");
  ps.how = JOIN_SLURM_ENV;
  run_procs(2, all_reduce_body, NULL, &ps);
  assert_int_equal(shm_leftovers(ps.name), 0); /* the segment was named NAME-slurm-4242.0 */
}

/* ---------------------------------------------------------------- NCCL */

/* The NCCL backend where there is no GPU (or the build has no CUDA): the join fails at
 * once saying why. */
static void nccl_without_a_device_fails_saying_why(void **state) {
  (void)state;
  nas_err why = {{0}};
  if (tr_cuda_device_count(&why) > 0) {
    print_message("NCCL: a CUDA device is present; the no-device check does not apply\n");
    return;
  }
  tr_comm_options o = {.backend = TR_COMM_NCCL, .world = 1, .nodes = 1, .name = "nccl-none",
                       .timeout_s = 5};
  tr_comm *comm;
  nas_err err = {{0}};
  double start = nas_monotonic();
  assert_int_equal(tr_comm_join(&o, &comm, &err), NAS_ERR);
  assert_null(comm);
  print_message("NCCL join without a device: %s\n", err.msg);
  assert_true(strstr(err.msg, "no usable CUDA device") || strstr(err.msg, "no CUDA device") ||
              strstr(err.msg, "built without CUDA/NCCL"));
  assert_true(nas_monotonic() - start < 2);
}

/* Whether every checked element of the device tensor t equals host. */
static bool device_equals(tr_tensor *t, const double *host, int64_t n) {
  for (int64_t i = 0; i < n; i += 97)
    if (tr_get(t, i) != host[i]) return false;
  return true;
}

/* World 1 on device 0: each collective out of place into a zeroed buffer, so each must
 * move the data itself; values checked on the host. */
static void nccl_moves_device_buffers_on_one_gpu(void **state) {
  (void)state;
  nas_err why = {{0}};
  if (tr_cuda_device_count(&why) < 1) {
    print_message("SKIPPED: NCCL collectives need a CUDA device: %s\n", why.msg);
    skip();
  }
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  ctx.cuda = tr_cuda_new(0, 0, &why);
  assert_non_null(ctx.cuda);
  tr_comm_options o = {.backend = TR_COMM_NCCL, .world = 1, .nodes = 1, .timeout_s = 60};
  unique_name(o.name, sizeof o.name, "nccl");
  tr_comm *comm;
  nas_err err = {{0}};
  if (tr_comm_join(&o, &comm, &err) != NAS_OK) print_error("%s\n", err.msg);
  assert_non_null(comm);
  assert_int_equal(tr_comm_backend_of(comm), TR_COMM_NCCL);
  enum { N = 1000 };
  const int64_t n = N;
  double host[N];
  for (int64_t i = 0; i < n; i++) host[i] = input(0, 0, i);
  tr_tensor *src = tr_from_data(&ctx, TR_F64, 1, &n, host);
  tr_tensor *send = tr_to_device(&ctx, src, TR_DEVICE_CUDA(0));
  tr_tensor *recv = tr_to_device(&ctx, src, TR_DEVICE_CUDA(0));
  assert_non_null(send);
  assert_non_null(recv);
  void *s = tr_data(send), *r = tr_data(recv);
  assert_int_equal(tr_fill_(&ctx, recv, 0), NAS_OK);
  assert_int_equal(tr_comm_all_reduce(comm, TR_F64, s, r, n, TR_REDUCE_AVG, &err), NAS_OK);
  assert_true(device_equals(recv, host, n));
  assert_int_equal(tr_fill_(&ctx, recv, 0), NAS_OK);
  assert_int_equal(tr_comm_all_gather(comm, TR_F64, s, r, n, &err), NAS_OK);
  assert_true(device_equals(recv, host, n));
  assert_int_equal(tr_fill_(&ctx, recv, 0), NAS_OK);
  assert_int_equal(tr_comm_reduce_scatter(comm, TR_F64, s, r, n, TR_REDUCE_SUM, &err), NAS_OK);
  assert_true(device_equals(recv, host, n));
  assert_int_equal(tr_comm_broadcast(comm, TR_F64, r, n, 0, &err), NAS_OK);
  assert_int_equal(tr_comm_barrier(comm, &err), NAS_OK);
  assert_true(device_equals(recv, host, n));
  tr_comm_free(comm);
  tr_release(src);
  tr_release(send);
  tr_release(recv);
  tr_cuda_free(ctx.cuda);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reference_data_is_sensitive_to_summation_order),
      cmocka_unit_test(all_reduce_equals_rank_order_sum_for_1_to_4_ranks),
      cmocka_unit_test(all_gather_concatenates_in_rank_order_for_1_to_4_ranks),
      cmocka_unit_test(reduce_scatter_gives_each_rank_its_summed_chunk_for_1_to_4_ranks),
      cmocka_unit_test(broadcast_copies_the_root_to_every_rank_for_1_to_4_ranks),
      cmocka_unit_test(barrier_makes_every_rank_writes_visible_before_anyone_passes),
      cmocka_unit_test(mismatched_calls_fail_on_every_rank_without_deadlock),
      cmocka_unit_test(bad_group_arguments_are_errors),
      cmocka_unit_test(bad_join_options_are_refused_without_waiting),
      cmocka_unit_test(a_rank_that_exits_makes_the_others_fail_at_once),
      cmocka_unit_test(a_rank_that_stops_calling_times_the_others_out),
      cmocka_unit_test(joining_times_out_naming_who_did_not_come),
      cmocka_unit_test(a_segment_left_by_a_killed_launch_is_replaced),
      cmocka_unit_test(a_segment_left_by_a_killed_launch_of_another_size_is_replaced),
      cmocka_unit_test(a_segment_left_by_a_killed_launch_is_removed_by_the_next_group),
      cmocka_unit_test_setup(nas_variables_give_rank_world_and_name, env_setup),
      cmocka_unit_test_setup(slurm_variables_name_the_group_by_job_step, env_setup),
      cmocka_unit_test_setup(missing_or_malformed_variables_are_named, env_setup),
      cmocka_unit_test_setup(processes_from_a_step_on_two_nodes_are_refused, env_setup),
      cmocka_unit_test(ranks_form_a_group_from_nas_variables),
      cmocka_unit_test(ranks_form_a_group_from_slurm_variables),
      cmocka_unit_test(nccl_without_a_device_fails_saying_why),
      cmocka_unit_test(nccl_moves_device_buffers_on_one_gpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
