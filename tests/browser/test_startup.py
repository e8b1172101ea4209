"""Each demo, run as a user runs it (`python demos/<name>.py --port P`, zoo models), serves its
page within 30 s on CPU (issue 8)."""

import pytest

from .conftest import launched, screenshot

pytestmark = pytest.mark.browser

DEMOS = {  # script: (zoo entries it loads, an element of its page)
    "dlm_lattice.py": (("text-target", "text-dlm"), "#run"),
    "vlm_chat.py": (("vlm-target", "vlm-vispec", "vlm-text-drafter"), "#ask"),
    "video_draft.py": (("video-dit",), "#run"),
}


@pytest.mark.parametrize("script", list(DEMOS))
def test_demo_starts_within_30_s(script, page):
    from mmspec import zoo

    entries, element = DEMOS[script]
    missing = sorted(set(entries) - set(zoo.available()))
    if missing:
        pytest.fail(f"{script}: zoo entries {missing} are missing from assets/zoo/")
    with launched(script) as (url, seconds):
        page.goto(url)
        page.locator(element).wait_for()
        screenshot(page, f"{script[:-3]}_start")
    print(f"{script} answered after {seconds:.1f} s")
    assert seconds < 30
