"""nas_client: the Python client of ``nas serve`` — your own training loop asks nas for
hyperparameters, reports how training goes, and ends each trial. Standard library only
(urllib, json): copy this one file anywhere, or put its folder on PYTHONPATH.

    import nas_client

    client = nas_client.Client("http://127.0.0.1:8470")   # token: $NAS_TOKEN, if the server wants one
    exp = client.experiment_handle("mnist")
    for trial in exp.ask_until_done(worker="gpu-0"):       # ends when the budget is handed out
        with trial:                                       # an exception fails the trial, then propagates
            model = make_model(lr=trial.params["lr"])
            for epoch in range(20):
                if trial.report(step=epoch, loss=model.train_epoch()):
                    break                                 # early stopping stopped this trial
            trial.complete(loss=model.validate())         # leaving the block does this too

The endpoints are those of docs/api.md; clients/python/README.md tells the rest. Errors are
NasError subclasses carrying the server's message and HTTP status. Refused connections and
5xx answers are retried with exponential backoff, writes only where the server cannot have
acted on them (Client says which).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import pathlib
import random
import socket
import ssl
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "Client", "Experiment", "Trial",
    "NasError", "ServerUnreachable", "BadRequest", "Unauthorized", "Forbidden", "NotFound",
    "Conflict", "ExperimentDone", "ServerError",
]

#: Where `nas serve` listens unless told otherwise.
DEFAULT_URL = "http://127.0.0.1:8470"
#: Sent as User-Agent, so that the server's log tells which client asked.
USER_AGENT = "nas-client-python/1"
#: The most trials one page of GET .../trials holds (the server's cap).
_PAGE_MAX = 1000
#: The most characters of an exception's text that a with block's failure message keeps.
_EXCEPTION_TEXT_MAX = 2000
#: What a socket's timeout raises: socket.timeout before Python 3.10, TimeoutError since.
_TIMEOUTS = (TimeoutError, socket.timeout)


# ---- errors ---------------------------------------------------------------------------------

class NasError(Exception):
    """A request the server refused or could not answer.

    ``message`` is the server's explanation, ``status`` the HTTP status (None when no answer
    came), ``method`` and ``url`` the request.
    """

    def __init__(self, message: str, status: int | None = None, method: str = "", url: str = ""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.method = method
        self.url = url

    def __str__(self) -> str:
        where = f"{self.method} {self.url}".strip()
        status = f"HTTP {self.status}" if self.status is not None else "no answer"
        return f"{self.message} ({status}{': ' + where if where else ''})"


class ServerUnreachable(NasError):
    """No answer from the server: refused, reset or timed out, after the retries."""


class BadRequest(NasError):
    """400, 413 or 422: the request itself is wrong (a spec error, a metric that is not a
    number, completing a trial that never reported an objective)."""


class Unauthorized(NasError):
    """401: the server wants a token and got none, or one it does not know."""


class Forbidden(NasError):
    """403: the token may only read, or the server serves only its own machine."""


class NotFound(NasError):
    """404: no such experiment, trial or endpoint."""


class Conflict(NasError):
    """409: the state forbids it (the trial has ended, the spec differs from the stored one,
    ``nas run`` is running the experiment)."""


class ExperimentDone(Conflict):
    """409 to an ask: the experiment is stopped, or its whole budget (or every assignment of
    a finite search space) has been handed out."""


class ServerError(NasError):
    """5xx: the server failed (after the retries)."""


_ERRORS_BY_STATUS: dict[int, type[NasError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    413: BadRequest, 422: BadRequest,
}


def _error_of(status: int, body: bytes, method: str, url: str) -> NasError:
    """The NasError of an HTTP error answer, with the server's {"error": message}; an ask's
    409 that says {"done": true} (nothing left to hand out) is ExperimentDone."""
    try:
        answer = json.loads(body)
        message, done = answer["error"], answer.get("done") is True
    except (ValueError, TypeError, KeyError, AttributeError):
        message = body.decode("utf-8", "replace").strip() or http.client.responses.get(status, "")
        done = False
    cls = ServerError if status >= 500 else _ERRORS_BY_STATUS.get(status, NasError)
    if cls is Conflict and done:
        cls = ExperimentDone
    return cls(str(message), status, method, url)


def _error_body(answer: urllib.error.HTTPError) -> bytes:
    """The body of an error answer; empty when the connection broke off in it (the status
    says enough)."""
    try:
        return answer.read()
    except (http.client.HTTPException, OSError):
        return b""


class _Retry(Exception):
    """An attempt failed in a way that sending the request again may mend; `error` is what
    to raise when no attempt is left."""

    def __init__(self, error: NasError):
        super().__init__(str(error))
        self.error = error


# ---- the client -------------------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Leaves a 3xx answer an error: urllib would follow it with every header, the token
    included, to any host and scheme, and turn a POST into a GET. nas serve never
    redirects, so one means the URL is not the server's."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in a file: its first line that is neither blank nor a # comment. A file its
    group or others may read is refused, as `nas serve` refuses its token file and nas's
    own storage client a $NAS_TOKEN_FILE (common/common.c, nas_check_private)."""
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise ValueError(f"token file {os.fspath(path)} may be read by others (mode {mode & 0o777:03o}); "
                         f"make it private: chmod 600 {os.fspath(path)}")
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                return line
    raise ValueError(f"token file {os.fspath(path)} holds no token")


