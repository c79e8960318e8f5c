/* spec: the experiment specification a user writes in YAML (format in docs/spec.md).
 *
 * spec_load parses and validates a whole file: every error names file:line:column and
 * what was expected, unknown keys are errors with a "did you mean" for near misses. A spec
 * that loads is complete: defaults are filled in and cross references (condition parents,
 * {param} placeholders, constraint metrics) are checked, so later stages never re-validate.
 * A spec is immutable after loading and owns all of its memory. */
#ifndef NAS_SPEC_H
#define NAS_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

typedef enum {
  PARAM_FLOAT,       /* real in [low, high], optionally on a log scale or a step grid */
  PARAM_INT,         /* integer in [low, high], optionally log scale or step */
  PARAM_CATEGORICAL, /* one of `choices` */
  PARAM_FIXED,       /* always `fixed`; not searched, still substituted and stored */
} param_kind;

typedef enum { COND_EQ, COND_NE, COND_LT, COND_LE, COND_GT, COND_GE, COND_IN } cond_op;

/* "active only when <parent> <op> <value>" (e.g. `when: "layers >= 3"`, or
 * `when: {param: opt, in: [adam, adamw]}`). The parent comes earlier in `params`. */
typedef struct {
  size_t parent;   /* index into spec.params */
  cond_op op;
  json_t *values;  /* owned JSON array: one value for comparisons, several for COND_IN */
} param_condition;

typedef struct {
  char *name;
  param_kind kind;
  double low, high;    /* PARAM_FLOAT / PARAM_INT bounds, inclusive */
  double step;         /* grid step from low; 0 = none */
  bool log;            /* search on a log scale (low > 0) */
  json_t *choices;     /* owned JSON array of strings/numbers/bools (PARAM_CATEGORICAL) */
  json_t *fixed;       /* owned JSON value (PARAM_FIXED) */
  bool conditional;    /* cond is meaningful */
  param_condition cond;
  int line;            /* where it was declared, for later messages */
} param_spec;

/* The most steps a discrete range may span ((high - low) / step of an int, whose step is 1
 * unless given, or of a stepped float): 2^52 - 1, so that the optimizer's unit interval
 * (optimizer/space.c) tells every level apart. */
#define SPEC_MAX_STEPS 4503599627370495.0

typedef enum { GOAL_MINIMIZE, GOAL_MAXIMIZE } objective_goal;

typedef struct {
  char *name;          /* metric name the trial reports */
  objective_goal goal;
  bool has_threshold;  /* threshold is the reference point coordinate */
  double threshold;
  bool has_noise;      /* noise: the known standard deviation of the metric's readings */
  double noise;        /* (≥ 0), which the gp optimizer models as known noise */
} objective_spec;

typedef enum { CONSTRAINT_LE, CONSTRAINT_GE } constraint_op;

/* An outcome constraint such as "latency_ms <= 5". */
typedef struct {
  char *metric;
  constraint_op op;
  double bound;
} constraint_spec;

/* A built-in trial (`trial.builtin`): a model family that `nas worker` builds, trains on a
 * dataset and measures (docs/spec.md, "Built-in trials"). */
typedef struct {
  char *model;         /* "mlp", "cnn", "resnet" or "mobilenet" */
  char *dataset;       /* "digits", "fashion-mnist", or an absolute path (a folder of IDX
                          files or a CSV file) */
  json_t *settings;    /* owned JSON object: the settings written in the section (not
                          model or dataset); see spec_builtin_settings for a trial's all */
} builtin_spec;

typedef struct {
  builtin_spec *builtin; /* owned; NULL for a command trial. A trial has exactly one of a
                            command (argv) and builtin */
  char **argv;         /* NULL-terminated; may hold {param} placeholders; empty (argc 0)
                          for a built-in trial */
  size_t argc;
  char *workdir;       /* absolute; default: the spec file's folder */
  char **env;          /* NULL-terminated "NAME=VALUE" list added to the trial's environment */
  size_t n_env;
  double timeout_s;    /* 0 = none */
  int max_attempts;    /* launches of one trial whose job is lost (process vanished, heartbeat
                          stopped, node failure or preemption); default 3 */
  double heartbeat_timeout_s; /* a running trial silent for longer is lost; 0 = never */
} trial_spec;

typedef struct {
  int max_trials;      /* trials that end completed, failed or stopped count towards it */
  int parallel;        /* trials in flight at once, >= 1 */
  double max_wall_s;   /* 0 = none */
  double max_failure_rate; /* stop once more than this share of ended trials failed
                              (judged from 5 ended trials on); default 0.5; 1 = never */
  int patience_trials;     /* stop when the front's hypervolume grew by less than */
  double patience_min_improvement; /* this share over the last patience_trials completed
                                      trials; 0 trials = never */
} budget_spec;

