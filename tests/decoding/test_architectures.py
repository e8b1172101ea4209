"""The architecture sweep (issue 29) in the test suite: every causal LM and image-text-to-text class
of the installed transformers, in two tiny configurations, ends as its row of
`docs/architectures.md` says: `pass` (the model's own tokens, or a reported near-tie) or a
one-line refusal, never a mismatch or a traceback from inside a library.
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
           if case in arch_sweep.COLUMNS[kind] and state.split(":")[0] not in _FINE[case]}
    assert not bad, f"{model_type}: {bad}"
    assert row is not None, f"{model_type} is not in docs/architectures.md"
    for case in arch_sweep.COLUMNS[kind]:
        # a near-tie may flip with the summation order (threads): it stands for a pass
        state, want = (_TIE.get(s, s) for s in (result[case].split(":")[0], row[case]))
        assert state == want, f"{model_type} {case}: {result[case]}; the table says {row[case]}"


# a near-tie (the model's own top two logits within arch_sweep.NEAR_TIE) is reported, not failed;
# the second configuration may not build tiny (untested, as the table says)
_FINE = {case: {"pass", "refused", "near-tie"} for case in arch_sweep.COLUMNS["vlm"]}
_FINE[arch_sweep.SECOND_CASE] = {"pass", "refused", "near-tie", "not built"}
_TIE = {"near-tie": "pass"}


def test_a_flip_at_a_near_tie_is_reported_with_its_gap_and_any_other_is_a_mismatch():
    """`near_tie` reads the model's own logits where our tokens first leave its greedy ones: a
    flip between logits 1.7e-4 apart (of a largest logit of 0.5) is a near-tie, 1e-2 apart a
    mismatch; pads (id 0) are not fed."""
    import torch
    from types import SimpleNamespace

    seen = []

    def model_with_gap(gap):
        def forward(input_ids, use_cache):
            seen.append(input_ids)
            logits = torch.zeros(1, input_ids.shape[1], 8)
            logits[0, -1, 3], logits[0, -1, 4] = 0.5, 0.5 - gap  # the model picks 3
            return SimpleNamespace(logits=logits)
        return forward

    ref = torch.tensor([[0, 5, 6, 3, 3], [7, 5, 6, 1, 1]])
    got = torch.tensor([[0, 5, 6, 3, 4], [7, 5, 6, 1, 1]])
    line = arch_sweep.near_tie(model_with_gap(1.7e-4), got, ref, prompt_len=3)
    assert line is not None and "1.7e-04 apart" in line
    assert seen[-1].tolist() == [[5, 6, 3]]
    assert arch_sweep.near_tie(model_with_gap(1e-2), got, ref, prompt_len=3) is None


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