def _metric_value(name: str, value: Any) -> int | float:
    """A metric as JSON can carry it: ints stay ints, anything with __float__ (numpy and
    torch scalars) becomes a float; NaN, infinities and bools are refused."""
    if isinstance(value, bool) or not isinstance(name, str) or not name:
        raise TypeError(f"metric {name!r}: expected a non-empty name and a number, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} is {type(value).__name__}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"metric {name!r} is {number}, not a finite number; "
                         "fail the trial instead (a diverged run)")
    return number


def _metrics_of(metrics: Mapping[str, Any] | None, named: Mapping[str, Any]) -> dict[str, int | float]:
    """metrics (for names that are no Python identifiers, e.g. "val/loss") merged with the
    keyword arguments, each checked."""
    merged = {**(metrics or {}), **named}
    return {name: _metric_value(name, value) for name, value in merged.items()}


class Client:
    """A connection to ``nas serve``; cheap to make, safe to share between threads.

    url: the server, ``http://HOST:PORT`` or ``https://…`` (default $NAS_URL, else nas serve's
        default address); a trailing ``/api/v1`` is fine.
    token, token_file: the bearer token, or a file holding it alone on its first line; when
        neither is given, $NAS_TOKEN, then the file $NAS_TOKEN_FILE. The token is sent only
        in the Authorization header, never to where a redirect points (none is followed),
        and never shows in errors or repr().
    cafile: the PEM certificate(s) to trust for https, e.g. the server's own --tls-cert when
        it signed it itself; default: the system's certificate authorities.
    timeout: seconds one attempt may take.
    retries, backoff: a refused connection and a 5xx answer are tried again up to `retries`
        times, after backoff, 2·backoff, 4·backoff … seconds (each at most 30, with jitter).
        A write (POST: an ask, a report …) is tried again only when the server cannot have
        acted on it: a refused connection or a 503 (no storage connection for it); a GET
        also after a 500 or a connection that broke after it was sent.
    """

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 token_file: str | os.PathLike[str] | None = None,
                 cafile: str | os.PathLike[str] | None = None, timeout: float = 30.0,
                 retries: int = 5, backoff: float = 0.25):
        url = (url or os.environ.get("NAS_URL") or DEFAULT_URL).rstrip("/")
        self.url = url[: -len("/api/v1")] if url.endswith("/api/v1") else url
        if token is None and token_file is not None:
            token = _read_token_file(token_file)
        if token is None and os.environ.get("NAS_TOKEN"):
            token = os.environ["NAS_TOKEN"]
        if token is None and os.environ.get("NAS_TOKEN_FILE"):
            token = _read_token_file(os.environ["NAS_TOKEN_FILE"])
        if token is not None and (not token or any(c.isspace() for c in token)):
            raise ValueError("a token is one word without blanks")
        self._token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if cafile:
            handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:
        return f"Client({self.url!r}{', token=…' if self._token else ''})"

    # ---- HTTP ----

    def _request(self, method: str, path: str, body: Any = None, *, query: Mapping[str, Any] | None = None,
                 yaml: str | None = None) -> Any:
        """The parsed JSON answer of METHOD /api/v1/PATH, retried as the class says."""
        url = f"{self.url}/api/v1{path}"
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        data = None
        if yaml is not None:
            data, headers["Content-Type"] = yaml.encode("utf-8"), "application/yaml"
        elif method == "POST":
            data, headers["Content-Type"] = json.dumps(body or {}).encode("utf-8"), "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in range(self.retries + 1):
            try:
                return self._send(method, url, data, headers)
            except _Retry as retry:
                if attempt == self.retries:
                    raise retry.error from retry.__cause__
            delay = min(self.backoff * 2 ** attempt, 30.0)
            time.sleep(delay * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def _send(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> Any:
        """One attempt: the parsed JSON answer, a NasError, or _Retry when another attempt
        may succeed."""
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as answer:
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                where = e.headers.get("Location", "elsewhere")
                raise NasError(f"redirected to {where}, not followed: nas serve never redirects; "
                               "is this its URL?", e.code, method, url) from None
            # A 500 may come after the server stored part of a write; a 503 before it did anything.
            error = _error_of(e.code, _error_body(e), method, url)
            again = e.code == 503 or (e.code >= 500 and method == "GET")
            raise (_Retry(error) if again else error) from None
        except urllib.error.URLError as e:
            # Raised while connecting or sending: the server cannot have acted on a request
            # it did not get whole. Other reasons (DNS, certificates) will not mend.
            error = ServerUnreachable(str(e.reason), None, method, url)
            raise (_Retry(error) if isinstance(e.reason, (ConnectionError, *_TIMEOUTS)) else error) from e
        except (http.client.HTTPException, ConnectionError, *_TIMEOUTS) as e:
            # Raised after the request was sent: only a read is safe to send again.
            error = ServerUnreachable(f"the connection broke: {e!r}", None, method, url)
            raise (_Retry(error) if method == "GET" else error) from e
        try:
            return json.loads(text)
        except ValueError:
            raise NasError(f"the answer is not JSON: {text[:200]!r}", status, method, url) from None

    @staticmethod
    def _experiment_path(name: str, *rest: Any) -> str:
        parts = [urllib.parse.quote(str(p), safe="") for p in (name, *rest)]
        return "/experiments/" + "/".join(parts)

    # ---- experiments ----

    def experiments(self) -> list[dict[str, Any]]:
        """Every experiment's summary (name, status, counts, progress, hypervolume …)."""
        return self._request("GET", "/experiments")["experiments"]

    def experiment(self, name: str) -> dict[str, Any]:
        """One experiment's summary; NotFound when there is none of that name."""
        return self._request("GET", self._experiment_path(name))

    def experiment_handle(self, name: str) -> Experiment:
        """An Experiment to ask trials of; asks the server nothing."""
        return Experiment(self, name)

    def create(self, spec: str | os.PathLike[str]) -> Experiment:
        """Stores the experiment of a YAML spec (the text, or a pathlib.Path to read) and
        returns its handle. The same spec again is no error; a different spec under a stored
        name is Conflict, a wrong one BadRequest with file:line:col. Relative paths in the
        spec are the server's."""
        text = spec if isinstance(spec, str) else pathlib.Path(spec).read_text(encoding="utf-8")
        return Experiment(self, self._request("POST", "/experiments", yaml=text)["name"])

    def stop(self, name: str) -> dict[str, Any]:
        """Stops the experiment: no trial is handed out any more. Returns its summary."""
        return self._request("POST", self._experiment_path(name, "stop"))

    def pareto(self, name: str) -> dict[str, Any]:
        """The Pareto front: {"experiment", "hypervolume", "reference_point", "front"}."""
        return self._request("GET", self._experiment_path(name, "pareto"))

    # ---- trials ----

    def trials(self, name: str, status: str | None = None, offset: int = 0,
               limit: int | None = None) -> list[dict[str, Any]]:
        """The experiment's trials in number order, each {"number", "status", "params",
        "metrics", …}; only those of `status` (queued, running, completed, failed, timeout,
        stopped) when given. `limit` None lists them all, fetching page after page."""
        found: list[dict[str, Any]] = []
        while limit is None or len(found) < limit:
            want = _PAGE_MAX if limit is None else min(limit - len(found), _PAGE_MAX)
            page = self._request("GET", self._experiment_path(name, "trials"),
                                 query={"status": status, "offset": offset + len(found), "limit": want})
            found += page["trials"]
            if len(page["trials"]) < want:
                break
        return found

    def trial(self, name: str, number: int) -> dict[str, Any]:
        """One trial in full: also "intermediate" ({metric: [[step, value, time], …]}),
        "error", "run_dir" and its log tails."""
        return self._request("GET", self._experiment_path(name, "trials", number))


class Experiment:
    """An experiment to ask trials of, by name (``client.experiment_handle(name)`` or
    ``client.create(spec)``)."""

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"Experiment({self.name!r})"

    def ask(self, n: int = 1, worker: str | None = None) -> list[Trial]:
        """Hands out up to n trials (queued ones first, then new suggestions), each running
        until you end it. `worker` names you in the trials' job id (``ask:WORKER``).
        ExperimentDone when the experiment is stopped, or its budget (or a finite search
        space) is all handed out."""
        body: dict[str, Any] = {"n": n}
        if worker is not None:
            body["worker"] = worker
        try:
            answer = self.client._request("POST", Client._experiment_path(self.name, "ask"), body)
        except Conflict as e:
            raise self._done_or(e) from None
        return [Trial(self, t["number"], t["params"], t.get("attempt")) for t in answer["trials"]]

    def _done_or(self, conflict: Conflict) -> Conflict:
        """ExperimentDone when the server or the experiment's summary says so, else the
        conflict itself (e.g. `nas run` is running the experiment)."""
        if isinstance(conflict, ExperimentDone):
            return conflict
        summary = self.info()
        budget = summary["progress"]["budget"]
        if summary["status"] == "stopped" or 0 < budget <= summary["trials"]:
            return ExperimentDone(conflict.message, conflict.status, conflict.method, conflict.url)
        return conflict

    def ask_until_done(self, worker: str | None = None) -> Iterator[Trial]:
        """Trials one at a time until ExperimentDone. Trials other workers still run may yet
        be handed out again if they go silent; run the loop once more to take those."""
        while True:
            try:
                trial, = self.ask(1, worker)
            except ExperimentDone:
                return
            yield trial

    def info(self) -> dict[str, Any]:
        """The experiment's summary (see Client.experiment)."""
        return self.client.experiment(self.name)

    def trials(self, status: str | None = None, offset: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The experiment's trials (see Client.trials)."""
        return self.client.trials(self.name, status, offset, limit)

    def trial(self, number: int) -> dict[str, Any]:
        """One trial in full (see Client.trial)."""
        return self.client.trial(self.name, number)

    def pareto(self) -> dict[str, Any]:
        """The Pareto front (see Client.pareto)."""
        return self.client.pareto(self.name)

    def stop(self) -> dict[str, Any]:
        """Stops the experiment (see Client.stop)."""
        return self.client.stop(self.name)


class Trial:
    """A trial handed out by Experiment.ask: ``params`` to train with, then report, complete
    or fail. Its ``status`` is "running" until one of these ends it here.

    As a context manager it ends itself: an exception inside the block fails it with the
    exception's type, message and place, then propagates (KeyboardInterrupt and SystemExit
    leave it running, for its lease to hand it out again); leaving the block normally
    completes it with what it reported (its objectives' last values) unless it was already
    completed, failed or stopped. One that never reported an objective is then failed with
    the server's reason and BadRequest is raised: a loop that forgot to report is a bug.
    """

    def __init__(self, experiment: Experiment, number: int, params: dict[str, Any],
                 attempt: int | None = None):
        self.experiment = experiment
        self.number = number
        self.params = params
        #: The attempt the ask handed out (1, 2, …; None from a server that sends none).
        #: report(), heartbeat(), complete() and fail() send it: once this trial went silent
        #: and was handed out again, they are refused (Conflict) rather than write into the
        #: new attempt, keep it alive or end it.
        self.attempt = attempt
        #: "running", then "completed", "failed" or "stopped".
        self.status = "running"
        #: True once early stopping stopped the trial (report() returned True).
        self.should_stop = False

    def __repr__(self) -> str:
        return (f"Trial({self.experiment.name!r}, number={self.number}, attempt={self.attempt}, "
                f"params={self.params!r}, status={self.status!r})")

    def _tell(self, what: str, body: dict[str, Any]) -> Any:
        """Tells this attempt of the trial, not one handed out since."""
        if self.attempt is not None:
            body["attempt"] = self.attempt
        path = Client._experiment_path(self.experiment.name, "trials", self.number, what)
        return self.experiment.client._request("POST", path, body)

    def report(self, metrics: Mapping[str, Any] | None = None, /, *, step: int | None = None,
               **named: Any) -> bool:
        """Stores metrics — intermediate ones at `step` (an epoch), final ones without — and
        counts as a heartbeat. Returns True when early stopping stopped the trial: break out
        of the loop then (the trial has ended as stopped; later reports, complete() and
        fail() send nothing). ``report({"val/acc": 0.9}, step=3)`` takes any metric name.
        Conflict as complete() says."""
        if self.should_stop:
            return True
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an integer >= 0, not {step!r}")
        body: dict[str, Any] = {"metrics": _metrics_of(metrics, named)}
        if step is not None:
            body["step"] = step
        if self._tell("report", body)["stop"]:
            self.should_stop, self.status = True, "stopped"
        return self.should_stop

    def complete(self, metrics: Mapping[str, Any] | None = None, /, **named: Any) -> None:
        """Ends the trial completed, storing these final metrics first (may be none when the
        objectives were reported already). BadRequest when an objective was never reported;
        the trial is then still running. Conflict when it was handed out again since (this
        attempt went silent for longer than trial.heartbeat_timeout, or `nas retry`)."""
        if self.status == "stopped":
            return
        values = _metrics_of(metrics, named)
        self._tell("complete", {"metrics": values} if values else {})
        self.status = "completed"

    def fail(self, message: str = "") -> None:
        """Ends the trial failed, with why (shown by `nas trials` and the API); Conflict as
        complete() says."""
        if self.status == "stopped":
            return
        self._tell("fail", {"error": message} if message else {})
        self.status = "failed"

    def heartbeat(self) -> None:
        """A sign of life for a long step without reports: a handed-out trial silent for
        longer than the spec's trial.heartbeat_timeout (default 10 minutes) is taken back;
        Conflict as complete() says."""
        self._tell("heartbeat", {})

    def __enter__(self) -> Trial:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.status != "running":
            return False
        if exc is None:
            try:
                self.complete()
            except BadRequest as e:
                self.fail(e.message)
                raise
            return False
        if not isinstance(exc, Exception):
            # Ctrl-C, sys.exit(), a closed generator: no fault of the trial's, and an
            # interrupt must not wait on the server. Left running, the trial is handed out
            # again once its lease lapses, as a worker's that died would be.
            return False
        try:
            self.fail(_failure_text(exc, tb))
        except NasError as e:  # keep the user's exception; tell what else went wrong
            if hasattr(exc, "add_note"):
                exc.add_note(f"nas_client: trial {self.number} could not be failed: {e}")
        return False


def _failure_text(exc: BaseException, tb: Any) -> str:
    """``ValueError: lr is negative (at train.py:42 in step)``: the innermost frame's place."""
    said = str(exc)[:_EXCEPTION_TEXT_MAX]
    text = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    frames = traceback.extract_tb(tb)
    if frames:
        frame = frames[-1]
        text += f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
    return text
