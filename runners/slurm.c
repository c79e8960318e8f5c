/* runners/slurm.c: the Slurm backend — every job is a Slurm batch job (docs/runners.md).
 *
 * runner_start writes the trial's job script (slurm_script.c) into its run folder and
 * submits it with `sbatch --parsable`; the handle is Slurm's job id ("12345", or
 * "12345_3" for a task of a job array). runner_start_held submits with --hold and
 * runner_release lets the job go (`scontrol release`). runner_start_batch submits a batch
 * as one job array when the spec says `array: true`. runner_poll asks Slurm about every job
 * it needs news of in ONE squeue call; runner_stop is scancel.
 *
 * Polling is paced: squeue runs at most every poll_interval seconds, except for a job it
 * has not heard of yet (just re-attached) and for a job whose exit.json has appeared (the
 * job script writes it as the command ends), so that ends are learnt at once while a
 * controller shared by hundreds of users is not asked several times a second. Between
 * queries a job keeps the state Slurm gave last.
 *
 * Invariants:
 * - Nothing from a spec or a trial reaches a shell: Slurm's commands run from argv
 *   (slurm_cmd.c) and the job script quotes every value (slurm_script.c).
 * - Slurm's word is final when it has one; exit.json is read only for a job Slurm no
 *   longer knows (purged after MinJobAge), and a job neither knows of is lost.
 * - A state once final stays final for a handle: finished jobs are never asked about
 *   again.
 * - The memory of jobs (`seen`) holds only handles of the last two polls, jobs started
 *   since and jobs held until released, sorted by handle; poll and stop work as well
 *   without it (in another process).
 * - A job submitted held has the file `held` in its run folder until runner_release: a
 *   held (or cancelled) job with that file that this runner did not hold itself was left
 *   by a starter that died before releasing it, never ran, and is lost. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runners/slurm_internal.h"

#define DEFAULT_POLL_INTERVAL_S 10.0
#define EXIT_REQUERY_S 0.5 /* while exit.json exists but Slurm still says running */
#define DEFAULT_RETRIES 4
#define DEFAULT_BACKOFF_S 1.0
#define COMMAND_TIMEOUT_S 60.0
#define HELD_FILE "held" /* in a run folder while its job waits for runner_release */

/* ---- options ---- */

/* Options that become one sbatch flag each; their values are kept as text. */
static const struct {
  const char *name;
  const char *flag;
  bool count_ok; /* a positive integer is accepted (and is the only thing accepted when
                    word_ok is false) */
  bool word_ok;  /* a string is accepted */
} flag_options[] = {
    {"partition", "--partition", false, true},
    {"account", "--account", false, true},
    {"qos", "--qos", false, true},
    {"cpus_per_task", "--cpus-per-task", true, false},
    {"mem", "--mem", true, true},
    {"gpus", "--gpus", true, true},
    {"gres", "--gres", false, true},
    {"nodes", "--nodes", true, true},
    {"ntasks", "--ntasks", true, false},
    {"gpus_per_task", "--gpus-per-task", true, true},
};
#define N_FLAG_OPTIONS (sizeof flag_options / sizeof *flag_options)

static const char other_options[] =
    "time, sbatch_args, setup, array, srun, poll_interval, retries, retry_backoff";

typedef struct {
  char **items; /* owned strings */
  size_t n;
} text_list;

/* What the runner last learnt about a job. */
typedef struct {
  char *handle;         /* owned */
  char *run_dir;        /* owned, absolute; NULL when not started by this runner */
  job_status status;    /* JOB_RUNNING until Slurm (or exit.json) says otherwise */
  bool exit_seen;       /* exit.json existed when Slurm was last asked */
  double asked_at;      /* monotonic time Slurm was last asked about it; 0 = never */
  bool held;            /* started held by this runner, not released yet */
  unsigned long polled; /* value of polls when last polled or started */
} seen_job;

typedef struct {
  char *flag_values[N_FLAG_OPTIONS]; /* owned; NULL = not given */
  double time_s;                     /* `time`; 0 = not given */
  text_list sbatch_args;             /* extra sbatch arguments, after the runner's own */
  text_list setup;                   /* job script lines run before the command */
  bool array;                        /* batches go as job arrays */
  bool srun;                         /* the command runs as `srun -- command`: once per
                                        task of the allocation (ntasks) */
  double poll_interval;              /* seconds between squeue calls */
  slurm_retry retry;
  seen_job *seen; /* owned, sorted by handle */
  size_t n_seen, cap_seen;
  runner_self self;    /* the nas binary the jobs are told of */
  unsigned long polls; /* runner_poll calls so far */
  double last_query;   /* monotonic time of the last squeue; 0 = none yet */
} slurm_runner;

static void text_list_free(text_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->items[i]);
  free(l->items);
  *l = (text_list){0};
}

/* Reads an array of strings; when single_ok, one string too (as a list of one). */
static int text_list_read(const char *key, const json_t *value, bool single_ok, text_list *out,
                          nas_err *err) {
  text_list_free(out);
  bool single = single_ok && json_is_string(value);
  if (!single && !json_is_array(value))
    return nas_errf(err, "option %s: expected a list of strings%s", key,
                    single_ok ? " (or one string)" : "");
  size_t n = single ? 1 : json_array_size(value);
  out->items = calloc(n ? n : 1, sizeof *out->items);
  if (!out->items) return nas_errf(err, "option %s: out of memory", key);
  for (size_t i = 0; i < n; i++) {
    const json_t *item = single ? value : json_array_get(value, i);
    if (!json_is_string(item))
      return nas_errf(err, "option %s[%zu]: expected a string", key, i);
    out->items[out->n] = strdup(json_string_value(item));
    if (!out->items[out->n++]) return nas_errf(err, "option %s: out of memory", key);
  }
  return NAS_OK;
}

