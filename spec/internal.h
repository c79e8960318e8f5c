/* spec internals shared by the files of spec/ (not part of the public API).
 *
 * yaml_load.c  turns the text into a libyaml document within the limits below.
 * node.c    reads libyaml document nodes into checked values (yaml_ctx, spec_node_*).
 * params.c  decides what a parameter accepts (spec_param_accepts, spec_values_equal).
 * render.c  formats values (spec_format_double, spec_describe_value) and splits command arguments
 *           into literal text and {name} placeholders (spec_command_piece_next).
 * Readers take a dotted field path (`what`, e.g. "parameters.lr.low") that starts every
 * message after the FILE:LINE:COL prefix. */
#ifndef NAS_SPEC_INTERNAL_H
#define NAS_SPEC_INTERNAL_H

#include <yaml.h>

#include "spec/spec.h"

/* ---- yaml_load.c: the text as a YAML document ---- */

/* What one spec may hold (docs/spec.md, "Limits"): nesting depth of lists and mappings,
 * entries of one list or mapping, values in the whole file with every alias counted as
 * the values it stands for, and anchors. They keep every reader's work small (the
 * quadratic checks, such as duplicate keys and choices, see at most SPEC_MAX_ENTRIES). */
enum {
  SPEC_MAX_DEPTH = 64,
  SPEC_MAX_ENTRIES = 1000,
  SPEC_MAX_VALUES = 100000,
  SPEC_MAX_ANCHORS = 100,
};

/* Loads the one document of text into doc (which the caller deletes on success; a text
 * with no document gives a document without a root). Syntax errors, limits passed and
 * unsupported tags are reported as "FILE:LINE:COL: ...". */
int spec_yaml_load(const char *text, const char *file, yaml_document_t *doc, nas_err *err);
/* Line and column (1-based; columns in characters, as libyaml counts them) of a byte
 * offset of text, for the mistakes that carry only the offset. */
void spec_offset_position(const char *text, size_t offset, size_t *line, size_t *col);

/* ---- node.c: reading the YAML document ---- */

/* What every reader needs: the loaded document (borrowed) and where messages go. */
typedef struct {
  yaml_document_t *doc;
  const char *file; /* the name messages start with */
  nas_err *err;
} yaml_ctx;

/* Room for a dotted field path in messages ("parameters.lr.when.in"). */
enum { FIELD_CAP = 256 };
/* Writes "what.key" into buf (FIELD_CAP bytes, cut short when longer); returns buf. */
const char *spec_field_join(char *buf, const char *what, const char *key);

/* Scalar types as a user expects them: plain true/false are bools, plain ~/null/empty is
 * nothing, plain numbers (1, -3, 0.5, 1e-4) are numbers, anything quoted is a string. */
typedef enum { SCALAR_NULL, SCALAR_BOOL, SCALAR_INT, SCALAR_REAL, SCALAR_STRING } scalar_kind;

scalar_kind spec_scalar_kind_of(const char *text, bool plain);
/* Owned JSON for a scalar (json_null for nothing); NULL when out of memory. */
json_t *spec_scalar_json(const char *text, bool plain);
/* Length of the run of ASCII letters, digits, '_' and `extra` characters at text. */
size_t spec_name_span(const char *text, const char *extra);
/* Whether text is an ASCII letter or '_' followed by name characters (see spec_name_span).
 * Parameter and metric names allow ".-" as extra, environment names nothing. */
bool spec_is_identifier(const char *text, const char *extra);
/* Refuses, at node, a parameter or metric (`kind`) named like a column that trial listings
 * (`nas trials`, `nas pareto`, `nas ask`, and their JSON: one flat object per trial) put
 * beside the parameters and metrics: trial, attempt, status, rung, reference, error, timing
 * columns; one of the two would overwrite the other in every row. */
int spec_check_listing_column(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                              const char *name, const char *kind);
/* A value written inline in a string ("3", "adam", "'a b'"), surrounding spaces ignored:
 * quoted text is a string, the rest is typed like a plain scalar. *out is owned, NULL when
 * the text is blank; NAS_ERR only when out of memory. */
int spec_inline_value(const char *text, json_t **out, nas_err *err);
/* The name in names (NULL-terminated) nearest to word when close enough to be a likely
 * typo (edit distance <= 2 and below word's length), else NULL. */
const char *spec_nearest_name(const char *word, const char *const *names);

