#!/usr/bin/python3
"""bench/optuna_problems.py: Optuna 3.1 (Debian's python3-optuna, run with /usr/bin/python3)
on the problems of bench/bench_optimizer.c, for BENCH.md section 1.

Prints the same CSV rows as `bench_optimizer run`: problem,q,method,seed,evals,hv, where hv is
the hypervolume of the first `evals` evaluations (10, 20, ..., 50) against the problem's
reference point. Methods: tpe (TPESampler(multivariate=True, n_startup_trials=2(d+1))) and
nsga2 (NSGAIISampler with its defaults). q = 1 asks and tells one trial at a time; q = 4 asks
four trials, then evaluates and tells all four (a batch, as nas's q = 4).

    /usr/bin/python3 bench/optuna_problems.py [--seeds N] [--q 1,4] [--methods tpe,nsga2]
        [--problems BraninCurrin,ZDT1,DTLZ2_M2,DTLZ2_M3]
    /usr/bin/python3 bench/optuna_problems.py --front-bound
        the best log10 HV difference k points can reach on BraninCurrin's true front
"""
import argparse
import math
import sys
import time

BUDGET = 50
CHECK_EVERY = 10


def branin_currin(x):
    u, v = 15 * x[0] - 5, 15 * x[1]
    t = v - 5.1 / (4 * math.pi ** 2) * u * u + 5 / math.pi * u - 6
    branin = t * t + 10 * (1 - 1 / (8 * math.pi)) * math.cos(u) + 10
    a = x[0]
    factor = 1.0 if x[1] == 0 else 1 - math.exp(-1 / (2 * x[1]))
    currin = factor * (2300 * a ** 3 + 1900 * a ** 2 + 2092 * a + 60) / (
        100 * a ** 3 + 500 * a ** 2 + 4 * a + 20)
    return [branin, currin]


def zdt1(x):
    g = 1 + 9 * sum(x[1:]) / (len(x) - 1)
    return [x[0], g * (1 - math.sqrt(x[0] / g))]


def dtlz2(x, m):
    g = sum((xi - 0.5) ** 2 for xi in x[m - 1:])
    f = []
    for j in range(m):
        v = 1 + g
        for i in range(m - 1 - j):
            v *= math.cos(x[i] * math.pi / 2)
        if j > 0:
            v *= math.sin(x[m - 1 - j] * math.pi / 2)
        f.append(v)
    return f


# name: (d, reference point, max HV, function); all objectives minimised.
PROBLEMS = {
    "BraninCurrin": (2, [18.0, 6.0], 59.36011874867746, branin_currin),
    "ZDT1": (6, [11.0, 11.0], 120 + 2 / 3, zdt1),
    "DTLZ2_M2": (6, [1.1, 1.1], 1.21 - math.pi / 4, lambda x: dtlz2(x, 2)),
    "DTLZ2_M3": (6, [1.1, 1.1, 1.1], 1.331 - math.pi / 6, lambda x: dtlz2(x, 3)),
}


def hv2(points, ref):
    """Exact 2-D hypervolume: sweep in the first objective."""
    inside = sorted(p for p in points if p[0] < ref[0] and p[1] < ref[1])
    total, best = 0.0, ref[1]
    for a, b in inside:
        if b < best:
            total += (ref[0] - a) * (best - b)
            best = b
    return total


def hypervolume(points, ref):
    """Exact hypervolume in 2 or 3 objectives (3-D by slicing along the last one)."""
    if len(ref) == 2:
        return hv2(points, ref)
    inside = sorted((p for p in points if all(v < r for v, r in zip(p, ref))), key=lambda p: p[2])
    total = 0.0
    for i, p in enumerate(inside):
        top = inside[i + 1][2] if i + 1 < len(inside) else ref[2]
        total += hv2([q[:2] for q in inside[:i + 1]], ref[:2]) * (top - p[2])
    return total


def make_sampler(method, d, seed):
    import optuna
    if method == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, n_startup_trials=2 * (d + 1),
                                          seed=seed)
    if method == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise SystemExit(f"optuna_problems.py: unknown method {method}")


def run_one(name, method, seed, q):
    import optuna
    d, ref, _, f = PROBLEMS[name]
    study = optuna.create_study(directions=["minimize"] * len(ref),
                                sampler=make_sampler(method, d, seed))
    values, sampler_time = [], 0.0
    while len(values) < BUDGET:
        start = time.perf_counter()
        trials = [study.ask() for _ in range(min(q, BUDGET - len(values)))]
        xs = [[t.suggest_float(f"x{i}", 0.0, 1.0) for i in range(d)] for t in trials]
        sampler_time += time.perf_counter() - start
        for t, x in zip(trials, xs):
            y = f(x)
            study.tell(t, y)
            values.append(y)
    for evals in range(CHECK_EVERY, BUDGET + 1, CHECK_EVERY):
        print(f"{name},{q},optuna-{method},{seed},{evals},{hypervolume(values[:evals], ref):.12g}")
    sys.stdout.flush()
    return sampler_time / BUDGET


def front_bound():
    """Best log10 HV difference k points can reach on BraninCurrin (exact for a dense front).

    The front is taken from an 801x801 grid of the square; the best k of its points (600
    kept, evenly along it) are chosen exactly by dynamic programming: sorted by the first
    objective, best[j][i] is the largest hypervolume of j points whose last is point i."""
    import numpy as np
    _, ref, max_hv, f = PROBLEMS["BraninCurrin"]
    n = 801
    pts = sorted(p for p in (f([i / (n - 1), j / (n - 1)]) for i in range(n) for j in range(n))
                 if p[0] < ref[0] and p[1] < ref[1])
    front, low = [], ref[1]
    for p in pts:
        if p[1] < low:
            front.append(p)
            low = p[1]
    front = front[::max(1, len(front) // 600)]
    a = np.array([ref[0] - p[0] for p in front])  # width to the reference point
    b = np.array([p[1] for p in front])
    best = a * (ref[1] - b)  # one point
    print("| points on the front | best log10(max HV - HV) |\n|---|---|")
    for k in range(2, 101):  # best[i] becomes the best of k points ending at point i
        nxt = np.full_like(best, -np.inf)
        for i in range(1, len(front)):
            nxt[i] = np.max(best[:i] + a[i] * (b[:i] - b[i]))
        best = nxt
        if k in (10, 20, 30, 40, 44, 50, 100):
            print(f"| {k} | {math.log10(max_hv - best.max()):.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--q", default="1,4")
    ap.add_argument("--methods", default="tpe,nsga2")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--front-bound", action="store_true")
    args = ap.parse_args()
    if args.front_bound:
        front_bound()
        return
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("problem,q,method,seed,evals,hv")
    for name in args.problems.split(","):
        for q in (int(v) for v in args.q.split(",")):
            for method in args.methods.split(","):
                times = [run_one(name, method, seed, q) for seed in range(args.seeds)]
                ms = 1e3 * sum(times) / len(times)
                print(f"optuna {method} {name} q={q}: sampler {ms:.2f} ms per trial", file=sys.stderr)


if __name__ == "__main__":
    main()
