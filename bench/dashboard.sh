#!/bin/sh
# bench/dashboard.sh: `make bench-dashboard` — the dashboard at 10 000 trials. Imports an
# experiment of TRIALS trials (two objectives, two parameters, a 5-step curve each) made up
# by Python into a fresh SQLite file, serves it, and measures the page's two data
# requests (GET …/dashboard, then …/curves, with curl) and the page's first paint in headless
# Chromium (bench/first_paint.py: the time from asking for the page to the rendered frame of
# its summary, front and hypervolume, which the page's script writes into <body
# data-first-draw-ms>, and to every card drawn, <body data-drawn-ms>; real time).
set -eu
BIN=${BIN:-bin}
NAS=$(pwd)/$BIN/nas
TRIALS=${TRIALS:-10000}
dir=$(mktemp -d)
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
python3 - "$TRIALS" >"$dir/big.json" <<'PY'
import json, math, random, sys
n = int(sys.argv[1]); rnd = random.Random(1); trials = []
spec = ("name: big\nparameters:\n  x: {type: float, low: 0, high: 1}\n"
        "  act: {type: categorical, choices: [relu, tanh, gelu]}\n"
        "objectives: [{name: y, goal: minimize}, {name: z, goal: minimize}]\n"
        "trial: {command: [true]}\nbudget: {trials: %d}\n" % n)
for i in range(n):
    x = rnd.random(); t = 1.7e9 + i
    y, z = x + 0.1 * rnd.random(), 1 - math.sqrt(x) + 0.2 * rnd.random()
    trials.append({"number": i, "status": "completed", "params": {"x": x, "act": rnd.choice(["relu", "tanh", "gelu"])},
                   "metrics": {"y": y, "z": z}, "attempts": 1, "created_at": t, "started_at": t,
                   "finished_at": t + 0.5, "error": None, "reference_point": None, "heartbeat_at": None,
                   "intermediate": {"y": [[s, y + 1 / (s + 1), t] for s in range(5)]}})
json.dump({"format": "nas-experiment", "version": 1, "exported_at": 1.7e9,
           "experiment": {"name": "big", "status": "finished", "created_at": 1.7e9, "spec": spec,
                          "spec_path": "/tmp/big.yaml", "run_root": "/tmp"}, "trials": trials}, sys.stdout)
PY
"$NAS" import "$dir/big.json" --storage "sqlite:$dir/nas.db" >/dev/null
"$NAS" serve --storage "sqlite:$dir/nas.db" --listen 127.0.0.1:0 2>"$dir/serve.log" &
server=$!
until grep -q "listening on port" "$dir/serve.log"; do sleep 0.05; done
port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$dir/serve.log")
for part in dashboard dashboard dashboard curves; do
  curl -s -o /dev/null -w "GET /api/v1/experiments/big/$part: %{time_total} s, %{size_download} bytes\n" \
    "http://127.0.0.1:$port/api/v1/experiments/big/$part"
done
for i in 1 2 3; do
  python3 bench/first_paint.py "http://127.0.0.1:$port/#/e/big" "$dir/chromium"
done
