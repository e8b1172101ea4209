"""How the zoo's models were made: the trainers and their data, apart from the loading
(`mmspec.zoo.load`, which imports nothing from here).

    python -m mmspec.zoo.training.train_text tokenizer|text-target|text-drafter|text-dlm
    python -m mmspec.zoo.training.train_vlm tokenizer|vlm-target|vlm-assistant|vlm-vispec|...
    python -m mmspec.zoo.training.train_video
    python -m mmspec.zoo.training.eagle3 RUN --name text-eagle3 ...   # ship an EAGLE-3 run

Files: the three trainers (`train_text.py`, `train_vlm.py`, `train_video.py`, on
`mmspec.train_scaffold`); their recipes (`specs.py` for text, `vlm_specs.py` for the shipped VLM
entries); data (`data.py`: token windows of the stdlib corpus, `vlm_data.py`: scene batches);
losses (`objectives.py`, `distill.py`: training on the target's continuations); `committed.py`
(fine-tunes from a committed entry); `eagle3.py` (an EAGLE-3 drafter trained by
`mmspec.vision.train --arch eagle3` written into the zoo).
"""
