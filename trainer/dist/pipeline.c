/* pipeline: one stage of a GPipe pipeline (docs/engine-pipeline.md) — its run of the
 * model's children, the schedule of a mini-batch's micro-batches (GPipe's fill-drain, or
 * one forward one backward under `never`), checkpointing in torchgpipe's three modes, the
 * stage's optimiser and the gather of the whole model.
 *
 * A mini-batch of B examples is cut into `chunks` micro-batches [B*i/M, B*(i+1)/M). Stage s
 * runs the forward of micro-batch 0, 1, ... as its input arrives from stage s-1 (stage 0
 * takes it from x) and sends each output on to stage s+1, so stage s works on micro-batch i
 * while stage s+1 works on i-1 (fill); then the backward in reverse order, each gradient
 * coming from stage s+1 (the last stage: the micro-batch's loss, weighted by its share of
 * the mini-batch) and the input's gradient going back to stage s-1 (drain). Gradients
 * accumulate in the parameters' .grad, so the sum over micro-batches is the gradient of
 * the mini-batch's mean loss. Under `never` on a world whose sends never wait (threads),
 * the order is one forward one backward instead (one_forward_one_backward): stage s runs a
 * few forwards ahead, then each backward in micro-batch order between the remaining
 * forwards, so the last stage sends micro-batch 0's input gradient right after its forward
 * and stage 0 does not wait for every forward downstream. Under `never`, every stage but
 * the first sends a micro-batch's input gradient before it adds that backward's weight
 * gradients, which it queues (ctx->wgrads) and adds later (wgrads_catch_up says when):
 * stage s-1 gets to work sooner.
 *
 * Invariants:
 * - A micro-batch's stage input is a detached leaf, so the stage's ops build a graph of
 *   their own per micro-batch; it requires grad on every stage but the first, whose input
 *   gradient nobody needs.
 * - A checkpointed micro-batch keeps only that input and the generator state its forward
 *   started from; the forward ran without grad. Its backward first recomputes the stage
 *   with grad from the same generator state (the same dropout masks), then puts the
 *   current generator back, and the running statistics of batch norm as they were, so
 *   recomputing changes nothing the forward did not.
 * - Any failure aborts the world: the other stages stop waiting and fail with the same
 *   message.
 * - A stage's parameters and buffers lie on one device, the stage's: the CPU for the
 *   thread and shared-memory transports, ctx->cuda's CUDA device for NCCL, which moves
 *   device tensors only. Every tensor the stage makes or receives is made there, and stage
 *   0 moves its slices of x there. */
#include <stdlib.h>
#include <string.h>

#include "trainer/cuda/cuda_internal.h"
#include "trainer/dist/pipeline_internal.h"

/* One micro-batch between its forward and its backward. */
typedef struct {
  int64_t start, count; /* examples of the mini-batch */
  tr_tensor *input;     /* owned: the stage's input leaf */
  tr_tensor *output;    /* owned: the stage output with its graph (the last stage: the
                           weighted loss); NULL when checkpointed */
  uint64_t rng[4];      /* ctx's generator before the forward */
  size_t wgrad_mark;    /* the stage's queue of weight gradients after its backward */
} pipe_chunk;

struct tr_pipe {
  tr_pipe_config cfg;
  tr_pipe_world *world; /* borrowed */
  int stage, stages;
  tr_module *const *children;  /* borrowed: the model's children */
  int balance[TR_PIPE_MAX_STAGES]; /* children per stage */
  int first, count;            /* this stage's children */
  tr_device device;            /* where its parameters and buffers are */
  tr_param_list params;        /* this stage's parameters */
  tr_param_list state;         /* its parameters and buffers (batch norm running
                                  statistics; those that do not require grad) */
  pipe_bn *bn;                 /* owned; NULL unless deferred batch norm */
  pipe_skips *skips;           /* owned: the skip connections that cross stages */
  pipe_chunk *chunks;          /* owned, cfg.chunks */
  tr_wgrad_queue *wgrads;      /* owned: the weight gradients put off (wgrads_init); NULL:
                                  none are */
  bool interleaved;            /* one forward one backward, not fill-drain (schedule_init) */
};

