"""The names and constants the Rust core owns (``tokpack-core``'s ``policy`` module), for the
Python side: every Python use imports them from here, so each has exactly one definition. The
packed-directory format's names are in ``_format``."""

from ._tokpack import (  # noqa: F401 (re-exported)
    ATTENTION_COST,
    IGNORE_INDEX,
    MICRO_BATCH_ORDERS,
    OVER_CAP_POLICIES,
    OVERLONG_HINT,
    OVERLONG_POLICIES,
    PAIR_LAYOUTS,
    PAIR_SEGMENT_ROLES,
    PARTITION_METHODS,
    ROW_ORDERS,
    SEGMENT_ROLES,
    SPLIT_REGEXES,
    STRATEGIES,
    default_threads,
)
