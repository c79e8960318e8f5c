/* spec/multi_fidelity.c: the `multi_fidelity:` section -> spec.multi_fidelity.
 *
 *   multi_fidelity:
 *     kind: hyperband      # the only kind so far
 *     min_epochs: 1        # the fewest epochs a trial trains (default 1)
 *     max_epochs: 27       # the most (required); every bracket's last rung trains this many
 *     eta: 3               # keep the best 1/eta at each rung, for eta times the epochs
 * It decides how long trials train, as early_stopping decides when they stop: the two
 * exclude each other. */
#include <string.h>

#include "spec/internal.h"

/* An integer key in [low, high] (required, or else the default already in *out). */
static int epochs_key(const yaml_ctx *c, const yaml_node_t *section, const char *key,
                      bool required, long low, long high, int *out) {
  yaml_node_t *node = NULL;
  int rc = required ? spec_node_required(c, section, "multi_fidelity", key, &node) : NAS_OK;
  if (!required) node = spec_node_optional(c, section, key);
  if (rc || !node) return rc;
  char what[FIELD_CAP];
  spec_field_join(what, "multi_fidelity", key);
  long long v;
  if ((rc = spec_node_integer(c, node, what, &v))) return rc;
  if (v < low || v > high)
    return spec_node_errf(c, node, "%s: must be between %ld and %ld, got %lld", what, low, high, v);
  *out = (int)v;
  return NAS_OK;
}

static int parse_kind(const yaml_ctx *c, const yaml_node_t *section, multi_fidelity_spec *mf) {
  static const char *const kinds[] = {"hyperband", NULL};
  yaml_node_t *node;
  const char *text;
  int rc = spec_node_required(c, section, "multi_fidelity", "kind", &node);
  if (!rc) rc = spec_node_text(c, node, "multi_fidelity.kind", &text);
  if (rc) return rc;
  if (strcmp(text, "hyperband") == 0) {
    mf->kind = MULTI_FIDELITY_HYPERBAND;
    return NAS_OK;
  }
  const char *guess = spec_nearest_name(text, kinds);
  return spec_node_errf(c, node, "multi_fidelity.kind: expected hyperband, got '%s'%s%s%s", text,
                   guess ? "; did you mean '" : "", guess ? guess : "", guess ? "'?" : "");
}

/* The built-in section's `epochs:` (set, so trial.builtin is a mapping that has it) differs
 * from max_epochs, which takes its place: it would be ignored without a word. */
static int builtin_epochs_error(const yaml_ctx *c, const yaml_node_t *root, int max_epochs) {
  yaml_node_t *trial = spec_node_optional(c, root, "trial");
  yaml_node_t *builtin = spec_node_optional(c, trial, "builtin");
  return spec_node_errf(c, spec_node_optional(c, builtin, "epochs"),
                        "trial.builtin.epochs: multi_fidelity trains each trial up to max_epochs "
                        "(%d), which takes the place of this setting; remove it or make it %d",
                        max_epochs, max_epochs);
}

int spec_parse_multi_fidelity(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  static const char *const keys[] = {"kind", "min_epochs", "max_epochs", "eta", NULL};
  yaml_node_t *section = spec_node_optional(c, root, "multi_fidelity");
  multi_fidelity_spec *mf = &s->multi_fidelity;
  *mf = (multi_fidelity_spec){.kind = MULTI_FIDELITY_NONE, .min_epochs = 1, .eta = 3};
  if (!section) return NAS_OK;
  int rc = spec_node_expect_mapping(c, section, "multi_fidelity");
  if (!rc) rc = spec_node_check_keys(c, section, "multi_fidelity", keys);
  if (!rc) rc = parse_kind(c, section, mf);
  if (!rc) rc = epochs_key(c, section, "min_epochs", false, 1, 100000, &mf->min_epochs);
  if (!rc) rc = epochs_key(c, section, "max_epochs", true, 1, 100000, &mf->max_epochs);
  if (!rc) rc = epochs_key(c, section, "eta", false, 2, 100, &mf->eta);
  if (!rc && mf->max_epochs < mf->min_epochs * mf->eta)
    rc = spec_node_errf(c, spec_node_optional(c, section, "max_epochs"),
                   "multi_fidelity.max_epochs: must be at least min_epochs × eta (%d × %d), so "
                   "that a bracket has two rungs; got %d", mf->min_epochs, mf->eta,
                   mf->max_epochs);
  for (size_t i = 0; !rc && s->trial.builtin && i < s->n_params; i++)
    if (strcmp(s->params[i].name, "epochs") == 0)
      rc = spec_node_errf(c, section, "multi_fidelity: decides how many epochs each built-in trial "
                     "trains, so 'epochs' cannot be a searched parameter too; remove it");
  const json_t *epochs = s->trial.builtin ? json_object_get(s->trial.builtin->settings, "epochs")
                                           : NULL;
  if (!rc && epochs && json_integer_value(epochs) != mf->max_epochs)
    rc = builtin_epochs_error(c, root, mf->max_epochs);
  if (!rc && s->early_stopping.rule != EARLY_STOP_NONE)
    rc = spec_node_errf(c, section, "multi_fidelity: cannot be combined with early_stopping "
                   "(both decide how long trials train); keep one of them");
  if (rc) mf->kind = MULTI_FIDELITY_NONE;
  return rc;
}
