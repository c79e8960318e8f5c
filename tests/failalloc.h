/* failalloc: allocation-failure injection for a test binary, in the manner of SQLite's
 * malloc tests.
 *
 * The binary that includes this header (one translation unit only: it defines malloc,
 * calloc, realloc and free) replaces the C library's allocator with a thin layer over
 * glibc's own (__libc_malloc …). Everything in the process allocates through it: libnas,
 * libc's strdup/asprintf/open_memstream, SQLite, jansson, libyaml, GSL, nlopt. The layer is
 * idle except on the thread that armed it, between failalloc_begin and failalloc_end; there
 * it counts allocations, fails the one chosen (once, or that one and every later one), and
 * remembers every block it handed out until that block is freed, so a leak is seen without
 * a sanitizer.
 *
 * failalloc_run drives one operation through every failure point: it runs the operation
 * once to warm up caches and once to count its allocations (A) and call sites, then for
 * n = 0, stride, 2·stride, … fails allocation n (transient mode: only that one; persistent
 * mode: that one and all after it, from stride/2 on) until a run makes fewer than n
 * allocations. The stride is 1 unless A exceeds the case's max_runs. After each
 * run it asserts that the operation either succeeded or returned an error with a message
 * (never one without an injected failure), that nothing allocated in the run is still
 * held after the case's `after` hook, and whatever that hook checks of the stored state.
 *
 * The allocator has no context argument, so its state is one static struct: the only
 * global mutable state a test binary may have, and only this one.
 *
 * Under AddressSanitizer the sanitizer owns malloc and a replacement would break it, so
 * the layer is left out: failalloc_unavailable says so (the binary then runs nothing, as
 * cmocka counts skipped tests as failures) and failalloc_run skips its test; `make test`
 * builds without sanitizers and runs them.
 *
 * Debugging: FAILALLOC_VERBOSE=1 prints each run's failure point; FAILALLOC_TRACE=k prints
 * a backtrace (addresses; resolve them with addr2line -e BINARY) of allocation k of every
 * tracked run of the cases whose name holds $FAILALLOC_CASE (of all when unset), to find
 * where a leaked block (reported by its number) came from. */
#ifndef NAS_TESTS_FAILALLOC_H
#define NAS_TESTS_FAILALLOC_H

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <execinfo.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "tests/testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define FAILALLOC_ENABLED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAILALLOC_ENABLED 0
#endif
#endif
#ifndef FAILALLOC_ENABLED
#define FAILALLOC_ENABLED 1
#endif

/* One operation under test. `ctx` is the case's own. */
typedef struct {
  const char *name;
  void *ctx;
  /* Prepares a run's inputs (optional); not tracked, never failed. */
  void (*before)(void *ctx);
  /* The operation: returns NAS_OK, or a negative code with err set. It frees everything
   * it made that is not kept in ctx for `after`. */
  int (*op)(void *ctx, nas_err *err);
  /* Checks what the run left (stored state, outputs; rc is op's result) and frees what op
   * kept in ctx (optional). Tracked but never failed: what it frees counts. */
  void (*after)(void *ctx, int rc);
  /* Most runs per mode: above that, failure points are taken every A/max_runs allocations
   * (0: every point). */
  long max_runs;
  /* A function of a shared library known to leak blocks of its own when one of its own
   * allocations fails (NULL: none). Such leaks are counted and shown, not failed; blocks
   * it allocated for our code, or leaked after our code's allocation failed, still are. */
  const void *leaky_library;
  /* A function of a shared library that ends the process when an allocation of its own
   * fails (OpenBLAS does), NULL: none. Its allocations are counted but never failed. */
  const void *spared_library;
} failalloc_case;

/* What failalloc_run saw. */
typedef struct {
  long allocations; /* allocations the operation makes when none fails */
  long sites;       /* distinct places in the binary (libnas or the test) they came from */
  long runs;        /* runs with an injected failure, both modes */
  long failed_runs; /* of those, runs where op returned an error */
} failalloc_report;

#if FAILALLOC_ENABLED

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void __libc_free(void *p);

/* Blocks held at once by one run of an operation; more is a test error. */
#define FAILALLOC_SLOTS (1u << 18)
/* Distinct call sites remembered when counting. */
#define FAILALLOC_SITES 4096

typedef struct {
  void *block;
  long seq;          /* its allocation number within the run */
  uintptr_t caller;  /* the code that called the allocator */
} failalloc_slot;

