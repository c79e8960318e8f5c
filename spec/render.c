/* spec/render.c: parameter values as text, and trial commands with values filled in.
 *
 * A value's text is what a trial sees on its command line: integers without a decimal
 * point, reals as the shortest %g text that reads back as the same double (0.1 -> "0.1",
 * never "0.10000000000000001"), strings unchanged, bools as true/false. Command arguments
 * are split into pieces by one scanner, spec_command_piece_next, which the loader uses to check
 * placeholders and spec_render_argv uses to fill them, so both read braces the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

void spec_format_double(double v, char *buf, size_t cap) {
  int precision = 1;
  while (precision < 17) {
    snprintf(buf, cap, "%.*g", precision, v);
    if (strtod(buf, NULL) == v) break;
    precision++;
  }
  snprintf(buf, cap, "%.*g", precision, v);
  /* %g writes 3600 as "3.6e+03" at 2 digits; like Python's repr, numbers below 1e16 are
   * written in plain digits, which are just as exact. */
  const char *e = strchr(buf, 'e');
  int exponent = e ? atoi(e + 1) : 0;
  if (e && exponent >= 0 && exponent < 16)
    snprintf(buf, cap, "%.*g", exponent + 1 > precision ? exponent + 1 : precision, v);
}

/* Numbers, bools and null into buf; false for strings, arrays and objects. */
static bool scalar_text(const json_t *value, char *buf, size_t cap) {
  switch (json_typeof(value)) {
  case JSON_INTEGER: snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(value)); break;
  case JSON_REAL:
    spec_format_double(json_real_value(value), buf, cap);
    break;
  case JSON_TRUE: snprintf(buf, cap, "true"); break;
  case JSON_FALSE: snprintf(buf, cap, "false"); break;
  case JSON_NULL: snprintf(buf, cap, "null"); break;
  default: return false;
  }
  return true;
}

char *spec_value_text(const json_t *value) {
  char buf[32];
  if (!value) return strdup("");
  if (json_is_string(value)) return strdup(json_string_value(value));
  if (scalar_text(value, buf, sizeof buf)) return strdup(buf);
  return json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
}

void spec_describe_value(const json_t *value, char *buf, size_t cap) {
  if (json_is_string(value)) {
    snprintf(buf, cap, "'%s'", json_string_value(value));
  } else if (json_is_real(value)) {
    /* A whole real is written as one, since messages say when a real is not an integer. */
    scalar_text(value, buf, cap);
    if (!strpbrk(buf, ".e")) snprintf(buf + strlen(buf), cap - strlen(buf), ".0");
  } else if (!scalar_text(value, buf, cap)) {
    char *dumped = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(buf, cap, "%s", dumped ? dumped : "?");
    free(dumped);
  }
}

void spec_describe_list(const json_t *array, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "[");
  for (size_t i = 0; i < json_array_size(array) && used < cap; i++) {
    char item[64];
    spec_describe_value(json_array_get(array, i), item, sizeof item);
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", item);
  }
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

void spec_describe_condition(const spec *s, const param_condition *cond, char *buf, size_t cap) {
  char values[200];
  if (cond->op == COND_IN)
    spec_describe_list(cond->values, values, sizeof values);
  else
    spec_describe_value(json_array_get(cond->values, 0), values, sizeof values);
  snprintf(buf, cap, "%s %s %s", s->params[cond->parent].name, spec_cond_op_text(cond->op), values);
}

int spec_command_piece_next(const char *arg, size_t *pos, command_piece *piece) {
  const char *at = arg + *pos;
  *piece = (command_piece){.start = at, .len = 1};
  if (*at == '\0') return 0;
  if ((at[0] == '{' && at[1] == '{') || (at[0] == '}' && at[1] == '}')) {
    *pos += 2;
    return 1;
  }
  if (*at == '}') {
    piece->error = "'}' without an opening '{' (write '}}' for a literal brace)";
    return -1;
  }
  if (*at == '{') {
    size_t len = strcspn(at + 1, "{}");
    if (at[1 + len] != '}') {
      piece->error = "'{' without a closing '}' (write '{{' for a literal brace)";
      return -1;
    }
    if (len == 0) {
      piece->error = "empty placeholder {} (write {{}} for literal braces)";
      return -1;
    }
    *piece = (command_piece){.start = at + 1, .len = len, .is_param = true};
    *pos += len + 2;
    return 1;
  }
  piece->len = strcspn(at, "{}");
  *pos += piece->len;
  return 1;
}

/* The text a placeholder stands for: the value's text, or nothing when inactive. */
static int write_param(const spec *s, const json_t *params, const command_piece *piece, FILE *out,
                       nas_err *err) {
  int index = spec_param_find(s->params, s->n_params, piece->start, piece->len);
  if (index < 0)
    return nas_errf(err, "placeholder {%.*s} names no parameter", (int)piece->len, piece->start);
  if (!spec_param_active(s, (size_t)index, params)) return NAS_OK;
  const char *name = s->params[index].name;
  const json_t *value = json_object_get(params, name);
  if (!value) return nas_errf(err, "parameter '%s' has no value", name);
  char *text = spec_value_text(value);
  if (!text) return nas_errf(err, "out of memory");
  fputs(text, out);
  free(text);
  return NAS_OK;
}

static int render_arg(const spec *s, const json_t *params, const char *arg, char **out,
                      nas_err *err) {
  char *buf = NULL;
  size_t len = 0, pos = 0;
  FILE *text = open_memstream(&buf, &len);
  if (!text) return nas_errf(err, "out of memory");
  command_piece piece;
  int more = 0, rc = NAS_OK;
  while (!rc && (more = spec_command_piece_next(arg, &pos, &piece)) > 0) {
    if (piece.is_param)
      rc = write_param(s, params, &piece, text, err);
    else
      fwrite(piece.start, 1, piece.len, text);
  }
  if (!rc && more < 0) rc = nas_errf(err, "command argument '%s': %s", arg, piece.error);
  int closed = nas_memstream_close(text, &buf, rc ? NULL : err);
  if (!rc) rc = closed;
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  return NAS_OK;
}

int spec_render_argv(const spec *s, const json_t *params, char ***argv_out, nas_err *err) {
  *argv_out = NULL;
  char **argv = calloc(s->trial.argc + 1, sizeof *argv);
  if (!argv) return nas_errf(err, "out of memory");
  for (size_t i = 0; i < s->trial.argc; i++) {
    int rc = render_arg(s, params, s->trial.argv[i], &argv[i], err);
    if (rc) {
      spec_argv_free(argv);
      return rc;
    }
  }
  *argv_out = argv;
  return NAS_OK;
}

void spec_argv_free(char **argv) {
  if (!argv) return;
  for (char **arg = argv; *arg; arg++) free(*arg);
  free(argv);
}
