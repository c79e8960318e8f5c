/* serve/api_storage.c: POST /api/v1/storage/OPERATION, the storage RPC (storage/rpc.h,
 * docs/storage-http.md) that the http storage backend speaks, so that `nas report`,
 * workers and every other command reach this server's storage through it.
 *
 * A thin layer: the operation, its idempotency key (the Idempotency-Key header) and its
 * arguments go to storage_rpc_serve on the request's pooled storage connection (writes
 * through the group commit, commit.c, several in one transaction, where the storage can
 * group them). Reads need a read token, writes a write token. The status says how it
 * went: 200, 404 (NAS_ENOTFOUND or no such operation), 409 (NAS_EEXIST), 422 for any
 * other failure of the operation (final: the client does not retry it), 403 for a read
 * token that writes. */
#include <stdlib.h>

#include "serve/api.h"
#include "storage/rpc.h"

/* One RPC call; a write goes through the group commit, so it lives on the heap until
 * answered. */
typedef struct {
  serve_write write;
  const storage_rpc_op *op;
  const char *key; /* borrowed from the request, may be NULL */
  json_t *args;    /* owned */
  json_t *reply;   /* owned until answered */
  int rc;
} rpc_call;

static void rpc_call_run(storage *st, void *arg) {
  rpc_call *call = arg;
  json_decref(call->reply);
  call->rc = storage_rpc_serve(st, call->op, call->key, call->args, &call->reply);
}

static void rpc_call_answer(serve_request *req, void *arg) {
  rpc_call *call = arg;
  int status = call->rc == NAS_OK          ? MHD_HTTP_OK
               : call->rc == NAS_ENOTFOUND ? MHD_HTTP_NOT_FOUND
               : call->rc == NAS_EEXIST    ? MHD_HTTP_CONFLICT
                                           : MHD_HTTP_UNPROCESSABLE_CONTENT;
  serve_reply(req, call->reply ? status : MHD_HTTP_INTERNAL_SERVER_ERROR, call->reply);
  json_decref(call->args);
  free(call);
}

int api_storage(serve_request *req, char **parts) {
  const storage_rpc_op *op = storage_rpc_find(parts[0]);
  if (!op) return serve_fail(req, MHD_HTTP_NOT_FOUND, "no storage operation '%s'", parts[0]);
  if (storage_rpc_writes(op) && req->scope < SCOPE_WRITE)
    return serve_fail(req, MHD_HTTP_FORBIDDEN, "this token may only read");
  json_t *args = serve_body_json(req);
  if (!args) return NAS_ERR;
  rpc_call *call = malloc(sizeof *call);
  if (!call) {
    json_decref(args);
    return serve_fail(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
  }
  *call = (rpc_call){.write = {.run = rpc_call_run, .answer = rpc_call_answer, .arg = call},
                     .op = op,
                     .key = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Idempotency-Key"),
                     .args = args};
  if (storage_rpc_writes(op)) {
    serve_submit(req, &call->write);
  } else {
    rpc_call_run(req->st, call);
    rpc_call_answer(req, call);
  }
  return NAS_OK;
}
