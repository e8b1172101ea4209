"""Text: every speculative method on the zoo's trained text pair, side by side in one run (issues 5, 7).

Prompts: N held-out stdlib files (`mmspec.zoo.corpus`, never trained on), evenly spaced over the
files long enough, each cut to a `--prompt-tokens` window from the middle of the file; greedy,
`--new-tokens` new tokens each. All methods run on the same prompts in the same process,
interleaved per prompt so that background load hits them alike:

    target-only greedy          target.generate(do_sample=False)                 the reference
    HF assisted generation      target.generate(assistant_model=text-drafter)    HF's defaults
    HF assisted, 5 tokens       the same, the assistant set as the zoo preset's AR drafter
    HF prompt lookup            target.generate(prompt_lookup_num_tokens=10)
    ModelDrafter chain / tree   mmspec.generate, text-drafter: 5-chain; 16-node top-4 tree
    PromptLookupDrafter         mmspec.generate, n-gram copy (10 tokens, 2-gram, as HF)
    DLM naive                   NaiveDiffusionDrafter(text-dlm): argmax path, fixed k
    DLM CPS                     DiffusionDrafter(text-dlm): CPS (paper defaults), fixed k
    DLM CPS+ADL                 DiffusionDrafter(text-dlm): CPS + ADL (paper defaults, k in [20, 30])
    DLM CPS+ADL, prefix cache   the same, prefix_cache=True (beyond the paper: prefix KV reused)
    EAGLE-3 chain / tree        mmspec.generate, the zoo's `text-eagle3` (or `--eagle3 PATH`,
                                trained with `mmspec.vision.train --arch eagle3`): 5-chain;
                                16-node tree
    DFlash chain                DFlashDrafter, the zoo's `text-dflash` (or `--dflash PATH`): one
                                block, its argmax chain (what z-lab's dflash_generate drafts)
    DFlash + path search        the same block, DiffuSpec's CPS beams + the chain as one tree

tau is tokens per target verification forward, counted the same way for every method: a forward
pre-hook counts the target's calls, and tau = (new tokens - 1) / (calls - 1) (the prefill's call
and its token excluded, as in `SpecStats`); without the bonus token (DiffuSpec's MAT) it is tau - 1.
For mmspec methods the count is checked against `SpecStats.rounds`. Speedup = target-only wall
time / the method's wall time, summed over the prompts (each the best of `--repeats`). Every mmspec
output is asserted token-identical to target-only greedy; HF's outputs are compared and reported.

    python benchmarks/text.py [--prompts 8] [--prompt-tokens 256] [--new-tokens 96] [--threads 1]
                              [--repeats 1] [--fixed-k 20] [--eagle3 PATH] [--dflash PATH]
                              [--plot] [--write]

The EAGLE-3 rows draft with the zoo's `text-eagle3`, or with the drafter `--eagle3 PATH` names.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import check_plot_deps, markdown_table, write_section
from mmspec import zoo
from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.decoding import generate, kv_cache
from mmspec.decoding.drafters import ModelDrafter, PromptLookupDrafter
from mmspec.diffusion import (
    CPSConfig,
    DiffusionDrafter,
    DiffusionDrafterConfig,
    NaiveDiffusionDrafter,
    NgramProxy,
    build_lattice,
)
from mmspec.diffusion.adl import ADLConfig
from mmspec.diffusion.cps import search
from mmspec.kernels.tune import timed
from mmspec.zoo.corpus import source_files, stdlib_root
from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.registry import ZOO_DLM_K

PLOTS = Path(__file__).resolve().parent / "plots"
TAU_RATIO_BAR = 1.15  # issue 7: CPS+ADL tau >= 1.15x naive (paper ablation: MAT 6.99 vs 6.05)
SPEEDUP_BAR = 1.5  # issue 7: >= 1.5x over target-only, and ahead of HF assisted generation
REF, HF_ASSIST, HF_PLD = "target-only greedy", "HF assisted generation", "HF prompt lookup"
# HF's assistant set as the zoo preset drafts with text-drafter (`mmspec generate --target text
# --drafter model`: 5 greedy tokens a round): a fixed length, no confidence stop
HF_TUNED_SETTINGS = {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant",
                     "assistant_confidence_threshold": 0.0}
HF_TUNED = "HF assisted generation, 5 tokens"
NAIVE, CPS, CPS_ADL = "DLM naive (argmax, fixed k)", "DLM CPS (fixed k)", "DLM CPS+ADL"
CACHED = "DLM CPS+ADL, prefix KV cache"
SHORT_K = ZOO_DLM_K  # the zoo preset's CPU-sized ADL range: verifying k tokens is compute-bound
SHORT = f"DLM CPS+ADL, prefix KV cache, k in [{SHORT_K[0]}, {SHORT_K[1]}]"
DLM_METHODS = (NAIVE, CPS, CPS_ADL, CACHED, SHORT)
# the EAGLE-3 rows draft the ModelDrafter rows' shapes: a 5-token chain; 16 nodes, top-4, 4 deep
EAGLE3_CHAIN = {"depth": 5, "top_k": 1, "total_tokens": 6}
EAGLE3_TREE = {"depth": 4, "top_k": 4, "total_tokens": 17}
DFLASH_CHAIN, DFLASH_TREE = "DFlash chain", "DFlash + path search"
DFLASH_SEARCH = CPSConfig(beam_width=3)  # DiffuSpec's defaults (paper §4.1), beams of 3
DFLASH_TREE_BAR = 1.15  # issue 46: the path-search tree's tau >= 1.15x the chain's


# ------------------------------------------------------------------------------------- prompts

@dataclass
class Prompt:
    file: str  # relative to the stdlib root
    ids: torch.Tensor  # long [1, P]


def heldout_prompts(tokenizer, n: int, prompt_tokens: int, new_tokens: int) -> list[Prompt]:
    """n windows of `prompt_tokens` tokens from the middle of held-out files, evenly spaced over
    the files that have at least `prompt_tokens + new_tokens` tokens."""
    root = stdlib_root()
    long_enough = []
    for path in source_files("heldout"):
        try:
            ids = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids
        except UnicodeDecodeError:  # a few test fixtures, as in `corpus.read_texts`
            continue
        if ids.shape[1] >= prompt_tokens + new_tokens:
            long_enough.append((path.relative_to(root).as_posix(), ids))
    if len(long_enough) < n:
        raise ValueError(f"--prompts {n}: only {len(long_enough)} held-out files have "
                         f">= {prompt_tokens + new_tokens} tokens")
    picked = [long_enough[i * len(long_enough) // n] for i in range(n)]
    prompts = []
    for name, ids in picked:
        start = (ids.shape[1] - prompt_tokens) // 2
        prompts.append(Prompt(name, ids[:, start:start + prompt_tokens]))
    return prompts


# ------------------------------------------------------------------------------------- methods

class RoundLog:
    """Wraps a drafter (batch 1) to record each round's accepted draft tokens and, for diffusion
    drafters, the block length k and ADL's L_gen (raw argmax draft length before its first EOS)."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.accepted: list[int] = []
        self.ks: list[int] = []
        self.generated: list[int] = []

    def __getattr__(self, name):  # vocab_size, needs_target_hidden, ... of the wrapped drafter
        return getattr(self.drafter, name)

    def propose(self, state):
        draft = self.drafter.propose(state)
        lengths = getattr(self.drafter, "lengths", None)  # DiffusionDrafter: k of this round
        if lengths is not None:
            self.ks.append(lengths[0].k)
            self.generated.append(self.drafter.generated[0])
        return draft

    def update(self, result):
        self.accepted.append(int(result.num_accepted[0]))
        self.drafter.update(result)


