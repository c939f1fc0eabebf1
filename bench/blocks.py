"""Writing a benchmark's results between markers in a markdown file (`<!-- bench:NAME:begin -->` …
`<!-- bench:NAME:end -->`): the prose around the block is hand-written and kept; a missing block is
appended."""

from __future__ import annotations

import re
from pathlib import Path


def write_block(out: Path, name: str, body: str) -> None:
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
