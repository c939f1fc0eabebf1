"""Attention by region, the paper's figure: which part of the prompt each cached token belongs to.

The decision's attention is summed over these regions (the sink, the document before the first
field, the fields, the downstream notes after it, errata, skills, and the question with the answer)
so a strategy's reading can be set beside recompute's and beside the paper's. Stdlib only: the web
app sums stored maps with it, and anything else that has token records can too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

REGIONS = ("sink", "before_field", "field", "after_field", "errata", "skills", "question")

REGION_HELP = {
    "sink": "the first 4 tokens (the attention sink)",
    "before_field": "the document before the first field",
    "field": "the fields' own tokens (all fields)",
    "after_field": "the downstream notes: the document after the first field",
    "errata": "appended errata",
    "skills": "spliced skills",
    "question": "the question (and the answer so far)",
}

SINK_TOKENS = 4

# The paper's reading on its 4–8B models: the decision's attention on each region (the rest elsewhere).
PAPER_READING = {"field": 0.001, "after_field": 0.56, "sink": 0.36}

ERRATUM = "erratum"  # an appended correction: its tokens' segment, and what the pages call one

_BY_SEGMENT = {ERRATUM: "errata", "skill": "skills", "question": "question",
               "answer": "question", "sink": "sink"}
# the segments whose first token the run page's heatmap strip marks ("erratum starts here")
MARKED_SEGMENTS = (ERRATUM, "skill", "question", "answer")


@dataclass(frozen=True)
class Span:
    """A token's character span in the document ((-1, -1) outside it) and its segment."""

    start: int
    end: int
    segment: str


def token_regions(tokens: Sequence[Span], fields: Sequence[tuple[int, int]]) -> list[str]:
    """The region of each token. Document tokens overlapping a field [start, end) are `field`;
    document tokens outside the document's text are a placed skill's (recompute reads the skill as
    document text); the others, and the frame around them, fall before or after the first field by
    position (with no field, the whole document is `before_field`)."""
    first = min((start for start, _ in fields), default=None)
    regions, seen_field = [], False
    for i, token in enumerate(tokens):
        region = "sink" if i < SINK_TOKENS else _BY_SEGMENT.get(token.segment)
        if region is None and token.segment == "document" and token.start < 0:
            region = "skills"  # a placed skill's text read as part of the document (recompute)
        if region is None and token.start >= 0:
            in_field = any(token.start < end and start < token.end for start, end in fields)
            after = first is not None and token.start >= first
            region = "field" if in_field else ("after_field" if after else "before_field")
        if region is None:  # frame tokens: before the fields until the document has passed one
            region = "after_field" if seen_field else "before_field"
        seen_field = seen_field or region in ("field", "after_field")
        regions.append(region)
    return regions
