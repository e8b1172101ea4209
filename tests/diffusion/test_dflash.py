"""DFlash / DFlash2 drafters: their checkpoints' layout loads, the drafts are their code's, and
decoding through the engine is lossless (greedy token-identical to `target.generate`; sampling
exact by a chi-square test of the joint of the new tokens)."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from mmspec import DFlashDrafter, generate

from .dflash_reference import dflash_raw_config, random_state, reference_generate, write_checkpoint

VOCAB, EOS = 48, 2


def tiny_qwen3(seed=0, vocab=VOCAB, layers=3, init_std=0.3):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, head_dim=8,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                      eos_token_id=EOS, initializer_range=init_std, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).eval()


def tiny_llama(seed=0, vocab=VOCAB, layers=3, init_std=0.3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                      eos_token_id=EOS, initializer_range=init_std)
    return LlamaForCausalLM(cfg).eval()


def drafter_for(tmp_path, target, seed=0, scale=0.3, **kw):
    raw = dflash_raw_config(target, **kw)
    state = random_state(raw, seed, scale)
    path = write_checkpoint(tmp_path / f"ckpt{seed}", raw, state)
    return DFlashDrafter.from_pretrained(path, target), raw, state


PROMPT = torch.tensor([5, 9, 3, 17, 11, 4, 22, 8])
KINDS = {
    "dflash": dict(kind="DFlashDraftModel", is_causal=None),
    "dflash2": dict(kind="DFlash2DraftModel"),
    "dflash2_sliding": dict(kind="DFlash2DraftModel", sliding=True),
    "dflash2_sliding_causal": dict(kind="DFlash2DraftModel", sliding=True, is_causal=None),
    "dflash_scaled_embedding": dict(kind="DFlashDraftModel", input_embedding_scale=2.0,
                                    layer_ids=[0, 2], block=4),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_drafts_equal_their_dflash_generate(tmp_path, name):
    """Round by round, the drafted block of `mmspec.generate` equals the one their loop drafts
    (re-derived in `dflash_reference.py`), and so does the output."""
    target = tiny_qwen3(0)
    drafter, raw, state = drafter_for(tmp_path, target, **KINDS[name])
    new = 20
    expected, their_drafts = reference_generate(state, raw, target, PROMPT, new)
    ours = []
    out = generate(target, drafter, PROMPT[None], max_new_tokens=new, eos_token_id=[],
                   do_sample=False, on_round=lambda d, r, s: ours.append(d.tokens[0].clone()))
    assert torch.equal(out.sequences[0], expected)
    if len(ours[-1]) == 0:  # their last block may draft the final token itself; ours emits it
        ours, last = ours[:-1], their_drafts.pop()  # as the bonus, without a draft
        assert len(last) == 1
    assert len(ours) == len(their_drafts) > 3
    for round_, (a, b) in enumerate(zip(ours, their_drafts)):
        assert torch.equal(a, b), (round_, a, b)


@pytest.mark.parametrize("make", [tiny_qwen3, tiny_llama])
@pytest.mark.parametrize("kind", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_greedy_left_padded_batch_equals_target_generate(tmp_path, make, kind):
    # a 12-token vocabulary: random drafts are accepted now and then, so rows get holes
    target = make(1, vocab=12)
    drafter, _, _ = drafter_for(tmp_path, target, kind=kind, block=8)
    rows = [torch.randint(3, 12, (n,), generator=torch.Generator().manual_seed(n))
            for n in (4, 9, 7)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                               pad_token_id=0)
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=30,
                   do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted < out.stats.drafted


def test_custom_generate_and_compile_are_token_identical(tmp_path, monkeypatch):
    """`target.generate(custom_generate=mmspec.speculative(drafter))` with transformers' own
    repetition penalty, and `compile=True` (the static cache; the compiled call replaced by the
    model's own, its outputs overwritten at the next call as CUDA graphs overwrite theirs)."""
    import mmspec
    from mmspec.decoding import static

    target = tiny_qwen3(2, vocab=12)
    drafter, _, _ = drafter_for(tmp_path, target, kind="DFlash2DraftModel", block=5)
    ids = torch.tensor([[0, 0, 5, 9, 11, 4], [7, 3, 10, 5, 9, 8]])
    mask = (ids != 0).long()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                          repetition_penalty=1.3)
    out = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                          repetition_penalty=1.3, custom_generate=mmspec.speculative(drafter))
    assert torch.equal(out, ref)

    outputs = []

    def graph_like(model, config):
        def call(**kwargs):
            for tensor in outputs:
                tensor.fill_(float("nan"))
            outputs.clear()
            result = model(**kwargs)
            outputs.extend([result.logits, *(result.hidden_states or ())])
            return result
        return call

    monkeypatch.setattr(static, "compiled_forward", graph_like)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20,
                   do_sample=False, compile=True)
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted > 0


