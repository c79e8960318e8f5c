/* spec/param_parse.c: the `parameters:` section -> spec.params, conditions included.
 *
 * Parameters keep the order they are written in. Names are read in a first pass so a
 * condition naming a parameter declared later gets a message saying so; definitions are
 * read in a second pass, in order, so a condition's parent is always complete when the
 * condition is checked. Invariants of a loaded parameter: low < high, high - low finite;
 * log => low > 0; step > 0 divides high - low; int bounds and steps are integers; an int or
 * stepped range spans at most SPEC_MAX_STEPS steps; categorical choices are >= 2 distinct
 * scalars; a condition's parent comes earlier, every value it names is one the parent can
 * take, and some value of the parent satisfies it. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

/* Indexed by param_kind. */
static const char *const kind_names[] = {"float", "int", "categorical", "fixed", NULL};
static const char *const range_keys[] = {"type", "low", "high", "log", "step", "when", NULL};
static const char *const categorical_keys[] = {"type", "choices", "when", NULL};
static const char *const fixed_keys[] = {"type", "value", "when", NULL};
static const char *const any_kind_keys[] = {"type",    "low",   "high", "log", "step",
                                            "choices", "value", "when", NULL};
/* Ints are stored as doubles: keep them exact. */
static const double max_exact_int = 9007199254740992.0; /* 2^53 */

static const char *const *keys_of(param_kind kind) {
  switch (kind) {
  case PARAM_FLOAT:
  case PARAM_INT: return range_keys;
  case PARAM_CATEGORICAL: return categorical_keys;
  case PARAM_FIXED: break;
  }
  return fixed_keys;
}

static bool in_list(const char *word, const char *const *list) {
  for (; *list; list++)
    if (strcmp(word, *list) == 0) return true;
  return false;
}

static int parse_kind(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                      param_kind *kind) {
  yaml_node_t *node;
  const char *text = NULL;
  char field[FIELD_CAP];
  spec_field_join(field, what, "type");
  int rc = spec_node_required(c, map, what, "type", &node);
  if (!rc) rc = spec_node_text(c, node, field, &text);
  if (rc) return rc;
  for (int k = 0; kind_names[k]; k++) {
    if (strcmp(text, kind_names[k]) == 0) {
      *kind = (param_kind)k;
      return NAS_OK;
    }
  }
  const char *guess = spec_nearest_name(text, kind_names);
  if (guess)
    return spec_node_errf(c, node, "%s: unknown type '%s'; did you mean '%s'?", field, text, guess);
  return spec_node_errf(c, node, "%s: unknown type '%s' (float, int, categorical or fixed)", field,
                        text);
}

/* Keys of another type (`choices` on a float) get a message that says so. */
static int check_param_keys(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                            param_kind kind) {
  const char *const *keys = keys_of(kind);
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
       pair++) {
    yaml_node_t *key = spec_node_at(c, pair->key);
    const char *text = spec_node_scalar_text(key);
    if (in_list(text, any_kind_keys) && !in_list(text, keys))
      return spec_node_errf(c, key, "%s: '%s' does not apply to a %s parameter", what, text,
                            spec_param_kind_name(kind));
  }
  return NAS_OK;
}

/* A bound or step: an integer for int parameters, any number for floats. */
static int read_number(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                       const char *key, param_kind kind, double *out) {
  char field[FIELD_CAP];
  spec_field_join(field, what, key);
  if (kind == PARAM_FLOAT) {
    int rc = spec_node_number(c, node, field, out);
    if (rc == NAS_OK) *out += 0.0; /* -0.0 is 0: decoded ends and spec_diff showed the sign */
    return rc;
  }
  long long value;
  int rc = spec_node_integer(c, node, field, &value);
  if (rc) return rc;
  *out = (double)value;
  if (*out > max_exact_int || *out < -max_exact_int)
    return spec_node_errf(c, node, "%s: must be within +-2^53 (9007199254740992)", field);
  return NAS_OK;
}

/* A discrete range's levels must fit the optimizer's encoding (SPEC_MAX_STEPS); at is the
 * node that set the step (or high, for an int's default step of 1). */