@dataclass
class Run:
    sequences: torch.Tensor
    seconds: float
    calls: int  # target forwards, the prefill included
    stats: object = None  # SpecStats for mmspec methods
    accepted: list = field(default_factory=list)  # per round (mmspec)
    ks: list = field(default_factory=list)  # per round (DLM drafters)
    generated: list = field(default_factory=list)  # per round (DLM drafters): ADL's L_gen


@dataclass
class Method:
    name: str
    kind: str  # "reference", "hf" or "mmspec"
    run: Callable  # (prompt ids, max_new_tokens) -> (sequences, SpecStats or None, RoundLog or None)
    settings: str


class CallCounter:
    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.calls += 1


def assistant_settings(assistant) -> str:
    """The assistant settings HF's assisted generation runs with: the assistant's own
    generation config, its unset fields filled with transformers' defaults, as
    `AssistedCandidateGenerator` does (the target's `GenerationConfig()` leaves them None)."""
    config = copy.deepcopy(assistant.generation_config)
    config.update(**config._get_default_generation_params(), defaults_only=True)
    return (f"num_assistant_tokens={config.num_assistant_tokens}, schedule "
            f"{config.num_assistant_tokens_schedule!r}, assistant_confidence_threshold="
            f"{config.assistant_confidence_threshold}")


def engine_run(target, make_drafter, eos: int) -> Callable:
    """A Method's `run` for `mmspec.generate` greedy with a fresh `make_drafter()` per call,
    its rounds logged (`RoundLog`)."""
    def run(ids, n):
        log = RoundLog(make_drafter())
        out = generate(target, log, ids, max_new_tokens=n, do_sample=False, eos_token_id=eos)
        return out.sequences, out.stats, log
    return run


