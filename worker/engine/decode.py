"""One batched greedy decode for every readout of a decision-only run (issue 42, item 1).

A free answer of N tokens, read one strategy after another, costs N forwards per strategy: each a
pass over the weights for one token. Here every strategy's answer is decoded in the same forwards,
a batch row per strategy, so N tokens cost N − 1 batched steps after the prompts, whatever the
number of strategies. The strategies' caches differ in length (the reference's notes, an erratum's
appended tokens, hoist's tail), so each row's cache (its notes and its prompt) is stacked beside the
others' and padded on the RIGHT with zeros no query sees (an attention mask), and each row's answer
tokens take positions that continue its own cache (position ids per row). Models with sliding-window
layers take a mask per layer type: the window is cut by positions, as transformers' own.

Each row computes what its strategy's own readout computes (`worker.engine.readout.decide`): its
prompt forward is the same forward (rows with the same notes length and the same prompt share one,
unpadded), and in each decode step its query reads the same keys in the same order, the padding
after them contributing exact zeros, its query heads grouped in the kernel as a lone row's
(`worker.engine.split_attention._grouped_step`). What still differs is the rounding of a matrix
product with several rows against one with a single row (oneDNN's bfloat16 matmul, or a float32 gemm
against a gemv): it moved gemma3-270m's logits by up to 0.375 in bfloat16 and turned one greedy
token of 25 ("What" for "Where", the two best logits tied). So a row whose steps came within
`tie_margin` of a tie is decoded again alone; `tests/engine/test_batched_decode.py` checks the
tokens on both bundled models in float32 and bfloat16.

The last answer token needs no forward after it (the unbatched loop used to make one and throw its
logits away).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from worker.engine.notes import KV, cache_from_layers, layers_of
from worker.engine.readout import Frame, Readout, _prompt_forward, _stop_ids, decide
from worker.engine.selective import has_sliding_window
from worker.engine.types import Question


@dataclass
class Started:
    """One row after its prompt forward: the logits [vocab] (float32) of its next answer token, its
    cache (notes, prompt and the draft tokens it accepted, per layer [1, kv, C, d]), the deferred
    rows' fresh K/V, when the first token was ready; and what its draft gave: the answer tokens
    accepted (each the greedy choice after the ones before it), their log-probabilities, whether one
    of those choices came within `tie_margin` of a tie, and whether the answer already ended."""

    logits: torch.Tensor
    layers: list[KV]
    fresh: list[KV] | None
    first_token_at: float
    ahead: list[int] = field(default_factory=list)
    ahead_logp: list[float] = field(default_factory=list)
    close: bool = False
    ended: int | None = None  # the answer already ended: the stop token chosen (-1: at max_new_tokens)
    after: torch.Tensor | None = None  # the next token's logits after `ahead` (None: `logits`)


def _accepted(logits: torch.Tensor, draft: Sequence[int], stop: set[int], margin: float,
              max_new_tokens: int) -> tuple[int, list[float], bool, int | None]:
    """How many of `draft`'s tokens greedy decoding would have chosen, given the logits [D + 1, vocab]
    read after the prompt and after each draft token: (accepted answer tokens, their
    log-probabilities, a choice within `margin` of a tie, how the answer ended if it did: the stop
    token chosen, or -1 at `max_new_tokens`)."""
    logps: list[float] = []
    close = False
    for i in range(len(draft) + 1):
        if len(logps) >= max_new_tokens:
            return len(logps), logps, close, -1
        row = logits[i]
        token = int(row.argmax())
        if i == len(draft) or token != draft[i]:
            return len(logps), logps, close, None
        close = close or _close(row, margin)
        if token in stop:
            return len(logps), logps, close, token
        logps.append(float(torch.log_softmax(row, dim=-1)[token]))
    return len(logps), logps, close, None


@torch.inference_mode()
def start_rows(model, tokenizer, rows: Sequence, suffix_ids: list[int],
               drafts: Sequence[Sequence[int]] = (), max_new_tokens: int = 0) -> list[Started]:
    """Each row's prompt forward (its appended tokens, then the question): rows with deferred tokens
    one by one (`_prompt_forward`), the others in one unpadded batched forward per (notes length,
    prompt), as many rows as share it. A row's `drafts` entry (its guess at the answer, ending in a
    stop token if the answer ends: speculative decoding) goes after its prompt in the same forward,
    read teacher-forced: the draft tokens greedy decoding would choose are accepted (the rest of the
    answer is then decoded from there), so a right draft costs no decode step at all. Draft rows of
    a group are padded at their end (causal: nothing before sees the padding)."""
    out: list[Started | None] = [None] * len(rows)
    groups: dict[tuple, list[int]] = {}
    stop, margin = _stop_ids(tokenizer), tie_margin(model)
    for i, row in enumerate(rows):
        prompt = [*row.shared, *suffix_ids]
        if row.deferred is not None:
            logits, cache, fresh = _prompt_forward(model, row.base, prompt, row.deferred)
            out[i] = Started(logits, layers_of(cache), fresh, time.perf_counter())
            continue
        groups.setdefault((row.base[0][0].shape[2], tuple(prompt)), []).append(i)
    for (_, prompt), members in groups.items():
        guess = [list(drafts[i])[:max_new_tokens] if i < len(drafts) else [] for i in members]
        width = max(len(g) for g in guess)
        if len(members) == 1:
            stacked = rows[members[0]].base
        else:
            stacked = [tuple(torch.cat([rows[i].base[n][kv] for i in members]) for kv in (0, 1))
                       for n in range(len(rows[members[0]].base))]
        cache = cache_from_layers(stacked, model)
        ids = torch.tensor([list(prompt) + g + [prompt[-1]] * (width - len(g)) for g in guess],
                           device=model.device)
        keep = torch.arange(len(prompt) - 1, len(prompt) + width, device=model.device)
        logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep).logits.float()
        ready = time.perf_counter()
        whole = layers_of(cache)
        notes = stacked[0][0].shape[2] + len(prompt)
        for b, (i, g) in enumerate(zip(members, guess)):
            took, logps, close, ended = _accepted(logits[b], g, stop, margin, max_new_tokens)
            out[i] = Started(logits[b, 0], [(k[b:b + 1, :, :notes + took], v[b:b + 1, :, :notes + took])
                                            for k, v in whole], None, ready, g[:took], logps, close, ended,
                             logits[b, took])
    return out  # type: ignore[return-value]


def _stacked(started: Sequence[Started]) -> tuple[list[KV], list[int]]:
    """The rows' caches side by side, [B, kv, C, d] per layer, each padded on the right with zeros
    up to the longest (C); and each row's own length."""
    lengths = [s.layers[0][0].shape[2] for s in started]
    most = max(lengths)
    layers = []
    for n in range(len(started[0].layers)):
        k0, v0 = started[0].layers[n]
        keys = k0.new_zeros(len(started), k0.shape[1], most, k0.shape[3])
        values = v0.new_zeros(len(started), v0.shape[1], most, v0.shape[3])
        for b, (s, length) in enumerate(zip(started, lengths)):
            keys[b, :, :length] = s.layers[n][0][0]
            values[b, :, :length] = s.layers[n][1][0]
        layers.append((keys, values))
    return layers, lengths


