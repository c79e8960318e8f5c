/* scheduler/hyperband.c: multi-fidelity by Hyperband's brackets of successive halving over
 * epochs (spec.multi_fidelity; BOHB's scheme: the optimizer proposes every trial, the
 * brackets decide how long each trains).
 *
 * A trial's bracket follows from its number alone, and the rung it trains to is stored
 * with it (trial_row.rung), so every decision can be taken again from storage after a
 * crash: a rung is decided once all its trials have ended, by promoting the best
 * n_{i+1} (fewest others dominating them over the objectives, then the lowest number; all
 * of its completed, feasible ones when there are fewer) to the next rung — completed →
 * queued at rung + 1, in storage before anything else. Trials promoted before a crash
 * still hold their rung's values (they are queued, not yet run, because promotions come
 * before launches), so the ranking repeats itself and only the rest of the decision is
 * made. A trial trains each rung from the weights it saved at the end of the one before
 * (NAS_RESUME_DIR), on a learning-rate schedule of max_epochs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/internal.h"

/* ---- bracket arithmetic ----------------------------------------------------------------- */

static int64_t power(int base, int exp) {
  int64_t p = 1;
  while (exp-- > 0) p *= base;
  return p;
}

int sched_hyperband_top(const multi_fidelity_spec *mf) {
  int s = 0;
  while ((int64_t)mf->min_epochs * power(mf->eta, s + 1) <= mf->max_epochs) s++;
  return s;
}

int sched_hyperband_trials(const multi_fidelity_spec *mf, int s, int rung) {
  int64_t top = sched_hyperband_top(mf), grown = (top + 1) * power(mf->eta, s);
  int64_t first = (grown + s) / (s + 1); /* ceil((s_max + 1)·eta^s / (s + 1)) */
  return (int)(first / power(mf->eta, rung));
}

int sched_hyperband_epochs(const multi_fidelity_spec *mf, int s, int rung) {
  int64_t epochs = mf->max_epochs / power(mf->eta, s - rung);
  return epochs < mf->min_epochs ? mf->min_epochs : (int)epochs;
}

int sched_hyperband_epochs_run(const multi_fidelity_spec *mf, int number, int rung) {
  sched_bracket b;
  sched_hyperband_bracket_of(mf, number, &b);
  int before = rung > 0 ? sched_hyperband_epochs(mf, b.bracket, rung - 1) : 0;
  return sched_hyperband_epochs(mf, b.bracket, rung) - before;
}

double sched_hyperband_epochs_per_trial(const multi_fidelity_spec *mf) {
  double epochs = 0, trials = 0;
  for (int s = sched_hyperband_top(mf); s >= 0; s--) {
    trials += sched_hyperband_trials(mf, s, 0);
    for (int rung = 0, before = 0; rung <= s; rung++) {
      int reached = sched_hyperband_epochs(mf, s, rung);
      epochs += (double)sched_hyperband_trials(mf, s, rung) * (reached - before);
      before = reached;
    }
  }
  return epochs / trials;
}

void sched_hyperband_bracket_of(const multi_fidelity_spec *mf, int number, sched_bracket *out) {
  int top = sched_hyperband_top(mf), round = 0;
  for (int s = top; s >= 0; s--) round += sched_hyperband_trials(mf, s, 0);
  int offset = number % round, first = number - offset;
  for (int s = top; s >= 0; s--) {
    int n = sched_hyperband_trials(mf, s, 0);
    if (offset < n || s == 0) {
      *out = (sched_bracket){.bracket = s, .first_number = first, .n_trials = n, .n_rungs = s + 1};
      return;
    }
    offset -= n;
    first += n;
  }
}

/* ---- a trial's budget ------------------------------------------------------------------- */

/* runs/<experiment>/<number>.rungs/epoch-<epochs>: where a trial keeps what it saved after
 * that many epochs; stable across attempts. Owned; NULL when out of memory. */
static char *rung_dir(const experiment_row *exp, int number, int epochs) {
  char *runs = sched_experiment_runs_dir(exp);
  char *dir = runs ? nas_asprintf("%s/%d.rungs/epoch-%d", runs, number, epochs) : NULL;
  free(runs);
  return dir;
}

void sched_hyperband_env(const sched *sc, const trial_row *row, char **env, size_t *n) {
  const multi_fidelity_spec *mf = &sc->s->multi_fidelity;
  if (mf->kind == MULTI_FIDELITY_NONE) return;
  sched_bracket b;
  sched_hyperband_bracket_of(mf, row->number, &b);
  int rung = row->rung < b.n_rungs ? row->rung : b.n_rungs - 1;
  int epochs = sched_hyperband_epochs(mf, b.bracket, rung);
  int first = rung > 0 ? sched_hyperband_epochs(mf, b.bracket, rung - 1) : 0;
  char *save = rung_dir(sc->exp, row->number, epochs);
  env[(*n)++] = nas_asprintf("NAS_EPOCHS=%d", epochs);
  env[(*n)++] = nas_asprintf("NAS_FIRST_EPOCH=%d", first);
  env[(*n)++] = nas_asprintf("NAS_MAX_EPOCHS=%d", mf->max_epochs);
  env[(*n)++] = save ? nas_asprintf("NAS_SAVE_DIR=%s", save) : NULL;
  free(save);
  if (rung == 0) return;
  char *resume = rung_dir(sc->exp, row->number, first);
  env[(*n)++] = resume ? nas_asprintf("NAS_RESUME_DIR=%s", resume) : NULL;
  free(resume);
}

/* ---- promotions ------------------------------------------------------------------------- */

