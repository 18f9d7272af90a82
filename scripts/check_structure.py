#!/usr/bin/env python3
"""Checks the code-structure rules of docs/structure.md (scripts/test.sh runs it first).

- Size: no source file (.cc, .h, .py, .sh) under src/, python/, tests/, scripts/, examples/
  over 600 lines, and no C++ function in src/ (not in a test) over 80 lines; the function
  extents come from Universal Ctags (start and end line of each definition).
- Exceptions: only those in the table "Allowed over the limits" of docs/structure.md, each
  with the most lines it may have and its reason. An entry that is no longer needed (the
  file or function is within the limit) is an error too, so the list only shrinks.
- Modules: each folder src/tenplex/<module> is one module. Its edges (the tenplex libraries
  its CMakeLists.txt links, DEPS of tenplex_module/tenplex_library and
  target_link_libraries, and the `#include "tenplex/<other>/..."` lines of its non-test
  sources) must be in the "Module map" table of docs/structure.md ("May depend on"); no
  module may reach, directly or through others, one its row says it must never import.
  Test-only links (TEST_DEPS, *_test.cc, *testing.h) are not edges.

  check_structure.py            run every check; exit status 1 and one line per violation
  check_structure.py --counts   print the counts (files, functions, sys.path inserts)
                                without the allow-list, for docs/structure.md's before/after
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("check_structure")

FILE_LIMIT = 600
FUNCTION_LIMIT = 80
SIZE_ROOTS = ("src", "python", "tests", "scripts", "examples")
SOURCE_SUFFIXES = (".cc", ".h", ".py", ".sh")
DOC = "docs/structure.md"
ALLOW_HEADING = "## Allowed over the limits"
MAP_HEADING = "## Module map"
MODULES_DIR = "src/tenplex"


@dataclasses.dataclass(frozen=True)
class Item:
    """A file (function "") or a C++ function of a file, with its length in lines."""

    path: str
    function: str
    lines: int

    def describe(self) -> str:
        what = f"{self.path} {self.function}()" if self.function else self.path
        limit = FUNCTION_LIMIT if self.function else FILE_LIMIT
        return f"{what}: {self.lines} lines (limit {limit})"


@dataclasses.dataclass(frozen=True)
class MapRow:
    """One row of the module map: the modules it may depend on and those it must never reach."""

    allowed: frozenset[str]
    never: frozenset[str]  # "*": every module not in `allowed`


def git_files(root: Path, *pathspecs: str) -> list[str]:
    """Tracked files under the given pathspecs that exist in the working tree."""
    out = subprocess.run(["git", "ls-files", "--", *pathspecs], cwd=root, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if (root / f).is_file()]


def table_rows(doc: str, heading: str) -> list[list[str]]:
    """The cells of the Markdown table in the section `heading` (header and rule skipped)."""
    lines = doc.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        raise SystemExit(f"{DOC}: no section '{heading}'") from None
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue
        rows.append(cells)
    return rows[1:]  # the header


def ticked(cell: str) -> list[str]:
    """The `backticked` names of a table cell."""
    return re.findall(r"`([^`]+)`", cell)


# --- sizes --------------------------------------------------------------------------------


def long_files(root: Path) -> list[Item]:
    """Source files over FILE_LIMIT lines."""
    items = []
    for f in git_files(root, *SIZE_ROOTS):
        if f.endswith(SOURCE_SUFFIXES):
            with open(root / f, "rb") as fh:
                n = sum(1 for _ in fh)
            if n > FILE_LIMIT:
                items.append(Item(f, "", n))
    return items


def is_test_source(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith("_test.cc") or name.endswith("testing.h")


def long_functions(root: Path) -> list[Item]:
    """C++ function definitions in src/ (tests excluded) over FUNCTION_LIMIT lines."""
    ctags = shutil.which("ctags-universal") or shutil.which("ctags")
    if ctags is None:
        raise SystemExit("ctags (Universal Ctags) is not installed: scripts/install-deps.sh installs universal-ctags")
    version = subprocess.run([ctags, "--version"], capture_output=True, text=True).stdout
    if "Universal Ctags" not in version:
        raise SystemExit(f"{ctags} is not Universal Ctags (it has no end lines): install universal-ctags")
    files = [f for f in git_files(root, "src") if f.endswith((".cc", ".h")) and not is_test_source(f)]
    cmd = [ctags, "--languages=C++", "--kinds-C++=f", "--fields=+ne", "-x", "--_xformat=%N\t%F\t%n\t%e", *files]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{ctags} failed: {out.stderr.strip()}")
    items = []
    for line in out.stdout.splitlines():
        name, path, start, end = line.split("\t")
        if not end:
            log.warning("ctags gave no end line for %s in %s:%s; not checked", name, path, start)
            continue
        n = int(end) - int(start) + 1
        if n > FUNCTION_LIMIT:
            items.append(Item(path, name, n))
    return items


def read_allow_list(doc: str) -> dict[tuple[str, str], int]:
    """(path, function or "") -> the most lines the entry allows."""
    allowed: dict[tuple[str, str], int] = {}
    for cells in table_rows(doc, ALLOW_HEADING):
        if len(cells) != 4 or not ticked(cells[0]) or not cells[2].isdigit() or not cells[3]:
            raise SystemExit(f"{DOC}: an allow-list row needs `path` | `function` or blank | lines | reason: {cells}")
        function = ticked(cells[1])
        allowed[(ticked(cells[0])[0], function[0] if function else "")] = int(cells[2])
    return allowed


def check_sizes(root: Path, doc: str) -> list[str]:
    """Violations of the size limits, and allow-list entries that are stale or outgrown."""
    allowed = read_allow_list(doc)
    errors = []
    found: dict[tuple[str, str], int] = {}
    for item in long_files(root) + long_functions(root):
        key = (item.path, item.function)
        found[key] = max(found.get(key, 0), item.lines)
    for key, n in sorted(found.items()):
        item = Item(key[0], key[1], n)
        if key not in allowed:
            errors.append(f"{item.describe()}: split it (or, with a reason, add it to {DOC}'s allow-list)")
        elif n > allowed[key]:
            errors.append(f"{item.describe()}: grew past the {allowed[key]} lines {DOC} allows it")
    for key in sorted(set(allowed) - set(found)):
        what = f"{key[0]} {key[1]}()" if key[1] else key[0]
        errors.append(f"{what} is within the limit now: remove its row from {DOC}'s allow-list")
    return errors


# --- modules ------------------------------------------------------------------------------


def cmake_calls(text: str, command: str) -> list[list[str]]:
    """The arguments of every call of a CMake command (comments dropped)."""
    text = re.sub(r"#[^\n]*", "", text)
    calls = []
    for m in re.finditer(rf"\b{command}\s*\(([^)]*)\)", text):
        calls.append(m.group(1).split())
    return calls


def module_targets(root: Path, modules: list[str]) -> dict[str, str]:
    """Target name -> module, for the libraries and executables each module's CMakeLists defines."""
    owner: dict[str, str] = {}
    for mod in modules:
        text = (root / MODULES_DIR / mod / "CMakeLists.txt").read_text()
        for args in cmake_calls(text, "tenplex_module"):
            owner[f"tenplex_{args[0]}"] = mod
            owner[f"tenplex_{args[0]}_test"] = mod
        for command in ("tenplex_library", "add_executable", "add_library"):
            for args in cmake_calls(text, command):
                owner[args[0]] = mod
    return owner


