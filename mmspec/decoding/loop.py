"""The round loop of `generate`: the prefill, then rounds of draft, verify, accept and commit
until every row is done.

A round reads the device once (`host = ...tolist()` in `Loop._accept`): every host decision
after the draft (the accepted lengths, EOS, stats, streamed tokens) comes from that read, and
every one before it from the previous round's. What the drafter and the target's forward do
inside is theirs (`tests/decoding/test_syncs.py` counts both). The target runs through a
`verifier.Verifier`, whichever one the call chose; the rows and slots are `rows.py`'s.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Callable

import torch

from mmspec._cache_name import cache_kwargs, output_cache

from . import kv_cache
from . import recurrent as rec
from .clock import Clock, fill_times
from .draft import Draft, Drafter, DraftState, VerifyResult
from .hidden import check_hidden, gather_hidden
from .positions import prefill_position_ids
from .processors import NodeProcessors
from .rows import Rows, Slots, columns
from .sampling import SamplingConfig
from .settings import vocab_size
from .static import compile_seconds
from .stats import SpecStats
from .tree import build_tree, main_path, raise_draft_errors
from .verify import verify_greedy, verify_sampling


@dataclass
class SpecOutput:
    """sequences: long `[B, L + n]`, the (left-padded) prompt then the new tokens, padded after
    EOS; stats: what the call did (`stats.py`)."""

    sequences: torch.Tensor
    stats: SpecStats


@dataclass(frozen=True)
class LoopOptions:
    """What a call asks of the loop besides the target, the drafter and the prompt (`generate`
    and `speculative` resolve them).

    rule:       the target's logits processors, applied at every tree node (`processors.py`).
    eos:        long `[E]`, the ids that end a row.
    pad:        the id written after a row's end.
    stop:       transformers' stopping criteria (`speculative`), or None.
    asked_eos:  the call's own EOS ids for the drafter (`DraftState.eos_token_id`), or None.
    sampling:   the call's sampling for the drafter (`DraftState.sampling`), None when greedy.
    streamer:   a transformers streamer (`put`, `end`), batch 1.
    generator:  the `torch.Generator` of the sampling draws.
    on_round:   `on_round(draft, result, stats)` after every round.
    profile:    CUDA events instead of wall time (`clock.py`).
    put_prompt: the streamer gets the prompt first (transformers gave it already in
                `speculative`).
    """

    rule: NodeProcessors
    eos: torch.Tensor
    pad: int = 0
    stop: object | None = None
    asked_eos: tuple | None = None
    sampling: SamplingConfig | None = None
    streamer: object | None = None
    generator: torch.Generator | None = None
    on_round: Callable | None = None
    profile: bool = False
    put_prompt: bool = True


def decode(target, drafter: Drafter, verifier, prompt: dict, max_new_tokens: int,
           options: LoopOptions) -> SpecOutput:
    """The loop. `prompt`: `input_ids` `[B, L]`, `attention_mask` long `[B, L]` and the model
    kwargs of the prefill (`pixel_values`, ...) under `model_kwargs`."""
    loop = Loop(target, drafter, verifier, options, max_new_tokens, prompt["model_kwargs"])
    loop.prefill(prompt["input_ids"], prompt["attention_mask"])
    while any(loop.rows.live):
        loop.round()
    return loop.finish()


def _pick(scores: torch.Tensor, do_sample: bool, generator) -> torch.Tensor:
    """scores `[B, V]` (processed) -> long `[B]`, greedy or sampled."""
    if not do_sample:
        return scores.argmax(-1)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


def prefill(target, input_ids, attention_mask, model_kwargs, layers, cache, width=None):
    """The prompt forward, as `target.generate` runs it (no mask without padding, last logits
    only), into `cache` (`Verifier.prefill_cache`; None: the model's own). -> the last logits
    `[B, V]`, the cache it returned, the prompt's positions and the drafter's features (or
    None). `layers`, `width`: the drafter's `target_hidden_layers` (empty: it reads none) and
    `target_hidden_size`, checked on this forward (`hidden.check_hidden`)."""
    position_ids = prefill_position_ids(target, input_ids, attention_mask, model_kwargs)
    if "logits_to_keep" in inspect.signature(target.forward).parameters:
        model_kwargs = {"logits_to_keep": 1, **model_kwargs}
    mask = None if bool(attention_mask.all()) else attention_mask
    inputs = target.prepare_inputs_for_generation(
        input_ids, attention_mask=mask, position_ids=position_ids,
        use_cache=True, is_first_iteration=True, **model_kwargs,
        **cache_kwargs(target.prepare_inputs_for_generation, cache))
    out = target(**inputs, output_hidden_states=bool(layers), return_dict=True)
    hidden = None
    if layers:
        check_hidden(target, out.hidden_states, layers, width, *input_ids.shape)
        hidden = gather_hidden(out.hidden_states, layers)
    return out.logits[:, -1], output_cache(out), position_ids, hidden


class Loop:
    """One call's state between rounds: its rows and slots, the drafter's features, the stats
    and the clock. `prefill` and `round` move it on; each round is draft (`_draft`), verify
    (`_verify`), accept (`_accept`: the round's one device read), commit (`_commit`), then the
    drafter's update, streaming and the stats (`_report`)."""

    def __init__(self, target, drafter: Drafter, verifier, options: LoopOptions,
                 max_new_tokens: int, model_kwargs: dict):
        self.target, self.drafter, self.verifier, self.opts = target, drafter, verifier, options
        self.max_new_tokens, self.model_kwargs = max_new_tokens, model_kwargs
        self.start, self.compiled_before = time.perf_counter(), compile_seconds()
        self.stats = SpecStats()
        self.layers = tuple(drafter.target_hidden_layers) if drafter.needs_target_hidden else ()
        self.hidden_size = drafter.target_hidden_size
        self.vocab = vocab_size(target)

    def prefill(self, input_ids, attention_mask) -> None:
        """The prompt forward and each row's first token (from its logits, no draft)."""
        opts, b = self.opts, input_ids.shape[0]
        self.clock = clock = Clock(input_ids.device, opts.profile)
        p0 = clock.now()
        logits, cache, prompt_pos, self.hidden = prefill(
            self.target, input_ids, attention_mask, self.model_kwargs, self.layers,
            self.verifier.prefill_cache(), self.hidden_size)
        self.recurrent = self.verifier.adopt(cache)
        self.state_layers = rec.recurrent_layers(self.verifier.cache) if self.recurrent else []
        # where trees or holes do not verify exactly: each draft's main path, and the rows of
        # a batch commit alike (no holes)
        probe = self.verifier.probe
        self.path_only = self.recurrent or (probe is not None and probe.tree_mode is None)
        self.even = b > 1 and (self.recurrent or (probe is not None and not probe.holes))
        first = _pick(opts.rule.first(input_ids, logits), opts.rule.do_sample, opts.generator)
        self.rows = rows = Rows(input_ids, self.max_new_tokens, opts.eos, opts.pad)
        num, hit = rows.cut(first[:, None], torch.ones_like(first))
        rows.write(first[:, None], num)
        host = torch.cat([num, hit.long(), first]).tolist()
        num_h, hit_h = rows.stop_at_criteria(opts.stop, host[:b],
                                             [bool(h) for h in host[b: 2 * b]])
        rows.advance(num_h, hit_h)
        self.stats.new_tokens += b
        if opts.streamer is not None and opts.put_prompt:
            opts.streamer.put(input_ids.cpu())
        self._stream(host[2 * b:])
        self.slots = Slots(input_ids, attention_mask, first, prompt_pos)
        clock.add("prefill", p0, clock.now())

    def round(self) -> None:
        clock, rows = self.clock, self.rows
        t0 = clock.now()
        remaining = [self.max_new_tokens - c - 1 if live else -1
                     for c, live in zip(rows.count, rows.live)]
        draft = self._draft(max(remaining))
        tree, verified, node_map, out = self._verify(draft, remaining)
        accept = self._accept(tree, verified, out, remaining)
        result = self._commit(tree, node_map, out, accept)
        te = clock.now()
        if max(remaining) > 0:  # update answers a propose; a budget-capped last round had none
            self.drafter.update(result)
        tf = clock.now()
        clock.add("draft", te, tf)
        clock.add("round", t0, tf)
        self._report(draft, result, accept)

    def _draft(self, depth_cap: int) -> Draft:
        """The drafter's proposal (an empty one when no row can take a draft token)."""
        slots, opts, clock = self.slots, self.opts, self.clock
        state = DraftState(slots.ids, slots.valid.long(), depth_cap, slots.root_pos,
                           self.stats.rounds, self.hidden, self.model_kwargs, opts.generator,
                           opts.asked_eos, opts.sampling, self.verifier.compile_config)
        ta = clock.now()
        draft = (self.drafter.propose(state) if depth_cap > 0
                 else Draft.empty(len(slots.ids), slots.ids.device))
        clock.add("draft", ta, clock.now())
        return draft

    def _verify(self, draft: Draft, remaining: list[int]):
        """The tree of the draft (its main path where only that is exact), the target's forward
        over it. -> (tree, the verified draft, its node map to the draft or None, the output)."""
        slots, clock = self.slots, self.clock
        pruned = main_path(draft) if self.path_only else None
        verified, node_map = (draft, None) if pruned is None else pruned
        tree = build_tree(slots.ids[:, -1], verified, self.vocab, defer_checks=True)
        # finished rows (remaining -1) and nodes deeper than a row's budget are never committed:
        # drop them, so no position runs past prompt + max_new_tokens (GPT-2's table ends there)
        # or grows in a finished row; decided on the host, sent only when a node is dropped
        kept = [[d <= max(left, 0) for d in depths]
                for depths, left in zip(tree.host_depth, remaining)]
        if not all(map(all, kept)):
            tree.valid = tree.valid & torch.tensor(kept, device=slots.ids.device)
        prepared = self.verifier.prepare(tree, slots)
        self.saved = rec.snapshot(self.state_layers) if self.recurrent else None
        tc = clock.now()
        out = self.verifier.forward(tree, slots, prepared, bool(self.layers))
        clock.add("forward", tc, clock.now())
        return tree, verified, node_map, out

    def _accept(self, tree, verified, out, remaining: list[int]) -> dict:
        """Each row's accepted path and bonus token, cut at EOS, the budget and the stopping
        criteria, written to the rows; the round's one device-to-host read."""
        rows, opts, b = self.rows, self.opts, len(self.slots.ids)
        lengths = [[rows.prompt_len + rows.count[r] + d if d <= remaining[r] else -1
                    for d in tree.host_depth[r]] for r in range(b)]
        scores = opts.rule.tree(out.logits, tree.tokens, tree.anc, tree.depth, rows.seq, lengths)
        if opts.rule.do_sample:
            best, bonus = verify_sampling(tree, scores.softmax(-1), opts.generator)
        else:
            best, bonus = verify_greedy(tree, scores)
        # the root and the accepted nodes, then the bonus token right after each row's path
        depth, keep, keep_valid = accepted_path(tree, best)
        path_tokens = tree.tokens.gather(1, keep)[:, 1:]  # [B, K-1]
        if self.even:
            depth, bonus = even_commit(depth, bonus, path_tokens, rows.live_t)
            keep_valid = columns(keep.shape[1], depth.device) <= depth[:, None]
        new = torch.cat([path_tokens, bonus[:, None]], dim=1)  # [B, K]
        new.scatter_(1, depth[:, None], bonus[:, None])
        num, hit = rows.cut(new, depth + 1)  # cut at EOS and max_new_tokens
        rows.write(new, num)
        drafted = (tree.valid[:, 1:] & rows.live_t[:, None]).sum(-1)
        # the round's one device-to-host read
        host = torch.cat([depth, num, hit, drafted, new.flatten(), tree.checks]).tolist()
        raise_draft_errors(host[len(host) - len(tree.checks):], verified, self.vocab)
        width = new.shape[1]
        num_h, hit_h = rows.stop_at_criteria(opts.stop, host[b: 2 * b],
                                             [bool(h) for h in host[2 * b: 3 * b]])
        accepted = Accepted(depth, bonus, keep, keep_valid, path_tokens, new, host[:b], num_h,
                            host[3 * b: 4 * b], list(rows.live), rows.live_t,
                            [host[4 * b + r * width: 4 * b + (r + 1) * width] for r in range(b)])
        rows.advance(num_h, hit_h)
        return accepted

    def _commit(self, tree, node_map, out, acc: Accepted) -> VerifyResult:
        """Keep the root and the accepted nodes in the target's cache at slots `[C, C + K)`
        (holes where a row accepted fewer; `rows.py`), append them to the slots, stream row 0's
        new tokens. -> the drafter's `VerifyResult`."""
        slots, b = self.slots, len(acc.new)
        k = max(d for d, alive in zip(acc.depth_h, acc.live_h) if alive) + 1
        keep, keep_valid = acc.keep[:, :k], acc.keep_valid[:, :k]
        if self.layers:  # before a replay: a compiled call's outputs live until the next call
            h = gather_hidden(out.hidden_states, self.layers)  # [B, N, H']
            self.hidden = h.gather(1, keep[..., None].expand(-1, -1, h.shape[-1]))  # [B, K, H']
        if self.recurrent:  # a chain, rows alike: replay the committed tokens after a rejection
            self._roll_back(tree, k)
        else:
            kv_cache.commit_path(self.verifier.cache, slots.ids.shape[1] - 1, keep,
                                 in_place=tree.is_chain)
        slots.append(acc.path_tokens[:, : k - 1], keep_valid[:, 1:], acc.bonus, acc.depth,
                     acc.live, all(acc.live_h))
        if acc.num_h[0] > 0:
            self._stream(acc.new_h[0][: acc.num_h[0]])
        nodes = keep[:, 1:] - 1  # [B, K-1] draft node indices of the accepted path
        return VerifyResult(
            num_accepted=torch.where(acc.live, acc.depth, 0),
            new_tokens=[acc.new[r, : acc.num_h[r]] for r in range(b)],
            accepted_nodes=[_draft_nodes(nodes[r, : acc.depth_h[r] if acc.live_h[r] else 0],
                                         node_map, r) for r in range(b)],
            target_hidden=self.hidden if self.layers else None,
        )

    def _stream(self, tokens: list[int]) -> None:
        """Hand the streamer (batch 1) its row's newly committed tokens, from the host."""
        if self.opts.streamer is not None:
            self.opts.streamer.put(torch.tensor(tokens))

    def _roll_back(self, tree, k: int) -> None:
        """Recurrent state (`recurrent.py`): keep the verification's state where all `k` fed
        tokens were committed, else restore the snapshot and feed the `k` committed ones again
        (`Verifier.replay`)."""
        cache, start = self.verifier.cache, self.slots.ids.shape[1] - 1
        if k == tree.tokens.shape[1]:
            rec.crop_attention(cache, start + k)
            return
        rec.crop_attention(cache, start)
        rec.restore(self.state_layers, self.saved)
        t0 = self.clock.now()
        self.verifier.replay(tree, k, self.slots)
        t1 = self.clock.now()
        self.clock.add("forward", t0, t1)  # a target forward too
        self.clock.add("replay", t0, t1)
        self.stats.replays += 1

    def _report(self, draft: Draft, result: VerifyResult, acc: Accepted) -> None:
        """The round's stats and running times, then the caller's `on_round`."""
        stats, live_h = self.stats, acc.live_h
        stats.rounds += 1
        stats.row_rounds += sum(live_h)
        stats.drafted += sum(acc.drafted_h)
        stats.accepted += sum(min(d, n) if alive else 0
                              for d, n, alive in zip(acc.depth_h, acc.num_h, live_h))
        committed = sum(n for n, alive in zip(acc.num_h, live_h) if alive)
        stats.committed += committed
        stats.new_tokens += committed
        if not self.clock.events:  # wall time: the running totals cost nothing
            fill_times(stats, self.clock)
        if self.opts.on_round is not None:
            self.opts.on_round(draft, result, stats)

    def finish(self) -> SpecOutput:
        if self.opts.streamer is not None:
            self.opts.streamer.end()
        sequences = self.rows.sequences
        self.stats.total_time = self.clock.finish() - self.start
        self.stats.compile_time = compile_seconds() - self.compiled_before
        fill_times(self.stats, self.clock)
        return SpecOutput(sequences, self.stats)


@dataclass
class Accepted:
    """A round's verdict before the commit. Device: depth, bonus `[B]` (draft tokens accepted,
    the target's token after them), keep, keep_valid `[B, K]` (tree nodes of the root and the
    path, node order; valid where accepted), path_tokens `[B, K-1]`, new `[B, K]` (path then
    bonus), live bool `[B]` (rows live before the round). Host, from the round's one read:
    depth_h, num_h (tokens committed, after EOS, budget and stopping criteria), drafted_h,
    live_h, new_h (each row's `new`)."""

    depth: torch.Tensor
    bonus: torch.Tensor
    keep: torch.Tensor
    keep_valid: torch.Tensor
    path_tokens: torch.Tensor
    new: torch.Tensor
    depth_h: list
    num_h: list
    drafted_h: list
    live_h: list
    live: torch.Tensor
    new_h: list


def accepted_path(tree, best):
    """-> depth `[B]` (draft tokens accepted), keep long `[B, K]` (root then path, node order;
    rows with a shorter path repeat trailing nodes), keep_valid bool `[B, K]`. K is the tree's
    depth + 1 (from the host shape): the engine trims it to the deepest accepted path after the
    round's read."""
    b, n = tree.depth.shape
    depth = tree.depth.gather(1, best[:, None])[:, 0]
    k = tree.max_depth + 1
    on_path = tree.anc.gather(1, best[:, None, None].expand(b, 1, n))[:, 0]  # [B, N]
    keep = torch.argsort((~on_path).to(torch.int8), dim=1, stable=True)[:, :k]
    keep_valid = columns(k, best.device) <= depth[:, None]
    return depth, keep, keep_valid


def even_commit(depth, bonus, path_tokens, live):
    """Every live row commits as many tokens as the live row that accepted fewest: a row that
    accepted more keeps that many drafts, and its next accepted draft becomes its bonus token
    (the target's own pick there, greedy or sampled: a speculative round's tokens are the
    target's at every position it emits, so a shorter prefix of them is too). No row gets a
    hole, for targets that verify exactly only without them. `[B]` depth and bonus."""
    n = path_tokens.shape[1]
    if n == 0:
        return depth, bonus
    least = torch.where(live, depth, n).min()
    cut = live & (depth > least)
    at = least.clamp(max=n - 1).expand(len(depth))[:, None]
    return torch.where(cut, least, depth), torch.where(cut, path_tokens.gather(1, at)[:, 0], bonus)


def _draft_nodes(nodes, node_map, row):
    """Accepted node indices of the verified draft, as indices of the drafter's own draft."""
    return nodes if node_map is None else node_map[row, nodes]
