#!/usr/bin/env python3
"""The peer of `qkv bench MODEL_DIR` on all-MiniLM-L6-v2: sentence-transformers' encode of a batch
of 32 texts of 24 tokens (with [CLS] and [SEP]), the same thread count; median of --repeat runs.

    /tmp/hf/bin/python bench/torch_embed.py ~/.cache/qkv/models/all-MiniLM-L6-v2 --threads 2
    build/default/qkv bench ~/.cache/qkv/models/all-MiniLM-L6-v2 --dim B=32 --dim T=24 --backend cpu --repeat 5
"""
import argparse
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    st = SentenceTransformer(a.model, device="cpu")
    texts = [" ".join(["word"] * 22)] * 32  # 22 word tokens + [CLS] + [SEP] = 24
    assert st.tokenize(texts)["input_ids"].shape == (32, 24)
    st.encode(texts)
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        st.encode(texts, batch_size=32)
        times.append(time.perf_counter() - t0)
    print(f"sentence-transformers, torch {torch.__version__}, {a.threads} threads: 32 x 24 tokens in {statistics.median(times) * 1e3:.1f} ms (median of {a.repeat})")


if __name__ == "__main__":
    main()
