"""Drafters in the ViSpec authors' layout (github.com/KangJialiang/ViSpec): random weights with
their key names, shapes and config.json fields, loaded by `ViSpecDrafter.from_pretrained`; every
round's greedy chain equals a re-implementation of the authors' forward written here from their
`cnets_ours.py` / `spec_model_ours.py` / `utils.py` (not from mmspec), and greedy output equals
`target.generate`, with images in the prompt."""


import pytest
import torch
import torch.nn.functional as F
from tests.eagle.test_drafter import _rms, _rope, write  # the authors' Llama pieces, shared
from tests.vision.tiny_vlms import (
    IMAGE,
    llava_prompt,
    qwen_prompt,
    reference,
)

from mmspec import generate
from mmspec.vision import ViSpecDrafter
from mmspec.vision.vispec_official import OfficialViSpecDrafter

D, HEADS, VOCAB = 64, 4, 128  # the tiny targets' text sizes
DH = D // HEADS


# ---------------------------------------------------------------- checkpoints, authors' layout


def official_config(qwen: bool, kv_heads=HEADS, **extra) -> dict:
    """vispec/train/{llava_1.6_7B,qwen2.5_vl_3B}_config.json, scaled down."""
    cfg = {"architectures": ["LlavaNextForConditionalGeneration"], "bos_token_id": 1,
           "eos_token_id": 2, "hidden_act": "silu", "hidden_size": D, "initializer_range": 0.02,
           "intermediate_size": 2 * D, "max_position_embeddings": 4096, "model_type": "llava_next",
           "num_attention_heads": HEADS, "num_hidden_layers": 1, "num_key_value_heads": kv_heads,
           "pad_token_id": 0, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
           "tie_word_embeddings": False, "torch_dtype": "float16", "use_cache": True,
           "vocab_size": VOCAB}
    if qwen:
        cfg.update({"architectures": ["Qwen2_5_VLForConditionalGeneration"],
                    "model_type": "qwen2_5_vl", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                    "max_position_embeddings": 8192, "qkv_bias": True})
        del cfg["rope_scaling"], cfg["pad_token_id"]
    return {**cfg, **extra}


def official_state(seed, qkv_bias: bool, kv_heads=HEADS, num_q=2, embed=False, d=D,
                   heads=HEADS) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = lambda *shape: torch.randn(*shape, generator=g) * shape[-1] ** -0.5
    small = lambda *shape: 0.1 * torch.randn(*shape, generator=g)
    dh = d // heads
    sd = {"fc.weight": w(d, 2 * d), "fc.bias": small(d),
          "img_fc.weight": w(d, 2 * d), "img_fc.bias": small(d),  # not [I | 0]: images matter
          "imadpt.q": torch.randn(num_q, heads, dh, generator=g) * dh ** -0.5,
          "imadpt.k_proj.weight": w(d, d), "imadpt.v_proj.weight": w(d, d),
          "imadpt.o_proj.weight": w(d, d),
          "layers.0.self_attn.q_proj.weight": w(d, d),
          "layers.0.self_attn.k_proj.weight": w(kv_heads * dh, d),
          "layers.0.self_attn.v_proj.weight": w(kv_heads * dh, d),
          "layers.0.self_attn.o_proj.weight": w(d, d),
          "layers.0.mlp.gate_proj.weight": w(2 * d, d), "layers.0.mlp.up_proj.weight": w(2 * d, d),
          "layers.0.mlp.down_proj.weight": w(d, 2 * d),
          "layers.0.post_attention_layernorm.weight": 1 + small(d)}
    if qkv_bias:
        sd.update({"imadpt.k_proj.bias": small(d), "imadpt.v_proj.bias": small(d),
                   "layers.0.self_attn.q_proj.bias": small(d),
                   "layers.0.self_attn.k_proj.bias": small(kv_heads * dh),
                   "layers.0.self_attn.v_proj.bias": small(kv_heads * dh)})
    if embed:  # a copy that differs from the target's: where each is used shows
        sd["embed_tokens.weight"] = torch.randn(VOCAB, d, generator=g)
    return sd


# ------------------------------------------ the authors' forward, re-implemented (reference)


def _linear(sd, name, x):
    return x @ sd[name + ".weight"].T + (sd[name + ".bias"] if name + ".bias" in sd else 0)