/* ---------------------------------------------------------------- partition */

static int check_balance(tr_ctx *ctx, const tr_pipe_config *cfg, int stages, int children,
                         int *balance) {
  bool given = false;
  for (int s = 0; s < stages; s++) given = given || cfg->balance[s] != 0;
  if (stages > children)
    return nas_errf(&ctx->err, "pipeline: %d stages for a model of %d children (each stage "
                    "needs at least one)", stages, children);
  int sum = 0;
  for (int s = 0; s < stages; s++) {
    balance[s] = given ? cfg->balance[s] : children * (s + 1) / stages - children * s / stages;
    if (balance[s] < 1)
      return nas_errf(&ctx->err, "pipeline: balance[%d] is %d; every stage needs at least one "
                      "child", s, balance[s]);
    sum += balance[s];
  }
  if (sum != children)
    return nas_errf(&ctx->err, "pipeline: the balance covers %d children, the model has %d",
                    sum, children);
  return NAS_OK;
}

static int check_config(tr_ctx *ctx, tr_module *model, const tr_pipe_rank *rank,
                        const tr_pipe_config *cfg) {
  if (!model || !rank || !rank->world || !cfg)
    return nas_errf(&ctx->err, "pipeline: no model, rank or config");
  if (cfg->chunks < 1)
    return nas_errf(&ctx->err, "pipeline: chunks must be at least 1, got %d", cfg->chunks);
  if (cfg->checkpoint != TR_PIPE_CKPT_EXCEPT_LAST && cfg->checkpoint != TR_PIPE_CKPT_ALWAYS &&
      cfg->checkpoint != TR_PIPE_CKPT_NEVER)
    return nas_errf(&ctx->err, "pipeline: unknown checkpoint mode %d", (int)cfg->checkpoint);
  return NAS_OK;
}

/* The stage's device (that of its first tensor; the CPU when it has none), which every
 * other tensor of the stage must share. */
static int stage_device(tr_ctx *ctx, tr_pipe *p) {
  p->device = p->state.n ? tr_tensor_device(p->state.items[0]) : TR_DEVICE_CPU;
  for (size_t i = 1; i < p->state.n; i++) {
    tr_device at = tr_tensor_device(p->state.items[i]);
    if (at.kind == p->device.kind && at.index == p->device.index) continue;
    char a[32], b[32];
    return nas_errf(&ctx->err, "pipeline stage %d: %s is on %s but %s on %s: a stage's layers "
                    "must be on one device", p->stage, p->state.names[i],
                    tc_device_str(at, a, sizeof a), p->state.names[0],
                    tc_device_str(p->device, b, sizeof b));
  }
  return NAS_OK;
}

/* Whether the stage's device suits its world's transport and ctx. */
static int check_device(tr_ctx *ctx, const tr_pipe *p) {
  bool cuda = p->device.kind == TR_CUDA;
  if (cuda && !pw_moves_device_memory(p->world))
    return nas_errf(&ctx->err, "pipeline stage %d: the stage is on cuda:%d but its stages meet "
                    "on the host (threads or shared memory): stages on CUDA devices are "
                    "processes over NCCL (tr_pipe_run_group with an NCCL group)", p->stage,
                    p->device.index);
  if (!cuda && pw_moves_device_memory(p->world))
    return nas_errf(&ctx->err, "pipeline stage %d: the stage is on the cpu but its stages meet "
                    "over NCCL, which moves device memory only: move the model to the GPU "
                    "(tr_module_to_device)", p->stage);
  if (cuda && (!ctx->cuda || tr_cuda_device(ctx->cuda) != p->device.index))
    return nas_errf(&ctx->err, "pipeline stage %d: the stage is on cuda:%d but ctx->cuda is %s "
                    "(set it to the engine of that device, from tr_cuda_new)", p->stage,
                    p->device.index, ctx->cuda ? "another device's engine" : "NULL");
  return NAS_OK;
}

