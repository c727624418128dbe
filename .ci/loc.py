"""Code lines of the package at git commits: Python under ``python/tokpack`` (stubs included) and
Rust under ``rust/``, without blank, comment and docstring lines, Rust ``#[cfg(test)] mod
tests`` blocks and ``rust/*/tests/`` (tests are not counted). Not run by CI: issue 36's "fewer
lines than before" is measured with it.

    python .ci/loc.py 193a457 HEAD                      # totals at each commit
    python .ci/loc.py 193a457 HEAD --exclude 'tree|cap_repair'
    python .ci/loc.py 193a457 HEAD --files              # per-file change, largest first
    python .ci/loc.py 193a457 HEAD --commits --exclude 'tree|cap_repair'
                                       # each commit's own change (merges left out), in order

``--exclude`` leaves out files whose path matches (features added after the first commit, to
compare the code the two commits share).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import tokenize
from typing import Dict, List, Optional, Set


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def python_lines(src: str) -> int:
    """Lines holding a token other than a comment or a docstring."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
        tree = ast.parse(src)
    except (SyntaxError, tokenize.TokenError):
        return sum(1 for line in src.splitlines() if line.strip())
    docs: Set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: Set[int] = set()
    for t in tokens:
        if t.type not in skip and t.type != tokenize.ENDMARKER:
            lines.update(n for n in range(t.start[0], t.end[0] + 1) if n not in docs)
    return len(lines)


def rust_lines(src: str) -> int:
    """Lines other than blank and ``//`` ones, before a ``#[cfg(test)] mod tests`` block."""
    code = src.split("#[cfg(test)]\nmod tests")[0]
    stripped = (line.strip() for line in code.splitlines())
    return sum(1 for line in stripped if line and not line.startswith("//"))


def counts(
    commit: str, exclude: Optional[str], names: Optional[List[str]] = None
) -> Dict[str, int]:
    """Code lines per counted file at ``commit`` (of ``names`` only, when given)."""
    listed = _git("ls-tree", "-r", "--name-only", commit, "python/tokpack", "rust").split()
    out = {}
    for name in listed if names is None else sorted(set(names) & set(listed)):
        if re.match(r"rust/[^/]+/tests/", name) or (exclude and re.search(exclude, name)):
            continue
        if name.endswith((".py", ".pyi")):
            out[name] = python_lines(_git("show", f"{commit}:{name}"))
        elif name.endswith(".rs"):
            out[name] = rust_lines(_git("show", f"{commit}:{name}"))
    return out


def commit_changes(first: str, last: str, exclude: Optional[str]) -> None:
    """Each non-merge commit of ``first..last``: its own change of the count, and its title."""
    for c in _git("rev-list", "--reverse", "--no-merges", f"{first}..{last}").split():
        changed = _git("diff", "--no-renames", "--name-only", f"{c}^", c).split()
        before, after = counts(f"{c}^", exclude, changed), counts(c, exclude, changed)
        title = _git("log", "-1", "--format=%h %s", c).strip()
        print(f"{sum(after.values()) - sum(before.values()):+6d} {title[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", nargs="+")
    parser.add_argument("--exclude", help="regex of file paths left out")
    parser.add_argument("--files", action="store_true", help="per-file change, first to last")
    parser.add_argument(
        "--commits", dest="each_commit", action="store_true", help="each commit's own change"
    )
    args = parser.parse_args()
    if args.each_commit:
        commit_changes(args.commits[0], args.commits[-1], args.exclude)
        return
    per = {c: counts(c, args.exclude) for c in args.commits}
    for c, files in per.items():
        py = sum(n for f, n in files.items() if not f.endswith(".rs"))
        rs = sum(n for f, n in files.items() if f.endswith(".rs"))
        print(f"{c}: {py + rs} code lines (Python {py}, Rust {rs})")
    if args.files:
        a, b = per[args.commits[0]], per[args.commits[-1]]
        rows = [(b.get(f, 0) - a.get(f, 0), f) for f in sorted(a.keys() | b.keys())]
        for delta, name in sorted(r for r in rows if r[0]):
            print(f"{delta:+6d} {name} ({a.get(name, 0)} -> {b.get(name, 0)})")


if __name__ == "__main__":
    main()
