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
# in the same four fields as sim_layer. Until that layer reports here it
# says "-" and counts for nothing.
live_layer() {
  echo "- - - -"
}

mutants=("$@")
if [[ ${#mutants[@]} -eq 0 ]]; then
  mapfile -t mutants < <(all_mutants)
fi

printf '%-28s | %-7s %7s %6s %-26s | %-7s %7s\n' mutant sim seeds seed invariant live runs
printf -- '-%.0s' {1..100}; echo
missed=0
for m in "${mutants[@]}"; do
  read -r sv sseeds sseed sinv <<<"$(sim_layer "$m")"
  read -r lv lseeds _ _ <<<"$(live_layer "$m")"
  printf '%-28s | %-7s %7s %6s %-26s | %-7s %7s\n' "$m" "$sv" "$sseeds" "$sseed" "${sinv//_/ }" "$lv" "$lseeds"
  if [[ $sv != caught && $lv != caught ]]; then
    missed=$((missed + 1))
  fi
done
if [[ $missed -gt 0 ]]; then
  echo "$missed mutant(s) caught by no layer"
  exit 1
fi
echo "every mutant caught"
