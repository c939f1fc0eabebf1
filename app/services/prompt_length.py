"""How long a trajectory's prompt grows, counted by the web before anything is saved: a turn whose
prompt would be past the model's context is a 422 naming the turn and the length.

The web app never loads torch or transformers (tests/test_layers.py), so it reads the converted
model's files instead, where the worker converts them (`worker.engine.models.converted_dir`:
`<data>/models/<alias>/`; the embedded default, `kvnotes serve`, shares one data folder between the
web and the worker):
- `tokenizer.json`, read by the `tokenizers` package: Rust with Python bindings, no torch, and the
  very library transformers' fast tokenizers run on, so the counts are the worker's;
- `config.json`: the context is its `max_position_embeddings`, the attribute the worker reads;
- the chat template (`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`), rendered
  here with jinja2 in a sandbox the way transformers renders it, for the frame's head and tail
  (`worker.engine.readout.make_frame`); a model without one is read as a base model (its start token
  added by the tokenizer's post-processor, the question closed by `PLAIN_TAIL`).

Where the web cannot see those files (a web container without the models volume, a tiny test model
built in memory, a template that does not render here), it does not guess: the worker's own check
(`worker.engine.trajectory.check`) fails the trajectory before its first turn, naming the turn and the
length, and the Turns panel says so before Start (`unchecked_here`). Both count the same: the frame,
the document with the fields' values of that turn, every
turn's text so far, every erratum appended so far and the turn's question. The worker adds 8 tokens
of margin; the web refuses only a prompt past the context without it, so it never refuses one the
worker would run.

Nothing of this runs in the web process. Reading gemma3-270m's 33 MB `tokenizer.json` takes 0.6 s of
one core, and `tokenizers` holds the GIL throughout (4.9 s measured on a loaded machine): inside a
web process that starves every other thread, uvicorn's supervisor's health ping included (it kills
a child silent for 5 s), so a page that loaded it killed its process (issue 51 item 1). The model's
files are read and every count made in one helper process per web process (`_counter`, spawned on
first use), which the request waits on without holding the GIL. A page needs no count: the Turns
panel (`unchecked_here`) only looks whether the files are here, and asks the helper to read them
(`warm`) while the user types the turns, so Start finds them read.

Counting is cheap: each piece (the document per set of values, each turn's text, each erratum, each
question) is tokenized once and the pieces are summed; a turn whose sum comes within `slack` of the
context is counted again exactly, as one text, and only an exact count past the context is refused
(a piece boundary can merge or split a token or two, never more).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.services.errors import Unprocessable
from data.settings import get_settings
from vocabulary import render_erratum
from vocabulary.prompt import PLAIN_TAIL, question_text
from vocabulary.trajectories import TrajectorySpec

log = logging.getLogger(__name__)

_MARK = "\x00KVNOTES-DOCUMENT\x00"  # where the document goes in the rendered template (as the worker)


@dataclass(frozen=True)
class ModelText:
    """What the web reads of a converted model: its tokenizer, its context and its frame."""

    alias: str
    context: int
    tokenizer: Any  # tokenizers.Tokenizer
    prefix: str  # the chat template's head before the document ("" for a base model)
    tail: str  # the template's tail after the question (end of turn, assistant header)
    chat: bool

    def count(self, text: str) -> int:
        """Tokens of text inside the prompt (no special tokens added)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def counts(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def framed(self, text: str) -> int:
        """Tokens of the frame's head and `text` as the worker tokenizes the document
        (`LoadedModel.tokenize_document`: a base model's start token added)."""
        return len(self.tokenizer.encode(self.prefix + text, add_special_tokens=not self.chat).ids)

    def suffix(self, question: str, choices: tuple[str, ...]) -> str:
        """The question after the document, closed by the template's tail (`Frame.suffix`)."""
        return question_text(question, choices) + (self.tail if self.chat else PLAIN_TAIL)


def model_folder(alias: str) -> Path:
    return get_settings().data_dir / "models" / alias


def _stamp(folder: Path) -> tuple[int, ...] | None:
    """The model files' modification times (a changed file is read again), or None when one is missing."""
    try:
        return tuple((folder / name).stat().st_mtime_ns for name in ("tokenizer.json", "config.json"))
    except OSError:
        return None


def model_text(alias: str) -> ModelText | None:
    """The model's files as read here, or None when they are not on this host (or cannot be read
    here): then the worker checks. This loads the tokenizer in THIS process: only the counter
    process (`_counter`) and tests call it; the web asks `check_fits`."""
    folder = model_folder(alias)
    stamp = _stamp(folder)
    return None if stamp is None else _read(str(folder), alias, stamp)


@lru_cache(maxsize=8)
def _read(folder_name: str, alias: str, _stamp: tuple[int, ...]) -> ModelText | None:
    folder = Path(folder_name)
    try:
        from tokenizers import Tokenizer  # torch-free; imported on first use only

        context = _config_context(folder)
        if context is None:
            return None
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        frame = _frame(folder)
    except Exception as exc:  # an unreadable file, a template that does not render here: the worker checks
        log.warning("prompt length: the model's files could not be read here",
                    extra={"model": alias, "reason": type(exc).__name__})
        return None
    if frame is None:
        return ModelText(alias, context, tokenizer, "", "", chat=False)
    prefix, tail = frame
    return ModelText(alias, context, tokenizer, prefix, tail, chat=True)


def _config_context(folder: Path) -> int | None:
    """The model's context from its config.json (a small file), or None when it names none."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        context = config.get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return context if isinstance(context, int) and context > 0 else None


def _template(folder: Path) -> tuple[str | None, dict]:
    """The chat template's source (None: a base model) and the tokenizer's config."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), config
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: transformers uses "default"
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    return (source if isinstance(source, str) and source else None), config


def _frame(folder: Path) -> tuple[str, str] | None:
    """(head, tail) of the chat template around one user message, with the generation prompt, as
    transformers renders it (sandboxed jinja2, trim_blocks, lstrip_blocks, loopcontrols, its tojson
    and raise_exception, the tokenizer's special tokens as variables); None for a base model."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source, config = _template(folder)
    if source is None:
        return None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: (
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys))
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    special = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
    text = env.from_string(source).render(messages=[{"role": "user", "content": _MARK}], tools=None,
                                          documents=None, add_generation_prompt=True, **special)
    head, tail = text.split(_MARK)
    return head, tail


@dataclass(frozen=True)
class TooLong:
    """The first turn whose prompt is past the context: its index (0-based), the prompt's length."""

    index: int
    tokens: int
    context: int
    errata: int

    def message(self, model: str) -> str:
        # "errat" + ending: the word alone would read as the strategy's name to tests/test_strategy_names.py
        errata = f", {self.errata} errat{'um' if self.errata == 1 else 'a'}" if self.errata else ""
        return (f"turn {self.index + 1}: the prompt would be {self.tokens} tokens (the document, every "
                f"turn's text so far{errata} and the question), past {model}'s context of "
                f"{self.context} tokens")


def _document(spec: TrajectorySpec, values: dict[str, str]) -> str:
    """The document with the fields' current values (the worker's `_text`)."""
    text = spec.document
    for f in sorted(spec.fields, key=lambda f: f.start, reverse=True):
        text = text[:f.start] + values[f.label] + text[f.end:]
    return text


def _skill_text(spec: TrajectorySpec, turn) -> str:
    """The text of the skill a turn places, when trajectories carry skills (`TurnSpec.skill`)."""
    name = getattr(turn, "skill", None)
    skills = getattr(spec, "skills", ())
    return next((s.text for s in skills if s.name == name), "") if name else ""


def first_too_long(spec: TrajectorySpec, model: ModelText) -> TooLong | None:
    """The first turn of `spec` whose prompt is past the model's context, or None when every turn
    fits. Turns with an unknown field label are left to `plan`'s check (which runs first)."""
    values = {f.label: spec.document[f.start:f.end] for f in spec.fields}
    texts = [_skill_text(spec, t) + t.append for t in spec.turns]
    appended_counts = model.counts(texts)
    documents: dict[str, int] = {}
    suffixes: dict[tuple[str, tuple[str, ...]], int] = {}
    appended, appended_tokens, errata, n_errata = "", 0, 0, 0
    for i, turn in enumerate(spec.turns):
        for label, value in turn.fields.items():
            if label in values and value != values[label]:
                errata += model.count(render_erratum(label, values[label], value))
                n_errata += 1
                values[label] = value
        appended += texts[i]
        appended_tokens += appended_counts[i]
        document = _document(spec, values)
        if document not in documents:
            documents[document] = model.framed(document)
        ask = ((turn.question, tuple(turn.choices or ())) if turn.question is not None
               else (spec.question, tuple(spec.choices)))
        if ask not in suffixes:
            suffixes[ask] = model.count(model.suffix(*ask))
        rest = errata + suffixes[ask]
        slack = 16 + 4 * (i + 1 + n_errata)
        if documents[document] + appended_tokens + rest + slack <= model.context:
            continue
        exact = model.framed(document + appended) + rest
        if exact > model.context:
            return TooLong(i, exact, model.context, n_errata)
    return None


# ---- the counter: one helper process per web process reads the files and counts ----------------

COUNT_WAIT_S = 120.0  # how long Start waits for a count (a first read on a loaded machine: seconds)
_UNREADABLE = "unreadable"  # the counter's answer when the files cannot be read there
_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_read_there: dict[str, tuple[tuple[int, ...], Future]] = {}  # folder: (its stamp, the counter's read)


def _watch_parent(parent: int) -> None:
    """In the counter: exit once the web process that started it is gone (no orphan holds a model's
    tokenizer). A thread polling, not the parent-death signal: that fires when the THREAD that
    spawned the counter ends, and a request's thread ends when the server's pool shrinks."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="kvnotes-counter-parent", daemon=True).start()


def _counter() -> ProcessPoolExecutor:
    """This process's counter, started on first use (spawned: the web process's threads and
    connections are not forked into it)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_watch_parent, initargs=(os.getpid(),))
        return _pool


