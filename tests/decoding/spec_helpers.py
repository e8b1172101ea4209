"""Tiny random configs of real Hugging Face classes, built on CPU with fixed seeds."""

import torch

from mmspec.decoding import Draft

VOCAB = 64
PAD, BOS, EOS = 0, 1, 2


def _seeded(seed, build):
    torch.manual_seed(seed)
    return build().eval()


def tiny_llama(seed=0, vocab=VOCAB, layers=2, init_std=0.02):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=PAD, bos_token_id=BOS,
                      eos_token_id=EOS, initializer_range=init_std)
    return _seeded(seed, lambda: LlamaForCausalLM(cfg))


def tiny_qwen2(seed=0, vocab=VOCAB, init_std=0.02):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                      initializer_range=init_std)
    return _seeded(seed, lambda: Qwen2ForCausalLM(cfg))


def tiny_deepseek_v3(seed=0, vocab=VOCAB):
    """MLA attention: the cached values' last dim differs from the keys' (issue 29)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                           moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                           n_group=1, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
                           q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8,
                           v_head_dim=6, max_position_embeddings=512, pad_token_id=PAD,
                           bos_token_id=BOS, eos_token_id=EOS)
    return _seeded(seed, lambda: DeepseekV3ForCausalLM(cfg))


LLAVA_IMAGE_TOKEN = VOCAB - 1


def tiny_llava(seed=0, init_std=0.02):
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, image_size=16, patch_size=8,
                              initializer_range=init_std)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                       initializer_range=init_std)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=LLAVA_IMAGE_TOKEN,
                      projector_hidden_act="gelu", vision_feature_layer=-1,
                      vision_feature_select_strategy="full", initializer_range=init_std)
    model = _seeded(seed, lambda: LlavaForConditionalGeneration(cfg))
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    return model


def llava_inputs(seed=0, text_len=6):
    """A prompt with one 16x16 image: 4 patches + CLS = 5 image tokens ("full" feature strategy)."""
    g = torch.Generator().manual_seed(seed)
    n_img = 5  # 4 patches + CLS with vision_feature_select_strategy="full"
    text = torch.randint(3, VOCAB - 1, (1, text_len), generator=g)
    ids = torch.cat([text[:, :2], torch.full((1, n_img), LLAVA_IMAGE_TOKEN), text[:, 2:]], 1)
    pixel_values = torch.randn(1, 3, 16, 16, generator=g)
    return ids, {"pixel_values": pixel_values}


QWEN_VL_IMAGE, QWEN_VL_START, QWEN_VL_END = VOCAB - 1, VOCAB - 2, VOCAB - 3


def tiny_qwen2_5_vl(seed=0, init_std=0.02):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = Qwen2_5_VLConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "max_position_embeddings": 512, "pad_token_id": PAD, "bos_token_id": BOS,
                         "eos_token_id": EOS, "initializer_range": init_std,
                         "rope_parameters": {"rope_type": "mrope", "mrope_section": [1, 1, 2],
                                          "rope_theta": 10000.0}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                           "patch_size": 2, "temporal_patch_size": 2, "spatial_merge_size": 2,
                           "out_hidden_size": 32, "window_size": 8, "fullatt_block_indexes": [1],
                       "initializer_range": init_std},
        image_token_id=QWEN_VL_IMAGE, vision_start_token_id=QWEN_VL_START,
        vision_end_token_id=QWEN_VL_END, video_token_id=VOCAB - 4, initializer_range=init_std,
    )
    model = _seeded(seed, lambda: Qwen2_5_VLForConditionalGeneration(cfg))
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    return model


def qwen_vl_inputs(seed=0, text_len=6, grid=(1, 4, 8)):
    """One image of grid (t, h, w) patches: t*h*w/4 image tokens after the 2x2 merge."""
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    n_img = t * h * w // 4
    text = torch.randint(3, VOCAB - 4, (1, text_len), generator=g)
    image = torch.tensor([[QWEN_VL_START] + [QWEN_VL_IMAGE] * n_img + [QWEN_VL_END]])
    ids = torch.cat([text[:, :2], image, text[:, 2:]], 1)
    mm = (ids == QWEN_VL_IMAGE).long()
    pixel_values = torch.randn(t * h * w, 3 * 2 * 2 * 2, generator=g)
    return ids, {"pixel_values": pixel_values, "image_grid_thw": torch.tensor([grid]),
                 "mm_token_type_ids": mm}


# ----------------------------------------------------------------------------- test drafters


def committed(state, prompt_len):
    """Per row, the tokens generated so far (the committed real tokens after the prompt)."""
    valid = state.attention_mask.bool()
    return [ids[m][prompt_len[b]:] for b, (ids, m) in enumerate(zip(state.input_ids, valid))]


class OracleDrafter:
    """Drafts from a known continuation `ref` `[B, n]` (the target's own greedy output).

    mode "perfect": the true next tokens; "wrong": each token shifted by one (never right);
    "tree": a tree whose true path hides among wrong siblings, ending in a wrong leaf. The truth
    is the second sibling in even rows and the first in odd rows, so the rows of a batch accept
    different nodes (a commit that mixed up rows' paths shows).
    """

    def __init__(self, ref, prompt_len, num_tokens=4, mode="perfect", vocab=VOCAB):
        self.ref, self.prompt_len, self.n, self.mode, self.vocab = ref, prompt_len, num_tokens, mode, vocab
        self.rounds = self.updates = 0

    def _truth(self, state, n):
        out = torch.zeros(len(self.ref), n, dtype=torch.long)
        for b, done in enumerate(committed(state, self.prompt_len)):
            nxt = self.ref[b, len(done): len(done) + n]
            out[b, : len(nxt)] = nxt
        return out

    def propose(self, state):
        self.rounds += 1
        n = min(self.n, state.max_tokens)
        truth = self._truth(state, n)  # [B, n]
        if self.mode == "perfect":
            return Draft.chain(truth)
        if self.mode == "wrong":
            return Draft.chain((truth + 1) % self.vocab)
        # tree: nodes 2i and 2i+1 are the truth and a wrong sibling, both children of the previous
        # truth; the truth is node 2i+1 in even rows, 2i in odd rows
        odd = (torch.arange(len(truth)) % 2 == 1)[:, None]  # [B, 1]
        wrong = (truth + 1) % self.vocab  # [B, n]
        pairs = torch.stack([torch.where(odd, truth, wrong), torch.where(odd, wrong, truth)], 2)
        leaf = (truth[:, -1:] + 2) % self.vocab  # a wrong leaf below the last truth
        tokens = torch.cat([pairs.reshape(len(truth), 2 * n), leaf], 1)  # [B, 2n + 1]
        truth_node = 2 * torch.arange(n) + torch.where(odd, 0, 1)  # [B, n]
        above = torch.cat([torch.full_like(odd, -1, dtype=torch.long), truth_node], 1)  # [B, n+1]
        parents = torch.cat([above[:, :-1].repeat_interleave(2, 1), above[:, -1:]], 1)  # [B, 2n+1]
        return Draft(tokens, parents)

    def update(self, result):
        self.updates += 1
        assert self.updates == self.rounds, "update() without a propose() in the same round"


class RandomDrafter:
    """Random tokens in a random tree shape (per row), from a seeded generator."""

    def __init__(self, num_tokens=6, seed=0, vocab=VOCAB):
        self.n, self.vocab = num_tokens, vocab
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, state):
        b = state.input_ids.shape[0]
        tokens = torch.randint(0, self.vocab, (b, self.n), generator=self.g)
        parents = torch.stack([
            torch.tensor([-1] + [int(torch.randint(-1, i, (1,), generator=self.g)) for i in range(1, self.n)])
            for _ in range(b)])
        return Draft(tokens, parents)

    def update(self, result):
        pass
