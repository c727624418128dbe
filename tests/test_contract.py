"""The names and constants the Rust core owns have one definition: every Python module that uses
one holds the core's value, and the core accepts exactly the names it exports."""

import numpy as np
import pytest

import tokpack
from tokpack import _contract, _tokpack

CONSTANTS = [name for name in _contract.__all__ if name.isupper()]


@pytest.mark.parametrize("name", CONSTANTS)
def test_python_holds_the_cores_constant(name):
    assert getattr(_contract, name) == getattr(_tokpack, name)


def test_every_python_use_is_the_cores_value():
    from tokpack import _outdir, files, packed_dir, planning
    from tokpack.tokenize import masks

    assert (files.FORMAT, files.FORMAT_VERSION) == (_tokpack.FORMAT, _tokpack.FORMAT_VERSION)
    assert (packed_dir.FORMAT, packed_dir.FORMAT_VERSION) == (_tokpack.FORMAT, 2)
    assert _outdir.SIDE_DIR == _tokpack.SIDE_DIR == "__tokpack__"
    assert masks.IGNORE_INDEX == _tokpack.IGNORE_INDEX == -100
    assert planning.STRATEGIES == _tokpack.STRATEGIES
    assert planning.OVERLONG_POLICIES == _tokpack.OVERLONG_POLICIES
    assert files.PAIR_LAYOUTS == _tokpack.PAIR_LAYOUTS == ("separate", "shared-prompt")
    assert _contract.default_threads() == _tokpack.default_threads() >= 1


def test_torch_ignore_index_is_the_cores():
    collate = pytest.importorskip("tokpack.torch.collate")
    assert collate.IGNORE_INDEX == _tokpack.IGNORE_INDEX


def test_segment_roles_are_the_cores():
    pairs = pytest.importorskip("tokpack.torch.pairs")
    roles = _tokpack.SEGMENT_ROLES
    assert roles == ("sequence", "chosen", "rejected", "prompt")
    assert [pairs.ROLE_SEQUENCE, pairs.ROLE_CHOSEN, pairs.ROLE_REJECTED, pairs.ROLE_PROMPT] == [
        roles.index(n) for n in roles
    ]
    assert _tokpack.PAIR_SEGMENT_ROLES == {"separate": (1, 2), "shared-prompt": (3, 1, 2)}


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
