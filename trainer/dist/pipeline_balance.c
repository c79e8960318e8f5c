/* pipeline_balance: how many of a model's children each pipeline stage gets — the cut of a
 * sequence of costs into consecutive runs that minimises the largest run (the linear
 * partition problem, by dynamic programming), with costs measured per child: forward and
 * backward time on a sample batch (torchgpipe's balance_by_time) or bytes of parameters,
 * their gradients and the output activation (its balance_by_size, counted rather than
 * measured on a device; a skip connection's carried tensor counts on its pop). Measuring
 * leaves the model as it was: gradients dropped, batch norm's running statistics put back,
 * skip connections' slots emptied. A model on a CUDA device is measured there (sample on
 * the same device), its times with the device's queue drained before each clock read. */
#include <float.h>
#include <stdlib.h>

#include "trainer/dist/pipeline_internal.h"

/* best[j * (n + 1) + i]: the smallest largest run when the first i costs make j stages;
 * cut[...]: where the last of those stages starts. */
int tr_pipe_balance_costs(const double *costs, int n, int stages, int *balance, nas_err *err) {
  if (stages < 1 || stages > TR_PIPE_MAX_STAGES || stages > n)
    return nas_errf(err, "pipeline balance: %d stages for %d children (1 to %d stages, at "
                    "most one per child)", stages, n, TR_PIPE_MAX_STAGES);
  size_t width = (size_t)n + 1;
  double *prefix = calloc(width, sizeof *prefix);
  double *best = malloc((size_t)(stages + 1) * width * sizeof *best);
  int *cut = calloc((size_t)(stages + 1) * width, sizeof *cut);
  if (!prefix || !best || !cut) {
    free(prefix), free(best), free(cut);
    return nas_errf(err, "pipeline balance: out of memory");
  }
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + costs[i];
  for (size_t i = 0; i < (size_t)(stages + 1) * width; i++) best[i] = DBL_MAX;
  best[0] = 0;
  for (int j = 1; j <= stages; j++) {
    for (int i = j; i <= n; i++) {
      for (int c = j - 1; c < i; c++) { /* the last stage is children [c, i) */
        double prev = best[(size_t)(j - 1) * width + (size_t)c];
        if (prev == DBL_MAX) continue;
        double run = prefix[i] - prefix[c];
        double worst = prev > run ? prev : run;
        if (worst < best[(size_t)j * width + (size_t)i]) {
          best[(size_t)j * width + (size_t)i] = worst;
          cut[(size_t)j * width + (size_t)i] = c;
        }
      }
    }
  }
  for (int j = stages, i = n; j >= 1; j--) {
    int c = cut[(size_t)j * width + (size_t)i];
    balance[j - 1] = i - c;
    i = c;
  }
  free(prefix);
  free(best);
  free(cut);
  return NAS_OK;
}

/* ---------------------------------------------------------------- measured costs */

static int children_of(tr_ctx *ctx, tr_module *model, tr_module *const **children, int *n) {
  size_t count = 0;
  *children = tn_module_children(model, &count);
  if (count == 0)
    return nas_errf(&ctx->err, "pipeline balance: the model must be a Sequential with children");
  *n = (int)count;
  return NAS_OK;
}

/* The monotonic clock once the work queued on ctx's device, if any, is done. */
static int clock_after_device(tr_ctx *ctx, double *now) {
  int rc = ctx->cuda ? tr_cuda_sync(ctx->cuda, &ctx->err) : NAS_OK;
  *now = nas_monotonic();
  return rc;
}

/* Seconds of child's forward on x and backward from ones into its input and parameters;
 * *out gets its output (owned, no history). */
static int time_child(tr_ctx *ctx, tr_module *child, tr_tensor *x, double *seconds,
                      tr_tensor **out) {
  tr_tensor *in = tr_detach(ctx, x);
  if (!in) return NAS_ERR;
  in->requires_grad = true;
  double start, end = 0;
  int rc = clock_after_device(ctx, &start);
  tr_tensor *y = rc == NAS_OK ? tr_module_forward(ctx, child, in) : NULL;
  /* on the host: a backward on a device takes its seed from there too */
  tr_tensor *ones = y ? tr_full(ctx, y->dtype, y->ndim, y->shape, 1.0) : NULL;
  rc = ones ? NAS_OK : NAS_ERR;
  if (rc == NAS_OK && y->grad_fn) rc = tr_backward(ctx, y, ones, false);
  if (rc == NAS_OK) rc = clock_after_device(ctx, &end);
  *seconds = end - start;
  *out = rc == NAS_OK ? tr_detach(ctx, y) : NULL;
  tr_release(ones);
  tr_release(y);
  tr_release(in);
  return *out ? NAS_OK : NAS_ERR;
}