/* A whole number from min to max as JSON: an integer, or a real without a fraction. */
static bool whole_number(const json_t *value, double min, double max, long long *out) {
  double v = json_number_value(value);
  if (!json_is_number(value) || !(v >= min) || v > max || v != floor(v)) return false;
  *out = (long long)v;
  return true;
}

static int flag_option_read(size_t i, const json_t *value, slurm_runner *sr, nas_err *err) {
  long long count;
  char *text = NULL;
  if (flag_options[i].count_ok && whole_number(value, 1, 1e12, &count))
    text = nas_asprintf("%lld", count);
  else if (flag_options[i].word_ok && json_is_string(value) && json_string_length(value) > 0)
    text = strdup(json_string_value(value));
  else
    return nas_errf(err, "option %s: expected %s", flag_options[i].name,
                    !flag_options[i].word_ok   ? "a positive integer"
                    : flag_options[i].count_ok ? "a positive integer or a non-empty string"
                                               : "a non-empty string");
  if (!text) return nas_errf(err, "option %s: out of memory", flag_options[i].name);
  free(sr->flag_values[i]);
  sr->flag_values[i] = text;
  return NAS_OK;
}

/* `time`: minutes as a number, or a Slurm time string ("90", "1:30:00", "2-00:00:00"). */
static int time_option_read(const json_t *value, slurm_runner *sr, nas_err *err) {
  double seconds = -1;
  if (json_is_number(value)) seconds = json_number_value(value) * 60;
  else if (json_is_string(value) && slurm_time_parse(json_string_value(value), &seconds) != NAS_OK)
    seconds = -1;
  if (!(seconds > 0) || !isfinite(seconds))
    return nas_errf(err, "option time: expected minutes (a positive number) or a Slurm time "
                         "such as \"1:30:00\" or \"2-00:00:00\"");
  sr->time_s = seconds;
  return NAS_OK;
}

static int seconds_read(const char *key, const json_t *value, double *out, nas_err *err) {
  double v = json_number_value(value);
  if (!json_is_number(value) || !(v >= 0) || !isfinite(v))
    return nas_errf(err, "option %s: expected a non-negative number of seconds", key);
  *out = v;
  return NAS_OK;
}

static int other_option_read(const char *key, const json_t *value, slurm_runner *sr,
                             nas_err *err) {
  if (strcmp(key, "time") == 0) return time_option_read(value, sr, err);
  if (strcmp(key, "sbatch_args") == 0)
    return text_list_read(key, value, false, &sr->sbatch_args, err);
  if (strcmp(key, "setup") == 0) return text_list_read(key, value, true, &sr->setup, err);
  if (strcmp(key, "poll_interval") == 0) return seconds_read(key, value, &sr->poll_interval, err);
  if (strcmp(key, "retry_backoff") == 0) return seconds_read(key, value, &sr->retry.backoff_s, err);
  if (strcmp(key, "array") == 0 || strcmp(key, "srun") == 0) {
    if (!json_is_boolean(value)) return nas_errf(err, "option %s: expected true or false", key);
    *(key[0] == 'a' ? &sr->array : &sr->srun) = json_is_true(value);
    return NAS_OK;
  }
  if (strcmp(key, "retries") == 0) {
    long long n;
    if (!whole_number(value, 0, 100, &n))
      return nas_errf(err, "option retries: expected an integer from 0 to 100");
    sr->retry.retries = (int)n;
    return NAS_OK;
  }
  char known[512];
  int used = snprintf(known, sizeof known, "%s", flag_options[0].name);
  for (size_t i = 1; i < N_FLAG_OPTIONS; i++)
    used += snprintf(known + used, sizeof known - (size_t)used, ", %s", flag_options[i].name);
  return nas_errf(err, "unknown option '%s' (known: %s, %s)", key, known, other_options);
}

static int options_read(const json_t *options, slurm_runner *sr, nas_err *err) {
  if (!json_is_object(options)) return nas_errf(err, "options must be a mapping");
  const char *key;
  json_t *value;
  json_object_foreach((json_t *)options, key, value) {
    size_t i = 0;
    while (i < N_FLAG_OPTIONS && strcmp(flag_options[i].name, key) != 0) i++;
    int rc = i < N_FLAG_OPTIONS ? flag_option_read(i, value, sr, err)
                                : other_option_read(key, value, sr, err);
    if (rc != NAS_OK) return NAS_ERR;
  }
  return NAS_OK;
}

/* ---- what the runner remembers of jobs ---- */

static int seen_cmp(const void *key, const void *entry) {
  return strcmp(key, ((const seen_job *)entry)->handle);
}

static seen_job *seen_find(slurm_runner *sr, const char *handle) {
  return sr->n_seen ? bsearch(handle, sr->seen, sr->n_seen, sizeof *sr->seen, seen_cmp) : NULL;
}

