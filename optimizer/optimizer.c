/* optimizer/optimizer.c: the optimizer types behind one interface (optimizer_* in
 * optimizer.h), the argument checks common to all of them, option checking for the
 * backends (options.h) and pareto_objectives_to_min.
 *
 * Invariants: a backend is only ever called with arguments that passed the checks here
 * (non-negative trial numbers, objects for every assignment, non-NULL arrays where counts
 * are positive), and after a failed suggest every out[i] is NULL. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/backend.h"
#include "optimizer/options.h"
#include "optimizer/optimizer.h"

/* The optimizer types, in the order messages list them. */
static const optimizer_backend *const backends[] = {
    &optimizer_random_backend,
    &optimizer_sobol_backend,
    &optimizer_gp_backend,
};
enum { n_backends = sizeof backends / sizeof backends[0] };

struct optimizer {
  const spec *s;                     /* borrowed */
  space *sp;                         /* owned */
  const optimizer_backend *backend;
  void *state;                       /* the backend's, freed by backend->free */
};

static size_t list_length(const char *const *list) {
  size_t n = 0;
  while (list && list[n]) n++;
  return n;
}

int optimizer_check_options(const char *type, const json_t *options, const char *const *known,
                            nas_err *err) {
  const char *key;
  const json_t *value;
  size_t n_known = list_length(known);
  json_object_foreach((json_t *)options, key, value) {
    size_t i = 0;
    while (i < n_known && strcmp(known[i], key) != 0) i++;
    if (i < n_known) continue;
    const char *hint = nas_nearest(key, known, n_known);
    if (n_known == 0)
      return nas_errf(err, "optimizer %s: unknown option '%s' (it takes no options)", type, key);
    return nas_errf(err, "optimizer %s: unknown option '%s'%s%s%s", type, key,
                    hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
  }
  return 0;
}

static const optimizer_backend *find_backend(const char *type, nas_err *err) {
  const char *names[n_backends];
  for (size_t i = 0; i < n_backends; i++) {
    if (strcmp(backends[i]->type, type) == 0) return backends[i];
    names[i] = backends[i]->type;
  }
  char known[256] = "";
  for (size_t i = 0; i < n_backends; i++) {
    size_t used = strlen(known);
    snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", names[i]);
  }
  const char *hint = nas_nearest(type, names, n_backends);
  nas_errf(err, "optimizer: unknown type '%s'%s%s%s (known: %s)", type,
           hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "", known);
  return NULL;
}

int optimizer_create(const spec *s, optimizer **out, nas_err *err) {
  *out = NULL;
  const char *type = s->optimizer.type ? s->optimizer.type : "gp";
  const optimizer_backend *backend = find_backend(type, err);
  if (!backend) return NAS_ERR;
  optimizer *opt = calloc(1, sizeof *opt);
  json_t *no_options = s->optimizer.options ? NULL : json_object();
  const json_t *options = s->optimizer.options ? s->optimizer.options : no_options;
  if (!opt || !options) {
    free(opt);
    json_decref(no_options);
    return nas_errf(err, "optimizer: out of memory");
  }
  opt->s = s;
  opt->backend = backend;
  int rc = space_create(s, &opt->sp, err);
  if (rc == 0) rc = backend->create(opt->sp, options, &opt->state, err);
  json_decref(no_options);
  if (rc < 0) {
    space_free(opt->sp);
    free(opt);
    return rc;
  }
  *out = opt;
  return 0;
}

void optimizer_set_watch(optimizer *opt, optimizer_watch watch) {
  if (opt->backend->set_watch) opt->backend->set_watch(opt->state, watch);
}

void optimizer_set_trials_expected(optimizer *opt, size_t n) {
  if (opt->backend->set_trials_expected) opt->backend->set_trials_expected(opt->state, n);
}

int optimizer_validate_options(const char *type, const json_t *options, nas_err *err) {
  const optimizer_backend *backend = find_backend(type, err);
  void *state = NULL;
  if (!backend || backend->create(NULL, options, &state, err) < 0) return NAS_ERR;
  backend->free(state);
  return NAS_OK;
}

void optimizer_free(optimizer *opt) {
  if (!opt) return;
  opt->backend->free(opt->state);
  space_free(opt->sp);
  free(opt);
}

/* The checks every backend relies on (see the invariants at the top). */
static int check_suggest_args(const optimizer *opt, const observation *obs, size_t n_obs,
                              const json_t *const *pending, size_t n_pending, size_t n,
                              int first_number, json_t **out, nas_err *err) {
  if (!out) return nas_errf(err, "optimizer: no room for %zu suggestions", n);
  if (first_number < 0 || (size_t)first_number + n > (size_t)INT_MAX)
    return nas_errf(err, "optimizer: trial numbers %d..%zu out of range", first_number,
                    (size_t)first_number + n);
  if (n_obs > 0 && !obs) return nas_errf(err, "optimizer: %zu observations missing", n_obs);
  if (n_pending > 0 && !pending)
    return nas_errf(err, "optimizer: %zu pending assignments missing", n_pending);
  const spec *s = opt->s;
  for (size_t i = 0; i < n_obs; i++) {
    if (!json_is_object(obs[i].params))
      return nas_errf(err, "optimizer: observation %zu: parameters are not an object", i);
    if ((s->n_objectives > 0 && !obs[i].objectives) ||
        (s->n_constraints > 0 && !obs[i].constraints))
      return nas_errf(err, "optimizer: observation %zu: metric values missing", i);
  }
  for (size_t i = 0; i < n_pending; i++)
    if (!json_is_object(pending[i]))
      return nas_errf(err, "optimizer: pending assignment %zu is not an object", i);
  return 0;
}

int optimizer_suggest(optimizer *opt, const observation *obs, size_t n_obs,
                      const json_t *const *pending, size_t n_pending, size_t n,
                      int first_number, json_t **out, double *refs, nas_err *err) {
  if (n == 0) return 0;
  if (check_suggest_args(opt, obs, n_obs, pending, n_pending, n, first_number, out, err) < 0)
    return NAS_ERR;
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  for (size_t i = 0; refs && i < n * opt->s->n_objectives; i++) refs[i] = NAN;
  int rc = opt->backend->suggest(opt->state, obs, n_obs, pending, n_pending, n, first_number,
                                 out, refs, err);
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (!out[i]) rc = nas_errf(err, "optimizer %s: suggestion %zu missing", opt->backend->type, i);
  if (rc < 0) {
    for (size_t i = 0; i < n; i++) {
      json_decref(out[i]);
      out[i] = NULL;
    }
  }
  return rc;
}

void pareto_objectives_to_min(const spec *s, const double *raw, double *out) {
  for (size_t j = 0; j < s->n_objectives; j++)
    out[j] = s->objectives[j].goal == GOAL_MAXIMIZE ? -raw[j] : raw[j];
}
