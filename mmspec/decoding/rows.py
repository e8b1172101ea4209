"""The engine's bookkeeping of a batch: `Rows` (each row's output sequence) and `Slots` (the
committed tokens lined up with the target's KV cache, what a drafter sees).

B rows; L prompt columns (left-padded); n new tokens at most per row (`max_new_tokens`).

A worked example: two rows, prompt length L = 4, row 0 left-padded by one (`p` pad, `.` a hole).

    prompt            slots after the prefill           first token (from the prefill logits)
    row 0: p a b c    ids   [p a b c | x]  valid [0 1 1 1 | 1]
    row 1: d e f g    ids   [d e f g | y]  valid [1 1 1 1 | 1]

The last slot of every row is its *root*: its last committed token, whose keys the next
verification forward computes (the cache holds slots 0..S-2). Round 1 drafts a tree below each
root; row 0 accepts 2 draft tokens (u v) and takes the target's bonus token w, row 1 accepts 0
and takes its bonus z. The round appends K = 1 + max accepted = 3 slots to every row: the accepted
path (holes where a row accepted fewer), then the bonus token as the new root.

    row 0: ids [p a b c x | u v | w]  valid [0 1 1 1 1 | 1 1 | 1]
    row 1: ids [d e f g y | . . | z]  valid [1 1 1 1 1 | 0 0 | 1]

The KV cache gets the same layout (`kv_cache.commit_path` gathers the root's and the accepted
nodes' keys into slots C..C+K-1, C = S - 1 before the round), and `valid` is the
`attention_mask` of every later forward, so the holes are never attended. Positions do not
count holes: row 1's root z sits at position 5 (`root_pos`), row 0's w at 6.

`Rows` keeps the same tokens without holes, as `generate` returns them:

    row 0: seq [p a b c | x u v w | pad ...]   count 4
    row 1: seq [d e f g | y z     | pad ...]   count 2
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=64)
def columns(n: int, device: torch.device) -> torch.Tensor:
    """long `[n]`: 0, ..., n - 1, made once per (n, device), never written to (a round asks for
    the same few widths every time)."""
    return torch.arange(n, device=device)


class Rows:
    """Each row's sequence (the prompt as given, then its committed tokens, pad after) on the
    device, and its count of new tokens and liveness both on the host (from the round's one read)
    and on the device (for the next round's masks)."""

    def __init__(self, input_ids, max_new_tokens, eos, pad):
        b, length = input_ids.shape
        device = input_ids.device
        self.prompt_len, self.max_new, self.pad = length, max_new_tokens, pad
        # [B, L + max_new + 1]; the last column takes the writes of masked entries
        self.seq = torch.full((b, length + max_new_tokens + 1), pad, dtype=torch.long,
                              device=device)
        self.seq[:, :length] = input_ids
        self.eos = eos.to(device)
        self.count, self.live = [0] * b, [True] * b
        self.live_t = torch.ones(b, dtype=torch.bool, device=device)
        self._send_counts()

    def _send_counts(self) -> None:
        """The host counts on the device, in one copy: `end_t` long `[B]` each row's next column
        (L + count), `left_t` long `[B]` the tokens it may still commit (0 once finished)."""
        counts = [[self.prompt_len + c for c in self.count],
                  [self.max_new - c if live else 0 for c, live in zip(self.count, self.live)]]
        self.end_t, self.left_t = torch.tensor(counts, device=self.seq.device)

    def cut(self, new: torch.Tensor, num: torch.Tensor):
        """new long `[B, K]`, num long `[B]` -> (num after the budget and the first EOS, hit:
        bool `[B]` an EOS among them), on the device; nothing is committed yet."""
        col = columns(new.shape[1], new.device)
        num = torch.minimum(num, self.left_t)
        is_eos = torch.isin(new, self.eos) & (col < num[:, None])  # [B, K]
        hit = is_eos.any(-1)
        return torch.where(hit, is_eos.int().argmax(-1) + 1, num), hit

    def write(self, new: torch.Tensor, num: torch.Tensor) -> None:
        """Write the first `num[b]` tokens of `new[b]` after row b's committed ones (device)."""
        col = columns(new.shape[1], new.device)
        idx = torch.where(col < num[:, None], self.end_t[:, None] + col,
                          self.seq.shape[1] - 1)  # [B, K]
        self.seq.scatter_(1, idx, new)

    def advance(self, num: list[int], stopped: list[bool]) -> None:
        """Host counts of this round's commit; rows that stopped (EOS, a criterion) or ran out
        of budget are finished."""
        live = list(self.live)
        for b, n in enumerate(num):
            if self.live[b]:
                self.count[b] += n
                self.live[b] = not stopped[b] and self.count[b] < self.max_new
        self._send_counts()
        if self.live != live:  # a row finished
            self.live_t = torch.tensor(self.live, device=self.seq.device)

    def unwrite(self, b: int, start: int, end: int) -> None:
        """Pad row b's new tokens `[start, end)` again (cut by a stopping criterion)."""
        self.seq[b, self.prompt_len + start: self.prompt_len + end] = self.pad

    def stop_at_criteria(self, stop, num: list[int], hit: list[bool]):
        """Apply the extra stopping criteria (stop strings, ...) to the tokens just written: cut
        `num` (host list) where one fires, and mark those rows stopped (host list `hit`)."""
        if stop is None or not stop.extra:
            return num, hit
        start = [self.prompt_len + c for c in self.count]
        cut = stop.first_stop(self.seq, start,
                              [n if live else 0 for n, live in zip(num, self.live)])
        num, hit = list(num), list(hit)
        for b, at in enumerate(cut):
            if at is not None:
                self.unwrite(b, self.count[b] + at, self.count[b] + num[b])
                num[b], hit[b] = at, True
        return num, hit

    @property
    def sequences(self) -> torch.Tensor:
        """long `[B, L + n]`, n the longest row's new tokens; pad after each row's end."""
        return self.seq[:, : self.prompt_len + max(self.count)]


class Slots:
    """Committed tokens in slot layout (module docstring), and each row's root position.

    ids:      long `[B, S]`, the last column every row's root.
    valid:    bool `[B, S]`, False on left padding and holes.
    root_pos: long `[B, 1]`, or `[A, B, 1]` for multi-axis RoPE: each root's position.
    """

    def __init__(self, input_ids, attention_mask, first, prompt_pos):
        self.ids = torch.cat([input_ids, first[:, None]], dim=1)  # [B, L + 1]; last column: roots
        self.valid = torch.cat([attention_mask.bool(),
                                torch.ones_like(self.ids[:, :1], dtype=torch.bool)], 1)
        self.root_pos = prompt_pos[..., -1:] + 1  # [..., B, 1]

    @property
    def cache_valid(self) -> torch.Tensor:
        """bool `[B, S - 1]`: the slots whose keys are cached (all but the roots)."""
        return self.valid[:, :-1]

    def append(self, path_tokens, path_valid, bonus, depth, live, all_live: bool) -> None:
        """path_tokens/path_valid `[B, K-1]` accepted tokens (holes False); bonus, depth, live
        `[B]`; all_live: the host knows every row was live (nothing to mask). A finished row gets
        holes and keeps its root position: no position (target's or drafter's) grows past where
        the row stopped."""
        step = depth + 1
        if not all_live:
            path_valid, step = path_valid & live[:, None], step * live
        self.ids = torch.cat([self.ids, path_tokens, bonus[:, None]], dim=1)
        self.valid = torch.cat([self.valid, path_valid, live[:, None]], 1)
        self.root_pos = self.root_pos + step[:, None]
