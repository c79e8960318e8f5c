/* spec/early_stop.c: the `early_stopping:` section -> spec.early_stopping.
 *
 *   early_stopping:
 *     rule: median | asha
 *     objectives: [accuracy]   # which objectives are judged; default all
 *     min_steps: 1             # no decision before this step
 *     min_trials: 4            # other trials needed at a step before deciding
 *     reduction_factor: 3      # asha: keep the best 1/η at each rung
 *     rungs: [1, 3, 9, 27]     # asha: steps judged; default min_steps·η^k
 * Rungs are ascending positive steps; defaults fill the ladder up to 2^31 steps. */
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

static int parse_rule(const yaml_ctx *c, const yaml_node_t *section, early_stop_spec *es) {
  static const char *const rules[] = {"median", "asha", NULL};
  yaml_node_t *node;
  const char *text;
  int rc = spec_node_required(c, section, "early_stopping", "rule", &node);
  if (!rc) rc = spec_node_text(c, node, "early_stopping.rule", &text);
  if (rc) return rc;
  if (strcmp(text, "median") == 0) es->rule = EARLY_STOP_MEDIAN;
  else if (strcmp(text, "asha") == 0) es->rule = EARLY_STOP_ASHA;
  else {
    const char *guess = spec_nearest_name(text, rules);
    return spec_node_errf(c, node, "early_stopping.rule: expected median or asha, got '%s'%s%s%s",
                          text, guess ? "; did you mean '" : "", guess ? guess : "",
                          guess ? "'?" : "");
  }
  return NAS_OK;
}

static int find_objective(const spec *s, const char *name) {
  for (size_t i = 0; i < s->n_objectives; i++)
    if (strcmp(s->objectives[i].name, name) == 0) return (int)i;
  return -1;
}

/* objectives: names of declared objectives, each once; default all of them. */
static int parse_judged(const yaml_ctx *c, const yaml_node_t *section, spec *s) {
  early_stop_spec *es = &s->early_stopping;
  yaml_node_t *list = spec_node_optional(c, section, "objectives");
  size_t n = list ? (size_t)(list->data.sequence.items.top - list->data.sequence.items.start)
                  : s->n_objectives;
  int rc = list ? spec_node_expect_list(c, list, "early_stopping.objectives") : NAS_OK;
  if (rc) return rc;
  if (list && n == 0)
    return spec_node_errf(c, list, "early_stopping.objectives: name at least one");
  if (!(es->objectives = calloc(n, sizeof *es->objectives)))
    return nas_errf(c->err, "out of memory");
  for (size_t i = 0; i < n; i++) {
    es->objectives[i] = i;
    if (!list) continue;
    yaml_node_t *item = spec_node_at(c, list->data.sequence.items.start[i]);
    const char *name;
    if ((rc = spec_node_text(c, item, "early_stopping.objectives", &name))) return rc;
    int j = find_objective(s, name);
    if (j < 0)
      return spec_node_errf(c, item, "early_stopping.objectives: '%s' is not an objective", name);
    for (size_t k = 0; k < i; k++)
      if (es->objectives[k] == (size_t)j)
        return spec_node_errf(c, item, "early_stopping.objectives: '%s' named twice", name);
    es->objectives[i] = (size_t)j;
  }
  es->n_objectives = n;
  return NAS_OK;
}

/* An optional integer key in [low, high], else the default already in *out. */
static int optional_long(const yaml_ctx *c, const yaml_node_t *section, const char *key,
                         long low, long high, long *out) {
  yaml_node_t *node = spec_node_optional(c, section, key);
  if (!node) return NAS_OK;
  char what[FIELD_CAP];
  spec_field_join(what, "early_stopping", key);
  long long v;
  int rc = spec_node_integer(c, node, what, &v);
  if (rc) return rc;
  if (v < low || v > high)
    return spec_node_errf(c, node, "%s: must be between %ld and %ld, got %lld", what, low, high, v);
  *out = (long)v;
  return NAS_OK;
}

static int parse_rungs(const yaml_ctx *c, const yaml_node_t *section, early_stop_spec *es) {
  yaml_node_t *list = spec_node_optional(c, section, "rungs");
  size_t cap = 64;
  if (!(es->rungs = calloc(cap, sizeof *es->rungs))) return nas_errf(c->err, "out of memory");
  if (!list) { /* min_steps·η^k, while it fits */
    for (double step = (double)es->min_steps; step < 2147483647.0 && es->n_rungs < cap;
         step *= es->reduction_factor)
      if (es->n_rungs == 0 || (long)step > es->rungs[es->n_rungs - 1])
        es->rungs[es->n_rungs++] = (long)step;
    return NAS_OK;
  }
  int rc = spec_node_expect_list(c, list, "early_stopping.rungs");
  size_t n = rc ? 0 : (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  if (!rc && (n == 0 || n > cap))
    return spec_node_errf(c, list, "early_stopping.rungs: give between 1 and %zu steps", cap);
  for (size_t i = 0; i < n && !rc; i++) {
    yaml_node_t *item = spec_node_at(c, list->data.sequence.items.start[i]);
    long long step;
    if ((rc = spec_node_integer(c, item, "early_stopping.rungs", &step))) break;
    if (step < 1 || (i > 0 && step <= es->rungs[i - 1]))
      rc = spec_node_errf(c, item, "early_stopping.rungs: steps must be positive and ascending");
    es->rungs[es->n_rungs++] = (long)step;
  }
  return rc;
}

int spec_parse_early_stopping(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  static const char *const keys[] = {"rule",       "objectives",       "min_steps",
                                     "min_trials", "reduction_factor", "rungs", NULL};
  yaml_node_t *section = spec_node_optional(c, root, "early_stopping");
  early_stop_spec *es = &s->early_stopping;
  es->min_steps = 1;
  es->min_trials = 4;
  es->reduction_factor = 3;
  if (!section) return NAS_OK;
  int rc = spec_node_expect_mapping(c, section, "early_stopping");
  if (!rc) rc = spec_node_check_keys(c, section, "early_stopping", keys);
  if (!rc) rc = parse_rule(c, section, es);
  if (!rc) rc = parse_judged(c, section, s);
  if (!rc) rc = optional_long(c, section, "min_steps", 0, 1000000000, &es->min_steps);
  long min_trials = es->min_trials;
  if (!rc) rc = optional_long(c, section, "min_trials", 1, 1000000, &min_trials);
  es->min_trials = (int)min_trials;
  yaml_node_t *eta = rc ? NULL : spec_node_optional(c, section, "reduction_factor");
  if (eta &&
      !(rc = spec_node_number(c, eta, "early_stopping.reduction_factor", &es->reduction_factor)) &&
      !(es->reduction_factor >= 1.5 && es->reduction_factor <= 100))
    rc = spec_node_errf(c, eta, "early_stopping.reduction_factor: must be in [1.5, 100], got %g",
                        es->reduction_factor);
  if (!rc && es->rule == EARLY_STOP_ASHA) {
    if (es->min_steps == 0) es->min_steps = 1;
    rc = parse_rungs(c, section, es);
  } else if (!rc && spec_node_optional(c, section, "rungs")) {
    rc = spec_node_errf(c, spec_node_optional(c, section, "rungs"),
                        "early_stopping.rungs: only the asha rule uses rungs");
  }
  return rc;
}
