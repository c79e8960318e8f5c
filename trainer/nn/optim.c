/* optim: SGD (momentum, Nesterov, weight decay), Adam and AdamW; learning-rate schedules
 * (constant, step, cosine, one-cycle); gradient clipping by global norm; the training state
 * file that keeps an optimiser's state and the generator across a stop (docs/engine.md).
 *
 * The optimiser retains its parameters and keeps one state tensor per parameter and slot
 * (momentum buffer; Adam's first and second moments), made on the first step that sees a
 * gradient. Updates write the parameters in place and bump their version, so a graph that
 * saved a parameter before the step cannot silently run backward after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "trainer/core/internal.h"
#include "trainer/cuda/cuda_ops.h"
#include "trainer/nn/serial.h"

#define KERN_FILE "trainer/nn/kern_optim.h"
#include "trainer/core/kern_both.h"

struct tr_optim {
  tr_optim_config cfg;
  tr_tensor **params; /* owned references */
  tr_tensor **state;  /* 2 per parameter (momentum | m, v); owned, NULL until first used */
  int64_t *updates;   /* per parameter: the steps that updated it (it had a gradient), Adam's
                         t in its bias correction, as torch's per-parameter state['step'] */
  size_t n;
  int64_t steps; /* steps taken */
};

tr_optim *tr_optim_new(tr_ctx *ctx, const tr_optim_config *cfg, tr_tensor *const *params,
                       size_t n) {
  /* written so that NaN fails every test; momentum 1 or more grows the buffer forever */
  if (!(cfg->lr >= 0) || !(cfg->momentum >= 0 && cfg->momentum < 1) ||
      !(cfg->weight_decay >= 0) || (cfg->nesterov && cfg->momentum <= 0)) {
    tr_fail(ctx, "optim: lr %g, momentum %g, weight decay %g (lr and weight decay from 0, "
                 "momentum in [0, 1)%s)", cfg->lr, cfg->momentum, cfg->weight_decay,
            cfg->nesterov ? "; Nesterov needs momentum > 0" : "");
    return NULL;
  }
  /* 0 asks for the default; beta 1 divides by a zero bias correction */
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1) ||
      !(cfg->eps >= 0)) {
    tr_fail(ctx, "optim: beta1 %g, beta2 %g, eps %g (betas in [0, 1), eps from 0)", cfg->beta1,
            cfg->beta2, cfg->eps);
    return NULL;
  }
  tr_optim *opt = calloc(1, sizeof *opt);
  tr_tensor **ps = calloc(n ? n : 1, sizeof *ps), **st = calloc(2 * (n ? n : 1), sizeof *st);
  int64_t *updates = calloc(n ? n : 1, sizeof *updates);
  if (!opt || !ps || !st || !updates) {
    free(opt);
    free(ps);
    free(st);
    free(updates);
    tr_fail(ctx, "optim: out of memory");
    return NULL;
  }
  opt->cfg = *cfg;
  if (opt->cfg.beta1 == 0) opt->cfg.beta1 = 0.9;
  if (opt->cfg.beta2 == 0) opt->cfg.beta2 = 0.999;
  if (opt->cfg.eps == 0) opt->cfg.eps = 1e-8;
  for (size_t i = 0; i < n; i++) ps[i] = tr_retain(params[i]);
  opt->params = ps;
  opt->state = st;
  opt->updates = updates;
  opt->n = n;
  return opt;
}

void tr_optim_free(tr_optim *opt) {
  if (!opt) return;
  for (size_t i = 0; i < opt->n; i++) {
    tr_release(opt->params[i]);
    tr_release(opt->state[2 * i]);
    tr_release(opt->state[2 * i + 1]);
  }
  free(opt->params);
  free(opt->state);
  free(opt->updates);
  free(opt);
}

void tr_optim_set_lr(tr_optim *opt, double lr) { opt->cfg.lr = lr; }

void tr_optim_zero_grad(tr_optim *opt) {
  for (size_t i = 0; i < opt->n; i++) {
    tr_tensor *p = opt->params[i];
    if (p->grad && p->grad->refs == 1 && p->grad->storage->refs == 1) {
      /* a private grad is dropped: backward then hands over its own buffer, no zeroing
       * and no adding (torch's set_to_none) */
      tr_release(p->grad);
      p->grad = NULL;
    } else {
      tr_zero_grad(p);
    }
  }
}

