import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from mmspec._cache_name import cache_kwargs
from mmspec.kernels import (
    HF_ATTENTION_NAME,
    BlockSparseMask,
    causal_block_mask,
    prefix_block_mask,
    register_hf_attention,
    tree_block_mask,
    tree_depths,
)


@pytest.fixture(scope="module")
def llama():
    register_hf_attention()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation(HF_ATTENTION_NAME)
    return model


def test_causal_mask_reproduces_sdpa_forward(llama):
    ids = torch.randint(0, 64, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = llama(ids).logits  # no block mask: SDPA fallback
        ours = llama(ids, block_sparse_mask=causal_block_mask(37, 37, 16)).logits
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)


def test_tree_forward_matches_each_branch(llama):
    """A tree verified in one forward gives every node the logits of its own root-to-node path."""
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 64, (1, 20), generator=g)
    parents = torch.tensor([-1, 0, 0, 1, 2, 4])
    tree = torch.randint(0, 64, (1, 6), generator=g)
    with torch.no_grad():
        cache = DynamicCache(config=llama.config)
        llama(prefix, **cache_kwargs(llama.forward, cache), use_cache=True)
        positions = (20 + tree_depths(parents))[None]
        tree_logits = llama(tree, **cache_kwargs(llama.forward, cache), position_ids=positions,
                            block_sparse_mask=tree_block_mask(parents, 20, 16)).logits
        for node, path in {3: [0, 1, 3], 5: [0, 2, 4, 5]}.items():
            seq = torch.cat([prefix, tree[:, path]], dim=1)
            expect = llama(seq).logits[0, -1]
            torch.testing.assert_close(tree_logits[0, node], expect, atol=1e-5, rtol=1e-5)


def _left_padded(pad_rows):
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(4))
    valid = torch.ones(2, 20, dtype=torch.bool)
    for row, pad in pad_rows.items():
        valid[row, :pad] = False
    return ids, valid, (valid.long().cumsum(-1) - 1).clamp_min(0)


def test_left_padded_batch_matches_sdpa(llama):
    """The hook ignored attention_mask when given a block_sparse_mask: the padded row's logits
    were 0.2 off. One mask object for both calls: the second must not reuse the first's keys."""
    mask = causal_block_mask(20, 20, 16)
    for pad_rows in ({0: 7}, {1: 3}):
        ids, valid, positions = _left_padded(pad_rows)
        with torch.no_grad():
            llama.set_attn_implementation("sdpa")
            ref = llama(ids, attention_mask=valid.long(), position_ids=positions).logits
            llama.set_attn_implementation(HF_ATTENTION_NAME)
            out = llama(ids, attention_mask=valid.long(), position_ids=positions,
                        block_sparse_mask=mask).logits
        torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)


def test_padding_is_hidden_but_the_block_mask_replaces_causality(llama):
    # a bidirectional draft block on a causal model stays bidirectional; only padding is hidden
    ids, valid, positions = _left_padded({0: 5})
    block = prefix_block_mask(12, 8, 16)
    token = block.to_dense() & valid[:, None, None, :] | torch.eye(20, dtype=torch.bool)
    with torch.no_grad():
        llama.set_attn_implementation("sdpa")  # a 4-D bool mask goes to SDPA as it is
        ref = llama(ids, attention_mask=token, position_ids=positions).logits
        causal = llama(ids, attention_mask=valid.long(), position_ids=positions).logits
        llama.set_attn_implementation(HF_ATTENTION_NAME)
        out = llama(ids, attention_mask=valid.long(), position_ids=positions,
                    block_sparse_mask=block).logits
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    assert (causal - ref)[valid].abs().max() > 1e-2


def test_refuses_an_additive_bias_it_cannot_add(llama):
    bias = torch.zeros(1, 1, 20, 20)
    bias[..., 3] = 0.5
    with torch.no_grad(), pytest.raises(NotImplementedError,
                                        match="attention_mask: .* got the bias 0.5"):
        llama(torch.zeros(1, 20, dtype=torch.long), attention_mask=bias,
              block_sparse_mask=causal_block_mask(20, 20, 16))


