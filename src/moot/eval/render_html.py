"""The report as one self-contained HTML page: the same sections as the Markdown
(:func:`moot.eval.render.sections`), the figures inlined as PNG."""

from __future__ import annotations

import base64
import html
import re

from moot.eval.quality_render import render_quality_html
from moot.eval.render import NOTES, header_lines, sections
from moot.eval.report_model import EvalReport


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:.5em 0}code{background:#f3f3f3;padding:0 3px}
"""


def render_html(report: EvalReport, images: dict[str, bytes]) -> str:
    def md_inline(text: str) -> str:
        escaped = html.escape(text)
        escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
        escaped = re.sub(r"\*(.+?)\*", r"<i>\1</i>", escaped)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>moot eval: {html.escape(report.config.dataset)}"
             f"</title><style>{_CSS}</style></head><body>", f"<h1>moot eval: {html.escape(report.config.dataset)}</h1>",
             "<ul>" + "".join(f"<li>{md_inline(h)}</li>" for h in header_lines(report)) + "</ul>"]  # fmt: skip
    for part in sections(report):
        parts.append(f"<h2>{html.escape(part.title)}</h2>")
        if part.text:
            parts.append(f"<p>{md_inline(part.text)}</p>")
        if part.bullets:
            parts.append("<ul>" + "".join(f"<li>{md_inline(b.strip().removeprefix('- '))}</li>" for b in part.bullets)
                         + "</ul>")  # fmt: skip
        if part.table is not None:
            parts.append(_html_table(*part.table))
    if images:
        parts.append("<h2>Figures</h2>")
        for name, data in images.items():
            parts.append(f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>")
    else:
        parts.append("<p>(Figures need matplotlib: <code>pip install 'moot[eval]'</code>.)</p>")
    parts += render_quality_html(report.quality)
    parts.append(f"<p>{md_inline(NOTES)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
