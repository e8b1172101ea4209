"""Transformers' logits processors and stopping criteria, applied to a speculative round.

`target.generate` calls its `LogitsProcessorList` once a step on `input_ids` `[B, L]` (every row
as long as the others) and the next-token logits, and its `StoppingCriteriaList` after each new
token. A round verifies a tree of nodes per row, and rows hold different numbers of tokens, so
`NodeProcessors` calls the list once per *prefix length*: node i of row b is processed with
`input_ids` = the row's prompt (its padding included, as transformers has it), its committed tokens
and the tokens of node i's own path, which is exactly the sequence `target.generate` would hold
when it predicted that node's next token. Position-wise processors (repetition penalty,
no-repeat n-gram, bad words, sequence bias, min length / min new tokens, forced BOS/EOS, suppress
at begin, exponential decay) are then exact per node. Processors that read the scores alone (the
sampling warpers, suppress tokens, logit normalisation) take every node in one call.

A processor the list holds must be a function of each row's sequence and scores: one that reads the
batch index or carries state from call to call is refused (`refuse_processors`).

`StopRule`: transformers' max-length and EOS criteria are the engine's budget and EOS ids, applied
on the device; any other criterion (stop strings, max time, a caller's own) is called after each
committed token, grouped by sequence length as above, and costs one more host read in a round
that commits tokens.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc

# processors whose output depends on the scores only: one call for every node of a round
_SCORES_ONLY = (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper,
                lp.MinPLogitsWarper, lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper,
                lp.EtaLogitsWarper, lp.TopHLogitsWarper, lp.InfNanRemoveLogitsProcessor,
                lp.LogitNormalization, lp.SuppressTokensLogitsProcessor)

# processors that cannot be exact under speculation, with the reason (by class: a caller's list
# may hold them too)
_REFUSED = {
    lp.UnbatchedClassifierFreeGuidanceLogitsProcessor:
        "guidance_scale: classifier-free guidance runs an unconditional forward with its own "
        "cache, one token a call, which a round verifying several positions cannot advance",
    lp.ClassifierFreeGuidanceLogitsProcessor:
        "guidance_scale: classifier-free guidance needs the unconditional half of a doubled "
        "batch, which the verification forward does not run",
    lp.WatermarkLogitsProcessor:
        "watermarking_config: the watermark is seeded per row from the batch's sequences one "
        "step at a time; not verified exact under speculation",
    lp.SynthIDTextWatermarkLogitsProcessor:
        "watermarking_config: SynthID keeps a state advanced once a step, which a round "
        "verifying several positions cannot reproduce",
    lp.PrefixConstrainedLogitsProcessor:
        "prefix_allowed_tokens_fn: it is called with a row's batch index, which the per-node "
        "calls of a verified tree do not keep",
    lp.EncoderNoRepeatNGramLogitsProcessor:
        "encoder_no_repeat_ngram_size: it indexes its n-grams by batch row, which the per-node "
        "calls of a verified tree do not keep",
}


def refuse_processors(processors, batch: int) -> None:
    """ValueError naming the first processor that cannot be exact under speculation."""
    for proc in processors:
        why = _REFUSED.get(type(proc))
        if why is None and isinstance(proc, lp.EncoderRepetitionPenaltyLogitsProcessor) and batch > 1:
            why = ("encoder_repetition_penalty: with several rows it maps scores to prompts by "
                   "batch index, which the per-node calls of a verified tree do not keep; pass one "
                   "prompt per call")
        if why is not None:
            raise ValueError(f"{why}; it is not applied under speculative decoding (use "
                             f"target.generate without custom_generate)")


def _for_rows(proc, rows: torch.Tensor):
    """`proc` for a call on the batch rows `rows` (long `[M]`): a copy whose per-row state is
    those rows' (transformers' repetition penalty skips each row's left padding, 5.24)."""
    ignore = getattr(proc, "prompt_ignore_length", None)
    if isinstance(proc, lp.RepetitionPenaltyLogitsProcessor) and isinstance(ignore, torch.Tensor):
        proc = copy.copy(proc)
        proc.prompt_ignore_length = ignore.to(rows.device).index_select(0, rows)
    return proc


def _runs(processors):
    """Consecutive processors grouped into (scores_only, [processors]) runs, in list order."""
    runs = []
    for proc in processors:
        only = isinstance(proc, _SCORES_ONLY)
        if runs and runs[-1][0] == only:
            runs[-1][1].append(proc)
        else:
            runs.append((only, [proc]))
    return runs


def _group(lengths: list[int]) -> dict[int, list[int]]:
    groups = defaultdict(list)
    for index, length in enumerate(lengths):
        if length >= 0:
            groups[length].append(index)
    return groups


