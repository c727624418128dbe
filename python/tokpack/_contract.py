"""The names and constants the Rust core owns (``tokpack-core``'s ``policy`` module), for the
Python side: every Python use imports them from here, so each has exactly one definition."""

from ._tokpack import (
    ATTENTION_COST,
    FORMAT,
    FORMAT_VERSION,
    IGNORE_INDEX,
    MICRO_BATCH_ORDERS,
    OVER_CAP_POLICIES,
    OVERLONG_HINT,
    OVERLONG_POLICIES,
    PAIR_LAYOUTS,
    PAIR_SEGMENT_ROLES,
    PARTITION_METHODS,
    RESERVED_COLUMNS,
    SEGMENT_ROLES,
    SIDE_DIR,
    SPLIT_REGEXES,
    STRATEGIES,
    default_threads,
)

__all__ = [
    "ATTENTION_COST",
    "FORMAT",
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "MICRO_BATCH_ORDERS",
    "OVER_CAP_POLICIES",
    "OVERLONG_HINT",
    "OVERLONG_POLICIES",
    "PAIR_LAYOUTS",
    "PAIR_SEGMENT_ROLES",
    "RESERVED_COLUMNS",
    "PARTITION_METHODS",
    "SEGMENT_ROLES",
    "SIDE_DIR",
    "SPLIT_REGEXES",
    "STRATEGIES",
    "default_threads",
]
