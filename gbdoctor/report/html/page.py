"""HTML building blocks: escaping, tags, tables, field lists, charts, and the page around them.

The page inlines its stylesheet, its script and Chart.js (vendored in ``static/``, MIT, its
licence beside it), so one file opens offline. Charts carry their numbers as JSON in the page,
taken from the records as they are; the script only draws them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from importlib import resources

__all__ = [
    "Chart",
    "Page",
    "Series",
    "badge",
    "fields",
    "h",
    "section",
    "table",
    "tag",
]

CHART_JS_VERSION = "4.6.1"
"""The vendored ``static/chart.umd.min.js`` (npm ``chart.js``); ``static/chart.js.LICENSE.md``."""

KIND_COLORS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#e15759",
    "#9c755f",
)
"""Block-kind colours of the model strip and the charts, in kind order (then repeated)."""


def h(value: object) -> str:
    """``value`` as HTML text (quotes escaped too: it may sit in an attribute)."""
    return escape(str(value), quote=True)


def tag(name: str, body: str = "", **attrs: object) -> str:
    """``<name attrs>body</name>``; ``class_`` is ``class``, ``data_x`` is ``data-x``; an
    attribute whose value is None or False is left out, True writes the bare name."""
    parts = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        attr = key.rstrip("_").replace("_", "-")
        parts.append(attr if value is True else f'{attr}="{h(value)}"')
    return f"<{' '.join(parts)}>{body}</{name}>"


def section(ident: str, title: str, body: str) -> str:
    """A titled section of an article (``ident``: its anchor, unique on the page)."""
    return tag("section", tag("h3", h(title)) + body, id=ident)


def badge(text: str, tone: str) -> str:
    """A small coloured label; ``tone``: ``bad``, ``warn``, ``good`` or ``info``."""
    return tag("span", h(text), class_=f"badge {tone}")


def table(
    head: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Iterable[int] = (),
    row_class: str | None = None,
) -> str:
    """A table of already-escaped cells; columns listed in ``numeric`` align right."""
    right = set(numeric)
    heads = "".join(
        tag("th", h(name), class_="num" if i in right else None) for i, name in enumerate(head)
    )
    body = "".join(
        tag(
            "tr",
            "".join(
                tag("td", cell, class_="num" if i in right else None) for i, cell in enumerate(row)
            ),
            class_=row_class,
        )
        for row in rows
    )
    return tag("table", tag("thead", tag("tr", heads)) + tag("tbody", body))


def fields(pairs: Iterable[tuple[str, str]]) -> str:
    """A definition list of (label, already-escaped value) pairs."""
    return tag("dl", "".join(tag("dt", h(k)) + tag("dd", v) for k, v in pairs), class_="fields")


def number(value: float | int | None, digits: int = 3) -> str:
    """A record's number as written for people: ``-`` when absent, else up to ``digits``
    significant decimals (the value itself, rounded for display only)."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


@dataclass(frozen=True)
class Series:
    """One dataset of a chart: ``data`` are the records' values (None: no value), or
    ``[low, high]`` pairs for a spread drawn as a thin bar over the main one."""

    label: str
    data: Sequence[float | int | None | Sequence[float]]
    color: str
    type: str | None = None
    range: bool = False


@dataclass(frozen=True)
class Chart:
    """A chart the page's script draws with Chart.js; the caption says what it shows."""

    kind: str
    """Chart.js type: ``bar`` or ``line``."""
    title: str
    labels: Sequence[str]
    series: Sequence[Series]
    caption: str = ""
    x_label: str = ""
    y_label: str = ""
    unit: str = ""
    begin_at_zero: bool = True
    stacked: bool = False
    """Bars stacked per label (a line dataset stays on its own)."""

    def spec(self) -> dict[str, object]:
        return {
            "type": self.kind,
            "labels": list(self.labels),
            "datasets": [
                {
                    "label": s.label,
                    "data": list(s.data),
                    "color": s.color,
                    **({"type": s.type} if s.type else {}),
                    **({"range": True} if s.range else {}),
                }
                for s in self.series
            ],
            "xLabel": self.x_label,
            "yLabel": self.y_label,
            "unit": self.unit,
            "beginAtZero": self.begin_at_zero,
            "stacked": self.stacked,
        }


_SCRIPT_DATA_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)
"""What HTML's script-data states react to (``</script``, ``<!--``), escaped the way JSON
allows inside a string (the only place JSON text can hold them), so the text parses as the same
JSON (issue 45: ``<!--<script>`` in a break message swallowed the page's scripts)."""


def script_safe_json(text: str) -> str:
    """JSON text made safe inside ``<script type="application/json">`` (``str.replace`` per
    character: a search in C, where ``str.translate`` visits every character of a 200 MB twin)."""
    for raw, escaped in _SCRIPT_DATA_ESCAPES:
        if raw in text:
            text = text.replace(raw, escaped)
    return text


def _script_json(data: object) -> str:
    return script_safe_json(json.dumps(data, sort_keys=True))


def _static(name: str) -> str:
    return resources.files("gbdoctor.report.html").joinpath("static", name).read_text("utf-8")


def _chart_js() -> str:
    # The source-map comment would make devtools ask for a file the page does not have.
    lines = _static("chart.umd.min.js").splitlines()
    return "\n".join(line for line in lines if not line.startswith("//# sourceMappingURL="))


@dataclass
class Page:
    """The page being built: articles (one per document), the navigation, the chart data and
    the JSON twins embedded for download."""

    title: str
    articles: list[str] = field(default_factory=list)
    nav: list[tuple[str, str]] = field(default_factory=list)
    scripts: list[tuple[str, str]] = field(default_factory=list)

    def chart(self, chart: Chart) -> str:
        """The chart's figure; its data go into the page as JSON for the script."""
        ident = f"chart-{len(self.scripts)}"
        self.scripts.append((ident, _script_json(chart.spec())))
        canvas = tag("canvas", "", data_chart=ident, role="img", aria_label=chart.title)
        caption = tag("b", h(chart.title)) + (f" {h(chart.caption)}" if chart.caption else "")
        return tag(
            "figure",
            tag("div", canvas, class_="box") + tag("figcaption", caption),
            class_="chart",
        )

    def twin(self, text: str, name: str) -> str:
        """A link that downloads ``text`` (a document's JSON, embedded) as ``name``."""
        ident = f"twin-{len(self.scripts)}"
        self.scripts.append((ident, script_safe_json(text)))
        return tag("a", h(f"JSON twin ({name})"), href="#", data_twin=ident, data_name=name)

    def render(self) -> str:
        data = "".join(
            tag("script", body, type="application/json", id=ident) for ident, body in self.scripts
        )
        nav = "".join(tag("a", h(label), href=f"#{anchor}") for anchor, label in self.nav)
        header = tag("header", tag("h1", h(self.title)) + tag("nav", nav), class_="top")
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            # No request leaves the page: everything it needs is inline.
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
            'connect-src blob:">'
            f"{tag('title', h(self.title))}{tag('style', _static('report.css'))}</head>\n"
            f"<body>{header}<main>{''.join(self.articles)}</main>\n{data}\n"
            f"<script>{_chart_js()}</script>\n<script>{_static('report.js')}</script>"
            "</body></html>\n"
        )
