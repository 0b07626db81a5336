#!/usr/bin/env bash
# Installs llama.cpp for kvwarden's reference checks (internal/llamacpp, run.mjs):
# node-llama-cpp at the version package-lock.json pins, with its prebuilt CPU
# binaries, into tools/llamacpp/node_modules. Needs Node.js >= 20 and npm (Debian:
# apt-get install nodejs npm) and a reachable npm registry; nothing is compiled.
# Running it again changes nothing: an install that loads is kept.
set -euo pipefail
cd "$(dirname "$0")"

fail() { printf 'tools/llamacpp/install.sh: %s\n' "$*" >&2; exit 1; }

command -v node >/dev/null || fail "node is missing: install Node.js >= 20 (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || fail "npm is missing: install it (Debian: apt-get install npm)"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 20 ] || fail "node $(node --version) is too old: node-llama-cpp needs Node.js >= 20"
[ -f package-lock.json ] || fail "package-lock.json is missing from $(pwd): it pins what is installed"

pinned=$(node -p 'require("./package.json").dependencies["node-llama-cpp"]')
# info loads llama.cpp's binaries without a model: the check that matters.
if installed=$(node run.mjs info 2>/dev/null) &&
   [ "$(node -p 'JSON.parse(process.argv[1]).info.node_llama_cpp' "$installed")" = "$pinned" ]; then
  echo "node-llama-cpp $pinned is installed and loads: nothing to do"
  exit 0
fi

# --ignore-scripts: node-llama-cpp's postinstall (which npm < 11 runs by
# default) tries GPU builds first and may download llama.cpp's source and
# compile it when a prebuilt binary does not load; run.mjs loads the
# prebuilt CPU binaries itself (build "never"), so nothing here needs it.
# NODE_LLAMA_CPP_SKIP_DOWNLOAD is node-llama-cpp's own switch for the same.
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --no-audit --no-fund --ignore-scripts ||
  fail "npm ci failed (is the npm registry reachable? npm config get registry: $(npm config get registry))"

node run.mjs info >/dev/null ||
  fail "node-llama-cpp $pinned installed but llama.cpp does not load on this machine (see the error above); its prebuilt binaries cover linux-x64, linux-arm64, macOS and Windows"
echo "node-llama-cpp $pinned installed: $(node run.mjs info)"
