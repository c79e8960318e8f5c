/* spec/node.c: reading libyaml document nodes into checked values.
 *
 * Every reader takes the node it reads and a dotted field path ("parameters.lr.low"), so a
 * failure reads "FILE:LINE:COL: parameters.lr.low: expected a number, got 'abc'". Lines
 * and columns are 1-based (libyaml's marks are 0-based). Scalars are typed the way a user
 * expects: plain true/false are bools, plain numbers are numbers, quoted text is always a
 * string. Readers return borrowed pointers into the document except where they say owned. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

/* Deep enough for any sensible options block; stops alias loops (`&a [*a]`). */
enum { JSON_MAX_DEPTH = 64 };

const char *spec_field_join(char *buf, const char *what, const char *key) {
  snprintf(buf, FIELD_CAP, "%s.%s", what, key);
  return buf;
}

static bool word_in(const char *text, const char *const *words) {
  for (; *words; words++)
    if (strcmp(text, *words) == 0) return true;
  return false;
}

static bool skip_digits(const char **p) {
  const char *start = *p;
  while (isdigit((unsigned char)**p)) (*p)++;
  return *p > start;
}

static void skip_sign(const char **p) {
  if (**p == '+' || **p == '-') (*p)++;
}

static bool looks_integer(const char *t) {
  skip_sign(&t);
  return skip_digits(&t) && *t == '\0';
}

/* Decimal reals only: no hex, inf or nan, which strtod would also take. */
static bool looks_real(const char *t) {
  skip_sign(&t);
  bool whole = skip_digits(&t), frac = false;
  if (*t == '.') {
    t++;
    frac = skip_digits(&t);
  }
  if (!whole && !frac) return false;
  if (*t == 'e' || *t == 'E') {
    t++;
    skip_sign(&t);
    if (!skip_digits(&t)) return false;
  }
  return *t == '\0';
}

scalar_kind spec_scalar_kind_of(const char *text, bool plain) {
  static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
  static const char *const bools[] = {"true", "True", "TRUE", "false", "False", "FALSE", NULL};
  if (!plain) return SCALAR_STRING;
  if (word_in(text, nulls)) return SCALAR_NULL;
  if (word_in(text, bools)) return SCALAR_BOOL;
  if (looks_integer(text)) {
    errno = 0;
    (void)strtoll(text, NULL, 10);
    if (errno != ERANGE) return SCALAR_INT;
  }
  if (looks_real(text) && isfinite(strtod(text, NULL))) return SCALAR_REAL;
  return SCALAR_STRING;
}

json_t *spec_scalar_json(const char *text, bool plain) {
  switch (spec_scalar_kind_of(text, plain)) {
    case SCALAR_NULL:
      return json_null();
    case SCALAR_BOOL:
      return json_boolean(tolower((unsigned char)text[0]) == 't');
    case SCALAR_INT:
      return json_integer(strtoll(text, NULL, 10));
    case SCALAR_REAL:
      return json_real(strtod(text, NULL));
    case SCALAR_STRING:
      break;
  }
  return json_string(text);
}

size_t spec_name_span(const char *text, const char *extra) {
  size_t n = 0;
  for (char ch = text[0]; ch; ch = text[++n]) {
    bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    if (!alnum && ch != '_' && !strchr(extra, ch)) break;
  }
  return n;
}

bool spec_is_identifier(const char *text, const char *extra) {
  char first = text[0];
  bool starts = (first >= 'a' && first <= 'z') || (first >= 'A' && first <= 'Z') || first == '_';
  return starts && text[spec_name_span(text, extra)] == '\0';
}

bool spec_is_listing_column(const char *name) {
  static const char *const columns[] = {"trial",      "attempt",    "status",      "rung",
                                        "reference",  "error",      "created_at",  "started_at",
                                        "finished_at", "duration_s", NULL};
  for (const char *const *column = columns; *column; column++)
    if (strcmp(name, *column) == 0) return true;
  return false;
}

int spec_check_listing_column(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                              const char *name, const char *kind) {
  if (spec_is_listing_column(name))
    return spec_node_errf(c, node,
                          "%s: '%s' is a column of the trial listings (trial, attempt, status, "
                          "rung, reference, error, timings); give the %s another name",
                          what, name, kind);
  return NAS_OK;
}

