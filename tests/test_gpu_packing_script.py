"""``benches/gpu_packing.py``: skips cleanly without CUDA, and its CPU-capable parts (the
check_packing matrix, the cost line, the training layouts) run with ``--device cpu --tiny``."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parent.parent / "benches" / "gpu_packing.py"


def run(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script runs")
def test_skips_cleanly_without_cuda():
    done = run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpu_packing: no CUDA device here; skipped (--device cpu --tiny runs the CPU parts)"
    ]


def test_cpu_parts_run_tiny():
    done = run("--device", "cpu", "--tiny", "--families", "llama,mamba2")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^check llama / sdpa / hf +exact +\d+ ms$", out, re.M)
    assert re.search(r"^check mamba2 / \w+ / hf +MIXES at layer 0 \(linear_attention\)", out, re.M)
    assert re.search(r"^cost +check_packing on the training model .* one forward of 300", out, re.M)
    losses = re.findall(r"^train (\S+) .*tokens/s, [\d.]+x padded, mean loss ([\d.]+)", out, re.M)
    assert [name for name, _ in losses] == ["padded", "recipe", "per-row"]
    # The same samples in every layout: the same mean loss.
    assert len({loss for _, loss in losses}) == 1


def test_unknown_family_is_a_usage_error():
    done = run("--device", "cpu", "--families", "llama,nope")
    assert done.returncode == 2 and "unknown families ['nope']" in done.stderr