/* State slot k of parameter i, zeroed on creation. */
static tr_tensor *state_of(tr_ctx *ctx, tr_optim *opt, size_t i, int k) {
  tr_tensor **slot = &opt->state[2 * i + (size_t)k];
  if (!*slot)
    *slot = tr_zeros(ctx, opt->params[i]->dtype, opt->params[i]->ndim, opt->params[i]->shape);
  return *slot;
}

/* Parameters of this many elements on are updated on the engine's pool: a hand-off costs
 * about a microsecond, SGD with momentum of a 256x128 weight several on one thread. At
 * TR_PAR_MIN (the OpenMP loops' bound, used here before) the MLP's 256x128 weight stayed
 * on the caller while the worker waited (perf: the caller did 3x the worker's updates). */
#define OPTIM_SPLIT_MIN 8192

/* One parameter's update (update_part's argument): the tensors' data, state NULL where
 * the method has none (SGD without momentum: both; SGD: v). */
typedef struct {
  const tr_optim_config *cfg;
  tr_dtype dtype;
  int64_t n;
  char *p, *m, *v;
  const char *g;
  double bc1, bc2;
} update_job;

/* Elements [lo, hi) of part `part`: the kernels update element by element. */
static void update_part(void *arg, int part, int parts) {
  const update_job *j = arg;
  const tr_optim_config *c = j->cfg;
  size_t at;
  int64_t lo, hi;
  tn_par_range(j->n, part, parts, &lo, &hi);
  if (hi <= lo) return;
  at = (size_t)lo * tr_dtype_size(j->dtype);
  if (c->kind == TR_SGD)
    TR_DISPATCH(j->dtype, sgd_update, j->p + at, j->g + at, j->m ? j->m + at : NULL, hi - lo, c->lr,
                c->momentum, c->weight_decay, c->nesterov);
  else
    TR_DISPATCH(j->dtype, adam_update, j->p + at, j->g + at, j->m + at, j->v + at, hi - lo, c->lr,
                c->beta1, c->beta2, c->eps, c->weight_decay, c->kind == TR_ADAMW, j->bc1, j->bc2);
}

/* Updates parameter i, its update number t (Adam's bias correction is 1 - beta^t). */
static int step_param(tr_ctx *ctx, tr_optim *opt, size_t i, int64_t t) {
  const tr_optim_config *c = &opt->cfg;
  double bc1 = 1 - pow(c->beta1, (double)t), bc2 = 1 - pow(c->beta2, (double)t);
  tr_tensor *p = opt->params[i], *g = p->grad;
  if (tn_on_cuda(p) || tn_on_cuda(g))
    return tc_optim_update(ctx, c, p, &opt->state[2 * i], bc1, bc2);
  if (!tr_is_contiguous(p) || !tr_is_contiguous(g) || g->dtype != p->dtype || g->numel != p->numel)
    return nas_errf(&ctx->err, "optim: parameter %zu and its grad must be contiguous and alike", i);
  bool adam = c->kind != TR_SGD, momentum = adam || c->momentum > 0;
  tr_tensor *m = momentum ? state_of(ctx, opt, i, 0) : NULL;
  tr_tensor *v = adam && m ? state_of(ctx, opt, i, 1) : NULL;
  if ((momentum && !m) || (adam && !v)) return NAS_ERR;
  update_job job = {c,          p->dtype, p->numel, tr_data(p), m ? tr_data(m) : NULL,
                    v ? tr_data(v) : NULL, tr_data(g), bc1, bc2};
  /* With the engine's own pool, parameters from OPTIM_SPLIT_MIN elements on are split over
   * it (the kernels' OpenMP loops then run on one thread); without, those loops use
   * OpenMP's threads. */
  tn_pool_run_from(ctx, p->numel, OPTIM_SPLIT_MIN, update_part, &job);
  p->storage->version++;
  return NAS_OK;
}

int tr_optim_step(tr_ctx *ctx, tr_optim *opt) {
  /* tr_optim_set_lr has no ctx to refuse a rate with: the step does, before changing anything */
  if (!(opt->cfg.lr >= 0))
    return nas_errf(&ctx->err, "optim: lr %g (from 0; a schedule's rate?)", opt->cfg.lr);
  opt->steps++;
  /* A parameter without a gradient (frozen, or in a branch this step did not use) is not
   * updated and does not count the step: its first update is its t = 1, as in torch. */
  for (size_t i = 0; i < opt->n; i++) {
    if (!opt->params[i]->grad) continue;
    if (step_param(ctx, opt, i, opt->updates[i] + 1)) return NAS_ERR;
    opt->updates[i]++;
  }
  return NAS_OK;
}

