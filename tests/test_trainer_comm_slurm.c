/* The process backend of the collectives under a real srun, on the single-node Slurm
 * cluster this binary starts (tests/slurmcluster.h): the tasks of `srun -n N` form their
 * group by themselves from SLURM_* (tr_comm_init_env) and all-reduce a vector to the
 * rank-order sum; a task that leaves early makes the others fail naming it, not hang.
 *
 * The tasks are this binary itself, run as `test_trainer_comm_slurm --comm-task MODE`.
 * Without Slurm (no packages, not root) the tests are skipped with a loud message, and fail
 * when CI=true. */
#include "tests/testutil.h"

#include <math.h>

#include "tests/slurmcluster.h"
#include "trainer/dist.h"
#include "trainer/trainer.h"

#define TASK_ARG "--comm-task"
/* Elements each task reduces: more than one staging piece of the default 1 MiB. */
#define TASK_COUNT 300000

/* ---------------------------------------------------------------- the task */

/* Task rank's element i: magnitudes from 2^-10 to 2^10, so that another summation order
 * would give other bits. */
static double task_value(int rank, int64_t i) {
  return ldexp(sin((double)(i + 1) * (rank + 1)), (int)((i * 7 + rank * 3) % 21) - 10);
}

/* Elements of the all-reduce that differ from the serial rank-order sum. */
static int64_t task_wrong(const double *sum, int world) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < TASK_COUNT; i++) {
    double want = task_value(0, i);
    for (int r = 1; r < world; r++) want += task_value(r, i);
    wrong += sum[i] != want;
  }
  return wrong;
}

/* One srun task: joins the step's group and all-reduces its vector; in mode "leave" the
 * last task leaves without calling. Prints one line; exit status 0 when all went well. */
static int comm_task(const char *mode) {
  tr_comm_options o = {.backend = TR_COMM_PROCESSES, .timeout_s = 20};
  tr_comm *comm;
  nas_err err = {{0}};
  if (tr_comm_init_env(&o, &comm, &err) != NAS_OK) {
    printf("task: %s\n", err.msg);
    return 1;
  }
  int rank = tr_comm_rank(comm), world = tr_comm_world(comm);
  if (strcmp(mode, "leave") == 0 && rank == world - 1) {
    printf("task %d of %d: leaving\n", rank, world);
    tr_comm_free(comm);
    return 0;
  }
  double *x = malloc(TASK_COUNT * sizeof *x);
  for (int64_t i = 0; x && i < TASK_COUNT; i++) x[i] = task_value(rank, i);
  int rc = x ? tr_comm_all_reduce(comm, TR_F64, x, x, TASK_COUNT, TR_REDUCE_SUM, &err)
             : nas_errf(&err, "out of memory");
  if (rc == NAS_OK) {
    int64_t wrong = task_wrong(x, world);
    printf("task %d of %d: all_reduce %s (%lld of %d elements differ)\n", rank, world,
           wrong ? "WRONG" : "ok", (long long)wrong, TASK_COUNT);
    rc = wrong ? NAS_ERR : NAS_OK;
  } else {
    printf("task %d of %d: %s\n", rank, world, err.msg);
  }
  free(x);
  tr_comm_free(comm);
  return rc == NAS_OK ? 0 : 1;
}

/* ---------------------------------------------------------------- the tests */

typedef struct {
  test_slurm_cluster cluster;
  bool up;
  char self[4096]; /* this binary, which the tasks run */
} group;

static int group_setup(void **state) {
  group *g = calloc(1, sizeof *g);
  *state = g;
  ssize_t n = readlink("/proc/self/exe", g->self, sizeof g->self - 1);
  assert_true(n > 0);
  g->self[n] = '\0';
  g->up = test_slurm_cluster_start(&g->cluster);
  if (!g->up) {
    bool ci = getenv("CI") && strcmp(getenv("CI"), "true") == 0;
    fprintf(stderr,
            "\n*** SLURM CLUSTER NOT STARTED: %s\n"
            "*** The srun collectives tests %s. Install slurm-wlm and munge "
            "(scripts/deps.sh slurm) and run as root.\n\n",
            g->cluster.why, ci ? "FAIL (CI=true)" : "are SKIPPED");
    return ci ? -1 : 0;
  }
  /* Every test cluster numbers its jobs from 1: this keeps our groups' names apart from
   * those of another cluster's steps on this machine (make test and make asan at once). */
  char id[64];
  snprintf(id, sizeof id, "test-slurm-%d", (int)getpid());
  setenv("NAS_COMM_ID", id, 1);
  return 0;
}

static int group_teardown(void **state) {
  group *g = *state;
  test_slurm_cluster_stop(&g->cluster);
  free(g);
  return 0;
}

/* Runs `srun -n tasks SELF --comm-task mode`; returns its status, *out its output. */
static int srun_tasks(const group *g, const char *tasks, const char *mode, char **out) {
  char *argv[] = {"srun", "-n", (char *)tasks, "-t", "1", (char *)g->self, TASK_ARG,
                  (char *)mode, NULL};
  int rc = test_run(NULL, argv, out);
  print_message("srun -n %s (%s) exited %d:\n%s", tasks, mode, rc, *out);
  return rc;
}

static void srun_tasks_form_a_group_and_all_reduce_to_the_rank_order_sum(void **state) {
  group *g = *state;
  if (!g->up) skip();
  const char *tasks[] = {"2", "4"};
  for (int t = 0; t < 2; t++) {
    char *out = NULL;
    assert_int_equal(srun_tasks(g, tasks[t], "sum", &out), 0);
    for (int r = 0; r < atoi(tasks[t]); r++) {
      char line[64];
      snprintf(line, sizeof line, "task %d of %s: all_reduce ok", r, tasks[t]);
      assert_non_null(strstr(out, line));
    }
    free(out);
  }
}

static void a_task_that_leaves_makes_the_others_fail_naming_it(void **state) {
  group *g = *state;
  if (!g->up) skip();
  char *out = NULL;
  assert_int_not_equal(srun_tasks(g, "3", "leave", &out), 0);
  assert_non_null(strstr(out, "task 2 of 3: leaving"));
  assert_non_null(strstr(out, "task 0 of 3: all_reduce: rank 2 (pid "));
  assert_non_null(strstr(out, "task 1 of 3: all_reduce: rank 2 (pid "));
  assert_non_null(strstr(out, "exited while the others waited for it"));
  free(out);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], TASK_ARG) == 0) return comm_task(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(srun_tasks_form_a_group_and_all_reduce_to_the_rank_order_sum),
      cmocka_unit_test(a_task_that_leaves_makes_the_others_fail_naming_it),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
