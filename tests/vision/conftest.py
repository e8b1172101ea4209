import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tiny_vlms

import pytest  # noqa: E402
from tiny_vlms import no_eos, tiny_llava, tiny_qwen2_5_vl  # noqa: E402


# the tiny targets most tests decode with (EOS never sampled); a module's own fixture of the same
# name replaces them there (test_errors' keeps EOS)
@pytest.fixture(scope="module")
def llava():
    return no_eos(tiny_llava())


@pytest.fixture(scope="module")
def qwen():
    return no_eos(tiny_qwen2_5_vl())
