/* serve/notifiers.c: the webhooks of experiments told through the server (ask/tell,
 * docs/api.md). Each experiment whose spec has a notify: section gets one notifier
 * (notify/notify.h), started at its first tell and kept until the server stops, so that a
 * tell only queues its events and never waits on a receiver, and the events of many tells
 * share one webhook thread and queue. A spec changed since (a rename) gets a notifier of
 * its own; the old one stays until the stop, since a tell in flight may still use it. */
#include <stdlib.h>
#include <string.h>

#include "scheduler/scheduler.h"
#include "serve/internal.h"

struct serve_notifier {
  int64_t experiment_id;
  char *spec_text; /* owned: the spec nt was started from */
  spec *s;         /* owned: nt borrows its notify: section */
  notifier *nt;    /* owned; NULL when the spec has no webhooks */
};

void serve_notifiers_init(serve_notifiers *ns) {
  *ns = (serve_notifiers){0};
  pthread_mutex_init(&ns->lock, NULL);
}

void serve_notifiers_free(serve_notifiers *ns) {
  /* Their flush times run together: stopping waits one, however many experiments. */
  for (size_t i = 0; i < ns->n; i++) notifier_begin_close(ns->all[i].nt);
  for (size_t i = 0; i < ns->n; i++) {
    notifier_close(ns->all[i].nt);
    spec_free(ns->all[i].s);
    free(ns->all[i].spec_text);
  }
  free(ns->all);
  pthread_mutex_destroy(&ns->lock);
}

/* A new entry for exp at the end of ns (under its lock); NULL when it cannot be made. */
static serve_notifier *add(serve_notifiers *ns, const experiment_row *exp, nas_err *err) {
  if (ns->n == ns->cap) {
    size_t cap = ns->cap ? 2 * ns->cap : 8;
    serve_notifier *grown = realloc(ns->all, cap * sizeof *grown);
    if (!grown) return nas_errf(err, "out of memory"), NULL;
    ns->all = grown, ns->cap = cap;
  }
  serve_notifier e = {.experiment_id = exp->id, .spec_text = strdup(exp->spec_text)};
  int rc = e.spec_text ? sched_experiment_spec(exp, &e.s, err) : nas_errf(err, "out of memory");
  if (rc == NAS_OK) rc = notifier_start(e.s->notify, e.s->n_notify, &e.nt, err);
  if (rc != NAS_OK) {
    spec_free(e.s);
    free(e.spec_text);
    return NULL;
  }
  ns->all[ns->n] = e;
  return &ns->all[ns->n++];
}

notifier *serve_notifiers_get(serve_notifiers *ns, const experiment_row *exp) {
  pthread_mutex_lock(&ns->lock);
  serve_notifier *found = NULL;
  for (size_t i = 0; !found && i < ns->n; i++)
    if (ns->all[i].experiment_id == exp->id && strcmp(ns->all[i].spec_text, exp->spec_text) == 0)
      found = &ns->all[i];
  nas_err err;
  if (!found && !(found = add(ns, exp, &err)))
    nas_log("%s: no webhooks for this tell: %s", exp->name, err.msg);
  notifier *nt = found ? found->nt : NULL;
  pthread_mutex_unlock(&ns->lock);
  return nt;
}
