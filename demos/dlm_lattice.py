"""DiffuSpec, round by round: the diffusion drafter's lattice, the CPS path, what was accepted, ADL.

A prompt goes to the zoo text pair (`text-target` verifies, `text-dlm` drafts with
`DiffusionDrafter`). Every round, `generate(on_round=...)` hands over the draft and the verdict,
and the drafter's inspectable state gives the lattice (`drafter.lattice`, one bidirectional DLM
forward over `[prefix, MASK x k]`), the CPS path (`drafter.paths`) and ADL's L_gen
(`drafter.generated`). The page shows, for a selected round, the top candidates per block position
(heat-map and table) with the CPS path against the argmax path, and over all rounds the block
length k, L_gen and the accepted length (DiffuSpec §3.2-3.4, arXiv 2510.02358).

    python demos/dlm_lattice.py [--port 7860]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):  # `python demos/dlm_lattice.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demos.extras import require_demo_extras

require_demo_extras("demos/dlm_lattice.py")  # one line naming `.[demo]`, not a ModuleNotFoundError

import matplotlib

matplotlib.use("Agg")
import gradio as gr
import matplotlib.pyplot as plt
import pandas as pd
import torch

from demos.common import parser, run, show_token, token_spans, warn
from mmspec import generate, zoo
from mmspec.diffusion import DiffusionDrafter, DiffusionDrafterConfig

TOP = 5  # candidates shown per block position
NO_DRAFT = "no draft: one token of budget was left, so the target committed it alone"
MODES = ("CPS + ADL", "CPS, fixed k", "argmax path, fixed k (naive)")
EXAMPLE = ("import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n\n\n"
           "class Path:\n    def __init__(self, name):\n")


@dataclass
class RoundView:
    """One round of batch row 0, as ids and floats (no tensors kept)."""

    k: int  # block length of this round
    generated: int  # ADL's L_gen: raw argmax draft tokens before its first EOS
    top_ids: list  # [k][TOP] lattice candidates per position, best first
    top_probs: list  # [k][TOP]
    argmax: list  # [k] argmax token per position (the naive path)
    path: list  # the drafted path (CPS, or argmax through the first EOS)
    path_probs: list  # lattice probability of each path token
    path_ranks: list  # 1-based rank of each path token in its position's lattice row
    accepted: int  # draft tokens the target accepted
    committed: list  # tokens committed: accepted ones then the target's bonus token
    argmax_accepted: int = 0  # what the argmax path would have had accepted this round


@dataclass
class Decoding:
    prompt_ids: list
    first: int  # the prefill's token
    rounds: list
    stats: object  # SpecStats


def load_pair():
    """-> (text-target ZooModel, text-dlm ZooModel)."""
    return zoo.load("text-target"), zoo.load("text-dlm")


def make_drafter(target, dlm, mode: str, k: int) -> DiffusionDrafter:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    fixed_k = None if mode == MODES[0] else k
    config = DiffusionDrafterConfig(shift=dlm.shift, fixed_k=fixed_k)
    if mode == MODES[2]:
        config = replace(config, cps=None)
    return DiffusionDrafter(dlm.model, dlm.mask_token_id, target.model, config=config)


def decode(target, dlm, prompt: str, max_new_tokens: int, mode: str, k: int = 20) -> Decoding:
    """Greedy speculative decoding of `prompt`, recording every round's lattice and verdict."""
    ids = target.tokenizer(prompt, return_tensors="pt").input_ids  # [1, P]
    drafter = make_drafter(target, dlm, mode, k)
    rounds = []

    def on_round(draft, result, stats):
        new = result.new_tokens[0].tolist()
        if draft.tokens.shape[1] == 0:  # one token of budget left: no draft, only the bonus
            rounds.append(RoundView(k=0, generated=0, top_ids=[], top_probs=[], argmax=[],
                                    path=[], path_probs=[], path_ranks=[], accepted=0,
                                    committed=new))
            return
        logprobs = drafter.lattice.logprobs[0, : int(drafter.lattice.lengths[0])]  # [k, V]
        top = logprobs.topk(TOP, dim=-1)
        path = drafter.paths[0][0]
        path_lp = logprobs[torch.arange(len(path)), torch.tensor(path, dtype=torch.long)]
        ranks = (logprobs[: len(path)] > path_lp[:, None]).sum(-1) + 1
        rounds.append(RoundView(
            k=logprobs.shape[0], generated=drafter.generated[0], top_ids=top.indices.tolist(),
            top_probs=top.values.exp().tolist(), argmax=logprobs.argmax(-1).tolist(), path=path,
            path_probs=path_lp.exp().tolist(), path_ranks=ranks.tolist(),
            accepted=min(int(result.num_accepted[0]), len(new)), committed=new))

    with torch.no_grad():
        out = generate(target.model, drafter, ids, max_new_tokens=max_new_tokens,
                       on_round=on_round)
    answer = out.sequences[0, ids.shape[1]:].tolist()
    start = 1  # the prefill's token, then every round's committed tokens
    for r in rounds:
        # greedy decoding is lossless: `answer` is the target's own continuation, so a path is
        # accepted up to its first token that differs from it
        r.argmax_accepted = common_prefix(r.argmax, answer[start:])
        start += len(r.committed)
    return Decoding(ids[0].tolist(), answer[0], rounds, out.stats)


