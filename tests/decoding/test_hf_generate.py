"""`target.generate(custom_generate=mmspec.speculative(drafter))`: transformers' own settings,
processors and stopping criteria applied to speculative rounds give `target.generate`'s output
(greedy: equal; sampled: the same joint distribution, chi-square)."""

import pytest
import torch
from spec_helpers import PAD, tiny_llama
from test_sampling import P_MIN, _chi2
from transformers import StoppingCriteriaList, StopStringCriteria
from transformers.generation.streamers import BaseStreamer

import mmspec
from mmspec.decoding.processors import NodeProcessors

IDS = torch.tensor([[PAD, PAD, 5, 9, 11, 4], [12, 7, 30, 5, 9, 8]])
MASK = (IDS != PAD).long()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def plain(target):
    """The greedy continuation without settings: settings below are chosen to change it."""
    return target.generate(IDS, attention_mask=MASK, max_new_tokens=16, do_sample=False)[:, 6:]


def _settings(plain):
    a, b, c = (int(t) for t in plain[0, :3])
    return {
        "repetition_penalty": {"repetition_penalty": 1.8},
        "no_repeat_ngram": {"no_repeat_ngram_size": 2},
        "bad_words": {"bad_words_ids": [[b], [int(plain[1, 0]), int(plain[1, 1])]]},
        "sequence_bias": {"sequence_bias": {(a, b): -10.0, (c,): 0.5}},
        "suppress": {"suppress_tokens": [a], "begin_suppress_tokens": [int(plain[1, 0])]},
        "eos_list": {"eos_token_id": [c, int(plain[1, 4])]},
        "min_new_tokens": {"eos_token_id": [c, int(plain[1, 4])], "min_new_tokens": 6},
        "min_length": {"eos_token_id": [b], "min_length": 10},
        "forced_eos": {"forced_eos_token_id": 3, "eos_token_id": 3},
        "decay": {"eos_token_id": [60], "exponential_decay_length_penalty": (2, 3.0)},
    }


@pytest.mark.parametrize("name", ["repetition_penalty", "no_repeat_ngram", "bad_words",
                                  "sequence_bias", "suppress", "eos_list", "min_new_tokens",
                                  "min_length", "forced_eos", "decay"])
def test_greedy_settings_equal_target_generate(target, plain, name):
    setting = _settings(plain)[name]
    kwargs = dict(attention_mask=MASK, max_new_tokens=16, do_sample=False, pad_token_id=PAD)
    expected = target.generate(IDS, **kwargs, **setting)
    assert not torch.equal(expected[:, 6:], plain[:, : expected.shape[1] - 6]) or \
        expected.shape[1] != plain.shape[1] + 6, "the setting must change the output"
    for drafter in (mmspec.ModelDrafter(target, 4), mmspec.ModelDrafter(target, 6, top_k=2, depth=3)):
        spec = mmspec.speculative(drafter)
        out = target.generate(IDS, **kwargs, **setting, custom_generate=spec)
        assert torch.equal(out, expected), (name, drafter.top_k)
        # the tiny target's logits are nearly flat, so a bias can leave the drafter (the target
        # without the setting) no accepted token: rounds still verify drafts
        assert spec.stats.drafted > 0


def test_stop_strings_stop_where_target_generate_stops():
    from mmspec.zoo.training.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat. the dog ate the hat; a cat, a dog."] * 4,
                          vocab_size=280)
    model = tiny_llama(0, vocab=len(tok))
    ids = torch.tensor([[60, 61, 62, 70]])
    free = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)
    pieces = [tok.decode(free[0, i: i + n]) for n in (2, 1) for i in range(10, free.shape[1] - 2)]
    stop = next(p for p in pieces if p.isascii() and p.isprintable() and p.strip())
    expected = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None,
                              stop_strings=[stop], tokenizer=tok)
    assert expected.shape[1] < free.shape[1]
    # transformers 5.24 hands a custom_generate callable no tokenizer: the criterion by hand
    criteria = StoppingCriteriaList([StopStringCriteria(tok, [stop])])
    for drafter in (mmspec.ModelDrafter(model, 4), mmspec.ModelDrafter(model, 6, top_k=2, depth=3)):
        out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None,
                             stopping_criteria=criteria, custom_generate=mmspec.speculative(drafter))
        assert torch.equal(out, expected)


