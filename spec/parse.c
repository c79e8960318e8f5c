/* spec/parse.c: loading a spec file: YAML text -> validated, complete `spec`.
 *
 * The whole document is loaded with libyaml's document API, then read section by section
 * in a fixed order (parameters before trial, so placeholders can be checked). The first
 * problem found is reported as "FILE:LINE:COL: field: message" and everything built so far
 * is freed, so a failed load owns nothing. Defaults are filled here; nothing later needs
 * to re-validate a spec that loaded. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spec/internal.h"

static const char *const root_keys[] = {"name",       "storage",     "seed",  "parameters",
                                        "objectives", "constraints", "trial", "budget",
                                        "runner",     "optimizer",   "early_stopping",
                                        "enqueue",    "warm_start",  "notify",
                                        "multi_fidelity", NULL};
static const char *const runner_types[] = {"local", "slurm", NULL};
static const char *const optimizer_types[] = {"gp", "random", "sobol", NULL};

static int parse_identity(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  yaml_node_t *node;
  nas_err why;
  int rc = spec_node_required(c, root, "spec", "name", &node);
  if (!rc) rc = spec_node_dup_text(c, node, "name", &s->name);
  if (!rc && nas_check_experiment_name(s->name, &why) != NAS_OK)
    rc = spec_node_errf(c, node, "name: %s", why.msg);
  if (rc) return rc;
  node = spec_node_optional(c, root, "storage");
  if (node)
    rc = spec_node_dup_string(c, node, "storage",
                              "a storage URL (sqlite:PATH, postgresql://…, http://HOST:PORT)",
                              &s->storage);
  else if (!(s->storage = strdup("sqlite:nas.db")))
    rc = nas_errf(c->err, "out of memory");
  if (rc) return rc;
  long long seed = 0;
  node = spec_node_optional(c, root, "seed");
  if (node && (rc = spec_node_integer(c, node, "seed", &seed))) return rc;
  if (seed < 0) return spec_node_errf(c, node, "seed: must be 0 or more, got %lld", seed);
  s->seed = (long)seed;
  return NAS_OK;
}

static int check_metric_name(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                             const char *name) {
  if (spec_is_identifier(name, ".-")) return NAS_OK;
  return spec_node_errf(c, node,
                        "%s: '%s' is not a metric name (a letter or '_', then letters, "
                        "digits, '_', '.' or '-')",
                        what, name);
}

/* A metric's name must not be taken by a parameter, by a column of the trial listings or by
 * the "step" key of metric lines: in each case one of the two would be lost or misread. */
static int check_metric_unclaimed(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                                  const char *name, const spec *s) {
  if (strcmp(name, "step") == 0)
    return spec_node_errf(c, node,
                          "%s: 'step' is the key that gives a metric line's step; give the "
                          "metric another name",
                          what);
  if (spec_check_listing_column(c, node, what, name, "metric")) return NAS_ERR;
  if (spec_param_index(s, name) >= 0)
    return spec_node_errf(c, node,
                          "%s: '%s' is also a parameter's name, and trial listings show both in "
                          "one row; give them different names",
                          what, name);
  return NAS_OK;
}

static int parse_metric_name(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                             char **out) {
  int rc = spec_node_dup_text(c, node, what, out);
  return rc ? rc : check_metric_name(c, node, what, *out);
}

static int parse_goal(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                      objective_goal *goal) {
  static const char *const goals[] = {"minimize", "maximize", NULL};
  const char *text = NULL;
  int rc = spec_node_text(c, node, what, &text);
  if (rc) return rc;
  if (strcmp(text, "minimize") == 0 || strcmp(text, "maximize") == 0) {
    *goal = text[1] == 'i' ? GOAL_MINIMIZE : GOAL_MAXIMIZE;
    return NAS_OK;
  }
  const char *guess = spec_nearest_name(text, goals);
  if (guess)
    return spec_node_errf(c, node, "%s: '%s' is not a goal; did you mean '%s'?", what, text, guess);
  return spec_node_errf(c, node, "%s: '%s' is not a goal (minimize or maximize)", what, text);
}

