"""Streaming through transformers' `TextStreamer` and `TextIteratorStreamer`."""

from threading import Thread

import torch
from spec_helpers import OracleDrafter, tiny_llama
from transformers import TextIteratorStreamer, TextStreamer

from mmspec import generate


class WordTokenizer:
    """The one method the streamers use: decode ids to words `t<id>`."""

    def decode(self, ids, **kwargs):
        return "".join(f" t{i}" for i in ids)


def _case():
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    ref = target.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=[])
    drafter = OracleDrafter(ref[:, ids.shape[1]:], [ids.shape[1]], 4, "perfect")
    return target, ids, ref, drafter


def test_text_streamer_prints_the_new_tokens(capsys):
    target, ids, ref, drafter = _case()
    streamer = TextStreamer(WordTokenizer(), skip_prompt=True)
    out = generate(target, drafter, ids, max_new_tokens=12, eos_token_id=[], streamer=streamer)
    printed = capsys.readouterr().out
    assert torch.equal(out.sequences, ref)
    assert printed.strip() == WordTokenizer().decode(ref[0, ids.shape[1]:].tolist()).strip()


def test_text_iterator_streamer_yields_while_generating():
    target, ids, ref, drafter = _case()
    streamer = TextIteratorStreamer(WordTokenizer(), skip_prompt=True)
    thread = Thread(target=generate, args=(target, drafter, ids),
                    kwargs={"max_new_tokens": 12, "eos_token_id": [], "streamer": streamer})
    thread.start()
    chunks = list(streamer)
    thread.join()
    assert "".join(chunks).strip() == WordTokenizer().decode(ref[0, ids.shape[1]:].tolist()).strip()
    assert len(chunks) >= 3  # several rounds, several pieces
