"""The architecture sweep (issue 29): every causal LM class that the installed transformers maps,
built tiny with random weights, decoded greedily by `mmspec.generate` and compared with its own
`generate`, for a chain (an oracle of its own tokens with rejections), a tree, prompt lookup on a left-padded batch and a tree on that batch.

Each case ends as `pass` (token-identical), `refused` (a one-line `UnsupportedTarget` or
`ValueError` from mmspec, before the first token) or, for the test, a failure: a mismatch or a
traceback from inside transformers or torch. An architecture whose tiny build (or its own
`generate`) fails is `not built`, with the reason. The expected outcome of every architecture is
the table in `docs/architectures.md`, which users read to look up their model; regenerate it with

    python -m tests.decoding.arch_sweep --write

Tiny configs: the class's default config with its sizes shrunk (`SIZE`), its per-layer lists cut
to one layer of each kind, special token ids moved into the small vocabulary, a sliding window of
8 (so the 23-token calls cross it) and a few per-model fixes (`OVERRIDES`).

A second tiny configuration of each class (`SECOND`: other widths, heads and layers, one layer
more, `OVERRIDES_SECOND`) decodes one cheaper case, the column `2nd config`: the chain on a
left-padded batch of two with a longer prompt (`PROMPTS_SECOND`), so the admission probe meets
other shapes; its verdict must not depend on them. A greedy token that differs from the model's
own where its top two logits are within `NEAR_TIE` of its largest is reported `near-tie` with the
gap (fp32 summation order decides it), not a mismatch.
"""

from __future__ import annotations

import re
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

TABLE = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"
MAPPINGS = {"causal": MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            "vlm": MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}


VOCAB = 256
SIZE = {
 "hidden_size": 64, "d_model": 64, "n_embd": 64, "dim": 64, "embed_dim": 64, "n_embed": 64,
 "word_embed_proj_dim": 64, "embedding_size": 64, "emb_dim": 64,
 "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
 "encoder_layers": 2, "num_decoder_layers": 2, "num_encoder_layers": 2,
 "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4, "decoder_attention_heads": 4,
 "encoder_attention_heads": 4, "num_key_value_heads": 2, "n_kv_heads": 2, "num_kv_heads": 2,
 "multi_query_group_num": 2, "head_dim": 16, "kv_channels": 16, "d_kv": 16,
 "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "decoder_ffn_dim": 128,
 "encoder_ffn_dim": 128, "ffn_hidden_size": 128, "d_ff": 128, "moe_intermediate_size": 32,
 "shared_expert_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64,
 "expert_intermediate_size": 32,
 "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
 "num_experts_per_tok": 2, "moe_k": 2, "moe_topk": 2, "n_group": 1, "topk_group": 1,
 "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
 "v_head_dim": 16,
 "vocab_size": VOCAB, "n_words": VOCAB, "max_position_embeddings": 256, "n_positions": 256,
 "n_ctx": 256, "pronunciation_vocab_size": 32, "shape_vocab_size": 32,
 "state_size": 8, "mamba_d_state": 8, "ssm_state_size": 8, "conv_kernel": 4, "time_step_rank": 8,
 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
 "linear_value_head_dim": 16,
 "sliding_window": 8, "sliding_window_size": 8, "local_attention_window_len": 8, "window_size": 8,
 "vocab_size_per_layer_input": VOCAB, "unpadded_vocab_size": VOCAB, "expert_ffn_hidden_size": 32,
 "dim_ff": 128, "encoder_hash_byte_group_vocab": 512, "hidden_size_global": 64, "rotary_dim": 8,
 "codebook_size": 64, "base_channels": 32, "num_res_blocks": 1, "mamba_chunk_size": 16, "num_experts_per_token": 2, "num_expert_group": 1, "linear_num_heads": 4,
 "linear_head_dim": 16, "layer_group_size": 2, "adapter_in_dim": 64, "adapter_out_dim": 64,
 "adapter_input_size": 64, "adapter_output_size": 64, "num_shared_experts": 1, "mamba_dt_rank": 8, "index_topk": 64, "index_head_dim": 16, "index_n_heads": 2,
}
# the second configuration: 96 wide (6 heads of 16), 3 of 6 heads for keys and values, 3 layers
_WIDTHS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "n_embed",
           "word_embed_proj_dim", "embedding_size", "emb_dim", "hidden_size_global",
           "adapter_in_dim", "adapter_out_dim", "adapter_input_size", "adapter_output_size")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads",
          "encoder_attention_heads")
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers",
           "encoder_layers", "num_decoder_layers", "num_encoder_layers")
