/* builtin/datasets.c: datasets of built-in trials by name or path, as images (n, C, H, W),
 * and the two preparations every trial applies: keeping a subset, standardising.
 *
 * Named datasets are files Debian packages ship (nothing is downloaded): "digits" is
 * scikit-learn's digits.csv.gz, "fashion-mnist" the IDX files of dataset-fashion-mnist.
 * A path is a folder of IDX files (MNIST's names, gzip or not) or one CSV file. Only the
 * API of trainer/trainer.h is used. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "builtin/builtin.h"

static const char digits_file[] = "digits.csv.gz";
static const char fashion_folder[] = "fashion-mnist";

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_folder(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* dir/name or dir/name.gz, whichever exists; NULL when neither. Owned. */
static char *idx_file(const char *dir, const char *name) {
  char *path = nas_asprintf("%s/%s", dir, name);
  if (path && is_file(path)) return path;
  free(path);
  path = nas_asprintf("%s/%s.gz", dir, name);
  if (path && is_file(path)) return path;
  free(path);
  return NULL;
}

/* Images and labels named prefix-images-idx3-ubyte / prefix-labels-idx1-ubyte in dir;
 * NAS_ENOTFOUND when both files are missing, NAS_ERR when one is. */
static int load_idx_pair(tr_ctx *ctx, const char *dir, const char *prefix, tr_dataset *out,
                         nas_err *err) {
  char *images_name = nas_asprintf("%s-images-idx3-ubyte", prefix);
  char *labels_name = nas_asprintf("%s-labels-idx1-ubyte", prefix);
  char *images = images_name ? idx_file(dir, images_name) : NULL;
  char *labels = labels_name ? idx_file(dir, labels_name) : NULL;
  int rc = !images_name || !labels_name ? nas_errf(err, "out of memory")
           : images && labels           ? tr_idx_load(ctx, images, labels, out)
           : images || labels
               ? nas_errf(err, "%s: %s without %s (optionally .gz)", dir,
                          images ? images_name : labels_name, images ? labels_name : images_name)
               : nas_errc(err, NAS_ENOTFOUND, "%s: no %s and %s (optionally .gz) there", dir,
                          images_name, labels_name);
  if (rc == NAS_ERR && images && labels) nas_errf(err, "%s", ctx->err.msg);
  free(images_name), free(labels_name), free(images), free(labels);
  return rc;
}

/* The shape of a CSV example of k features: 1×√k×√k when k is a square, else k×1×1. */
static tr_input_shape csv_shape(int64_t k) {
  int64_t side = (int64_t)llround(sqrt((double)k));
  return side * side == k ? (tr_input_shape){1, side, side} : (tr_input_shape){k, 1, 1};
}

/* The shape of one example of ds as an image: IDX (n, H, W) is 1×H×W, (n, C, H, W) stays;
 * CSV (n, k) as csv_shape says. */
static tr_input_shape image_shape(const tr_dataset *ds) {
  const int64_t *dims = ds->x->shape;
  if (ds->x->ndim == 4) return (tr_input_shape){dims[1], dims[2], dims[3]};
  if (ds->x->ndim == 3) return (tr_input_shape){1, dims[1], dims[2]};
  return csv_shape(ds->x->ndim == 2 ? dims[1] : 1);
}

bool tr_input_is_image(tr_input_shape s) { return s.height > 1 || s.width > 1; }

/* Columns of the first non-blank line of the CSV file at path (gzip or not). */
static int csv_columns(const char *path, int64_t *columns, nas_err *err) {
  gzFile in = gzopen(path, "rb");
  if (!in) return nas_errf(err, "%s: cannot be read", path);
  int64_t commas = 0;
  bool seen = false;
  for (int c; (c = gzgetc(in)) != -1 && !(c == '\n' && seen);) {
    seen = seen || !isspace(c);
    commas += c == ',';
  }
  gzclose(in);
  *columns = commas + 1;
  return NAS_OK;
}

int tr_named_dataset_holds_images(const char *path, bool *images, nas_err *err) {
  *images = true;
  if (is_folder(path)) return NAS_OK; /* IDX files: images by their format */
  int64_t columns = 0;
  if (csv_columns(path, &columns, err) != NAS_OK) return NAS_ERR;
  *images = tr_input_is_image(csv_shape(columns - 1)); /* the label is a column */
  return NAS_OK;
}

