"""Attribution, the notes map: which notes carry the decision — measured causally, by patching.

Start from the `in_place` cache of an edit: the field's own tokens already hold their new K/V, every
other token still holds the notes it took about the OLD value. Patch one span of those downstream
notes with its K/V from a full recompute and read the decision again: the share of the gap to
recompute that the patch closes is that span's attribution,

    share(S) = (KL(recompute ‖ in_place) − KL(recompute ‖ in_place + S from recompute))
               / KL(recompute ‖ in_place)

and the field's own share is how much of the stale → recompute gap refreshing the field alone closed.
The paper found the field's own K/V drives under 1% of the decision on its models; this measures it
for yours. With several fields, each changed stretch is also refreshed alone (the other fields left
as they were), and its own share of the stale → recompute gap measured.

Every share is that patch alone (the paper's causal patching): patches overlap in what they carry and
act together non-linearly, so the shares do not add up — not to each other, not with the field's
(whose denominator is the whole stale → recompute gap; a span's is what is left after the field).

Spans are cut on word boundaries (a cut falls only before a token that starts a word), so a span's
text never starts or ends mid-word.

Cost: only the first answer token's distribution is read (no choice scoring, no generation);
patched caches go through the model `BATCH` at a time, one forward of the question for the whole
batch; and the map is refined coarse to fine: spans of `COARSE × span_tokens` tokens first, then
`span_tokens` inside those that matter (`REFINE_SHARE`).
"""

from __future__ import annotations

from difflib import SequenceMatcher

import torch

from vocabulary import FLOOR, REFERENCE
from worker.engine.compare import fidelity
from worker.engine.edit import Editor
from worker.engine.notes import KV, cache_from_layers
from worker.engine.offsets import Insertions, new_to_document
from worker.engine.rope import NotPortableError
from worker.engine.strategies import EDITS
from worker.engine.strategies.edit import complete_notes
from worker.engine.types import Attribution, EditShare, EngineError, Field, Question, SpanShare

BATCH = 8  # patched caches per forward: 8 copies of a 1k-token cache of a 135M model is ~0.4 GB
COARSE = 4  # first pass: spans of 4 × span_tokens
REFINE_SHARE = 0.05  # coarse spans whose patch moves at least 5% of the gap are measured finely
# whitespace, and how tokenizers write it: Ġ Ċ ĉ (byte-level BPE), ▁ (SentencePiece)
WHITESPACE = " \n\t\u0120\u010a\u0109\u2581"


def notes_map(model, tokenizer, editor: Editor, full: list[KV], in_place: list[KV], stale: list[KV],
              prompt: list[int], span_tokens: int = 16, coarse: int = COARSE,
              stale_prompt: list[int] | None = None) -> Attribution:
    """The notes map of one edit from its three caches (recompute, in_place, stale) and the prompt
    read after them (`stale_prompt` after the stale notes, when it differs).

    Coarse to fine: spans of `coarse × span_tokens` tokens first; those whose patch closes (or
    opens) at least `REFINE_SHARE` of the gap are measured again in spans of `span_tokens`; the
    others stay coarse. `coarse=1` measures every fine span. Character offsets come from the
    editor's new tokens (offsets into the old document)."""
    if span_tokens < 1 or coarse < 1:
        raise EngineError("span_tokens and coarse must be at least 1")
    n = len(editor.new_ids)
    ref, base_logits = _first_token_logits(model, _stack([full, in_place]), prompt)
    stale_logits = _first_token_logits(model, _stack([stale]), stale_prompt or prompt)[0]
    kl_stale = fidelity(ref, stale_logits).kl_to_recompute
    kl_base = fidelity(ref, base_logits).kl_to_recompute
    starts = word_starts(tokenizer, editor.new_ids)
    changed = [b for b in editor.blocks if not b.reuse]
    first = changed[0].j1 if changed else n
    while 0 < first < n and not starts[first] and editor.new_segments[first - 1] != "frame":
        first -= 1  # the first span starts on the changed word's first token

    def measure(bounds: list[tuple[int, int]]) -> list[SpanShare]:
        out = []
        for i in range(0, len(bounds), BATCH):
            batch = bounds[i : i + BATCH]
            for (s, e), row in zip(
                batch, _first_token_logits(model, _patched(in_place, full, batch), prompt)
            ):
                kl = fidelity(ref, row).kl_to_recompute
                chars = [o for o in editor.new_offsets[s:e] if o[0] >= 0]
                out.append(SpanShare(s, e, tokenizer.decode(editor.new_ids[s:e]), _share(kl_base, kl), kl,
                                     min((c[0] for c in chars), default=-1),
                                     max((c[1] for c in chars), default=-1)))
        return out

    spans = measure([b for lo, hi in regions(editor, first, n)
                     for b in word_spans(starts, lo, hi, span_tokens * coarse)])
    if coarse > 1:
        wide = [sp for sp in spans if abs(sp.share) >= REFINE_SHARE and sp.end - sp.start > span_tokens]
        finer = measure([b for sp in wide for b in word_spans(starts, sp.start, sp.end, span_tokens)])
        spans = sorted([sp for sp in spans if sp not in wide] + finer, key=lambda sp: sp.start)
    field_share = _share(kl_stale, kl_base)
    return Attribution(kl_stale, kl_base, field_share, spans,
                       _edit_shares(model, editor, ref, kl_stale, kl_base, prompt))


