/* trainer/nn/data_cache.c: prepared datasets in cache files mapped read-only by every process
 * that uses them, so a trial's data set-up is a few system calls and the pages are the
 * kernel's page cache, shared by all trials on a machine (trainer/nn/data_cache.h).
 *
 * File layout (native byte order; the magic tells a foreign file from ours):
 *   cache_header | key text | identity text | padding to 64 | features of each part
 *   (float32, each 64-byte aligned) | labels of each part (int32)
 * The header records the file's size, a CRC-32 of the data (every part's features, then its
 * labels, in part order) and a CRC-32 of the header and both texts. Opening checks magic,
 * version, size, checksum, key and identity, and that every part lies inside the file. The
 * data's checksum is verified once per cache file, not on every open (reading it all would
 * cost what the cache saves): then a marker beside it (<file>.verified) records the
 * file's identity as it was (stat's, as for the source below), and later opens that find
 * the identity unchanged trust the data. Anything that writes into the file changes its
 * ctime, and so its identity, so the next open verifies the data again: an overwritten
 * payload is caught, not only truncation and damage to the header. The file is only ever
 * written whole, under another name, synced, then renamed.
 *
 * The source's identity is stat's device, inode, size, modification and change times (ns)
 * of the file, or of every file in the folder by name: a few microseconds where a content
 * hash would read the whole source every time. Rewriting a file changes its ctime, even a
 * copy onto the same inode that sets the old size and mtime back (cp -p, rsync -t), so
 * every edit is seen. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "trainer/nn/data_cache.h"

static const char cache_magic[8] = {'N', 'A', 'S', 'D', 'C', 'A', 'C', 'H'};
enum { CACHE_VERSION = 2, CACHE_ALIGN = 64 };

typedef struct {
  int32_t ndim, nclasses;
  int64_t n;
  int64_t shape[4];
  uint64_t x_offset, y_offset; /* bytes from the start of the file */
} cache_part;

typedef struct {
  char magic[8];
  uint32_t version, nparts;
  uint64_t file_size;
  uint64_t key_len, identity_len; /* the texts right after the header */
  double meta[TR_CACHE_MAX_META];
  cache_part parts[TR_CACHE_MAX_PARTS];
  uint32_t crc; /* of the header (this field 0) and both texts */
  uint32_t data_crc; /* of every part's features, then its labels, in part order */
} cache_header;

struct tr_data_cache {
  void *map;
  size_t size;
  tr_storage *storage; /* over the whole mapping; one reference is ours */
};

/* ---------------------------------------------------------------- where */

