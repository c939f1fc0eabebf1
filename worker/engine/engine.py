"""The Engine: one loaded model and everything the paper does with its notes.

    eng = load("smollm2-135m")
    notes = eng.prefill(document)                       # Notes (.token_ids, .cache)
    report = eng.edit(notes, fields=[Field(10, 16, "denied", "status")],
                      question=Question("Can this user log in?", ("yes", "no")))
    report = eng.compose(context, skills=[skill_text], question=Question(...))
    report = eng.run(RunRequest(document, question, fields=(...), placements=(Placement(skill, at=120),)))

How a run times and compares the strategies is `worker.engine.run`; the model, its tokenizer and
frame, prefill (through the KV store) and skills are `worker.engine.loaded.LoadedModel`, which the
Engine extends with the runs; this module also holds the cache of loaded engines.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from vocabulary import DEFAULT_COMPOSE_STRATEGIES, DEFAULT_TEMPLATE, STRATEGIES
from worker.engine.blend import Blend, compose_run
from worker.engine.compose import token_boundary
from worker.engine.devices import resolve_device, resolve_dtype
from worker.engine.loaded import LoadedModel
from worker.engine.models import DEFAULT_MODEL, TensorProgress, load_model
from worker.engine.notes import Notes
from worker.engine.run import RunRequest, run
from worker.engine.store import KVStore
from worker.engine.types import EngineError, Field, ProgressFn, Question, Report


class Engine(LoadedModel):
    """One loaded model and the paper's operations on its notes: run, edit, compose."""

    # ---- runs ---------------------------------------------------------------------------------
    def run(self, request: RunRequest, notes: Notes | None = None,
            progress: ProgressFn | None = None) -> Report:
        """Every strategy of `request` against recompute (see `worker.engine.run`); `notes` are the
        document's cached notes, prefilled when None."""
        return run(self, request, notes, progress)

    # ---- the paper's two operations, one at a time --------------------------------------------
    def edit(
        self,
        notes: Notes | str,
        fields: list[Field],
        question: Question | str,
        *,
        choices: tuple[str, ...] | list[str] = (),
        cot: bool = False,
        strategies: tuple[str, ...] | list[str] = STRATEGIES,
        errata: list[str] | None = None,
        erratum_template: str = DEFAULT_TEMPLATE,
        selective_fraction: float = 0.15,
        attention: bool | list[str] = False,
        attribution: bool = False,
        mechanism: bool = False,
        progress: ProgressFn | None = None,
    ) -> Report:
        """Edit fields of a document whose notes are cached (or of a text, prefilled first): the
        Python face of `run`. `question` is a `Question`, or its text with `choices` / `cot`."""
        if isinstance(question, str):
            question = Question(question, tuple(choices), cot)
        text = notes if isinstance(notes, str) else notes.text
        request = RunRequest(
            document=text, question=question, fields=tuple(fields), strategies=tuple(strategies),
            errata=None if errata is None else tuple(errata), erratum_template=erratum_template,
            selective_fraction=selective_fraction,
            attention=attention if isinstance(attention, bool) else tuple(attention), attribution=attribution,
            mechanism=mechanism,
        )
        return self.run(request, notes=None if isinstance(notes, str) else notes, progress=progress)

    def compose(self, context: Notes | str, skills: list[str | Notes], question: Question | str,
                at: int | None | list[int | None] = None, seam: int = 0, attention: bool = False,
                progress: ProgressFn | None = None, *,
                strategies: tuple[str, ...] | list[str] = DEFAULT_COMPOSE_STRATEGIES,
                suffix: str | None = None, seam_tokens: int = 4, epic_tokens: int = 16,
                selective_fraction: float = 0.15) -> Report:
        """Compose a context from compiled skills (each before character `at`, None = the end, in
        order) and report every strategy of `worker.engine.blend` against `recompute`.

        seam: `splice`'s own seam repair (tokens per skill); suffix: the exact text after the
        composed prompt instead of the frame's question (the chat template's assistant header is
        added after it)."""
        self.require_portable()
        if isinstance(question, str):
            question = Question(question)
        ats = at if isinstance(at, list) else [at] * len(skills)
        if len(ats) != len(skills):
            raise EngineError(f"{len(skills)} skills but {len(ats)} positions")
        old = self.prefill(context) if isinstance(context, str) else context
        compiled = tuple(s if isinstance(s, Notes) else self.compile_skill(s) for s in skills)
        blend = Blend(context=old, skills=compiled, at_tokens=tuple(token_boundary(old, a)[0] for a in ats),
                      question=question, suffix=suffix, seams=(seam,) * len(skills), seam_tokens=seam_tokens,
                      epic_tokens=epic_tokens, selective_fraction=selective_fraction)
        return compose_run(self, blend, tuple(strategies), attention=attention, progress=progress)


_ENGINES: dict[tuple[str, str, torch.dtype], Engine] = {}


def load(name: str | None = None, device: str | None = None, store: KVStore | None = None,
         data_dir: Path | None = None, trust_remote_code: bool = False,
         dtype: str | torch.dtype | None = None, max_memory: dict | None = None,
         progress: TensorProgress | None = None) -> Engine:
    """An Engine for a model alias, local path or hub id; cached per process, device and dtype.

    device: "cpu", "cuda", "cuda:1", "auto" (spread over the GPUs; `max_memory` per device) … (default:
        CUDA when available). A device that is not there raises `DeviceError`.
    dtype: "float32", "bfloat16", "float16" or a torch dtype (default: bfloat16 on CUDA, float32 on
        the CPU); one the device cannot run raises `DeviceError`.
    store: the KV store prefill reuses prefixes from and skills are kept in (None: no store).
    data_dir: where bundled models are converted to (default `./var`; the worker and the command
        line pass their settings' data folder).
    progress: hears (tensors done, tensors in all) while a bundled model converts on first use."""
    name = name or DEFAULT_MODEL
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    key = (name, device, dtype)
    if key not in _ENGINES:
        model, tokenizer, info = load_model(name, device=device, dtype=dtype, data_dir=data_dir,
                                            trust_remote_code=trust_remote_code, max_memory=max_memory,
                                            progress=progress)
        _ENGINES[key] = Engine(model, tokenizer, info)
    engine = _ENGINES[key]
    if store is not None:
        engine.store = store
    return engine


@contextlib.contextmanager
def no_store(engine: Engine):
    saved, engine.store = engine.store, None
    try:
        yield engine
    finally:
        engine.store = saved