_FFNS = ("intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim",
         "ffn_hidden_size", "d_ff", "dim_ff")
SECOND = {**SIZE, **dict.fromkeys(_WIDTHS, 96), **dict.fromkeys(_HEADS, 6),
          **dict.fromkeys(_KV_HEADS, 3), **dict.fromkeys(_LAYERS, 3), **dict.fromkeys(_FFNS, 192)}
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
# ids a tiny vocabulary must hold
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
             "sep_token_id": 3, "cls_token_id": 4, "mask_token_id": 5, "unk_token_id": 6}


def _layer_lists(d, more: bool = False):
    """Per-layer lists (layer_types, ...) cut to one layer of each kind (at least two layers);
    `more`: then the first kind once more (the second configuration)."""
    n = next((d[k] for k in LAYER_COUNTS if isinstance(d.get(k), int)), None)
    lists = {k: v for k, v in d.items() if isinstance(v, list) and n and len(v) == n and n > 2}
    if not lists:
        return {}
    # lists of layer indices (Llama 4's `moe_layers`, LFM2's `full_attn_idxs`) name layers
    # rather than describe them: they are renumbered below, not used to choose the layers kept
    index = {k for k, v in lists.items()
             if all(isinstance(x, int) and not isinstance(x, bool) for x in v)
             and len(set(v)) == len(v) and set(v) <= set(range(n))}
    pick = [0, 1]
    for k, v in lists.items():
        if k in index:
            continue
        try:
            firsts = sorted({repr(x): i for i, x in reversed(list(enumerate(v)))}.values())
        except TypeError:
            continue
        if len(firsts) > 1:
            pick = firsts if len(firsts) > 1 else [0, 1]
            break
    pick = pick + pick[:1] if more else pick
    out = {k: ([j for j, i in enumerate(pick) if i in v] if k in index else [v[i] for i in pick])
           for k, v in lists.items()}
    for k in LAYER_COUNTS:
        if isinstance(d.get(k), int):
            out[k] = len(pick)
    return out


# sizes some configs leave at None (and then fail without): filled in
_FILL_NONE = {"num_experts_per_tok", "n_routed_experts", "n_shared_experts", "num_experts_per_token",
              "num_local_experts", "moe_intermediate_size",
              "linear_head_dim", "linear_num_heads"}


def _shrink(d, size=SIZE):
    out = {}
    for k, v in d.items():
        if k in size and (isinstance(v, int) and not isinstance(v, bool)
                          or v is None and k in _FILL_NONE):
            out[k] = size[k]
        elif k.endswith("_token_id") or k.endswith("_token_index"):
            if isinstance(v, int) and v >= VOCAB - 8:
                out[k] = TOKEN_IDS.get(k, 7)
            elif isinstance(v, list) and any(isinstance(i, int) and i >= VOCAB - 8 for i in v):
                out[k] = [TOKEN_IDS.get(k, 7)]
        elif isinstance(v, dict) and (k.endswith("config") or k.endswith("_cfg") or "model_type" in v):
            out[k] = _shrink(v, size)
        elif isinstance(v, dict) and isinstance(v.get("mrope_section"), list):
            # M-RoPE splits the rotary half of the head (16 // 2 here) over its 3 axes
            out[k] = {**v, "mrope_section": [2, 3, 3][:len(v["mrope_section"])]}
    out.update(_layer_lists(d, more=size is SECOND))
    if isinstance(d.get("qk_rope_head_dim"), int) and "head_dim" in d:
        out["head_dim"] = out["qk_rope_head_dim"]
    if isinstance(d.get("kv_lora_rank"), int) and "num_key_value_heads" in d:  # MLA: all heads
        out["num_key_value_heads"] = out.get("num_attention_heads", 4)
    return out