static int parse_objective(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                           objective_spec *o) {
  static const char *const keys[] = {"name", "goal", "threshold", "noise", NULL};
  char field[FIELD_CAP];
  yaml_node_t *value;
  int rc = spec_node_expect_mapping(c, node, what);
  if (!rc) rc = spec_node_check_keys(c, node, what, keys);
  if (!rc) rc = spec_node_required(c, node, what, "name", &value);
  spec_field_join(field, what, "name");
  if (!rc) rc = parse_metric_name(c, value, field, &o->name);
  if (!rc) rc = spec_node_required(c, node, what, "goal", &value);
  spec_field_join(field, what, "goal");
  if (!rc) rc = parse_goal(c, value, field, &o->goal);
  if (rc) return rc;
  value = spec_node_optional(c, node, "threshold");
  o->has_threshold = value != NULL;
  spec_field_join(field, what, "threshold");
  if (value && (rc = spec_node_number(c, value, field, &o->threshold))) return rc;
  value = spec_node_optional(c, node, "noise");
  o->has_noise = value != NULL;
  spec_field_join(field, what, "noise");
  if (value && (rc = spec_node_number(c, value, field, &o->noise))) return rc;
  if (value && !(o->noise >= 0 && isfinite(o->noise)))
    return spec_node_errf(c, value, "%s: must be a standard deviation (a number ≥ 0)", field);
  return NAS_OK;
}

static int parse_objectives(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  yaml_node_t *list;
  int rc = spec_node_required(c, root, "spec", "objectives", &list);
  if (!rc) rc = spec_node_expect_list(c, list, "objectives");
  if (rc) return rc;
  size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  if (n == 0) return spec_node_errf(c, list, "objectives: at least one objective is needed");
  if (!(s->objectives = calloc(n, sizeof *s->objectives))) return nas_errf(c->err, "out of memory");
  for (size_t i = 0; i < n; i++) {
    yaml_node_t *item = spec_node_at(c, list->data.sequence.items.start[i]);
    char what[48];
    snprintf(what, sizeof what, "objectives[%zu]", i);
    s->n_objectives = i + 1;
    if ((rc = parse_objective(c, item, what, &s->objectives[i]))) return rc;
    if ((rc = check_metric_unclaimed(c, item, what, s->objectives[i].name, s))) return rc;
    for (size_t j = 0; j < i; j++)
      if (strcmp(s->objectives[j].name, s->objectives[i].name) == 0)
        return spec_node_errf(c, item, "%s: objective '%s' appears twice", what,
                              s->objectives[i].name);
  }
  return NAS_OK;
}

/* "metric <= number" or "metric >= number". */
static int parse_constraint(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                            constraint_spec *k) {
  const char *text = NULL;
  int rc = spec_node_text(c, node, what, &text);
  if (rc) return rc;
  const char *metric = text + strspn(text, " ");
  size_t metric_len = spec_name_span(metric, ".-");
  const char *op = metric + metric_len + strspn(metric + metric_len, " ");
  bool le = strncmp(op, "<=", 2) == 0, ge = strncmp(op, ">=", 2) == 0;
  json_t *bound = NULL;
  if ((le || ge) && spec_inline_value(op + 2, &bound, c->err)) return NAS_ERR;
  bool numeric = json_is_number(bound);
  k->bound = json_number_value(bound);
  json_decref(bound);
  if (metric_len == 0 || !numeric)
    return spec_node_errf(c, node,
                          "%s: '%s' is not a constraint; write \"metric <= number\" or "
                          "\"metric >= number\"",
                          what, text);
  if (!(k->metric = strndup(metric, metric_len))) return nas_errf(c->err, "out of memory");
  k->op = le ? CONSTRAINT_LE : CONSTRAINT_GE;
  return check_metric_name(c, node, what, k->metric);
}

static int parse_constraints(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  yaml_node_t *list = spec_node_optional(c, root, "constraints");
  if (!list) return NAS_OK;
  int rc = spec_node_expect_list(c, list, "constraints");
  if (rc) return rc;
  size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  if (n == 0) return NAS_OK;
  if (!(s->constraints = calloc(n, sizeof *s->constraints)))
    return nas_errf(c->err, "out of memory");
  for (size_t i = 0; i < n; i++) {
    char what[48];
    snprintf(what, sizeof what, "constraints[%zu]", i);
    s->n_constraints = i + 1;
    yaml_node_t *item = spec_node_at(c, list->data.sequence.items.start[i]);
    rc = parse_constraint(c, item, what, &s->constraints[i]);
    if (!rc) rc = check_metric_unclaimed(c, item, what, s->constraints[i].metric, s);
    if (rc) return rc;
  }
  return NAS_OK;
}