def link_edges(root: Path, modules: list[str], owner: dict[str, str]) -> set[tuple[str, str]]:
    """(module, module) for each tenplex library a module's non-test target links."""
    edges = set()
    keywords = {"DEPS", "TEST_DEPS", "EXCLUDE", "SOURCES", "PUBLIC", "PRIVATE", "INTERFACE"}
    for mod in modules:
        text = (root / MODULES_DIR / mod / "CMakeLists.txt").read_text()
        deps: list[str] = []
        for command in ("tenplex_module", "tenplex_library"):
            for args in cmake_calls(text, command):
                section = ""
                for a in args[1:]:
                    section = a if a in keywords else section
                    if section == "DEPS" and a != "DEPS":
                        deps.append(a)
        for args in cmake_calls(text, "target_link_libraries"):
            if not args[0].endswith("_test"):
                deps += [a for a in args[1:] if a not in keywords]
        for dep in deps:
            if dep.startswith("tenplex_"):
                if dep not in owner:
                    raise SystemExit(f"{MODULES_DIR}/{mod}/CMakeLists.txt links {dep}, which no module defines")
                if owner[dep] != mod:
                    edges.add((mod, owner[dep]))
    return edges


def include_edges(root: Path, modules: list[str]) -> set[tuple[str, str]]:
    """(module, module) for each `#include "tenplex/<other>/..."` of a module's non-test sources."""
    edges = set()
    pattern = re.compile(r'^\s*#\s*include\s+"tenplex/([a-z_0-9]+)/', re.MULTILINE)
    for f in git_files(root, MODULES_DIR):
        parts = f.split("/")
        if len(parts) < 4 or not f.endswith((".cc", ".h")) or is_test_source(f) or parts[2] not in modules:
            continue
        for other in pattern.findall((root / f).read_text(errors="replace")):
            if other != parts[2]:
                edges.add((parts[2], other))
    return edges


