"""`compile=True` (`mmspec/decoding/static.py`): the static-cache path is token-identical to
`target.generate` on every family of the identity tests, eagerly (the compiled call replaced by
the model's own `__call__`: the cache, the padded shapes, the 4-D mask and the in-place commit
are all there, only the compiler is not), and through a real `torch.compile` graph on the tiny
Llama: dynamo-traced (backend "eager") in the suite, inductor with `MMSPEC_INDUCTOR=1` (its test
took 60 s with a cold inductor cache and 31 s with a warm one on the shared 2-core machine, past
the ~40 s the suite can give it) and on CUDA (CUDA graphs; the GPU session's tests step)."""

import importlib
import os
from types import SimpleNamespace

import arch_sweep
import pytest
import torch
import test_generate as identity
from spec_helpers import PAD, VOCAB, OracleDrafter, RandomDrafter, tiny_llama
import test_windows
import transformers
from test_windows import tiny_gemma2
from transformers.cache_utils import StaticLayer
from transformers.generation.configuration_utils import CompileConfig

import mmspec
from mmspec import ModelDrafter, UnsupportedTarget, generate
from mmspec.decoding import kv_cache, static, windows
from mmspec.decoding import recurrent as rec

NEW = identity.NEW


_GRAPH_OUTPUTS = []  # the last compiled call's outputs, whichever model made it


def _graph_like(target, config):
    """The compiled call as CUDA graphs treat its outputs: each call, of this model or another
    (the graphs share one memory pool), overwrites the previous call's (here with NaN), so an
    output read after the next call reads garbage."""

    def call(**kwargs):
        for tensor in _GRAPH_OUTPUTS:
            tensor.fill_(float("nan"))
        _GRAPH_OUTPUTS.clear()
        out = target(**kwargs)
        _GRAPH_OUTPUTS.extend([out.logits, *(out.hidden_states or ())])
        return out

    return call


@pytest.fixture
def eager(monkeypatch):
    """The static path without the compiler: the model's own `__call__` in the compiled call's
    place, its outputs overwritten at the next call as CUDA graphs overwrite theirs
    (`_graph_like`)."""
    monkeypatch.setattr(static, "compiled_forward", _graph_like)


DRAFTERS = ["random_tree", "perfect_in_tree", "model_chain"]


@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_the_static_path_is_token_identical(identity_case, eager, drafter_name):
    name, target, ids, kwargs, ref = identity_case
    drafter = identity.make_drafter(drafter_name, target, [ids.shape[1]], ref[:, ids.shape[1]:])
    out = generate(target, drafter, ids, max_new_tokens=NEW, compile=True, **kwargs)
    assert torch.equal(out.sequences, ref)
    identity._check_acceptance(drafter_name, out.stats)


@pytest.fixture(scope="module", params=list(identity.TARGETS))
def identity_case(request):
    target = identity._target(request.param)
    ids, kwargs = identity.TARGETS[request.param][1](0)
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, **kwargs)
    return request.param, target, ids, kwargs, ref


@pytest.fixture(scope="module", params=list(identity.TARGETS))
def batch(request):
    target = identity._target(request.param)
    ids, mask, kwargs = identity.BATCHES[request.param]()
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                          pad_token_id=PAD, **kwargs)
    return request.param, target, ids, mask, kwargs, ref


class _OneRowRight(OracleDrafter):
    """The true chain in the row that runs longest, wrong tokens in the others: that row
    accepts whole drafts while the others accept none, so they collect holes."""

    def propose(self, state):
        draft = super().propose(state)
        right = int((self.ref != PAD).sum(1).argmax())
        wrong = torch.arange(len(self.ref)) != right
        draft.tokens[wrong] = (draft.tokens[wrong] + 1) % VOCAB
        return draft