def tiny_config(model_type, second: bool = False):
    """The class's tiny config; `second`: the second configuration (`SECOND`)."""
    cls = CONFIG_MAPPING[model_type]
    d = cls().to_dict()
    kw = _shrink(d, SECOND if second else SIZE)
    if "is_decoder" in d:
        kw["is_decoder"] = True
    kw.update(OVERRIDES.get(model_type, {}))
    if second:
        kw.update(OVERRIDES_SECOND.get(model_type, {}))
    config = cls(**kw)
    if model_type in _MROPE:  # their default M-RoPE split is for a 128-wide head
        text = config.get_text_config()
        text.rope_parameters = {**(text.rope_parameters or {}), "mrope_section": [2, 3, 3]}
    return config


_MROPE = ("qwen2_vl", "qwen2_5_vl", "glm4v", "glm4v_moe", "glm46v", "glm_ocr", "glmga",
          "paddleocr_vl")


OVERRIDES = {
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_expand=2),
    "kimi_linear": dict(layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"], linear_head_dim=16, num_key_value_heads=4),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"], lru_width=64, attention_window_size=8),
    "mamba2": dict(num_heads=8, head_dim=16, n_groups=1),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8),
    "zaya": dict(num_experts_per_tok=1),
    "dory": dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"], n_input_layers=1, n_recurrent_layers=1, n_output_layers=1),
    "reformer": dict(axial_pos_shape=[16, 16], axial_pos_embds_dim=[32, 32], attn_layers=["local", "lsh"], is_decoder=True, local_attn_chunk_length=8, lsh_attn_chunk_length=8),
    "dots3_note": dict(num_key_value_heads=4), "dots3_note_text": dict(num_key_value_heads=4),
    "hunyuan_v1_dense": dict(head_dim=16), "hunyuan_v1_moe": dict(head_dim=16), "ministral": dict(head_dim=16),
    "nemotron": dict(num_key_value_heads=2),
    "lfm2_moe": dict(num_dense_layers=1, layer_types=["conv", "full_attention"]),
    "gemma4_assistant": dict(hidden_size_per_layer_input=0),
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0, hidden_size_per_layer_input=16, laurel_rank=8, altup_num_inputs=2),
    "zamba": dict(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid", "hybrid"]),
    "dbrx": dict(attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "attn_pdrop": 0.0,
                              "clip_qkv": 8.0}),
    "dots1": dict(n_shared_experts=1, moe_intermediate_size=32),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8),
    "mimo_v2_flash": dict(num_key_value_heads=2, layer_types=["full_attention", "sliding_attention"]),
    "cohere_compass_text": dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16, indexer_compress_ratio=4),
    # xLSTMCache sizes its state from qk_dim_factor * hidden_size rounded up to 64: keep it 64
    "xlstm": dict(num_blocks=2, embedding_dim=64, num_heads=4, qk_dim_factor=1.0, v_dim_factor=1.0),
}
_MLA = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "longcat_flash", "minicpm3", "sarvam_mla", "youtu", "axk1", "axk2")
for _m in _MLA:
    OVERRIDES.setdefault(_m, {})["num_key_value_heads"] = 4
for _m in ("mamba2", "nemotron_h", "zamba2"):  # SSD chunks of 128-256 steps: slow, same sums
    OVERRIDES.setdefault(_m, {})["chunk_size"] = 16

