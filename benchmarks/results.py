"""Replace one benchmark's section of benchmarks/RESULTS.md, leaving the others untouched."""

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