def test_a_batch_outgrowing_the_cache_is_token_identical(batch, eager, monkeypatch):
    # rows accepting different numbers of tokens leave holes, which need more slots than
    # prompt + max_new_tokens: the static cache grows (reallocated, then a new graph)
    name, target, ids, mask, kwargs, ref = batch
    grew = []
    fit = static.StaticVerifier._fit

    def spy(self, needed):
        grew.append(needed > self.length)
        fit(self, needed)

    monkeypatch.setattr(static.StaticVerifier, "_fit", spy)
    monkeypatch.setattr(static, "LENGTH_BUCKET", 8)  # a tight first length
    drafter = _OneRowRight(ref[:, ids.shape[1]:], mask.sum(1).tolist(), 5, "perfect")
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=NEW,
                   compile=True, **kwargs)
    assert torch.equal(out.sequences, ref)
    assert any(grew)


def _show_slots_past_the_tree(attends, nodes, length, dtype, mask=static.dense_tree_mask):
    """dense_tree_mask whose nodes also see every slot after the tree (stale and unwritten)."""
    out = mask(attends, nodes, length, dtype)
    out[..., attends.shape[-1]:] = 0
    return out


def _commit_row_0s_path(cache, start, keep, in_place=False, commit_path=kv_cache.commit_path):
    commit_path(cache, start, keep[:1].expand_as(keep), in_place=in_place)


@pytest.mark.parametrize("module, name, mutant", [
    (static, "dense_tree_mask", _show_slots_past_the_tree),
    (kv_cache, "commit_path", _commit_row_0s_path),
], ids=["mask_shows_slots_past_the_tree", "commits_another_rows_path"])
def test_the_static_identity_cases_notice_a_wrong_mask_or_commit(batch, eager, monkeypatch,
                                                                 module, name, mutant):
    _, target, ids, mask, kwargs, ref = batch
    static.probe(target, ids, mask)  # measured on the real code, whatever ran before
    monkeypatch.setattr(module, name, mutant)
    drafter = identity.make_drafter("perfect_in_tree", target, mask.sum(1).tolist(),
                                    ref[:, ids.shape[1]:])
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=NEW,
                   compile=True, **kwargs)
    assert not torch.equal(out.sequences, ref)


def test_custom_generate_takes_compile(eager, monkeypatch):
    # speculative(drafter, compile=True) dropped compile and ran the dynamic path
    verified = []

    def counted(self, *args, verify=static.StaticVerifier.verify, **kwargs):
        verified.append(1)
        return verify(self, *args, **kwargs)

    monkeypatch.setattr(static.StaticVerifier, "verify", counted)
    target = tiny_llama(0, init_std=identity.SHARP)
    ids = torch.tensor([[PAD, PAD, 5, 9, 11, 4], [12, 7, 30, 5, 9, 8]])
    mask = (ids != PAD).long()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                          repetition_penalty=1.3)
    spec = mmspec.speculative(ModelDrafter(tiny_llama(1), 10, top_k=3, depth=3), compile=True)
    out = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                          repetition_penalty=1.3, custom_generate=spec)
    assert torch.equal(out, ref)
    assert len(verified) == spec.stats.rounds  # every round through the static verifier


# sliding-window targets (test_windows.py's, window 8): Gemma 2 (a sliding then a full layer,
# soft-capped logits) and Gemma 3 (two sliding layers, then a full one) take a mask per layer type,
# Mistral (every layer slides) one mask; prompts of 10 and 12 tokens, 24 new ones
SLIDING = {"gemma2": tiny_gemma2, "mistral": lambda: test_windows._other("mistral"),
           "gemma3": lambda: test_windows._other("gemma3")}


@pytest.fixture(scope="module", params=list(SLIDING))
def sliding_batch(request):
    target = SLIDING[request.param]()
    g = torch.Generator().manual_seed(5)
    ids, mask = torch.full((3, 12), PAD), torch.zeros(3, 12, dtype=torch.long)
    for b, n in enumerate([12, 5, 9]):
        ids[b, 12 - n:] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[b, 12 - n:] = 1
    ref = target.generate(ids, attention_mask=mask, do_sample=False,
                          max_new_tokens=test_windows.NEW, pad_token_id=PAD, eos_token_id=[])
    return request.param, target, ids, mask, ref