/* The entry of handle, made (running, as just started) when there is none. */
static seen_job *seen_get(slurm_runner *sr, const char *handle, nas_err *err) {
  seen_job *found = seen_find(sr, handle);
  if (found) return found;
  if (sr->n_seen == sr->cap_seen) {
    size_t cap = sr->cap_seen ? sr->cap_seen * 2 : 16;
    seen_job *bigger = realloc(sr->seen, cap * sizeof *bigger);
    if (!bigger) return nas_errf(err, "out of memory"), NULL;
    sr->seen = bigger;
    sr->cap_seen = cap;
  }
  size_t at = 0;
  while (at < sr->n_seen && strcmp(sr->seen[at].handle, handle) < 0) at++;
  char *copy = strdup(handle);
  if (!copy) return nas_errf(err, "out of memory"), NULL;
  memmove(&sr->seen[at + 1], &sr->seen[at], (sr->n_seen - at) * sizeof *sr->seen);
  sr->seen[at] = (seen_job){.handle = copy, .status = {.state = JOB_RUNNING},
                            .polled = sr->polls};
  sr->n_seen++;
  return &sr->seen[at];
}

static void seen_drop_at(slurm_runner *sr, size_t at) {
  free(sr->seen[at].handle);
  free(sr->seen[at].run_dir);
  memmove(&sr->seen[at], &sr->seen[at + 1], (sr->n_seen - at - 1) * sizeof *sr->seen);
  sr->n_seen--;
}

static void seen_forget(slurm_runner *sr, const char *handle) {
  seen_job *e = seen_find(sr, handle);
  if (e) seen_drop_at(sr, (size_t)(e - sr->seen));
}

/* Forgets jobs neither in this poll nor in the one before, nor started since; a job held
 * by this runner is kept until released or stopped (the caller polls it only after). */
static void seen_prune(slurm_runner *sr) {
  for (size_t i = sr->n_seen; i-- > 0;)
    if (!sr->seen[i].held && sr->seen[i].polled + 1 < sr->polls) seen_drop_at(sr, i);
}

/* Remembers a job just submitted; on failure the job is cancelled by the caller. */
static int seen_started(slurm_runner *sr, const char *handle, const char *run_dir, bool held,
                        nas_err *err) {
  seen_job *e = seen_get(sr, handle, err);
  if (!e) return NAS_ERR;
  free(e->run_dir);
  e->run_dir = strdup(run_dir);
  if (!e->run_dir) return nas_errf(err, "out of memory");
  e->held = held;
  e->polled = sr->polls;
  return NAS_OK;
}

/* ---- files in the run folder ---- */

static bool file_in_exists(const char *dir, const char *name) {
  char *path = nas_asprintf("%s/%s", dir, name);
  bool exists = path && access(path, F_OK) == 0;
  free(path);
  return exists;
}

static int file_in_remove(const char *dir, const char *name, nas_err *err) {
  char *path = nas_asprintf("%s/%s", dir, name);
  if (!path) return nas_errf(err, "out of memory");
  int rc = unlink(path) == 0 || errno == ENOENT ? NAS_OK
                                                : nas_errf(err, "cannot remove %s: %s", path,
                                                           strerror(errno));
  free(path);
  return rc;
}

static int file_in_write(const char *dir, const char *name, const char *text, nas_err *err) {
  char *path = nas_asprintf("%s/%s", dir, name);
  if (!path) return nas_errf(err, "out of memory");
  int rc = nas_write_file_atomic(path, text, strlen(text), err);
  free(path);
  return rc;
}

/* ---- running Slurm's commands ---- */

typedef struct {
  char **items; /* owned strings, NULL-terminated */
  size_t n, cap;
} arg_list;

static void args_free(arg_list *a) {
  for (size_t i = 0; i < a->n; i++) free(a->items[i]);
  free(a->items);
  *a = (arg_list){0};
}

/* Appends text, taking it over; NULL (a failed allocation) or no memory is an error. */
static int args_take(arg_list *a, char *text) {
  if (!text) return NAS_ERR;
  if (a->n + 2 > a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 32;
    char **bigger = realloc(a->items, cap * sizeof *bigger);
    if (!bigger) {
      free(text);
      return NAS_ERR;
    }
    a->items = bigger;
    a->cap = cap;
  }
  a->items[a->n++] = text;
  a->items[a->n] = NULL;
  return NAS_OK;
}

static int args_add(arg_list *a, const char *text) { return args_take(a, strdup(text)); }

/* Whether a failed Slurm command says the job is gone already (squeue -j with one id it
 * does not know fails the same way). */
static bool says_gone(const slurm_output *res) {
  const char *e = res->errs ? res->errs : "";
  return strstr(e, "Invalid job id specified") || strstr(e, "already completing or completed") ||
         strstr(e, "Job has already finished");
}

/* Runs scancel or scontrol release on one job (argv); a job already gone is no error. */
static int job_command(const slurm_runner *sr, char *const *argv, nas_err *err) {
  slurm_output res;
  int rc = slurm_cmd_run(&sr->retry, argv, NULL, &res, err);
  if (rc != NAS_OK && says_gone(&res)) rc = NAS_OK;
  slurm_output_free(&res);
  return rc;
}

static int job_cancel(const slurm_runner *sr, const char *handle, nas_err *err) {
  char *argv[] = {"scancel", (char *)handle, NULL};
  return job_command(sr, argv, err);
}

