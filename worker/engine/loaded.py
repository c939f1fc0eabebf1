"""A loaded model and what it does with notes: tokens in the model's frame, prefill (through the KV
store), skills compiled and kept, and placements spliced in. `worker.engine.engine.Engine` is this
plus the runs (edit, compose); the run and measure modules speak only this part, so they never
import the engine that calls them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator

import torch

from worker.engine.compose import Placement, lay_out, splice_all, token_boundary
from worker.engine.devices import on_layer_devices
from worker.engine.fingerprint import fingerprint
from worker.engine.forward import extend
from worker.engine.models import ModelInfo
from worker.engine.notes import Notes
from worker.engine.readout import make_frame
from worker.engine.rope import NotPortableError, RopeLayout, rope_layout
from worker.engine.split_attention import install as install_split_attention
from worker.engine.store import KVStore
from worker.engine.store_tiers import Reuse
from worker.engine.types import EngineError

log = logging.getLogger(__name__)


class LoadedModel:
    """A model, its tokenizer and frame, and the KV store its notes go through."""

    def __init__(self, model, tokenizer, info: ModelInfo, store: KVStore | None = None):
        self.model, self.tokenizer, self.info = model, tokenizer, info
        install_split_attention(model)  # forwards after cached notes attend in two parts (no copy of them)
        self.frame = make_frame(tokenizer)
        self.store = store
        try:
            self.rope: RopeLayout | None = rope_layout(model)
            self.rope_error = ""
        except NotPortableError as exc:
            self.rope, self.rope_error = None, str(exc)
        self._warm = False
        self.last_reuse: Reuse | None = None  # the last prefill's store lookup (None: no store)
        self._fingerprint = ""  # the checkpoint's (`worker.engine.fingerprint`), read on first use
        self.store_scope = ""  # "" (the deployment's notes) or a salt: one user's (`scoped`)

    @property
    def device(self) -> torch.device:
        return self.model.device

    # ---- tokens -------------------------------------------------------------------------------
    def tokenize_document(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[str]]:
        """Frame + document → ids, per-token char offsets into `text` ((-1,-1) in the frame), segments."""
        prefix = self.frame.prefix
        enc = self.tokenizer(prefix + text, add_special_tokens=self.frame.add_special_tokens,
                             return_offsets_mapping=True)
        ids, offsets, segments = list(enc["input_ids"]), [], []
        for start, end in enc["offset_mapping"]:
            if end <= len(prefix):  # the chat template's head, or a start token the tokenizer added
                offsets.append((-1, -1))
                segments.append("frame")
            else:
                offsets.append((max(start - len(prefix), 0), end - len(prefix)))
                segments.append("document")
        return ids, offsets, segments

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def start_token(self) -> int:
        """The model's start token, used as the attention sink a skill is compiled with."""
        tok = self.tokenizer
        if tok.bos_token_id is not None:
            return tok.bos_token_id
        if self.frame.prefix:
            return self.encode(self.frame.prefix)[0]
        return tok.eos_token_id

    # ---- prefill ------------------------------------------------------------------------------
    @property
    def model_key(self) -> str:
        """What the KV store keys this model's notes by: alias, dtype (bf16 notes are not fp32 notes),
        a fingerprint of the checkpoint (other weights under the same alias never share notes; read
        once) and, inside `scoped`, the scope's salt (one user's notes are nobody else's)."""
        if not self._fingerprint:
            self._fingerprint = fingerprint(self.model)
        key = f"{self.info.alias}:{self.model.dtype}:{self._fingerprint[:16]}"
        return f"{key}:{self.store_scope}" if self.store_scope else key

    @contextlib.contextmanager
    def scoped(self, owner: str | None) -> Iterator[None]:
        """Key the store's notes by `owner` inside the block (KVNOTES_STORE_SCOPE=user): a lookup
        finds only what the same owner prefilled, so neither `store_reuse` nor timing tells one user
        what another prefilled. None: the deployment's notes, shared by everyone (the default)."""
        saved = self.store_scope
        self.store_scope = "" if owner is None else \
            "user-" + hashlib.sha256(b"kvnotes store scope\0" + owner.encode()).hexdigest()[:16]
        try:
            yield
        finally:
            self.store_scope = saved

    @torch.inference_mode()
    def _prefill_ids(self, ids: list[int]) -> list:
        """Full K/V of `ids`, reusing the longest prefix the KV store holds."""
        cached_n, cached = (0, None)
        self.last_reuse = None
        if self.store is not None:
            cached_n, cached = self.store.get_prefix(self.model_key, ids)
            self.last_reuse = self.store.last_reuse
        if cached_n and cached is not None:
            layers = on_layer_devices(cached, self.model)
            if cached_n < len(ids):
                layers = extend(self.model, layers, ids[cached_n:])
        else:
            layers = extend(self.model, None, ids)
        if self.store is not None and cached_n < len(ids):
            self.store.put(self.model_key, ids, [(k[0], v[0]) for k, v in layers])
        return layers

    def prefill(self, text: str) -> Notes:
        """Prefill the framed document and keep its notes: the FULL K/V of every layer."""
        ids, offsets, segments = self.tokenize_document(text)
        return Notes(ids, offsets, segments, self._prefill_ids(ids), text=text, rope=self.rope,
                     immobile_reason=self.rope_error)

    def compile_skill(self, text: str, sink: bool = True) -> Notes:
        """Prefill a skill once, after the start token (its attention sink, dropped when spliced).
        `sink=False` prefills the bare skill — worse, kept to measure exactly that."""
        if not text.strip():
            raise EngineError("a skill needs some text")
        body = self.encode(text)
        ids = ([self.start_token()] if sink else []) + body
        offsets = [(-1, -1)] * len(ids)
        segments = (["sink"] if sink else []) + ["skill"] * len(body)
        return Notes(ids, offsets, segments, self._prefill_ids(ids), text=text, rope=self.rope,
                     immobile_reason=self.rope_error)

    def save_skill(self, skill: Notes) -> str:
        """Keep a compiled skill's notes in the KV store; returns the key `stored_skill` takes."""
        if self.store is None:
            raise EngineError("this engine has no KV store to keep skills in")
        layers = [(k[0], v[0]) for k, v in skill.layers]  # drop the batch dimension
        key = self.store.put(self.model_key, skill.token_ids, layers, segments=skill.segments,
                             first_position=skill.first_position)
        if key is None:  # runs still splice the skill: they compile it again when it is not stored
            raise EngineError("the KV store could not keep the compiled skill (full disk or permissions; "
                              "see the worker log)")
        return key

    def stored_skill(self, key: str, text: str) -> Notes | None:
        """The compiled skill `save_skill` kept under `key`, or None when it is missing, evicted,
        corrupt or was not stored as a skill (the caller compiles it again)."""
        entry = self.store.get_entry(key) if self.store is not None else None
        if entry is None or len(entry.segments) != len(entry.token_ids):
            return None
        return Notes(
            token_ids=entry.token_ids,
            offsets=[(-1, -1)] * len(entry.token_ids),
            segments=entry.segments,
            layers=on_layer_devices(entry.layers, self.model),
            text=text,
            first_position=entry.first_position,
            rope=self.rope,
            immobile_reason=self.rope_error,
        )

    def require_portable(self) -> None:
        if self.rope is None:
            raise NotPortableError(f"{self.info.alias}: {self.rope_error}")

    def warm_up(self, n_tokens: int = 128) -> None:
        """One short and one longer forward before anything is timed (first calls of a shape are slow)."""
        if not self._warm:
            ids = (self.encode("warm up the kernels once. ") or [0]) * 64
            layers = extend(self.model, None, ids[: max(8, min(n_tokens, 256))])
            extend(self.model, layers, ids[:4])
            self._warm = True

    # ---- composing ----------------------------------------------------------------------------
    def compose_notes(self, context: Notes, placements: list[Placement]) -> tuple[Notes, str, int]:
        """Splice every placement into `context`. Returns the composed notes, the composed text
        (what recompute reads) and how many tokens seam repair ran through the model."""
        if not placements:
            return context, context.text, 0
        self.require_portable()
        skills = [p.notes if p.notes is not None else self.compile_skill(p.text) for p in placements]
        snapped = [token_boundary(context, p.at) for p in placements]
        layout = lay_out(context, skills, [t for t, _ in snapped])
        notes = splice_all(self.model, context, skills, layout, [p.seam for p in placements])
        pieces, last_char = [], 0
        for i in layout.order:
            char = snapped[i][1]
            pieces += [context.text[last_char:char], placements[i].text]
            last_char = char
        pieces.append(context.text[last_char:])
        ordered = (placements[i] for i in layout.order)
        seam_tokens = sum(min(p.seam, e - s) for p, (s, e) in zip(ordered, layout.spans))
        return notes, "".join(pieces), seam_tokens