static int check_step_count(const yaml_ctx *c, const yaml_node_t *at, const char *what,
                            const param_spec *p, double step) {
  double steps = round((p->high - p->low) / step);
  if (steps <= SPEC_MAX_STEPS) return NAS_OK;
  char count[32], step_text[32];
  spec_format_double(steps, count, sizeof count);
  spec_format_double(step, step_text, sizeof step_text);
  return spec_node_errf(c, at,
                        "%s: high - low spans %s steps of %s; at most 4503599627370495 "
                        "(2^52 - 1) can be searched: narrow the range or take a larger step",
                        what, count, step_text);
}

static int parse_step(const yaml_ctx *c, const yaml_node_t *map, const char *what, param_spec *p) {
  yaml_node_t *node = spec_node_optional(c, map, "step");
  if (!node) return NAS_OK;
  int rc = read_number(c, node, what, "step", p->kind, &p->step);
  if (rc) return rc;
  char text[32], span[32];
  spec_format_double(p->step, text, sizeof text);
  if (!(p->step > 0))
    return spec_node_errf(c, node, "%s.step: must be above 0, got %s", what, text);
  if (p->log) return spec_node_errf(c, node, "%s: step cannot be combined with log: true", what);
  spec_format_double(p->high - p->low, span, sizeof span);
  if (!spec_on_step_grid(p->high - p->low, p->step))
    return spec_node_errf(c, node, "%s.step: high - low (%s) is not a multiple of step %s", what,
                          span, text);
  return check_step_count(c, node, what, p, p->step);
}

static int parse_range(const yaml_ctx *c, const yaml_node_t *map, const char *what, param_spec *p) {
  yaml_node_t *low, *high, *log;
  int rc = spec_node_required(c, map, what, "low", &low);
  if (!rc) rc = read_number(c, low, what, "low", p->kind, &p->low);
  if (!rc) rc = spec_node_required(c, map, what, "high", &high);
  if (!rc) rc = read_number(c, high, what, "high", p->kind, &p->high);
  if (rc) return rc;
  char low_text[32], high_text[32];
  spec_format_double(p->low, low_text, sizeof low_text);
  spec_format_double(p->high, high_text, sizeof high_text);
  if (!(p->low < p->high))
    return spec_node_errf(c, high, "%s: high (%s) must be above low (%s)", what, high_text,
                          low_text);
  char field[FIELD_CAP];
  spec_field_join(field, what, "log");
  if ((log = spec_node_optional(c, map, "log")) && (rc = spec_node_bool(c, log, field, &p->log)))
    return rc;
  if (p->log && !(p->low > 0))
    return spec_node_errf(c, low, "%s: log: true needs low above 0, got %s", what, low_text);
  /* The optimizer places values by their share of high - low: it must be a number. */
  if (!isfinite(p->high - p->low))
    return spec_node_errf(c, high, "%s: the range is too wide: high - low must be at most %g",
                          what, DBL_MAX);
  if (spec_node_optional(c, map, "step")) return parse_step(c, map, what, p);
  return p->kind == PARAM_INT ? check_step_count(c, high, what, p, 1) : NAS_OK;
}

/* Refuses choice when one of p's choices so far equals it, or differs from it only in type
 * (1 and '1', true and 'true'): {name} and NAS_PARAM_<NAME> give a trial both as the same
 * text, so the two would be configurations it cannot tell apart. choice is borrowed. */
static int check_choice_distinct(const yaml_ctx *c, const yaml_node_t *node, const char *field,
                                 const param_spec *p, const json_t *choice) {
  char *text = spec_value_text(choice), *env = spec_param_env_name(p->name);
  int rc = text && env ? NAS_OK : nas_errf(c->err, "out of memory");
  for (size_t j = 0; rc == NAS_OK && j < json_array_size(p->choices); j++) {
    const json_t *earlier = json_array_get(p->choices, j);
    char *earlier_text = spec_value_text(earlier);
    bool same = spec_values_equal(choice, earlier);
    if (!earlier_text) rc = nas_errf(c->err, "out of memory");
    else if (same || strcmp(text, earlier_text) == 0) {
      char said[64], first[64];
      spec_describe_value(choice, said, sizeof said);
      spec_describe_value(earlier, first, sizeof first);
      if (!same)
        rc = spec_node_errf(c, node, "%s: %s is written to the trial as %s is ('%s' in {%s} "
                            "and %s); keep one", field, said, first, text, p->name, env);
      else if (strcmp(said, first) != 0)
        rc = spec_node_errf(c, node, "%s: %s is the same choice as %s (numbers compare by value)",
                            field, said, first);
      else rc = spec_node_errf(c, node, "%s: %s appears twice", field, said);
    }
    free(earlier_text);
  }
  free(text);
  free(env);
  return rc;
}

