/* spec/trial.c: the `trial:` section -> spec.trial.
 *
 * A trial runs either a command or a built-in model (`builtin`, spec/builtin.c), never
 * both; a built-in trial's argv is empty. The command is a list of arguments, never a
 * string to split: nas executes it with execvp, no shell. Every {name} placeholder in it
 * names a declared parameter and braces are balanced ({{ and }} for literal ones), so
 * rendering a loaded spec cannot fail on the text. workdir is made absolute against the
 * spec file's folder; env holds "NAME=VALUE". */
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

static int check_placeholders(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                              const spec *s, const char *arg) {
  size_t pos = 0;
  command_piece piece;
  int more;
  while ((more = spec_command_piece_next(arg, &pos, &piece)) > 0) {
    if (!piece.is_param || spec_param_find(s->params, s->n_params, piece.start, piece.len) >= 0)
      continue;
    int len = (int)piece.len;
    const char *guess = spec_param_nearest(s, piece.start, piece.len);
    if (guess)
      return spec_node_errf(c, node, "%s: unknown placeholder {%.*s}; did you mean '%s'?", what,
                            len, piece.start, guess);
    return spec_node_errf(c, node,
                          "%s: unknown placeholder {%.*s} (no parameter has that name; "
                          "write {{ and }} for literal braces)",
                          what, len, piece.start);
  }
  return more < 0 ? spec_node_errf(c, node, "%s: %s", what, piece.error) : NAS_OK;
}

static int parse_command(const yaml_ctx *c, const yaml_node_t *trial, spec *s) {
  yaml_node_t *list;
  int rc = spec_node_required(c, trial, "trial", "command", &list);
  if (rc) { /* the one other way to say what runs */
    size_t len = strlen(c->err->msg);
    snprintf(c->err->msg + len, sizeof c->err->msg - len, " (or 'builtin' for a built-in model)");
    return rc;
  }
  if (list->type == YAML_SCALAR_NODE)
    return spec_node_errf(c, list,
                          "trial.command: write the command as a list of arguments, e.g. "
                          "[python3, train.py, \"--lr={lr}\"]; a single string is not split into "
                          "arguments");
  if ((rc = spec_node_expect_list(c, list, "trial.command"))) return rc;
  size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  if (n == 0) return spec_node_errf(c, list, "trial.command: needs at least the program to run");
  if (!(s->trial.argv = calloc(n + 1, sizeof *s->trial.argv)))
    return nas_errf(c->err, "out of memory");
  for (size_t i = 0; i < n && !rc; i++) {
    yaml_node_t *node = spec_node_at(c, list->data.sequence.items.start[i]);
    char what[48];
    snprintf(what, sizeof what, "trial.command[%zu]", i);
    rc = spec_node_dup_text(c, node, what, &s->trial.argv[i]);
    if (!rc) rc = check_placeholders(c, node, what, s, s->trial.argv[i]);
    s->trial.argc = i + 1;
  }
  if (!rc && s->trial.argv[0][0] == '\0')
    rc = spec_node_errf(c, spec_node_at(c, list->data.sequence.items.start[0]),
                        "trial.command[0]: the program to run is empty");
  return rc;
}

static int parse_workdir(const yaml_ctx *c, const yaml_node_t *trial, const char *dir, spec *s) {
  yaml_node_t *node = spec_node_optional(c, trial, "workdir");
  const char *text = dir;
  int rc = node ? spec_node_text(c, node, "trial.workdir", &text) : NAS_OK;
  if (rc) return rc;
  s->trial.workdir = nas_abspath(text, dir);
  return s->trial.workdir ? NAS_OK : nas_errf(c->err, "out of memory");
}

