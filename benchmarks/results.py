"""A benchmark's section of benchmarks/RESULTS.md: its tables, and replacing it while leaving the others untouched."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def replace_section(name: str, title: str, body: str) -> None:
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{begin}\n## {title}\n\n{body}\n{end}"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def markdown_table(header: list[str], rows: list[list[object]]) -> list[str]:
    """A Markdown table's lines: the header, the rule under it and one line per row (each cell as str)."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(map(str, r))} |" for r in rows)]


def publish(name: str, title: str, body: str, write: bool) -> None:
    """Print the section; with `write`, also replace it in RESULTS.md."""
    print(f"## {title}\n\n{body}", flush=True)
    if write:
        replace_section(name, title, body)
