"""Mechanism: why a decision moved, causally — knockout with a random control, selective@K with
its K*, and a logit lens per strategy (the paper's mechanism experiments, on one run).

Everything is read at the deciding token (issue 43): a choice question's first answer token (the
choice whose first token is most probable); a free answer's token where recompute's answer first
names a field's value, recompute's answer up to there teacher-forced (appended to the question's
tokens), else the first token where recompute's and stale's answers differ (`Mechanism.read_at`
says which). Recompute's token there (`Mechanism.answer`) and its decision are what every variant
is measured against, with KL(recompute ‖ variant). With chain of thought the first answer token is
the reasoning's first, not the final answer.

Cost (`Mechanism.costs`, in recomputes: tokens run through the model over the tokens of one
recompute of the document and question): knockout is a few dozen question-length forwards per
strategy, batched; selective@K recomputes each distinct set of tokens once, batched; the lens is
one question-length forward per strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from vocabulary import FLOOR, REFERENCE
from vocabulary.agreement import DecidingToken, agrees, deciding_token
from worker.engine.attention import capture_attention
from worker.engine.edit import Editor
from worker.engine.mechanism.knockout import knockout, regions_of
from worker.engine.mechanism.lens import lens
from worker.engine.mechanism.masked import Probe, prompt_logits
from worker.engine.mechanism.selective_k import sweep, unmasked_reading
from worker.engine.mechanism.types import Mechanism
from worker.engine.notes import KV
from worker.engine.selective import movement
from worker.engine.strategies import EDITS
from worker.engine.strategies.edit import complete_notes
from worker.engine.types import Attribution, Question, StrategyResult

if TYPE_CHECKING:
    from worker.engine.loaded import LoadedModel
    from worker.engine.strategies.measure import Outcome

SEED = 0  # the random controls' generator


def explain(engine: LoadedModel, editor: Editor, chosen: dict[str, Outcome],
            results: dict[str, StrategyResult],
            suffix_ids: list[int], question: Question, fields: list[tuple[int, int]],
            attribution: Attribution | None = None, seed: int = SEED,
            progress: Callable[[str, float], None] | None = None, values: Sequence[str] = ()) -> Mechanism:
    """The three views of a run from its measured outcomes (`chosen`, by strategy, recompute's
    among them), their results, the question's tokens and the fields' document spans; `values`:
    the fields' old and new values (a free answer is read where recompute's names one)."""
    step = progress or (lambda stage, fraction: None)
    model, ref = engine.model, chosen[REFERENCE]
    if not ref.readout.answer_ids:
        return Mechanism("", "", None, notes=["recompute gave no answer token, so there is no decision "
                                             "to explain (an empty answer)"])
    at = _deciding(engine, chosen, question, values)
    answer_ids = ref.readout.answer_ids
    answer_id = answer_ids[at.index]
    # teacher-force recompute's answer up to the deciding token: every view reads the token after it
    suffix_ids = list(suffix_ids) + list(answer_ids[:at.index])
    firsts = [(c, engine.tokenizer(engine.frame.choice_text(c), add_special_tokens=False)["input_ids"][0])
              for c in question.choices]
    recompute_layers = ref.surgery.layers
    reference = prompt_logits(model, recompute_layers, suffix_ids, [[None] * len(recompute_layers)])[0]
    probe = Probe.of(reference, answer_id, firsts, engine.tokenizer.decode)
    shown = _shown(results, question, values)
    out = Mechanism(engine.tokenizer.decode([answer_id]), probe.decision(reference), shown)
    forced = engine.tokenizer.decode(list(answer_ids[:at.index]))
    out.read_at = f"answer token {at.index + 1} ({out.answer.strip()!r}), {at.why}"
    if at.index:
        out.read_at += f"; recompute's answer before it ({forced.strip()!r}) teacher-forced"
    if firsts and not probe.choices:
        out.notes.append("the choices share their first token, so the decision there is the most "
                         "probable token")
    if question.cot:
        out.notes.append("with chain of thought, the first answer token is the reasoning's first")
    total = len(editor.new_ids) + len(suffix_ids)  # one recompute's tokens
    generator = torch.Generator().manual_seed(seed)

    attention: dict[str, torch.Tensor] = {}
    rows = 0
    for i, name in enumerate([REFERENCE] + ([shown] if shown else [])):
        step("mechanism: knockout", i / 2)
        s = chosen[name].surgery
        prompt = list(s.pending) + list(suffix_ids)
        attention[name] = _decision_attention(model, s.layers, prompt)
        regions = regions_of(s.segments, s.offsets, len(suffix_ids), fields)
        unmasked, found, run = knockout(model, probe, name, s.layers, prompt, regions, attention[name],
                                        generator)
        out.unmasked[name], rows = unmasked, rows + run + len(prompt)
        out.knockout += found
    out.costs["knockout"] = rows / total

    step("mechanism: selective@K", 0.0)
    changed = [j for b in editor.blocks if not b.reuse for j in range(b.j1, b.j2)]
    if not changed:
        out.notes.append("selective@K: no field changed the notes, so there is nothing to recompute")
    else:
        field_alone = EDITS.field_alone()  # the notes selective@K starts from (K = 0)
        measured = chosen.get(field_alone)
        alone = (measured.surgery if measured is not None
                 else complete_notes(EDITS.build([field_alone])[field_alone], editor))
        start = changed[0]
        downstream = [j for b in editor.blocks if b.reuse and b.j1 >= start for j in range(b.j1, b.j2)]
        base, run = unmasked_reading(model, probe, alone.layers, list(suffix_ids))
        out.downstream = len(downstream)
        if base.decision == probe.decision(reference):  # K* = 0 under every ranking: nothing to find
            out.selective_skipped = (f"{field_alone} (the field alone, K = 0) already gives {REFERENCE}'s "
                                     f"decision ({base.decision!r}), so K* = 0 under every ranking: the "
                                     "sweep was skipped")
            out.costs["selective_k"] = run / total
        else:
            rankings, cost = _rankings(model, alone.layers, editor.new_ids, start, downstream,
                                       attention[REFERENCE], attribution, generator)
            curves, swept = sweep(model, probe, alone.layers, editor.new_ids, suffix_ids, changed,
                                  downstream, rankings, lambda f: step("mechanism: selective@K", f))
            out.selective_k = curves
            out.costs["selective_k"] = (run + swept + cost) / total

    rows = 0
    for i, (name, outcome) in enumerate(chosen.items()):
        step("mechanism: logit lens", i / max(len(chosen), 1))
        s = outcome.surgery
        prompt = list(s.pending) + list(suffix_ids)
        out.logit_lens[name] = lens(model, s.layers, prompt, answer_id)
        rows += len(prompt)
    out.costs["logit_lens"] = rows / total
    return out


def _deciding(engine: LoadedModel, chosen: dict[str, Outcome], question: Question,
              values: Sequence[str]) -> DecidingToken:
    """Where to read: a choice question at its first answer token (the choices are told apart
    there); a free answer where recompute's answer first names a value, else where recompute's and
    stale's answers first differ (`vocabulary.agreement.deciding_token`)."""
    ids = chosen[REFERENCE].readout.answer_ids
    if question.choices or question.cot:
        first = "the first answer token" + (" (the reasoning's first)" if question.cot else "")
        return DecidingToken(0, first)
    prefixes = [engine.tokenizer.decode(ids[:t + 1]) for t in range(len(ids))]
    floor = chosen.get(FLOOR)
    return deciding_token(prefixes, values, ids, floor.readout.answer_ids if floor is not None else None)