def _sliding_run(sliding_batch, rows, make_drafter):
    _, target, ids, mask, ref = sliding_batch
    ids, mask, ref = ids[rows], mask[rows], ref[rows]
    out = generate(target, make_drafter(ref[:, ids.shape[1]:], mask.sum(1).tolist()), ids,
                   attention_mask=mask, max_new_tokens=test_windows.NEW, pad_token_id=PAD,
                   eos_token_id=[], compile=True)
    return out, ref


def test_sliding_window_targets_are_token_identical(sliding_batch, eager):
    # a tree a round (wrong siblings and leaf: rejections to roll back) on the row of 12 tokens,
    # whose window slides through the whole call
    out, ref = _sliding_run(sliding_batch, [0], lambda truth, lens: OracleDrafter(
        truth, lens, 4, "tree"))
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted >= 12


def _with_holes(sliding_batch):
    # rows accept different numbers of tokens: their holes shift slots against positions, in
    # which the window counts (windows.py)
    return _sliding_run(sliding_batch, [0, 1, 2], lambda truth, lens: _OneRowRight(
        truth, lens, 5, "perfect"))


def test_a_sliding_window_batch_with_holes_is_token_identical(sliding_batch, eager):
    out, ref = _with_holes(sliding_batch)
    assert torch.equal(out.sequences, ref)


def test_a_kv_sharing_target_is_token_identical(eager, monkeypatch):
    # Gemma 4 with its last two layers reading the KV of the two before (DummyLayers in the
    # cache), sliding windows of 8 crossed, a batch whose holes make the cache grow
    monkeypatch.setattr(static, "LENGTH_BUCKET", 8)  # a tight first length
    grew = []
    monkeypatch.setattr(static, "grow", lambda cache, needed, length, grow=static.grow: (
        grew.append(needed > length), grow(cache, needed, length))[1])
    config = arch_sweep.tiny_config("gemma4_text")
    config = type(config)(**{**config.to_dict(), "num_hidden_layers": 4,
                             "num_kv_shared_layers": 2,
                             "layer_types": ["sliding_attention", "full_attention"] * 2})
    torch.manual_seed(0)
    target = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert "DummyLayer" in {type(layer).__name__ for layer in static.static_cache(target, 8).layers}
    ids, mask = arch_sweep.PROMPTS, arch_sweep.MASK
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                          pad_token_id=PAD, eos_token_id=[])
    out = generate(target, _OneRowRight(ref[:, ids.shape[1]:], mask.sum(1).tolist(), 5,
                                        "perfect"),
                   ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD,
                   eos_token_id=[], compile=True)
    assert torch.equal(out.sequences, ref)
    assert any(grew)


def _window_in_slots(token_mask, q_pos, k_pos, window, within=windows.within_window):
    """within_window counted in cache slots (transformers' own rule), not in positions."""
    b, n, width = token_mask.shape
    slots = torch.arange(width).expand(b, width)
    return within(token_mask, slots[:, width - n:], slots, window)


@pytest.mark.parametrize("sliding_batch", ["gemma2"], indirect=True)
@pytest.mark.parametrize("mutant", [lambda m, q, k, w: m, _window_in_slots],
                         ids=["no_window", "window_in_slots"])
def test_the_sliding_window_cases_notice_a_wrong_window(sliding_batch, eager, monkeypatch, mutant):
    _, target, ids, mask, _ = sliding_batch
    static.probe(target, ids, mask)  # measured on the real code, whatever ran before
    monkeypatch.setattr(static, "within_window", mutant)
    out, ref = _with_holes(sliding_batch)
    assert not torch.equal(out.sequences, ref)


