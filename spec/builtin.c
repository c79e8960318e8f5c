/* spec/builtin.c: the `trial.builtin` section -> spec.trial.builtin, and the settings a
 * built-in trial trains with.
 *
 *   trial:
 *     builtin: {model: mlp, dataset: digits, epochs: 3, optimizer: adam}
 *
 * One table (`settings`) says which settings exist, for which model, what values each
 * takes and its default; the loader, the check of search parameters and
 * spec_builtin_settings all read it, so they agree. Invariants of a loaded built-in trial:
 * model is "mlp", "cnn", "resnet" or "mobilenet"; dataset is a known name or an absolute
 * path; every setting written in the section is one of the model's with a value it takes; every search
 * parameter names a setting of the model and every value it can take is valid for it, so
 * spec_builtin_settings cannot fail on a valid assignment except for memory. */
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

/* Which models a setting is for: a bit per model, in the order of models[]. FOR_BOTH is
 * every model (named when there were two). */
enum {
  FOR_MLP = 1,
  FOR_CNN = 2,
  FOR_RESNET = 4,
  FOR_MOBILENET = 8,
  FOR_IMAGES = FOR_CNN | FOR_RESNET | FOR_MOBILENET,
  FOR_BOTH = FOR_MLP | FOR_IMAGES
};

typedef enum { SETTING_INT, SETTING_FLOAT, SETTING_CHOICE, SETTING_BOOL } setting_kind;

typedef struct {
  const char *name;
  unsigned models;             /* FOR_* bits */
  setting_kind kind;
  double low, high;            /* numbers: the range, inclusive unless open below/above */
  bool open_low, open_high;
  const char *const *choices;  /* SETTING_CHOICE: the words it takes */
  const char *fallback;        /* the default, written as in YAML */
  int per_layer;               /* > 0: NAME1 … NAME<per_layer> exist too (no default;
                                  a layer without its own value takes NAME's) */
  bool odd;                    /* SETTING_INT: odd values only (kernel sizes) */
} builtin_setting;

static const char *const activations[] = {"relu", "gelu", "tanh", "sigmoid", NULL};
static const char *const mobile_activations[] = {"relu", "hardswish", NULL};
static const char *const optimizers[] = {"sgd", "adam", "adamw", NULL};
static const char *const schedules[] = {"constant", "cosine", "step", "onecycle", NULL};
static const char *const mlp_norms[] = {"none", "batch", "layer", NULL};
static const char *const cnn_norms[] = {"none", "batch", NULL};
static const char *const poolings[] = {"max", "avg", NULL};
static const char *const models[] = {"mlp", "cnn", "resnet", "mobilenet", NULL};
static const char *const dataset_names[] = {"digits", "fashion-mnist", NULL};
static const char *const device_kinds[] = {"cpu", "cuda", NULL};
static const char *const shardings[] = {"full", "grad_op", "none", NULL};
static const char *const pipe_checkpoints[] = {"except_last", "always", "never", NULL};
static const char *const pipe_balances[] = {"count", "size", "time", NULL};