/* Writes "FILE:LINE:COL: <message>" for node into the context's error; returns NAS_ERR. */
int spec_node_errf(const yaml_ctx *c, const yaml_node_t *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "WHAT: expected EXPECTED, got <what node holds>". */
int spec_node_expected(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                       const char *expected);
/* A scalar's text, or NULL for mappings and lists. */
const char *spec_node_scalar_text(const yaml_node_t *node);
bool spec_node_is_null(const yaml_node_t *node);
/* A child node by id (pairs and items hold ids). */
yaml_node_t *spec_node_at(const yaml_ctx *c, int id);
/* The value of key in map; NULL when absent or written with no value (an optional key
 * with no value counts as not given). */
yaml_node_t *spec_node_optional(const yaml_ctx *c, const yaml_node_t *map, const char *key);
/* The value of a key that must be present with a value. */
int spec_node_required(const yaml_ctx *c, const yaml_node_t *map, const char *what, const char *key,
                       yaml_node_t **out);
/* Fails on the first key of map that is not in known (NULL-terminated), suggesting the
 * nearest known key. */
int spec_node_check_keys(const yaml_ctx *c, const yaml_node_t *map, const char *what,
                         const char *const *known);
/* Fails on the first duplicate or non-scalar key of any mapping in the document. */
int spec_node_check_unique_keys(const yaml_ctx *c);

int spec_node_expect_mapping(const yaml_ctx *c, const yaml_node_t *node, const char *what);
int spec_node_expect_list(const yaml_ctx *c, const yaml_node_t *node, const char *what);
/* A scalar with a value, as written (numbers and bools as their text); borrowed. */
int spec_node_text(const yaml_ctx *c, const yaml_node_t *node, const char *what, const char **out);
int spec_node_dup_text(const yaml_ctx *c, const yaml_node_t *node, const char *what, char **out);
/* As spec_node_dup_text for a field that only a string may be: a plain number, true/false
 * or nothing is refused too ("what: expected `expected`, got …"). */
int spec_node_dup_string(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                         const char *expected, char **out);
int spec_node_number(const yaml_ctx *c, const yaml_node_t *node, const char *what, double *out);
int spec_node_integer(const yaml_ctx *c, const yaml_node_t *node, const char *what, long long *out);
int spec_node_bool(const yaml_ctx *c, const yaml_node_t *node, const char *what, bool *out);
/* Seconds > 0 from a number or a string such as "90s", "10m", "1.5h", "2d". */
int spec_node_duration(const yaml_ctx *c, const yaml_node_t *node, const char *what, double *out);
/* A scalar with a value (string, number or bool) as owned JSON. */
int spec_node_scalar_json(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                          json_t **out);
/* Any node as owned JSON: mappings become objects, lists arrays, scalars typed. */
int spec_node_json(const yaml_ctx *c, const yaml_node_t *node, const char *what, json_t **out);

/* ---- param_parse.c, trial.c: sections of the file ---- */

int spec_parse_parameters(const yaml_ctx *c, const yaml_node_t *node, spec *s);
/* The trial section; node NULL when the spec has none (ask and tell only). */
int spec_parse_trial(const yaml_ctx *c, const yaml_node_t *node, const char *dir, spec *s);
/* builtin.c: trial.builtin (after parameters, which it checks) -> s->trial.builtin. */
int spec_parse_builtin(const yaml_ctx *c, const yaml_node_t *section, const char *dir, spec *s);
void spec_builtin_free(builtin_spec *b);
/* early_stopping: (optional; after objectives, which it refers to). */
int spec_parse_early_stopping(const yaml_ctx *c, const yaml_node_t *root, spec *s);
/* multi_fidelity.c: multi_fidelity: (optional; after early_stopping, which it excludes). */
int spec_parse_multi_fidelity(const yaml_ctx *c, const yaml_node_t *root, spec *s);
/* notify.c: notify: (optional) -> s->notify. */
int spec_parse_notify(const yaml_ctx *c, const yaml_node_t *root, spec *s);
void spec_notify_free(notify_spec *targets, size_t n);

/* assign.c: `enqueue:` and `warm_start:` (optional; after parameters, which they
 * assign). */
int spec_parse_enqueue(const yaml_ctx *c, const yaml_node_t *root, spec *s);
int spec_parse_warm_start(const yaml_ctx *c, const yaml_node_t *root, spec *s);
void spec_warm_start_free(warm_start_spec *w);

/* ---- params.c: what values parameters take ---- */

/* Equal JSON values, numbers compared by value (3 equals 3.0). */
bool spec_values_equal(const json_t *a, const json_t *b);
/* Whether p can take value; when not, why says so ("7 is outside [1, 4]"). */
bool spec_param_accepts(const param_spec *p, const json_t *value, char *why, size_t cap);
/* Whether offset is a whole number of steps (within 1e-9 relative). */
bool spec_on_step_grid(double offset, double step);
/* Whether value lies within p's [low, high] (p is a float or int parameter). */
bool spec_param_in_range(const param_spec *p, double value);
/* Index of the parameter whose name is the len bytes at name among the first n, or -1. */
int spec_param_find(const param_spec *params, size_t n, const char *name, size_t len);
/* The parameter name nearest to the len bytes at name, when it is a likely typo; else
 * NULL. Borrowed from s. */
const char *spec_param_nearest(const spec *s, const char *name, size_t len);
/* The YAML name of a parameter kind ("float", "categorical"). */
const char *spec_param_kind_name(param_kind kind);
/* Text of a condition's operator ("<=", "in"). */
const char *spec_cond_op_text(cond_op op);

/* ---- render.c: values as text, command arguments ---- */

/* Shortest %g text that reads back as exactly v; buf needs 32 bytes. */
void spec_format_double(double v, char *buf, size_t cap);
/* A value for messages: strings in quotes, others as spec_value_text writes them. */
void spec_describe_value(const json_t *value, char *buf, size_t cap);
/* "[a, b, c]" for an array, with spec_describe_value for each element. */
void spec_describe_list(const json_t *array, char *buf, size_t cap);
/* A condition as written in the string form ("layers >= 3", "opt in ['sgd', 'adam']"). */
void spec_describe_condition(const spec *s, const param_condition *cond, char *buf, size_t cap);

/* One piece of a command argument: literal text, or the name inside a {name}. */
typedef struct {
  const char *start;
  size_t len;
  bool is_param;
  const char *error; /* set when the argument is malformed at this point */
} command_piece;

/* Reads the piece of arg at *pos and moves *pos past it: 1 when a piece was read, 0 at
 * the end, -1 when the braces are malformed (piece->error says how). `{{` and `}}` read
 * as the literal pieces "{" and "}". */
int spec_command_piece_next(const char *arg, size_t *pos, command_piece *piece);

#endif
