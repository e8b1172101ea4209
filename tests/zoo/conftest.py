"""Shared fixtures: the shipped tokenizer and a fixed held-out slice of the stdlib corpus."""

import pytest
import torch

from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.tokenizer import load_tokenizer
from mmspec.zoo.training.data import eval_windows, token_stream


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(ZOO_DIR / "text-tokenizer")


@pytest.fixture(scope="session")
def heldout_stream(tokenizer) -> torch.Tensor:
    return token_stream(tokenizer, "heldout")


@pytest.fixture(scope="session")
def heldout_windows(heldout_stream) -> torch.Tensor:
    """The slice every text card reports: 16 windows of 256 tokens."""
    return eval_windows(heldout_stream, 256, 16)