def regions(editor: Editor, lo: int, hi: int) -> list[tuple[int, int]]:
    """Tokens [lo, hi) cut wherever the region changes: a placed skill (document tokens with no
    place in the document), a field's new value (its tokens all map to the field), the document,
    or another segment (erratum, frame). No span of the notes map crosses one, so a span is one
    region's and its label is what its highlight covers."""
    changed = {editor.new_offsets[j] for b in editor.blocks if not b.reuse for j in range(b.j1, b.j2)}

    def region(j: int) -> str:
        segment, offset = editor.new_segments[j], editor.new_offsets[j]
        if segment != "document":
            return segment
        if offset[0] < 0:
            return "skill"
        return "field" if offset in changed else "document"

    kinds = [region(j) for j in range(lo, hi)]
    cuts = [lo] + [lo + k for k in range(1, len(kinds)) if kinds[k] != kinds[k - 1]] + [hi]
    return list(zip(cuts, cuts[1:]))


def word_starts(tokenizer, ids: list[int]) -> list[bool]:
    """Per token: whether a word starts there (the token begins with whitespace, or follows a token
    that ends with it). A cut before such a token never splits a word."""
    pieces = [p or "" for p in tokenizer.convert_ids_to_tokens(list(ids))]
    return [j == 0 or pieces[j][:1] in WHITESPACE or pieces[j - 1][-1:] in WHITESPACE
            for j in range(len(pieces))]


