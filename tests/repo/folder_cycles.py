#!/usr/bin/env python3
"""The folders of include/weft include each other in one direction only.

Reads every `#include "weft/<folder>/..."` line under include/weft, makes a graph of folders (an
edge a -> b where a file in a includes one in b), and fails naming each pair of folders that reach
each other, with the lines that close the loop, unless the pair is listed in KNOWN below with the
reason it is still there (to be emptied, not grown).

    folder_cycles.py [ROOT]      exit 0: no cycle beyond KNOWN; 1: the cycles, or a KNOWN one gone
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
# None: a pair that must stay for a while is listed here with its reason, e.g. {("device", "ops")}.
KNOWN = set()
INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]weft/([\w.-]+)/')


def edges():
    out = defaultdict(list)  # (a, b) -> ["file:line", ...]
    base = os.path.join(ROOT, "include", "weft")
    for dirpath, _, names in os.walk(base):
        rel = os.path.relpath(dirpath, base)
        if rel == ".":
            continue
        top = rel.split(os.sep)[0]
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) != top:
                        out[(top, m.group(1))].append(f"{os.path.relpath(path, ROOT)}:{n}")
    return out


def main():
    e = edges()
    graph = defaultdict(set)
    for a, b in e:
        graph[a].add(b)

    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for y in graph[todo.pop()]:
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return seen

    nodes = sorted(set(graph) | {b for v in graph.values() for b in v})
    r = {n: reach(n) for n in nodes}
    cycles = sorted((a, b) for a in nodes for b in nodes if a < b and b in r[a] and a in r[b])
    print(f"folder_cycles: {len(nodes)} folders, {len(e)} folder edges, {len(cycles)} pairs in a cycle "
          f"({len(KNOWN)} known)")
    status = 0
    for a, b in cycles:
        if (a, b) in KNOWN:
            print(f"  known: {a} <-> {b}")
            continue
        status = 1
        print(f"  {a} <-> {b}: a new cycle")
        for x, y in ((a, b), (b, a)):
            where = e.get((x, y), [])
            print(f"    {x} -> {y}: " + (", ".join(where[:4]) + (" ..." if len(where) > 4 else "") if where
                                         else "through other folders"))
    for a, b in sorted(KNOWN - set(cycles)):
        status = 1
        print(f"  {a} <-> {b} is listed as known but no longer a cycle: take it out of KNOWN")
    return status


if __name__ == "__main__":
    sys.exit(main())
