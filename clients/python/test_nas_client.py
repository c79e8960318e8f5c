"""clients/python/test_nas_client.py: nas_client against real `nas serve` processes — ask,
report, complete and fail; the with block failing a trial on an exception; early stopping;
errors with the server's message and status; tokens; retries while the server is not up.

Run by tests/test_python_client.c (`make test`), or by hand from the repository root:
    NAS_BIN=bin/nas python3 -m unittest discover -s clients/python -v
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from pathlib import Path

import nas_client
from nas_client import (BadRequest, Client, Conflict, Experiment, ExperimentDone, Forbidden,
                        NotFound, ServerError, ServerUnreachable, Unauthorized)

NAS_BIN = os.path.abspath(os.environ.get("NAS_BIN", Path(__file__).resolve().parents[2] / "bin" / "nas"))
READER = "r0000000000000000000000000000000000000001"
WRITER = "w0000000000000000000000000000000000000002"


def setUpModule() -> None:
    # What the client would otherwise take from the caller's environment.
    for key in ("NAS_URL", "NAS_TOKEN", "NAS_TOKEN_FILE"):
        os.environ.pop(key, None)


def spec(name: str, budget: int = 3, extra: str = "", trial: str = "{command: [echo, unused]}") -> str:
    """An experiment for ask and tell: one parameter x, one objective loss."""
    return (f"name: {name}\n"
            "parameters: {x: {type: float, low: 0, high: 1}}\n"
            "objectives: [{name: loss, goal: minimize}]\n"
            f"trial: {trial}\n"
            "optimizer: {type: sobol}\n"
            f"budget: {{trials: {budget}}}\n" + extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`nas serve` on 127.0.0.1 with its own SQLite storage in folder."""

    def __init__(self, folder: str, *extra: str, port: int = 0):
        self.log_path = os.path.join(folder, f"serve-{time.monotonic_ns()}.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [NAS_BIN, "serve", "--storage", f"sqlite:{folder}/nas.db", "--listen", f"127.0.0.1:{port}", *extra],
                cwd=folder, stdout=log, stderr=log)
        self.port = port

    def wait_listening(self) -> str:
        """The server's URL once it listens."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = re.search(r"listening on port (\d+)", Path(self.log_path).read_text())
            if found:
                self.port = int(found[1])
                return f"http://127.0.0.1:{self.port}"
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"nas serve did not start: {Path(self.log_path).read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class LiveServerTest(unittest.TestCase):
    """A class of tests sharing one server (and its storage) in a fresh folder."""

    server_args: tuple[str, ...] = ()

    @classmethod
    def setUpClass(cls) -> None:
        cls.folder = tempfile.mkdtemp(prefix="nas-pyclient-")
        cls.prepare(cls.folder)
        cls.server = Server(cls.folder, *cls.server_args)
        cls.url = cls.server.wait_listening()

    @classmethod
    def prepare(cls, folder: str) -> None:
        """What the server needs in its folder before it starts."""

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        shutil.rmtree(cls.folder)


class AskAndTellTest(LiveServerTest):
    def setUp(self) -> None:
        self.client = Client(self.url, retries=0)

    def new_experiment(self, extra: str = "", budget: int = 3) -> Experiment:
        return self.client.create(spec(self._testMethodName.replace("_", "-")[:60], budget, extra))

    def test_ask_report_complete_stores_the_curve_and_the_final_values(self):
        exp = self.new_experiment()
        trial, = exp.ask(worker="gpu-7")
        self.assertEqual((trial.number, trial.status), (0, "running"))
        self.assertTrue(0 <= trial.params["x"] <= 1)
        self.assertFalse(trial.report(step=1, loss=0.5, accuracy=0.25))
        self.assertFalse(trial.report({"val/acc": 0.4}, step=2, loss=0.375))
        trial.complete(loss=0.125)
        self.assertEqual(trial.status, "completed")
        stored = exp.trial(trial.number)
        self.assertEqual((stored["status"], stored["job_id"]), ("completed", "ask:gpu-7"))
        self.assertEqual(stored["metrics"], {"loss": 0.125, "accuracy": 0.25, "val/acc": 0.4})
        self.assertEqual([point[:2] for point in stored["intermediate"]["loss"]], [[1, 0.5], [2, 0.375]])
        self.assertEqual([point[:2] for point in stored["intermediate"]["val/acc"]], [[2, 0.4]])

    def test_fail_ends_the_trial_with_the_message(self):
        exp = self.new_experiment()
        trial, = exp.ask()
        trial.fail("out of memory on the GPU")
        self.assertEqual(trial.status, "failed")
        stored = exp.trial(trial.number)
        self.assertEqual((stored["status"], stored["error"]), ("failed", "out of memory on the GPU"))

    def test_a_trial_handed_out_again_is_not_ended_by_its_old_attempt(self):
        name = self._testMethodName.replace("_", "-")[:60]
        exp = self.client.create(spec(name, 1, trial="{heartbeat_timeout: 0.2, max_attempts: 3}"))
        old, = exp.ask()
        time.sleep(0.4)  # silent past heartbeat_timeout: the next ask hands it out again
        new, = exp.ask()
        self.assertEqual((old.number, old.attempt, new.number, new.attempt), (0, 1, 0, 2))
        with self.assertRaisesRegex(Conflict, "runs attempt 2, not attempt 1"):
            old.report(loss=5, step=0)
        with self.assertRaisesRegex(Conflict, "runs attempt 2, not attempt 1"):
            old.heartbeat()
        with self.assertRaisesRegex(Conflict, "runs attempt 2, not attempt 1"):
            old.complete(loss=1)
        with self.assertRaisesRegex(Conflict, "runs attempt 2, not attempt 1"):
            old.fail("too late")
        self.assertEqual(exp.trial(0)["status"], "running")
        new.complete(loss=2)
        stored = exp.trial(0)
        self.assertEqual((stored["status"], stored["metrics"], stored["attempts"]), ("completed", {"loss": 2}, 2))

    def test_an_exception_in_the_with_block_fails_the_trial_and_propagates(self):
        exp = self.new_experiment()
        with self.assertRaises(ZeroDivisionError):
            with exp.ask()[0] as trial:
                trial.report(step=1, loss=0.5)
                trial.params["x"] / 0
        self.assertEqual(trial.status, "failed")
        error = exp.trial(trial.number)["error"]
        self.assertRegex(error, r"^ZeroDivisionError: float division by zero \(at test_nas_client\.py:\d+ in "
                                r"test_an_exception_in_the_with_block_fails_the_trial_and_propagates\)$")

    def test_an_interrupt_or_exit_in_the_with_block_leaves_the_trial_to_its_lease(self):
        # Ctrl-C or sys.exit() says nothing about the trial: it is not failed (nothing is
        # sent, so the interrupt is not held up either); silent, it is handed out again.
        exp = self.new_experiment()
        for stop in (KeyboardInterrupt, SystemExit):
            with self.assertRaises(stop):
                with exp.ask()[0] as trial:
                    trial.report(step=1, loss=0.5)
                    raise stop()
            self.assertEqual(trial.status, "running")
            self.assertEqual(exp.trial(trial.number)["status"], "running")

    def test_leaving_the_with_block_completes_the_trial_with_what_it_reported(self):
        exp = self.new_experiment()
        with exp.ask()[0] as trial:
            trial.report(step=1, loss=0.75)
            trial.report(step=2, loss=0.5)
        self.assertEqual(trial.status, "completed")
        stored = exp.trial(trial.number)
        self.assertEqual((stored["status"], stored["metrics"]), ("completed", {"loss": 0.5}))

    def test_leaving_the_with_block_without_an_objective_fails_the_trial_and_raises(self):
        exp = self.new_experiment()
        with self.assertRaises(BadRequest) as raised:
            with exp.ask()[0] as trial:
                trial.report(step=1, accuracy=0.9)
        self.assertEqual(raised.exception.status, 422)
        self.assertIn("has not reported objective 'loss'", raised.exception.message)
        stored = exp.trial(trial.number)
        self.assertEqual(stored["status"], "failed")
        self.assertIn("has not reported objective 'loss'", stored["error"])

    def test_early_stopping_makes_report_return_true_and_ends_the_trial_as_stopped(self):
        exp = self.new_experiment("early_stopping: {rule: median, min_steps: 1, min_trials: 1}\n", budget=2)
        with exp.ask()[0] as first:
            first.report(step=1, loss=0.1)
        with exp.ask()[0] as second:
            self.assertFalse(second.should_stop)
            self.assertTrue(second.report(step=1, loss=5.0))
            self.assertTrue(second.should_stop)
            self.assertTrue(second.report(step=2, loss=4.0))  # sends nothing: the trial has ended
            second.complete(loss=4.0)                          # nor does this
        self.assertEqual(second.status, "stopped")
        stored = exp.trial(second.number)
        self.assertEqual(stored["status"], "stopped")
        self.assertEqual([point[:2] for point in stored["intermediate"]["loss"]], [[1, 5.0]])

    def test_ask_until_done_hands_out_the_whole_budget_then_ends(self):
        exp = self.new_experiment(budget=3)
        numbers = []
        for trial in exp.ask_until_done(worker="loop"):
            with trial:
                trial.report(loss=trial.params["x"])
            numbers.append(trial.number)
        self.assertEqual(numbers, [0, 1, 2])
        with self.assertRaises(ExperimentDone) as raised:
            exp.ask()
        self.assertIsInstance(raised.exception, Conflict)
        self.assertIn("spent its budget of 3 trials", raised.exception.message)
        self.assertEqual(exp.info()["counts"]["completed"], 3)

    def test_ask_until_done_ends_when_a_finite_space_is_used_up(self):
        # Two assignments and a budget of 5: the third ask finds nothing left to hand out.
        exp = self.client.create(
            "name: finite-space\n"
            "parameters: {x: {type: int, low: 0, high: 1}}\n"
            "objectives: [{name: loss, goal: minimize}]\n"
            "optimizer: {type: sobol}\n"
            "budget: {trials: 5}\n")
        told = []
        for trial in exp.ask_until_done():
            trial.complete(loss=trial.params["x"])
            told.append(trial.params["x"])
        self.assertEqual(sorted(told), [0, 1])
        with self.assertRaises(ExperimentDone) as raised:
            exp.ask()
        self.assertIn("search space exhausted", raised.exception.message)

    def test_a_stopped_experiment_hands_out_nothing(self):
        exp = self.new_experiment()
        self.assertEqual(exp.stop()["status"], "stopped")
        with self.assertRaises(ExperimentDone):
            exp.ask()
        self.assertEqual(list(exp.ask_until_done()), [])

    def test_listings_show_what_was_told(self):
        exp = self.new_experiment(budget=4)
        for trial in exp.ask(n=4):
            if trial.number == 3:
                trial.fail("diverged")
            else:
                trial.complete(loss=trial.number)
        self.assertIn(exp.name, [e["name"] for e in self.client.experiments()])
        self.assertEqual(self.client.experiment(exp.name)["counts"]["completed"], 3)
        self.assertEqual([t["number"] for t in exp.trials()], [0, 1, 2, 3])
        self.assertEqual([t["number"] for t in exp.trials(status="completed", offset=1, limit=1)], [1])
        self.assertEqual([t["number"] for t in exp.trials(status="failed")], [3])
        front = exp.pareto()["front"]
        self.assertEqual([(row["trial"], row["loss"]) for row in front], [(0, 0)])

    def test_errors_carry_the_servers_message_and_status(self):
        with self.assertRaises(NotFound) as raised:
            self.client.experiment("nope")
        self.assertEqual(raised.exception.status, 404)
        self.assertIn("no experiment 'nope'", str(raised.exception))
        with self.assertRaises(BadRequest) as raised:
            self.client.create("name: bad\nparameters: {x: {type: floaty}}\n")
        self.assertEqual(raised.exception.status, 400)
        self.assertIn("request.yaml:2:", raised.exception.message)
        exp = self.new_experiment()
        with self.assertRaises(Conflict) as raised:
            self.client.create(spec(exp.name).replace("sobol", "random"))
        self.assertIn("different spec", raised.exception.message)
        trial, = exp.ask()
        trial.complete(loss=1)
        with self.assertRaises(Conflict) as raised:
            trial.report(loss=2)
        self.assertEqual(raised.exception.status, 409)
        self.assertIn("is completed, not running", raised.exception.message)
        with self.assertRaises(NotFound):
            nas_client.Trial(exp, 99, {}).heartbeat()

    def test_metrics_that_are_no_finite_numbers_are_refused_before_sending(self):
        exp = self.new_experiment()
        trial, = exp.ask()
        with self.assertRaisesRegex(ValueError, "metric 'loss' is nan, not a finite number"):
            trial.report(loss=float("nan"))
        with self.assertRaisesRegex(TypeError, "metric 'loss' is str, not a number"):
            trial.report(loss="high")
        with self.assertRaises(TypeError):
            trial.report(loss=True)
        with self.assertRaisesRegex(ValueError, "step must be an integer >= 0"):
            trial.report(step=-1, loss=1.0)
        trial.heartbeat()
        self.assertNotIn("loss", exp.trial(trial.number)["metrics"])

    def test_a_spec_file_path_is_read_and_sent(self):
        path = Path(self.folder, "from-file.yaml")
        path.write_text(spec("from-file"))
        self.assertEqual(self.client.create(path).name, "from-file")


class TokenTest(LiveServerTest):
    server_args = ("--token-file", "tokens")

    @classmethod
    def prepare(cls, folder: str) -> None:
        tokens = Path(folder, "tokens")
        tokens.write_text(f"read {READER}\nwrite {WRITER}\n")
        tokens.chmod(0o600)

    def test_without_a_valid_token_every_request_is_unauthorized(self):
        with self.assertRaises(Unauthorized) as raised:
            Client(self.url).experiments()
        self.assertEqual(raised.exception.status, 401)
        with self.assertRaisesRegex(Unauthorized, "not valid"):
            Client(self.url, token="x" * 40).experiments()

    def test_a_read_token_reads_but_may_not_write(self):
        client = Client(self.url, token=READER)
        self.assertIsInstance(client.experiments(), list)
        with self.assertRaises(Forbidden) as raised:
            client.create(spec("forbidden"))
        self.assertEqual(raised.exception.status, 403)
        self.assertIn("only read", raised.exception.message)
        self.assertNotIn(READER, str(raised.exception) + repr(client))

    def test_a_token_file_or_the_environment_gives_the_write_token(self):
        token_file = Path(self.folder, "client-token")
        token_file.write_text(f"# nas\n{WRITER}\n")
        token_file.chmod(0o644)  # refused where others can read it, as nas serve refuses its own
        with self.assertRaisesRegex(ValueError, r"client-token may be read by others \(mode 644\); "
                                    r"make it private: chmod 600 "):
            Client(self.url, token_file=token_file)
        token_file.chmod(0o600)
        self.assertEqual(Client(self.url, token_file=token_file).create(spec("by-file")).name, "by-file")
        os.environ["NAS_TOKEN"] = WRITER
        try:
            self.assertEqual(Client(self.url).create(spec("by-env")).name, "by-env")
        finally:
            del os.environ["NAS_TOKEN"]


class TlsTest(LiveServerTest):
    server_args = ("--tls-cert", "cert.pem", "--tls-key", "key.pem")

    @classmethod
    def prepare(cls, folder: str) -> None:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", "key.pem", "-out", "cert.pem"], cwd=folder, check=True, capture_output=True)

    def test_https_works_with_the_servers_own_certificate_as_cafile(self):
        url = self.url.replace("http:", "https:")
        client = Client(url, cafile=Path(self.folder, "cert.pem"), retries=0)
        self.assertEqual(client.create(spec("over-tls")).name, "over-tls")
        with self.assertRaises(ServerUnreachable) as raised:
            Client(url, retries=0).experiments()  # the system's authorities do not know it
        self.assertIn("CERTIFICATE_VERIFY_FAILED", raised.exception.message)


class StandIn(http.server.ThreadingHTTPServer):
    """A stand-in for nas serve, for what the real one cannot be made to do on demand:
    answer 5xx, or drop a connection after reading the request. `answers` lists what the
    requests in turn get: an HTTP status, or None to close the connection unanswered."""

    def __init__(self, answers: list[int | None], location: str = "", cut_body: bool = False):
        self.answers, self.requests, self.location = answers, 0, location
        self.cut_body = cut_body  # the connection closes halfway through each answer's body
        super().__init__(("127.0.0.1", 0), StandInHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class StandInHandler(http.server.BaseHTTPRequestHandler):
    def answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server = self.server
        status = server.answers[min(server.requests, len(server.answers) - 1)]
        server.requests += 1
        if status is None:
            self.close_connection = True
            return
        body = json.dumps({"experiments": []} if status == 200 else {"error": "busy"}).encode()
        self.send_response(status)
        if 300 <= status < 400:
            self.send_header("Location", server.location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if server.cut_body else body)
        self.close_connection = server.cut_body

    do_GET = do_POST = answer

    def log_message(self, *args) -> None:
        pass


class RetryTest(unittest.TestCase):
    def test_refused_connections_are_retried_until_the_server_listens(self):
        folder = tempfile.mkdtemp(prefix="nas-pyclient-")
        port = free_port()
        started: list[Server] = []
        late_start = threading.Timer(0.5, lambda: started.append(Server(folder, port=port)))
        late_start.start()
        try:
            began = time.monotonic()
            self.assertEqual(Client(f"http://127.0.0.1:{port}", retries=10, backoff=0.1).experiments(), [])
            self.assertGreater(time.monotonic() - began, 0.45)
        finally:
            late_start.join()
            started[0].stop()
            shutil.rmtree(folder)

    def test_without_retries_a_refused_connection_is_server_unreachable(self):
        with self.assertRaises(ServerUnreachable) as raised:
            Client(f"http://127.0.0.1:{free_port()}", retries=0).experiments()
        self.assertIsNone(raised.exception.status)

    def test_5xx_answers_are_retried_then_raised(self):
        stand_in = StandIn([503, 503, 200])
        try:
            self.assertEqual(Client(stand_in.url, retries=2, backoff=0.01).experiments(), [])
            self.assertEqual(stand_in.requests, 3)
            stand_in.requests = 0
            with self.assertRaises(ServerError) as raised:
                Client(stand_in.url, retries=1, backoff=0.01).experiments()
            self.assertEqual((raised.exception.status, raised.exception.message), (503, "busy"))
        finally:
            stand_in.close()

    def test_a_500_retries_a_read_but_not_a_write_which_may_be_stored(self):
        stand_in = StandIn([500, 200])
        try:
            client = Client(stand_in.url, retries=2, backoff=0.01)
            self.assertEqual(client.experiments(), [])
            self.assertEqual(stand_in.requests, 2)
            stand_in.answers, stand_in.requests = [500, 200], 0
            with self.assertRaises(ServerError):
                client.experiment_handle("x").ask()
            self.assertEqual(stand_in.requests, 1)
            stand_in.answers, stand_in.requests = [503, 200], 0  # a 503 stored nothing
            self.assertEqual(client._request("POST", "/experiments/x/ask", {}), {"experiments": []})
            self.assertEqual(stand_in.requests, 2)
        finally:
            stand_in.close()

    def test_a_broken_connection_after_sending_retries_a_read_but_not_a_write(self):
        stand_in = StandIn([None, None, 200])
        try:
            client = Client(stand_in.url, retries=2, backoff=0.01)
            self.assertEqual(client.experiments(), [])
            self.assertEqual(stand_in.requests, 3)
            stand_in.answers, stand_in.requests = [None], 0
            with self.assertRaises(ServerUnreachable):
                client.experiment_handle("x").ask()
            self.assertEqual(stand_in.requests, 1)
        finally:
            stand_in.close()


    def test_an_error_answer_that_breaks_off_is_still_a_nas_error(self):
        stand_in = StandIn([500], cut_body=True)
        try:
            with self.assertRaises(ServerError) as raised:
                Client(stand_in.url, retries=1, backoff=0.01).experiments()
            self.assertEqual(raised.exception.status, 500)
            self.assertEqual(stand_in.requests, 2)  # a read, so retried
        finally:
            stand_in.close()


    def test_an_answer_that_never_comes_is_server_unreachable_after_the_timeout(self):
        with socket.socket() as silent:  # takes connections, never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen(4)
            client = Client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3, retries=0)
            began = time.monotonic()
            for call in (client.experiments, client.experiment_handle("x").ask):
                with self.assertRaises(ServerUnreachable):
                    call()
            self.assertLess(time.monotonic() - began, 3)


class RedirectTest(unittest.TestCase):
    def test_a_redirect_is_not_followed_so_the_token_goes_nowhere_else(self):
        # urllib would follow it with the Authorization header, to any host and scheme,
        # and turn a POST into a GET; nas serve never redirects.
        elsewhere = StandIn([200])
        redirecting = StandIn([302], location=elsewhere.url + "/api/v1/experiments")
        try:
            client = Client(redirecting.url, token=WRITER, retries=0)
            for call in (client.experiments, client.experiment_handle("x").ask):
                with self.assertRaises(nas_client.NasError) as raised:
                    call()
                self.assertEqual(raised.exception.status, 302)
                self.assertIn("not followed", raised.exception.message)
            self.assertEqual((redirecting.requests, elsewhere.requests), (2, 0))
        finally:
            redirecting.close()
            elsewhere.close()


class ClientSetupTest(unittest.TestCase):
    def test_the_url_comes_from_the_argument_or_nas_url(self):
        self.assertEqual(Client("http://h:1/api/v1/").url, "http://h:1")
        os.environ["NAS_URL"] = "http://h:2"
        try:
            self.assertEqual(Client().url, "http://h:2")
        finally:
            del os.environ["NAS_URL"]
        self.assertEqual(Client().url, "http://127.0.0.1:8470")


if __name__ == "__main__":
    unittest.main()