/* ---- submission ---- */

/* A trial ready to submit: absolute folders and its job script written. */
typedef struct {
  char *run_dir, *workdir, *script; /* owned */
} prepared;

static void prepared_free(prepared *p) {
  free(p->run_dir), free(p->workdir), free(p->script);
  *p = (prepared){0};
}

/* What Slurm needs of a job besides what runner.c checks of every job. */
static int job_check(const runner_job *job, nas_err *err) {
  if (strchr(job->run_dir, '\\'))
    return nas_errf(err, "run_dir '%s' holds a backslash, which sbatch's --output cannot "
                         "take", job->run_dir);
  return slurm_env_check(job->env, err);
}

static void held_orphan_cancel(const slurm_runner *sr, const char *run_dir);

static int prepare(const slurm_runner *sr, const runner_job *job, prepared *p, nas_err *err) {
  *p = (prepared){0};
  if (job_check(job, err) != NAS_OK) return NAS_ERR;
  p->run_dir = nas_abspath(job->run_dir, NULL);
  p->workdir = nas_abspath(job->workdir, NULL);
  if (!p->run_dir || !p->workdir) return nas_errf(err, "out of memory");
  if (nas_mkdirs(p->run_dir, err) != NAS_OK) return NAS_ERR;
  held_orphan_cancel(sr, p->run_dir);
  if (file_in_remove(p->run_dir, RUNNER_EXIT_FILE, err) != NAS_OK ||
      file_in_remove(p->run_dir, HELD_FILE, err) != NAS_OK) /* left by an earlier job */
    return NAS_ERR;
  slurm_task task = {.argv = job->argv, .workdir = p->workdir, .run_dir = p->run_dir,
                     .env = job->env, .setup = sr->setup.items, .n_setup = sr->setup.n,
                     .srun = sr->srun, .nas_bin = sr->self.bin, .nas_dir = sr->self.dir};
  return slurm_job_script_write(&task, &p->script, err);
}

/* Owned sbatch --output pattern "dir/name": every '%' of dir doubled, so that sbatch reads
 * the folder as it is, and name kept as a pattern ("%a.log": one file per array task). */
static char *output_pattern(const char *dir, const char *name) {
  char *out = malloc(2 * strlen(dir) + strlen(name) + 2);
  if (out) {
    char *w = out;
    for (const char *p = dir; *p; p++) {
      *w++ = *p;
      if (*p == '%') *w++ = '%';
    }
    sprintf(w, "/%s", name);
  }
  return out;
}

/* The value of NAME in a NAME=VALUE list, or NULL. */
static const char *env_value(char *const *env, const char *name) {
  size_t len = strlen(name);
  const char *value = NULL;
  for (size_t i = 0; env && env[i]; i++)
    if (strncmp(env[i], name, len) == 0 && env[i][len] == '=') value = env[i] + len + 1;
  return value;
}

/* The job's name in squeue: "nas-EXPERIMENT-NUMBER" for a scheduler's trial. */
static char *job_name(const runner_job *job, bool array) {
  const char *exp = env_value(job->env, "NAS_EXPERIMENT");
  const char *number = env_value(job->env, "NAS_TRIAL_NUMBER");
  if (exp && array) return nas_asprintf("nas-%s", exp);
  if (exp && number) return nas_asprintf("nas-%s-%s", exp, number);
  const char *slash = strrchr(job->argv[0], '/');
  return nas_asprintf("nas-%s", slash ? slash + 1 : job->argv[0]);
}

/* A random word that marks a submission, to find it again when sbatch's answer is lost. */
static char *submit_token(void) {
  unsigned char bytes[8];
  if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes) {
    unsigned long long fallback = (unsigned long long)(nas_now() * 1e6) ^ (unsigned)getpid();
    memcpy(bytes, &fallback, sizeof bytes);
  }
  char hex[2 * sizeof bytes + 1];
  for (size_t i = 0; i < sizeof bytes; i++) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return nas_asprintf("nas-submit-%s", hex);
}

/* What an sbatch call is made of, besides the runner's options. */
typedef struct {
  const runner_job *first; /* the job (or the array's first) */
  double timeout_s;        /* longest time limit asked for; 0 = none */
  const char *workdir;     /* absolute */
  char *output, *error;    /* owned sbatch patterns; error may be NULL */
  size_t n_tasks;          /* > 1: a job array of that many tasks */
  bool hold;
  const char *comment;
  const char *script;
} submission;

/* The time limit in whole minutes (Slurm's unit), rounded up; 0 = none. */
static long time_limit_minutes(const slurm_runner *sr, double timeout_s) {
  double s = sr->time_s;
  if (timeout_s > 0 && (s == 0 || timeout_s < s)) s = timeout_s;
  return s > 0 ? (long)ceil(s / 60 - 1e-9) : 0;
}