/* budget.patience: {trials: N, min_improvement: share}. */
static int parse_patience(const yaml_ctx *c, const yaml_node_t *budget, spec *s) {
  static const char *const keys[] = {"trials", "min_improvement", NULL};
  yaml_node_t *patience = spec_node_optional(c, budget, "patience"), *node;
  if (!patience) return NAS_OK;
  long long trials;
  double share = 0.001;
  int rc = spec_node_expect_mapping(c, patience, "budget.patience");
  if (!rc) rc = spec_node_check_keys(c, patience, "budget.patience", keys);
  if (!rc) rc = spec_node_required(c, patience, "budget.patience", "trials", &node);
  if (!rc) rc = spec_node_integer(c, node, "budget.patience.trials", &trials);
  if (rc) return rc;
  if (trials < 1 || trials > 1000000)
    return spec_node_errf(
        c, node, "budget.patience.trials: must be between 1 and 1000000, got %lld", trials);
  node = spec_node_optional(c, patience, "min_improvement");
  if (node && (rc = spec_node_number(c, node, "budget.patience.min_improvement", &share)))
    return rc;
  if (!(share >= 0 && share < 1))
    return spec_node_errf(c, node,
                          "budget.patience.min_improvement: must be in [0, 1), a share of "
                          "the hypervolume, got %g",
                          share);
  s->budget.patience_trials = (int)trials;
  s->budget.patience_min_improvement = share;
  return NAS_OK;
}

static int parse_failure_rate(const yaml_ctx *c, const yaml_node_t *budget, spec *s) {
  yaml_node_t *node = spec_node_optional(c, budget, "max_failure_rate");
  s->budget.max_failure_rate = 0.5;
  int rc = node ? spec_node_number(c, node, "budget.max_failure_rate", &s->budget.max_failure_rate)
                : NAS_OK;
  if (!rc && !(s->budget.max_failure_rate >= 0 && s->budget.max_failure_rate <= 1))
    rc = spec_node_errf(c, node, "budget.max_failure_rate: must be in [0, 1], got %g",
                        s->budget.max_failure_rate);
  return rc;
}

static int parse_budget(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  static const char *const keys[] = {"trials",           "parallel", "wall_time",
                                     "max_failure_rate", "patience", NULL};
  yaml_node_t *budget, *node;
  long long trials, parallel = 1;
  int rc = spec_node_required(c, root, "spec", "budget", &budget);
  if (!rc) rc = spec_node_expect_mapping(c, budget, "budget");
  if (!rc) rc = spec_node_check_keys(c, budget, "budget", keys);
  if (!rc) rc = spec_node_required(c, budget, "budget", "trials", &node);
  if (!rc) rc = spec_node_integer(c, node, "budget.trials", &trials);
  if (rc) return rc;
  if (trials < 1 || trials > 1000000000)
    return spec_node_errf(c, node, "budget.trials: must be between 1 and 1000000000, got %lld",
                          trials);
  node = spec_node_optional(c, budget, "parallel");
  if (node && (rc = spec_node_integer(c, node, "budget.parallel", &parallel))) return rc;
  if (parallel < 1 || parallel > 1000000)
    return spec_node_errf(c, node, "budget.parallel: must be between 1 and 1000000, got %lld",
                          parallel);
  s->budget.max_trials = (int)trials;
  s->budget.parallel = (int)parallel;
  node = spec_node_optional(c, budget, "wall_time");
  if (node && (rc = spec_node_duration(c, node, "budget.wall_time", &s->budget.max_wall_s)))
    return rc;
  return (rc = parse_failure_rate(c, budget, s)) ? rc : parse_patience(c, budget, s);
}

static int parse_plugin_type(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                             const char *const *types, char **out) {
  const char *text = NULL;
  int rc = spec_node_text(c, node, what, &text);
  if (rc) return rc;
  for (const char *const *t = types; *t; t++)
    if (strcmp(*t, text) == 0) return spec_node_dup_text(c, node, what, out);
  const char *guess = spec_nearest_name(text, types);
  if (guess)
    return spec_node_errf(c, node, "%s: unknown type '%s'; did you mean '%s'?", what, text, guess);
  return spec_node_errf(c, node, "%s: unknown type '%s'", what, text);
}

