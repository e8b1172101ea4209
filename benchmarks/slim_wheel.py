"""A transformers wheel cut to the model families the GPU steps build, so that the tracked tree and
the carried wheels fit the device call's 64 MiB (benchmarks/gpu_session.sh --download).

    python3 benchmarks/slim_wheel.py transformers-5.24.0-py3-none-any.whl OUT.whl

It drops every `modular_*.py` (the sources transformers generates its modeling files from;
nothing imports them at run time) and, for each family `transformers/models/NAME/` outside `KEEP`,
its model code (`modeling_*`, image, video and feature processors), keeping its package, config
and tokenizer modules, which transformers' auto classes and other families import; then it
rewrites RECORD to list what is left. transformers imports model code lazily by name, so a family
whose code is not there fails only when something builds one. Entries keep their dates, so the
same wheel slims to the same bytes (`benchmarks/gpu_wheels.txt` records them).
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile

# the families the GPU steps' benchmarks and tests build (benchmarks/*.py, the `tests`,
# `draft_tests`, `tree_levels` and `train` steps' files, the zoo's configs), their auto classes,
# and a few common ones for a step run by hand; then those that other packages import from
# transformers by name when they are imported: diffusers' RAE autoencoder (`diffusers.models`,
# so `DiffusionPipeline` and every pipeline: dinov2_with_registers, siglip, vit_mae) and the
# image's peft (`peft.utils.constants`: bloom), which `diffusers.hooks` imports when peft is
# installed. Without them `import diffusers...` fails on the GPU machine (an H200 call lost its
# DraftAttention step to each, 2026-11-28).
KEEP = frozenset({
    "auto", "bert", "clip", "deepseek_v3", "deepseek_v4", "gemma", "gemma2", "gemma3", "gpt2",
    "gpt_neo", "gpt_oss", "inkling", "llama", "llama4", "llava", "llava_next", "mistral",
    "mixtral", "phi3", "qwen2", "qwen2_5_vl", "qwen2_vl", "qwen3", "qwen3_moe", "qwen3_next",
    "siglip", "t5", "umt5",
    "bloom", "dinov2_with_registers", "vit_mae",
})


_MODEL_CODE = ("modeling_", "image_processing_", "video_processing_", "feature_extraction_",
               "convert_")


def kept(name: str) -> bool:
    """Whether the wheel entry `name` stays."""
    base = name.rsplit("/", 1)[-1]
    if base.startswith("modular_"):
        return False
    parts = name.split("/")
    if len(parts) > 3 and parts[0] == "transformers" and parts[1] == "models":
        return parts[2] in KEEP or not base.startswith(_MODEL_CODE)
    return True


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(source: str, target: str) -> tuple[int, int]:
    """Write the slimmed copy of wheel `source` to `target`; -> (entries kept, entries dropped)."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        infos = src.infolist()
        record = next((i for i in infos if i.filename.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise SystemExit(f"{source}: no .dist-info/RECORD, so it is no wheel")
        lines, dropped = [], 0
        for info in infos:
            if info is record:
                continue
            if not kept(info.filename):
                dropped += 1
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            lines.append(_record_line(info.filename, data))
        lines.append(f"{record.filename},,")
        dst.writestr(record, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    return len(lines), dropped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 benchmarks/slim_wheel.py SOURCE.whl TARGET.whl", file=sys.stderr)
        return 2
    kept_n, dropped = slim(*argv)
    print(f"{argv[1]}: {kept_n} entries kept, {dropped} dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