typedef enum {
  EARLY_STOP_NONE,
  EARLY_STOP_MEDIAN, /* at every step from min_steps: stop when more than half of the other
                        trials at that step did better */
  EARLY_STOP_ASHA,   /* at rung steps only: stop unless among the best 1/reduction_factor */
} early_stop_rule;

/* Early stopping on intermediate (per-step) values of the objectives. With several
 * objectives "did better" means "dominates". */
typedef struct {
  early_stop_rule rule;
  size_t *objectives;      /* owned: indices into spec.objectives judged (default: all) */
  size_t n_objectives;
  long min_steps;          /* no decision before this step; default 1 */
  int min_trials;          /* other trials needed at a step before deciding; default 4 */
  double reduction_factor; /* ASHA's η; default 3 */
  long *rungs;             /* owned: ASHA's steps, ascending (default min_steps·η^k) */
  size_t n_rungs;
} early_stop_spec;

/* Multi-fidelity training (`multi_fidelity:`): Hyperband's brackets of successive halving
 * over epochs (scheduler/hyperband.c). Bracket s (s_max … 0, s_max the largest s with
 * min_epochs·eta^s <= max_epochs) starts ceil((s_max + 1)·eta^s / (s + 1)) trials at
 * max_epochs / eta^s epochs; each rung keeps the best 1/eta for eta times the epochs, the
 * last rung at max_epochs. */
typedef enum { MULTI_FIDELITY_NONE, MULTI_FIDELITY_HYPERBAND } multi_fidelity_kind;

typedef struct {
  multi_fidelity_kind kind;
  int min_epochs; /* the fewest epochs a trial trains; default 1 */
  int max_epochs; /* the most, reached by the trials of every bracket's last rung */
  int eta;        /* the share kept at each rung (1/eta) and the epochs' factor; default 3 */
} multi_fidelity_spec;

/* A plug-in section: `type` plus options that only that plug-in reads (and checks:
 * sched_check_spec reports a bad one at its place in the file). */
typedef struct {
  char *type;
  json_t *options;     /* owned JSON object of the remaining keys */
  json_t *where;       /* owned JSON object: each option's name -> "FILE:LINE:COL" of its
                          value, for messages */
} plugin_spec;

/* `warm_start`: completed trials of earlier experiments (same storage) given to the
 * optimizer as observations (docs/spec.md, "Warm start"). */
typedef struct {
  char **from;         /* owned: the experiments' names, in order */
  size_t n_from;       /* 0 when the spec has no warm_start */
  json_t *fill;        /* owned JSON object: parameter -> value for imported trials that
                          lack the parameter (values as the space stores them) */
} warm_start_spec;
/* Events a webhook can be sent (`notify[].on`), as bits of notify_spec.events. */
typedef enum {
  NOTIFY_TRIAL_COMPLETED = 1u << 0,
  NOTIFY_TRIAL_FAILED = 1u << 1,        /* failed or timed out */
  NOTIFY_FRONT_CHANGED = 1u << 2,       /* the trials on the Pareto front changed */
  NOTIFY_EXPERIMENT_FINISHED = 1u << 3, /* a run ended with its budget spent */
} notify_event;
#define NOTIFY_EVENT_COUNT 4
#define NOTIFY_ALL_EVENTS ((1u << NOTIFY_EVENT_COUNT) - 1)
/* The most `notify:` targets one spec may have (each gets a thread of its own). */
#define NOTIFY_MAX_TARGETS 16

typedef enum {
  NOTIFY_JSON,  /* the event as a JSON object (docs/spec.md, "Notifications") */
  NOTIFY_SLACK, /* {"text": one line}, what Slack's incoming webhooks take */
} notify_format;

/* One webhook (`notify:` entry). */
typedef struct {
  char *url;           /* http:// or https://; its path may be a secret (a Slack webhook's
                          is), so messages show it only as spec_url_shown gives it */
  unsigned events;     /* notify_event bits; default all */
  notify_format format;
} notify_spec;

typedef struct spec {
  char *path;          /* absolute path of the file it was loaded from ("<string>" otherwise) */
  char *text;          /* the file's exact text, stored with the experiment */
  char *name;
  char *storage;       /* storage URL as written; default "sqlite:nas.db" */
  long seed;           /* default 0 */
  param_spec *params;
  size_t n_params;
  objective_spec *objectives;
  size_t n_objectives;
  constraint_spec *constraints;
  size_t n_constraints;
  trial_spec trial;
  budget_spec budget;
  plugin_spec runner;    /* default type "local" */
  plugin_spec optimizer; /* default type "gp" */
  early_stop_spec early_stopping;
  multi_fidelity_spec multi_fidelity;
  json_t *enqueue;       /* owned JSON array of full assignments (`enqueue:`), each checked
                            like spec_check_params; NULL when the spec has none */
  warm_start_spec warm_start;
  notify_spec *notify;   /* webhooks; n_notify of them (0: none) */
  size_t n_notify;
} spec;

