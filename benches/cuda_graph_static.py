"""CUDA graph over static-shape packed batches (issue 38): captures one training step of a small
model (forward, loss, backward) once, on the first batch, then replays it over an epoch of
``PackedCollator(static=StaticShapes(...))`` batches by copying each batch into the captured
input buffers; the optimizer steps outside the graph. Exits 0 with a "skipped" line without
CUDA; installs nothing; takes well under a minute on a GPU.

    python benches/cuda_graph_static.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from tokpack import plan
from tokpack.torch.collate import PackedCollator
from tokpack.torch.static import StaticShapes

ROWS, MAX_LEN, CAP, ALIGN, VOCAB = 4, 1024, 16, 64, 512


class SmallModel(torch.nn.Module):
    """Two same-document causal attention blocks over ``document_ids``."""

    def __init__(self, dim=128, heads=4):
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(VOCAB, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(2))
        self.mlps = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, ids, doc, labels):
        x = self.emb(ids)
        b, n, d = x.shape
        causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
        mask = ((doc.unsqueeze(-1) == doc.unsqueeze(-2)) & causal).unsqueeze(1)
        for qkv, mlp in zip(self.blocks, self.mlps):
            q, k, v = qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + mlp(h.transpose(1, 2).reshape(b, n, d))
        logits = self.head(x)[:, :-1]
        return F.cross_entropy(
            logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100,
            reduction="sum",
        )  # fmt: skip


def batches(n_samples=400, seed=0):
    rng = np.random.default_rng(seed)
    p = plan(rng.integers(8, 400, n_samples), MAX_LEN, max_segments_per_row=CAP,
             align_segments=ALIGN)  # fmt: skip
    rows = []
    for r in range(p.n_bins):
        ls = p.row(r)[2]
        rows.append({"input_ids": rng.integers(1, VOCAB, int(ls.sum())), "seq_lengths": ls})
    collator = PackedCollator("padded", static=StaticShapes(ROWS, MAX_LEN, CAP, align=ALIGN))
    return [collator.collate(rows[i : i + ROWS]) for i in range(0, len(rows), ROWS)]


def main() -> int:
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = SmallModel().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    epoch = batches()
    keys = ("input_ids", "document_ids", "labels")
    static = {k: epoch[0][k].to(dev).clone() for k in keys}
    # Warm up on a side stream (as torch.cuda.graphs asks), then capture one step.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            model(*(static[k] for k in keys)).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        loss = model(*(static[k] for k in keys))
        loss.backward()
    captures = 1
    start = time.perf_counter()
    losses = []
    for batch in epoch:
        for k in keys:
            if batch[k].shape != static[k].shape:
                print(f"FAILED: {k} has shape {tuple(batch[k].shape)}, captured {static[k].shape}")
                return 1
            static[k].copy_(batch[k], non_blocking=True)
        opt.zero_grad(set_to_none=False)
        graph.replay()
        opt.step()
        losses.append(loss.detach().clone())
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    finite = bool(torch.isfinite(torch.stack(losses)).all())
    print(
        f"{len(epoch)} batches of {ROWS} x {MAX_LEN} tokens replayed from {captures} capture in "
        f"{wall:.2f} s; losses finite: {finite}"
    )
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