# the second configuration's per-model fixes: sizes the overrides above tie to a width of 64
OVERRIDES_SECOND = {
    "granitemoehybrid": dict(layer_types=["mamba", "attention", "mamba"], mamba_n_heads=12),
    "mamba2": dict(num_heads=12),
    "recurrent_gemma": dict(block_types=["recurrent", "attention", "recurrent"], lru_width=96),
    "kimi_linear": dict(layer_types=["linear_attention", "full_attention", "linear_attention"],
                        mlp_layer_types=["dense", "sparse", "sparse"], num_key_value_heads=6),
    "falcon_h1": dict(mamba_d_ssm=96, mamba_n_heads=12),
    "xlstm": dict(num_blocks=3, hidden_size=128, embedding_dim=128, num_heads=2,
                  qk_dim_factor=0.5),
    "dory": dict(num_hidden_layers=3),
    "zamba": dict(num_hidden_layers=3),
    "lfm2_moe": dict(layer_types=["conv", "full_attention", "conv"]),
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    "mimo_v2_flash": dict(num_key_value_heads=3,
                          layer_types=["full_attention", "sliding_attention", "full_attention"]),
    "dots3_note": dict(num_key_value_heads=6), "dots3_note_text": dict(num_key_value_heads=6),
    "diffllama": dict(num_key_value_heads=2),  # its differential attention needs an even count
    # axial position dims sum to the width; one attention kind per layer
    "reformer": dict(axial_pos_embds_dim=[48, 48], attn_layers=["local", "lsh", "local"]),
    "dbrx": dict(attn_config={"kv_n_heads": 3, "rope_theta": 10000.0, "attn_pdrop": 0.0,
                              "clip_qkv": 8.0}),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=12),
}
for _m in _MLA:
    OVERRIDES_SECOND.setdefault(_m, {})["num_key_value_heads"] = 6


PROMPTS = torch.tensor([[9, 10, 11, 12, 13, 9, 10, 11, 14, 15, 16],
                        [0, 0, 0, 20, 21, 22, 20, 21, 23, 24, 25]])
MASK = torch.tensor([[1] * 11, [0, 0, 0] + [1] * 8])
NEW_TOKENS = 12
# the second configuration's batch: a longer prompt (past the probe's 12 tokens), 5 pads
PROMPTS_SECOND = torch.tensor([[30 + (7 * i) % 41 for i in range(19)],
                               [0] * 5 + [40 + (5 * i) % 37 for i in range(14)]])
MASK_SECOND = (PROMPTS_SECOND > 0).long()
NEW_SECOND = 8
SECOND_CASE = "2nd config"
# a greedy flip where the model's own top two logits are this close (relative to its largest
# logit) is a near-tie: the probe's fp32 tolerance for summation orders (admission.py)
NEAR_TIE = 1e-3
CASES = ("chain", "tree", "lookup batch", "tree batch")
# the chain of the left-padded batch, staggered, from a drafter that reads the target's hidden
# states (`HiddenChain`); like the VLM section's untrained `ViSpecDrafter.from_target`
# (text-only prompt, where ViSpec has an adapter for the class), its column does not count in
# the outcome
HIDDEN_CASE = "hidden batch"
COLUMNS = {"causal": CASES + (HIDDEN_CASE, SECOND_CASE),
           "vlm": CASES + (HIDDEN_CASE, "vispec", SECOND_CASE)}
# generation-config settings some classes ship (Whisper, BART) that `mmspec.generate` refuses on
# their own: the sweep is about the architecture, so it switches them off on both sides
_SETTINGS_OFF = ("forced_eos_token_id", "forced_bos_token_id", "begin_suppress_tokens",
                 "suppress_tokens", "no_repeat_ngram_size", "min_length", "repetition_penalty",
                 "bad_words_ids")


def build(model_type: str, kind: str = "causal", second: bool = False):
    import transformers

    config = tiny_config(model_type, second)
    torch.manual_seed(0)
    auto = (transformers.AutoModelForCausalLM if kind == "causal"
            else transformers.AutoModelForImageTextToText)
    model = auto.from_config(config).eval()
    if hasattr(model, "set_default_language"):  # X-MOD: one adapter per language
        model.set_default_language(next(iter(config.languages)))
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = None, 0  # EOS off: every call runs its full length
    for name in _SETTINGS_OFF:
        if getattr(gen, name, None) is not None:
            setattr(gen, name, None)
    return model


