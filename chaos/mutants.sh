#!/usr/bin/env bash
# The mutant matrix: every planted bug of internal/mutant, built under its
# tag (mutant_<name>), must be caught. For each mutant this prints which
# layer caught it, after how many seeds, and by which invariant; it exits
# non-zero if any mutant is caught by no layer.
#
#   chaos/mutants.sh            every mutant
#   chaos/mutants.sh NAME...    only these
#
# Layers (one column each):
#   sim   the deterministic simulator (go test ./chaos/sim -run TestSimCatchesMutant)
#   live  the real-process chaos layer: see live_layer below.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

# The names of internal/mutant's mutants, as its constants spell them.
all_mutants() {
  sed -n '/^const (/,/^)/p' internal/mutant/mutant.go | grep -oE '= "[a-z_]+"' | tr -d '= "'
}

# sim_layer NAME prints "caught SEEDS SEED INVARIANT" or "missed SEEDS - -".
sim_layer() {
  local out line
  out=$(go test -count=1 -tags "mutant_$1" ./chaos/sim -run 'TestSimCatchesMutant$' -v 2>&1)
  line=$(grep -oE "MUTANT $1 (caught|missed) .*" <<<"$out" | tail -1)
  if [[ -z $line ]]; then
    echo "error - - $(grep -m1 -E 'FAIL|panic|cannot|undefined' <<<"$out" | tr ' ' '_')"
    return
  fi
  local verdict seeds seed invariant
  verdict=$(awk '{print $3}' <<<"$line")
  seeds=$(grep -oE 'seeds=[0-9]+' <<<"$line" | cut -d= -f2)
  seed=$(grep -oE ' seed=[0-9]+' <<<"$line" | cut -d= -f2)
  invariant=$(grep -oE 'invariant="[^"]*"' <<<"$line" | cut -d'"' -f2 | tr ' ' '_')
  echo "$verdict ${seeds:--} ${seed:--} ${invariant:--}"
}

# live_layer NAME prints the real-process layer's verdict for the mutant,
# in the same four fields as sim_layer: a short campaign (node chaos)
# against real processes of a chaos build carrying the mutant, which must
# end in a violation (exit 3). It runs for the mutants in LIVE (default:
# the incident, whose campaign must show cross-tenant bytes); "-" for the
# others, which count for nothing here.
LIVE="${LIVE:-incident}"
live_layer() {
  if [[ " $LIVE " != *" $1 "* ]]; then
    echo "- - - -"
    return
  fi
  local bin dir rc
  dir=$(mktemp -d "${TMPDIR:-/tmp}/kvwarden-mutant-$1.XXXXXX")
  bin="$dir/node"
  if ! go build -tags "chaos mutant_$1" -o "$bin" ./cmd/node 2>"$dir/build.txt"; then
    echo "error - - build"
    return
  fi
  # A prefill pool smaller than the load needs: the pool runs out, which
  # a correct node answers "busy" and the incident's node answers with a
  # placeholder.
  "$bin" chaos --seed 1 --requests 200 --faults none --context-tokens 128 --prompt-bytes-max 100 \
    --report "$dir/report.json" -- --prefill-pages 8 >"$dir/summary.txt" 2>"$dir/log.txt"
  rc=$?
  if [[ $rc -eq 3 ]]; then
    echo "caught 200 - $(grep -m1 -oE 'VIOLATION: [^(]*' "$dir/summary.txt" | cut -c12- | tr ' ' '_')"
  else
    echo "missed 200 - exit_$rc"
  fi
  [[ -n "${KEEP:-}" ]] && echo "live campaign of $1 kept in $dir" >&2 || rm -rf "$dir"
}

mutants=("$@")
if [[ ${#mutants[@]} -eq 0 ]]; then
  mapfile -t mutants < <(all_mutants)
fi

printf '%-28s | %-7s %7s %6s %-26s | %-7s %8s %s\n' mutant sim seeds seed invariant live requests violation
printf -- '-%.0s' {1..100}; echo
missed=0
for m in "${mutants[@]}"; do
  read -r sv sseeds sseed sinv <<<"$(sim_layer "$m")"
  read -r lv lseeds _ linv <<<"$(live_layer "$m")"
  printf '%-28s | %-7s %7s %6s %-26s | %-7s %8s %s\n' "$m" "$sv" "$sseeds" "$sseed" "${sinv//_/ }" "$lv" "$lseeds" "${linv//_/ }"
  if [[ $sv != caught && $lv != caught ]]; then
    missed=$((missed + 1))
  fi
done
if [[ $missed -gt 0 ]]; then
  echo "$missed mutant(s) caught by no layer"
  exit 1
fi
echo "every mutant caught"
