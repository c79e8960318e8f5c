#!/usr/bin/env python3
"""examples/python/train_loop.py: a plain training loop searched by nas — logistic regression
trained by minibatch SGD on synthetic data, standard library only. One file, three ways:

  python3 train_loop.py --url http://127.0.0.1:8470   your loop asks `nas serve` for trials
                                                      (nas_client) until the budget is handed out
  nas run spec.yaml                                   nas starts it once per trial: parameters in
                                                      $NAS_PARAMS, metrics as nas-metric lines
  python3 train_loop.py                               one run with default hyperparameters

Each epoch reports the validation loss and accuracy at step = epoch; early stopping
(spec.yaml) may stop a trial between epochs. See clients/python/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

#: Hyperparameters of a run outside nas.
DEFAULT_PARAMS = {"lr": 0.1, "l2": 1e-4, "batch_size": 32, "epochs": 12}

Sample = tuple[list[float], int]
#: Called after each epoch with (epoch, {"val_loss": …, "accuracy": …}); True stops training.
EpochHook = Callable[[int, dict[str, float]], bool]


def make_data(seed: int = 0, n: int = 600, dims: int = 5) -> tuple[list[Sample], list[Sample]]:
    """Points x ~ N(0, I) labelled 1 with probability sigmoid(w·x + 0.5) for a fixed random w;
    the first 80 % to train on, the rest to validate. The same for every trial."""
    rng = random.Random(seed)
    true_w = [rng.gauss(0, 1.5) for _ in range(dims)]
    data = []
    for _ in range(n):
        x = [rng.gauss(0, 1) for _ in range(dims)]
        y = int(rng.random() < sigmoid(sum(a * b for a, b in zip(true_w, x)) + 0.5))
        data.append((x, y))
    cut = n * 4 // 5
    return data[:cut], data[cut:]


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(z, 500.0), -500.0)))


def evaluate(w: list[float], b: float, data: list[Sample]) -> dict[str, float]:
    """Mean log loss and accuracy of the model (w, b) on data."""
    loss = correct = 0.0
    for x, y in data:
        p = min(max(sigmoid(sum(a * c for a, c in zip(w, x)) + b), 1e-12), 1 - 1e-12)
        loss -= math.log(p) if y else math.log(1 - p)
        correct += (p >= 0.5) == bool(y)
    return {"val_loss": loss / len(data), "accuracy": correct / len(data)}


def train(params: dict, on_epoch: EpochHook) -> dict[str, float]:
    """Trains with params (lr, l2, batch_size, epochs); returns the last epoch's metrics."""
    train_set, val_set = make_data()
    lr, l2, batch_size = float(params["lr"]), float(params["l2"]), int(params["batch_size"])
    w, b = [0.0] * len(train_set[0][0]), 0.0
    metrics = evaluate(w, b, val_set)
    for epoch in range(1, int(params["epochs"]) + 1):
        order = list(range(len(train_set)))
        random.Random(epoch).shuffle(order)
        for start in range(0, len(order), batch_size):
            batch = [train_set[i] for i in order[start:start + batch_size]]
            grad_w, grad_b = [0.0] * len(w), 0.0
            for x, y in batch:
                error = sigmoid(sum(a * c for a, c in zip(w, x)) + b) - y
                grad_w = [g + error * c for g, c in zip(grad_w, x)]
                grad_b += error
            w = [a - lr * (g / len(batch) + l2 * a) for a, g in zip(w, grad_w)]
            b -= lr * grad_b / len(batch)
        metrics = evaluate(w, b, val_set)
        if on_epoch(epoch, metrics):
            break
    return metrics


def print_metrics(metrics: dict[str, float], step: int | None = None) -> None:
    """One line of nas's metric protocol (docs/metrics-protocol.md), flushed at once."""
    line = dict(metrics, step=step) if step is not None else metrics
    print(f"nas-metric {json.dumps(line)}", flush=True)


def run_as_trial() -> None:
    """One training run with $NAS_PARAMS (as `nas run` starts it), else the defaults."""
    params = json.loads(os.environ["NAS_PARAMS"]) if "NAS_PARAMS" in os.environ else DEFAULT_PARAMS

    def on_epoch(epoch: int, metrics: dict[str, float]) -> bool:
        print_metrics(metrics, step=epoch)
        return False  # nas stops a trial itself, with SIGTERM

    print_metrics(train(params, on_epoch))


def run_with_server(args: argparse.Namespace) -> None:
    """Asks the server for trials and trains each, until the budget is handed out or
    --trials trials have run."""
    try:
        import nas_client
    except ImportError:  # run from a checkout of nas: the client is in clients/python
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))
        import nas_client
    client = nas_client.Client(args.url, token_file=args.token_file)
    experiment = client.experiment_handle(args.experiment)
    for count, trial in enumerate(experiment.ask_until_done(worker=args.worker), start=1):
        with trial:  # an exception fails the trial on the server, then ends this program
            result = train(trial.params, lambda epoch, metrics: trial.report(step=epoch, **metrics))
            trial.complete(**result)  # sends nothing when early stopping stopped the trial
        print(f"trial {trial.number} {trial.status}: val_loss {result['val_loss']:.4f}, "
              f"accuracy {result['accuracy']:.3f}, params {trial.params}", flush=True)
        if count == args.trials:
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("NAS_URL"),
                        help="the nas serve to ask for trials (default $NAS_URL); without one, "
                             "train once with $NAS_PARAMS or the defaults")
    parser.add_argument("--experiment", default="python-example", help="(default %(default)s)")
    parser.add_argument("--worker", help="this worker's name in the trials' job id")
    parser.add_argument("--trials", type=int, default=0, help="stop after this many (default: all)")
    parser.add_argument("--token-file", help="a file holding the server's token (else $NAS_TOKEN)")
    args = parser.parse_args()
    if args.url:
        run_with_server(args)
    else:
        run_as_trial()


if __name__ == "__main__":
    main()
