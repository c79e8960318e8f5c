/* pipeline_skip: skip connections across pipeline stages (torchgpipe's @skippable stash/pop;
 * docs/engine-pipeline.md). A skip whose stash (tr_skip_new) is a child of one stage and
 * whose pop is a child of a later one gets its kept tensor carried directly from the
 * stash's stage to the pop's, per micro-batch, and the gradient of that tensor carried
 * back; a skip within one stage needs nothing (the two ends share their slot).
 *
 * Invariants:
 * - On the pop's stage the carried tensor is a leaf that requires grad, received with
 *   each run of the micro-batch (its forward, and a checkpointed one's recomputation) and
 *   put into the pop's slot before it. A checkpointed micro-batch drops it after the
 *   forward, as it drops everything but its stage input, so `always` holds one carried
 *   tensor, not one per micro-batch; the stash's stage recomputes the same values (same
 *   input, generator and running statistics) and sends them again. After the backward
 *   the leaf's gradient (zeros when the pop's output does not depend on it) goes back.
 * - On the stash's stage the kept tensor is taken out of the slot and sent after every
 *   run; it is held for the backward only when it has its graph (not a checkpointed
 *   micro-batch: the recomputation takes it again). The backward first runs back from it
 *   with the pop's gradient, keeping the graph, then from the stage output.
 * - Both ends walk the skips in child order, and each pair of stages' messages is a FIFO,
 *   so every message meets its receive: forward, the activation before the skips;
 *   backward, the recomputation's skips, then the input gradient before the skips'
 *   gradients. A stage recomputes micro-batch i first thing in its backward of i, which
 *   waits for nothing of i from later stages, and a pop's stage is later than its
 *   stash's, so the resent skip is never waited for by the stage that must send it. */
#include <stdlib.h>

#include "trainer/dist/pipeline_internal.h"

typedef struct {
  int stash_at, pop_at; /* children of the model */
  int from, to;         /* their stages */
  tr_tensor **slot;     /* borrowed: this copy's slot of the pair */
} skip_pair;

struct pipe_skips {
  int stage, chunks, n;
  skip_pair *pairs;   /* owned, n: the skips that cross stages, in child order */
  tr_tensor **carried; /* owned, chunks * n: [i * n + k], micro-batch i's tensor of skip k
                          (the received leaf on the pop's stage, the kept tensor on the
                          stash's), or NULL */
};

static int stage_of(const int *balance, int stages, int child) {
  for (int s = 0, end = 0; s < stages; s++)
    if (child < (end += balance[s])) return s;
  return stages - 1;
}

/* Pairs every pop with the latest open stash of its slot; counts into *n the pairs whose
 * ends lie on different stages and fills pairs (may be NULL: counting only). */
static int pair_ends(tr_ctx *ctx, tr_module *const *children, int n_children,
                     const int *balance, int stages, skip_pair *pairs, int *n) {
  *n = 0;
  for (int k = 0; k < n_children; k++) {
    bool stashes;
    tr_tensor **slot = tn_module_skip(children[k], &stashes);
    if (!slot || stashes) continue;
    int at = -1;
    for (int j = k - 1; j >= 0 && at < 0; j--) {
      bool other;
      if (tn_module_skip(children[j], &other) == slot && other) at = j;
    }
    if (at < 0)
      return nas_errf(&ctx->err, "pipeline: child %d pops a skip connection that no earlier "
                      "child of the model stashes", k);
    int from = stage_of(balance, stages, at), to = stage_of(balance, stages, k);
    if (from == to) continue;
    if (pairs) pairs[*n] = (skip_pair){at, k, from, to, slot};
    (*n)++;
  }
  return NAS_OK;
}

