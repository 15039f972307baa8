#!/usr/bin/env bash
# The workspace's tests in a shuffled order: the test binaries in an order
# drawn from SEED, and each binary's tests shuffled by the same seed (libtest's
# --shuffle-seed, an unstable option that RUSTC_BOOTSTRAP lets the test
# binaries of a stable toolchain take). A test that passes only after
# another one, or only alone, fails here. Replay a run with its seed.
#
#   tests/shuffled.sh [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:-$RANDOM}
echo "shuffle seed: $SEED"
mapfile -t binaries < <(cargo test --workspace --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])')
mapfile -t order < <(printf '%s\n' "${binaries[@]}" | sort |
  shuf --random-source=<(openssl enc -aes-256-ctr -pass pass:"$SEED" -nosalt </dev/zero 2>/dev/null))
for binary in "${order[@]}"; do
  echo "== $(basename "$binary")"
  # From its package's folder, as cargo runs it.
  dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | python3 -c '
import json, sys, os
name = sys.argv[1].rsplit("-", 1)[0]
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if t["name"].replace("-", "_") == name:
            print(os.path.dirname(p["manifest_path"])); sys.exit()' "$(basename "$binary")")
  (cd "${dir:-.}" && RUSTC_BOOTSTRAP=1 "$binary" -Z unstable-options --shuffle-seed "$SEED" -q)
done
echo "all passed, shuffle seed $SEED"
