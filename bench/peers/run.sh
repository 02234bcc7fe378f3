#!/usr/bin/env bash
# The peer comparison of docs/performance.md, by hand (not in CI): the same dispatch world in
# SimPy and Ciw, from a virtual environment next to this script. Run from anywhere:
#   bash bench/peers/run.sh [requests, default 200000] [ciw requests, default 20000]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q -r "$here/requirements.txt"; }
n="${1:-200000}"
n_ciw="${2:-20000}"
for policy in random jsq; do
    "$venv/bin/python" "$here/simpy_dispatch.py" --requests "$n" --policy "$policy"
    "$venv/bin/python" "$here/ciw_dispatch.py" --requests "$n_ciw" --policy "$policy"
done
echo "routelab, same world (mean response and requests/s per policy): routelab compare exp_rho09 --policies random,least_requests"
echo "and its simulated requests/s: routelab bench (dispatch section)"