pipe_skips *pipe_skips_new(tr_ctx *ctx, tr_module *const *children, int n_children,
                           const int *balance, int stages, int stage, int chunks) {
  int n = 0;
  if (pair_ends(ctx, children, n_children, balance, stages, NULL, &n)) return NULL;
  pipe_skips *sk = calloc(1, sizeof *sk);
  if (sk) {
    sk->pairs = calloc(n ? (size_t)n : 1, sizeof *sk->pairs);
    sk->carried = calloc(n ? (size_t)n * (size_t)chunks : 1, sizeof *sk->carried);
  }
  if (!sk || !sk->pairs || !sk->carried) {
    pipe_skips_free(sk);
    tr_fail(ctx, "pipeline: out of memory");
    return NULL;
  }
  *sk = (pipe_skips){stage, chunks, n, sk->pairs, sk->carried};
  pair_ends(ctx, children, n_children, balance, stages, sk->pairs, &n);
  return sk;
}

void pipe_skips_clear(pipe_skips *sk, int i) {
  for (int k = 0; k < sk->n; k++) {
    tr_release(sk->carried[i * sk->n + k]);
    sk->carried[i * sk->n + k] = NULL;
  }
}

void pipe_skips_free(pipe_skips *sk) {
  if (!sk) return;
  if (sk->carried)
    for (int i = 0; i < sk->chunks; i++) pipe_skips_clear(sk, i);
  free(sk->carried);
  free(sk->pairs);
  free(sk);
}

int pipe_skips_recv(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i) {
  for (int k = 0; k < sk->n; k++) {
    const skip_pair *s = &sk->pairs[k];
    if (s->to != sk->stage) continue;
    char what[96];
    snprintf(what, sizeof what, "the skip stashed by child %d for micro-batch %d", s->stash_at,
             i);
    tr_tensor *t = pw_recv(ctx, w, s->from, sk->stage, what);
    if (!t) return NAS_ERR;
    t->requires_grad = true;
    sk->carried[i * sk->n + k] = t;
  }
  return NAS_OK;
}

void pipe_skips_load(pipe_skips *sk, int i) {
  for (int k = 0; k < sk->n; k++) {
    const skip_pair *s = &sk->pairs[k];
    if (s->to != sk->stage) continue;
    tr_release(*s->slot);
    *s->slot = tr_retain(sk->carried[i * sk->n + k]);
  }
}

int pipe_skips_take(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i, bool send,
                    bool keep) {
  int rc = NAS_OK;
  for (int k = 0; k < sk->n && rc == NAS_OK; k++) {
    const skip_pair *s = &sk->pairs[k];
    if (s->from != sk->stage) continue;
    tr_tensor *t = *s->slot;
    *s->slot = NULL;
    if (!t) return nas_errf(&ctx->err, "pipeline: child %d kept nothing to carry", s->stash_at);
    if (send) rc = pw_send(ctx, w, sk->stage, s->to, t);
    tr_release(sk->carried[i * sk->n + k]);
    sk->carried[i * sk->n + k] = keep ? t : NULL;
    if (!keep) tr_release(t);
  }
  return rc;
}

int pipe_skips_backward(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i) {
  int rc = NAS_OK;
  for (int k = 0; k < sk->n && rc == NAS_OK; k++) {
    const skip_pair *s = &sk->pairs[k];
    if (s->from != sk->stage) continue;
    char what[96];
    snprintf(what, sizeof what, "the gradient of the skip popped by child %d for micro-batch %d",
             s->pop_at, i);
    tr_tensor *grad = pw_recv(ctx, w, s->to, sk->stage, what);
    tr_tensor *kept = sk->carried[i * sk->n + k];
    if (!grad) return NAS_ERR;
    if (!kept) rc = nas_errf(&ctx->err, "pipeline: no kept tensor of child %d", s->stash_at);
    else if (kept->requires_grad) rc = tr_backward(ctx, kept, grad, true);
    tr_release(grad);
  }
  return rc;
}

int pipe_skips_send_grads(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i) {
  int rc = NAS_OK;
  for (int k = 0; k < sk->n && rc == NAS_OK; k++) {
    const skip_pair *s = &sk->pairs[k];
    if (s->to != sk->stage) continue;
    tr_tensor *leaf = sk->carried[i * sk->n + k];
    tr_tensor *grad = leaf->grad ? tr_retain(leaf->grad) : pipe_zeros_like(ctx, leaf);
    rc = grad ? pw_send(ctx, w, sk->stage, s->from, grad) : NAS_ERR;
    tr_release(grad);
  }
  return rc;
}