def _shown(results: dict[str, StrategyResult], question: Question, values: Sequence[str] = ()) -> str | None:
    """The strategy the run page opens on: the one that decides otherwise than recompute under the
    one rule (`vocabulary.agreement`: the same choice, the same values named whatever the wording,
    else the first answer token) with the largest KL, else the largest KL (None when recompute ran
    alone)."""
    others = {n: r for n, r in results.items() if n != REFERENCE}
    if not others:
        return None
    ref = results.get(REFERENCE)

    def differs(r: StrategyResult) -> bool:
        if ref is None:
            return not r.decision_matches_recompute
        return not agrees(r.decision, ref.decision, choices=question.choices, values=values,
                          first_token=r.top1_agrees)

    return max(others, key=lambda n: (differs(others[n]), others[n].kl_to_recompute))


def _decision_attention(model, layers: list[KV], prompt: list[int]) -> torch.Tensor:
    """The decision's attention per position (notes, then the prompt), mean over layers and heads."""
    weights, _ = capture_attention(model, layers, prompt, len(prompt) - 1)
    return torch.from_numpy(weights).float().mean(dim=(0, 1))


def _rankings(model, layers: list[KV], ids: list[int], start: int, downstream: list[int],
              attention: torch.Tensor, attribution: Attribution | None,
              generator: torch.Generator) -> tuple[dict[str, list[int] | str], int]:
    """The downstream positions best first, per ranking (or why a ranking is missing), and the
    token rows ranking cost."""
    def by(score) -> list[int]:
        return sorted(downstream, key=lambda j: (-score(j), j))

    out: dict[str, list[int] | str] = {}
    if attribution is None:
        out["notes_map"] = "the notes map was not measured on this run (tick Notes map to rank by it)"
    else:
        share = {j: s.share for s in attribution.spans for j in range(s.start, s.end)}
        out["notes_map"] = by(lambda j: share.get(j, 0.0))
    out["attention"] = by(lambda j: float(attention[j]))
    moved = movement(model, layers, ids, start)
    out["kv_deviation"] = by(lambda j: float(moved[j - start]))
    order = torch.randperm(len(downstream), generator=generator).tolist()
    out["random"] = [downstream[i] for i in order]
    return out, len(ids) - start