/* The layer's state; see the header comment for why it is static. */
static struct {
  bool tracking;         /* the armed thread's allocations are counted and remembered */
  bool persistent;       /* once failing, keep failing */
  bool failing;          /* persistent mode has begun to fail */
  bool in_trace;         /* inside backtrace(): its own allocations pass through */
  bool collect_sites;    /* remember where allocations come from (the counting run) */
  long fail_at;          /* number of the allocation to fail; -1: none */
  long allocations;      /* allocations of this run so far */
  long op_allocations;   /* of those, made by the operation (before its `after`) */
  long failures;         /* allocations failed in this run */
  long trace_at;         /* FAILALLOC_TRACE, or -1 */
  uintptr_t failed_caller; /* the code whose allocation failed first in this run */
  uintptr_t spared_lo, spared_hi; /* executable code whose allocations never fail */
  size_t live;           /* remembered blocks not freed yet */
  failalloc_slot slots[FAILALLOC_SLOTS];
  uintptr_t sites[FAILALLOC_SITES];
  size_t n_sites;
} failalloc;

/* Set on the thread under test only. */
static __thread bool failalloc_armed_thread;

extern const char __executable_start[];
extern const char etext[];

static inline size_t failalloc_hash(const void *p) {
  return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull) & (FAILALLOC_SLOTS - 1);
}

static void failalloc_remember(void *block, long seq, uintptr_t caller) {
  if (failalloc.live >= FAILALLOC_SLOTS - 1) {
    fputs("failalloc: too many live blocks\n", stderr);
    abort();
  }
  size_t i = failalloc_hash(block);
  while (failalloc.slots[i].block) i = (i + 1) & (FAILALLOC_SLOTS - 1);
  failalloc.slots[i] = (failalloc_slot){block, seq, caller};
  failalloc.live++;
}

/* Forgets block if remembered (linear probing with backward-shift deletion); returns
 * whether it was. */
static bool failalloc_forget(const void *block) {
  if (failalloc.live == 0 || !block) return false;
  size_t i = failalloc_hash(block);
  while (failalloc.slots[i].block != block) {
    if (!failalloc.slots[i].block) return false;
    i = (i + 1) & (FAILALLOC_SLOTS - 1);
  }
  size_t hole = i;
  for (size_t j = (i + 1) & (FAILALLOC_SLOTS - 1); failalloc.slots[j].block;
       j = (j + 1) & (FAILALLOC_SLOTS - 1)) {
    size_t home = failalloc_hash(failalloc.slots[j].block);
    /* The entry at j may move into the hole unless its home lies in (hole, j]. */
    bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    failalloc.slots[hole] = failalloc.slots[j];
    hole = j;
  }
  failalloc.slots[hole] = (failalloc_slot){NULL, 0, 0};
  failalloc.live--;
  return true;
}

/* The first return address inside this binary (libnas is linked in statically) above the
 * allocator: where the allocation comes from in our code. */
static void failalloc_note_site(void) {
  void *frames[16];
  failalloc.in_trace = true;
  int n = backtrace(frames, 16);
  failalloc.in_trace = false;
  for (int k = 2; k < n; k++) {
    uintptr_t a = (uintptr_t)frames[k];
    if (a < (uintptr_t)__executable_start || a >= (uintptr_t)etext) continue;
    for (size_t s = 0; s < failalloc.n_sites; s++)
      if (failalloc.sites[s] == a) return;
    if (failalloc.n_sites < FAILALLOC_SITES) failalloc.sites[failalloc.n_sites++] = a;
    return;
  }
}

static void failalloc_trace(long seq) {
  void *frames[32];
  fprintf(stderr, "failalloc: allocation %ld from\n", seq);
  failalloc.in_trace = true;
  int n = backtrace(frames, 32);
  backtrace_symbols_fd(frames, n, 2);
  failalloc.in_trace = false;
}

/* Whether this allocation (called from caller) is one to fail; counts it. */
static bool failalloc_fails(long *seq, uintptr_t caller) {
  if (!failalloc_armed_thread || !failalloc.tracking || failalloc.in_trace) return false;
  *seq = failalloc.allocations++;
  if (*seq == failalloc.trace_at) failalloc_trace(*seq);
  if (failalloc.collect_sites) failalloc_note_site();
  bool fail = failalloc.failing || *seq == failalloc.fail_at;
  if (!fail) return false;
  if (caller >= failalloc.spared_lo && caller < failalloc.spared_hi) {
    if (*seq == failalloc.fail_at) failalloc.fail_at++; /* fail the next one instead */
    return false;
  }
  failalloc.failing = failalloc.persistent;
  if (failalloc.failures++ == 0) failalloc.failed_caller = caller;
  errno = ENOMEM;
  return true;
}

static void failalloc_keep(void *block, long seq, uintptr_t caller) {
  if (block && seq >= 0) failalloc_remember(block, seq, caller);
}

#define FAILALLOC_CALLER ((uintptr_t)__builtin_return_address(0))

void *malloc(size_t size) {
  long seq = -1;
  if (failalloc_fails(&seq, FAILALLOC_CALLER)) return NULL;
  void *block = __libc_malloc(size);
  failalloc_keep(block, seq, FAILALLOC_CALLER);
  return block;
}

