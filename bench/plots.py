"""Plots of the engine benchmark (matplotlib, written as PNG next to the markdown that shows them)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def speedup_by_position(path: Path, speedups: dict[tuple[str, int], dict[str, float]], device: str) -> str:
    """Speed-up over recompute against document length: one panel per strategy, one line per field
    position. `speedups[(position, tokens)][strategy]`."""
    plt = _pyplot()
    if plt is None:
        return "(matplotlib not installed: no plot written)"
    positions = list(dict.fromkeys(p for p, _ in speedups))
    sizes = sorted({n for _, n in speedups})
    names = [s for s in next(iter(speedups.values())) if s != "recompute"]
    cols = 4
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for i, pos in enumerate(positions):
            xs = [n for n in sizes if (pos, n) in speedups]
            ax.plot(xs, [speedups[(pos, n)][name] for n in xs], marker="o", color=f"C{i}",
                    label=f"field {pos}")
        ax.axhline(1, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_title(name)
        ax.set_xlabel("document tokens")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes[0][0].set_ylabel("speed-up over recompute (×, same call)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Edit strategies against recompute, by document length and field position ({device})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"![speed-up by field position]({path.name})"


def latency(path: Path, sizes: list[int], lat: dict[int, dict[str, float]], device: str, title: str) -> str:
    """Latency and speed-up per strategy against document length (one position)."""
    plt = _pyplot()
    if plt is None:
        return "(matplotlib not installed: no plot written)"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(next(iter(lat.values())).keys())
    for i, name in enumerate(names):
        a1.plot(sizes, [lat[s][name] for s in sizes], marker="o", label=name, color=f"C{i}")
        if name != "recompute":
            a2.plot(sizes, [lat[s]["recompute"] / lat[s][name] for s in sizes], marker="o",
                    label=name, color=f"C{i}")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_xlabel("document tokens (target)")
        ax.grid(True, which="both", alpha=0.3)
    a1.set_ylabel("latency to decision, ms (median)")
    a1.set_title(f"{title} ({device})")
    a2.set_ylabel("speed-up over recompute (×)")
    a2.set_title("Speed-up over recompute, same run")
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![latency]({path.name})"
