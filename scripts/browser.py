#!/usr/bin/env python3
"""scripts/browser.py PROFILE_DIR URL [WIDTH,HEIGHT]: one page in headless Chromium, kept
open while a program drives it a line at a time, for what --dump-dom cannot see: a page
living through a server that stops and starts again (tests/test_e2e_dashboard.c), when a
page's first paint came (bench/first_paint.py). Chromium is driven over the DevTools
protocol on a pipe (--remote-debugging-pipe: NUL-separated JSON on fds 3 and 4), so no
websocket library is needed. The window is 1400,900 unless said.

Commands on stdin, one a line, each answered by one line on stdout:
  navigate URL             loads URL in the page; answers "ok"
  wait SECONDS EXPRESSION  evaluates the JavaScript EXPRESSION in the page every 20 ms until
                           it is truthy; answers its value as JSON, or "timeout"
  screenshot PATH          saves the page as a PNG at PATH; answers "ok"
End of input closes the browser."""
import base64, json, os, subprocess, sys, time

profile, url = sys.argv[1], sys.argv[2]
window = sys.argv[3] if len(sys.argv) > 3 else "1400,900"
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()


def pipes_on_3_and_4():
    a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)  # above 4: neither dup2 clobbers the other
    os.dup2(a, 3)
    os.dup2(b, 4)


chrome = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--hide-scrollbars", "--user-data-dir=" + profile, "--window-size=" + window,
                           "--remote-debugging-pipe"],
                          preexec_fn=pipes_on_3_and_4, close_fds=False, stderr=subprocess.DEVNULL)
os.close(to_chrome_r)
os.close(from_chrome_w)
pending, last_id, session = b"", 0, None


def call(method, params=None):
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


def wait(seconds, expression):
    deadline = time.time() + seconds
    while time.time() < deadline:
        reply = call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        value = reply.get("result", {}).get("value")
        if value:
            return json.dumps(value)
        time.sleep(0.02)
    return "timeout"


def screenshot(path):
    with open(path, "wb") as out:
        out.write(base64.b64decode(call("Page.captureScreenshot", {"format": "png"})["data"]))
    return "ok"


try:
    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    call("Page.navigate", {"url": url})
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "navigate":
            call("Page.navigate", {"url": rest})
            answer = "ok"
        elif command == "wait":
            seconds, _, expression = rest.partition(" ")
            answer = wait(float(seconds), expression)
        elif command == "screenshot":
            answer = screenshot(rest)
        else:
            answer = "unknown command " + command
        print(answer, flush=True)
finally:
    chrome.kill()
    chrome.wait()
