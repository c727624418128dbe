"""Every ```python, ```bash and ```console block of README.md and docs/ runs, so a renamed
argument or option fails here instead of in a reader's hands.

Each page runs in a fresh directory of its own, in a child process, block by block in page
order: Python blocks share one namespace (as a reader pasting them into one session), shell
blocks run with `bash -euo pipefail`, `tokpack` being this checkout's CLI. The directory holds
small generated inputs the pages name: `data/` (SFT-like token shards), `tok/` (a tiny chat
tokenizer), `chats.jsonl`, `prefs.jsonl`, `kto.jsonl` and `weighted/` (token shards with
`source` and `weight` columns). A page may need more Python names (a model): PAGE_SETUP.

A block preceded by `<!-- skip: REASON -->` does not run; those are counted and kept rare."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)```(python|bash|console)\s*$")
SKIP = re.compile(r"^\s*<!-- skip: (.+?) -->\s*$")
MAX_SKIPPED = 6

# A causal LM small enough to run a step on CPU in a blink (random weights).
TINY_LLAMA = """
from transformers import LlamaConfig, LlamaForCausalLM

def _tiny_llama(vocab_size, seed=0):
    import torch
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, use_cache=False,
        attn_implementation="sdpa"))
"""

# The multimodal page's inputs (a Qwen2-VL-style tokenizer in vl/, image and video chats) and what a
# reader brings: the model and its image processor.
VL_SETUP = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from tests._vl_factory import build_vl_tokenizer, image_chats, tiny_qwen2_5_vl, write_jsonl
from tests._vl_factory import image_processor as _image_processor, media_chats
build_vl_tokenizer(Path("vl"))
write_jsonl(Path("image_chats.jsonl"), image_chats(30, Path("imgs"), seed=0))
write_jsonl(Path("video_chats.jsonl"), media_chats(6, Path("media"), seed=0))
image_processor = _image_processor()
model = tiny_qwen2_5_vl(Path("vl"))
"""

# Names a page uses without defining them: what a reader brings (a model), nothing tokpack does.
# The object-storage page's bucket: a local S3 endpoint (moto's server) named by the standard
# environment variables (the page's shell blocks inherit them), holding `tokpack pack data/`.
REMOTE_SETUP = """
import os
from pathlib import Path
from moto.server import ThreadedMotoServer
import pyarrow.fs as _fs
import tokpack
_server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
_server.start()
_host, _port = _server.get_host_and_port()
os.environ.update(AWS_ENDPOINT_URL=f"http://{_host}:{_port}", AWS_ACCESS_KEY_ID="docs",
                  AWS_SECRET_ACCESS_KEY="docs", AWS_DEFAULT_REGION="us-east-1",
                  TOKPACK_CACHE_DIR=str(Path("cache").absolute()))
_s3 = _fs.S3FileSystem(endpoint_override=f"{_host}:{_port}", scheme="http",
                       allow_bucket_creation=True)
_s3.create_dir("my-bucket")
tokpack.pack_files(["data"], "packed", 4096, row_group_rows=64)
for _p in sorted(Path("packed").rglob("*")):
    if _p.is_file():
        with _s3.open_output_stream(f"my-bucket/{_p.as_posix()}") as _f:
            _f.write(_p.read_bytes())
"""

PAGE_SETUP = {
    "docs/guide/remote.md": REMOTE_SETUP,
    "docs/guide/multimodal.md": VL_SETUP,
    "docs/guide/preference.md": TINY_LLAMA
    + "model = _tiny_llama(1024)\nref_model = _tiny_llama(1024, seed=1)\n",
    "docs/guide/training.md": TINY_LLAMA + "model = _tiny_llama(1024)\n",
    "docs/guide/coming-from.md": TINY_LLAMA + "model = _tiny_llama(1024)\n",
    "docs/guide/trees.md": TINY_LLAMA + "model = _tiny_llama(1024)\n",
}


class Block(NamedTuple):
    lang: str
    line: int  # 1-based line of the first line of code
    source: str
    skip: Optional[str]


