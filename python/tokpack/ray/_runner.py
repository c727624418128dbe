"""``tokpack tokenize --ray``: the chunks of ``tokpack tokenize`` encoded by Ray tasks.

The driver reads the inputs and writes the shards as ``tokpack tokenize`` does, and hands each
chunk of records (raw JSONL lines or Parquet rows, with their file and line) to a Ray task; the
results come back in input order. Rendering and encoding, the part that costs (tens of
microseconds a conversation), runs on the cluster, and the output (shards, counts, rejected
records with their file and line, manifest and cache key) is byte for byte that of ``tokpack
tokenize`` on one machine.

Tasks, not actors: Ray schedules a task wherever a CPU is free (an actor waiting for resources
would hold its chunks forever) and reruns it if its worker dies; a chunk has no side effect, so
a rerun gives the same result (tested by killing a worker mid-run). Each worker process loads
the encoder once and keeps it for the run's later chunks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import ray

from .._checks import MAX_ROWS, check_int
from ..tokenize.options import TokenizeOptions
from ..tokenize.pipeline import RecordEncoder, run_packed
from ._blocks import cancelling

# This worker process's encoder, with the (tokenizer path, options) it was loaded for.
_ENCODER: List[Tuple[str, TokenizeOptions, RecordEncoder]] = []


@ray.remote
def _encode(tokenizer: str, options: TokenizeOptions, packed: Any) -> Any:
    if not _ENCODER or _ENCODER[0][:2] != (tokenizer, options):
        _ENCODER[:] = [(tokenizer, options, RecordEncoder(tokenizer, options))]
    return run_packed(_ENCODER[0][2], packed)


class RayRunner:
    """Runs each chunk as a Ray task, keeping ``ahead`` of them under way (default: two per CPU
    of the cluster). ``ray_remote_args`` go to the tasks (``num_cpus``, custom ``resources``,
    ``scheduling_strategy``, ``max_retries``, ...). The tokenizer directory (and a chat template
    file) must be readable at the same path on every node."""

    def __init__(
        self, ahead: Optional[int] = None, ray_remote_args: Optional[Dict[str, Any]] = None
    ) -> None:
        self.ahead = None if ahead is None else check_int(ahead, "ahead", 1, MAX_ROWS)
        self.ray_remote_args = dict(ray_remote_args or {})

    @contextlib.contextmanager
    def session(
        self, encoding: RecordEncoder
    ) -> Iterator[Tuple[Callable[[Any], Callable[[], Any]], int]]:
        ahead = self.ahead or 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        path = str(encoding.tokenizer.path.resolve())
        task = _encode.options(**self.ray_remote_args) if self.ray_remote_args else _encode
        pending: Set[Any] = set()  # the tasks not taken yet (taken ones free their results)

        def submit(packed: Any) -> Callable[[], Any]:
            ref = task.remote(path, encoding.options, packed)
            pending.add(ref)

            def result() -> Any:
                pending.discard(ref)
                return ray.get(ref)

            return result

        with cancelling(pending):  # on failure or Ctrl-C: no task keeps encoding for nobody
            yield submit, ahead