def word_spans(starts: list[bool], lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """Tokens [lo, hi) in spans of about `size` tokens, each cut moved to the nearest word start
    (a span grows or shrinks by part of a word; a run with no word start stays one span)."""
    cuts = [lo]
    while cuts[-1] + size < hi:
        cut = _nearest_start(starts, cuts[-1] + size, cuts[-1], hi)
        if cut is None:
            break
        cuts.append(cut)
    return list(zip(cuts, [*cuts[1:], hi]))


def _nearest_start(starts: list[bool], target: int, lo: int, hi: int) -> int | None:
    """The word start nearest `target` strictly inside (lo, hi), the later one on a tie."""
    for d in range(hi - lo):
        for j in (target + d, target - d):
            if lo < j < hi and starts[j]:
                return j
    return None


def _edit_shares(model, editor: Editor, ref: torch.Tensor, kl_stale: float, kl_base: float,
                 prompt: list[int]) -> list[EditShare]:
    """Each changed stretch of the document refreshed alone, in place, the other changes left as
    the old tokens: the share of the stale → recompute gap it closes by itself. One stretch: the
    field's own share. None when a field alone changes the length on a model whose keys cannot be
    re-rotated (the fields are then only measured together)."""
    ops = SequenceMatcher(a=editor.old.token_ids, b=editor.new_ids, autojunk=False).get_opcodes()
    groups = _changed_stretches(editor, ops)
    if len(groups) < 2:
        return [EditShare(a, b, _share(kl_stale, kl_base), kl_base) for a, b, _ in groups]
    out = []
    field_alone = EDITS.field_alone()
    strategy = EDITS.build([field_alone])[field_alone]
    for a, b, members in groups:
        alone = _only(editor, ops, members)
        try:
            layers = complete_notes(strategy, alone).layers
        except NotPortableError:  # one field alone changes the length, and this model's keys cannot move
            return []
        logits = _first_token_logits(model, _stack([layers]), prompt)[0]
        kl = fidelity(ref, logits).kl_to_recompute
        out.append(EditShare(a, b, _share(kl_stale, kl), kl))
    return out


def _changed_stretches(editor: Editor, ops: list[tuple]) -> list[tuple[int, int, set[int]]]:
    """The changed opcodes grouped by the document characters they touch: (start, end, opcode
    indexes); opcodes whose characters overlap or touch are one stretch (one field's new value)."""
    groups: list[tuple[int, int, set[int]]] = []
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        chars = [o for o in editor.new_offsets[j1:j2] + editor.old.offsets[i1:i2] if o[0] >= 0]
        if tag == "equal" or not chars:
            continue
        a, b = min(o[0] for o in chars), max(o[1] for o in chars)
        if groups and a <= groups[-1][1]:
            pa, pb, members = groups[-1]
            groups[-1] = (pa, max(pb, b), members | {k})
        else:
            groups.append((a, b, {k}))
    return groups


def _only(editor: Editor, ops: list[tuple], members: set[int]) -> Editor:
    """An editor of the same old notes whose new tokens change only the opcodes `members`."""
    ids: list[int] = []
    segments: list[str] = []
    offsets: list[tuple[int, int]] = []
    old = editor.old
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal" or k in members:
            ids += editor.new_ids[j1:j2]
            segments += editor.new_segments[j1:j2]
            offsets += editor.new_offsets[j1:j2]
        else:
            ids += old.token_ids[i1:i2]
            segments += old.segments[i1:i2]
            offsets += old.offsets[i1:i2]
    return Editor(editor.model, editor.rope, old, ids, segments, offsets)


def attribute(engine, document: str, fields: list[Field], question: Question | str,
              span_tokens: int = 16, coarse: int = COARSE) -> Attribution:
    """The notes map of editing `fields` of `document` (`kvnotes attribute`): prefill, edit, map."""
    if isinstance(question, str):
        question = Question(question)
    old = engine.prefill(document)
    new_text = document
    for f in sorted(fields, key=lambda f: f.start, reverse=True):
        new_text = new_text[: f.start] + f.new_value + new_text[f.end:]
    new_ids, offsets, segments = engine.tokenize_document(new_text)
    offsets = [new_to_document(o, list(fields), Insertions()) for o in offsets]
    editor = Editor(engine.model, engine.rope, old, new_ids, segments, offsets)
    if len(new_ids) != old.n_tokens:
        engine.require_portable()
    prompt = engine.encode(engine.frame.suffix(question))
    full, moved, kept = (complete_notes(EDITS.build([name])[name], editor).layers
                         for name in (REFERENCE, EDITS.field_alone(), FLOOR))
    return notes_map(engine.model, engine.tokenizer, editor, full, moved, kept, prompt, span_tokens, coarse)


def _stack(caches: list[list[KV]]) -> list[KV]:
    """Caches of equal length side by side: per layer [len(caches), kv_heads, T, head_dim]."""
    return [(torch.cat([c[i][0] for c in caches]), torch.cat([c[i][1] for c in caches]))
            for i in range(len(caches[0]))]


def _patched(base: list[KV], donor: list[KV], bounds: list[tuple[int, int]]) -> list[KV]:
    """One batch of copies of `base`, copy i with tokens bounds[i] of every layer taken from `donor`:
    per layer [len(bounds), kv_heads, T, head_dim], written once (no per-copy clone, no concatenation)."""
    out = []
    for (bk, bv), (dk, dv) in zip(base, donor):
        k = bk.expand(len(bounds), -1, -1, -1).clone()
        v = bv.expand(len(bounds), -1, -1, -1).clone()
        for i, (start, end) in enumerate(bounds):
            k[i, :, start:end], v[i, :, start:end] = dk[0, :, start:end], dv[0, :, start:end]
        out.append((k, v))
    return out


@torch.inference_mode()
def _first_token_logits(model, stacked: list[KV], prompt: list[int]) -> torch.Tensor:
    """The first answer token's logits after each cache of the batch `stacked` and `prompt`:
    float32 [batch, vocab], in one forward."""
    batch = stacked[0][0].shape[0]
    ids = torch.tensor([prompt] * batch, device=model.device)
    out = model(input_ids=ids, cache=cache_from_layers(stacked, model), use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].float()


def _share(before: float, after: float) -> float:
    return 0.0 if before <= 1e-12 else (before - after) / before
