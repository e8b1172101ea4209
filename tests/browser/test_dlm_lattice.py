"""demos/dlm_lattice.py in Chromium: a prompt gives an answer, a lattice per round and the ADL plot;
an empty prompt gives a readable error."""

import re

import pytest

from .conftest import screenshot, served

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app():
    from demos.dlm_lattice import build_app

    return build_app()


def test_prompt_shows_lattice_rounds_and_adl(app, page):
    with served(app) as url:
        page.goto(url)
        page.locator("#prompt textarea").fill("def read(path):\n    with open(path) as f:\n")
        page.locator("#run").click()
        answer = page.locator("#answer")
        answer.wait_for()
        assert "def read(path)" in answer.inner_text()
        assert page.locator("#answer .tok-bonus").count() > 0  # the target's own tokens
        summary = page.locator("#summary")
        assert "τ =" in summary.inner_text() and "rounds" in summary.inner_text()
        assert page.locator("#adl img, #adl svg").count() > 0
        assert page.locator("#lattice img, #lattice svg").count() > 0
        table = page.locator("#table")
        assert "top 1" in table.inner_text()
        assert "rejected" in table.inner_text() or "accepted" in table.inner_text()
        # another round: the slider's number box drives the lattice view
        number = page.locator("#round input[type=number]")
        number.fill("2")
        number.press("Enter")
        page.locator("#round-title").get_by_text("round 2 of").wait_for()
        page.wait_for_timeout(1000)  # the plot's image replaces the old one
        screenshot(page, "dlm_lattice")


def test_naive_mode_accepts_what_its_argmax_path_predicts(app, page):
    """The naive drafter drafts the argmax path, so the page's hindsight count of what the argmax
    path would have had accepted must equal what was accepted."""
    with served(app) as url:
        page.goto(url)
        page.get_by_text("argmax path, fixed k (naive)").click()
        page.locator("#run").click()
        summary = page.locator("#summary")
        summary.get_by_text("would have had").wait_for()
        match = re.search(r"accepted (\d+) of \d+ drafted.*would have had (\d+) accepted",
                          summary.inner_text())
        assert match and match.group(1) == match.group(2), summary.inner_text()


def test_empty_prompt_shows_a_message(app, page):
    with served(app) as url:
        page.goto(url)
        page.locator("#prompt textarea").fill("   ")
        page.locator("#run").click()
        page.locator("#summary").get_by_text("Please enter a prompt").wait_for()
        assert "Traceback" not in page.content()
        page.wait_for_timeout(500)  # the toast slides in
        screenshot(page, "dlm_lattice_empty_prompt")



def test_a_round_without_a_draft_shows_no_stale_lattice():
    # with one token of budget left `generate` drafts nothing; the round showed the previous
    # round's lattice and path, with a made-up "rejected" verdict
    from demos.dlm_lattice import EXAMPLE, MODES, decode, load_pair

    target, dlm = load_pair()
    dec = decode(target, dlm, EXAMPLE, 9, MODES[1], 6)  # its last round has no budget to draft
    last = dec.rounds[-1]
    assert (last.k, last.path, last.accepted, len(last.committed)) == (0, [], 0, 1)
    assert sum(len(r.path) for r in dec.rounds) == dec.stats.drafted


def test_a_round_without_a_draft_is_shown_as_an_empty_round():
    # its view crashed in imshow ("Invalid shape (0,) for image data"): the page showed an error
    import matplotlib.pyplot as plt

    from demos.dlm_lattice import EXAMPLE, MODES, NO_DRAFT, TABLE_COLUMNS, decode, load_pair
    from demos.dlm_lattice import round_view

    target, dlm = load_pair()
    dec = decode(target, dlm, EXAMPLE, 9, MODES[1], 6)  # its last round has no budget to draft
    last = len(dec.rounds)
    title, figure, table = round_view(target.tokenizer, dec, last)
    assert title.startswith(f"**round {last} of {last}: k = 0") and NO_DRAFT in title
    assert table.empty and list(table.columns) == TABLE_COLUMNS
    assert [t.get_text() for t in figure.axes[0].texts] == [NO_DRAFT]
    first = round_view(target.tokenizer, dec, 1)
    assert first[0].startswith("**round 1 of") and len(first[2]) == dec.rounds[0].k
    # the slider's number box takes any number: 0 is the first round, not the last
    assert round_view(target.tokenizer, dec, 0)[0] == first[0]
    assert round_view(target.tokenizer, dec, last + 3)[0] == title
    plt.close("all")