/* Per-layer counts must stay within the trainer's TR_MAX_BLOCKS (8). */
static const builtin_setting settings[] = {
    {"epochs", FOR_BOTH, SETTING_INT, 1, 100000, .fallback = "10"},
    {"batch_size", FOR_BOTH, SETTING_INT, 1, 65536, .fallback = "64"},
    {"limit_train", FOR_BOTH, SETTING_INT, 0, 1e9, .fallback = "0"},
    {"limit_val", FOR_BOTH, SETTING_INT, 0, 1e9, .fallback = "0"},
    {"validation", FOR_BOTH, SETTING_FLOAT, 0, 0.9, .open_low = true, .fallback = "0.1"},
    {"optimizer", FOR_BOTH, SETTING_CHOICE, .choices = optimizers, .fallback = "adam"},
    {"lr", FOR_BOTH, SETTING_FLOAT, 0, 10, .open_low = true, .fallback = "0.001"},
    {"momentum", FOR_BOTH, SETTING_FLOAT, 0, 1, .open_high = true, .fallback = "0.9"},
    {"weight_decay", FOR_BOTH, SETTING_FLOAT, 0, 1, .fallback = "0"},
    {"schedule", FOR_BOTH, SETTING_CHOICE, .choices = schedules, .fallback = "constant"},
    {"nesterov", FOR_BOTH, SETTING_BOOL, .fallback = "false"},
    {"warmup", FOR_BOTH, SETTING_FLOAT, 0, 1000, .fallback = "0"},
    {"label_smoothing", FOR_BOTH, SETTING_FLOAT, 0, 1, .open_high = true, .fallback = "0"},
    {"augment_flip", FOR_BOTH, SETTING_BOOL, .fallback = "false"},
    {"augment_crop", FOR_BOTH, SETTING_INT, 0, 16, .fallback = "0"},
    {"data_cache", FOR_BOTH, SETTING_BOOL, .fallback = "true"},
    {"dropout", FOR_BOTH, SETTING_FLOAT, 0, 1, .open_high = true, .fallback = "0"},
    {"activation", FOR_MLP | FOR_CNN, SETTING_CHOICE, .choices = activations, .fallback = "relu"},
    {"activation", FOR_MOBILENET, SETTING_CHOICE, .choices = mobile_activations,
     .fallback = "relu"},
    {"threads", FOR_BOTH, SETTING_INT, 1, 256, .fallback = "1"},
    {"device", FOR_BOTH, SETTING_CHOICE, .choices = device_kinds, .fallback = "cpu"},
    {"devices", FOR_BOTH, SETTING_INT, 1, 1024, .fallback = "1"},
    {"sharding", FOR_BOTH, SETTING_CHOICE, .choices = shardings, .fallback = "full"},
    {"checkpoint_activations", FOR_BOTH, SETTING_BOOL, .fallback = "false"},
    {"pipeline_stages", FOR_BOTH, SETTING_INT, 1, 16, .fallback = "1"},
    {"pipeline_chunks", FOR_BOTH, SETTING_INT, 1, 1024, .fallback = "4"},
    {"pipeline_checkpoint", FOR_BOTH, SETTING_CHOICE, .choices = pipe_checkpoints,
     .fallback = "except_last"},
    {"pipeline_balance", FOR_BOTH, SETTING_CHOICE, .choices = pipe_balances, .fallback = "count"},
    {"layers", FOR_MLP, SETTING_INT, 1, 8, .fallback = "2"},
    {"width", FOR_MLP, SETTING_INT, 1, 65536, .fallback = "128", .per_layer = 8},
    {"norm", FOR_MLP, SETTING_CHOICE, .choices = mlp_norms, .fallback = "none"},
    {"stages", FOR_IMAGES, SETTING_INT, 1, 6, .fallback = "2"},
    {"channels", FOR_IMAGES, SETTING_INT, 1, 4096, .fallback = "16", .per_layer = 6},
    {"blocks", FOR_RESNET | FOR_MOBILENET, SETTING_INT, 1, 8, .fallback = "1", .per_layer = 6},
    {"expansion", FOR_MOBILENET, SETTING_INT, 1, 8, .fallback = "4", .per_layer = 6},
    {"kernel", FOR_MOBILENET, SETTING_INT, 3, 7, .fallback = "3", .per_layer = 6, .odd = true},
    {"se", FOR_MOBILENET, SETTING_BOOL, .fallback = "false", .per_layer = 6},
    {"kernel", FOR_CNN, SETTING_INT, 1, 9, .fallback = "3"},
    {"pooling", FOR_CNN, SETTING_CHOICE, .choices = poolings, .fallback = "max"},
    {"head_width", FOR_CNN, SETTING_INT, 0, 65536, .fallback = "0"},
    {"norm", FOR_CNN, SETTING_CHOICE, .choices = cnn_norms, .fallback = "none"},
};
enum { N_SETTINGS = sizeof settings / sizeof settings[0] };

/* The bit of a model named in models[] (0 for another name). */
static unsigned model_bit(const char *model) {
  for (unsigned i = 0; models[i]; i++)
    if (strcmp(model, models[i]) == 0) return 1u << i;
  return 0;
}

/* The names of the models in bits, as "cnn, resnet and mobilenet". */
static void models_text(unsigned bits, char *buf, size_t cap) {
  size_t len = 0;
  int left = __builtin_popcount(bits);
  buf[0] = '\0';
  for (unsigned i = 0; models[i] && len < cap; i++) {
    if (!(bits & (1u << i))) continue;
    left--;
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", models[i],
                            left > 1 ? ", " : left == 1 ? " and " : "");
  }
}

