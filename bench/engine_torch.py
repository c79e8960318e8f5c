#!/usr/bin/python3
"""PyTorch side of `make bench-engine` (BENCH.md section 2) and of bench/engine_gpu.sh: the same
models, batch sizes, steps and measurements as bench/bench_engine.c, printed as "key value" lines.

Usage: engine_torch.py THREADS [--quick] [--batch N] [--device cpu|cuda] [--model wide]
(torch.set_num_threads(THREADS); OpenBLAS's own thread count comes from OPENBLAS_NUM_THREADS in
the environment, set by bench/engine.sh). On cuda every timed span ends with
torch.cuda.synchronize(), as the engine's ends with tr_cuda_sync, and TF32 is off for matmuls
(PyTorch's default) and for cuDNN's convolutions (on by default), so both sides compute in
float32."""
import argparse
import time

import torch
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def wide():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                         nn.ReLU(), nn.Linear(4096, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))


def wait(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_rate(model, batch, device, warmup, steps):
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    wait(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    wait(device)
    return (steps * batch / (time.perf_counter() - start),
            steps * batch / (time.process_time() - cpu_start))


def latency(model, device, warmup=200, runs=1000):
    x = torch.randn(1, 1, 28, 28, device=device)
    model.eval()
    times = []
    with torch.no_grad():
        for i in range(warmup + runs):
            start = time.perf_counter()
            model(x)
            wait(device)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e6)
    model.train()
    times.sort()
    return times[runs // 2], times[runs * 99 // 100]


def sgemm_rate(device, n, reps=16):
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = min(timed(lambda: torch.mm(a, b), device) for _ in range(reps))
    return 2.0 * n ** 3 / best * 1e-9


def timed(fn, device):
    start = time.perf_counter()
    fn()
    wait(device)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("threads", type=int)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=("wide",), help="that model's training alone")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch_version {torch.__version__}")
    print(f"batch {args.batch}")
    if args.model == "wide":
        rate, per_cpu = train_rate(wide().to(device), args.batch, device, 1 if args.quick else 10,
                                   2 if args.quick else 100)
        print(f"wide_train_samples_per_s {rate:.0f}\nwide_train_samples_per_cpu_s {per_cpu:.0f}")
        return
    m, c = mlp().to(device), cnn().to(device)
    for name, model, warmup, steps in (("mlp", m, 50, 400), ("cnn", c, 10, 60)):
        rate, per_cpu = train_rate(model, args.batch, device, 2 if args.quick else warmup,
                                   5 if args.quick else steps)
        print(f"{name}_train_samples_per_s {rate:.0f}\n{name}_train_samples_per_cpu_s {per_cpu:.0f}")
    for name, model in (("mlp", m), ("cnn", c)):
        p50, p99 = latency(model, device)
        print(f"{name}_infer_p50_us {p50:.2f}\n{name}_infer_p99_us {p99:.2f}")
    # the engine's benchmark sizes: 1024^3 on the CPU, 4096^3 on a device
    print(f"sgemm_torch_gflops {sgemm_rate(device, 4096 if device.type == 'cuda' else 1024):.1f}")


if __name__ == "__main__":
    main()
