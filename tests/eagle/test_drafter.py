"""EagleDrafter on SafeAILab EAGLE-1/2 and EAGLE-3 checkpoints: random weights in the authors'
layout (key names, shapes, config.json fields), drafted chains equal to a re-implementation of the
authors' forward written here from SafeAILab/EAGLE `cnets1.py` / `cnets.py` (not from mmspec), and
greedy output equal to `target.generate`."""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec import EagleDrafter, generate

D, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 32, 4, 2, 64, 128, 8  # FFN = 2 D in the drafters too
DRAFT_VOCAB = 48
PAD = 0


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=FFN,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                      pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


# ----------------------------------------------------------------- checkpoints, authors' layout


def _config(eagle3: bool, d=D, **extra) -> dict:
    """config.json as the authors ship it (EAGLE-LLaMA3-Instruct-8B, traineagle3/config.json),
    scaled down."""
    cfg = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
           "hidden_act": "silu", "hidden_size": d, "initializer_range": 0.02,
           "intermediate_size": 2 * d, "max_position_embeddings": 2048, "model_type": "llama",
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
           "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
           "tie_word_embeddings": False, "torch_dtype": "float16",
           "transformers_version": "4.28.1", "use_cache": True, "vocab_size": VOCAB}
    if eagle3:
        cfg["draft_vocab_size"] = DRAFT_VOCAB
    else:
        cfg.update({"rope_theta": 500000.0, "bias": True})
    return {**cfg, **extra}


def _layer(g, prefix, d_in, first_eagle1, d=D):
    dh, ffn = d // HEADS, 2 * d
    w = lambda *shape: torch.randn(*shape, generator=g) * shape[-1] ** -0.5
    norm = lambda: 1 + 0.1 * torch.randn(d, generator=g)
    sd = {f"{prefix}self_attn.q_proj.weight": w(HEADS * dh, d_in),
          f"{prefix}self_attn.k_proj.weight": w(KV_HEADS * dh, d_in),
          f"{prefix}self_attn.v_proj.weight": w(KV_HEADS * dh, d_in),
          f"{prefix}self_attn.o_proj.weight": w(d, HEADS * dh),
          f"{prefix}mlp.gate_proj.weight": w(ffn, d), f"{prefix}mlp.up_proj.weight": w(ffn, d),
          f"{prefix}mlp.down_proj.weight": w(d, ffn),
          f"{prefix}post_attention_layernorm.weight": norm()}
    if not first_eagle1:
        sd[f"{prefix}input_layernorm.weight"] = norm()
    return sd


def eagle1_state(seed=1, layers=1, embed=False, d=D):
    g = torch.Generator().manual_seed(seed)
    sd = {"fc.weight": torch.randn(d, 2 * d, generator=g) * (2 * d) ** -0.5,
          "fc.bias": 0.1 * torch.randn(d, generator=g)}
    for i in range(layers):
        sd.update(_layer(g, f"layers.{i}.", d, first_eagle1=i == 0, d=d))
    if embed:
        sd["embed_tokens.weight"] = torch.randn(VOCAB, d, generator=g)
    return sd