def _layer(sd, x, pos, cfg):
    """LlamaDecoderLayer(index 0) over one causal row `[N, d]`: no input norm, GQA attention."""
    n, kv = x.shape[0], cfg["num_key_value_heads"]
    theta, eps = cfg.get("rope_theta", 10000.0), cfg["rms_norm_eps"]
    p = "layers.0.self_attn."
    q = _linear(sd, p + "q_proj", x).view(n, HEADS, DH).transpose(0, 1)
    k = _linear(sd, p + "k_proj", x).view(n, kv, DH).transpose(0, 1)
    v = _linear(sd, p + "v_proj", x).view(n, kv, DH).transpose(0, 1)
    q, k = _rope(q, pos, theta), _rope(k, pos, theta)
    k, v = k.repeat_interleave(HEADS // kv, 0), v.repeat_interleave(HEADS // kv, 0)  # repeat_kv
    scores = q @ k.transpose(1, 2) / DH ** 0.5 + torch.full((n, n), float("-inf")).triu(1)
    a = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, D)
    x = x + a @ sd[p + "o_proj.weight"].T
    h = _rms(x, sd["layers.0.post_attention_layernorm.weight"], eps)
    p = "layers.0.mlp."
    mlp = F.silu(h @ sd[p + "gate_proj.weight"].T) * (h @ sd[p + "up_proj.weight"].T)
    return x + mlp @ sd[p + "down_proj.weight"].T


def _adaptor(sd, image):
    """ImgAdaptor: the learnable queries attend (no mask) over one image's embeddings `[n, d]`."""
    n, num_q = image.shape[0], sd["imadpt.q"].shape[0]
    q = sd["imadpt.q"].transpose(0, 1)  # [H, Q, dh]
    k = _linear(sd, "imadpt.k_proj", image).view(n, HEADS, DH).transpose(0, 1)
    v = _linear(sd, "imadpt.v_proj", image).view(n, HEADS, DH).transpose(0, 1)
    out = ((q @ k.transpose(1, 2) / DH ** 0.5).softmax(-1) @ v).transpose(0, 1)
    return out.reshape(num_q, D) @ sd["imadpt.o_proj.weight"].T  # [Q, d]


def _fuse(sd, emb, hidden, img):
    """Model.forward's text path: fc([emb ; img_fc([hidden ; last image vector])])."""
    fused = _linear(sd, "img_fc", torch.cat([hidden, img], -1))
    return _linear(sd, "fc", torch.cat([emb, fused], -1))


def target_pass(target, seq, extras):
    """The target over `seq` `[S]`: (inputs_embeds `[S, d]` with the image features scattered in,
    last hidden states `[S, d]`), as spec_model_ours / ge_data take them."""
    extras = dict(extras)
    if "mm_token_type_ids" in extras:
        types = torch.zeros(1, len(seq), dtype=extras["mm_token_type_ids"].dtype)
        types[:, : extras["mm_token_type_ids"].shape[1]] = extras["mm_token_type_ids"]
        extras["mm_token_type_ids"] = types
    with torch.no_grad():
        out = target(input_ids=seq[None], output_hidden_states=True, **extras)
    return out.hidden_states[0][0], out.hidden_states[-1][0]


def ref_chain(target, sd, cfg, seq, prompt_len, extras, n):
    """The authors' greedy chain (topK_genrate with top_k=1) after the committed tokens `seq`
    `[S]` (the last one is the root) of a prompt of `prompt_len` tokens: n token ids.

    Their prefill over the prompt, then one cached call per round over the new pairs, then the
    tree, equals one causal pass over the pairs below, since nothing is dropped from the cache."""
    inputs_embeds, hidden = target_pass(target, seq[:-1], extras)
    own = sd.get("embed_tokens.weight", target.get_input_embeddings().weight)
    with torch.no_grad():
        # pair j: hidden state of slot j, token of slot j + 1 (input_ids[:, 1:]); the prompt's
        # tokens embedded as the target's inputs_embeds[:, 1:], the root and later ones by
        # the drafter's embed_tokens
        emb = torch.stack([inputs_embeds[j + 1] if j + 1 < prompt_len else own[seq[j + 1]]
                           for j in range(len(seq) - 1)])
        is_img = seq[1:] == IMAGE  # image_mask[:, 1:]
        ends = [j for j in range(len(is_img))
                if is_img[j] and (j + 1 == len(is_img) or not is_img[j + 1])]  # runs' last pairs
        xs, pos, img, start = [], [], torch.zeros(D), 0
        for e in ends:  # a segment: text pairs, then the image run's compressed tokens
            for j in range(start, e + 1):
                if not is_img[j]:
                    xs.append(_fuse(sd, emb[j], hidden[j], img))
                    pos.append(j)
            span = torch.arange(start, e + 1)[is_img[start: e + 1]]
            adapted = _adaptor(sd, emb[span])
            num_q = adapted.shape[0]
            xs += list(adapted[:-1])
            pos += list(range(e + 2 - num_q, e + 1))
            img, start = adapted[-1], e + 1
        for j in range(start, len(seq) - 1):
            xs.append(_fuse(sd, emb[j], hidden[j], img))
            pos.append(j)
        chain, next_pos = [], len(seq) - 1  # len_posi
        for _ in range(n):
            h = _layer(sd, torch.stack(xs), torch.tensor(pos), cfg)[-1]
            tok = int((h @ target.get_output_embeddings().weight.T).argmax())
            chain.append(tok)
            xs.append(_fuse(sd, own[tok], h, img))  # a tree node feeds its parent's output
            pos.append(next_pos)
            next_pos += 1
        return chain


