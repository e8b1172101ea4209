"""What every demo shares: the command line, one torch thread, the launch settings, token display.

Each demo module has `build_app(...) -> gr.Blocks` (what the browser tests launch) and `main()`.
"""

from __future__ import annotations

import argparse
import html
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the demos run offline

import gradio as gr
import torch

from mmspec.zoo.paths import ZOO_DIR, positive_int

from demos.ports import check_port

CSS = """
.tok { border-radius: 3px; padding: 0 1px; }
.tok-prompt { color: #777; }
.tok-accepted { background: #b7e4c7; }
.tok-bonus { background: #ffd8a8; }
.legend span { margin-right: 1em; }
"""


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: local only)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    return ap


def serve(app: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, block: bool = True):
    """Launch `app` on host:port; `block=False` returns at once (tests call `app.close()`)."""
    return app.launch(server_name=host, server_port=port, prevent_thread_lock=not block,
                      quiet=not block, show_error=True, css=CSS, ssr_mode=False,
                      footer_links=[], allowed_paths=[str(ZOO_DIR)])  # sample images


def run(build_app, args: argparse.Namespace, **build_kwargs) -> None:
    check_port(args.host, args.port)  # before the models load, not after
    torch.set_num_threads(args.threads)
    app = build_app(**build_kwargs)
    serve(app, args.host, args.port)


def warn(message: str) -> str:
    """Bad input: a toast (gr.Warning) and the same words for the page's status box."""
    gr.Warning(message)
    return f"⚠️ {message}"


def show_token(text: str) -> str:
    """A token as a readable label: spaces as '·', newlines as '⏎'."""
    return text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def token_spans(pieces: list[tuple[str, str]]) -> str:
    """HTML for (text, kind) pieces, kind in prompt / accepted / bonus, with a legend."""
    body = "".join(f'<span class="tok tok-{kind}">{html.escape(text)}</span>'
                   for text, kind in pieces)
    legend = ('<div class="legend"><span class="tok tok-accepted">accepted draft tokens</span>'
              '<span class="tok tok-bonus">target tokens (bonus / correction)</span></div>')
    return f'{legend}<pre style="white-space: pre-wrap; overflow-wrap: anywhere" id="answer">{body}</pre>'
