"""The Markdown report as one self-contained HTML page (figures as data URIs).

Whatever the Markdown holds, the page runs nothing and loads nothing: the body is
sanitised against an allow-list of the elements a report uses (headings, paragraphs,
lists, tables, code, emphasis, links to relative or http(s) targets, `claim-<n>` anchors,
images with PNG data URIs only, verdict classes on table cells, line-break opportunities
(`wbr`), and the `div.table-box` each table sits in), and a Content-Security-Policy forbids
scripts, frames, forms and every outside resource.  Input text is already made literal in
the Markdown (report.text); this is the second, independent layer.

The page reads at 1200 px and 800 px windows (tests/test_report_layout.py): nothing is wider
than the content column; every table sits in its own horizontal scroll box (`div.table-box`),
which scrolls only a table that cannot fit (the ladder at 800 px); groups of names
(`L0H3+L0H4+...`) may break after each `+`; the evidence ladder shows all its columns at
1200 px, one step a line; the verdict table's reason column keeps a readable width; and
figures (drawn at most 1060 px wide) are shown at their own size where the column holds them,
scaled down to it where not.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Mapping

from .markdown import SYMBOLS
from .style import VERDICT_BACKGROUNDS
from .text import plain

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; overflow-wrap: break-word; }
.table-box { overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.verdicts td:first-child { white-space: nowrap; }
.verdicts td:nth-child(3) { min-width: 12em; }
.verdicts td:last-child { min-width: 16em; }
.ladder table { font-size: 0.85em; }
.ladder th, .ladder td { padding: 0.3em 0.3em; }
.ladder td:first-child { min-width: 7em; }
.ladder td:last-child { min-width: 16em; }
.routes td:first-child, .routes td:nth-child(6) { white-space: nowrap; }
.routes td:last-child { min-width: 14em; }
img { max-width: 100%; height: auto; box-sizing: border-box; border: 1px solid #eee; }
code { background: #f5f5f5; padding: 0 0.2em; } pre { white-space: pre-wrap; }
h1 { border-bottom: 2px solid #444; } h2 { border-bottom: 1px solid #aaa; margin-top: 2em; }
@media (max-width: 1000px) {
  .verdicts td:first-child { white-space: normal; } .verdicts td:nth-child(3) { min-width: 7em; }
  .verdicts td:last-child { min-width: 10em; } .verdicts th, .verdicts td { padding: 0.3em 0.45em; } }
""" + "".join(f"td.v-{v} {{ background: {c}; }}\n" for v, c in VERDICT_BACKGROUNDS.items())

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "p", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td",
        "code", "pre", "em", "strong", "img", "a", "hr", "br", "blockquote", "wbr", "div"}
ATTRIBUTES = {"img": {"src", "alt", "title"}, "a": {"href", "title", "id"}}
PNG_URI = "data:image/png;base64,"
NBSP = "\u00a0"
_RELATIVE = re.compile(r"^[^:/?#]*(?:[/?#]|$)")  # no scheme: a relative reference
_ANCHOR = re.compile(r"^claim-[0-9]+$")  # the ids of claim sections (report.markdown.anchor)
BOX = "table-box"  # the class of the scroll box around each table
# the tables styled on their own, by their first and last column headers (report.markdown)
TABLE_KINDS = {("claim", "reason"): "verdicts", ("mechanism", "contradictions"): "ladder",
               ("edge", "tests"): "routes"}  # routes: weights vs use
CLASSES = {"td": {f"v-{v}" for v in VERDICT_BACKGROUNDS}, "div": {BOX, *TABLE_KINDS.values()}}
_TABLE = re.compile(r"<table>(.*?)</table>", re.S)
_HEADERS = re.compile(r"<th(?:\s[^>]*)?>(.*?)</th>", re.S)
_TEXT = re.compile(r">([^<>]+)<")  # the text between two tags (attribute values escape < and >)
_GROUP = re.compile(r"(?<=[^\s+])\+(?=[^\s+])")  # a + joining two names: L0H3+L0H4
_MARKS = "".join(re.escape(m) for m in SYMBOLS.values())
_RUNG_CELL = re.compile(rf"<td>([{_MARKS}] .*?)</td>", re.S)  # a ladder cell listing steps: `✓ a ✗ b`
_STEP = re.compile(rf" ([{_MARKS}]) ")


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


def _boxed(match: re.Match[str]) -> str:
    """A table in its scroll box, the box classed by the table's kind where it has one."""
    headers = [html.unescape(h).strip() for h in _HEADERS.findall(match.group(1))]
    kind = TABLE_KINDS.get((headers[0], headers[-1])) if headers else None
    table = match.group(0)
    if kind == "ladder":  # one step a line, each mark kept with its claim
        table = _RUNG_CELL.sub(lambda m: "<td>" + m.group(1)[0] + NBSP + _STEP.sub(rf"<br>\1{NBSP}", m.group(1)[2:])
                               + "</td>", table)
    return f'<div class="{BOX}{" " + kind if kind else ""}">{table}</div>'


def fit(body: str) -> str:
    """`body` laid out to fit its column: each table in a scroll box (the ladder's steps one
    a line), and a line-break opportunity (`<wbr>`) after each `+` of a group of names, so
    that `L0H3+L0H4+...` wraps."""
    body = _TEXT.sub(lambda m: ">" + _GROUP.sub("+<wbr>", m.group(1)) + "<", body)
    return _TABLE.sub(_boxed, body)


def sanitise(body: str) -> str:
    """`body` with every element, attribute and URL outside the report's allow-list removed."""
    import nh3

    return nh3.clean(body, tags=TAGS, attributes=ATTRIBUTES, attribute_filter=_allowed,
                     url_schemes={"http", "https", "data"}, strip_comments=True, link_rel="noopener noreferrer",
                     allowed_classes=CLASSES)


def render_html(md: str, figures: dict[str, bytes], title: str, marks: Mapping[str, str] | None = None,
                rewrite: Callable[[str], str] | None = None) -> str:
    """`md` as a page: figures inlined, verdict cells coloured (and each cell holding
    exactly a key of `marks` coloured as its verdict), `rewrite` applied to the HTML
    body, the body laid out to fit (`fit`), then sanitised (see the module docstring)
    under a strict CSP."""
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
    body = fit(body)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            f"<meta name=\"referrer\" content=\"no-referrer\">"
            f"<title>Evidence report: {html.escape(plain(title))}</title><style>{CSS}</style></head>"
            f"<body>\n{sanitise(body)}\n</body></html>\n")