static int parse_choices(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                         param_spec *p) {
  yaml_node_t *list;
  char field[FIELD_CAP];
  spec_field_join(field, what, "choices");
  int rc = spec_node_required(c, map, what, "choices", &list);
  if (!rc) rc = spec_node_expect_list(c, list, field);
  if (!rc && !(p->choices = json_array())) rc = nas_errf(c->err, "out of memory");
  if (rc) return rc;
  for (yaml_node_item_t *item = list->data.sequence.items.start;
       item < list->data.sequence.items.top; item++) {
    yaml_node_t *node = spec_node_at(c, *item);
    json_t *choice;
    if ((rc = spec_node_scalar_json(c, node, field, &choice))) return rc;
    if ((rc = check_choice_distinct(c, node, field, p, choice))) {
      json_decref(choice);
      return rc;
    }
    if (json_array_append_new(p->choices, choice) != 0) return nas_errf(c->err, "out of memory");
  }
  if (json_array_size(p->choices) < 2)
    return spec_node_errf(
        c, list, "%s: needs at least 2 choices (a single value is a fixed parameter)", field);
  return NAS_OK;
}

static int parse_fixed(const yaml_ctx *c, const yaml_node_t *map, const char *what, param_spec *p) {
  yaml_node_t *node;
  char field[FIELD_CAP];
  spec_field_join(field, what, "value");
  int rc = spec_node_required(c, map, what, "value", &node);
  return rc ? rc : spec_node_scalar_json(c, node, field, &p->fixed);
}

/* ---- conditions ---- */

/* A condition as read, before its parent is resolved. */
typedef struct {
  const yaml_node_t *parent_at; /* where messages about the parent point */
  const yaml_node_t *values_at; /* where messages about the values point */
  const char *parent;           /* borrowed from the document, parent_len bytes */
  size_t parent_len;
} condition_read;

static const struct {
  const char *text;
  cond_op op;
} op_table[] = {{"==", COND_EQ}, {"!=", COND_NE}, {"<=", COND_LE},
                {">=", COND_GE}, {"<", COND_LT},  {">", COND_GT}};

static int parse_condition_text(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                                param_condition *cond, condition_read *read) {
  const char *text = spec_node_scalar_text(node);
  const char *name = text + strspn(text, " ");
  size_t name_len = spec_name_span(name, ".-");
  const char *op = name + name_len + strspn(name + name_len, " ");
  for (size_t k = 0; name_len > 0 && k < sizeof op_table / sizeof op_table[0]; k++) {
    size_t op_len = strlen(op_table[k].text);
    if (strncmp(op, op_table[k].text, op_len) != 0) continue;
    json_t *value;
    if (spec_inline_value(op + op_len, &value, c->err)) return NAS_ERR;
    if (!value) break;
    cond->op = op_table[k].op;
    if (!(cond->values = json_pack("[o]", value))) return nas_errf(c->err, "out of memory");
    *read = (condition_read){node, node, name, name_len};
    return NAS_OK;
  }
  return spec_node_errf(c, node,
                        "%s: '%s' is not a condition; write \"PARAM OP VALUE\" with OP one "
                        "of ==, !=, <, <=, >, >= (or {param: P, in: [...]})",
                        what, text);
}

static int append_scalar(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                         json_t *array) {
  json_t *value;
  int rc = spec_node_scalar_json(c, node, what, &value);
  if (!rc && json_array_append_new(array, value) != 0) rc = nas_errf(c->err, "out of memory");
  return rc;
}