def build_methods(target, drafter_model, tree_drafter_model, dlm, eos: int, fixed_k: int):
    gen_kw = {"do_sample": False, "eos_token_id": eos, "pad_token_id": eos}
    from transformers import GenerationConfig

    hf = GenerationConfig()
    # HF reads these settings from the assistant's own generation config, not from generate's
    # arguments: the tuned row gets its own copy of the drafter
    tuned_assistant = copy.deepcopy(drafter_model)
    tuned_assistant.generation_config.update(**HF_TUNED_SETTINGS)

    def hf_run(**extra):
        def run(ids, n):
            return target.generate(ids, max_new_tokens=n, **gen_kw, **extra), None, None
        return run

    def mm_run(make_drafter):
        return engine_run(target, make_drafter, eos)

    def dlm_drafter(config):
        return DiffusionDrafter(dlm.model, dlm.mask_token_id, target, eos_token_id=eos,
                                config=config)

    shift = dlm.shift
    return [
        Method(REF, "reference", hf_run(), "`target.generate(do_sample=False)`"),
        Method(HF_ASSIST, "hf", hf_run(assistant_model=drafter_model),
               f"text-drafter, HF defaults: {assistant_settings(drafter_model)}"),
        Method(HF_TUNED, "hf", hf_run(assistant_model=tuned_assistant),
               f"text-drafter set as the zoo preset's AR drafter (5 greedy tokens a round): "
               f"{assistant_settings(tuned_assistant)}"),
        Method(HF_PLD, "hf", hf_run(prompt_lookup_num_tokens=10),
               f"prompt_lookup_num_tokens=10, max_matching_ngram_size="
               f"{hf.max_matching_ngram_size or 2}"),
        Method("ModelDrafter chain", "mmspec", mm_run(lambda: ModelDrafter(drafter_model, 5)),
               "text-drafter, 5 tokens, greedy chain"),
        Method("ModelDrafter tree", "mmspec",
               mm_run(lambda: ModelDrafter(tree_drafter_model, num_tokens=16, top_k=4)),
               "text-drafter, EAGLE-2 tree: 16 nodes, top-4, depth 4"),
        Method("PromptLookupDrafter", "mmspec", mm_run(lambda: PromptLookupDrafter()),
               "10 tokens, 2-gram (HF's defaults)"),
        Method(NAIVE, "mmspec",
               mm_run(lambda: NaiveDiffusionDrafter(dlm.model, dlm.mask_token_id, target,
                                                    k=fixed_k, shift=shift, eos_token_id=eos)),
               f"text-dlm, argmax path through the first EOS, k={fixed_k}"),
        Method(CPS, "mmspec", mm_run(lambda: dlm_drafter(DiffusionDrafterConfig(shift=shift,
                                                                                fixed_k=fixed_k))),
               f"text-dlm, CPS tau=0.8, M=15, B=3, lambda=0.5, 3-gram proxy; k={fixed_k}"),
        Method(CPS_ADL, "mmspec", mm_run(lambda: dlm_drafter(DiffusionDrafterConfig(shift=shift))),
               "text-dlm, CPS as above + ADL k in [20, 30], delta=10, rho=0.5"),
        Method(CACHED, "mmspec",
               mm_run(lambda: dlm_drafter(DiffusionDrafterConfig(shift=shift, prefix_cache=True))),
               "CPS+ADL as above, `prefix_cache=True`: the DLM's prefix KV is kept between rounds "
               "(Fast-dLLM's approximate prefix cache): each round runs the new tokens + block"),
        Method(SHORT, "mmspec",
               mm_run(lambda: dlm_drafter(DiffusionDrafterConfig(
                   shift=shift, prefix_cache=True, adl=ADLConfig(*SHORT_K)))),
               f"the row above with ADL k in [{SHORT_K[0]}, {SHORT_K[1]}] (k_1 = {SHORT_K[1]}) "
               f"instead of the paper's [20, 30]: shorter blocks verify cheaper on a CPU"),
    ]


def eagle3_methods(target, path: Path, eos: int) -> list:
    """"EAGLE-3 chain" and "EAGLE-3 tree": the EAGLE-3 drafter in `path` (an `EagleDrafter`
    folder for `target`) in the ModelDrafter rows' two shapes."""
    from mmspec import EagleDrafter

    chain = EagleDrafter.from_pretrained(path, target, **EAGLE3_CHAIN).eval()
    tree = EagleDrafter.from_pretrained(path, target, **EAGLE3_TREE).eval()
    return [Method("EAGLE-3 chain", "mmspec", engine_run(target, lambda: chain, eos),
                   f"{path.name}, {EAGLE3_CHAIN['depth']} tokens, greedy chain"),
            Method("EAGLE-3 tree", "mmspec", engine_run(target, lambda: tree, eos),
                   f"{path.name}, EAGLE-2 tree: {EAGLE3_TREE['total_tokens'] - 1} nodes, "
                   f"top-{EAGLE3_TREE['top_k']}, depth {EAGLE3_TREE['depth']}")]


def dflash_methods(target, path: Path, eos: int) -> list:
    """"DFlash chain" and "DFlash + path search": the DFlash drafter in `path` for `target`."""
    from mmspec.diffusion import DFlashDrafter

    chain = DFlashDrafter.from_pretrained(path, target).eval()
    tree = DFlashDrafter.from_pretrained(path, target, path_search=DFLASH_SEARCH).eval()
    block = chain.config.block_size
    return [Method(DFLASH_CHAIN, "mmspec", engine_run(target, lambda: chain, eos),
                   f"{path.name}, blocks of {block}: {block - 1} tokens, argmax chain"),
            Method(DFLASH_TREE, "mmspec", engine_run(target, lambda: tree, eos),
                   f"{path.name}, CPS (beam 3, tau 0.8, 3-gram proxy, lam 0.5) over the block, "
                   f"the argmax chain added, one tree")]


