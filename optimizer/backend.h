/* optimizer/backend.h: the table each optimizer type fills (internal to optimizer/).
 * optimizer.c keeps the list of types and does the argument checks common to all. */
#ifndef NAS_OPTIMIZER_BACKEND_H
#define NAS_OPTIMIZER_BACKEND_H

#include "optimizer/optimizer.h"

/* A suggestion's watch as the backends see it: once the caller's watch has said stop, the
 * answer stays yes, so every loop of the suggestion ends quickly. */
typedef struct {
  optimizer_watch watch;
  bool stopped;
} optimizer_cancel;

static inline bool optimizer_cancelled(optimizer_cancel *c) {
  if (c && !c->stopped && c->watch.cancelled) c->stopped = c->watch.cancelled(c->watch.ctx);
  return c && c->stopped;
}

typedef struct optimizer_backend {
  const char *type; /* name in the spec's `optimizer: {type: …}` */
  /* Reads options (a JSON object of the spec's other keys, never NULL) and makes the
   * backend's state in *state. The space is borrowed and outlives the state; it is NULL
   * when only the options are checked (optimizer_validate_options), and the state is then
   * freed unused, so create must not look into the space. */
  int (*create)(const space *sp, const json_t *options, void **state, nas_err *err);
  void (*free)(void *state);
  /* As optimizer_suggest; out[0..n-1] receive owned JSON objects; refs is NULL or filled
   * with NaN already, and the backend writes the rows of the suggestions that aimed at a
   * reference point. */
  int (*suggest)(void *state, const observation *obs, size_t n_obs,
                 const json_t *const *pending, size_t n_pending, size_t n, int first_number,
                 json_t **out, double *refs, nas_err *err);
  /* Optional (NULL: the backend's suggestions are quick): keeps the watch for suggest. */
  void (*set_watch)(void *state, optimizer_watch watch);
  /* Optional (NULL: the backend does not plan by the budget): keeps the estimate. */
  void (*set_trials_expected)(void *state, size_t n);
} optimizer_backend;

extern const optimizer_backend optimizer_random_backend;
extern const optimizer_backend optimizer_sobol_backend;
extern const optimizer_backend optimizer_gp_backend;

#endif
