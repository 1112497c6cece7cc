#!/usr/bin/env python3
"""HF tokenizers encoding speed on one core, the counterpart of `kestrel tokenize --bench` (docs/benchmarks/tokenizer.md).

    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false /opt/oracle/bin/python tools/bench_tokenizer_hf.py \\
        tests/data/tokenizers/qwen2 tests/data/tokenizers/corpus.jsonl [--repeat 3]

Times `Tokenizer.encode` string by string (what Kestrel does per request) and `encode_batch` over the whole corpus
(one Rust call, so no Python overhead per string; single-threaded by RAYON_NUM_THREADS=1).
"""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model_dir")
ap.add_argument("corpus")
ap.add_argument("--repeat", type=int, default=3)
args = ap.parse_args()
tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
corpus = [json.loads(line) for line in open(args.corpus, encoding="utf-8") if line.strip()]
nbytes = sum(len(s.encode()) for s in corpus)
for p in range(args.repeat):
    t = time.perf_counter()
    n = sum(len(tok.encode(s).ids) for s in corpus)
    dt = time.perf_counter() - t
    print(f"encode   pass {p + 1}: {len(corpus)} strings, {nbytes} bytes, {n} tokens in {dt:.4f} s: "
          f"{nbytes / dt / 1e6:.2f} MB/s, {n / dt:.0f} tokens/s")
for p in range(args.repeat):
    t = time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(corpus))
    dt = time.perf_counter() - t
    print(f"batch    pass {p + 1}: {len(corpus)} strings, {nbytes} bytes, {n} tokens in {dt:.4f} s: "
          f"{nbytes / dt / 1e6:.2f} MB/s, {n / dt:.0f} tokens/s")
