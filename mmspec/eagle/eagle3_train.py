"""EAGLE-3 training (Li et al. 2025, "EAGLE-3"): the drafter, its draft vocabulary and its loss.

`python -m mmspec.vision.train --arch eagle3` trains an `EagleDrafter` (`head.py`) online
against its target with these pieces; the loop, optimiser and checkpoints are that trainer's.
Semantics of SafeAILab/EAGLE `eagle/traineagle3/cnets.py` (`Model.forward`, `scandata`):

- features: the target's hidden states at three layers (`hidden_states` entries 2, L // 2,
  L - 3, as the reference's patched target hands them over; `checkpoint.py`) side by side,
  fused by `fc` (3d -> d). Entry j pairs the feature of slot j with the token of slot j + 1 at
  position j, and its output predicts the token of slot j + 2 (the drafter's input shift).
- draft vocabulary: the `draft_vocab_size` most frequent tokens of the supervised tokens (the
  target's answers, or with every position supervised the target's argmax at each of them,
  `target_argmax`), sorted by id; `d2t[i] = id_i - i`, `t2d` marks them.
- training-time test: `rollout_steps + 1` passes. Pass i feeds entry j the drafter's own output
  of pass i - 1 at entry j (not the target's feature: no `fc`) with the token of slot j + 1 + i,
  at position j + i, attending the pass-0 entries up to j and its own entries of passes 1..i:
  exactly a tree node at depth i whose ancestors are the gold tokens. So pass i trains what the
  drafter does at tree depth i.
- loss of pass i: cross-entropy against the target's distribution over the draft vocabulary
  (softmax of its logits at the `t2d` ids), on entries that predict an answer token whose
  target argmax is in the draft vocabulary; passes weighted 0.8 ** i and summed. The reference
  supervises every position of its (chat) training data but the prompt's (`loss_mask`);
  `prompt_len=0` supervises every position, as for plain text windows (`--supervise all`).

Deliberate differences: each pass's loss is the mean over its supervised entries (the reference
divides by every entry of the batch); the draft `lm_head` starts from the target's rows of the
draft vocabulary (the reference starts it at random), which shortens short runs; a target with
too few layers for 2, L // 2, L - 3 gets layers 1, L // 2, L - 1 (saved with the drafter, in the
speculators format).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .drafter import EagleDrafter
from .checkpoint import eagle3_feature_layers
from .draft_kv import append_kv
from .head import EagleConfig

DRAFT_VOCAB_SIZE = 32000  # EAGLE-3 LLaMA-3.1-8B config.json: draft_vocab_size
ROLLOUT_STEPS = 6  # cnets.py: self.length = 7 passes
PASS_DECAY = 0.8  # main.py: ploss_weight = 0.8 ** i
# samples whose target argmax sets the draft vocabulary under `--supervise all`: one target
# forward each, and the ranking of a few thousand tokens settles long before (ours: 4,096)
VOCABULARY_SAMPLES = 512


def feature_layers(num_layers: int) -> tuple:
    """The reference's (2, L // 2, L - 3) where they are three distinct layers, else
    (1, L // 2, L - 1) for a small target; ValueError below 3 layers."""
    try:
        return eagle3_feature_layers(num_layers)
    except ValueError:
        layers = tuple(sorted({1, num_layers // 2, num_layers - 1}))
        if len(layers) != 3:
            raise ValueError(f"target: EAGLE-3 reads three distinct layers' inputs, a target of "
                             f"{num_layers} layers has too few") from None
        return layers


def new_eagle3_drafter(target, draft_vocab_size: int = DRAFT_VOCAB_SIZE,
                       layers: tuple | None = None, intermediate_size: int | None = None,
                       num_heads: int | None = None,
                       num_kv_heads: int | None = None) -> EagleDrafter:
    """An untrained EAGLE-3 drafter for `target`, float32, shaped like one of its decoder layers
    (as the reference's config.json for each target). draft_vocab_size: capped at the target's
    vocabulary; smaller, its `d2t` is set by `fit_draft_vocabulary`. layers: the target layers
    whose inputs are the features (default `feature_layers`). intermediate_size, num_heads,
    num_kv_heads: a smaller layer than the target's (None: the target's); the width is the
    target's, which fixes `fc` and the query and output projections."""
    text = target.config.get_text_config(decoder=True)
    embed = target.get_input_embeddings().weight
    vocab, d = embed.shape
    if isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int) \
            or draft_vocab_size < 1:
        raise ValueError(f"draft_vocab_size must be an int >= 1, got {draft_vocab_size!r}")
    num_layers = text.num_hidden_layers
    layers = feature_layers(num_layers) if layers is None else tuple(layers)
    if len(layers) != 3 or len(set(layers)) != 3 or not all(
            isinstance(i, int) and 0 <= i < num_layers for i in layers):
        raise ValueError(f"feature_layers: three distinct layer ids in [0, {num_layers}) of this "
                         f"target, got {list(layers)}")
    heads = text.num_attention_heads if num_heads is None else num_heads
    kv_heads = (getattr(text, "num_key_value_heads", None) or text.num_attention_heads
                if num_kv_heads is None else num_kv_heads)
    intermediate = text.intermediate_size if intermediate_size is None else intermediate_size
    for name, value in (("intermediate_size", intermediate), ("num_heads", heads),
                        ("num_kv_heads", kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if d % heads or heads % kv_heads:
        raise ValueError(f"num_heads: the EAGLE-3 layer takes head_dim = hidden_size / heads and "
                         f"groups the heads over the KV heads; {heads} heads over {kv_heads} KV "
                         f"heads at the target's width {d} do not divide")
    params = getattr(text, "rope_parameters", None) or {}
    cfg = EagleConfig(
        arch="eagle3", hidden_size=d, target_hidden_size=d,
        intermediate_size=intermediate, num_heads=heads, num_kv_heads=kv_heads, num_layers=1,
        vocab_size=vocab, draft_vocab_size=min(draft_vocab_size, vocab),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
        rope_theta=float(params.get("rope_theta", getattr(text, "rope_theta", 10000.0))),
        hidden_act=getattr(text, "hidden_act", "silu"), feature_layers=layers)
    return EagleDrafter(cfg, target).float()


def draft_vocabulary(answers: list, vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """`d2t` long `[draft_vocab_size]`: the most frequent tokens of `answers` (long `[A_i]`
    each), ties and never-seen tokens by id, sorted by id; draft id i is target id i + d2t[i]."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for answer in answers:
        counts += torch.bincount(answer.reshape(-1).cpu(), minlength=vocab_size)[:vocab_size]
    kept = torch.sort(-counts, stable=True).indices[:draft_vocab_size].sort().values
    return kept - torch.arange(draft_vocab_size)


def fit_draft_vocabulary(drafter: EagleDrafter, answers: list) -> None:
    """Set the drafter's `d2t` from `answers` and start its `lm_head` from the target's rows of
    those tokens (a drafter over the whole vocabulary keeps no `d2t`)."""
    cfg = drafter.config
    if cfg.draft_vocab_size < cfg.vocab_size:
        d2t = draft_vocabulary(answers, cfg.vocab_size, cfg.draft_vocab_size)
        drafter.head.d2t.copy_(d2t.to(drafter.head.d2t.device))
    ids = drafter.head.target_ids(torch.arange(cfg.draft_vocab_size,
                                               device=drafter.lm_head_weight.device))
    with torch.no_grad():
        drafter.head.lm_head.weight.copy_(drafter.lm_head_weight[ids])


@torch.no_grad()
def target_argmax(target, samples: list, answers: list) -> list:
    """The target's greedy next token (long `[T_i - 1]`) at every position of each sample's
    prompt + answer but the last, for the first `VOCABULARY_SAMPLES` samples: the tokens a
    drafter supervised on every position (`--supervise all`) is asked for, whose most frequent
    ones make its draft vocabulary (as the answers do when only they are supervised)."""
    tokens = []
    for sample, answer in list(zip(samples, answers))[:VOCABULARY_SAMPLES]:
        prompt = sample["input_ids"]
        ids = torch.cat([prompt, answer[None].to(prompt)], 1)
        extras = {k: v for k, v in sample.items() if k not in ("input_ids", "attention_mask")}
        if "mm_token_type_ids" in extras:  # per-token types: zeros (text) for the answer
            types = extras["mm_token_type_ids"]
            extras["mm_token_type_ids"] = F.pad(types, (0, ids.shape[1] - types.shape[1]))
        logits = target(input_ids=ids, attention_mask=torch.ones_like(ids), **extras).logits
        tokens.append(logits[0, :-1].argmax(-1).cpu())
    return tokens


def training_passes(drafter: EagleDrafter, features: torch.Tensor, tokens: torch.Tensor,
                    steps: int) -> list:
    """The training-time test's forward: features `[B, n, 3d]` of the target at slots
    0..n-1, tokens long `[B, n + steps]` of slots 1..n+steps (past the end: any id, such entries
    are not supervised) -> `steps` outputs `[B, n, d]`; entry j of pass i is the tree node at
    depth i below entry j whose path is the tokens of slots j + 2..j + 1 + i."""
    head = drafter.head
    b, n = features.shape[:2]
    device = features.device
    entry = torch.arange(n, device=device)
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=device)
    x = head.layer_input(None, features, from_target=True)  # [B, n, d]
    past, outputs = None, []
    for i in range(steps):
        embeds = drafter.embed_weight[tokens[:, i: i + n]].to(x.dtype)  # [B, n, d]
        # keys: pass 0's entries up to j, then entry j of each later pass (its ancestors)
        mask = torch.cat([causal] + [eye] * i, 1).expand(b, n, (i + 1) * n)
        x, new_kv = head(x, embeds, (entry + i).expand(b, n), past, mask)
        past = append_kv(past, new_kv)
        outputs.append(x)  # the next pass feeds each entry its own output (a node's input)
    return outputs


def eagle3_loss(drafter: EagleDrafter, target, ids: torch.Tensor, prompt_len: int,
                extras: dict, rollout_steps: int):
    """(loss, parts) for one sequence `ids` `[1, T]` whose first `prompt_len` tokens are the
    prompt: the training-time test of the module docstring, `rollout_steps + 1` passes, on the
    entries that predict a token past the prompt (`prompt_len` 0: every entry, the whole
    window supervised)."""
    head = drafter.head
    t = ids.shape[1]
    n = t - 1  # entries
    steps = rollout_steps + 1
    with torch.no_grad():
        out = target(input_ids=ids, attention_mask=torch.ones_like(ids),
                     output_hidden_states=True, **extras)
        features = torch.cat([out.hidden_states[i] for i in drafter.config.feature_layers],
                             -1)[:, :-1].to(head.fc.weight.dtype)  # [1, n, 3d]
        vocab_ids = head.target_ids(torch.arange(drafter.config.draft_vocab_size,
                                                 device=ids.device))  # [Vd] in draft order
        in_draft = torch.zeros(out.logits.shape[-1], dtype=torch.bool, device=ids.device)
        in_draft[vocab_ids] = True
        # slots past the end: padding, never supervised
        logits = F.pad(out.logits.float(), (0, 0, 0, steps))  # [1, T + steps, V]
    hidden = training_passes(drafter, features, F.pad(ids, (0, steps))[:, 1:], steps)
    entry = torch.arange(n, device=ids.device)
    total, parts = 0.0 * hidden[0].sum(), {}  # a zero with a graph when nothing is supervised
    for i, h in enumerate(hidden):
        with torch.no_grad():
            t_logits = logits[0, 1 + i: 1 + i + n]  # [n, V]: the target's at slot j + 1 + i
            supervised = ((entry + 1 + i <= t - 1) & (entry + 2 + i >= prompt_len)
                          & in_draft[t_logits.argmax(-1)])
            t_probs = t_logits[supervised][:, vocab_ids].softmax(-1)  # [M, Vd]
        if not bool(supervised.any()):
            continue
        draft = head.draft_logits(h[0, supervised], None).float()  # [M, Vd]
        loss = -(t_probs * draft.log_softmax(-1)).sum(-1).mean()
        total = total + PASS_DECAY ** i * loss
        parts[f"ce{i}"] = float(loss.detach())
        parts[f"acc{i}"] = float((draft.argmax(-1) == t_probs.argmax(-1)).float().mean())
    return total, parts
