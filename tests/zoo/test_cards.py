import json

from mmspec.zoo.cards import read_card, write_card


def test_a_retrained_card_keeps_the_attempts_of_the_card_it_replaces(tmp_path):
    tried = [{"recipe": "lr 3e-3", "shipped": False, "why_not_shipped": "diverged"}]
    write_card(tmp_path, {"name": "m", "summary": "s", "results": {"loss": 1.0}, "attempts": tried})
    write_card(tmp_path, {"name": "m", "summary": "s", "results": {"loss": 0.5}})
    card = read_card(tmp_path)
    assert card["results"] == {"loss": 0.5} and card["attempts"] == tried
    assert "diverged" in (tmp_path / "README.md").read_text()
    own = [{"recipe": "new"}]
    write_card(tmp_path, {"name": "m", "summary": "s", "attempts": own})
    assert json.loads((tmp_path / "card.json").read_text())["attempts"] == own


def test_a_first_card_has_no_attempts(tmp_path):
    write_card(tmp_path, {"name": "m", "summary": "s"})
    assert "attempts" not in read_card(tmp_path)
