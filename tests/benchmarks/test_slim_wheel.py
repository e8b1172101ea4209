"""benchmarks/slim_wheel.py: the transformers wheel carried to the GPU machine keeps what the GPU
steps import (every family's package, config and tokenizer; the kept families' model code) and a
RECORD that lists exactly what is left."""

import importlib.util
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("slim_wheel", ROOT / "benchmarks" / "slim_wheel.py")
slim_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slim_wheel)

ENTRIES = {
    "transformers/__init__.py": "x",
    "transformers/models/auto/modeling_auto.py": "auto",
    "transformers/models/llama/modeling_llama.py": "llama",
    "transformers/models/llama/modular_llama.py": "generator source",
    "transformers/models/bart/__init__.py": "lazy",
    "transformers/models/bart/configuration_bart.py": "config",
    "transformers/models/bart/tokenization_bart.py": "tok",
    "transformers/models/bart/modeling_bart.py": "model code",
    "transformers/models/bart/image_processing_bart.py": "image code",
    "transformers-5.24.0.dist-info/METADATA": "meta",
}


def test_slim_keeps_what_the_gpu_steps_import_and_rewrites_record(tmp_path):
    source, target = tmp_path / "t.whl", tmp_path / "out.whl"
    with zipfile.ZipFile(source, "w") as z:
        for name, text in ENTRIES.items():
            z.writestr(name, text)
        z.writestr("transformers-5.24.0.dist-info/RECORD", "stale\n")
    kept, dropped = slim_wheel.slim(str(source), str(target))
    with zipfile.ZipFile(target) as z:
        names = set(z.namelist())
        record = z.read("transformers-5.24.0.dist-info/RECORD").decode().splitlines()
    gone = {"transformers/models/llama/modular_llama.py", "transformers/models/bart/modeling_bart.py",
            "transformers/models/bart/image_processing_bart.py"}
    assert names == (set(ENTRIES) - gone) | {"transformers-5.24.0.dist-info/RECORD"}
    assert (kept, dropped) == (len(names), len(gone))
    assert {line.split(",")[0] for line in record} == names
    assert all(line.split(",")[1].startswith("sha256=") for line in record
               if not line.endswith("RECORD,,"))
    # the same wheel slims to the same bytes: gpu_wheels.txt records their count
    again = tmp_path / "again.whl"
    slim_wheel.slim(str(source), str(again))
    assert again.read_bytes() == target.read_bytes()


def test_the_gpu_steps_model_families_are_kept():
    # the families of the zoo's configs and the GPU steps' benchmarks and tests
    for family in ("llama", "qwen2", "qwen3", "qwen3_next", "gemma2", "llava", "clip", "t5", "umt5"):
        assert slim_wheel.kept(f"transformers/models/{family}/modeling_{family}.py"), family


def _slim_transformers(into: Path) -> None:
    """The installed transformers as the slimmed wheel would install it: a tree of links to the
    files `kept` keeps (what `slim` keeps of the wheel, by the same rule)."""
    import transformers

    src = Path(transformers.__file__).parent
    for path in src.rglob("*.py"):
        name = "transformers/" + path.relative_to(src).as_posix()
        if slim_wheel.kept(name):
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    dist = next(src.parent.glob("transformers-*.dist-info"), None)
    if dist is not None:  # importlib.metadata's version of transformers, which diffusers checks
        (into / dist.name).symlink_to(dist, target_is_directory=True)


def test_what_the_gpu_steps_import_imports_with_the_slimmed_transformers(tmp_path):
    # The H200 call of 2026-11-28 lost its DraftAttention step twice: `diffusers.hooks` imports
    # peft, which imports BloomPreTrainedModel, and `DiffusionPipeline` imports diffusers' RAE
    # autoencoder, which imports Dinov2WithRegistersModel; neither family's model code was kept.
    import subprocess
    import sys

    pytest = __import__("pytest")
    pytest.importorskip("diffusers")
    _slim_transformers(tmp_path)
    code = (
        "import transformers, diffusers.hooks, diffusers.pipelines.pipeline_utils\n"
        "from diffusers import DiffusionPipeline, WanTransformer3DModel, "
        "CogVideoXTransformer3DModel\n"
        "import mmspec.zoo.video_pipeline, mmspec.video_dit\n"
        # what peft imports from transformers at import time (the GPU image has peft)
        "from transformers import BloomPreTrainedModel, PreTrainedModel, Cache, DynamicCache\n"
        "from transformers.models.gpt2.modeling_gpt2 import Conv1D\n"
        "assert transformers.__file__.startswith(%r), transformers.__file__\n" % str(tmp_path)
    )
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
