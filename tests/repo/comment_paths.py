#!/usr/bin/env python3
"""Every path a comment names exists.

Reads the comments of weft's sources (include/, examples/, tests/, benchmarks/, cmake/, scripts/,
tools/: // and # lines) and the docs, finds the words that look like a path of the repository
(a folder and a file name with one of the sources' extensions), and fails listing each one that
names nothing: resolved from the repository's root, from include/weft/ (headers name each other
that way), from include/, tests/ and examples/, from comm/ and device/cuda/ (docs name their
files so), and from the commenting file's own folder. Placeholders (DIR/..., models/name/...) are
not paths.

    comment_paths.py [ROOT]      exit 0: all exist; 1: the missing ones, file:line each
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCES = (".hpp", ".cuh", ".cpp", ".cu", ".h", ".cmake", ".py", ".sh")
DIRS = ("include", "examples", "tests", "benchmarks", "cmake", "scripts", "tools", "docs")
EXT = r"(?:hpp|cuh|cpp|cu|h|cmake|py|sh|md|json|jsonl|txt|toml|yml|yaml)"
# A path: segments of word characters, dots and dashes, at least one slash, ending in a known
# extension; not part of a URL, a larger word or an #include (the compiler checks those).
PATH = re.compile(r"(?<![\w/.:<-])((?:\.\./)*(?:[\w.-]+/)+[\w.-]+\." + EXT + r")(?![\w/])")
GENERATED = {"weft_units.hpp", "weft_trainer.hpp", "weft_families.hpp", "weft_host_gemm.cpp"}


def comments(path):
    """(line number, text) of each comment line (or every line of a Markdown file)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    md = path.endswith(".md")
    hash_comments = path.endswith((".py", ".sh", ".cmake")) or os.path.basename(path) in ("CMakeLists.txt",) \
        or (not os.path.splitext(path)[1] and lines and lines[0].startswith("#!"))
    for n, line in enumerate(lines, 1):
        if md:
            yield n, line
        elif hash_comments:
            at = line.find("#")
            if at >= 0:
                yield n, line[at:]
        else:
            at = line.find("//")
            if at >= 0 and "#include" not in line[:at]:
                yield n, line[at:]


def exists(name, path):
    if os.path.basename(name) in GENERATED:
        return True
    here = os.path.dirname(path)
    for base in (ROOT, os.path.join(ROOT, "include", "weft"), os.path.join(ROOT, "include"), here,
                 os.path.join(ROOT, ".."), os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests"),
                 os.path.join(ROOT, "include", "weft", "comm"), os.path.join(ROOT, "include", "weft", "device", "cuda")):
        if os.path.exists(os.path.normpath(os.path.join(base, name))):
            return True
    return False


def files():
    for top in ("CMakeLists.txt", "README.md"):
        yield os.path.join(ROOT, top)
    for d in DIRS:
        for dirpath, dirnames, names in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = [x for x in dirnames if x not in ("corpus", "fixtures", "__pycache__")]
            for name in sorted(names):
                p = os.path.join(dirpath, name)
                if name.endswith(SOURCES + (".md",)) or name == "CMakeLists.txt" or \
                        (d == "scripts" and "." not in name):
                    yield p


def main():
    missing = []
    checked = 0
    for path in files():
        if not os.path.isfile(path):
            continue
        for n, text in comments(path):
            for m in PATH.finditer(text):
                name = m.group(1)
                if "://" in text[max(0, m.start() - 12):m.start() + 3] or name.startswith(("build/", "/")):
                    continue
                if re.search(r"[<>*{}$]", name) or re.search(r"(^|/)([A-Z]+|name)/", name):
                    continue  # a placeholder
                checked += 1
                if not exists(name, path):
                    missing.append(f"{os.path.relpath(path, ROOT)}:{n}: names {name}, which does not exist")
    print(f"comment_paths: {checked} paths named in comments and docs, {len(missing)} missing")
    for m in missing:
        print("  " + m)
    return 1 if missing or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
