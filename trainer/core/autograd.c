/* autograd: backward nodes, saved variables and the engine that runs a graph backward.
 *
 * The words are PyTorch's. An op whose inputs need grad makes a tr_node; its next_edges
 * point at the nodes that made its inputs, or at a fresh AccumulateGrad node for a leaf that
 * requires grad (that node holds the leaf and adds into leaf->grad). The output tensor holds
 * its node (grad_fn); a node holds the nodes of its edges. References only point from later
 * to earlier, and saved tensors are detached aliases, so the graph has no cycles and goes
 * away with the last tensor that points into it.
 *
 * tr_backward counts, for every node reachable from the root, how many edges point at it;
 * a node runs once all its consumers have sent their gradient (a ready stack), so each runs
 * exactly once with the sum of what it received. Without retain_graph every node frees its
 * saved tensors and buffers as soon as it has run. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/core/internal.h"

/* ---------------------------------------------------------------- nodes */

/* AccumulateGrad: the end of every path, adding the arriving gradient into leaf->grad. */
typedef struct {
  tr_node base;
  tr_tensor *variable; /* the leaf (owned) */
} accumulate_node;

static int accumulate_apply(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **grad_in);
static const tr_node_ops accumulate_ops = {"AccumulateGrad", accumulate_apply,
                                           sizeof(accumulate_node), NULL};

static void node_release_saved(tr_node *node) {
  for (tr_saved *s = node->saved; s; s = s->next) {
    tr_release(s->t);
    s->t = NULL;
  }
  if (node->ops->release_variables && !node->released) node->ops->release_variables(node);
  node->released = true;
}

static void node_free(tr_node *node) {
  node_release_saved(node);
  if (node->ops == &accumulate_ops) tr_release(((accumulate_node *)node)->variable);
  tr_release(node->grad_buf);
  free(node->next_edges);
  free(node);
}

/* Frees node and every node only it kept alive, without recursion (graphs can be deep). */
void ag_node_release(tr_node *node) {
  if (!node || --node->refs > 0) return;
  size_t len = 0, cap = 0;
  tr_node **stack = NULL;
  for (tr_node *cur = node; cur; cur = len ? stack[--len] : NULL) {
    for (int i = 0; i < cur->n_next; i++) {
      tr_node *fn = cur->next_edges[i].fn;
      if (!fn || --fn->refs > 0) continue;
      if (len == cap) {
        size_t ncap = cap ? cap * 2 : 16;
        tr_node **grown = realloc(stack, ncap * sizeof *grown);
        if (!grown) { /* no memory for the worklist: recursion still frees everything */
          fn->refs = 1;
          ag_node_release(fn);
          continue;
        }
        stack = grown;
        cap = ncap;
      }
      stack[len++] = fn;
    }
    node_free(cur);
  }
  free(stack);
}

static tr_node *node_new(tr_ctx *ctx, const tr_node_ops *ops, int n_next) {
  assert(ops->size == 0 || ops->size >= sizeof(tr_node));
  tr_node *node = calloc(1, ops->size ? ops->size : sizeof(tr_node));
  tr_edge *edges = n_next ? calloc((size_t)n_next, sizeof *edges) : NULL;
  if (!node || (n_next && !edges)) {
    free(node);
    free(edges);
    tr_fail(ctx, "autograd: out of memory");
    return NULL;
  }
  node->refs = 1;
  node->ops = ops;
  node->n_next = n_next;
  node->next_edges = edges;
  return node;
}

static int accumulate_apply(tr_ctx *ctx, tr_node *node, tr_tensor *g, tr_tensor **grad_in) {
  (void)grad_in;
  tr_tensor *leaf = ((accumulate_node *)node)->variable;
  if (leaf->grad) return tn_add(ctx, leaf->grad, g, 1.0);
  /* A buffer nobody else sees becomes the grad; a shared one is copied. */
  leaf->grad = tn_is_private(g) ? tr_retain(g) : tn_clone(ctx, g);
  return leaf->grad ? NAS_OK : NAS_ERR;
}

tr_tensor *ag_accumulator(const tr_node *node, int i, tr_dtype dtype, int64_t numel,
                          const tr_tensor *const *reads, int n_reads) {
  const tr_node *fn = node->next_edges[i].fn;
  if (!fn || fn->ops != &accumulate_ops) return NULL;
  tr_tensor *grad = ((const accumulate_node *)fn)->variable->grad;
  if (!grad || tn_on_cuda(grad) || !tr_is_contiguous(grad) || grad->dtype != dtype ||
      grad->numel != numel)
    return NULL;
  for (int r = 0; r < n_reads; r++)
    if (reads[r]->storage == grad->storage) return NULL;
  return grad;
}