void *calloc(size_t n, size_t size) {
  long seq = -1;
  if (failalloc_fails(&seq, FAILALLOC_CALLER)) return NULL;
  void *block = __libc_calloc(n, size);
  failalloc_keep(block, seq, FAILALLOC_CALLER);
  return block;
}

/* A block reallocated keeps the standing it had: one made before the run (owned by the
 * case's inputs) is not the run's to free. */
void *realloc(void *old, size_t size) {
  uintptr_t caller = FAILALLOC_CALLER;
  long seq = -1;
  if (!old) {
    if (failalloc_fails(&seq, caller)) return NULL;
    void *block = __libc_malloc(size);
    failalloc_keep(block, seq, caller);
    return block;
  }
  if (size == 0) {
    free(old);
    return NULL;
  }
  if (failalloc_fails(&seq, caller)) return NULL;
  bool was_kept = failalloc_forget(old);
  void *block = __libc_realloc(old, size);
  if (was_kept) failalloc_remember(block ? block : old, seq >= 0 ? seq : 0, caller);
  return block;
}

void free(void *block) {
  failalloc_forget(block);
  __libc_free(block);
}

static void failalloc_barrier(void) { __asm__ __volatile__("" ::: "memory"); }

/* Starts a tracked run on this thread failing allocation fail_at (-1: none). */
static void failalloc_begin(long fail_at, bool persistent, bool collect_sites) {
  failalloc_barrier();
  failalloc.allocations = 0;
  failalloc.failures = 0;
  failalloc.failed_caller = 0;
  failalloc.fail_at = fail_at;
  failalloc.persistent = persistent;
  failalloc.failing = false;
  failalloc.collect_sites = collect_sites;
  failalloc_armed_thread = true;
  failalloc.tracking = true;
  failalloc_barrier();
}

/* Stops failing; allocations are still counted and remembered. */
static void failalloc_stop_failing(void) {
  failalloc_barrier();
  failalloc.op_allocations = failalloc.allocations;
  failalloc.fail_at = -1;
  failalloc.failing = false;
  failalloc.collect_sites = false;
  failalloc_barrier();
}

/* Ends the run: the layer goes idle again. */
static void failalloc_end(void) {
  failalloc_barrier();
  failalloc.tracking = false;
  failalloc_armed_thread = false;
  failalloc_barrier();
}

/* Whether code at address a belongs to the same shared object as the function fn. */
static bool failalloc_same_object(uintptr_t a, const void *fn) {
  Dl_info at, of;
  return fn && dladdr((const void *)a, &at) && dladdr(fn, &of) && at.dli_fbase == of.dli_fbase;
}

/* Whether this run's first injected failure hit an allocation of the shared object holding
 * fn (for `after` hooks: a library that absorbs its own failures may change its results). */
static bool failalloc_failed_in(const void *fn) {
  failalloc_barrier();
  return failalloc.failures > 0 && failalloc_same_object(failalloc.failed_caller, fn);
}

/* Reports (up to show of them) and forgets every block still remembered; returns how
 * many there were, less those excused: blocks a library named by the case allocated
 * itself and leaked after its own allocation failed. */
static size_t failalloc_forget_all(const failalloc_case *c, const char *what, int show) {
  failalloc_barrier();
  const void *leaky = c ? c->leaky_library : NULL;
  bool own_failure =
      failalloc.failures > 0 && failalloc_same_object(failalloc.failed_caller, leaky);
  size_t leaked = 0, excused = 0;
  for (size_t i = 0; i < FAILALLOC_SLOTS && failalloc.live; i++) {
    failalloc_slot *slot = &failalloc.slots[i];
    if (!slot->block) continue;
    if (own_failure && failalloc_same_object(slot->caller, leaky)) {
      excused++;
    } else if (leaked++ < (size_t)show) {
      fprintf(stderr, "failalloc: %s: block of allocation %ld not freed\n", what, slot->seq);
    }
    *slot = (failalloc_slot){NULL, 0, 0};
    failalloc.live--;
  }
  if (excused && show)
    fprintf(stderr, "failalloc: %s: excused %zu blocks the library leaked itself\n", what,
            excused);
  return leaked;
}

/* The executable segments' span of the shared object at load address base. */
typedef struct {
  uintptr_t base, lo, hi;
} failalloc_span;

static int failalloc_span_of(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  failalloc_span *span = data;
  if (info->dlpi_addr != span->base) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (!span->lo || lo < span->lo) span->lo = lo;
    if (hi > span->hi) span->hi = hi;
  }
  return 1;
}