char *tr_data_cache_dir(nas_err *err) {
  const char *own = getenv("NAS_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
             *home = getenv("HOME");
  char *dir = own && *own   ? strdup(own)
              : xdg && *xdg ? nas_asprintf("%s/nas", xdg)
              : home && *home ? nas_asprintf("%s/.cache/nas", home)
                              : NULL;
  if (!dir)
    nas_errf(err, (own && *own) || (xdg && *xdg) || (home && *home)
                      ? "out of memory"
                      : "no cache folder: set NAS_CACHE_DIR (or HOME)");
  return dir;
}

/* FNV-1a, 64 bits: a file name from a text, not a security property. */
static uint64_t fnv1a(uint64_t h, const char *text) {
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    h = (h ^ *p) * 0x100000001b3ULL;
  return h;
}

char *tr_data_cache_path(const tr_cache_request *req) {
  char *source = realpath(req->source, NULL);
  if (!source) return NULL;
  uint64_t h = fnv1a(fnv1a(0xcbf29ce484222325ULL, source), "\n");
  h = fnv1a(h, req->key);
  free(source);
  return nas_asprintf("%s/%s-%016llx.nascache", req->dir, req->name, (unsigned long long)h);
}

/* ---------------------------------------------------------------- the source's identity */

/* The ctime with the mtime: every write sets it and no tool sets it back (touch and cp -p
 * set only the mtime); what else sets it (chmod, a new hard link) only costs a rebuild. */
static char *stat_text(const char *name, const struct stat *st) {
  return nas_asprintf("%s dev %llu ino %llu size %lld mtime %lld.%09ld ctime %lld.%09ld\n",
                      name, (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                      (long long)st->st_size, (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec,
                      (long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
}

/* text + more (more freed); NULL when either is NULL. */
static char *append(char *text, char *more) {
  char *joined = text && more ? nas_asprintf("%s%s", text, more) : NULL;
  free(text);
  free(more);
  return joined;
}

/* Every regular file of folder dir, in name order. */
static char *folder_identity(const char *dir, nas_err *err) {
  struct dirent **entries = NULL;
  int n = scandir(dir, &entries, NULL, alphasort);
  if (n < 0) {
    nas_errf(err, "%s: cannot list: %s", dir, strerror(errno));
    return NULL;
  }
  char *text = strdup("");
  for (int i = 0; i < n; i++) {
    char *path = text ? nas_asprintf("%s/%s", dir, entries[i]->d_name) : NULL;
    struct stat st;
    if (path && stat(path, &st) == 0 && S_ISREG(st.st_mode))
      text = append(text, stat_text(entries[i]->d_name, &st));
    else if (!path) text = append(text, NULL);
    free(path);
    free(entries[i]);
  }
  free(entries);
  if (!text) nas_errf(err, "out of memory");
  return text;
}

/* Owned; NULL with err set. */
static char *source_identity(const char *source, nas_err *err) {
  struct stat st;
  if (stat(source, &st) != 0) {
    nas_errf(err, "%s: %s", source, strerror(errno));
    return NULL;
  }
  if (S_ISDIR(st.st_mode)) return folder_identity(source, err);
  char *text = stat_text(".", &st);
  if (!text) nas_errf(err, "out of memory");
  return text;
}

/* ---------------------------------------------------------------- reading */

static uint32_t header_crc(const cache_header *h, const char *texts) {
  cache_header copy = *h;
  copy.crc = 0;
  uLong crc = crc32(0L, (const Bytef *)&copy, sizeof copy);
  return (uint32_t)crc32(crc, (const Bytef *)texts, (uInt)(h->key_len + h->identity_len));
}

static bool part_fits(const cache_part *p, uint64_t size) {
  if (p->ndim == 0) return p->n == 0; /* an empty part */
  if (p->ndim < 1 || p->ndim > 4 || p->n < 0 || p->shape[0] != p->n || p->x_offset % 4 ||
      p->y_offset % 4)
    return false;
  uint64_t values = 1;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] < 0 || (p->shape[d] > 0 && values > UINT64_MAX / 8 / (uint64_t)p->shape[d]))
      return false;
    values *= (uint64_t)p->shape[d];
  }
  return p->x_offset <= size && values * 4 <= size - p->x_offset && p->y_offset <= size &&
         (uint64_t)p->n * 4 <= size - p->y_offset;
}

/* CRC-32 of a part's features, then its labels, part after part (data of a file whose
 * parts were checked to fit it). */
static uint32_t data_crc(const tr_cache_content *content) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t i = 0; i < content->nparts; i++) {
    const tr_dataset *ds = &content->parts[i];
    if (ds->x) crc = crc32_z(crc, (const Bytef *)tr_f32(ds->x), (size_t)ds->x->numel * 4);
    if (ds->n > 0) crc = crc32_z(crc, (const Bytef *)ds->y, (size_t)ds->n * 4);
  }
  return (uint32_t)crc;
}

/* The same over the mapped file's parts. */
static uint32_t mapped_data_crc(const void *map) {
  const cache_header *h = map;
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint32_t i = 0; i < h->nparts; i++) {
    const cache_part *p = &h->parts[i];
    if (p->ndim == 0) continue;
    size_t values = 1;
    for (int d = 0; d < p->ndim; d++) values *= (size_t)p->shape[d];
    crc = crc32_z(crc, (const Bytef *)map + p->x_offset, values * 4);
    if (p->n > 0) crc = crc32_z(crc, (const Bytef *)map + p->y_offset, (size_t)p->n * 4);
  }
  return (uint32_t)crc;
}

/* Whether the data of the mapped file at path (identity st) matches its checksum: the
 * marker beside it says so when it records this very identity (its ctime included); else
 * the data is read and checked now, and the marker written when it is good (one that
 * cannot be written only costs the check again next time). */
static bool data_intact(const char *path, const void *map, const struct stat *st) {
  char *marker = nas_asprintf("%s.verified", path), *seen = stat_text(".", st), *recorded = NULL;
  size_t len;
  nas_err ignored;
  bool intact = marker && seen && nas_read_file(marker, &recorded, &len, &ignored) == NAS_OK &&
                strcmp(recorded, seen) == 0;
  if (!intact) {
    intact = mapped_data_crc(map) == ((const cache_header *)map)->data_crc;
    if (intact && marker && seen) nas_write_file_atomic(marker, seen, strlen(seen), &ignored);
  }
  free(marker), free(seen), free(recorded);
  return intact;
}

