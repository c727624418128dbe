"""The command line: ``tokpack demo`` and error reporting."""

import subprocess
import sys

from tokpack.cli import main


def test_demo_prints_a_row_per_strategy(capsys):
    assert main(["demo", "--samples", "2000", "--max-len", "2048"]) == 0
    out = capsys.readouterr().out
    for strategy in ("bfd", "ffd", "next_fit", "padding", "random"):
        assert f"| {strategy} " in out
    assert "lower bound" in out


def test_entry_point_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "tokpack", "demo", "--samples", "500"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "efficiency" in proc.stdout


def test_config_errors_exit_non_zero_without_traceback(capsys):
    assert main(["demo", "--samples", "100", "--max-len", "0"]) == 2
    err = capsys.readouterr().err
    assert "max_len must be at least 1" in err and "Traceback" not in err