def _step_mask(model, lengths: list[int], most: int, step: int):
    """The visibility of decode step `step` (0: the first token after the prompts): row b's query,
    at position lengths[b] + step, sees its own cache [0, lengths[b]) and every answer token so far
    (the tail, after the padded caches). None when nothing is padded and no window cuts (a plain
    causal forward, as a single row's). Sliding-window models: {layer type: mask}."""
    device = model.device
    length = torch.tensor(lengths, device=device)
    index = torch.arange(most, device=device)
    sees = torch.cat([index[None, :] < length[:, None],
                      torch.ones(len(lengths), step + 1, dtype=torch.bool, device=device)], dim=1)
    if not has_sliding_window(model):
        return None if min(lengths) == most else sees[:, None, None, :]
    window = model.config.get_text_config(decoder=True).sliding_window
    key_pos = torch.cat([index[None, :].expand(len(lengths), most),
                         length[:, None] + torch.arange(step + 1, device=device)[None, :]], dim=1)
    in_window = key_pos > (length + step)[:, None] - window  # transformers' sliding_window_overlay
    return {"full_attention": sees[:, None, None, :],
            "sliding_attention": (sees & in_window)[:, None, None, :]}


def tie_margin(model) -> float:
    """How close a greedy step's two best logits may come before the batched decode of a row is not
    trusted to pick what the row alone picks: a batched matrix product rounds differently from a
    one-row one (oneDNN's bfloat16 matmul with one row accumulates in another order than with two or
    more). Measured on gemma3-270m, 845-token notes, 5 answer tokens teacher-forced through both
    paths: at most 3.5e-5 apart in float32 and 0.375 in bfloat16; the margins hold some 30x and 3x that."""
    return 1e-3 if model.dtype == torch.float32 else 1.0


def _close(logits: torch.Tensor, margin: float) -> bool:
    top = torch.topk(logits, 2).values
    return bool(top[0] - top[1] <= margin)


