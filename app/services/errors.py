"""The errors actions raise: `Unprocessable` for input that is well-formed but impossible here
(422), `Gone` for what was deleted meanwhile (404), `RunLimitReached` when the run caps are reached
(429)."""

from __future__ import annotations


class Unprocessable(ValueError):
    """`errors` maps each request field to blame to one line a person can act on. The API answers
    422 shaped like FastAPI's validation errors; a page shows each message beside its field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.errors = {field: message}

    @classmethod
    def of(cls, errors: dict[str, str]) -> Unprocessable:
        """Several fields at once (a form's checks); `errors` must not be empty."""
        first, *_ = errors.items()
        exc = cls(*first)
        exc.errors = dict(errors)
        return exc

    @property
    def field(self) -> str:
        return next(iter(self.errors))

    @property
    def message(self) -> str:
        return "; ".join(self.errors.values())


class Gone(LookupError):
    """What an action works on was deleted meanwhile (a field whose notebook another request just
    deleted): the API and the pages answer 404 with this message, as they would had the request
    come a moment later."""


class RunLimitReached(RuntimeError):
    """Too many runs queued or running (for this user, or in all): the API answers 429 with this
    message, which names the limit and its setting."""