/* Where each option of a plug-in section was written (plugin_spec.where). */
static int record_option_places(const yaml_ctx *c, const yaml_node_t *section, json_t *where) {
  for (yaml_node_pair_t *pair = section->data.mapping.pairs.start;
       pair < section->data.mapping.pairs.top; pair++) {
    const char *key = spec_node_scalar_text(spec_node_at(c, pair->key));
    const yaml_node_t *value = spec_node_at(c, pair->value);
    char place[FIELD_CAP + 48];
    snprintf(place, sizeof place, "%s:%zu:%zu", c->file, value->start_mark.line + 1,
             value->start_mark.column + 1);
    if (strcmp(key, "type") != 0 && json_object_set_new(where, key, json_string(place)) != 0)
      return nas_errf(c->err, "out of memory");
  }
  return NAS_OK;
}

/* runner: / optimizer: a `type` (default given) and options for that plug-in. */
static int parse_plugin(const yaml_ctx *c, const yaml_node_t *root, const char *section,
                        const char *const *types, plugin_spec *out) {
  yaml_node_t *node = spec_node_optional(c, root, section), *type = NULL;
  int rc = node ? spec_node_expect_mapping(c, node, section) : NAS_OK;
  if (!rc) rc = node ? spec_node_json(c, node, section, &out->options) : NAS_OK;
  if (rc) return rc;
  if (!out->options && !(out->options = json_object())) return nas_errf(c->err, "out of memory");
  json_object_del(out->options, "type");
  if (!(out->where = json_object())) return nas_errf(c->err, "out of memory");
  if (node && (rc = record_option_places(c, node, out->where))) return rc;
  if (node) type = spec_node_optional(c, node, "type");
  char what[FIELD_CAP];
  spec_field_join(what, section, "type");
  if (type) return parse_plugin_type(c, type, what, types, &out->type);
  return (out->type = strdup(types[0])) ? NAS_OK : nas_errf(c->err, "out of memory");
}

static int parse_root(const yaml_ctx *c, const yaml_node_t *root, const char *dir, spec *s) {
  yaml_node_t *params;
  int rc = spec_node_expect_mapping(c, root, "spec");
  if (!rc) rc = spec_node_check_keys(c, root, "spec", root_keys);
  if (!rc) rc = parse_identity(c, root, s);
  if (!rc) rc = spec_node_required(c, root, "spec", "parameters", &params);
  if (!rc) rc = spec_parse_parameters(c, params, s);
  if (!rc) rc = parse_objectives(c, root, s);
  if (!rc) rc = parse_constraints(c, root, s);
  if (!rc) rc = spec_parse_trial(c, spec_node_optional(c, root, "trial"), dir, s);
  if (!rc) rc = parse_budget(c, root, s);
  if (!rc) rc = parse_plugin(c, root, "runner", runner_types, &s->runner);
  if (!rc) rc = parse_plugin(c, root, "optimizer", optimizer_types, &s->optimizer);
  if (!rc) rc = spec_parse_early_stopping(c, root, s);
  if (!rc) rc = spec_parse_multi_fidelity(c, root, s);
  if (!rc) rc = spec_parse_enqueue(c, root, s);
  if (!rc) rc = spec_parse_warm_start(c, root, s);
  if (!rc) rc = spec_parse_notify(c, root, s);
  return rc;
}

static int too_large(const char *file, nas_err *err) {
  return nas_errf(err, "%s: larger than %zu bytes (1 MiB), the most a spec may hold", file,
                  SPEC_MAX_BYTES);
}

/* Reads the spec file at path into an owned text. Only a regular file is read, and only up
 * to one byte past the limit: a device (/dev/zero) or a pipe could go on for ever, and
 * opening without waiting (O_NONBLOCK) keeps a FIFO without a writer from hanging us. */