/* Whether the mapped file (size bytes) is intact and holds key's content of a source with
 * this identity; why says what is wrong when not. */
static bool content_current(const void *map, size_t size, const char *key, const char *identity,
                            const char **why) {
  const cache_header *h = map;
  *why = "damaged";
  if (size < sizeof *h || memcmp(h->magic, cache_magic, sizeof cache_magic) != 0 ||
      h->version != CACHE_VERSION || h->nparts > TR_CACHE_MAX_PARTS)
    return false;
  if (h->file_size != size) return (*why = "truncated"), false;
  if (h->key_len > size - sizeof *h || h->identity_len > size - sizeof *h - h->key_len)
    return false;
  const char *texts = (const char *)map + sizeof *h;
  if (header_crc(h, texts) != h->crc) return false;
  for (uint32_t i = 0; i < h->nparts; i++)
    if (!part_fits(&h->parts[i], size)) return false;
  *why = "for other settings";
  if (h->key_len != strlen(key) || memcmp(texts, key, h->key_len) != 0) return false;
  *why = "stale (the source changed)";
  return h->identity_len == strlen(identity) &&
         memcmp(texts + h->key_len, identity, h->identity_len) == 0;
}

/* Maps path when it is current: NAS_OK, NAS_ENOTFOUND (missing, stale or damaged; why
 * says which), or NAS_ERR for a failure to read it. */
static int map_current(const char *path, const char *key, const char *identity, void **map,
                       size_t *size, const char **why, nas_err *err) {
  *why = "missing";
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? NAS_ENOTFOUND : nas_errf(err, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int rc = nas_errf(err, "%s: %s", path, strerror(errno));
    close(fd);
    return rc;
  }
  *size = (size_t)st.st_size;
  *map = *size > 0 ? mmap(NULL, *size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (*size == 0) return (*why = "truncated"), NAS_ENOTFOUND;
  if (*map == MAP_FAILED) return nas_errf(err, "%s: cannot map: %s", path, strerror(errno));
  if (content_current(*map, *size, key, identity, why)) {
    if (data_intact(path, *map, &st)) return NAS_OK;
    *why = "damaged (its data does not match its checksum)";
  }
  munmap(*map, *size);
  return NAS_ENOTFOUND;
}

/* ---------------------------------------------------------------- writing */

static uint64_t align_up(uint64_t n) { return (n + CACHE_ALIGN - 1) / CACHE_ALIGN * CACHE_ALIGN; }

/* The header of content, its parts laid out after texts_len bytes of texts. */
static int plan_layout(const tr_cache_content *content, uint64_t key_len, uint64_t identity_len,
                       cache_header *h, nas_err *err) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, cache_magic, sizeof cache_magic);
  h->version = CACHE_VERSION;
  h->nparts = (uint32_t)content->nparts;
  h->key_len = key_len;
  h->identity_len = identity_len;
  memcpy(h->meta, content->meta, sizeof h->meta);
  uint64_t at = align_up(sizeof *h + key_len + identity_len);
  for (size_t i = 0; i < content->nparts; i++) {
    const tr_dataset *ds = &content->parts[i];
    cache_part *p = &h->parts[i];
    if (ds->n == 0 && !ds->x) continue; /* empty, as a dataset without a test part has */
    if (!ds->x || ds->x->dtype != TR_F32 || !tr_is_contiguous(ds->x) || ds->x->ndim < 1 ||
        ds->x->ndim > 4 || ds->x->shape[0] != ds->n || tr_tensor_device(ds->x).kind != TR_CPU)
      return nas_errf(err, "cache: part %zu is not contiguous float32 (n, ...) on the CPU", i);
    *p = (cache_part){.ndim = ds->x->ndim, .nclasses = ds->nclasses, .n = ds->n, .x_offset = at};
    memcpy(p->shape, ds->x->shape, sizeof(int64_t) * (size_t)ds->x->ndim);
    at = align_up(at + (uint64_t)ds->x->numel * 4);
  }
  for (size_t i = 0; i < content->nparts; i++) {
    h->parts[i].y_offset = at;
    at = align_up(at + (uint64_t)content->parts[i].n * 4);
  }
  h->file_size = at;
  return NAS_OK;
}

static int write_at(int fd, const void *data, size_t len, uint64_t offset) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return NAS_ERR;
    p += n, len -= (size_t)n, offset += (uint64_t)n;
  }
  return NAS_OK;
}

