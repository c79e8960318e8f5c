#!/usr/bin/env bash
# `make demo`: runs the quickstart experiment into nas.db and prints its Pareto front.
# A second run finds the experiment finished and only prints the front again
# (remove nas.db and runs/ to start over).
set -euo pipefail
cd "$(dirname "$0")/.."
bin/nas run examples/quickstart.yaml --storage sqlite:nas.db
echo
bin/nas pareto quickstart --storage sqlite:nas.db
