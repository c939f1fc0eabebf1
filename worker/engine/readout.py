"""Readout: the decision a model takes after its notes — the question asked after the document.

The document is framed the way the model was trained to read it: inside the user turn of the chat
template where the model has one (the frame's `prefix` is the template's head, prefilled with the
document), or after the start token for a base model. The question then closes the turn:

    [prefix][document][errata…]  ← cached notes
    \n\nQuestion … <end of user turn><assistant header>   ← the suffix, computed by every strategy

With `choices`, the decision is the choice whose WHOLE token sequence is most probable (summed
log-probabilities). The strategy's readout, what its time to first token measures, is ONE forward of
the question in the order the choices are listed (no choice's tokens in it). When the caller gives the
question's tokens in the other orders (`worker.engine.orders.reading_orders`, a balanced set of at
most 8), the choices are read over every order after the first token, timed apart
(`Readout.measure_ms`): the decision is the debiased distribution's, with its spread over the orders
and whether the answer follows a position. Without choices, a greedy generation. With chain of
thought, the model first writes its reasoning greedily, then the choices are scored after an answer
cue, in the listed order only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from vocabulary.prompt import ANSWER_CUE, PLAIN_TAIL, choice_text, question_text
from worker.engine.forward import Deferred, fill
from worker.engine.notes import KV, cache_from_layers, layers_of
from worker.engine.orders import OrderReading, orders_forward, over_orders, reading_orders, settled
from worker.engine.selective import has_sliding_window
from worker.engine.types import Question

_DOC_MARK = "\x00KVNOTES-DOCUMENT\x00"


@dataclass(frozen=True)
class Frame:
    """How a document and a question are wrapped for one tokenizer."""

    prefix: str  # text before the document
    tail: str  # text after the question (end of user turn + assistant header), "" for base models
    chat: bool
    add_special_tokens: bool  # whether tokenizing prefix + document adds the start token

    def suffix(self, question: Question) -> str:
        """The question after the document (`vocabulary.prompt`), closed by the template's tail."""
        body = question_text(question.text, question.choices, question.cot)
        return body + (self.tail if self.chat else PLAIN_TAIL)

    def choice_text(self, choice: str) -> str:
        """How a choice is written as the answer's first words (base models need a leading space)."""
        return choice_text(choice, self.chat)


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
    """The decision and what it was taken from.

    logits: float32 [vocab] at the decision position.
    answer_ids: the tokens the model answered with after the prompt (the chosen choice's tokens, or
        what it generated, reasoning included), to score other notes on the same answer.
    first_token_at: `time.perf_counter()` when the first answer token's logits were ready (TTFT): one
        readout, the choices in their listed order.
    choice_probs: over every order scored (the debiased distribution); choice_spread: each one's
        [min, max] over those orders; order_bias: the position the answer follows more than the
        document ("first", "last", …), None when it follows the document; measure_ms: what reading
        the other orders took, after the first token (not part of any strategy's time).
    """

    logits: torch.Tensor
    decision: str
    choice_probs: dict[str, float]
    text: str
    answer_ids: list[int]
    first_token_at: float
    deferred_kv: list[KV] | None = None
    choice_spread: dict[str, list[float]] = field(default_factory=dict)
    order_bias: str | None = None
    measure_ms: float = 0.0  # reading the choices over their other orders, after the first token
    # each choice's summed log-probability in the listed order (empty when not read in one pass):
    # the teacher-forced likelihood of that answer, read for free
    choice_logp: dict[str, float] = field(default_factory=dict)
    # how many of the choices' orders the decision read (a decision-only readout stops once no
    # order left could change it: `worker.engine.orders.settled`); 0 without choices
    orders_read: int = 0
    orders_needed: int = 0  # of those, what it needed where a reading may stop (read at once: fewer)
    orders_total: int = 0  # the orders a full reading reads: more than `orders_read` is a partial reading
    # a free answer decoded in a batch (`worker.engine.decode`): each answer token's log-probability,
    # the stop token that ended it (None: max_new_tokens), the tokens (stop included) a draft gave
    answer_logp: list[float] = field(default_factory=list)
    answer_end: int | None = None
    drafted: int = 0


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


