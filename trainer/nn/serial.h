/* trainer/nn/serial.h: the byte level of the engine's files (the weights file of nn.c, the
 * training state of optim_state.c): a growing buffer written little-endian and sealed with
 * a CRC-32, a cursor that reads one back, and the tensor record both files share
 * (docs/engine.md, "Weights file"). Internal to the engine. */
#ifndef NAS_TRAINER_SERIAL_H
#define NAS_TRAINER_SERIAL_H

#include "trainer/core/internal.h"

/* Bytes being written; owned data, freed by the writer. */
typedef struct {
  unsigned char *data;
  size_t n, cap;
} ser_buf;

/* Each returns NAS_OK, or NAS_ERR when out of memory. */
int ser_put(ser_buf *b, const void *src, size_t n);
int ser_put_u32(ser_buf *b, uint32_t v);
int ser_put_i64(ser_buf *b, int64_t v);
/* One record: u32 name_len, name, u8 dtype, u8 ndim, i64 shape[ndim], the data (t on the CPU). */
int ser_put_tensor(ser_buf *b, const char *name, const tr_tensor *t);
/* Appends the CRC-32 of every byte so far, then writes the buffer to path atomically. */
int ser_seal_and_write(ser_buf *b, const char *path, nas_err *err);

/* A cursor over bytes read back. */
typedef struct {
  const unsigned char *p;
  size_t left;
} ser_reader;

/* Whether n more bytes were there (copied into dst unless it is NULL). */
bool ser_take(ser_reader *r, void *dst, size_t n);
bool ser_take_u32(ser_reader *r, uint32_t *v);
bool ser_take_i64(ser_reader *r, int64_t *v);
/* The record of tensor `name` for t (contiguous, on the CPU): the name, dtype and shape
 * must be t's; the first mismatch or a truncation is reported with path and name. *data
 * gets where its values are in r's bytes; t is not written. */
int ser_check_tensor(ser_reader *r, const char *path, const char *name, const tr_tensor *t,
                     const unsigned char **data, nas_err *err);
/* t's values from data (what ser_check_tensor found for t); bumps t's version. */
void ser_fill_tensor(tr_tensor *t, const unsigned char *data);
/* ser_check_tensor, then ser_fill_tensor. */
int ser_take_tensor(ser_reader *r, const char *path, const char *name, tr_tensor *t, nas_err *err);
/* The n bytes of a file at path that must start with the 4-byte magic and end with the
 * CRC-32 of the rest; *r gets the bytes between the two. `what` names the kind of file in
 * errors ("nas weights file"). */
int ser_open(const unsigned char *data, size_t n, const char *magic, const char *what,
             const char *path, ser_reader *r, nas_err *err);

/* Whether this host stores integers little-endian, as the files do. */
bool ser_host_is_little_endian(void);

#endif
