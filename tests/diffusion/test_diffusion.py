import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from mmspec.decoding.draft import DraftState, VerifyResult
from mmspec.diffusion import diffusion
from mmspec.diffusion.adl import ADLConfig, AdaptiveDraftLength, generated_length
from mmspec.diffusion.cps import CPSConfig
from mmspec.diffusion.diffusion import (
    DiffusionDrafter,
    DiffusionDrafterConfig,
    NaiveDiffusionDrafter,
)
from mmspec.diffusion.lattice import build_lattice

from .models import EOS, MASK, VOCAB


def tokenizer(names: dict) -> PreTrainedTokenizerFast:
    vocab = {name: i for i, name in names.items()}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")))


def state(ids, round=0, max_tokens=64):
    return DraftState(ids, torch.ones_like(ids), max_tokens, round=round)


def result(accepted):
    return VerifyResult(torch.tensor(accepted), [], [])


# -- construction errors ------------------------------------------------------------------------
def test_mask_id_outside_the_vocabulary_raises(dlm, target):
    with pytest.raises(ValueError, match=r"mask_token_id 64 is outside .*\[0, 64\)"):
        DiffusionDrafter(dlm, 64, target)


def test_mask_id_equal_to_eos_raises(dlm, target):
    with pytest.raises(ValueError, match="also an EOS id"):
        DiffusionDrafter(dlm, EOS, target)


def test_vocabulary_mismatch_names_what_differs(dlm, target):
    names = {i: f"t{i}" for i in range(VOCAB)}
    other = {**names, 7: "seven"}
    with pytest.raises(ValueError, match=r"1 shared ids map .*\(id 7 is 't7' for the drafter and "
                                         r"'seven' for the target"):
        DiffusionDrafter(dlm, MASK, target, tokenizer=tokenizer(names),
                         target_tokenizer=tokenizer(other))
    fewer = {i: f"t{i}" for i in range(40)}
    with pytest.raises(ValueError, match="24 target ids are missing"):
        DiffusionDrafter(dlm, MASK, target, tokenizer=tokenizer(fewer),
                         target_tokenizer=tokenizer(names))
    with pytest.raises(ValueError, match="pass both"):
        DiffusionDrafter(dlm, MASK, target, tokenizer=tokenizer(names))


def test_dlm_only_ids_are_suppressed(dlm, target):
    drafter_names = {i: f"t{i}" for i in range(VOCAB)}
    target_names = {i: f"t{i}" for i in range(60)}  # 60..63 (the mask 63 among them) DLM-only
    drafter = DiffusionDrafter(dlm, MASK, target, tokenizer=tokenizer(drafter_names),
                               target_tokenizer=tokenizer(target_names))
    assert drafter.suppressed.tolist() == [60, 61, 62, 63]


@pytest.mark.parametrize("make", [
    lambda m, t: NaiveDiffusionDrafter(m, MASK, t, k=0),
    lambda m, t: DiffusionDrafter(m, MASK, t, config=DiffusionDrafterConfig(fixed_k=-3)),
])
def test_k_not_positive_raises(dlm, target, make):
    with pytest.raises(ValueError, match="k must be > 0"):
        make(dlm, target)


@pytest.mark.parametrize("kwargs, match", [
    ({"return_tree": True, "cps": None}, "needs CPS"),
    ({"proposal": "l2r"}, "proposal must be"),
    ({"max_context": 30}, "must exceed the largest block 30"),
    # non-int lengths crashed deep inside generate (torch.full, heapq) instead
    ({"fixed_k": 2.5}, r"DiffusionDrafterConfig.fixed_k must be an int, got 2.5"),
    ({"fixed_k": "8"}, r"fixed_k must be an int, got '8'"),
    ({"ngram_order": 0}, "ngram_order must be >= 1, got 0"),
    ({"adl": None, "fixed_k": 8, "ngram_order": 2.5}, "ngram_order must be an int"),
    # wrong types passed on to a comparison or an attribute read deep inside a round
    ({"adl": None}, r"DiffusionDrafterConfig.adl must be ADLConfig, got None"),
    ({"cps": {"tau": 0.9}}, r"cps must be CPSConfig or None, got \{'tau': 0.9\}"),
    ({"shift": "no"}, r"shift must be bool, got 'no'"),
    ({"prefix_cache": 1}, r"prefix_cache must be bool, got 1"),
    ({"adl": {"k_min": 2}}, r"adl must be ADLConfig"),
])
def test_bad_drafter_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiffusionDrafterConfig(**kwargs)


