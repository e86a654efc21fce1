"""What every chart of a report shares: one colour per stack decided in one place, integer
ticks on count axes, lift axes that do not exaggerate tiny differences, the seed noise band,
and saving with pinned metadata (regenerated files are byte-stable)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib as mpl  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.backends.backend_svg import FigureCanvasSVG  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# SVG text stays text (searchable, a third of the SVG's size): drawing each glyph as a path
# was a tenth of the charts' CPU
STABLE_RC = {"svg.hashsalt": "gepa-harness-report", "svg.fonttype": "none", "path.simplify": True}
CONTROL_GREY = "#7f7f7f"  # the seed-only control arm, in every chart
SEED_GREY = "0.35"
NOISE_COLOUR = "#9ecae1"
MIN_LIFT = 0.05  # a lift axis spans at least +-0.05 reward
SCORE = "mean reward on the pool's rows (0-1)"
TITLE_CHARS = 72
# a key's or a tick's label wraps past these: a label naming a configuration ("gepa
# (cited_memory=0, edit_formats=[...], +11 more #ed2f09)") runs past 100 characters, and one
# line of that pushed the axes out of the figure
KEY_CHARS = 60
TICK_CHARS = 26
KEY_LINE_IN = 8 * 1.25 / 72  # one line of an 8 pt key, in inches
KEY_CHAR_IN = 8 * 0.55 / 72  # one character of it, about
PNG_DPI = 110


def palette(labels: Iterable[str]) -> dict[str, str]:
    """Label -> colour for a whole report: labels in sorted order take tab10 (tab20 past nine),
    skipping grey, which only the seed-only control arm gets."""
    names = sorted(set(labels))
    control = [n for n in names if n.split(" (")[0] == "seed_only"]
    others = [n for n in names if n not in control]
    cmap = mpl.colormaps["tab10" if len(others) <= 9 else "tab20"]
    greys = {7} if cmap.N == 10 else {14, 15}
    slots = [i for i in range(cmap.N) if i not in greys]
    colours = {name: to_hex(cmap(slots[i % len(slots)])) for i, name in enumerate(others)}
    return {**colours, **{name: CONTROL_GREY for name in control}}


def integer_ticks(lo: float, hi: float, max_ticks: int = 8) -> list[int]:
    """Whole-number ticks covering [lo, hi] with a 1-2-5 step: never K = 0.6 on a count axis."""
    first, last = math.floor(lo), math.ceil(hi)
    span = max(last - first, 1)
    step = 1
    for magnitude in (10 ** e for e in range(0, 12)):
        found = next((m * magnitude for m in (1, 2, 5) if span / (m * magnitude) <= max_ticks - 1), None)
        if found is not None:
            step = found
            break
    start = math.ceil(first / step) * step
    return list(range(start, last + 1, step))


def count_axis(ax: Axes, which: str, lo: float, hi: float, pad: float = 0.5) -> None:
    """A count axis: integer ticks and limits a little past the data."""
    ticks = integer_ticks(lo, hi)
    limits = (min(lo, ticks[0]) - pad, max(hi, ticks[-1]) + pad)
    if which == "x":
        ax.set_xticks(ticks)
        ax.set_xlim(*limits)
    else:
        ax.set_yticks(ticks)
        ax.set_ylim(*limits)


def lift_limit(values: Iterable[float | None]) -> float:
    """Half-height of a symmetric lift axis: at least MIN_LIFT, rounded up to 0.05."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
    top = max(finite + [0.0]) * 1.15
    return max(MIN_LIFT, math.ceil(round(top / 0.05, 9)) * 0.05)


def lift_axis(ax: Axes, values: Iterable[float | None], label: str) -> None:
    limit = lift_limit(values)
    ax.set_ylim(-limit, limit)
    ax.axhline(0.0, color=SEED_GREY, linewidth=1.0, zorder=1)
    ax.set_ylabel(label)


def noise_band(ax: Axes, half: float | None, runs: int) -> None:
    """The seed's run-to-run spread as a band around zero lift, or a note that it is unknown."""
    if half is None:
        ax.text(0.01, 0.02, f"seed noise floor unknown ({runs} run{'s' if runs != 1 else ''} of the seed)",
                transform=ax.transAxes, fontsize=8, color=SEED_GREY, va="bottom")
        return
    ax.axhspan(-half, half, color=NOISE_COLOUR, alpha=0.35, linewidth=0, zorder=0,
               label=f"{NOISE_LABEL}{half:.3f} (half range, {runs} runs)")