def test_the_streamer_gets_the_prompt_then_every_new_token(target):
    class Collect(BaseStreamer):
        def __init__(self):
            self.parts, self.ended = [], False

        def put(self, value):
            self.parts.append(value.flatten().tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    ids = IDS[1:]
    out = target.generate(ids, max_new_tokens=12, do_sample=False, streamer=streamer,
                          custom_generate=mmspec.speculative(mmspec.ModelDrafter(target, 4)))
    assert streamer.parts[0] == ids[0].tolist() and streamer.ended
    assert sum(streamer.parts[1:], []) == out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("setting,reason", [
    ({"num_beams": 2}, "beam search keeps"),
    ({"guidance_scale": 1.5}, "classifier-free guidance"),
    ({"penalty_alpha": 0.6, "top_k": 4}, "contrastive search"),
    ({"output_scores": True, "return_dict_in_generate": True}, "not per-step scores"),
])
def test_settings_that_cannot_be_exact_are_refused_with_their_reason(target, setting, reason):
    with pytest.raises(ValueError, match=reason):
        target.generate(IDS[1:], max_new_tokens=4, **setting,
                        custom_generate=mmspec.speculative(mmspec.ModelDrafter(target, 2)),
                        trust_remote_code=True)


def _processors(model, prompt, **setting):
    """The LogitsProcessorList transformers builds for `setting` (caught at custom_generate)."""
    caught = {}

    def catch(model, input_ids, logits_processor, **kwargs):
        caught["procs"] = logits_processor
        return input_ids

    model.generate(prompt, max_new_tokens=3, custom_generate=catch, **setting)
    return caught["procs"]


@pytest.mark.parametrize("setting,tree", [
    ({"do_sample": True, "temperature": 0.8, "top_k": 4, "min_p": 0.05, "top_p": 0.95}, True),
    ({"do_sample": True, "typical_p": 0.9, "repetition_penalty": 2.0, "top_k": 0,
      "epsilon_cutoff": 3e-3}, False),
])
def test_sampling_draws_from_the_target_joint(setting, tree):
    """3 new tokens for 5000 identical rows of a 5-token vocabulary: their joint vs the exact one,
    enumerated with the processors transformers builds for the same settings."""
    vocab, new, rows = 5, 3, 5000
    model = tiny_llama(0, vocab=vocab)
    model.lm_head.weight.data *= 20.0  # peaked: a missing processor shows
    prompt = torch.tensor([[1, 3, 3, 4]])
    procs = _processors(model, prompt, eos_token_id=None, pad_token_id=0, **setting)
    assert len(procs) >= 3
    joint, seqs = torch.ones(1), prompt
    with torch.no_grad():
        for _ in range(new):
            scores = procs(seqs, model(seqs).logits[:, -1].float())
            joint = (joint[:, None] * scores.softmax(-1)).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(vocab, 0),
                              torch.arange(vocab).repeat(seqs.shape[0])[:, None]], 1)
    drafter = (mmspec.ModelDrafter(tiny_llama(1, vocab=vocab), 4, top_k=2, depth=2) if tree
               else mmspec.ModelDrafter(tiny_llama(1, vocab=vocab), 3))
    spec = mmspec.speculative(drafter)
    out = model.generate(prompt.expand(rows, -1), max_new_tokens=new, eos_token_id=None,
                         pad_token_id=0, custom_generate=spec,
                         generator=torch.Generator().manual_seed(0), **setting)
    assert 0 < spec.stats.accepted < spec.stats.drafted
    cells = (out[:, -new:] * vocab ** torch.arange(new - 1, -1, -1)).sum(-1)
    assert _chi2(torch.bincount(cells, minlength=vocab ** new), joint) > P_MIN


def _tree_of_four():
    """root 0, then 1 <- 0, 2 <- 1, 3 <- 0 (a sibling branch): depth `[2, 4]`, anc `[2, 4, 4]`."""
    parents = [-1, 0, 1, 0]
    depth = torch.tensor([[0, 1, 2, 1]] * 2)
    anc = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(4):
        j = i
        while j >= 0:
            anc[i, j], j = True, parents[j]
    return depth, anc.expand(2, -1, -1)


def test_each_tree_node_is_processed_with_its_own_path_as_prefix():
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    torch.manual_seed(0)
    vocab = 12
    seq = torch.tensor([[3, 3, 5, 0, 0, 0, 0], [0, 7, 1, 4, 0, 0, 0]])  # committed: 3 and 4 long
    tokens = torch.tensor([[5, 8, 9, 2], [4, 2, 2, 11]])
    depth, anc = _tree_of_four()
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.7),
                                 NoRepeatNGramLogitsProcessor(2)])
    logits = torch.randn(2, 4, vocab)
    lengths = [[3 + d for d in (0, 1, 2, 1)], [4 + d for d in (0, 1, 2, 1)]]
    got = NodeProcessors(procs, False).tree(logits, tokens, anc, depth, seq,
                                            lengths)
    for b, committed in enumerate((3, 4)):
        for i in range(4):
            path = tokens[b, [j for j in range(1, 4) if anc[b, i, j]]]
            prefix = torch.cat([seq[b, :committed], path])[None]
            torch.testing.assert_close(got[b, i], procs(prefix, logits[b, i][None].clone())[0])


def test_each_tree_node_keeps_its_own_rows_processor_state():
    """transformers' repetition penalty skips each row's left padding (`prompt_ignore_length`, one
    entry per row): a left-padded two-row tree, every node compared with the processor of its
    own row applied to its own prefix (another row's entry would penalise the pad id in row 0
    and spare row 1's first tokens)."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    vocab, penalty = 12, 1.7
    seq = torch.tensor([[PAD, PAD, 5, 6, 0, 0], [7, 8, 9, 10, 0, 0]])  # row 0 left-padded
    ignore = torch.tensor([2, 0])
    tokens = torch.tensor([[6, 3, 4, 1], [10, 1, 3, 4]])
    depth, anc = _tree_of_four()
    logits = torch.randn(2, 4, vocab).abs() + 0.5  # positive: a penalty divides
    lengths = [[4 + int(d) for d in depth[0]]] * 2
    proc = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=ignore)
    got = NodeProcessors([proc], False).tree(logits, tokens, anc, depth, seq, lengths)
    for b in range(2):
        own = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=ignore[b:b + 1])
        for i in range(4):
            path = tokens[b, [j for j in range(1, 4) if anc[b, i, j]]]
            prefix = torch.cat([seq[b, :4], path])[None]
            torch.testing.assert_close(got[b, i], own(prefix, logits[b, i][None].clone())[0])
