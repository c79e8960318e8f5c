/* spec/diff.c: what changed between two loaded specs, one line per changed field.
 *
 * Each field is written as canonical text (numbers as their shortest exact text, strings
 * quoted, env sorted, options with sorted keys) and two specs differ in a field exactly
 * when those texts differ, so comments, key order in mappings, quoting style and number
 * spelling (1e-3 vs 0.001) never show up as changes. Field names are the YAML keys
 * ("budget.trials: 20 -> 30"); parameters are matched by name. Webhook URLs are shown as
 * spec_url_shown gives them (their paths may be secrets) but compared whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/internal.h"

static void write_quoted(FILE *out, const char *text) {
  json_t *string = json_string(text);
  char *quoted = string ? json_dumps(string, JSON_ENCODE_ANY) : NULL;
  fputs(quoted ? quoted : text, out);
  free(quoted);
  json_decref(string);
}

/* Strings quoted so that "1" and 1 differ; other values as spec_value_text writes them. */
static void write_value(FILE *out, const json_t *value) {
  if (json_is_string(value)) {
    write_quoted(out, json_string_value(value));
    return;
  }
  char *text = spec_value_text(value);
  fputs(text ? text : "?", out);
  free(text);
}

static void write_values(FILE *out, const json_t *array) {
  fputc('[', out);
  for (size_t i = 0; i < json_array_size(array); i++) {
    if (i) fputs(", ", out);
    write_value(out, json_array_get(array, i));
  }
  fputc(']', out);
}

static void write_number(FILE *out, double x) {
  char text[32];
  spec_format_double(x, text, sizeof text);
  fputs(text, out);
}

static void write_param(FILE *out, const spec *s, const param_spec *p) {
  fputs(spec_param_kind_name(p->kind), out);
  if (p->kind == PARAM_FLOAT || p->kind == PARAM_INT) {
    fputs(" [", out);
    write_number(out, p->low);
    fputs(", ", out);
    write_number(out, p->high);
    fputs("]", out);
    if (p->log) fputs(" log", out);
    if (p->step > 0) {
      fputs(" step ", out);
      write_number(out, p->step);
    }
  } else {
    fputc(' ', out);
    if (p->kind == PARAM_CATEGORICAL)
      write_values(out, p->choices);
    else
      write_value(out, p->fixed);
  }
  if (!p->conditional) return;
  fprintf(out, " when %s %s ", s->params[p->cond.parent].name, spec_cond_op_text(p->cond.op));
  if (p->cond.op == COND_IN)
    write_values(out, p->cond.values);
  else
    write_value(out, json_array_get(p->cond.values, 0));
}

