#!/usr/bin/env python3
"""bench/nas_fashion_report.py OUT OBJECTIVES PARALLEL: the tables of bench/nas_fashion.sh, read from
the runs it made (OUT/runs.txt: method, seed, experiment, start and end Unix times per run),
their sqlite storage (OUT/nas.db) and the trials' logs (OUT/runs/<experiment>/*/stdout.log).

Hypervolume here is over (accuracy − 0.8) × (1 − params / 100 000) [× (1 − latency p50 /
5 ms)], the specs' thresholds as the reference point, from every set of final metrics a
trial stored (a Hyperband trial stores one per rung it ends), in the order they were stored:
so the best-so-far curve of a method counts a model as soon as some rung of it was measured.
"""
import collections, glob, json, os, re, sqlite3, statistics, sys

out, n_obj, parallel = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
runs = [line.split() for line in open(os.path.join(out, "runs.txt")) if line.strip()]
db = sqlite3.connect(os.path.join(out, "nas.db"))
REF_ACC, REF_PARAMS, REF_LAT = 0.8, 100000.0, 5.0


def gains(m):
    """A measurement as coordinates to maximise, 0 at the reference point."""
    g = [m["accuracy"] - REF_ACC, 1 - m["params"] / REF_PARAMS]
    if n_obj == 3:
        g.append(1 - m["latency_ms_p50"] / REF_LAT)
    return g


def hv2(points):
    pts = sorted((p for p in points if p[0] > 0 and p[1] > 0), key=lambda p: -p[0])
    area, best_y = 0.0, 0.0
    for x, y in pts:
        if y > best_y:
            area += x * (y - best_y)
            best_y = y
    return area


def hypervolume(points):
    if n_obj == 2:
        return hv2(points)
    pts = [p for p in points if min(p) > 0]
    levels = sorted({p[2] for p in pts}, reverse=True) + [0.0]
    return sum((levels[k] - levels[k + 1]) * hv2([p[:2] for p in pts if p[2] >= levels[k]])
               for k in range(len(levels) - 1))


def measurements(name):
    """Every set of final metrics of the experiment's trials, oldest first."""
    rows = db.execute(
        "SELECT t.number, m.name, m.value, m.time FROM metrics m JOIN trials t ON t.id = m.trial_id"
        " JOIN experiments e ON e.id = t.experiment_id WHERE e.name = ? AND m.step IS NULL"
        " ORDER BY m.time, m.id", (name,)).fetchall()
    groups = collections.OrderedDict()
    for number, metric, value, time in rows:
        groups.setdefault((number, time), {"trial": number, "time": time})[metric] = value
    return [g for g in groups.values() if "accuracy" in g and "params" in g]


def trials(name):
    rows = db.execute(
        "SELECT t.number, t.status, t.params_json, t.rung, t.started_at, t.finished_at FROM trials t"
        " JOIN experiments e ON e.id = t.experiment_id WHERE e.name = ? ORDER BY t.number",
        (name,)).fetchall()
    return {r[0]: {"status": r[1], "params": json.loads(r[2]), "rung": r[3], "started": r[4],
                   "finished": r[5]} for r in rows}


def data_seconds(name):
    found = []
    for log in glob.glob(os.path.join(out, "runs", name, "*", "stdout.log")):
        m = re.search(r"data ready in ([0-9.]+) s", open(log, errors="replace").read())
        if m:
            found.append(float(m.group(1)))
    return found


by_method = collections.OrderedDict()
print("| method | seed | trials started | rungs measured | hypervolume | best val accuracy | wall s |")
print("|---|---|---|---|---|---|---|")
for method, seed, name, start, end in runs:
    ms, ts = measurements(name), trials(name)
    hv = hypervolume([gains(m) for m in ms])
    best = max((m["accuracy"] for m in ms), default=float("nan"))
    run = dict(method=method, seed=seed, name=name, start=float(start), end=float(end), ms=ms, ts=ts)
    by_method.setdefault(method, []).append(run)
    print(f"| {method} | {seed} | {len(ts)} | {len(ms)} | {hv:.4f} | {best:.4f} | "
          f"{float(end) - float(start):.0f} |")