def figure(n_panels: int, ncols: int = 1, width: float = 6.4, height: float = 4.4) -> tuple[Figure, list[Axes]]:
    n_panels = max(n_panels, 1)
    nrows = (n_panels + ncols - 1) // ncols
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for extra in axes[n_panels:]:
        extra.set_visible(False)
    return fig, axes


def title(ax: Axes, text: str, chars: int = TITLE_CHARS) -> None:
    ax.set_title(textwrap.fill(text, chars), fontsize=9.5, loc="left")


def suptitle(fig: Figure, text: str) -> None:
    """The figure's heading, wrapped to its width (about 11 characters per inch at 12 pt)."""
    fig.suptitle(textwrap.fill(text, max(40, int(fig.get_figwidth() * 11))))


def wrapped(label: str, chars: int = KEY_CHARS) -> str:
    return textwrap.fill(label, chars)


def legend(ax: Axes, loc: str = "best") -> None:
    """Inside the axes for a few entries, to the right of it for more (so lines stay visible)."""
    handles, labels = ax.get_legend_handles_labels()
    if not labels:
        return
    labels = [wrapped(label) for label in labels]
    if len(labels) > 4:
        ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(handles, labels, fontsize=8, loc=loc)


NOISE_LABEL = "seed noise ±"
SHARED_NOISE_LABEL = "seed noise band (its half range is in each panel's title)"


def figure_legend(fig: Figure, axes: Sequence[Axes], loc: str = "best") -> None:
    """One key for a figure's panels: a label has one colour in the whole report, so panels
    need not repeat it. A legend per panel was over half of the charts' CPU with many cells
    (each one laid out and drawn, twice per save). A single panel keeps its own legend; the
    noise bands of several panels, which differ only in width, share one entry."""
    shown = [ax for ax in axes if ax.get_visible()]
    if len(shown) == 1:
        legend(shown[0], loc)
        return
    entries: dict[str, Artist] = {}
    for ax in shown:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    noise = [label for label in entries if label.startswith(NOISE_LABEL)]
    if len(noise) > 1:
        band = entries[noise[0]]
        entries = {label: handle for label, handle in entries.items() if label not in noise}
        entries[SHARED_NOISE_LABEL] = band
    if entries:
        labels = [wrapped(label) for label in entries]
        fig.legend(list(entries.values()), labels, loc="outside right upper", fontsize=8)
        # a key taller than the figure is cut off, and a key beside the panels takes its
        # width from theirs, squeezing them under titles wrapped for a whole panel (two
        # panels' titles then overlap): the figure grows to hold it
        lines = sum(label.count("\n") + 1 for label in labels) + 0.5 * len(labels)
        fig.set_figheight(max(fig.get_figheight(), lines * KEY_LINE_IN + 0.6))
        widest = max(len(line) for label in labels for line in label.splitlines())
        fig.set_figwidth(fig.get_figwidth() + widest * KEY_CHAR_IN + 0.6)


def spread(n: int, width: float = 0.24) -> list[float]:
    """Deterministic horizontal offsets for n dots around one x."""
    if n <= 1:
        return [0.0]
    return [width * (i / (n - 1) - 0.5) for i in range(n)]


def save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """The PNG and the SVG, each drawn in one pass, the layout computed once: the PNG canvas's
    draw runs the constrained layout, which then stays put for the SVG. ``savefig`` would draw
    each format twice and lay out four times; the layout was a third of the charts' CPU.
    Leaves the figure's layout fixed (drawn again, it keeps the positions of this save)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    dpi = fig.get_dpi()
    try:
        with mpl.rc_context(STABLE_RC):
            fig.set_dpi(PNG_DPI)
            FigureCanvasAgg(fig).print_png(png, metadata={"Software": None})
            fig.set_dpi(dpi)  # the SVG canvas draws at 72 dpi and embeds images at the figure's
            fig.set_layout_engine("none")  # positions are figure fractions: the same at any dpi
            FigureCanvasSVG(fig).print_svg(svg, metadata={"Date": None, "Creator": None})
    finally:
        fig.set_dpi(dpi)
    return [png, svg]


def remove_stale(out_dir: Path, names: Sequence[str]) -> None:
    """Charts an earlier report drew that this one does not (a run became a sweep)."""
    for name in names:
        for suffix in (".png", ".svg"):
            (out_dir / f"{name}{suffix}").unlink(missing_ok=True)
