"""The pilot's PNG: provisioning latency percentiles and throughput against concurrency.

Left panel: p50 / p95 / p99 provisioning latency (ms, log scale) per backend, with the raw
tool's p50 dashed. Right panel: completed rollouts per second, backends side by side.
"""

from __future__ import annotations

from pathlib import Path

from rollbox.pilot.models import PilotReport

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
_STYLES = {"p50_ms": ("-", "o"), "p95_ms": ("--", "s"), "p99_ms": (":", "^")}


def render_png(report: PilotReport, path: Path) -> Path:
    """Draw the plot into ``path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax_lat, ax_tp) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    backends = [b for b in report.backends if b.levels]
    levels = sorted({lv.concurrency for b in backends for lv in b.levels})
    xpos = {c: i for i, c in enumerate(levels)}
    width = 0.8 / max(1, len(backends))
    for bi, b in enumerate(backends):
        color = _COLORS[bi % len(_COLORS)]
        xs = [xpos[lv.concurrency] for lv in b.levels]
        for key, (style, marker) in _STYLES.items():
            ys = [getattr(lv.provisioning, key) for lv in b.levels]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax_lat.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    linestyle=style,
                    marker=marker,
                    color=color,
                    label=f"{b.backend} {key[:3]}",
                )
        raw_pts = [
            (xpos[lv.concurrency], lv.raw.start.p50_ms)
            for lv in b.levels
            if lv.raw.available and lv.raw.start.p50_ms is not None
        ]
        if raw_pts:
            ax_lat.plot(
                [p[0] for p in raw_pts],
                [p[1] for p in raw_pts],
                linestyle=(0, (1, 1)),
                marker="x",
                color=color,
                alpha=0.6,
                label=f"raw {b.levels[0].raw.tool} p50",
            )
        offs = (bi - (len(backends) - 1) / 2) * width
        bars = ax_tp.bar(
            [x + offs for x in xs],
            [lv.throughput_per_s for lv in b.levels],
            width=width,
            color=color,
            label=b.backend,
        )
        ax_tp.bar_label(bars, fmt="%.1f", fontsize=8)
    for ax in (ax_lat, ax_tp):
        ax.set_xticks(range(len(levels)), [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.grid(True, axis="y", alpha=0.3)
    ax_lat.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax_lat.yaxis.set_major_formatter(plain)
    ax_lat.yaxis.set_minor_formatter(plain)
    ax_lat.tick_params(axis="y", which="minor", labelsize=7)
    ax_lat.set_ylabel("provisioning latency (ms, create + first exec)")
    ax_lat.set_title("Provisioning latency percentiles")
    ax_lat.legend(fontsize=7, ncol=2)
    ax_tp.set_ylabel("completed rollouts / s")
    ax_tp.set_title("Throughput")
    ax_tp.legend(fontsize=8)
    fig.suptitle(
        f"rollbox pilot — workload {report.workload}, {report.rollouts} rollouts per level, "
        f"{report.cpus} CPUs",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