/* from + (to - from) along half a cosine, at fraction pct in [0, 1] of the way. */
static double cosine_between(double from, double to, double pct) {
  return to + (from - to) * 0.5 * (1 + cos(M_PI * pct));
}

/* PyTorch's OneCycleLR with its defaults (div_factor 25, final_div_factor 1e4, cos): the
 * rise ends at step warmup - 1, the fall at step warmup + total - 1. */
static double one_cycle_at(const tr_lr_schedule *s, int64_t step) {
  double start = s->base_lr / 25, end = start / 1e4;
  int64_t rise_end = s->warmup - 1;
  if (step <= rise_end)
    return cosine_between(start, s->base_lr, rise_end > 0 ? (double)step / (double)rise_end : 1);
  double pct = s->total > 0 ? (double)(step - rise_end) / (double)s->total : 1;
  return cosine_between(s->base_lr, end, pct < 1 ? pct : 1);
}

double tr_lr_at(const tr_lr_schedule *s, int64_t step) {
  if (s->kind == TR_LR_ONECYCLE) return one_cycle_at(s, step);
  if (s->warmup > 0 && step < s->warmup) return s->base_lr * (double)(step + 1) / (double)s->warmup;
  int64_t t = step - (s->warmup > 0 ? s->warmup : 0);
  switch (s->kind) {
  case TR_LR_STEP:
    return s->step_size > 0 ? s->base_lr * pow(s->gamma, (double)(t / s->step_size)) : s->base_lr;
  case TR_LR_COSINE:
    if (s->total <= 0 || t >= s->total) return s->min_lr;
    return cosine_between(s->base_lr, s->min_lr, (double)t / (double)s->total);
  case TR_LR_CONSTANT:
  case TR_LR_ONECYCLE: break;
  }
  return s->base_lr;
}

/* tr_clip_grad_norm on the host: returns the norm before. */
static double clip_host(tr_tensor *const *params, size_t n, double max_norm) {
  double sq = 0;
  for (size_t i = 0; i < n; i++)
    if (params[i]->grad) sq += tn_sumsq(params[i]->grad);
  double norm = sqrt(sq);
  if (norm > max_norm && norm > 0) {
    double scale = max_norm / (norm + 1e-6); /* torch's epsilon: the result stays just below */
    for (size_t i = 0; i < n; i++) {
      tr_tensor *g = params[i]->grad;
      if (!g) continue;
      if (tr_is_contiguous(g))
        tn_scale_contig(g, scale);
      else
        for (int64_t j = 0; j < g->numel; j++) tn_set(g, j, tr_get(g, j) * scale);
      g->storage->version++;
    }
  }
  return norm;
}

int tr_clip_grad_norm(tr_ctx *ctx, tr_tensor *const *params, size_t n, double max_norm,
                      double *norm) {
  /* a negative limit would turn every gradient around; NaN would clip nothing */
  if (!(max_norm >= 0))
    return nas_errf(&ctx->err, "clip_grad_norm: max norm %g (from 0)", max_norm);
  double before = tn_grads_on_cuda(params, n) ? tc_clip_grad_norm(params, n, max_norm)
                                              : clip_host(params, n, max_norm);
  if (norm) *norm = before;
  return NAS_OK;
}

/* ---------------------------------------------------------------- training state */

/* The file's layout (docs/engine.md, "Training state file"); version 1 had no part and
 * count of parts, and is read as the whole (part 0 of 1). */
enum { STATE_VERSION = 3, STATE_RNG_WORDS = 4 };
static const char *const kind_names[] = {"sgd", "adam", "adamw"};
/* What a state of single-process training is: its only part. */
static const tr_train_part whole_training = {0, 1, "part"};

/* State tensors per parameter the method keeps: SGD's momentum buffer, Adam's moments. */
static uint32_t slots_kept(const tr_optim_config *c) {
  return c->kind != TR_SGD ? 2 : c->momentum > 0 ? 1 : 0;
}

/* torch's names for them in an optimiser's state_dict, with the parameter's index. */
static void slot_name(const tr_optim *opt, size_t i, int k, char *name, size_t cap) {
  const char *slot = opt->cfg.kind == TR_SGD ? "momentum_buffer" : k == 0 ? "exp_avg" : "exp_avg_sq";
  snprintf(name, cap, "%zu.%s", i, slot);
}

