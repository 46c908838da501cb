#!/usr/bin/env python3
"""The peer of bench/decode_bench.cpp: transformers' GPT2LMHeadModel on PyTorch (eager, f32, the
same thread count), GPT-2 small's shape with 2048 positions and random weights; decode tokens/s
against a cache of P tokens and the prefill of 512 tokens (the last position's logits, as
generate asks), medians of --repeat runs; --dtype bfloat16 for the bf16 rows.

    /tmp/hf/bin/python bench/torch_decode.py --threads 2     (the venv of tests/fixtures/make_hf_fixtures.py)
"""
import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.cache_utils import DynamicCache


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    config = GPT2Config(n_positions=2048)
    model = GPT2LMHeadModel(config).eval().to(getattr(torch, a.dtype))
    print(f"transformers GPT2LMHeadModel in {a.dtype}, torch {torch.__version__}, {a.threads} threads; medians of {a.repeat} runs of {a.steps} decode steps")
    print("| cache P | tokens/s | ms/token |\n|---|---|---|")
    with torch.no_grad():
        for cache in (128, 2048 - a.steps - 1):
            rates = []
            for _ in range(a.repeat):
                ids = (torch.arange(cache) * 7919 % 50257).unsqueeze(0)
                out = model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    out = model(nxt, past_key_values=past, use_cache=True)
                    past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                rates.append(a.steps / (time.perf_counter() - t0))
            r = statistics.median(rates)
            print(f"| {cache} | {r:.1f} | {1e3 / r:.1f} |")
        times = []
        ids = (torch.arange(512) * 7919 % 50257).unsqueeze(0)
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            # As generate runs it (and qkv's step graph): logits of the last position only.
            model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        print(f"\nprefill of 512 tokens: {t * 1e3:.1f} ms ({512 / t:.0f} tokens/s)")


if __name__ == "__main__":
    main()