int spec_inline_value(const char *text, json_t **out, nas_err *err) {
  *out = NULL;
  text += strspn(text, " ");
  size_t len = strlen(text);
  while (len > 0 && text[len - 1] == ' ') len--;
  if (len == 0) return NAS_OK;
  if (len >= 2 && (text[0] == '\'' || text[0] == '"') && text[len - 1] == text[0]) {
    *out = json_stringn(text + 1, len - 2);
  } else {
    char *plain = strndup(text, len);
    *out = plain ? spec_scalar_json(plain, true) : NULL;
    free(plain);
  }
  return *out ? NAS_OK : nas_errf(err, "out of memory");
}

const char *spec_nearest_name(const char *word, const char *const *names) {
  size_t n = 0;
  while (names[n]) n++;
  return nas_nearest(word, names, n);
}

int spec_node_errf(const yaml_ctx *c, const yaml_node_t *node, const char *fmt, ...) {
  char msg[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nas_errf(c->err, "%s:%zu:%zu: %s", c->file, node->start_mark.line + 1,
                  node->start_mark.column + 1, msg);
}

const char *spec_node_scalar_text(const yaml_node_t *node) {
  return node->type == YAML_SCALAR_NODE ? (const char *)node->data.scalar.value : NULL;
}

static bool node_plain(const yaml_node_t *node) {
  return node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static scalar_kind node_scalar_kind(const yaml_node_t *node) {
  return spec_scalar_kind_of(spec_node_scalar_text(node), node_plain(node));
}

bool spec_node_is_null(const yaml_node_t *node) {
  return node->type == YAML_SCALAR_NODE && node_scalar_kind(node) == SCALAR_NULL;
}

/* What a node holds, for "got ..." in messages; long text is cut short. */
static void node_describe(const yaml_node_t *node, char *buf, size_t cap) {
  if (node->type == YAML_MAPPING_NODE) {
    snprintf(buf, cap, "a mapping");
  } else if (node->type == YAML_SEQUENCE_NODE) {
    snprintf(buf, cap, "a list");
  } else if (spec_node_is_null(node)) {
    snprintf(buf, cap, "nothing");
  } else {
    const char *text = spec_node_scalar_text(node);
    int shown = strlen(text) > 40 ? 37 : 40;
    const char *more = strlen(text) > 40 ? "..." : "";
    if (node_plain(node))
      snprintf(buf, cap, "'%.*s%s'", shown, text, more);
    else
      snprintf(buf, cap, "the quoted string \"%.*s%s\"", shown, text, more);
  }
}

int spec_node_expected(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                       const char *expected) {
  char got[96];
  node_describe(node, got, sizeof got);
  return spec_node_errf(c, node, "%s: expected %s, got %s", what, expected, got);
}

yaml_node_t *spec_node_at(const yaml_ctx *c, int id) { return yaml_document_get_node(c->doc, id); }

static yaml_node_pair_t *node_pair(const yaml_ctx *c, const yaml_node_t *map, const char *key) {
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
       pair++) {
    const char *text = spec_node_scalar_text(spec_node_at(c, pair->key));
    if (text && strcmp(text, key) == 0) return pair;
  }
  return NULL;
}

yaml_node_t *spec_node_optional(const yaml_ctx *c, const yaml_node_t *map, const char *key) {
  yaml_node_pair_t *pair = node_pair(c, map, key);
  if (!pair) return NULL;
  yaml_node_t *value = spec_node_at(c, pair->value);
  return spec_node_is_null(value) ? NULL : value;
}

int spec_node_required(const yaml_ctx *c, const yaml_node_t *map, const char *what, const char *key,
                       yaml_node_t **out) {
  yaml_node_pair_t *pair = node_pair(c, map, key);
  if (!pair) return spec_node_errf(c, map, "%s: missing required key '%s'", what, key);
  yaml_node_t *value = spec_node_at(c, pair->value);
  if (spec_node_is_null(value))
    return spec_node_errf(c, spec_node_at(c, pair->key), "%s: '%s' has no value", what, key);
  *out = value;
  return NAS_OK;
}

/* "a, b, c" for the keys a message lists. */
static void join_names(const char *const *names, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (const char *const *n = names; *n && used < cap; n++) {
    int w = snprintf(buf + used, cap - used, "%s%s", n == names ? "" : ", ", *n);
    if (w < 0) break;
    used += (size_t)w;
  }
}

int spec_node_check_keys(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                         const char *const *known) {
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
       pair++) {
    yaml_node_t *key = spec_node_at(c, pair->key);
    const char *text = spec_node_scalar_text(key);
    if (word_in(text, known)) continue;
    const char *guess = spec_nearest_name(text, known);
    if (guess)
      return spec_node_errf(c, key, "%s: unknown key '%s'; did you mean '%s'?", what, text, guess);
    char list[400];
    join_names(known, list, sizeof list);
    return spec_node_errf(c, key, "%s: unknown key '%s' (known keys: %s)", what, text, list);
  }
  return NAS_OK;
}

