"""demos/video_draft.py in Chromium on the zoo video model (`video-dit`): its default prompt gives
both videos, the timings and the draft map."""

import pytest

from .conftest import screenshot, served

pytestmark = pytest.mark.browser


def test_zoo_video_model_default_prompt(page):
    from demos.video_draft import build_app
    from mmspec import zoo

    if "video-dit" not in zoo.available():
        pytest.fail("the zoo has no video-dit (assets/zoo/video-dit)")
    app = build_app()
    with served(app) as url:
        page.goto(url)
        page.locator("#run").click()
        page.locator("#status").get_by_text("PSNR").wait_for(timeout=120_000)
        assert "DraftAttention" in page.locator("#status").inner_text()
        page.locator("#dense video").wait_for()
        page.locator("#draft video").wait_for()
        page.locator("#map img").first.wait_for()
        page.wait_for_timeout(1500)  # the players show their first frame
        screenshot(page, "video_draft_zoo")
