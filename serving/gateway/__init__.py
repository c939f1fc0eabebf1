"""The erratum gateway's core: an OpenAI request that equals a remembered base except for short
changed spans is sent as the base plus an erratum (or field + erratum, or hoisted), so the serving
engine's prefix cache keeps hitting; a sampled share is also sent unchanged and compared.

`serving.gateway.rewrite` (bases and layouts), `changes` (template and diff), `prompts` (the request's
context), `tenants` (whose bases a request may use), `state` and `redis_state` (where bases and counts
live: memory, or one Redis shared by every process), `stats` (counts, `/metrics` from
prometheus_client), `forward` (one request through the backend protocol). The
HTTP side is `app.gateway`; `kvnotes gateway` serves it alone, `kvnotes serve` at `/gateway/v1`.
"""

from serving.gateway.changes import Change, Slot, Template
from serving.gateway.forward import Gateway, Prepared, agree
from serving.gateway.prompts import CHAT, COMPLETIONS, Prompt, read_prompt
from serving.gateway.rewrite import LAYOUTS, PASS_THROUGH, Plan, Rewriter, Settings
from serving.gateway.stats import BaseRow, Stats

__all__ = ["CHAT", "COMPLETIONS", "LAYOUTS", "PASS_THROUGH", "BaseRow", "Change", "Gateway", "Plan",
           "Prepared", "Prompt", "Rewriter", "Settings", "Slot", "Stats", "Template", "agree", "read_prompt"]
