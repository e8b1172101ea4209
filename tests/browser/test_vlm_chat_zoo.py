"""demos/vlm_chat.py in Chromium on the zoo VLM (`vlm-target` with `vlm-vispec` and
`vlm-text-drafter`): its sample scene and question stream an answer with accepted draft tokens,
in ViSpec and text-only mode."""

import pytest

from .conftest import screenshot, served

pytestmark = pytest.mark.browser

ENTRIES = ("vlm-target", "vlm-vispec", "vlm-text-drafter")


@pytest.fixture(scope="module")
def app():
    from demos.vlm_chat import build_app
    from mmspec import zoo

    missing = sorted(set(ENTRIES) - set(zoo.available()))
    if missing:
        pytest.fail(f"zoo entries {missing} are missing from assets/zoo/")
    return build_app()


@pytest.mark.parametrize("mode", ["ViSpec", "text-only drafter"])
def test_sample_scene_answer_streams_with_accepted_tokens(app, page, mode):
    with served(app) as url:
        page.goto(url)
        page.locator("#mode").get_by_text(mode).click()
        page.locator("#ask").click()  # the sample image and question are preloaded
        status = page.locator("#status")
        status.get_by_text("done").wait_for(timeout=120_000)
        assert "τ =" in status.inner_text()
        assert page.locator("#answer .tok-accepted").count() > 0
        screenshot(page, f"vlm_chat_zoo_{mode.split()[0].lower()}")
