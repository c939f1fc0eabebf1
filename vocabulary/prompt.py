"""The prompt format: how kvnotes asks a question after a document, written once for the engine's
readout (`worker.engine.readout.Frame`, which wraps it in a tokenizer's chat template) and for the
serving replay (`serving.streams`, `serving.server`, which send it to a vLLM server).

A model with a chat template gets the document and the question as one user message (the template
adds its own tail: end of turn, assistant header); a base model gets plain text that ends in
`PLAIN_TAIL`, and its answer's first words follow that cue after a space (`choice_text`).
"""

from __future__ import annotations

from collections.abc import Sequence

COT_CUE = "Think step by step in two or three short sentences, then give the answer."
ANSWER_CUE = "\nSo the answer is:"  # after a chain of thought: the answer follows this
PLAIN_TAIL = "\nAnswer:"  # a base model's prompt ends here (no chat template to end the turn)


def question_text(question: str, choices: Sequence[str] = (), cot: bool = False) -> str:
    """The question as appended after the document, before any template tail."""
    lines = [f"\n\nQuestion: {question.strip()}"]
    if choices:
        lines.append("Answer with one of: " + ", ".join(choices) + ".")
    if cot:
        lines.append(COT_CUE)
    return "\n".join(lines)


def choice_text(choice: str, chat: bool) -> str:
    """How a choice is written as the answer's first words (a base model's after a space)."""
    return choice if chat and not choice.startswith(" ") else " " + choice.strip()