def _greedy(model, tokenizer, logits: torch.Tensor, cache, max_new_tokens: int) -> list[int]:
    """Greedy tokens after `logits` until a stop token or `max_new_tokens` (`cache` grows)."""
    stop = _stop_ids(tokenizer)
    generated: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(logits.argmax())
        if nxt in stop:
            break
        generated.append(nxt)
        logits = _forward(model, [nxt], cache)
    return generated


def _score_choices(model, tokenizer, frame: Frame, logits: torch.Tensor, cache, choices) -> dict[str, float]:
    """Summed log-probability of each whole choice after `cache`, normalised over the choices.

    The first token of every choice is read from `logits`; the rest of all choices go through ONE
    forward, side by side after the cache, each seeing the cache and only its own earlier tokens
    (a block-diagonal mask and restarted positions). Models with sliding-window layers take one
    forward per choice instead, since one custom mask cannot carry two windows."""
    first = torch.log_softmax(logits, dim=-1)
    encoded = [tokenizer(frame.choice_text(c), add_special_tokens=False)["input_ids"] for c in choices]
    scores = [float(first[ids[0]]) for ids in encoded]
    rest = [i for i, ids in enumerate(encoded) if len(ids) > 1]
    if rest:
        base = layers_of(cache)
        if has_sliding_window(model):
            for i in rest:
                scores[i] += _continuation_logp(model, base, [encoded[i]])[0]
        else:
            for i, lp in zip(rest, _continuation_logp(model, base, [encoded[i] for i in rest])):
                scores[i] += lp
    probs = torch.softmax(torch.tensor(scores, device=logits.device), dim=0)
    return {c: float(p) for c, p in zip(choices, probs)}