@pytest.mark.parametrize("make, match", [
    (lambda: ADLConfig(rho="0.5"), r"ADLConfig.rho must be int or float, got '0.5'"),
    (lambda: ADLConfig(rho=True), r"ADLConfig.rho must be int or float, got True"),
    (lambda: CPSConfig(tau="0.8"), r"CPSConfig.tau must be int or float, got '0.8'"),
    (lambda: CPSConfig(lam=None), r"CPSConfig.lam must be int or float, got None"),
])
def test_bad_adl_and_cps_values_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_drafter_arguments_are_named(dlm, target):
    with pytest.raises(TypeError, match="config must be a DiffusionDrafterConfig, got dict"):
        DiffusionDrafter(dlm, MASK, target, config={"fixed_k": 4})
    with pytest.raises(TypeError, match="mask_token_id must be an int, got '63'"):
        DiffusionDrafter(dlm, "63", target)
    for eos, shown in ((100, r"\[100\]"), (-1, r"\[-1\]"), ([EOS, "2"], r"\['2'\]")):
        with pytest.raises(ValueError, match=r"eos_token_id: expected ids in the target's "
                                             r"vocabulary \[0, 64\), got " + shown):
            DiffusionDrafter(dlm, MASK, target, eos_token_id=eos)
    # k=None made the baseline an ADL drafter, silently
    with pytest.raises(ValueError, match="k must be an int > 0 .*got None"):
        NaiveDiffusionDrafter(dlm, MASK, target, k=None)
    drafter = DiffusionDrafter(dlm, MASK, target, eos_token_id=torch.tensor([EOS]))
    assert drafter.eos_ids == [EOS] and type(drafter.eos_ids[0]) is int


# -- one round ----------------------------------------------------------------------------------
def test_naive_drafter_proposes_the_argmax_path_through_the_first_eos(dlm, target):
    ids = torch.randint(2, 60, (2, 9))
    draft = NaiveDiffusionDrafter(dlm, MASK, target, k=12).propose(state(ids))
    lattice = build_lattice(dlm, ids, torch.ones_like(ids), [12, 12], MASK, VOCAB, True)
    for b in range(2):
        argmax = lattice.argmax()[b].tolist()
        expected = argmax[:generated_length(argmax, [EOS]) + 1]
        n = len(expected) if draft.num_tokens is None else int(draft.num_tokens[b])
        assert draft.tokens[b, :n].tolist() == expected
    assert draft.parents.tolist() == list(range(-1, draft.tokens.shape[1] - 1))
    assert draft.probs is None  # a chosen path is a point-mass proposal


def test_adl_drives_the_block_length_round_by_round(dlm, target, monkeypatch):
    seen = []

    def spy(model, ids, mask, ks, *args):
        seen.append(list(ks))
        return build_lattice(model, ids, mask, ks, *args)

    monkeypatch.setattr(diffusion, "build_lattice", spy)
    ids = torch.randint(2, 60, (1, 9))
    drafter = DiffusionDrafter(dlm, MASK, target)
    reference = AdaptiveDraftLength()
    for rnd, accepted in enumerate([3, 0, 25]):
        drafter.propose(state(ids, round=rnd))
        raw = build_lattice(dlm, ids, torch.ones_like(ids), seen[-1], MASK, VOCAB, True)
        drafter.update(result([accepted]))
        reference.update(generated_length(raw.argmax()[0].tolist(), [EOS]), accepted)
        assert drafter.lengths[0].k == reference.k
    assert seen[0] == [30]  # k_1 = k_max
    assert seen[1:] == [[k] for k in _replay([3, 0], ids, dlm)]
    drafter.propose(state(ids, round=0))  # a new generate call starts over
    assert seen[-1] == [30]


