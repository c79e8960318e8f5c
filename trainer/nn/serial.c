/* trainer/nn/serial.c: the byte level shared by the engine's files (serial.h): little-endian
 * integers, tensor records, the CRC-32 seal, and the cursor that reads them back. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "trainer/nn/serial.h"

/* Room for n more bytes. */
static int reserve(ser_buf *b, size_t n) {
  if (b->n + n <= b->cap) return NAS_OK;
  size_t ncap = (b->cap ? b->cap * 2 : 4096) + n;
  unsigned char *grown = realloc(b->data, ncap);
  if (!grown) return NAS_ERR;
  b->data = grown;
  b->cap = ncap;
  return NAS_OK;
}

int ser_put(ser_buf *b, const void *src, size_t n) {
  if (reserve(b, n)) return NAS_ERR;
  memcpy(b->data + b->n, src, n);
  b->n += n;
  return NAS_OK;
}

int ser_put_u32(ser_buf *b, uint32_t v) {
  unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                         (unsigned char)(v >> 24)};
  return ser_put(b, le, 4);
}

int ser_put_i64(ser_buf *b, int64_t v) {
  if (ser_put_u32(b, (uint32_t)((uint64_t)v & 0xffffffffu))) return NAS_ERR;
  return ser_put_u32(b, (uint32_t)((uint64_t)v >> 32));
}

int ser_put_tensor(ser_buf *b, const char *name, const tr_tensor *t) {
  unsigned char head[2] = {(unsigned char)t->dtype, (unsigned char)t->ndim};
  if (ser_put_u32(b, (uint32_t)strlen(name)) || ser_put(b, name, strlen(name)) ||
      ser_put(b, head, 2))
    return NAS_ERR;
  for (int d = 0; d < t->ndim; d++)
    if (ser_put_i64(b, t->shape[d])) return NAS_ERR;
  size_t nbytes = (size_t)t->numel * tr_dtype_size(t->dtype);
  if (reserve(b, nbytes)) return NAS_ERR;
  tn_copy_to_contig(t, b->data + b->n);
  b->n += nbytes;
  return NAS_OK;
}

int ser_seal_and_write(ser_buf *b, const char *path, nas_err *err) {
  if (ser_put_u32(b, (uint32_t)crc32(0L, b->data, (uInt)b->n)))
    return nas_errf(err, "%s: out of memory while serialising", path);
  return nas_write_file_atomic(path, (const char *)b->data, b->n, err);
}

bool ser_take(ser_reader *r, void *dst, size_t n) {
  if (r->left < n) return false;
  if (dst) memcpy(dst, r->p, n);
  r->p += n;
  r->left -= n;
  return true;
}

bool ser_take_u32(ser_reader *r, uint32_t *v) {
  unsigned char le[4];
  if (!ser_take(r, le, 4)) return false;
  *v = (uint32_t)le[0] | (uint32_t)le[1] << 8 | (uint32_t)le[2] << 16 | (uint32_t)le[3] << 24;
  return true;
}

bool ser_take_i64(ser_reader *r, int64_t *v) {
  uint32_t lo, hi;
  if (!ser_take_u32(r, &lo) || !ser_take_u32(r, &hi)) return false;
  *v = (int64_t)((uint64_t)hi << 32 | lo);
  return true;
}

int ser_check_tensor(ser_reader *r, const char *path, const char *name, const tr_tensor *t,
                     const unsigned char **data, nas_err *err) {
  uint32_t len;
  unsigned char head[2];
  char got[256];
  if (!ser_take_u32(r, &len) || len >= sizeof got || !ser_take(r, got, len) || !ser_take(r, head, 2))
    return nas_errf(err, "%s: truncated record for %s", path, name);
  got[len] = '\0';
  if (strcmp(got, name) != 0)
    return nas_errf(err, "%s: found tensor '%s' where '%s' was expected", path, got, name);
  if (head[0] != t->dtype || head[1] != t->ndim)
    return nas_errf(err, "%s: %s has dtype %d with %d dims, the model's has dtype %d with %d", path,
                    name, head[0], head[1], (int)t->dtype, t->ndim);
  for (int d = 0; d < t->ndim; d++) {
    int64_t size;
    if (!ser_take_i64(r, &size)) return nas_errf(err, "%s: truncated shape of %s", path, name);
    if (size != t->shape[d])
      return nas_errf(err, "%s: %s has size %lld at dim %d, the model's has %lld", path, name,
                      (long long)size, d, (long long)t->shape[d]);
  }
  size_t nbytes = (size_t)t->numel * tr_dtype_size(t->dtype);
  if (r->left < nbytes) return nas_errf(err, "%s: truncated data of %s", path, name);
  if (!tr_is_contiguous(t))
    return nas_errf(err, "%s: %s is not contiguous in the model", path, name);
  *data = r->p;
  ser_take(r, NULL, nbytes);
  return NAS_OK;
}

void ser_fill_tensor(tr_tensor *t, const unsigned char *data) {
  /* loading writes leaves on purpose: no grad-mode check */
  memcpy(tr_data(t), data, (size_t)t->numel * tr_dtype_size(t->dtype));
  t->storage->version++;
}

int ser_take_tensor(ser_reader *r, const char *path, const char *name, tr_tensor *t, nas_err *err) {
  const unsigned char *data;
  if (ser_check_tensor(r, path, name, t, &data, err) != NAS_OK) return NAS_ERR;
  ser_fill_tensor(t, data);
  return NAS_OK;
}

int ser_open(const unsigned char *data, size_t n, const char *magic, const char *what,
             const char *path, ser_reader *r, nas_err *err) {
  if (n < 8 || memcmp(data, magic, 4) != 0) return nas_errf(err, "%s: not a %s", path, what);
  uint32_t stored = (uint32_t)data[n - 4] | (uint32_t)data[n - 3] << 8 |
                    (uint32_t)data[n - 2] << 16 | (uint32_t)data[n - 1] << 24;
  if ((uint32_t)crc32(0L, data, (uInt)(n - 4)) != stored)
    return nas_errf(err, "%s: checksum mismatch (the file is corrupt or truncated)", path);
  *r = (ser_reader){data + 4, n - 8};
  return NAS_OK;
}

bool ser_host_is_little_endian(void) {
  uint16_t one = 1;
  return *(unsigned char *)&one == 1;
}
