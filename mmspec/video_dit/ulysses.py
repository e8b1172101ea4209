"""DraftAttention under diffusers' Ulysses context parallelism (`enable_parallelism`).

diffusers shards the tokens of a video across the N processes of a Ulysses group (the model's
`_cp_plan` splits them in contiguous chunks along the sequence, `hooks/context_parallel.py`).
Around each attention call `TemplatedUlyssesAttention` (`models/attention_dispatch.py`) trades
them with an all-to-all: every rank then holds the whole sequence for H/N of the heads, calls the
attention backend's `forward_op` on it and trades the output back. DraftAttention's map and
selection are per head (`draft_map.select_blocks`: every mode ranks a head's own map), so a rank
that drafts and selects for its heads on the whole sequence computes exactly the blocks a single
process computes for them. The sparse call is that `forward_op`.

After the all-to-all the sequence is the ranks' local sequences one after another. Each local
sequence is a chunk of the video tokens plus, with joint attention, a chunk of the text (text
after the video for HunyuanVideo, before it for CogVideoX), so the full sequence is
`[v0, t0, v1, t1, ...]`; `_to_model_order` makes it `[v0, v1, ..., t0, t1, ...]` (the model's
token order, row-major video tokens; a copy where there is text) and `_from_model_order` undoes
it. `draft_attention` then reads them through the tile permutation: diffusers' split hooks cut
the tokens and RoPE tables inside the modules' own forward, before a forward hook of ours could
put them in tile order once per forward, so under context parallelism the state keeps `tiled`
False.

Ring attention (each rank sees a shard of the keys in turn) and Ulysses "anything" (uneven
shards) are refused by `check_context_parallel`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ulysses_config(parallel_config):
    """The `ContextParallelConfig` of a processor's `_parallel_config`, or None without one."""
    return getattr(parallel_config, "context_parallel_config", None)


def check_context_parallel(cp, model_name: str) -> None:
    """Refuse the context parallelism DraftAttention cannot run under, in one line."""
    if cp is None:
        return
    if cp.ring_degree > 1:
        raise NotImplementedError(
            f"DraftAttention on a {model_name} with ring attention "
            f"(ring_degree={cp.ring_degree}): each rank would see a shard of the keys, and the draft map needs them all; use "
            f"Ulysses instead, ContextParallelConfig(ulysses_degree={cp.ring_degree})")
    if cp.ulysses_anything:
        raise NotImplementedError(
            f"DraftAttention on a {model_name} with ulysses_anything=True: uneven shards are not "
            f"supported; use ContextParallelConfig(ulysses_degree={cp.ulysses_degree}) with a "
            f"token count and head count divisible by {cp.ulysses_degree}")


def _to_model_order(x: torch.Tensor, world: int, text_len: int, text_first: bool):
    """`[B, H, world * S, D]`, the ranks' local sequences (each `[video, text]` or `[text, video]`,
    `text_len` text tokens) one after another -> `[B, H, world * S, D]` in the model's order."""
    b, h, _, d = x.shape
    x = x.view(b, h, world, -1, d)  # [B, H, world, S, D]
    if not text_len:
        return x.flatten(2, 3)
    split = text_len if text_first else x.shape[3] - text_len
    first, second = x[:, :, :, :split].flatten(2, 3), x[:, :, :, split:].flatten(2, 3)
    return torch.cat([first, second], dim=2)


def _from_model_order(x: torch.Tensor, world: int, text_len: int, text_first: bool):
    """The inverse of `_to_model_order`."""
    b, h, n, d = x.shape
    if not text_len:
        return x
    split = world * text_len if text_first else n - world * text_len
    first = x[:, :, :split].reshape(b, h, world, -1, d)
    second = x[:, :, split:].reshape(b, h, world, -1, d)
    return torch.cat([first, second], dim=3).flatten(2, 3)


def _gather_key_valid(key_valid: torch.Tensor, group, world: int) -> torch.Tensor:
    """bool `[B|1, S]` of this rank's tokens -> `[B|1, world * S]`, the ranks' one after
    another."""
    parts = [torch.empty_like(key_valid, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, key_valid.to(torch.uint8).contiguous(), group=group)
    return torch.cat(parts, dim=1).bool()


def ulysses_draft_attention(attend, q, k, v, parallel_config, *, text_len: int = 0,
                            text_first: bool = False, key_valid: torch.Tensor | None = None,
                            **kwargs):
    """`attend(q, k, v, text_len=, text_first=, key_valid=, **kwargs)` (a DraftAttention call on
    the whole sequence, `[B, H/N, L, D]`) run on this rank's tokens `[B, H, L/N, D]` through
    diffusers' Ulysses all-to-all; returns `[B, H, L/N, D]`, this rank's tokens for every head."""
    from diffusers.models.attention_dispatch import TemplatedUlyssesAttention

    cp = parallel_config.context_parallel_config
    world, heads = cp.ulysses_degree, q.shape[1]
    if heads % world:
        raise ValueError(f"ulysses_degree={world} must divide the attention heads, got {heads}")
    group = cp._ulysses_mesh.get_group()
    if key_valid is not None:
        key_valid = _to_model_order(_gather_key_valid(key_valid, group, world)[:, None, :, None],
                                    world, text_len, text_first)[:, 0, :, 0]

    def forward_op(ctx, query, key, value, *args, _save_ctx=True, _parallel_config=None):
        # [B, world * S, H/N, D]: the whole sequence for this rank's heads
        full = [_to_model_order(x.transpose(1, 2), world, text_len, text_first)
                for x in (query, key, value)]
        out = attend(*full, text_len=world * text_len, text_first=text_first,
                     key_valid=key_valid, **kwargs)
        return _from_model_order(out, world, text_len, text_first).transpose(1, 2)

    def backward_op(ctx, grad_out, *args, **kw):
        raise NotImplementedError("DraftAttention under Ulysses runs inference only (no backward)")

    out = TemplatedUlyssesAttention.apply(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, 0.0, False, None, False,
        False, forward_op, backward_op, parallel_config)
    return out.transpose(1, 2)  # [B, H, L/N, D]
