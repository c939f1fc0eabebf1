"""The erratum template: the correction appended after a document when a field changes.

Lives in `app/` (pure Python, no dependencies) so the web app can propose errata and the engine
can render its default ones from one definition; the engine imports it, never the reverse.
"""

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
