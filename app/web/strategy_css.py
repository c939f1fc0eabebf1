"""The strategies' colours as one stylesheet fragment, written from their descriptors
(`vocabulary.StrategyInfo.colour`): a `--s-{name}` variable per strategy, and the `.strategy.{name}`
/ `.s-{name}` classes that set the chips' and panels' `--c` from it. Every page links it after
`kvnotes.css` (`base.html`, `present.html`), the offline report inlines it, and the server's drawings
(`svg_export`, `regions_view`) read the same descriptors, so a strategy's colour is written once.
"""

from __future__ import annotations

from functools import lru_cache

from vocabulary import EDIT_INFO, ROLES, colours


def strategy_css(palette: dict[str, str] | None = None, roles: dict[str, str] | None = None) -> str:
    """The fragment for `palette` (name → `#rrggbb`; every strategy's by default) and `roles` (role
    → the one edit strategy that plays it, as `--role-{role}`; a chip of no known strategy takes
    the reference's colour)."""
    palette = colours() if palette is None else palette
    if roles is None:
        players = {role: [n for n, info in EDIT_INFO.items() if info.role == role] for role in ROLES}
        roles = {role: names[0] for role, names in players.items() if len(names) == 1}
    lines = ["/* written by app/web/strategy_css.py from the strategies' descriptors */", ":root {"]
    lines += [f"  --s-{name}: {colour};" for name, colour in palette.items()]
    lines += [f"  --role-{role}: var(--s-{name});" for role, name in roles.items() if name in palette]
    lines.append("}")
    lines += [f".strategy.{name}, .s-{name} {{ --c: var(--s-{name}); }}" for name in palette]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=1)
def cached_strategy_css() -> str:
    """The fragment the server sends (the descriptors do not change while it runs)."""
    return strategy_css()
