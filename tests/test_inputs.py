"""The one input resolver (files, directories, globs) behind pack, stats, tokenize,
pack --tokenizer and the streaming reader, and the errors it gives."""

import errno
import os

import pytest

import tokpack
from tokpack import _tokpack
from tokpack._io.inputs import RAW_SUFFIXES, TOKEN_SUFFIXES, input_error, resolve_inputs
from tokpack._io.outdir import describe_inputs
from tokpack.cli import main
from tokpack.synthetic import write_token_shards

from ._tokenizer_factory import CHATML_GEN, build_tokenizer, conversations, write_jsonl
from ._tree import tree


def touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def names(paths, root):
    return [str(p.relative_to(root)) for p in paths]


def test_directories_are_recursive_sorted_and_skip_side_files(tmp_path):
    for name in [
        "b.parquet",
        "a/z.arrow",
        "a/B.PARQUET",
        "c.feather",
        "notes.txt",
        "_side.parquet",
        ".hidden.parquet",
        "__tokpack__/_index.arrow",
        ".out.tmp-1-ab/part-00000.parquet",
        "_cache/x.parquet",
    ]:
        touch(tmp_path / name)
    found = resolve_inputs(tmp_path, TOKEN_SUFFIXES)
    assert names(found, tmp_path) == ["a/B.PARQUET", "a/z.arrow", "b.parquet", "c.feather"]
    # Files given by name are taken whatever their suffix; order is the order given.
    given = [tmp_path / "notes.txt", tmp_path / "a"]
    assert names(resolve_inputs(given, TOKEN_SUFFIXES), tmp_path) == [
        "notes.txt",
        "a/B.PARQUET",
        "a/z.arrow",
    ]
    assert names(resolve_inputs(tmp_path, RAW_SUFFIXES), tmp_path) == ["a/B.PARQUET", "b.parquet"]
    with pytest.raises(tokpack.InputNotFoundError, match="no .jsonl / .gz files inside"):
        resolve_inputs(tmp_path, (".jsonl", ".gz"))


def test_globs_and_names_with_glob_characters(tmp_path):
    touch(tmp_path / "d/x1.parquet")
    touch(tmp_path / "d/sub/x2.parquet")
    touch(tmp_path / "d/[literal].parquet")
    found = resolve_inputs(str(tmp_path / "d/**/x*.parquet"), TOKEN_SUFFIXES)
    assert names(found, tmp_path) == ["d/sub/x2.parquet", "d/x1.parquet"]
    literal = resolve_inputs(str(tmp_path / "d/[literal].parquet"), TOKEN_SUFFIXES)
    assert names(literal, tmp_path) == ["d/[literal].parquet"]
    with pytest.raises(tokpack.InputNotFoundError, match="no file matches"):
        resolve_inputs(str(tmp_path / "d/*.arrow"), TOKEN_SUFFIXES)
    with pytest.raises(tokpack.InputNotFoundError, match="no such file"):
        resolve_inputs(tmp_path / "nope.parquet", TOKEN_SUFFIXES)
    with pytest.raises(tokpack.ConfigError, match="empty"):
        resolve_inputs([""], TOKEN_SUFFIXES)


