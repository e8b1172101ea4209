#!/usr/bin/env bash
# The checks that need a GPU, in one command for a session that is lent one (device tool: one
# `run` of at most 10 minutes; its $OUT comes back). Each step's log lands in $OUT; BENCHMARKS.md
# sections are written in the GPU machine's copy of the tree, so the edited file is copied to
# $OUT too: merge its GPU sections by hand (the machine's .git is older than the session's).
#
#   run: bash benchmarks/gpu_session.sh            (the repo root; python3 with torch + triton)
#   STEPS="engine" bash benchmarks/gpu_session.sh     (some steps only)
#
# Default steps (issues 31 and 33), about 8 minutes on an H100/H200:
#   kernels   every kernel backend (Triton, its Hopper TMA variants triton-tma and
#             triton-tma-persistent, FlexAttention; FlashInfer and FlashAttention-4 where
#             installed) against the fastest dense attention on the machine, D 128 and 64, random
#             and causal masks; then the points as the machine's table for backend="auto"
#             (copied to $OUT/auto_table.json) and auto timed against the fastest backend at every
#             point, issue 33's 5% goal (section kernels_gpu; the points as JSON too); then
#             benchmarks/kernel_configs.py --tma: the TMA kernels' launch configs, warp
#             specialisation off and on, D=128 at density 1 and 0.1 (log kernel_configs_tma.log
#             only). Its two commands are capped at 330 + 100 s, tests at 240 s: STEPS="kernels
#             tests" fits one 10-minute call unless every command runs to its cap
#   engine    benchmarks/engine_speed.py --gpu: the oracle drafter on a Llama-7B-sized bf16 target
#             (section engine_speed_gpu), then with --compile: generate(compile=True) against
#             the eager engine on it (section engine_compile_gpu; goal: compiled rounds >= 1.5x
#             faster). With the compile run the three default steps need more than one
#             10-minute call: run STEPS="engine" alone, then "kernels tests"
#   tests     the kernel tests with Triton (its TMA variants too: tests/kernels/test_triton_tma.py)
#             and FlexAttention compiled, not interpreted, and
#             FlashInfer's and FlashAttention-4's where their packages import; the
#             engine's syncs a round; compile=True with CUDA graphs on a tiny Llama and a tiny
#             Gemma 2 (sliding windows: a mask per layer type) (exact, one graph for every round)
#             and a tiny Qwen3-Next (linear attention: unpadded chains, replays; few graphs)
# Issue 32 item 4, by name (STEPS="draft_tests draft", about 5-6 minutes; needs diffusers):
#   draft_tests  tests/video_dit/test_fused_draft.py compiled on the GPU: the fused Triton draft
#                selects the torch path's blocks and writes its index, with no host sync
#   draft    benchmarks/draft_attention.py --gpu-only: the draft side's cost as % of a dense
#            call at 32,256 tokens, fused against torch ops, and one Wan-sized denoising step
#            dense / 75% / 90% with either draft, next to its 50-step estimate with the default
#            15 dense warm-up steps, at 32k, 480x832 and 720x1280 and CogVideoX-2B's 480x720
#            (section draft_attention_gpu, the grids of its last run)
# Earlier sessions' steps, by name only (STEPS="compiled padded_text tiles"):
#   compiled DraftAttention against compiled dense, Wan and CogVideoX sizes; padded_text
#   HunyuanVideo 1.5's padded-text skip; tiles the sparse call at 128-, 64- and 32-token blocks
#   (these need diffusers: carry its wheel in .whl)
# Issue 30 item 2 (STEPS="tree_levels", under a minute): benchmarks/tree_levels.py --device cuda,
#   the zoo ViSpec drafter's tree levels through block_sparse_attention against SDPA (section
#   tree_levels; on a CPU the layer is 1.3-1.6x slower there, so mmspec/eagle/tree_attention.py's
#   SDPA_DEVICES keeps CPUs, and CUDA until this runs, on SDPA: take "cuda" out of it if this shows
#   the layer faster on a GPU)
# Issue 34.13 (STEPS="train", about 1 minute): mmspec.vision.train on the GPU through the training
#   scaffold (accelerate's CUDA state), a cut run resumed to the uninterrupted run's weights
#
# The GPU machine reaches no package index: the pinned Hugging Face wheels travel in .whl/
# (ignored by git; `bash benchmarks/gpu_session.sh --download` fills it here) and are installed
# into /tmp/site there.
#
# FlashInfer's and FlashAttention-4's wheels (`--download-kernels`, into .whl-kernels/, also
# installed when present) are for a GPU machine the tree reaches without a size limit: a device
# call of this workplace carries at most 64 MiB, and the tree (41 MB) plus .whl/ (23 MB) fill it.
# Both stacks are on PyPI for CPython 3.12 / linux x86_64 (2026-11-26; the GPU image's python is
# 3.12, its torch 2.11.0+cu130, with cuda-bindings, einops, ninja, nvidia-ml-py already there):
#   FlashAttention-4 (backend "fa4", imports flash_attn.cute): flash-attn-4 0.5 MB, quack-kernels
#     0.7 MB, apache-tvm-ffi 3.3 MB, torch-c-dlpack-ext 0.9 MB, nvidia-cutlass-dsl (+ libs-base
#     3.1 MB, libs-core 1.6 MB, libs-cu13 92 MB: the CuTe DSL compiler for CUDA 13): ~102 MB
#   FlashInfer (backend "flashinfer"): flashinfer-python 62 MB (pure Python; its kernels compile
#     with the machine's nvcc at first use, minutes: flashinfer-jit-cache is not on PyPI and
#     flashinfer-cubin is 458 MB), nccl-extensions 22.6 MB, nvidia-cudnn-frontend 11.6 MB,
#     nccl4py 3.7 MB, cuda-tile 0.4 MB, cuda-python 8 kB, and the CuTe DSL above: ~200 MB
# Neither pulls torch or CUDA runtime wheels (--no-deps; the GPU image has its own).
set -uo pipefail
download() {  # folder, specs...: wheels for CPython 3.12 on linux x86_64, no dependencies
    local dir=$1; shift
    mkdir -p "$dir"
    for spec in "$@"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform any -d "$dir" "$spec"
    done
}
if [[ "${1:-}" == "--download" ]]; then  # on the CPU machine, before the GPU run
    download .whl transformers==5.24.0 accelerate==1.15.0 huggingface_hub==2.4.0 \
        tokenizers==0.23.3 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 hf-xet==1.8.0 \
        click==8.5.1 regex diffusers==0.42.1 safetensors==0.8.0
    exit 0
