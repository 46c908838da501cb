#!/usr/bin/env python3
"""qkv against Hugging Face transformers on PyTorch, side by side in one run, as ratios against the
targets of issue 39: GPT-2 small's shape (random weights) decoding at caches of 128 and ~2048
tokens in f32 and with bf16 weights, its prefill of 512 tokens and peak resident memory, and
all-MiniLM-L6-v2's sentence embeddings of 32 texts x 24 tokens. Each side runs in its own
process, one after the other, with the same thread count; medians of --repeat runs.

    /tmp/hf/bin/python bench/vs_transformers.py --threads 2    (the venv of tests/fixtures/make_hf_fixtures.py)

qkv's rows come from build/default/bench/qkv_decode_bench and `qkv bench MODEL_DIR`, PyTorch's
from bench/torch_decode.py and bench/torch_embed.py, whose own output is printed first.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def run(cmd, env=None):
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    print(out, flush=True)
    return out


def floats(pattern, text):
    return [float(m) for m in re.findall(pattern, text)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build", "default"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--minilm", default=os.path.join(os.environ.get("QKV_MODELS_DIR", os.path.expanduser("~/.cache/qkv/models")),
                                                    "all-MiniLM-L6-v2"))
    a = p.parse_args()
    env = dict(os.environ, QKV_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    py = sys.executable

    qkv = run([os.path.join(a.build, "bench", "qkv_decode_bench"), "--steps", str(a.steps), "--repeat", str(a.repeat)], env)
    # | weights | cache P | tokens/s | ms/token | bound tokens/s | of bound |
    rows = {(m[0], int(m[1])): (float(m[2]), float(m[4])) for m in re.findall(r"\| (f32|bf16) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", qkv)}
    prefill_qkv = floats(r"prefill of 512 tokens \(f32\): ([\d.]+) ms", qkv)[0]
    rss_ratio = floats(r"= \d+ MB \(([\d.]+)x\)", qkv)[0]
    torch32 = run([py, os.path.join(ROOT, "bench", "torch_decode.py"), "--threads", str(a.threads), "--steps", str(a.steps), "--repeat",
                   str(a.repeat)], env)
    torch_rates = floats(r"\| \d+ \| ([\d.]+) \| [\d.]+ \|", torch32)
    prefill_torch = floats(r"prefill of 512 tokens: ([\d.]+) ms", torch32)[0]

    results = []  # (what, qkv, peer, ratio, target, met)
    caches = sorted({c for (_, c) in rows})
    for i, cache in enumerate(caches):
        rate, bound = rows[("f32", cache)]
        results.append((f"decode f32, cache {cache}: of the read bound", f"{rate:.1f} tok/s", f"bound {bound:.1f}", rate / bound, 0.70))
        results.append((f"decode f32, cache {cache}: vs transformers", f"{rate:.1f} tok/s", f"{torch_rates[i]:.1f} tok/s",
                        rate / torch_rates[i], 2.0))
        if ("bf16", cache) in rows:
            results.append((f"decode bf16 weights, cache {cache}: vs qkv f32", f"{rows[('bf16', cache)][0]:.1f} tok/s", f"{rate:.1f} tok/s",
                            rows[("bf16", cache)][0] / rate, 1.7))
    results.append(("prefill 512 tokens (f32): speed vs transformers", f"{prefill_qkv:.0f} ms", f"{prefill_torch:.0f} ms",
                    prefill_torch / prefill_qkv, 1.5))
    # A peak at most 1.2x the weights and the cache: the ratio printed is (1.2 / measured), met at >= 1.
    results.append(("peak RSS decoding / (weights + cache)", f"{rss_ratio:.2f}x", "<= 1.2x", 1.2 / rss_ratio, 1.0))

    if os.path.isdir(a.minilm):
        emb_qkv = run([os.path.join(a.build, "qkv"), "bench", a.minilm, "--dim", "B=32", "--dim", "T=24", "--backend", "cpu", "--repeat", "5"], env)
        ms_qkv = floats(r"\ncpu\s+([\d.]+)", emb_qkv)[0]
        emb_torch = run([py, os.path.join(ROOT, "bench", "torch_embed.py"), a.minilm, "--threads", str(a.threads)], env)
        ms_torch = floats(r"in ([\d.]+) ms", emb_torch)[0]
        results.append(("MiniLM embeddings, 32 x 24 tokens: speed vs sentence-transformers", f"{ms_qkv:.0f} ms", f"{ms_torch:.0f} ms",
                        ms_torch / ms_qkv, 2.0))
    else:
        print(f"(no {a.minilm}: scripts/fetch_models.sh downloads it; the MiniLM row is left out)")

    print(f"\n| {a.threads} threads | qkv | peer | ratio | target | |\n|---|---|---|---|---|---|")
    for what, mine, peer, ratio, target in results:
        print(f"| {what} | {mine} | {peer} | {ratio:.2f} | >= {target:g} | {'met' if ratio >= target else 'not met'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