/* The largest spec file, in bytes (1 MiB); larger ones are refused unread. */
#define SPEC_MAX_BYTES ((size_t)1 << 20)

/* Loads and validates the YAML file at path, which must be a regular file (not a device
 * or a pipe, which could be endless) of at most SPEC_MAX_BYTES. */
int spec_load(const char *path, spec **out, nas_err *err);
/* Same from text already in memory; `name` stands for the file in messages and `dir` is
 * the folder relative paths in it are resolved against. */
int spec_parse(const char *text, const char *name, const char *dir, spec **out, nas_err *err);
void spec_free(spec *s);

/* The environment variable a trial finds parameter `name` in: NAS_PARAM_ and the name
 * upper-cased, every character but a letter or digit as '_' (`drop-out` ->
 * NAS_PARAM_DROP_OUT). Loading refuses two parameters with the same one. Owned; NULL when
 * out of memory. */
char *spec_param_env_name(const char *name);

/* Index of the parameter called name, or -1. */
int spec_param_index(const spec *s, const char *name);
/* Whether name is one of the columns trial listings have (trial, attempt, status, rung,
 * reference, error and the timings), which no parameter, objective or constraint may take. */
bool spec_is_listing_column(const char *name);
/* Whether the spec's trials run something (a command or a built-in model); a spec without
 * either is driven by ask and tell only. */
bool spec_trial_runs(const spec *s);
/* Whether parameter i is active given the (partial) assignment params, a JSON object of
 * the values chosen so far (parents are decided before children). */
bool spec_param_active(const spec *s, size_t i, const json_t *params);
/* Checks that params (a JSON object) is a valid full assignment: every active parameter
 * present and in range, no inactive or unknown one. */
int spec_check_params(const spec *s, const json_t *params, nas_err *err);

/* NAME=VALUE arguments (n of them) as a full assignment: each value typed as a YAML plain
 * scalar ("3" an integer, "adam" a string, quotes for text that looks like a number),
 * stored as a suggestion would be (a categorical value as its choice, a float as a real),
 * fixed parameters filled in, and the whole checked as spec_check_params does. Unknown
 * names get a did-you-mean. *out is an owned JSON object. */
int spec_assignment_parse(const spec *s, char *const *args, size_t n, json_t **out,
                          nas_err *err);
/* Whether arg has the shape NAME=VALUE (an '=' after a non-empty name), which commands
 * check before anything else; what NAME and VALUE may be is each reader's. */
bool spec_is_assignment(const char *arg);
/* s's text with the value of its `name:` changed to new_name (checked as
 * nas_check_experiment_name),
 * all else byte for byte; the result is checked to load with that name. Owned *out. */
int spec_text_renamed(const spec *s, const char *new_name, char **out, nas_err *err);
/* The trial's argv with every {name} replaced by the parameter's value (numbers printed
 * exactly, `{{` and `}}` for literal braces). Owned NULL-terminated array; free with
 * spec_argv_free. Placeholders of inactive parameters become empty strings. */
int spec_render_argv(const spec *s, const json_t *params, char ***argv_out, nas_err *err);
void spec_argv_free(char **argv);
/* A JSON value as command-line text: integers without a decimal point, reals with the
 * shortest text that reads back exactly, strings as they are, bools as true/false. */
char *spec_value_text(const json_t *value);

/* Every setting of a built-in trial for the assignment params (a JSON object of the
 * active parameters' values): each setting of its model at its default, overridden by the
 * section's values, overridden by the search parameters of the same names. Per-layer
 * settings (width3, channels2) appear only when given. Owned JSON object; an error for a
 * spec without trial.builtin. */
int spec_builtin_settings(const spec *s, const json_t *params, json_t **out, nas_err *err);

/* The name of one notify_event bit as written in `notify[].on` ("trial_completed"). */
const char *spec_notify_event_name(notify_event event);
/* A webhook URL as messages may show it: scheme and host (with port), anything after the
 * host (path, query: where a secret token may be) as "/…", and no user or password
 * ("https://hooks.slack.com/…"). Owned; NULL when out of memory. */
char *spec_url_shown(const char *url);

/* Lines describing how two specs differ in meaning ("budget.trials: 20 -> 30"), one per
 * line, each ending in '\n'; fields are named by their YAML keys. *out is owned, NULL when
 * they are the same; NAS_ERR only when out of memory. */
int spec_diff(const spec *a, const spec *b, char **out, nas_err *err);

#endif