static int sbatch_args(const slurm_runner *sr, const submission *sub, arg_list *a) {
  static const char *const fixed[] = {"sbatch", "--parsable", "--export=ALL",
                                      "--open-mode=append"};
  int rc = NAS_OK;
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) rc |= args_add(a, fixed[i]);
  char *name = job_name(sub->first, sub->n_tasks > 1);
  rc |= args_take(a, nas_asprintf("--job-name=%s", name ? name : "nas"));
  free(name);
  rc |= args_take(a, nas_asprintf("--comment=%s", sub->comment));
  rc |= args_take(a, nas_asprintf("--chdir=%s", sub->workdir));
  rc |= args_take(a, nas_asprintf("--output=%s", sub->output));
  if (sub->error) rc |= args_take(a, nas_asprintf("--error=%s", sub->error));
  long minutes = time_limit_minutes(sr, sub->timeout_s);
  if (minutes > 0) rc |= args_take(a, nas_asprintf("--time=%ld", minutes));
  if (sub->n_tasks > 1) rc |= args_take(a, nas_asprintf("--array=0-%zu", sub->n_tasks - 1));
  if (sub->hold) rc |= args_add(a, "--hold");
  for (size_t i = 0; i < N_FLAG_OPTIONS; i++)
    if (sr->flag_values[i])
      rc |= args_take(a, nas_asprintf("%s=%s", flag_options[i].flag, sr->flag_values[i]));
  for (size_t i = 0; i < sr->sbatch_args.n; i++) rc |= args_add(a, sr->sbatch_args.items[i]);
  rc |= args_add(a, sub->script);
  return rc == NAS_OK ? NAS_OK : NAS_ERR;
}

/* Looks for the job marked with comment among the user's jobs, after an sbatch whose
 * answer was lost: found, its id goes into res->out as sbatch would have printed it. */
typedef struct {
  const slurm_runner *sr;
  const char *comment;
} lost_answer;

/* The owned id of the user's job submitted with comment (one squeue, no retry), or NULL
 * when there is none or Slurm cannot be asked. */
static char *job_with_comment(const slurm_runner *sr, const char *comment) {
  char *argv[] = {"squeue", "-h", "--me", "-t", "all", "-O", "ArrayJobID:|,Comment:|", NULL};
  slurm_retry once = sr->retry;
  once.retries = 0;
  slurm_output found;
  nas_err ignored;
  int rc = slurm_cmd_run(&once, argv, NULL, &found, &ignored);
  char *id = NULL;
  size_t comment_len = strlen(comment);
  for (char *line = rc == NAS_OK ? found.out : NULL; line && *line && !id;) {
    char *bar = strchr(line, '|'), *eol = strchrnul(line, '\n');
    if (bar && bar < eol && (size_t)(eol - bar - 1) >= comment_len &&
        strncmp(bar + 1, comment, comment_len) == 0 &&
        (bar[1 + comment_len] == '|' || bar + 1 + comment_len == eol))
      id = strndup(line, (size_t)(bar - line));
    line = *eol ? eol + 1 : NULL;
  }
  slurm_output_free(&found);
  return id;
}

/* A run folder still holding HELD_FILE when its trial starts again: the last start there
 * submitted a held job and ended before anyone stored the job's id (the scheduler then
 * starts the trial again in the same folder). That job would wait in the queue forever;
 * it is found by the submission token HELD_FILE holds, and cancelled. */
static void held_orphan_cancel(const slurm_runner *sr, const char *run_dir) {
  char *path = nas_asprintf("%s/%s", run_dir, HELD_FILE), token[64];
  int fd;
  int64_t size;
  if (!path || nas_open_regular(path, &fd, &size, NULL) != NAS_OK) {
    free(path);
    return;
  }
  ssize_t n = read(fd, token, sizeof token - 1);
  close(fd);
  free(path);
  token[n > 0 ? n : 0] = '\0';
  if (strncmp(token, "nas-submit-", 11) != 0) return;
  char *id = job_with_comment(sr, token);
  if (id && job_cancel(sr, id, NULL) == NAS_OK)
    nas_log("slurm runner: cancelled job %s, submitted held for %s by a start that ended "
            "before its id was stored", id, run_dir);
  free(id);
}

static int lost_answer_check(void *ctx, slurm_output *res, nas_err *err) {
  (void)err;
  const lost_answer *la = ctx;
  char *id = job_with_comment(la->sr, la->comment);
  if (!id) return 0;
  free(res->out);
  res->out = id;
  return 1;
}

/* Reads sbatch --parsable's answer: "ID" or "ID;CLUSTER". */
static int job_id_read(const char *out, char **id, nas_err *err) {
  size_t len = strspn(out, "0123456789");
  if (len == 0 || (out[len] != '\0' && out[len] != ';' && out[len] != '\n' && out[len] != ' '))
    return nas_errf(err, "sbatch printed '%.80s', not a job id", out);
  *id = strndup(out, len);
  return *id ? NAS_OK : nas_errf(err, "out of memory");
}

/* Submits, marked with sub->comment (a fresh token when NULL); *id (owned) is the job id. */
static int submit(const slurm_runner *sr, submission *sub, char **id, nas_err *err) {
  char *own = sub->comment ? NULL : submit_token();
  const char *comment = own ? own : sub->comment;
  arg_list args = {0};
  sub->comment = comment;
  int rc = comment && sbatch_args(sr, sub, &args) == NAS_OK ? NAS_OK
                                                             : nas_errf(err, "out of memory");
  lost_answer la = {.sr = sr, .comment = comment};
  slurm_recover recover = {.check = lost_answer_check, .ctx = &la};
  slurm_output res = {0};
  if (rc == NAS_OK) rc = slurm_cmd_run(&sr->retry, args.items, &recover, &res, err);
  if (rc == NAS_OK) rc = job_id_read(res.out, id, err);
  slurm_output_free(&res);
  args_free(&args);
  free(own);
  return rc;
}

