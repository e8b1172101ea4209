#!/usr/bin/env bash
# Every GPU check of issue 42 in one device call (`run`: at most 600 s, 64 MiB carried, 8 files
# back from $OUT). From the repository root:
#
#   bash benchmarks/gpu_session.sh --download   # here, once: the wheels the GPU image lacks, in .whl/
#   bash benchmarks/gpu_session.sh --plan       # the steps, their caps, the deadline, the carry size
#   run(command="bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=600)
#   STEPS="tests draft_tests" bash benchmarks/gpu_session.sh     # named steps only, in that order
#
# One global deadline (DEADLINE, 570 s): the default steps run in order of value, each its own
# process under `timeout -k`, its cap cut to the time left, and a step that no longer fits is
# skipped. Each benchmark writes as it measures: its BENCHMARKS.md section after every row
# ($OUT/BENCHMARKS.md, a copy of the tree's, through MMSPEC_BENCHMARKS_MD) and issue 42's goals in
# $OUT/results/<section>.json (`benchmarks/gpu_results.py`, through MMSPEC_GPU_RESULTS): a step
# killed at its cap keeps the rows it measured, and a failing backend is a "failed" row. After the
# call, merge the GPU sections of $OUT/BENCHMARKS.md by hand and copy $OUT/results/*.json to
# benchmarks/results/gpu/. $OUT gets at most 8 files: session.txt (versions, one line per step),
# steps.log (every step's output), BENCHMARKS.md, results/*.json (4) and kernel_points.json.
#
# The image (KINDS.md) has torch 2.11, Triton 3.6, transformers 5.17 and no diffusers; the wheels
# in benchmarks/gpu_wheels.txt (transformers and diffusers as constraints.txt pins them, and a
# regex recent enough for that transformers) are all that travels besides the tree. FlashInfer's
# and FlashAttention-4's stacks (~200 MB) do not fit a call's 64 MiB.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE=${DEADLINE:-570}
SETUP=40   # seconds kept for the wheels' install and the device probe
LIMIT_MIB=64
WHEELS=benchmarks/gpu_wheels.txt
PY=${PY:-python3}

# name|cap (s)|command; the first DEFAULT_STEPS run by default, in this order (the most valuable
# first), the others by name. $RES is the results folder.
# Caps from the H200 run of 2026-11-28: kernels took 39 s, engine 66 s, engine_compile 113 s;
# draft took 75 s without its 32k Wan part and now also times the per-layer copy on padded grids.
# `tests` runs 8 pytest workers (pytest-xdist is in the image): each shape compiles its own Triton
# kernels, CPU-bound work, and one worker got through about a third of tests/kernels in 240 s on
# an H200 (2026-11-28).
STEP_TABLE=(
  "kernels|100|\$PY benchmarks/kernels.py --gpu-only --write --head-dims 128 --points \$OUT/kernel_points.json"
  "draft|200|\$PY benchmarks/draft_attention.py --gpu-only --write --extra-grids 21x45x80 --draft-kernels auto"
  "engine|110|\$PY benchmarks/engine_speed.py --gpu --write --taus 4"
  "engine_compile|120|\$PY benchmarks/engine_speed.py --gpu --compile --write"
  "tests|240|\$PY -m pytest -q -n 8 -p no:cacheprovider tests/kernels tests/decoding/test_syncs.py tests/decoding/test_static.py::test_inductor_compiled_rounds_are_token_identical tests/decoding/test_static.py::test_a_compiled_graph_serves_every_round_on_sliding_windows tests/decoding/test_static.py::test_a_compiled_graph_serves_a_hybrid_target"
  "draft_tests|120|env MMSPEC_INDUCTOR=1 \$PY -m pytest -q -p no:cacheprovider tests/video_dit/test_fused_draft.py tests/video_dit/test_gathered.py"
  "kernels_full|330|\$PY benchmarks/kernels.py --gpu-only --auto --write --points \$OUT/kernel_points.json"
  "engine_taus|200|\$PY benchmarks/engine_speed.py --gpu --write"
  "kernel_configs|100|\$PY benchmarks/kernel_configs.py --tma --repeats 10"
  "compiled|300|\$PY benchmarks/draft_attention.py --gpu-only --compile --write --extra-grids 21x30x52 --cogvideox-grids 13x30x45"
  "tree_levels|120|\$PY benchmarks/tree_levels.py --device cuda --write"
  "train|120|\$PY tests/vision/gpu_resume_check.py"
)
DEFAULT_STEPS="kernels draft engine engine_compile"