def dflash_verdicts(totals: dict) -> list:
    """Issue 46's goals on the zoo pair, when the DFlash rows ran."""
    if DFLASH_CHAIN not in totals:
        return []
    chain, tree, dlm = totals[DFLASH_CHAIN], totals[DFLASH_TREE], totals[SHORT]
    ratio = tree.tau / chain.tau
    return [
        (f"- **DFlash τ ≥ DiffuSpec's τ** (the zoo preset's CPS+ADL row, {SHORT}), read both "
         f"ways: DFlash's own argmax chain {chain.tau:.2f} vs {dlm.tau:.2f} → "
         f"**{'met' if chain.tau >= dlm.tau else 'missed'}**; DFlash with the causal path search "
         f"that DiffuSpec's row also drafts with {tree.tau:.2f} vs {dlm.tau:.2f} → "
         f"**{'met' if tree.tau >= dlm.tau else 'missed'}**."),
        (f"- **DFlash + path search τ ≥ {DFLASH_TREE_BAR}× the DFlash chain's**: {tree.tau:.2f} "
         f"vs {chain.tau:.2f} = {ratio:.2f}× → "
         f"**{'met' if ratio >= DFLASH_TREE_BAR else 'missed'}**."),
    ]


def run_method(method: Method, counter: CallCounter, ids: torch.Tensor, n: int) -> Run:
    counter.calls = 0
    start = time.perf_counter()
    with torch.no_grad():
        sequences, stats, log = method.run(ids, n)
    seconds = time.perf_counter() - start
    run = Run(sequences, seconds, counter.calls, stats)
    if log is not None:
        run.accepted, run.ks, run.generated = log.accepted, log.ks, log.generated
    if stats is not None and stats.rounds + 1 != run.calls:
        raise AssertionError(f"{method.name}: {run.calls} target calls counted but SpecStats says "
                             f"{stats.rounds} rounds + 1 prefill")
    return run


def best_runs(methods, counter: CallCounter, prompt, repeats: int, n: int) -> dict:
    """Each method's fastest of `repeats` runs on one prompt, the methods interleaved so that
    background load hits them alike; every mmspec output asserted equal to target-only greedy."""
    best: dict[str, Run] = {}
    for _ in range(repeats):
        for m in methods:
            run = run_method(m, counter, prompt.ids, n)
            if m.name not in best or run.seconds < best[m.name].seconds:
                best[m.name] = run
    ref = best[REF].sequences
    for m in methods:
        if m.kind == "mmspec" and not torch.equal(best[m.name].sequences, ref):
            raise AssertionError(f"LOSSLESS MISMATCH: {m.name} differs from target-only greedy "
                                 f"on {prompt.file}: "
                                 f"{first_difference(best[m.name].sequences, ref)}")
    return best


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    n = min(a.shape[1], b.shape[1])
    diff = (a[0, :n] != b[0, :n]).nonzero()
    where = int(diff[0]) if len(diff) else n
    return f"lengths {a.shape[1]} vs {b.shape[1]}, first difference at position {where}"


# ------------------------------------------------------------------------------ unit costs

def median_ms(fn, repeats: int = 15) -> float:
    return 1e3 * timed(fn, repeats)


@torch.no_grad()
def unit_costs(target, drafter_model, dlm, ids: torch.Tensor, k: int, eos: int) -> dict:
    """Milliseconds of one call of each building block at this prompt length (batch 1)."""
    p = ids.shape[1]

    def cached(model):
        return output_cache(model(ids, use_cache=True))

    def step(model, cache, n):
        def fn():
            model(input_ids=ids[:, -n:], position_ids=torch.arange(p, p + n)[None],
                  **cache_kwargs(model.forward, cache), use_cache=True)
            kv_cache.crop(cache, p)
        return fn

    t_cache, d_cache = cached(target), cached(drafter_model)
    vocab = target.get_output_embeddings().weight.shape[0]
    suppressed = torch.tensor([dlm.mask_token_id])
    ones = torch.ones_like(ids)

    def lattice():
        return build_lattice(dlm.model, ids, ones, [k], dlm.mask_token_id, vocab, dlm.shift,
                             suppressed)

    logprobs = lattice().logprobs[0]
    proxy = NgramProxy(vocab, 3)
    proxy.begin(ids[0])
    return {
        "target decode step (1 token)": median_ms(step(target, t_cache, 1)),
        "target verify forward (5 tokens)": median_ms(step(target, t_cache, 5)),
        f"target verify forward ({k} tokens)": median_ms(step(target, t_cache, k)),
        "drafter AR step (1 token)": median_ms(step(drafter_model, d_cache, 1)),
        f"DLM lattice forward (prompt + {k} masks, no KV reuse)": median_ms(lattice),
        "CPS search on that lattice (n-gram proxy)": median_ms(
            lambda: search(logprobs, CPSConfig(), [eos], proxy)),
    }


# ----------------------------------------------------------------------------------- report

