"""README.md's Python blocks run as pasted, on the zoo: each in a fresh namespace, from the
repository root. A block preceded by `<!-- template -->` (placeholders such as PATH) is skipped."""

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


@pytest.mark.parametrize("number", range(len(python_blocks((ROOT / "README.md").read_text()))))
def test_readme_python_block_runs_as_pasted(number, monkeypatch, capsys):
    code = python_blocks((ROOT / "README.md").read_text())[number]
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"README.md python block {number}", "exec"), {"__name__": "__readme__"})
