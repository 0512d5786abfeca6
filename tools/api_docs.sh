#!/usr/bin/env bash
# The API reference from the public headers (docs/Doxyfile): HTML in OUT/html, and a
# failure when Doxygen warns about anything (the warnings are printed).
# Usage: tools/api_docs.sh OUT
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
command -v doxygen >/dev/null || { echo "api_docs: doxygen is not installed (apt-get install doxygen)"; exit 1; }
headers=$("$root/tools/public_headers.sh" --list | grep -v '^{' | sed "s#^#$root/#" | tr '\n' ' ')
rm -f "$out/warnings.txt"
(cd "$root" && PS_DOC_INPUT="$headers" PS_DOC_OUT="$out" PS_DOC_ROOT="$root" doxygen docs/Doxyfile)
if [ -s "$out/warnings.txt" ]; then
  echo "api_docs: Doxygen warned ($(wc -l < "$out/warnings.txt") lines):"
  cat "$out/warnings.txt"
  exit 1
fi
echo "api_docs: $(echo "$headers" | wc -w) headers, $(find "$out/html" -name '*.html' | wc -l) pages in $out/html, no warning"
