import torch

from mmspec.diffusion.cps import CPSConfig, search
from mmspec.diffusion.lm_proxy import CausalLMProxy

from .models import tiny_qwen2


def test_cached_scores_equal_a_full_forward():
    lm = tiny_qwen2(3, layers=1)
    history = torch.randint(2, 60, (9,))
    paths = torch.randint(2, 60, (3, 4))
    candidates = torch.tensor([1, 5, 40, 70])  # 70 lies past the LM's vocabulary
    proxy = CausalLMProxy(lm)
    proxy.begin(history)
    scores = proxy.score(paths, candidates)
    full = torch.cat([history.expand(3, -1), paths], dim=1)
    expected = torch.log_softmax(lm(input_ids=full).logits[:, -1], -1)[:, candidates[:3]]
    torch.testing.assert_close(scores[:, :3], expected, atol=1e-5, rtol=1e-5)
    assert torch.isneginf(scores[:, 3]).all()
    first = proxy.score(torch.zeros(2, 0, dtype=torch.long), candidates[:3])  # depth 0
    last = torch.log_softmax(lm(input_ids=history[None]).logits[0, -1], -1)[candidates[:3]]
    torch.testing.assert_close(first, last.expand(2, -1), atol=1e-5, rtol=1e-5)


def test_lm_proxy_with_lambda_zero_follows_the_lm_within_the_lattice():
    lm = tiny_qwen2(3, layers=1)
    history = torch.randint(2, 60, (6,))
    lattice = torch.full((3, 64), float("-inf"))
    lattice[:, 2:62] = -torch.log(torch.tensor(60.0))  # flat over 60 ids: the proxy decides
    proxy = CausalLMProxy(lm)
    proxy.begin(history)
    beam = search(lattice, CPSConfig(lam=0.0, tau=1.0, max_candidates=64, beam_width=1), [1],
                  proxy)[0]
    seq = history.tolist()
    assert len(beam.tokens) == 3
    for token in beam.tokens:  # greedy under the LM, restricted to the lattice's ids 2..61
        logits = lm(input_ids=torch.tensor([seq])).logits[0, -1]
        allowed = torch.full_like(logits, float("-inf"))
        allowed[2:62] = 0.0
        assert token == int((logits + allowed).argmax())
        seq.append(token)