/* The stage's parameters and buffers, on one device that suits the world. */
static int collect_tensors(tr_ctx *ctx, tr_pipe *p) {
  int rc = NAS_OK;
  for (int k = p->first; k < p->first + p->count && rc == NAS_OK; k++) {
    rc = tr_module_parameters(p->children[k], false, &p->params, &ctx->err);
    if (rc == NAS_OK) rc = tr_module_parameters(p->children[k], true, &p->state, &ctx->err);
  }
  if (rc == NAS_OK) rc = stage_device(ctx, p);
  return rc == NAS_OK ? check_device(ctx, p) : rc;
}

/* Under `never`, stage s > 0 computes a micro-batch's input gradient before its weight
 * gradients and puts those off until later backwards have run (wgrads_catch_up): in
 * fill-drain the s stages upstream drain while it adds them. A put-off product holds its
 * layer's input and output gradient, about a micro-batch's graph per micro-batch put off,
 * which `never` (holding micro-batches' graphs from their forwards to their backwards) is
 * the mode to spend on; checkpointing's point is to hold one micro-batch's graph, so there
 * a backward adds its weight gradients as it goes (docs/engine-pipeline.md, "Weight
 * gradients in the drain"). */
static int wgrads_init(tr_ctx *ctx, tr_pipe *p) {
  if (p->stage == 0 || p->cfg.checkpoint != TR_PIPE_CKPT_NEVER) return NAS_OK;
  p->wgrads = tr_wgrads_new();
  return p->wgrads ? NAS_OK : nas_errf(&ctx->err, "pipeline: out of memory");
}

/* One forward one backward needs `never` and sends that never wait. Checkpointing keeps
 * torchgpipe's fill-drain: `except_last` leaves out the one micro-batch whose backward
 * follows its forward there, and a checkpointed stash's stage sends its skips again in
 * its backward, which that order keeps apart from the forwards' sends. Sends that may
 * wait (a full ring, NCCL's rendezvous) would deadlock two stages that send to each other
 * at once, a forward's output one way and a backward's input gradient the other; in
 * fill-drain all forwards' sends come before any backward's. */
static void schedule_init(tr_pipe *p) {
  p->interleaved = p->cfg.checkpoint == TR_PIPE_CKPT_NEVER && !pw_sends_wait(p->world);
}

tr_pipe *tr_pipe_new(tr_ctx *ctx, tr_module *model, const tr_pipe_rank *rank,
                     const tr_pipe_config *cfg) {
  if (check_config(ctx, model, rank, cfg)) return NULL;
  size_t n = 0;
  tr_module *const *children = tn_module_children(model, &n);
  if (n == 0) {
    nas_errf(&ctx->err, "pipeline: the model must be a Sequential with children to cut");
    return NULL;
  }
  int balance[TR_PIPE_MAX_STAGES] = {0};
  if (check_balance(ctx, cfg, rank->stages, (int)n, balance)) return NULL;
  tr_pipe *p = calloc(1, sizeof *p);
  if (p) p->chunks = calloc((size_t)cfg->chunks, sizeof *p->chunks);
  if (!p || !p->chunks) {
    free(p);
    nas_errf(&ctx->err, "pipeline: out of memory");
    return NULL;
  }
  p->cfg = *cfg;
  p->world = rank->world;
  p->stage = rank->stage;
  p->stages = rank->stages;
  p->children = children;
  memcpy(p->balance, balance, sizeof balance);
  for (int s = 0; s < rank->stage; s++) p->first += balance[s];
  p->count = balance[rank->stage];
  int rc = collect_tensors(ctx, p);
  if (rc == NAS_OK &&
      !(p->skips = pipe_skips_new(ctx, children, (int)n, balance, rank->stages, rank->stage,
                                  cfg->chunks)))
    rc = NAS_ERR;
  if (rc == NAS_OK) rc = wgrads_init(ctx, p);
  schedule_init(p);
  if (rc == NAS_OK && cfg->deferred_batch_norm) {
    p->bn = pipe_bn_new(ctx, children + p->first, p->count);
    if (!p->bn) rc = NAS_ERR;
  }
  if (rc == NAS_OK) return p;
  tr_pipe_free(p);
  return NULL;
}

