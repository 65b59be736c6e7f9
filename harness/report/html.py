"""The Markdown report as one self-contained HTML page (figures as data URIs)."""

from __future__ import annotations

import base64
import html

from .style import VERDICT_BACKGROUNDS

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f5f5f5; padding: 0 0.2em; }
h1 { border-bottom: 2px solid #444; } h2 { border-bottom: 1px solid #aaa; margin-top: 2em; }
""" + "".join(f"td.v-{v} {{ background: {c}; }}\n" for v, c in VERDICT_BACKGROUNDS.items())


def render_html(md: str, figures: dict[str, bytes], title: str) -> str:
    """`md` as a page: figures inlined, verdict cells coloured."""
    import markdown

    body = markdown.markdown(md, extensions=["tables", "sane_lists"])
    for name, png in figures.items():
        uri = "data:image/png;base64," + base64.b64encode(png).decode()
        body = body.replace(f'src="figures/{name}"', f'src="{uri}"')
    for verdict in VERDICT_BACKGROUNDS:
        body = body.replace(f"<td>{verdict}</td>", f'<td class="v-{verdict}">{verdict}</td>')
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Evidence report: {html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body>\n{body}\n</body></html>\n")


def mark_cells(page: str, text: str, verdict: str) -> str:
    """Colour every table cell holding exactly `text` as `verdict`."""
    return page.replace(f"<td>{text}</td>", f'<td class="v-{verdict}">{text}</td>')
