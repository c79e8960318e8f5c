#!/usr/bin/env python3
"""bench/first_paint.py URL PROFILE_DIR: loads URL in headless Chromium, driven over the
DevTools protocol on a pipe (--remote-debugging-pipe: NUL-separated JSON on fds 3 and 4, so
no websocket library is needed), waits until the dashboard's script says it drew the page
(<body data-ready>) and prints how long after the request the first draw came (the summary
and the cards at the top of the page; the page's own performance.now(), real time), how
long that drawing took, and when every card but the learning curves was drawn."""
import json, os, subprocess, sys, time

url, profile = sys.argv[1], sys.argv[2]
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()


def pipes_on_3_and_4():
    a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)  # above 4: neither dup2 clobbers the other
    os.dup2(a, 3)
    os.dup2(b, 4)


chrome = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--user-data-dir=" + profile, "--window-size=1400,2000", "--remote-debugging-pipe"],
                          preexec_fn=pipes_on_3_and_4, close_fds=False, stderr=subprocess.DEVNULL)
os.close(to_chrome_r)
os.close(from_chrome_w)
pending, last_id = b"", 0
# The page's marks and where its time went: the page itself, Chart.js and app.js, the
# dashboard's data request (all from the page's request, in ms).
TIMINGS = """JSON.stringify(document.body && document.body.dataset.ready && (() => {
  const end = (pred) => Math.round(Math.max(0, ...performance.getEntriesByType("resource")
    .filter((e) => pred(e.name)).map((e) => e.responseEnd)));
  return {ready: document.body.dataset.ready, firstDrawMs: document.body.dataset.firstDrawMs,
          renderMs: document.body.dataset.renderMs, drawnMs: document.body.dataset.drawnMs,
          pageMs: Math.round(performance.getEntriesByType("navigation")[0].responseEnd),
          scriptsMs: end((n) => n.includes("/static/")), dataMs: end((n) => n.includes("/dashboard"))};
})())"""


def call(method, params=None, session=None):
    global pending, last_id
    last_id += 1
    message = {"id": last_id, "method": method, "params": params or {}}
    if session:
        message["sessionId"] = session
    os.write(to_chrome_w, json.dumps(message).encode() + b"\0")
    while True:
        while b"\0" not in pending:
            chunk = os.read(from_chrome_r, 1 << 16)
            if not chunk:
                sys.exit("chromium closed the pipe")
            pending += chunk
        raw, pending = pending.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == last_id:
            return reply.get("result", reply)


try:
    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    # Twice: a browser that just started, then the page opened again (a reload, warm).
    for attempt in ("first load", "again"):
        call("Page.navigate", {"url": "about:blank"}, session=session)
        call("Page.navigate", {"url": url}, session=session)
        deadline = time.time() + 30
        while time.time() < deadline:
            reply = call("Runtime.evaluate", {"expression": TIMINGS, "returnByValue": True}, session=session)
            data = json.loads(reply.get("result", {}).get("value") or "null") or {}
            if data.get("ready"):
                print(f"{url} ({attempt}): first paint {data['firstDrawMs']} ms after the request "
                      f"(page {data['pageMs']} ms, scripts {data['scriptsMs']} ms, data {data['dataMs']} ms, "
                      f"drawing {data['renderMs']} ms; every card by {data.get('drawnMs', '?')} ms)")
                break
            time.sleep(0.02)
        else:
            sys.exit(f"{url}: not drawn within 30 s")
finally:
    chrome.kill()
