/* spec/notify.c: the `notify:` section (webhooks) -> spec.notify.
 *
 *   notify:
 *     - url: https://hooks.slack.com/services/T000/B000/XXXX   # http:// or https://
 *       on: [trial_failed, experiment_finished]   # default: every event
 *       format: slack                             # json (default) or slack
 *
 * A URL's path and query may be a secret (a Slack webhook's path is its only credential),
 * so no message here quotes a URL: they point at it by file:line:col instead. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "spec/internal.h"

/* In notify_event bit order. */
static const char *const event_names[] = {"trial_completed", "trial_failed", "front_changed",
                                          "experiment_finished", NULL};
static const char *const format_names[] = {"json", "slack", NULL};

/* Far beyond any real webhook; keeps a pasted document out of requests and messages. */
enum { NOTIFY_URL_MAX = 2048 };

const char *spec_notify_event_name(notify_event event) {
  for (int i = 0; i < NOTIFY_EVENT_COUNT; i++)
    if (event == 1u << i) return event_names[i];
  return "?";
}

/* Length of "http://" or "https://" at the start of url (any case), else 0. */
static size_t scheme_len(const char *url) {
  if (strncasecmp(url, "http://", 7) == 0) return 7;
  if (strncasecmp(url, "https://", 8) == 0) return 8;
  return 0;
}

/* The host (with its port) of the authority at from, which runs to the first '/', '?' or
 * '#', past any "user:password@"; *len gets its length. */
static const char *url_host(const char *from, size_t *len) {
  size_t n = strcspn(from, "/?#");
  const char *host = from;
  for (const char *at = memchr(host, '@', n); at; at = memchr(host, '@', n)) {
    n -= (size_t)(at + 1 - host);
    host = at + 1;
  }
  *len = n;
  return host;
}

char *spec_url_shown(const char *url) {
  size_t scheme = scheme_len(url), len;
  const char *host = url_host(url + scheme, &len);
  return nas_asprintf("%.*s%.*s%s", (int)scheme, url, (int)len, host, host[len] ? "/…" : "");
}

static int parse_url(const yaml_ctx *c, const yaml_node_t *node, const char *what, char **out) {
  const char *text = NULL;
  int rc = spec_node_text(c, node, what, &text);
  if (rc) return rc;
  size_t scheme = scheme_len(text), host_len;
  if (scheme == 0) return spec_node_errf(c, node, "%s: must start with http:// or https://", what);
  url_host(text + scheme, &host_len);
  if (host_len == 0) return spec_node_errf(c, node, "%s: names no host after the scheme", what);
  if (strlen(text) > NOTIFY_URL_MAX)
    return spec_node_errf(c, node, "%s: longer than %d characters", what, NOTIFY_URL_MAX);
  for (const char *p = text; *p; p++)
    if ((unsigned char)*p <= ' ' || *p == 0x7f)
      return spec_node_errf(c, node, "%s: holds a space or control character (write it %%-encoded)",
                            what);
  return spec_node_dup_text(c, node, what, out);
}

/* A word of names (NULL-terminated) -> its index; an unknown one gets a suggestion. */
static int parse_word(const yaml_ctx *c, const yaml_node_t *node, const char *what,
                      const char *const *names, const char *expected, int *out) {
  const char *text = NULL;
  int rc = spec_node_text(c, node, what, &text);
  if (rc) return rc;
  for (int i = 0; names[i]; i++)
    if (strcmp(names[i], text) == 0) {
      *out = i;
      return NAS_OK;
    }
  const char *guess = spec_nearest_name(text, names);
  return spec_node_errf(c, node, "%s: expected %s, got '%s'%s%s%s", what, expected, text,
                        guess ? "; did you mean '" : "", guess ? guess : "", guess ? "'?" : "");
}

/* on: a non-empty list of event names, each once. */
static int parse_events(const yaml_ctx *c, const yaml_node_t *entry, const char *what,
                        notify_spec *t) {
  yaml_node_t *list = spec_node_optional(c, entry, "on");
  t->events = NOTIFY_ALL_EVENTS;
  if (!list) return NAS_OK;
  char field[FIELD_CAP];
  spec_field_join(field, what, "on");
  int rc = spec_node_expect_list(c, list, field);
  if (rc) return rc;
  if (list->data.sequence.items.top == list->data.sequence.items.start)
    return spec_node_errf(c, list, "%s: name at least one event (or leave 'on' out for all)",
                          field);
  t->events = 0;
  for (yaml_node_item_t *item = list->data.sequence.items.start;
       item < list->data.sequence.items.top; item++) {
    yaml_node_t *node = spec_node_at(c, *item);
    int index;
    if ((rc = parse_word(c, node, field, event_names,
                         "trial_completed, trial_failed, front_changed or experiment_finished",
                         &index)))
      return rc;
    if (t->events & (1u << index))
      return spec_node_errf(c, node, "%s: '%s' named twice", field, event_names[index]);
    t->events |= 1u << index;
  }
  return NAS_OK;
}

static int parse_target(const yaml_ctx *c, const yaml_node_t *entry, const char *what,
                        notify_spec *t) {
  static const char *const keys[] = {"url", "on", "format", NULL};
  char field[FIELD_CAP];
  yaml_node_t *node;
  int rc = spec_node_expect_mapping(c, entry, what);
  if (!rc) rc = spec_node_check_keys(c, entry, what, keys);
  if (!rc) rc = spec_node_required(c, entry, what, "url", &node);
  if (!rc) rc = parse_url(c, node, spec_field_join(field, what, "url"), &t->url);
  if (!rc) rc = parse_events(c, entry, what, t);
  if (rc || !(node = spec_node_optional(c, entry, "format"))) return rc;
  int format;
  rc = parse_word(c, node, spec_field_join(field, what, "format"), format_names, "json or slack",
                  &format);
  t->format = (notify_format)format;
  return rc;
}

int spec_parse_notify(const yaml_ctx *c, const yaml_node_t *root, spec *s) {
  yaml_node_t *list = spec_node_optional(c, root, "notify");
  if (!list) return NAS_OK;
  int rc = spec_node_expect_list(c, list, "notify");
  if (rc) return rc;
  size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
  if (n > NOTIFY_MAX_TARGETS)
    return spec_node_errf(c, list, "notify: at most %d webhooks, got %zu", NOTIFY_MAX_TARGETS, n);
  if (n == 0) return NAS_OK;
  if (!(s->notify = calloc(n, sizeof *s->notify))) return nas_errf(c->err, "out of memory");
  for (size_t i = 0; i < n && !rc; i++) {
    char what[48];
    snprintf(what, sizeof what, "notify[%zu]", i);
    s->n_notify = i + 1;
    rc = parse_target(c, spec_node_at(c, list->data.sequence.items.start[i]), what, &s->notify[i]);
  }
  return rc;
}

void spec_notify_free(notify_spec *targets, size_t n) {
  for (size_t i = 0; i < n; i++) free(targets[i].url);
  free(targets);
}
