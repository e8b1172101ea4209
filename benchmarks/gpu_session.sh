#!/usr/bin/env bash
# The checks that need a GPU, in one command for a session that is lent one (device tool: one
# `run` of at most 10 minutes; its $OUT comes back). Each step's log lands in $OUT; BENCHMARKS.md
# sections are written in the GPU machine's copy of the tree, so the edited file is copied to
# $OUT too: merge its GPU sections by hand (the machine's .git is older than the session's).
#
#   run: bash benchmarks/gpu_session.sh            (the repo root; a venv with torch + triton)
#   STEPS="compiled" bash benchmarks/gpu_session.sh   (some steps only, e.g. one per call when
#                                                      all four would pass the 10-minute limit)
#
# 1. kernels and DraftAttention tests with Triton compiled, not interpreted
# 2. compiled DraftAttention against compiled dense (never measured yet), Wan and CogVideoX sizes
# 3. HunyuanVideo 1.5's padded-text skip on the GPU (16 heads, bf16)
# 4. the sparse call's speed at 128-, 64- and 32-token blocks (the fidelity bar is met at 32)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
PY=${PY:-python}
STEPS=${STEPS:-tests compiled padded_text tiles}
step() {  # name, command...: run, keep the log, go on after a failure
    local name=$1; shift
    [[ " $STEPS " == *" $name "* ]] || return 0
    echo "== $name: $*"
    local start=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    echo "   rc $? in $((SECONDS - start)) s (log $OUT/$name.log)"
}
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$OUT/device.txt"
step tests $PY -m pytest -q -x tests/kernels tests/video_dit/test_sparse_attention.py \
    tests/video_dit/test_compile.py
step compiled $PY benchmarks/draft_attention.py --gpu-only --compile --write \
    --extra-grids 21x30x52 --cogvideox-grids 13x30x45
step padded_text $PY benchmarks/draft_attention.py --padded-text --write
step tiles $PY benchmarks/draft_attention.py --tiles 8x16,8x8,4x8,8x8/4x8,8x16/4x8 --write
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
