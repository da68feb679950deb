#!/bin/sh
# Run the whole suite with two CPU-bound processes beside it (a busy two-core
# machine), RUNS times in a row (default 3); stops at the first red run.
# Usage: tests/load_check.sh [RUNS] [make arguments...]
# The hogs are this script's own children, ended by their PIDs on any exit.
set -u
runs=${1:-3}
[ $# -gt 0 ] && shift
python3 -c 'while True: pass' & hog1=$!
python3 -c 'while True: pass' & hog2=$!
# On any exit: end the hogs by their PIDs and wait until they are gone.
trap 'kill "$hog1" "$hog2" 2>/dev/null; wait "$hog1" "$hog2" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
echo "load_check: CPU hogs $hog1 and $hog2; $runs run(s) of make test"
i=1
while [ "$i" -le "$runs" ]; do
    echo "load_check: run $i of $runs (load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null))"
    if ! make test "$@"; then
        echo "load_check: run $i failed"
        exit 1
    fi
    i=$((i + 1))
done
echo "load_check: $runs run(s) green under load"
