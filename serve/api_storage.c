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
#include "serve/api.h"
#include "storage/rpc.h"

/* One RPC write for the group commit. */
typedef struct {
  const storage_rpc_op *op;
  const char *key; /* borrowed, may be NULL */
  const json_t *args;
  json_t *reply;   /* owned */
  int rc;
} rpc_write;

static void rpc_write_run(storage *st, void *arg) {
  rpc_write *w = arg;
  json_decref(w->reply);
  w->rc = storage_rpc_serve(st, w->op, w->key, w->args, &w->reply);
}

int api_storage(serve_request *req, char **parts) {
  const storage_rpc_op *op = storage_rpc_find(parts[0]);
  if (!op) return serve_fail(req, MHD_HTTP_NOT_FOUND, "no storage operation '%s'", parts[0]);
  if (storage_rpc_writes(op) && req->scope < SCOPE_WRITE)
    return serve_fail(req, MHD_HTTP_FORBIDDEN, "this token may only read");
  json_t *args = serve_body_json(req);
  if (!args) return NAS_ERR;
  const char *key = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Idempotency-Key");
  rpc_write call = {op, key, args, NULL, NAS_OK};
  if (req->srv->grouped_writes && storage_rpc_writes(op))
    serve_commit(&req->srv->committer, req->st, &(serve_write){.run = rpc_write_run, .arg = &call});
  else
    rpc_write_run(req->st, &call);
  json_decref(args);
  json_t *reply = call.reply;
  int rc = call.rc;
  int status = rc == NAS_OK          ? MHD_HTTP_OK
               : rc == NAS_ENOTFOUND ? MHD_HTTP_NOT_FOUND
               : rc == NAS_EEXIST    ? MHD_HTTP_CONFLICT
                                     : MHD_HTTP_UNPROCESSABLE_CONTENT;
  serve_reply(req, reply ? status : MHD_HTTP_INTERNAL_SERVER_ERROR, reply);
  return rc;
}
