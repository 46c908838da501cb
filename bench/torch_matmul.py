"""PyTorch CUDA peer for qkv's GPU matmul figures: torch.matmul on the device's GPU in f32 (TF32
off) and f16 (tensor cores), as the half-precision issue's target asks (f16 at 4096^3, qkv's
cooperative-matrix kernel against it). Run beside qkv_graph_bench on the same GPU:
  QKV_BENCH_MATMUL=4096,4096,4096 QKV_BENCH_BACKENDS=vulkan qkv_graph_bench --benchmark_filter=matmul
  python3 bench/torch_matmul.py 4096,4096,4096
Usage: python3 torch_matmul.py [M,N,K ...]"""
import sys, time, torch

torch.backends.cuda.matmul.allow_tf32 = False


def timed(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


shapes = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [(512, 512, 512), (4096, 4096, 4096)]
print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
print("dtype    M      N      K        ms    TFLOP/s")
for dt in (torch.float32, torch.float16):
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        t = timed(lambda: torch.matmul(a, b))
        print(f"{str(dt)[6:]:7} {m:6} {n:6} {k:6} {t*1e3:9.3f} {2*m*n*k/t/1e12:9.2f}", flush=True)