field() { local IFS='|'; read -r -a parts <<<"$1"; echo "${parts[$2]}"; }
find_step() {  # name -> its table line
    for line in "${STEP_TABLE[@]}"; do [[ "$(field "$line" 0)" == "$1" ]] && { echo "$line"; return 0; }; done
    return 1
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
tree_bytes() { git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }
wheel_bytes() { awk '!/^#/ && NF == 2 { s += $2 } END { print s + 0 }' "$WHEELS"; }

plan() {
    local total=0 line name cap
    echo "gpu_session plan: one device call, deadline ${DEADLINE} s (a run may take 600 s)"
    printf '%-15s %7s  %s\n' step "cap (s)" command
    for name in $STEPS; do
        line=$(find_step "$name") || { echo "unknown step $name (steps: $(all_names))"; return 2; }
        cap=$(field "$line" 1)
        total=$((total + cap))
        printf '%-15s %7s  %s\n' "$name" "$cap" "$(field "$line" 2)"
    done
    echo "caps: ${total} s of steps + ${SETUP} s setup = $((total + SETUP)) s; deadline ${DEADLINE} s"
    local tree wheels
    tree=$(tree_bytes); wheels=$(wheel_bytes)
    echo "carry: tracked tree $(mib "$tree") MiB + wheels $(mib "$wheels") MiB ($WHEELS) =" \
         "$(mib $((tree + wheels))) MiB of ${LIMIT_MIB} MiB"
    echo "files back under \$OUT: session.txt steps.log BENCHMARKS.md results/kernels_gpu.json" \
         "results/draft_attention_gpu.json results/engine_speed_gpu.json" \
         "results/engine_compile_gpu.json kernel_points.json (8 at most)"
    echo "other steps, by name (STEPS=...): $(all_names)"
    echo "wheels here: $(wheels_here)"
    echo "device call: run(command=\"bash benchmarks/gpu_session.sh\", carry=[\".whl\"], timeout_s=600)"
}
wheels_here() {  # whether .whl/ holds exactly the manifest's wheels
    local file bytes missing=0
    while read -r file bytes; do
        [[ -z "$file" || "$file" == \#* ]] && continue
        [[ "$(stat -c %s ".whl/$file" 2>/dev/null)" == "$bytes" ]] || missing=$((missing + 1))
    done <"$WHEELS"
    local extra
    extra=$(ls .whl/*.whl 2>/dev/null | while read -r f; do grep -q "^$(basename "$f") " "$WHEELS" || echo x; done | wc -l)
    if ((missing || extra)); then
        echo "$missing missing or of another size, $extra not listed: run --download first"
    else
        echo "ok"
    fi
}
all_names() { local line; for line in "${STEP_TABLE[@]}"; do printf '%s ' "$(field "$line" 0)"; done; }

download() {  # the manifest's wheels into .whl/ (CPython 3.12, linux x86_64), nothing else there
    mkdir -p .whl
    local file bytes spec
    while read -r file bytes; do
        [[ -z "$file" || "$file" == \#* ]] && continue
        spec=$(echo "$file" | awk -F- '{ print $1 "==" $2 }')
        local into=.whl
        [[ "$file" == transformers-* ]] && into=$(mktemp -d)  # slimmed below
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform any -d "$into" "$spec" || return 1
        if [[ "$into" != .whl ]]; then  # the model code the GPU steps never build stays behind
            python3 benchmarks/slim_wheel.py "$into/$file" ".whl/$file" || return 1
            rm -rf "$into"
        fi
        [[ "$(stat -c %s ".whl/$file")" == "$bytes" ]] || { echo ".whl/$file is not $bytes bytes"; return 1; }
    done <"$WHEELS"
    for file in .whl/*.whl; do  # two versions of one package stop the install
        grep -q "^$(basename "$file") " "$WHEELS" || { echo "removing $file"; rm -f "$file"; }
    done
    ls -l .whl
}

STEPS=${STEPS:-$DEFAULT_STEPS}
case "${1:-}" in
    --plan) plan; exit $? ;;
    --download) download; exit $? ;;
    "") ;;
    *) echo "gpu_session.sh takes --plan, --download or nothing, got $1"; exit 2 ;;
esac

for name in $STEPS; do  # a typo is found before minutes of device time, not after
    find_step "$name" >/dev/null || { echo "unknown step $name (steps: $(all_names))"; exit 2; }
done
START=$SECONDS
MIN_STEP=${MIN_STEP:-20}  # a step with less time left is skipped
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT/results"
SUMMARY=$OUT/session.txt
LOG=$OUT/steps.log
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT PY
export MMSPEC_BENCHMARKS_MD=$OUT/BENCHMARKS.md MMSPEC_GPU_RESULTS=$OUT/results
cp BENCHMARKS.md "$MMSPEC_BENCHMARKS_MD"
: >"$LOG"
WHEEL_DIR=${WHEEL_DIR:-.whl}
if compgen -G "$WHEEL_DIR/*.whl" >/dev/null; then
    if timeout -k 5 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/site "$WHEEL_DIR"/*.whl >>"$LOG" 2>&1; then
        export PYTHONPATH=/tmp/site:$PWD
    else
        echo "wheels: install failed (steps.log); the image's own packages are used" >>"$SUMMARY"
    fi
fi
timeout -k 5 60 "$PY" -c "import importlib.metadata as m, torch, triton
def v(n):
    try: return m.version(n)
    except m.PackageNotFoundError: return 'missing'
print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device', '| torch',
      torch.__version__, '| triton', triton.__version__, '| transformers', v('transformers'),
      '| diffusers', v('diffusers'))" >>"$SUMMARY" 2>>"$LOG"
# what the steps import, each tried alone: a failure is one line here and its traceback in
# steps.log, before any step spends minutes finding it (an H200 call lost its DraftAttention step
# to the image's peft and to diffusers' RAE autoencoder, families the slimmed wheel had dropped)
for mod in "diffusers.hooks" "diffusers.pipelines.pipeline_utils" "mmspec.video_dit" "mmspec.kernels"; do
    timeout -k 5 60 "$PY" -c "import $mod" >>"$LOG" 2>&1 \
        || echo "import $mod failed (steps.log): the steps that need it will fail too" >>"$SUMMARY"
done
echo "deadline ${DEADLINE} s; steps: $STEPS" >>"$SUMMARY"

for name in $STEPS; do
    line=$(find_step "$name") || { echo "$name: unknown step" | tee -a "$SUMMARY"; continue; }
    cap=$(field "$line" 1)
    left=$((DEADLINE - (SECONDS - START) - 10))  # timeout -k may take 5 s more
    limit=$((cap < left ? cap : left))
    if ((limit < MIN_STEP)); then
        printf '%-15s skipped: %d s left before the deadline\n' "$name" "$((left + 10))" | tee -a "$SUMMARY"
        continue
    fi
    echo "==== $name (cap ${limit} s): $(field "$line" 2)" >>"$LOG"
    t0=$SECONDS
    eval "timeout -k 5 $limit $(field "$line" 2)" >>"$LOG" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status="timed out at ${limit} s (rows measured so far kept)" ;;
        *) status="failed (rc $rc; steps.log)" ;;
    esac
    printf '%-15s %-60s %4d s\n' "$name" "$status" "$((SECONDS - t0))" | tee -a "$SUMMARY"
done
echo "done in $((SECONDS - START)) s" | tee -a "$SUMMARY"
