"""`generate`: lossless speculative decoding for any Hugging Face causal LM or VLM.

One round (Leviathan et al. 2023, tree verification as in SpecInfer / EAGLE-2):

    draft   = drafter.propose(state)                  # a tree below each row's last token
    logits  = target(root + draft nodes, tree mask)   # one forward, shared block-sparse layer
    path    = verify(draft, logits)                   # greedy match or rejection sampling
    commit(path): gather its KV entries, append the tokens and the target's bonus token
    drafter.update(result)

The target stays an unmodified transformers model: the prompt goes through its own
`prepare_inputs_for_generation` (so `pixel_values`, `image_grid_thw`, M-RoPE positions work as in
`model.generate`), and every tree verification forward passes `block_sparse_mask=` to the attention
function `mmspec_block_sparse` (`mmspec.kernels.register_hf_attention`), which `generate` switches
the target to for the call (it is transformers' SDPA when no mask is passed, as for chains).

Batches: rows are left-padded and each row accepts its own number of tokens, so the KV cache and
the token slots get *holes* that the mask hides (`rows.py` has a worked example); no row waits
for another.

The path of a call: `generate` resolves its arguments (`settings.resolve_call`) and checks the
drafter (`draft.as_drafter`); `run` picks the verifier (`compile=`: `verifier.DynamicVerifier` or
`static.StaticVerifier`), admits the target and runs the loop (`loop.decode`) inside the target's
attention switch.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from mmspec.kernels.hf import use_block_sparse_attention

from .draft import Drafter, as_drafter
from .loop import LoopOptions, SpecOutput, decode
from .positions import engine_positions
from .settings import check_inputs, resolve_call, sampling_processors
from .static import StaticVerifier, check_compile
from .verifier import DynamicVerifier, Verifier
from .windows import sliding_windows

__all__ = ["SpecOutput", "generate", "run"]


@contextmanager
def block_sparse_attention_of(model):
    """Route the model's attention through mmspec's layer for the duration of the block."""
    restore = use_block_sparse_attention(model)
    try:
        yield
    finally:
        restore()


def generate(target, drafter, input_ids=None, generation_config=None, streamer=None,
             generator=None, on_round=None, profile=False, compile=False,
             **kwargs) -> SpecOutput:
    """Speculative decoding with `drafter`; output distributed exactly as `target.generate`'s.

    Args:
        target: a transformers causal LM or VLM (`...ForCausalLM`, `...ForConditionalGeneration`).
        drafter: a `Drafter` (`draft.py`, docs/drafters.md), or any object with
            `propose(DraftState) -> Draft` and `update(VerifyResult)`.
        input_ids: long `[B, L]`, left-padded when B > 1.
        generation_config: a transformers `GenerationConfig`, as in `target.generate`: its set
            fields over the target's generation config; keyword settings go over both.
        streamer: a transformers `TextStreamer` / `TextIteratorStreamer` (batch 1).
        generator: optional `torch.Generator` for the sampling draws.
        on_round: optional `on_round(draft, result, stats)`, called after every round with the
            round's `Draft`, its `VerifyResult` and the running `SpecStats` (to watch a call
            round by round, e.g. in a demo; the drafter has already seen `result`).
        profile: time the phases in `stats` with CUDA events (read once, after the call) on a
            CUDA device; otherwise they are wall time, which on a GPU counts launches, not
            kernels (no round waits for the device only to time it; `stats.total_time` does
            wait, once).
        compile: True keeps the target's KV in a transformers `StaticCache` and runs every
            verification forward in one shape, `torch.compile`d (`dynamic=False`; CUDA graphs
            through `mode="reduce-overhead"` on a GPU); a transformers `CompileConfig` sets the
            compilation itself. Off by default: compiling costs seconds to minutes at the first
            call of each shape, which only long GPU runs earn back. Targets whose cache cannot be
            static are refused before the first token (`static.py`).
        **kwargs: as in `target.generate`:
            `attention_mask`: `[B, L]`, 0 on padding; None means no padding (or, with a pad id
            in the prompt that is not an EOS id, padding there, as transformers reads it).
            Generation settings, the fields of `GenerationConfig`: `max_new_tokens` (new tokens
            per row, at most; 32 when neither the call nor `generation_config` sets it);
            `do_sample`, `temperature`, `top_k`, `top_p`, `repetition_penalty` (None: the
            generation config's, then transformers' defaults, exactly as `target.generate`
            resolves them); `eos_token_id` (an int or a list; `[]` stops on no token; given, it
            also overrides a drafter's own EOS ids, `DraftState.eos_token_id`); `pad_token_id`
            (fills rows after their EOS; None: the generation config's, then the first EOS id).
            A setting `generate` does not apply (`no_repeat_ngram_size=`, `num_beams=`, ...)
            raises a ValueError instead of silently changing the output.
            Model inputs for the prefill (`pixel_values`, `image_grid_thw`, ...); a name the
            model does not take is an error naming it.
    """
    call = resolve_call(target, input_ids, generation_config, kwargs)
    drafter = as_drafter(drafter)
    check_inputs(target, drafter, input_ids, call.attention_mask, call.max_new_tokens,
                 call.pad_token_id)
    drafter.check_inputs(call.model_kwargs)  # a drafter that knows its target's inputs (ViSpec)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer needs a batch of 1 row, got {input_ids.shape[0]}")
    attention_mask = (torch.ones_like(input_ids) if call.attention_mask is None
                      else call.attention_mask)
    compile_config = check_compile(compile)
    options = LoopOptions(
        rule=sampling_processors(call.sampling, attention_mask), eos=call.eos,
        pad=0 if call.pad_token_id is None else call.pad_token_id, asked_eos=call.asked_eos,
        sampling=call.sampling if call.sampling.do_sample else None, streamer=streamer,
        generator=generator, on_round=on_round, profile=profile)
    prompt = {"input_ids": input_ids, "attention_mask": attention_mask,
              "model_kwargs": call.model_kwargs}
    return run(target, drafter, prompt, call.max_new_tokens, options, compile_config)


def make_verifier(target, windows: tuple, compile_config) -> Verifier:
    """`compile=`'s one effect on the engine: which verifier runs the target."""
    if compile_config is None:
        return DynamicVerifier(target, windows)
    return StaticVerifier(target, windows, compile_config)


def run(target, drafter: Drafter, prompt: dict, max_new_tokens: int, options: LoopOptions,
        compile_config=None) -> SpecOutput:
    """The checked call's admission, the target's attention switch and the drafter's `end()`
    around the loop; shared by `generate` and `speculative` (`hf_generate.py`). `prompt`:
    `input_ids`, `attention_mask` (long `[B, L]`) and `model_kwargs`; `compile_config`: a
    transformers `CompileConfig` for `compile=True` (`static.py`), else None."""
    input_ids, attention_mask = prompt["input_ids"], prompt["attention_mask"]
    verifier = make_verifier(target, sliding_windows(target), compile_config)
    with engine_positions(target):  # the BART family: the engine's positions, not cache slots
        verifier.admit(drafter, input_ids, attention_mask, max_new_tokens)
        with block_sparse_attention_of(target), torch.no_grad():
            try:
                verifier.open(input_ids.shape[1], max_new_tokens)
                prompt = {**prompt, "attention_mask": attention_mask.long()}
                return decode(target, drafter, verifier, prompt, max_new_tokens, options)
            except IndexError as err:  # a learned position table (GPT-2, OPT) past its end
                _refuse_past_positions(target, input_ids.shape[1], max_new_tokens, err)
                raise
            finally:  # inside the target's switch: a drafter sharing the model restores it first
                drafter.end()


def _refuse_past_positions(target, prompt_len: int, max_new_tokens: int, err) -> None:
    """After an IndexError: a ValueError naming the position limit when the call went past it."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") \
        else target.config
    for name in ("n_positions", "max_position_embeddings"):
        limit = getattr(config, name, None)
        # the last new token is never fed back: prompt + max_new_tokens - 1 positions are read
        if isinstance(limit, int) and prompt_len + max_new_tokens - 1 > limit:
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: the prompt ({prompt_len} tokens) and the "
                f"new tokens fed back need {prompt_len + max_new_tokens - 1} positions, past "
                f"the target's {name}={limit}, where its positions ran out ({err}); ask for "
                f"at most {max(limit - prompt_len + 1, 0)} new tokens") from err
