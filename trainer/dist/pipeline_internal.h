/* pipeline_internal: what the files of the pipeline share (docs/engine-pipeline.md): the
 * world the stages meet in — a FIFO of tensors from each stage to each other, the abort
 * that fails every stage with one message, the step barrier — and the stage struct. Not
 * part of the public API (trainer/pipeline.h). */
#ifndef NAS_TRAINER_PIPELINE_INTERNAL_H
#define NAS_TRAINER_PIPELINE_INTERNAL_H

#include "trainer/pipeline.h"
#include "trainer/core/internal.h"

/* ---------------------------------------------------------------- the world
 *
 * The pw_* calls reach the stages' transport: threads of this process (pipeline_world.c),
 * processes over a shared-memory segment (pipeline_shm.c) or processes on CUDA devices
 * over NCCL (pipeline_nccl.c). */

/* A world of `stages` thread stages whose waits give up after timeout_s; NULL with err set. */
tr_pipe_world *pw_new(int stages, double timeout_s, nas_err *err);
void pw_free(tr_pipe_world *w);
/* Queues a contiguous copy of t for stage `to` (threads: never blocks, the copy is the
 * message; processes: blocks, bounded by the timeout, while the pair's mailbox is full;
 * NCCL: blocks until `to` receives it). NAS_ERR with ctx->err set. */
int pw_send(tr_ctx *ctx, tr_pipe_world *w, int from, int to, const tr_tensor *t);
/* The next tensor from `from` to `to`, in ctx's allocator (owned; NCCL: on the device of
 * ctx->cuda); `what` names it for the message when the wait times out (which aborts the
 * world). NULL with ctx->err set. */
tr_tensor *pw_recv(tr_ctx *ctx, tr_pipe_world *w, int from, int to, const char *what);
/* Returns once every stage has called it, with *value the sum of the stages' values (in
 * stage order). Fails when the world is aborted or a stage does not come in time. */
int pw_step_end(tr_pipe_world *w, int stage, double *value, nas_err *err);
/* Aborts the world with "pipeline stage <stage>: <message>" (the message alone when it
 * begins with that stage's name already) unless it is aborted already, and puts the
 * world's message into err. Returns NAS_ERR. */
int pw_abort(tr_pipe_world *w, int stage, nas_err *err);
/* Whether the world is aborted; its message into err (may be NULL) if so. */
bool pw_aborted(tr_pipe_world *w, nas_err *err);
/* Whether the world moves tensors on CUDA devices (NCCL) rather than host tensors. */
bool pw_moves_device_memory(const tr_pipe_world *w);
/* Whether a send may wait for its receiver to take it (processes, NCCL) rather than never
 * (threads): a schedule with sends both ways at once needs sends that never wait. */
bool pw_sends_wait(const tr_pipe_world *w);
/* The world of this process's stage over group (borrowed, an NCCL group: stage = its rank)
 * whose waits are bounded by the group's own timeout; NULL with err set. */
tr_pipe_world *pw_nccl_new(tr_comm *group, nas_err *err);

/* What a transport implements: the pw_* calls above on its own state. */
typedef struct {
  int (*send)(tr_ctx *ctx, void *impl, int from, int to, const tr_tensor *t);
  tr_tensor *(*recv)(tr_ctx *ctx, void *impl, int from, int to, const char *what);
  int (*step_end)(void *impl, int stage, double *value, nas_err *err);
  /* aborts with message (already prefixed) unless aborted; the world's message into err */
  void (*abort)(void *impl, const char *message, nas_err *err);
  bool (*aborted)(void *impl, nas_err *err);
  void (*free)(void *impl);
  bool device_memory; /* moves tensors on CUDA devices, not on the host */
  bool sends_wait;    /* a send may wait for its receiver (a full ring, NCCL's rendezvous) */
} pw_transport;

struct tr_pipe_world {
  const pw_transport *transport;
  void *impl; /* owned by the transport */
};

/* The message of a wait that timed out, the same on every transport. */
void pw_stalled_message(nas_err *out, int stage, double timeout_s, const char *what);

/* ---------------------------------------------------------------- skip connections */

typedef struct pipe_skips pipe_skips; /* one stage's skips that cross stages */

/* The skips of children (n_children, cut by balance into stages) that cross stages, as
 * stage sees them, for micro-batches of chunks; NULL with ctx->err set when a pop has no
 * earlier stash. */
pipe_skips *pipe_skips_new(tr_ctx *ctx, tr_module *const *children, int n_children,
                           const int *balance, int stages, int stage, int chunks);
void pipe_skips_free(pipe_skips *sk);
/* The pop's stage, forward of micro-batch i: receives the tensors of the skips it pops
 * from their stash stages (kept as leaves that require grad). */
int pipe_skips_recv(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i);
/* Before each run of micro-batch i: the received tensors into this copy's pop slots. */
void pipe_skips_load(pipe_skips *sk, int i);
/* After each run of micro-batch i on the stash's stage: takes the kept tensors out of the
 * slots, sends them to the pops' stages when send, holds them for the backward when keep. */
int pipe_skips_take(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i, bool send,
                    bool keep);
/* The stash's stage, backward of micro-batch i before the stage output's: receives each
 * kept tensor's gradient and runs back from it (keeping the graph). */
int pipe_skips_backward(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i);
/* The pop's stage, after the backward of micro-batch i: each received leaf's gradient back
 * to its stash's stage. */
int pipe_skips_send_grads(tr_ctx *ctx, pipe_skips *sk, tr_pipe_world *w, int i);
/* Drops what micro-batch i holds. */
void pipe_skips_clear(pipe_skips *sk, int i);

/* ---------------------------------------------------------------- tensors on either device */

/* saved[i] = a copy of state's item i when it is a buffer (does not require grad); saved
 * has state->n slots, zeroed. Restore copies them back and frees them, so running a
 * forward in between changes no running statistics (recomputation, balancing). */
int pipe_buffers_save(tr_ctx *ctx, const tr_param_list *state, tr_tensor **saved);
int pipe_buffers_restore(tr_ctx *ctx, const tr_param_list *state, tr_tensor **saved);
/* Copies src's values into dst (contiguous, same shape and device) without a version bump:
 * a memcpy on the host, a copy queued on ctx's stream on a device. */
int pipe_copy_values(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src);
/* Zeros of t's dtype and shape on t's device (owned), or NULL with ctx->err set. */
tr_tensor *pipe_zeros_like(tr_ctx *ctx, const tr_tensor *t);

/* ---------------------------------------------------------------- deferred batch norm */

typedef struct pipe_bn pipe_bn; /* the deferred statistics of one stage */

/* The state for every batch norm of children (n) and of their children, each hooked
 * (tn_module_set_bn_hook) until pipe_bn_free, which must come before the model's free;
 * NULL with ctx->err set. */
pipe_bn *pipe_bn_new(tr_ctx *ctx, tr_module *const *children, int n);
void pipe_bn_free(pipe_bn *bn);
/* Starts a mini-batch: remembers the running statistics, clears the sums. */
int pipe_bn_begin(tr_ctx *ctx, pipe_bn *bn);
/* Whether the forwards that follow count (a micro-batch's forward) or not (its
 * recomputation, anything else): while on, a tracked batch norm in training mode adds its
 * input to its sums, runs, and puts the running statistics back as they were at begin. */
void pipe_bn_track(pipe_bn *bn, bool on);
/* Ends the mini-batch: running = (1 - momentum) * running + momentum * statistics of all
 * the micro-batches together (unbiased variance, as torch). */
int pipe_bn_end(tr_ctx *ctx, pipe_bn *bn);

#endif
