/* runners/slurm_state.c: what Slurm says about jobs, in the runner's words.
 *
 * Reads squeue's answer (SLURM_SQUEUE_FORMAT), maps Slurm's job states onto job_status,
 * and parses job ids and Slurm time limits. The mapping (docs/runners.md):
 *   PENDING, RUNNING, CONFIGURING, COMPLETING, SUSPENDED, REQUEUED, … -> running
 *     (waiting, as long as it has not started: PENDING, CONFIGURING, SUSPENDED, REQUEUED…)
 *   COMPLETED -> exited 0;  FAILED -> exited N, or signaled S when ExitCode says a signal
 *     (FAILED with ExitCode 0:0 failed before the job script ran: lost)
 *   TIMEOUT, DEADLINE -> timeout;  CANCELLED -> stopped
 *   OUT_OF_MEMORY -> signaled SIGKILL, with a detail that says so
 *   NODE_FAIL, PREEMPTED, BOOT_FAIL, REVOKED -> lost, so that the trial is run again
 * A state this table does not know counts as running: a new kind of waiting is likelier
 * than a new kind of end, and a job that did end is learnt from its exit.json once Slurm
 * forgets it.
 *
 * Invariants: pure functions of their input; rows come out sorted by id. */
#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runners/slurm_internal.h"

/* How a Slurm state ends a job. */
typedef enum { ENDS_NOT, ENDS_BY_EXIT, ENDS_TIMEOUT, ENDS_STOPPED, ENDS_OOM, ENDS_LOST } ending;

static const struct {
  const char *state;
  ending how;
} endings[] = {
    {"COMPLETED", ENDS_BY_EXIT},    {"FAILED", ENDS_BY_EXIT},
    {"TIMEOUT", ENDS_TIMEOUT},      {"DEADLINE", ENDS_TIMEOUT},
    {"CANCELLED", ENDS_STOPPED},    {"OUT_OF_MEMORY", ENDS_OOM},
    {"NODE_FAIL", ENDS_LOST},       {"PREEMPTED", ENDS_LOST},
    {"BOOT_FAIL", ENDS_LOST},       {"REVOKED", ENDS_LOST},
};

/* States of a job that has not started running (or was put aside): it cannot print. */
static const char *const waiting_states[] = {
    "PENDING", "CONFIGURING", "POWER_UP_NODE", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
    "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
};

static bool waiting_state(const char *state) {
  for (size_t i = 0; i < sizeof waiting_states / sizeof *waiting_states; i++)
    if (strcmp(waiting_states[i], state) == 0) return true;
  return false;
}

static ending ending_of(const char *state) {
  for (size_t i = 0; i < sizeof endings / sizeof *endings; i++)
    if (strcmp(endings[i].state, state) == 0) return endings[i].how;
  return ENDS_NOT;
}

/* Reads an exit code as squeue prints it (a raw wait status, "768" for exit 3) or as
 * scontrol does ("3:0", "0:9"). Unreadable text counts as 0:0. */
static void exit_code_read(const char *text, int *code, int *sig) {
  char *end;
  long first = strtol(text, &end, 10);
  *code = *sig = 0;
  if (end == text || first < 0) return;
  if (*end == ':') {
    *code = (int)first;
    *sig = atoi(end + 1);
  } else if ((first & 0x7f) != 0) {
    *sig = (int)(first & 0x7f);
  } else {
    *code = (int)((first >> 8) & 0xff);
  }
}

job_status slurm_status_of(const char *id, const char *state, const char *exit_code,
                           const char *reason) {
  job_status st = {.state = JOB_RUNNING};
  int code, sig;
  exit_code_read(exit_code, &code, &sig);
  switch (ending_of(state)) {
  case ENDS_NOT:
    st.waiting = waiting_state(state);
    return st;
  case ENDS_BY_EXIT:
    if (strcmp(state, "FAILED") == 0 && code == 0 && sig == 0) {
      st.state = JOB_LOST; /* failed before the script ran: a launch or prolog failure */
      break;
    }
    st.state = sig ? JOB_SIGNALED : JOB_EXITED;
    st.exit_code = code;
    st.signal = sig;
    return st; /* the trial's own status says it all */
  case ENDS_TIMEOUT: st.state = JOB_TIMEOUT; break;
  case ENDS_STOPPED: st.state = JOB_STOPPED; break;
  case ENDS_OOM:
    st.state = JOB_SIGNALED;
    st.signal = SIGKILL;
    break;
  case ENDS_LOST: st.state = JOB_LOST; break;
  }
  const char *why = st.state == JOB_SIGNALED ? " (killed for using more memory than it asked for)"
                    : st.state == JOB_LOST   ? " (not by its own doing: run it again)"
                                             : "";
  bool has_reason = reason && reason[0] && strcmp(reason, "None") != 0;
  snprintf(st.detail, sizeof st.detail, "Slurm job %s ended %s%s%s%s", id, state, why,
           has_reason ? ", reason " : "", has_reason ? reason : "");
  return st;
}