static int write_content(int fd, const tr_cache_content *content, const char *key,
                         const char *identity) {
  cache_header h;
  nas_err ignored;
  size_t key_len = strlen(key), identity_len = strlen(identity);
  if (plan_layout(content, key_len, identity_len, &h, &ignored) != NAS_OK) return NAS_ERR;
  char *texts = nas_asprintf("%s%s", key, identity);
  if (!texts) return NAS_ERR;
  h.data_crc = data_crc(content);
  h.crc = header_crc(&h, texts);
  int rc = ftruncate(fd, (off_t)h.file_size) == 0 ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK) rc = write_at(fd, &h, sizeof h, 0);
  if (rc == NAS_OK) rc = write_at(fd, texts, key_len + identity_len, sizeof h);
  for (size_t i = 0; rc == NAS_OK && i < content->nparts; i++) {
    const tr_dataset *ds = &content->parts[i];
    if (h.parts[i].ndim == 0) continue;
    rc = write_at(fd, tr_f32(ds->x), (size_t)ds->x->numel * 4, h.parts[i].x_offset);
    if (rc == NAS_OK) rc = write_at(fd, ds->y, (size_t)ds->n * 4, h.parts[i].y_offset);
  }
  free(texts);
  return rc;
}

static void content_free(tr_cache_content *content) {
  for (size_t i = 0; i < TR_CACHE_MAX_PARTS; i++) tr_dataset_free(&content->parts[i]);
  memset(content, 0, sizeof *content);
}

/* Builds the content and puts it at path: written whole to a temporary file beside it,
 * then renamed over it, so readers see the old file or the new one, never a part. The data
 * is on disk before the rename and the rename before the verified marker (which makes
 * later opens trust the data), so a power loss cannot leave a trusted file of lost pages.
 * *builder_failed says whether the error is the builder's own. */
