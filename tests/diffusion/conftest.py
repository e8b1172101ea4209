import pytest

from .models import tiny_qwen2


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(0)


@pytest.fixture(scope="module")
def dlm():
    return tiny_qwen2(1)