static void chunk_clear(pipe_chunk *c) {
  tr_release(c->input);
  tr_release(c->output);
  c->input = c->output = NULL;
}

void tr_pipe_free(tr_pipe *p) {
  if (!p) return;
  for (int i = 0; i < p->cfg.chunks; i++) chunk_clear(&p->chunks[i]);
  free(p->chunks);
  tr_wgrads_free(p->wgrads);
  pipe_bn_free(p->bn);
  pipe_skips_free(p->skips);
  tr_param_list_free(&p->params);
  tr_param_list_free(&p->state);
  free(p);
}

void tr_pipe_layers(const tr_pipe *p, int *first, int *count) {
  *first = p->first;
  *count = p->count;
}

/* ---------------------------------------------------------------- one micro-batch */

/* What a train step's micro-batches share. */
typedef struct {
  tr_tensor *x; /* borrowed: stage 0's mini-batch */
  int64_t batch;
  tr_pipe_loss_fn loss_fn;
  void *loss_arg;
  double loss; /* the last stage: the weighted losses so far */
} pipe_step;

static bool is_last(const tr_pipe *p) { return p->stage == p->stages - 1; }

static bool is_checkpointed(const tr_pipe *p, int i) {
  switch (p->cfg.checkpoint) {
  case TR_PIPE_CKPT_ALWAYS: return true;
  case TR_PIPE_CKPT_EXCEPT_LAST: return i < p->cfg.chunks - 1;
  case TR_PIPE_CKPT_NEVER: break;
  }
  return false;
}

/* The stage's children on x (borrowed); deferred batch norm adds up its statistics when
 * tracking (forwards do, recomputations not). */
static tr_tensor *stage_run(tr_ctx *ctx, tr_pipe *p, tr_tensor *x, bool tracking) {
  tr_tensor *cur = tr_retain(x);
  if (p->bn) pipe_bn_track(p->bn, tracking);
  for (int k = 0; k < p->count && cur; k++) {
    tr_tensor *next = tr_module_forward(ctx, p->children[p->first + k], cur);
    tr_release(cur);
    cur = next;
  }
  if (p->bn) pipe_bn_track(p->bn, false);
  return cur;
}

/* The last stage: the micro-batch's loss weighted by its share of the mini-batch (owned). */
static tr_tensor *weighted_loss(tr_ctx *ctx, const pipe_step *step, const pipe_chunk *c,
                                tr_tensor *out) {
  tr_tensor *loss = step->loss_fn(ctx, out, c->start, c->count, step->loss_arg);
  if (!loss) return NULL;
  if (loss->numel != 1) {
    tr_release(loss);
    return tr_fail(ctx, "the loss of examples [%lld, %lld) has %lld elements, not one",
                   (long long)c->start, (long long)(c->start + c->count),
                   (long long)loss->numel);
  }
  tr_tensor *weighted = tr_scale(ctx, loss, (double)c->count / (double)step->batch);
  tr_release(loss);
  return weighted;
}

/* Micro-batch i's input: stage 0's slice of x on the stage's device, or what stage s-1
 * sent (owned). */
