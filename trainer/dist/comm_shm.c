/* comm_shm: the process backend of the collectives: ranks that are processes on one node,
 * meeting in a POSIX shared-memory segment, /dev/shm/nas-comm-NAME (docs/engine-comm.md,
 * "The process backend").
 *
 * The segment holds a header (a process-shared robust mutex and a condition variable that
 * make a generation-counting barrier, and the group's broken flag with its message), a
 * record per rank (pid, barriers reached), the call slots (2 x world, by round parity, as
 * in the thread backend) and the staging areas (2 parities x world x stage_bytes). Ranks'
 * buffers are private memory, so a collective runs in rounds of one piece each: every rank
 * copies its piece of input into its staging area and waits at the barrier, then reads
 * what it needs from everyone's areas. The first round also posts the call into the rank's
 * slot, and after its barrier every rank checks all slots, as the thread backend does.
 *
 * Invariants:
 * - Rank 0 builds the segment under a temporary name and renames it into place when it is
 *   complete, so a rank that opens the name sees a whole segment (or a stale one from a
 *   dead launch, whose creator's pid is gone: it waits for rank 0 to replace it). Once all
 *   ranks have joined, rank 0 unlinks the name; the mappings live on, so nothing is left in
 *   /dev/shm however the ranks end after that. A rank 0 killed before then leaves its
 *   segment: the next rank 0 of this user (any group) removes it.
 * - Slots and staging areas alternate by round parity: round k+2 reuses round k's only
 *   after every rank has passed round k+1's first barrier, so after all finished round k.
 * - In an all-reduce round rank r alone reads and writes chunk r of the staging areas and
 *   leaves its reduced chunk in rank 0's area; a second barrier comes before anyone reads
 *   the result. Each element is summed in rank order, as in every CPU backend.
 * - No wait is unbounded: a waiting rank looks every SHM_POLL_S at the ranks it waits for,
 *   and when one has exited, or timeout_s has passed, it marks the group broken with a
 *   message and wakes everyone; every rank then fails with that message, in this call and
 *   every later one.
 * - The header and the rank records are read and written under the segment's mutex. Slots
 *   and staging areas are written without it: the barrier's lock and unlock order a rank's
 *   writes before the reads the other ranks make after the barrier. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trainer/dist/comm_internal.h"

#define SHM_DIR "/dev/shm"
#define SHM_MAGIC 0x6e61732d636f6d6dull /* "nas-comm" */
#define SHM_POLL_S 0.1                  /* how often a waiting rank checks on the others */
#define SHM_LOOK_S 0.005                /* how often a joining rank looks for the segment */
#define SHM_STAGE_DEFAULT ((size_t)1 << 20)
#define SHM_STAGE_MAX ((size_t)1 << 30)
/* Each staging area holds at least a double per rank (stage_size), and stays within
 * SHM_STAGE_MAX, so the segment's size (2 x world areas) cannot wrap around. */
#define SHM_WORLD_MAX ((int)(SHM_STAGE_MAX / sizeof(double)))

/* One rank's record in the segment. */
typedef struct {
  int32_t pid;     /* 0 until the rank has joined */
  uint64_t pid_ns; /* inode of its /proc/self/ns/pid (0: unknown); pids are compared only
                      within one pid namespace */
  uint64_t passes; /* barriers the rank has arrived at */
} shm_rank;

typedef struct {
  uint64_t magic; /* SHM_MAGIC once the segment is complete */
  int32_t world;
  uint64_t stage_bytes;    /* per rank and parity; a multiple of 64 */
  pthread_mutex_t lock;    /* process-shared, robust */
  pthread_cond_t released; /* process-shared, CLOCK_MONOTONIC: the last arrival signals */
  int32_t arrived;         /* ranks waiting at the barrier now */
  uint64_t generation;     /* barriers completed */
  int32_t broken;          /* a rank exited or a wait timed out: every call fails */
  char why[800];           /* the message they fail with */
} shm_header;

/* Byte offsets of the segment's parts, and its size. */
typedef struct {
  size_t ranks, slots, stage, total;
} shm_layout;

