"""The Markdown report as one self-contained HTML page (figures as data URIs).

Whatever the Markdown holds, the page runs nothing and loads nothing: the body is
sanitised against an allow-list of the elements a report uses (headings, paragraphs,
lists, tables, code, emphasis, links to relative or http(s) targets, `claim-<n>` anchors,
images with PNG data URIs only, verdict classes on table cells), and a Content-Security-Policy
forbids scripts, frames, forms and every outside resource.  Input text is already
made literal in the Markdown (report.text); this is the second, independent layer.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Mapping

from .style import VERDICT_BACKGROUNDS
from .text import plain

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
td:first-child { white-space: nowrap; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f5f5f5; padding: 0 0.2em; }
h1 { border-bottom: 2px solid #444; } h2 { border-bottom: 1px solid #aaa; margin-top: 2em; }
""" + "".join(f"td.v-{v} {{ background: {c}; }}\n" for v, c in VERDICT_BACKGROUNDS.items())

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "p", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td",
        "code", "pre", "em", "strong", "img", "a", "hr", "br", "blockquote"}
ATTRIBUTES = {"img": {"src", "alt", "title"}, "a": {"href", "title", "id"}}
PNG_URI = "data:image/png;base64,"
_RELATIVE = re.compile(r"^[^:/?#]*(?:[/?#]|$)")  # no scheme: a relative reference
_ANCHOR = re.compile(r"^claim-[0-9]+$")  # the ids of claim sections (report.markdown.anchor)


def _allowed(tag: str, attr: str, value: str) -> str | None:
    """Keep an attribute value only where it is safe: PNG data URIs for images; links
    to relative or http(s) targets."""
    if (tag, attr) == ("img", "src"):
        return value if value.startswith(PNG_URI) else None
    if (tag, attr) == ("a", "id"):
        return value if _ANCHOR.match(value) else None
    if (tag, attr) == ("a", "href"):
        return value if _RELATIVE.match(value) or value.lower().startswith(("http://", "https://")) else None
    return value


def sanitise(body: str) -> str:
    """`body` with every element, attribute and URL outside the report's allow-list removed."""
    import nh3

    return nh3.clean(body, tags=TAGS, attributes=ATTRIBUTES, attribute_filter=_allowed,
                     url_schemes={"http", "https", "data"}, strip_comments=True, link_rel="noopener noreferrer",
                     allowed_classes={"td": {f"v-{v}" for v in VERDICT_BACKGROUNDS}})


def render_html(md: str, figures: dict[str, bytes], title: str, marks: Mapping[str, str] | None = None,
                rewrite: Callable[[str], str] | None = None) -> str:
    """`md` as a page: figures inlined, verdict cells coloured (and each cell holding
    exactly a key of `marks` coloured as its verdict), `rewrite` applied to the HTML
    body, then the body sanitised (see the module docstring) under a strict CSP."""
    import markdown

    body = markdown.markdown(md, extensions=["tables", "sane_lists"])
    for name, png in figures.items():
        uri = PNG_URI + base64.b64encode(png).decode()
        body = body.replace(f'src="figures/{html.escape(name)}"', f'src="{uri}"')
    cells = {v: v for v in VERDICT_BACKGROUNDS} | dict(marks or {})
    for text, verdict in cells.items():
        body = body.replace(f"<td>{html.escape(text, quote=False)}</td>",
                            f'<td class="v-{verdict}">{html.escape(text, quote=False)}</td>')
    if rewrite is not None:
        body = rewrite(body)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            f"<meta name=\"referrer\" content=\"no-referrer\">"
            f"<title>Evidence report: {html.escape(plain(title))}</title><style>{CSS}</style></head>"
            f"<body>\n{sanitise(body)}\n</body></html>\n")