static int start_one(slurm_runner *sr, const runner_job *job, bool hold, char **handle,
                     nas_err *err) {
  prepared p;
  int rc = prepare(sr, job, &p, err);
  submission sub = {.first = job, .timeout_s = job->timeout_s, .workdir = p.workdir,
                    .hold = hold, .script = p.script};
  if (rc == NAS_OK) {
    sub.output = output_pattern(p.run_dir, "stdout.log");
    sub.error = output_pattern(p.run_dir, "stderr.log");
    if (!sub.output || !sub.error) rc = nas_errf(err, "out of memory");
  }
  char *token = hold ? submit_token() : NULL;
  if (rc == NAS_OK && hold && !token) rc = nas_errf(err, "out of memory");
  sub.comment = token;
  if (rc == NAS_OK && hold) rc = file_in_write(p.run_dir, HELD_FILE, token, err);
  if (rc == NAS_OK) rc = submit(sr, &sub, handle, err);
  if (rc == NAS_OK && seen_started(sr, *handle, p.run_dir, hold, err) != NAS_OK) {
    job_cancel(sr, *handle, NULL);
    free(*handle);
    *handle = NULL;
    rc = NAS_ERR;
  }
  free(sub.output), free(sub.error), free(token);
  prepared_free(&p);
  if (rc != NAS_OK) return nas_err_prefix(err, "cannot submit %s", job->argv[0]);
  return NAS_OK;
}

/* ---- job arrays ---- */

/* The array's own folder (in its first trial's run folder): array.sh, and i.log, a link
 * to trial i's stderr.log where Slurm writes what it has to say about task i. */
static int array_folder_make(const prepared *ps, size_t n, char **dir, nas_err *err) {
  *dir = nas_asprintf("%s/array", ps[0].run_dir);
  if (!*dir) return nas_errf(err, "out of memory");
  if (nas_mkdirs(*dir, err) != NAS_OK) return NAS_ERR;
  for (size_t i = 0; i < n; i++) {
    char *link = nas_asprintf("%s/%zu.log", *dir, i);
    char *target = nas_asprintf("%s/stderr.log", ps[i].run_dir);
    int rc = link && target ? NAS_OK : nas_errf(err, "out of memory");
    if (rc == NAS_OK && unlink(link) != 0 && errno != ENOENT)
      rc = nas_errf(err, "cannot replace %s: %s", link, strerror(errno));
    if (rc == NAS_OK && symlink(target, link) != 0)
      rc = nas_errf(err, "cannot link %s: %s", link, strerror(errno));
    free(link), free(target);
    if (rc != NAS_OK) return NAS_ERR;
  }
  return NAS_OK;
}

/* The longest time limit among jobs; 0 (none) when one of them has none. */
static double longest_timeout(const runner_job *jobs, size_t n) {
  double longest = 0;
  for (size_t i = 0; i < n; i++) {
    if (jobs[i].timeout_s == 0) return 0;
    longest = fmax(longest, jobs[i].timeout_s);
  }
  return longest;
}

static int array_submit(slurm_runner *sr, const runner_job *jobs, const prepared *ps, size_t n,
                        char **id, nas_err *err) {
  char *dir = NULL, *script = NULL;
  char **scripts = calloc(n, sizeof *scripts);
  int rc = scripts ? array_folder_make(ps, n, &dir, err) : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++) scripts[i] = ps[i].script;
  if (rc == NAS_OK) rc = slurm_array_script_write(dir, scripts, n, &script, err);
  submission sub = {.first = &jobs[0], .timeout_s = longest_timeout(jobs, n),
                    .workdir = ps[0].workdir, .n_tasks = n, .script = script};
  if (rc == NAS_OK) {
    sub.output = output_pattern(dir, "%a.log");
    if (!sub.output) rc = nas_errf(err, "out of memory");
  }
  if (rc == NAS_OK) rc = submit(sr, &sub, id, err);
  free(sub.output), free(script), free(scripts), free(dir);
  return rc;
}

/* Hands out "ID_i" for each task and remembers them; NAS_ERR when out of memory. */
static int array_handles(slurm_runner *sr, const char *id, const prepared *ps, size_t n,
                         char **handles, nas_err *err) {
  for (size_t i = 0; i < n; i++) {
    handles[i] = nas_asprintf("%s_%zu", id, i);
    if (!handles[i] || seen_started(sr, handles[i], ps[i].run_dir, false, err) != NAS_OK) {
      for (size_t j = 0; j <= i; j++) free(handles[j]), handles[j] = NULL;
      return nas_errf(err, "out of memory");
    }
  }
  return NAS_OK;
}

/* ---- polling ---- */

/* How a job ended that Slurm no longer knows of: exit.json says, else it is lost (or,
 * when exit.json cannot be read, failed with the reason). */
