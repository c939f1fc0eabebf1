"""The gateway's own request slots (issue 49 item 4): a gateway request may hold its slot for minutes
(a long prefill, a slow upstream, a stream), so it never takes one of the web app's slots
(`app.api.capacity`, sized with the database pool) nor waits in its line, and it holds no database
connection (`app.security.guard.authorize` gives its session back once the caller is known). It
takes one of this process's `KVNOTES_GATEWAY_SLOTS` instead, at most `KVNOTES_GATEWAY_SLOTS_PER_USER`
per tenant (the signed-in user under `kvnotes serve`, else the API key or tenant header; requests with
none share one count), for as long as its answer is being sent. Past either cap the answer is 429
with `Retry-After` at once: one user's slow upstream never takes the notebook away from everyone.

Event-loop only (plain counters, no lock): every take and give runs in the loop's one thread.
"""

from __future__ import annotations

from collections import Counter

NO_TENANT = "-"  # the count of requests that name no tenant
RETRY_AFTER_S = 2


class Slots:
    """The counts held, in all and per tenant."""

    def __init__(self) -> None:
        self.held = 0
        self.per_tenant: Counter[str] = Counter()
        self.refused = 0

    def take(self, tenant: str, total: int, per_tenant: int) -> str:
        """Take a slot for `tenant`; "" when taken, else why not (the 429's message)."""
        who = tenant or NO_TENANT
        if self.per_tenant[who] >= per_tenant:
            self.refused += 1
            return (f"this tenant already has {per_tenant} gateway requests in flight "
                    "(KVNOTES_GATEWAY_SLOTS_PER_USER); try again when one has finished")
        if self.held >= total:
            self.refused += 1
            return (f"the gateway has {total} requests in flight (KVNOTES_GATEWAY_SLOTS); "
                    "try again shortly")
        self.held += 1
        self.per_tenant[who] += 1
        return ""

    def give(self, tenant: str) -> None:
        who = tenant or NO_TENANT
        self.held -= 1
        self.per_tenant[who] -= 1
        if self.per_tenant[who] <= 0:
            del self.per_tenant[who]


SLOTS = Slots()  # this process's