/* Spares the code of the shared object holding fn (none when NULL). */
static void failalloc_spare(const void *fn) {
  failalloc.spared_lo = failalloc.spared_hi = 0;
  Dl_info info;
  if (!fn || !dladdr(fn, &info)) return;
  failalloc_span span = {.base = (uintptr_t)info.dli_fbase};
  dl_iterate_phdr(failalloc_span_of, &span);
  failalloc.spared_lo = span.lo;
  failalloc.spared_hi = span.hi;
}

static long failalloc_env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? atol(v) : -1;
}

/* One tracked run failing allocation fail_at (-1: none): op, then after, then the checks
 * every run must pass. Returns op's result; *fired says whether a failure was injected. */
static int failalloc_run_once(const failalloc_case *c, long fail_at, bool persistent,
                              bool collect_sites, bool *fired) {
  char what[160];
  snprintf(what, sizeof what, "%s, failing allocation %ld%s", c->name, fail_at,
           persistent ? " and after" : "");
  if (failalloc_env("FAILALLOC_VERBOSE") > 0) fprintf(stderr, "failalloc: %s\n", what);
  if (c->before) c->before(c->ctx);
  nas_err err = {{0}};
  failalloc_begin(fail_at, persistent, collect_sites);
  int rc = c->op(c->ctx, &err);
  failalloc_stop_failing();
  *fired = failalloc.failures > 0;
  if (c->after) c->after(c->ctx, rc);
  failalloc_end();
  if (failalloc_env("FAILALLOC_VERBOSE") > 0) fprintf(stderr, "  -> %d %s\n", rc, err.msg);
  size_t leaked = failalloc_forget_all(c, what, 8);
  if (leaked) fail_msg("%s: %zu blocks leaked (rc %d: %s)", what, leaked, rc, err.msg);
  if (rc < 0 && !*fired) fail_msg("%s: failed with no failure injected: %s", what, err.msg);
  if (rc < 0 && !err.msg[0]) fail_msg("%s: returned %d without a message", what, rc);
  if (rc > 0) fail_msg("%s: returned %d", what, rc);
  return rc;
}

/* Runs c through every failure point in both modes (see the header comment). */
static void failalloc_run(const failalloc_case *c, failalloc_report *report) {
  failalloc_end(); /* a test that failed mid-run may have left the layer armed */
  failalloc_forget_all(NULL, "", 0);
  failalloc_spare(c->spared_library);
  const char *only = getenv("FAILALLOC_CASE");
  failalloc.trace_at = !only || strstr(c->name, only) ? failalloc_env("FAILALLOC_TRACE") : -1;
  /* Warm-up: first-use allocations of libraries (SQLite's initialisation, jansson's hash
   * seed, the unwinder backtrace loads) are made once per process and kept. */
  void *frames[4];
  backtrace(frames, 4);
  nas_err err = {{0}};
  if (c->before) c->before(c->ctx);
  int rc = c->op(c->ctx, &err);
  if (c->after) c->after(c->ctx, rc);
  if (rc != NAS_OK) fail_msg("%s: fails without injected failures: %s", c->name, err.msg);

  bool fired;
  failalloc.n_sites = 0;
  failalloc_run_once(c, -1, false, true, &fired);
  failalloc_report r = {.allocations = failalloc.op_allocations,
                        .sites = (long)failalloc.n_sites};
  long stride = c->max_runs > 0 && r.allocations > c->max_runs
                    ? (r.allocations + c->max_runs - 1) / c->max_runs
                    : 1;
  /* When sampling, the persistent mode takes the points halfway between the transient's. */
  for (int persistent = 0; persistent <= 1; persistent++) {
    for (long n = persistent ? stride / 2 : 0;; n += stride) {
      rc = failalloc_run_once(c, n, persistent, false, &fired);
      if (!fired) break;
      r.runs++;
      r.failed_runs += rc < 0;
    }
  }
  fprintf(stderr,
          "failalloc: %s: %ld allocations from %ld sites, failed at %s: "
          "%ld runs, %ld ended in an error\n",
          c->name, r.allocations, r.sites, stride == 1 ? "every point" : "sampled points", r.runs,
          r.failed_runs);
  if (report) *report = r;
}

/* Whether the layer is left out of this build (it is not). */
static bool failalloc_unavailable(void) { return false; }

#else /* !FAILALLOC_ENABLED */

static bool failalloc_unavailable(void) {
  fputs("failalloc: skipped: AddressSanitizer owns malloc, so failures cannot be injected; "
        "the plain build (make test) runs these tests\n", stderr);
  return true;
}

static bool failalloc_failed_in(const void *fn) {
  (void)fn;
  return false;
}

static void failalloc_run(const failalloc_case *c, failalloc_report *report) {
  (void)report;
  fprintf(stderr, "failalloc: %s skipped: AddressSanitizer owns malloc, so failures cannot be "
                  "injected; the plain build runs it\n", c->name);
  skip();
}

#endif
#endif
