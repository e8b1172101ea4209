"""Ask a VLM about an image; the answer streams with each round's accepted draft tokens highlighted.

The target verifies, a drafter proposes: ViSpec (`mmspec.vision.ViSpecDrafter`, vision-aware), the
text-only ablation (same head, no image adaptor, no global vector), or no drafter at all (target
only, one token per forward, through the same engine so the numbers compare). Every round,
`generate(on_round=...)` reports how many draft tokens the target accepted; the page colours them
and keeps a live tau (tokens per target forward, bonus included) and tokens/s.

    python demos/vlm_chat.py [--port 7860]                       # the zoo VLM (vlm-target)
    python demos/vlm_chat.py --target PATH --drafter PATH [--text-drafter PATH]
                                      # any HF LLaVA / Qwen2.5-VL checkpoint + saved ViSpec drafters
"""

from __future__ import annotations

import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python demos/vlm_chat.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demos.extras import require_demo_extras

require_demo_extras("demos/vlm_chat.py")  # one line naming `.[demo]`, not a ModuleNotFoundError

import gradio as gr
import torch
from PIL import Image, UnidentifiedImageError

from demos.common import parser, run, token_spans, warn
from mmspec import generate, zoo
from mmspec.decoding.draft import Draft
from mmspec.zoo.paths import positive_int
from mmspec.zoo.presets import vlm_inputs

VISPEC, TEXT_ONLY, TARGET_ONLY = "ViSpec", "text-only drafter", "target only"


@dataclass
class Chat:
    """target: a transformers VLM; processor: its processor; drafters: mode name -> drafter.
    image, question: what the page starts with (None: nothing)."""

    target: Any
    processor: Any
    drafters: dict
    image: Path | None = None
    question: str = "Describe the image."
    name: str = "VLM"


class TargetOnly:
    """No draft: every round is one ordinary decoding step of the target."""

    def propose(self, state) -> Draft:
        return Draft.empty(state.input_ids.shape[0], state.input_ids.device)

    def update(self, result) -> None:
        pass


def load_zoo() -> Chat:
    """The zoo VLM (`vlm-target`) with its ViSpec and text-only drafters and sample scene."""
    if "vlm-target" not in zoo.available():
        raise SystemExit("the zoo has no vlm-target yet (assets/zoo/); pass --target PATH "
                         "--drafter PATH for a checkpoint of your own")
    entry = zoo.load("vlm-target")
    drafters = {VISPEC: zoo.load("vlm-vispec", target=entry.model).model,
                TEXT_ONLY: zoo.load("vlm-text-drafter", target=entry.model).model}
    return Chat(entry.model, entry.tokenizer, drafters, entry.path / "sample.png",
                entry.card.get("sample_prompt", "Describe the image."), "zoo vlm-target")


