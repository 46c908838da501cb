#!/usr/bin/env python3
"""The GPU peer of bench/decode_attention_bench.cpp --backend vulkan: PyTorch CUDA's
scaled_dot_product_attention for one decode step (a query per sequence, H = 32 query heads over
Hkv = 8 key/value heads with enable_gqa, D = 128) against caches of 4096 and 32768 tokens, batch
1 and 8, f32 and bf16, timed with CUDA events (median of --repeat runs of 20 steps), and the
cache's bytes over the device's copy bandwidth measured in the same run (a 1 GiB clone).

    python3 bench/torch_decode_sdpa.py [--repeat 5]      (PyTorch 2.5 or newer, with CUDA)
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def device_ms(fn, repeat, steps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(1 << 28, device="cuda")
    bandwidth = 2 * x.numel() * 4 / (device_ms(lambda: x.clone(), a.repeat, 5) / 1e3)
    del x
    print(f"decode SDPA on {torch.cuda.get_device_name()}, torch {torch.__version__}; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'B':5} {'cache':6} {'dtype':8} {'ms':>9} {'GB/s':>9} {'of bound':>9}")
    for b in (1, 8):
        for m in (4096, 32768):
            for dt in (torch.float32, torch.bfloat16):
                q = torch.randn(b, 32, 1, 128, device="cuda", dtype=dt)
                k, v = (torch.randn(b, 8, m, 128, device="cuda", dtype=dt) for _ in range(2))
                with torch.no_grad():
                    ms = device_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), a.repeat)
                rate = 2 * k.numel() * k.element_size() / (ms / 1e3)
                print(f"{b:<5} {m:<6} {str(dt)[6:]:8} {ms:9.3f} {rate / 1e9:9.1f} {100 * rate / bandwidth:8.0f}%", flush=True)


if __name__ == "__main__":
    main()
