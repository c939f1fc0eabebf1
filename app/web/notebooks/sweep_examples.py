"""Bundled sweep examples (`examples/sweeps/<slug>.json`, e.g. the home page's destination-city sweep):
a notebook whose fields each carry many values. Loading one makes the notebook through the same
path as every example (`load_example`, each field's first value as its new value) and marks it
`sweeps/<slug>`, so its Sweep panel opens prefilled with the example's values, strategies and
threshold: one click from the card to the README's sweep."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from app.web.notebooks.examples import ExampleError, load_example
from app.web.templating import EXAMPLES_DIR
from data.accounts import LOCAL_USER
from data.models import Notebook
from vocabulary import EXACT_REUSE
from vocabulary.confidence import more_needed
from vocabulary.sweeps import SWEEP_STRATEGIES

SWEEPS_DIR = EXAMPLES_DIR / "sweeps"
MARK = "sweeps/"  # a notebook's `example` for a sweep example: "sweeps/<slug>"


@dataclass(frozen=True)
class Measured:
    """The example's sweep as measured on its model (`<slug>.measured.json`, written by
    scripts/measure_sweep_example.py): what the card promises is what this run did."""

    model: str
    device: str
    edits_done: int
    seconds: float
    load: float  # the load average (1 min) when it started: the machine may have been shared
    policy: str
    decided: bool
    cost_share: float | None  # the policy's share of recompute's tokens
    prefix_reuse_share: float | None


@dataclass(frozen=True)
class SweepExample:
    slug: str
    title: str
    summary: str
    values: dict[str, tuple[str, ...]]  # field label → the values the sweep gives it, in order
    strategies: tuple[str, ...]
    threshold: float
    stop_when_decided: bool = True
    expected_policy: str = ""
    measured: Measured | None = None

    @property
    def mark(self) -> str:
        return MARK + self.slug

    @property
    def needed(self) -> int | None:
        """Changed edits, every one agreeing, that lift a candidate's 95% lower bound (a confidence
        sequence: valid at every look, so the sweep may stop once decided) to the threshold."""
        return more_needed([(0, 0)], self.threshold)


def _measured(path: Path) -> Measured | None:
    """The example's own model's measured run, or None (no file, or a file without it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        run = data["models"][data["model"]]
        policy = run["policy"]["strategy"]
        return Measured(data["model"], str(run["device"]), int(run["edits_done"]), float(run["seconds"]),
                        float(run["load_before"][0]), policy, bool(run["policy"]["decided"]),
                        run["strategies"].get(policy, {}).get("cost_share"),
                        run["strategies"].get(EXACT_REUSE, {}).get("cost_share"))
    except (OSError, KeyError, TypeError, ValueError):
        return None


def read_sweep_example(slug: str, directory: Path = SWEEPS_DIR) -> SweepExample:
    """`examples/sweeps/<slug>.json`; an unknown slug or a bad file is an `ExampleError`."""
    path = directory / f"{slug}.json"
    if not path.is_file() or path.parent != directory or slug.endswith(".measured"):
        raise ExampleError(f"no sweep example named {slug!r}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        values = {str(f["label"]): tuple(str(v) for v in f["values"]) for f in data["fields"]}
        strategies = tuple(s for s in data.get("strategies", SWEEP_STRATEGIES) if s in SWEEP_STRATEGIES)
        return SweepExample(slug, str(data.get("title", slug)), str(data.get("summary", "")), values,
                            strategies, float(data.get("threshold", 0.95)),
                            bool(data.get("stop_when_decided", True)), str(data.get("expected_policy", "")),
                            _measured(directory / f"{slug}.measured.json"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ExampleError(f"sweep example {slug}: {type(exc).__name__} {exc}") from None


def list_sweep_examples(directory: Path = SWEEPS_DIR) -> list[SweepExample]:
    slugs = [p.stem for p in sorted(directory.glob("*.json")) if not p.name.endswith(".measured.json")]
    return [read_sweep_example(slug, directory) for slug in slugs]


def sweep_example_of(notebook: Notebook) -> SweepExample | None:
    """The sweep example a notebook was made from, or None."""
    mark = notebook.example or ""
    if not mark.startswith(MARK):
        return None
    try:
        return read_sweep_example(mark[len(MARK):])
    except ExampleError:
        return None


def load_sweep_example(session: Session, slug: str, created_by: str = LOCAL_USER) -> Notebook:
    """The notebook of a sweep example (committed by the caller), marked `sweeps/<slug>`."""
    read_sweep_example(slug)  # an unknown slug fails before anything is made
    notebook = load_example(session, slug, SWEEPS_DIR, created_by)
    notebook.example = MARK + slug
    return notebook
