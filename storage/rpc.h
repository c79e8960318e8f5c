/* storage/rpc.h: the storage RPC, every storage operation as one JSON request and reply,
 * for `nas serve` to offer a storage to clients that cannot reach its database (the http
 * backend, storage/http.c, is the client; docs/storage-http.md is the protocol).
 *
 * Operation NAME is POST /api/v1/storage/NAME with a JSON object of its arguments, named
 * as in storage.h; the reply is a JSON object of its outputs ("id", "experiment",
 * "experiments", "trial", "trials", "metrics", "lease"; {} when there are none), or, on a
 * failure, {"error": MESSAGE, "code": "ENOTFOUND" | "EEXIST" | "ERR"} where MESSAGE is
 * the storage's own, without the operation in front (the client's storage.c adds it).
 *
 * Writes that are not idempotent carry an idempotency key (storage.h): the first request
 * under a key does the write and commits the key with it; any later one under the same key
 * is answered from the stored result without writing again. */
#ifndef NAS_STORAGE_RPC_H
#define NAS_STORAGE_RPC_H

#include <jansson.h>

#include "storage/storage.h"

typedef struct storage_rpc_op storage_rpc_op;

/* The operation named name, or NULL. */
const storage_rpc_op *storage_rpc_find(const char *name);
/* Whether it changes the storage (so needs a write token). */
bool storage_rpc_writes(const storage_rpc_op *op);
/* Whether it is not idempotent (so its requests carry an idempotency key). */
bool storage_rpc_keyed(const storage_rpc_op *op);

/* Runs op with args on st under key (NULL: none; ignored for idempotent operations).
 * NAS_OK: *reply is the owned reply. Else *reply is the owned error reply and the code
 * is the storage's (NAS_ENOTFOUND, NAS_EEXIST, NAS_ERR). Malformed args are NAS_ERR. */
int storage_rpc_serve(storage *st, const storage_rpc_op *op, const char *key,
                      const json_t *args, json_t **reply);

#endif