V = 5  # the joint of 4 new tokens has 5**4 = 625 cells


def _exact_joint(model, prompt, n, temperature):
    joint, seqs = torch.ones(1), prompt
    with torch.no_grad():
        for _ in range(n):
            probs = (model(seqs).logits[:, -1].float() / temperature).softmax(-1)  # [V^i, V]
            joint = (joint[:, None] * probs).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(V, 0),
                              torch.arange(V).repeat(seqs.shape[0])[:, None]], 1)
    return joint


@pytest.mark.parametrize("kind", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_sampling_draws_the_target_joint(tmp_path, kind):
    """10000 identical rows sample 4 new tokens; their joint against the exact one (chi-square),
    with the drafter's probabilities in the acceptance rule (a point-mass reading of a sampled
    draft would skew it)."""
    from scipy.stats import chisquare

    target = tiny_qwen3(0, vocab=V, init_std=0.02)
    target.lm_head.weight.data *= 15.0  # peaked: a wrong acceptance rule shows
    drafter, _, _ = drafter_for(tmp_path, target, kind=kind, block=4, mask=4,
                                selector_top_k=3, scale=0.2)
    prompt, n, new, temperature = torch.tensor([[1, 3, 4, 3]]), 10000, 4, 0.5
    torch.manual_seed(1)
    out = generate(target, drafter, prompt.expand(n, -1), max_new_tokens=new, do_sample=True,
                   temperature=temperature, top_k=None, eos_token_id=[], pad_token_id=0)
    assert 0 < out.stats.accepted < out.stats.drafted
    cells = (out.sequences[:, -new:] * V ** torch.arange(new - 1, -1, -1)).sum(-1)
    counts = torch.bincount(cells, minlength=V ** new).double()
    expected = _exact_joint(target, prompt, new, temperature)
    assert counts[expected == 0].sum() == 0
    exp = expected.double() * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    e = e * obs.sum() / e.sum()
    assert chisquare(obs.numpy(), e.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("kind", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_batch_rows_draft_as_each_row_alone(tmp_path, kind):
    """Left padding and the holes of rows that accepted fewer tokens stay out of a row's
    context: round by round, each row of a batch drafts what it drafts alone (while the block
    has its full length in both runs; near the end it follows the longest row)."""
    target = tiny_qwen3(1, vocab=12)
    drafter, _, _ = drafter_for(tmp_path, target, kind=kind, block=6)
    rows = [torch.randint(3, 12, (n,), generator=torch.Generator().manual_seed(n))
            for n in (4, 9, 7)]
    width = max(len(r) for r in rows)
    ids, mask = torch.zeros(3, width, dtype=torch.long), torch.zeros(3, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    batch, holes = [], []
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[],
                   on_round=lambda d, r, s: (batch.append(d.tokens.clone()),
                                             holes.append(len(set(r.num_accepted.tolist())) > 1)))
    assert any(holes)  # rows accepted different numbers of tokens in some round
    compared = 0
    for i, r in enumerate(rows):
        alone = []
        generate(target, drafter, r[None], max_new_tokens=40, eos_token_id=[],
                 on_round=lambda d, res, s: alone.append(d.tokens[0].clone()))
        for j, (together, solo) in enumerate(zip(batch, alone)):
            if together.shape[1] == solo.shape[0] == 5:
                assert torch.equal(together[i], solo), (i, j)
                compared += 1
    assert compared > 15 and out.stats.accepted > 0


@pytest.mark.parametrize("kind", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_sampled_drafts_carry_the_law_they_were_drawn_from(tmp_path, kind):
    """Under sampling, `Draft.probs` row t is their law for position t: DFlash the call's warped
    softmax of the draft logits; DFlash2 the selector's softmax(scores / T) given the token
    drawn at t - 1; and every drawn token has probability > 0 under it."""
    from mmspec.decoding.draft import DraftState
    from mmspec.decoding.sampling import SamplingConfig, target_probs

    from .dflash_reference import draft_logits, selector_scores

    target = tiny_qwen3(0)
    drafter, raw, state = drafter_for(tmp_path, target, kind=kind, block=6,
                                      output_multiplier=0.2)
    ids = torch.cat([PROMPT, torch.tensor([7])])[None]
    layers = [i + 1 for i in raw["dflash_config"]["target_layer_ids"]]
    with torch.no_grad():
        hs = target(PROMPT[None], output_hidden_states=True).hidden_states
    features = torch.cat([hs[i] for i in layers], -1)
    sampling = SamplingConfig(True, 0.7, top_k=20)
    draft = drafter.propose(DraftState(ids, torch.ones_like(ids), 10, round=0,
                                       target_hidden=features, sampling=sampling,
                                       generator=torch.Generator().manual_seed(0)))
    drafter.end()
    block = torch.full((6,), raw["dflash_config"]["mask_token_id"])
    block[0] = 7
    embed, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    with torch.no_grad():
        hidden, logits = draft_logits(state, raw, features[0], block, len(PROMPT), embed, head)
        if kind == "DFlashDraftModel":
            expected = target_probs(logits, sampling)
        else:
            previous = torch.cat([block[:1], draft.tokens[0, :-1]])
            cand, scores = selector_scores(state, raw, hidden, logits, previous)
            expected = torch.zeros_like(logits).scatter(-1, cand, (scores / 0.7).softmax(-1))
    assert torch.allclose(draft.probs[0], expected, atol=1e-5)
    assert (draft.probs[0].gather(-1, draft.tokens[0, :, None]) > 0).all()


def test_path_search_tree_is_lossless_and_holds_the_chain(tmp_path):
    """`path_search=CPSConfig(...)`: CPS beams over the block plus the argmax chain, one tree;
    greedy output equals target.generate on a padded batch, and each round's tree contains the
    chain the plain drafter would draft."""
    from mmspec.diffusion import CPSConfig

    target = tiny_qwen3(1, vocab=12)
    _, raw, state = drafter_for(tmp_path, target, kind="DFlashDraftModel", block=6)
    # lam 0: the beams follow the n-gram proxy alone, so they need not hold the argmax chain
    tree = DFlashDrafter.from_pretrained(tmp_path / "ckpt0", target,
                                         path_search=CPSConfig(beam_width=3, lam=0.0))
    chain = DFlashDrafter.from_pretrained(tmp_path / "ckpt0", target)
    ids = torch.tensor([[0, 0, 5, 9, 11, 4], [7, 3, 10, 5, 9, 8]])
    mask = (ids != 0).long()
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    rounds = []

    def check(draft, result, stats):
        rounds.append(draft)

    out = generate(target, tree, ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                   on_round=check)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted and any(d.parents.dim() == 2 and d.tokens.shape[1] > 5
                                          for d in rounds)
    first = rounds[0]
    plain = []
    generate(target, chain, ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
             on_round=lambda d, r, s: plain.append(d))
    assert torch.equal(first.tokens[:, :5], plain[0].tokens)  # the chain comes first
    assert first.parents[0, :5].tolist() == [-1, 0, 1, 2, 3]
    sampled = generate(target, tree, ids, attention_mask=mask, max_new_tokens=8, do_sample=True,
                       generator=torch.Generator().manual_seed(0))
    assert sampled.sequences.shape[1] <= ids.shape[1] + 8
    with pytest.raises(ValueError, match="path_search: DFlash2 walks its own candidate"):
        drafter_for(tmp_path / "two", target)[0].__class__.from_pretrained(
            tmp_path / "two" / "ckpt0", target, path_search=CPSConfig())


SWEEP = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2",
         "olmo2", "granite", "cohere", "starcoder2", "qwen3_moe")


@pytest.mark.parametrize("model_type", SWEEP)
def test_architectures_of_the_sweep_stay_lossless(tmp_path, model_type):
    """The architecture sweep's tiny targets (`tests/decoding/arch_sweep.py`: sliding windows,
    soft caps, scaled embeddings, MoE, GPT-2's learned positions) on its left-padded batch: a
    DFlash drafter reading their first and last layers, greedy output identical to their own."""
    from tests.decoding import arch_sweep

    model = arch_sweep.build(model_type)
    prompts, mask = arch_sweep.PROMPTS[:2], arch_sweep.MASK[:2]
    new = arch_sweep.NEW_TOKENS
    ref = model.generate(prompts, attention_mask=mask, max_new_tokens=new, do_sample=False,
                         pad_token_id=0)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    raw = dflash_raw_config(model, mask=5, layer_ids=[0, layers - 1])
    raw["vocab_size"] = model.get_input_embeddings().weight.shape[0]
    drafter = DFlashDrafter.from_pretrained(
        write_checkpoint(tmp_path / "d", raw, random_state(raw)), model)
    out = generate(model, drafter, prompts, attention_mask=mask, max_new_tokens=new,
                   do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