# where no tree mask is exact the engine verifies main paths, and the static path verifies them
# through the model's own causal mask from a 2-D slot mask: Bloom builds its ALiBi from that mask
# (a 4-D one fails), MPT counts ALiBi in slots; PaliGemma's Gemma layers are bidirectional over
# the prompt (its prefix), which its static prefill must not extend to unwritten slots. PaliGemma
# at the sweep's weights: with sharper ones the engine refuses it (its text-only generate attends
# over the prompt bidirectionally, its plain forward over everything: `admission._generate_agrees`)
MAIN_PATH_ONLY = [("bloom", "causal", True), ("mpt", "causal", True),
                  ("paligemma", "vlm", False)]


def _sharp(model_type, kind="causal", std=identity.SHARP, **config_kwargs):
    """The sweep's tiny class with weights of std `std` (at the sweep's 0.02 they repeat one
    token, whatever the attention sees)."""
    config = arch_sweep.tiny_config(model_type)
    for c in {id(config): config, id(text := config.get_text_config()): text}.values():
        c.initializer_range = std
    for name, value in config_kwargs.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    auto = (transformers.AutoModelForCausalLM if kind == "causal"
            else transformers.AutoModelForImageTextToText)
    return auto.from_config(config).eval()


@pytest.mark.parametrize("model_type, kind, sharp", MAIN_PATH_ONLY,
                         ids=[m for m, _, _ in MAIN_PATH_ONLY])
def test_main_path_targets_are_token_identical(eager, model_type, kind, sharp):
    target = _sharp(model_type, kind) if sharp else arch_sweep.build(model_type, kind)
    ids, mask = arch_sweep.PROMPTS, arch_sweep.MASK
    ref = target.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=PAD,
                          max_new_tokens=arch_sweep.NEW_TOKENS)
    # rows rejecting at different depths: holes where the target verifies them (Bloom)
    out = generate(target, arch_sweep.OracleChain(ref, mask, stagger=True), ids,
                   attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS, pad_token_id=PAD,
                   compile=True)
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted > 0


@pytest.mark.parametrize("window", [64, 63])
def test_gpt_neo_runs_while_its_static_cache_fits_its_local_window(eager, window):
    # its local layers window their keys back from the cache's last slot: exact while the
    # 64-slot cache (11 + 12 tokens and a bucket) fits the window, refused with the reason past
    target = _sharp("gpt_neo", window_size=window)
    ids, mask = arch_sweep.PROMPTS, arch_sweep.MASK
    ref = target.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=PAD,
                          max_new_tokens=arch_sweep.NEW_TOKENS)
    drafter = arch_sweep.OracleChain(ref, mask, stagger=True)
    if window == 63:
        with pytest.raises(UnsupportedTarget, match=(
                r"^GPTNeoForCausalLM: compile=True keeps the KV in a StaticCache of 64 slots, "
                r"and this model's local-attention layers count their window \(window_size=63\)"
                r" back from the cache's last slot, not from the query, .*; no cache of whole "
                r"64-slot buckets does; use compile=False$")):
            generate(target, drafter, ids, attention_mask=mask, pad_token_id=PAD,
                     max_new_tokens=arch_sweep.NEW_TOKENS, compile=True)
        return
    out = generate(target, drafter, ids, attention_mask=mask, pad_token_id=PAD,
                   max_new_tokens=arch_sweep.NEW_TOKENS, compile=True)
    assert torch.equal(out.sequences, ref)


def test_a_dsa_target_is_token_identical(eager):
    # DeepSeek-V3.2: StaticIndexedLayers, whose indexer keys the commit gathers in place beside
    # the KV (test_kv_cache.py checks the gather); a tree a round on a batch with holes
    target = _sharp("deepseek_v32")
    ids, mask = arch_sweep.PROMPTS, arch_sweep.MASK
    ref = target.generate(ids, attention_mask=mask, do_sample=False,
                          max_new_tokens=arch_sweep.NEW_TOKENS, pad_token_id=PAD)
    drafter = _OneRowRight(ref[:, ids.shape[1]:], mask.sum(1).tolist(), 4, "tree")
    out = generate(target, drafter, ids, attention_mask=mask, pad_token_id=PAD,
                   max_new_tokens=arch_sweep.NEW_TOKENS, compile=True)
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted > 0


