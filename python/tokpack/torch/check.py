"""``check_packing``: does this model, fed these packed batches, compute what it computes on each
sample alone? Measured on the user's model, on its device and dtype, before training.

A few hundred random token ids are cut into 2-3 segments, packed into one batch by the collator
(two segments per row, so the padded layouts have a padded row too) and run once; then each
segment is run alone, as a batch of one row holding only it. Forward hooks on the decoder layers
keep the packed outputs, and compare each alone run with its segment's slice of them, so the
report says which layer (and, from ``config.layer_types``, which kind of layer) first lets one
sample see another. Nothing is trained: ``torch.no_grad()``, eval mode (dropout off), the
model's train/eval mode restored afterwards.

Cost: 1 packed forward of T tokens + one forward per segment (T tokens in all), no backward:
``(1 + segments) * c0 + 2 * forward(T)``, ``c0`` the fixed cost of one forward call. For real
models ``c0`` vanishes and the check costs two forwards of T = 300 tokens, a fraction of a
percent of one training step of 8 x 4096 tokens (forward + backward ~ 3 forwards of 32k
tokens); on the tiny test configs ``c0`` dominates. Memory: one no-grad forward of T tokens
plus the packed outputs of every decoder layer (layers x T x hidden) and the logits (T x vocab).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from .._checks import MAX_LEN, check_choice, check_int
from ..errors import ConfigError, PackingError
from .attention import document_ids
from .collate import PackedCollator
from .device import to_device
from .models import model_inputs, packing_support

__all__ = ["check_packing", "PackingReport", "TOLERANCES"]

#: Default ``(atol, rtol)`` per compute dtype: a layer's output (and the logits) of a segment
#: packed is exact when ``max |packed - alone| <= atol + rtol * max |alone|``. Packing changes
#: the kernels' shapes (a block mask instead of a causal one, varlen instead of dense), so
#: exact paths differ by rounding only: about 1e-15 in float64, 1e-6 in float32, a few units of
#: the last place in bf16/fp16 through the layers. Mixing two samples moves the outputs by the
#: order of their scale, far above these (in bf16, a mix of a handful of tokens in a long
#: sample can hide below the tolerance: check in float32 or float64 for that).
TOLERANCES: Dict[torch.dtype, Tuple[float, float]] = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


@dataclass(frozen=True)
class PackingReport:
    """What :func:`check_packing` measured.

    Attributes:
        family: ``config.model_type`` (else the model's class name).
        format: the collator's format (``"hf"``, ``"padded"``, ``"flash"``; a custom
            collator's class name).
        exact: every decoder layer's output and the logits of every segment packed equal its
            alone run within the tolerance.
        dtype: the compute dtype that set the default tolerance.
        atol, rtol: the tolerance: ``max |packed - alone| <= atol + rtol * max |alone|``.
        segments: the segments' lengths, in batch order.
        layer_kinds: the kind of each decoder layer (``config.layer_types`` when the config has
            it, ``layers_block_type`` for the Mamba hybrids, else the layer's class name).
        layer_errors: per decoder layer, ``max |packed - alone|`` over the segments.
        errors: the largest error per layer kind, and ``"output"`` (the logits).
        first_diverging_layer: the first decoder layer out of tolerance (None if none is).
        mixes: what lets samples see each other: ``"layer 3 (sliding_attention)"``, ``"the
            output"`` (the layers agree, the head does not), ``"the batch's boundaries"`` (the
            collator's boundary fields do not separate the segments); None when exact.
        forward_passes: forwards run (1 packed + one per segment).
        seconds: wall time of the check.
    """

    family: str
    format: str
    exact: bool
    dtype: str
    atol: float
    rtol: float
    segments: Tuple[int, ...]
    layer_kinds: Tuple[str, ...]
    layer_errors: Tuple[float, ...]
    errors: Dict[str, float] = field(default_factory=dict)
    first_diverging_layer: Optional[int] = None
    mixes: Optional[str] = None
    forward_passes: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        verdict = "exact" if self.exact else f"MIXES SAMPLES at {self.mixes}"
        lines = [
            f"{self.family} with {self.format} batches: {verdict}"
            f" ({self.dtype}, tolerance atol={self.atol:g} rtol={self.rtol:g},"
            f" segments {list(self.segments)}, {self.forward_passes} forwards,"
            f" {self.seconds * 1e3:.0f} ms)"
        ]
        lines += [f"  {kind:<24} max error {err:.3g}" for kind, err in self.errors.items()]
        return "\n".join(lines)


def check_packing(
    model: torch.nn.Module,
    collator: Optional[Callable[[Sequence[Mapping[str, Any]]], Mapping[str, Any]]] = None,
    *,
    segments: int = 3,
    tokens: int = 300,
    seed: int = 0,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    device: Optional[Union[str, torch.device]] = None,
    dtype: Optional[torch.dtype] = None,
    raise_on_failure: bool = True,
    fix: Optional[str] = None,
) -> PackingReport:
    """Check that ``model`` fed packed batches from ``collator`` computes, for every sample, what
    it computes on the sample alone; raise :class:`tokpack.PackingError` if it does not.

    ``tokens`` random token ids (avoiding the pad id) are cut into ``segments`` segments of
    similar random lengths and collated as rows of two segments each; the model runs the packed
    batch once, then each segment alone (a batch of one row holding only it, from the same
    collator), in eval mode without gradients. Forward hooks on the decoder layers compare each
    layer's output on each segment, so the report names the first layer, and its kind, where
    packed and alone diverge: that layer is what mixes samples.

    Args:
        model: the model as it will train (its config, attention implementation, device and
            dtype); its train/eval mode is restored afterwards, its weights are not touched.
        collator: a ``PackedCollator`` (default: the layout ``PackedCollator.for_model(model)``
            would give, measured even where ``for_model`` refuses it) or any callable from
            rows (``input_ids``, ``labels``, ``seq_lengths``) to a batch whose tokens are
            ``[1, T]`` (padding-free), ``[B, L]`` (one row per packed row, padded) or ``[T]``
            (flat). The model gets the batch minus tokpack's bookkeeping keys and the labels.
        segments: how many segments (2..64).
        tokens: how many tokens in all (at least 4 per segment).
        seed: the random ids and lengths.
        atol, rtol: the tolerance (see :data:`TOLERANCES`); default by ``dtype``.
        device: where the batches go; default the device of the model's first parameter.
        dtype: the compute dtype that sets the default tolerance; default the lowest-precision
            floating dtype of the model's parameters.
        raise_on_failure: raise :class:`tokpack.PackingError` when not exact (else only report).
        fix: the fix the error names (the format to use, the kernel package to install); default
            a generic line.

    Cost: ``1 + segments`` forwards over ``2 * tokens`` tokens in all, no backward: about
    ``2 * forward(tokens)`` plus a fixed cost per forward call (about 0.1 s for a 2-layer
    hidden-64 Llama on one CPU thread; see the training guide).
    """
    segments = check_int(segments, "segments", 2, 64)
    tokens = check_int(tokens, "tokens", 4 * segments, MAX_LEN)
    if collator is None:
        collator = PackedCollator(**packing_support(model).collator_options())
    fmt = getattr(collator, "format", type(collator).__name__)
    if fmt == "torchtune":
        raise ConfigError(
            "check_packing needs batches a Hugging Face style model takes: collator format hf,"
            " padded or flash, got 'torchtune'"
        )
    params = [p for p in model.parameters() if p.is_floating_point()]
    if device is None:
        device = params[0].device if params else torch.device("cpu")
    device = torch.device(device)
    if dtype is None:
        dtype = max(
            (p.dtype for p in params), key=lambda d: torch.finfo(d).eps, default=torch.float32
        )
    check_choice("dtype", dtype, TOLERANCES)
    default_atol, default_rtol = TOLERANCES[dtype]
    atol = default_atol if atol is None else float(atol)
    rtol = default_rtol if rtol is None else float(rtol)

    config = getattr(model, "config", None)
    family = str(getattr(config, "model_type", None) or type(model).__name__)
    pieces = _random_segments(model, config, segments, tokens, seed)
    layers = _decoder_layers(model, config)
    kinds = _layer_kinds(layers, config)

    started = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outcome = _compare(model, collator, pieces, layers, device)
            first, mixes = _verdict(outcome, kinds, atol, rtol)
            if mixes is not None and fix is None and getattr(config, "use_cache", False):
                fix = _cache_fix(model, collator, pieces, layers, device, kinds, atol, rtol)
    finally:
        model.train(was_training)
    layer_errors, output_error, _ = outcome
    errors: Dict[str, float] = {}
    for kind, (err, _) in zip(kinds, layer_errors):
        errors[kind] = max(errors.get(kind, 0.0), err)
    errors["output"] = output_error[0]
    report = PackingReport(
        family=family,
        format=str(fmt),
        exact=mixes is None,
        dtype=str(dtype).replace("torch.", ""),
        atol=atol,
        rtol=rtol,
        segments=tuple(int(p.numel()) for p in pieces),
        layer_kinds=tuple(kinds),
        layer_errors=tuple(e[0] for e in layer_errors),
        errors=errors,
        first_diverging_layer=first,
        mixes=mixes,
        forward_passes=1 + len(pieces),
        seconds=time.perf_counter() - started,
    )
    if not report.exact and raise_on_failure:
        raise PackingError(_failure_message(report, model, fix))
    return report


def _verdict(
    outcome: Tuple[List[Tuple[float, float]], Tuple[float, float], bool],
    kinds: List[str],
    atol: float,
    rtol: float,
) -> Tuple[Optional[int], Optional[str]]:
    """(the first decoder layer out of tolerance, what mixes: None when exact)."""
    layer_errors, output_error, boundaries_ok = outcome

    def close(err: Tuple[float, float]) -> bool:
        return err[0] <= atol + rtol * err[1]

    first = next((i for i, e in enumerate(layer_errors) if not close(e)), None)
    if not boundaries_ok:
        return first, "the batch's boundaries"
    if first is not None:
        return first, f"layer {first} ({kinds[first]})"
    if not close(output_error):
        return None, "the output" if kinds else "the output (no decoder layers to tell which)"
    return None, None


def _cache_fix(model, collator, pieces, layers, device, kinds, atol, rtol) -> Optional[str]:
    """The fix when the config asks for a KV cache and the batches are exact without one:
    transformers builds no packed-sequence mask when a cache exists, and use_cache=True (the
    config default) creates one even in training. None (the default fix) otherwise."""
    try:
        outcome = _compare(model, collator, pieces, layers, device, {"use_cache": False})
    except TypeError:  # a forward without use_cache: the cache is not what mixes
        return None
    if _verdict(outcome, kinds, atol, rtol)[1] is not None:
        return None
    return (
        "set model.config.use_cache = False (with a KV cache transformers builds no"
        " packed-sequence mask; without one these batches are exact)"
    )


def _failure_message(report: PackingReport, model: torch.nn.Module, fix: Optional[str]) -> str:
    where = report.mixes
    if report.first_diverging_layer is not None:
        err = report.layer_errors[report.first_diverging_layer]
    else:
        err = report.errors["output"]
    if fix is None:
        fix = (
            "give the model the boundaries its layers read (PackedCollator.for_model(model)"
            " picks the format, and names the kernel package a family needs), or train one"
            " sample per row"
        )
    return (
        f"{report.family} ({type(model).__name__}) mixes samples with {report.format} batches:"
        f" {where} is the first where a packed sample differs from the sample alone (max error"
        f" {err:.3g}, tolerance atol={report.atol:g} rtol={report.rtol:g} in {report.dtype});"
        f" {fix}"
    )


def _random_segments(
    model: torch.nn.Module, config: Any, n: int, tokens: int, seed: int
) -> List[torch.Tensor]:
    """``n`` int64 segments of random ids summing to ``tokens``, each at least 2 tokens."""
    g = torch.Generator().manual_seed(seed)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None  # type: ignore[operator]
    vocab = getattr(embeddings, "num_embeddings", None) or getattr(config, "vocab_size", None)
    if not vocab:
        raise ConfigError(
            f"check_packing cannot tell the vocabulary size of {type(model).__name__}: it needs"
            " get_input_embeddings() or config.vocab_size"
        )
    # Lengths within +-1/3 of the mean, so no segment is trivially short.
    mean = tokens / n
    jitter = torch.rand(n, generator=g) * (2 / 3) + (2 / 3)
    lengths = torch.clamp((jitter / jitter.sum() * tokens).round().long(), min=2)
    lengths[-1] = tokens - int(lengths[:-1].sum())
    if int(lengths[-1]) < 2:
        lengths = torch.full((n,), int(mean), dtype=torch.int64)
        lengths[-1] = tokens - int(lengths[:-1].sum())
    ids = torch.randint(0, int(vocab), (tokens,), generator=g, dtype=torch.int64)
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and vocab > 1:
        ids[ids == pad] = (pad + 1) % int(vocab)
    return list(torch.split(ids, lengths.tolist()))


def _decoder_layers(model: torch.nn.Module, config: Any) -> List[torch.nn.Module]:
    """The model's decoder layers: the ModuleList of ``config.num_hidden_layers`` modules (one
    named ``layers`` first), else the longest ModuleList; empty when there is none."""
    n = getattr(config, "num_hidden_layers", None)
    lists = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) > 0
    ]
    if isinstance(n, int):
        sized = [(name, m) for name, m in lists if len(m) == n]
        named = [m for name, m in sized if name.rsplit(".", 1)[-1] == "layers"]
        if named or sized:
            return list((named or [m for _, m in sized])[0])
    if not lists:
        return []
    return list(max((m for _, m in lists), key=len))  # type: ignore[arg-type]


def _layer_kinds(layers: List[torch.nn.Module], config: Any) -> List[str]:
    for attr in ("layer_types", "layers_block_type"):
        kinds = getattr(config, attr, None)
        if isinstance(kinds, (list, tuple)) and len(kinds) == len(layers):
            return [str(k) for k in kinds]
    return [type(layer).__name__ for layer in layers]


def _rows(pieces: List[torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
    """Rows of two segments each (the last may hold one)."""
    rows = []
    for i in range(0, len(pieces), 2):
        part = pieces[i : i + 2]
        ids = torch.cat(part)
        lens = torch.tensor([p.numel() for p in part], dtype=torch.int64)
        rows.append({"input_ids": ids, "labels": ids.clone(), "seq_lengths": lens})
    return rows


def _collate(collator: Callable, rows: List[Dict[str, torch.Tensor]]) -> Dict[str, Any]:
    # collate(): the plain batch, without the shared-memory transport of DataLoader workers.
    collate = getattr(collator, "collate", None)
    return dict(collate(rows) if callable(collate) else collator(rows))


def _token_index(batch: Mapping[str, Any], rows: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
    """Per token of the rows (row by row), its index in the batch's flattened tokens."""
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        raise ConfigError(
            f"check_packing needs a batch with an input_ids tensor, got keys {sorted(batch)}"
        )
    lens = [int(r["input_ids"].numel()) for r in rows]
    total = sum(lens)
    if ids.numel() == total:
        # Padding-free ([1, T] or flat [T]): the rows concatenated.
        index = torch.arange(total)
    elif ids.dim() == 2 and ids.shape[0] == len(rows) and ids.shape[1] >= max(lens):
        width = ids.shape[1]
        index = torch.cat([r * width + torch.arange(n) for r, n in enumerate(lens)])
    else:
        raise ConfigError(
            f"check_packing cannot place {len(rows)} rows of {lens} tokens in a batch whose"
            f" input_ids have shape {tuple(ids.shape)}: expected [1, {total}], [{total}] or"
            f" [{len(rows)}, L >= {max(lens)}]"
        )
    expected = torch.cat([r["input_ids"] for r in rows])
    if not torch.equal(ids.reshape(-1).cpu()[index], expected):
        raise ConfigError(
            "check_packing: the collator's input_ids do not hold the rows' tokens in order"
        )
    return index


def _boundaries_separate(batch: Mapping[str, Any], index: torch.Tensor, lens: List[int]) -> bool:
    """Whether the batch's boundary fields (when it has any) give each segment one document of
    its own: False means the collator itself joins two samples."""
    try:
        doc = document_ids(batch)
    except ConfigError:
        return True  # no boundary fields: the model's outputs tell
    flat = doc.reshape(-1).cpu()
    if flat.numel() != int(batch["input_ids"].numel()):
        return True  # boundaries of another shape (a context-parallel slice): not compared
    width = doc.shape[-1]
    seen = set()
    for piece in torch.split(index, lens):
        ids = flat[piece]
        row = int(piece[0]) // width
        if int(ids.min()) < 0 or not bool((ids == ids[0]).all()) or (row, int(ids[0])) in seen:
            return False
        seen.add((row, int(ids[0])))
    return True


def _first_tensor(output: Any) -> Optional[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _logits(output: Any) -> Optional[torch.Tensor]:
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping):
        return _first_tensor(tuple(output.values()))
    return _first_tensor(output)


def _tokens_first(t: torch.Tensor, n_tokens: int, shape: torch.Size) -> Optional[torch.Tensor]:
    """``t`` as ``[tokens, ...]`` when its leading dims are the batch's token dims, else None.
    A padding-free batch (``[1, T]`` or ``[T]``) may come out either way: a flat-batch model
    that runs an HF stack returns ``[1, T, ...]``."""
    if tuple(t.shape[: len(shape)]) == tuple(shape):
        return t.reshape(n_tokens, *t.shape[len(shape) :])
    if t.dim() > 0 and max(shape, default=1) == n_tokens:
        lead = 0
        while lead < t.dim() - 1 and t.shape[lead] == 1:
            lead += 1
        if t.shape[lead] == n_tokens:
            return t.reshape(n_tokens, *t.shape[lead + 1 :])
    return None


def _forward(model, batch, device, extra) -> Optional[torch.Tensor]:
    """The model's logits on ``batch`` as ``[tokens, ...]`` (None when it gives none)."""
    # Labels dropped too: the check compares outputs, it computes no loss.
    inputs = {k: v for k, v in model_inputs(batch).items() if k not in ("labels", "shift_labels")}
    inputs = to_device(inputs, device, pin=False, non_blocking=False)
    out = _logits(model(**inputs, **extra))
    ids = batch["input_ids"]
    return None if out is None else _tokens_first(out.detach(), int(ids.numel()), ids.shape)


def _compare(
    model: torch.nn.Module,
    collator: Callable,
    pieces: List[torch.Tensor],
    layers: List[torch.nn.Module],
    device: torch.device,
    extra: Optional[Dict[str, Any]] = None,
) -> Tuple[List[Tuple[float, float]], Tuple[float, float], bool]:
    """(per layer, then the output: (max |packed - alone|, max |alone|)), and whether the
    batch's boundary fields separate the segments. ``extra``: more keyword arguments for the
    model's forward calls."""
    extra = extra or {}
    rows = _rows(pieces)
    batch = _collate(collator, rows)
    index = _token_index(batch, rows)
    lens = [int(p.numel()) for p in pieces]
    boundaries_ok = _boundaries_separate(batch, index, lens)
    shape = batch["input_ids"].shape
    n_tokens = int(batch["input_ids"].numel())

    packed: List[Optional[torch.Tensor]] = [None] * len(layers)
    errors = [(0.0, 0.0)] * len(layers)
    # What the hooks compare against: the packed outputs of the segment being run alone.
    state: Dict[str, Any] = {"packed": True}

    def hook_for(i: int):
        def hook(module, args, output):
            t = _first_tensor(output)
            if t is None:
                return
            if state["packed"]:
                packed[i] = _tokens_first(t.detach(), n_tokens, shape)
                return
            ref = packed[i]
            alone = _tokens_first(t.detach(), state["n"], state["shape"])
            if ref is None or alone is None:
                return
            errors[i] = _worst(errors[i], ref[state["rows"]], alone[state["index"]])

        return hook

    handles = [layer.register_forward_hook(hook_for(i)) for i, layer in enumerate(layers)]
    try:
        packed_out = _forward(model, batch, device, extra)
        state["packed"] = False
        output_error = (0.0, 0.0)
        for k, piece in enumerate(pieces):
            alone_rows = _rows([piece])
            alone_batch = _collate(collator, alone_rows)
            alone_index = _token_index(alone_batch, alone_rows)
            state.update(
                rows=index[sum(lens[:k]) : sum(lens[: k + 1])].to(device),
                index=alone_index.to(device),
                n=int(alone_batch["input_ids"].numel()),
                shape=alone_batch["input_ids"].shape,
            )
            alone_out = _forward(model, alone_batch, device, extra)
            if packed_out is not None and alone_out is not None:
                output_error = _worst(
                    output_error, packed_out[state["rows"]], alone_out[state["index"]]
                )
    finally:
        for h in handles:
            h.remove()
    return errors, output_error, boundaries_ok


def _worst(
    current: Tuple[float, float], packed: torch.Tensor, alone: torch.Tensor
) -> Tuple[float, float]:
    """``current`` updated with the segment's (max |packed - alone|, max |alone|)."""
    if packed.shape != alone.shape:
        return (float("inf"), current[1])
    if not alone.numel():
        return current
    # Differences in at least float32 (bf16 would round them), float64 kept for float64.
    wide = torch.promote_types(alone.dtype, torch.float32)
    alone = alone.to(wide)
    err = float((packed.to(wide) - alone).abs().max())
    return (max(current[0], err), max(current[1], float(alone.abs().max())))