static int check_mapping_keys_unique(const yaml_ctx *c, const yaml_node_t *map) {
  yaml_node_pair_t *start = map->data.mapping.pairs.start, *top = map->data.mapping.pairs.top;
  for (yaml_node_pair_t *pair = start; pair < top; pair++) {
    yaml_node_t *key = spec_node_at(c, pair->key);
    const char *text = spec_node_scalar_text(key);
    if (!text)
      return spec_node_errf(c, key, "mapping keys must be plain names, not %s",
                            key->type == YAML_MAPPING_NODE ? "mappings" : "lists");
    for (yaml_node_pair_t *earlier = start; earlier < pair; earlier++) {
      yaml_node_t *first = spec_node_at(c, earlier->key);
      if (strcmp(spec_node_scalar_text(first), text) == 0)
        return spec_node_errf(c, key, "duplicate key '%s' (first at line %zu, column %zu)", text,
                              first->start_mark.line + 1, first->start_mark.column + 1);
    }
  }
  return NAS_OK;
}

int spec_node_check_unique_keys(const yaml_ctx *c) {
  for (yaml_node_t *node = c->doc->nodes.start; node < c->doc->nodes.top; node++) {
    if (node->type != YAML_MAPPING_NODE) continue;
    int rc = check_mapping_keys_unique(c, node);
    if (rc) return rc;
  }
  return NAS_OK;
}

int spec_node_expect_mapping(const yaml_ctx *c, const yaml_node_t *node, const char *what) {
  return node->type == YAML_MAPPING_NODE ? NAS_OK : spec_node_expected(c, node, what, "a mapping");
}

int spec_node_expect_list(const yaml_ctx *c, const yaml_node_t *node, const char *what) {
  return node->type == YAML_SEQUENCE_NODE ? NAS_OK : spec_node_expected(c, node, what, "a list");
}

int spec_node_text(const yaml_ctx *c, const yaml_node_t *node, const char *what, const char **out) {
  if (node->type != YAML_SCALAR_NODE || spec_node_is_null(node))
    return spec_node_expected(c, node, what, "a string");
  *out = spec_node_scalar_text(node);
  return NAS_OK;
}

int spec_node_dup_text(const yaml_ctx *c, const yaml_node_t *node, const char *what, char **out) {
  const char *text = NULL;
  int rc = spec_node_text(c, node, what, &text);
  if (rc) return rc;
  *out = strdup(text);
  return *out ? NAS_OK : spec_node_errf(c, node, "%s: out of memory", what);
}

int spec_node_dup_string(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                         const char *expected, char **out) {
  if (node->type != YAML_SCALAR_NODE || node_scalar_kind(node) != SCALAR_STRING)
    return spec_node_expected(c, node, what, expected);
  return spec_node_dup_text(c, node, what, out);
}

/* The quoted number hint turns `low: "0.5"` into an error that says how to fix it. */
static int expected_number(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                           const char *expected) {
  if (node->type == YAML_SCALAR_NODE && !node_plain(node) &&
      spec_scalar_kind_of(spec_node_scalar_text(node), true) != SCALAR_STRING) {
    char want[80];
    snprintf(want, sizeof want, "%s (write it without quotes)", expected);
    return spec_node_expected(c, node, what, want);
  }
  return spec_node_expected(c, node, what, expected);
}

int spec_node_number(const yaml_ctx *c, const yaml_node_t *node, const char *what, double *out) {
  scalar_kind kind = node->type == YAML_SCALAR_NODE ? node_scalar_kind(node) : SCALAR_STRING;
  if (kind != SCALAR_INT && kind != SCALAR_REAL) return expected_number(c, node, what, "a number");
  *out = strtod(spec_node_scalar_text(node), NULL);
  return NAS_OK;
}

int spec_node_integer(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                      long long *out) {
  if (node->type != YAML_SCALAR_NODE || node_scalar_kind(node) != SCALAR_INT)
    return expected_number(c, node, what, "an integer");
  *out = strtoll(spec_node_scalar_text(node), NULL, 10);
  return NAS_OK;
}

int spec_node_bool(const yaml_ctx *c, const yaml_node_t *node, const char *what, bool *out) {
  if (node->type != YAML_SCALAR_NODE || node_scalar_kind(node) != SCALAR_BOOL)
    return spec_node_expected(c, node, what, "true or false");
  *out = tolower((unsigned char)spec_node_scalar_text(node)[0]) == 't';
  return NAS_OK;
}