def blocks(page: Path) -> List[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        previous = next((s for s in reversed(lines[:i]) if s.strip()), "")
        skip = SKIP.match(previous)
        source = textwrap.dedent("\n".join(lines[i + 1 : j]))
        found.append(Block(m.group(2), i + 2, source, skip.group(1) if skip else None))
        i = j + 1
    return found


def shell_commands(block: Block) -> str:
    """A console block's commands are its `$ ` lines; the rest is output."""
    if block.lang != "console":
        return block.source
    return "\n".join(s[2:] for s in block.source.splitlines() if s.startswith("$ "))


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


RUNNER = r"""
import json, os, subprocess, sys
page, blocks, setup = json.load(open(sys.argv[1]))
shell = 'tokpack() { "$TOKPACK_PYTHON" -m tokpack "$@"; }\n'
namespace = {"__name__": "__main__"}
exec(compile(setup, page + " (setup)", "exec"), namespace)
for lang, line, source in blocks:
    print(f"== {page}:{line} ({lang})", flush=True)
    if lang == "python":
        exec(compile("\n" * (line - 1) + source, page, "exec"), namespace)
    else:
        subprocess.run(["bash", "-euo", "pipefail", "-c", shell + source], check=True)
"""


@pytest.fixture(scope="session")
def inputs(tmp_path_factory):
    """The files the pages name, made once and copied into each page's directory."""
    from tokpack.synthetic import write_token_shards

    from ._tokenizer_factory import build_tokenizer, sentence

    base = tmp_path_factory.mktemp("doc-inputs")
    write_token_shards(
        base / "data", 1500, n_files=2, max_length=4096, vocab_size=1000, row_group_rows=256
    )
    build_tokenizer(base / "tok", vocab_size=1024)
    rng = random.Random(0)

    def write_jsonl(name, records):
        with open(base / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    write_jsonl(
        "chats.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": sentence(rng, rng.randint(3, 40))},
                    {"role": "assistant", "content": sentence(rng, rng.randint(3, 80))},
                ]
            }
            for _ in range(200)
        ],
    )
    write_jsonl(
        "prefs.jsonl",
        [
            {
                "prompt": sentence(rng, rng.randint(3, 30)),
                "chosen": sentence(rng, rng.randint(3, 40)),
                "rejected": sentence(rng, rng.randint(3, 40)),
            }
            for _ in range(100)
        ],
    )
    write_jsonl(
        "kto.jsonl",
        [
            {
                "prompt": sentence(rng, rng.randint(3, 30)),
                "completion": sentence(rng, rng.randint(3, 40)),
                "label": rng.random() < 0.5,
            }
            for _ in range(100)
        ],
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(base / "data")
    n = table.num_rows
    (base / "weighted").mkdir()
    pq.write_table(
        table.append_column(
            "source", pa.array([("web", "code")[i % 2] for i in range(n)])
        ).append_column("weight", pa.array([1.0 + (i % 3) for i in range(n)])),
        base / "weighted" / "part.parquet",
    )
    return base


def test_pages_have_runnable_snippets():
    found = {page_id(p): blocks(p) for p in PAGES}
    skipped = [(page, b.line, b.skip) for page, bs in found.items() for b in bs if b.skip]
    total = sum(len(bs) for bs in found.values())
    assert total > 40, f"only {total} snippets found: is the fence pattern still right?"
    assert len(skipped) <= MAX_SKIPPED, f"too many skipped snippets: {skipped}"
    print(f"{total} snippets, {len(skipped)} skipped: {skipped}")


def test_readme_gives_the_two_commands_first():
    first = blocks(ROOT / "README.md")[0]
    lines = first.source.splitlines()
    assert lines[0].split("#")[0].strip().endswith("tokpack demo")
    assert lines[1].rstrip().endswith("# run the tests")


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "README.md links to no page"
    assert [link for link in local if not (ROOT / link).exists()] == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_snippets_run(page, inputs, tmp_path):
    todo = [b for b in blocks(page) if not b.skip]
    if not todo:
        pytest.skip("no snippet to run")
    work = tmp_path / "work"
    shutil.copytree(inputs, work)
    spec = tmp_path / "blocks.json"
    spec.write_text(
        json.dumps(
            [
                page_id(page),
                [(b.lang, b.line, shell_commands(b)) for b in todo],
                PAGE_SETUP.get(page_id(page), ""),
            ]
        )
    )
    pythonpath = [str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]
    env = dict(
        os.environ,
        TOKPACK_PYTHON=sys.executable,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(filter(None, pythonpath)),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        MPLBACKEND="Agg",
    )
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(spec)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail((proc.stdout + proc.stderr)[-6000:], pytrace=False)
