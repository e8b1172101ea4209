"""README.md's and docs/'s Python blocks run as pasted, on the zoo: each in a fresh namespace, from
the repository root. A block preceded by `<!-- template -->` (placeholders such as PATH, a GPU or
a hub download) is skipped; keep those rare."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- template -->\s*)?```python\n(.*?)```", re.S)


def python_blocks(text: str) -> list[str]:
    return [code for template, code in BLOCK.findall(text) if not template]


def test_template_blocks_are_skipped():
    text = "```python\na = 1\n```\n<!-- template -->\n```python\nPATH\n```\n```python\nb\n```"
    assert python_blocks(text) == ["a = 1\n", "b\n"]


def test_the_readme_starts_with_make_run_and_make_test():
    first = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].splitlines()
    assert first[0].startswith("make run ") and first[1].startswith("make test ")


def test_the_readme_is_a_front_page():
    """At most 250 lines: the reference text lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
BLOCKS = [(page, number) for page in PAGES
          for number in range(len(python_blocks((ROOT / page).read_text())))]


@pytest.mark.parametrize("page,number", BLOCKS, ids=[f"{p}-{n}" for p, n in BLOCKS])
def test_python_block_runs_as_pasted(page, number, monkeypatch, capsys):
    code = python_blocks((ROOT / page).read_text())[number]
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"{page} python block {number}", "exec"), {"__name__": "__readme__"})