/* Slot k of parameter i as a record: copied from its device, or zeros when no step has
 * made it yet (what state_of would make). */
static int put_slot(tr_ctx *ctx, ser_buf *b, tr_optim *opt, size_t i, int k, nas_err *err) {
  tr_tensor *s = opt->state[2 * i + (size_t)k], *p = opt->params[i];
  tr_tensor *host = !s ? tr_zeros(ctx, p->dtype, p->ndim, p->shape)
                    : tn_on_cuda(s) ? tr_to_device(ctx, s, TR_DEVICE_CPU) : tr_retain(s);
  if (!host) return nas_errf(err, "optimiser state %zu: %s", i, ctx->err.msg);
  char name[64];
  slot_name(opt, i, k, name, sizeof name);
  int rc = ser_put_tensor(b, name, host) ? nas_errf(err, "out of memory") : NAS_OK;
  tr_release(host);
  return rc;
}

int tr_train_state_save(tr_ctx *ctx, tr_optim *opt, const tr_train_part *part, const char *path,
                        nas_err *err) {
  if (!ser_host_is_little_endian())
    return nas_errf(err, "%s: training state files are little-endian only", path);
  if (!part) part = &whole_training;
  uint32_t slots = slots_kept(&opt->cfg);
  ser_buf b = {0};
  int rc = ser_put(&b, "NAST", 4) || ser_put_u32(&b, STATE_VERSION) ||
                   ser_put_u32(&b, (uint32_t)opt->cfg.kind) || ser_put_u32(&b, slots) ||
                   ser_put_u32(&b, (uint32_t)opt->n) || ser_put_u32(&b, (uint32_t)part->index) ||
                   ser_put_u32(&b, (uint32_t)part->count) || ser_put_i64(&b, opt->steps)
               ? nas_errf(err, "out of memory")
               : NAS_OK;
  for (int j = 0; j < STATE_RNG_WORDS && rc == NAS_OK; j++)
    if (ser_put_i64(&b, (int64_t)ctx->rng[j])) rc = nas_errf(err, "out of memory");
  for (size_t i = 0; i < opt->n && rc == NAS_OK; i++)
    if (ser_put_i64(&b, opt->updates[i])) rc = nas_errf(err, "out of memory");
  for (size_t i = 0; i < opt->n && rc == NAS_OK; i++)
    for (int k = 0; k < (int)slots && rc == NAS_OK; k++) rc = put_slot(ctx, &b, opt, i, k, err);
  if (rc == NAS_OK) rc = ser_seal_and_write(&b, path, err);
  else nas_err_prefix(err, "%s", path);
  free(b.data);
  return rc;
}

/* What the head of a training state file says. */
typedef struct {
  uint32_t version, kind, slots, count;
  uint32_t part, parts; /* which part of how many the state is */
  int64_t steps;
  uint64_t rng[STATE_RNG_WORDS];
} state_head;

/* Reads the head and checks that it is the state of this part and optimiser. */
static int take_state_head(ser_reader *r, const tr_optim *opt, const tr_train_part *part,
                           const char *path, state_head *h, nas_err *err) {
  if (!ser_take_u32(r, &h->version))
    return nas_errf(err, "%s: the head of the training state is damaged", path);
  if (h->version < 1 || h->version > STATE_VERSION)
    return nas_errf(err, "%s: training state version %u, this nas reads versions 1 to %d", path,
                    h->version, STATE_VERSION);
  h->part = 0, h->parts = 1;
  bool whole = ser_take_u32(r, &h->kind) && ser_take_u32(r, &h->slots) &&
               ser_take_u32(r, &h->count) &&
               (h->version < 2 || (ser_take_u32(r, &h->part) && ser_take_u32(r, &h->parts))) &&
               ser_take_i64(r, &h->steps);
  for (int j = 0; whole && j < STATE_RNG_WORDS; j++) {
    int64_t word;
    whole = ser_take_i64(r, &word);
    h->rng[j] = (uint64_t)word;
  }
  if (!whole || h->kind > TR_ADAMW || h->steps < 0 || h->part >= h->parts)
    return nas_errf(err, "%s: the head of the training state is damaged", path);
  if (h->parts != (uint32_t)part->count || h->part != (uint32_t)part->index)
    return nas_errf(err, "%s: the training state of %s %u of %u; this is %s %d of %d: training "
                    "resumes on as many %ss as saved it", path, part->unit, h->part, h->parts,
                    part->unit, part->index, part->count, part->unit);
  if (h->kind != (uint32_t)opt->cfg.kind || h->slots != slots_kept(&opt->cfg))
    return nas_errf(err, "%s: the state of %s keeping %u tensors per parameter; this run's "
                    "optimiser is %s keeping %u", path, kind_names[h->kind], h->slots,
                    kind_names[opt->cfg.kind], slots_kept(&opt->cfg));
  if (h->count != opt->n)
    return nas_errf(err, "%s: the state of %u parameters; the optimiser has %zu", path, h->count,
                    opt->n);
  return NAS_OK;
}