@torch.inference_mode()
def greedy_rows(model, tokenizer, started: Sequence[Started], max_new_tokens: int
                ) -> tuple[list[list[int]], list[bool], list[list[float]], list[int | None]]:
    """Each row's greedy answer tokens after its prompt (and the draft tokens it accepted), until a
    stop token or `max_new_tokens`, all rows in one forward a step (a row that stopped rides along,
    its tokens dropped); and per row whether one of its choices came within `tie_margin` of a tie;
    and each answer token's log-probability where it was chosen (its own answer's teacher-forced
    likelihood, read for free); and the stop token that ended each answer (None: `max_new_tokens`)."""
    stop, margin = _stop_ids(tokenizer), tie_margin(model)
    generated = [list(s.ahead) for s in started]
    logps = [list(s.ahead_logp) for s in started]
    close = [s.close for s in started]
    ends = [s.ended if s.ended is not None and s.ended >= 0 else None for s in started]
    done = [s.ended is not None or len(g) >= max_new_tokens for s, g in zip(started, generated)]
    if all(done):
        return generated, close, logps, ends
    layers, lengths = _stacked(started)
    most = max(lengths)
    cache = cache_from_layers(layers, model)
    logits = [s.logits if s.after is None else s.after for s in started]
    step = 0
    while True:
        nxt = [int(row.argmax()) for row in logits]
        for b, token in enumerate(nxt):
            if not done[b]:
                close[b] = close[b] or _close(logits[b], margin)
                if token in stop:
                    done[b], ends[b] = True, token
                else:
                    generated[b].append(token)
                    logps[b].append(float(torch.log_softmax(logits[b], dim=-1)[token]))
                    done[b] = len(generated[b]) >= max_new_tokens
        if all(done):
            break
        positions = torch.tensor([[length + step] for length in lengths], device=model.device)
        out = model(input_ids=torch.tensor([[t] for t in nxt], device=model.device), position_ids=positions,
                    attention_mask=_step_mask(model, lengths, most, step), cache=cache, use_cache=True,
                    logits_to_keep=1)
        logits = list(out.logits[:, -1].float())
        step += 1
    return generated, close, logps, ends


def answer_all(model, tokenizer, frame: Frame, rows: Sequence, suffix_ids: list[int],
               question: Question, drafts: Sequence[Sequence[int]] = ()) -> list[Readout]:
    """Each row's free-answer readout as `decide` takes it alone, the answers decoded together, after
    each row's draft of its answer where it has one (`start_rows`: what greedy decoding would choose
    of it is taken, so the answer is the same with any draft or none). A row whose decode came
    within `tie_margin` of a tie (where rounding could pick another token) is read again alone
    (`decide`), so every answer is the one its strategy's own readout gives."""
    started = start_rows(model, tokenizer, rows, suffix_ids, drafts, question.max_new_tokens)
    answers, close, logps, ends = greedy_rows(model, tokenizer, started, question.max_new_tokens)
    out = []
    for row, s, generated, again, logp, end in zip(rows, started, answers, close, logps, ends):
        if again:
            out.append(decide(model, tokenizer, frame, cache_from_layers(row.base, model), suffix_ids,
                              question, pending=list(row.shared), deferred=row.deferred))
            continue
        answer = tokenizer.decode(generated, skip_special_tokens=True).strip()
        out.append(Readout(logits=s.logits, decision=answer.split("\n")[0].strip(), choice_probs={},
                           text=answer, answer_ids=list(generated), first_token_at=s.first_token_at,
                           deferred_kv=s.fresh, answer_logp=logp, answer_end=end,
                           drafted=len(s.ahead) + (s.ended is not None and s.ended >= 0)))
    return out


def drafted_answer(tokenizer, answer: Sequence[int], end: int | None, before: Sequence[str],
                   after: Sequence[str]) -> list[int]:
    """A draft of this edit's answer from an earlier edit's (`answer` tokens, then its stop token
    `end` when one ended it): each field's earlier value `before[i]` written in the answer (alone or
    after a space) replaced by its value now, `after[i]`. Only a guess: `start_rows` keeps what
    greedy decoding would choose of it."""
    out = list(answer)
    for old, new in zip(before, after):
        if old == new or not old:
            continue
        for lead in (" ", ""):
            was = tokenizer(lead + old, add_special_tokens=False)["input_ids"]
            at = next((i for i in range(len(out) - len(was) + 1) if out[i:i + len(was)] == was), -1)
            if was and at >= 0:
                out[at:at + len(was)] = tokenizer(lead + new, add_special_tokens=False)["input_ids"]
                break
    return out + ([end] if end is not None else [])