def read_module_map(doc: str) -> dict[str, MapRow]:
    rows: dict[str, MapRow] = {}
    for cells in table_rows(doc, MAP_HEADING):
        if len(cells) != 4 or len(ticked(cells[0])) != 1:
            raise SystemExit(f"{DOC}: a module-map row needs `module` | job | `may`, ... | `never`, ...: {cells}")
        rows[ticked(cells[0])[0]] = MapRow(frozenset(ticked(cells[2])), frozenset(ticked(cells[3])))
    return rows


def reach(edges: set[tuple[str, str]] | dict[str, frozenset[str]], start: str) -> set[str]:
    """The modules reachable from `start` (not itself unless on a cycle)."""
    succ: dict[str, set[str]] = {}
    items = edges.items() if isinstance(edges, dict) else ((a, {b}) for a, b in edges)
    for a, bs in items:
        succ.setdefault(a, set()).update(bs)
    seen: set[str] = set()
    todo = list(succ.get(start, ()))
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += succ.get(m, ())
    return seen


def check_map_itself(rows: dict[str, MapRow], modules: list[str]) -> list[str]:
    """The map names every module folder and no other, is acyclic, and never contradicts itself."""
    errors = [f"module {m} ({MODULES_DIR}/{m}) has no row in {DOC}'s module map" for m in modules if m not in rows]
    errors += [f"{DOC}'s module map has a row for {m}, which is not a module folder" for m in rows if m not in modules]
    allowed = {m: r.allowed for m, r in rows.items()}
    for m, r in sorted(rows.items()):
        errors += [f"module map: {m} may depend on {d}, which is not a module" for d in sorted(r.allowed - set(rows))]
        errors += [
            f"module map: {m} never imports {d}, which is not a module" for d in sorted(r.never - set(rows) - {"*"})
        ]
        closure = reach(allowed, m)
        if m in closure:
            errors.append(f"module map: {m} may reach itself (a cycle)")
        never = set(rows) - r.allowed - {m} if "*" in r.never else r.never
        errors += [
            f"module map: {m} may reach {d}, which its row says it never imports" for d in sorted(never & closure)
        ]
    return errors


def check_modules(root: Path, doc: str) -> list[str]:
    """The build's module edges against the module map."""
    modules = sorted(p.parent.name for p in (root / MODULES_DIR).glob("*/CMakeLists.txt"))
    rows = read_module_map(doc)
    errors = check_map_itself(rows, modules)
    owner = module_targets(root, modules)
    links, includes = link_edges(root, modules, owner), include_edges(root, modules)
    for a, b in sorted(links | includes):
        if a in rows and b not in rows[a].allowed:
            how = " and ".join(k for k, e in (("links", links), ("includes", includes)) if (a, b) in e)
            errors.append(f"{a} {how} {b}: not an edge of {DOC}'s module map (May depend on)")
    for m in modules:
        if m in rows:
            r = rows[m]
            never = set(rows) - r.allowed - {m} if "*" in r.never else r.never
            errors += [
                f"{m} reaches {d} through the build, which it must never import"
                for d in sorted(never & reach(links | includes, m))
            ]
    log.info(
        "modules: %d folders, %d edges (links %d, includes %d)",
        len(modules),
        len(links | includes),
        len(links),
        len(includes),
    )
    return errors


# --- main ---------------------------------------------------------------------------------


def print_counts(root: Path) -> None:
    files, functions = long_files(root), long_functions(root)
    grep = ["git", "grep", "-c", "-e", r"sys\.path\.insert(", "--", "*.py"]
    out = subprocess.run(grep, cwd=root, capture_output=True, text=True)
    inserts = sum(int(line.rsplit(":", 1)[1]) for line in out.stdout.splitlines())
    print(f"files over {FILE_LIMIT} lines: {len(files)}")
    for item in sorted(files, key=lambda i: -i.lines):
        print(f"  {item.describe()}")
    print(f"C++ functions over {FUNCTION_LIMIT} lines: {len(functions)}")
    for item in sorted(functions, key=lambda i: -i.lines):
        print(f"  {item.describe()}")
    print(f"sys.path.insert calls in Python files: {inserts}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the checkout")
    ap.add_argument("--counts", action="store_true", help="print the counts, ignoring the allow-list")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="check_structure: %(message)s")
    if args.counts:
        print_counts(args.root)
        return 0
    doc = (args.root / DOC).read_text()
    errors = check_sizes(args.root, doc) + check_modules(args.root, doc)
    for e in errors:
        log.error("%s", e)
    if errors:
        log.error("%d structure violation(s); the rules and the allow-list: %s", len(errors), DOC)
        return 1
    log.info("sizes and module map as %s says", DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
