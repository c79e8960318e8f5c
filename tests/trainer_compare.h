/* Comparing a trained model with a reference, for the tests of distributed training
 * (FSDP, pipelines): a model's values as one array, and closeness over a whole model.
 * Include after tests/testutil.h. */
#ifndef NAS_TESTS_TRAINER_COMPARE_H
#define NAS_TESTS_TRAINER_COMPARE_H

#include <math.h>

#include "trainer/trainer.h"

/* All of m's parameters (and, with buffers, its running statistics), float32,
 * concatenated in order (owned; NULL on failure); *n gets their count. */
static inline float *module_values_copy(tr_module *m, bool buffers, int64_t *n) {
  tr_param_list ps = {0};
  *n = 0;
  if (tr_module_parameters(m, buffers, &ps, NULL)) return NULL;
  for (size_t i = 0; i < ps.n; i++) *n += ps.items[i]->numel;
  float *out = malloc((size_t)*n * sizeof *out);
  int64_t off = 0;
  for (size_t i = 0; out && i < ps.n; i++) {
    memcpy(out + off, tr_f32(ps.items[i]), (size_t)ps.items[i]->numel * sizeof *out);
    off += ps.items[i]->numel;
  }
  tr_param_list_free(&ps);
  return out;
}

/* max |got - want| <= rtol * max |want|, over the whole model. */
static inline void assert_close(const float *got, const float *want, int64_t n, double rtol,
                                const char *what) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    worst = fmax(worst, fabs((double)got[i] - want[i]));
    scale = fmax(scale, fabs((double)want[i]));
  }
  if (worst > rtol * scale)
    print_error("%s: max difference %.3g, max magnitude %.3g\n", what, worst, scale);
  assert_true(worst <= rtol * scale);
}

#endif