/* The layer number in name after a per-layer setting's prefix ("width3" -> 3), 0 when
 * name is not prefix followed by a number from 1 without leading zeros. */
static int layer_of(const char *name, const char *prefix) {
  size_t len = strlen(prefix);
  if (strncmp(name, prefix, len) != 0) return 0;
  const char *digits = name + len;
  if (digits[0] < '1' || digits[0] > '9' || strspn(digits, "0123456789") != strlen(digits) ||
      strlen(digits) > 3)
    return 0;
  return atoi(digits);
}

/* The setting called name (or one of its layers) for any model the bits allow; NULL when
 * none. */
static const builtin_setting *setting_find(const char *name, unsigned bits) {
  for (size_t i = 0; i < N_SETTINGS; i++) {
    const builtin_setting *st = &settings[i];
    int layer = st->per_layer ? layer_of(name, st->name) : 0;
    bool named = strcmp(name, st->name) == 0 || (layer > 0 && layer <= st->per_layer);
    if ((st->models & bits) && named) return st;
  }
  return NULL;
}

/* The models that have a setting called name (its rows' bits together); 0 when none. */
static unsigned setting_models(const char *name) {
  unsigned bits = 0;
  for (unsigned bit = FOR_MLP; bit & FOR_BOTH; bit <<= 1)
    if (setting_find(name, bit)) bits |= bit;
  return bits;
}

/* The model's setting names and the section's own keys, for suggestions. Owned array of
 * borrowed names; NULL when out of memory. */
static const char **setting_names(unsigned bits) {
  const char **names = calloc(N_SETTINGS + 3, sizeof *names);
  size_t n = 0;
  for (size_t i = 0; names && i < N_SETTINGS; i++)
    if (settings[i].models & bits) names[n++] = settings[i].name;
  if (names) names[n++] = "model", names[n++] = "dataset";
  return names;
}

/* Whether x lies in st's range; when not, why says so (text is x as the message shows it). */
static bool setting_range_accepts(const builtin_setting *st, double x, const char *text,
                                  char *why, size_t cap) {
  bool above = st->open_low ? x > st->low : x >= st->low;
  bool below = st->open_high ? x < st->high : x <= st->high;
  if (above && below) return true;
  char low[32], high[32];
  spec_format_double(st->low, low, sizeof low);
  spec_format_double(st->high, high, sizeof high);
  snprintf(why, cap, "%s is outside %c%s, %s%c", text, st->open_low ? '(' : '[', low, high,
           st->open_high ? ')' : ']');
  return false;
}

/* Whether st takes value; when not, why says so. */
static bool setting_accepts(const builtin_setting *st, const json_t *value, char *why, size_t cap) {
  char text[64], list[200];
  spec_describe_value(value, text, sizeof text);
  if (st->kind == SETTING_CHOICE) {
    const char *word = json_string_value(value);
    for (const char *const *c = st->choices; word && *c; c++)
      if (strcmp(word, *c) == 0) return true;
    json_t *choices = json_array();
    for (const char *const *c = st->choices; choices && *c; c++)
      json_array_append_new(choices, json_string(*c));
    spec_describe_list(choices, list, sizeof list);
    json_decref(choices);
    snprintf(why, cap, "%s is not one of %s", text, list);
    return false;
  }
  if (st->kind == SETTING_BOOL) {
    if (json_is_boolean(value)) return true;
    snprintf(why, cap, "expected true or false, got %s", text);
    return false;
  }
  if (st->kind == SETTING_INT ? !json_is_integer(value) : !json_is_number(value)) {
    snprintf(why, cap, "expected %s, got %s", st->kind == SETTING_INT ? "an integer" : "a number",
             text);
    return false;
  }
  if (st->odd && json_integer_value(value) % 2 == 0) {
    snprintf(why, cap, "%s is even; the setting takes odd numbers", text);
    return false;
  }
  return setting_range_accepts(st, json_number_value(value), text, why, cap);
}

/* ---- the section ---- */

