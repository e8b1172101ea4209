"""The architecture sweep (issue 29) in the test suite: every causal LM and image-text-to-text class
of the installed transformers ends as its row of `docs/architectures.md` says: `pass` (the
model's own tokens) or a one-line refusal, never a mismatch or a traceback from inside a library.
An architecture a new transformers release adds fails here until the table is regenerated and
read (`python -m tests.decoding.arch_sweep --write`)."""

import pytest

import arch_sweep

TABLE = arch_sweep.read_table()
CLASSES = [(kind, m) for kind, mapping in arch_sweep.MAPPINGS.items() for m in sorted(mapping)]


@pytest.mark.parametrize("kind", sorted(arch_sweep.MAPPINGS))
def test_the_table_names_every_architecture(kind):
    missing = sorted(set(arch_sweep.MAPPINGS[kind]) - set(TABLE[kind]))
    assert not missing, (f"{kind} architectures not in docs/architectures.md: {missing}; run "
                         f"python -m tests.decoding.arch_sweep --write and read the result")


@pytest.mark.parametrize("kind,model_type", CLASSES, ids=[f"{k}-{m}" for k, m in CLASSES])
def test_architecture(kind, model_type):
    result = arch_sweep.sweep_one(model_type, kind)
    row = TABLE[kind].get(model_type)
    if result["built"]:
        assert row is None or row["outcome"] == "not built", (
            f"{model_type} no longer builds tiny: {result['built']}")
        pytest.skip(f"not built tiny: {result['built']}")
    bad = {case: state for case, state in result.items()
           if case in arch_sweep.COLUMNS[kind]
           and not (state == "pass" or state.startswith("refused"))}
    assert not bad, f"{model_type}: {bad}"
    assert row is not None, f"{model_type} is not in docs/architectures.md"
    for case in arch_sweep.COLUMNS[kind]:
        assert result[case].split(":")[0] == row[case], (
            f"{model_type} {case}: {result[case]}; the table says {row[case]}")


def test_every_product_name_maps_to_a_row_and_survives_a_rewrite(tmp_path):
    """The hand-written section (Llama 3.1 -> `llama`, ...) names only model types that have a
    row, and `--write` keeps it."""
    import re

    text = arch_sweep.TABLE.read_text()
    section = "\n".join(arch_sweep.products_section(text))
    named = set(re.findall(r"\| `([a-z0-9_.-]+)`", section)) | {
        m for cell in re.findall(r"\| (`[a-z0-9_.-]+`(?:, `[a-z0-9_.-]+`)+) \|", section)
        for m in re.findall(r"`([a-z0-9_.-]+)`", cell)}
    rows = set(TABLE["causal"]) | set(TABLE["vlm"])
    assert len(named) > 50 and not named - rows, sorted(named - rows)
    copy = tmp_path / "architectures.md"
    copy.write_text(text)
    arch_sweep.write_table({"causal": {}, "vlm": {}}, 1.0, copy)
    assert section and section in copy.read_text()
