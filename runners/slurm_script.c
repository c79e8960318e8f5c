/* runners/slurm_script.c: the bash job scripts the Slurm runner submits and keeps in each
 * trial's run folder.
 *
 * job.sh runs one trial: it appends its output to the run folder's stdout.log and
 * stderr.log, runs the spec's setup lines, exports the trial's environment (read from
 * env.sh beside it), enters the workdir and execs the command, all in a subshell so that
 * nothing from the user reaches the script's own shell; then it records how the command
 * ended in exit.json (the local runner's format) and ends the same way, re-raising a
 * signal that killed the command, so that Slurm's ExitCode says what the trial did.
 * array.sh picks a job.sh by SLURM_ARRAY_TASK_ID.
 *
 * Invariants:
 * - Every value that comes from a spec or a trial (argv, environment values, folders)
 *   enters a script as one single-quoted word (nas_shell_quote), which bash reads back
 *   byte for byte: no expansion, no word splitting, whatever quotes, `$(…)`, newlines or
 *   globs it holds. Environment names are checked to be bash identifiers. The setup lines
 *   are the only text written as shell code, on purpose: they are the spec author's shell.
 * - A script is written atomically: Slurm never reads half of one.
 * - The environment's values may be secrets (NAS_STORAGE with a database password), so
 *   they live only in env.sh, which only the user can read (0600), never in job.sh or in
 *   any command's arguments; job.sh itself is the user's alone too (0700), as its setup
 *   lines are the spec author's shell.
 * - The script's own shell traps TERM, INT and HUP so that it outlives a time limit's or a
 *   cancel's SIGTERM long enough to write exit.json; the subshell starts with the default
 *   handlers (bash resets trapped signals there), so the command sees every signal. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runners/slurm_internal.h"

/* Writes s to f as one quoted word; NAS_ERR when out of memory. */
static int word_put(FILE *f, const char *s) {
  char *quoted = nas_shell_quote(s);
  if (!quoted) return NAS_ERR;
  fputs(quoted, f);
  free(quoted);
  return NAS_OK;
}

static bool env_name_valid(const char *entry, size_t len) {
  if (len == 0 || isdigit((unsigned char)entry[0])) return false;
  for (size_t i = 0; i < len; i++)
    if (!isalnum((unsigned char)entry[i]) && entry[i] != '_') return false;
  return true;
}

int slurm_env_check(char *const *env, nas_err *err) {
  for (size_t i = 0; env && env[i]; i++) {
    const char *eq = strchr(env[i], '=');
    if (!eq) return nas_errf(err, "environment entry '%s' is not NAME=VALUE", env[i]);
    if (!env_name_valid(env[i], (size_t)(eq - env[i])))
      return nas_errf(err, "environment variable '%.*s' cannot be exported by a job "
                           "script (a name is letters, digits and _, not starting with a "
                           "digit)", (int)(eq - env[i]), env[i]);
  }
  return NAS_OK;
}

/* env.sh: one export per environment entry, in order (a later one wins), then NAS_BIN
 * and nas's folder put first on the PATH the setup lines and the entries left. */
static int env_fill(FILE *f, const void *ctx) {
  const slurm_task *task = ctx;
  fputs("# The environment of a nas trial, read by job.sh beside it. Readable only by you:\n"
        "# its values may be secrets (the password in NAS_STORAGE).\n", f);
  int rc = NAS_OK;
  for (size_t i = 0; task->env && task->env[i] && rc == NAS_OK; i++) {
    const char *eq = strchr(task->env[i], '=');
    fprintf(f, "export %.*s=", (int)(eq - task->env[i]), task->env[i]);
    rc = word_put(f, eq + 1);
    fputc('\n', f);
  }
  fputs("export NAS_BIN=", f);
  if (rc == NAS_OK) rc = word_put(f, task->nas_bin);
  fputs("\nexport PATH=", f);
  if (rc == NAS_OK) rc = word_put(f, task->nas_dir);
  fputs("\"${PATH:+:$PATH}\"\n", f);
  return rc;
}

/* The subshell that becomes the trial: setup, environment, workdir, command. */
static int trial_put(FILE *f, const slurm_task *task) {
  int rc = NAS_OK;
  fputs("(\n", f);
  if (task->n_setup) fputs("  # setup (runner.setup in the spec)\n", f);
  for (size_t i = 0; i < task->n_setup; i++) fprintf(f, "  %s\n", task->setup[i]);
  fputs("  . \"$nas_dir/" SLURM_ENV_FILE "\" || { printf 'nas: cannot read %s\\n' "
        "\"$nas_dir/" SLURM_ENV_FILE "\" >&2; exit 127; }\n"
        "  cd -- ", f);
  if (rc == NAS_OK) rc = word_put(f, task->workdir);
  fputs(" || { printf 'nas: cannot enter workdir %s\\n' ", f);
  if (rc == NAS_OK) rc = word_put(f, task->workdir);
  fputs(" >&2; exit 127; }\n  exec --", f);
  if (task->srun) fputs(" srun --", f);
  for (size_t i = 0; task->argv[i] && rc == NAS_OK; i++) {
    fputc(' ', f);
    rc = word_put(f, task->argv[i]);
  }
  fputs("\n)\n", f);
  return rc;
}