def eagle3_state(seed=2, embed=True):
    g = torch.Generator().manual_seed(seed)
    sd = {"fc.weight": torch.randn(D, 3 * D, generator=g) * (3 * D) ** -0.5,
          "norm.weight": 1 + 0.1 * torch.randn(D, generator=g),
          "lm_head.weight": torch.randn(DRAFT_VOCAB, D, generator=g) * D ** -0.5,
          "midlayer.hidden_norm.weight": 1 + 0.1 * torch.randn(D, generator=g)}
    sd.update(_layer(g, "midlayer.", 2 * D, first_eagle1=False))
    # the draft vocabulary: a sorted subset of target ids; d2t holds offsets, t2d membership
    used = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    sd["d2t"] = used - torch.arange(DRAFT_VOCAB)
    sd["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)
    sd["t2d"][used] = True
    if embed:
        sd["embed_tokens.weight"] = torch.randn(VOCAB, D, generator=g)
    return sd


def write(path, config, state, bin_=False):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if bin_:
        torch.save(state, path / "pytorch_model.bin")
    else:
        save_file(state, str(path / "model.safetensors"))
    return path


# -------------------------------------------- the authors' forward, re-implemented (reference)


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(int(pos.max()) + 1).float(), inv_freq)
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos()[pos], emb.sin()[pos]  # [N, dim]
    rotated = torch.cat((-x[..., dim // 2:], x[..., : dim // 2]), -1)
    return x * cos + rotated * sin


def _attention(sd, p, x, pos, theta):
    """cnets LlamaAttention over one row `[N, in]`, causal, no cache."""
    n, dh = x.shape[0], D // HEADS
    q = (x @ sd[p + "q_proj.weight"].T).view(n, HEADS, dh).transpose(0, 1)
    k = (x @ sd[p + "k_proj.weight"].T).view(n, KV_HEADS, dh).transpose(0, 1)
    v = (x @ sd[p + "v_proj.weight"].T).view(n, KV_HEADS, dh).transpose(0, 1)
    q, k = _rope(q, pos, theta), _rope(k, pos, theta)
    k, v = (t.repeat_interleave(HEADS // KV_HEADS, 0) for t in (k, v))  # repeat_kv
    w = q @ k.transpose(1, 2) / dh ** 0.5
    w = w + torch.full((n, n), torch.finfo(torch.float32).min).triu(1)
    out = torch.softmax(w.float(), -1) @ v  # [H, N, dh]
    return out.transpose(0, 1).reshape(n, HEADS * dh) @ sd[p + "o_proj.weight"].T


def _mlp(sd, p, x):
    gate = torch.nn.functional.silu(x @ sd[p + "gate_proj.weight"].T)
    return (gate * (x @ sd[p + "up_proj.weight"].T)) @ sd[p + "down_proj.weight"].T


def ref_eagle1(sd, embed, feats, tokens, pos, layers, theta=500000.0, eps=1e-5):
    """cnets1.Model.forward: fc([embed(token); feature]) then the decoder layers."""
    x = torch.cat([embed[tokens], feats], -1) @ sd["fc.weight"].T + sd["fc.bias"]
    for i in range(layers):
        p = f"layers.{i}."
        h = x if i == 0 else _rms(x, sd[p + "input_layernorm.weight"], eps)
        x = x + _attention(sd, p + "self_attn.", h, pos, theta)
        x = x + _mlp(sd, p + "mlp.", _rms(x, sd[p + "post_attention_layernorm.weight"], eps))
    return x


def ref_eagle3(sd, embed, g, tokens, pos, theta=10000.0, eps=1e-5):
    """cnets.Model.forward after fc: midlayer over [input_norm(embed); hidden_norm(g)]."""
    p = "midlayer."
    h = torch.cat([_rms(embed[tokens], sd[p + "input_layernorm.weight"], eps),
                   _rms(g, sd[p + "hidden_norm.weight"], eps)], -1)
    x = g + _attention(sd, p + "self_attn.", h, pos, theta)
    return x + _mlp(sd, p + "mlp.", _rms(x, sd[p + "post_attention_layernorm.weight"], eps))


def target_features(target, ids, eagle3):
    """EAGLE-1: the base model's output (after its final norm). EAGLE-3: the inputs of decoder
    layers 2, L//2, L-3 (modeling_llama_kv.py), captured by hooks, in layer order."""
    with torch.no_grad():
        if not eagle3:
            return target.model(ids).last_hidden_state[0]
        taken = {}
        keep = sorted({2, LAYERS // 2, LAYERS - 3})
        def grab(i):
            def hook(module, args, kwargs):
                taken[i] = args[0] if args else kwargs["hidden_states"]
            return hook

        hooks = [target.model.layers[i].register_forward_pre_hook(grab(i), with_kwargs=True)
                 for i in keep]
        target.model(ids)
        for h in hooks:
            h.remove()
        return torch.cat([taken[i][0] for i in keep], -1)


def ref_chain(target, sd, seq, n, eagle3, layers=1):
    """The authors' greedy chain (topK_genrate with top_k=1) after the committed tokens `seq`
    `[S]` (its last token is the root): n target ids."""
    embed = sd.get("embed_tokens.weight", target.get_input_embeddings().weight.detach())
    feats = target_features(target, seq[None, :-1], eagle3)  # [S-1, F] slots 0..S-2
    tokens = seq[1:].clone()  # input_ids[:, 1:]: entry i pairs feature i with token i + 1
    with torch.no_grad():
        if eagle3:
            g = feats @ sd["fc.weight"].T  # target features go through fc
        chain = []
        for _ in range(n):
            pos = torch.arange(len(tokens))
            if eagle3:
                h = ref_eagle3(sd, embed, g, tokens, pos)[-1]
                logits = _rms(h, sd["norm.weight"], 1e-5) @ sd["lm_head.weight"].T
                draft_id = int(logits.argmax())
                tok = draft_id + int(sd["d2t"][draft_id])
                g = torch.cat([g, h[None]])  # the draft's own h is fed back, no fc
            else:
                h = ref_eagle1(sd, embed, feats, tokens, pos, layers)[-1]
                tok = int((h @ target.lm_head.weight.T).argmax())  # the target's head, no norm
                feats = torch.cat([feats, h[None]])
            chain.append(tok)
            tokens = torch.cat([tokens, torch.tensor([tok])])
        return chain


# -------------------------------------------------------------------------------------- tests

CASES = {
    "eagle1": (False, lambda: (_config(False), eagle1_state()), 1),
    "eagle1_2layers_bin_embed": (False, lambda: (_config(False, num_hidden_layers=2),
                                                 eagle1_state(3, layers=2, embed=True)), 2),
    "eagle3": (True, lambda: (_config(True), eagle3_state()), 1),
    "eagle3_target_embed": (True, lambda: (_config(True), eagle3_state(4, embed=False)), 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rounds_chain_is_the_authors(target, tmp_path, case):
    eagle3, make, layers = CASES[case]
    config, state = make()
    path = write(tmp_path / case, config, state, bin_="bin" in case)
    drafter = EagleDrafter.from_pretrained(path, target, depth=4, top_k=1, total_tokens=6)
    ids = torch.tensor([[1, 17, 33, 5, 90, 64, 12, 7]])
    ref = target.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=[])
    rounds = []
    seq = ref[0, : ids.shape[1] + 1]  # the prompt and the prefill's token

    def on_round(draft, result, stats):
        nonlocal seq
        rounds.append((seq, draft.tokens[0].tolist()))
        seq = torch.cat([seq, result.new_tokens[0]])

    out = generate(target, drafter, ids, max_new_tokens=12, eos_token_id=[], on_round=on_round)
    assert torch.equal(out.sequences, ref)
    assert len(rounds) >= 2 and len(rounds[0][1]) == 4
    for committed, chain in rounds:  # round 0 reads the prompt; later ones extend the cache
        assert chain == ref_chain(target, state, committed, len(chain), eagle3, layers), \
            (len(committed), chain)
    if eagle3:  # the chain went through d2t: target ids the draft vocabulary maps to
        used = set((torch.arange(DRAFT_VOCAB) + state["d2t"]).tolist())
        assert all(t in used for _, chain in rounds for t in chain)


@pytest.mark.parametrize("eagle3", [False, True])
def test_tree_batch_greedy_is_the_targets_output(target, tmp_path, eagle3):
    config, state = (_config(True), eagle3_state()) if eagle3 else (_config(False), eagle1_state())
    drafter = EagleDrafter.from_pretrained(write(tmp_path / "ckpt", config, state), target,
                                           depth=4, top_k=3, total_tokens=10)
    ids = torch.tensor([[PAD, PAD, PAD, 1, 40, 41, 9], [1, 17, 33, 5, 90, 64, 12]])
    mask = (ids != PAD).long()
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                          pad_token_id=PAD, eos_token_id=[])
    sizes = []
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=16,
                   pad_token_id=PAD, eos_token_id=[],
                   on_round=lambda d, r, s: sizes.append(d.tokens.shape[1]))
    assert torch.equal(out.sequences, ref)
    assert sizes[0] == 9  # total_tokens - 1 nodes: a tree, not a chain


@pytest.fixture(scope="module")
def near_bigram_target(target):
    """The target with its layers' outputs scaled down: the next token depends mostly on the
    current one, so a drafter close to `fc = [2I | 0]` gets many (and per row different) tokens
    accepted, and later rounds feed several slots with holes."""
    model = copy.deepcopy(target)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    return model


def test_batch_with_accepted_tokens_drafts_the_authors_chains(near_bigram_target, tmp_path):
    target, state = near_bigram_target, eagle1_state()
    near_identity = torch.cat([2 * torch.eye(D), torch.zeros(D, D)], 1)
    state["fc.weight"] = near_identity + 0.05 * state["fc.weight"]
    for key in ("fc.bias", "layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight"):
        state[key] = 0.05 * state[key]
    drafter = EagleDrafter.from_pretrained(write(tmp_path / "ckpt", _config(False), state),
                                           target, depth=4, top_k=1, total_tokens=6)
    ids = torch.tensor([[PAD, PAD, PAD, 1, 40, 41, 9], [1, 17, 33, 5, 90, 64, 12]])
    mask = (ids != PAD).long()
    new = 24
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                          pad_token_id=PAD, eos_token_id=[])
    seqs = [ref[b, ids.shape[1] - int(mask[b].sum()): ids.shape[1] + 1] for b in range(2)]
    prompt = [len(s) - 1 for s in seqs]
    rounds, accepted = [], []

    def on_round(draft, result, stats):
        for b in range(2):
            if len(seqs[b]) - prompt[b] < new:  # a live row: its draft is meant to be used
                rounds.append((seqs[b], draft.tokens[b].tolist()))
            seqs[b] = torch.cat([seqs[b], result.new_tokens[b]])
        accepted.append(result.num_accepted.tolist())

    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=new,
                   pad_token_id=PAD, eos_token_id=[], on_round=on_round)
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted >= 8 and any(a != b for a, b in accepted), accepted  # holes
    for committed, chain in rounds:
        assert chain == ref_chain(target, state, committed, len(chain), False), len(committed)


@pytest.mark.parametrize("vlm", ["llava", "qwen2_5_vl"])
def test_vlm_target_greedy_is_the_targets_output(tmp_path, vlm):
    from tests.vision import tiny_vlms

    build, prompt = {"llava": (tiny_vlms.tiny_llava, tiny_vlms.llava_prompt),
                     "qwen2_5_vl": (tiny_vlms.tiny_qwen2_5_vl, tiny_vlms.qwen_prompt)}[vlm]
    target = tiny_vlms.no_eos(build())
    d = target.get_input_embeddings().weight.shape[1]
    path = write(tmp_path / "ckpt", _config(False, d=d), eagle1_state(d=d))
    drafter = EagleDrafter.from_pretrained(path, target, depth=4, top_k=3, total_tokens=10)
    ids, extras = prompt()
    out = generate(target, drafter, ids, max_new_tokens=12, **extras)
    assert torch.equal(out.sequences, tiny_vlms.reference(target, ids, extras, 12))


# ------------------------------------------------------------------------------ bad checkpoints


class NotATensor:
    pass


def test_bad_checkpoints_get_one_line(target, tmp_path):
    def fails(name, config, state, match, bin_=False):
        with pytest.raises(ValueError, match=match) as err:
            EagleDrafter.from_pretrained(write(tmp_path / name, config, state, bin_), target)
        assert "\n" not in str(err.value)

    fails("unknown", _config(False), {"foo.weight": torch.zeros(2)}, "no known EAGLE layout")
    big = {k: torch.zeros(*[48 if s == D else 96 if s == 2 * D else s for s in v.shape])
           for k, v in eagle1_state().items()}
    fails("hidden", _config(False, hidden_size=48), big, "hidden_size 48, the target's hidden "
                                                         "size is 32")
    no_d2t = {k: v for k, v in eagle3_state().items() if k != "d2t"}
    fails("no_d2t", _config(True), no_d2t, "drafts over 48 ids .* no d2t")
    fails("pickle", _config(False), {**eagle1_state(), "extra": NotATensor()},
          "needs unpickling of more than tensors", bin_=True)
    fails("missing", _config(False), {k: v for k, v in eagle1_state().items() if k != "fc.bias"},
          r"missing \['fc.bias'\]")
    shallow = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=FFN,
                                           num_hidden_layers=4, num_attention_heads=HEADS))
    with pytest.raises(ValueError, match="layers 2, L//2 and L-3, three distinct layers"):
        EagleDrafter.from_pretrained(write(tmp_path / "e3", _config(True), eagle3_state()), shallow)