/* Objective j of trial t in the minimisation convention. */
static double minimised(const spec *s, const sched_results *r, size_t t, size_t j) {
  double v = r->values[t * r->n_metrics + j]; /* objectives come first */
  return s->objectives[j].goal == GOAL_MAXIMIZE ? -v : v;
}

static bool dominates(const spec *s, const sched_results *r, size_t a, size_t b) {
  bool better = false;
  for (size_t j = 0; j < s->n_objectives; j++) {
    double x = minimised(s, r, a, j), y = minimised(s, r, b, j);
    if (x > y) return false;
    better |= x < y;
  }
  return better;
}

/* A trial that may be promoted from rung i: already promoted, or completed there with every
 * objective reported and every constraint met. */
static bool contender(const spec *s, const sched_results *r, size_t t, int rung) {
  const trial_row *row = &r->trials[t];
  if (row->rung < rung || (row->rung == rung && row->status != TRIAL_COMPLETED)) return false;
  for (size_t j = 0; j < s->n_objectives; j++)
    if (isnan(r->values[t * r->n_metrics + j])) return false;
  return sched_results_feasible(s, r, t);
}

typedef struct {
  size_t t;      /* index into the results */
  size_t beaten; /* contenders dominating it */
  int number;
} ranked;

static int cmp_ranked(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->beaten != y->beaten) return x->beaten < y->beaten ? -1 : 1;
  return (x->number > y->number) - (x->number < y->number);
}

/* Stores the promotion of trial t from rung and queues it to launch first. */
static int promote(sched *sc, const sched_results *r, size_t t, int rung, int epochs,
                   nas_err *err) {
  trial_row row;
  int64_t id = r->trials[t].id;
  if (storage_trial_promote(sc->st, id, rung, err) != NAS_OK ||
      storage_trial_get(sc->st, id, &row, err) != NAS_OK)
    return NAS_ERR;
  sched_count(sc, TRIAL_COMPLETED, TRIAL_QUEUED);
  char *what = nas_asprintf("promoted to rung %d: trains on to %d epochs", rung + 1, epochs);
  sched_progress_event(sc, &row, what ? what : "promoted");
  free(what);
  return sched_enqueue(sc, &row, err);
}

/* Decides rung i of a bracket whose members are the results' trials [from, to), when it
 * has ended and is undecided; *waiting says the rung is not decided (so later rungs wait).
 * A rung with fewer contenders than its share keeps them all: once it has ended and every
 * contender is promoted it is decided, so the next rung is judged on what reached it. */
static int decide_rung(sched *sc, const sched_results *r, const sched_bracket *b, size_t from,
                       size_t to, int rung, bool *waiting, nas_err *err) {
  const multi_fidelity_spec *mf = &sc->s->multi_fidelity;
  size_t reached = 0, promoted = 0, n = 0;
  for (size_t t = from; t < to; t++) {
    reached += r->trials[t].rung >= rung;
    promoted += r->trials[t].rung > rung;
  }
  size_t keep = reached / (size_t)mf->eta;
  if (promoted >= keep) return NAS_OK;
  bool ended = true;
  for (size_t t = from; t < to; t++)
    ended &= r->trials[t].rung != rung || trial_status_final(r->trials[t].status);
  if (!ended) {
    *waiting = true;
    return NAS_OK;
  }
  ranked *order = calloc(to - from, sizeof *order);
  if (!order) return nas_errf(err, "out of memory");
  for (size_t t = from; t < to; t++) {
    if (!contender(sc->s, r, t, rung)) continue;
    order[n] = (ranked){.t = t, .number = r->trials[t].number};
    for (size_t u = from; u < to; u++)
      order[n].beaten += u != t && contender(sc->s, r, u, rung) && dominates(sc->s, r, u, t);
    n++;
  }
  qsort(order, n, sizeof *order, cmp_ranked);
  int epochs = sched_hyperband_epochs(mf, b->bracket, rung + 1), rc = NAS_OK;
  for (size_t k = 0; k < n && k < keep && rc == NAS_OK; k++)
    if (r->trials[order[k].t].rung == rung) {
      rc = promote(sc, r, order[k].t, rung, epochs, err);
      *waiting = true; /* these results still hold it at this rung: the next rung waits */
    }
  free(order);
  return rc;
}

/* The bracket of the results' trials [from, to); more: trials of it are still to come. */
static int decide_bracket(sched *sc, const sched_results *r, const sched_bracket *b,
                          size_t from, size_t to, bool more, nas_err *err) {
  bool waiting = more;
  for (int rung = 0; rung + 1 < b->n_rungs && !waiting; rung++)
    if (decide_rung(sc, r, b, from, to, rung, &waiting, err) != NAS_OK) return NAS_ERR;
  return NAS_OK;
}

int sched_hyperband_promote(sched *sc, nas_err *err) {
  const multi_fidelity_spec *mf = &sc->s->multi_fidelity;
  if (mf->kind == MULTI_FIDELITY_NONE || sc->draining) return NAS_OK;
  const sched_results *r = sched_results_now(sc, err);
  if (!r) return NAS_ERR;
  bool budget_spent = sc->counts.total >= sc->s->budget.max_trials;
  size_t promoted_before = sc->n_queued;
  int rc = NAS_OK;
  for (size_t from = 0, to; rc == NAS_OK && from < r->n_trials; from = to) {
    sched_bracket b;
    sched_hyperband_bracket_of(mf, r->trials[from].number, &b);
    for (to = from; to < r->n_trials && r->trials[to].number < b.first_number + b.n_trials;) to++;
    bool more = (int)(to - from) < b.n_trials && !budget_spent;
    rc = decide_bracket(sc, r, &b, from, to, more, err);
  }
  if (sc->n_queued != promoted_before) sched_results_stale(sc);
  return rc;
}