/* After the subshell: exit.json, then end as the command ended. A status of 128+N is
 * taken as death by signal N when N is a signal whose default action ends a process (bash
 * cannot tell it from `exit 128+N`; it is the shells' own convention). */
static const char script_tail[] =
    "nas_status=$?\n"
    "nas_state=exited nas_code=$nas_status nas_signal=0\n"
    "if [ \"$nas_status\" -gt 128 ] && [ \"$nas_status\" -le 192 ]; then\n"
    "  case $((nas_status - 128)) in\n"
    "    17|18|19|20|21|22|23|28) ;; # CHLD CONT STOP TSTP TTIN TTOU URG WINCH end nothing\n"
    "    *) nas_state=signaled nas_code=0 nas_signal=$((nas_status - 128)) ;;\n"
    "  esac\n"
    "fi\n"
    "printf '{\"state\": \"%s\", \"exit_code\": %d, \"signal\": %d}\\n' \"$nas_state\" "
    "\"$nas_code\" \"$nas_signal\" >\"$nas_dir/" RUNNER_EXIT_FILE ".tmp\" &&\n"
    "  mv -f -- \"$nas_dir/" RUNNER_EXIT_FILE ".tmp\" \"$nas_dir/" RUNNER_EXIT_FILE "\"\n"
    "if [ \"$nas_signal\" -ne 0 ]; then\n"
    "  trap - \"$nas_signal\"\n"
    "  ulimit -c 0\n"
    "  kill -s \"$nas_signal\" $$\n"
    "fi\n"
    "exit \"$nas_status\"\n";

static int job_fill(FILE *f, const void *ctx) {
  const slurm_task *task = ctx;
  fputs("#!/bin/bash\n"
        "# A nas trial, written by the slurm runner (docs/runners.md) and submitted with\n"
        "# sbatch. Runs the trial's command in its workdir with its environment, appends\n"
        "# the output to stdout.log and stderr.log here and records the end in exit.json.\n"
        "nas_dir=", f);
  int rc = word_put(f, task->run_dir);
  fputs("\nexec >>\"$nas_dir/stdout.log\" 2>>\"$nas_dir/stderr.log\" </dev/null\n"
        "rm -f -- \"$nas_dir/" RUNNER_EXIT_FILE "\" # a requeued job starts afresh\n"
        "trap : TERM INT HUP # outlive a time limit's SIGTERM to write " RUNNER_EXIT_FILE "\n",
        f);
  if (rc == NAS_OK) rc = trial_put(f, task);
  fputs(script_tail, f);
  return rc;
}

typedef struct {
  char *const *scripts;
  size_t n;
} array_list;

static int array_fill(FILE *f, const void *ctx) {
  const array_list *list = ctx;
  fputs("#!/bin/bash\n"
        "# A job array of nas trials, written by the slurm runner (docs/runners.md): task N\n"
        "# runs the job script of the N-th trial below.\n"
        "case \"${SLURM_ARRAY_TASK_ID-}\" in\n", f);
  int rc = NAS_OK;
  for (size_t i = 0; i < list->n && rc == NAS_OK; i++) {
    fprintf(f, "  %zu) exec \"$BASH\" -- ", i);
    rc = word_put(f, list->scripts[i]);
    fputs(" ;;\n", f);
  }
  fputs("esac\n"
        "echo \"nas: no trial for array task '${SLURM_ARRAY_TASK_ID-}'\" >&2\n"
        "exit 1\n", f);
  return rc;
}

/* Writes dir/name atomically with permission bits mode and the text fill puts into a
 * stream; *path (owned). */
static int script_write(const char *dir, const char *name, unsigned mode,
                        int (*fill)(FILE *f, const void *ctx), const void *ctx, char **path,
                        nas_err *err) {
  char *text = NULL;
  size_t len = 0;
  *path = nas_asprintf("%s/%s", dir, name);
  FILE *f = *path ? open_memstream(&text, &len) : NULL;
  int rc = f ? fill(f, ctx) : NAS_ERR;
  if (f && nas_memstream_close(f, &text, NULL) != NAS_OK) rc = NAS_ERR;
  if (rc != NAS_OK) nas_errf(err, "%s/%s: out of memory", dir, name);
  else rc = nas_write_file_atomic_mode(*path, text, len, mode, err);
  free(text);
  if (rc != NAS_OK) {
    free(*path);
    *path = NULL;
  }
  return rc;
}

int slurm_job_script_write(const slurm_task *task, char **path, nas_err *err) {
  if (slurm_env_check(task->env, err) != NAS_OK) return NAS_ERR;
  char *env_path = NULL;
  int rc = script_write(task->run_dir, SLURM_ENV_FILE, 0600, env_fill, task, &env_path, err);
  free(env_path);
  if (rc != NAS_OK) return rc;
  return script_write(task->run_dir, "job.sh", 0700, job_fill, task, path, err);
}

int slurm_array_script_write(const char *dir, char *const *scripts, size_t n, char **path,
                             nas_err *err) {
  array_list list = {.scripts = scripts, .n = n};
  return script_write(dir, "array.sh", 0644, array_fill, &list, path, err);
}
