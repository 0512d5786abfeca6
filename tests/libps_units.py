#!/usr/bin/python3
"""No loop among libps's units: unit X (X.hpp and X.cpp, named by their path under libps/,
e.g. core/shard_core) depends on unit Y when either file includes "libps/Y.hpp". Exits 1
naming each loop, so a new include that closes one fails the suite.  usage: libps_units.py LIBPS_DIR"""
import os
import re
import sys


def dependencies(root):
    deps = {}
    names = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, files in os.walk(root) for n in files)
    for name in names:
        unit, ext = os.path.splitext(name)
        if ext not in (".hpp", ".cpp"):
            continue
        found = deps.setdefault(unit, set())
        with open(os.path.join(root, name), encoding="utf-8") as f:
            for line in f:
                m = re.match(r'\s*#\s*include\s+"libps/([\w/]+)\.hpp"', line)
                if m and m.group(1) != unit:
                    found.add(m.group(1))
    return deps


def loops(deps):
    """Strongly connected components of more than one unit (Tarjan's, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(deps):
        if start in index:
            continue
        work = [(start, iter(sorted(deps.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(deps.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: libps_units.py LIBPS_DIR")
    deps = dependencies(sys.argv[1])
    found = loops(deps)
    for component in found:
        edges = [f"{a} -> {b}" for a in component for b in sorted(deps[a]) if b in component]
        print("libps units in a loop: " + ", ".join(component) + " (" + "; ".join(edges) + ")")
    if found:
        sys.exit(1)
    print(f"libps: {len(deps)} units, no loop among them")


if __name__ == "__main__":
    main()
