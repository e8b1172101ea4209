"""Engine efficiency: how much of the ideal speculative speedup the engine delivers (issue 31).

No trained drafter is needed. An *oracle* drafter proposes the target's own greedy continuation
(computed once with `target.generate`), corrupted so that each round accepts a chosen number of
tokens: round r accepts a_r = floor((r + 1)(tau - 1)) - floor(r (tau - 1)) drafted tokens, so tau
(tokens per target forward, bonus included) is exactly the one asked for, as long as the engine's
verification agrees with `target.generate` (bf16 near-ties can make them part; the measured tau is
printed beside the asked one, and the output is compared with target-only greedy).

Two draft shapes: a chain of 7 tokens and a 30-node tree (6 levels of 5 siblings, each level below
the previous level's first node; the correct path runs through the first nodes).

For each tau and shape, side by side in one run:
    measured speedup = target-only greedy wall time / mmspec.generate wall time (same prompt,
                       same number of new tokens, EOS off)
    ideal speedup    = tau x decode-step time / verification-forward time, both from this run
                       (the decode step from target-only greedy: its wall time / new tokens;
                       the verification forward from `SpecStats.target_forward_time / rounds`):
                       what a free drafter and a free engine would give
    efficiency       = measured / ideal
    engine overhead  = engine time (rounds minus drafter calls minus target forwards) as a % of
                       the verification forwards
The drafter is nearly free (it indexes a stored tensor); its time is taken out of nothing, so it
counts against the efficiency. HF's assisted generation is compared at its own tau through prompt
lookup (`prompt_lookup_num_tokens=7`, no model), beside mmspec's `PromptLookupDrafter(7)`.

CPU: the zoo text target (fp32). GPU (`--gpu`): a Llama-7B-sized random-weight target in bf16
(hidden 4096, 32 layers, 32 heads, FFN 11008, vocabulary 32000), built on the GPU.

`--compile` measures instead `generate(compile=True)` beside the eager engine at tau = 4, chain
and tree, and target-only greedy, in one run (section engine_compile / engine_compile_gpu): the round time of each (wall time of
the call minus its prefill, over its rounds; the drafter is the oracle, nearly free), their ratio,
and the first compiled call's time (tracing, compiling and, on CUDA, recording the graphs). Goal
on the GPU: compiled rounds >= 1.5x faster than eager ones.

    python benchmarks/engine_speed.py [--write] [--threads 2] [--new-tokens 96] [--compile]
    python benchmarks/engine_speed.py --gpu [--write] [--taus 4] [--compile]  # engine_speed_gpu
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_results import record  # noqa: E402
from benchmarks.report import markdown_table, write_section  # noqa: E402
from mmspec import Draft, PromptLookupDrafter, generate  # noqa: E402
from mmspec.zoo.presets import heldout_code_prompt  # noqa: E402

TAUS = (1.5, 2.0, 3.0, 4.0, 6.0)
CHAIN = 7  # drafted tokens per chain round
TREE_LEVELS, TREE_WIDTH = 6, 5  # 30 nodes


def tree_parents(levels: int = TREE_LEVELS, width: int = TREE_WIDTH) -> torch.Tensor:
    """Level l's `width` siblings hang below level l-1's first node (node (l-1) * width)."""
    return torch.tensor([-1 if i < width else (i // width - 1) * width
                         for i in range(levels * width)])


class OracleDrafter:
    """Drafts `reference`'s continuation of the committed tokens (batch 1), wrong at depth a_r.

    reference: long `[1, P + M]`, the prompt then the target's greedy continuation.
    shape: "chain" or "tree". A round whose committed tokens have left the reference (a near-tie
    broke the other way) drafts the reference anyway; `diverged` counts such rounds.
    """

    def __init__(self, reference: torch.Tensor, tau: float, shape: str, vocab: int):
        self.ref = reference[0]
        self.step = tau - 1.0  # accepted draft tokens per round, on average
        self.shape, self.vocab = shape, vocab
        self.parents = (torch.arange(-1, CHAIN - 1) if shape == "chain"
                        else tree_parents()).to(reference.device)
        self.depth_of = (torch.arange(CHAIN) if shape == "chain"
                         else torch.arange(TREE_LEVELS * TREE_WIDTH) // TREE_WIDTH
                         ).to(reference.device)
        self.first = (torch.ones(CHAIN, dtype=torch.bool) if shape == "chain"
                      else torch.arange(TREE_LEVELS * TREE_WIDTH) % TREE_WIDTH == 0
                      ).to(reference.device)
        self.sibling = (torch.zeros(CHAIN, dtype=torch.long) if shape == "chain"
                        else torch.arange(TREE_LEVELS * TREE_WIDTH) % TREE_WIDTH
                        ).to(reference.device)
        self.round = 0
        self.diverged = 0

    def accepted_this_round(self) -> int:
        r = self.round
        return int((r + 1) * self.step + 1e-9) - int(r * self.step + 1e-9)

    def propose(self, state) -> Draft:
        if state.round == 0:
            self.round, self.diverged = 0, 0
        n = state.input_ids.shape[1]  # batch 1, no padding: every slot is committed
        depth = self.depth_of
        want = self.ref[n + depth]  # the reference token at each node's depth
        a = self.accepted_this_round()
        # right on the first node of levels < a; wrong at level a and on every sibling
        wrong = (depth >= a) | ~self.first
        tokens = torch.where(wrong, (want + 1 + self.sibling) % self.vocab, want)
        keep = depth < state.max_tokens
        if not torch.equal(state.input_ids[0, -4:], self.ref[n - 4:n]):
            self.diverged += 1
        self.round += 1
        return Draft(tokens[keep][None], self.parents[keep])

    def update(self, result) -> None:
        pass


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def wall(fn, device, repeats: int):
    """Median wall seconds of `repeats` calls (after the caller's warm-up) and the last result."""
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def peaked(model, seed: int = 0):
    """Give a random-weight Llama clear greedy choices, at the same cost per forward.

    A freshly initialised model's logits are nearly flat: in bf16 its own `generate` and a
    verification forward (which sums in another order) part at near-ties within a few tokens
    (seen on an H100: 106 of 121 oracle rounds off the reference), so no drafter could be
    accepted at a chosen rate. Here every layer's output projections are scaled by 1e-3 (the
    residual stream keeps the input token's embedding) and the LM head is the embedding in a
    random order, so the next token is a fixed permutation of the current one, with a margin
    some 60 times the noise. Every matrix keeps its shape: the forward costs what it did."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(1e-3)
            layer.mlp.down_proj.weight.mul_(1e-3)
        emb = model.model.embed_tokens.weight
        perm = torch.randperm(emb.shape[0], generator=g).to(emb.device)
        model.lm_head.weight.copy_(emb[perm])
    return model


def llama_sized(device, small: bool = False):
    """Llama-7B-sized (or, `small`, a 4-layer 256-wide test size) random bf16 target, peaked."""
    from transformers import LlamaConfig, LlamaForCausalLM

    size = (dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4) if small else
            dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32))
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=4096, pad_token_id=0,
                      tie_word_embeddings=False, **size)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    what = ("Llama-7B-sized (6.7B parameters)" if not small else "a 4-layer Llama") + \
        " random weights, bf16, peaked (`peaked`: output projections x 1e-3, the LM head a " \
        "permuted embedding, so greedy choices are clear; the cost per forward is unchanged)"
    return peaked(model).eval(), what


def zoo_target():
    from mmspec import zoo

    entry = zoo.load("text-target")
    return entry.model.eval(), "the zoo text target, fp32", entry.tokenizer


GREEDY = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


def baseline(target, ids, new_tokens: int, repeats: int, device) -> dict:
    """Target-only greedy: its time and output, and the reference the oracle drafts from."""
    target.generation_config.eos_token_id = None  # EOS off: every call makes new_tokens

    def target_only(n=new_tokens):
        return target.generate(ids, max_new_tokens=n, **GREEDY)

    target_only(8)  # warm-up
    reference = target.generate(ids, max_new_tokens=new_tokens + CHAIN + 2, **GREEDY)
    t_base, base_out = wall(target_only, device, repeats)
    print(f"target-only greedy: {t_base * 1e3:.0f} ms for {new_tokens} tokens "
          f"({t_base / new_tokens * 1e3:.2f} ms a token)", flush=True)
    return {"reference": reference, "base_out": base_out, "t_base": t_base}


def run(target, ids, new_tokens: int, repeats: int, device, taus=TAUS,
        progress=lambda rows: None) -> tuple[list, list, dict]:
    """The efficiency table (module docstring); `progress(rows)` after every row. Speedups come
    from calls timed as users run them; the phases of a round (verification forward, drafter,
    engine) from one more call with `profile=True`, which on CUDA times them with CUDA events
    (wall time there would count kernel launches, not kernels)."""
    vocab = target.get_output_embeddings().weight.shape[0]
    greedy = GREEDY
    base = baseline(target, ids, new_tokens, repeats, device)
    reference, base_out, t_base = base["reference"], base["base_out"], base["t_base"]
    t_step = t_base / new_tokens
    rows, plot_rows, raw = [], [], {"t_step_ms": t_step * 1e3}
    for tau in taus:
        for shape in ("chain", "tree"):
            drafter = OracleDrafter(reference, tau, shape, vocab)

            def spec(n=new_tokens, d=drafter, profile=False):
                return generate(target, d, ids, max_new_tokens=n, eos_token_id=[],
                                pad_token_id=0, profile=profile)

            spec(8)  # warm-up (and the tree path's first mask)
            t_spec, out = wall(spec, device, repeats)
            s = spec(profile=True).stats  # the phases: CUDA events on a GPU
            same = torch.equal(out.sequences, base_out)
            fwd = s.target_forward_time / s.rounds
            engine = s.engine_time / s.rounds
            draft = s.draft_time / s.rounds
            measured = t_base / t_spec
            ideal = s.mean_accepted * t_step / fwd
            free_round = (s.total_time - s.prefill_time - s.draft_time) / s.rounds
            rows.append([shape, f"{tau:g}", f"{s.mean_accepted:.2f}", s.rounds,
                         f"{t_step * 1e3:.2f}", f"{fwd * 1e3:.2f}", f"{free_round * 1e3:.2f}",
                         f"{draft * 1e3:.2f}", f"{100 * engine / fwd:.1f}%",
                         f"{measured:.2f}x", f"{ideal:.2f}x", f"{measured / ideal:.2f}",
                         "yes" if same else f"no ({drafter.diverged} rounds off)"])
            plot_rows.append((shape, tau, s.mean_accepted, measured, ideal))
            progress(rows)
            print(f"{shape:5s} tau {tau:g} (measured {s.mean_accepted:.2f}): round "
                  f"{free_round * 1e3:.2f} ms, verify fwd {fwd * 1e3:.2f} ms, engine "
                  f"{100 * engine / fwd:.1f}% of it; speedup {measured:.2f}x of ideal "
                  f"{ideal:.2f}x = efficiency {measured / ideal:.2f}; identical: {same}",
                  flush=True)
    # HF's assisted generation at its own tau: prompt lookup, no model, beside ours
    calls = {"n": 0}
    hook = target.register_forward_pre_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    try:
        def hf_lookup(n=new_tokens):
            return target.generate(ids, max_new_tokens=n, prompt_lookup_num_tokens=CHAIN,
                                   **greedy)

        hf_lookup(8)
        calls["n"] = 0
        t_hf, hf_out = wall(hf_lookup, device, repeats)
        hf_tau = (new_tokens - 1) / max(calls["n"] / repeats - 1, 1)
    finally:
        hook.remove()
    lookup = PromptLookupDrafter(CHAIN)

    def ours(n=new_tokens):
        return generate(target, lookup, ids, max_new_tokens=n, eos_token_id=[], pad_token_id=0)

    ours(8)
    t_ours, our_out = wall(ours, device, repeats)
    lookup_rows = [
        ["HF prompt lookup (7 tokens)", f"{hf_tau:.2f}", f"{t_hf * 1e3:.0f}",
         f"{t_base / t_hf:.2f}x", "yes" if torch.equal(hf_out, base_out) else "no"],
        ["mmspec PromptLookupDrafter(7)", f"{our_out.stats.mean_accepted:.2f}",
         f"{t_ours * 1e3:.0f}", f"{t_base / t_ours:.2f}x",
         "yes" if torch.equal(our_out.sequences, base_out) else "no"],
    ]
    for r in lookup_rows:
        print(f"{r[0]}: tau {r[1]}, {r[2]} ms, {r[3]} over target-only, identical {r[4]}")
    raw["plot"] = plot_rows
    return rows, lookup_rows, raw


COMPILE_TAU = 4.0


def run_compiled(target, ids, new_tokens: int, repeats: int, device,
                 progress=lambda rows: None) -> list:
    """`compile=True` against the eager engine, side by side, at `COMPILE_TAU` (module
    docstring); `progress(rows)` after every row. The first compiled call has the timed calls'
    length: the static cache is sized by the prompt and `max_new_tokens`, so a shorter warm-up
    would compile another graph. A round is the timed call's wall time minus its prefill, the
    prefill timed by one more call with `profile=True` (CUDA events on a GPU)."""
    vocab = target.get_output_embeddings().weight.shape[0]
    raw = baseline(target, ids, new_tokens, repeats, device)
    rows = []
    for shape in ("chain", "tree"):
        drafter = OracleDrafter(raw["reference"], COMPILE_TAU, shape, vocab)

        def spec(compile, d=drafter, profile=False):
            return generate(target, d, ids, max_new_tokens=new_tokens, eos_token_id=[],
                            pad_token_id=0, compile=compile, profile=profile)

        spec(False)  # warm-up
        t_first, _ = wall(lambda: spec(True), device, 1)  # compiles
        t_eager, eager = wall(lambda: spec(False), device, repeats)
        t_comp, comp = wall(lambda: spec(True), device, repeats)
        prefill_e = spec(False, profile=True).stats.prefill_time
        prefill_c = spec(True, profile=True).stats.prefill_time
        round_e = (t_eager - prefill_e) / eager.stats.rounds
        round_c = (t_comp - prefill_c) / comp.stats.rounds
        same = (torch.equal(eager.sequences, raw["base_out"])
                and torch.equal(comp.sequences, raw["base_out"]))
        rows.append([shape, f"{comp.stats.mean_accepted:.2f}", comp.stats.rounds,
                     f"{round_e * 1e3:.2f}", f"{round_c * 1e3:.2f}", f"{round_e / round_c:.2f}x",
                     f"{raw['t_base'] / t_eager:.2f}x", f"{raw['t_base'] / t_comp:.2f}x",
                     f"{t_first:.1f}", "yes" if same else "no"])
        print(f"{shape:5s} compiled: round {round_c * 1e3:.2f} ms vs eager {round_e * 1e3:.2f} "
              f"ms ({round_e / round_c:.2f}x); first compiled call {t_first:.1f} s; "
              f"identical: {same}", flush=True)
        progress(rows)
    return rows


COMPILE_HEADER = ["draft", "tau", "rounds", "eager round (ms)", "compiled round (ms)",
                  "compiled vs eager rounds", "eager speedup", "compiled speedup",
                  "first compiled call (s)", "= target-only"]


HEADER = ["draft", "tau asked", "tau measured", "rounds", "decode step (ms)",
          "verify forward (ms)", "round, free drafter (ms)", "drafter (ms)",
          "engine / verify forward", "speedup", "ideal", "efficiency", "= target-only"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", action="store_true", help="the 7B-sized bf16 target on CUDA")
    p.add_argument("--small", action="store_true",
                   help="with --gpu, or alone on the CPU: a 4-layer bf16 Llama (a quick check)")
    p.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md "
                   "(after every row) and, with --gpu, issue 42's goals as JSON")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=None,
                   help="new tokens per call (default 96 on the CPU, 128 on the GPU)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls per method, median (default 1 on the CPU, 3 on the GPU)")
    p.add_argument("--taus", type=_taus, default=TAUS, metavar="4,2",
                   help=f"the taus, in this order (default {','.join(map(str, TAUS))})")
    p.add_argument("--compile", action="store_true",
                   help="instead: generate(compile=True) against the eager engine at tau 4")
    args = p.parse_args(argv)
    if args.gpu and not torch.cuda.is_available():  # noqa: SIM102
        p.error("--gpu needs a CUDA device; none is visible")
    device = torch.device("cuda" if args.gpu else "cpu")
    new_tokens = args.new_tokens or (128 if args.gpu else 96)
    repeats = args.repeats or (3 if args.gpu else 1)
    if args.gpu or args.small:
        target, what = llama_sized(device, small=args.small)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, 32000, (1, args.prompt_tokens), generator=g).to(device)
    else:
        torch.set_num_threads(args.threads)
        target, what, tokenizer = zoo_target()
        ids = heldout_code_prompt(tokenizer, args.prompt_tokens)
    if args.compile:
        def compiled_progress(rows):
            _write_compiled(args, rows, what, new_tokens, repeats, device)

        with torch.inference_mode():
            run_compiled(target, ids, new_tokens, repeats, device, compiled_progress)
        return 0

    def progress(rows):
        _write_speed(args, rows, None, what, ids.shape[1], new_tokens, repeats)

    with torch.inference_mode():
        rows, lookup_rows, raw = run(target, ids, new_tokens, repeats, device, args.taus,
                                     progress)
    _write_speed(args, rows, lookup_rows, what, ids.shape[1], new_tokens, repeats)
    return 0


def _taus(text: str) -> tuple[float, ...]:
    try:
        taus = tuple(float(x) for x in text.split(","))
    except ValueError:
        taus = ()
    if not taus or min(taus) < 1:
        raise argparse.ArgumentTypeError(f"--taus takes numbers >= 1 joined by commas, e.g. "
                                         f"4,2; got {text!r}")
    return taus


def _write_speed(args, rows, lookup_rows, what, prompt_tokens, new_tokens, repeats) -> None:
    """Print (when the run is over: `lookup_rows` given) and, with --write, write the section
    from the rows so far, and on the GPU issue 42's goals at tau 4."""
    eff = {(r[0], r[1]): float(r[11]) for r in rows}
    share = {(r[0], r[1]): float(r[8].rstrip("%")) for r in rows}
    chain4 = eff.get(("chain", "4"))
    body = (
        f"Target: {what}; a {prompt_tokens}-token prompt, {new_tokens} new tokens, greedy, EOS "
        f"off; median of {repeats} timed call(s) after a warm-up, every method in this one run. "
        f"Oracle drafter (the target's own greedy continuation, wrong from depth a_r on), chain "
        f"of {CHAIN} and a {TREE_LEVELS * TREE_WIDTH}-node tree. Ideal = tau x decode step / "
        f"verify forward; efficiency = speedup / ideal. The phases of a round (verify forward, "
        f"drafter, the engine's share, which excludes the drafter's calls and the target's "
        f"forwards) come from one more call with `profile=True` (CUDA events on a GPU).\n\n"
        + markdown_table(HEADER, rows) + "\n")
    if lookup_rows is not None:
        body += ("\nHF's assisted generation at its own tau (prompt lookup, no model), beside "
                 "mmspec's prompt lookup, same prompt:\n\n"
                 + markdown_table(["method", "tau", "ms", "speedup", "= target-only"],
                                  lookup_rows) + "\n")
    if args.gpu and chain4 is not None:
        body += (f"\nGoal (issue 42, 7B-sized target): efficiency >= 0.9 at tau = 4 (chain: "
                 f"{chain4:.2f}, {'met' if chain4 >= 0.9 else 'missed'}).\n")
    if lookup_rows is not None:
        print(body)
    if not args.write:
        return
    name = "engine_speed_gpu" if args.gpu else "engine_speed"
    title = ("Engine efficiency on a GPU (`benchmarks/engine_speed.py --gpu`)" if args.gpu
             else "Engine efficiency, CPU (`benchmarks/engine_speed.py`)")
    write_section(name, title, body)
    if args.gpu:
        for shape in ("chain", "tree"):
            if (shape, "4") in eff:
                device = torch.cuda.get_device_name()
                record(name, f"efficiency at tau 4, {shape}", eff[(shape, "4")], device)
                record(name, f"engine work per round, % of a verification forward, {shape}",
                       share[(shape, "4")], device)


def _write_compiled(args, compile_rows, what, new_tokens, repeats, device) -> None:
    ratios = [float(r[5][:-1]) for r in compile_rows]
    body = (
        f"Target: {what}; a {args.prompt_tokens}-token prompt, {new_tokens} new tokens, greedy, "
        f"EOS off; median of {repeats} timed call(s) after a warm-up and a first compiled call, "
        f"every method in this one run; oracle drafter (as in the engine efficiency section) at "
        f"tau {COMPILE_TAU:g}. `compile=True`: the KV in a StaticCache, every verification "
        f"forward padded to one shape and torch.compiled (dynamic=False, "
        f"{'mode reduce-overhead: CUDA graphs' if device.type == 'cuda' else 'inductor'}); the "
        f"drafter is not compiled. A round is the call's wall time minus its prefill (timed by "
        f"one more call with `profile=True`: CUDA events on a GPU), over its rounds; speedups "
        f"are over target-only greedy.\n\n"
        + markdown_table(COMPILE_HEADER, compile_rows) + "\n")
    if args.gpu:
        body += (f"\nGoal (issue 42, GPU): compiled rounds >= 1.5x faster than eager ("
                 + ", ".join(f"{r[0]} {x:.2f}x" for r, x in zip(compile_rows, ratios))
                 + f": {'met' if min(ratios) >= 1.5 else 'missed'}).\n")
    print(body)
    if args.write:
        name = "engine_compile_gpu" if args.gpu else "engine_compile"
        title = ("compile=True against the eager engine, GPU (`benchmarks/engine_speed.py "
                 "--gpu --compile`)" if args.gpu else "compile=True against the eager engine, "
                 "CPU (`benchmarks/engine_speed.py --compile`)")
        write_section(name, title, body)
        if args.gpu:
            for row, ratio in zip(compile_rows, ratios):
                record(name, f"compiled vs eager rounds, {row[0]}", ratio,
                       torch.cuda.get_device_name())


if __name__ == "__main__":
    sys.exit(main())
