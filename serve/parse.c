/* serve/parse.c: reading the parts of a request that clients control — its path against a
 * route's pattern, counts and trial numbers in it, the JSON bodies of reports, and the Host
 * and Origin headers that tell where a browser sent it from — as pure
 * functions (no connection, no storage), so that tests/fuzz/fuzz_request.c can throw
 * arbitrary bytes at them. Each failure says what was expected, for a 4xx reply. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"
#include "metrics/metrics.h"

bool serve_path_match(const char *pattern, char *path, char **parts, size_t max_parts,
                      size_t *n_parts) {
  *n_parts = 0;
  const char *p = pattern;
  char *s = path;
  while (*p == '/' && *s == '/') {
    p++, s++;
    size_t plen = strcspn(p, "/"), slen = strcspn(s, "/");
    if (slen == 0) return false;
    if (plen == 1 && *p == '*') {
      if (*n_parts == max_parts) return false;
      parts[(*n_parts)++] = s;
    } else if (plen != slen || strncmp(p, s, plen) != 0) {
      return false;
    }
    p += plen, s += slen;
  }
  if (*p != '\0' || *s != '\0') return false;
  for (size_t k = 0; k < *n_parts; k++) parts[k][strcspn(parts[k], "/")] = '\0';
  return true;
}

bool serve_host_is_loopback(const char *host) {
  char name[64];
  size_t len;
  if (host[0] == '[') { /* [IPv6]:port */
    len = strcspn(host + 1, "]");
    if (host[1 + len] != ']' || (host[2 + len] && host[2 + len] != ':')) return false;
    host++;
  } else {
    len = strcspn(host, ":");
  }
  if (len == 0 || len >= sizeof name) return false;
  memcpy(name, host, len);
  name[len] = '\0';
  struct in_addr v4;
  struct in6_addr v6;
  if (inet_pton(AF_INET, name, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, name, &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  return strcasecmp(name, "localhost") == 0;
}

bool serve_origin_is_host(const char *origin, const char *host) {
  if (!host) return false;
  const char *rest = strncasecmp(origin, "http://", 7) == 0    ? origin + 7
                     : strncasecmp(origin, "https://", 8) == 0 ? origin + 8
                                                               : NULL;
  return rest && strcasecmp(rest, host) == 0;
}

int serve_parse_count(const char *text, long max, long *out) {
  char *end;
  if (*text < '0' || *text > '9') return NAS_ERR; /* strtol would take " 1" and "+1" */
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < 0 || v > max) return NAS_ERR;
  *out = v;
  return NAS_OK;
}

int serve_parse_step(const json_t *body, int64_t *step, char *why, size_t why_size) {
  const json_t *v = json_object_get(body, "step");
  *step = METRIC_FINAL;
  if (!v || json_is_null(v)) return NAS_OK;
  nas_err err; /* an integer past 2^53 becomes a double of at least 2^53: still refused */
  double real = json_is_integer(v) ? (double)json_integer_value(v) : NAN; /* NaN: refused */
  if (metric_step_check(real, &err) != NAS_OK) {
    snprintf(why, why_size, "%s", err.msg);
    return NAS_ERR;
  }
  *step = json_integer_value(v);
  return NAS_OK;
}

int serve_parse_metrics(const json_t *body, bool required, int64_t step, double now,
                        metric_obs **obs, size_t *n, char *why, size_t why_size) {
  const json_t *metrics = json_object_get(body, "metrics");
  *obs = NULL;
  *n = 0;
  if (!metrics && !required) return NAS_OK;
  if (!json_is_object(metrics) || json_object_size(metrics) == 0) {
    snprintf(why, why_size, "expected \"metrics\": {\"name\": number, …}");
    return NAS_ERR;
  }
  if (!(*obs = calloc(json_object_size(metrics), sizeof **obs))) {
    snprintf(why, why_size, "out of memory");
    return NAS_ERR;
  }
  const char *name;
  const json_t *value;
  json_object_foreach((json_t *)metrics, name, value) {
    nas_err bad; /* the checks of a metric line (a name, a finite value, NAME_sem >= 0) */
    bool number = json_is_number(value);
    if (!number || metric_check(name, json_number_value(value), &bad) != NAS_OK) {
      if (number) snprintf(why, why_size, "%s", bad.msg);
      else snprintf(why, why_size, "metric '%.100s' is not a number", name);
      free(*obs);
      *obs = NULL;
      *n = 0;
      return NAS_ERR;
    }
    (*obs)[(*n)++] = (metric_obs){.name = name, .step = step, .value = json_number_value(value), .time = now};
  }
  return NAS_OK;
}