class OracleChain:
    """Chains of 3 of the model's own next tokens (from its `generate`), the last one wrong in
    every other round: high acceptance, and rejections to roll back."""

    def __init__(self, ref, prompt_mask, stagger: bool = False, new_tokens: int = NEW_TOKENS):
        self.ref, self.real = ref, prompt_mask.sum(-1)  # ref [B, L + new]
        self.new_tokens = new_tokens
        self.rounds = 0
        self.stagger = stagger  # every round, row r's draft wrong at (round + r) % 3

    def propose(self, state):
        from mmspec.decoding import Draft

        n = min(3, state.max_tokens)
        done = state.attention_mask.sum(-1) - self.real  # committed tokens, the root included
        at = self.ref.shape[1] - self.new_tokens + done  # [B]
        idx = (at[:, None] + torch.arange(n, device=at.device)).clamp(max=self.ref.shape[1] - 1)
        truth = self.ref.gather(1, idx)
        if self.stagger:  # rows accept different numbers: a batch gets holes
            rows = torch.arange(len(truth), device=truth.device)
            at = (self.rounds + rows) % n
            truth[rows, at] = (truth[rows, at] + 1) % VOCAB
        elif self.rounds % 2:
            truth[:, -1] = (truth[:, -1] + 1) % VOCAB
        self.rounds += 1
        return Draft.chain(truth)

    def update(self, result):
        pass


class HiddenChain(OracleChain):
    """`OracleChain` staggered, declared as a hidden-state drafter as DFlash reads a target:
    the `hidden_states` entries of its first and last layers, each the text config's
    `hidden_size` wide. The engine checks them on the prefill's forward and gathers the
    committed slots' every round (`mmspec/decoding/hidden.py`)."""

    needs_target_hidden = True

    def __init__(self, model, ref, prompt_mask):
        super().__init__(ref, prompt_mask, stagger=True)
        text = model.config.get_text_config(decoder=True)
        self.target_hidden_layers = (1, text.num_hidden_layers)
        self.target_hidden_size = getattr(text, "hidden_size", None)


def _drafter(case, model, ref, mask):
    from mmspec.decoding import ModelDrafter, PromptLookupDrafter

    if case == "vispec":
        from mmspec.vision import ViSpecDrafter

        torch.manual_seed(0)
        return ViSpecDrafter.from_target(model)  # refused with one line where unsupported
    if case == "chain":
        return OracleChain(ref, mask)
    if case == HIDDEN_CASE:
        return HiddenChain(model, ref, mask)
    if case == "lookup batch":
        return PromptLookupDrafter(num_tokens=3)
    return ModelDrafter(model, num_tokens=6, top_k=2, depth=3)  # the target drafts for itself


def _one_line(err: BaseException) -> str:
    return re.sub(r"\s+", " ", str(err)).strip()