@pytest.mark.parametrize("model_type, reason", [
    ("inkling_text", r"^InklingForCausalLM: compile=True keeps the KV in a StaticCache, which "
                     r"holds this model in LinearAttentionAndStaticFullAttentionLayer, "
                     r"LinearAttentionAndStaticSlidingWindowAttentionLayer layers; the engine "
                     r"commits paths only in full-attention StaticLayers"),
    ("deepseek_v4", r"^DeepseekV4ForCausalLM: compile=True keeps the KV in transformers' "
                    r"StaticCache, which has no layer for this model's layer type "
                    r"'heavily_compressed_attention'; use compile=False$"),
])
def test_targets_without_a_static_cache_of_full_layers_are_refused_with_the_reason(model_type,
                                                                                   reason):
    target = arch_sweep.build(model_type)
    with pytest.raises(UnsupportedTarget, match=reason):
        generate(target, RandomDrafter(4), torch.tensor([[5, 6, 7, 8]]), max_new_tokens=4,
                 compile=True)


def _tiny_llama4(chunk):
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    return Llama4ForCausalLM(Llama4TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        num_local_experts=2, attention_chunk_size=chunk, layer_types=None,
        initializer_range=identity.SHARP)).eval()


def test_chunked_attention_targets_are_token_identical_past_a_chunk(eager):
    # Llama 4 (every layer chunked here) with chunks of 8: the prompt (11 tokens) and the new
    # ones cross two chunk borders, rows with holes included; its chunk mask counts positions
    # (windows.within_chunk). The eager engine refuses this call (admission.check_length)
    target = _tiny_llama4(8)
    ids, mask = arch_sweep.PROMPTS, arch_sweep.MASK
    ref = target.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=PAD,
                          max_new_tokens=arch_sweep.NEW_TOKENS, eos_token_id=[])
    out = generate(target, _OneRowRight(ref[:, ids.shape[1]:], mask.sum(1).tolist(), 4, "tree"),
                   ids, attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS,
                   pad_token_id=PAD, eos_token_id=[], compile=True)
    assert torch.equal(out.sequences, ref)
    with pytest.raises(UnsupportedTarget, match=r"^Llama4ForCausalLM: its chunked-attention "
                                                r"layers attend within blocks of 8 tokens"):
        generate(target, RandomDrafter(4), ids, attention_mask=mask, max_new_tokens=4,
                 pad_token_id=PAD)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_compile_must_be_a_bool_or_a_compile_config(value):
    with pytest.raises(ValueError, match=f"compile must be a bool or a transformers "
                                         f"CompileConfig, got {value!r}"):
        generate(tiny_llama(0), RandomDrafter(4), torch.tensor([[5, 6, 7]]), compile=value)


def _compiled_run(backend, device="cpu"):
    torch._dynamo.reset()
    counters = importlib.import_module("torch._dynamo.utils").counters
    counters.clear()
    target = tiny_llama(0, layers=1, init_std=identity.SHARP).to(device)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0)).to(device)
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW)
    # reduce-overhead: CUDA graphs on a GPU (inductor's default on a CPU)
    config = CompileConfig(backend=backend, dynamic=False, fullgraph=False,
                           mode="reduce-overhead" if backend == "inductor" else None)
    for drafter in (OracleDrafter(ref[:, 8:], [8], 3, "tree"),  # 7 nodes: one bucket of 8
                    ModelDrafter(tiny_llama(1).to(device), 4)):  # 5 nodes, fewer at the end
        out = generate(target, drafter, ids, max_new_tokens=NEW, compile=config)
        assert torch.equal(out.sequences, ref)
        assert out.stats.rounds > 3
    # one graph for every round of both calls (same bucket, same cache length), and at most two
    # for the drafter's model (one-token steps; padded catch-ups, after a whole draft accepted)
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])


def test_a_compiled_graph_serves_every_round():
    _compiled_run("eager")