@dataclass
class Total:
    seconds: float = 0.0
    new_tokens: int = 0
    rounds: int = 0
    draft_time: float = 0.0  # SpecStats sums (mmspec methods)
    verify_time: float = 0.0  # the target's verification forwards
    engine_time: float = 0.0
    round_time: float = 0.0  # total minus prefill
    identical: int = 0
    prompts: int = 0
    accepted: list = field(default_factory=list)  # per prompt, per round
    ks: list = field(default_factory=list)
    generated: list = field(default_factory=list)

    @property
    def tau(self) -> float:
        return (self.new_tokens - self.prompts) / max(self.rounds, 1)


def fmt_ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def table(methods: list[Method], totals: dict[str, Total], has_stats: set) -> tuple[list, list]:
    ref = totals[REF].seconds
    header = ["method", "τ with bonus", "τ without bonus (MAT)", "tokens/s",
              "speedup vs target-only", "draft ms/round", "target verify ms/round",
              "engine ms/round", "identical to greedy"]
    rows = []
    for m in methods:
        t = totals[m.name]
        draft = verify = engine = None
        if m.name in has_stats:
            draft, verify = t.draft_time / t.rounds * 1e3, t.verify_time / t.rounds * 1e3
            engine = t.engine_time / t.rounds * 1e3
        ident = "reference" if m.kind == "reference" else f"{t.identical}/{t.prompts}"
        rows.append([m.name, f"{t.tau:.2f}", f"{t.tau - 1:.2f}", f"{t.new_tokens / t.seconds:.1f}",
                     f"{ref / t.seconds:.2f}x", fmt_ms(draft), fmt_ms(verify), fmt_ms(engine), ident])
    return header, rows


