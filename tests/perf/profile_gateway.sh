#!/usr/bin/env bash
# Profile the gateway under scenario 1 of the end-to-end benchmark with py-spy.
#
#   tests/perf/profile_gateway.sh            # Python frames, --nonblocking (undistorted)
#   tests/perf/profile_gateway.sh --native   # also C frames (syscalls, json, gc); pauses the
#                                            # process at each sample, so it runs ~2x slower
#   tests/perf/profile_gateway.sh --scenarios 4   # per-request costs instead of per-event
#
# Writes tests/perf/results/profile.txt (py-spy collapsed stacks), profile.svg (flame graph)
# and profile.json (the summary printed at the end: top functions by self and inclusive time).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python tests/perf/bench_gateway.py --profile "$@"