static job_status gone_status(const char *handle, const char *run_dir) {
  job_status st = {.state = JOB_LOST};
  nas_err why;
  int found = runner_exit_file_read(run_dir, &st, &why);
  if (found == 1) {
    snprintf(st.detail, sizeof st.detail, "Slurm no longer knows job %s; its %s tells how "
             "it ended", handle, RUNNER_EXIT_FILE);
    return st;
  }
  st = (job_status){.state = found == 0 ? JOB_LOST : JOB_UNREADABLE};
  if (found == 0)
    snprintf(st.detail, sizeof st.detail, "Slurm does not know job %s (purged, or never "
             "run) and it left no %s", handle, RUNNER_EXIT_FILE);
  else
    snprintf(st.detail, sizeof st.detail, "Slurm no longer knows job %.28s and %.100s", handle,
             why.msg);
  return st;
}

/* Slurm's word on a job, except for a job whose starter ended before releasing it (held,
 * or cancelled, while its run folder still holds HELD_FILE, and not held by this runner):
 * such a job never ran, is cancelled if still held, and is lost. */
static job_status row_status(const slurm_runner *sr, const slurm_row *row, const char *run_dir,
                             const seen_job *e) {
  bool held_or_cancelled = row->held || row->status.state == JOB_STOPPED;
  if ((e && e->held) || !held_or_cancelled || !file_in_exists(run_dir, HELD_FILE))
    return row->status;
  if (row->held) job_cancel(sr, row->id, NULL);
  job_status st = {.state = JOB_LOST};
  snprintf(st.detail, sizeof st.detail, "Slurm job %s was never released (its starter ended "
           "first) and is cancelled", row->id);
  return st;
}

/* Whether to ask Slurm about a job now: one not heard of yet; a running one once the poll
 * interval has passed, at once when its exit.json has just appeared, and then every
 * EXIT_REQUERY_S until Slurm says it ended — unless Slurm says it waits to start: its
 * exit.json is then an earlier run's (a job requeued after a preemption may wait hours). */
static bool needs_asking(const slurm_runner *sr, const seen_job *e, bool exit_exists,
                         double now) {
  if (!e) return true;
  if (e->status.state != JOB_RUNNING) return false;
  if (exit_exists && !e->exit_seen) return true;
  if (exit_exists && !e->status.waiting &&
      now - e->asked_at >= fmin(EXIT_REQUERY_S, sr->poll_interval))
    return true;
  return now - sr->last_query >= sr->poll_interval;
}

/* Owned "h1,h2,…" of the handles to ask about. */
static char *id_list(char *const *handles, const bool *ask, size_t n) {
  size_t len = 1;
  for (size_t i = 0; i < n; i++) len += ask[i] ? strlen(handles[i]) + 1 : 0;
  char *list = malloc(len), *w = list;
  for (size_t i = 0; list && i < n; i++)
    if (ask[i]) w += sprintf(w, "%s%s", w == list ? "" : ",", handles[i]);
  return list;
}

/* Runs the one squeue call of a poll. *answered is false when Slurm could not be reached
 * even after retries: the jobs then keep their states until the next poll. */
static int squeue_ask(const slurm_runner *sr, const char *ids, slurm_row **rows, size_t *n_rows,
                      bool *answered, nas_err *err) {
  char *argv[] = {"squeue", "-h", "-t", "all", "-r", "-j", (char *)ids,
                  "-O", SLURM_SQUEUE_FORMAT, NULL};
  slurm_output res;
  *rows = NULL;
  *n_rows = 0;
  *answered = true;
  int rc = slurm_cmd_run(&sr->retry, argv, NULL, &res, err);
  if (rc == NAS_OK) {
    rc = slurm_rows_parse(res.out, rows, n_rows, err);
  } else if (says_gone(&res)) { /* squeue -j with one unknown id fails; more succeed */
    rc = NAS_OK;
  } else if (res.transient) {
    nas_log("slurm runner: %s; asking again at the next poll", err ? err->msg : "squeue failed");
    *answered = false;
    rc = NAS_OK;
  }
  slurm_output_free(&res);
  return rc;
}

/* Asks Slurm about the jobs marked in ask and records what it says. */
static int query(slurm_runner *sr, char *const *handles, char *const *run_dirs, size_t n,
                 const bool *ask, const bool *exit_exists, nas_err *err) {
  char *ids = id_list(handles, ask, n);
  if (!ids) return nas_errf(err, "out of memory");
  slurm_row *rows;
  size_t n_rows;
  bool answered;
  int rc = squeue_ask(sr, ids, &rows, &n_rows, &answered, err);
  free(ids);
  double now = nas_monotonic();
  sr->last_query = now;
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    if (!ask[i]) continue;
    seen_job *e = seen_get(sr, handles[i], err);
    if (!e) {
      rc = NAS_ERR;
      break;
    }
    const slurm_row *row = slurm_rows_find(rows, n_rows, handles[i]);
    if (answered)
      e->status = row ? row_status(sr, row, run_dirs[i], e) : gone_status(handles[i], run_dirs[i]);
    e->exit_seen = exit_exists[i];
    e->asked_at = now;
  }
  slurm_rows_free(rows, n_rows);
  return rc;
}

/* ---- the backend ---- */

static const char bad_handle[] = "malformed Slurm job handle '%s' (expected a job id such as "
                                 "12345, or 12345_3 for a task of a job array)";

static void slurm_free(void *state) {
  slurm_runner *sr = state;
  if (!sr) return;
  for (size_t i = 0; i < N_FLAG_OPTIONS; i++) free(sr->flag_values[i]);
  text_list_free(&sr->sbatch_args);
  text_list_free(&sr->setup);
  for (size_t i = 0; i < sr->n_seen; i++) free(sr->seen[i].handle), free(sr->seen[i].run_dir);
  free(sr->seen);
  runner_self_free(&sr->self);
  free(sr);
}

