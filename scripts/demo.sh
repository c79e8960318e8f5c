#!/usr/bin/env bash
# `make demo`: a small neural-architecture search written only in YAML
# (examples/digits-nas.yaml: 16 MLPs trained by nas itself on scikit-learn's 8x8 digits,
# two at a time, chosen by the default GP optimizer), then its Pareto front of validation
# accuracy against parameters. Takes seconds. A second run finds the experiment finished
# and only prints the front again (remove nas.db and runs/ to start over).
# The toy quickstart runs the same way: bin/nas run examples/quickstart.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
bin/nas run examples/digits-nas.yaml --storage sqlite:nas.db
echo
bin/nas pareto digits-nas --storage sqlite:nas.db
