"""The core installs light: `import tokpack` and everything but `tokpack.torch` work without
torch (and without tokenizers / jinja2 until tokenizing is asked for)."""

import subprocess
import sys
import textwrap


def run_blocked(code: str, blocked=("torch", "tokenizers", "jinja2", "transformers")):
    script = "import sys\n"
    script += "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    script += textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)


def test_core_works_without_torch_or_tokenizers():
    proc = run_blocked(
        """
        import tokpack
        assert tokpack.plan([3, 5, 2], 8).n_bins == 2
        assert tokpack.pack_sequences([[1, 2], [3]], max_length=4).tolist() == [[1, 2, 3, 0]]
        assert tokpack.pack_tokens([[1, 2], [3]], 4).num_rows == 1
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_torch_parts_say_what_is_missing():
    proc = run_blocked(
        """
        import tokpack
        try:
            tokpack.PackedDataset
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("no ImportError")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "torch" in proc.stdout


def test_tree_part_says_what_is_missing():
    proc = run_blocked(
        """
        try:
            import tokpack.tree
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("no ImportError")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "tokpack.tree needs PyTorch" in proc.stdout


def test_ray_part_says_what_is_missing():
    proc = run_blocked(
        """
        import tokpack
        try:
            import tokpack.ray
        except ImportError as exc:
            assert "tokpack[ray]" in str(exc), exc
        else:
            raise SystemExit("no ImportError")
        """,
        blocked=("ray",),
    )
    assert proc.returncode == 0, proc.stderr
