/* builtin/worker_data.c: a built-in trial's data through the dataset cache — the dataset split,
 * subsets kept and standardised once per machine (worker_data_read), then mapped read-only
 * by every trial that prepares it the same way (trainer/nn/data_cache.h).
 *
 * The cache file is keyed by the dataset's path and every input of the preparation (the
 * validation share, the split seed, the subsets), so trials that differ only in the model or
 * the recipe share one file; its parts are train, validation and test, and it keeps the
 * background value beside them. A cache that cannot be used (no folder can be made, a disk
 * full) is no reason to fail a trial: the data is then read directly and origin says why. */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builtin/builtin.h"

enum { PART_TRAIN, PART_VAL, PART_TEST, N_PARTS };
enum { META_BACKGROUND, META_MEAN, META_STD };

/* The builder's state: what to read, and whether reading it (not the cache) failed. */
typedef struct {
  const char *path;
  const worker_plan *plan;
  uint64_t split_seed;
  bool read_failed;
} cache_build;

static int build(tr_ctx *ctx, void *arg, tr_cache_content *out, nas_err *err) {
  cache_build *b = arg;
  worker_data d;
  if (worker_data_read(ctx, b->path, b->plan, b->split_seed, &d, err) != NAS_OK) {
    b->read_failed = true;
    return NAS_ERR;
  }
  out->parts[PART_TRAIN] = d.all.train;
  out->parts[PART_VAL] = d.val;
  out->parts[PART_TEST] = d.all.test;
  out->nparts = N_PARTS;
  out->meta[META_BACKGROUND] = d.background;
  out->meta[META_MEAN] = d.standardization.mean;
  out->meta[META_STD] = d.standardization.std;
  free(d.all.source); /* the parts now belong to out */
  return NAS_OK;
}

/* Everything the prepared data depends on besides the source's files. "v2" names the way
 * worker_data_read prepares and what it accepts; change it when that changes (v1 files
 * may hold infinities from CSV values past float32, which v2 refuses). */
static char *preparation_key(const worker_plan *plan, uint64_t split_seed) {
  return nas_asprintf("nas worker data v2: validation %.17g, split seed %llu, limit_train %lld, "
                      "limit_val %lld, one mean and std of the training part",
                      plan->validation, (unsigned long long)split_seed,
                      (long long)plan->limit_train, (long long)plan->limit_val);
}

/* The source's last path component with anything but [A-Za-z0-9._-] made '_'. Owned. */
static char *file_stem(const char *path) {
  char *copy = strdup(path), *stem = copy ? strdup(basename(copy)) : NULL;
  free(copy);
  for (char *p = stem; p && *p; p++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", *p)) *p = '_';
  return stem;
}

/* out's datasets from the mapped content (taken over from it). */
static int adopt(const char *path, tr_cache_content *content, worker_data *out, nas_err *err) {
  out->all.train = content->parts[PART_TRAIN];
  out->val = content->parts[PART_VAL];
  out->all.test = content->parts[PART_TEST];
  out->background = (float)content->meta[META_BACKGROUND];
  out->standardization = (tr_standardization){content->meta[META_MEAN], content->meta[META_STD]};
  const int64_t *dims = out->all.train.x->shape;
  out->all.shape = (tr_input_shape){dims[1], dims[2], dims[3]};
  out->all.source = realpath(path, NULL);
  if (out->all.train.x->ndim != 4 || !out->all.source)
    return nas_errf(err, "dataset cache: %s", out->all.source ? "not images" : "out of memory");
  return NAS_OK;
}

int worker_data_cached(tr_ctx *ctx, const char *path, const worker_plan *plan,
                       uint64_t split_seed, worker_data *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  cache_build state = {path, plan, split_seed, false};
  char *dir = tr_data_cache_dir(err), *key = preparation_key(plan, split_seed);
  char *stem = file_stem(path);
  tr_cache_request req = {dir, stem, path, key, build, &state};
  tr_cache_content content;
  bool built = false;
  int rc = dir && key && stem ? tr_data_cache_open(ctx, &req, &out->cache, &content, &built, err)
                              : (dir ? nas_errf(err, "out of memory") : NAS_ERR);
  char *file = rc == NAS_OK ? tr_data_cache_path(&req) : NULL;
  if (rc == NAS_OK) rc = adopt(path, &content, out, err);
  if (rc == NAS_OK)
    snprintf(out->origin, sizeof out->origin, "mapped from the cache %s%s", file ? file : dir,
             built ? " (built now)" : "");
  free(dir), free(key), free(stem), free(file);
  if (rc == NAS_OK || state.read_failed) {
    if (rc != NAS_OK) worker_data_free(out);
    return rc;
  }
  worker_data_free(out);
  nas_err why = *err;
  rc = worker_data_read(ctx, path, plan, split_seed, out, err);
  if (rc == NAS_OK) snprintf(out->origin, sizeof out->origin, "read directly: %.350s", why.msg);
  return rc;
}