_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.skipif(
    os.environ.get("MMSPEC_INDUCTOR") != "1", reason="inductor on the CPU: about a minute "
    "cold on the 2-core machine; MMSPEC_INDUCTOR=1 runs it")), _CUDA])
def test_inductor_compiled_rounds_are_token_identical(device):
    _compiled_run("inductor", device)


@pytest.mark.parametrize("device", ["cpu", _CUDA])
def test_a_compiled_graph_serves_every_round_on_sliding_windows(device):
    # Gemma 2's masks per layer type, a dict, through dynamo (backend "eager" on the CPU; on
    # CUDA inductor with CUDA graphs): one graph for every round
    torch._dynamo.reset()
    counters = importlib.import_module("torch._dynamo.utils").counters
    counters.clear()
    target = tiny_gemma2().to(device)
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1)).to(device)
    ref = target.generate(ids, do_sample=False, max_new_tokens=test_windows.NEW, eos_token_id=[])
    config = (CompileConfig(backend="eager", dynamic=False, fullgraph=False) if device == "cpu"
              else CompileConfig(dynamic=False, fullgraph=False, mode="reduce-overhead"))
    out = generate(target, OracleDrafter(ref[:, 10:], [10], 3, "tree"), ids,
                   max_new_tokens=test_windows.NEW, eos_token_id=[], compile=config)
    assert torch.equal(out.sequences, ref)
    assert out.stats.rounds > 3
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.parametrize("batch_of", [1, 3])
@pytest.mark.parametrize("seed", [0, 1], ids=["own_weights", "other_weights"])
def test_a_compiled_chain_drafter_drafts_what_the_eager_one_drafts(eager, batch_of, seed):
    # the drafter's static cache, padded catch-ups and one-token steps: the same drafts, round
    # by round, as its own model with a DynamicCache (lossless either way, so compare the
    # drafts). With the target's own weights every draft is accepted, so each catch-up feeds
    # several slots (the padded shape); with other weights most feed one
    target = tiny_llama(0, init_std=identity.SHARP)
    if batch_of == 1:
        ids, mask = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0)), None
    else:
        ids, mask = identity._left_padded_batch()
    _drafts_alike(target, lambda: ModelDrafter(tiny_llama(seed, init_std=identity.SHARP), 4),
                  ids, mask, NEW)


def test_a_compiled_sliding_window_drafter_drafts_what_the_eager_one_drafts(eager):
    # Gemma 2 drafting for itself over a window the call outgrows: its StaticCache keeps every
    # entry and its window mask counts positions (one row: no holes, where the eager drafter's
    # window, counted in slots by transformers, would differ)
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    _drafts_alike(tiny_gemma2(), lambda: ModelDrafter(tiny_gemma2(), 4), ids, None,
                  test_windows.NEW, eos_token_id=[])


def _drafts_alike(target, make_drafter, ids, mask, new, compiled_cache="StaticCache", **kwargs):
    runs = {}
    for compile in (False, True):
        drafter = make_drafter()
        drafts, caches = [], set()

        def on_round(draft, result, stats, d=drafter, drafts=drafts, caches=caches):
            drafts.append(draft.tokens.clone())
            caches.add(type(d.cache).__name__)

        out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=new,
                       compile=compile, on_round=on_round, **kwargs)
        runs[compile] = out.sequences, drafts, caches
    assert torch.equal(runs[True][0], runs[False][0])
    assert runs[True][2] == {compiled_cache} and runs[False][2] == {"DynamicCache"}
    assert len(runs[True][1]) == len(runs[False][1]) > 3
    for a, b in zip(runs[True][1], runs[False][1]):
        assert torch.equal(a, b)


# Hybrid linear-attention / SSM targets: each verified chain unpadded, the recurrent state rolled
# back by a restore and a replay through the same static forward (`recurrent.py`). Gated delta
# net beside full attention (Qwen3-Next), Mamba-2 beside attention (Bamba), Zamba 2's hybrid
# layers (mamba state and attention keys in one cache layer, `LinearAttentionAndStaticFull
# AttentionLayer`; initialised at std 0.1, as the sweep's tiny one only repeats the prompt's last
# token, which no rollback could get wrong).
HYBRIDS = {"qwen3_next": None, "bamba": None, "zamba2": 0.1}


