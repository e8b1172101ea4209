"""`BlockSparseMask`: which key blocks each query block attends, in FlexAttention's BlockMask layout.

Per (batch, head, query block) the mask holds two ordered index lists of key blocks
(FlexAttention's "ordered BCSR", `torch/nn/attention/flex_attention.py::BlockMask`):

- *full* blocks (`full_kv_num_blocks`, `full_kv_indices`): every in-range element is attended, so
  kernels skip the element mask;
- *partial* blocks (`kv_num_blocks`, `kv_indices`): each carries a `[bq, bk]` element mask in
  `partial_masks`, aligned slot by slot with `kv_indices`.

Entries past a row's count are padding and never read. Batch and head dimensions of size 1
broadcast. Lengths need not be multiples of the block size: the last block of a ragged tail is
shorter, and a "full" tail block means every key that exists.

Deliberate differences from FlexAttention: element masks are stored as tensors (not `mask_mod`
callables), so every backend, the Triton kernel included, reads the same data; and the class
validates the tensors it is given, because a wrong index here is a silent wrong answer (the
constructors that derive the lists themselves, `from_dense` and `from_token_mask`, skip those
checks, which read the device).
"""

from __future__ import annotations

import math
import numbers
import threading
import weakref
from dataclasses import dataclass

import torch

_DENSE_CACHE_MAX = 1 << 22  # elements of a token-level mask kept by `to_dense` (4 MiB of bool)


class _LastDense(threading.local):
    """`to_dense`'s last result: (weak references to the mask's tensors, key, tensor, its
    version). Weak references: a freed tensor's id may be reused, a dead reference cannot match."""

    entry = None


_LAST_DENSE = _LastDense()


