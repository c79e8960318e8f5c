/* trainer/nn/data_cache.h: prepared datasets kept in cache files that every process maps
 * read-only (trainer/nn/data_cache.c; docs/spec.md, "Dataset cache").
 *
 * A cache file holds up to TR_CACHE_MAX_PARTS datasets (float32 features of any shape of up
 * to 4 dims, int32 labels) and a few numbers, exactly as a builder made them. It is named
 * by its request's name, source path and key, and records the source's identity (stat of
 * the file, or of every file in the folder), so a changed source makes it stale. Opening
 * maps a current, intact file; otherwise it builds one under a lock (one builder at a time
 * per file; the others wait and then map its result), writes it to a temporary file and
 * renames it into place, so no reader ever sees a partial file. A part of the data layer
 * kept in its own header because it is about files, not tensors. */
#ifndef NAS_TRAINER_DATA_CACHE_H
#define NAS_TRAINER_DATA_CACHE_H

#include "trainer/trainer.h"

#define TR_CACHE_MAX_PARTS 4
#define TR_CACHE_MAX_META 4

/* What a cache file holds. */
typedef struct {
  tr_dataset parts[TR_CACHE_MAX_PARTS];
  size_t nparts;
  double meta[TR_CACHE_MAX_META]; /* numbers the builder keeps beside the data */
} tr_cache_content;

/* Makes the content when there is no current file: fills out (its parts owned by the cache
 * code from then on, which frees them once written). Parts' features must be contiguous
 * float32 on the CPU, or NULL for an empty part (n 0), which comes back all zero. NAS_OK,
 * or an error with err set. */
typedef int (*tr_cache_build_fn)(tr_ctx *ctx, void *arg, tr_cache_content *out, nas_err *err);

typedef struct {
  const char *dir;    /* the cache folder; made when missing */
  const char *name;   /* readable start of the file's name (letters, digits, '-', '_', '.') */
  const char *source; /* the file or folder the content is made from */
  const char *key;    /* everything else the content depends on (the preparation's inputs) */
  tr_cache_build_fn build;
  void *arg;
} tr_cache_request;

typedef struct tr_data_cache tr_data_cache;

/* Maps req's content, building it first when its file is missing, stale or damaged (a
 * truncated file is detected by its recorded size; the header is checksummed, and so is
 * the data, which is read and checked once per file and again after any write into it;
 * data_cache.c says how). out's parts
 * are new datasets: features are read-only tensors on the mapping (never write to them),
 * labels owned copies. Free them (tr_dataset_free) before tr_data_cache_close. *built says
 * whether this call ran the builder (may be NULL). On error *cache is NULL and out empty;
 * the builder's error comes back as it gave it, others name the cache file. */
int tr_data_cache_open(tr_ctx *ctx, const tr_cache_request *req, tr_data_cache **cache,
                       tr_cache_content *out, bool *built, nas_err *err);
/* Unmaps. A mapping still used by a tensor is left mapped (a leak, never a dangling
 * pointer). NULL is fine. */
void tr_data_cache_close(tr_data_cache *c);

/* The cache folder: $NAS_CACHE_DIR, else $XDG_CACHE_HOME/nas, else $HOME/.cache/nas. Owned;
 * NULL with err set when none can be named. */
char *tr_data_cache_dir(nas_err *err);
/* The file req's content lives in. Owned; NULL when out of memory or req->source does not
 * exist. */
char *tr_data_cache_path(const tr_cache_request *req);

#endif
