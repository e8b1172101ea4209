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
