/* tests/dashboard.h: checks of the dashboard's data endpoints against the CLI's answers,
 * shared by the SQLite (test_e2e_dashboard.c) and PostgreSQL (test_e2e_postgres.c) tests. */
#ifndef NAS_TESTS_DASHBOARD_H
#define NAS_TESTS_DASHBOARD_H

#include <jansson.h>
#include <math.h>

#include "tests/serve.h"

/* GET …/dashboard, …/curves and /api/v1/compare of experiment name (whose `nas pareto
 * --format json` is pareto, and which has n_trials trials, each reporting a curve of
 * curve_metric) agree with the CLI. */
static inline void check_dashboard_api(const test_server *srv, const char *name, const json_t *pareto,
                                       size_t n_trials, const char *curve_metric) {
  int code;
  char *path = nas_asprintf("/api/v1/experiments/%s/dashboard", name);
  json_t *d = test_http(srv, "GET", path, NULL, NULL, &code);
  assert_int_equal(code, 200);
  const json_t *trials = json_object_get(d, "trials");
  assert_int_equal(json_array_size(json_object_get(trials, "number")), n_trials);
  assert_int_equal(json_array_size(json_object_get(trials, "status")), n_trials);
  const json_t *columns = json_object_get(trials, "params");
  assert_true(json_object_size(columns) > 0);
  const char *key;
  const json_t *column;
  json_object_foreach((json_t *)columns, key, column) assert_int_equal(json_array_size(column), n_trials);
  assert_true(json_equal(json_object_get(json_object_get(d, "pareto"), "front"), json_object_get(pareto, "front")));
  assert_true(json_number_value(json_object_get(json_object_get(d, "experiment"), "hypervolume")) ==
              json_number_value(json_object_get(pareto, "hypervolume")));
  /* The history ends at the front's hypervolume. */
  const json_t *volumes = json_object_get(json_object_get(d, "hypervolume_history"), "hypervolume");
  assert_true(fabs(json_number_value(json_array_get(volumes, json_array_size(volumes) - 1)) -
                   json_number_value(json_object_get(pareto, "hypervolume"))) < 1e-9);
  json_decref(d);
  free(path);

  path = nas_asprintf("/api/v1/experiments/%s/curves", name);
  json_t *c = test_http(srv, "GET", path, NULL, NULL, &code);
  assert_int_equal(code, 200);
  assert_int_equal(json_array_size(json_object_get(json_object_get(json_object_get(c, "curves"), curve_metric), "trial")),
                   n_trials);
  json_decref(c);
  free(path);

  /* An experiment compared with itself gets its own `nas pareto` hypervolume. */
  path = nas_asprintf("/api/v1/compare?experiments=%s,%s", name, name);
  json_t *cmp = test_http(srv, "GET", path, NULL, NULL, &code);
  assert_int_equal(code, 200);
  assert_true(fabs(json_number_value(json_object_get(json_array_get(json_object_get(cmp, "experiments"), 0), "hypervolume")) -
                   json_number_value(json_object_get(pareto, "hypervolume"))) < 1e-9);
  json_decref(cmp);
  free(path);
  json_t *none = test_http(srv, "GET", "/api/v1/experiments/no-such/dashboard", NULL, NULL, &code);
  assert_int_equal(code, 404);
  json_decref(none);
}

#endif
