#!/usr/bin/env bash
# The installed package works out of tree: install ActorPS into a fresh prefix, build
# examples/ as a project of its own with find_package(ActorPS), run hello_kv.
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The package names its dependencies, never a path on the machine that built it.
if grep -n "librocksdb" "$work"/prefix/lib*/cmake/ActorPS/ActorPSTargets*.cmake; then
  echo "the installed targets name RocksDB by this machine's path"; exit 1
fi
# Only the public API's headers are installed: <actorps/actorps.hpp> and what it includes.
installed=$(cd "$work/prefix/include/actorps" && find . -name '*.hpp' | sed 's#^\./##' | grep -v '^actorps\.hpp$' | sort)
public=$("$source/tools/public_headers.sh" --list | grep -v '^include/' | grep -v '^{' | sort)
if [ "$installed" != "$public" ]; then
  echo "installed headers differ from what actorps.hpp includes (CMakeLists.txt's PS_PUBLIC_HEADERS):"
  diff <(echo "$installed") <(echo "$public") || true
  exit 1
fi
cmake -S "$source/examples" -B "$work/hello" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/hello" -j2 >/dev/null
"$work/hello/hello_kv" --servers=2 --workers=3
"$work/hello/logistic_regression" --workers=3  # processes: copies of the out-of-tree binary
"$work/hello/custom_rule" --cluster=embedded  # the rule registered out of tree, on the shards
"$work/hello/custom_stage" --cluster=embedded
"$work/hello/sparse_rows" --cluster=embedded
"$work/hello/fault_drill"
echo "the examples built against the installed package, each passing its check: PASS"