/* This process's view of the segment. */
typedef struct {
  shm_header *head;     /* the mapping; NULL until mapped */
  size_t bytes;         /* its size */
  shm_rank *ranks;      /* world, in the mapping */
  comm_call *slots;     /* 2 * world, in the mapping: [parity * world + rank] */
  unsigned char *stage; /* 2 * world areas of stage_bytes, in the mapping */
  size_t stage_bytes;
  double timeout_s;
  uint64_t pid_ns;   /* this process's pid namespace */
  char *path;        /* owned: /dev/shm/nas-comm-NAME */
  bool named;        /* rank 0 while the name is still linked: it must unlink it */
  const void **srcs; /* owned, world: comm_reduce's sources */
  void **dsts;       /* owned, world: and its destination */
} shm_comm;

static int shm_run(tr_comm *comm, const comm_call *call, nas_err *err);
static void shm_free(tr_comm *comm);

static const comm_backend shm_backend = {TR_COMM_PROCESSES, shm_run, shm_free};

/* ---------------------------------------------------------------- layout */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static shm_layout layout_of(int world, size_t stage_bytes) {
  shm_layout l;
  l.ranks = align64(sizeof(shm_header));
  l.slots = l.ranks + align64((size_t)world * sizeof(shm_rank));
  l.stage = l.slots + align64(2 * (size_t)world * sizeof(comm_call));
  l.total = l.stage + 2 * (size_t)world * stage_bytes;
  return l;
}

/* The staging size for what the caller asked (0: the default): whole cache lines, and room
 * for at least one element of every chunk of a reduce-scatter. */
static size_t stage_size(size_t asked, int world) {
  size_t least = align64((size_t)world * sizeof(double));
  size_t bytes = asked ? align64(asked) : SHM_STAGE_DEFAULT;
  return bytes < least ? least : bytes;
}

/* Points sc's parts into the mapping at map. */
static void shm_map_parts(shm_comm *sc, void *map, size_t bytes, int world, size_t stage_bytes) {
  shm_layout l = layout_of(world, stage_bytes);
  sc->head = map;
  sc->bytes = bytes;
  sc->ranks = (shm_rank *)((char *)map + l.ranks);
  sc->slots = (comm_call *)((char *)map + l.slots);
  sc->stage = (unsigned char *)map + l.stage;
  sc->stage_bytes = stage_bytes;
}

static unsigned char *stage_of(const shm_comm *sc, int parity, int rank) {
  return sc->stage + ((size_t)parity * (size_t)sc->head->world + (size_t)rank) * sc->stage_bytes;
}

/* ---------------------------------------------------------------- liveness */

uint64_t comm_pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

bool comm_pid_exited(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return errno == ENOENT;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  /* "pid (command) S ...": the state follows the last ')' (the command may hold one) */
  const char *paren = strrchr(text, ')');
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* Whether rank q joined and has exited since, as far as this process can tell. */
static bool rank_exited(const shm_comm *sc, int q) {
  const shm_rank *r = &sc->ranks[q];
  return r->pid != 0 && sc->pid_ns != 0 && r->pid_ns == sc->pid_ns && comm_pid_exited(r->pid);
}

/* ---------------------------------------------------------------- barrier */

static struct timespec monotonic_ts(double seconds) {
  double whole = floor(seconds);
  return (struct timespec){.tv_sec = (time_t)whole, .tv_nsec = (long)((seconds - whole) * 1e9)};
}

/* Marks the group broken (the first message stays) and wakes every waiter. Lock held. */
static void shm_break(shm_header *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void shm_break(shm_header *h, const char *fmt, ...) {
  if (h->broken) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->why, sizeof h->why, fmt, ap);
  va_end(ap);
  h->broken = 1;
  pthread_cond_broadcast(&h->released);
}

/* What a lock or wait returned: a rank that died holding the mutex breaks the group (the
 * state it guarded may be half written). */
static void shm_locked(shm_header *h, int rc) {
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(&h->lock);
    shm_break(h, "a rank died while it held the group's lock");
  } else if (rc != 0 && rc != ETIMEDOUT) {
    shm_break(h, "waiting at the group's barrier: %s", strerror(rc));
  }
}

static int shm_lock(shm_comm *sc, nas_err *err) {
  int rc = pthread_mutex_lock(&sc->head->lock);
  if (rc != 0 && rc != EOWNERDEAD) return nas_errf(err, "comm group lock: %s", strerror(rc));
  shm_locked(sc->head, rc);
  return NAS_OK;
}

/* Called by rank, waiting in `during` until deadline: breaks the group when a rank it
 * waits for (one that has not reached this barrier) has exited, or the deadline passed.
 * Lock held. */