print("\nBest-so-far hypervolume against wall time (mean over seeds):\n")
wall = max(r["end"] - r["start"] for rs in by_method.values() for r in rs)
marks = [wall * k / 8 for k in range(1, 9)]
print("| method | " + " | ".join(f"{t / 60:.1f} min" for t in marks) + " |")
print("|---|" + "---|" * len(marks))
for method, rs in by_method.items():
    cells = []
    for t in marks:
        cells.append(statistics.mean(
            hypervolume([gains(m) for m in r["ms"] if m["time"] - r["start"] <= t]) for r in rs))
    print(f"| {method} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")

print("\nFront of each method (all seeds together; every measured rung a model), beside the "
      "hand-designed models of the Fashion-MNIST README (test accuracy):\n")
print("| method | model (trial, seed) | params | val accuracy | test accuracy | latency p50 ms |")
print("|---|---|---|---|---|---|")
for method, rs in by_method.items():
    pool = [dict(m, seed=r["seed"], settings=r["ts"].get(m["trial"], {}).get("params", {}))
            for r in rs for m in r["ms"]]
    front = [m for m in pool if not any(
        all(a >= b for a, b in zip(gains(o), gains(m))) and gains(o) != gains(m) for o in pool)]
    for m in sorted(front, key=lambda m: m["params"]):
        if m["accuracy"] < REF_ACC or m["params"] > REF_PARAMS:
            continue
        desc = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in sorted(m["settings"].items()))
        print(f"| {method} | {desc} (trial {m['trial']}, seed {m['seed']}) | {int(m['params'])} | "
              f"{m['accuracy']:.4f} | {m.get('test_accuracy', float('nan')):.4f} | "
              f"{m.get('latency_ms_p50', float('nan')):.3f} |")
for name, params, acc in [("MLP 256-128-100 (README)", "247 766", "0.8833"),
                          ("2 Conv <100K parameters (README)", "< 100 000", "0.925"),
                          ("2 Conv ~113K parameters (README)", "~113 000", "0.922"),
                          ("DenseNet-BC (README)", "768 000", "0.954")]:
    print(f"| hand-designed | {name} | {params} | | {acc} | |")

print("\nPer-trial time split (means per trial run, i.e. per rung for Hyperband; the rest of a "
      "trial is start-up, model building, latency, test evaluation and saving; idle is the "
      "share of the run's slot-seconds (parallel × wall) not spent in a trial run that was "
      "measured: the scheduler's gaps and the runs cut off by the wall-time budget):\n")
print("| method | trial runs | data setup s | training s | rest of trial s | data share | idle share |")
print("|---|---|---|---|---|---|---|")
for method, rs in by_method.items():
    data, train, slots = [], [], 0.0
    for r in rs:
        data += data_seconds(r["name"])
        train += [m.get("train_seconds", 0.0) for m in r["ms"]]
        slots += parallel * (r["end"] - r["start"])
    # Trials that ran once (rung 0) have that run's start and end stored.
    mean_data = statistics.mean(data) if data else float("nan")
    mean_train = statistics.mean(train) if train else float("nan")
    walls = [t["finished"] - t["started"] for r in rs for t in r["ts"].values()
             if t["status"] == "completed" and t["started"] and t["finished"] and t["rung"] == 0]
    train0 = [m.get("train_seconds", 0.0) for r in rs for m in r["ms"]
              if r["ts"].get(m["trial"], {}).get("rung", 0) == 0]
    mean_rest = (statistics.mean(walls) - mean_data - statistics.mean(train0)
                 if walls and train0 and data else float("nan"))
    busy = len(train) * (mean_data + mean_train + (mean_rest if mean_rest == mean_rest else 0))
    print(f"| {method} | {len(train)} | {mean_data:.3f} | {mean_train:.1f} | {mean_rest:.1f} | "
          f"{mean_data / (mean_data + mean_train + max(mean_rest, 0)):.2%} | "
          f"{max(0.0, 1 - busy / slots):.1%} |")