/* An unknown key: a setting of other models, a layer past the last, or a typo. */
static int unknown_setting(const yaml_ctx *c, const yaml_node_t *key, const char *model) {
  const char *name = spec_node_scalar_text(key);
  unsigned bits = setting_models(name);
  if (bits && !(bits & model_bit(model))) {
    char owners[64];
    models_text(bits, owners, sizeof owners);
    return spec_node_errf(c, key, "trial.builtin: '%s' is a setting of %s models, not of %s", name,
                     owners, model);
  }
  for (size_t i = 0; i < N_SETTINGS; i++) {
    const builtin_setting *per = &settings[i];
    if (per->per_layer && (per->models & model_bit(model)) && layer_of(name, per->name) > 0)
      return spec_node_errf(c, key, "trial.builtin: '%s': %s goes from %s1 to %s%d", name,
                            per->name, per->name, per->name, per->per_layer);
  }
  const char **names = setting_names(model_bit(model));
  const char *guess = names ? spec_nearest_name(name, names) : NULL;
  int rc = guess ? spec_node_errf(c, key, "trial.builtin: unknown setting '%s'; did you mean '%s'?",
                                  name, guess)
                 : spec_node_errf(c, key,
                                  "trial.builtin: unknown setting '%s' of %s models (docs/spec.md "
                                  "lists them)",
                                  name, model);
  free(names);
  return rc;
}

static int parse_model(const yaml_ctx *c, const yaml_node_t *section, builtin_spec *b) {
  yaml_node_t *node;
  const char *text;
  int rc = spec_node_required(c, section, "trial.builtin", "model", &node);
  if (!rc) rc = spec_node_text(c, node, "trial.builtin.model", &text);
  if (rc) return rc;
  if (!model_bit(text)) {
    const char *guess = spec_nearest_name(text, models);
    return spec_node_errf(c, node,
                     "trial.builtin.model: unknown model '%s'%s%s%s (mlp, cnn, resnet or "
                     "mobilenet)",
                     text, guess ? "; did you mean '" : "", guess ? guess : "", guess ? "'?" : "");
  }
  return spec_node_dup_text(c, node, "trial.builtin.model", &b->model);
}

/* A known name, else a path (made absolute against dir); a bare word that is neither is
 * a likely typo of a name. */
static int parse_dataset(const yaml_ctx *c, const yaml_node_t *section, const char *dir,
                         builtin_spec *b) {
  yaml_node_t *node;
  const char *text;
  int rc = spec_node_required(c, section, "trial.builtin", "dataset", &node);
  if (!rc) rc = spec_node_text(c, node, "trial.builtin.dataset", &text);
  if (rc) return rc;
  for (const char *const *name = dataset_names; *name; name++)
    if (strcmp(text, *name) == 0)
      return spec_node_dup_text(c, node, "trial.builtin.dataset", &b->dataset);
  if (!strchr(text, '/') && !strchr(text, '.')) {
    const char *guess = spec_nearest_name(text, dataset_names);
    return spec_node_errf(
        c, node,
        "trial.builtin.dataset: unknown dataset '%s'%s%s%s (digits, fashion-mnist, "
        "or a path: a folder of IDX files or a CSV file; write ./%s for a folder "
        "of that name)",
        text, guess ? "; did you mean '" : "", guess ? guess : "", guess ? "'?" : "", text);
  }
  b->dataset = nas_abspath(text, dir);
  return b->dataset ? NAS_OK : nas_errf(c->err, "out of memory");
}

/* The setting `name` (written at key) set to value. */
static int parse_setting_named(const yaml_ctx *c, yaml_node_t *key, const char *name,
                               yaml_node_t *value, builtin_spec *b) {
  const builtin_setting *st = setting_find(name, model_bit(b->model));
  if (!st) return unknown_setting(c, key, b->model);
  char what[FIELD_CAP], why[300];
  spec_field_join(what, "trial.builtin", name);
  /* Duplicate keys are refused with the document, so only `pipeline:` can repeat one. */
  static const char pipeline_prefix[] = "pipeline_";
  if (json_object_get(b->settings, name) &&
      strncmp(name, pipeline_prefix, strlen(pipeline_prefix)) == 0)
    return spec_node_errf(c, key, "%s: given twice (as pipeline.%s and %s); keep one", what,
                          name + strlen(pipeline_prefix), name);
  json_t *json;
  int rc = spec_node_scalar_json(c, value, what, &json);
  if (rc) return rc;
  if (!setting_accepts(st, json, why, sizeof why)) {
    json_decref(json);
    return spec_node_errf(c, value, "%s: %s", what, why);
  }
  return json_object_set_new(b->settings, name, json) == 0 ? NAS_OK
                                                            : nas_errf(c->err, "out of memory");
}