def test_symlinks(tmp_path):
    real = touch(tmp_path / "real/a.parquet")
    d = tmp_path / "d"
    d.mkdir()
    (d / "linked.parquet").symlink_to(real)
    (d / "linked-dir").symlink_to(tmp_path / "real")  # not followed: no loops, no doubles
    assert names(resolve_inputs(d, TOKEN_SUFFIXES), tmp_path) == ["d/linked.parquet"]
    (d / "broken.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(tokpack.InputNotFoundError, match="broken symbolic link"):
        resolve_inputs(d, TOKEN_SUFFIXES)
    loop = tmp_path / "loop.parquet"
    loop.symlink_to(loop)
    with pytest.raises(tokpack.InputNotFoundError, match="symlink loop"):
        resolve_inputs(loop, TOKEN_SUFFIXES)
    with pytest.raises(tokpack.InputNotFoundError, match="symlink loop"):
        describe_inputs([loop])


def test_permission_denied_is_its_own_error(tmp_path, monkeypatch):
    touch(tmp_path / "d/a.parquet")

    def denied(path, *args):
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as m:
        m.setattr(os, "scandir", denied)
        with pytest.raises(tokpack.InputPermissionError, match="permission denied") as info:
            resolve_inputs(tmp_path / "d", TOKEN_SUFFIXES)
    assert isinstance(info.value, PermissionError)
    assert not isinstance(info.value, FileNotFoundError)
    with monkeypatch.context() as m:
        m.setattr("tokpack._io.outdir.fingerprint_file", denied)
        with pytest.raises(tokpack.InputPermissionError):
            describe_inputs([tmp_path / "d/a.parquet"])
    with monkeypatch.context() as m:
        m.setattr(os, "access", lambda *a, **k: False)
        with pytest.raises(tokpack.InputPermissionError, match="a.parquet: permission denied"):
            resolve_inputs(tmp_path / "d/a.parquet", TOKEN_SUFFIXES)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_file_is_a_permission_error(tmp_path):
    f = touch(tmp_path / "a.parquet")
    f.chmod(0)
    try:
        with pytest.raises(tokpack.InputPermissionError):
            resolve_inputs(f, TOKEN_SUFFIXES)
    finally:
        f.chmod(0o644)


def test_an_input_that_cannot_be_read_as_a_file_is_a_read_error(tmp_path):
    """A FIFO or a directory where a file is expected, or an I/O error: InputReadError (an
    OSError), not InputNotFoundError, in the resolver and in the Rust readers."""
    fifo = tmp_path / "a.parquet"
    os.mkfifo(fifo)
    with pytest.raises(tokpack.InputReadError, match="a.parquet: not a regular file") as info:
        resolve_inputs(fifo, TOKEN_SUFFIXES)
    assert isinstance(info.value, OSError) and not isinstance(info.value, FileNotFoundError)
    err = input_error(tmp_path / "b.parquet", OSError(errno.EIO, "Input/output error"))
    assert type(err) is tokpack.InputReadError
    assert str(err).endswith("b.parquet: cannot read (Input/output error)")
    shard_dir = tmp_path / "c.parquet"
    shard_dir.mkdir()
    for read in (
        lambda: _tokpack.read_row_group(path=str(shard_dir), row_group=0, columns=["input_ids"]),
        lambda: _tokpack.file_checksum(str(shard_dir)),
    ):
        with pytest.raises(tokpack.InputReadError, match=r"c.parquet: cannot read \(is a direc"):
            read()


def test_errors_pickle():
    import pickle

    for cls in (tokpack.InputPermissionError, tokpack.InputReadError, tokpack.OutputExistsError):
        err = pickle.loads(pickle.dumps(cls("msg")))
        assert type(err) is cls and str(err) == "msg"


def test_streaming_reader_and_stats_read_nested_directories_and_globs(tmp_path, capsys):
    write_token_shards(tmp_path / "c/a", 30, n_files=1, max_length=40, seed=1)
    write_token_shards(tmp_path / "c/b", 20, n_files=2, max_length=40, seed=2)
    rows = sum(len(b["input_ids"]) for b in tokpack.streaming_dataset_reader(tmp_path / "c", 7))
    assert rows == 50
    pattern = str(tmp_path / "c/*/shard-00000.parquet")
    rows = sum(len(b["input_ids"]) for b in tokpack.streaming_dataset_reader(pattern, 7))
    assert rows == 40
    assert main(["stats", str(tmp_path / "c"), "--max-len", "64", "--quiet"]) == 0
    assert "50" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    pytest.importorskip("tokenizers")
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "gen", CHATML_GEN)


def test_tokenize_reads_directories_and_globs_as_pack_does(tok_dir, tmp_path, capsys):
    raw = tmp_path / "raw"
    convs = conversations(60, seed=4)
    write_jsonl(touch(raw / "a.jsonl"), [{"messages": c} for c in convs[:30]])
    write_jsonl(touch(raw / "sub/b.jsonl"), [{"messages": c} for c in convs[30:]])
    touch(raw / "README.md", b"not data")
    base = ["--tokenizer", str(tok_dir), "--quiet"]
    files = [str(raw / "a.jsonl"), str(raw / "sub/b.jsonl")]
    assert main(["tokenize", *files, "-o", str(tmp_path / "by-name"), *base]) == 0
    assert main(["tokenize", str(raw), "-o", str(tmp_path / "by-dir"), *base]) == 0
    glob_arg = str(raw / "**/*.jsonl")
    assert main(["tokenize", glob_arg, "-o", str(tmp_path / "by-glob"), *base]) == 0
    expected = (tmp_path / "by-name/part-00000.parquet").read_bytes()
    for out in ("by-dir", "by-glob"):
        assert (tmp_path / out / "part-00000.parquet").read_bytes() == expected
    # One-step packing resolves the same way; both refuse an output inside their inputs, or
    # one holding files tokpack did not write, and touch nothing.
    assert main(["pack", str(raw), "-o", str(tmp_path / "packed"), *base]) == 0
    capsys.readouterr()
    (tmp_path / "by-glob/notes.txt").write_text("mine")
    before = tree(tmp_path)
    for cmd, out, why in [
        ("pack", raw / "packed", "inside the input directory"),
        ("tokenize", raw / "tokens", "inside the input directory"),
        ("tokenize", tmp_path / "by-glob", "did not write"),
        ("pack", tmp_path / "by-glob", "did not write"),
    ]:
        assert main([cmd, str(raw), "-o", str(out), *base]) == 2
        assert why in capsys.readouterr().err
        assert tree(tmp_path) == before