def common_prefix(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# ------------------------------------------------------------------------------------- views

def answer_html(tokenizer, dec: Decoding) -> str:
    pieces = [(tokenizer.decode(dec.prompt_ids), "prompt"), (tokenizer.decode([dec.first]), "bonus")]
    for r in dec.rounds:
        if r.accepted:
            pieces.append((tokenizer.decode(r.committed[: r.accepted]), "accepted"))
        if len(r.committed) > r.accepted:
            pieces.append((tokenizer.decode(r.committed[r.accepted:]), "bonus"))
    return token_spans(pieces)


def summary(dec: Decoding, mode: str) -> str:
    s = dec.stats
    return (f"**{mode}**: {s.new_tokens} tokens in {s.total_time:.2f} s "
            f"({s.tokens_per_s:.1f} tok/s), {s.rounds} rounds, "
            f"τ = {s.mean_accepted:.2f} tokens per target forward "
            f"({s.mean_accepted_no_bonus:.2f} accepted draft tokens per round), "
            f"accepted {s.accepted} of {s.drafted} drafted. The argmax path of the same "
            f"lattices would have had {sum(r.argmax_accepted for r in dec.rounds)} accepted.")


def _verdict(r: RoundView, i: int) -> str:
    if i >= len(r.path):
        return "not drafted"
    if i < r.accepted:
        return "accepted"
    return "rejected" if i == r.accepted else "after rejection"


TABLE_COLUMNS = ["pos", "verdict", "drafted", "argmax", *(f"top {j + 1}" for j in range(TOP))]


def lattice_table(tokenizer, r: RoundView) -> pd.DataFrame:
    """One row per block position: verdict, CPS/drafted token, argmax token, top candidates (no
    row for a round without a draft, the columns all the same)."""
    word = lambda t: show_token(tokenizer.decode([t]))
    rows = []
    for i in range(r.k):
        row = {"pos": i, "verdict": _verdict(r, i),
               "drafted": f"{word(r.path[i])} ({r.path_probs[i]:.2f}, #{r.path_ranks[i]})"
               if i < len(r.path) else "",
               "argmax": word(r.argmax[i])}
        for j in range(TOP):
            row[f"top {j + 1}"] = f"{word(r.top_ids[i][j])} {r.top_probs[i][j]:.2f}"
        rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def lattice_figure(tokenizer, r: RoundView, title: str):
    """Heat-map [TOP x k] of candidate probabilities; drafted-path cells boxed (green: accepted,
    red: the rejected one, grey: after it). A round without a draft (k = 0) says so instead."""
    fig, ax = plt.subplots(figsize=(max(6.0, 0.62 * r.k + 1.5), 3.4), dpi=90)
    if r.k == 0:  # no lattice to show (imshow refuses an empty [TOP, 0] image)
        ax.text(0.5, 0.5, NO_DRAFT, ha="center", va="center", fontsize=9)
        ax.set_axis_off()
        ax.set_title(title, fontsize=9)
        return fig
    probs = torch.tensor(r.top_probs).T.numpy()  # [TOP, k]
    im = ax.imshow(probs, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(r.k):
        for j in range(TOP):
            label = show_token(tokenizer.decode([r.top_ids[i][j]]))[:6]
            ax.text(i, j, label, ha="center", va="center", fontsize=7,
                    color="white" if r.top_probs[i][j] > 0.6 else "black")
    colors = {"accepted": "#2b8a3e", "rejected": "#e03131", "after rejection": "#868e96"}
    for i, token in enumerate(r.path):
        j = r.path_ranks[i] - 1
        if j < TOP:
            ax.add_patch(plt.Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, lw=2,
                                       edgecolor=colors[_verdict(r, i)]))
    off = [i for i in range(len(r.path)) if r.path_ranks[i] > TOP]
    ax.set_xticks(range(r.k))
    ax.set_xticklabels([f"{i}" + ("*" if i in off else "") for i in range(r.k)], fontsize=7)
    ax.set_yticks(range(TOP))
    ax.set_yticklabels([f"top {j + 1}" for j in range(TOP)], fontsize=8)
    ax.set_xlabel("block position (boxed: drafted path, green accepted, red rejected; the top 1 "
                  "row is the argmax path; * drafted token below top 5)", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01, label="DLM probability")
    fig.tight_layout()
    return fig


def round_view(tokenizer, dec: Decoding, index: int):
    """-> (title, lattice plot, table) of round `index` (1-based, clamped to the rounds: the
    slider needs a maximum >= 2 and its number box takes any number)."""
    index = min(max(int(index), 1), len(dec.rounds))
    r = dec.rounds[index - 1]
    if r.k == 0:
        title = f"round {index} of {len(dec.rounds)}: k = 0, {NO_DRAFT}"
    else:
        title = (f"round {index} of {len(dec.rounds)}: k = {r.k}, drafted {len(r.path)}, "
                 f"accepted {r.accepted} (argmax path: {r.argmax_accepted}), "
                 f"L_gen = {r.generated}")
    return f"**{title}**", lattice_figure(tokenizer, r, title), lattice_table(tokenizer, r)


def adl_figure(dec: Decoding):
    """Block length k, ADL's L_gen and the accepted length, per round."""
    x = list(range(1, len(dec.rounds) + 1))
    fig, ax = plt.subplots(figsize=(7, 3), dpi=90)
    ax.step(x, [r.k for r in dec.rounds], where="mid", label="block length k", color="#1971c2")
    ax.plot(x, [r.generated for r in dec.rounds], "o--", ms=3, label="L_gen (raw draft before EOS)",
            color="#868e96")
    ax.bar(x, [r.accepted for r in dec.rounds], color="#2b8a3e", alpha=0.6,
           label="accepted draft tokens")
    ax.set_xlabel("round")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("ADL: draft length over time", fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------- app

def build_app(target=None, dlm=None) -> gr.Blocks:
    """The page; `target`, `dlm` default to the zoo text pair."""
    if target is None or dlm is None:
        target, dlm = load_pair()
    tokenizer = target.tokenizer

    def on_run(prompt, max_new_tokens, mode, k):
        """-> answer, status, ADL plot, state, round slider, round title, lattice plot, table."""
        if not prompt or not prompt.strip():
            message = warn("Please enter a prompt (the text pair was trained on Python source).")
            return gr.skip(), message, *[gr.skip()] * 6
        dec = decode(target, dlm, prompt, int(max_new_tokens), mode, int(k))
        if not dec.rounds:
            message = warn("The target stopped right after the prompt: no draft rounds to show.")
            return gr.skip(), message, *[gr.skip()] * 6
        slider = gr.Slider(minimum=1, maximum=max(2, len(dec.rounds)), value=1, step=1,
                           interactive=True)
        return (answer_html(tokenizer, dec), summary(dec, mode), adl_figure(dec), dec, slider,
                *round_view(tokenizer, dec, 1))

    def show_round(dec, index):
        """-> round title, lattice plot, table."""
        if dec is None:
            return gr.skip(), gr.skip(), gr.skip()
        return round_view(tokenizer, dec, index)

    with gr.Blocks(title="mmspec: DiffuSpec lattice") as app:
        gr.Markdown("## DiffuSpec round by round\nA diffusion LM (`text-dlm`) drafts a block in "
                    "one forward; causal path search (CPS) picks a path through its lattice; the "
                    "target (`text-target`) verifies it; adaptive draft length (ADL) sets the next "
                    "block length.")
        state = gr.State(None)
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(value=EXAMPLE, lines=8, label="Prompt (Python source)",
                                    elem_id="prompt")
            with gr.Column(scale=1):
                mode = gr.Radio(list(MODES), value=MODES[0], label="Drafter")
                k = gr.Slider(4, 30, value=20, step=1, label="k (fixed-k modes)")
                max_new = gr.Slider(8, 256, value=64, step=8, label="max new tokens")
                button = gr.Button("Generate", variant="primary", elem_id="run")
        summary_box = gr.Markdown(elem_id="summary")
        answer = gr.HTML(label="Output", elem_id="output")
        adl_plot = gr.Plot(label="ADL", elem_id="adl")
        round_slider = gr.Slider(1, 2, value=1, step=1, label="round", interactive=False,
                                 elem_id="round")
        round_title = gr.Markdown(elem_id="round-title")
        lattice_plot = gr.Plot(label="lattice", elem_id="lattice")
        table = gr.Dataframe(label="lattice, top candidates per block position", elem_id="table",
                             wrap=True)
        button.click(on_run, [prompt, max_new, mode, k],
                     [answer, summary_box, adl_plot, state, round_slider, round_title,
                      lattice_plot, table])
        round_slider.change(show_round, [state, round_slider], [round_title, lattice_plot, table])
    return app


def main(argv=None) -> None:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    run(build_app, args)


if __name__ == "__main__":
    main()