/* Each child's best time over repeats of forward and backward, along the sample's way. */
static int measure_times(tr_ctx *ctx, tr_module *const *children, int n, tr_tensor *sample,
                         int repeats, double *costs) {
  tr_tensor *cur = tr_retain(sample);
  bool prev = tr_set_grad_enabled(ctx, true);
  int rc = NAS_OK;
  for (int k = 0; k < n && rc == NAS_OK; k++) {
    tr_tensor *next = NULL;
    costs[k] = DBL_MAX;
    /* a pop takes what its stash kept: every repeat gets it back */
    tr_tensor **slot = tn_module_skip(children[k], NULL);
    tr_tensor *kept = slot ? tr_retain(*slot) : NULL;
    for (int r = 0; r < repeats && rc == NAS_OK; r++) {
      double seconds;
      tr_release(next);
      if (slot && !*slot) *slot = tr_retain(kept);
      rc = time_child(ctx, children[k], cur, &seconds, &next);
      if (rc == NAS_OK && seconds < costs[k]) costs[k] = seconds;
    }
    tr_release(kept);
    tr_release(cur);
    cur = next;
  }
  tr_set_grad_enabled(ctx, prev);
  tr_release(cur);
  /* measuring left gradients behind: the model is as it was */
  for (int k = 0; k < n; k++) {
    tr_param_list ps = {0};
    if (tr_module_parameters(children[k], false, &ps, NULL) == NAS_OK)
      for (size_t i = 0; i < ps.n; i++) {
        tr_release(ps.items[i]->grad);
        ps.items[i]->grad = NULL;
      }
    tr_param_list_free(&ps);
  }
  return rc;
}

/* Bytes of the tensor a skip connection's pop finds kept (0 for other children): what a
 * pipeline carries to the pop's stage and holds there. */
static double carried_bytes(tr_module *child) {
  bool stashes;
  tr_tensor **slot = tn_module_skip(child, &stashes);
  if (!slot || stashes || !*slot) return 0;
  return (double)(*slot)->numel * (double)tr_dtype_size((*slot)->dtype);
}

/* Drops what measuring left in the skip connections' slots. */
static void skips_empty(tr_module *const *children, int n) {
  for (int k = 0; k < n; k++) {
    tr_tensor **slot = tn_module_skip(children[k], NULL);
    if (!slot) continue;
    tr_release(*slot);
    *slot = NULL;
  }
}

/* Bytes of each child's parameters and gradients and of its output on the sample; a pop's
 * adds the tensor its stash kept, which a pipeline carries to the pop's stage and holds
 * there until the backward (or, for a checkpointed micro-batch, during its run). */
static int measure_sizes(tr_ctx *ctx, tr_module *const *children, int n, tr_tensor *sample,
                         double *costs) {
  tr_tensor *cur = tr_retain(sample);
  bool prev = tr_set_grad_enabled(ctx, false);
  for (int k = 0; k < n && cur; k++) {
    double carried = carried_bytes(children[k]);
    tr_tensor *next = tr_module_forward(ctx, children[k], cur);
    tr_release(cur);
    cur = next;
    size_t size = tr_dtype_size(sample->dtype);
    costs[k] = (double)(2 * tr_module_param_count(children[k]) * (int64_t)size) +
               (cur ? (double)cur->numel * (double)size : 0) + carried;
  }
  tr_set_grad_enabled(ctx, prev);
  int rc = cur ? NAS_OK : NAS_ERR;
  tr_release(cur);
  return rc;
}

typedef enum { BY_TIME, BY_SIZE } balance_kind;

static int balance_by(tr_ctx *ctx, balance_kind kind, tr_module *model, tr_tensor *sample,
                      int stages, int repeats, int *balance) {
  tr_module *const *children = NULL;
  int n = 0;
  if (children_of(ctx, model, &children, &n)) return NAS_ERR;
  if (!sample) return nas_errf(&ctx->err, "pipeline balance: no sample batch");
  /* measuring runs forwards: batch norm's running statistics go back as they were */
  tr_param_list state = {0};
  int rc = tr_module_parameters(model, true, &state, &ctx->err);
  double *costs = calloc((size_t)n, sizeof *costs);
  tr_tensor **saved = calloc(state.n ? state.n : 1, sizeof *saved);
  if (rc == NAS_OK && (!costs || !saved)) rc = nas_errf(&ctx->err, "out of memory");
  if (rc == NAS_OK) rc = pipe_buffers_save(ctx, &state, saved);
  if (rc == NAS_OK)
    rc = kind == BY_TIME ? measure_times(ctx, children, n, sample, repeats, costs)
                         : measure_sizes(ctx, children, n, sample, costs);
  if (saved && pipe_buffers_restore(ctx, &state, saved) != NAS_OK && rc == NAS_OK) rc = NAS_ERR;
  skips_empty(children, n);
  /* tr_pipe_balance_costs says "pipeline balance" itself */
  if (rc != NAS_OK) rc = nas_err_prefix(&ctx->err, "pipeline balance");
  else rc = tr_pipe_balance_costs(costs, n, stages, balance, &ctx->err);
  free(saved);
  free(costs);
  tr_param_list_free(&state);
  return rc;
}

int tr_pipe_balance_by_time(tr_ctx *ctx, tr_module *model, tr_tensor *sample, int stages,
                            int repeats, int *balance) {
  return balance_by(ctx, BY_TIME, model, sample, stages, repeats < 1 ? 1 : repeats, balance);
}

int tr_pipe_balance_by_size(tr_ctx *ctx, tr_module *model, tr_tensor *sample, int stages,
                            int *balance) {
  return balance_by(ctx, BY_SIZE, model, sample, stages, 0, balance);
}