def _replay(accepted, ids, dlm):
    adl, ks = AdaptiveDraftLength(), []
    for acc in accepted:
        raw = build_lattice(dlm, ids, torch.ones_like(ids), [adl.k], MASK, VOCAB, True)
        ks.append(adl.update(generated_length(raw.argmax()[0].tolist(), [EOS]), acc))
    return ks


@pytest.mark.parametrize("tree", [False, True])
def test_non_finite_dlm_logits_are_named(target, tree):
    # a NaN lattice drafted nothing, silently, as a chain, and crashed in build_tree as a tree
    from .models import tiny_qwen2

    dlm = tiny_qwen2(1)

    def poison(module, args, kwargs, output):
        output.logits[1] = float("nan")  # row 1 only, as an fp16 overflow would

    dlm.register_forward_hook(poison, with_kwargs=True)
    drafter = DiffusionDrafter(dlm, MASK, target, config=DiffusionDrafterConfig(return_tree=tree))
    with pytest.raises(RuntimeError, match=r"non-finite logits .* batch rows \[1\] in round 0"):
        drafter.propose(state(torch.randint(2, 60, (2, 6))))


def test_max_tokens_caps_the_depth(dlm, target):
    ids = torch.randint(2, 60, (1, 9))
    config = DiffusionDrafterConfig(return_tree=True, cps=CPSConfig(lam=1.0))
    draft = DiffusionDrafter(dlm, MASK, target, config=config).propose(state(ids, max_tokens=3))
    depth = torch.zeros(draft.tokens.shape[1], dtype=torch.long)
    for i, p in enumerate(draft.parents[0].tolist()):
        depth[i] = 0 if p < 0 else depth[p] + 1
    assert int(depth.max()) == 2


def test_beams_come_back_as_one_tree(dlm, target):
    ids = torch.randint(2, 60, (2, 9))
    config = DiffusionDrafterConfig(fixed_k=6, return_tree=True, cps=CPSConfig(lam=1.0))
    tree = DiffusionDrafter(dlm, MASK, target, config=config).propose(state(ids))
    chain_config = DiffusionDrafterConfig(fixed_k=6, cps=CPSConfig(lam=1.0))
    chain = DiffusionDrafter(dlm, MASK, target, config=chain_config).propose(state(ids))
    assert tree.parents.shape == tree.tokens.shape  # a tree per row
    for b in range(2):
        n = tree.tokens.shape[1] if tree.num_tokens is None else int(tree.num_tokens[b])
        parents = tree.parents[b, :n].tolist()
        assert all(p < i for i, p in enumerate(parents))
        assert n > 6  # B = 3 beams over 6 positions share some nodes but not all
        best = chain.tokens[b].tolist()  # the best beam is the first root-to-leaf path
        assert tree.tokens[b, :len(best)].tolist() == best
        assert parents[:len(best)] == list(range(-1, len(best) - 1))


def test_approximate_proposal_carries_the_lattice_marginals(dlm, target):
    ids = torch.randint(2, 60, (1, 9))
    config = DiffusionDrafterConfig(fixed_k=5, proposal="approximate_l2r")
    draft = DiffusionDrafter(dlm, MASK, target, config=config).propose(state(ids))
    lattice = build_lattice(dlm, ids, torch.ones_like(ids), [5], MASK, VOCAB, True)
    t = draft.tokens.shape[1]
    torch.testing.assert_close(draft.probs, lattice.logprobs[:, :t].exp())


