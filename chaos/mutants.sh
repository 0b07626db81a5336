#!/usr/bin/env bash
# The mutant matrix: every planted bug of internal/mutant, built under its
# tag (mutant_<name>), must be caught. For each mutant this prints which
# layer caught it, after how many seeds, and by which invariant; it exits
# non-zero if any mutant is caught by no layer, or a mutant of LIVE is not
# caught by the live layer (see live_layer).
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
# in the same four fields as sim_layer. For the mutants in LIVE (default:
# the incident) it runs one short campaign (node chaos) against real
# processes of a chaos build carrying the mutant, and the same campaign
# against a chaos build of main first: main must pass it (exit 0), and the
# mutant must end in violations (exit 3) with wrong answers and rows read
# that another tenant wrote. A mutant in LIVE must be caught by both
# layers; "-" for the others, which count for nothing here.
LIVE="${LIVE-incident}" # LIVE= (empty) runs no live campaign
# A prefill pool smaller than the load needs: it runs out, which main
# answers "busy" and the incident's node answers with a placeholder.
campaign=(chaos --seed 1 --requests 200 --faults none --context-tokens 128 --prompt-bytes-max 100)
campaign_nodes=(-- --prefill-pages 8)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvwarden-mutants.XXXXXX")
if [[ -n "${KEEP:-}" ]]; then
  echo "live campaigns kept in $work" >&2
else
  trap 'rm -rf "$work"' EXIT
fi

# field NAME FILE is the integer JSON field NAME of report FILE (0 if absent).
field() {
  grep -oE "\"$1\": [0-9]+" "$2" | head -1 | grep -oE '[0-9]+$' || echo 0
}

# baseline runs the campaign once against main; its exit status is kept.
baseline=1
run_baseline() {
  if go build -tags chaos -o "$work/node-main" ./cmd/node; then
    "$work/node-main" "${campaign[@]}" --report "$work/main.json" "${campaign_nodes[@]}" >"$work/main.txt" 2>"$work/main.log"
    baseline=$?
  fi
}

live_layer() {
  if [[ " $LIVE " != *" $1 "* ]]; then
    echo "- - - -"
    return
  fi
  if [[ $baseline -ne 0 ]]; then
    echo "error - - main_failed_the_campaign_(exit_$baseline)"
    return
  fi
  local bin="$work/node-$1" report="$work/$1.json" rc wrong rows
  go build -tags "chaos mutant_$1" -o "$bin" ./cmd/node || { echo "error - - build"; return; }
  "$bin" "${campaign[@]}" --report "$report" "${campaign_nodes[@]}" >"$work/$1.txt" 2>"$work/$1.log"
  rc=$?
  wrong=$(field wrong_answers "$report")
  rows=$(field cross_tenant_rows "$report")
  if [[ $rc -eq 3 && $wrong -gt 0 && $rows -gt 0 ]]; then
    echo "caught 200 - ${wrong}_wrong_answers,_${rows}_rows_of_other_tenants_read"
  else
    echo "missed 200 - exit_${rc},_${wrong}_wrong,_${rows}_rows_of_other_tenants"
  fi
}

# The invariant each mutant must break first in the simulator: the check
# of the layer the mutant removes (either of those "|" separates, for a
# mutant that removes two: the incident admits past the smallest pool and
# then reads the placeholder's pages, and which a seed reaches first is the
# seed's). Caught by another one, the mutant counts as missed, so that a
# check that stops working cannot hide behind another.
declare -A expect=(
  [incident]="provenance|admission"
  [no_tag_check]="one owner"
  [early_release]="release after ack"
  [no_gen_bump]="generations grow"
  [checksum_skips_header]="corruption refused"
  [no_manifest_verify]="provenance"
  [admit_ignores_smallest_pool]="admission"
  [late_done_accepted]="late messages ignored"
  [scope_from_request]="provenance"
  [evict_no_gen_bump]="generations grow"
  [lease_count_negative]="lease count"
  [key_without_scope]="cache scope"
  [held_copy_unchecked]="provenance"
  [move_early_release]="release after ack"
  [move_replay]="answers"
  [relay_unhanded]="answers"
)

mutants=("$@")
if [[ ${#mutants[@]} -eq 0 ]]; then
  mapfile -t mutants < <(all_mutants)
fi

live_asked=""
for m in "${mutants[@]}"; do
  [[ " $LIVE " == *" $m "* ]] && live_asked=1
done
if [[ -n $live_asked ]]; then
  run_baseline
  echo "main against the live campaign: exit $baseline (wrong answers $(field wrong_answers "$work/main.json"), rows of other tenants read $(field cross_tenant_rows "$work/main.json"))"
fi
printf '%-28s | %-7s %7s %6s %-26s | %-7s %8s %s\n' mutant sim seeds seed invariant live requests violation
printf -- '-%.0s' {1..100}; echo
missed=0
for m in "${mutants[@]}"; do
  read -r sv sseeds sseed sinv <<<"$(sim_layer "$m")"
  if [[ $sv == caught && "|${expect[$m]:-}|" != *"|${sinv//_/ }|"* ]]; then
    sv=other # caught, but not by the check of the layer it removes
  fi
  read -r lv lseeds _ linv <<<"$(live_layer "$m")"
  printf '%-28s | %-7s %7s %6s %-26s | %-7s %8s %s\n' "$m" "$sv" "$sseeds" "$sseed" "${sinv//_/ }" "$lv" "$lseeds" "${linv//_/ }"
  if [[ $sv != caught && $lv != caught ]] || [[ " $LIVE " == *" $m "* && $lv != caught ]]; then
    missed=$((missed + 1))
  fi
done
if [[ $missed -gt 0 ]]; then
  echo "$missed mutant(s) not caught by every layer they must be caught by"
  exit 1
fi
echo "every mutant caught"