static int parse_setting(const yaml_ctx *c, const yaml_node_pair_t *pair, builtin_spec *b) {
  yaml_node_t *key = spec_node_at(c, pair->key);
  return parse_setting_named(c, key, spec_node_scalar_text(key), spec_node_at(c, pair->value), b);
}

/* `pipeline: {stages: N, chunks: M, checkpoint: except_last, balance: count}`: the
 * pipeline_ settings written as one mapping (docs/engine-pipeline.md). */
static int parse_pipeline(const yaml_ctx *c, const yaml_node_pair_t *pair, builtin_spec *b) {
  yaml_node_t *section = spec_node_at(c, pair->value);
  int rc = spec_node_expect_mapping(c, section, "trial.builtin.pipeline");
  for (yaml_node_pair_t *p = rc ? NULL : section->data.mapping.pairs.start;
       !rc && p < section->data.mapping.pairs.top; p++) {
    yaml_node_t *key = spec_node_at(c, p->key);
    const char *name = spec_node_scalar_text(key);
    if (strcmp(name, "stages") != 0 && strcmp(name, "chunks") != 0 &&
        strcmp(name, "checkpoint") != 0 && strcmp(name, "balance") != 0)
      return spec_node_errf(c, key,
                            "trial.builtin.pipeline: unknown key '%s' (stages, chunks, "
                            "checkpoint, balance)",
                            name);
    char full[64];
    snprintf(full, sizeof full, "pipeline_%s", name);
    rc = parse_setting_named(c, key, full, spec_node_at(c, p->value), b);
  }
  return rc;
}

/* A pipeline (pipeline_stages > 1) and FSDP (devices > 1, sharding) are two ways to split
 * a model over ranks; one trial uses one of them. */
static int check_exclusive(const yaml_ctx *c, const yaml_node_t *section, const builtin_spec *b) {
  json_t *stages = json_object_get(b->settings, "pipeline_stages");
  if (!stages || json_integer_value(stages) <= 1) return NAS_OK;
  json_t *devices = json_object_get(b->settings, "devices");
  if (devices && json_integer_value(devices) > 1)
    return spec_node_errf(c, section,
                          "trial.builtin: pipeline stages and devices > 1 (sharded data "
                          "parallel) cannot be combined; use one of them");
  if (json_object_get(b->settings, "sharding"))
    return spec_node_errf(c, section,
                          "trial.builtin: sharding applies to devices > 1, not to a "
                          "pipeline (a stage keeps its layers whole)");
  return NAS_OK;
}

/* The node of parameter name in the document's `parameters` mapping (for messages). */
static yaml_node_t *param_node(const yaml_ctx *c, const char *name) {
  yaml_node_t *root = yaml_document_get_root_node(c->doc);
  yaml_node_t *params = root ? spec_node_optional(c, root, "parameters") : NULL;
  if (!params || params->type != YAML_MAPPING_NODE) return root;
  for (yaml_node_pair_t *pair = params->data.mapping.pairs.start;
       pair < params->data.mapping.pairs.top; pair++) {
    yaml_node_t *key = spec_node_at(c, pair->key);
    if (strcmp(spec_node_scalar_text(key), name) == 0) return key;
  }
  return root;
}

/* Whether every value parameter p can take is valid for st; when not, why says so. A
 * numeric range is valid when both ends are (the setting's ranges have no holes). */
static bool param_fits(const param_spec *p, const builtin_setting *st, char *why, size_t cap) {
  if (p->kind == PARAM_FIXED) return setting_accepts(st, p->fixed, why, cap);
  if (p->kind == PARAM_CATEGORICAL) {
    for (size_t i = 0; i < json_array_size(p->choices); i++)
      if (!setting_accepts(st, json_array_get(p->choices, i), why, cap)) return false;
    return true;
  }
  if (st->kind == SETTING_CHOICE || st->kind == SETTING_BOOL) {
    snprintf(why, cap, "the setting takes %s: declare a categorical parameter",
             st->kind == SETTING_BOOL ? "true or false" : "words");
    return false;
  }
  if (st->odd) {
    snprintf(why, cap, "the setting takes odd integers only: declare a categorical parameter "
                       "such as [3, 5]");
    return false;
  }
  if (st->kind == SETTING_INT && p->kind == PARAM_FLOAT) {
    snprintf(why, cap, "the setting takes integers: declare an int parameter");
    return false;
  }
  /* Both ends checked as numbers, not JSON values, so the check needs no memory. */
  char low[32], high[32];
  spec_format_double(p->low, low, sizeof low);
  spec_format_double(p->high, high, sizeof high);
  return setting_range_accepts(st, p->low, low, why, cap) &&
         setting_range_accepts(st, p->high, high, why, cap);
}