static int parse_condition_map(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                               param_condition *cond, condition_read *read) {
  static const char *const keys[] = {"param", "in", "equals", NULL};
  yaml_node_t *param;
  const char *name = NULL;
  char field[FIELD_CAP];
  spec_field_join(field, what, "param");
  int rc = spec_node_check_keys(c, map, what, keys);
  if (!rc) rc = spec_node_required(c, map, what, "param", &param);
  if (!rc) rc = spec_node_text(c, param, field, &name);
  if (rc) return rc;
  yaml_node_t *in = spec_node_optional(c, map, "in"),
              *equals = spec_node_optional(c, map, "equals");
  if ((in != NULL) == (equals != NULL))
    return spec_node_errf(c, map, "%s: needs exactly one of 'in' (a list) and 'equals' (a value)",
                          what);
  *read = (condition_read){param, in ? in : equals, name, strlen(name)};
  spec_field_join(field, what, in ? "in" : "equals");
  if (!(cond->values = json_array())) return nas_errf(c->err, "out of memory");
  if (equals) {
    cond->op = COND_EQ;
    return append_scalar(c, equals, field, cond->values);
  }
  cond->op = COND_IN;
  if ((rc = spec_node_expect_list(c, in, field))) return rc;
  if (in->data.sequence.items.top == in->data.sequence.items.start)
    return spec_node_errf(c, in, "%s: needs at least one value", field);
  for (yaml_node_item_t *item = in->data.sequence.items.start;
       !rc && item < in->data.sequence.items.top; item++)
    rc = append_scalar(c, spec_node_at(c, *item), field, cond->values);
  return rc;
}

/* Resolves the parent's name to an index earlier than self. */
static int resolve_parent(const yaml_ctx *c, const spec *s, size_t self, const char *what,
                          const condition_read *read, size_t *parent) {
  int found = spec_param_find(s->params, s->n_params, read->parent, read->parent_len);
  int name_len = (int)read->parent_len;
  if (found >= 0 && (size_t)found < self) {
    *parent = (size_t)found;
    return NAS_OK;
  }
  if (found >= 0 && (size_t)found == self)
    return spec_node_errf(c, read->parent_at, "%s: a parameter cannot depend on itself", what);
  if (found >= 0)
    return spec_node_errf(c, read->parent_at,
                          "%s: '%.*s' is declared after '%s'; a condition can "
                          "only use parameters declared before it",
                          what, name_len, read->parent, s->params[self].name);
  const char *guess = spec_param_nearest(s, read->parent, read->parent_len);
  if (guess)
    return spec_node_errf(c, read->parent_at, "%s: unknown parameter '%.*s'; did you mean '%s'?",
                          what, name_len, read->parent, guess);
  return spec_node_errf(c, read->parent_at, "%s: unknown parameter '%.*s'", what, name_len,
                        read->parent);
}

static bool is_comparison(cond_op op) {
  return op == COND_LT || op == COND_LE || op == COND_GT || op == COND_GE;
}

/* `<`, `<=`, `>`, `>=`: a number within the numeric parent's range that some of its values
 * satisfy. */
static int check_comparison(const yaml_ctx *c, const param_spec *parent, const char *what,
                            const param_condition *cond, const condition_read *read) {
  const json_t *value = json_array_get(cond->values, 0);
  char text[64], low[32], high[32];
  spec_describe_value(value, text, sizeof text);
  if (parent->kind != PARAM_FLOAT && parent->kind != PARAM_INT)
    return spec_node_errf(c, read->values_at,
                          "%s: '%s' compares a %s parameter ('%s'); only "
                          "float and int parameters can be compared",
                          what, spec_cond_op_text(cond->op), spec_param_kind_name(parent->kind),
                          parent->name);
  if (!json_is_number(value))
    return spec_node_errf(c, read->values_at,
                          "%s: '%s' can only be compared with a number, not %s", what,
                          parent->name, text);
  spec_format_double(parent->low, low, sizeof low);
  spec_format_double(parent->high, high, sizeof high);
  double bound = json_number_value(value);
  if (!spec_param_in_range(parent, bound))
    return spec_node_errf(c, read->values_at, "%s: %s is outside the range of '%s' [%s, %s]",
                          what, text, parent->name, low, high);
  bool below_all = cond->op == COND_LT && bound <= parent->low;
  if (below_all || (cond->op == COND_GT && bound >= parent->high))
    return spec_node_errf(c, read->values_at, "%s: '%s %s %s' never holds: '%s' is %s %s",
                          what, parent->name, spec_cond_op_text(cond->op), text, parent->name,
                          below_all ? "at least" : "at most", below_all ? low : high);
  return NAS_OK;
}