static tr_tensor *chunk_input(tr_ctx *ctx, tr_pipe *p, const pipe_step *step, int i) {
  const pipe_chunk *c = &p->chunks[i];
  if (p->stage == 0) {
    tr_tensor *slice = tr_narrow(ctx, step->x, 0, c->start, c->count);
    if (!slice || tr_tensor_device(slice).kind == p->device.kind) return slice;
    tr_tensor *moved = tr_to_device(ctx, slice, p->device);
    tr_release(slice);
    return moved;
  }
  char what[64];
  snprintf(what, sizeof what, "the activation of micro-batch %d", i);
  return pw_recv(ctx, p->world, p->stage - 1, p->stage, what);
}

/* The stage output of a micro-batch (owned): sent on, or turned into its loss. */
static int chunk_deliver(tr_ctx *ctx, tr_pipe *p, pipe_step *step, pipe_chunk *c,
                         tr_tensor *out, bool keep) {
  if (!is_last(p)) {
    if (keep) c->output = tr_retain(out);
    return pw_send(ctx, p->world, p->stage, p->stage + 1, out);
  }
  tr_tensor *loss = weighted_loss(ctx, step, c, out);
  if (!loss) return NAS_ERR;
  step->loss += tr_item(loss);
  if (keep)
    c->output = loss;
  else
    tr_release(loss);
  return NAS_OK;
}

static int chunk_forward(tr_ctx *ctx, tr_pipe *p, pipe_step *step, int i) {
  pipe_chunk *c = &p->chunks[i];
  tr_tensor *in = chunk_input(ctx, p, step, i);
  c->input = in ? tr_detach(ctx, in) : NULL;
  tr_release(in);
  if (!c->input) return NAS_ERR;
  c->input->requires_grad = p->stage > 0;
  if (pipe_skips_recv(ctx, p->skips, p->world, i)) return NAS_ERR;
  memcpy(c->rng, ctx->rng, sizeof c->rng);
  bool keep = !is_checkpointed(p, i);
  bool prev = tr_set_grad_enabled(ctx, keep);
  pipe_skips_load(p->skips, i);
  tr_tensor *out = stage_run(ctx, p, c->input, true);
  int rc = out ? chunk_deliver(ctx, p, step, c, out, keep) : NAS_ERR;
  if (rc == NAS_OK) rc = pipe_skips_take(ctx, p->skips, p->world, i, true, keep);
  /* a checkpointed micro-batch keeps no carried skip: the recomputation receives it again */
  if (!keep) pipe_skips_clear(p->skips, i);
  tr_set_grad_enabled(ctx, prev);
  tr_release(out);
  /* deferred batch norm moves the running statistics once the mini-batch's forwards ran;
   * backwards never read them (a recomputation puts back what it changes) */
  if (rc == NAS_OK && p->bn && i == p->cfg.chunks - 1) rc = pipe_bn_end(ctx, p->bn);
  return rc;
}

int pipe_buffers_save(tr_ctx *ctx, const tr_param_list *state, tr_tensor **saved) {
  for (size_t i = 0; i < state->n; i++) {
    tr_tensor *t = state->items[i];
    if (t->requires_grad) continue;
    saved[i] = tn_clone(ctx, t);
    if (!saved[i]) return NAS_ERR;
  }
  return NAS_OK;
}

int pipe_buffers_restore(tr_ctx *ctx, const tr_param_list *state, tr_tensor **saved) {
  int rc = NAS_OK;
  for (size_t i = 0; i < state->n; i++) {
    if (!saved[i]) continue;
    if (rc == NAS_OK) rc = pipe_copy_values(ctx, state->items[i], saved[i]);
    tr_release(saved[i]);
    saved[i] = NULL;
  }
  return rc;
}

int pipe_copy_values(tr_ctx *ctx, tr_tensor *dst, const tr_tensor *src) {
  if (!tn_on_cuda(dst)) {
    tn_copy_to_contig(src, tr_data(dst));
    return NAS_OK;
  }
  return tc_copy_raw(ctx, dst, src);
}

