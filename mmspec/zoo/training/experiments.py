"""VLM zoo recipes tried and not shipped: no weights in `assets/zoo/` (so none in the registry),
but `python -m mmspec.zoo.training.train_vlm NAME --zoo DIR --out DIR` trains each into a scratch
zoo, and `benchmarks/vlm.py` and `benchmarks/vispec_variants.py` compare them there with the
shipped ones. What each gave is in BENCHMARKS.md under the section named beside it.
"""

from __future__ import annotations

from mmspec.zoo.training.vlm_specs import DrafterSpec, VLMSpec

EXPERIMENTS = {
    s.name: s
    for s in (
        # ViSpec's premise needs many image tokens per image: the shipped target's LLaVA at patch
        # 4 (256 image tokens instead of 64), trained in one stage (tower pre-trained then frozen,
        # colour questions and the image-word loss from the start), and both drafters on it with
        # the shipped drafters' first recipe (BENCHMARKS.md "VLM at 256 image tokens per image")
        VLMSpec("vlm-target-p4", hidden_size=192, num_layers=8, num_heads=3, num_kv_heads=1,
                intermediate_size=576, steps=1000, patch_size=4, lr=1.5e-3, warmup=50,
                vision_pretrain_steps=2000, freeze_vision=True, colour_share=0.5,
                image_word_loss=0.3,
                drafters=("vlm-vispec-p4", "vlm-text-drafter-p4", "vlm-assistant")),
        DrafterSpec("vlm-vispec-p4", text_only=False, steps=5000, samples=2400,
                    target="vlm-target-p4"),
        DrafterSpec("vlm-text-drafter-p4", text_only=True, steps=5000, samples=2400,
                    target="vlm-target-p4"),
        # ViSpec's own ablation point 17q: 16 compressed tokens per image instead of 1
        # (BENCHMARKS.md "VLM at 256 image tokens, ViSpec with 16 compressed tokens per image")
        DrafterSpec("vlm-vispec-p4-17q", text_only=False, steps=5000, samples=2400,
                    target="vlm-target-p4", num_queries=17),
        # vlm-vispec's recipe with ViSpec's own shifted rollout (the shipped recipe before
        # EAGLE-3's training-time test replaced it), with EAGLE-3's multi-layer features, or with
        # both of EAGLE-3's pieces: only the training-time test raised tau (BENCHMARKS.md
        # `vispec_variants`)
        DrafterSpec("vlm-vispec-shifted", text_only=False, steps=5000, samples=2400),
        DrafterSpec("vlm-vispec-ml", text_only=False, steps=5000, samples=2400,
                    features="eagle3"),
        DrafterSpec("vlm-vispec-e3", text_only=False, steps=5000, samples=2400,
                    features="eagle3", rollout_steps=6, training_time_test=True),
    )
}
