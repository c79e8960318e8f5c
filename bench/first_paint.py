#!/usr/bin/env python3
"""bench/first_paint.py URL PROFILE_DIR: loads URL in headless Chromium (scripts/browser.py,
DevTools over a pipe), waits until the dashboard's script says it drew the page
(<body data-ready>) and prints how long after the request the first draw came (the summary
and the cards at the top of the page; the page's own performance.now(), real time), how
long that drawing took, and when every card but the learning curves was drawn."""
import json, subprocess, sys

url, profile = sys.argv[1], sys.argv[2]
# The page's marks and where its time went: the page itself, Chart.js and app.js, the
# dashboard's data request (all from the page's request, in ms). One line: one command.
TIMINGS = " ".join("""document.body && document.body.dataset.ready && JSON.stringify((() => {
  const end = (pred) => Math.round(Math.max(0, ...performance.getEntriesByType("resource")
    .filter((e) => pred(e.name)).map((e) => e.responseEnd)));
  return {ready: document.body.dataset.ready, firstDrawMs: document.body.dataset.firstDrawMs,
          renderMs: document.body.dataset.renderMs, drawnMs: document.body.dataset.drawnMs,
          pageMs: Math.round(performance.getEntriesByType("navigation")[0].responseEnd),
          scriptsMs: end((n) => n.includes("/static/")), dataMs: end((n) => n.includes("/dashboard"))};
})())""".split())
# The browser that scripts/browser.py keeps open and drives one command a line.
browser = subprocess.Popen([sys.executable, "scripts/browser.py", profile, "about:blank", "1400,2000"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def ask(command):
    browser.stdin.write(command + "\n")
    browser.stdin.flush()
    return browser.stdout.readline().strip()


try:
    # Twice: a browser that just started, then the page opened again (a reload, warm).
    for attempt in ("first load", "again"):
        ask("navigate about:blank")
        ask("navigate " + url)
        answer = ask("wait 30 " + TIMINGS)
        if answer == "timeout":
            sys.exit(f"{url}: not drawn within 30 s")
        data = json.loads(json.loads(answer))
        print(f"{url} ({attempt}): first paint {data['firstDrawMs']} ms after the request "
              f"(page {data['pageMs']} ms, scripts {data['scriptsMs']} ms, data {data['dataMs']} ms, "
              f"drawing {data['renderMs']} ms; every card by {data.get('drawnMs', '?')} ms)")
finally:
    browser.stdin.close()
    browser.wait()