def _mask(past: int, deferred: Deferred | None, owner: list[int], device: torch.device) -> torch.Tensor:
    """[1, 1, L, past + L] visibility of a forward's rows after `past` cached tokens, made on
    `device`. `owner` per row: -2 a deferred row, -1 the shared prefix, n >= 0 the n-th branch
    (see `_branches`)."""
    length = len(owner)
    own = torch.tensor(owner, device=device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    sees = (own[:, None] == own[None, :]) | (own[None, :] == -1)  # own branch, or the shared prefix
    new = causal & sees
    cached = torch.ones(length, past, dtype=torch.bool, device=device)
    if deferred is not None:
        pos, n_def = torch.tensor(deferred.positions, device=device), len(deferred.positions)
        cached[:, pos] = False  # nobody reads the stale K/V at a deferred position
        # a deferred row: the notes before it
        cached[:n_def] &= torch.arange(past, device=device)[None, :] < pos[:, None]
        new[n_def:, :n_def] = True  # every later row sees every deferred one (tril covers deferred rows)
    return torch.cat([cached, new], dim=1)[None, None]


@torch.inference_mode()
def _branches(model, base, prefix: list[int], sequences: list[list[int]], deferred: Deferred | None = None):
    """One forward after the cached `base`: the `deferred` rows at their own positions (if any),
    then a shared `prefix`, then every sequence side by side after it, each seeing the cache, the
    deferred rows, the prefix and only its own earlier tokens (a block mask and restarted positions).
    Returns the logits [vocab] after the prefix (None without one); per sequence,
    log p(seq[1:] | cache, prefix, seq[0]); and the forward's cache (its tails: deferred rows first)."""
    past = base[0][0].shape[2] if base else 0
    n_def = len(deferred.positions) if deferred else 0
    n_prefix = len(prefix)
    inputs = (list(deferred.ids) if deferred else []) + list(prefix)
    positions = (list(deferred.positions) if deferred else []) + [past + j for j in range(n_prefix)]
    owner = [-2] * n_def + [-1] * n_prefix
    for n, seq in enumerate(sequences):
        inputs += seq[:-1]
        positions += [past + n_prefix + j for j in range(len(seq) - 1)]
        owner += [n] * (len(seq) - 1)
    length = len(inputs)
    keep = ([n_def + n_prefix - 1] if n_prefix else []) + list(range(n_def + n_prefix, length))
    cache = cache_from_layers(base, model) if base else None
    out = model(
        input_ids=torch.tensor([inputs], device=model.device),
        position_ids=torch.tensor([positions], device=model.device),
        attention_mask=_mask(past, deferred, owner, model.device),
        cache=cache,
        use_cache=True,
        logits_to_keep=torch.tensor(keep, device=model.device),
    )
    logits = out.logits[0].float()  # [len(keep), vocab]
    head = logits[0] if n_prefix else None
    logp = torch.log_softmax(logits[1:] if n_prefix else logits, dim=-1)
    totals, offset = [], 0
    for seq in sequences:
        m = len(seq) - 1
        totals.append(float(sum(logp[offset + j, seq[j + 1]] for j in range(m))))
        offset += m
    return head, totals, cache


def _deferred_kv(cache, deferred: Deferred | None) -> list[KV] | None:
    """The deferred rows' fresh K/V per layer, read from a `_branches` forward's cache."""
    if deferred is None:
        return None
    n = len(deferred.positions)
    return [(layer.tail_keys[:, :, :n], layer.tail_values[:, :, :n]) for layer in cache.layers]


def _continuation_logp(model, base, sequences: list[list[int]]) -> list[float]:
    """log p(seq[1:] | cache, seq[0]) for each sequence, all in one forward after the cached `base`."""
    return _branches(model, base, [], sequences)[1]


def _choice_ids(tokenizer, frame: Frame, choices) -> list[list[int]]:
    return [tokenizer(frame.choice_text(c), add_special_tokens=False)["input_ids"] for c in choices]


def orders_suffixes(tokenizer, frame: Frame, question: Question) -> list[list[int]]:
    """The question's tokens in every order of its choices it is read in (`reading_orders`: a
    balanced set of at most 8) but the listed one (whose tokens the caller has): what
    `decide(orders=...)` scores the choices over after the first token. Empty with chain of thought
    (the reasoning is one generation) or fewer than two choices."""
    if question.cot or len(question.choices) < 2:
        return []
    return [tokenizer(frame.suffix(replace(question, choices=order)), add_special_tokens=False)["input_ids"]
            for order in reading_orders(question.choices)[1:]]


def _one_pass_readout(model, tokenizer, frame: Frame, base: list[KV], prompt: list[int], question: Question,
                      deferred: Deferred | None) -> Readout:
    """Deferred rows, prompt and every choice in ONE forward: the fast path for a decision over choices."""
    encoded = _choice_ids(tokenizer, frame, question.choices)
    logits, rest, cache = _branches(model, base, prompt, encoded, deferred)
    first_token_at = time.perf_counter()
    first = torch.log_softmax(logits, dim=-1)
    scores = torch.tensor([float(first[ids[0]]) + r for ids, r in zip(encoded, rest)], device=logits.device)
    probs = {c: float(p) for c, p in zip(question.choices, torch.softmax(scores, dim=0))}
    out = _chosen(over_orders([question.choices], [probs]), logits, encoded, question, first_token_at,
                  _deferred_kv(cache, deferred))
    out.choice_logp = {c: float(s) for c, s in zip(question.choices, scores)}
    return out


def _chosen(reading: OrderReading, logits: torch.Tensor, encoded: list[list[int]], question: Question,
            first_token_at: float, deferred_kv: list[KV] | None, text: str = "",
            reasoning: Sequence[int] = ()) -> Readout:
    """The readout of a choice question: the most probable choice over the orders read."""
    decision = max(reading.probs, key=reading.probs.get)
    return Readout(logits=logits, decision=decision, choice_probs=reading.probs, text=text,
                   answer_ids=list(reasoning) + encoded[question.choices.index(decision)],
                   first_token_at=first_token_at, deferred_kv=deferred_kv,
                   choice_spread=reading.spread, order_bias=reading.bias, orders_read=reading.orders,
                   orders_total=reading.of)


def _per_order(choices: Sequence[str], scores: Sequence[Sequence[float]]) -> list[dict[str, float]]:
    """Each order's summed log-probabilities (in the listed order) as its distribution over the choices."""
    # python floats in and out: a CPU tensor, by name
    return [dict(zip(choices, torch.softmax(torch.tensor(s, dtype=torch.float64, device="cpu"), dim=0)
                     .tolist())) for s in scores]


def _other_orders(model, tokenizer, frame: Frame, base: list[KV], pending: list[int],
                  orders: Sequence[list[int]], question: Question,
                  listed: dict[str, float] | None = None) -> list[dict[str, float]]:
    """Each other order's distribution over the choices after the completed notes `base` and the
    `pending` tokens, order by order (sliding-window layers: one custom mask cannot carry them).
    With the `listed` order's distribution (a run that times nothing), it stops as soon as the
    decision is `settled`: no order left could change it."""
    per_order: list[dict[str, float]] = []
    total = len(orders) + 1
    for suffix, rotation in zip(orders, reading_orders(question.choices)[1:]):
        if listed is not None and settled(question.choices, [listed, *per_order], total):
            break
        mine = cache_from_layers(base, model)
        head = _forward(model, list(pending) + list(suffix), mine)
        probs = _score_choices(model, tokenizer, frame, head, mine, list(rotation))
        per_order.append({c: probs[c] for c in question.choices})
    return per_order


def _first_token_then_orders(model, tokenizer, frame: Frame, cache, pending: list[int], suffix_ids: list[int],
                             orders: Sequence[list[int]], question: Question,
                             deferred: Deferred | None, stop: bool = False) -> Readout:
    """A timed choice readout: the first token is ONE forward of the prompt alone (deferred rows,
    appended tokens, the question in the listed order); then, apart (`measure_ms`), every order's
    choices after the completed notes (one `orders_forward`; order by order with sliding windows,
    where `stop` ends the reading once the decision is settled)."""
    base = layers_of(cache)
    prompt = pending + suffix_ids
    if deferred is not None:
        logits, cache, fresh = _prompt_forward(model, base, prompt, deferred)  # completes `base` in place
    else:
        logits, fresh = _forward(model, prompt, cache), None
    first_token_at = time.perf_counter()
    encoded = _choice_ids(tokenizer, frame, question.choices)
    if has_sliding_window(model):
        listed = _score_choices(model, tokenizer, frame, logits, cache, question.choices)
        per_order = [listed, *_other_orders(model, tokenizer, frame, base, pending, orders, question,
                                            listed if stop else None)]
        listed_logp: dict[str, float] = {}
    else:
        _, scores, _ = orders_forward(model, base, pending, [suffix_ids, *[list(o) for o in orders]], encoded)
        per_order = _per_order(question.choices, scores)
        listed_logp = dict(zip(question.choices, scores[0]))
    read = over_orders(reading_orders(question.choices)[:len(per_order)], per_order, len(orders) + 1)
    out = _chosen(read, logits, encoded, question, first_token_at, fresh)
    out.measure_ms = (time.perf_counter() - first_token_at) * 1000
    out.choice_logp = listed_logp
    return out


def _prompt_forward(model, base: list[KV], prompt: list[int],
                    deferred: Deferred) -> tuple[torch.Tensor, object, list[KV]]:
    """The deferred rows and the prompt in one forward; (logits [vocab] after the prompt, a cache of
    the completed notes + the prompt to keep generating from, the deferred rows' K/V)."""
    logits, _, cache = _branches(model, base, prompt, [], deferred)
    fresh = _deferred_kv(cache, deferred)
    n = len(deferred.positions)
    tails = [(layer.tail_keys[:, :, n:], layer.tail_values[:, :, n:]) for layer in cache.layers]
    # the strategy's own notes, completed in place
    after = cache_from_layers(fill(base, deferred, fresh), model)
    for layer, (k, v) in zip(after.layers, tails):
        layer.tail_keys, layer.tail_values = k, v
    return logits, after, fresh


def decide(model, tokenizer, frame: Frame, cache, suffix_ids: list[int], question: Question,
           pending: list[int] = (), deferred: Deferred | None = None,
           first_token_only: bool = False, orders: Sequence[list[int]] = (),
           orders_apart: bool = True) -> Readout:
    """Ask `question` after the notes in `cache` (mutated) and take the decision. `pending` are
    tokens a strategy appends (an erratum), `deferred` cached positions it left to recompute
    (`worker.engine.forward.Deferred`): both go through the model in the same forward as the
    question, so neither costs an extra pass over the weights. With `deferred`, the readout's
    `deferred_kv` completes the notes (`fill`). `first_token_only` stops at the first answer token's
    logits (a timing repeat: no decision, no generation). `orders`: the question's tokens in every
    other order of its choices (`orders_suffixes`), to score the choices over their orders after
    the first token, timed apart (`Readout.measure_ms`; ignored with chain of thought, without
    choices, or for a timing repeat). `orders_apart=False` (a run that times nothing) stops reading
    them once no order left could change the decision (`worker.engine.orders.settled`); a run that
    times nothing reads its readouts batched (`worker.engine.batched.decide_all`)."""
    prompt = list(pending) + list(suffix_ids)
    if deferred is not None and has_sliding_window(model):
        raise ValueError("a sliding-window model cannot defer tokens to the readout "
                         "(one mask cannot carry its windows)")
    if orders and len(orders) != len(reading_orders(question.choices)) - 1:
        raise ValueError(f"{len(question.choices)} choices are read in "
                         f"{len(reading_orders(question.choices))} orders, not {len(orders) + 1}")
    if question.choices and not question.cot and orders and not first_token_only:
        return _first_token_then_orders(model, tokenizer, frame, cache, list(pending), list(suffix_ids),
                                        orders, question, deferred, stop=not orders_apart)
    if question.choices and not question.cot and not has_sliding_window(model):
        return _one_pass_readout(model, tokenizer, frame, layers_of(cache), prompt, question, deferred)
    fresh = None
    if deferred is not None:
        logits, cache, fresh = _prompt_forward(model, layers_of(cache), prompt, deferred)
    else:
        logits = _forward(model, prompt, cache)
    first_token_at = time.perf_counter()
    if first_token_only:
        return Readout(logits=logits, decision="", choice_probs={}, text="", answer_ids=[],
                       first_token_at=first_token_at, deferred_kv=fresh)
    reasoning: list[int] = []
    if question.cot:
        reasoning = _greedy(model, tokenizer, logits, cache, max(question.max_new_tokens, 48))
        cue = tokenizer(ANSWER_CUE if question.choices else ANSWER_CUE + " ",
                        add_special_tokens=False)["input_ids"]
        reasoning += cue
        logits = _forward(model, cue, cache)
    text = tokenizer.decode(reasoning, skip_special_tokens=True) if question.cot else ""
    if question.choices:
        probs = _score_choices(model, tokenizer, frame, logits, cache, question.choices)
        return _chosen(over_orders([question.choices], [probs]), logits,
                       _choice_ids(tokenizer, frame, question.choices), question, first_token_at, fresh,
                       text=text, reasoning=reasoning)
    generated = _greedy(model, tokenizer, logits, cache_from_layers(layers_of(cache), model),
                        question.max_new_tokens)
    answer = tokenizer.decode(generated, skip_special_tokens=True).strip()
    full = f"{text.rstrip()} {answer}" if question.cot else answer
    return Readout(logits=logits, decision=answer.split("\n")[0].strip(), choice_probs={}, text=full,
                   answer_ids=reasoning + generated, first_token_at=first_token_at, deferred_kv=fresh)
