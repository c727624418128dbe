"""A snapshot of a directory tree, to check that a refused run touched nothing."""

import os
from pathlib import Path


def tree(root):
    """Every entry under ``root`` (hidden ones too) with its bytes, or its link target."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(root))] = p.read_bytes()
        else:
            out[str(p.relative_to(root))] = "dir"
    return out