static int parse_env(const yaml_ctx *c, const yaml_node_t *trial, spec *s) {
  yaml_node_t *map = spec_node_optional(c, trial, "env");
  if (!map) return NAS_OK;
  int rc = spec_node_expect_mapping(c, map, "trial.env");
  if (rc) return rc;
  size_t n = (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
  if (!(s->trial.env = calloc(n + 1, sizeof *s->trial.env)))
    return nas_errf(c->err, "out of memory");
  for (size_t i = 0; i < n; i++) {
    yaml_node_pair_t *pair = &map->data.mapping.pairs.start[i];
    yaml_node_t *key = spec_node_at(c, pair->key);
    const char *name = spec_node_scalar_text(key), *value;
    char what[FIELD_CAP];
    spec_field_join(what, "trial.env", name);
    /* POSIX portable names: no '.' or '-'. */
    if (!spec_is_identifier(name, ""))
      return spec_node_errf(c, key,
                            "trial.env: '%s' is not an environment variable name (a letter "
                            "or '_', then letters, digits or '_')",
                            name);
    if ((rc = spec_node_text(c, spec_node_at(c, pair->value), what, &value))) return rc;
    if (!(s->trial.env[i] = nas_asprintf("%s=%s", name, value)))
      return nas_errf(c->err, "out of memory");
    s->trial.n_env = i + 1;
  }
  return NAS_OK;
}

/* max_attempts (default 3) and the optional durations. */
static int parse_limits(const yaml_ctx *c, const yaml_node_t *trial, spec *s) {
  long long attempts = 3;
  yaml_node_t *node = spec_node_optional(c, trial, "max_attempts");
  int rc = node ? spec_node_integer(c, node, "trial.max_attempts", &attempts) : NAS_OK;
  if (rc) return rc;
  if (attempts < 1 || attempts > 100)
    return spec_node_errf(c, node, "trial.max_attempts: must be between 1 and 100, got %lld",
                          attempts);
  s->trial.max_attempts = (int)attempts;
  if ((node = spec_node_optional(c, trial, "timeout")) &&
      (rc = spec_node_duration(c, node, "trial.timeout", &s->trial.timeout_s)))
    return rc;
  node = spec_node_optional(c, trial, "heartbeat_timeout");
  return node
             ? spec_node_duration(c, node, "trial.heartbeat_timeout", &s->trial.heartbeat_timeout_s)
             : NAS_OK;
}

/* An experiment driven by ask and tell runs nothing itself: an empty command. */
static int no_program(const yaml_ctx *c, spec *s) {
  s->trial.argv = calloc(1, sizeof *s->trial.argv);
  return s->trial.argv ? NAS_OK : nas_errf(c->err, "out of memory");
}

/* What a trial runs: at most one of a command and a built-in model (spec/builtin.c). */
static int parse_what_runs(const yaml_ctx *c, const yaml_node_t *trial, const char *dir,
                           spec *s) {
  yaml_node_t *builtin = spec_node_optional(c, trial, "builtin");
  if (!builtin && !spec_node_optional(c, trial, "command")) return no_program(c, s);
  if (!builtin) return parse_command(c, trial, s);
  if (spec_node_optional(c, trial, "command"))
    return spec_node_errf(c, builtin, "trial: give either command or builtin, not both");
  if (!(s->trial.argv = calloc(1, sizeof *s->trial.argv))) return nas_errf(c->err, "out of memory");
  return spec_parse_builtin(c, builtin, dir, s);
}

bool spec_trial_runs(const spec *s) { return s->trial.argc > 0 || s->trial.builtin; }

int spec_parse_trial(const yaml_ctx *c, const yaml_node_t *node, const char *dir, spec *s) {
  static const char *const keys[] = {"command",      "builtin",           "workdir", "env",
                                     "timeout",      "max_attempts",      "heartbeat_timeout",
                                     NULL};
  if (!node) { /* no trial section: ask and tell only, with the defaults */
    s->trial.max_attempts = 3;
    s->trial.workdir = nas_abspath(dir, NULL);
    return s->trial.workdir ? no_program(c, s) : nas_errf(c->err, "out of memory");
  }
  int rc = spec_node_expect_mapping(c, node, "trial");
  if (!rc) rc = spec_node_check_keys(c, node, "trial", keys);
  if (!rc) rc = parse_what_runs(c, node, dir, s);
  if (!rc) rc = parse_workdir(c, node, dir, s);
  if (!rc) rc = parse_env(c, node, s);
  return rc ? rc : parse_limits(c, node, s);
}
