#!/usr/bin/env bash
# Model-checks formal/handoff.pml (the handoff), formal/cache.pml (the
# prefix cache's shared pages) and formal/move.pml (a running request's
# move between decode nodes) with SPIN: each correct model must have no
# error in any configuration, and every planted bug (mutant) must be caught
# as an assertion violation. Installs nothing; needs spin and a C compiler.
#
#   formal/check.sh            # exit 0: all as expected
#   DEPTH=20000 formal/check.sh
#   KEEP=1 formal/check.sh     # keep the work folder (pan output, trails)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
depth="${DEPTH:-10000}"   # pan -m: DFS stack depth; the models need ~200
cc="${CC:-gcc}"

if ! command -v spin >/dev/null 2>&1; then
  echo "check.sh: spin not found on PATH; install it first (Debian: apt-get install -y spin)" >&2
  exit 2
fi
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "check.sh: C compiler '$cc' not found; spin's verifier is C" >&2
  exit 2
fi
for m in handoff cache move; do
  [[ -f "$here/$m.pml" ]] || { echo "check.sh: $here/$m.pml missing" >&2; exit 2; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/kvwarden-formal.XXXXXX")"
if [[ -n "${KEEP:-}" ]]; then
  echo "work folder: $work"
else
  trap 'rm -rf "$work"' EXIT
fi

# Bounded configurations, each searched exhaustively. handoff.pml has two
# that together cover every behaviour the model has; one configuration with
# all of them at once is too large to search in seconds (see MAPPING.md,
# "Bounds").
#   faults: two requests, up to two data-plane faults, one cancel, one
#           retransmission per attempt, no re-plan.
#   retry:  request 0 may re-plan once after a failed attempt (same owner
#           gets a page again: only the generation tells the tenancies
#           apart), one data-plane fault, no cancel, no retransmission.
FAULTS="-DRETRY_MAX=0 -DFAULT_MAX=2 -DCANCEL_MAX=1 -DRETX_MAX=1"
RETRY="-DRETRY_MAX=1 -DFAULT_MAX=1 -DCANCEL_MAX=0 -DRETX_MAX=0"
# For cache.pml two more:
#   share:  two readers of scope A and one of scope B (probing A's pages)
#           race two prefills' published pages, evictions and reclaims.
#   dup:    one reader a scope, and one unlease delivered twice (with two
#           readers of a scope sharing a page a duplicate would take the
#           other's count; see MAPPING.md).
SHARE=""
DUP="-DNREADERS_A=1 -DDUP_MAX=1"
# For move.pml four (see MAPPING.md, "Bounds"):
#   move:   the defaults: two moves from A to B, one message lost, one
#           delivered twice, one crash of either node.
#   later:  A may decode a token between two moves (an older version in a
#           late frame); one duplicate, no loss, no crash.
#   rogue:  a rogue's chunk, one duplicate, the relay's own deadline at any
#           moment.
#   back:   A to B, back to A and to B again; one crash, one duplicate,
#           no loss.
MOVE=""
LATER="-DNTOK=5 -DLOSS_MAX=0 -DCRASH_MAX=0"
ROGUE="-DLOSS_MAX=0 -DCRASH_MAX=0 -DFORGE_MAX=1 -DRTO=1"
BACK="-DBACK=1 -DMOVE_MAX=3 -DLOSS_MAX=0 -DNSLOT=16"

# model|name|config|expected|extra flags
variants=(
  "handoff|correct|faults|pass|"
  "handoff|correct|retry|pass|"
  "handoff|MUTANT_NO_TAG_CHECK|faults|fail|-DMUTANT_NO_TAG_CHECK"
  "handoff|MUTANT_NO_GEN_BUMP|retry|fail|-DMUTANT_NO_GEN_BUMP"
  "handoff|MUTANT_EARLY_RELEASE|faults|fail|-DMUTANT_EARLY_RELEASE"
  "handoff|MUTANT_HEADER_UNCHECKED|faults|fail|-DMUTANT_HEADER_UNCHECKED"
  "cache|correct|share|pass|"
  "cache|correct|dup|pass|"
  "cache|MUTANT_NO_SCOPE_CHECK|share|fail|-DMUTANT_NO_SCOPE_CHECK"
  "cache|MUTANT_EVICT_NO_GEN_BUMP|share|fail|-DMUTANT_EVICT_NO_GEN_BUMP"
  "cache|MUTANT_UNLEASE_NO_COUNT|dup|fail|-DMUTANT_UNLEASE_NO_COUNT"
  "cache|MUTANT_PUBLISH_NO_GEN_BUMP|share|fail|-DMUTANT_PUBLISH_NO_GEN_BUMP"
  "move|correct|move|pass|"
  "move|correct|later|pass|"
  "move|correct|rogue|pass|"
  "move|correct|back|pass|"
  "move|MUTANT_MOVE_RELEASE_BEFORE_ACK|move|fail|-DMUTANT_MOVE_RELEASE_BEFORE_ACK"
  "move|MUTANT_MOVE_STALE_TAG|move|fail|-DMUTANT_MOVE_STALE_TAG"
  "move|MUTANT_RELAY_UNHANDED|rogue|fail|-DMUTANT_RELAY_UNHANDED"
  "move|MUTANT_MOVE_REPLAY|move|fail|-DMUTANT_MOVE_REPLAY"
)

now() { date +%s.%N; }
status=0
t_all=$(now)
printf '%-7s %-30s %-7s %-8s %-6s %12s %8s  %s\n' model variant config expected got states seconds note
for v in "${variants[@]}"; do
  IFS='|' read -r model name config expected extra <<<"$v"
  case "$config" in
    faults) flags="$FAULTS" ;;
    retry)  flags="$RETRY" ;;
    share)  flags="$SHARE" ;;
    dup)    flags="$DUP" ;;
    move)   flags="$MOVE" ;;
    later)  flags="$LATER" ;;
    rogue)  flags="$ROGUE" ;;
    back)   flags="$BACK" ;;
  esac
  dir="$work/$model.$name.$config"
  mkdir -p "$dir"
  cp "$here/$model.pml" "$dir/$model.pml"
  # shellcheck disable=SC2086 # flags are meant to split into words
  if ! (cd "$dir" && spin -a $flags $extra "$model.pml" >spin.log 2>&1); then
    echo "check.sh: spin -a failed for $model $name ($config):" >&2
    cat "$dir/spin.log" >&2
    exit 1
  fi
  # -w: gcc warns about array indexing it cannot prove in range; pan checks
  # every index at run time and reports it as an error.
  if ! (cd "$dir" && "$cc" -O2 -w -DSAFETY -DCOLLAPSE -o pan pan.c >cc.log 2>&1); then
    echo "check.sh: compiling the verifier failed for $model $name ($config):" >&2
    cat "$dir/cc.log" >&2
    exit 1
  fi
  t0=$(now)
  (cd "$dir" && ./pan -m"$depth" >pan.out 2>&1) || true
  secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
  out="$dir/pan.out"

  errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$out" | tail -n 1)
  states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' "$out" | tail -n 1)
  [[ -n "$states" ]] || states="?"
  note=""
  if [[ -z "$errors" ]]; then
    got="broken"
    note="no 'errors:' line from pan (see below)"
  elif [[ "$errors" == 0 ]]; then
    got="pass"
  else
    got="fail"
    note=$(grep -m 1 -o 'assertion violated.*' "$out" || true)
    if [[ -z "$note" ]]; then
      got="fail-other"   # an error that is not an assertion (e.g. invalid end state)
      note=$(grep -m 1 -E '^pan:[0-9]+:|^pan: ' "$out" || true)
    fi
  fi
  # A search cut short by the depth bound proves nothing.
  if grep -q 'max search depth too small' "$out"; then
    if [[ "$got" == pass ]]; then got="truncated"; fi
    note="$note [max search depth too small: raise DEPTH]"
  fi
  if [[ "$got" == pass ]] && ! grep -q 'Full statespace search' "$out"; then
    got="partial"
  fi

  printf '%-7s %-30s %-7s %-8s %-6s %12s %8s  %s\n' "$model" "$name" "$config" "$expected" "$got" "$states" "$secs" "$note"
  if [[ "$got" != "$expected" ]]; then
    status=1
    if [[ "$got" != fail && "$got" != pass ]]; then
      sed -n '1,40p' "$out" >&2
    fi
  fi
done
total=$(awk -v a="$t_all" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
if [[ $status -eq 0 ]]; then
  echo "ok: correct models have no error in every configuration; every mutant caught (${total}s with compiles)"
else
  echo "FAILED: some variant did not come out as expected (${total}s with compiles)" >&2
fi
exit $status