def _forget_counter(pool: ProcessPoolExecutor) -> None:
    """A counter that died (killed, out of memory) is replaced on next use."""
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
            _read_there.clear()
    pool.shutdown(wait=False, cancel_futures=True)


def _readable_there(folder: str, alias: str, stamp: tuple[int, ...]) -> bool:
    """In the counter: read the model's files (kept for the counts that follow)."""
    return _read(folder, alias, stamp) is not None


def _too_long_there(folder: str, alias: str, stamp: tuple[int, ...],
                    spec: TrajectorySpec) -> TooLong | str | None:
    """In the counter: `first_too_long`, or `_UNREADABLE`."""
    model = _read(folder, alias, stamp)
    return _UNREADABLE if model is None else first_too_long(spec, model)


def warm(alias: str) -> None:
    """Have the counter read `alias`'s files now (once per version of them), without waiting."""
    folder = model_folder(alias)
    stamp = _stamp(folder)
    if stamp is None:
        return
    key = str(folder)
    with _lock:
        known = _read_there.get(key)
        if known is not None and known[0] == stamp:
            return
    pool = _counter()
    try:
        future = pool.submit(_readable_there, key, alias, stamp)
    except (BrokenProcessPool, RuntimeError):
        _forget_counter(pool)
        return
    with _lock:
        _read_there[key] = (stamp, future)