static int read_spec_file(const char *path, char **out, size_t *len, nas_err *err) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nas_errf(err, "%s: %s", path, strerror(errno));
  struct stat st;
  char *text = NULL;
  size_t n = 0;
  int rc = NAS_OK;
  if (fstat(fd, &st) != 0)
    rc = nas_errf(err, "%s: %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    rc = nas_errf(err, "%s: not a regular file; give the path of a spec file (not a folder, "
                  "device or pipe)", path);
  else if ((size_t)st.st_size > SPEC_MAX_BYTES)
    rc = too_large(path, err);
  else if (!(text = malloc(SPEC_MAX_BYTES + 2)))
    rc = nas_errf(err, "%s: out of memory", path);
  while (!rc && n <= SPEC_MAX_BYTES) {
    ssize_t got = read(fd, text + n, SPEC_MAX_BYTES + 1 - n);
    if (got == 0) break;
    if (got > 0) n += (size_t)got;
    else if (errno != EINTR) rc = nas_errf(err, "%s: %s", path, strerror(errno));
  }
  close(fd);
  if (!rc && n > SPEC_MAX_BYTES) rc = too_large(path, err); /* it grew while read */
  if (rc) {
    free(text);
    return rc;
  }
  text[n] = '\0';
  *out = text;
  *len = n;
  return NAS_OK;
}

/* Parses text into *out; path is what spec.path records. */
static int parse_spec(const char *text, const char *file, const char *dir, const char *path,
                      spec **out, nas_err *err) {
  *out = NULL;
  if (strlen(text) > SPEC_MAX_BYTES) return too_large(file, err);
  yaml_document_t doc;
  int rc = spec_yaml_load(text, file, &doc, err);
  if (rc) return rc;
  yaml_ctx c = {.doc = &doc, .file = file, .err = err};
  spec *s = calloc(1, sizeof *s);
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  if (!s)
    rc = nas_errf(err, "%s: out of memory", file);
  else if (!root)
    rc = nas_errf(err,
                  "%s:1:1: the file is empty; a spec needs name, parameters, "
                  "objectives, trial and budget",
                  file);
  if (!rc) rc = spec_node_check_unique_keys(&c);
  if (!rc) rc = parse_root(&c, root, dir, s);
  if (!rc && (!(s->text = strdup(text)) || !(s->path = strdup(path))))
    rc = nas_errf(err, "%s: out of memory", file);
  yaml_document_delete(&doc);
  if (rc) {
    spec_free(s);
    return rc;
  }
  *out = s;
  return NAS_OK;
}

int spec_parse(const char *text, const char *name, const char *dir, spec **out, nas_err *err) {
  char *abs_dir = nas_abspath(dir ? dir : ".", NULL);
  if (!abs_dir)
    return nas_errf(err, "cannot resolve the folder '%s': %s", dir ? dir : ".", strerror(errno));
  int rc = parse_spec(text, name ? name : "<string>", abs_dir, "<string>", out, err);
  free(abs_dir);
  return rc;
}

int spec_load(const char *path, spec **out, nas_err *err) {
  *out = NULL;
  char *text = NULL, *abs_path = NULL, *dir = NULL;
  size_t len = 0;
  int rc = read_spec_file(path, &text, &len, err);
  if (rc) return rc;
  size_t line, column;
  if (strlen(text) != len) {
    spec_offset_position(text, strlen(text), &line, &column);
    rc = nas_errf(err, "%s:%zu:%zu: holds a NUL byte; a spec is a text file", path, line, column);
  } else if (!(abs_path = nas_abspath(path, NULL)) || !(dir = nas_dirname(abs_path))) {
    rc = nas_errf(err, "%s: out of memory", path);
  }
  if (!rc) rc = parse_spec(text, path, dir, abs_path, out, err);
  free(text);
  free(abs_path);
  free(dir);
  return rc;
}

/* Byte offset in text of a libyaml mark: its line, then its column counted in characters
 * (UTF-8 sequences are one character). A byte order mark starting the text is not counted
 * in the first line's columns. */
static size_t mark_offset(const char *text, yaml_mark_t mark) {
  size_t off = strncmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
  for (size_t line = 0; line < mark.line && text[off]; off++)
    if (text[off] == '\n') line++;
  for (size_t col = 0; col < mark.column && text[off]; col++)
    for (off++; ((unsigned char)text[off] & 0xC0) == 0x80; off++) {}
  return off;
}

/* text with the value of the root's `name` replaced by name, quoted when YAML would read
 * it as something other than a string (true, 1e3). Owned; NULL without a name node. */
