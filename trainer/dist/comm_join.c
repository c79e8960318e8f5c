/* comm_join: how a process finds its group: rank, world and group name from the environment
 * (srun's SLURM_* variables or a launcher's NAS_*), the checks every join makes on them,
 * and the dispatch to the backend that joins (docs/engine-comm.md, "Rendezvous").
 *
 * Invariants: every rank of a launch derives the same group name from its environment, and
 * two launches that may overlap derive different ones (a Slurm job step, or the launcher's
 * NAS_COMM_ID). Nothing here keeps state; a failed join leaves nothing behind. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/dist/comm_internal.h"

/* Parses the environment variable var as an integer in [lo, hi] into *out. */
static int env_int(const char *var, int lo, int hi, int *out, nas_err *err) {
  const char *text = getenv(var);
  if (!text || !*text) return nas_errf(err, "%s is not set", var);
  char *end;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || *end || value < lo || value > hi)
    return nas_errf(err, "%s=\"%s\" is not an integer in [%d, %d]", var, text, lo, hi);
  *out = (int)value;
  return NAS_OK;
}

bool comm_name_ok(const char *name) {
  size_t n = strnlen(name, TR_COMM_NAME_MAX);
  if (n == 0 || n == TR_COMM_NAME_MAX || name[0] == '.') return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
    if (!plain) return false;
  }
  return true;
}

/* Writes the group name into opts->name, checked. */
static int set_name(tr_comm_options *opts, const char *name, const char *from, nas_err *err) {
  int n = snprintf(opts->name, sizeof opts->name, "%s", name);
  if (n < 0 || n >= (int)sizeof opts->name || !comm_name_ok(opts->name))
    return nas_errf(err, "group name \"%s\" (from %s) must be 1 to %d letters, digits, '.', '_' "
                    "or '-', not starting with '.'", name, from, TR_COMM_NAME_MAX - 1);
  return NAS_OK;
}

/* A launcher's processes on one node: NAS_RANK, NAS_WORLD, NAS_COMM_ID. */
static int env_nas(tr_comm_options *opts, nas_err *err) {
  if (env_int("NAS_WORLD", 1, INT_MAX, &opts->world, err) != NAS_OK ||
      env_int("NAS_RANK", 0, opts->world - 1, &opts->rank, err) != NAS_OK)
    return NAS_ERR;
  const char *id = getenv("NAS_COMM_ID");
  if (!id || !*id)
    return nas_errf(err, "NAS_COMM_ID is not set (a group name unique to this launch)");
  opts->local_rank = opts->rank;
  opts->nodes = 1;
  return set_name(opts, id, "NAS_COMM_ID", err);
}

/* A task of srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES, and the job step
 * for the name. */
static int env_slurm(tr_comm_options *opts, nas_err *err) {
  const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  if (!job || !*job || !step || !*step)
    return nas_errf(err, "SLURM_PROCID is set but not SLURM_JOB_ID and SLURM_STEP_ID: run the "
                    "ranks as the tasks of srun, not from the batch script itself");
  if (env_int("SLURM_NTASKS", 1, INT_MAX, &opts->world, err) != NAS_OK ||
      env_int("SLURM_PROCID", 0, opts->world - 1, &opts->rank, err) != NAS_OK ||
      env_int("SLURM_LOCALID", 0, opts->world - 1, &opts->local_rank, err) != NAS_OK ||
      env_int("SLURM_NNODES", 1, opts->world, &opts->nodes, err) != NAS_OK)
    return NAS_ERR;
  /* Job ids restart with a fresh controller (test clusters, for one): a launcher that may
   * overlap another cluster's steps on the same node sets NAS_COMM_ID to tell them apart. */
  const char *prefix = getenv("NAS_COMM_ID");
  char name[2 * TR_COMM_NAME_MAX];
  bool prefixed = prefix && *prefix;
  snprintf(name, sizeof name, "%s%sslurm-%s.%s", prefixed ? prefix : "", prefixed ? "-" : "", job,
           step);
  return set_name(opts, name, "NAS_COMM_ID, SLURM_JOB_ID and SLURM_STEP_ID", err);
}

int tr_comm_env(tr_comm_options *opts, nas_err *err) {
  int rc;
  if (getenv("NAS_RANK")) rc = env_nas(opts, err);
  else if (getenv("SLURM_PROCID")) rc = env_slurm(opts, err);
  else
    return nas_errf(err, "collectives from the environment: neither NAS_RANK (with NAS_WORLD "
                    "and NAS_COMM_ID) nor SLURM_PROCID (a task of srun) is set");
  return rc == NAS_OK ? NAS_OK : nas_err_prefix(err, "collectives from the environment");
}

/* The checks every join makes, whatever the backend. */
static int check_options(const tr_comm_options *o, nas_err *err) {
  if (o->world < 1) return nas_errf(err, "world size must be at least 1, got %d", o->world);
  if (o->rank < 0 || o->rank >= o->world)
    return nas_errf(err, "rank %d is not in [0, %d)", o->rank, o->world);
  if (o->local_rank < 0) return nas_errf(err, "local rank %d is negative", o->local_rank);
  if (o->nodes < 1 || o->nodes > o->world)
    return nas_errf(err, "%d nodes for %d ranks", o->nodes, o->world);
  if (!comm_name_ok(o->name))
    return nas_errf(err, "group name \"%.*s\" must be 1 to %d letters, digits, '.', '_' or '-', "
                    "not starting with '.'", TR_COMM_NAME_MAX, o->name, TR_COMM_NAME_MAX - 1);
  return NAS_OK;
}

/* Joins with the defaults filled in (timeout). */
static int join_backend(const tr_comm_options *opts, tr_comm **out, nas_err *err) {
  tr_comm_options o = *opts;
  if (!(o.timeout_s > 0)) o.timeout_s = TR_COMM_TIMEOUT_S;
  switch (o.backend) {
  case TR_COMM_PROCESSES:
    if (o.nodes > 1)
      return nas_errf(err, "the ranks run on %d nodes, and CPU collectives work within one node: "
                      "use the NCCL backend across nodes", o.nodes);
    return comm_shm_join(&o, out, err);
  case TR_COMM_NCCL:
    return comm_nccl_join(&o, out, err);
  case TR_COMM_THREADS:
    return nas_errf(err, "thread ranks form a group with tr_comm_group_new, not by joining");
  }
  return nas_errf(err, "unknown backend %d", (int)o.backend);
}

int tr_comm_join(const tr_comm_options *opts, tr_comm **out, nas_err *err) {
  *out = NULL;
  if (!opts) return nas_errf(err, "comm join: no options");
  if (check_options(opts, err) != NAS_OK) return nas_err_prefix(err, "comm join");
  if (join_backend(opts, out, err) == NAS_OK) return NAS_OK;
  return nas_err_prefix(err, "comm group \"%s\" (rank %d of %d)", opts->name, opts->rank,
                        opts->world);
}

int tr_comm_init_env(const tr_comm_options *opts, tr_comm **out, nas_err *err) {
  *out = NULL;
  tr_comm_options o = opts ? *opts : (tr_comm_options){.backend = TR_COMM_PROCESSES};
  if (tr_comm_env(&o, err) != NAS_OK) return NAS_ERR;
  return tr_comm_join(&o, out, err);
}
