"""`mmspec demo`: a self-contained tour of the block-sparse attention layer.

The layer the three accelerators share, on data made on the spot (no downloads; the embedded
default of `make run` is `mmspec generate`, the zoo VLM):
1. the three mask builders (causal, speculative tree, diffusion prefix + bidirectional block);
2. DraftAttention-style sparse attention at 10% density against dense SDPA, timed side by side,
   with its error against the fp32 reference;
3. tree verification on a small random Llama through the Hugging Face hook: one forward over a
   draft tree gives every node the same logits as running its own branch.
"""

import argparse
import time

import torch
import torch.nn.functional as F

from mmspec._cache_name import cache_kwargs
from mmspec.kernels import (
    BlockSparseMask,
    block_sparse_attention,
    causal_block_mask,
    prefix_block_mask,
    tree_block_mask,
)


def show_masks():
    print("== 1. mask builders ('█' full block, '░' partial block, ' ' skipped)")
    for title, mask in (
        ("causal, 200 queries vs 320 keys (bottom-right aligned), 32-token blocks",
         causal_block_mask(200, 320, 32)),
        ("draft tree of 8 nodes after a 40-token prefix, 16-token blocks",
         tree_block_mask(torch.tensor([-1, 0, 0, 1, 1, 2, 3, 6]), 40, 16)),
        ("diffusion drafter: 100-token causal prefix + 40-token bidirectional block",
         prefix_block_mask(100, 40, 16)),
    ):
        print(f"\n{title}: {mask}")
        print(mask.to_string())


def sparse_vs_dense(n: int, density: float):
    print(f"\n== 2. block-sparse attention at density {density} vs dense SDPA "
          f"(B=1, H=4, N={n}, D=64, fp32, 128-token blocks)")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 64, generator=g) for _ in range(3))
    nb = n // 128
    keep = max(1, round(density * nb))
    order = torch.rand(1, 4, nb, nb, generator=g).argsort(-1)[..., :keep]
    blocks = torch.zeros(1, 4, nb, nb, dtype=torch.bool).scatter_(-1, order, True)
    mask = BlockSparseMask.from_dense(blocks, 128, n, n)
    block_sparse_attention(q, k, v, mask)  # warm-up (builds the CPU kernel once per environment)
    start = time.perf_counter()
    dense = F.scaled_dot_product_attention(q, k, v)
    t_dense = time.perf_counter() - start
    start = time.perf_counter()
    out = block_sparse_attention(q, k, v, mask)
    t_sparse = time.perf_counter() - start
    rows = slice(0, 256)  # check against the fp32 reference on the first query blocks
    sub = BlockSparseMask.from_dense(blocks[:, :, :2], 128, 256, n)
    ref = block_sparse_attention(q[:, :, rows], k, v, sub, backend="reference")
    print(f"dense SDPA {t_dense * 1e3:.0f} ms, block-sparse {t_sparse * 1e3:.0f} ms: "
          f"{t_dense / t_sparse:.1f}x faster; max error vs fp32 reference "
          f"{(out[:, :, rows] - ref).abs().max():.1e}; output differs from dense by design "
          f"(mean |diff| {(out - dense).abs().mean():.2f})")


def tree_verification():
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from mmspec.kernels import HF_ATTENTION_NAME, register_hf_attention, tree_depths

    print("\n== 3. tree verification in one forward through the Hugging Face hook")
    register_hf_attention()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation(HF_ATTENTION_NAME)
    print("(a small randomly initialised Llama built on the spot: the check is exactness, "
          "not text)")
    prefix = torch.randint(0, 256, (1, 48))
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 6])
    tree = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        cache = DynamicCache(config=config)
        model(prefix, **cache_kwargs(model.forward, cache), use_cache=True)
        logits = model(tree, **cache_kwargs(model.forward, cache),
                       position_ids=(48 + tree_depths(parents))[None],
                       block_sparse_mask=tree_block_mask(parents, 48, 16)).logits[0]
        worst = 0.0
        for node in range(8):
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(int(parents[path[-1]]))
            seq = torch.cat([prefix, tree[:, path[::-1]]], 1)
            worst = max(worst, (model(seq).logits[0, -1] - logits[node]).abs().max().item())
    print(f"8 tree nodes verified in one forward; max |logit difference| vs running each branch "
          f"separately: {worst:.1e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mmspec demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="sequence length for part 2")
    parser.add_argument("--density", type=float, default=0.1)
    args = parser.parse_args(argv)
    if args.tokens < 256 or args.tokens % 128:
        parser.error(f"--tokens must be a multiple of 128 and >= 256, got {args.tokens}")
    if not 0 < args.density <= 1:
        parser.error(f"--density must be in (0, 1], got {args.density}")
    show_masks()
    sparse_vs_dense(args.tokens, args.density)
    tree_verification()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
