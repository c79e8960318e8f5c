/* notify: webhooks. Posts the events of a running experiment to the URLs of its spec's
 * `notify:` section (docs/spec.md, "Notifications") with libcurl, off the caller's thread.
 *
 * Each webhook has a thread and a queue of its own, so a slow or dead receiver delays only
 * its own events, and notifier_post never waits on the network: it formats the body and
 * appends it under a mutex. A queue holds at most NOTIFY_QUEUE_CAP events; when it is full
 * the oldest is dropped, with a warning (one per 10 s at most; notifier_close logs the
 * total). A request that fails (no connection, a timeout, an
 * HTTP 5xx or 429) is tried again after 0.5 s, 1 s, 2 s, up to NOTIFY_ATTEMPTS tries; one
 * refused outright (another 4xx) is not. Failures are logged (nas_log) and never reach the
 * caller: a webhook cannot fail a run. Logs show a URL only as spec_url_shown gives it,
 * since its path may be a secret (a Slack webhook's is). */
#ifndef NAS_NOTIFY_H
#define NAS_NOTIFY_H

#include <jansson.h>

#include "common/common.h"
#include "spec/spec.h"

#define NOTIFY_QUEUE_CAP 1000  /* events waiting per webhook */
#define NOTIFY_ATTEMPTS 4      /* tries of one event */
#define NOTIFY_TIMEOUT_S 10.0  /* one request, connecting included */
#define NOTIFY_CONNECT_S 5.0   /* connecting */
#define NOTIFY_FLUSH_S 5.0     /* notifier_close waits this long for queued events */

typedef struct notifier notifier;

/* Starts a thread per webhook of targets[0..n-1] (borrowed: they must outlive the
 * notifier). n may be 0: *out is then NULL, which every function here accepts. */
int notifier_start(const notify_spec *targets, size_t n, notifier **out, nas_err *err);

/* Queues event for every webhook that subscribes to it: `payload` (borrowed) for json
 * webhooks, {"text": text} for slack ones, its &, < and > escaped as Slack asks. Never blocks beyond a short mutex hold. */
void notifier_post(notifier *nt, notify_event event, const json_t *payload, const char *text);

/* Starts the NOTIFY_FLUSH_S that notifier_close gives the queued events, without waiting:
 * called on many notifiers before closing each, they all flush at once, so closing them
 * takes one flush time, not one each. A second call changes nothing. */
void notifier_begin_close(notifier *nt);

/* Waits up to NOTIFY_FLUSH_S (from notifier_begin_close, when that came first) for the
 * queued events to be delivered (a request in flight is cut short then, within about a
 * second), logs how many were given up, and frees. */
void notifier_close(notifier *nt);

#endif
