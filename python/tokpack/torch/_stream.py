"""What the streaming datasets share: a global stream of rows per epoch, split into batches over
ranks and DataLoader workers, resumable in global rows consumed, with the exact global
normalisers of each optimizer step and, with ``balance="compute"``, each step's rows dealt out
again so that the ranks' compute is even.

A subclass says how long an epoch's stream is, where its rows are (``_locate``) and what a
resumption state must match (``_fingerprint``); :class:`RowStream` does the rest for the
single-directory :class:`PackedIterableDataset` and the mixture alike.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .._checks import MAX_SEED, check_choice, check_int
from ..balance import Cost
from ..balance.packed import checked_balance, deal_batches, packed_cost, row_compute
from ..errors import ConfigError
from ..kinds import KINDS
from ..packed.format import ROW_COLUMNS
from ..packed.mixture import MAX_STREAM_ROWS
from ..packed.order import TAILS, RankSplit
from ..packed.reader import PackedDir
from ..packed.row_counts import RowCounts
from ._rows import GroupCache
from ._transport import ship
from ._workers import resolve_rank, worker_slot

__all__ = ["RowStream"]

# Stream rows of an epoch that never ends (the split's arithmetic stays in Python ints).
ENDLESS = 1 << 62

# A reader looks ahead for groups to fetch or decode at every this many of its batches.
_PREFETCH_EVERY = 4

Collate = Callable[[List[Dict[str, torch.Tensor]]], Dict[str, Any]]


def check_tree_sources(sources: Sequence[PackedDir], collate_fn: Optional[Collate]) -> None:
    """Tree directories (sample kind ``tree``) are read by a tree collator only, and alone or
    with other tree directories: ConfigError naming the directory otherwise. A flat collator
    would mix the sequences of a tree row; a mixture of tree and flat rows has no collator."""
    trees = [p for p in sources if KINDS[p.kind].trees]
    if not trees:
        if getattr(collate_fn, "reads_tree_rows", False):
            raise ConfigError(
                f"{type(collate_fn).__name__} reads packed tree directories; {sources[0].shown}"
                f" holds {sources[0].kind} rows: collate them with tokpack.torch.PackedCollator"
            )
        return
    flat = [p for p in sources if not KINDS[p.kind].trees]
    if flat:
        raise ConfigError(
            f"{trees[0].shown} holds tree rows and {flat[0].shown} {flat[0].kind} rows: one"
            " stream cannot mix them (no collator batches both); mix tree directories with tree"
            " directories only"
        )
    if collate_fn is not None and not getattr(collate_fn, "reads_tree_rows", False):
        raise ConfigError(
            f"{trees[0].shown} holds tree rows (sequences sharing prefixes stored once), which"
            f" {type(collate_fn).__name__} would mix: use collate_fn="
            "tokpack.tree.PackedTreeCollator()"
        )


class RowStream(torch.utils.data.IterableDataset):
    """Base of the streaming datasets (see :class:`PackedIterableDataset` for the contract).

    Subclasses call :meth:`_setup` and implement ``_stream_rows``, ``_fingerprint``,
    ``_locate`` and ``_row_counts``; ``self.sources`` lists their packed directories.
    """

    sources: Sequence[PackedDir]

    def _setup(
        self,
        *,
        batch_rows: int,
        seed: int,
        rank: Optional[int],
        world_size: Optional[int],
        collate_fn: Optional[Collate],
        tail: str,
        shuffle_window: int,
        grad_accum_steps: Optional[int],
        balance: Optional[str] = None,
        cost: Cost = "attention",
    ) -> None:
        self.batch_rows = check_int(batch_rows, "batch_rows", 1, MAX_STREAM_ROWS)
        self.seed = check_int(seed, "seed", 0, MAX_SEED)
        self.shuffle_window = check_int(shuffle_window, "shuffle_window", 1, MAX_STREAM_ROWS)
        self.tail = check_choice("tail", tail, TAILS)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        rows = self._stream_rows()
        if rows is not None and rows < self.world_size:
            shown = ", ".join(p.shown for p in self.sources)
            raise ConfigError(
                f"one epoch of {shown} has {rows} rows, fewer than world_size={self.world_size}"
            )
        check_tree_sources(self.sources, collate_fn)
        self.collate_fn = collate_fn
        if grad_accum_steps is not None:
            grad_accum_steps = check_int(grad_accum_steps, "grad_accum_steps", 1, MAX_STREAM_ROWS)
        self.grad_accum_steps = grad_accum_steps
        self.balance = checked_balance(balance)
        self._cost = packed_cost(cost)
        self.epoch = 0
        self._start = 0
        # Batches of the split from _start already taken when the state was loaded (only a state
        # saved inside a balanced optimizer step has some: the step restarts at _start).
        self._skip = 0
        # The split's index (from _start) of the next batch this process makes.
        self._next_batch = 0
        # Workers share up to three windows of groups: the window the slowest worker reads, the
        # one the fastest reads and the one being read ahead (see `_prefetch`).
        window = self.shuffle_window + 1
        # A collator that names the columns it reads has only those decoded.
        reads = getattr(collate_fn, "reads_columns", None)
        self._caches = [
            GroupCache(p, window, 3 * window, None if reads is None else reads(p.columns))
            for p in self.sources
        ]
        # Collated without a collate_fn: rows of an unlabelled source train on every token.
        self._columns = [c for c in ROW_COLUMNS if any(c in p.columns for p in self.sources)]
        # Roles and carried columns come along when every source has them.
        self._columns += [
            c
            for c in self.sources[0].columns
            if c not in ROW_COLUMNS and all(c in p.columns for p in self.sources)
        ]
        # Multimodal sources mixed with text ones: a text row has no image, so it gets empty
        # media per segment (the media columns are never dropped, and one collator takes both).
        media = KINDS["multimodal"].carried
        self._no_media = [
            [c for c in media if c not in p.carried]
            if any(media[0] in q.carried for q in self.sources)
            else []
            for p in self.sources
        ]
        self._columns += [c for c in media if any(self._no_media) and c not in self._columns]
        # Per-row counts for the global normalisers: read once here, before workers copy it.
        self._counts: Optional[List[RowCounts]] = (
            None if self.grad_accum_steps is None else self._row_counts()
        )
        # Each source's per-row compute (their seq_lengths read once, here) for the deal.
        self._compute: Optional[List[np.ndarray]] = (
            None if self.balance is None else [row_compute(p, self._cost) for p in self.sources]
        )

    # -- what a subclass provides ----------------------------------------------------------

    @abstractmethod
    def _stream_rows(self) -> Optional[int]:
        """Rows of one epoch's stream (None: endless)."""

    @abstractmethod
    def _fingerprint(self) -> Dict[str, Any]:
        """What a resumption state must match."""

    @abstractmethod
    def _locate(self, a: int, b: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, row group, row in group) of stream rows ``[a, b)`` of this epoch."""

    @abstractmethod
    def _row_counts(self) -> List[RowCounts]:
        """Per-row counts of each source, for the global normalisers."""

    # -- order and state -------------------------------------------------------------------

    def _split(self) -> RankSplit:
        n = self._stream_rows()
        return RankSplit(
            ENDLESS if n is None else n,
            self._start,
            batch_rows=self.batch_rows,
            world_size=self.world_size,
            tail=self.tail,
        )

    def __len__(self) -> int:
        """Batches this rank yields from the current state to the end of the epoch."""
        if self._stream_rows() is None:
            raise TypeError("an endless stream (stop='never') has no length")
        return self._split().num_batches - self._skip

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order; a new epoch starts from its first row."""
        epoch = check_int(epoch, "epoch", 0, MAX_STREAM_ROWS)
        if epoch != self.epoch:
            self.epoch, self._start, self._skip, self._next_batch = epoch, 0, 0, 0

    def _step_batches(self) -> int:
        """Local batches per optimizer step (a step's rows are what the balance deals)."""
        return self.grad_accum_steps or 1

    def _deal_key(self) -> Dict[str, Any]:
        """What must match to resume inside a balanced optimizer step: the same deal."""
        return {
            "world_size": self.world_size,
            "batch_rows": self.batch_rows,
            "grad_accum_steps": self._step_batches(),
            "tail": self.tail,
            "cost": list(self._cost),
        }

    def _consumed(self, split: RankSplit, batches: int) -> Dict[str, Any]:
        """Where the stream stands once every rank has taken its first ``batches`` batches of
        ``split``: the global rows consumed, plus, inside a balanced optimizer step (whose rows
        are not a prefix of the stream), the step's first row and the batches taken of it."""
        into = batches % self._step_batches()
        if self.balance is None or into == 0 or batches >= split.num_batches:
            return {"rows_consumed": split.round_end(batches - 1)}
        return {
            "rows_consumed": split.round_end(batches - into - 1),
            "mid_step": {"batches": into, **self._deal_key()},
        }

    def state_dict(self, batches_consumed: Optional[int] = None) -> Dict[str, Any]:
        """The resumption state, in global rows consumed this epoch.

        ``batches_consumed``: batches this rank has trained on since iteration started from the
        current state (what the training loop counts). Without it, the batches handed out by this
        process's iterator are counted (exact with ``num_workers=0``). Inside a DataLoader worker
        (torchdata's ``StatefulDataLoader`` asks each worker) the state also records the worker's
        own next batch, which ``load_state_dict`` restores when the topology is unchanged.
        """
        split = self._split()
        if batches_consumed is None:
            n = self._next_batch
        else:
            n = check_int(batches_consumed, "batches_consumed", 0, MAX_STREAM_ROWS)
            if n > split.num_batches - self._skip:
                raise ConfigError(
                    f"batches_consumed={n} but this epoch has {split.num_batches - self._skip}"
                )
            n += self._skip
        state = {
            "epoch": self.epoch,
            **self._consumed(split, min(n, split.num_batches)),
            **self._fingerprint(),
        }
        if batches_consumed is None and worker_slot()[1] > 1:
            own = {"from_rows": self._start, "skip": self._skip, "next_batch": n}
            state["worker"] = {**own, **self._topology()}
        return state

    def _topology(self) -> Dict[str, Any]:
        """What a worker's own state must match to resume at that worker's next batch."""
        return {
            "num_workers": worker_slot()[1],
            "world_size": self.world_size,
            "batch_rows": self.batch_rows,
            "tail": self.tail,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` or from a batch's ``position`` dict."""
        try:
            epoch = check_int(state["epoch"], "epoch", 0, MAX_STREAM_ROWS)
            rows = check_int(state["rows_consumed"], "rows_consumed", 0, MAX_STREAM_ROWS)
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"state needs 'epoch' and 'rows_consumed': {exc}") from None
        for key, mine in self._fingerprint().items():
            if key in state and state[key] != mine:
                raise ConfigError(f"state was saved with {key}={state[key]!r}, this is {mine!r}")
        total = self._stream_rows()
        if total is not None and rows > total:
            raise ConfigError(f"rows_consumed={rows} > the epoch's {total} rows")
        skip = self._mid_step(state.get("mid_step"))
        worker = state.get("worker")
        if worker is not None and all(worker.get(k) == v for k, v in self._topology().items()):
            # A worker's own state (StatefulDataLoader): resume at that worker's next batch.
            self.epoch, self._start = epoch, int(worker["from_rows"])
            self._skip = int(worker.get("skip", 0))
            self._next_batch = int(worker["next_batch"])
        else:
            self.epoch, self._start, self._skip, self._next_batch = epoch, rows, skip, skip

    def _mid_step(self, mid: Any) -> int:
        """Batches already taken of the balanced optimizer step a state was saved in (0 at a
        step boundary). Its other rows are dealt by the step's deal: resuming needs the same."""
        if mid is None:
            return 0
        if self.balance is None:
            raise ConfigError(
                f"state was saved {mid.get('batches')} batches into an optimizer step of a"
                ' balance="compute" stream; resuming inside that step needs balance="compute"'
            )
        mine = self._deal_key()
        differ = [key for key in mine if mid.get(key) != mine[key]]
        if differ:
            saved = ", ".join(f"{key}={mid.get(key)!r}" for key in differ)
            here = ", ".join(f"{key}={mine[key]!r}" for key in differ)
            raise ConfigError(
                f"state was saved {mid.get('batches')} batches into a balanced optimizer step"
                f" with {saved}, this stream has {here}; resuming inside a step needs the same"
                " deal (resume from a state saved at a step boundary to change them)"
            )
        batches = check_int(mid.get("batches"), "mid_step batches", 0, MAX_STREAM_ROWS)
        if batches >= mine["grad_accum_steps"]:
            raise ConfigError(
                f"mid_step batches={batches} but a step has {mine['grad_accum_steps']} batches"
            )
        return batches

    # -- global normalisers ----------------------------------------------------------------

    def _step_counts(self, a: int, b: int) -> Tuple[int, int]:
        """(loss terms, samples) of stream rows ``[a, b)``: every rank's rows of a step."""
        assert self._counts is not None
        src, groups, rows = self._locate(a, b)
        terms = samples = 0
        for s in np.unique(src):
            mask = src == s
            index = self.sources[s].group_start[groups[mask]] + rows[mask]
            terms += int(self._counts[s].loss_terms[index].sum())
            samples += int(self._counts[s].samples[index].sum())
        return terms, samples

    # -- iteration -------------------------------------------------------------------------

    def _dealt(self, split: RankSplit, m: int) -> Tuple[Tuple[np.ndarray, ...], List[np.ndarray]]:
        """Optimizer step ``m`` (local batches ``[m G, (m + 1) G)`` of every rank) dealt with
        even compute: its rows as ``_locate`` gives them, and this rank's batches as indices
        into them. Every rank computes the same deal from the same rows. Only the epoch's last
        round can have batches of other than ``batch_rows`` rows: it keeps its plain split
        (:func:`deal_batches`, the sampler's rule too)."""
        span = self._step_batches()
        first, last = m * span, min((m + 1) * span, split.num_batches)
        a = split.round_end(first - 1)
        located = self._locate(a, split.round_end(last - 1))
        slots = [
            [np.arange(*split.batch(r, k)) - a for k in range(first, last)]
            for r in range(self.world_size)
        ]
        assert self._compute is not None
        src, groups, rows = located
        compute = np.empty(len(src))
        for s in np.unique(src):
            mask = src == s
            index = self.sources[s].group_start[groups[mask]] + rows[mask]
            compute[mask] = self._compute[s][index]
        return located, deal_batches(slots, compute, self.batch_rows)[self.rank]

    def _batch(self, src: np.ndarray, groups: np.ndarray, rows: np.ndarray) -> Dict[str, Any]:
        # A collator that only reads its rows gets views of the cached groups, others copies.
        copy = not getattr(self.collate_fn, "reads_rows_only", False)
        caches = self._caches
        batch_rows = [
            _with_media(caches[s].get(g).row(r, copy), self._no_media[s], copy)
            for s, g, r in zip(src.tolist(), groups.tolist(), rows.tolist())
        ]
        if self.collate_fn is not None:
            return self.collate_fn(batch_rows)
        return {
            name: [row[name] if name in row else row["input_ids"].clone() for row in batch_rows]
            for name in self._columns
        }

    def _decode_ahead(self, groups: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
        """In one process, have ``groups`` ((source, group), in the order the rows need them)
        decoded on the background thread (see :meth:`GroupCache.decode_ahead`); those it could
        not take yet (not fetched yet from object storage, or the decodes waiting are many)
        are returned, to be asked again at the next batch."""
        return [(s, g) for s, g in groups if not self._caches[s].decode_ahead(g)]

    def _groups(self, a: int, b: int) -> Iterable[Tuple[int, int]]:
        """The (source, group) pairs of stream rows ``[a, b)``, each once, in the order the rows
        need them."""
        total = self._stream_rows()
        b = b if total is None else min(b, total)
        if a >= b:
            return ()
        src, groups, _ = self._locate(a, b)
        return dict.fromkeys(zip(src.tolist(), groups.tolist()))

    def _prefetch(self, a: int, b: int) -> None:
        """Have the groups of stream rows ``[a, b)`` decoded in the background (with several
        DataLoader workers: see :func:`GroupCache.prefetch`)."""
        for s, g in self._groups(a, b):
            self._caches[s].prefetch(g)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        worker, num_workers = worker_slot()
        split = self._split()
        total = self._stream_rows()
        if (
            split.num_batches == 0
            and total is not None
            and split.start < total
            and self.tail == "even"
        ):
            warnings.warn(
                f"only {total - split.start} rows left in epoch {self.epoch}, fewer"
                f" than world_size={self.world_size}: they are skipped",
                stacklevel=2,
            )
        if self._next_batch >= split.num_batches:
            # The previous pass finished: a new pass replays the epoch from the state.
            self._next_batch = self._skip
        # Worker w makes batches skip + w, skip + w + n, ... (the DataLoader takes them in turn).
        first = self._next_batch + (worker - self._next_batch + self._skip) % num_workers
        steps = self.grad_accum_steps
        step_counts: Tuple[int, Tuple[int, int]] = (-1, (0, 0))
        span = self._step_batches()
        deal: Tuple[int, Any] = (-1, None)
        # With several workers, the groups a window of rows ahead are decoded in the background
        # (by whichever worker gets there first), so workers seldom wait for a decode; checked
        # every few batches (shuffled windows spread each window's groups over its rows).
        ahead = self.shuffle_window * max(int(p.group_rows.max(initial=1)) for p in self.sources)
        # Object storage: fetched ahead by this process's fetch threads even without workers,
        # every row from the first batch's to a window ahead of the current one (the first
        # window too, so the loop does not fetch it itself), each group once.
        remote = any(p.remote for p in self.sources)
        edge = -1
        # In one process: the groups a window ahead not handed to the decoder yet.
        waiting: List[Tuple[int, int]] = []
        try:
            for i, k in enumerate(range(first, split.num_batches, num_workers)):
                a, b = split.batch(self.rank, k)
                if i % _PREFETCH_EVERY == 0:
                    if remote:
                        edge = max(edge, a)
                        self._prefetch(edge, b + ahead)
                        edge = max(edge, b + ahead)
                    elif num_workers > 1:
                        self._prefetch(a + ahead, b + ahead)
                    if num_workers == 1:
                        waiting = self._decode_ahead(self._groups(a, b + ahead))
                elif waiting:
                    waiting = self._decode_ahead(waiting)
                if self.balance is None:
                    batch = self._batch(*self._locate(a, b))
                else:
                    if deal[0] != k // span:
                        deal = (k // span, self._dealt(split, k // span))
                    located, mine = deal[1]
                    batch = self._batch(*(x[mine[k % span]] for x in located))
                if steps is not None:
                    # The optimizer step of local batch k: rounds [m G, (m + 1) G) of every rank.
                    m = k // steps
                    if step_counts[0] != m:
                        last = min((m + 1) * steps, split.num_batches) - 1
                        a, b = split.round_end(m * steps - 1), split.round_end(last)
                        step_counts = (m, self._step_counts(a, b))
                    batch["global_num_loss_tokens"], batch["global_num_samples"] = step_counts[1]
                consumed = self._consumed(split, k + 1)
                batch["position"] = {"epoch": self.epoch, "batch": k, **consumed}
                self._next_batch = k + 1
                yield ship(batch)
        finally:
            # Stopped early (or done): nothing asked ahead is needed any more.
            for cache in self._caches:
                if remote:
                    cache.cancel_prefetch()
                else:
                    cache.cancel_decodes()
        # This worker's share of the pass is done; in a worker, `_next_batch` only saw its own
        # batches, so mark the whole pass finished or a persistent worker's next pass would
        # resume mid-epoch instead of replaying it.
        self._next_batch = split.num_batches


def _with_media(row: Dict[str, Any], missing: List[str], copy: bool) -> Dict[str, Any]:
    """``row`` of a text source in a mixture with multimodal ones: no image in any segment."""
    if missing and "seq_lengths" in row:  # (a collator reading no segments reads no media)
        n = len(row["seq_lengths"])
        for c in missing:
            if c == KINDS["multimodal"].carried[0]:
                row[c] = ["[]"] * n
            else:
                zeros = np.zeros(n, dtype=np.int32)
                row[c] = torch.from_numpy(zeros) if copy else zeros
    return row