def test_max_context_hides_the_oldest_tokens(dlm, target):
    ids = torch.randint(2, 60, (1, 20))
    config = DiffusionDrafterConfig(fixed_k=4, cps=None, max_context=12)
    capped = DiffusionDrafter(dlm, MASK, target, config=config).propose(state(ids))
    short = NaiveDiffusionDrafter(dlm, MASK, target, k=4).propose(state(ids[:, -8:]))
    assert torch.equal(capped.tokens, short.tokens)


def test_prefix_cache_past_max_context_runs_the_capped_forward(dlm, target):
    ids = torch.randint(2, 60, (1, 20))
    capped = DiffusionDrafterConfig(fixed_k=4, cps=None, max_context=12)
    cached = DiffusionDrafterConfig(fixed_k=4, cps=None, max_context=12, prefix_cache=True)
    expected = DiffusionDrafter(dlm, MASK, target, config=capped).propose(state(ids))
    drafter = DiffusionDrafter(dlm, MASK, target, config=cached)
    assert torch.equal(drafter.propose(state(ids)).tokens, expected.tokens)
    assert drafter.prefix.kv is None  # nothing cached from a capped round


def test_a_new_generate_call_starts_with_an_empty_prefix_cache(dlm, target):
    drafter = DiffusionDrafter(dlm, MASK, target,
                               config=DiffusionDrafterConfig(fixed_k=4, prefix_cache=True))
    ids = torch.randint(2, 60, (1, 8))
    drafter.propose(state(ids))
    assert drafter.prefix.kv.get_seq_length() == 8
    other = torch.randint(2, 60, (1, 5))
    first = drafter.propose(state(other))  # round 0 again
    fresh = DiffusionDrafter(dlm, MASK, target, config=DiffusionDrafterConfig(fixed_k=4))
    assert torch.equal(first.tokens, fresh.propose(state(other)).tokens)
    assert drafter.prefix.kv.get_seq_length() == 5


def test_generate_drops_the_prefix_cache_and_lattice_when_the_call_ends(dlm, target):
    from mmspec import generate

    drafter = DiffusionDrafter(dlm, MASK, target,
                               config=DiffusionDrafterConfig(fixed_k=4, prefix_cache=True))
    seen = []
    generate(target, drafter, torch.randint(2, 60, (1, 8)), max_new_tokens=10, eos_token_id=[],
             on_round=lambda *_: seen.append(drafter.prefix.kv is not None))
    assert any(seen)  # the cache served the call's rounds
    assert drafter.prefix.kv is None and drafter.lattice is None  # and is gone after it


def test_the_eos_token_id_passed_to_generate_wins_over_the_drafters(target):
    from mmspec import generate

    from .models import tiny_qwen2

    def eos_everywhere(module, args, out):  # the DLM's argmax is EOS at every position
        out.logits[..., EOS] = 100.0

    dlm = tiny_qwen2(1)  # its own copy, for the hook
    dlm.register_forward_hook(eos_everywhere)
    ids = torch.randint(2, 60, (1, 6))
    for eos, length in ((None, 1), ([], 4), ([7], 4)):  # None: the drafter's EOS, the target's
        drafter, lengths = NaiveDiffusionDrafter(dlm, MASK, target, k=4), []
        generate(target, drafter, ids, max_new_tokens=6, eos_token_id=eos,
                 on_round=lambda draft, *_: lengths.append(draft.tokens.shape[1]))
        assert lengths[0] == length, (eos, lengths)  # the path stops at an EOS id of the call
    # an id outside the vocabulary stops nothing; CPS indexed the lattice with it
    config = DiffusionDrafterConfig(fixed_k=4)
    for eos in ([7], [7, 10_000]):
        generate(target, DiffusionDrafter(dlm, MASK, target, config=config), ids,
                 max_new_tokens=6, eos_token_id=eos)
    refused = rf"eos_token_id must not include .*mask_token_id {MASK}, got \[{MASK}\]"
    with pytest.raises(ValueError, match=refused):
        generate(target, NaiveDiffusionDrafter(dlm, MASK, target, k=4), ids, eos_token_id=MASK)