/* Seconds in text such as "90", "-1", "90s" or "1.5h"; false when it is not a duration. */
static bool duration_seconds(const char *text, double *seconds) {
  static const char units[] = "smhd";
  static const double unit_seconds[] = {1, 60, 3600, 86400};
  size_t len = strlen(text);
  char number[48];
  if (len == 0 || len >= sizeof number) return false;
  const char *unit = strchr(units, text[len - 1]);
  size_t digits = unit ? len - 1 : len;
  memcpy(number, text, digits);
  number[digits] = '\0';
  if (!looks_real(number)) return false;
  *seconds = strtod(number, NULL) * (unit ? unit_seconds[unit - units] : 1);
  return true;
}

/* The longest duration a spec may give: 100 years. Far beyond it the seconds no longer fit
 * the time_t of a timer (the local runner's monitor would wait on an invalid time and spin),
 * and nothing meant as a limit is that long; "no limit" is said by leaving the key out. */
#define DURATION_MAX_S (100 * 365.25 * 86400)

int spec_node_duration(const yaml_ctx *c, const yaml_node_t *node, const char *what, double *out) {
  const char *text = spec_node_scalar_text(node);
  double seconds;
  if (!text || spec_node_is_null(node) || !duration_seconds(text, &seconds))
    return spec_node_expected(c, node, what,
                              "a duration such as 90, \"90s\", \"10m\", \"1.5h\" or \"2d\"");
  if (!(seconds > 0))
    return spec_node_errf(c, node, "%s: must be more than 0 seconds (leave it out for no limit)",
                          what);
  if (!(seconds <= DURATION_MAX_S)) /* infinity too, from 1e308d */
    return spec_node_errf(c, node, "%s: must be at most 100 years (\"36525d\"; leave it out for "
                          "no limit)", what);
  *out = seconds;
  return NAS_OK;
}

int spec_node_scalar_json(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                          json_t **out) {
  if (node->type != YAML_SCALAR_NODE || spec_node_is_null(node))
    return spec_node_expected(c, node, what, "a string, number or bool");
  /* libyaml's reader lets only valid UTF-8 through, so jansson fails here only for want
   * of memory. */
  *out = spec_scalar_json(spec_node_scalar_text(node), node_plain(node));
  return *out ? NAS_OK : spec_node_errf(c, node, "%s: out of memory", what);
}

static json_t *node_json_at(const yaml_ctx *c, const yaml_node_t *node, int depth,
                            bool *too_deep);

static json_t *mapping_json(const yaml_ctx *c, const yaml_node_t *map, int depth,
                            bool *too_deep) {
  json_t *object = json_object();
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start;
       object && pair < map->data.mapping.pairs.top; pair++) {
    json_t *value = node_json_at(c, spec_node_at(c, pair->value), depth + 1, too_deep);
    const char *key = spec_node_scalar_text(spec_node_at(c, pair->key));
    if (!value || json_object_set_new(object, key, value) != 0) {
      json_decref(object);
      object = NULL;
    }
  }
  return object;
}

static json_t *list_json(const yaml_ctx *c, const yaml_node_t *list, int depth,
                         bool *too_deep) {
  json_t *array = json_array();
  for (yaml_node_item_t *item = list->data.sequence.items.start;
       array && item < list->data.sequence.items.top; item++) {
    json_t *value = node_json_at(c, spec_node_at(c, *item), depth + 1, too_deep);
    if (json_array_append_new(array, value) != 0) {
      json_decref(array);
      array = NULL;
    }
  }
  return array;
}

/* NULL when nesting passes JSON_MAX_DEPTH (*too_deep is then set) or out of memory. */
static json_t *node_json_at(const yaml_ctx *c, const yaml_node_t *node, int depth,
                            bool *too_deep) {
  if (depth > JSON_MAX_DEPTH) {
    *too_deep = true;
    return NULL;
  }
  if (node->type == YAML_MAPPING_NODE) return mapping_json(c, node, depth, too_deep);
  if (node->type == YAML_SEQUENCE_NODE) return list_json(c, node, depth, too_deep);
  return spec_scalar_json(spec_node_scalar_text(node), node_plain(node));
}

int spec_node_json(const yaml_ctx *c, const yaml_node_t *node, const char *what, json_t **out) {
  bool too_deep = false;
  *out = node_json_at(c, node, 0, &too_deep);
  if (*out) return NAS_OK;
  if (!too_deep) return spec_node_errf(c, node, "%s: out of memory", what);
  return spec_node_errf(c, node,
                        "%s: cannot be stored (nested over %d levels deep, or an alias that "
                        "contains itself)",
                        what, JSON_MAX_DEPTH);
}