def _build_hybrid(model_type):
    std = HYBRIDS[model_type]
    if std is None:
        return arch_sweep.build(model_type)
    model = _sharp(model_type, std=std)
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module", params=list(HYBRIDS))
def hybrid(request):
    model = _build_hybrid(request.param)
    refs = {}
    for b in (1, 2):
        ids, mask = arch_sweep.PROMPTS[:b], arch_sweep.MASK[:b]
        with torch.no_grad():
            refs[b] = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                                     max_new_tokens=arch_sweep.NEW_TOKENS)
    return model, refs


def _hybrid_run(hybrid, b):
    """Chains of three with one wrong draft every round, at a position that moves round by
    round (a replay every round; on the left-padded batch of two, rows accept different counts
    and commit alike)."""
    model, refs = hybrid
    ids, mask = arch_sweep.PROMPTS[:b], arch_sweep.MASK[:b]
    out = generate(model, arch_sweep.OracleChain(refs[b], mask, stagger=True), ids,
                   attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS, do_sample=False,
                   pad_token_id=0, compile=True)
    return out, refs[b]


@pytest.mark.parametrize("b", [1, 2])
def test_hybrid_targets_are_token_identical_under_compile(hybrid, eager, b):
    out, ref = _hybrid_run(hybrid, b)
    assert torch.equal(out.sequences, ref)
    assert out.stats.replays >= 3 and out.stats.accepted >= 4


def test_a_chain_drafter_on_a_hybrid_model_stays_eager_under_compile(eager, hybrid):
    # ModelDrafter re-reads a recurrent model's whole prefix every round; its static path would
    # pad those catch-ups into the state: under compile=True it keeps its own eager cache, and
    # drafts what it drafts without compile
    model, _ = hybrid
    ids, mask = arch_sweep.PROMPTS[:2], arch_sweep.MASK[:2]
    _drafts_alike(model, lambda: ModelDrafter(model, 2), ids, mask, arch_sweep.NEW_TOKENS,
                  compiled_cache="DynamicCache", do_sample=False, pad_token_id=0)


def _padded_verify(self, *args, verify=static.StaticVerifier.verify, **kwargs):
    """verify padding a recurrent target's chain to the bucket, as for attention-only ones."""
    self.recurrent = False
    try:
        return verify(self, *args, **kwargs)
    finally:
        self.recurrent = True


@pytest.mark.parametrize("mutant", [
    (static.StaticVerifier, "verify", _padded_verify),
    (static.StaticVerifier, "replay", lambda self, *args: None),
    (rec, "crop_attention", lambda cache, start, crop=rec.crop_attention: crop(
        SimpleNamespace(layers=[layer for layer in cache.layers
                                if not isinstance(layer, StaticLayer)]), start)),
], ids=["padding_fed_to_the_state", "no_replay", "static_keys_not_cut_back"])
def test_the_hybrid_cases_notice_padding_or_a_missing_rollback(hybrid, eager, monkeypatch,
                                                               mutant):
    monkeypatch.setattr(*mutant)
    out, ref = _hybrid_run(hybrid, 1)
    assert not torch.equal(out.sequences, ref)


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.skipif(
    os.environ.get("MMSPEC_COMPILE_GRID") != "all", reason="dynamo traces Qwen3-Next's torch "
    "gated-delta-rule fallback: 16-40 s on the 2-core machine; MMSPEC_COMPILE_GRID=all runs "
    "it")), _CUDA])
