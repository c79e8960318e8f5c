/* The thread-rank collectives of trainer.h: each collective against a serial reference
 * computed here (exact equality: sums are taken in rank order), for 1 to 4 ranks, many
 * rounds in a row to shake out races; the barrier orders memory; mismatched calls fail on
 * every rank without a deadlock and leave the group usable.
 *
 * cmocka's asserts must run on the main thread, so each rank counts its own failures and
 * keeps the first message; the main thread asserts after joining the ranks. */
#include "tests/testutil.h"

#include <math.h>
#include <pthread.h>

#include "trainer/trainer.h"

#define ROUNDS 200
#define MAX_WORLD 4

/* Counts that cover empty, fewer elements than ranks, uneven chunks, and more than one
 * reduction block (2048 floats). */
static const int64_t counts[] = {0, 1, 3, 4, 7, 33, 257, 2053};
#define N_COUNTS ((int)(sizeof counts / sizeof counts[0]))

/* ---------------------------------------------------------------- rank threads */

typedef struct rank_job rank_job;
typedef void (*rank_body)(rank_job *job);

struct rank_job {
  tr_comm *comm;
  int rank, world;
  rank_body body;
  void *shared; /* the test's state seen by all ranks */
  int failures;
  char first[1200]; /* the first failure's message */
};

static void job_fail(rank_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_fail(rank_job *job, const char *fmt, ...) {
  if (job->failures++ > 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(job->first, sizeof job->first, fmt, ap);
  va_end(ap);
}

static void *rank_main(void *arg) {
  rank_job *job = arg;
  job->body(job);
  return NULL;
}

/* Runs body on world threads, one per rank of a fresh group; asserts no rank failed. */
static void run_ranks(int world, rank_body body, void *shared) {
  nas_err err = {{0}};
  tr_comm_group *group = tr_comm_group_new(world, &err);
  assert_non_null(group);
  rank_job jobs[MAX_WORLD] = {{0}};
  pthread_t threads[MAX_WORLD];
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){.comm = tr_comm_group_comm(group, r, &err),
                         .rank = r,
                         .world = world,
                         .body = body,
                         .shared = shared};
    assert_non_null(jobs[r].comm);
    assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &jobs[r]), 0);
  }
  for (int r = 0; r < world; r++) assert_int_equal(pthread_join(threads[r], NULL), 0);
  tr_comm_group_free(group);
  for (int r = 0; r < world; r++) {
    if (jobs[r].failures)
      print_error("world %d rank %d: %d failures, first: %s\n", world, r, jobs[r].failures,
                  jobs[r].first);
    assert_int_equal(jobs[r].failures, 0);
  }
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
  for (int round = 0; round < ROUNDS; round++) {
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
  for (int round = 0; round < ROUNDS; round++) {
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
  for (int round = 0; round < ROUNDS; round++) {
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
  for (int round = 0; round < ROUNDS; round++) {
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

static void all_reduce_equals_rank_order_sum_for_1_to_4_ranks(void **state) {
  (void)state;
  for (int world = 1; world <= MAX_WORLD; world++) run_ranks(world, all_reduce_body, NULL);
}

static void all_gather_concatenates_in_rank_order_for_1_to_4_ranks(void **state) {
  (void)state;
  for (int world = 1; world <= MAX_WORLD; world++) run_ranks(world, all_gather_body, NULL);
}

static void reduce_scatter_gives_each_rank_its_summed_chunk_for_1_to_4_ranks(void **state) {
  (void)state;
  for (int world = 1; world <= MAX_WORLD; world++) run_ranks(world, reduce_scatter_body, NULL);
}

static void broadcast_copies_the_root_to_every_rank_for_1_to_4_ranks(void **state) {
  (void)state;
  for (int world = 1; world <= MAX_WORLD; world++) run_ranks(world, broadcast_body, NULL);
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
 * memory: the barrier alone must order it (a thread sanitizer run checks exactly that). */
static void barrier_body(rank_job *job) {
  int *stamps = job->shared;
  nas_err err = {{0}};
  for (int round = 0; round < ROUNDS * 5; round++) {
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
  for (int world = 1; world <= MAX_WORLD; world++) {
    int stamps[MAX_WORLD] = {0};
    run_ranks(world, barrier_body, stamps);
  }
}

/* ---------------------------------------------------------------- errors */

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
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      run_ranks(world, mismatch_body, (void *)&cases[c]);
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
