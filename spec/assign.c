/* spec/assign.c: known configurations — assignments of values to the search parameters
 * written by a person rather than suggested: the `enqueue:` section, the NAME=VALUE
 * arguments of `nas enqueue`, and the `warm_start:` section (whose `fill` assigns values
 * to parameters that earlier experiments lacked).
 *
 * Every assignment is checked against the space as spec_check_params checks a suggestion,
 * and stored as a suggestion would be: a categorical value as the choice itself (so "64"
 * typed as an integer stays the integer choice 64), a float as a real, and fixed
 * parameters filled in; so an enqueued trial is indistinguishable from a suggested one. */
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

/* value as parameter p stores it (owned), or NULL with why when p does not take it. */
static json_t *param_value(const param_spec *p, const json_t *value, char *why, size_t cap) {
  if (!spec_param_accepts(p, value, why, cap)) return NULL;
  for (size_t i = 0; p->kind == PARAM_CATEGORICAL && i < json_array_size(p->choices); i++)
    if (spec_values_equal(value, json_array_get(p->choices, i)))
      return json_incref(json_array_get(p->choices, i));
  if (p->kind == PARAM_FLOAT) return json_real(json_number_value(value));
  return json_deep_copy(value);
}

/* Fills in the fixed parameters that are active and not given, then checks the whole. */
static int assignment_complete(const spec *s, json_t *params, nas_err *err) {
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    if (p->kind != PARAM_FIXED || json_object_get(params, p->name) ||
        !spec_param_active(s, i, params))
      continue;
    if (json_object_set_new(params, p->name, json_deep_copy(p->fixed)) != 0)
      return nas_errf(err, "out of memory");
  }
  return spec_check_params(s, params, err);
}

/* "unknown parameter 'x'", with a did-you-mean when one is near. */
static int unknown_param(const spec *s, const char *name, size_t len, nas_err *err) {
  const char *guess = spec_param_nearest(s, name, len);
  if (guess)
    return nas_errf(err, "unknown parameter '%.*s'; did you mean '%s'?", (int)len, name, guess);
  return nas_errf(err, "unknown parameter '%.*s' (the space has no parameter of that name)",
                  (int)len, name);
}

/* Sets params[name] to value (borrowed) as parameter `name` of s stores it. */
static int assign(const spec *s, json_t *params, const char *name, size_t len,
                  const json_t *value, nas_err *err) {
  int i = spec_param_find(s->params, s->n_params, name, len);
  if (i < 0) return unknown_param(s, name, len, err);
  const param_spec *p = &s->params[i];
  if (json_object_get(params, p->name)) return nas_errf(err, "'%s' is given twice", p->name);
  char why[300];
  json_t *stored = param_value(p, value, why, sizeof why);
  if (!stored) return nas_errf(err, "parameter '%s': %s", p->name, why);
  return json_object_set_new(params, p->name, stored) == 0 ? NAS_OK
                                                            : nas_errf(err, "out of memory");
}

bool spec_is_assignment(const char *arg) {
  const char *eq = strchr(arg, '=');
  return eq && eq != arg;
}

/* One NAME=VALUE argument into params. */
static int assign_argument(const spec *s, json_t *params, const char *arg, nas_err *err) {
  if (!spec_is_assignment(arg)) return nas_errf(err, "'%s' is not NAME=VALUE", arg);
  const char *eq = strchr(arg, '=');
  json_t *value = NULL;
  int rc = spec_inline_value(eq + 1, &value, err);
  if (rc == NAS_OK && !value) rc = nas_errf(err, "'%s' has no value after '='", arg);
  if (rc == NAS_OK) rc = assign(s, params, arg, (size_t)(eq - arg), value, err);
  json_decref(value);
  return rc;
}

int spec_assignment_parse(const spec *s, char *const *args, size_t n, json_t **out,
                          nas_err *err) {
  json_t *params = json_object();
  int rc = params ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) rc = assign_argument(s, params, args[i], err);
  if (rc == NAS_OK) rc = assignment_complete(s, params, err);
  if (rc != NAS_OK) {
    json_decref(params);
    return rc;
  }
  *out = params;
  return NAS_OK;
}

/* ---- the sections ------------------------------------------------------------------------ */

/* A mapping of parameter names to values (an `enqueue` item, `warm_start.fill`) into
 * params, each problem reported at the key or value it concerns. */