def test_rejects_non_mask(llama):
    with pytest.raises(TypeError, match="block_sparse_mask must be a BlockSparseMask"):
        llama(torch.zeros(1, 4, dtype=torch.long), block_sparse_mask=torch.ones(4, 4))


def _gemma2(softcap, window):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       attn_logit_softcapping=softcap, sliding_window=window,
                       final_logit_softcapping=None, max_position_embeddings=128)
    return Gemma2ForCausalLM(cfg).eval()


def test_refuses_a_window_it_would_silently_drop():
    # Gemma 2 alternates sliding-window layers; the block-sparse path would attend beyond the
    # window (a 4e-1 logit error)
    model = _gemma2(None, 8)
    model.set_attn_implementation(register_hf_attention())
    ids = torch.randint(0, 64, (1, 24))
    with torch.no_grad(), pytest.raises(
            NotImplementedError, match=r"sliding-window layer \(sliding_window=8\) over 24 keys"):
        model(ids, block_sparse_mask=causal_block_mask(24, 24, 16))


def test_window_masks_are_picked_per_layer():
    # Gemma 2's layers alternate sliding (window 8) and full attention: {window: mask} per layer
    model, ids = _gemma2(None, 8), torch.randint(0, 64, (1, 24))
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    within = causal & ~torch.ones(24, 24, dtype=torch.bool).tril(-8)
    masks = {None: causal_block_mask(24, 24, 16),
             8: BlockSparseMask.from_token_mask(within[None, None], 16)}
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref = model(ids).logits
        model.set_attn_implementation(register_hf_attention())
        out = model(ids, block_sparse_mask=masks).logits
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        swapped = model(ids, block_sparse_mask={None: masks[8], 8: masks[None]}).logits
        assert (swapped - ref).abs().max() > 1e-3
        with pytest.raises(ValueError, match=r"masks for sliding windows \[None\], but this "
                                             r"layer's sliding_window is 8"):
            model(ids, block_sparse_mask={None: masks[None]})


def test_gemma2_softcap_tree_forward_matches_eager():
    """Gemma 2 soft-caps its attention logits (50 in its config; 1 here, so that the cap matters
    at this size): a tree verified through the hook gives each node its path's eager logits."""
    model, uncapped = _gemma2(1.0, 4096), _gemma2(None, 4096)  # the same weights
    for m in (model, uncapped):  # logits of a few units, so the cap matters at init scale
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.data *= 30
            layer.self_attn.k_proj.weight.data *= 30
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 64, (1, 20), generator=g)
    tree = torch.randint(0, 64, (1, 6), generator=g)
    parents = torch.tensor([-1, 0, 0, 1, 2, 4])
    with torch.no_grad():
        model.set_attn_implementation("eager")
        uncapped.set_attn_implementation("eager")
        expect = {node: model(torch.cat([prefix, tree[:, path]], 1)).logits[0, -1]
                  for node, path in {3: [0, 1, 3], 5: [0, 2, 4, 5]}.items()}
        plain = uncapped(torch.cat([prefix, tree[:, [0, 1, 3]]], 1)).logits[0, -1]
        assert (plain - expect[3]).abs().max() > 1e-3  # the cap changes the logits (tol 1e-5)
        model.set_attn_implementation(register_hf_attention())
        cache = DynamicCache(config=model.config)
        # the prefill has no block mask: SDPA cannot soft-cap, so it runs through ours as well
        prefill = model(prefix, **cache_kwargs(model.forward, cache), use_cache=True).logits
        model.set_attn_implementation("eager")
        torch.testing.assert_close(prefill, model(prefix).logits, atol=1e-5, rtol=1e-5)
        model.set_attn_implementation(register_hf_attention())
        positions = (20 + tree_depths(parents))[None]
        logits = model(tree, **cache_kwargs(model.forward, cache), position_ids=positions,
                       block_sparse_mask=tree_block_mask(parents, 20, 16)).logits
    for node, ref in expect.items():
        torch.testing.assert_close(logits[0, node], ref, atol=1e-5, rtol=1e-5)