static int reshape_to(tr_ctx *ctx, tr_dataset *ds, tr_input_shape s, nas_err *err) {
  if (!ds->x) return NAS_OK;
  int64_t shape[4] = {ds->n, s.channels, s.height, s.width};
  tr_tensor *images = tr_reshape(ctx, ds->x, 4, shape);
  if (!images) return nas_errf(err, "dataset: %s", ctx->err.msg);
  tr_release(ds->x);
  ds->x = images;
  return NAS_OK;
}

/* Both parts as images of the training part's shape, which the test part's must be (the
 * same pixel count in another geometry would be scrambled); the class count covers both. */
static int finish(tr_ctx *ctx, tr_named_dataset *nd, nas_err *err) {
  nd->shape = image_shape(&nd->train);
  if (nd->test.n > 0) {
    tr_input_shape train = nd->shape, test = image_shape(&nd->test);
    if (train.channels != test.channels || train.height != test.height ||
        train.width != test.width)
      return nas_errf(err, "%s: training examples are %lldx%lldx%lld, test examples %lldx%lldx%lld "
                      "(channels x height x width)", nd->source, (long long)train.channels,
                      (long long)train.height, (long long)train.width, (long long)test.channels,
                      (long long)test.height, (long long)test.width);
    int32_t classes = nd->train.nclasses > nd->test.nclasses ? nd->train.nclasses
                                                             : nd->test.nclasses;
    nd->train.nclasses = nd->test.nclasses = classes;
  }
  int rc = reshape_to(ctx, &nd->train, nd->shape, err);
  return rc ? rc : reshape_to(ctx, &nd->test, nd->shape, err);
}

static int load_folder(tr_ctx *ctx, const char *dir, tr_named_dataset *out, nas_err *err) {
  int rc = load_idx_pair(ctx, dir, "train", &out->train, err);
  if (rc != NAS_OK) return rc;
  nas_err absent; /* no test part at all is fine */
  rc = load_idx_pair(ctx, dir, "t10k", &out->test, &absent);
  if (rc != NAS_OK && rc != NAS_ENOTFOUND) return nas_errf(err, "%s", absent.msg);
  return NAS_OK;
}

/* A path found by tr_named_dataset_find: a folder of IDX files or a CSV file. */
static int load_path(tr_ctx *ctx, const char *path, tr_named_dataset *out, nas_err *err) {
  out->source = realpath(path, NULL);
  if (!out->source && !(out->source = strdup(path))) return nas_errf(err, "out of memory");
  if (is_folder(path)) return load_folder(ctx, path, out, err);
  if (tr_csv_load(ctx, path, -1, &out->train)) return nas_errf(err, "%s", ctx->err.msg);
  return NAS_OK;
}

/* The first of dirs holding name (a file or a folder); NULL when none. Owned. */
static char *search(const char *const *dirs, const char *name, bool folder) {
  for (; dirs && *dirs; dirs++) {
    char *path = nas_asprintf("%s/%s", *dirs, name);
    if (path && (folder ? is_folder(path) : is_file(path))) return path;
    free(path);
  }
  return NULL;
}

static int not_found(const char *name, const char *const *dirs, const char *hint, nas_err *err) {
  char tried[600] = "";
  size_t used = 0;
  for (; dirs && *dirs && used < sizeof tried; dirs++)
    used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", *dirs);
  return nas_errf(err, "dataset '%s' not found (looked in: %s); %s", name, used ? tried : "nowhere",
                  hint);
}

int tr_named_dataset_find(const char *name, const char *const *dirs, char **path, nas_err *err) {
  bool digits = strcmp(name, "digits") == 0, fashion = strcmp(name, fashion_folder) == 0;
  if (digits || fashion) {
    *path = search(dirs, digits ? digits_file : fashion_folder, fashion);
    if (*path) return NAS_OK;
    return not_found(name, dirs,
                     digits ? "it is tests/data/digits.csv.gz in nas's source tree, or "
                              "scikit-learn's sklearn/datasets/data/digits.csv.gz; set "
                              "NAS_DATA_DIR to its folder"
                            : "install it with 'apt-get install dataset-fashion-mnist'",
                     err);
  }
  if (!is_folder(name) && !is_file(name))
    return nas_errf(err, "dataset %s: no such file or folder", name);
  *path = strdup(name);
  return *path ? NAS_OK : nas_errf(err, "out of memory");
}

