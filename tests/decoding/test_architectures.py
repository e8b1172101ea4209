"""The architecture sweep (issue 29) in the test suite: every causal LM class of the installed
transformers ends as its row of `docs/architectures.md` says: `pass` (the model's own tokens) or
a one-line refusal, never a mismatch or a traceback from inside a library. An architecture a new
transformers release adds fails here until the table is regenerated and read
(`python -m tests.decoding.arch_sweep --write`)."""

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import arch_sweep

TABLE = arch_sweep.read_table()


def test_the_table_names_every_architecture():
    missing = sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - set(TABLE))
    assert not missing, (f"architectures not in docs/architectures.md: {missing}; run "
                         f"python -m tests.decoding.arch_sweep --write and read the result")


@pytest.mark.parametrize("model_type", sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_architecture(model_type):
    result = arch_sweep.sweep_one(model_type)
    row = TABLE.get(model_type)
    if result["built"]:
        assert row is None or row["outcome"] == "not built", (
            f"{model_type} no longer builds tiny: {result['built']}")
        pytest.skip(f"not built tiny: {result['built']}")
    bad = {case: state for case, state in result.items()
           if case != "built" and not (state == "pass" or state.startswith("refused"))}
    assert not bad, f"{model_type}: {bad}"
    assert row is not None, f"{model_type} is not in docs/architectures.md"
    for case in arch_sweep.CASES:
        assert result[case].split(":")[0] == row[case], (
            f"{model_type} {case}: {result[case]}; the table says {row[case]}")