def _known_unreadable(alias: str, stamp: tuple[int, ...]) -> bool:
    """The counter read `alias`'s files (this version of them) and could not use them."""
    with _lock:
        known = _read_there.get(str(model_folder(alias)))
    if known is None or known[0] != stamp or not known[1].done():
        return False
    try:
        return known[1].result() is False
    except Exception:  # the counter died reading them: counted as unreadable until they change
        return True


def check_fits(spec: TrajectorySpec) -> None:
    """`Unprocessable` naming the first turn whose prompt is past the model's context; nothing when
    every turn fits, or when the model's files are not on this host or cannot be read by the
    counter (the worker checks then). Waits for the counter (never on the event loop: the caller
    runs in a thread), at most `COUNT_WAIT_S`."""
    folder = model_folder(spec.model)
    stamp = _stamp(folder)
    if stamp is None:
        return
    pool = _counter()
    try:
        found = pool.submit(_too_long_there, str(folder), spec.model, stamp, spec).result(COUNT_WAIT_S)
    except FutureTimeout:
        log.warning("prompt length: the counter did not answer in time; the worker checks",
                    extra={"model": spec.model, "seconds": COUNT_WAIT_S})
        return
    except (BrokenProcessPool, RuntimeError):
        log.warning("prompt length: the counter died; the worker checks", extra={"model": spec.model})
        _forget_counter(pool)
        return
    if isinstance(found, TooLong):
        raise Unprocessable(f"turns.{found.index}", found.message(spec.model))


def unchecked_here(alias: str) -> str | None:
    """Why a trajectory's prompt lengths on `alias` cannot be checked when it is started (the
    sentence the Turns panel shows), or None when they are: the model's files are on this host (and
    the counter, asked to read them now, has not found them unusable). Reads no tokenizer here."""
    stamp = _stamp(model_folder(alias))
    if stamp is not None and not _config_context(model_folder(alias)):
        stamp = None
    if stamp is not None:
        warm(alias)
        if not _known_unreadable(alias, stamp):
            return None
    return (f"Prompt lengths are checked by the worker, not at once: {alias}'s tokenizer and config are "
            "not on this web server, so a turn past the model's context fails the trajectory when the "
            "worker starts it (within seconds, naming the turn and its length, before any turn runs).")