tr_tensor *pipe_zeros_like(tr_ctx *ctx, const tr_tensor *t) {
  if (!tn_on_cuda(t)) return tr_zeros(ctx, t->dtype, t->ndim, t->shape);
  tr_tensor *z = tc_empty_like(ctx, t);
  if (z && tr_fill_(ctx, z, 0) != NAS_OK) {
    tr_release(z);
    return NULL;
  }
  return z;
}

/* A checkpointed micro-batch's forward again, with grad and its generator state, its
 * skips received and sent again as in the forward; the output with its graph (the last
 * stage: the weighted loss), owned. */
static tr_tensor *chunk_recompute(tr_ctx *ctx, tr_pipe *p, const pipe_step *step, int i) {
  pipe_chunk *c = &p->chunks[i];
  tr_tensor **saved = calloc(p->state.n ? p->state.n : 1, sizeof *saved);
  if (!saved) return tr_fail(ctx, "pipeline: out of memory");
  uint64_t now[4];
  memcpy(now, ctx->rng, sizeof now);
  memcpy(ctx->rng, c->rng, sizeof now);
  bool prev = tr_set_grad_enabled(ctx, true);
  tr_tensor *out = NULL;
  if (pipe_skips_recv(ctx, p->skips, p->world, i) == NAS_OK &&
      pipe_buffers_save(ctx, &p->state, saved) == NAS_OK) {
    pipe_skips_load(p->skips, i);
    out = stage_run(ctx, p, c->input, false);
  }
  if (out && pipe_skips_take(ctx, p->skips, p->world, i, true, true)) {
    tr_release(out);
    out = NULL;
  }
  if (out && is_last(p)) {
    tr_tensor *loss = weighted_loss(ctx, step, c, out);
    tr_release(out);
    out = loss;
  }
  tr_set_grad_enabled(ctx, prev);
  memcpy(ctx->rng, now, sizeof now);
  if (pipe_buffers_restore(ctx, &p->state, saved) != NAS_OK) {
    tr_release(out);
    out = NULL;
  }
  free(saved);
  return out;
}

/* Sends the gradient of micro-batch i's input back to stage s-1 (zeros when the stage's
 * output does not depend on it). */
static int send_input_grad(tr_ctx *ctx, tr_pipe *p, pipe_chunk *c) {
  tr_tensor *grad = c->input->grad ? tr_retain(c->input->grad) : pipe_zeros_like(ctx, c->input);
  int rc = grad ? pw_send(ctx, p->world, p->stage, p->stage - 1, grad) : NAS_ERR;
  tr_release(grad);
  return rc;
}

/* After the backward of micro-batch i on stage s, the weight gradients put off until now:
 * fill-drain (backwards from the last micro-batch to the first), those of the backward of
 * micro-batch i + s and before, so the last s micro-batches' fill the drain; one forward
 * one backward, those of micro-batch i - 1, so the input gradient of micro-batch i went
 * out without waiting for them and the queue holds at most two micro-batches'. */
static int wgrads_catch_up(tr_ctx *ctx, tr_pipe *p, int i) {
  if (!p->wgrads) return NAS_OK;
  p->chunks[i].wgrad_mark = tr_wgrads_queued(p->wgrads);
  int due = p->interleaved ? i - 1 : i + p->stage;
  return due >= 0 && due < p->cfg.chunks
             ? tr_wgrads_run(ctx, p->wgrads, p->chunks[due].wgrad_mark)
             : NAS_OK;
}