/* Every value must be one the parent can take, or the condition could never decide; and
 * some value of the parent must satisfy it, or its parameter would never be active. */
static int check_condition_values(const yaml_ctx *c, const param_spec *parent, const char *what,
                                  const param_condition *cond, const condition_read *read) {
  if (is_comparison(cond->op)) return check_comparison(c, parent, what, cond, read);
  if (cond->op == COND_NE && parent->kind == PARAM_FIXED &&
      spec_values_equal(parent->fixed, json_array_get(cond->values, 0))) {
    char text[64];
    spec_describe_value(parent->fixed, text, sizeof text);
    return spec_node_errf(c, read->values_at, "%s: '%s != %s' never holds: '%s' is fixed at %s",
                          what, parent->name, text, parent->name, text);
  }
  for (size_t i = 0; i < json_array_size(cond->values); i++) {
    char why[300];
    if (!spec_param_accepts(parent, json_array_get(cond->values, i), why, sizeof why))
      return spec_node_errf(c, read->values_at, "%s: '%s' can never hold that: %s", what,
                            parent->name, why);
  }
  return NAS_OK;
}

/* Numbers compare by value (docs/spec.md), so `layers == 4.0` means `layers == 4`: a whole
 * real compared with an int parameter is kept as the integer it equals, which the
 * parameter takes. */
static int whole_reals_as_integers(const yaml_ctx *c, json_t *values) {
  for (size_t i = 0; i < json_array_size(values); i++) {
    const json_t *value = json_array_get(values, i);
    double v = json_number_value(value);
    if (!json_is_real(value) || v != floor(v) || fabs(v) > max_exact_int) continue;
    if (json_array_set_new(values, i, json_integer((json_int_t)v)) != 0)
      return nas_errf(c->err, "out of memory");
  }
  return NAS_OK;
}

static int parse_condition(const yaml_ctx *c, const yaml_node_t *when, const char *param_what,
                           spec *s, size_t self) {
  param_spec *p = &s->params[self];
  condition_read read = {0};
  char what[FIELD_CAP];
  spec_field_join(what, param_what, "when");
  int rc;
  if (when->type == YAML_MAPPING_NODE)
    rc = parse_condition_map(c, when, what, &p->cond, &read);
  else if (when->type == YAML_SCALAR_NODE)
    rc = parse_condition_text(c, when, what, &p->cond, &read);
  else
    rc = spec_node_expected(c, when, what,
                            "a condition such as \"layers >= 3\" or "
                            "{param: opt, in: [sgd]}");
  if (!rc) rc = resolve_parent(c, s, self, what, &read, &p->cond.parent);
  if (!rc && s->params[p->cond.parent].kind == PARAM_INT)
    rc = whole_reals_as_integers(c, p->cond.values);
  if (!rc) rc = check_condition_values(c, &s->params[p->cond.parent], what, &p->cond, &read);
  p->conditional = rc == NAS_OK;
  return rc;
}

/* ---- one parameter ---- */

static int parse_definition(const yaml_ctx *c, const yaml_node_t *map, const char *what, spec *s,
                            size_t self) {
  param_spec *p = &s->params[self];
  /* Typos first, so `tpye: int` reads "did you mean 'type'?", not "missing 'type'". */
  int rc = spec_node_check_keys(c, map, what, any_kind_keys);
  if (!rc) rc = parse_kind(c, map, what, &p->kind);
  if (!rc) rc = check_param_keys(c, map, what, p->kind);
  if (rc) return rc;
  switch (p->kind) {
  case PARAM_FLOAT:
  case PARAM_INT: rc = parse_range(c, map, what, p); break;
  case PARAM_CATEGORICAL: rc = parse_choices(c, map, what, p); break;
  case PARAM_FIXED: rc = parse_fixed(c, map, what, p); break;
  }
  yaml_node_t *when = rc ? NULL : spec_node_optional(c, map, "when");
  return when ? parse_condition(c, when, what, s, self) : rc;
}

