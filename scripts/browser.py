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
  fault TEXT ANSWER COUNT  the page's next COUNT requests whose URL holds TEXT get ANSWER
                           instead of reaching the server: an HTTP status (a JSON body
                           {"error": "injected by scripts/browser.py"}) or "reset" (the
                           connection drops); answers "ok". Requests are held in the browser
                           (DevTools' Fetch domain) and answered while a command runs, so a
                           "wait" should follow.
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
faults = []  # [text, answer, count left] of the fault commands, in their order


def send(method, params=None):
    """Sends a command without waiting for its reply; returns its id."""
    global last_id
    last_id += 1
    message = {"id": last_id, "method": method, "params": params or {}}
    if session:
        message["sessionId"] = session
    os.write(to_chrome_w, json.dumps(message).encode() + b"\0")
    return last_id


def call(method, params=None):
    global pending
    sent = send(method, params)
    while True:
        while b"\0" not in pending:
            chunk = os.read(from_chrome_r, 1 << 16)
            if not chunk:
                sys.exit("chromium closed the pipe")
            pending += chunk
        raw, pending = pending.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == sent:
            return reply.get("result", reply)
        if reply.get("method") == "Fetch.requestPaused":
            answer_paused(reply["params"])


def answer_paused(request):
    """Answers a request held by the Fetch domain as the first fault matching it says, or
    lets it go to the server."""
    rid, url = request["requestId"], request["request"]["url"]
    fault = next((f for f in faults if f[0] in url and f[2] > 0), None)
    if not fault:
        send("Fetch.continueRequest", {"requestId": rid})
        return
    fault[2] -= 1
    if fault[1] == "reset":
        send("Fetch.failRequest", {"requestId": rid, "errorReason": "ConnectionReset"})
        return
    body = json.dumps({"error": "injected by scripts/browser.py"}).encode()
    send("Fetch.fulfillRequest", {"requestId": rid, "responseCode": int(fault[1]),
                                  "responseHeaders": [{"name": "Content-Type", "value": "application/json"}],
                                  "body": base64.b64encode(body).decode()})


def fault(text, answer, count):
    faults.append([text, answer, int(count)])
    call("Fetch.enable", {"patterns": [{"urlPattern": "*" + f[0] + "*"} for f in faults]})
    return "ok"


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
        elif command == "fault":
            answer = fault(*rest.split(" "))
        else:
            answer = "unknown command " + command
        print(answer, flush=True)
finally:
    chrome.kill()
    chrome.wait()