static int chunk_backward(tr_ctx *ctx, tr_pipe *p, const pipe_step *step, int i) {
  pipe_chunk *c = &p->chunks[i];
  tr_tensor *out = c->output ? tr_retain(c->output) : chunk_recompute(ctx, p, step, i);
  tr_tensor *grad = NULL;
  int rc = out ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && !is_last(p)) {
    char what[64];
    snprintf(what, sizeof what, "the gradient of micro-batch %d", i);
    grad = pw_recv(ctx, p->world, p->stage + 1, p->stage, what);
    if (!grad) rc = NAS_ERR;
  }
  tr_wgrad_queue *caller_wgrads = ctx->wgrads;
  ctx->wgrads = p->wgrads;
  if (rc == NAS_OK) rc = pipe_skips_backward(ctx, p->skips, p->world, i);
  /* a stage of parameterless children on the mini-batch itself has nothing to run back */
  if (rc == NAS_OK && out->grad_fn) rc = tr_backward(ctx, out, grad, false);
  ctx->wgrads = caller_wgrads;
  if (rc == NAS_OK && p->stage > 0) rc = send_input_grad(ctx, p, c);
  if (rc == NAS_OK) rc = pipe_skips_send_grads(ctx, p->skips, p->world, i);
  if (rc == NAS_OK) rc = wgrads_catch_up(ctx, p, i);
  tr_release(out);
  tr_release(grad);
  chunk_clear(c);
  pipe_skips_clear(p->skips, i);
  return rc;
}

/* ---------------------------------------------------------------- the mini-batch */

static int check_step(tr_ctx *ctx, const tr_pipe *p, const pipe_step *step) {
  if (step->batch < p->cfg.chunks)
    return nas_errf(&ctx->err, "a mini-batch of %lld examples cannot make %d micro-batches",
                    (long long)step->batch, p->cfg.chunks);
  if (p->stage == 0 && (!step->x || step->x->ndim < 1 || step->x->shape[0] != step->batch))
    return nas_errf(&ctx->err, "stage 0 needs the mini-batch x with %lld examples",
                    (long long)step->batch);
  if (is_last(p) && !step->loss_fn) return nas_errf(&ctx->err, "the last stage needs a loss");
  return NAS_OK;
}

/* GPipe's fill-drain: every forward in order, then every backward in reverse. */
static int fill_drain(tr_ctx *ctx, tr_pipe *p, pipe_step *step) {
  int m = p->cfg.chunks, rc = NAS_OK;
  for (int i = 0; i < m && rc == NAS_OK; i++) rc = chunk_forward(ctx, p, step, i);
  for (int i = m - 1; i >= 0 && rc == NAS_OK; i--) rc = chunk_backward(ctx, p, step, i);
  return rc;
}

/* One forward one backward (1F1B): stage s runs the forwards of `ahead` micro-batches,
 * then the backward of micro-batch 0, 1, ... each followed by the next forward while any
 * is left. The last stage runs one ahead: each micro-batch's backward right after its
 * forward. Stage s < S - 1 runs S - s + 1 ahead, one more than 1F1B's S - s: stage s + 1
 * adds a micro-batch's weight gradients only after its next backward (wgrads_catch_up),
 * so its first two turns are short, and the extra input keeps it from waiting then. So
 * stage s holds at most S - s + 1 micro-batches' graphs, not M. Each stage's forwards run
 * in the order fill-drain runs them (the same generator draws, running statistics and
 * loss sum); its backwards run in micro-batch order on every stage, so each pair of
 * stages still sees its messages in the order they were sent (activations and skips in
 * forwards, gradients in backwards), and a backward waits only for stages downstream,
 * which have run that micro-batch's forward. */
static int one_forward_one_backward(tr_ctx *ctx, tr_pipe *p, pipe_step *step) {
  int m = p->cfg.chunks, ahead = is_last(p) ? 1 : p->stages - p->stage + 1;
  int next = 0, rc = NAS_OK;
  for (; next < m && next < ahead && rc == NAS_OK; next++) rc = chunk_forward(ctx, p, step, next);
  for (int i = 0; i < m && rc == NAS_OK; i++) {
    rc = chunk_backward(ctx, p, step, i);
    if (rc == NAS_OK && next < m) rc = chunk_forward(ctx, p, step, next++);
  }
  return rc;
}