/* Whether every example of ds has the same label (ds->n > 0). */
static bool one_label(const tr_dataset *ds) {
  for (int64_t i = 1; i < ds->n; i++)
    if (ds->y[i] != ds->y[0]) return false;
  return true;
}

int tr_named_dataset_load(tr_ctx *ctx, const char *name, const char *const *dirs,
                          tr_named_dataset *out, nas_err *err) {
  memset(out, 0, sizeof *out);
  char *path = NULL;
  int rc = tr_named_dataset_find(name, dirs, &path, err);
  if (rc == NAS_OK) rc = load_path(ctx, path, out, err);
  free(path);
  if (rc == NAS_OK && out->train.n == 0) rc = nas_errf(err, "dataset %s holds no examples", name);
  /* every model would score 1: most likely the wrong column was taken for the label */
  if (rc == NAS_OK && one_label(&out->train))
    rc = nas_errf(err, "dataset %s: every training example has label %d: one class, nothing "
                  "to classify (a CSV file's label is its last column)", name, out->train.y[0]);
  if (rc == NAS_OK) rc = finish(ctx, out, err);
  if (rc != NAS_OK) tr_named_dataset_free(out);
  return rc;
}

void tr_named_dataset_free(tr_named_dataset *nd) {
  tr_dataset_free(&nd->train);
  tr_dataset_free(&nd->test);
  free(nd->source);
  memset(nd, 0, sizeof *nd);
}

/* ---------------------------------------------------------------- preparation */

int tr_dataset_truncate(tr_ctx *ctx, tr_dataset *ds, int64_t n, nas_err *err) {
  if (n <= 0 || n >= ds->n) return NAS_OK;
  if (!tr_is_contiguous(ds->x)) return nas_errf(err, "truncate: features must be contiguous");
  int64_t shape[TR_MAX_DIMS];
  memcpy(shape, ds->x->shape, sizeof shape);
  shape[0] = n;
  /* A copy, not a view, so the examples left out are freed. */
  tr_tensor *x = tr_from_data(ctx, TR_F32, ds->x->ndim, shape, tr_f32(ds->x));
  int32_t *y = malloc(sizeof *y * (size_t)n);
  if (!x || !y) {
    tr_release(x);
    free(y);
    return nas_errf(err, "truncate: out of memory");
  }
  memcpy(y, ds->y, sizeof *y * (size_t)n);
  tr_release(ds->x);
  free(ds->y);
  ds->x = x;
  ds->y = y;
  ds->n = n;
  return NAS_OK;
}

int tr_standardize(const tr_dataset *ref, tr_dataset *const *sets, size_t n,
                   tr_standardization *done, nas_err *err) {
  if (!ref->x || ref->x->numel == 0 || !tr_is_contiguous(ref->x))
    return nas_errf(err, "standardize: no contiguous reference data");
  const float *v = tr_f32(ref->x);
  double sum = 0, sum2 = 0, count = (double)ref->x->numel;
  for (int64_t i = 0; i < ref->x->numel; i++) sum += v[i];
  double mean = sum / count;
  for (int64_t i = 0; i < ref->x->numel; i++) sum2 += (v[i] - mean) * (v[i] - mean);
  double std = sqrt(sum2 / count);
  if (std <= 1e-12) std = 1; /* every value alike: shifted only */
  float shift = (float)mean, scale = (float)(1.0 / std);
  if (done) *done = (tr_standardization){mean, std};
  for (size_t s = 0; s < n; s++) {
    tr_tensor *x = sets[s]->x;
    if (!x) continue;
    if (!tr_is_contiguous(x)) return nas_errf(err, "standardize: features must be contiguous");
    float *d = tr_f32(x);
    for (int64_t i = 0; i < x->numel; i++) d[i] = (d[i] - shift) * scale;
    x->storage->version++; /* an in-place write, like every other */
  }
  return NAS_OK;
}
