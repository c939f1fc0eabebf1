"""The erratum gateway's rewrite: a request that equals a remembered base except for short changed
spans is sent as the base plus an erratum, so the serving engine's prefix cache keeps hitting.

**Bases.** Per tenant (`serving.gateway.tenants`: a base never serves another tenant), kept in the
gateway's state (`serving.gateway.state`: this process's memory, or one Redis that every process and
replica shares; bounded by count and characters per tenant and overall, LRU and TTL), and planned
under the tenant's lock there, the first version of
each long prompt forwarded is its base: the texts of its context messages (`serving.gateway.prompts`)
as first seen. A later message of the same conversation (a new turn) extends the base with its own
first version. A request is matched to the client's base with the same model, route and roles whose
texts it is closest to; none close enough (similarity under `NEW_BASE_BELOW`) makes it a new base,
sent unchanged.

**Changes.** By template (`--notebook`: the notebook's document, its fields as slots, named by their
labels) or by a token diff (`serving.gateway.changes`). At most `max_fields` spans, covering at most
`max_share` of the context, else the request passes through; the last message is never read.

**Layouts**, one wording (`vocabulary.render_erratum`), as the replays lay them out. The gateway's
policy is a strategy (`--policy`, or a notebook's adopted sweep policy); it rewrites with the serving
layout that strategy's descriptor declares (`StrategyInfo.serving_layout`), when it is one of these
(`LAYOUT_OF`; another policy passes through):
- `APPEND_ERRATUM`: every context message as in the base, and after the last context message an erratum
  for each value that differs from what was told before this turn: the same request asked again
  with another value is the base plus one erratum (the edit replay's variant of that layout); once the
  conversation moves on to a later turn, that turn's errata stay where they were and later errata
  come after them (the trajectory replay's layout), so every later turn hits too;
- `REFRESH_ERRATUM`: the same errata after the current text (the field refreshed where it stands);
- `HOIST_FIELDS`: each changed line moved to the end of its message, holding the current value
  (`vocabulary.hoist`); the lines moved stay moved for every later request of the base.

**Safety.** A base whose sampled agreement's Wilson lower bound has fallen below the threshold after
a disagreement (`Rewriter.checked`) passes through from then on. Prompts live only in these bases. A
state that cannot be reached passes the request through, saying so (`STATE_DOWN`), never a 5xx.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from serving.gateway.changes import Change, Template, common_head, common_tail, diff_changes
from serving.gateway.memory_state import MemoryState
from serving.gateway.prompts import Prompt
from serving.gateway.state import Base, Lease, Limits, LockBusy, State
from serving.gateway.stats import Stats
from serving.gateway.tenants import Tenant
from vocabulary import render_erratum
from vocabulary.hoist import hoist
from vocabulary.strategies import APPEND_ERRATUM, HOIST_FIELDS, REFRESH_ERRATUM, served

log = logging.getLogger("kvnotes.gateway")
GATEWAY_LAYOUTS = (APPEND_ERRATUM, REFRESH_ERRATUM, HOIST_FIELDS)  # the serving layouts it writes
LAYOUT_OF: dict[str, str] = served(GATEWAY_LAYOUTS)  # {policy: its layout}, in rank order
LAYOUTS = tuple(LAYOUT_OF)  # the policies that have a gateway layout (the first is the default)
PASS_THROUGH = "pass-through"
PLAN_FAILED = "the plan failed"  # a pass-through's reason: planning raised (logged), the base dropped
STATE_DOWN = "the shared state is unreachable"  # a pass-through's reason: Redis did not answer (logged)
LOCK_BUSY = "the tenant's lock is busy"  # a pass-through's reason: its earlier requests are still planned
TENANT_BUSY = "the tenant's earlier requests are still being planned"  # past `PLANS_PER_TENANT` (forward)
LOCK_WAIT_S = 5.0  # a request waits this long for its tenant's lock, then passes through (LOCK_BUSY)
NEW_BASE_BELOW = 0.8  # a request less similar than this to every base starts a new one
MIN_CONTEXT_CHARS = 1000  # a shorter context is not worth a base


@dataclass(frozen=True)
class Settings:
    """How the gateway rewrites: `layout` (a policy of LAYOUTS, or PASS_THROUGH with `policy_reason`),
    the limits, the share of rewritten requests checked, the agreement threshold, the LRU sizes."""

    layout: str = LAYOUTS[0]
    policy_reason: str = ""
    max_fields: int = 4
    max_share: float = 0.05
    check_rate: float = 0.05
    threshold: float = 0.9
    clients: int = 256  # tenants
    bases_per_client: int = 16
    chars_per_client: int = 4_500_000  # the bases' text a tenant may hold (a 4 MiB body); oldest go first
    chars_total: int = 64_000_000  # the bases' text all tenants may hold; the least recent tenants go
    ttl_s: float = 24 * 3600.0  # a base unused this long is forgotten
    min_context_chars: int = MIN_CONTEXT_CHARS
    seed: int | None = None

    @property
    def limits(self) -> Limits:
        return Limits(self.clients, self.bases_per_client, self.chars_per_client, self.chars_total,
                      self.ttl_s)


@dataclass(frozen=True)
class Span:
    """A span of a base's text with the value it now holds (what `vocabulary.hoist` reads)."""

    start: int
    end: int
    new_value: str