def sweep_one(model_type: str, kind: str = "causal", compile: bool = False) -> dict:
    """-> {"built": reason or None, case: "pass" | "refused: ..." | "near-tie: ..." | "MISMATCH"
    | "CRASH: ...", "2nd config": the same or "not built: ...", "seconds": (first, second)}
    kind: "causal" (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) or "vlm"
    (`MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`, text-only prompts). compile: every case with
    `generate(compile=True)` (see `main`)."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = build(model_type, kind)
            refs = {b: _reference(model, PROMPTS[:b], MASK[:b], NEW_TOKENS) for b in (1, 2)}
        except Exception as err:  # noqa: BLE001 - any failure of the tiny build is recorded
            return {"built": f"{type(err).__name__}: {_one_line(err)[:160]}"}
        result, notes = {"built": None}, set()
        for case in COLUMNS[kind][:-1]:
            b = 2 if case.endswith("batch") else 1
            result[case] = _run_case(model, lambda: _drafter(case, model, refs[b], MASK[:b]),
                                     refs[b], PROMPTS[:b], MASK[:b], NEW_TOKENS, compile, notes)
        del model
        middle = time.perf_counter()
        result[SECOND_CASE] = _second(model_type, kind, compile, notes)
        result["seconds"] = (middle - start, time.perf_counter() - middle)
        if notes:
            result["notes"] = "; ".join(sorted(notes))
        return result


def _reference(model, prompts, mask, new):
    with torch.no_grad():
        return model.generate(prompts, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              pad_token_id=0)


def _second(model_type, kind, compile, notes) -> str:
    """The second configuration's case: the model's own chain on `PROMPTS_SECOND`."""
    try:
        model = build(model_type, kind, second=True)
        ref = _reference(model, PROMPTS_SECOND, MASK_SECOND, NEW_SECOND)
    except Exception as err:  # noqa: BLE001 - any failure of the tiny build is recorded
        return f"not built: {type(err).__name__}: {_one_line(err)[:160]}"
    return _run_case(model, lambda: OracleChain(ref, MASK_SECOND, new_tokens=NEW_SECOND), ref,
                     PROMPTS_SECOND, MASK_SECOND, NEW_SECOND, compile, notes)


def _run_case(model, make_drafter, ref, prompts, mask, new, compile, notes) -> str:
    """One `mmspec.generate` call with `make_drafter()` against the model's own tokens `ref`, as
    a table cell's state (and its reason); what the engine warned while it passed goes into
    `notes`."""
    import mmspec
    from mmspec.decoding.admission import UnsupportedTarget

    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            out = mmspec.generate(model, make_drafter(), prompts, attention_mask=mask,
                                  max_new_tokens=new, do_sample=False, pad_token_id=0,
                                  compile=compile)
        notes.update(_NOTES[k] for w in said for k in _NOTES if k in str(w.message))
        if torch.equal(out.sequences, ref):
            return "pass"
        tie = near_tie(model, out.sequences, ref, prompts.shape[1])
        return "MISMATCH" if tie is None else f"near-tie: {tie}"
    except (UnsupportedTarget, ValueError) as err:
        ours = "/mmspec/" in traceback.extract_tb(err.__traceback__)[-1].filename
        return (f"refused: {_one_line(err)}" if ours and "\n" not in str(err)
                else f"CRASH: {type(err).__name__}: {_one_line(err)[:200]}")
    except Exception as err:  # noqa: BLE001 - the sweep reports every other failure
        where = Path(traceback.extract_tb(err.__traceback__)[-1].filename).name
        return f"CRASH: {type(err).__name__} in {where}: {_one_line(err)[:200]}"


def near_tie(model, got, ref, prompt_len: int) -> str | None:
    """Where `got` first leaves the model's own greedy tokens `ref` (`[B, L + new]`) in each
    row that differs: the gap between the logits of the model's token and ours, from its plain
    forward over the row's real tokens before that point; a line naming the largest gap if every
    one is within `NEAR_TIE` of the largest logit, else None (a mismatch)."""
    worst = None
    for row in range(len(ref)):
        differ = (got[row, prompt_len:] != ref[row, prompt_len:]).nonzero()
        if len(differ) == 0:
            continue
        at = prompt_len + int(differ[0])
        prefix = ref[row, :at][ref[row, :at] != 0][None]  # the pads (id 0) dropped
        try:
            with torch.no_grad():
                logits = model(input_ids=prefix, use_cache=False).logits[0, -1].float()
        except Exception:  # noqa: BLE001 - no plain forward: no claim of a near-tie
            return None
        gap = float(logits[ref[row, at]] - logits[got[row, at]])
        scale = max(float(logits.abs().max()), 1.0)
        if abs(gap) > NEAR_TIE * scale:
            return None
        if worst is None or abs(gap) > worst[0]:
            worst = (abs(gap), abs(gap) / scale)
    if worst is None:  # only the lengths differ
        return None
    return f"greedy flips where its top two logits are {worst[0]:.1e} apart ({worst[1]:.0e} of the largest)"


# what the engine said while it passed (warnings), as the table's reason column says it
_NOTES = {"main path": "trees verified along their main path (no tree mask is exact)",
          "drafting chains": "ModelDrafter drafts chains on it"}


def outcome(result: dict) -> str:
    if result["built"]:
        return "not built"
    states = {v.split(":")[0] for k, v in result.items() if k in CASES + (SECOND_CASE,)}
    states = {"pass" if s == "near-tie" else s for s in states} - {"not built"}
    if states == {"pass"}:
        return "pass"
    if "MISMATCH" in states or "CRASH" in states:
        return "FAIL"
    return "pass, some refused" if "pass" in states else "refused"


def read_table(path: Path = TABLE) -> dict:
    """{kind: {model_type: {"outcome": ..., case: "pass" | "refused" | "-"}}} from the docs."""
    rows, kind = {"causal": {}, "vlm": {}}, "causal"
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            kind = "vlm" if "image" in line.lower() else "causal"
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        cases = COLUMNS[kind]
        if len(cells) == 4 + len(cases) and cells[0].startswith("`"):
            rows[kind][cells[0].strip("`")] = {"outcome": cells[2],
                                               **dict(zip(cases, cells[3:3 + len(cases)]))}
    return rows


def _section(kind: str, results: dict) -> list:
    mapping, cases = MAPPINGS[kind], COLUMNS[kind]
    counts = {}
    for r in results.values():
        counts[outcome(r)] = counts.get(outcome(r), 0) + 1
    vispec = sorted(m for m, r in results.items() if r.get("vispec") == "pass")
    lines = [
        "Totals: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + "."
        + (f" `ViSpecDrafter.from_target` passes on {len(vispec)} ({', '.join(vispec)}); the "
           f"other classes have no ViSpec adapter (refused)." if "vispec" in cases else ""),
        "",
        "| model type | class | outcome | " + " | ".join(cases) + " | reason |",
        "|---|---|---|" + "---|" * len(cases) + "---|",
    ]
    for model_type, r in results.items():
        if r["built"]:
            cells = ["-"] * len(cases)
            why = f"not built tiny here: {r['built']}"
        else:
            cells = [r[c].split(":")[0] for c in cases]
            refusals = sorted({r[c][len("refused: "):] for c in cases
                               if r[c].startswith("refused") and "unsupported class" not in r[c]})
            ties = sorted({f"{c}: near-tie, {r[c][len('near-tie: '):]}" for c in cases
                           if r[c].startswith("near-tie")})
            second = r[SECOND_CASE]
            unbuilt = ([f"2nd config not built tiny: {second[len('not built: '):]}"]
                       if second.startswith("not built") else [])
            why = " / ".join(refusals + ties + unbuilt + ([r["notes"]] if r.get("notes") else []))
        lines.append(f"| `{model_type}` | {mapping[model_type]} | {outcome(r)} | "
                     + " | ".join(cells) + f" | {why.replace('|', '/')} |")
    return lines


# the hand-written section of product names (Llama 3.1 -> `llama`), kept by `write_table`
PRODUCTS = ("<!-- products:", "<!-- /products -->")


def products_section(text: str) -> list:
    """The lines of `text`'s products section, markers included, and a blank line; [] if none."""
    if PRODUCTS[0] not in text or PRODUCTS[1] not in text:
        return []
    start, end = text.index(PRODUCTS[0]), text.index(PRODUCTS[1]) + len(PRODUCTS[1])
    return text[start:end].splitlines() + [""]