/* Every search parameter sets a setting of the model, with values it takes. */
static int check_params(const yaml_ctx *c, const spec *s) {
  const builtin_spec *b = s->trial.builtin;
  for (size_t i = 0; i < s->n_params; i++) {
    const param_spec *p = &s->params[i];
    const builtin_setting *st = setting_find(p->name, model_bit(b->model));
    char what[FIELD_CAP], why[300];
    spec_field_join(what, "parameters", p->name);
    yaml_node_t *at = param_node(c, p->name);
    if (!st) {
      const char **names = setting_names(model_bit(b->model));
      const char *guess = names ? spec_nearest_name(p->name, names) : NULL;
      int rc = spec_node_errf(c, at,
                              "%s: a built-in %s trial has no setting of this name%s%s%s; its "
                              "parameters must be settings (docs/spec.md, \"Built-in trials\")",
                              what, b->model, guess ? "; did you mean '" : "", guess ? guess : "",
                              guess ? "'?" : "");
      free(names);
      return rc;
    }
    if (!param_fits(p, st, why, sizeof why))
      return spec_node_errf(c, at, "%s: not a valid value of the built-in setting: %s", what, why);
  }
  return NAS_OK;
}

int spec_parse_builtin(const yaml_ctx *c, const yaml_node_t *section, const char *dir, spec *s) {
  int rc = spec_node_expect_mapping(c, section, "trial.builtin");
  if (rc) return rc;
  builtin_spec *b = calloc(1, sizeof *b);
  if (!b || !(b->settings = json_object())) {
    free(b);
    return nas_errf(c->err, "out of memory");
  }
  s->trial.builtin = b;
  rc = parse_model(c, section, b);
  if (!rc) rc = parse_dataset(c, section, dir, b);
  for (yaml_node_pair_t *pair = section->data.mapping.pairs.start;
       !rc && pair < section->data.mapping.pairs.top; pair++) {
    const char *key = spec_node_scalar_text(spec_node_at(c, pair->key));
    if (strcmp(key, "pipeline") == 0)
      rc = parse_pipeline(c, pair, b);
    else if (strcmp(key, "model") != 0 && strcmp(key, "dataset") != 0)
      rc = parse_setting(c, pair, b);
  }
  if (!rc) rc = check_exclusive(c, section, b);
  return rc ? rc : check_params(c, s);
}

void spec_builtin_free(builtin_spec *b) {
  if (!b) return;
  free(b->model);
  free(b->dataset);
  json_decref(b->settings);
  free(b);
}

/* ---- settings of one trial ---- */

int spec_builtin_settings(const spec *s, const json_t *params, json_t **out, nas_err *err) {
  *out = NULL;
  const builtin_spec *b = s->trial.builtin;
  if (!b) return nas_errf(err, "experiment '%s' runs a command, not a built-in trial", s->name);
  json_t *all = json_object();
  int rc = all ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < N_SETTINGS; i++) {
    if (!(settings[i].models & model_bit(b->model))) continue;
    if (json_object_set_new(all, settings[i].name, spec_scalar_json(settings[i].fallback, true)) !=
        0)
      rc = nas_errf(err, "out of memory");
  }
  if (rc == NAS_OK && json_object_update(all, b->settings) != 0)
    rc = nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < s->n_params; i++) {
    const json_t *value = json_object_get(params, s->params[i].name);
    if (value && json_object_set(all, s->params[i].name, (json_t *)value) != 0)
      rc = nas_errf(err, "out of memory");
  }
  if (rc != NAS_OK) {
    json_decref(all);
    return rc;
  }
  *out = all;
  return NAS_OK;
}
