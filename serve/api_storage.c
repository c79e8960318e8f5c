/* serve/api_storage.c: POST /api/v1/storage/OPERATION, the storage RPC (storage/rpc.h,
 * docs/storage-http.md) that the http storage backend speaks, so that `nas report`,
 * workers and every other command reach this server's storage through it.
 *
 * A thin layer: the operation, its idempotency key (the Idempotency-Key header) and its
 * arguments go to storage_rpc_serve on the request's pooled storage connection. Reads need
 * a read token, writes a write token. The status says how it went: 200, 404 (NAS_ENOTFOUND
 * or no such operation), 409 (NAS_EEXIST), 422 for any other failure of the operation
 * (final: the client does not retry it), 403 for a read token that writes. */
#include "serve/api.h"
#include "storage/rpc.h"

int api_storage(serve_request *req, char **parts) {
  const storage_rpc_op *op = storage_rpc_find(parts[0]);
  if (!op) return serve_fail(req, MHD_HTTP_NOT_FOUND, "no storage operation '%s'", parts[0]);
  if (storage_rpc_writes(op) && req->scope < SCOPE_WRITE)
    return serve_fail(req, MHD_HTTP_FORBIDDEN, "this token may only read");
  json_t *args = serve_body_json(req);
  if (!args) return NAS_ERR;
  const char *key = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Idempotency-Key");
  json_t *reply = NULL;
  bool queued = req->srv->one_writer && storage_rpc_writes(op);
  if (queued) pthread_mutex_lock(&req->srv->write_lock);
  int rc = storage_rpc_serve(req->st, op, key, args, &reply);
  if (queued) pthread_mutex_unlock(&req->srv->write_lock);
  json_decref(args);
  int status = rc == NAS_OK          ? MHD_HTTP_OK
               : rc == NAS_ENOTFOUND ? MHD_HTTP_NOT_FOUND
               : rc == NAS_EEXIST    ? MHD_HTTP_CONFLICT
                                     : MHD_HTTP_UNPROCESSABLE_CONTENT;
  serve_reply(req, reply ? status : MHD_HTTP_INTERNAL_SERVER_ERROR, reply);
  return rc;
}