bool slurm_handle_valid(const char *handle) {
  const char *p = handle;
  if (!isdigit((unsigned char)*p)) return false;
  while (isdigit((unsigned char)*p)) p++;
  if (*p == '\0') return true;
  if (*p++ != '_' || !isdigit((unsigned char)*p)) return false;
  while (isdigit((unsigned char)*p)) p++;
  return *p == '\0';
}

static int row_cmp(const void *a, const void *b) {
  return strcmp(((const slurm_row *)a)->id, ((const slurm_row *)b)->id);
}

void slurm_rows_free(slurm_row *rows, size_t n) {
  for (size_t i = 0; i < n; i++) free(rows[i].id);
  free(rows);
}

/* Splits line (modified) into its 4 fields; false when it has fewer. */
static bool fields_split(char *line, char *field[4]) {
  for (int i = 0; i < 4; i++) {
    field[i] = line;
    char *bar = strchr(line, '|');
    if (!bar) return i == 3; /* the last '|' may be missing */
    *bar = '\0';
    line = bar + 1;
  }
  return true;
}

/* Strips the blanks squeue may pad a field with. */
static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

int slurm_rows_parse(const char *text, slurm_row **rows_out, size_t *n_out, nas_err *err) {
  size_t lines = 1;
  for (const char *p = text; *p; p++) lines += *p == '\n';
  slurm_row *rows = calloc(lines, sizeof *rows);
  char *copy = strdup(text);
  if (!rows || !copy) {
    free(rows), free(copy);
    return nas_errf(err, "out of memory");
  }
  size_t n = 0;
  int rc = NAS_OK;
  char *save = NULL;
  for (char *line = strtok_r(copy, "\n", &save); line && rc == NAS_OK;
       line = strtok_r(NULL, "\n", &save)) {
    char *field[4];
    if (!fields_split(line, field) || !slurm_handle_valid(trim(field[0]))) {
      rc = nas_errf(err, "squeue printed a line the runner cannot read: '%s'", line);
      break;
    }
    rows[n].id = strdup(trim(field[0]));
    if (!rows[n].id) rc = nas_errf(err, "out of memory");
    else {
      const char *reason = trim(field[3]);
      rows[n].status = slurm_status_of(rows[n].id, trim(field[1]), trim(field[2]), reason);
      rows[n].held = rows[n].status.state == JOB_RUNNING &&
                     (strcmp(reason, "JobHeldUser") == 0 || strcmp(reason, "JobHeldAdmin") == 0);
    }
    n++;
  }
  free(copy);
  if (rc != NAS_OK) {
    slurm_rows_free(rows, n);
    return rc;
  }
  qsort(rows, n, sizeof *rows, row_cmp);
  *rows_out = rows;
  *n_out = n;
  return NAS_OK;
}

const slurm_row *slurm_rows_find(const slurm_row *rows, size_t n, const char *id) {
  slurm_row key = {.id = (char *)id};
  return n ? bsearch(&key, rows, n, sizeof *rows, row_cmp) : NULL;
}

/* Reads a non-negative integer of at most 9 digits; NULL when there is none (or more
 * digits: those are counted, never added up, as a long cannot hold every run of them). */
static const char *number_read(const char *p, long *out) {
  if (!isdigit((unsigned char)*p)) return NULL;
  long v = 0;
  int digits = 0;
  for (; isdigit((unsigned char)*p); p++, digits++)
    if (digits < 9) v = v * 10 + (*p - '0');
  if (digits > 9) return NULL;
  *out = v;
  return p;
}

int slurm_time_parse(const char *text, double *seconds) {
  long part[3] = {0}; /* the numbers after the days, in the order written */
  int n = 0;
  long days = -1;
  const char *p = number_read(text, &part[n++]);
  if (p && *p == '-') { /* "D-…": days first, then hours[:minutes[:seconds]] */
    days = part[0];
    n = 0;
    p = number_read(p + 1, &part[n++]);
  }
  while (p && *p == ':' && n < 3) p = number_read(p + 1, &part[n++]);
  if (!p || *p != '\0') return NAS_ERR;
  double s;
  if (days >= 0) /* D-HH, D-HH:MM, D-HH:MM:SS */
    s = days * 86400.0 + part[0] * 3600.0 + part[1] * 60.0 + part[2];
  else if (n == 1) /* MM */
    s = part[0] * 60.0;
  else if (n == 2) /* MM:SS */
    s = part[0] * 60.0 + part[1];
  else /* HH:MM:SS */
    s = part[0] * 3600.0 + part[1] * 60.0 + part[2];
  *seconds = s;
  return NAS_OK;
}
