"""Readout: the decision a model takes after its notes — the question asked after the document.

The document is framed the way the model was trained to read it: inside the user turn of the chat
template where the model has one (the frame's `prefix` is the template's head, prefilled with the
document), or after the start token for a base model. The question then closes the turn:

    [prefix][document][errata…]  ← cached notes
    \n\nQuestion … <end of user turn><assistant header>   ← the suffix, computed by every strategy

With `choices`, the decision is the choice whose WHOLE token sequence is most probable (summed
log-probabilities); without, a greedy generation. With chain of thought, the model first writes its
reasoning greedily, then the choices are scored after an answer cue.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.notes import cache_from_layers, layers_of
from worker.engine.types import Question

_DOC_MARK = "\x00KVNOTES-DOCUMENT\x00"
COT_CUE = "Think step by step in two or three short sentences, then give the answer."
ANSWER_CUE = "\nSo the answer is:"


@dataclass(frozen=True)
class Frame:
    """How a document and a question are wrapped for one tokenizer."""

    prefix: str  # text before the document
    tail: str  # text after the question (end of user turn + assistant header), "" for base models
    chat: bool
    add_special_tokens: bool  # whether tokenizing prefix + document adds the start token

    def suffix(self, question: Question) -> str:
        lines = [f"\n\nQuestion: {question.text.strip()}"]
        if question.choices:
            lines.append("Answer with one of: " + ", ".join(question.choices) + ".")
        if question.cot:
            lines.append(COT_CUE)
        body = "\n".join(lines)
        return body + self.tail if self.chat else body + "\nAnswer:"

    def choice_text(self, choice: str) -> str:
        """How a choice is written as the answer's first words (base models need a leading space)."""
        return choice if self.chat and not choice.startswith(" ") else " " + choice.strip()


def make_frame(tokenizer) -> Frame:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": _DOC_MARK}], tokenize=False, add_generation_prompt=True
        )
        head, tail = text.split(_DOC_MARK)
        return Frame(prefix=head, tail=tail, chat=True, add_special_tokens=False)
    return Frame(prefix="", tail="", chat=False, add_special_tokens=True)


@dataclass
class Readout:
    """The decision and what it was taken from. logits: float32 [vocab] at the decision position."""

    logits: torch.Tensor
    decision: str
    choice_probs: dict[str, float]
    text: str


def _stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return ids


@torch.inference_mode()
def _forward(model, ids: list[int], cache) -> torch.Tensor:
    """Feed `ids` after `cache` (mutated: it grows); logits [vocab] of the last position only."""
    x = torch.tensor([ids], device=model.device)
    out = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float()


def _greedy(model, tokenizer, logits: torch.Tensor, cache, max_new_tokens: int) -> tuple[str, torch.Tensor]:
    stop = _stop_ids(tokenizer)
    generated: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(logits.argmax())
        if nxt in stop:
            break
        generated.append(nxt)
        logits = _forward(model, [nxt], cache)
    return tokenizer.decode(generated, skip_special_tokens=True), logits


def _score_choices(model, tokenizer, frame: Frame, logits: torch.Tensor, cache, choices) -> dict[str, float]:
    """Summed log-probability of each whole choice after `cache`, normalised over the choices."""
    base = layers_of(cache)
    first = torch.log_softmax(logits, dim=-1)
    scores = []
    for choice in choices:
        ids = tokenizer(frame.choice_text(choice), add_special_tokens=False)["input_ids"]
        total = float(first[ids[0]])
        if len(ids) > 1:
            x = torch.tensor([ids[:-1]], device=model.device)
            with torch.inference_mode():
                out = model(input_ids=x, cache=cache_from_layers(base), use_cache=True)
            logp = torch.log_softmax(out.logits[0].float(), dim=-1)
            total += float(sum(logp[j, ids[j + 1]] for j in range(len(ids) - 1)))
        scores.append(total)
    probs = torch.softmax(torch.tensor(scores), dim=0)
    return {c: float(p) for c, p in zip(choices, probs)}


def decide(model, tokenizer, frame: Frame, cache, suffix_ids: list[int], question: Question) -> Readout:
    """Ask `question` after the notes in `cache` (mutated) and take the decision."""
    logits = _forward(model, suffix_ids, cache)
    text = ""
    if question.cot:
        text, _ = _greedy(model, tokenizer, logits, cache, max(question.max_new_tokens, 48))
        cue = ANSWER_CUE if question.choices else ANSWER_CUE + " "
        logits = _forward(model, tokenizer(cue, add_special_tokens=False)["input_ids"], cache)
    if question.choices:
        probs = _score_choices(model, tokenizer, frame, logits, cache, question.choices)
        decision = max(probs, key=probs.get)
        return Readout(logits=logits, decision=decision, choice_probs=probs, text=text)
    answer, _ = _greedy(model, tokenizer, logits, cache_from_layers(layers_of(cache)), question.max_new_tokens)
    answer = answer.strip()
    full = (text + ANSWER_CUE + " " + answer) if question.cot else answer
    return Readout(logits=logits, decision=answer.split("\n")[0].strip(), choice_probs={}, text=full)
