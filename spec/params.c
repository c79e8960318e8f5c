/* spec/params.c: what values a loaded spec's parameters take, and which are active.
 *
 * One rule decides "can parameter p take value v" (spec_param_accepts); the loader uses it for
 * condition values and spec_check_params for whole assignments, so both agree. Numbers
 * compare by value (3 == 3.0), but int parameters only take JSON integers, so stored
 * assignments keep their types. Bounds are exact: an optimizer clamps to [low, high]. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

char *spec_param_env_name(const char *name) {
  char *env = nas_asprintf("NAS_PARAM_%s", name);
  for (char *p = env ? env + strlen("NAS_PARAM_") : NULL; p && *p; p++)
    *p = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
  return env;
}

bool spec_values_equal(const json_t *a, const json_t *b) {
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  return json_equal(a, b);
}

bool spec_on_step_grid(double offset, double step) {
  double steps = offset / step;
  return fabs(steps - round(steps)) <= 1e-9 * fmax(1.0, fabs(steps));
}

bool spec_param_in_range(const param_spec *p, double value) {
  return value >= p->low && value <= p->high;
}

/* The numeric checks shared by float and int parameters. */
static bool number_accepted(const param_spec *p, double x, char *why, size_t cap) {
  char value[32], low[32], high[32], step[32];
  spec_format_double(x, value, sizeof value);
  spec_format_double(p->low, low, sizeof low);
  spec_format_double(p->high, high, sizeof high);
  if (!spec_param_in_range(p, x)) {
    snprintf(why, cap, "%s is outside [%s, %s]", value, low, high);
    return false;
  }
  if (p->step > 0 && !spec_on_step_grid(x - p->low, p->step)) {
    spec_format_double(p->step, step, sizeof step);
    snprintf(why, cap, "%s is not on the grid %s + k * %s", value, low, step);
    return false;
  }
  return true;
}

bool spec_param_accepts(const param_spec *p, const json_t *value, char *why, size_t cap) {
  char text[64], list[200];
  spec_describe_value(value, text, sizeof text);
  switch (p->kind) {
  case PARAM_FLOAT:
    if (json_is_number(value)) return number_accepted(p, json_number_value(value), why, cap);
    snprintf(why, cap, "expected a number, got %s", text);
    return false;
  case PARAM_INT:
    if (json_is_integer(value)) return number_accepted(p, json_number_value(value), why, cap);
    snprintf(why, cap, "expected an integer, got %s", text);
    return false;
  case PARAM_CATEGORICAL:
    for (size_t i = 0; i < json_array_size(p->choices); i++)
      if (spec_values_equal(value, json_array_get(p->choices, i))) return true;
    spec_describe_list(p->choices, list, sizeof list);
    snprintf(why, cap, "%s is not one of %s", text, list);
    return false;
  case PARAM_FIXED: break;
  }
  if (spec_values_equal(value, p->fixed)) return true;
  char fixed[64];
  spec_describe_value(p->fixed, fixed, sizeof fixed);
  snprintf(why, cap, "the value is fixed at %s, got %s", fixed, text);
  return false;
}

int spec_param_find(const param_spec *params, size_t n, const char *name, size_t len) {
  for (size_t i = 0; i < n; i++)
    if (strncmp(params[i].name, name, len) == 0 && params[i].name[len] == '\0') return (int)i;
  return -1;
}

const char *spec_param_nearest(const spec *s, const char *name, size_t len) {
  const char **names = calloc(s->n_params + 1, sizeof *names);
  char *wanted = strndup(name, len);
  const char *guess = NULL;
  if (names && wanted) {
    for (size_t i = 0; i < s->n_params; i++) names[i] = s->params[i].name;
    guess = spec_nearest_name(wanted, names);
  }
  free(wanted);
  free(names);
  return guess;
}

const char *spec_param_kind_name(param_kind kind) {
  switch (kind) {
  case PARAM_FLOAT: return "float";
  case PARAM_INT: return "int";
  case PARAM_CATEGORICAL: return "categorical";
  case PARAM_FIXED: break;
  }
  return "fixed";
}

const char *spec_cond_op_text(cond_op op) {
  switch (op) {
  case COND_EQ: return "==";
  case COND_NE: return "!=";
  case COND_LT: return "<";
  case COND_LE: return "<=";
  case COND_GT: return ">";
  case COND_GE: return ">=";
  case COND_IN: break;
  }
  return "in";
}

int spec_param_index(const spec *s, const char *name) {
  return spec_param_find(s->params, s->n_params, name, strlen(name));
}

static bool condition_holds(const param_condition *cond, const json_t *value) {
  const json_t *first = json_array_get(cond->values, 0);
  double x = json_number_value(value), bound = json_number_value(first);
  bool numbers = json_is_number(value) && json_is_number(first);
  switch (cond->op) {
    case COND_EQ:
      return spec_values_equal(value, first);
    case COND_NE:
      return !spec_values_equal(value, first);
    case COND_LT:
      return numbers && x < bound;
    case COND_LE:
      return numbers && x <= bound;
    case COND_GT:
      return numbers && x > bound;
    case COND_GE:
      return numbers && x >= bound;
    case COND_IN:
      break;
  }
  for (size_t i = 0; i < json_array_size(cond->values); i++)
    if (spec_values_equal(value, json_array_get(cond->values, i))) return true;
  return false;
}

bool spec_param_active(const spec *s, size_t i, const json_t *params) {
  const param_spec *p = &s->params[i];
  if (!p->conditional) return true;
  const param_spec *parent = &s->params[p->cond.parent];
  /* Parents come earlier, so this recursion ends. */
  if (!spec_param_active(s, p->cond.parent, params)) return false;
  const json_t *value = json_object_get(params, parent->name);
  return value && condition_holds(&p->cond, value);
}

int spec_check_params(const spec *s, const json_t *params, nas_err *err) {
  if (!json_is_object(params)) return nas_errf(err, "parameters: expected a JSON object");
  const char *name = NULL;
  const json_t *value;
  json_object_foreach((json_t *)params, name, value) {
    if (spec_param_index(s, name) < 0) return nas_errf(err, "unknown parameter '%s'", name);
  }
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    bool active = spec_param_active(s, i, params);
    value = json_object_get(params, p->name);
    char why[300];
    if (active && !value) return nas_errf(err, "parameter '%s' is missing", p->name);
    if (!active && value) {
      spec_describe_condition(s, &p->cond, why, sizeof why);
      return nas_errf(err,
                      "parameter '%s' is inactive (its condition %s does not hold) but has "
                      "a value",
                      p->name, why);
    }
    if (active && !spec_param_accepts(p, value, why, sizeof why))
      return nas_errf(err, "parameter '%s': %s", p->name, why);
  }
  return NAS_OK;
}