static int assign_mapping(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                          const spec *s, json_t *params) {
  int rc = spec_node_expect_mapping(c, map, what);
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start;
       rc == NAS_OK && pair < map->data.mapping.pairs.top; pair++) {
    yaml_node_t *key = spec_node_at(c, pair->key), *node = spec_node_at(c, pair->value);
    const char *name = spec_node_scalar_text(key);
    char field[FIELD_CAP];
    spec_field_join(field, what, name);
    json_t *value = NULL;
    nas_err why;
    if (spec_param_find(s->params, s->n_params, name, strlen(name)) < 0) {
      unknown_param(s, name, strlen(name), &why);
      return spec_node_errf(c, key, "%s: %s", what, why.msg);
    }
    rc = spec_node_scalar_json(c, node, field, &value);
    if (rc == NAS_OK && assign(s, params, name, strlen(name), value, &why) != NAS_OK)
      rc = spec_node_errf(c, node, "%s: %s", what, why.msg);
    json_decref(value);
  }
  return rc;
}

/* enqueue: a list of assignments, each complete once fixed parameters are filled in. */
int spec_parse_enqueue(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  yaml_node_t *list = spec_node_optional(c, root, "enqueue");
  if (!list) return NAS_OK;
  int rc = spec_node_expect_list(c, list, "enqueue");
  size_t n = rc ? 0 : (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  /* Queued trials run even once the budget is spent (docs/cli.md, nas enqueue). */
  if (n > (size_t)s->budget.max_trials)
    return spec_node_errf(c, list,
                          "enqueue: %zu assignments, more than budget.trials (%d), which they "
                          "count in; raise the budget or queue fewer",
                          n, s->budget.max_trials);
  if (rc == NAS_OK && !(s->enqueue = json_array())) rc = nas_errf(c->err, "out of memory");
  size_t i = 0;
  for (yaml_node_item_t *item = list->data.sequence.items.start;
       rc == NAS_OK && item < list->data.sequence.items.top; item++, i++) {
    yaml_node_t *node = spec_node_at(c, *item);
    char what[48];
    snprintf(what, sizeof what, "enqueue[%zu]", i);
    json_t *params = json_object();
    nas_err why;
    if (!params) return nas_errf(c->err, "out of memory");
    rc = assign_mapping(c, node, what, s, params);
    if (rc == NAS_OK && assignment_complete(s, params, &why) != NAS_OK)
      rc = spec_node_errf(c, node, "%s: %s", what, why.msg);
    if (rc == NAS_OK && json_array_append(s->enqueue, params) != 0)
      rc = nas_errf(c->err, "out of memory");
    json_decref(params);
  }
  return rc;
}

static int parse_warm_start_from(const yaml_ctx *c, const yaml_node_t *list, spec *s) {
  int rc = spec_node_expect_list(c, list, "warm_start.from");
  size_t n = rc ? 0 : (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  if (rc == NAS_OK && n == 0)
    return spec_node_errf(c, list, "warm_start.from: name at least one earlier experiment");
  if (rc == NAS_OK && !(s->warm_start.from = calloc(n, sizeof *s->warm_start.from)))
    return nas_errf(c->err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    yaml_node_t *node = spec_node_at(c, list->data.sequence.items.start[i]);
    char what[48];
    snprintf(what, sizeof what, "warm_start.from[%zu]", i);
    rc = spec_node_dup_text(c, node, what, &s->warm_start.from[i]);
    if (rc) break;
    s->warm_start.n_from = i + 1;
    const char *name = s->warm_start.from[i];
    nas_err why;
    if (nas_check_experiment_name(name, &why) != NAS_OK)
      return spec_node_errf(c, node, "%s: %s", what, why.msg);
    if (strcmp(name, s->name) == 0)
      return spec_node_errf(c, node, "%s: '%s' is this experiment itself", what, name);
    for (size_t j = 0; j < i; j++)
      if (strcmp(s->warm_start.from[j], name) == 0)
        return spec_node_errf(c, node, "%s: '%s' is named twice", what, name);
  }
  return rc;
}

/* warm_start: {from: [EXPERIMENT, …], fill: {PARAMETER: VALUE, …}}. */
int spec_parse_warm_start(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  static const char *const keys[] = {"from", "fill", NULL};
  yaml_node_t *section = spec_node_optional(c, root, "warm_start"), *from, *fill;
  if (!section) return NAS_OK;
  int rc = spec_node_expect_mapping(c, section, "warm_start");
  if (!rc) rc = spec_node_check_keys(c, section, "warm_start", keys);
  if (!rc) rc = spec_node_required(c, section, "warm_start", "from", &from);
  if (!rc) rc = parse_warm_start_from(c, from, s);
  if (!rc && !(s->warm_start.fill = json_object())) rc = nas_errf(c->err, "out of memory");
  if (!rc && (fill = spec_node_optional(c, section, "fill")))
    rc = assign_mapping(c, fill, "warm_start.fill", s, s->warm_start.fill);
  return rc;
}

void spec_warm_start_free(warm_start_spec *w) {
  for (size_t i = 0; i < w->n_from; i++) free(w->from[i]);
  free(w->from);
  json_decref(w->fill);
}