class NodeProcessors:
    """A `LogitsProcessorList` applied to the target's logits at the first token and at every
    node of a verified tree. `do_sample`: the scores are then sampled (softmax), else argmax'd."""

    def __init__(self, processors, do_sample: bool):
        self.processors = list(processors)
        self.do_sample = do_sample
        self.runs = _runs(self.processors)

    def _apply(self, ids_of, lengths: list[int], rows: int, scores: torch.Tensor) -> torch.Tensor:
        """scores float32 `[M, V]`, `M = B * n`, entry m of batch row `m // n` (n = M / `rows`);
        `lengths[m]`: its prefix length (-1: skip it); `ids_of(index, length)`: long
        `[len(index), length]` the prefixes of those entries."""
        groups = None
        for scores_only, procs in self.runs:
            if scores_only:
                for proc in procs:
                    scores = proc(None, scores)
                continue
            groups = groups if groups is not None else _group(lengths)
            out = scores.clone()
            for length, members in groups.items():
                index = torch.tensor(members, device=scores.device)
                ids, part = ids_of(index, length), scores.index_select(0, index)
                batch_rows = index // (len(lengths) // rows)
                for proc in procs:
                    part = _for_rows(proc, batch_rows)(ids, part)
                out.index_copy_(0, index, part.to(out.dtype))
            scores = out
        return scores

    def first(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The prompt's next-token logits `[B, V]` -> float32 scores `[B, V]`."""
        scores = logits.float()
        if not self.processors:
            return scores
        return self._apply(lambda index, length: input_ids.index_select(0, index)[:, :length],
                           [input_ids.shape[1]] * len(input_ids), len(input_ids), scores)

    def tree(self, logits, tokens, anc, depth, seq, lengths) -> torch.Tensor:
        """Logits `[B, N, V]` at every node -> float32 scores `[B, N, V]`.

        tokens, depth: long `[B, N]` (node 0: the root, the last committed token); anc: bool
        `[B, N, N]`; seq: long `[B, W]` each row's prompt then committed tokens (what is past a
        row's length is overwritten here); lengths: host list of `[N]` int lists, the prefix
        length of each node (-1: a node whose scores are never used).
        """
        b, n, v = logits.shape
        scores = logits.float().reshape(b * n, v)
        if not self.processors:
            return scores.view(b, n, v)
        flat_lengths = [length for row in lengths for length in row]
        if all(scores_only for scores_only, _ in self.runs):  # no processor reads a prefix
            return self._apply(None, flat_lengths, b, scores).view(b, n, v)
        w = seq.shape[1]
        root_len = torch.tensor([row[0] for row in lengths], device=seq.device)  # [B]
        # node i's prefix: the row's committed sequence, then its path's tokens at root_len + d - 1
        ext = torch.cat([seq, seq.new_zeros(b, 1)], 1)[:, None].expand(b, n, w + 1).clone()
        cols = root_len[:, None, None] + depth[:, None, :] - 1  # [B, 1, N] column of node j
        on_path = anc & (depth > 0)[:, None, :]  # [B, N, N] ancestors of i below the root
        cols = torch.where(on_path, cols.clamp(0, w - 1), w)  # column w: a scratch column
        ext.scatter_(2, cols, tokens[:, None, :].expand(b, n, n))
        flat = ext.view(b * n, w + 1)
        out = self._apply(lambda index, length: flat.index_select(0, index)[:, :length],
                          flat_lengths, b, scores)
        return out.view(b, n, v)


class StopRule:
    """Transformers' stopping criteria split into what the engine applies on the device (the
    budget from `MaxLengthCriteria`, the ids of `EosTokenCriteria`) and the rest (`extra`),
    called after each committed token."""

    def __init__(self, criteria):
        self.max_length = None
        self.eos = None
        self.extra = []
        for criterion in criteria:
            if type(criterion) is sc.MaxLengthCriteria:
                limit = criterion.max_length
                self.max_length = limit if self.max_length is None else min(self.max_length, limit)
            elif type(criterion) is sc.EosTokenCriteria:
                ids = criterion.eos_token_id.flatten()
                self.eos = ids if self.eos is None else torch.cat([self.eos, ids.to(self.eos)])
            else:
                self.extra.append(criterion)

    def first_stop(self, seq: torch.Tensor, start: list[int], num: list[int]) -> list[int | None]:
        """Row b committed `num[b]` tokens at columns `[start[b], start[b] + num[b])` of seq
        `[B, W]`: -> per row, how many of them stand when an extra criterion stops the row after
        one of them (the first that fires), None where none fires. One host read."""
        items = [(b, j) for b in range(len(num)) for j in range(num[b])]
        if not self.extra or not items:
            return [None] * len(num)
        lengths = [start[b] + j + 1 for b, j in items]
        fired = torch.zeros(len(items), dtype=torch.bool, device=seq.device)
        for length, members in _group(lengths).items():
            index = torch.tensor(members, device=seq.device)
            rows = torch.tensor([items[m][0] for m in members], device=seq.device)
            ids = seq.index_select(0, rows)[:, :length]
            hit = torch.zeros(len(members), dtype=torch.bool, device=seq.device)
            for criterion in self.extra:
                hit |= criterion(ids, None).to(hit.device)
            fired.index_copy_(0, index, hit)
        stop = [None] * len(num)
        for (b, j), hit in zip(items, fired.tolist()):
            if hit and stop[b] is None:
                stop[b] = j + 1
        return stop
