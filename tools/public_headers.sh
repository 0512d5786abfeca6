#!/usr/bin/env bash
# The repository's headers that <actorps/actorps.hpp> pulls in, and their lines: what an
# app author's compiler reads of ActorPS. Usage: tools/public_headers.sh [--list]
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(mktemp --suffix=.cpp)
trap 'rm -f "$src"' EXIT
echo '#include "actorps/actorps.hpp"' > "$src"
g++ -std=c++20 -I. -Iinclude -MM "$src" | tr ' \\' '\n\n' | grep -E '^(actors|libps|runtime|kernels|include)/' | sort -u > "$src.list"
[ "${1:-}" = "--list" ] && cat "$src.list"
echo "{\"headers\":$(wc -l < "$src.list"),\"lines\":$(cat "$src.list" | xargs cat | wc -l)}"
rm -f "$src.list"
