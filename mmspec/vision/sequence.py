"""The drafter's own sequence: (target feature, next token) pairs, with each image compressed.

EAGLE pairs: entry i holds the target's last hidden state at position i and the token at i + 1;
its output predicts the feature at i + 1. It sits at the target's position of token i, so draft
positions match the target's (M-RoPE axes included).

ViSpec (`vispec.md` §1.3-1.4) on top of that, per image k with token slots s_1 < ... < s_n:
- the pairs whose token is an image token (i = s_j - 1) are dropped, hidden states included;
- Q - 1 compressed tokens (the adaptor's first outputs) take their place, at the positions of the
  span's last Q - 1 dropped pairs, so text after the image keeps its original positions;
- every pair after the image (i >= s_n) gets image k's global vector; earlier text gets zeros.
The text-only variant keeps every pair, with the image features as the token embeddings of image
positions (the target's own `inputs_embeds`), and has no global vectors.

Deliberate difference from ViSpec's code: image spans come from the per-image feature counts,
not from contiguous runs of image tokens, so adjacent images and any number of images per row are
handled (the reference's `trans_mat` is only right for one image).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Entries:
    """B rows of N draft entries (right-padded; `valid` False on padding).

    embeds, features, global_vecs, compressed: `[B, N, d]`; is_compressed, valid: bool `[B, N]`;
    positions: long `[A, B, N]`; pair_index: long `[B, N]`, the pair i of each entry (-1 for
    compressed tokens and padding), which training uses to find the targets.
    """

    embeds: torch.Tensor
    features: torch.Tensor
    global_vecs: torch.Tensor
    compressed: torch.Tensor
    is_compressed: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    pair_index: torch.Tensor

    @property
    def last_index(self) -> torch.Tensor:
        """long `[B]`: each row's last valid entry."""
        n = self.valid.shape[1]
        idx = torch.arange(n, device=self.valid.device).expand_as(self.valid)
        return torch.where(self.valid, idx, -1).max(1).values


def _row_entries(b, input_ids, valid, features, positions, embed_weight, images, adapted, slots,
                 num_compressed):
    """One row's entries as a dict of unpadded tensors (see `prompt_entries`)."""
    tokens = input_ids[b, 1:]  # [S-1] the token of pair i
    n_pairs = tokens.shape[0]
    d = features.shape[-1]
    keep = valid[b, :-1] & valid[b, 1:]  # [S-1]
    embeds = embed_weight[tokens].to(features.dtype)  # [S-1, d]
    global_vecs = features.new_zeros(n_pairs, d)
    order = torch.arange(n_pairs, device=tokens.device)
    extra = {"key": [], "vec": [], "pos": []}
    for k, (row, cols) in enumerate(slots):
        if row != b:
            continue
        pairs = cols - 1
        pairs = pairs[pairs >= 0]
        if adapted is None:  # text-only: the target's inputs_embeds at image positions
            has_pair = cols >= 1
            embeds[cols[has_pair] - 1] = images[k][has_pair].to(embeds.dtype)
            continue
        if len(pairs) < num_compressed:
            raise ValueError(f"image {k} has {len(pairs)} tokens, fewer than the {num_compressed} "
                             f"compressed tokens per image (num_queries - 1)")
        keep[pairs] = False
        after = order >= int(cols[-1])
        global_vecs[after] = adapted[k, -1].to(features.dtype)
        trail = pairs[len(pairs) - num_compressed:]
        extra["key"].append(trail)
        extra["vec"].append(adapted[k, :num_compressed].to(features.dtype))
        extra["pos"].append(positions[:, b, trail])
    idx = order[keep]
    key = torch.cat([idx] + extra["key"])
    n_extra = len(key) - len(idx)
    comp = torch.cat([features.new_zeros(len(idx), d)] + extra["vec"])
    sort = torch.argsort(key, stable=True)
    pos = torch.cat([positions[:, b, idx]] + extra["pos"], dim=1)
    pad = lambda x: torch.cat([x, x.new_zeros(n_extra, *x.shape[1:])])
    return {
        "embeds": pad(embeds[idx])[sort],
        "features": pad(features[b, idx])[sort],
        "global_vecs": pad(global_vecs[idx])[sort],
        "compressed": comp[sort],
        "is_compressed": (torch.arange(len(key), device=key.device) >= len(idx))[sort],
        "positions": pos[:, sort],
        "pair_index": torch.cat([idx, torch.full((n_extra,), -1, device=key.device)])[sort],
    }


def _stack(rows: list) -> Entries:
    """Right-pad the rows' entries to one length."""
    n = max(r["pair_index"].shape[0] for r in rows)
    out = {}
    for name in rows[0]:
        parts = []
        for r in rows:
            x = r[name]
            dim = 1 if name == "positions" else 0
            shape = list(x.shape)
            shape[dim] = n - x.shape[dim]
            fill = -1 if name == "pair_index" else 0
            parts.append(torch.cat([x, x.new_full(shape, fill)], dim=dim))
        out[name] = torch.stack(parts, dim=1 if name == "positions" else 0)
    valid = torch.stack([torch.arange(n, device=rows[0]["pair_index"].device)
                         < r["pair_index"].shape[0] for r in rows])
    return Entries(valid=valid, **out)


def prompt_entries(input_ids, valid, features, positions, embed_weight, images, adapted,
                   slots, num_compressed) -> Entries:
    """Entries for whole sequences: the prompt at round 0, or prompt + answer in training.

    input_ids long `[B, S]`, valid bool `[B, S]` (no holes inside a row), features `[B, S-1, d]`
    (the target's last hidden states of slots 0..S-2), positions long `[A, B, S-1]`,
    embed_weight `[V, d]`, images: K tensors `[n_k, d]`, adapted `[K, Q, d]` or None (text-only),
    slots: `TargetAdapter.image_slots`, num_compressed = Q - 1.
    """
    rows = [_row_entries(b, input_ids, valid, features, positions, embed_weight, images, adapted,
                         slots, num_compressed) for b in range(input_ids.shape[0])]
    return _stack(rows)


def decode_entries(new_ids, new_valid, features, root_positions, embed_weight, global_vecs) -> Entries:
    """Entries for the tokens committed in the last round.

    new_ids, new_valid: `[B, K]` the new slots (accepted draft tokens with holes, then the bonus);
    features `[B, K, d]`: the target's hidden states of the previous root and the accepted nodes,
    right-padded (`DraftState.target_hidden`); root_positions long `[A, B, 1]`: the previous
    root's position; global_vecs `[B, d]`: each row's latest image vector (vispec.md §1.4: reused
    for every new token).
    """
    b, k = new_ids.shape
    order = torch.argsort((~new_valid).to(torch.int8), dim=1, stable=True)  # valid slots first
    tokens = new_ids.gather(1, order)  # [B, K]
    count = new_valid.sum(1)  # [B]
    valid = torch.arange(k, device=new_ids.device)[None] < count[:, None]
    steps = torch.arange(k, device=new_ids.device)
    return Entries(
        embeds=embed_weight[tokens].to(features.dtype),
        features=features,
        global_vecs=global_vecs[:, None].expand(b, k, -1).to(features.dtype),
        compressed=torch.zeros_like(features),
        is_compressed=torch.zeros_like(valid),
        valid=valid,
        positions=root_positions + steps,
        pair_index=torch.where(valid, steps, -1),
    )
