#!/usr/bin/env bash
# ThreadSanitizer run of the actor and multi-process tests (not part of ./run test: it
# builds CAF and the project again, ~15 minutes on 2 cores).
#
# Debian's CAF libraries are not instrumented, so TSan would see CAF's own synchronization
# as races. This script builds CAF 0.17.6 from Debian's source package with
# -fsanitize=thread into a side prefix (build-tsan/caf), builds ActorPS against it with
# -fsanitize=thread (build-tsan/ps) and runs the actor tests and the multi-process tests.
# Usage: tools/tsan.sh [ctest -R regex]   (default: the actor and cluster tests)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/build-tsan
mkdir -p "$out"
tests=${1:-'^(actors|cluster|hello_kv)$'}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo

# 1. CAF's source, from Debian's source package (deb-src of the machine's own suites, in a
#    side list so the system's apt configuration stays as it is).
if [ ! -f "$out/caf/lib/libcaf_core.so" ]; then
  $sudo apt-get install -y -qq dpkg-dev cmake g++ libssl-dev >/dev/null
  lists=$out/apt
  mkdir -p "$lists/lists/partial"
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$lists/src.sources"
  apt_opts=(-o "Dir::Etc::SourceParts=$lists" -o "Dir::Etc::SourceList=/dev/null" -o "Dir::State::Lists=$lists/lists")
  apt-get "${apt_opts[@]}" update -qq
  rm -rf "$out/src" && mkdir -p "$out/src"
  # The package's upstream tarball always; Debian's patch set when the mirror has it (some
  # mirrors lack the .debian.tar.xz: then the upstream source of the same version is built).
  (cd "$out/src" && apt-get "${apt_opts[@]}" source -qq --download-only actor-framework=0.17.6-2.1 >/dev/null 2>&1) ||
    echo "tsan: Debian's patch set for actor-framework 0.17.6-2.1 could not be fetched; building its upstream tarball" >&2
  if [ -f "$out"/src/actor-framework_0.17.6-2.1.debian.tar.xz ]; then
    (cd "$out/src" && dpkg-source -x actor-framework_0.17.6-2.1.dsc >/dev/null)
  else
    tar -xzf "$out"/src/actor-framework_0.17.6.orig.tar.gz -C "$out/src"
  fi
  src=$(ls -d "$out"/src/actor-framework-0.17.6*/ | head -1)
  # -include limits: what Debian's patch set adds for g++ 12 (receive_buffer.hpp lacks it
  # upstream); harmless when the patches are applied.
  cmake -S "$src" -B "$out/caf-build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$out/caf" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -include limits" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
    -DCAF_NO_EXAMPLES=ON -DCAF_NO_UNIT_TESTS=ON -DCAF_NO_TOOLS=ON -DCAF_NO_OPENSSL=ON -DCAF_NO_PYTHON=ON \
    -DCAF_NO_OPENCL=ON -DCAF_LOG_LEVEL=QUIET >/dev/null
  cmake --build "$out/caf-build" -j"$(nproc)" >/dev/null
  cmake --install "$out/caf-build" >/dev/null
fi

# 2. ActorPS against it, instrumented.
cmake -S "$root" -B "$out/ps" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_WITH_CUDA=OFF -DPS_JEMALLOC=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DCAF_INCLUDE_DIR="$out/caf/include" -DCAF_CORE_LIBRARY="$out/caf/lib/libcaf_core.so" \
  -DCAF_IO_LIBRARY="$out/caf/lib/libcaf_io.so" >/dev/null
cmake --build "$out/ps" -j"$(nproc)" >/dev/null

# 3. The tests. Every report fails the test (halt_on_error); the log keeps them all.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 log_path=$out/tsan"
# libgomp is not instrumented either: TSan cannot see an OpenMP team's fork and join and
# reports the kernels' loop variables as races (seen: thrust's counting_iterator in
# kernels::add). The kernels run one OpenMP thread here; everything else runs as usual.
export OMP_NUM_THREADS=1
export LD_LIBRARY_PATH="$out/caf/lib"
rm -f "$out"/tsan.*
status=0
(cd "$out/ps" && ctest -R "$tests" --output-on-failure --timeout 1200) || status=$?
reports=$(cat "$out"/tsan.* 2>/dev/null | grep -c "WARNING: ThreadSanitizer" || true)
echo "tsan: $reports report(s); logs: $out/tsan.*"
exit $status