/* Slot k of parameter i from its record, on the parameter's device, into *out (owned). */
static int take_slot(tr_ctx *ctx, ser_reader *r, const tr_optim *opt, size_t i, int k,
                     const char *path, tr_tensor **out, nas_err *err) {
  tr_tensor *p = opt->params[i], *host = tr_zeros(ctx, p->dtype, p->ndim, p->shape);
  char name[64];
  slot_name(opt, i, k, name, sizeof name);
  int rc = host ? ser_take_tensor(r, path, name, host, err) : nas_errf(err, "%s", ctx->err.msg);
  if (rc == NAS_OK && tn_on_cuda(p)) {
    *out = tr_to_device(ctx, host, tr_tensor_device(p));
    if (!*out) rc = nas_errf(err, "%s: %s", name, ctx->err.msg);
    tr_release(host);
  } else if (rc == NAS_OK) {
    *out = host;
  } else {
    tr_release(host);
  }
  return rc;
}

/* Each parameter's update count into updates (opt->n): version 3 keeps them; before, one
 * count stood for all (steps). */
static int take_updates(ser_reader *r, const state_head *h, size_t n, const char *path,
                        int64_t *updates, nas_err *err) {
  for (size_t i = 0; i < n; i++) {
    if (h->version < 3) updates[i] = h->steps;
    else if (!ser_take_i64(r, &updates[i]) || updates[i] < 0 || updates[i] > h->steps)
      return nas_errf(err, "%s: the update count of parameter %zu is damaged", path, i);
  }
  return NAS_OK;
}

/* The file's body into opt and ctx; nothing changes unless all of it is good. */
static int parse_state(tr_ctx *ctx, tr_optim *opt, const tr_train_part *part, ser_reader *r,
                       const char *path, nas_err *err) {
  state_head h;
  if (take_state_head(r, opt, part, path, &h, err) != NAS_OK) return NAS_ERR;
  size_t n = 2 * opt->n;
  tr_tensor **loaded = calloc(n ? n : 1, sizeof *loaded);
  int64_t *updates = calloc(opt->n ? opt->n : 1, sizeof *updates);
  int rc = loaded && updates ? take_updates(r, &h, opt->n, path, updates, err)
                             : nas_errf(err, "out of memory");
  for (size_t i = 0; i < opt->n && rc == NAS_OK; i++)
    for (int k = 0; k < (int)h.slots && rc == NAS_OK; k++)
      rc = take_slot(ctx, r, opt, i, k, path, &loaded[2 * i + (size_t)k], err);
  if (rc == NAS_OK && r->left != 0)
    rc = nas_errf(err, "%s: %zu stray bytes after the last tensor", path, r->left);
  for (size_t j = 0; loaded && j < n; j++) {
    if (rc != NAS_OK) {
      tr_release(loaded[j]);
      continue;
    }
    tr_release(opt->state[j]);
    opt->state[j] = loaded[j];
  }
  free(loaded);
  if (rc == NAS_OK) memcpy(opt->updates, updates, opt->n * sizeof *updates);
  free(updates);
  if (rc != NAS_OK) return rc;
  opt->steps = h.steps;
  memcpy(ctx->rng, h.rng, sizeof ctx->rng);
  return NAS_OK;
}

int tr_train_state_load(tr_ctx *ctx, tr_optim *opt, const tr_train_part *part, const char *path,
                        nas_err *err) {
  if (!ser_host_is_little_endian())
    return nas_errf(err, "%s: training state files are little-endian only", path);
  char *data = NULL;
  size_t n = 0;
  if (nas_read_file(path, &data, &n, err)) return NAS_ERR;
  ser_reader r;
  int rc = ser_open((const unsigned char *)data, n, "NAST", "nas training state file", path, &r, err);
  if (rc == NAS_OK) rc = parse_state(ctx, opt, part ? part : &whole_training, &r, path, err);
  free(data);
  return rc;
}
