/* What a nas process pays before it does anything, and the run-time loading of the GPU
 * libraries that keeps that small. Every CLI call, scheduler and worker is a fresh process,
 * and a signal sent just after start must find its handler installed, so `nas --version`
 * must take milliseconds and a few MB even in the CUDA build: cuBLAS and NCCL (~0.4 s and
 * ~230 MB when linked) are loaded only when a CUDA engine's GEMM binding or an NCCL id or
 * communicator is made. Those loaders are tested here where they can run without a GPU: the
 * library loads, and what fails after it is the device or NCCL itself, not the loading. */
#include "tests/testutil.h"

#include <sys/resource.h>

#include "trainer/dist/comm_nccl.h"
#include "trainer/cuda/cuda_kernels.h"

/* A plain build starts in ~25 ms and ~14 MB; under AddressSanitizer (`make asan` builds
 * this test and nas with it) in ~0.15 s and ~37 MB, mostly its runtime's. Linking cuBLAS
 * and NCCL again would cost ~0.4 s and ~230 MB (~0.7 s and ~360 MB under ASan). */
#define STARTUP_RUNS 5
#ifdef __SANITIZE_ADDRESS__
#define STARTUP_MAX_S 0.4
#define STARTUP_MAX_RSS_KB (100 * 1024)
#else
#define STARTUP_MAX_S 0.1
#define STARTUP_MAX_RSS_KB (50 * 1024)
#endif

/* Runs `nas --version` with its output dropped; its wall time and peak RSS (this child's
 * alone: wait4, not RUSAGE_CHILDREN, which keeps the peak of every earlier child). */
static void run_version(double *wall_s, long *rss_kb) {
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    execl(test_nas_bin(), test_nas_bin(), "--version", (char *)NULL);
    _exit(127);
  }
  int status;
  struct rusage usage;
  assert_int_equal(wait4(pid, &status, 0, &usage), pid);
  clock_gettime(CLOCK_MONOTONIC, &end);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  *wall_s = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) * 1e-9;
  *rss_kb = usage.ru_maxrss;
}

/* The best of a few runs, so that a busy machine does not fail the test. */
static void version_starts_in_milliseconds_and_megabytes(void **state) {
  (void)state;
  double best_s = 1e9;
  long best_kb = 0;
  for (int i = 0; i < STARTUP_RUNS; i++) {
    double wall_s;
    long rss_kb;
    run_version(&wall_s, &rss_kb);
    if (wall_s < best_s) best_s = wall_s;
    if (i == 0 || rss_kb < best_kb) best_kb = rss_kb;
  }
  print_message("%s --version: %.3f s, %ld KB max RSS (best of %d)\n", test_nas_bin(), best_s,
                best_kb, STARTUP_RUNS);
  assert_true(best_s < STARTUP_MAX_S);
  assert_true(best_kb < STARTUP_MAX_RSS_KB);
}

static bool is_load_failure(const char *msg) { return strstr(msg, "cannot load") != NULL; }

static void cublas_is_loaded_when_a_gemm_binding_is_made(void **state) {
  (void)state;
#ifndef NAS_HAVE_CUDA
  print_message("skipped: built without CUDA\n");
  skip();
#endif
  void *blas = NULL;
  tck_status st = tck_blas_new(0, NULL, &blas);
  /* With a device it works; without one the message is the CUDA runtime's (no driver, no
   * device), which comes after cuBLAS was loaded and its functions found. */
  if (st) {
    print_message("tck_blas_new: %s\n", st);
    assert_false(is_load_failure(st));
    assert_null(strstr(st, "has no"));
  }
  assert_non_null(blas); /* it owns the message: freed after reading it, as any caller does */
  assert_null(tck_blas_free(0, blas));
}

static void nccl_is_loaded_for_a_unique_id(void **state) {
  (void)state;
#ifndef NAS_HAVE_CUDA
  print_message("skipped: built without CUDA\n");
  skip();
#endif
  unsigned char id[COMM_NCCL_ID_BYTES] = {0};
  nas_err err = {{0}};
  /* ncclGetUniqueId needs no GPU, only a network interface for the bootstrap. */
  if (comm_nccl_make_id(id, &err) != NAS_OK) {
    print_message("comm_nccl_make_id: %s\n", err.msg);
    assert_false(is_load_failure(err.msg));
    assert_non_null(strstr(err.msg, "ncclGetUniqueId"));
    return;
  }
  unsigned char zero[COMM_NCCL_ID_BYTES] = {0};
  assert_memory_not_equal(id, zero, sizeof id);
}

static void nccl_communicator_without_a_device_names_the_reason(void **state) {
  (void)state;
  nas_err err = {{0}};
  int devices;
  if (comm_nccl_devices(&devices, &err) == NAS_OK) {
    print_message("skipped: this machine has a CUDA device\n");
    skip();
  }
  unsigned char id[COMM_NCCL_ID_BYTES] = {0};
  comm_nccl *nc = NULL;
  assert_int_equal(comm_nccl_new(id, 0, 1, 0, 1.0, &nc, &err), NAS_ERR);
  assert_null(nc);
  assert_false(is_load_failure(err.msg));
  assert_non_null(strstr(err.msg, "NCCL backend"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(version_starts_in_milliseconds_and_megabytes),
      cmocka_unit_test(cublas_is_loaded_when_a_gemm_binding_is_made),
      cmocka_unit_test(nccl_is_loaded_for_a_unique_id),
      cmocka_unit_test(nccl_communicator_without_a_device_names_the_reason),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
