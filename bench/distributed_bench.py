#!/usr/bin/env python3
"""Distributed benchmark: P ranks of 1 thread against 1 process of 2 threads, for the same work.

Ring attention (causal, zigzag, forward and backward at (1, H, N, D)) and data-parallel training
of the copy task, each against one process doing the whole of it, measured in the same round,
plus the cost model's prediction of the ratio from what one thread measures alone:

  ring, per rank:  sum over the P steps of max(compute of the step, the message that step
                   hides), forward and backward; compute = 2P - 1 whole chunk-pair blocks and 2
                   causal (diagonal) ones, each timed alone on one thread; a message = one k/v
                   block, timed as a sendrecv around the ring; the backward sends two (k/v and the
                   dk/dv accumulator) per step and one more at the end. With more ranks than
                   cores, compute stretches by ranks / cores.
  data-parallel:   one rank's step on its shard (timed alone, one thread, as the data-parallel
                   step runs it: forward and backward, then the update) + an allreduce of the
                   gradients' bytes (timed in the job).

    python3 bench/distributed_bench.py --build build/default               # P = 2 and 4, N = 4096
    python3 bench/distributed_bench.py --build build/default --ranks 2 --seq 8192 --rounds 5
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys


def run(cmd, env_extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **env_extra)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/default")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-bytes", type=int, default=4096, help="data-parallel gradient buckets (the copy task has 20 KiB)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "qkv_distributed_bench")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("distributed_bench: mpirun not found (scripts/setup.sh installs Open MPI)")
    mpirun = os.path.realpath(mpirun)  # Open MPI takes its prefix from the path it is started by
    common = ["--seq", str(a.seq), "--dim", str(a.dim), "--heads", str(a.heads), "--reps", str(a.reps), "--batch", str(a.batch),
              "--bucket-bytes", str(a.bucket_bytes)]

    print(f"N = {a.seq}, H = {a.heads}, D = {a.dim}, causal, zigzag; copy task batch {a.batch}; {a.cores} cores; "
          f"medians of {a.rounds} rounds of {a.reps} runs\n")
    attn_rows, train_rows = [], []
    for p in a.ranks:
        peer, calib, job = [], [], []
        for _ in range(a.rounds):
            model = ["--model-ranks", str(p)]
            peer.append(run([exe] + common + model, {"QKV_NUM_THREADS": "2"}))
            calib.append(run([exe] + common + model, {"QKV_NUM_THREADS": "1"}))
            job.append(run([mpirun, "--oversubscribe", "-np", str(p), "-x", "QKV_NUM_THREADS=1", exe] + common, {}))
        t_peer = med(peer, "attention_seconds")
        t_ring = med(job, "ring_forward") + med(job, "ring_backward")
        stretch = max(1.0, p / a.cores)
        ff, fb = med(calib, "block_full_forward") * stretch, med(calib, "block_full_backward") * stretch
        df, db = med(calib, "block_diag_forward") * stretch, med(calib, "block_diag_backward") * stretch
        msg = med(job, "message_seconds")
        fwd = max(2 * df + ff, msg if p > 1 else 0) + sum(max(2 * ff, msg if s < p - 1 else 0) for s in range(1, p))
        bwd = max(2 * db + fb, msg) + sum(max(2 * fb, (2 if s < p - 1 else 1) * msg) for s in range(1, p)) + msg
        per_step_compute = 2 * ff  # forward, a middle step
        waited = med(job, "ring_wait_fraction")
        attn_rows.append((p, t_peer, t_ring, t_peer / t_ring, t_peer / (fwd + bwd), msg / per_step_compute, med(job, "ring_hidden_fraction"),
                          waited, med(job, "message_bytes")))

        if p == a.ranks[0]:
            c = a.seq // (2 * p)
            flop_rate = 4 * c * c * a.dim * a.heads / med(calib, "block_full_forward")  # one rank's attention FLOP/s
            bandwidth = med(job, "message_bytes") / msg

        t_peer_train = med(peer, "train_step_seconds")
        t_dp = med(job, "train_step_seconds")
        model_dp = med(calib, "train_shard_step_seconds") * stretch + med(job, "allreduce_seconds")
        train_rows.append((p, t_peer_train, t_dp, t_peer_train / t_dp, t_peer_train / model_dp, med(job, "train_overlapped_fraction"),
                           med(job, "train_done_fraction")))

    print("Ring attention, forward + backward")
    print("| ranks | 1 process, 2 threads (ms) | ranks x 1 thread (ms) | ratio | modelled ratio | model error "
          "| message / compute per step | transfers hidden | time in waits | message |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p, tp, tr, ratio, modelled, per_step, hidden, waited, bytes_ in attn_rows:
        err = (modelled - ratio) / ratio
        print(f"| {p} | {tp * 1e3:.1f} | {tr * 1e3:.1f} | {ratio:.2f} | {modelled:.2f} | {err:+.0%} | {per_step:.2f} | {hidden:.0%} "
              f"| {waited:.0%} | {bytes_ / 2**20:.1f} MiB |")
    print("\n(message / compute per step below 1: the transfer of the next block can hide behind the current block's compute; "
          "transfers hidden: of the ring's messages, those complete when the compute they overlap ended, on the rank that hid "
          "fewest (the backward's last message, with nothing left to overlap, counts as not hidden); time in waits: the share of "
          "the ring's time ranks spent blocked on a transfer, which includes waiting for a slower rank)")
    print("\nData-parallel training step (copy task)")
    print("| ranks | 1 process, 2 threads (ms) | ranks x 1 thread (ms) | ratio | modelled ratio | model error "
          "| reductions started in the backward | complete when it ended |")
    print("|---|---|---|---|---|---|---|---|")
    for p, tp, tr, ratio, modelled, overlapped, done in train_rows:
        print(f"| {p} | {tp * 1e3:.2f} | {tr * 1e3:.2f} | {ratio:.2f} | {modelled:.2f} | {(modelled - ratio) / ratio:+.0%} "
              f"| {overlapped:.0%} | {done:.0%} |")
    print(f"\n(gradients in buckets of {a.bucket_bytes} bytes; a bucket's reduction starts once the backward has computed all of its "
          "gradients, while the backward goes on: started in the backward = kernels of it were still to run; complete when it "
          "ended = wholly hidden, on the rank with fewest)")
    extrapolate(flop_rate, bandwidth)


def seconds(t):
    return f"{t:.1f} s" if t >= 1 else f"{t * 1e3:.1f} ms"


def extrapolate(flop_rate, bandwidth, heads=32, dim=64, network=12.5e9):
    """The ring's cost per rank beyond this machine: per step, 2 whole blocks of c = N / (2P)
    rows (8 c^2 D H FLOP forward) against one k/v message of 2 (N/P) D H floats; the message hides
    when it takes less than the compute, i.e. when c >= 2 F / BW."""
    print(f"\nCost model beyond this machine (H = {heads}, D = {dim}; F = {flop_rate / 1e9:.0f} GFLOP/s per rank, measured here "
          f"on one core; messages at {bandwidth / 1e9:.1f} GB/s, measured here between ranks, and at {network / 1e9:.1f} GB/s, "
          f"a 100 Gb/s network)")
    print(f"(the message hides when c = N / (2P) >= 2 F / BW: here c >= {2 * flop_rate / bandwidth:.0f} rows; a GPU rank at "
          f"F = 300 TFLOP/s needs c >= {2 * 300e12 / network:.0f} rows over a 100 Gb/s network, {2 * 300e12 / 450e9:.0f} over NVLink at 450 GB/s)")
    print("| N | ranks | rows per rank | k/v message per step | compute per step | message here | message on the network "
          "| hidden here / on the network | per-rank memory |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (65536, 262144, 1048576):
        for p in (2, 8, 64):
            c = n // (2 * p)
            msg_bytes = 2 * (n // p) * dim * heads * 4
            compute = 8 * c * c * dim * heads / flop_rate
            here, net = msg_bytes / bandwidth, msg_bytes / network
            memory = 16 * (n // p) * dim * heads * 4  # q, k, v, y, dy, dq and the travelling blocks and accumulators
            print(f"| {n} | {p} | {n // p} | {msg_bytes / 2**20:.0f} MiB | {seconds(compute)} | {seconds(here)} | {seconds(net)} "
                  f"| {'yes' if here <= compute else 'no'} / {'yes' if net <= compute else 'no'} | {memory / 2**30:.2f} GiB |")


if __name__ == "__main__":
    main()
