# the tiny LLaVA target the vision tests decode with (EOS never sampled), for the EAGLE drafters'
# VLM cases
from tests.vision.conftest import llava  # noqa: F401
