"""Tree positions: root + 1 + depth on every axis; for Qwen2.5-VL, M-RoPE with rope_deltas."""

import torch
from spec_helpers import OracleDrafter, qwen_vl_inputs, tiny_qwen2_5_vl

from mmspec import generate


def test_qwen2_5_vl_verification_positions_match_get_rope_index():
    target = tiny_qwen2_5_vl(0)
    ids, kwargs = qwen_vl_inputs(1)
    ref = target.generate(ids, do_sample=False, max_new_tokens=10, eos_token_id=[], **kwargs)
    new = ref[:, ids.shape[1]:]
    seen = []

    def record(module, args, kw):
        if kw.get("pixel_values") is not None:  # the prefill: the engine's probe came before
            seen.clear()
        if "block_sparse_mask" in kw:  # verification forwards only
            seen.append((kw["input_ids"].clone(), kw["position_ids"].clone()))

    hook = target.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = generate(target, OracleDrafter(new, [ids.shape[1]], 3, "tree"), ids,
                       max_new_tokens=10, eos_token_id=[], **kwargs)
    finally:
        hook.remove()
    assert torch.equal(out.sequences, ref)
    # every tree went through the shared block-sparse layer (a last round can be a plain step)
    assert len(seen) >= out.stats.rounds - 1 >= 2
    # the reference: the M-RoPE positions of the whole final sequence, computed from scratch
    full, _ = target.model.get_rope_index(ref, image_grid_thw=kwargs["image_grid_thw"],
                                          mm_token_type_ids=torch.cat(
                                              [kwargs["mm_token_type_ids"], torch.zeros_like(new)], 1))
    assert target.model.rope_deltas.item() != 0  # the image really shifts text positions
    start = ids.shape[1]  # slot of the first root (the prefill's token)
    for tokens, pos in seen:  # pos: [4, 1, N] = text row + 3 M-RoPE axes
        assert pos.shape[0] == 4 and (pos[1:] == pos[1:2]).all()  # text tokens: equal axes
        root = pos[1, 0, 0]
        slot = int((full[0, 0] == root).nonzero()[0])  # where this root sits in the sequence
        assert torch.equal(tokens[0, 0], ref[0, slot])
        # "tree" oracle: node 2i+1 (tree node 2i+2) is the true token at depth i
        for depth in range(1, (tokens.shape[1] - 1) // 2 + 1):
            node = 2 * depth
            if slot + depth < ref.shape[1]:
                assert pos[1, 0, node] == full[0, 0, slot + depth]
                assert pos[1, 0, node - 1] == pos[1, 0, node]  # siblings share a position
        assert slot >= start


def test_the_unused_next_position_ids_is_gone():
    # tree positions come from the prefill's (`prefill_position_ids`); nothing called it
    from mmspec.decoding import positions

    assert not hasattr(positions, "next_position_ids")


def test_a_model_whose_generate_drops_position_ids_counts_slots_in_padded_rows():
    """HyperCLOVAX-Vision-V2's `prepare_inputs_for_generation` sets `position_ids` to None: its
    own generate gives every token its slot index, left padding included. The engine's positions
    (the cumsum rule) were 5 behind in a row with 5 pads and flipped its tokens (the sweep's
    second configuration): they must be slot indices too."""
    import arch_sweep

    from mmspec.decoding.positions import prefill_position_ids

    model = arch_sweep.build("hyperclovax_vision_v2", "vlm", second=True)
    prompts, mask = arch_sweep.PROMPTS_SECOND, arch_sweep.MASK_SECOND
    assert torch.equal(prefill_position_ids(model, prompts, mask, {}),
                       torch.arange(prompts.shape[1]).expand_as(prompts))
    with torch.no_grad():
        ref = model.generate(prompts, attention_mask=mask, max_new_tokens=8, do_sample=False,
                             pad_token_id=0)
    out = generate(model, arch_sweep.OracleChain(ref, mask, new_tokens=8), prompts,
                   attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