def verdicts(totals: dict[str, Total], methods: list[Method], costs: dict, fixed_k: int,
             target_params: int, dlm_steps: int, dlm_params: int) -> list:
    ref = totals[REF].seconds
    speed = {m.name: ref / totals[m.name].seconds for m in methods}
    hf = max((HF_ASSIST, HF_TUNED), key=speed.get)  # the peer: HF's faster assistant setting
    hf_text = f"HF assisted generation ({speed[hf]:.2f}×, the faster of its two rows)"
    naive, adl = totals[NAIVE], totals[CPS_ADL]
    ratio = (adl.tau - 1) / max(naive.tau - 1, 1e-9)
    lines = [
        (f"- **CPS+ADL τ ≥ {TAU_RATIO_BAR}× naive τ** (MAT, without the bonus token, as the paper's "
        f"6.99 vs 6.05): {adl.tau - 1:.2f} vs {naive.tau - 1:.2f} = {ratio:.2f}× → "
        f"**{'met' if ratio >= TAU_RATIO_BAR else 'missed'}** (with the bonus token: "
        f"{adl.tau:.2f} vs {naive.tau:.2f} = {adl.tau / naive.tau:.2f}×)."),
        (f"- **CPS+ADL speedup ≥ {SPEEDUP_BAR}× over target-only**: {speed[CPS_ADL]:.2f}× → "
        f"**{'met' if speed[CPS_ADL] >= SPEEDUP_BAR else 'missed'}**."),
        (f"- **CPS+ADL ahead of HF assisted generation** (the faster of its two rows, {hf}): "
        f"{speed[CPS_ADL]:.2f}× vs {speed[hf]:.2f}× → "
        f"**{'met' if speed[CPS_ADL] > speed[hf] else 'missed'}**."),
    ]
    # round 1 drafts ADL's k_1 = k_max; k, L_gen and L_acc below are of the rounds after it, so
    # that L_gen <= k holds for the averages as it does round by round
    ks = [k for row in adl.ks for k in row[1:]]
    gen = [g for row in adl.generated for g in row[1:]]
    later = [a for row in adl.accepted for a in row[1:]]
    acc = [a for row in adl.accepted for a in row]
    cps_acc = [a for row in totals[CPS].accepted for a in row]
    longest = (
        f"Longest accepted run in a round: {max(acc)} tokens with CPS+ADL, {max(cps_acc)} with "
        f"CPS at fixed k={fixed_k}" + (" (no round accepted its whole block, so a longer block "
                                      "could only matter through the DLM's bidirectional "
                                      "context)." if max(acc + cps_acc) < fixed_k else "."))
    if ks:
        k_min = ADLConfig().k_min
        grows = sum(k > fixed_k for k in ks)
        lines.append(
            f"- ADL's block length after round 1: mean k = {statistics.mean(ks):.1f} (min "
            f"{min(ks)}, max {max(ks)}; {grows} of {len(ks)} rounds above {fixed_k}). Eq. 11 "
            f"grows k by δ only while EMA(L_acc) ≥ EMA(L_gen); in these rounds L_gen (the raw "
            f"argmax draft's length before its first EOS, at most k) averages "
            f"{statistics.mean(gen):.1f} tokens and L_acc {statistics.mean(later):.2f}, "
            + ("so k falls to k_min and stays there. " if max(ks) == k_min else
               f"and k is at k_min = {k_min} in {sum(k == k_min for k in ks)} of them. ")
            + longest)
    else:
        lines.append(f"- ADL's block length: every prompt ended in round 1, so ADL never "
                     f"adapted k. {longest}")
    cached = totals[CACHED]
    lines.append(
        f"- With the prefix KV cache (`prefix_cache=True`, beyond the paper; approximate for a "
        f"bidirectional DLM, lossless all the same): τ {cached.tau:.2f} against {adl.tau:.2f} "
        f"uncached, drafting {cached.draft_time / cached.rounds * 1e3:.1f} ms per round against "
        f"{adl.draft_time / adl.rounds * 1e3:.1f}, speedup {speed[CACHED]:.2f}× over target-only "
        f"(bar {SPEEDUP_BAR}×: **{'met' if speed[CACHED] >= SPEEDUP_BAR else 'missed'}**), "
        f"{'ahead of' if speed[CACHED] > speed[hf] else 'behind'} {hf_text}.")
    short = totals[SHORT]
    lines.append(
        f"- A CPU-sized block (ADL k in [{SHORT_K[0]}, {SHORT_K[1]}], prefix cache): τ "
        f"{short.tau:.2f} against {cached.tau:.2f} at k in [20, 30], target verification "
        f"{short.verify_time / short.rounds * 1e3:.1f} ms per round against "
        f"{cached.verify_time / cached.rounds * 1e3:.1f}, speedup {speed[SHORT]:.2f}× "
        f"(bar {SPEEDUP_BAR}×: **{'met' if speed[SHORT] >= SPEEDUP_BAR else 'missed'}**), "
        f"{'ahead of' if speed[SHORT] > speed[hf] else 'behind'} {hf_text}. The long block "
        f"buys little τ here and each round costs "
        f"more; the zoo preset (`mmspec generate --target text`) uses this range.")
    mm = [m.name for m in methods if m.kind == "mmspec"]
    best = max(mm, key=speed.get)
    lines.append(f"- Fastest mmspec method: {best}, {speed[best]:.2f}× over target-only "
                 f"({'≥' if speed[best] >= SPEEDUP_BAR else '<'} {SPEEDUP_BAR}×) and "
                 f"{'ahead of' if speed[best] > speed[hf] else 'behind'} {hf_text}.")
    # CPS+ADL's cost per committed token against one target decode step, from this run's timings
    step = costs["target decode step (1 token)"]
    draft, verify = adl.draft_time / adl.rounds * 1e3, adl.verify_time / adl.rounds * 1e3
    engine, round_ms = adl.engine_time / adl.rounds * 1e3, adl.round_time / adl.rounds * 1e3
    dlm_ms = next(v for k, v in costs.items() if k.startswith("DLM lattice"))
    cps_ms = costs["CPS search on that lattice (n-gram proxy)"]
    verify_k = costs[f"target verify forward ({fixed_k} tokens)"]
    per_token = totals[REF].seconds / totals[REF].new_tokens * 1e3  # target-only, this run
    lines.append(
        f"- Where CPS+ADL's time goes: a round costs {round_ms:.1f} ms ({draft:.1f} ms drafting, "
        f"{verify:.1f} ms in the target's verification forward, {engine:.1f} ms engine) and "
        f"commits τ = {adl.tau:.2f} tokens: {round_ms / adl.tau:.1f} ms per token, against "
        f"{per_token:.1f} ms per token for target-only greedy in the same run, so rounds this "
        f"expensive break even only at τ = {round_ms / per_token:.1f}. In isolation (table "
        f"below), one DLM lattice forward costs {dlm_ms / step:.1f} target decode steps (the DLM "
        f"re-reads the whole prefix bidirectionally every round, no KV reuse), one CPS search "
        f"{cps_ms / step:.1f} steps, and verifying {fixed_k} tokens {verify_k / step:.1f} steps.")
    if speed[CPS_ADL] < SPEEDUP_BAR:
        lines.append(
            f"- What would change it: per round, drafting costs {draft:.1f} ms, "
            f"{draft / verify:.1f}× the verification forward ({verify:.1f} ms), and verifying "
            f"{fixed_k} tokens costs only {verify_k / step:.1f} decode steps. "
            f"(1) The target has {target_params / 1e6:.1f}M parameters, "
            f"{target_params / dlm_params:.1f}× the DLM's {dlm_params / 1e6:.1f}M; the paper's "
            f"Qwen2.5-32B is 4.6× its Dream-7B, and on a GPU both forwards are memory-bound, so "
            f"the DLM forward is small next to a target step; here one DLM lattice forward "
            f"(prefix + {fixed_k} tokens) costs {dlm_ms / step:.1f} target decode steps. "
            f"(2) Reusing the prefix KV cuts the lattice forward from prefix + k tokens to the new tokens + k (the prefix-cache row; a "
            f"block-causal DLM would make that exact). (3) CPS is "
            f"{cps_ms / round_ms:.0%} of a round here against about 1% in the paper (Fig. 6): its "
            f"n-gram proxy scores candidates one by one in Python. (4) τ itself: the DLM was "
            f"trained for {dlm_steps} steps, and the paper's MAT of 6.99 comes from Dream-7B; "
            f"distilling it on the target's own continuations did not raise τ (section "
            f"`dlm_compare`), so its size is the limit.")
    return lines