def test_a_compiled_graph_serves_a_hybrid_target(device):
    """Qwen3-Next's chains through dynamo (backend "eager" on the CPU; on CUDA inductor with
    CUDA graphs), replays included: the same tokens, from few graphs (one per chain length:
    the full chain, the replays' shorter ones and the budget-capped last rounds)."""
    torch._dynamo.reset()
    counters = importlib.import_module("torch._dynamo.utils").counters
    counters.clear()
    model = arch_sweep.build("qwen3_next").to(device)
    ids, mask = arch_sweep.PROMPTS[:1].to(device), arch_sweep.MASK[:1].to(device)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                             max_new_tokens=arch_sweep.NEW_TOKENS)
    config = (CompileConfig(backend="eager", dynamic=False, fullgraph=False) if device == "cpu"
              else CompileConfig(dynamic=False, fullgraph=False, mode="reduce-overhead"))
    out = generate(model, arch_sweep.OracleChain(ref, mask, stagger=True), ids,
                   attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS, do_sample=False,
                   pad_token_id=0, compile=config)
    assert torch.equal(out.sequences, ref)
    assert out.stats.replays >= 3
    assert counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])


class _HiddenChain(arch_sweep.OracleChain):
    """An EAGLE-style chain drafter: it asks for the target's hidden states and records them."""

    needs_target_hidden = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = []

    def update(self, result):
        self.results.append(result.target_hidden.clone())


@pytest.mark.parametrize("hybrid", ["qwen3_next"], indirect=True)
def test_no_output_of_a_compiled_call_is_read_after_the_next_call(eager, hybrid):
    """The replay is a second compiled call in the round: the committed hidden states are
    gathered from the verification's output before it (CUDA graphs would overwrite them)."""
    model, refs = hybrid
    ids, mask = arch_sweep.PROMPTS[:1], arch_sweep.MASK[:1]
    runs = {}
    for compile in (False, True):
        drafter = _HiddenChain(refs[1], mask, stagger=True)
        out = generate(model, drafter, ids, attention_mask=mask, pad_token_id=0, do_sample=False,
                       max_new_tokens=arch_sweep.NEW_TOKENS, compile=compile)
        assert torch.equal(out.sequences, refs[1]) and out.stats.replays >= 3
        runs[compile] = drafter.results
    assert len(runs[True]) == len(runs[False])
    for got, want in zip(runs[True], runs[False]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_a_chain_drafter_whose_model_takes_no_tree_mask_stays_eager(eager, model_type):
    """A ModelDrafter's static path feeds its model 4-D masks (Bloom's ALiBi fails on them, MPT's
    counts slots): where its model's static probe refuses, the drafter drafts eagerly under
    compile=True, what it drafts without compile (Bloom's static path crashed)."""
    target = _sharp(model_type)
    ids, mask = arch_sweep.PROMPTS, arch_sweep.MASK
    _drafts_alike(target, lambda: ModelDrafter(_sharp(model_type), 2), ids, mask,
                  arch_sweep.NEW_TOKENS, compiled_cache="DynamicCache", pad_token_id=PAD)


def test_compiling_is_announced_and_timed_apart_from_throughput(caplog):
    """The first compiled call was silent for tens of seconds, then tokens/s had the compilation
    folded in: now one line says compiling starts, and `stats.compile_time` holds the calls that
    compiled a graph (the first call compiles, the second, of the same shapes, does not)."""
    torch._dynamo.reset()
    target = tiny_llama(0, layers=1, init_std=identity.SHARP)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    config = CompileConfig(backend="eager", dynamic=False, fullgraph=False)
    with caplog.at_level("WARNING", logger="mmspec"):
        first = generate(target, RandomDrafter(4), ids, max_new_tokens=NEW, compile=config).stats
        second = generate(target, RandomDrafter(4), ids, max_new_tokens=NEW, compile=config).stats
    announced = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert len(announced) == 1 and "LlamaForCausalLM's forward" in announced[0]
    assert 0 < first.compile_time < first.total_time and second.compile_time == 0
    assert first.tokens_per_s == pytest.approx(
        first.new_tokens / (first.total_time - first.compile_time))
    assert "compile" in str(first) and "compile" not in str(second)
