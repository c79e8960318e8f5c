#!/usr/bin/python3
"""bench/optuna_problems.py: Optuna 3.1 (Debian's python3-optuna, run with /usr/bin/python3)
on the problems of bench/bench_optimizer.c, for BENCH.md section 1.

Prints the same CSV rows as `bench_optimizer run`: problem,q,method,seed,evals,hv,tip, where
hv is the hypervolume of the first `evals` evaluations (10, 20, ... and the problem's budget)
against the problem's reference point, and tip whether they reached the far tip of DTLZ7's
front. Methods: tpe (TPESampler(multivariate=True, n_startup_trials = the problem's initial
design size, 2(d+1) unless its protocol says)) and nsga2 (NSGAIISampler with its defaults);
both get C2-DTLZ2's constraint through constraints_func. q = 1 asks and tells one trial at a
time; q = 4 asks four trials, then evaluates and tells all four (a batch, as nas's q = 4).
Problems with a protocol of their own (C2DTLZ2: 10 + 40, q = 2; BraninCurrinNoisy: 6 + 80,
q = 4, noise sd 15.19 and 0.63 on what the sampler is told, the hypervolume of the noise-free
values) run at their q whatever --q says, as in bench_optimizer.c.

    /usr/bin/python3 bench/optuna_problems.py [--seeds N] [--q 1,4] [--methods tpe,nsga2]
        [--problems BraninCurrin,ZDT1,DTLZ2_M2,DTLZ2_M3,DTLZ7,C2DTLZ2,BraninCurrinNoisy]
    /usr/bin/python3 bench/optuna_problems.py --front-bound
        the best log10 HV difference k points can reach on BraninCurrin's true front
"""
import argparse
import math
import random
import sys
import time

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


def dtlz7(x):
    g = 1 + 9 * sum(x[1:]) / (len(x) - 1)
    return [x[0], (1 + g) * (2 - x[0] / (1 + g) * (1 + math.sin(3 * math.pi * x[0])))]


def c2_dtlz2_slack(f):
    """BoTorch's C2DTLZ2 slack (r = 0.2, M = 2): feasible when >= 0."""
    r2 = 0.2 ** 2
    ends = min((f[i] - 1) ** 2 + f[1 - i] ** 2 - r2 for i in range(2))
    middle = sum((v - 1 / math.sqrt(2)) ** 2 - r2 for v in f)
    return -min(ends, middle)


class Problem:
    def __init__(self, d, ref, max_hv, f, n_init=None, budget=50, q=None, noise=None,
                 slack=None, tip_f2=None):
        self.d, self.ref, self.max_hv, self.f = d, ref, max_hv, f
        self.n_init = n_init or 2 * (d + 1)
        self.budget, self.q, self.noise, self.slack, self.tip_f2 = budget, q, noise, slack, tip_f2


# all objectives minimised; max HV and protocols as in bench_optimizer.c
PROBLEMS = {
    "BraninCurrin": Problem(2, [18.0, 6.0], 59.36011874867746, branin_currin),
    "ZDT1": Problem(6, [11.0, 11.0], 120 + 2 / 3, zdt1),
    "DTLZ2_M2": Problem(6, [1.1, 1.1], 1.21 - math.pi / 4, lambda x: dtlz2(x, 2)),
    "DTLZ2_M3": Problem(6, [1.1, 1.1, 1.1], 1.331 - math.pi / 6, lambda x: dtlz2(x, 3)),
    "DTLZ7": Problem(6, [15.0, 15.0], 189.43077305224656, dtlz7, tip_f2=2.5),
    "C2DTLZ2": Problem(4, [1.1, 1.1], 0.3996406303723544, lambda x: dtlz2(x, 2), n_init=10,
                       q=2, slack=c2_dtlz2_slack),
    "BraninCurrinNoisy": Problem(2, [18.0, 6.0], 59.36011874867746, branin_currin, n_init=6,
                                 budget=86, q=4, noise=[15.19, 0.63]),
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


def make_sampler(method, prob, seed):
    import optuna
    constraints = (lambda t: t.user_attrs["constraint"]) if prob.slack else None
    if method == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, n_startup_trials=prob.n_init,
                                          seed=seed, constraints_func=constraints)
    if method == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, constraints_func=constraints)
    raise SystemExit(f"optuna_problems.py: unknown method {method}")


def run_one(name, method, seed, q):
    import optuna
    prob = PROBLEMS[name]
    study = optuna.create_study(directions=["minimize"] * len(prob.ref),
                                sampler=make_sampler(method, prob, seed))
    noise = random.Random(seed * 7919 + 17)
    true_values, sampler_time = [], 0.0
    while len(true_values) < prob.budget:
        start = time.perf_counter()
        trials = [study.ask() for _ in range(min(q, prob.budget - len(true_values)))]
        xs = [[t.suggest_float(f"x{i}", 0.0, 1.0) for i in range(prob.d)] for t in trials]
        sampler_time += time.perf_counter() - start
        for t, x in zip(trials, xs):
            y = prob.f(x)
            seen = [v + noise.gauss(0, sd) for v, sd in zip(y, prob.noise)] if prob.noise else y
            if prob.slack:
                slack = prob.slack(y)
                t.set_user_attr("constraint", [-slack])
                y = y if slack >= 0 else [math.inf] * len(y)  # infeasible: no hypervolume
            study.tell(t, seen)
            true_values.append(y)
    for evals in list(range(CHECK_EVERY, prob.budget, CHECK_EVERY)) + [prob.budget]:
        tip = ""
        if prob.tip_f2:
            tip = "1" if any(v[1] <= prob.tip_f2 for v in true_values[:evals]) else "0"
        hv = hypervolume(true_values[:evals], prob.ref)
        print(f"{name},{q},optuna-{method},{seed},{evals},{hv:.12g},{tip}")
    sys.stdout.flush()
    return sampler_time / prob.budget


def front_bound():
    """Best log10 HV difference k points can reach on BraninCurrin (exact for a dense front).

    The front is taken from an 801x801 grid of the square; the best k of its points (600
    kept, evenly along it) are chosen exactly by dynamic programming: sorted by the first
    objective, best[j][i] is the largest hypervolume of j points whose last is point i."""
    import numpy as np
    prob = PROBLEMS["BraninCurrin"]
    ref, max_hv, f = prob.ref, prob.max_hv, prob.f
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
    print("problem,q,method,seed,evals,hv,tip")
    for name in args.problems.split(","):
        qs = [PROBLEMS[name].q] if PROBLEMS[name].q else [int(v) for v in args.q.split(",")]
        for q in qs:
            for method in args.methods.split(","):
                times = [run_one(name, method, seed, q) for seed in range(args.seeds)]
                ms = 1e3 * sum(times) / len(times)
                print(f"optuna {method} {name} q={q}: sampler {ms:.2f} ms per trial", file=sys.stderr)


if __name__ == "__main__":
    main()
