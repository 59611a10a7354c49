"""A self-contained HTML pilot report: the table, the plot embedded as base64, the JSON."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from rollbox.pilot.models import PilotReport
from rollbox.pilot.table import COLUMNS, rows

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f0f0f0} td:first-child,td:last-child{text-align:left}
.leak{color:#b00;font-weight:bold} img{max-width:100%;border:1px solid #ddd}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:12px;max-height:40em}
"""


def render_html(report: PilotReport, png: bytes | None, path: Path) -> Path:
    """Write the report to ``path``; ``png`` (the plot's bytes) is embedded inline."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows(report):
        cells = []
        for c, v in zip(COLUMNS, r, strict=True):
            cls = ' class="leak"' if c == "cleanup" and v != "clean" else ""
            cells.append(f"<td{cls}>{html.escape(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    errors = [
        f"<li>{html.escape(b.backend)}: {html.escape(b.error)}</li>"
        for b in report.backends
        if b.error
    ]
    img = ""
    if png:
        data = base64.b64encode(png).decode()
        img = f'<p><img alt="pilot plot" src="data:image/png;base64,{data}"></p>'
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rollbox pilot</title>
<style>{_CSS}</style></head><body>
<h1>rollbox pilot</h1>
<p>workload <b>{html.escape(report.workload)}</b>, {report.rollouts} rollouts per level,
concurrency {", ".join(map(str, report.concurrency))}, retries {report.retries};
host {html.escape(report.host)} ({report.cpus} CPUs); baseline
<code>{html.escape(report.baseline[:19])}</code>; {report.started_at:%Y-%m-%d %H:%M:%S} UTC,
{(report.finished_at - report.started_at).total_seconds():.1f} s.</p>
<p>Latencies in ms. <i>prov</i> = create + first exec of <code>true</code>; <i>raw</i> = the
raw tool's bare start of <code>true</code> at the same concurrency in the same run.</p>
<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>
{"<ul>" + "".join(errors) + "</ul>" if errors else ""}
{img}
<h2>Data</h2><pre>{html.escape(json.dumps(report.model_dump(mode="json"), indent=1))}</pre>
</body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
    return path
