"""Model cards: `card.json` (read by `mmspec.zoo.load` and the tests) and a `README.md` rendering
of it, written beside each shipped checkpoint. Every number in a card is measured by the run."""

from __future__ import annotations

import json
from pathlib import Path

from mmspec.atomic import write_text_atomic


def _render(card: dict, depth: int = 0) -> list[str]:
    lines = []
    for key, value in card.items():
        pad = "  " * depth
        if isinstance(value, dict):
            lines.append(f"{pad}- **{key}**")
            lines.extend(_render(value, depth + 1))
        else:
            lines.append(f"{pad}- **{key}**: `{value}`" if depth else f"- **{key}**: {value}")
    return lines


def write_card(directory: str | Path, card: dict) -> None:
    """Write `card.json` and `README.md`. A retrained model's card keeps the `attempts` (recipes
    tried and not shipped) of the card it replaces, unless it brings its own."""
    directory = Path(directory)
    old = directory / "card.json"
    if "attempts" not in card and old.is_file():
        attempts = json.loads(old.read_text()).get("attempts")
        if attempts:
            card = {**card, "attempts": attempts}
    title = f"# {card['name']}\n\n{card.get('summary', '')}\n\n"
    body = {k: v for k, v in card.items() if k not in ("name", "summary")}
    write_text_atomic(directory / "README.md", title + "\n".join(_render(body)) + "\n")
    write_text_atomic(directory / "card.json", json.dumps(card, indent=2) + "\n")  # the card last


def read_card(directory: str | Path) -> dict:
    """The card of a zoo folder; ValueError naming the file if it is not a JSON object."""
    path = Path(directory) / "card.json"
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON: {err}") from None
    if not isinstance(card, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(card).__name__}")
    return card