static void shm_check_waited(shm_comm *sc, int rank, const char *during, double deadline) {
  shm_header *h = sc->head;
  uint64_t mine = sc->ranks[rank].passes;
  char waited[400] = "";
  size_t used = 0;
  for (int q = 0; q < h->world; q++) {
    if (sc->ranks[q].passes >= mine) continue;
    int pid = sc->ranks[q].pid;
    if (rank_exited(sc, q)) {
      shm_break(h, "%s: rank %d (pid %d) exited while the others waited for it", during, q, pid);
      return;
    }
    if (used < sizeof waited) {
      int n = pid ? snprintf(waited + used, sizeof waited - used, "%srank %d (pid %d)",
                             used ? ", " : "", q, pid)
                  : snprintf(waited + used, sizeof waited - used, "%srank %d (not joined)",
                             used ? ", " : "", q);
      used += n > 0 ? (size_t)n : 0;
    }
  }
  if (nas_monotonic() >= deadline)
    shm_break(h, "%s: timed out after %g s waiting for %s", during, sc->timeout_s, waited);
}

/* Arrives at the group's barrier as rank and returns once all ranks have; fails with the
 * group's message when it is broken, or breaks while waiting. */
static int shm_barrier(shm_comm *sc, int rank, const char *during, nas_err *err) {
  if (shm_lock(sc, err) != NAS_OK) return NAS_ERR;
  shm_header *h = sc->head;
  if (!h->broken) {
    uint64_t generation = h->generation;
    sc->ranks[rank].passes++;
    if (++h->arrived == h->world) {
      h->arrived = 0;
      h->generation++;
      pthread_cond_broadcast(&h->released);
    }
    double deadline = nas_monotonic() + sc->timeout_s;
    while (!h->broken && generation == h->generation) {
      struct timespec until = monotonic_ts(fmin(nas_monotonic() + SHM_POLL_S, deadline));
      int rc = pthread_cond_timedwait(&h->released, &h->lock, &until);
      shm_locked(h, rc);
      if (rc == ETIMEDOUT && generation == h->generation)
        shm_check_waited(sc, rank, during, deadline);
    }
  }
  int result = h->broken ? nas_errf(err, "%s", h->why) : NAS_OK;
  pthread_mutex_unlock(&h->lock);
  return result;
}

/* ---------------------------------------------------------------- joining */

int comm_shm_init_sync(pthread_mutex_t *lock, pthread_cond_t *cond, nas_err *err) {
  pthread_mutexattr_t ma;
  pthread_condattr_t ca;
  bool ok = pthread_mutexattr_init(&ma) == 0;
  ok = ok && pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) == 0 &&
       pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) == 0 &&
       pthread_mutex_init(lock, &ma) == 0;
  pthread_mutexattr_destroy(&ma);
  ok = ok && pthread_condattr_init(&ca) == 0;
  ok = ok && pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED) == 0 &&
       pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
       pthread_cond_init(cond, &ca) == 0;
  pthread_condattr_destroy(&ca);
  return ok ? NAS_OK : nas_errf(err, "cannot make process-shared mutex and condition variable");
}

void *comm_shm_map_new(const char *tmp, size_t bytes, nas_err *err) {
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    nas_errf(err, "cannot create %s: %s", tmp, strerror(errno));
    return NULL;
  }
  /* reserve the pages now: a full tmpfs then fails here instead of a SIGBUS later */
  int rc = posix_fallocate(fd, 0, (off_t)bytes);
  void *map = rc == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (rc == 0 && map == MAP_FAILED) rc = errno;
  close(fd);
  if (rc != 0) {
    unlink(tmp);
    nas_errf(err, "cannot reserve %zu bytes of shared memory in %s: %s (a container's /dev/shm "
             "may be small)", bytes, SHM_DIR, strerror(rc));
    return NULL;
  }
  return map;
}

/* Whether entry of the folder dirfd is a complete segment of this user whose rank 0 has
 * exited in this pid namespace: left by a launch killed while its ranks gathered. Its
 * inode into *inode. */
