"""The words every layer shares: strategy names and what each recomputes, the erratum template, and
the metrics a strategy is judged by. Each strategy's facts are a descriptor in
`vocabulary/strategies.py` (re-exported here); the hoist-to-end layout is `vocabulary/hoist.py`.

Plain Python that imports nothing, so the web app (which never loads torch) and the engine read one
definition. It lives in the engine because these are the engine's concepts; `worker/engine/__init__`
loads its torch-backed modules lazily, so `import vocabulary` costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from vocabulary.regions import ERRATUM

# strategies: one descriptor each (`vocabulary/strategies.py`)
from vocabulary.strategies import (
    AUTO_CANDIDATES,
    COMPOSE_HELP,
    COMPOSE_INFO,
    COMPOSE_STRATEGIES,
    DEFAULT_COMPOSE_STRATEGIES,
    DEFAULT_STRATEGIES,
    EDIT_INFO,
    EXACT_REUSE,
    FLOOR,
    REFERENCE,
    ROLES,
    STRATEGIES,
    STRATEGY_HELP,
    StrategyInfo,
    by_role,
    colours,
    unknown_compose_strategies,
    unknown_strategies,
    with_recompute,
)

# the bundled model a notebook, a run or a command uses unless told otherwise (torch-free, so that
# `kvnotes --help` and every command's parser build without importing the engine)
DEFAULT_MODEL = "smollm2-135m"

__all__ = [
    "DEFAULT_MODEL",
    "AUTO_CANDIDATES", "COMPOSE_HELP", "COMPOSE_INFO", "COMPOSE_STRATEGIES", "DEFAULT_COMPOSE_STRATEGIES",
    "DEFAULT_STRATEGIES",
    "DEFAULT_TEMPLATE", "EDIT_INFO", "ERRATUM", "EXACT_REUSE", "FLOOR", "METRICS", "METRIC_NAMES",
    "REFERENCE", "ROLES",
    "SPREAD",
    "STRATEGIES",
    "STRATEGY_HELP", "Metric", "StrategyInfo", "by_role", "colours", "render_erratum",
    "unknown_compose_strategies", "unknown_strategies",
    "with_recompute",
]


# The device name that spreads a model over every GPU, then the CPU (accelerate's `device_map`).
SPREAD = "auto"

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
    Metric("decision", str,
           "what the model decided: the most probable choice, or the first line of its answer"),
    Metric("choice_probs", dict[str, float],
           "probability of each choice, the mean over a balanced set of at most 8 orders of the choices "
           "(empty for a free answer)"),
    Metric("kl_to_recompute", float,
           "KL divergence of the first answer token's distribution from recompute's (0 = identical)"),
    Metric("top1_agrees", bool, "the most likely first answer token is the same as recompute's"),
    Metric("topk_overlap", int, "how many of recompute's 10 most likely first tokens are in this top 10"),
    Metric("logit_cosine", float, "cosine similarity of the first token's raw logits to recompute's"),
    Metric("decision_matches_recompute", bool,
           "same decision as recompute: the same choice, or the same answer after SQuAD normalisation"),
    Metric("tokens_computed", int, "tokens run through the model for the notes, seam repair included "
           "(for auto without a policy, every probe it ran, summed)"),
    Metric("latency_ms", float, "from the cached notes to the whole answer: ttft_ms + decode_ms"),
    Metric("ttft_ms", float, "time to first token: from the cached notes to the first answer token's logits"),
    Metric("decode_ms", float, "time after the first token, generating the rest of the answer (none "
           "for a choice question: its choices are scored with the first token)"),
    Metric("answer_f1", float,
           "token F1 of the answer against recompute's answer, SQuAD-normalised (1 = same words)"),
    Metric("recompute_answer_nll", float | None,
           "mean negative log-likelihood per token of recompute's answer under these notes "
           "(recompute's own is the baseline)"),
    Metric("prefix_cache_share", float,
           "share of the prompt this strategy sends (notes, then the question) that an exact-prefix "
           "serving cache (vLLM, SGLang) already holds from the original prompt (the old notes, placed "
           "skills included, then the same question)"),
    Metric("text", str, "generated text (free answer or chain of thought); empty when scored over choices"),
    Metric("detail", str, "how the strategy ran, e.g. how many downstream tokens selective chose"),
    Metric("picked", str | None, "the strategy auto picked (None for every other strategy)"),
    Metric("ttft_spread_ms", list[float],
           "[min, max] time to first token over the interleaved repeats (ttft_ms is their median)"),
    Metric("edit_followed", str | None,
           "does the answer name the fields' new values (new), the old ones (old), both or neither; "
           "None without fields"),
    Metric("speedup", float | None,
           "recompute's time to first token over this one's, the median over the paired timing rounds "
           "(recompute timed again in each round, beside the strategy); None for runs stored before"),
    Metric("speedup_range", list[float],
           "[min, max] of the speed-up over the paired rounds: noisy when it crosses 1× or spans more "
           "than a factor of 2, too short to time when recompute's first token is also under 250 ms "
           "(empty for runs stored before)"),
    Metric("choice_spread", dict[str, list[float]],
           "[min, max] of each choice's probability over the cyclic orders of the choices (choice_probs "
           "is their mean); empty for a free answer"),
    Metric("order_bias", str | None,
           "the position (first, last, …) whose choice the answer follows in more orders of the choices "
           "than it follows the document: read KL instead; None when the answer follows the document"),
    Metric("measure_ms", float,
           "reading the choices over their other orders (the decision's debiasing), after the first "
           "token and apart from it: time to first token is one readout in the listed order"),
    Metric("orders_read", int,
           "how many orders of the choices the decision was read over (0 for a free answer); fewer than "
           "orders_total is a partial reading, stopped once no order left could change the decision, "
           "whose choice_probs, choice_spread and order_bias cover only those orders"),
    Metric("orders_total", int, "how many orders of the choices a full reading reads (0 for a free answer)"),
)
METRIC_NAMES = tuple(metric.name for metric in METRICS)