static char *name_replaced(const char *text, const char *file, const char *name,
                           nas_err *err) {
  yaml_document_t doc;
  if (spec_yaml_load(text, file, &doc, err) != NAS_OK) return NULL;
  yaml_ctx c = {.doc = &doc, .file = file, .err = err};
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  yaml_node_t *node =
      root && root->type == YAML_MAPPING_NODE ? spec_node_optional(&c, root, "name") : NULL;
  char *out = NULL;
  if (!node) {
    nas_errf(err, "%s: the spec has no name to change", file);
  } else {
    size_t start = mark_offset(text, node->start_mark), end = mark_offset(text, node->end_mark);
    /* A block scalar (`name: >-`) ends at the start of the next line: keep its line break. */
    while (end > start && (text[end - 1] == '\n' || text[end - 1] == '\r')) end--;
    const char *quote = spec_scalar_kind_of(name, true) == SCALAR_STRING ? "" : "\"";
    out = nas_asprintf("%.*s%s%s%s%s", (int)start, text, quote, name, quote, text + end);
    if (!out) nas_errf(err, "out of memory");
  }
  yaml_document_delete(&doc);
  return out;
}

/* Whether renamed_text differs from s's text in the name only (an alias or an odd layout
 * could make a textual replacement change more, or break the text: replacing an anchored
 * name drops its anchor). Both are read against the same folder, since s may have been
 * read against one this function does not know. */
static int check_only_name_changed(const spec *s, const char *renamed_text, const char *name,
                                   nas_err *err) {
  char *diff = NULL, *expect = NULL;
  spec *before = NULL, *renamed = NULL;
  nas_err unreadable;
  int rc = spec_parse(s->text, s->path, ".", &before, err);
  bool readable = rc == NAS_OK &&
                  spec_parse(renamed_text, s->path, ".", &renamed, &unreadable) == NAS_OK;
  if (readable) rc = spec_diff(before, renamed, &diff, err);
  if (readable && rc == NAS_OK && !(expect = nas_asprintf("name: %s -> %s\n", s->name, name)))
    rc = nas_errf(err, "out of memory");
  if (rc == NAS_OK && (!diff || strcmp(diff, expect) != 0))
    rc = nas_errf(err, "experiment '%s': cannot change the name in the spec's text without "
                  "changing more (is it an alias? write the name out)", s->name);
  free(diff);
  free(expect);
  spec_free(before);
  spec_free(renamed);
  return rc;
}

int spec_text_renamed(const spec *s, const char *new_name, char **out, nas_err *err) {
  if (nas_check_experiment_name(new_name, err) != NAS_OK) return NAS_ERR;
  if (strcmp(new_name, s->name) == 0)
    return nas_errf(err, "the experiment is called '%s' already", new_name);
  char *text = name_replaced(s->text, s->path, new_name, err);
  if (!text) return NAS_ERR;
  if (check_only_name_changed(s, text, new_name, err) != NAS_OK) {
    free(text);
    return NAS_ERR;
  }
  *out = text;
  return NAS_OK;
}

static void free_strings(char **list) {
  if (!list) return;
  for (char **p = list; *p; p++) free(*p);
  free(list);
}

void spec_free(spec *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_params; i++) {
    param_spec *p = &s->params[i];
    free(p->name);
    json_decref(p->choices);
    json_decref(p->fixed);
    json_decref(p->cond.values);
  }
  free(s->params);
  for (size_t i = 0; i < s->n_objectives; i++) free(s->objectives[i].name);
  free(s->objectives);
  for (size_t i = 0; i < s->n_constraints; i++) free(s->constraints[i].metric);
  free(s->constraints);
  spec_builtin_free(s->trial.builtin);
  free_strings(s->trial.argv);
  free(s->trial.workdir);
  free_strings(s->trial.env);
  free(s->early_stopping.objectives);
  free(s->early_stopping.rungs);
  free(s->runner.type);
  json_decref(s->runner.options);
  json_decref(s->runner.where);
  free(s->optimizer.type);
  json_decref(s->optimizer.options);
  json_decref(s->optimizer.where);
  json_decref(s->enqueue);
  spec_warm_start_free(&s->warm_start);
  spec_notify_free(s->notify, s->n_notify);
  free(s->path);
  free(s->text);
  free(s->name);
  free(s->storage);
  free(s);
}
