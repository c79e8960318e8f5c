#!/usr/bin/python3
"""PyTorch CPU side of `make bench-engine` (BENCH.md section 2): the same models, batch sizes,
steps and measurements as bench/bench_engine.c, printed as "key value" lines.

Usage: engine_torch.py THREADS [--quick]   (torch.set_num_threads(THREADS); OpenBLAS's own
thread count comes from OPENBLAS_NUM_THREADS in the environment, set by bench/engine.sh)."""
import sys
import time

import torch
import torch.nn as nn

BATCH = 128


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))


def train_rate(model, warmup, steps):
    x = torch.randn(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (steps * BATCH / (time.perf_counter() - start),
            steps * BATCH / (time.process_time() - cpu_start))


def latency(model, warmup=200, runs=1000):
    x = torch.randn(1, 1, 28, 28)
    model.eval()
    times = []
    with torch.no_grad():
        for i in range(warmup + runs):
            start = time.perf_counter()
            model(x)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e6)
    model.train()
    times.sort()
    return times[runs // 2], times[runs * 99 // 100]


def sgemm_rate(n=1024, reps=16):
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = min(timed(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2.0 * n ** 3 / best * 1e-9


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    threads = int(sys.argv[1])
    quick = "--quick" in sys.argv
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    print(f"torch_version {torch.__version__}")
    m, c = mlp(), cnn()
    for name, model, warmup, steps in (("mlp", m, 50, 400), ("cnn", c, 10, 60)):
        rate, per_cpu = train_rate(model, 2 if quick else warmup, 5 if quick else steps)
        print(f"{name}_train_samples_per_s {rate:.0f}\n{name}_train_samples_per_cpu_s {per_cpu:.0f}")
    for name, model in (("mlp", m), ("cnn", c)):
        p50, p99 = latency(model)
        print(f"{name}_infer_p50_us {p50:.2f}\n{name}_infer_p99_us {p99:.2f}")
    print(f"sgemm_torch_gflops {sgemm_rate():.1f}")


if __name__ == "__main__":
    main()