def test_a_window_wider_than_the_keys_changes_nothing():
    model, ids = _gemma2(None, 4096), torch.randint(0, 64, (1, 24))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref = model(ids).logits
        model.set_attn_implementation(register_hf_attention())
        out = model(ids, block_sparse_mask=causal_block_mask(24, 24, 16)).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_masks_edited_in_place_are_seen(llama):
    # the combination of the two masks is kept between layers: it was also kept when the same
    # tensors came back edited in place, and the old contents answered
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(3))
    block = causal_block_mask(20, 20, 16)
    keys = torch.ones(1, 1, 20, 20, dtype=torch.bool).tril()
    with torch.no_grad():
        llama(ids, attention_mask=keys, block_sparse_mask=block)
        keys[..., :3] = False  # hide keys 0-2 from every query
        edited = llama(ids, attention_mask=keys, block_sparse_mask=block).logits
        fresh = llama(ids, attention_mask=keys.clone(), block_sparse_mask=block).logits
        torch.testing.assert_close(edited, fresh)
        block.partial_masks[..., :, :5] = False  # and the block mask's own elements
        edited = llama(ids, attention_mask=keys, block_sparse_mask=block).logits
        fresh = llama(ids, attention_mask=keys.clone(),
                      block_sparse_mask=BlockSparseMask.from_token_mask(
                          block.to_dense().clone(), block.block_size)).logits
        torch.testing.assert_close(edited, fresh)


def test_attention_sinks_join_the_softmax_as_the_models_eager_code_has_them():
    """GPT-OSS passes `s_aux` (one sink logit per head) to its attention function; the block-sparse
    path applies it from the log-sum-exp (issue 29: it was dropped, 0.1-0.4 off in the logits)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from mmspec.kernels.hf import mmspec_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 2, False
    module.sinks = torch.randn(4) * 2
    q, k, v = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    causal = torch.ones(5, 9, dtype=torch.bool).tril(4)  # bottom-right aligned
    additive = torch.zeros(1, 1, 5, 9).masked_fill(~causal, torch.finfo(torch.float32).min)
    want, _ = eager_attention_forward(module, q, k, v, additive, scaling=0.25, dropout=0.0,
                                      s_aux=module.sinks)
    got, _ = mmspec_attention_forward(module, q, k.repeat_interleave(2, 1),
                                      v.repeat_interleave(2, 1), None, scaling=0.25,
                                      block_sparse_mask=BlockSparseMask.from_token_mask(
                                          causal[None, None], 16),
                                      s_aux=module.sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_calls_without_a_mask_run_the_models_former_implementation():
    """Switched to mmspec's attention, a model that ran eager keeps its eager code for plain
    forwards (GPT-OSS: the sinks), so the switch alone changes no output."""
    from transformers import GptOssConfig, GptOssForCausalLM

    from mmspec.kernels.hf import use_block_sparse_attention

    cfg = GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       num_local_experts=2, num_experts_per_tok=1, sliding_window=64)
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg).eval()
    for module in model.modules():
        if hasattr(module, "sinks"):
            torch.nn.init.normal_(module.sinks, std=3.0)
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
        restore = use_block_sparse_attention(model)
        try:
            got = model(ids).logits
        finally:
            restore()
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("former", ["eager", None])
def test_a_prefill_into_an_empty_static_cache_is_unchanged_by_the_switch(former):
    """transformers passes no mask to a prompt's forward into an empty `StaticCache` (more keys
    than queries, the rest unwritten slots), relying on SDPA's top-left `is_causal`: the eager
    fallback (a model switched from eager) and the soft-capping one (Gemma 2 loaded with our
    attention) must align it top-left too; bottom-right, they attended to the zero slots
    (compile=True's prefill on Gemma 2)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, StaticCache

    from mmspec.kernels.hf import use_block_sparse_attention

    register_hf_attention()
    torch.manual_seed(0)
    if former is None:  # soft-capped logits, through the block-sparse layer
        model = Gemma2ForCausalLM(Gemma2Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=64,
            layer_types=["full_attention"], attn_logit_softcapping=1.0)).eval()
    else:
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, attn_implementation=former)).eval()
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
        if former is None:
            model.set_attn_implementation(HF_ATTENTION_NAME)
        else:
            use_block_sparse_attention(model)  # the model is this test's alone: not restored
        got = model(ids, past_key_values=StaticCache(config=model.config, max_cache_len=40),
                    use_cache=True).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