static int parse_param(const yaml_ctx *c, const yaml_node_t *value, spec *s, size_t self) {
  param_spec *p = &s->params[self];
  char what[FIELD_CAP];
  spec_field_join(what, "parameters", p->name);
  if (value->type == YAML_MAPPING_NODE) return parse_definition(c, value, what, s, self);
  if (value->type == YAML_SCALAR_NODE && !spec_node_is_null(value)) {
    p->kind = PARAM_FIXED; /* the shorthand `epochs: 5` */
    return spec_node_scalar_json(c, value, what, &p->fixed);
  }
  return spec_node_expected(c, value, what,
                            "a mapping such as {type: float, low: 0, high: 1}, or a "
                            "plain value for a fixed parameter");
}

/* First pass: every name, so conditions can tell "declared later" from "unknown". */
static int read_param_names(const yaml_ctx *c, const yaml_node_t *map, spec *s) {
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
       pair++) {
    yaml_node_t *key = spec_node_at(c, pair->key);
    const char *name = spec_node_scalar_text(key);
    if (!spec_is_identifier(name, ".-"))
      return spec_node_errf(c, key,
                            "parameters: '%s' is not a parameter name (a letter or '_', then "
                            "letters, digits, '_', '.' or '-')",
                            name);
    if (spec_check_listing_column(c, key, "parameters", name, "parameter")) return NAS_ERR;
    param_spec *p = &s->params[s->n_params++];
    if (!(p->name = strdup(name))) return nas_errf(c->err, "out of memory");
    p->line = (int)key->start_mark.line + 1;
  }
  return NAS_OK;
}

/* Parameters reach a trial's environment as NAS_PARAM_<NAME>, where `a.b`, `a_b`, `a-b`
 * and `A_B` are all NAS_PARAM_A_B: refuse names that would share one variable. */
static int check_env_names_distinct(const yaml_ctx *c, const yaml_node_t *map, const spec *s) {
  char **env = calloc(s->n_params, sizeof *env);
  int rc = env ? NAS_OK : nas_errf(c->err, "out of memory");
  for (size_t i = 0; !rc && i < s->n_params; i++) {
    if (!(env[i] = spec_param_env_name(s->params[i].name))) rc = nas_errf(c->err, "out of memory");
    for (size_t j = 0; !rc && j < i; j++) {
      if (strcmp(env[i], env[j]) != 0) continue;
      const yaml_node_t *first = spec_node_at(c, map->data.mapping.pairs.start[j].key);
      rc = spec_node_errf(c, spec_node_at(c, map->data.mapping.pairs.start[i].key),
                          "parameters: '%s' and '%s' (line %zu, column %zu) would both be the "
                          "environment variable %s; rename one",
                          s->params[i].name, s->params[j].name, first->start_mark.line + 1,
                          first->start_mark.column + 1, env[i]);
    }
  }
  for (size_t i = 0; env && i < s->n_params; i++) free(env[i]);
  free(env);
  return rc;
}

int spec_parse_parameters(const yaml_ctx *c, const yaml_node_t *node, spec *s) {
  int rc = spec_node_expect_mapping(c, node, "parameters");
  if (rc) return rc;
  size_t n = (size_t)(node->data.mapping.pairs.top - node->data.mapping.pairs.start);
  if (n == 0) return spec_node_errf(c, node, "parameters: at least one parameter is needed");
  if (!(s->params = calloc(n, sizeof *s->params))) return nas_errf(c->err, "out of memory");
  if ((rc = read_param_names(c, node, s)) || (rc = check_env_names_distinct(c, node, s)))
    return rc;
  for (size_t i = 0; i < n && !rc; i++)
    rc = parse_param(c, spec_node_at(c, node->data.mapping.pairs.start[i].value), s, i);
  return rc;
}