static void write_strings(FILE *out, char *const *list, size_t n) {
  fputc('[', out);
  for (size_t i = 0; i < n; i++) {
    if (i) fputs(", ", out);
    write_quoted(out, list[i]);
  }
  fputc(']', out);
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Mapping order of env means nothing: compare it sorted. */
static void write_env(FILE *out, const spec *s) {
  char **sorted = malloc((s->trial.n_env + 1) * sizeof *sorted);
  if (!sorted) return;
  if (s->trial.n_env) memcpy(sorted, s->trial.env, s->trial.n_env * sizeof *sorted);
  qsort(sorted, s->trial.n_env, sizeof *sorted, compare_strings);
  write_strings(out, sorted, s->trial.n_env);
  free(sorted);
}

static void write_duration(FILE *out, double seconds) {
  if (seconds <= 0) {
    fputs("none", out);
    return;
  }
  write_number(out, seconds);
  fputc('s', out);
}

static void write_options(FILE *out, const json_t *options) {
  char *text = json_dumps(options, JSON_COMPACT | JSON_SORT_KEYS);
  fputs(text ? text : "?", out);
  free(text);
}

static void write_name(FILE *out, const spec *s) { fputs(s->name, out); }
static void write_storage(FILE *out, const spec *s) { fputs(s->storage, out); }
static void write_seed(FILE *out, const spec *s) { fprintf(out, "%ld", s->seed); }
static void write_objectives(FILE *out, const spec *s) {
  fputc('[', out);
  for (size_t i = 0; i < s->n_objectives; i++) {
    const objective_spec *o = &s->objectives[i];
    fprintf(out, "%s%s %s", i ? ", " : "", o->name,
            o->goal == GOAL_MINIMIZE ? "minimize" : "maximize");
    if (o->has_threshold) {
      fputs(" threshold ", out);
      write_number(out, o->threshold);
    }
    if (o->has_noise) {
      fputs(" noise ", out);
      write_number(out, o->noise);
    }
  }
  fputc(']', out);
}
static void write_constraints(FILE *out, const spec *s) {
  fputc('[', out);
  for (size_t i = 0; i < s->n_constraints; i++) {
    const constraint_spec *k = &s->constraints[i];
    fprintf(out, "%s%s %s ", i ? ", " : "", k->metric, k->op == CONSTRAINT_LE ? "<=" : ">=");
    write_number(out, k->bound);
  }
  fputc(']', out);
}
static void write_command(FILE *out, const spec *s) {
  write_strings(out, s->trial.argv, s->trial.argc);
}
/* "none", or the model, the dataset and the settings written (sorted by name). */
static void write_builtin(FILE *out, const spec *s) {
  const builtin_spec *b = s->trial.builtin;
  if (!b) {
    fputs("none", out);
    return;
  }
  fprintf(out, "%s on ", b->model);
  write_quoted(out, b->dataset);
  fputc(' ', out);
  write_options(out, b->settings);
}
static void write_workdir(FILE *out, const spec *s) { fputs(s->trial.workdir, out); }
static void write_timeout(FILE *out, const spec *s) { write_duration(out, s->trial.timeout_s); }
static void write_trials(FILE *out, const spec *s) { fprintf(out, "%d", s->budget.max_trials); }
static void write_parallel(FILE *out, const spec *s) { fprintf(out, "%d", s->budget.parallel); }
static void write_wall_time(FILE *out, const spec *s) { write_duration(out, s->budget.max_wall_s); }
static void write_max_attempts(FILE *out, const spec *s) {
  fprintf(out, "%d", s->trial.max_attempts);
}
static void write_heartbeat(FILE *out, const spec *s) {
  write_duration(out, s->trial.heartbeat_timeout_s);
}
static void write_failure_rate(FILE *out, const spec *s) {
  write_number(out, s->budget.max_failure_rate);
}
static void write_patience(FILE *out, const spec *s) {
  fprintf(out, "%d trials, min_improvement ", s->budget.patience_trials);
  write_number(out, s->budget.patience_min_improvement);
}
static void write_early_stopping(FILE *out, const spec *s) {
  const early_stop_spec *es = &s->early_stopping;
  static const char *const rules[] = {"none", "median", "asha"};
  fprintf(out, "%s", rules[es->rule]);
  if (es->rule == EARLY_STOP_NONE) return;
  fputs(" on", out);
  for (size_t i = 0; i < es->n_objectives; i++)
    fprintf(out, " %s", s->objectives[es->objectives[i]].name);
  fprintf(out, ", min_steps %ld, min_trials %d", es->min_steps, es->min_trials);
  if (es->rule != EARLY_STOP_ASHA) return;
  fputs(", reduction_factor ", out);
  write_number(out, es->reduction_factor);
  fputs(", rungs", out);
  for (size_t i = 0; i < es->n_rungs; i++) fprintf(out, " %ld", es->rungs[i]);
}
static void write_multi_fidelity(FILE *out, const spec *s) {
  const multi_fidelity_spec *mf = &s->multi_fidelity;
  if (mf->kind == MULTI_FIDELITY_NONE) fputs("none", out);
  else fprintf(out, "hyperband, min_epochs %d, max_epochs %d, eta %d", mf->min_epochs,
               mf->max_epochs, mf->eta);
}
static void write_runner(FILE *out, const spec *s) { fputs(s->runner.type, out); }
static void write_runner_options(FILE *out, const spec *s) {
  write_options(out, s->runner.options);
}
static void write_optimizer(FILE *out, const spec *s) { fputs(s->optimizer.type, out); }
static void write_optimizer_options(FILE *out, const spec *s) {
  write_options(out, s->optimizer.options);
}

/* A JSON value with sorted keys, or `none` for NULL. */
static void write_json(FILE *out, const json_t *value) {
  char *text = value ? json_dumps(value, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
  fputs(text ? text : "none", out);
  free(text);
}
static void write_enqueue(FILE *out, const spec *s) { write_json(out, s->enqueue); }
static void write_warm_start(FILE *out, const spec *s) {
  if (s->warm_start.n_from == 0) {
    fputs("none", out);
    return;
  }
  fputs("from ", out);
  write_strings(out, s->warm_start.from, s->warm_start.n_from);
  fputs(" fill ", out);
  write_json(out, s->warm_start.fill);
}
/* [URL on [events] FORMAT, ...], each URL whole or as spec_url_shown gives it. */
static void write_notify(FILE *out, const spec *s, bool shown) {
  fputc('[', out);
  for (size_t i = 0; i < s->n_notify; i++) {
    const notify_spec *t = &s->notify[i];
    char *url = shown ? spec_url_shown(t->url) : NULL;
    fprintf(out, "%s%s on [", i ? ", " : "", shown ? (url ? url : "?") : t->url);
    free(url);
    const char *sep = "";
    for (unsigned bit = 1; bit <= NOTIFY_ALL_EVENTS; bit <<= 1)
      if (t->events & bit) {
        fprintf(out, "%s%s", sep, spec_notify_event_name((notify_event)bit));
        sep = ", ";
      }
    fprintf(out, "] %s", t->format == NOTIFY_SLACK ? "slack" : "json");
  }
  fputc(']', out);
}
static void write_notify_whole(FILE *out, const spec *s) { write_notify(out, s, false); }
static void write_notify_shown(FILE *out, const spec *s) { write_notify(out, s, true); }

/* A field of the spec and the writer of its canonical text. */
typedef struct {
  const char *field;
  void (*write)(FILE *, const spec *);
} field_writer;

/* In file order: these come before the parameters, the rest after. */
static const field_writer head_fields[] = {
    {"name", write_name},
    {"storage", write_storage},
    {"seed", write_seed},
};
static const field_writer tail_fields[] = {
    {"objectives", write_objectives},
    {"constraints", write_constraints},
    {"trial.command", write_command},
    {"trial.builtin", write_builtin},
    {"trial.workdir", write_workdir},
    {"trial.env", write_env},
    {"trial.timeout", write_timeout},
    {"trial.max_attempts", write_max_attempts},
    {"trial.heartbeat_timeout", write_heartbeat},
    {"budget.trials", write_trials},
    {"budget.parallel", write_parallel},
    {"budget.wall_time", write_wall_time},
    {"budget.max_failure_rate", write_failure_rate},
    {"budget.patience", write_patience},
    {"runner.type", write_runner},
    {"runner.options", write_runner_options},
    {"optimizer.type", write_optimizer},
    {"optimizer.options", write_optimizer_options},
    {"early_stopping", write_early_stopping},
    {"multi_fidelity", write_multi_fidelity},
    {"enqueue", write_enqueue},
    {"warm_start", write_warm_start},
};

/* Canonical texts are built in memory streams: open_text starts one on *text,
 * close_text ends it and returns the owned text, or NULL when out of memory. */
static FILE *open_text(char **text, size_t *len) {
  *text = NULL;
  return open_memstream(text, len);
}

static char *close_text(FILE *out, char **text) {
  return nas_memstream_close(out, text, NULL) == NAS_OK ? *text : NULL;
}

static char *field_text(void (*write)(FILE *, const spec *), const spec *s) {
  char *text;
  size_t len;
  FILE *out = open_text(&text, &len);
  if (!out) return NULL;
  write(out, s);
  return close_text(out, &text);
}

static char *param_text(const spec *s, const param_spec *p) {
  char *text;
  size_t len;
  FILE *out = open_text(&text, &len);
  if (!out) return NULL;
  write_param(out, s, p);
  return close_text(out, &text);
}

/* The names of from's parameters that other has too, in from's order. */
static char *common_order_text(const spec *from, const spec *other) {
  char *text;
  size_t len;
  FILE *out = open_text(&text, &len);
  if (!out) return NULL;
  const char *sep = "";
  for (size_t i = 0; i < from->n_params; i++) {
    if (spec_param_index(other, from->params[i].name) < 0) continue;
    fprintf(out, "%s%s", sep, from->params[i].name);
    sep = ", ";
  }
  return close_text(out, &text);
}

/* Writes "field: A -> B" when the texts differ; false when either is missing (no memory). */
static bool diff_texts(FILE *out, const char *field, char *a, char *b) {
  bool ok = a && b;
  if (ok && strcmp(a, b) != 0) fprintf(out, "%s: %s -> %s\n", field, a, b);
  free(a);
  free(b);
  return ok;
}

/* "notify: A -> B" with the URLs shown masked; a change only in what the mask hides is said
 * without showing it. */
static bool diff_notify(FILE *out, const spec *a, const spec *b) {
  char *whole_a = field_text(write_notify_whole, a), *whole_b = field_text(write_notify_whole, b);
  bool ok = whole_a && whole_b, changed = ok && strcmp(whole_a, whole_b) != 0;
  free(whole_a);
  free(whole_b);
  if (!changed) return ok;
  char *shown_a = field_text(write_notify_shown, a), *shown_b = field_text(write_notify_shown, b);
  ok = shown_a && shown_b;
  if (ok)
    fprintf(out, "notify: %s -> %s%s\n", shown_a, shown_b,
            strcmp(shown_a, shown_b) == 0 ? " (a URL changed in its hidden part)" : "");
  free(shown_a);
  free(shown_b);
  return ok;
}

/* Parameters only `from` has, written as "parameters.NAME: VERB (definition)". */
static bool diff_lone_params(FILE *out, const spec *from, const spec *other, const char *verb) {
  for (size_t i = 0; i < from->n_params; i++) {
    const param_spec *p = &from->params[i];
    if (spec_param_index(other, p->name) >= 0) continue;
    char *text = param_text(from, p);
    if (!text) return false;
    fprintf(out, "parameters.%s: %s (%s)\n", p->name, verb, text);
    free(text);
  }
  return true;
}

/* Order matters too: it is the order parameters are searched, stored and shown in. */
static bool diff_params(FILE *out, const spec *a, const spec *b) {
  bool ok = diff_lone_params(out, a, b, "removed");
  for (size_t i = 0; ok && i < a->n_params; i++) {
    int j = spec_param_index(b, a->params[i].name);
    if (j < 0) continue;
    char field[300];
    snprintf(field, sizeof field, "parameters.%s", a->params[i].name);
    ok = diff_texts(out, field, param_text(a, &a->params[i]), param_text(b, &b->params[j]));
  }
  ok = ok && diff_lone_params(out, b, a, "added");
  return ok &&
         diff_texts(out, "parameters order", common_order_text(a, b), common_order_text(b, a));
}

static bool diff_fields(FILE *out, const field_writer *table, size_t n, const spec *a,
                        const spec *b) {
  bool ok = true;
  for (size_t i = 0; ok && i < n; i++)
    ok = diff_texts(out, table[i].field, field_text(table[i].write, a),
                    field_text(table[i].write, b));
  return ok;
}

int spec_diff(const spec *a, const spec *b, char **diff, nas_err *err) {
  *diff = NULL;
  char *text;
  size_t len;
  FILE *out = open_text(&text, &len);
  if (!out) return nas_errf(err, "comparing specs: out of memory");
  bool ok = diff_fields(out, head_fields, sizeof head_fields / sizeof head_fields[0], a, b) &&
            diff_params(out, a, b) &&
            diff_fields(out, tail_fields, sizeof tail_fields / sizeof tail_fields[0], a, b) &&
            diff_notify(out, a, b);
  text = close_text(out, &text);
  if (!ok || !text) {
    free(text);
    return nas_errf(err, "comparing specs: out of memory");
  }
  if (text[0] == '\0') free(text);
  else *diff = text;
  return NAS_OK;
}
