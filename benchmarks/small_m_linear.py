"""Experiment (not part of mmspec): how much of the text pair's CPU verification cost is MKL's
small-M sgemm, measured with a weight-streaming fp32 linear (`benchmarks/csrc/small_m_linear.cpp`).

    python benchmarks/small_m_linear.py [--prompts 8] [--repeats 2] [--write]

1. The 43 linears of `text-target` (8.3M parameters, 33 MB in fp32), one pass each at M rows,
   MKL (`F.linear`) against the streaming kernel.
2. End to end on the held-out prompts of `benchmarks/text.py`: target-only greedy and the zoo
   preset's DiffuSpec (CPS + ADL, k in ZOO_DLM_K, prefix cache), once with stock linears and once
   with the kernel on both sides (target and DLM, for rows <= 12), interleaved per prompt, best of
   `--repeats`; every output asserted token-identical to its side's target-only greedy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.dlm_compare import best_of  # noqa: E402
from benchmarks.report import markdown_table, write_section  # noqa: E402
from benchmarks.text import heldout_prompts  # noqa: E402

MAX_ROWS = 12


def build():
    from torch.utils.cpp_extension import load

    load(name="mmspec_small_m_linear", is_python_module=False,
         sources=[str(Path(__file__).parent / "csrc" / "small_m_linear.cpp")],
         extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"])
    return torch.ops.mmspec_small_m


@contextlib.contextmanager
def streamed(ops, *models):
    """Route every fp32 `nn.Linear` of `models` through the kernel for inputs of <= 12 rows."""
    patched, empty = [], torch.empty(0)
    for model in models:
        for mod in model.modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            packed = ops.pack(mod.weight.detach().float())
            bias = empty if mod.bias is None else mod.bias.detach()

            def forward(x, mod=mod, packed=packed, bias=bias):
                rows = x.numel() // mod.in_features
                if rows > MAX_ROWS or x.dtype != torch.float32:
                    return F.linear(x, mod.weight, mod.bias)
                out = ops.skinny_linear(x.reshape(rows, mod.in_features), packed, bias,
                                        mod.out_features)
                return out.reshape(*x.shape[:-1], mod.out_features)

            mod.forward = forward
            patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            del mod.forward


def linear_pass(ops, model, repeats=15):
    """ms for one pass over every linear of `model` at M rows: {M: (MKL, kernel)}."""
    lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    packed = [ops.pack(m.weight.detach()) for m in lins]
    empty = torch.empty(0)
    out = {}
    for rows in (1, 2, 5, 8, 11):
        xs = {m.in_features: torch.randn(rows, m.in_features) for m in lins}
        for m, pk in zip(lins, packed):  # the kernel agrees with MKL
            x = xs[m.in_features]
            torch.testing.assert_close(
                ops.skinny_linear(x, pk, empty if m.bias is None else m.bias, m.out_features),
                F.linear(x, m.weight, m.bias), atol=1e-4, rtol=1e-4)
        times = []
        for use_kernel in (False, True):
            ts = []
            for _ in range(repeats):
                start = time.perf_counter()
                for m, pk in zip(lins, packed):
                    x = xs[m.in_features]
                    if use_kernel:
                        ops.skinny_linear(x, pk, empty if m.bias is None else m.bias,
                                          m.out_features)
                    else:
                        F.linear(x, m.weight, m.bias)
                ts.append(time.perf_counter() - start)
            times.append(sorted(ts)[len(ts) // 2] * 1e3)
        out[rows] = tuple(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from mmspec.decoding import generate
    from mmspec.zoo.presets import text_preset
    from mmspec.zoo.registry import ZOO_DLM_K

    ops = build()
    preset = text_preset()
    target, eos, dlm = preset.target, preset.eos_token_id, preset.extras["dlm"]
    load_start = os.getloadavg()[0]
    passes = linear_pass(ops, target)
    prompts = heldout_prompts(preset.tokenizer, args.prompts, 256, args.new_tokens)

    totals = {}  # (linears, method) -> [seconds, tokens committed, rounds]
    with torch.no_grad():
        for prompt in prompts:
            for linears, ctx in (("MKL", contextlib.nullcontext),
                                 ("streaming kernel", lambda: streamed(ops, target, dlm.model))):
                with ctx():
                    ref_s, ref = best_of(args.repeats, lambda: target.generate(
                        prompt.ids, max_new_tokens=args.new_tokens, do_sample=False,
                        eos_token_id=eos, pad_token_id=eos))
                    spec_s, out = best_of(args.repeats, lambda: generate(
                        target, preset.drafters["diffusion"](), prompt.ids,
                        max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=eos))
                if not torch.equal(out.sequences, ref):
                    raise AssertionError(f"{linears}: DiffuSpec differs from target-only greedy "
                                         f"on {prompt.file}")
                totals.setdefault((linears, "target-only"), [0.0, 0, 0])[0] += ref_s
                t = totals.setdefault((linears, "DiffuSpec"), [0.0, 0, 0])
                t[0] += spec_s
                t[1] += out.stats.committed
                t[2] += out.stats.row_rounds
    base = totals["MKL", "target-only"][0]
    rows = []
    for linears in ("MKL", "streaming kernel"):
        ref_s = totals[linears, "target-only"][0]
        spec_s, acc, rounds = totals[linears, "DiffuSpec"]
        rows.append([linears, f"{ref_s:.2f}", f"{spec_s:.2f}", f"{acc / rounds:.2f}",
                     f"**{ref_s / spec_s:.2f}x**", f"{base / spec_s:.2f}x"])
    pass_rows = [[m, f"{mkl:.2f}", f"{kern:.2f}", f"{mkl / kern:.2f}x"]
                 for m, (mkl, kern) in passes.items()]
    body = (
        "Experiment, not shipped: mmspec does not use this kernel. It measures how much of the "
        "text pair's CPU verification cost is MKL's small-M sgemm (see the text section's "
        "reading).\n\n"
        f"**1. The 43 linears of `text-target`** (8.3M parameters, 33 MB fp32), one pass at M "
        f"rows, median of 15, ms:\n\n"
        + markdown_table(["M rows", "MKL `F.linear`", "streaming kernel", "ratio"], pass_rows)
        + f"\n\n**2. End to end**, {len(prompts)} held-out prompts of 256 tokens (as "
        f"`benchmarks/text.py`), {args.new_tokens} new tokens, best of {args.repeats}, the zoo "
        f"preset's DiffuSpec (CPS + ADL k in [{ZOO_DLM_K[0]}, {ZOO_DLM_K[1]}], prefix cache); "
        f"'streaming kernel' runs target-only and DiffuSpec with the kernel for every linear of "
        f"the target and the DLM at <= {MAX_ROWS} rows (prefill stays on MKL). All outputs "
        f"token-identical to their side's target-only greedy. {args.threads} thread(s); load "
        f"average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.\n\n"
        + markdown_table(["linears", "target-only s", "DiffuSpec s", "τ",
                          "DiffuSpec speedup (same linears)", "vs stock target-only"], rows)
        + "\n")
    print(body)
    if args.write:
        write_section("small_m_linear", "Text pair: MKL's small-M sgemm against a weight-"
                      "streaming kernel (`benchmarks/small_m_linear.py`, experiment)", body)


if __name__ == "__main__":
    main()