def _is_int(value) -> bool:
    """An integer, Python's or NumPy's (`numbers.Integral`), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _length(name: str, value, minimum: int = 1) -> int:
    """`value` as an int, or an error naming `name`: lengths are counts of tokens."""
    if not _is_int(value) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value)


def _check_block_flags(name: str, flags, block_size: tuple[int, int], q_len: int,
                       kv_len: int) -> None:
    """Block flags are bool `[B|1, H|1, ceil(q_len / bq), ceil(kv_len / bk)]`."""
    if not isinstance(flags, torch.Tensor) or flags.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor [B, H, Mq, Nk], got "
            f"{getattr(flags, 'dtype', type(flags).__name__)} (`flags != 0` turns 0/1 ints "
            f"into one)")
    blocks = (math.ceil(q_len / block_size[0]), math.ceil(kv_len / block_size[1]))
    if flags.ndim != 4 or tuple(flags.shape[2:]) != blocks:
        raise ValueError(
            f"{name} must be [B, H, Mq, Nk], where q_len={q_len}, kv_len={kv_len} and block_size "
            f"{block_size} need (Mq, Nk) = {blocks}; got shape {tuple(flags.shape)}")


def _pair(block_size) -> tuple[int, int]:
    if _is_int(block_size):
        block_size = (block_size, block_size)
    if (
        not isinstance(block_size, (tuple, list))
        or len(block_size) != 2
        or not all(_is_int(b) and b > 0 for b in block_size)
    ):
        raise ValueError(
            f"block_size must be a positive int or a pair (bq, bk) of positive ints, got {block_size!r}"
        )
    return int(block_size[0]), int(block_size[1])


def _dense_to_ordered(block_bool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool `[B, H, M, N]` -> (counts int32 `[B, H, M]`, indices int32 `[B, H, M, N]`), kept first."""
    counts = block_bool.sum(-1, dtype=torch.int32)
    # stable sort on the negated flags keeps kept blocks first and in ascending order
    indices = torch.argsort((~block_bool).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts, indices


@dataclass(frozen=True, eq=False)
class BlockSparseMask:
    """Block-sparse attention layout (see the module docstring).

    Shapes (B and H may be 1 to broadcast; `Mq = ceil(q_len / bq)`, `Nk = ceil(kv_len / bk)`):
        kv_num_blocks:       int32 `[B, H, Mq]`         partial blocks per query block
        kv_indices:          int32 `[B, H, Mq, P]`      partial key-block ids, kept first
        full_kv_num_blocks:  int32 `[B, H, Mq]`         full blocks per query block
        full_kv_indices:     int32 `[B, H, Mq, F]`      full key-block ids, kept first
        partial_masks:       bool  `[B, H, Mq, P, bq, bk]` element masks of the partial slots
    """

    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    partial_masks: torch.Tensor
    block_size: tuple[int, int]
    q_len: int
    kv_len: int

    def __post_init__(self):
        bq, bk = _pair(self.block_size)
        object.__setattr__(self, "block_size", (bq, bk))
        for name in ("q_len", "kv_len"):
            object.__setattr__(self, name, _length(name, getattr(self, name)))
        mq, nk = self.num_q_blocks, self.num_kv_blocks
        tensors = {
            "kv_num_blocks": (self.kv_num_blocks, torch.int32, 3),
            "kv_indices": (self.kv_indices, torch.int32, 4),
            "full_kv_num_blocks": (self.full_kv_num_blocks, torch.int32, 3),
            "full_kv_indices": (self.full_kv_indices, torch.int32, 4),
            "partial_masks": (self.partial_masks, torch.bool, 6),
        }
        for name, (t, dtype, ndim) in tensors.items():  # types first: .device below
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        device = self.kv_num_blocks.device
        for name, (t, dtype, ndim) in tensors.items():
            if t.dtype != dtype:
                raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
            if t.ndim != ndim:
                raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
            if t.device != device:
                raise ValueError(f"{name} is on {t.device} but kv_num_blocks is on {device}")
        b, h = self.kv_num_blocks.shape[:2]
        expect = {
            "kv_num_blocks": (b, h, mq),
            "full_kv_num_blocks": (b, h, mq),
            "kv_indices": (b, h, mq, self.kv_indices.shape[-1]),
            "full_kv_indices": (b, h, mq, self.full_kv_indices.shape[-1]),
            "partial_masks": (b, h, mq, self.kv_indices.shape[-1], bq, bk),
        }
        for name, shape in expect.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(
                    f"{name} has shape {tuple(getattr(self, name).shape)} but q_len={self.q_len}, "
                    f"kv_len={self.kv_len}, block_size={(bq, bk)} and kv_num_blocks {(b, h, mq)} "
                    f"require {shape}"
                )
        self._check_indices(nk)

    def _check_indices(self, nk: int) -> None:
        lists = {
            "kv": (self.kv_num_blocks, self.kv_indices),
            "full_kv": (self.full_kv_num_blocks, self.full_kv_indices),
        }
        for prefix, (num, idx) in lists.items():
            if num.numel() and (num.min() < 0 or num.max() > idx.shape[-1]):
                raise ValueError(
                    f"{prefix}_num_blocks must lie in [0, {idx.shape[-1]}] (the width of "
                    f"{prefix}_indices), got range [{int(num.min())}, {int(num.max())}]"
                )
        # one bool per (row, key block), counting partial and full references together
        used = torch.zeros(*self.kv_num_blocks.shape, nk + 1, dtype=torch.int32, device=self.device)
        for prefix, (num, idx) in lists.items():
            width = idx.shape[-1]
            live = torch.arange(width, device=self.device) < num.unsqueeze(-1)  # [B, H, Mq, W]
            if live.any():
                live_idx = idx[live]
                if live_idx.min() < 0 or live_idx.max() >= nk:
                    raise ValueError(
                        f"{prefix}_indices must lie in [0, {nk}) for kv_len={self.kv_len} and "
                        f"bk={self.block_size[1]}, got range [{int(live_idx.min())}, "
                        f"{int(live_idx.max())}]"
                    )
            # dead slots count towards the spare column nk
            slot = torch.where(live, idx.long().clamp(0, nk - 1), nk)
            used.scatter_add_(-1, slot, torch.ones_like(slot, dtype=torch.int32))
        if used.numel() and used[..., :nk].max() > 1:
            raise ValueError(
                "a key block appears twice in one query block's lists (kv_indices and "
                "full_kv_indices together must hold distinct block ids)"
            )

    @classmethod
    def _unchecked(cls, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                   partial_masks, block_size, q_len, kv_len) -> "BlockSparseMask":
        """Rebuild a mask from tensors already validated (inside the custom op)."""
        mask = object.__new__(cls)
        for name, value in (("kv_num_blocks", kv_num_blocks), ("kv_indices", kv_indices),
                            ("full_kv_num_blocks", full_kv_num_blocks),
                            ("full_kv_indices", full_kv_indices), ("partial_masks", partial_masks),
                            ("block_size", tuple(block_size)), ("q_len", q_len),
                            ("kv_len", kv_len)):
            object.__setattr__(mask, name, value)
        return mask

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_dense(cls, block_bool: torch.Tensor, block_size, q_len: int, kv_len: int):
        """Every kept block is full. `block_bool` is bool `[B|1, H|1, ceil(q_len/bq), ceil(kv_len/bk)]`."""
        bq, bk = _pair(block_size)
        q_len, kv_len = _length("q_len", q_len), _length("kv_len", kv_len)
        _check_block_flags("block_bool", block_bool, (bq, bk), q_len, kv_len)
        # valid by construction, so the index checks of __post_init__ (a handful of device
        # syncs, once per layer and step under DraftAttention) are skipped
        return cls.from_full_lists(*_dense_to_ordered(block_bool), (bq, bk), q_len, kv_len)

    @classmethod
    def from_full_lists(cls, full_kv_num_blocks: torch.Tensor, full_kv_indices: torch.Tensor,
                        block_size, q_len: int, kv_len: int) -> "BlockSparseMask":
        """Every listed block full, from the lists `from_dense` would build: int32 counts
        `[B, H, Mq]` and int32 indices `[B, H, Mq, W]`, each row's kept key blocks first.

        For index lists built on the device (DraftAttention's fused draft writes them with its
        selection): the shapes are checked, the values are trusted, since checking them reads
        the device (`__post_init__` validates the masks built from their parts).
        """
        bq, bk = _pair(block_size)
        q_len, kv_len = _length("q_len", q_len), _length("kv_len", kv_len)
        mq = math.ceil(q_len / bq)
        num, idx = full_kv_num_blocks, full_kv_indices
        ok = (isinstance(num, torch.Tensor) and isinstance(idx, torch.Tensor)
              and num.dtype == idx.dtype == torch.int32 and num.ndim == 3 and idx.ndim == 4
              and num.shape[2] == mq and idx.shape[:3] == num.shape and num.device == idx.device)
        if not ok:
            raise ValueError(
                f"full_kv_num_blocks and full_kv_indices must be int32 [B, H, Mq={mq}] and "
                f"[B, H, Mq, W] on one device for q_len={q_len} and bq={bq}, got "
                f"{getattr(num, 'dtype', type(num).__name__)} {list(getattr(num, 'shape', []))} "
                f"and {getattr(idx, 'dtype', type(idx).__name__)} "
                f"{list(getattr(idx, 'shape', []))}")
        b, h = num.shape[:2]
        return cls._unchecked(
            torch.zeros(b, h, mq, dtype=torch.int32, device=num.device),
            torch.zeros(b, h, mq, 0, dtype=torch.int32, device=num.device),
            num, idx,
            torch.zeros(b, h, mq, 0, bq, bk, dtype=torch.bool, device=num.device),
            (bq, bk), q_len, kv_len,
        )

    @classmethod
    def from_token_mask(cls, token_bool: torch.Tensor, block_size, *, pad_partials: bool = False):
        """Classify the blocks of a token mask `[B|1, H|1, q_len, kv_len]` as full, partial or empty.

        Any bool token mask gives a valid layout (its lists come from the block flags, sorted),
        so the index checks of `__post_init__`, which read the device, are skipped, as
        `from_dense` does; the token mask itself is checked. The one device read left sizes the
        partial lists to the most any query block holds; `pad_partials=True` gives every query
        block a slot per key block instead (`partial_masks` `[.., Mq, Nk, bq, bk]`), which reads
        nothing back: for small masks built at every step (draft tree levels), not for long
        sequences, where that is Nk times the element masks.
        """
        bq, bk = _pair(block_size)
        if not isinstance(token_bool, torch.Tensor) or token_bool.dtype != torch.bool:
            raise TypeError(
                f"token_bool must be a bool tensor, got "
                f"{getattr(token_bool, 'dtype', type(token_bool).__name__)}"
            )
        if token_bool.ndim != 4:
            raise ValueError(
                f"token_bool must be [B, H, q_len, kv_len], got shape {tuple(token_bool.shape)}"
            )
        b, h, q_len, kv_len = token_bool.shape
        q_len, kv_len = _length("q_len", q_len), _length("kv_len", kv_len)
        mq, nk = math.ceil(q_len / bq), math.ceil(kv_len / bk)
        # pad to whole blocks; padding counts as "attended" so a ragged tail block can be full
        padded = torch.ones(b, h, mq * bq, nk * bk, dtype=torch.bool, device=token_bool.device)
        padded[..., :q_len, :kv_len] = token_bool
        tiles = padded.view(b, h, mq, bq, nk, bk).permute(0, 1, 2, 4, 3, 5)  # [B,H,Mq,Nk,bq,bk]
        in_range = torch.zeros_like(padded)
        in_range[..., :q_len, :kv_len] = True
        real = in_range.view(b, h, mq, bq, nk, bk).permute(0, 1, 2, 4, 3, 5)
        any_kept = (tiles & real).flatten(-2).any(-1)
        full = tiles.flatten(-2).all(-1) & any_kept
        partial = any_kept & ~full
        full_num, full_idx = _dense_to_ordered(full)
        part_num, part_idx = _dense_to_ordered(partial)
        if not pad_partials:
            width = int(part_num.max()) if part_num.numel() else 0
            part_idx = part_idx[..., :width]
        # element masks of the partial slots, gathered in slot order
        gather = part_idx.long()[..., None, None].expand(-1, -1, -1, -1, bq, bk)
        part_masks = torch.gather(tiles & real, 3, gather)
        mask = cls._unchecked(part_num, part_idx.contiguous(), full_num, full_idx,
                              part_masks.contiguous(), (bq, bk), q_len, kv_len)
        if token_bool.numel() <= _DENSE_CACHE_MAX:  # not a copy of a long prefill's mask
            mask._keep_dense(token_bool.clone())  # its token form, which to_dense would rebuild
        return mask

    @classmethod
    def from_block_flags(cls, full: torch.Tensor, partial: torch.Tensor, mask_mod, block_size,
                         q_len: int, kv_len: int) -> "BlockSparseMask":
        """Fast constructor for masks whose block structure is known analytically.

        `full` and `partial` are bool `[B|1, H|1, Mq, Nk]` block flags (bool, not 0/1 ints: as in
        `from_dense`, a flag tensor of another dtype is refused rather than guessed at). The
        predicate `mask_mod(b, h, q_idx, kv_idx) -> bool` (FlexAttention's signature, broadcasting
        tensors) is evaluated only inside the `partial` blocks; those it finds all-kept become full
        and those it finds empty are dropped.
        """
        bq, bk = _pair(block_size)
        q_len, kv_len = _length("q_len", q_len), _length("kv_len", kv_len)
        for name, flags in (("full", full), ("partial", partial)):
            _check_block_flags(name, flags, (bq, bk), q_len, kv_len)
        full, partial = torch.broadcast_tensors(full, partial)  # [B|1, H|1] each, as documented
        full, partial = full & ~partial, partial.clone()
        cand = partial.nonzero(as_tuple=True)  # (b, h, m, n) of each candidate block
        bi, hi, mi, ni = cand
        q_idx = mi[:, None, None] * bq + torch.arange(bq, device=full.device)[None, :, None]
        kv_idx = ni[:, None, None] * bk + torch.arange(bk, device=full.device)[None, None, :]
        in_range = (q_idx < q_len) & (kv_idx < kv_len)
        elements = mask_mod(bi[:, None, None], hi[:, None, None], q_idx, kv_idx)
        # a mask_mod may return ints ((q >= k).int()): as bools, as FlexAttention reads them
        elements = torch.as_tensor(elements, device=full.device).bool().expand(
            len(bi), bq, bk) & in_range
        all_kept = (elements | ~in_range).flatten(1).all(1) & elements.flatten(1).any(1)
        full[bi[all_kept], hi[all_kept], mi[all_kept], ni[all_kept]] = True
        partial[cand] = elements.flatten(1).any(1) & ~all_kept
        full_num, full_idx = _dense_to_ordered(full)
        part_num, part_idx = _dense_to_ordered(partial)
        width = int(part_num.max()) if part_num.numel() else 0
        part_idx = part_idx[..., :width].contiguous()
        # scatter each surviving candidate's elements into its slot
        slot_of = torch.zeros(full.shape, dtype=torch.long, device=full.device)
        slot_of.scatter_(-1, part_idx.long(), torch.arange(width, device=full.device).expand_as(part_idx))
        masks = torch.zeros(*full.shape[:3], width, bq, bk, dtype=torch.bool, device=full.device)
        keep = partial[cand]
        masks[bi[keep], hi[keep], mi[keep], slot_of[bi[keep], hi[keep], mi[keep], ni[keep]]] = (
            elements[keep]
        )
        return cls(part_num, part_idx, full_num, full_idx, masks, (bq, bk), q_len, kv_len)

    # ------------------------------------------------------------------------------- properties

    @property
    def device(self) -> torch.device:
        return self.kv_num_blocks.device

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, q_len, kv_len), with B and H possibly 1 (broadcast)."""
        b, h = self.kv_num_blocks.shape[:2]
        return (b, h, self.q_len, self.kv_len)

    @property
    def num_q_blocks(self) -> int:
        return math.ceil(self.q_len / self.block_size[0])

    @property
    def num_kv_blocks(self) -> int:
        return math.ceil(self.kv_len / self.block_size[1])

    @property
    def is_dense(self) -> bool:
        """True when every query block attends every key block in full."""
        return bool(self.kv_num_blocks.max() == 0) and bool(
            self.full_kv_num_blocks.min() == self.num_kv_blocks
        )

    # ------------------------------------------------------------------------------- conversions

    def block_layout(self) -> torch.Tensor:
        """int8 `[B, H, Mq, Nk]`: 0 = skipped, 1 = partial, 2 = full."""
        b, h, mq = self.kv_num_blocks.shape
        out = torch.zeros(b, h, mq, self.num_kv_blocks + 1, dtype=torch.int8, device=self.device)
        for code, num, idx in ((1, self.kv_num_blocks, self.kv_indices),
                               (2, self.full_kv_num_blocks, self.full_kv_indices)):
            live = torch.arange(idx.shape[-1], device=self.device) < num.unsqueeze(-1)
            slot = torch.where(live, idx.long(), self.num_kv_blocks)
            out.scatter_(-1, slot, code)
        return out[..., :-1]

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks,
                self.full_kv_indices, self.partial_masks)

    def versions(self) -> tuple[int, ...] | None:
        """The version counters of the mask's tensors (an in-place edit changes them), or None
        where there are none to trust: inference tensors, or tracing under torch.compile."""
        tensors = self._tensors()
        if torch.compiler.is_compiling() or any(t.is_inference() for t in tensors):
            return None
        return tuple(t._version for t in tensors)

    def to_dense(self) -> torch.Tensor:
        """Token-level bool `[B, H, q_len, kv_len]`: True where a query attends a key.

        The last small result is kept (per thread) for the same tensors: every layer of a forward
        asks for it again, through a new mask object around the same tensors (the custom op
        rebuilds one), ~55 us a build on a CPU at tree-verification sizes. An in-place change to
        those tensors or to the returned one is seen through their version counters; a write
        that bypasses them (`.data`, shared NumPy memory, a custom kernel) is not.
        """
        tensors = self._tensors()
        # inference tensors have no version counter: neither the mask's nor one built in
        # inference mode (found in review: a mask built at setup, attention under inference_mode)
        versions = None if torch.is_inference_mode_enabled() else self.versions()
        cacheable = versions is not None
        if cacheable:
            key = (versions, self.q_len, self.kv_len, self.block_size)
            last = _LAST_DENSE.entry
            if (last is not None and last[1] == key and last[2]._version == last[3]
                    and all(ref() is t for ref, t in zip(last[0], tensors))):
                return last[2]
        dense = self._build_dense()
        self._keep_dense(dense)
        return dense

    def _keep_dense(self, dense: torch.Tensor) -> None:
        """Keep `dense` as this mask's `to_dense` result (see there), where it can be kept."""
        versions = None if torch.is_inference_mode_enabled() else self.versions()
        if versions is not None and dense.numel() <= _DENSE_CACHE_MAX:
            key = (versions, self.q_len, self.kv_len, self.block_size)
            _LAST_DENSE.entry = (tuple(weakref.ref(t) for t in self._tensors()), key, dense,
                                 dense._version)

    def _build_dense(self) -> torch.Tensor:
        bq, bk = self.block_size
        b, h, mq = self.kv_num_blocks.shape
        nk = self.num_kv_blocks
        layout = self.block_layout()
        dense = (layout == 2)[..., None, None].expand(b, h, mq, nk, bq, bk).clone()
        if self.kv_indices.shape[-1]:
            live = torch.arange(self.kv_indices.shape[-1], device=self.device) < (
                self.kv_num_blocks.unsqueeze(-1)
            )
            bi, hi, mi, si = live.nonzero(as_tuple=True)
            dense[bi, hi, mi, self.kv_indices[bi, hi, mi, si].long()] = self.partial_masks[
                bi, hi, mi, si
            ]
        dense = dense.permute(0, 1, 2, 4, 3, 5).reshape(b, h, mq * bq, nk * bk)
        return dense[..., : self.q_len, : self.kv_len]

    def density(self) -> float:
        """Share of (query block, key block) pairs computed, full and partial, over all B and H."""
        kept = self.kv_num_blocks.sum() + self.full_kv_num_blocks.sum()
        total = self.kv_num_blocks.numel() * self.num_kv_blocks
        return float(kept) / total if total else 0.0  # a batch or head dim of 0

    def _block_states(self) -> torch.Tensor:
        """int32 `[B, H, Mq, Nk]`: -2 for a skipped (query block, key block), -1 for a full one,
        the partial slot (>= 0) for a partial one."""
        b, h, mq = self.kv_num_blocks.shape
        nk = self.num_kv_blocks
        states = torch.full((b, h, mq, nk + 1), -2, dtype=torch.int32, device=self.device)
        for num, idx, partial in ((self.full_kv_num_blocks, self.full_kv_indices, False),
                                  (self.kv_num_blocks, self.kv_indices, True)):
            width = idx.shape[-1]
            slot = torch.arange(width, dtype=torch.int32, device=self.device)
            used = slot < num[..., None]
            col = torch.where(used, idx.long(), nk)  # unused entries: the spare last column
            src = slot if partial else torch.full_like(slot, -1)
            states.scatter_(-1, col, src.expand_as(col).contiguous())
        return states[..., :-1].contiguous()

    def to_flex(self):
        """The same layout as a `torch.nn.attention.flex_attention.BlockMask`.

        Its `mask_mod` gives the whole mask (full blocks, the partial element masks, nothing
        elsewhere) from a map of each block's state, so no `[N, N]` token mask is built: the
        compiled kernel calls it on partial blocks only, the eager path on every pair.
        """
        from torch.nn.attention.flex_attention import BlockMask

        nk = self.num_kv_blocks
        bq, bk = self.block_size

        def pad(idx):  # FlexAttention reads the KV length from the index width
            out = torch.zeros(*idx.shape[:-1], nk, dtype=torch.int32, device=self.device)
            out[..., : min(idx.shape[-1], nk)] = idx[..., :nk]  # a row keeps at most nk blocks
            return out

        states = self._block_states()
        elements = self.partial_masks
        if elements.shape[3] == 0:  # no partial slot: one all-False slot to index
            elements = elements.new_zeros(*elements.shape[:3], 1, bq, bk)
        bb, hb = states.shape[:2]

        def mmspec_mask(b, h, q_idx, kv_idx):
            bi = b if bb > 1 else 0
            hi = h if hb > 1 else 0
            qb, kb = q_idx // bq, kv_idx // bk
            state = states[bi, hi, qb, kb]
            partial = elements[bi, hi, qb, state.clamp(min=0), q_idx % bq, kv_idx % bk]
            return (state == -1) | ((state >= 0) & partial)

        return BlockMask.from_kv_blocks(
            self.kv_num_blocks,
            pad(self.kv_indices),
            self.full_kv_num_blocks,
            pad(self.full_kv_indices),
            BLOCK_SIZE=self.block_size,
            mask_mod=mmspec_mask,
            seq_lengths=(self.q_len, self.kv_len),
        )

    def to(self, device) -> "BlockSparseMask":
        """The mask on `device` (a mask has no dtype to change: its indices stay int32 and its
        element masks bool)."""
        if isinstance(device, torch.dtype) or not isinstance(device, (str, int, torch.device)):
            raise TypeError(f"BlockSparseMask.to takes a device (e.g. 'cuda' or q.device), got "
                            f"{device!r}")
        device = torch.device(device)  # a bad name fails here, not in the first tensor's .to
        # already checked: no re-validation (device syncs on a GPU; `.item()` fails on "meta")
        return BlockSparseMask._unchecked(
            self.kv_num_blocks.to(device),
            self.kv_indices.to(device),
            self.full_kv_num_blocks.to(device),
            self.full_kv_indices.to(device),
            self.partial_masks.to(device),
            self.block_size,
            self.q_len,
            self.kv_len,
        )

    def __repr__(self) -> str:
        b, h, q, k = self.shape
        return (
            f"BlockSparseMask(shape=({b}, {h}, {q}, {k}), block_size={self.block_size}, "
            f"density={self.density():.3f})"
        )

    def to_string(self, batch: int = 0, head: int = 0) -> str:
        """ASCII picture of one (batch, head): '█' full, '░' partial, ' ' skipped."""
        chars = {0: " ", 1: "░", 2: "█"}
        rows = self.block_layout()[batch, head].tolist()
        return "\n".join("".join(chars[c] for c in row) for row in rows)