static int build_file(tr_ctx *ctx, const tr_cache_request *req, const char *path,
                      const char *identity, bool *builder_failed, nas_err *err) {
  tr_cache_content content = {0};
  cache_header layout;
  int rc = req->build(ctx, req->arg, &content, err);
  *builder_failed = rc != NAS_OK;
  if (rc == NAS_OK && content.nparts > TR_CACHE_MAX_PARTS)
    rc = nas_errf(err, "cache: %zu parts (at most %d)", content.nparts, TR_CACHE_MAX_PARTS);
  if (rc == NAS_OK) rc = plan_layout(&content, 0, 0, &layout, err);
  char *tmp = rc == NAS_OK ? nas_asprintf("%s.tmp.XXXXXX", path) : NULL;
  int fd = tmp ? mkstemp(tmp) : -1;
  if (rc == NAS_OK && fd < 0)
    rc = nas_errf(err, "%s: cannot create: %s", tmp ? tmp : path, tmp ? strerror(errno) : "out of memory");
  if (rc == NAS_OK && write_content(fd, &content, req->key, identity) != NAS_OK)
    rc = nas_errf(err, "%s: cannot write: %s", tmp, strerror(errno ? errno : EIO));
  if (rc == NAS_OK && fsync(fd) != 0)
    rc = nas_errf(err, "%s: cannot sync: %s", tmp, strerror(errno));
  if (fd >= 0 && close(fd) != 0 && rc == NAS_OK) rc = nas_errf(err, "%s: %s", tmp, strerror(errno));
  if (rc == NAS_OK && rename(tmp, path) != 0)
    rc = nas_errf(err, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
  if (rc == NAS_OK) rc = nas_fsync_dir(req->dir, err);
  if (rc != NAS_OK && fd >= 0) unlink(tmp);
  free(tmp);
  content_free(&content);
  return rc;
}

/* Under path's lock (a file beside it, held by one builder; the kernel drops it when a
 * builder dies): maps the file another builder made meanwhile, else builds it. */
static int build_locked(tr_ctx *ctx, const tr_cache_request *req, const char *path,
                        const char *identity, void **map, size_t *size, bool *built,
                        bool *builder_failed, nas_err *err) {
  char *lock_path = nas_asprintf("%s.lock", path);
  int fd = lock_path ? open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
  int rc = fd >= 0 ? NAS_OK
                   : nas_errf(err, "%s: %s", lock_path ? lock_path : path,
                              lock_path ? strerror(errno) : "out of memory");
  while (rc == NAS_OK && flock(fd, LOCK_EX) != 0)
    if (errno != EINTR) rc = nas_errf(err, "%s: cannot lock: %s", lock_path, strerror(errno));
  const char *why;
  if (rc == NAS_OK) rc = map_current(path, req->key, identity, map, size, &why, err);
  if (rc == NAS_ENOTFOUND) {
    *built = true;
    rc = build_file(ctx, req, path, identity, builder_failed, err);
    if (rc == NAS_OK) rc = map_current(path, req->key, identity, map, size, &why, err);
    if (rc == NAS_ENOTFOUND) rc = nas_errf(err, "%s: written but %s on reading back", path, why);
  }
  if (fd >= 0) close(fd); /* releases the lock */
  free(lock_path);
  return rc;
}

/* ---------------------------------------------------------------- the mapped content */

/* A tensor of part p's features on the mapping's storage (a new reference to it). */
static tr_tensor *part_features(tr_ctx *ctx, tr_data_cache *c, const cache_part *p) {
  tr_tensor *t = calloc(1, sizeof *t);
  if (!t) {
    nas_errf(&ctx->err, "cache: out of memory");
    return NULL;
  }
  t->refs = 1;
  t->storage = c->storage;
  c->storage->refs++;
  t->offset = (int64_t)(p->x_offset / 4);
  t->dtype = TR_F32;
  t->ndim = p->ndim;
  t->numel = 1;
  for (int d = p->ndim - 1; d >= 0; d--) {
    t->shape[d] = p->shape[d];
    t->strides[d] = t->numel;
    t->numel *= p->shape[d];
  }
  return t;
}

static int materialise(tr_ctx *ctx, tr_data_cache *c, tr_cache_content *out, nas_err *err) {
  const cache_header *h = c->map;
  memset(out, 0, sizeof *out);
  memcpy(out->meta, h->meta, sizeof out->meta);
  out->nparts = h->nparts;
  for (uint32_t i = 0; i < h->nparts; i++) {
    const cache_part *p = &h->parts[i];
    tr_dataset *ds = &out->parts[i];
    if (p->ndim == 0) continue; /* empty: stays all zero */
    ds->n = p->n;
    ds->nclasses = p->nclasses;
    ds->x = part_features(ctx, c, p);
    ds->y = malloc(sizeof(int32_t) * (size_t)(p->n ? p->n : 1));
    if (!ds->x || !ds->y) {
      content_free(out);
      return nas_errf(err, "cache: out of memory");
    }
    memcpy(ds->y, (const char *)c->map + p->y_offset, sizeof(int32_t) * (size_t)p->n);
  }
  return NAS_OK;
}

static tr_data_cache *cache_new(void *map, size_t size) {
  tr_data_cache *c = calloc(1, sizeof *c);
  tr_storage *s = c ? calloc(1, sizeof *s) : NULL;
  if (!s) {
    free(c);
    munmap(map, size);
    return NULL;
  }
  *s = (tr_storage){.refs = 1, .data = map, .nbytes = size, .device = TR_DEVICE_CPU};
  *c = (tr_data_cache){map, size, s};
  return c;
}

int tr_data_cache_open(tr_ctx *ctx, const tr_cache_request *req, tr_data_cache **cache,
                       tr_cache_content *out, bool *built, nas_err *err) {
  *cache = NULL;
  memset(out, 0, sizeof *out);
  bool ran = false, builder_failed = false;
  void *map = NULL;
  size_t size = 0;
  const char *why;
  char *identity = source_identity(req->source, err);
  char *path = identity ? tr_data_cache_path(req) : NULL;
  int rc = !identity ? NAS_ERR : path ? nas_mkdirs(req->dir, err) : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = map_current(path, req->key, identity, &map, &size, &why, err);
  if (rc == NAS_ENOTFOUND)
    rc = build_locked(ctx, req, path, identity, &map, &size, &ran, &builder_failed, err);
  if (rc == NAS_OK && !(*cache = cache_new(map, size))) rc = nas_errf(err, "out of memory");
  if (rc == NAS_OK && (rc = materialise(ctx, *cache, out, err)) != NAS_OK) {
    tr_data_cache_close(*cache);
    *cache = NULL;
  }
  /* the builder's errors are about the source and say so themselves */
  if (rc != NAS_OK && path && !builder_failed) nas_err_prefix(err, "dataset cache %s", path);
  if (built) *built = ran;
  free(identity);
  free(path);
  return rc;
}

void tr_data_cache_close(tr_data_cache *c) {
  if (!c) return;
  if (c->storage->refs == 1) {
    free(c->storage); /* ours alone: nothing else can reach the mapping */
    munmap(c->map, c->size);
  }
  free(c);
}
