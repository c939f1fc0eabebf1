"""The words every layer shares: strategy names and what each recomputes, the erratum template, and
the metrics a strategy is judged by.

Plain Python that imports nothing, so the web app (which never loads torch) and the engine read one
definition. It lives in the engine because these are the engine's concepts; `worker/engine/__init__`
loads its torch-backed modules lazily, so `import vocabulary` costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- strategies ----------------------------------------------------------------------------------

STRATEGIES = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective", "auto")

# What each strategy recomputes, in the paper's words (the run form's checklist and tooltips).
STRATEGY_HELP = {
    "recompute": "the reference: prefill everything again",
    "prefix_reuse": "recompute from the first field to the end (exact, what a prefix cache does)",
    "stale": "recompute nothing: the floor, the model acts on the old notes",
    "in_place": "recompute only the field's tokens; later keys re-rotated",
    "erratum": "append a correction and compute only its tokens",
    "field_erratum": "refresh the field and append the correction (the robust default)",
    "selective": "field + the downstream tokens whose notes moved most",
    "auto": "the cheapest strategy that matches field_erratum on a probe",
}

# The run form's default checklist: every strategy a first look needs, without the slow extras.
DEFAULT_STRATEGIES = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum")

# `auto` tries these (cheapest first) and keeps the first whose decision matches field_erratum's.
AUTO_CANDIDATES = ("stale", "erratum", "in_place")


def unknown_strategies(names: list[str] | tuple[str, ...]) -> str:
    """'' when every name is a strategy, else one line naming the unknown ones and the valid ones."""
    unknown = [name for name in names if name not in STRATEGIES]
    if not unknown:
        return ""
    return f"unknown strategy {', '.join(map(repr, unknown))}; valid strategies: {', '.join(STRATEGIES)}"


def with_recompute(names: list[str] | tuple[str, ...]) -> list[str]:
    """`recompute` first (every strategy is measured against it), then the others once each."""
    return ["recompute", *dict.fromkeys(name for name in names if name != "recompute")]


# ---- composing: a context from many precompiled skills -------------------------------------------

COMPOSE_STRATEGIES = ("recompute", "splice", "seam", "epic", "selective", "prefix_reuse")

COMPOSE_HELP = {
    "recompute": "the reference: prefill the whole composed prompt",
    "splice": "full reuse: every skill's notes re-rotated into place, nothing recomputed",
    "seam": "splice, then the first K tokens of every skill recomputed with the real prefix (seam repair)",
    "epic": "splice, then the first k = 16 tokens of every skill recomputed (EPIC)",
    "selective": "splice, then the 15% of reused tokens whose first-layer K/V move most recomputed (CacheBlend)",
    "prefix_reuse": "exact: the context and the first skill reused as a prefix cache holds them, the rest recomputed",
}


def unknown_compose_strategies(names: list[str] | tuple[str, ...]) -> str:
    """'' when every name is a compose strategy, else one line naming the unknown ones."""
    unknown = [name for name in names if name not in COMPOSE_STRATEGIES]
    if not unknown:
        return ""
    return (f"unknown compose strategy {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(COMPOSE_STRATEGIES)}")


# ---- the erratum ---------------------------------------------------------------------------------

DEFAULT_TEMPLATE = (
    "\n[STATE UPDATE] {label} has changed from {old} to {new}; "
    "this overrides any earlier value and any earlier conclusion.\n"
)


def render_erratum(label: str, old: str, new: str, template: str = DEFAULT_TEMPLATE) -> str:
    """The erratum for one field. `label` falls back to "the value" when a field has no name."""
    try:
        return template.format(label=label.strip() or "the value", old=old.strip(), new=new.strip())
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"erratum template may only use {{label}}, {{old}} and {{new}}; it used {{{exc.args[0]}}}"
        ) from None


# ---- metrics -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One number (or value) reported for each strategy: its JSON name, its Python type, and what it
    measures in one line (the run page's legend)."""

    name: str
    type: object  # a type or a generic alias such as dict[str, float]
    help: str


# The one list. The engine's `StrategyResult`, the `run_results` columns and the API's result schema
# carry exactly these names (tests/test_layers.py checks); `kvnotes edit --json` prints them.
METRICS = (
    Metric("decision", str, "what the model decided: the most probable choice, or the first line of its answer"),
    Metric("choice_probs", dict[str, float], "probability of each choice (empty for a free answer)"),
    Metric("kl_to_recompute", float,
           "KL divergence of the first answer token's distribution from recompute's (0 = identical)"),
    Metric("top1_agrees", bool, "the most likely first answer token is the same as recompute's"),
    Metric("topk_overlap", int, "how many of recompute's 10 most likely first tokens are in this top 10"),
    Metric("logit_cosine", float, "cosine similarity of the first token's raw logits to recompute's"),
    Metric("decision_matches_recompute", bool,
           "same decision as recompute: the same choice, or the same answer after SQuAD normalisation"),
    Metric("tokens_computed", int, "tokens run through the model for the notes, seam repair included"),
    Metric("latency_ms", float, "from the cached notes to the whole answer: ttft_ms + decode_ms"),
    Metric("ttft_ms", float, "time to first token: from the cached notes to the first answer token's logits"),
    Metric("decode_ms", float, "time after the first token: generating the rest, or scoring the choices"),
    Metric("answer_f1", float, "token F1 of the answer against recompute's answer, SQuAD-normalised (1 = same words)"),
    Metric("recompute_answer_nll", float | None,
           "mean negative log-likelihood per token of recompute's answer under these notes (recompute's own is the baseline)"),
    Metric("prefix_cache_share", float,
           "share of the final prompt an exact-prefix serving cache (vLLM, SGLang) would reuse from the old one"),
    Metric("text", str, "generated text (free answer or chain of thought); empty when scored over choices"),
    Metric("detail", str, "how the strategy ran, e.g. which strategy auto picked"),
)
METRIC_NAMES = tuple(metric.name for metric in METRICS)
