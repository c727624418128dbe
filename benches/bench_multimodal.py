"""Multimodal benchmark: synthetic image chats (Qwen2-VL conventions) tokenized and packed by
``tokpack.multimodal`` against the processor-per-sample route, in the same run.

The corpus: ``--chats`` JSONL records of 1-2 user turns with 1-3 images each (paths into a pool
of ``--pool`` JPEGs of 200-1400 pixels a side) and an assistant answer; a BPE with Qwen2-VL's
vision tokens and chat template (generation markers on assistant turns), and Qwen2-VL's
default image settings (max_pixels 1,003,520). tokpack's time is JSONL -> token shards
(header-only image sizes, content hashes) -> packed directory at ``--max-len``. The baseline is
what ``datasets.map`` runs per record: ``Qwen2VLProcessor.apply_chat_template(...,
tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`` (images decoded, resized
and patchified), on ``--baseline`` records (its rate is per record; the Arrow writing of
``pixel_values`` a real ``map`` adds is not counted, which favours the baseline). Ids, labels and
grids must be identical on those records. Goal (issue 22): tokpack >= 10x the baseline's
records/s. Run on a release build:

    python benches/bench_multimodal.py --chats 20000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._tokenizer_factory import sentence  # noqa: E402
from tests._vl_factory import build_vl_tokenizer, processor  # noqa: E402
from tokpack._io.tables import table  # noqa: E402
from tokpack.multimodal import pack_files, tokenize_files  # noqa: E402

DEFAULTS = {
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "min_pixels": 56 * 56,
    "max_pixels": 28 * 28 * 1280,
}


def make_corpus(work: Path, chats: int, pool: int, seed: int = 0):
    from PIL import Image

    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    (work / "imgs").mkdir()
    names = []
    for i in range(pool):
        w, h = rng.randint(200, 1400), rng.randint(200, 1400)
        # Smooth noise (upscaled): JPEG-compressible like a photo, cheap to make.
        small = nprng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
        Image.fromarray(small).resize((w, h), Image.BILINEAR).save(
            work / "imgs" / f"{i}.jpg", quality=90
        )
        names.append(f"imgs/{i}.jpg")
    records = []
    for _ in range(chats):
        messages, images = [], []
        for turn in range(rng.randint(1, 2)):
            content = []
            for _ in range(rng.randint(1 if turn == 0 else 0, 3 if turn == 0 else 1)):
                images.append(rng.choice(names))
                content.append({"type": "image"})
            content.append({"type": "text", "text": sentence(rng, rng.randint(3, 30))})
            messages.append({"role": "user", "content": content})
            messages.append({"role": "assistant", "content": sentence(rng, rng.randint(5, 80))})
        records.append({"messages": messages, "images": images})
    jsonl = work / "chats.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    return jsonl, records


def baseline(records, work: Path, tok: Path):
    proc = processor(tok)
    proc.image_processor = _defaults_processor()
    out = []
    start = time.perf_counter()
    for r in records:
        messages = json.loads(json.dumps(r["messages"]))
        it = iter(r["images"])
        for m in messages:
            if isinstance(m["content"], list):
                for part in m["content"]:
                    if part["type"] == "image":
                        part["image"] = str(work / next(it))
        enc = proc.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            return_tensors="np",
        )
        ids = enc["input_ids"][0]
        out.append(
            (
                ids.tolist(),
                np.where(enc["assistant_masks"][0] == 1, ids, -100).tolist(),
                enc["image_grid_thw"].tolist() if "image_grid_thw" in enc else [],
            )
        )
    return out, time.perf_counter() - start


def _defaults_processor():
    from tests._vl_factory import image_processor

    return image_processor(DEFAULTS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=20_000)
    parser.add_argument("--pool", type=int, default=64, help="distinct images")
    parser.add_argument("--baseline", type=int, default=300, help="records the baseline runs")
    parser.add_argument("--max-len", type=int, default=8192)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tokpack-bench-multimodal-"))
    try:
        jsonl, records = make_corpus(work, args.chats, args.pool)
        tok = build_vl_tokenizer(work / "vl")
        (tok / "preprocessor_config.json").write_text(json.dumps(DEFAULTS))
        loads = [os.getloadavg()[0]]

        start = time.perf_counter()
        manifest = tokenize_files(jsonl, work / "tokens", tok, vision=tok)
        tok_s = time.perf_counter() - start
        start = time.perf_counter()
        packed = pack_files(work / "tokens", work / "packed", args.max_len, overlong="drop")
        pack_s = time.perf_counter() - start
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        loads.append(os.getloadavg()[0])

        k = min(args.baseline, args.chats)
        expected, base_s = baseline(records[:k], work, tok)
        loads.append(os.getloadavg()[0])

        import pyarrow.parquet as pq

        ours = pq.read_table(sorted((work / "tokens").glob("part-*.parquet"))).slice(0, k)
        got = [
            (ids, labels, [m["grid"] for m in json.loads(media)])
            for ids, labels, media in zip(
                ours.column("input_ids").to_pylist(),
                ours.column("labels").to_pylist(),
                ours.column("media").to_pylist(),
            )
        ]
        same = got == expected

        n = args.chats
        ours_s = tok_s + pack_s
        base_rate = k / base_s
        f = packed["figures"]
        counts = manifest["counts"]
        print(
            f"{n:,} chats, {counts['images']:,} images ({args.pool} distinct JPEGs), "
            f"{counts['tokens']:,} tokens of which {counts['vision_tokens']:,} vision tokens"
        )
        print(
            table(
                ["route", "records", "seconds", "records/s", "speed-up"],
                [
                    [
                        "processor per sample (apply_chat_template)",
                        f"{k:,}",
                        f"{base_s:.1f}",
                        f"{base_rate:,.1f}",
                        "1.00x",
                    ],
                    [
                        "tokpack tokenize + pack",
                        f"{n:,}",
                        f"{ours_s:.1f}",
                        f"{n / ours_s:,.1f}",
                        f"{n / ours_s / base_rate:.1f}x",
                    ],
                    ["  of which tokenize", f"{n:,}", f"{tok_s:.1f}", f"{n / tok_s:,.1f}", ""],
                ],
            )
        )
        print(
            table(
                ["packing", "rows", "padding tokens", "efficiency"],
                [
                    [
                        "one sample per row",
                        f"{f['samples_packed']:,}",
                        f"{f['padding_tokens_unpacked']:,}",
                        f"{f['tokens'] / (f['samples_packed'] * args.max_len):.3f}",
                    ],
                    [
                        f"tokpack bfd, max_len {args.max_len}",
                        f"{f['rows']:,}",
                        f"{f['padding_tokens']:,}",
                        f"{f['efficiency']:.3f}",
                    ],
                ],
            )
        )
        print(f"identical ids, labels and grids on {k:,} records: {same}")
        print(f"peak RSS of the process after tokpack: {rss_mb:,.0f} MB")
        print(f"load average (1 min) before/after tokpack/after baseline: {loads}")
        return 0 if same else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
