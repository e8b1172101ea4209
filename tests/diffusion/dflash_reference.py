"""DFlash checkpoints in the authors' exact layout, tiny, and their drafting loop re-derived.

`write_checkpoint` writes a folder as z-lab/dflash ships one: a Qwen3 config.json with the keys of
their `tests/fixtures/dflash2-config.json` (architectures, dflash_config, num_target_layers,
layer_types, rope_parameters, ...) and a model.safetensors whose tensor names and shapes follow
their `tests/fixtures/dflash2-safetensors-header.json` (DFlash2) or the same without the
convolutions and the candidate selector (DFlash), scaled down to a tiny target.

`reference_generate` is their `dflash_generate` (z-lab/dflash `dflash/model.py`) greedy loop for
one sequence, re-derived from their code's semantics on plain tensors, independently of
`mmspec.diffusion.dflash_model`: RMSNorm, rotary, the context-then-block keys, the attention mask
of their `_attention_mask` (cache indices), the grouped dynamic convolution, the candidate
selector, the target's verification, and the block shrinking near the end (`verify_size`). The
draft's context keys are recomputed from all context features each round (their cache holds the
same values). The target runs without a cache on the whole sequence.
"""

import json
import math

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


def dflash_raw_config(target, kind="DFlash2DraftModel", layers=2, block=6, mask=None,
                      layer_ids=None, sliding=False, is_causal=False, **dflash):
    text = target.config.get_text_config(decoder=True)
    ids = list(layer_ids if layer_ids is not None else range(text.num_hidden_layers))
    cfg = {"block_size": block, "mask_token_id": text.vocab_size - 1 if mask is None else mask,
           "target_layer_ids": ids, **dflash}
    if kind == "DFlash2DraftModel":
        cfg = {"conv_group_size": 8, "conv_kernel_size": 2, "selector_rank": 8,
               "selector_top_k": 4, "final_logit_softcapping": 20.0, "output_multiplier": 0.7,
               **cfg}
    raw = {"architectures": [kind], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 1, "dflash_config": cfg, "eos_token_id": 2, "head_dim": 8,
           "hidden_act": "silu", "hidden_size": text.hidden_size, "initializer_range": 0.02,
           "intermediate_size": 48,
           "layer_types": ["sliding_attention" if sliding else "full_attention"] * layers,
           "max_position_embeddings": 512, "max_window_layers": layers, "model_type": "qwen3",
           "num_attention_heads": 4, "num_hidden_layers": layers, "num_key_value_heads": 2,
           "num_target_layers": text.num_hidden_layers, "pad_token_id": 0, "rms_norm_eps": 1e-6,
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
           "sliding_window": 4, "tie_word_embeddings": False, "transformers_version": "5.15.0",
           "use_cache": False, "use_sliding_window": sliding, "vocab_size": text.vocab_size}
    if is_causal is not None:
        raw["is_causal"] = is_causal
    return raw


def layout(raw):
    """Tensor name -> shape, as their safetensors header lists them."""
    h, d, inter = raw["hidden_size"], raw["head_dim"], raw["intermediate_size"]
    q, kv = raw["num_attention_heads"] * d, raw["num_key_value_heads"] * d
    cfg = raw["dflash_config"]
    shapes = {"fc.weight": [h, len(cfg["target_layer_ids"]) * h], "hidden_norm.weight": [h],
              "norm.weight": [h]}
    for i in range(raw["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                   p + "mlp.down_proj.weight": [h, inter], p + "mlp.gate_proj.weight": [inter, h],
                   p + "mlp.up_proj.weight": [inter, h], p + "self_attn.k_norm.weight": [d],
                   p + "self_attn.k_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                   p + "self_attn.q_norm.weight": [d], p + "self_attn.q_proj.weight": [q, h],
                   p + "self_attn.v_proj.weight": [kv, h]}
        if raw["architectures"] == ["DFlash2DraftModel"]:
            k, g = cfg["conv_kernel_size"], h // cfg["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                shapes |= {p + f"{conv}.base_kernel": [2, k, h],
                           p + f"{conv}.kernel_projection.weight": [2 * k * g, h]}
    if raw["architectures"] == ["DFlash2DraftModel"]:
        r, v = cfg["selector_rank"], raw["vocab_size"]
        shapes |= {"candidate_selector.hidden_projection.weight": [r, h],
                   "candidate_selector.predecessor_codebook": [v, r],
                   "candidate_selector.successor_codebook": [v, r]}
    return shapes


