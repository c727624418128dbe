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