fi
if [[ "${1:-}" == "--download-kernels" ]]; then  # 194 MB (14 wheels, 2026-11-26): see above
    download .whl-kernels flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
        torch-c-dlpack-ext==0.1.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
        flashinfer-python==0.7.2.post1 nccl-extensions==0.1.0 nvidia-cudnn-frontend==1.32.0 \
        nccl4py==0.6.0 cuda-tile==1.7.0 cuda-python==13.4.4
    exit 0
fi
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
PY=${PY:-python3}
STEPS=${STEPS:-kernels engine tests}
export PYTHONPATH=$PWD
for dir in .whl .whl-kernels; do
    if compgen -G "$dir/*.whl" >/dev/null; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$dir"/*.whl >>"$OUT/pip.log" 2>&1 || echo "$dir install failed (pip.log)"
        export PYTHONPATH=/tmp/site:$PWD
    fi
done
export PYTHONUNBUFFERED=1
step() {  # name, seconds, command...: run, keep the log, go on after a failure or a time-out
    local name=$1 limit=$2; shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    local log="$OUT/${STEP_LOG:-$name}.log"  # STEP_LOG: a second command of one step
    echo "== $name: $*"
    local start=$SECONDS
    timeout "$limit" "$@" >"$log" 2>&1
    echo "   rc $? in $((SECONDS - start)) s (log $log)"
}
$PY -c "import torch, transformers, triton; print(torch.__version__, torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'triton', triton.__version__)" 2>&1 | tee "$OUT/device.txt"
step kernels 330 $PY benchmarks/kernels.py --gpu-only --auto --write --points "$OUT/kernel_points.json"
[[ " $STEPS " == *" kernels "* ]] && $PY -m mmspec.kernels.tune --show >"$OUT/auto_table.json" 2>&1
STEP_LOG=kernel_configs_tma step kernels 100 $PY benchmarks/kernel_configs.py --tma --repeats 10
step engine 190 $PY benchmarks/engine_speed.py --gpu --write
STEP_LOG=engine_compile step engine 360 $PY benchmarks/engine_speed.py --gpu --compile --write
step tests 240 $PY -m pytest -q -p no:cacheprovider -p no:logging tests/kernels tests/decoding/test_syncs.py \
    "tests/decoding/test_static.py::test_inductor_compiled_rounds_are_token_identical" \
    "tests/decoding/test_static.py::test_a_compiled_graph_serves_every_round_on_sliding_windows" \
    "tests/decoding/test_static.py::test_a_compiled_graph_serves_a_hybrid_target"
MMSPEC_INDUCTOR=1 step draft_tests 120 $PY -m pytest -q -p no:cacheprovider -p no:logging tests/video_dit/test_fused_draft.py \
    "tests/video_dit/test_compile.py::test_inductor_compile_of_a_wan_with_padded_frames"
step draft 420 $PY benchmarks/draft_attention.py --gpu-only --write \
    --extra-grids 21x30x52,21x45x80 --cogvideox-grids 13x30x45
step compiled 300 $PY benchmarks/draft_attention.py --gpu-only --compile --write \
    --extra-grids 21x30x52 --cogvideox-grids 13x30x45
step padded_text 120 $PY benchmarks/draft_attention.py --padded-text --write
step train 120 $PY tests/vision/gpu_resume_check.py
step tree_levels 120 $PY benchmarks/tree_levels.py --device cuda --write
step tiles 200 $PY benchmarks/draft_attention.py --tiles 8x16,8x8,4x8,8x8/4x8,8x16/4x8 --write
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