# -------------------------------------------------------------------------------------- tests

def back_to_back_prompt():
    """Two LLaVA images with no text between: the authors' image mask sees one run of tokens."""
    ids, extras = llava_prompt(images=2, seed=5)
    keep = torch.ones(ids.shape[1], dtype=torch.bool)
    keep[20:23] = False  # the text before the second image (1, 5 6 7, 16 x image, 5 6 7, ...)
    assert ids[0, 20:23].tolist() == [5, 6, 7]
    return ids[:, keep], extras


CASES = {  # (vlm, qkv_bias, kv heads, num_q, embed_tokens, .bin, prompt)
    "llava_two_images": ("llava", False, HEADS, 2, False, False,
                         lambda: llava_prompt(images=2, seed=3)),
    "llava_back_to_back_images": ("llava", False, HEADS, 2, False, False,
                                  lambda: back_to_back_prompt()),
    "qwen_gqa_embed_bin_num_q3": ("qwen", True, 2, 3, True, True,
                                  lambda: qwen_prompt(grids=((1, 4, 4), (1, 8, 4)), seed=3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rounds_chain_is_the_authors(request, tmp_path, case):
    vlm, qkv_bias, kv, num_q, embed, bin_, prompt = CASES[case]
    target = request.getfixturevalue(vlm)
    cfg = official_config(vlm == "qwen", kv_heads=kv)
    sd = official_state(5, qkv_bias, kv, num_q, embed)
    drafter = ViSpecDrafter.from_pretrained(write(tmp_path / case, cfg, sd, bin_), target,
                                            depth=3, top_k=1, total_tokens=4)
    assert isinstance(drafter, OfficialViSpecDrafter) and drafter.num_queries == num_q
    ids, extras = prompt()
    new = 8
    ref = reference(target, ids, extras, new)
    rounds, seq = [], ref[0, : ids.shape[1] + 1]  # the prompt and the prefill's token

    def on_round(draft, result, stats):
        nonlocal seq
        rounds.append((seq, draft.tokens[0].tolist()))
        seq = torch.cat([seq, result.new_tokens[0]])

    out = generate(target, drafter, ids, max_new_tokens=new, on_round=on_round, **extras)
    assert torch.equal(out.sequences, ref)
    assert len(rounds) >= 2 and len(rounds[0][1]) == 3
    for committed, chain in rounds[:3]:  # round 0 reads the prompt; later ones extend the cache
        assert chain == ref_chain(target, sd, cfg, committed, ids.shape[1], extras, len(chain)), \
            (len(committed), chain)


def test_tree_greedy_is_the_targets_output(llava, tmp_path):
    sd = official_state(6, qkv_bias=False)
    drafter = ViSpecDrafter.from_pretrained(write(tmp_path / "ckpt", official_config(False), sd),
                                            llava, depth=3, top_k=3, total_tokens=8)
    ids, extras = llava_prompt(images=1, seed=4)
    sizes = []
    out = generate(llava, drafter, ids, max_new_tokens=10,
                   on_round=lambda d, r, s: sizes.append(d.tokens.shape[1]), **extras)
    assert torch.equal(out.sequences, reference(llava, ids, extras, 10))
    assert sizes[0] == 7  # a tree, not a chain


# ------------------------------------------------------------------------------ bad checkpoints


def test_bad_checkpoints_get_one_line(llava, tmp_path):
    def fails(name, config, state, match):
        with pytest.raises(ValueError, match=match) as err:
            ViSpecDrafter.from_pretrained(write(tmp_path / name, config, state), llava)
        assert "\n" not in str(err.value)

    cfg, sd = official_config(False), official_state(7, qkv_bias=False)
    fails("unknown", cfg, {"foo.weight": torch.zeros(2)}, "no ViSpec layout")
    fails("num_q", cfg, {**sd, "imadpt.q": torch.zeros(2, HEADS, DH + 1)},
          r"imadpt.q .* is \(2, 4, 17\), expected \[num_q >= 2, num_attention_heads, head_dim\]")
    fails("one_query", cfg, {**sd, "imadpt.q": torch.zeros(1, HEADS, DH)}, r"is \(1, 4, 16\)")
    wide = official_state(7, qkv_bias=False, d=2 * D)
    fails("hidden", {**cfg, "hidden_size": 2 * D}, wide,
          "hidden_size 128, the target's hidden size is 64")
    fails("qkv_bias", {**cfg, "qkv_bias": True}, sd, r"missing \['imadpt.k_proj.bias'")
    with pytest.raises(ValueError, match="dtype: the ViSpec authors' drafter"):
        ViSpecDrafter.from_pretrained(tmp_path / "unknown", llava, dtype=torch.float32)
