"""The names the Rust core owns: the values the packed format and the trainers depend on are
pinned here (a change must be deliberate: see CHANGELOG.md on `format_version`), and the core
accepts exactly the names it exports, with one message listing them.

(Python modules import these names from the core through `tokpack._contract`; comparing such a
re-export with the core's own object could not fail, so it is not tested.)"""

import numpy as np
import pytest

import tokpack
from tokpack import _contract, _tokpack


def test_the_packed_formats_names_are_pinned():
    assert (_tokpack.FORMAT_VERSION, _tokpack.SIDE_DIR) == (2, "__tokpack__")
    assert _tokpack.IGNORE_INDEX == -100
    assert _tokpack.PAIR_LAYOUTS == ("separate", "shared-prompt")
    assert _tokpack.SEGMENT_ROLES == ("sequence", "chosen", "rejected", "prompt")
    assert _tokpack.PAIR_SEGMENT_ROLES == {"separate": (1, 2), "shared-prompt": (3, 1, 2)}
    assert _tokpack.default_threads() >= 1


@pytest.mark.parametrize("strategy", _contract.STRATEGIES)
@pytest.mark.parametrize("overlong", _contract.OVERLONG_POLICIES)
def test_the_core_accepts_every_exported_name(strategy, overlong):
    p = tokpack.plan(np.array([3, 4, 2]), 4, strategy=strategy, overlong=overlong)
    assert p.strategy == strategy


@pytest.mark.parametrize(
    ("kind", "what", "names"),
    [("strategy", "strategy", "STRATEGIES"), ("overlong", "overlong policy", "OVERLONG_POLICIES")],
)
def test_the_core_lists_exactly_the_exported_names(kind, what, names):
    with pytest.raises(tokpack.ConfigError) as info:
        tokpack.plan(np.array([3]), 4, **{kind: "nope"})
    listed = ", ".join(f'"{n}"' for n in getattr(_contract, names))
    assert str(info.value) == f'unknown {what} "nope"; expected one of {listed}'


def test_python_choices_are_refused_in_the_core_s_words():
    """One wording for an unknown choice: the Python checker's message is the core's."""
    from tokpack._checks import check_choice

    with pytest.raises(tokpack.ConfigError) as core:
        tokpack.plan(np.array([3]), 4, strategy="nope")
    with pytest.raises(tokpack.ConfigError) as python:
        check_choice("strategy", "nope", _contract.STRATEGIES)
    assert str(python.value) == str(core.value)
    assert check_choice("strategy", "ffd", _contract.STRATEGIES) == "ffd"
    with pytest.raises(tokpack.ConfigError, match=r"^unknown tail \['drop'\]; expected one of"):
        check_choice("tail", ["drop"], ("drop", "pad"))  # unhashable: refused, not a TypeError


def test_the_listed_surface_leaves_out_the_drop_ins_and_the_uri_helpers():
    """``tokpack.__all__`` lists the API, not the guide's drop-ins nor ``shuffle_quality``
    (still reachable where the docs show them); ``tokpack.remote.__all__`` not the URI helpers."""
    import tokpack.remote

    unlisted = {"pack_sequences", "concatenate_and_pack", "streaming_dataset_reader"}
    assert not (unlisted | {"shuffle_quality"}) & set(tokpack.__all__)
    assert {"plan", "pack_files", "verify", "TokpackError"} <= set(tokpack.__all__)
    assert all(callable(getattr(tokpack, name)) for name in unlisted)
    assert not {"is_remote", "local_path", "store_of"} & set(tokpack.remote.__all__)
    assert callable(tokpack.remote.open_packed)


def test_the_readers_column_groups_are_the_shard_columns_they_name():
    """``packed.format``'s groups are slices of the core's SHARD_COLUMNS: a column inserted
    before them in the core must update them, not shift them silently."""
    from tokpack.packed import format

    assert format.ROW_COLUMNS == ("input_ids", "labels", "seq_lengths", "sample_ids")
    assert format.PAIR_SHARD_COLUMNS == ("seq_roles", "num_pairs")
    assert format.INDEX_COLUMNS == ("offset", "num_tokens", "num_seqs", "num_loss_tokens")


def test_the_tree_column_groups_are_the_tree_kinds_outputs_they_name():
    """``packed.tree_integrity``'s groups are slices of the core's tree outputs (the collator
    and ``verify`` read by them): a column moved in the core must update them."""
    from tokpack.packed import tree_integrity as tree

    assert tree.TREE_TOKEN_COLUMNS == ("tree_node",)
    assert tree.TREE_NODE_COLUMNS == tuple(
        f"tree_node_{x}" for x in ("parent", "depth", "tin", "tout", "len")
    )
    assert tree.TREE_SEQ_COLUMNS == ("tree_seq_end_node",)
    assert tree.TREE_TARGETS == "tree_target_pred"
    assert tree.TREE_PRED_COLUMNS == ("tree_pred_pos", "tree_pred_token", "tree_pred_weight")
