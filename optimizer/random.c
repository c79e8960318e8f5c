/* optimizer/random.c: the `random` optimizer: for trial number k, a uniform draw over the
 * space from the stream (spec.seed, k) (see taken.c), redrawn from the following streams
 * while it equals an observed, pending or earlier suggested assignment.
 * It keeps no state but the space and takes no options. */
#include <stdlib.h>

#include "optimizer/backend.h"
#include "optimizer/options.h"
#include "optimizer/taken.h"

typedef struct {
  const space *sp; /* borrowed */
} random_state;

static int random_create(const space *sp, const json_t *options, void **state, nas_err *err) {
  if (optimizer_check_options("random", options, NULL, err) < 0) return NAS_ERR;
  random_state *rs = malloc(sizeof *rs);
  if (!rs) return nas_errf(err, "optimizer random: out of memory");
  rs->sp = sp;
  *state = rs;
  return 0;
}

static void random_free(void *state) { free(state); }

static int random_suggest(void *state, const observation *obs, size_t n_obs,
                          const json_t *const *pending, size_t n_pending, size_t n,
                          int first_number, json_t **out, double *refs, nas_err *err) {
  (void)refs; /* random search aims at no reference point */
  const random_state *rs = state;
  return taken_suggest(rs->sp, space_spec(rs->sp)->seed, obs, n_obs, pending, n_pending, n,
                       first_number, NULL, out, err);
}

const optimizer_backend optimizer_random_backend = {
    .type = "random",
    .create = random_create,
    .free = random_free,
    .suggest = random_suggest,
};