bool ag_needs_grad(const tr_ctx *ctx, int n, tr_tensor *const *inputs) {
  if (!ctx->grad_enabled) return false;
  for (int i = 0; i < n; i++)
    if (inputs[i] && inputs[i]->requires_grad) return true;
  return false;
}

/* The edge of node's input t: t's node, or a new AccumulateGrad node for a leaf. */
static int edge_to(tr_ctx *ctx, tr_tensor *t, tr_edge *edge) {
  if (t->grad_fn) {
    edge->fn = t->grad_fn;
    t->grad_fn->refs++;
    return NAS_OK;
  }
  accumulate_node *acc = (accumulate_node *)node_new(ctx, &accumulate_ops, 0);
  if (!acc) return NAS_ERR;
  acc->variable = tr_retain(t);
  edge->fn = &acc->base;
  return NAS_OK;
}

void *ag_record(tr_ctx *ctx, const tr_node_ops *ops, int n, tr_tensor *const *inputs,
                tr_tensor *out, int *rc) {
  if (*rc != NAS_OK || !ag_needs_grad(ctx, n, inputs)) return NULL;
  tr_node *node = node_new(ctx, ops, n);
  if (!node) {
    *rc = NAS_ERR;
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    tr_tensor *t = inputs[i];
    if (!t) continue;
    if (i < TR_MAX_META) node->in_meta[i] = tn_meta(t);
    if (t->requires_grad && edge_to(ctx, t, &node->next_edges[i])) {
      ag_node_release(node);
      *rc = NAS_ERR;
      return NULL;
    }
  }
  ag_node_release(out->grad_fn);
  out->grad_fn = node;
  out->requires_grad = true;
  return node;
}

int ag_save(tr_ctx *ctx, tr_node *node, tr_saved *slot, tr_tensor *t) {
  assert(!slot->t);
  tr_tensor *alias = tn_alias(ctx, t);
  if (!alias) return NAS_ERR;
  slot->t = alias;
  slot->version = t->storage->version;
  slot->next = node->saved;
  node->saved = slot;
  return NAS_OK;
}

int ag_live(tr_ctx *ctx, const tr_node *node) {
  if (!node->released) return NAS_OK;
  return nas_errf(&ctx->err,
                  "%s: trying to backward through the graph a second time (its saved "
                  "tensors were freed by the first backward; pass retain_graph)",
                  node->ops->name);
}

tr_tensor *ag_saved(tr_ctx *ctx, tr_node *node, const tr_saved *slot) {
  if (ag_live(ctx, node)) return NULL;
  if (slot->t->storage->version != slot->version)
    return tr_fail(ctx,
                   "%s: a saved tensor was modified by an in-place operation after it was "
                   "saved (version %llu now, %llu when saved); its gradient would be wrong",
                   node->ops->name, (unsigned long long)slot->t->storage->version,
                   (unsigned long long)slot->version);
  return slot->t;
}

tr_tensor *ag_output(tr_tensor *out, int rc) {
  if (rc == NAS_OK) return out;
  tr_release(out);
  return NULL;
}

const char *tr_grad_fn_name(const tr_tensor *t) {
  return t->grad_fn ? t->grad_fn->ops->name : NULL;
}

void tr_zero_grad(tr_tensor *t) {
  if (t->grad) tn_fill(t->grad, 0.0);
}

/* ---------------------------------------------------------------- engine */

typedef struct {
  tr_node **items;
  size_t n, cap;
} node_vec;

static int vec_push(tr_ctx *ctx, node_vec *v, tr_node *node) {
  if (v->n == v->cap) {
    size_t ncap = v->cap ? v->cap * 2 : 64;
    tr_node **grown = realloc(v->items, ncap * sizeof *grown);
    if (!grown) return nas_errf(&ctx->err, "backward: out of memory");
    v->items = grown;
    v->cap = ncap;
  }
  v->items[v->n++] = node;
  return NAS_OK;
}

