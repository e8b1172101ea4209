"""demos/video_draft.py in Chromium on a tiny random Wan pipeline (the zoo model is not needed):
a prompt gives the dense and DraftAttention videos with timings and the draft-map heat-map;
moving the sparsity slider redraws the block mask; an empty prompt gives a readable message."""

import sys
from pathlib import Path

import pytest

from .conftest import screenshot, served

pytestmark = pytest.mark.browser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "video_dit"))


@pytest.fixture(scope="module")
def app():
    from tiny import tiny_wan_pipeline

    from demos.video_draft import build_app

    pipe = tiny_wan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    # WanPipeline's VAE: 4k + 1 frames, 16-pixel sizes; 128 px = 8 x 8 tokens per latent frame
    return build_app(pipe, prompt="a red car at night", num_frames=9, size=128, steps=6,
                     tile="2 x 2")


def test_prompt_gives_both_videos_timings_and_the_draft_map(app, page):
    with served(app) as url:
        page.goto(url)
        page.locator("#prompt textarea").fill("a blue car in snow")
        page.locator("#run").click()
        status = page.locator("#status")
        status.get_by_text("PSNR").wait_for(timeout=120_000)
        text = status.inner_text()
        assert "dense" in text and "DraftAttention" in text and " s" in text
        for video in ("#dense video", "#draft video"):
            page.locator(video).wait_for()
            assert page.locator(video).get_attribute("src")
        page.locator("#map img, #map svg").first.wait_for()
        before = page.locator("#map img").first.get_attribute("src")
        number = page.locator("#sparsity input[type=number]")
        number.fill("0.6")  # the default is 0.9
        number.press("Enter")
        page.wait_for_function(
            "before => { const i = document.querySelector('#map img');"
            " return i && i.getAttribute('src') !== before; }", arg=before)
        screenshot(page, "video_draft")


def test_bad_inputs_show_messages(app, page):
    with served(app) as url:
        page.goto(url)
        page.locator("#prompt textarea").fill("")
        page.locator("#run").click()
        page.locator("#status").get_by_text("Please enter a prompt").wait_for()
        page.locator("#prompt textarea").fill("a red car")
        page.locator("#size input").fill("33")
        page.locator("#run").click()
        page.locator("#status").get_by_text("positive even number").wait_for()
        page.locator("#size input").fill("128")
        page.locator("#tile input").click()
        page.get_by_role("option", name="8 x 16 (paper)").click()
        page.locator("#run").click()  # 8 x 8 tokens per latent frame: the tile does not fit
        page.locator("#status").get_by_text("larger than the frame").wait_for(timeout=120_000)
        assert "Traceback" not in page.content()
        page.wait_for_timeout(500)
        screenshot(page, "video_draft_bad_tile")


def test_query_tiles_show_a_map_of_query_tiles_by_tiles(app, page):
    # 8 x 8 tokens per latent frame: 4 query tiles over 16 tiles a frame
    with served(app) as url:
        page.goto(url)
        page.locator("#tile input").click()
        page.get_by_role("option", name="4 x 4 queries over 2 x 2 keys").click()
        page.locator("#run").click()
        page.locator("#status").get_by_text("PSNR").wait_for(timeout=120_000)
        page.locator("#map img").first.wait_for(timeout=60_000)  # the figure, drawn
        assert "Traceback" not in page.content() and "Error" not in page.locator(
            "#status").inner_text()
        screenshot(page, "video_draft_query_tiles")