static int run_schedule(tr_ctx *ctx, tr_pipe *p, pipe_step *step) {
  int m = p->cfg.chunks;
  for (int i = 0; i < m; i++) {
    p->chunks[i].start = step->batch * i / m;
    p->chunks[i].count = step->batch * (i + 1) / m - p->chunks[i].start;
  }
  int rc = p->bn ? pipe_bn_begin(ctx, p->bn) : NAS_OK;
  if (rc == NAS_OK)
    rc = p->interleaved ? one_forward_one_backward(ctx, p, step) : fill_drain(ctx, p, step);
  if (rc == NAS_OK && p->wgrads) rc = tr_wgrads_run(ctx, p->wgrads, tr_wgrads_queued(p->wgrads));
  tr_wgrads_drop(p->wgrads);
  for (int i = 0; i < m; i++) {
    chunk_clear(&p->chunks[i]);
    pipe_skips_clear(p->skips, i);
  }
  return rc;
}

int tr_pipe_train_step(tr_ctx *ctx, tr_pipe *p, tr_tensor *x, int64_t batch,
                       tr_pipe_loss_fn loss_fn, void *loss_arg, double *loss) {
  pipe_step step = {.x = x, .batch = batch, .loss_fn = loss_fn, .loss_arg = loss_arg};
  if (check_step(ctx, p, &step) || run_schedule(ctx, p, &step))
    return pw_abort(p->world, p->stage, &ctx->err);
  double total = is_last(p) ? step.loss : 0.0;
  if (pw_step_end(p->world, p->stage, &total, &ctx->err)) return NAS_ERR;
  if (loss) *loss = total;
  return NAS_OK;
}

/* ---------------------------------------------------------------- parameters */

tr_optim *tr_pipe_optim_new(tr_ctx *ctx, tr_pipe *p, const tr_optim_config *cfg) {
  return tr_optim_new(ctx, cfg, p->params.items, p->params.n);
}

/* Stage 0: the tensors of stage s's children, received into its own model's copies. */
static int gather_stage(tr_ctx *ctx, tr_pipe *p, int s, int first) {
  tr_param_list list = {0};
  int rc = NAS_OK;
  for (int k = first; k < first + p->balance[s] && rc == NAS_OK; k++)
    rc = tr_module_parameters(p->children[k], true, &list, &ctx->err);
  bool prev = tr_set_grad_enabled(ctx, false);
  for (size_t i = 0; i < list.n && rc == NAS_OK; i++) {
    tr_tensor *t = pw_recv(ctx, p->world, s, 0, list.names[i]);
    rc = t ? tr_copy_(ctx, list.items[i], t) : NAS_ERR;
    tr_release(t);
  }
  tr_set_grad_enabled(ctx, prev);
  tr_param_list_free(&list);
  return rc;
}

int tr_pipe_gather_model(tr_ctx *ctx, tr_pipe *p) {
  int rc = NAS_OK;
  if (p->stage > 0) {
    for (size_t i = 0; i < p->state.n && rc == NAS_OK; i++)
      rc = pw_send(ctx, p->world, p->stage, 0, p->state.items[i]);
  } else {
    for (int s = 1, first = p->balance[0]; s < p->stages && rc == NAS_OK; first += p->balance[s++])
      rc = gather_stage(ctx, p, s, first);
  }
  if (rc != NAS_OK) return pw_abort(p->world, p->stage, &ctx->err);
  double none = 0;
  return pw_step_end(p->world, p->stage, &none, &ctx->err);
}

void tr_pipe_memory_stats(const tr_pipe *p, tr_ctx *ctx, tr_pipe_memory *out) {
  *out = (tr_pipe_memory){0};
  for (size_t i = 0; i < p->params.n; i++) out->params += p->params.items[i]->numel;
  if (p->device.kind == TR_CUDA && ctx->cuda) tr_cuda_memory_stats(ctx->cuda, &out->alloc);
  else if (ctx->alloc) tr_allocator_stats(ctx->alloc, &out->alloc);
}