def write_table(results: dict, seconds: float, path: Path = TABLE) -> None:
    import transformers

    lines = [
        "# Which models `mmspec.generate` decodes exactly",
        "",
        f"Every entry of transformers {transformers.__version__}'s "
        f"`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` and `MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`, "
        f"built tiny with random weights and decoded greedily by `mmspec.generate` against the "
        f"model's own `generate`: a chain (the model's own next tokens, the last of three wrong "
        f"every other round), a tree (`ModelDrafter(top_k=2)`, the target drafting for itself), "
        f"prompt lookup on a left-padded batch of two, and the tree on that batch. `pass`: the "
        f"same tokens; `refused`: a one-line `UnsupportedTarget` (or `ValueError`) before the "
        f"first token, its reason in the last column, which also says where a pass took a "
        f"fallback: where no tree mask verifies exactly (recurrent state, ALiBi or windows "
        f"counted in cache slots, layers that take no mask), each tree is verified along its "
        f"main path, and where holes are not exact, a batch's rows commit alike (as many "
        f"tokens as the row that accepted fewest); both stay token-identical, with fewer tokens "
        f"accepted. `hidden batch`: the chain on the batch, rows accepting different numbers, "
        f"from a drafter that reads the target's hidden states as a DFlash drafter does (the "
        f"`hidden_states` entries of its first and last layers, `hidden_size` wide; the engine "
        f"refuses, before the first token, a target whose entries are not [batch, tokens, "
        f"hidden_size]); it does not count in the outcome. `2nd config`: a second tiny "
        f"configuration of the class (96 wide, 6 heads with 3 for keys and values, 3 layers) "
        f"decoding the chain on a left-padded batch of "
        f"two with a {PROMPTS_SECOND.shape[1]}-token prompt, so the engine's admission meets "
        f"other shapes (`not built` there: untested, not refused). `near-tie`: a greedy token "
        f"that differs from the model's own where its top two logits are within {NEAR_TIE:g} "
        f"of its largest logit (the gap in the last column): fp32 summation order decides "
        f"such a token, in its own generate too. `make test` runs this sweep "
        f"(`tests/decoding/test_architectures.py`) and fails on any mismatch, crash, or "
        f"architecture missing from these tables; `python -m tests.decoding.arch_sweep --write` "
        f"rewrites them ({seconds:.0f} s on a 2-core CPU, {_second_share(results)}). "
        f"`not built`: the sweep's tiny config "
        f"of that class fails in transformers itself (or needs a package not installed here); "
        f"those classes are untested, not refused.",
        "",
        *products_section(path.read_text() if path.is_file() else ""),
        f"## Causal LMs ({len(results['causal'])} classes)",
        "",
        *_section("causal", results["causal"]),
        "",
        f"## Image-text-to-text models ({len(results['vlm'])} classes), text-only prompts",
        "",
        "The text path of each VLM class (no image in the prompt); prompts with images are "
        "tested for the families mmspec's VLM adapters cover (LLaVA, Qwen2.5-VL: "
        "`tests/vision`, `tests/decoding`).",
        "",
        *_section("vlm", results["vlm"]),
    ]
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _second_share(results: dict) -> str:
    """The second configuration's time against the first's, summed over the sweep."""
    times = [r["seconds"] for rows in results.values() for r in rows.values() if "seconds" in r]
    first, second = (sum(t[i] for t in times) for i in (0, 1))
    return f"{first:.0f} s in the first configurations' cases, {second:.0f} s in the second's"