def plot(methods: list[Method], totals: dict[str, Total], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ref = totals[REF].seconds
    names = [m.name for m in methods]
    colors = ["#888888" if m.kind != "mmspec" else "#1f77b4" for m in methods]
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(names, [ref / totals[n].seconds for n in names], color=colors)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(SPEEDUP_BAR, color="red", lw=0.8, ls="--", label=f"bar {SPEEDUP_BAR}x")
    ax.set_xlabel("wall-clock speedup over target-only greedy")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    ax.set_title("Text pair, held-out stdlib prompts (grey: HF / reference)")
    fig.tight_layout()
    paths.append(out_dir / "text_speedup.png")
    fig.savefig(paths[-1], dpi=80)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    # one bar call per colour, so that the legend has an entry for each (a single call with a
    # list of colours showed only the first, grey, as "with bonus")
    y = list(range(len(names)))
    for kinds, color, label in (({"reference", "hf"}, "#888888", "with bonus (HF / reference)"),
                                ({"mmspec"}, "#1f77b4", "with bonus (mmspec)")):
        rows = [i for i, m in enumerate(methods) if m.kind in kinds]
        ax.barh(rows, [totals[names[i]].tau for i in rows], color=color, label=label)
    ax.barh(y, [totals[n].tau - 1 for n in names], color="#ff7f0e", alpha=0.7,
            label="without bonus (MAT)")
    ax.set_yticks(y, names)
    ax.set_xlabel("τ: tokens per target verification forward")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8)  # off the bars
    paths.append(out_dir / "text_tau.png")
    fig.savefig(paths[-1], dpi=80, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    # CPS and CPS+ADL can coincide: dashes show both
    styles = {NAIVE: "-", CPS: "--", CPS_ADL: ":", CACHED: "-.", SHORT: (0, (1, 3))}
    for name in DLM_METHODS:
        per_prompt = totals[name].accepted
        rounds = sorted(len(a) for a in per_prompt)[len(per_prompt) // 2]  # half still running
        mean = [statistics.mean(a[r] + 1 for a in per_prompt if len(a) > r) for r in range(rounds)]
        ax.plot(range(1, rounds + 1), mean, marker=".", ls=styles[name], label=name)
    ax.set_xlabel("round (while at least half of the prompts are still generating)")
    ax.set_ylabel("τ with bonus (mean over prompts)")
    ks = totals[CPS_ADL].ks
    ax2 = ax.twinx()
    rounds = sorted(len(k) for k in ks)[len(ks) // 2]
    ax2.plot(range(1, rounds + 1),
             [statistics.mean(k[r] for k in ks if len(k) > r) for r in range(rounds)],
             color="grey", ls="-.", label="ADL k (right axis)")
    ax2.set_ylabel("ADL block length k")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    # below the axes: inside, every corner covered a curve
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper center",
              bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
    ax.set_title("Diffusion drafter: τ per round")
    paths.append(out_dir / "text_tau_per_round.png")
    fig.savefig(paths[-1], dpi=80, bbox_inches="tight")
    plt.close(fig)
    return paths


# ------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    """The command line (`mmspec bench` reads its options here)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable)")
    parser.add_argument("--repeats", type=int, default=1, help="best of R timed runs per prompt")
    parser.add_argument("--fixed-k", type=int, default=20,
                        help="block length of the fixed-k DLM drafters (ADL's k_min)")
    parser.add_argument("--eagle3", type=Path, default=None,
                        help="an EAGLE-3 drafter folder for text-target: adds the EAGLE-3 rows "
                             "(default: the zoo's text-eagle3 if it has one)")
    parser.add_argument("--dflash", type=Path, default=None,
                        help="a DFlash drafter folder for text-target: adds the DFlash rows "
                             "(default: the zoo's text-dflash if it has one)")
    parser.add_argument("--plot", action="store_true", help=f"write PNG charts into {PLOTS}")
    parser.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    return parser


def main():
    parser = build_parser()
    args = parser.parse_args()
    check_plot_deps(args.plot)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    load_start = os.getloadavg()[0]

    target = zoo.load("text-target")
    drafter_model = zoo.load("text-drafter").model
    tree_drafter_model = zoo.load("text-drafter").model  # its own copy: the tree switches attention
    dlm = zoo.load("text-dlm")
    tokenizer = target.tokenizer
    eos = tokenizer.eos_token_id
    target = target.model
    counter = CallCounter(target)
    prompts = heldout_prompts(tokenizer, args.prompts, args.prompt_tokens, args.new_tokens)
    methods = build_methods(target, drafter_model, tree_drafter_model, dlm, eos, args.fixed_k)
    eagle3 = args.eagle3
    if eagle3 is None and (ZOO_DIR / "text-eagle3" / "card.json").is_file():
        eagle3 = ZOO_DIR / "text-eagle3"
    if eagle3 is not None:
        methods += eagle3_methods(target, eagle3, eos)
    dflash = args.dflash
    if dflash is None and (ZOO_DIR / "text-dflash" / "card.json").is_file():
        dflash = ZOO_DIR / "text-dflash"
    if dflash is not None:
        methods += dflash_methods(target, dflash, eos)
    print(f"{len(prompts)} prompts x {args.prompt_tokens} tokens, {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), load average {load_start:.2f} on {os.cpu_count()} CPUs",
          flush=True)

    # warm-up: first calls pay for lazy imports, allocator growth and the engine's admission
    # probe (once per target, `decoding/admission.py`: target forwards that are no round's, so
    # this call's count is not checked against SpecStats; it failed here since the probe came)
    for m in methods:
        with torch.no_grad():
            m.run(prompts[0].ids, min(8, args.new_tokens))
    costs = unit_costs(target, drafter_model, dlm, prompts[0].ids, args.fixed_k, eos)

    totals = {m.name: Total() for m in methods}
    has_stats = {m.name for m in methods if m.kind == "mmspec"}
    for i, prompt in enumerate(prompts):
        best = best_runs(methods, counter, prompt, args.repeats, args.new_tokens)
        ref = best[REF].sequences
        for m in methods:
            run, t = best[m.name], totals[m.name]
            same = torch.equal(run.sequences, ref)
            t.seconds += run.seconds
            t.new_tokens += run.sequences.shape[1] - prompt.ids.shape[1]
            t.rounds += run.calls - 1
            t.prompts += 1
            t.identical += same
            if run.stats is not None:
                t.draft_time += run.stats.draft_time
                t.verify_time += run.stats.target_forward_time
                t.engine_time += run.stats.engine_time
                t.round_time += run.stats.total_time - run.stats.prefill_time
                t.accepted.append(run.accepted)
                t.ks.append(run.ks)
                t.generated.append(run.generated)
        print(f"prompt {i + 1}/{len(prompts)} ({prompt.file}): " + ", ".join(
            f"{m.name} {best[m.name].seconds:.2f}s" for m in methods), flush=True)
    load_end = os.getloadavg()[0]

    header, rows = table(methods, totals, has_stats)
    lines = verdicts(totals, methods, costs, args.fixed_k,
                     sum(p.numel() for p in target.parameters()), dlm.card['config']['steps'],
                     dlm.card['params']) + dflash_verdicts(totals)
    cost_table = markdown_table([("building block (batch 1, prompt of "
                                 f"{args.prompt_tokens} tokens)"), "ms (median of 15)"],
                                [[k, f"{v:.2f}"] for k, v in costs.items()])
    settings = markdown_table(["method", "settings"], [[m.name, m.settings] for m in methods])
    files = ", ".join(f"`{p.file}`" for p in prompts)
    load = (f"Load average (1 min) {load_start:.2f} at the start and {load_end:.2f} at the end, on "
            f"{os.cpu_count()} CPUs: a shared machine, so absolute times are noisy; every ratio is "
            "measured within this run, methods interleaved per prompt.")
    body = "\n".join([
        (f"Zoo text pair: target `text-target` (Qwen2, {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M "
        f"parameters), AR drafter `text-drafter`, diffusion drafter `text-dlm` (Dream-style)"
        + ("" if eagle3 is None else ", EAGLE-3 drafter `text-eagle3`" if eagle3.parent == ZOO_DIR
           else f", EAGLE-3 drafter `{eagle3}` (not the zoo's)")
        + ("" if dflash is None else ", DFlash drafter `text-dflash`" if dflash.parent == ZOO_DIR
           else f", DFlash drafter `{dflash}` (not the zoo's)")
        + f"; "
        f"fp32, batch 1, greedy, {args.threads} thread(s). {len(prompts)} prompts of "
        f"{args.prompt_tokens} tokens from the middle of held-out stdlib files ({files}), "
        f"{args.new_tokens} new tokens each, best of {args.repeats} per prompt and method."),
        "",
        ("τ = tokens per target verification forward, counted with a forward hook on the target "
        "for every method (HF's included): (new tokens − 1) / (target calls − 1). Speedup = "
        "target-only wall time / the method's, summed over the prompts. Draft and verify "
        "times per round come from `SpecStats` (mmspec methods only). Every mmspec output is "
        "asserted token-identical to target-only greedy."),
        "",
        markdown_table(header, rows),
        "",
        "Bars (issue 7) and what the figures say:",
        "",
        *lines,
        "",
        cost_table,
        "",
        settings,
        "",
        load,
    ])
    print()
    print(markdown_table(header, rows))
    print()
    print("\n".join(lines))
    print()
    print(cost_table)
    print(load)
    if args.plot:
        for path in plot(methods, totals, PLOTS):
            print(f"wrote {path}")
        body += ("\n\nCharts: `benchmarks/plots/text_speedup.png`, `text_tau.png`, "
                 "`text_tau_per_round.png`.")
    if args.write:
        write_section("text", "Text pair: speculative methods side by side (`benchmarks/text.py`)",
                      body)


if __name__ == "__main__":
    main()
