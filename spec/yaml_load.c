/* spec/yaml_load.c: YAML text -> libyaml document, within the limits a spec must keep.
 *
 * libyaml's own loader (yaml_parser_load) has no limits, and a few hundred kilobytes
 * keep it busy for minutes: nesting 100 000 deep takes it half a minute (its simple-key
 * bookkeeping is quadratic in the depth), every alias is looked up among all anchors, and
 * aliases of aliases expand exponentially once a reader walks the tree. This loader
 * builds the same document from libyaml's events and stops at the first limit passed
 * (internal.h: depth, entries of one list or mapping, values with aliases expanded,
 * anchors), with FILE:LINE:COL and the limit in the message. Every check the readers
 * make afterwards is then bounded: the quadratic ones (duplicate keys, choices) look at
 * most SPEC_MAX_ENTRIES entries of one collection.
 *
 * More differences from libyaml's loader:
 * - An alias may only name a node that is complete, so the document has no cycles.
 * - A scalar holding a NUL character (a double-quoted "\0") is refused: the readers take
 *   scalars as C strings and would cut it short there.
 * - Tags are applied, not dropped (the document would read `!!str 7` as the number 7):
 *   `!!str` and `!` make a scalar a string exactly as quotes do (the readers type quoted
 *   scalars as strings, so the scalar is stored with a quoted style); `!!int`, `!!float`,
 *   `!!bool` and `!!null` check that the text is one and read it as a plain scalar;
 *   `!!seq` and `!!map` on a list and a mapping are accepted. Any other tag
 *   (`!!python/object`, `!!set`, `!custom`) is refused. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

#define CORE_TAG "tag:yaml.org,2002:"

/* A list or mapping whose end has not been read yet. */
typedef struct {
  int id;              /* its node */
  bool mapping;
  size_t entries;      /* items, or pairs once their key is read */
  int key;             /* mapping: node of a key waiting for its value; 0 = none */
  size_t values_before; /* loader.values when it started */
  char *anchor;        /* owned: defined once the node is complete; NULL = none */
  yaml_mark_t mark;
} open_node;

typedef struct {
  char *name;    /* owned */
  int id;
  size_t values; /* nodes it stands for, aliases in it expanded */
  yaml_mark_t mark;
} anchor_def;

typedef struct {
  yaml_document_t *doc;
  const char *file;
  nas_err *err;
  open_node open[SPEC_MAX_DEPTH];
  size_t depth;
  anchor_def anchors[SPEC_MAX_ANCHORS];
  size_t n_anchors;
  size_t values;     /* nodes so far, aliases counted as the nodes they stand for */
  size_t documents;  /* document starts seen */
} loader;