static int slurm_create(const json_t *options, void **state, nas_err *err) {
  slurm_runner *sr = calloc(1, sizeof *sr);
  if (!sr) return nas_errf(err, "out of memory");
  sr->poll_interval = DEFAULT_POLL_INTERVAL_S;
  sr->retry = (slurm_retry){.retries = DEFAULT_RETRIES, .backoff_s = DEFAULT_BACKOFF_S,
                            .timeout_s = COMMAND_TIMEOUT_S};
  if ((options && options_read(options, sr, err) != NAS_OK) ||
      runner_self_find(&sr->self, err) != NAS_OK) {
    slurm_free(sr);
    return NAS_ERR;
  }
  *state = sr;
  return NAS_OK;
}

static int slurm_start(void *state, const runner_job *job, char **handle, nas_err *err) {
  return start_one(state, job, false, handle, err);
}

static int slurm_start_held(void *state, const runner_job *job, char **handle, nas_err *err) {
  return start_one(state, job, true, handle, err);
}

/* A job that cannot be released (the controller did not answer, even after retries) is
 * given up as its starter's death gives it up: no longer held by this runner while its
 * run folder keeps HELD_FILE, so the next poll cancels it and says lost (it never ran),
 * and the scheduler runs the trial again, rather than waiting on it forever. */
static int slurm_release(void *state, const char *handle, nas_err *err) {
  slurm_runner *sr = state;
  if (!slurm_handle_valid(handle)) return nas_errf(err, bad_handle, handle);
  char *argv[] = {"scontrol", "release", (char *)handle, NULL};
  int rc = job_command(sr, argv, err);
  seen_job *e = seen_find(sr, handle);
  if (e) e->held = false;
  if (rc != NAS_OK)
    return nas_err_prefix(err, "job %s (cancelled and reported lost at the next poll)", handle);
  return e && e->run_dir ? file_in_remove(e->run_dir, HELD_FILE, err) : NAS_OK;
}

static int slurm_start_batch(void *state, const runner_job *jobs, size_t n, char **handles,
                             nas_err *err) {
  slurm_runner *sr = state;
  if (!sr->array || n < 2) return NAS_ENOTFOUND;
  prepared *ps = calloc(n, sizeof *ps);
  int rc = ps ? NAS_OK : nas_errf(err, "out of memory");
  for (size_t i = 0; rc == NAS_OK && i < n; i++)
    if (prepare(sr, &jobs[i], &ps[i], err) != NAS_OK) rc = nas_err_prefix(err, "trial %zu", i);
  char *id = NULL;
  if (rc == NAS_OK) rc = array_submit(sr, jobs, ps, n, &id, err);
  if (rc == NAS_OK && array_handles(sr, id, ps, n, handles, err) != NAS_OK) {
    job_cancel(sr, id, NULL);
    rc = NAS_ERR;
  }
  free(id);
  for (size_t i = 0; ps && i < n; i++) prepared_free(&ps[i]);
  free(ps);
  if (rc != NAS_OK) return nas_err_prefix(err, "cannot submit a job array of %zu trials", n);
  return NAS_OK;
}

static int slurm_poll(void *state, char *const *handles, char *const *run_dirs, size_t n,
                      job_status *out, nas_err *err) {
  slurm_runner *sr = state;
  sr->polls++;
  for (size_t i = 0; i < n; i++)
    if (!slurm_handle_valid(handles[i])) return nas_errf(err, bad_handle, handles[i]);
  bool *ask = calloc(2 * n + 1, sizeof *ask), *exit_exists = ask + n;
  if (!ask) return nas_errf(err, "out of memory");
  double now = nas_monotonic();
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    exit_exists[i] = file_in_exists(run_dirs[i], RUNNER_EXIT_FILE);
    ask[i] = needs_asking(sr, seen_find(sr, handles[i]), exit_exists[i], now);
    any |= ask[i];
  }
  int rc = any ? query(sr, handles, run_dirs, n, ask, exit_exists, err) : NAS_OK;
  for (size_t i = 0; rc == NAS_OK && i < n; i++) {
    seen_job *e = seen_get(sr, handles[i], err); /* every handle has an entry by now */
    if (!e) {
      rc = NAS_ERR;
      break;
    }
    out[i] = e->status;
    e->polled = sr->polls;
  }
  free(ask);
  seen_prune(sr);
  return rc;
}

static int slurm_stop(void *state, const char *handle, const char *run_dir, nas_err *err) {
  (void)run_dir;
  slurm_runner *sr = state;
  if (!slurm_handle_valid(handle)) return nas_errf(err, bad_handle, handle);
  if (job_cancel(sr, handle, err) != NAS_OK) return nas_err_prefix(err, "job %s", handle);
  seen_forget(sr, handle); /* so that the next poll asks Slurm how it ended */
  return NAS_OK;
}

const runner_backend runner_slurm_backend = {
    .type = "slurm",
    .create = slurm_create,
    .free = slurm_free,
    .start = slurm_start,
    .start_batch = slurm_start_batch,
    .poll = slurm_poll,
    .stop = slurm_stop,
    .start_held = slurm_start_held,
    .release = slurm_release,
};