def load_checkpoints(target_path: str, drafter_path: str, text_drafter_path: str | None) -> Chat:
    """Any Hugging Face LLaVA / LLaVA-NeXT / Qwen2.5-VL checkpoint and ViSpec drafters saved with
    `ViSpecDrafter.save_pretrained`; a folder that is missing or holds something else is a
    message naming its flag (SystemExit), not a traceback."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmspec.cli.generate import load_errors, model_folder
    from mmspec.vision import ViSpecDrafter

    target_path = model_folder("--target", target_path)  # a folder, zoo name or hub id
    with load_errors("--target", target_path, "a vision-language model"):
        target = AutoModelForImageTextToText.from_pretrained(target_path,
                                                             dtype=torch.float32).eval()
        processor = AutoProcessor.from_pretrained(target_path)
    drafters = {}
    for flag, mode, path in (("--drafter", VISPEC, drafter_path),
                             ("--text-drafter", TEXT_ONLY, text_drafter_path)):
        if path is None:
            continue
        try:  # a missing folder, another target's drafter, a target ViSpec does not support
            drafters[mode] = ViSpecDrafter.from_pretrained(path, target)
        except (FileNotFoundError, ValueError, TypeError) as err:
            raise SystemExit(f"{flag} {path}: {err}") from None
    return Chat(target, processor, drafters, name=Path(target_path).name)


class _Tokens:
    """A streamer (put/end) that forwards every committed chunk but the prompt to a queue."""

    def __init__(self, events: queue.Queue):
        self.events, self.prompt_seen = events, False

    def put(self, ids: torch.Tensor) -> None:
        if self.prompt_seen:
            self.events.put(("tokens", ids.reshape(-1).tolist()))
        self.prompt_seen = True

    def end(self) -> None:
        pass


def stream_rounds(chat: Chat, image: Image.Image, question: str, mode: str, max_new_tokens: int):
    """Yields (pieces, stats) after every round: pieces are (token ids, kind) with kind
    "accepted" or "bonus"; stats a dict with rounds, tau, tokens_per_s, new_tokens."""
    inputs = vlm_inputs(chat.processor, image, question)
    drafter = TargetOnly() if mode == TARGET_ONLY else chat.drafters[mode]
    events: queue.Queue = queue.Queue()

    def on_round(draft, result, stats):
        accepted = min(int(result.num_accepted[0]), len(result.new_tokens[0]))
        events.put(("round", accepted, stats.mean_accepted))

    def work():
        with torch.no_grad():
            return generate(chat.target, drafter, max_new_tokens=max_new_tokens,
                            streamer=_Tokens(events), on_round=on_round, **inputs)

    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(work)
    future.add_done_callback(lambda f: events.put(("done", f)))
    pool.shutdown(wait=False)
    pieces, pending, tau, rounds = [], None, 1.0, 0
    while True:
        kind, *payload = events.get()
        if kind == "tokens":
            if pending is not None:  # the prefill's token: no round verified it
                pieces.append((pending, "bonus"))
            pending = payload[0]
            continue
        if kind == "round":
            accepted, tau = payload
            pieces += [(pending[:accepted], "accepted"), (pending[accepted:], "bonus")]
            pending, rounds = None, rounds + 1
        if kind == "done":
            tau = payload[0].result().stats.mean_accepted  # re-raises generate's error, if any
            if pending is not None:
                pieces.append((pending, "bonus"))
        new = sum(len(ids) for ids, _ in pieces)
        seconds = time.perf_counter() - start
        yield pieces, {"rounds": rounds, "tau": tau, "tokens_per_s": new / seconds,
                       "new_tokens": new, "done": kind == "done"}
        if kind == "done":
            return


def decode_pieces(tokenizer, pieces) -> list[tuple[str, str]]:
    """(ids, kind) pieces -> (text, kind): each piece's text is what it adds to the decoded
    answer so far (a SentencePiece token decoded alone loses its leading space)."""
    ids, text, out = [], "", []
    for piece, kind in pieces:
        if piece:
            ids += piece
            full = tokenizer.decode(ids, skip_special_tokens=True)
            out.append((full[len(text):], kind))
            text = full
    return out


def read_image(path) -> Image.Image:
    """The uploaded file as RGB, or a ValueError that says what is wrong with it."""
    if path is None:
        raise ValueError("Please upload an image first.")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"Could not read {Path(path).name} as an image: it is not a PNG, JPEG "
                         f"or other format that Pillow reads.") from error


def preview_of(image: Image.Image, at_least: int = 192) -> Image.Image:
    """The image enlarged by a whole factor (nearest) when it is small (the zoo's scenes)."""
    k = max(1, at_least // max(image.size))
    return image.resize((image.width * k, image.height * k), Image.NEAREST) if k > 1 else image


def build_app(chat: Chat | None = None, max_new_tokens: int = 64) -> gr.Blocks:
    """The page; `chat` defaults to the zoo VLM."""
    chat = chat or load_zoo()
    tokenizer = getattr(chat.processor, "tokenizer", chat.processor)
    modes = [m for m in (VISPEC, TEXT_ONLY) if m in chat.drafters] + [TARGET_ONLY]

    def on_ask(path, question, mode, max_new):
        try:
            image = read_image(path)
        except ValueError as error:
            yield gr.skip(), warn(str(error)), gr.skip()
            return
        if not question or not question.strip():
            yield gr.skip(), warn("Please type a question about the image."), gr.skip()
            return
        for pieces, s in stream_rounds(chat, image, question, mode, int(max_new)):
            html = token_spans(decode_pieces(tokenizer, pieces))
            status = "done" if s["done"] else "generating…"
            line = (f"**{mode}**, {status}: {s['new_tokens']} tokens, {s['rounds']} rounds, "
                    f"τ = {s['tau']:.2f} tokens per target forward, "
                    f"{s['tokens_per_s']:.1f} tokens/s")
            yield html, line, preview_of(image)

    def on_upload(path):
        try:
            return preview_of(read_image(path)), ""
        except ValueError as error:
            return None, warn(str(error))

    with gr.Blocks(title="mmspec: ViSpec chat") as app:
        gr.Markdown(f"## Speculative decoding for a VLM ({chat.name})\nThe answer streams round "
                    "by round; green tokens were drafted and accepted by the target, orange ones "
                    "the target produced itself. The output is identical in every mode.")
        with gr.Row():
            with gr.Column(scale=1):
                upload = gr.File(label="Image", file_types=["image"], elem_id="image-file",
                                 value=str(chat.image) if chat.image else None)
                preview = gr.Image(label="preview", interactive=False, height=220,
                                   value=preview_of(read_image(chat.image)) if chat.image
                                   else None)
            with gr.Column(scale=2):
                question = gr.Textbox(value=chat.question, label="Question", elem_id="question")
                mode = gr.Radio(modes, value=modes[0], label="Drafter", elem_id="mode")
                max_new = gr.Slider(8, 256, value=max_new_tokens, step=8, label="max new tokens")
                button = gr.Button("Ask", variant="primary", elem_id="ask")
                status = gr.Markdown(elem_id="status")
                answer = gr.HTML(elem_id="output")
        upload.change(on_upload, upload, [preview, status])
        # one answer at a time: the drafters keep per-call state
        for event in (button.click, question.submit):
            event(on_ask, [upload, question, mode, max_new], [answer, status, preview],
                  concurrency_id="generate", concurrency_limit=1)
    return app


def main(argv=None) -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--target", help="a Hugging Face VLM checkpoint (default: the zoo VLM)")
    ap.add_argument("--drafter", help="a ViSpec drafter saved by ViSpecDrafter.save_pretrained")
    ap.add_argument("--text-drafter", help="optional: the text-only ablation drafter")
    ap.add_argument("--max-new-tokens", type=positive_int, default=64)
    args = ap.parse_args(argv)
    if (args.target is None) != (args.drafter is None):
        ap.error("--target and --drafter go together")
    chat = load_checkpoints(args.target, args.drafter, args.text_drafter) if args.target else None
    run(build_app, args, chat=chat, max_new_tokens=args.max_new_tokens)


if __name__ == "__main__":
    main()
