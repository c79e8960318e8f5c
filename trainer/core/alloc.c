/* alloc: a caching allocator for tensor memory, with usage statistics.
 *
 * Training allocates and frees the same few large buffers every step (activations, their
 * gradients, im2col columns). From malloc they come back as fresh pages each time: the
 * kernel faults and zeroes them, which cost a CNN step a third of its time. The cache
 * keeps freed blocks by size and hands them out again. Sizes round up to whole 4 KiB pages
 * (small ones to a power of two), so shapes that differ a little share blocks.
 *
 * Invariants: every block is 64-byte aligned; in_use counts bytes handed out and not given
 * back, cached the bytes held in the free list (at most limit). The allocator is reference
 * counted: each storage made from it holds a reference, so it outlives its last tensor
 * whatever order the owner frees things in. A mutex guards it, so tensors may be freed on
 * another thread than the one that made them.
 *
 * The same cache serves a device's memory (tn_allocator_new_device): blocks then come from
 * the device table the backend hands in (CUDA: cudaMalloc and cudaFree); cudaMalloc
 * synchronises and costs far more than malloc, so the cache matters more there. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/core/internal.h"

typedef struct {
  void *ptr;
  size_t size;
} free_block;

struct tr_allocator {
  pthread_mutex_t lock;
  int refs;
  const tn_device_ops *dev; /* the backend of the device the blocks live on; NULL: host */
  int device;               /* which device of that backend */
  size_t limit;       /* most bytes kept cached */
  free_block *blocks; /* the cache (owned blocks) */
  size_t n, cap;
  size_t in_use, peak, cached; /* bytes */
};

tr_allocator *tr_allocator_new(size_t cache_limit) {
  tr_allocator *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  pthread_mutex_init(&a->lock, NULL);
  a->refs = 1;
  a->limit = cache_limit;
  return a;
}

tr_allocator *tn_allocator_new_device(const tn_device_ops *ops, int device, size_t cache_limit) {
  tr_allocator *a = tr_allocator_new(cache_limit);
  if (a) {
    a->dev = ops;
    a->device = device;
  }
  return a;
}

const tn_device_ops *tn_device_of(const tr_tensor *t) {
  const tr_allocator *a = t->storage->alloc;
  return a ? a->dev : NULL;
}

/* A fresh block from the host or the device; NULL when out of memory. */
static void *block_new(const tr_allocator *a, size_t size) {
  if (!a || !a->dev) return aligned_alloc(64, size);
  return a->dev->block_new(a->device, size);
}

static void block_free(const tr_allocator *a, void *ptr) {
  if (!a || !a->dev)
    free(ptr);
  else
    a->dev->block_free(a->device, ptr);
}

/* Frees every cached block (the lock held, or a dying allocator). */
static void cache_drop(tr_allocator *a) {
  for (size_t i = 0; i < a->n; i++) block_free(a, a->blocks[i].ptr);
  a->n = 0;
  a->cached = 0;
}

static void allocator_destroy(tr_allocator *a) {
  cache_drop(a);
  free(a->blocks);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

tr_allocator *tn_allocator_retain(tr_allocator *a) {
  pthread_mutex_lock(&a->lock);
  a->refs++;
  pthread_mutex_unlock(&a->lock);
  return a;
}

void tr_allocator_release(tr_allocator *a) {
  if (!a) return;
  pthread_mutex_lock(&a->lock);
  int left = --a->refs;
  pthread_mutex_unlock(&a->lock);
  if (left == 0) allocator_destroy(a);
}

size_t tn_alloc_size(size_t nbytes) {
  if (nbytes >= 4096) return (nbytes + 4095) / 4096 * 4096;
  size_t size = 64;
  while (size < nbytes) size *= 2;
  return size;
}

void *tn_alloc(tr_allocator *a, size_t size) {
  if (!a) return block_new(a, size);
  pthread_mutex_lock(&a->lock);
  void *ptr = NULL;
  for (size_t i = a->n; i-- > 0;) { /* newest first: likeliest still in cache */
    if (a->blocks[i].size != size) continue;
    ptr = a->blocks[i].ptr;
    a->blocks[i] = a->blocks[--a->n];
    a->cached -= size;
    break;
  }
  if (!ptr) ptr = block_new(a, size);
  if (!ptr && a->n > 0) { /* out of memory: give the cached blocks back, then try again */
    cache_drop(a);
    ptr = block_new(a, size);
  }
  if (ptr) {
    a->in_use += size;
    if (a->in_use > a->peak) a->peak = a->in_use;
  }
  pthread_mutex_unlock(&a->lock);
  return ptr;
}

void tn_dealloc(tr_allocator *a, void *ptr, size_t size) {
  if (!a || !ptr) {
    block_free(a, ptr);
    return;
  }
  pthread_mutex_lock(&a->lock);
  a->in_use -= size;
  bool keep = a->cached + size <= a->limit;
  if (keep && a->n == a->cap) {
    size_t ncap = a->cap ? a->cap * 2 : 64;
    free_block *grown = realloc(a->blocks, ncap * sizeof *grown);
    if (grown) {
      a->blocks = grown;
      a->cap = ncap;
    } else {
      keep = false;
    }
  }
  if (keep) {
    a->blocks[a->n++] = (free_block){ptr, size};
    a->cached += size;
  }
  pthread_mutex_unlock(&a->lock);
  if (!keep) block_free(a, ptr);
}

void tr_allocator_stats(tr_allocator *a, tr_alloc_stats *out) {
  pthread_mutex_lock(&a->lock);
  *out = (tr_alloc_stats){a->in_use, a->peak, a->cached};
  pthread_mutex_unlock(&a->lock);
}

void tr_allocator_trim(tr_allocator *a) {
  pthread_mutex_lock(&a->lock);
  cache_drop(a);
  pthread_mutex_unlock(&a->lock);
}
