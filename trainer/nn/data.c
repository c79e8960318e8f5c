/* data: datasets from IDX (MNIST format) and CSV files, gzip-compressed or plain (zlib reads
 * both), train/validation split, per-feature normalisation, and seeded shuffled batches.
 *
 * A dataset is float32 features (n, ...) and int32 labels. Everything here is deterministic
 * given its seed: the split and every epoch's order come from xoshiro256** states seeded by
 * the caller, never from ctx's generator, so data order does not shift when a model change
 * draws a different number of random values. */
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "trainer/core/internal.h"

void tr_dataset_free(tr_dataset *ds) {
  tr_release(ds->x);
  free(ds->y);
  memset(ds, 0, sizeof *ds);
}

/* Reads a whole (possibly gzip-compressed) file into an owned NUL-terminated buffer. */
static int read_gz(const char *path, unsigned char **out, size_t *len, nas_err *err) {
  gzFile f = gzopen(path, "rb");
  if (!f) return nas_errf(err, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
  size_t cap = 1 << 20, n = 0, most = 1 << 30; /* zlib refuses reads that overflow an int */
  unsigned char *buf = malloc(cap + 1);
  int got = 0;
  while (buf && (got = gzread(f, buf + n, (unsigned)(cap - n < most ? cap - n : most))) > 0) {
    n += (size_t)got;
    if (n == cap) {
      unsigned char *grown = realloc(buf, cap * 2 + 1);
      if (!grown) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = grown;
      cap *= 2;
    }
  }
  int errnum = 0;
  const char *msg = gzerror(f, &errnum);
  /* a gzip stream cut short ends the reads without failing one: zlib says Z_BUF_ERROR */
  if (got >= 0 && errnum != Z_BUF_ERROR) msg = NULL;
  int rc = !buf  ? nas_errf(err, "%s: out of memory", path)
           : msg ? nas_errf(err, "%s: read failed: %s", path, msg)
                 : NAS_OK;
  gzclose(f);
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return NAS_OK;
}

/* ---------------------------------------------------------------- IDX */

/* An IDX file: 0, 0, type (0x08 unsigned byte), ndims, then ndims big-endian u32 sizes. */
typedef struct {
  unsigned char *raw; /* owned */
  int ndims;
  int64_t dims[4];
  const unsigned char *data;
  int64_t count; /* product of dims */
} idx_file;

static int idx_read(const char *path, idx_file *f, nas_err *err) {
  size_t len;
  memset(f, 0, sizeof *f);
  if (read_gz(path, &f->raw, &len, err)) return NAS_ERR;
  const unsigned char *p = f->raw;
  if (len < 4 || p[0] != 0 || p[1] != 0)
    return nas_errf(err, "%s: not an IDX file (bad magic)", path);
  if (p[2] != 0x08)
    return nas_errf(err, "%s: IDX element type 0x%02x (only unsigned bytes, 0x08)", path, p[2]);
  f->ndims = p[3];
  if (f->ndims < 1 || f->ndims > 4 || len < 4 + 4 * (size_t)f->ndims)
    return nas_errf(err, "%s: IDX header with %d dims", path, f->ndims);
  f->count = 1;
  for (int d = 0; d < f->ndims; d++) {
    const unsigned char *q = p + 4 + 4 * d;
    f->dims[d] = (int64_t)q[0] << 24 | q[1] << 16 | q[2] << 8 | q[3];
    if (d > 0 && f->dims[d] == 0) /* examples of no values */
      return nas_errf(err, "%s: IDX dimension %d has size 0", path, d);
    /* never more values than the file has bytes, so the product cannot overflow */
    if (f->dims[d] > 0 && f->count > (int64_t)len / f->dims[d])
      return nas_errf(err, "%s: IDX data truncated (its dims hold more values than its %zu bytes)",
                      path, len);
    f->count *= f->dims[d];
  }
  f->data = p + 4 + 4 * f->ndims;
  size_t data_len = len - (size_t)(f->data - p);
  if ((size_t)f->count > data_len)
    return nas_errf(err, "%s: IDX data truncated (%lld values expected)", path,
                    (long long)f->count);
  if ((size_t)f->count < data_len) /* dims that do not describe the data */
    return nas_errf(err, "%s: IDX data holds %zu byte%s past the %lld values its dims give", path,
                    data_len - (size_t)f->count, data_len - (size_t)f->count == 1 ? "" : "s",
                    (long long)f->count);
  return NAS_OK;
}

static int idx_to_dataset(tr_ctx *ctx, const idx_file *img, const idx_file *lab, tr_dataset *out,
                          const char *path, nas_err *err) {
  if (lab->ndims != 1 || lab->dims[0] != img->dims[0])
    return nas_errf(err, "%s: %lld labels for %lld images", path, (long long)lab->dims[0],
                    (long long)img->dims[0]);
  tr_tensor *x = tr_empty(ctx, TR_F32, img->ndims, img->dims);
  int32_t *y = malloc(sizeof(int32_t) * (size_t)(lab->count ? lab->count : 1));
  if (!x || !y) {
    tr_release(x);
    free(y);
    return nas_errf(err, "%s: out of memory", path);
  }
  float *px = tr_f32(x);
  for (int64_t i = 0; i < img->count; i++) px[i] = (float)img->data[i];
  int32_t top = -1;
  for (int64_t i = 0; i < lab->count; i++) {
    y[i] = lab->data[i];
    if (y[i] > top) top = y[i];
  }
  *out = (tr_dataset){x, y, img->dims[0], top + 1};
  return NAS_OK;
}

int tr_idx_load(tr_ctx *ctx, const char *images_path, const char *labels_path, tr_dataset *out) {
  nas_err *err = &ctx->err;
  idx_file img, lab = {0};
  int rc = idx_read(images_path, &img, err);
  if (rc == NAS_OK) rc = idx_read(labels_path, &lab, err);
  if (rc == NAS_OK) rc = idx_to_dataset(ctx, &img, &lab, out, labels_path, err);
  free(img.raw);
  free(lab.raw);
  return rc;
}

/* ---------------------------------------------------------------- CSV */

/* What parse_line says of a line that is not one of finite numbers. */
enum { CSV_NOT_NUMBERS = -1, CSV_NOT_FINITE = -2 };

/* Parses one line of comma-separated numbers into vals (up to cap; cap 0 and vals NULL
 * count only); returns the count, CSV_NOT_NUMBERS when a field is no number (as in a
 * header), or CSV_NOT_FINITE when one is NaN or infinite (strtod takes "nan" and "inf",
 * and gives inf for too large a value; too small a one is 0 or subnormal, a number all the
 * same) or past float32's range (stored as float32, it would be an infinity). */
static int64_t parse_line(char *line, double *vals, int64_t cap) {
  int64_t n = 0;
  bool finite = true;
  char *p = line;
  while (1) {
    char *end;
    double v = strtod(p, &end);
    if (end == p) return CSV_NOT_NUMBERS;
    finite = finite && isfinite(v) && fabs(v) <= FLT_MAX;
    while (*end == ' ' || *end == '\t' || *end == '\r') end++;
    if (n < cap) vals[n] = v;
    n++;
    if (*end == '\0') return finite ? n : CSV_NOT_FINITE;
    if (*end != ',') return CSV_NOT_NUMBERS;
    p = end + 1;
  }
}

/* A non-blank line of a CSV file and its number in the file (from 1), for errors. */
typedef struct {
  char *text;
  int64_t number;
} csv_line;

/* Splits buf into lines in place; returns the number of non-blank lines in *lines (owned). */
static int64_t split_lines(char *buf, csv_line **lines) {
  int64_t n = 0, cap = 1024, number = 0;
  csv_line *ls = malloc(sizeof *ls * (size_t)cap);
  for (char *line = buf, *next; ls && line; line = next) {
    number++;
    if ((next = strchr(line, '\n'))) *next++ = '\0';
    while (isspace((unsigned char)*line)) line++;
    if (*line == '\0') continue;
    if (n == cap) {
      csv_line *grown = realloc(ls, sizeof *ls * (size_t)(cap *= 2));
      if (!grown) {
        free(ls);
        return -1;
      }
      ls = grown;
    }
    ls[n++] = (csv_line){line, number};
  }
  *lines = ls;
  return ls ? n : -1;
}

/* The largest label a CSV file may give: a model has one output per class up to the
 * largest label, so a stray 1e9 would ask for an output layer of a billion. */
enum { CSV_MAX_LABEL = 65535 };

/* Fills row r of out from the parsed values (label at column lc). */
static int store_row(const double *vals, int64_t ncols, int64_t lc, float *xrow, int32_t *label) {
  double lv = vals[lc];
  if (!(lv >= 0 && lv <= CSV_MAX_LABEL) || lv != floor(lv)) return NAS_ERR;
  *label = (int32_t)lv;
  for (int64_t c = 0, k = 0; c < ncols; c++)
    if (c != lc) xrow[k++] = (float)vals[c];
  return NAS_OK;
}

/* Parses the rows into out; vals has room for ncols values (the first data line's). */
static int csv_fill(tr_ctx *ctx, const char *path, const csv_line *lines, int64_t n,
                    int64_t ncols, int64_t lc, double *vals, tr_dataset *out, nas_err *err) {
  tr_tensor *x = tr_empty(ctx, TR_F32, 2, (int64_t[]){n, ncols - 1});
  int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
  if (!x || !y) {
    tr_release(x);
    free(y);
    return nas_errf(err, "%s: out of memory", path);
  }
  int32_t top = -1;
  for (int64_t r = 0; r < n; r++) {
    int64_t got = parse_line(lines[r].text, vals, ncols);
    if (got != ncols || store_row(vals, ncols, lc, tr_f32(x) + r * (ncols - 1), &y[r])) {
      tr_release(x);
      free(y);
      return nas_errf(err, "%s:%lld: expected %lld finite numbers (within float32's +-3.4e38), "
                      "the label an integer 0 to %d", path, (long long)lines[r].number,
                      (long long)ncols, CSV_MAX_LABEL);
    }
    if (y[r] > top) top = y[r];
  }
  *out = (tr_dataset){x, y, n, top + 1};
  return NAS_OK;
}

/* Columns are counted on the first data line (parse_line counts past a cap of 0), so a
 * row may be as wide as the file allows: 64x64 images are 4 097 columns. */
static int csv_rows(tr_ctx *ctx, const char *path, const csv_line *lines, int64_t nlines,
                    int label_col, tr_dataset *out, nas_err *err) {
  int64_t first = 0, ncols = parse_line(lines[0].text, NULL, 0);
  if (ncols == CSV_NOT_NUMBERS) { /* a header */
    if (nlines < 2) return nas_errf(err, "%s: a header and no data", path);
    first = 1;
    ncols = parse_line(lines[1].text, NULL, 0);
  }
  if (ncols < 0)
    return nas_errf(err, "%s:%lld: not a line of finite numbers (within float32's +-3.4e38)", path,
                    (long long)lines[first].number);
  if (ncols < 2) return nas_errf(err, "%s: 1 column (a label and at least 1 feature)", path);
  int64_t lc = label_col < 0 ? ncols + label_col : label_col;
  if (lc < 0 || lc >= ncols)
    return nas_errf(err, "%s: label column %d of %lld", path, label_col, (long long)ncols);
  double *vals = malloc(sizeof *vals * (size_t)ncols);
  int rc = vals ? csv_fill(ctx, path, lines + first, nlines - first, ncols, lc, vals, out, err)
                : nas_errf(err, "%s: out of memory", path);
  free(vals);
  return rc;
}

int tr_csv_load(tr_ctx *ctx, const char *path, int label_col, tr_dataset *out) {
  nas_err *err = &ctx->err;
  unsigned char *buf;
  size_t len;
  if (read_gz(path, &buf, &len, err)) return NAS_ERR;
  const unsigned char *nul = memchr(buf, '\0', len); /* the lines would end there, unseen */
  if (nul) {
    nas_errf(err, "%s: a NUL byte at offset %zu: binary data, not CSV text", path,
             (size_t)(nul - buf));
    free(buf);
    return NAS_ERR;
  }
  csv_line *lines = NULL;
  int64_t nlines = split_lines((char *)buf, &lines);
  int rc = nlines < 0    ? nas_errf(err, "%s: out of memory", path)
           : nlines == 0 ? nas_errf(err, "%s: no data", path)
                         : csv_rows(ctx, path, lines, nlines, label_col, out, err);
  free(lines);
  free(buf);
  return rc;
}

/* ---------------------------------------------------------------- split, normalise */

static void shuffle(int64_t *order, int64_t n, uint64_t rng[4]) {
  for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
    int64_t j = (int64_t)(tr_rng_next(rng) % (uint64_t)(i + 1));
    int64_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

/* A new dataset of the rows of src listed in idx. */
static int gather(tr_ctx *ctx, const tr_dataset *src, const int64_t *idx, int64_t n,
                  tr_dataset *out) {
  tr_meta m = tn_meta(src->x);
  m.shape[0] = n;
  int64_t row = src->n ? src->x->numel / src->n : 0;
  tr_tensor *x = tn_empty_meta(ctx, TR_F32, &m);
  int32_t *y = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  if (!x || !y) {
    tr_release(x);
    free(y);
    return nas_errf(&ctx->err, "dataset: out of memory");
  }
  for (int64_t i = 0; i < n; i++) {
    memcpy(tr_f32(x) + i * row, tr_f32(src->x) + idx[i] * row, sizeof(float) * (size_t)row);
    y[i] = src->y[idx[i]];
  }
  *out = (tr_dataset){x, y, n, src->nclasses};
  return NAS_OK;
}

int tr_dataset_split(tr_ctx *ctx, const tr_dataset *src, double val_fraction, uint64_t seed,
                     tr_dataset *train, tr_dataset *val) {
  if (val_fraction < 0 || val_fraction > 1)
    return nas_errf(&ctx->err, "split: fraction %g outside [0, 1]", val_fraction);
  if (!tr_is_contiguous(src->x))
    return nas_errf(&ctx->err, "split: features must be contiguous");
  int64_t *order = malloc(sizeof(int64_t) * (size_t)(src->n ? src->n : 1));
  if (!order) return nas_errf(&ctx->err, "split: out of memory");
  for (int64_t i = 0; i < src->n; i++) order[i] = i;
  uint64_t rng[4];
  tr_rng_seed(rng, seed);
  shuffle(order, src->n, rng);
  int64_t nval = (int64_t)((double)src->n * val_fraction + 0.5);
  int rc = gather(ctx, src, order, nval, val);
  if (rc == NAS_OK) {
    rc = gather(ctx, src, order + nval, src->n - nval, train);
    if (rc) tr_dataset_free(val);
  }
  free(order);
  return rc;
}

void tr_normalizer_free(tr_normalizer *nz) {
  free(nz->mean);
  free(nz->std);
  memset(nz, 0, sizeof *nz);
}

int tr_normalizer_fit(const tr_dataset *ds, tr_normalizer *out, nas_err *err) {
  int64_t nfeat = ds->n ? ds->x->numel / ds->n : 0;
  double *sum = calloc((size_t)(nfeat ? nfeat : 1), sizeof *sum),
         *sq = calloc((size_t)(nfeat ? nfeat : 1), sizeof *sq);
  out->mean = malloc(sizeof(float) * (size_t)(nfeat ? nfeat : 1));
  out->std = malloc(sizeof(float) * (size_t)(nfeat ? nfeat : 1));
  out->nfeat = nfeat;
  if (!sum || !sq || !out->mean || !out->std || !tr_is_contiguous(ds->x)) {
    free(sum);
    free(sq);
    tr_normalizer_free(out);
    return nas_errf(err, "normalizer: out of memory or non-contiguous features");
  }
  const float *x = tr_f32(ds->x);
  for (int64_t i = 0; i < ds->n; i++)
    for (int64_t f = 0; f < nfeat; f++) sum[f] += x[i * nfeat + f];
  for (int64_t f = 0; f < nfeat; f++) out->mean[f] = (float)(sum[f] / (double)(ds->n ? ds->n : 1));
  for (int64_t i = 0; i < ds->n; i++)
    for (int64_t f = 0; f < nfeat; f++) {
      double d = x[i * nfeat + f] - out->mean[f];
      sq[f] += d * d;
    }
  for (int64_t f = 0; f < nfeat; f++) {
    double sd = sqrt(sq[f] / (double)(ds->n ? ds->n : 1));
    out->std[f] = (float)(sd < 1e-6 ? 1e-6 : sd);
  }
  free(sum);
  free(sq);
  return NAS_OK;
}

int tr_normalizer_apply(const tr_normalizer *nz, tr_dataset *ds, nas_err *err) {
  int64_t nfeat = ds->n ? ds->x->numel / ds->n : nz->nfeat;
  if (nfeat != nz->nfeat || !tr_is_contiguous(ds->x))
    return nas_errf(err, "normalizer: fitted on %lld features, data has %lld", (long long)nz->nfeat,
                    (long long)nfeat);
  float *x = tr_f32(ds->x);
  for (int64_t i = 0; i < ds->n; i++)
    for (int64_t f = 0; f < nfeat; f++)
      x[i * nfeat + f] = (x[i * nfeat + f] - nz->mean[f]) / nz->std[f];
  ds->x->storage->version++;
  return NAS_OK;
}

/* ---------------------------------------------------------------- loader */

int tr_loader_init(tr_loader *ld, const tr_dataset *ds, int64_t batch, bool shuffle_each,
                   uint64_t seed, nas_err *err) {
  memset(ld, 0, sizeof *ld);
  if (batch < 1) return nas_errf(err, "loader: batch size %lld", (long long)batch);
  ld->order = malloc(sizeof(int64_t) * (size_t)(ds->n ? ds->n : 1));
  if (!ld->order) return nas_errf(err, "loader: out of memory");
  ld->ds = ds;
  ld->batch = batch;
  ld->shuffle = shuffle_each;
  for (int64_t i = 0; i < ds->n; i++) ld->order[i] = i;
  tr_rng_seed(ld->rng, seed);
  if (shuffle_each) shuffle(ld->order, ds->n, ld->rng);
  return NAS_OK;
}

void tr_loader_free(tr_loader *ld) {
  free(ld->order);
  memset(ld, 0, sizeof *ld);
}

int64_t tr_loader_next(tr_ctx *ctx, tr_loader *ld, tr_tensor **x, int32_t **y) {
  *x = NULL;
  *y = NULL;
  if (ld->pos >= ld->ds->n) {
    ld->pos = 0;
    if (ld->shuffle) shuffle(ld->order, ld->ds->n, ld->rng);
    return 0;
  }
  int64_t b = ld->ds->n - ld->pos < ld->batch ? ld->ds->n - ld->pos : ld->batch;
  tr_dataset out;
  if (gather(ctx, ld->ds, ld->order + ld->pos, b, &out)) return NAS_ERR;
  ld->pos += b;
  *x = out.x;
  *y = out.y;
  return b;
}

void tr_loader_skip_epochs(tr_loader *ld, int epochs) {
  ld->pos = 0;
  for (int e = 0; ld->shuffle && e < epochs; e++) shuffle(ld->order, ld->ds->n, ld->rng);
}