def random_state(raw, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in layout(raw).items():
        w = torch.randn(shape, generator=g) * scale
        state[name] = 1.0 + w if "norm" in name else w
    return state


def write_checkpoint(path, raw, state):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


# --- their drafting step, re-derived ---

def _rms(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos.float()[:, None] * inv  # [L, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def _conv(x, dyn, base, group):
    """x [L, H], dyn [L, K, G], base [K, H]: their `_grouped_dynamic_convolve` for one row."""
    n, h = x.shape
    out = torch.zeros_like(x)
    for o in range(base.shape[0]):
        shifted = torch.cat([torch.zeros(o, h), x[: n - o]], 0)
        out = out + (base[o] + dyn[:, o].repeat_interleave(group, -1)) * shifted
    return out


def _attend(s, p, x, ctx, q_pos, k_pos, raw, causal):
    heads, kvh, d = raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"]
    theta, eps = raw["rope_parameters"]["rope_theta"], raw["rms_norm_eps"]
    q = _rms((x @ s[p + "q_proj.weight"].T).view(len(x), heads, d), s[p + "q_norm.weight"], eps)
    both = torch.cat([ctx, x], 0)
    k = _rms((both @ s[p + "k_proj.weight"].T).view(len(both), kvh, d), s[p + "k_norm.weight"],
             eps)
    v = (both @ s[p + "v_proj.weight"].T).view(len(both), kvh, d)
    q = _rope(q.transpose(0, 1), q_pos, theta)  # [heads, L, d]
    k = _rope(k.transpose(0, 1), k_pos, theta).repeat_interleave(heads // kvh, 0)
    v = v.transpose(0, 1).repeat_interleave(heads // kvh, 0)
    qi = len(both) - len(x) + torch.arange(len(x))[:, None]  # their index-based mask
    ki = torch.arange(len(both))[None]
    visible = torch.ones(len(x), len(both), dtype=torch.bool)
    if causal:
        visible &= ki <= qi
    if raw["layer_types"][0] == "sliding_attention":
        visible &= qi - ki < raw["sliding_window"]
        if not causal:
            visible &= ki - qi < raw["sliding_window"]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    out = att.masked_fill(~visible, float("-inf")).softmax(-1) @ v  # [heads, L, d]
    return out.transpose(0, 1).reshape(len(x), -1) @ s[p + "o_proj.weight"].T


def draft_logits(s, raw, features, block_ids, start, embed, lm_head):
    """Their draft model on one block: features [C, F] of positions [0, start), block_ids [N]
    at positions [start, start + N) -> final hidden [N - 1, H] and logits [N - 1, V] of block
    rows 1.. (output multiplier and soft cap applied)."""
    cfg, eps = raw["dflash_config"], raw["rms_norm_eps"]
    dflash2 = raw["architectures"] == ["DFlash2DraftModel"]
    causal = raw.get("is_causal")
    causal = raw["layer_types"][0] == "sliding_attention" if causal is None else causal
    ctx = _rms(features @ s["fc.weight"].T, s["hidden_norm.weight"], eps)
    x = F.embedding(block_ids, embed) * cfg.get("input_embedding_scale", 1.0)
    n, c = len(block_ids), len(ctx)
    q_pos, k_pos = torch.arange(start, start + n), torch.arange(start - c, start + n)
    for i in range(raw["num_hidden_layers"]):
        p = f"layers.{i}."
        for sub in ("attention", "mlp"):
            res = x
            h = _rms(x, s[p + ("input_layernorm" if sub == "attention" else
                               "post_attention_layernorm") + ".weight"], eps)
            if dflash2:
                k = cfg["conv_kernel_size"]
                dyn = (h @ s[p + f"{sub}_conv.kernel_projection.weight"].T).view(n, 2, k, -1)
                base = s[p + f"{sub}_conv.base_kernel"]
                h = _conv(h, dyn[:, 0], base[0], cfg["conv_group_size"])
            if sub == "attention":
                h = _attend(s, p + "self_attn.", h, ctx, q_pos, k_pos, raw, causal)
            else:
                gate, up = h @ s[p + "mlp.gate_proj.weight"].T, h @ s[p + "mlp.up_proj.weight"].T
                h = (F.silu(gate) * up) @ s[p + "mlp.down_proj.weight"].T
            if dflash2:
                h = _conv(h, dyn[:, 1], base[1], cfg["conv_group_size"])
            x = res + h
    hidden = _rms(x, s["norm.weight"], eps)[1:]
    logits = hidden @ lm_head.T * cfg.get("output_multiplier", 1.0)
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return hidden, logits


def selector_scores(s, raw, hidden, logits, previous):
    """Their candidate selector at each position given the previous token there: previous [T]
    -> candidate ids [T, k] and their scores [T, k]."""
    unary, cand = logits.topk(raw["dflash_config"]["selector_top_k"], -1)
    proj = hidden @ s["candidate_selector.hidden_projection.weight"].T
    code = s["candidate_selector.predecessor_codebook"][previous] * proj  # [T, r]
    succ = s["candidate_selector.successor_codebook"][cand]  # [T, k, r]
    return cand, unary + (succ @ code[:, :, None])[..., 0]


def draft_block(s, raw, features, block_ids, start, embed, lm_head):
    """Their greedy draft of block rows 1.. ([N - 1])."""
    hidden, logits = draft_logits(s, raw, features, block_ids, start, embed, lm_head)
    if raw["architectures"] != ["DFlash2DraftModel"]:
        return logits.argmax(-1)
    prev, out = block_ids[0], []
    for t in range(len(block_ids) - 1):
        cand, score = selector_scores(s, raw, hidden[t: t + 1], logits[t: t + 1], prev[None])
        prev = cand[0, score[0].argmax()]
        out.append(prev)
    return torch.stack(out)


@torch.no_grad()
def reference_generate(s, raw, target, prompt, max_new_tokens):
    """Their greedy `dflash_generate` for one prompt `[L]`: (tokens `[L + new]`, the drafted
    tokens of every round)."""
    layers = [i + 1 for i in raw["dflash_config"]["target_layer_ids"]]
    block, mask = raw["dflash_config"]["block_size"], raw["dflash_config"]["mask_token_id"]
    embed, lm_head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    seq = prompt.clone()
    out = target(seq[None], output_hidden_states=True)
    seq = torch.cat([seq, out.logits[0, -1:].argmax(-1)])
    max_length, drafts = len(prompt) + max_new_tokens, []
    while len(seq) < max_length:
        start = len(seq) - 1  # the anchor: the last token, not yet run through the target
        size = min(block, max_length - start)
        features = torch.cat([target(seq[None, :start], output_hidden_states=True)
                              .hidden_states[i][0] for i in layers], -1)
        ids = torch.full((size,), mask)
        ids[0] = seq[start]
        if size > 1:
            ids[1:] = draft_block(s, raw, features, ids, start, embed, lm_head)
            drafts.append(ids[1:].clone())
        posterior = target(torch.cat([seq[:start], ids])[None]).logits[0, start:].argmax(-1)
        accepted = int((ids[1:] == posterior[:-1]).long().cumprod(0).sum())
        seq = torch.cat([seq, ids[1: accepted + 1], posterior[accepted: accepted + 1]])
    return seq[:max_length], drafts
