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
from vocabulary.agreement import DecidingToken, agrees, deciding_token, value_token
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
    base_suffix = list(suffix_ids)
    # teacher-force recompute's answer up to the deciding token: recompute's views (and selective@K,
    # which asks what restores recompute's decision) read the token after it
    suffix_ids = base_suffix + list(answer_ids[:at.index])
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
    # every other strategy is read at ITS OWN answer's deciding token, its own answer teacher-forced
    # before it (issue 51 item 7), so each view describes the answer the decision table shows
    points = {REFERENCE: (suffix_ids, probe)}
    out.answer_by[REFERENCE], out.read_at_by[REFERENCE] = out.answer, out.read_at
    for name in chosen:
        if name == REFERENCE:
            continue
        own_suffix, own_probe, own_at = _own_point(engine, name, chosen, question, values, base_suffix,
                                                   firsts, recompute_layers)
        points[name] = (own_suffix, own_probe)
        token = engine.tokenizer.decode([own_probe.answer_id])
        out.answer_by[name] = token
        forced = "; its answer before it teacher-forced" if own_at.index else ""
        out.read_at_by[name] = (f"answer token {own_at.index + 1} ({token.strip()!r}) of {name}'s own "
                                f"answer, {own_at.why}{forced}")
    total = len(editor.new_ids) + len(suffix_ids)  # one recompute's tokens
    generator = torch.Generator().manual_seed(seed)

    attention: dict[str, torch.Tensor] = {}
    rows = 0
    for i, name in enumerate([REFERENCE] + ([shown] if shown else [])):
        step("mechanism: knockout", i / 2)
        s = chosen[name].surgery
        own_suffix, own_probe = points[name]
        prompt = list(s.pending) + list(own_suffix)
        attention[name] = _decision_attention(model, s.layers, prompt)
        regions = regions_of(s.segments, s.offsets, len(own_suffix), fields)
        unmasked, found, run = knockout(model, own_probe, name, s.layers, prompt, regions, attention[name],
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
        own_suffix, own_probe = points[name]
        prompt = list(s.pending) + list(own_suffix)
        out.logit_lens[name] = lens(model, s.layers, prompt, own_probe.answer_id)
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


def _own_answer(name: str, chosen: dict[str, Outcome]) -> list[int]:
    """A strategy's own answer tokens (recompute's when it gave none)."""
    return list(chosen[name].readout.answer_ids) or list(chosen[REFERENCE].readout.answer_ids)


def _own_deciding(engine: LoadedModel, name: str, chosen: dict[str, Outcome], question: Question,
                  values: Sequence[str]) -> DecidingToken:
    """Where strategy `name`'s own answer decides: a choice question's first answer token; a free
    answer's token where it first names (and tells apart) a value, else the first token where it
    parts from recompute's answer (`vocabulary.agreement.deciding_token`, recompute in the floor's
    place), else its first."""
    ids = _own_answer(name, chosen)
    if question.choices or question.cot:
        return DecidingToken(0, "the first answer token")
    prefixes = [engine.tokenizer.decode(ids[:t + 1]) for t in range(len(ids))]
    at = deciding_token(prefixes, values, ids, chosen[REFERENCE].readout.answer_ids)
    if value_token(prefixes, values) is not None:
        return DecidingToken(at.index, "where it first names a value")
    if "does not differ" not in at.why:
        return DecidingToken(at.index, "it names no value: the first token where it parts from recompute's")
    return DecidingToken(0, "it names no value and does not part from recompute's answer: its first token")


def _own_point(engine: LoadedModel, name: str, chosen: dict[str, Outcome], question: Question,
               values: Sequence[str], base_suffix: list[int], firsts: list[tuple[str, int]],
               recompute_layers) -> tuple[list[int], Probe, DecidingToken]:
    """Strategy `name`'s reading point: the question's tokens and its own answer up to its deciding
    token (teacher-forced), a probe of its own token there against recompute's notes read at that
    same point (KL, and recompute's decision there), and where and why."""
    ids = _own_answer(name, chosen)
    at = _own_deciding(engine, name, chosen, question, values)
    suffix = list(base_suffix) + ids[:at.index]
    reference = prompt_logits(engine.model, recompute_layers, suffix, [[None] * len(recompute_layers)])[0]
    return suffix, Probe.of(reference, ids[at.index], firsts, engine.tokenizer.decode), at


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