def _has_windows(model_type: str) -> bool:
    from types import SimpleNamespace

    from mmspec.decoding.windows import sliding_windows

    try:
        return bool(sliding_windows(SimpleNamespace(config=tiny_config(model_type))))
    except Exception:  # noqa: BLE001 - not built tiny: the sweep reports why
        return False


def main(argv=None) -> None:
    """`--write`: rewrite the tables. `--compile`: `generate(compile=True)` in every case, its
    compiled call replaced by the model's own `__call__` (the static cache, padded shapes, 4-D
    masks and in-place commits without the compiler's minutes, as `test_static.py`'s `eager`
    fixture); prints the outcomes, writes nothing. `--sliding`: only classes with sliding-window
    layers. Other arguments: model types to sweep."""
    argv = sys.argv[1:] if argv is None else argv
    only = [a for a in argv if not a.startswith("--")]
    compile = "--compile" in argv
    torch.set_num_threads(1)
    from transformers.utils import logging

    logging.set_verbosity_error()
    if compile:
        from mmspec.decoding import static

        static.compiled_forward = lambda target, config: target.__call__
    start, results = time.perf_counter(), {"causal": {}, "vlm": {}}
    for kind, mapping in MAPPINGS.items():
        for model_type in mapping:
            if only and model_type not in only:
                continue
            if "--sliding" in argv and not _has_windows(model_type):
                continue
            results[kind][model_type] = sweep_one(model_type, kind, compile)
            result = results[kind][model_type]
            why = {v for k, v in result.items()
                   if k in CASES + (SECOND_CASE,) and not v.startswith("pass")}
            print(f"{kind:6s} {model_type:28s} {outcome(result)}"
                  + (f"  ({'; '.join(sorted(why))[:300]})" if why else ""), flush=True)
    print(_second_share(results))
    if "--write" in argv and not only and not compile and "--sliding" not in argv:
        write_table(results, time.perf_counter() - start)
        print(f"wrote {TABLE}")


if __name__ == "__main__":
    main()