/* Every node reachable from root into *all, with deps = edges pointing at it. */
static int collect_graph(tr_ctx *ctx, tr_node *root, node_vec *all) {
  uint64_t mark = ++ctx->epoch;
  root->mark = mark;
  root->deps = 0;
  if (vec_push(ctx, all, root)) return NAS_ERR;
  for (size_t i = 0; i < all->n; i++) {
    tr_node *node = all->items[i];
    for (int e = 0; e < node->n_next; e++) {
      tr_node *fn = node->next_edges[e].fn;
      if (!fn) continue;
      if (fn->mark != mark) {
        fn->mark = mark;
        fn->deps = 0;
        if (vec_push(ctx, all, fn)) return NAS_ERR;
      }
      fn->deps++;
    }
  }
  return NAS_OK;
}

/* Runs node on its buffered gradient and hands the results to its edges. */
static int run_node(tr_ctx *ctx, tr_node *node, bool retain_graph, node_vec *ready) {
  /* also a node that saved nothing: running it again would add its gradients twice */
  if (node->ops != &accumulate_ops && ag_live(ctx, node)) return NAS_ERR;
  int rc = NAS_OK;
  tr_tensor **grad_in = NULL;
  if (node->grad_buf) {
    grad_in = node->n_next ? calloc((size_t)node->n_next, sizeof *grad_in) : NULL;
    if (node->n_next && !grad_in) return nas_errf(&ctx->err, "backward: out of memory");
    rc = node->ops->apply(ctx, node, node->grad_buf, grad_in);
    tr_release(node->grad_buf);
    node->grad_buf = NULL;
  }
  if (!retain_graph && node->ops != &accumulate_ops) node_release_saved(node);
  for (int e = 0; e < node->n_next; e++) {
    tr_node *fn = node->next_edges[e].fn;
    tr_tensor *g = grad_in ? grad_in[e] : NULL;
    if (!fn) {
      tr_release(g);
      continue;
    }
    if (g && rc == NAS_OK)
      rc = tn_accumulate(ctx, &fn->grad_buf, g);
    else
      tr_release(g);
    if (--fn->deps == 0 && rc == NAS_OK) rc = vec_push(ctx, ready, fn);
  }
  free(grad_in);
  return rc;
}

static tr_tensor *initial_grad(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad) {
  if (tn_on_cuda(root)) return tn_device_of(root)->initial_grad(ctx, root, grad);
  if (grad) {
    if (grad->numel != root->numel || grad->dtype != root->dtype)
      return tr_fail(ctx, "backward: gradient has %lld elements for a tensor of %lld",
                     (long long)grad->numel, (long long)root->numel);
    return tn_contig(ctx, grad);
  }
  if (root->numel != 1)
    return tr_fail(ctx,
                   "backward: a gradient is needed for a tensor of %lld elements "
                   "(only one-element outputs get 1 implicitly)",
                   (long long)root->numel);
  return tr_full(ctx, root->dtype, root->ndim, root->shape, 1.0);
}

int tr_backward(tr_ctx *ctx, tr_tensor *root, tr_tensor *grad, bool retain_graph) {
  if (!root->requires_grad)
    return nas_errf(&ctx->err, "backward: the tensor does not require grad and has no grad_fn");
  /* as many elements in another shape would reach the leaves as gradients of that shape */
  if (grad && !tr_same_shape(grad, root))
    return nas_errf(&ctx->err, "backward: the gradient's shape (%d dims) is not the tensor's "
                               "(%d dims, same sizes expected)", grad->ndim, root->ndim);
  tr_tensor *g0 = initial_grad(ctx, root, grad);
  if (!g0) return NAS_ERR;
  if (!root->grad_fn) { /* a leaf: its gradient is g0 itself */
    accumulate_node leaf_node = {.variable = root};
    int rc = accumulate_apply(ctx, &leaf_node.base, g0, NULL);
    tr_release(g0);
    return rc;
  }
  node_vec all = {0}, ready = {0};
  /* Backward computes plain tensors: no graph of the backward itself. */
  bool prev_grad = tr_set_grad_enabled(ctx, false);
  int rc = collect_graph(ctx, root->grad_fn, &all);
  if (rc == NAS_OK) {
    root->grad_fn->grad_buf = g0;
    g0 = NULL;
    rc = vec_push(ctx, &ready, root->grad_fn);
  }
  while (rc == NAS_OK && ready.n > 0)
    rc = run_node(ctx, ready.items[--ready.n], retain_graph, &ready);
  /* After a failure some nodes still hold gradients that will never be used. */
  for (size_t i = 0; i < all.n; i++) {
    tr_release(all.items[i]->grad_buf);
    all.items[i]->grad_buf = NULL;
  }
  tr_release(g0);
  free(all.items);
  free(ready.items);
  tr_set_grad_enabled(ctx, prev_grad);
  return rc;
}
