#!/usr/bin/env python3
"""Compile-time benchmark: wall time and peak memory of compiling DSL translation units.

The DSL's expressions are types, so compile time is part of what a model costs its user. This
compiles translation units with the exact command CMake uses for them (from the build's
compile_commands.json), at -O0 and -O2, several times each, and prints medians as a table next
to a peer measured in the same run: a translation unit that only includes the DSL (what every
model pays before it builds anything).

    python3 bench/compile_time.py --build build/default            # the units with targets
    python3 bench/compile_time.py --build build/default --repeat 5 --levels O2

Peak memory is the compiler's maximum resident set (ru_maxrss of the driver and its cc1plus).
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

# Targets at -O2 (seconds, MiB) by unit: the one that builds the decoder block and the
# encoder-decoder block with both activations (it was 54 s and 1.1 GB), and the one that reflects
# all three pretrained architectures, GPT-2, Llama and BERT (modules, configs, loading; 9.9 s and
# 509 MiB before config reading went through models/config.cpp).
TARGETS = {"models/block_models.cpp": {"O2": (15.0, 500.0)}, "models/pretrained.cpp": {"O2": (5.0, 500.0)}}

HEADERS_ONLY = '#include "dsl/dsl.hpp"\nint main() { return 0; }\n'


def compile_command(build, source):
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    for e in entries:
        if os.path.realpath(e["file"]) == os.path.realpath(source):
            args = e.get("arguments") or shlex.split(e["command"])
            return args, e["directory"], e["file"]
    sys.exit(f"compile_time.py: {source} is not in {build}/compile_commands.json (configure the build first)")


def with_level(args, original, level, source, output):
    """The command that compiled `original`, with its optimisation flags replaced by -<level> -g0,
    compiling `source` to `output`."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("-O") or a.startswith("-g") or a == "-c" or os.path.realpath(a) == os.path.realpath(original):
            continue
        out.append(a)
    return out + [f"-{level}", "-g0", "-c", source, "-o", output]


def measure(cmd, cwd):
    """Seconds and peak MiB of one compile."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit("compile_time.py: the compiler failed:\n" + proc.stderr.read().decode() + "\n" + shlex.join(cmd))
    return seconds, usage.ru_maxrss / 1024.0


def main():
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(root, "build", "default"), help="a configured build directory")
    p.add_argument("--source", action="append", help="translation units (default: those with targets, " + ", ".join(TARGETS) + ")")
    p.add_argument("--levels", default="O0,O2", help="optimisation levels, comma-separated")
    p.add_argument("--repeat", type=int, default=3, help="compiles per unit and level (the median is printed)")
    a = p.parse_args()
    sources = a.source or [os.path.join(root, unit) for unit in TARGETS]
    levels = a.levels.split(",")

    args, cwd, original = compile_command(a.build, sources[0])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        peer = os.path.join(tmp, "dsl_headers_only.cpp")
        with open(peer, "w") as f:
            f.write(HEADERS_ONLY)
        units = [(os.path.relpath(s, root), compile_command(a.build, s)) for s in sources]
        units.append(("peer: dsl/dsl.hpp alone", (args, cwd, original)))
        for name, (unit_args, unit_cwd, unit_file) in units:
            source = peer if name.startswith("peer") else unit_file
            for level in levels:
                cmd = with_level(unit_args, unit_file, level, source, os.path.join(tmp, "unit.o"))
                runs = [measure(cmd, unit_cwd) for _ in range(a.repeat)]
                rows.append((name, level, statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                             os.path.getsize(os.path.join(tmp, "unit.o")) / 1e6))

    peer_of = {r[1]: r for r in rows if r[0].startswith("peer")}
    print(f"compiler: {args[0]}; medians of {a.repeat}; peer: a unit that only includes the DSL")
    print(f"| unit | level | seconds | peak MiB | object MB | s vs peer | target |")
    print(f"|---|---|---|---|---|---|---|")
    for name, level, s, mib, mb in rows:
        target = ""
        if level in TARGETS.get(name, {}):
            ts, tm = TARGETS[name][level]
            ok = s <= ts and mib <= tm
            target = f"<= {ts:g} s, <= {tm:g} MiB: {'met' if ok else 'MISSED'}"
        ratio = s / peer_of[level][2] if level in peer_of and peer_of[level][2] > 0 else float("nan")
        print(f"| {name} | -{level} | {s:.2f} | {mib:.0f} | {mb:.1f} | {ratio:.1f}x | {target} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