static bool shm_orphaned(int dirfd, const char *entry, uint64_t pid_ns, ino_t *inode) {
  size_t ranks_at = layout_of(1, 0).ranks, need = ranks_at + sizeof(shm_rank);
  int fd = openat(dirfd, entry, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool candidate = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                   (size_t)st.st_size >= need;
  void *map = candidate ? mmap(NULL, need, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (map == MAP_FAILED) return false;
  *inode = st.st_ino;
  const shm_header *h = map;
  const shm_rank *r0 = (const shm_rank *)((const char *)map + ranks_at);
  bool orphaned = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == SHM_MAGIC && r0->pid > 0 &&
                  pid_ns != 0 && r0->pid_ns == pid_ns && comm_pid_exited(r0->pid);
  munmap(map, need);
  return orphaned;
}

/* Rank 0, before it makes its segment: unlinks this user's segments that killed launches
 * left in SHM_DIR. Their names are unique to those launches, so no rank 0 would ever
 * replace them, and a group whose rank 0 is gone can no longer form. */
static void shm_sweep(uint64_t pid_ns) {
  DIR *dir = pid_ns ? opendir(SHM_DIR) : NULL;
  if (!dir) return;
  for (struct dirent *e; (e = readdir(dir));) {
    ino_t inode;
    struct stat now;
    if (strncmp(e->d_name, "nas-comm-", 9) != 0 ||
        !shm_orphaned(dirfd(dir), e->d_name, pid_ns, &inode))
      continue;
    /* unless a relaunch under the same name has just renamed its own segment there */
    if (fstatat(dirfd(dir), e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == inode)
      unlinkat(dirfd(dir), e->d_name, 0);
  }
  closedir(dir);
}

/* Rank 0: builds the complete segment under a temporary name, then renames it into place
 * (replacing a stale one of a dead launch). */
static int shm_create(shm_comm *sc, int world, size_t stage_bytes, nas_err *err) {
  shm_sweep(sc->pid_ns);
  size_t bytes = layout_of(world, stage_bytes).total;
  char *tmp = nas_asprintf("%s.tmp-%ld", sc->path, (long)getpid());
  if (!tmp) return nas_errf(err, "out of memory");
  void *map = comm_shm_map_new(tmp, bytes, err);
  if (!map) {
    free(tmp);
    return NAS_ERR;
  }
  shm_map_parts(sc, map, bytes, world, stage_bytes);
  sc->head->world = world;
  sc->head->stage_bytes = stage_bytes;
  sc->ranks[0] = (shm_rank){.pid = getpid(), .pid_ns = sc->pid_ns};
  int rc = comm_shm_init_sync(&sc->head->lock, &sc->head->released, err);
  if (rc == NAS_OK) {
    __atomic_store_n(&sc->head->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    if (rename(tmp, sc->path) == 0) sc->named = true;
    else rc = nas_errf(err, "cannot rename %s to %s: %s", tmp, sc->path, strerror(errno));
  }
  if (rc != NAS_OK) unlink(tmp);
  free(tmp);
  return rc;
}

/* Whether the mapped segment is a complete one, with rank 0's record. */
static int shm_check_complete(const shm_comm *sc, const shm_header *h, size_t bytes,
                              nas_err *err) {
  if (bytes < layout_of(1, 0).ranks + sizeof(shm_rank) ||
      __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC)
    return nas_errf(err, "%s is not a nas comm segment", sc->path);
  return NAS_OK;
}

/* Whether the complete segment was made for world ranks. */
static int shm_check_segment(const shm_comm *sc, const shm_header *h, size_t bytes, int world,
                             nas_err *err) {
  if (h->world != world)
    return nas_errf(err, "rank 0 made the group for %d ranks, this rank was told %d", h->world,
                    world);
  if (h->stage_bytes % 64 != 0 || h->stage_bytes > SHM_STAGE_MAX ||
      layout_of(world, h->stage_bytes).total != bytes)
    return nas_errf(err, "%s has a size that does not fit its header", sc->path);
  return NAS_OK;
}

/* Records rank in the segment; an error when another process has taken its place. */
static int shm_register(shm_comm *sc, int rank, nas_err *err) {
  if (shm_lock(sc, err) != NAS_OK) return NAS_ERR;
  int taken = sc->ranks[rank].pid, rc = NAS_OK;
  if (taken)
    rc = nas_errf(err, "rank %d has joined already (pid %d): two launches share the group name",
                  rank, taken);
  else
    sc->ranks[rank] = (shm_rank){.pid = getpid(), .pid_ns = sc->pid_ns};
  pthread_mutex_unlock(&sc->head->lock);
  return rc;
}

/* One look for rank 0's segment: NAS_OK when mapped and registered, NAS_ENOTFOUND when it
 * is not there yet or is a stale one whose creator has exited. */
static int shm_try_attach(shm_comm *sc, int rank, int world, nas_err *err) {
  int fd = open(sc->path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? NAS_ENOTFOUND
                           : nas_errf(err, "cannot open %s: %s", sc->path, strerror(errno));
  struct stat st;
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0)
    map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return nas_errf(err, "cannot map %s: %s", sc->path, strerror(errno));
  size_t bytes = (size_t)st.st_size;
  shm_header *h = map;
  if (shm_check_complete(sc, h, bytes, err) != NAS_OK) {
    munmap(map, bytes);
    return NAS_ERR;
  }
  shm_map_parts(sc, map, bytes, world, h->stage_bytes);
  /* left by a launch that died, of whatever world size: rank 0 will replace it */
  if (rank_exited(sc, 0)) {
    munmap(map, bytes);
    sc->head = NULL;
    return NAS_ENOTFOUND;
  }
  if (shm_check_segment(sc, h, bytes, world, err) != NAS_OK ||
      shm_register(sc, rank, err) != NAS_OK) {
    munmap(map, bytes);
    sc->head = NULL;
    return NAS_ERR;
  }
  return NAS_OK;
}

/* Ranks but 0: waits for rank 0's segment and joins it. */
static int shm_attach(shm_comm *sc, int rank, int world, nas_err *err) {
  double deadline = nas_monotonic() + sc->timeout_s;
  for (;;) {
    int rc = shm_try_attach(sc, rank, world, err);
    if (rc != NAS_ENOTFOUND) return rc;
    if (nas_monotonic() >= deadline)
      return nas_errf(err, "timed out after %g s waiting for rank 0 to create %s", sc->timeout_s,
                      sc->path);
    nas_sleep(SHM_LOOK_S);
  }
}

static void shm_release(shm_comm *sc) {
  if (sc->head) munmap(sc->head, sc->bytes);
  if (sc->named) unlink(sc->path);
  free(sc->path);
  free(sc->srcs);
  free(sc->dsts);
  free(sc);
}

int comm_shm_join(const tr_comm_options *opts, tr_comm **out, nas_err *err) {
  int rank = opts->rank, world = opts->world;
  if (opts->stage_bytes > SHM_STAGE_MAX)
    return nas_errf(err, "stage_bytes %zu is over the limit of %zu", opts->stage_bytes,
                    SHM_STAGE_MAX);
  if (world > SHM_WORLD_MAX)
    return nas_errf(err, "%d ranks: processes meet in shared memory of at most %d ranks", world,
                    SHM_WORLD_MAX);
  shm_comm *sc = calloc(1, sizeof *sc);
  tr_comm *comm = calloc(1, sizeof *comm);
  if (sc) {
    sc->path = nas_asprintf("%s/nas-comm-%s", SHM_DIR, opts->name);
    sc->srcs = calloc((size_t)world, sizeof *sc->srcs);
    sc->dsts = calloc((size_t)world, sizeof *sc->dsts);
  }
  if (!sc || !comm || !sc->path || !sc->srcs || !sc->dsts) {
    if (sc) shm_release(sc);
    free(comm);
    return nas_errf(err, "out of memory");
  }
  sc->timeout_s = opts->timeout_s;
  sc->pid_ns = comm_pid_namespace();
  int rc = rank == 0 ? shm_create(sc, world, stage_size(opts->stage_bytes, world), err)
                     : shm_attach(sc, rank, world, err);
  if (rc == NAS_OK) rc = shm_barrier(sc, rank, "joining", err);
  if (sc->named) { /* everyone has mapped it, or the group failed: the name goes either way */
    unlink(sc->path);
    sc->named = false;
  }
  if (rc != NAS_OK) {
    shm_release(sc);
    free(comm);
    return NAS_ERR;
  }
  *comm = (tr_comm){.backend = &shm_backend, .rank = rank, .world = world, .impl = sc};
  *out = comm;
  return NAS_OK;
}

static void shm_free(tr_comm *comm) {
  shm_release(comm->impl);
  free(comm);
}

/* ---------------------------------------------------------------- collectives */

static const char *at(const void *p, int64_t i, size_t size) {
  return (const char *)p + (size_t)i * size;
}

/* Copies this rank's piece [from, from + n) of call's input into its staging area mine
 * (reduce-scatter: that piece of each of the world chunks, one after the other). */
static void shm_stage_in(const comm_call *call, int world, int rank, unsigned char *mine,
                         int64_t from, int64_t n) {
  size_t size = tr_dtype_size(call->dtype), bytes = (size_t)n * size;
  switch (call->kind) {
  case COMM_ALL_REDUCE:
  case COMM_ALL_GATHER:
    memcpy(mine, at(call->send, from, size), bytes);
    break;
  case COMM_REDUCE_SCATTER:
    for (int c = 0; c < world; c++)
      memcpy(mine + (size_t)c * bytes, at(call->send, c * call->count + from, size), bytes);
    break;
  case COMM_BROADCAST:
    if (rank == call->root) memcpy(mine, at(call->send, from, size), bytes);
    break;
  case COMM_BARRIER:
    break;
  }
}

/* This rank's share of piece [from, from + n) of a checked call staged in the areas of
 * parity. */
static int shm_move(tr_comm *comm, const comm_call *call, int parity, int64_t from, int64_t n,
                    nas_err *err) {
  shm_comm *sc = comm->impl;
  int world = comm->world, rank = comm->rank;
  size_t size = tr_dtype_size(call->dtype), bytes = (size_t)n * size;
  char *recv = (char *)call->recv;
  int64_t lo, hi;
  switch (call->kind) {
  case COMM_ALL_REDUCE: /* chunk rank of every area, into rank 0's area; then read it all */
    comm_chunk_bounds(n, world, rank, &lo, &hi);
    for (int q = 0; q < world; q++) sc->srcs[q] = stage_of(sc, parity, q) + (size_t)lo * size;
    sc->dsts[0] = stage_of(sc, parity, 0) + (size_t)lo * size;
    comm_reduce(call->dtype, call->op, world, sc->srcs, sc->dsts, 1, hi - lo);
    if (shm_barrier(sc, rank, "all_reduce", err) != NAS_OK) return NAS_ERR;
    memcpy(recv + (size_t)from * size, stage_of(sc, parity, 0), bytes);
    break;
  case COMM_REDUCE_SCATTER: /* the piece of chunk rank in every area, into recv */
    for (int q = 0; q < world; q++) sc->srcs[q] = stage_of(sc, parity, q) + (size_t)rank * bytes;
    sc->dsts[0] = recv + (size_t)from * size;
    comm_reduce(call->dtype, call->op, world, sc->srcs, sc->dsts, 1, n);
    break;
  case COMM_ALL_GATHER:
    for (int q = 0; q < world; q++)
      memcpy(recv + (size_t)(q * call->count + from) * size, stage_of(sc, parity, q), bytes);
    break;
  case COMM_BROADCAST:
    if (rank != call->root)
      memcpy(recv + (size_t)from * size, stage_of(sc, parity, call->root), bytes);
    break;
  case COMM_BARRIER:
    break;
  }
  return NAS_OK;
}

/* Rounds of one piece each (at least one: the first posts and checks the call). A rank
 * whose own arguments are bad stages nothing; the check then fails on every rank. */
static int shm_run(tr_comm *comm, const comm_call *call, nas_err *err) {
  shm_comm *sc = comm->impl;
  int world = comm->world, rank = comm->rank;
  bool valid = comm_check_args(call, world, rank, NULL) == NAS_OK;
  int64_t length = 0, piece = 1;
  if (valid && call->kind != COMM_BARRIER) {
    length = call->count;
    piece = (int64_t)(sc->stage_bytes / tr_dtype_size(call->dtype));
    if (call->kind == COMM_REDUCE_SCATTER) piece /= world;
  }
  const char *name = comm_kind_name(call->kind);
  int64_t from = 0;
  do {
    int64_t n = length - from < piece ? length - from : piece;
    int parity = (int)(comm->round++ & 1);
    if (valid) shm_stage_in(call, world, rank, stage_of(sc, parity, rank), from, n);
    if (from == 0) sc->slots[parity * world + rank] = *call;
    if (shm_barrier(sc, rank, name, err) != NAS_OK) return NAS_ERR;
    if (from == 0 && comm_check_calls(sc->slots + parity * world, world, err) != NAS_OK)
      return NAS_ERR;
    if (shm_move(comm, call, parity, from, n, err) != NAS_OK) return NAS_ERR;
    from += n;
  } while (from < length);
  return NAS_OK;
}