@dataclass(frozen=True)
class Plan:
    """What to send: `context` (None: the request unchanged), the reason it passes through ("" when
    rewritten), the base, and whether this request is also sent unchanged as a check."""

    context: list[str] | None
    reason: str
    base_id: str | None = None
    check: bool = False
    labels: tuple[str, ...] = ()

    @property
    def header(self) -> str:
        """The `x-kvnotes-gateway` header's value."""
        return self.layout_name if self.context is not None else f"{PASS_THROUGH}; reason={self.reason}"

    layout_name: str = ""
    values: tuple[str, ...] = ()  # the changed spans' old and new values: what a check's answers name


def _similarity(a: str, b: str) -> float:
    """How alike two texts are, from 0 to 1: the share their common head and tail cover (cheap, and
    enough for a field change), else the share of characters in the lines they have in common (a
    multiset of lines, each hashed once: linear, where difflib's bounds cost a Python step per
    character)."""
    if a == b:
        return 1.0
    head = common_head(a, b)
    tail = common_tail(a, b, head)
    share = (head + tail) / max(len(a), len(b), 1)
    if share >= NEW_BASE_BELOW:
        return share
    common = Counter(a.split("\n")) & Counter(b.split("\n"))
    return sum((len(line) + 1) * n for line, n in common.items()) / max(len(a), len(b), 1)


def _merge_span(spans: dict[tuple[int, int], str], start: int, end: int) -> None:
    """Add [start, end) to a message's moved spans, merged with every span it overlaps or touches."""
    for a, b in [k for k in spans if k[0] <= end and start <= k[1]]:
        del spans[(a, b)]
        start, end = min(start, a), max(end, b)
    spans[(start, end)] = ""


def _value_now(text: str, start: int, end: int, changes: list[Change]) -> str:
    """The base's span [start, end) with this request's changes inside it applied (sorted by place)."""
    out, at = [], start
    for c in changes:
        if start <= c.base_start and c.base_end <= end and c.base_start >= at:
            out += [text[at:c.base_start], c.new]
            at = c.base_end
    return "".join(out) + text[at:end]