static int mark_errf(const loader *l, yaml_mark_t mark, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int mark_errf(const loader *l, yaml_mark_t mark, const char *fmt, ...) {
  char msg[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nas_errf(l->err, "%s:%zu:%zu: %s", l->file, mark.line + 1, mark.column + 1, msg);
}

void spec_offset_position(const char *text, size_t offset, size_t *line, size_t *col) {
  *line = 1;
  *col = 1;
  /* a byte order mark starting the text is no column, as for libyaml's marks */
  size_t first = strncmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
  for (size_t i = first; i < offset && text[i]; i++) {
    if (text[i] == '\n') {
      (*line)++;
      *col = 1;
    } else if (((unsigned char)text[i] & 0xC0) != 0x80) { /* not inside a UTF-8 sequence */
      (*col)++;
    }
  }
}

static int syntax_error(const yaml_parser_t *parser, const char *text, const char *file,
                        nas_err *err) {
  /* libyaml leaves error unset when copying a tag fails, so that is a memory error too. */
  if (parser->error == YAML_MEMORY_ERROR || parser->error == YAML_NO_ERROR)
    return nas_errf(err, "%s: out of memory", file);
  size_t line = parser->problem_mark.line + 1, col = parser->problem_mark.column + 1;
  if (parser->error == YAML_READER_ERROR)
    spec_offset_position(text, parser->problem_offset, &line, &col);
  const char *problem = parser->problem ? parser->problem : "cannot be read";
  /* libyaml's words for a tab are "cannot start any token"; say what to change. */
  bool tab = parser->error == YAML_SCANNER_ERROR && parser->problem_mark.index < strlen(text) &&
             text[parser->problem_mark.index] == '\t';
  const char *hint = tab ? "; indent with spaces, YAML does not allow tabs there" : "";
  if (parser->context)
    return nas_errf(err, "%s:%zu:%zu: YAML syntax error: %s (%s at line %zu, column %zu)%s", file,
                    line, col, problem, parser->context, parser->context_mark.line + 1,
                    parser->context_mark.column + 1, hint);
  return nas_errf(err, "%s:%zu:%zu: YAML syntax error: %s%s", file, line, col, problem, hint);
}

/* A tag as a user writes it: "!!int" for the core schema's, else as given. */
static void tag_text(const char *tag, char *buf, size_t cap) {
  if (strncmp(tag, CORE_TAG, strlen(CORE_TAG)) == 0)
    snprintf(buf, cap, "!!%s", tag + strlen(CORE_TAG));
  else
    snprintf(buf, cap, "%s", tag);
}

static bool is_core_tag(const char *tag, const char *name) {
  return strncmp(tag, CORE_TAG, strlen(CORE_TAG)) == 0 && strcmp(tag + strlen(CORE_TAG), name) == 0;
}

static int unsupported_tag(const loader *l, yaml_mark_t mark, const char *tag) {
  char shown[128];
  tag_text(tag, shown, sizeof shown);
  return mark_errf(l, mark,
                   "the YAML tag '%s' is not supported; a spec takes only !!str, !!int, "
                   "!!float, !!bool, !!null, !!seq and !!map (remove the tag, or quote the "
                   "value for a string)",
                   shown);
}

/* Refuses tag on a node of the kind `where` names ("a single value", "a list", "a
 * mapping"): a standard tag is told where it belongs, any other is unsupported. */
static int refused_tag(const loader *l, yaml_mark_t mark, const char *tag, const char *where) {
  static const char *const standard[] = {"str", "int", "float", "bool", "null", "seq", "map"};
  bool is_standard = false;
  for (size_t i = 0; i < sizeof standard / sizeof standard[0]; i++)
    is_standard = is_standard || is_core_tag(tag, standard[i]);
  if (!is_standard) return unsupported_tag(l, mark, tag);
  char shown[128];
  tag_text(tag, shown, sizeof shown);
  return mark_errf(l, mark,
                   "the YAML tag '%s' cannot tag %s: !!str, !!int, !!float, !!bool and !!null "
                   "tag single values, !!seq lists, !!map mappings",
                   shown, where);
}

/* The style a tagged scalar is stored with, so that the readers type it as the tag says
 * (see the top of the file). */
static int scalar_style(const loader *l, const yaml_event_t *e, yaml_scalar_style_t *style) {
  static const struct {
    const char *name;
    scalar_kind kind;
    const char *what;
  } typed[] = {{"int", SCALAR_INT, "an integer"},
               {"float", SCALAR_REAL, "a decimal number"},
               {"bool", SCALAR_BOOL, "true or false"},
               {"null", SCALAR_NULL, "null, ~ or nothing"}};
  const char *tag = (const char *)e->data.scalar.tag, *text = (const char *)e->data.scalar.value;
  *style = e->data.scalar.style;
  if (!tag) return NAS_OK;
  if (strcmp(tag, "!") == 0 || is_core_tag(tag, "str")) {
    *style = YAML_SINGLE_QUOTED_SCALAR_STYLE;
    return NAS_OK;
  }
  for (size_t i = 0; i < sizeof typed / sizeof typed[0]; i++) {
    if (!is_core_tag(tag, typed[i].name)) continue;
    scalar_kind kind = spec_scalar_kind_of(text, true);
    if (kind != typed[i].kind && !(typed[i].kind == SCALAR_REAL && kind == SCALAR_INT))
      return mark_errf(l, e->start_mark, "'!!%s' needs %s, got '%.40s'", typed[i].name,
                       typed[i].what, text);
    *style = YAML_PLAIN_SCALAR_STYLE;
    return NAS_OK;
  }
  return refused_tag(l, e->start_mark, tag, "a single value");
}

static int collection_tag(const loader *l, const yaml_event_t *e, const yaml_char_t *tag,
                          const char *core) {
  const char *text = (const char *)tag;
  if (!text || strcmp(text, "!") == 0 || is_core_tag(text, core)) return NAS_OK;
  return refused_tag(l, e->start_mark, text, strcmp(core, "map") == 0 ? "a mapping" : "a list");
}

static void set_marks(const loader *l, int id, const yaml_event_t *e) {
  yaml_node_t *node = yaml_document_get_node(l->doc, id);
  node->start_mark = e->start_mark;
  node->end_mark = e->end_mark;
}

/* Counts `values` more nodes (an alias counts as all it stands for). */
static int count_values(loader *l, size_t values, yaml_mark_t mark) {
  l->values += values;
  if (l->values <= SPEC_MAX_VALUES) return NAS_OK;
  return mark_errf(l, mark,
                   "the file holds more than %d values (aliases counted as what they stand "
                   "for); a spec may hold at most %d",
                   SPEC_MAX_VALUES, SPEC_MAX_VALUES);
}

/* Makes node id the next entry of the innermost open collection (or the root). */
static int attach(loader *l, int id) {
  if (l->depth == 0) return NAS_OK; /* the first node is the document's root */
  open_node *parent = &l->open[l->depth - 1];
  int ok;
  if (!parent->mapping) {
    ok = yaml_document_append_sequence_item(l->doc, parent->id, id);
  } else if (!parent->key) {
    parent->key = id;
    return NAS_OK;
  } else {
    ok = yaml_document_append_mapping_pair(l->doc, parent->id, parent->key, id);
    parent->key = 0;
  }
  if (!ok) return nas_errf(l->err, "%s: out of memory", l->file);
  if (++parent->entries <= SPEC_MAX_ENTRIES) return NAS_OK;
  return mark_errf(l, parent->mark,
                   "this %s has more than %d entries; a spec allows at most %d in one list "
                   "or mapping (parameters, choices, command arguments, ...)",
                   parent->mapping ? "mapping" : "list", SPEC_MAX_ENTRIES, SPEC_MAX_ENTRIES);
}

static anchor_def *anchor_find(loader *l, const char *name) {
  for (size_t i = 0; i < l->n_anchors; i++)
    if (strcmp(l->anchors[i].name, name) == 0) return &l->anchors[i];
  return NULL;
}

/* Defines anchor (borrowed; NULL = none) for the complete node id. */
static int anchor_define(loader *l, const yaml_char_t *anchor, int id, size_t values,
                         yaml_mark_t mark) {
  const char *name = (const char *)anchor;
  if (!name) return NAS_OK;
  const anchor_def *first = anchor_find(l, name);
  if (first)
    return mark_errf(l, mark, "the anchor '&%s' is defined twice (first at line %zu, column %zu)",
                     name, first->mark.line + 1, first->mark.column + 1);
  if (l->n_anchors == SPEC_MAX_ANCHORS)
    return mark_errf(l, mark, "more than %d anchors; a spec may define at most %d",
                     SPEC_MAX_ANCHORS, SPEC_MAX_ANCHORS);
  char *copy = strdup(name);
  if (!copy) return nas_errf(l->err, "%s: out of memory", l->file);
  l->anchors[l->n_anchors++] = (anchor_def){copy, id, values, mark};
  return NAS_OK;
}

static int on_scalar(loader *l, const yaml_event_t *e) {
  /* A double-quoted "\0" would be cut short by every reader of the text as a C string. */
  if (memchr(e->data.scalar.value, '\0', e->data.scalar.length))
    return mark_errf(l, e->start_mark,
                     "the value holds a NUL character (\\0), which a spec cannot pass on");
  yaml_scalar_style_t style;
  int rc = scalar_style(l, e, &style);
  if (rc) return rc;
  int id = yaml_document_add_scalar(l->doc, NULL, e->data.scalar.value,
                                    (int)e->data.scalar.length, style);
  if (!id) return nas_errf(l->err, "%s: out of memory", l->file);
  set_marks(l, id, e);
  rc = count_values(l, 1, e->start_mark);
  if (!rc) rc = attach(l, id);
  if (!rc) rc = anchor_define(l, e->data.scalar.anchor, id, 1, e->start_mark);
  return rc;
}

static int on_alias(loader *l, const yaml_event_t *e) {
  const char *name = (const char *)e->data.alias.anchor;
  const anchor_def *def = anchor_find(l, name);
  if (!def)
    return mark_errf(l, e->start_mark,
                     "the alias '*%s' names no complete node before it (define '&%s' first; "
                     "an alias cannot be inside the node it names)",
                     name, name);
  int rc = count_values(l, def->values, e->start_mark);
  return rc ? rc : attach(l, def->id);
}

static int on_collection_start(loader *l, const yaml_event_t *e, bool mapping) {
  const yaml_char_t *tag = mapping ? e->data.mapping_start.tag : e->data.sequence_start.tag;
  const yaml_char_t *anchor =
      mapping ? e->data.mapping_start.anchor : e->data.sequence_start.anchor;
  int rc = collection_tag(l, e, tag, mapping ? "map" : "seq");
  if (rc) return rc;
  if (l->depth == SPEC_MAX_DEPTH)
    return mark_errf(l, e->start_mark,
                     "nested more than %d levels deep; a spec may nest at most %d", SPEC_MAX_DEPTH,
                     SPEC_MAX_DEPTH);
  int id = mapping ? yaml_document_add_mapping(l->doc, NULL, e->data.mapping_start.style)
                   : yaml_document_add_sequence(l->doc, NULL, e->data.sequence_start.style);
  if (!id) return nas_errf(l->err, "%s: out of memory", l->file);
  set_marks(l, id, e);
  if ((rc = count_values(l, 1, e->start_mark)) || (rc = attach(l, id))) return rc;
  char *anchor_copy = NULL;
  if (anchor && !(anchor_copy = strdup((const char *)anchor)))
    return nas_errf(l->err, "%s: out of memory", l->file);
  l->open[l->depth++] = (open_node){.id = id, .mapping = mapping, .values_before = l->values - 1,
                                    .anchor = anchor_copy, .mark = e->start_mark};
  return NAS_OK;
}

static int on_collection_end(loader *l, const yaml_event_t *e) {
  open_node *node = &l->open[--l->depth];
  yaml_node_t *made = yaml_document_get_node(l->doc, node->id);
  made->end_mark = e->end_mark;
  int rc = anchor_define(l, (const yaml_char_t *)node->anchor, node->id,
                         l->values - node->values_before, node->mark);
  free(node->anchor);
  node->anchor = NULL;
  return rc;
}

static int on_event(loader *l, const yaml_event_t *e) {
  switch (e->type) {
  case YAML_DOCUMENT_START_EVENT:
    if (l->documents++ == 0) return NAS_OK;
    return mark_errf(l, e->start_mark, "only one YAML document is allowed ('---' starts another)");
  case YAML_SCALAR_EVENT: return on_scalar(l, e);
  case YAML_ALIAS_EVENT: return on_alias(l, e);
  case YAML_SEQUENCE_START_EVENT: return on_collection_start(l, e, false);
  case YAML_MAPPING_START_EVENT: return on_collection_start(l, e, true);
  case YAML_SEQUENCE_END_EVENT:
  case YAML_MAPPING_END_EVENT: return on_collection_end(l, e);
  default: return NAS_OK; /* stream start and end, document end */
  }
}

static void loader_clear(loader *l) {
  for (size_t i = 0; i < l->depth; i++) free(l->open[i].anchor);
  for (size_t i = 0; i < l->n_anchors; i++) free(l->anchors[i].name);
}

int spec_yaml_load(const char *text, const char *file, yaml_document_t *doc, nas_err *err) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return nas_errf(err, "%s: out of memory", file);
  if (!yaml_document_initialize(doc, NULL, NULL, NULL, 1, 1)) {
    yaml_parser_delete(&parser);
    return nas_errf(err, "%s: out of memory", file);
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
  loader *l = calloc(1, sizeof *l);
  int rc = l ? NAS_OK : nas_errf(err, "%s: out of memory", file);
  if (l) *l = (loader){.doc = doc, .file = file, .err = err};
  for (bool done = false; !rc && !done;) {
    yaml_event_t event;
    if (!yaml_parser_parse(&parser, &event)) {
      rc = syntax_error(&parser, text, file, err);
      break;
    }
    done = event.type == YAML_STREAM_END_EVENT;
    rc = on_event(l, &event);
    yaml_event_delete(&event);
  }
  if (l) loader_clear(l);
  free(l);
  yaml_parser_delete(&parser);
  if (rc) yaml_document_delete(doc);
  return rc;
}