def test_wider_target_vocabulary_sets_the_lattice_width(dlm):
    # one tokenizer padded to two widths (Qwen2.5's 151936 and 152064), at a tiny size
    drafter = NaiveDiffusionDrafter(dlm, MASK, 128, k=4, eos_token_id=EOS)
    assert drafter.vocab_size == 128  # the engine checks this against the target's logits
    config = DiffusionDrafterConfig(fixed_k=4, proposal="approximate_l2r")
    draft = DiffusionDrafter(dlm, MASK, 128, eos_token_id=EOS, config=config).propose(
        state(torch.randint(2, 60, (1, 6))))
    assert draft.probs.shape[-1] == 128 and (draft.probs[..., 64:] == 0).all()


@pytest.mark.parametrize("target", [129, 4096, 50257])
def test_another_vocabulary_is_refused(dlm, target):
    # a 64-logit DLM beside a 129-, 4096- or 50257-token target: another tokenizer, which
    # drafted silently at tau 1 (ModelDrafter refused it); 63 (a mask appended) is taken
    from mmspec.diffusion.vocab import VocabularyMismatch

    with pytest.raises(VocabularyMismatch, match=rf"vocabulary \(64 logits\) does not match "
                                                 rf"the target's \({target}\)"):
        DiffusionDrafter(dlm, MASK, target, eos_token_id=EOS)
    assert DiffusionDrafter(dlm, MASK, 63, eos_token_id=EOS).vocab_size == 63


def test_public_name():
    import mmspec

    assert mmspec.DiffusionDrafter is DiffusionDrafter
    assert mmspec.NaiveDiffusionDrafter is NaiveDiffusionDrafter
    # the README configures it with these two, under the same name
    assert mmspec.DiffusionDrafterConfig is DiffusionDrafterConfig
    from mmspec.diffusion import ADLConfig

    assert mmspec.ADLConfig is ADLConfig


def test_a_learned_position_table_bounds_the_context():
    # a GPT-2-style DLM of 32 positions behind a 20-token prompt and 30 new tokens failed with a
    # bare IndexError in its embedding: its table is now the default max_context
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.decoding.spec_helpers import tiny_llama

    from mmspec import generate

    target = tiny_llama(0)
    torch.manual_seed(0)
    dlm = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=2, eos_token_id=None, bos_token_id=None)).eval()
    drafter = DiffusionDrafter(dlm, MASK, target, eos_token_id=EOS,
                               config=DiffusionDrafterConfig(adl=ADLConfig(4, 10)))
    assert drafter.config.max_context == 32
    ids = torch.randint(2, 60, (1, 20))
    out = generate(target, drafter, ids, max_new_tokens=30, eos_token_id=EOS)
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30,
                          do_sample=False, eos_token_id=EOS)
    assert torch.equal(out.sequences, ref)
    with pytest.raises(ValueError, match=r"model: its 32 learned positions \(max_context 32 must "
                                         r"exceed the largest block 40\)"):
        DiffusionDrafter(dlm, MASK, target, eos_token_id=EOS,
                         config=DiffusionDrafterConfig(fixed_k=40))


def test_a_model_on_another_device_is_named(dlm):
    # the meta device stands in for a GPU here: torch's error named neither the drafter nor .to
    import copy

    from tests.decoding.spec_helpers import tiny_llama

    from mmspec import generate

    drafter = DiffusionDrafter(copy.deepcopy(dlm).to("meta"), MASK, 64, eos_token_id=EOS)
    with pytest.raises(ValueError, match=r"the diffusion drafter's model is on meta and the "
                                         r"inputs on cpu: move it with drafter.to\('cpu'\)"):
        generate(tiny_llama(0), drafter, torch.tensor([[5, 6, 7]]), max_new_tokens=4,
                 eos_token_id=EOS)