class Rewriter:
    """The bases of every tenant (in `state`) and the rewrite of one request (`plan`); thread-safe."""

    def __init__(self, settings: Settings, template: Template | None = None,
                 stats: Stats | None = None, state: State | None = None) -> None:
        self.settings = settings
        self.template = template
        self.state = state or (stats.state if stats is not None else MemoryState(settings.limits))
        self.stats = stats or Stats(self.state)
        self._random = random.Random(settings.seed)

    # --- bases ---------------------------------------------------------------------------------------

    def _match(self, bases: list[Base], prompt: Prompt) -> Base | None:
        candidates = [b for b in bases if b.model == prompt.model and b.route == prompt.route
                      and b.roles[:len(prompt.roles)] == list(prompt.roles[:len(b.roles)])]
        best, score = None, 0.0
        for base in candidates:
            n = min(len(base.texts), len(prompt.context))
            ratio = min(_similarity(base.texts[i], prompt.context[i]) for i in range(n))
            if ratio > score:
                best, score = base, ratio
        return best if best is not None and score >= NEW_BASE_BELOW else None

    # --- one request ---------------------------------------------------------------------------------

    def plan(self, tenant: Tenant | str, prompt: Prompt | None, why_not: str = "") -> Plan:
        """What to send for `prompt` from `tenant` (None: not readable, for `why_not`). A request
        with no tenant (`serving.gateway.tenants`) passes through: no base serves two tenants."""
        if isinstance(tenant, str):
            tenant = Tenant(tenant, "key")
        if not tenant.id:
            return self._passed(None, tenant.why_not)
        if prompt is None:
            return self._passed(None, why_not)
        if prompt.size < self.settings.min_context_chars:
            return self._passed(None, f"context under {self.settings.min_context_chars} characters")
        breaker = self.state.breaker
        if not breaker.allow():
            return self._passed(None, STATE_DOWN)
        try:
            with self.state.lock(tenant.id, LOCK_WAIT_S) as lease:
                plan = self._plan(tenant.id, prompt, lease)
        except LockBusy:
            breaker.success()  # the state answered: busy is no fault of it
            log.info("gateway tenant lock busy: the request passes through", extra={"state": self.state.name})
            return self._passed(None, LOCK_BUSY)
        except self.state.errors as exc:
            breaker.failure()
            log.warning("gateway state unreachable: the request passes through",
                        extra={"state": self.state.name, "error": str(exc)[:200]})
            return self._passed(None, STATE_DOWN)
        breaker.success()
        return plan

    def _plan(self, client: str, prompt: Prompt, lease: Lease) -> Plan:
        """`plan` under the tenant's lock: match (among the candidates of the tenant's index only) or
        start a base, then rewrite."""
        candidates = [info.base_id for info in self.state.index(client)
                      if info.fits(prompt.model, prompt.route, prompt.roles)]
        base = self._match(self.state.load(client, candidates), prompt)
        if base is None:
            base = Base(uuid.uuid4().hex[:12], prompt.model, prompt.route, list(prompt.roles),
                        list(prompt.context))
            self._save(client, base, True, lease)
            if self.settings.layout == PASS_THROUGH:
                return self._passed(base.base_id, self.settings.policy_reason)
            return self._first(client, base, prompt, lease)
        if self.settings.layout == PASS_THROUGH:
            self._save(client, base, False, lease)
            return self._passed(base.base_id, self.settings.policy_reason)
        switched = self.stats.switched(base.base_id)
        if switched:
            self._save(client, base, False, lease)
            return self._passed(base.base_id, switched)
        return self._guarded(client, base, prompt, self._rewrite, lease)

    def _save(self, client: str, base: Base, texts: bool, lease: Lease) -> None:
        """`state.save`, fenced by `lease`: a save refused (the lock expired and another process
        planned since) is logged and counted; this request is still sent as planned."""
        if not self.state.save(client, base, texts, lease):
            self.stats.count_local("saves_fenced")
            log.warning("gateway save refused: the tenant's lock was lost", extra={"base": base.base_id})

    def _guarded(self, client: str, base: Base, prompt: Prompt, step: Callable[[Base, Prompt], Plan],
                 lease: Lease) -> Plan:
        """`step(base, prompt)`, then the base saved with what it changed; a plan that fails (a bug,
        a base in a state nobody foresaw) drops the base and passes the request through, logged:
        never a 5xx, and never the same failure on every later request of the base. (A state that
        fails is not the plan's fault: `plan` passes that request through and keeps the base.)"""
        turns = len(base.texts)
        try:
            plan = step(base, prompt)
        except self.state.errors:
            raise
        except Exception:
            log.exception("gateway plan failed: the base is dropped, the request passes through",
                          extra={"base": base.base_id})
            self.state.drop(client, base.base_id)
            return self._passed(None, PLAN_FAILED)
        self._save(client, base, len(base.texts) != turns, lease)
        return plan

    def busy(self) -> Plan:
        """A request not planned: its tenant has `forward.PLANS_PER_TENANT` in planning already
        (memory only: the event loop calls it)."""
        return self._passed(None, TENANT_BUSY)

    def _passed(self, base_id: str | None, reason: str) -> Plan:
        self.stats.request(base_id, reason)
        return Plan(None, reason, base_id)

    def _first(self, client: str, base: Base, prompt: Prompt, lease: Lease) -> Plan:
        """A new base: sent unchanged, except that a template's lines are hoisted from the start."""
        if LAYOUT_OF.get(self.settings.layout) == HOIST_FIELDS and self.template is not None:
            return self._guarded(client, base, prompt, self._rewrite, lease)
        return self._passed(base.base_id, "new base")

    def _changes(self, base: Base, prompt: Prompt) -> list[Change] | None:
        out: list[Change] = []
        for i, text in enumerate(prompt.context):
            if i >= len(base.texts):
                base.texts.append(text)  # a new turn: its first version joins the base
                continue
            if self.template is not None:
                found = self.template.changes(i, base.texts[i], text)
                if found is None and base.texts[i] != text:
                    return None
                out += found or []
            elif base.texts[i] != text:  # stops past --max-fields: such a request passes through
                out += diff_changes(i, base.texts[i], text, max(0, self.settings.max_fields - len(out)))
        return out

    def _rewrite(self, base: Base, prompt: Prompt) -> Plan:
        changes = self._changes(base, prompt)
        if changes is None:
            return self._passed(base.base_id, "the notebook's document is not in the prompt")
        if any(i >= len(prompt.context) for i in base.errata):
            return self._passed(base.base_id, "an earlier erratum's turn is not in this conversation")
        limit = self._over_limits(changes, prompt)
        if limit:
            return self._passed(base.base_id, limit)
        layout = self.settings.layout
        if LAYOUT_OF[layout] == HOIST_FIELDS:
            context = self._hoisted(base, prompt, changes)
        else:
            context = self._with_errata(base, prompt, changes, refreshed=LAYOUT_OF[layout] == REFRESH_ERRATUM)
        labels = tuple(dict.fromkeys(c.label for c in changes))
        self.stats.labels(base.base_id, labels)
        self.stats.request(base.base_id, "")
        check = self._random.random() < self.settings.check_rate
        values = tuple(dict.fromkeys(v.strip() for c in changes for v in c.values if v.strip()))
        return Plan(context, "", base.base_id, check, labels, layout, values)

    def _over_limits(self, changes: list[Change], prompt: Prompt) -> str:
        if len(changes) > self.settings.max_fields:
            return f"{len(changes)} changed spans, over --max-fields {self.settings.max_fields}"
        changed = sum(max(c.end - c.start, c.base_end - c.base_start) for c in changes)
        if changed > self.settings.max_share * max(1, prompt.size):
            return (f"changes cover {changed / max(1, prompt.size):.1%} of the prompt, over "
                    f"{self.settings.max_share:.0%}")
        return ""

    def _with_errata(self, base: Base, prompt: Prompt, changes: list[Change], refreshed: bool) -> list[str]:
        """The base's texts (or the current ones, `refreshed`) with the errata: those of earlier turns
        where they were told, and this turn's, from what those told to the values now."""
        at = len(prompt.context) - 1
        if base.pending is not None and base.pending[0] < at:  # the conversation moved on: keep it
            index, text, told = base.pending
            base.errata[index] = base.errata.get(index, "") + text
            base.told.update(told)
        base.pending = None
        current = {(c.message, c.base_start, c.base_end): c for c in changes}
        now, told_now = "", {}
        for key, change in current.items():
            told = base.told.get(key, change.old)
            if change.new != told:
                now += render_erratum(change.label, told, change.new)
                told_now[key], base.labels[key] = change.new, change.label
        for key, told in base.told.items():  # a value changed back to the base's
            if key not in current and key[0] <= at:
                original = base.texts[key[0]][key[1]:key[2]]
                if told != original:
                    now += render_erratum(base.labels.get(key, "the value"), told, original)
                    told_now[key] = original
        if now:
            base.pending = (at, now, told_now)
        texts = prompt.context if refreshed else base.texts[:len(prompt.context)]
        return [text + base.errata.get(i, "") + (now if i == at else "") for i, text in enumerate(texts)]

    def _hoisted(self, base: Base, prompt: Prompt, changes: list[Change]) -> list[str]:
        """The base's texts with every span moved so far hoisted, each holding its value now. The
        spans of a message never overlap: a change that overlaps or touches spans moved before is
        merged with them (08:07 → 09:07 moves "08", → 08:12 moves "07", → 09:12 changes "08:07": one
        span "08:07", not three overlapping ones, which `hoist` refuses)."""
        for c in changes:
            _merge_span(base.moved.setdefault(c.message, {}), c.base_start, c.base_end)
        if self.template is not None:  # every slot moves, from the first request on
            for i, text in enumerate(base.texts[:len(prompt.context)]):
                found = self.template.values(text)
                for start, end in (found[0] if found else []):
                    _merge_span(base.moved.setdefault(i, {}), start, end)
        out = []
        for i, text in enumerate(base.texts[:len(prompt.context)]):
            spans = base.moved.get(i)
            if not spans:
                out.append(prompt.context[i] if i < len(prompt.context) else text)
                continue
            here = sorted((c for c in changes if c.message == i), key=lambda c: (c.base_start, c.base_end))
            fields = [Span(a, b, _value_now(text, a, b, here)) for a, b in sorted(spans)]
            out.append(hoist(text, fields).text)
        return out

    def checked(self, base_id: str, agreed: bool, prompt_tokens: int = 0) -> str:
        """Count one sampled check (and the prompt tokens it sent); the reason the base now passes
        through ("" while it does not)."""
        return self.stats.checked(base_id, agreed, prompt_tokens, self.settings.threshold)
