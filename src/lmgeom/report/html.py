"""Self-contained HTML pages: styles, Plotly's script and all data inlined (readable from file://)."""

from __future__ import annotations

import html
import json
from typing import Any, Iterable, Sequence

import pandas as pd

from lmgeom.report.explorer import CHART_COLUMNS, WORD_COLUMNS
from lmgeom.report.figures import (Chart, EffectChart, StackedBars, plotly_band_note, plotly_effects, plotly_figure,
                                   plotly_stacked)
from lmgeom.report.labels import label, number
from lmgeom.report.missing_data import Skipped
from lmgeom.rundir import EXPLORER, generator_mark

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1240px;
       padding: 1em 2em 4em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
.note { color: #555; font-size: 0.92em; } .missing { background: #fff6e0; border-left: 4px solid #e0a000; padding: 0.5em 1em; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.45em; text-align: right; } th { background: #f4f4f4; }
th { vertical-align: bottom; } td { white-space: nowrap; } td.text { white-space: normal; }
td.text, th.text { text-align: left; } .chart { min-height: 410px; margin: 0.4em 0 1em; }
.figure-files { font-size: 0.85em; color: #555; margin-top: -0.6em; }
figure.chart-box { margin: 1.5em 0; } figcaption span { display: block; } .chart-title { font-weight: 600; font-size: 1.05em; }
.chart-subtitle { color: #555; font-size: 0.85em; }
nav a { margin-right: 1em; } #explorer-controls input, #explorer-controls select { font-size: 1em; padding: 0.2em 0.4em; }
.wide { overflow-x: auto; max-width: 100%; } details { margin: 0.6em 0; } summary { cursor: pointer; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def table(frame: pd.DataFrame, *, digits: int = 4, text_columns: Iterable[str] = ()) -> str:
    text = set(text_columns) | {c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])}
    head = "".join(f'<th class="{"text" if c in text else ""}">{esc(c)}</th>' for c in frame.columns)
    rows = []
    for record in frame.to_dict("records"):
        cells = "".join(
            f'<td class="text">{esc(record[c])}</td>' if c in text else f"<td>{esc(number(record[c], digits))}</td>"
            for c in frame.columns
        )
        rows.append(f"<tr>{cells}</tr>")
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def definition_list(items: Sequence[tuple[str, Any]]) -> str:
    rows = "".join(f'<tr><th class="text">{esc(k)}</th><td class="text">{esc(v)}</td></tr>' for k, v in items)
    return f"<table>{rows}</table>"


def missing(message: str) -> str:
    return f'<p class="missing">{esc(message)}</p>'


def not_measured(entries: Iterable[Skipped]) -> str:
    """A "not measured" box per kind of input a run did not find (`lmgeom.report.missing_data`): what,
    why, the paths looked for and how to measure it."""
    return "".join(missing(f"Not measured: {entry.what}, {entry.reason}"
                           + (f" (looked for {', '.join(entry.paths)})" if entry.paths else "")
                           + (f". To measure: {entry.fix}, and run again." if entry.fix else "."))
                   for entry in entries)


_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element, whatever its strings hold (a corpus word such as
    `a<!--<script>b`): `<`, `>` and `&` as `\\u003c`, `\\u003e`, `\\u0026`, so no `</script`, `<!--` or
    `<script` can end the element early or turn the rest of the page into script text (the line and
    paragraph separators too, which older JavaScript reads as line ends); the same value when parsed."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).translate(_SCRIPT_ESCAPES)


class Page:
    """Sections and charts, rendered into one HTML document with Plotly's script inlined once."""

    def __init__(self, title: str, subtitle: str) -> None:
        self.title = title
        self.subtitle = subtitle
        self.sections: list[tuple[str, str, str]] = []  # (anchor, heading, body)
        self.figures: dict[str, dict[str, Any]] = {}
        self.scripts: list[str] = []

    def section(self, anchor: str, heading: str, body: str) -> None:
        self.sections.append((anchor, heading, body))

    def chart(self, chart: Chart | StackedBars | EffectChart, *, files: Sequence[str] = ()) -> str:
        """A chart's placeholder (a line chart, a `StackedBars` or an `EffectChart`); its figure is drawn by
        the page script."""
        if isinstance(chart, StackedBars):
            return self.figure(chart.name, plotly_stacked(chart), chart.title, (chart.subtitle, chart.note), files=files)
        if isinstance(chart, EffectChart):
            return self.figure(chart.name, plotly_effects(chart), chart.title, (chart.subtitle, chart.note), files=files)
        return self.figure(chart.name, plotly_figure(chart), chart.title, (chart.subtitle, chart.note, plotly_band_note(chart)),
                           files=files)

    def figure(self, name: str, figure: dict[str, Any], title: str, lines: Sequence[str], *, files: Sequence[str] = ()) -> str:
        """The placeholder of the Plotly `figure` ({data, layout}) named `name`: its title and the
        given `lines` (those not empty) as text above it, links to its `files` (PNG, SVG) under it."""
        div_id = f"chart-{name}"
        self.figures[div_id] = figure
        links = " · ".join(f'<a href="{esc(f)}">{esc(f.rsplit(".", 1)[-1].upper())}</a>' for f in files)
        caption = f'<p class="figure-files">for papers: {links}</p>' if links else ""
        subtitle = "".join(f'<span class="chart-subtitle">{esc(text)}</span>' for text in lines if text)
        return (f'<figure class="chart-box"><figcaption><span class="chart-title">{esc(title)}</span>{subtitle}'
                f'</figcaption><div class="chart" id="{div_id}" data-chart="{esc(name)}"></div>{caption}</figure>')

    def render(self) -> str:
        from plotly.offline import get_plotlyjs

        nav = "".join(f'<a href="#{a}">{esc(h)}</a>' for a, h, _ in self.sections)
        body = "".join(f'<section id="{a}"><h2>{esc(h)}</h2>{b}</section>' for a, h, b in self.sections)
        draw = (
            f"const LMGEOM_FIGURES = {script_json(self.figures)};\n"
            "for (const [id, fig] of Object.entries(LMGEOM_FIGURES)) {\n"
            "  Plotly.newPlot(id, fig.data, fig.layout, {responsive: true, displaylogo: false});\n"
            "}\n"
        )
        scripts = "".join(f"<script>{s}</script>" for s in [draw, *self.scripts])
        return (
            f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{generator_mark()}"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(self.title)}</title>"
            f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>{esc(self.title)}</h1><p class=\"note\">{esc(self.subtitle)}</p><nav>{nav}</nav>"
            f"{body}{scripts}</body></html>\n"
        )


EXPLORER_SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById('explorer-data').textContent);
  const input = document.getElementById('explorer-word');
  const layerSelect = document.getElementById('explorer-layer');
  const out = document.getElementById('explorer-result');
  const lookup = new Map(data.words.map((w, i) => [w.toLowerCase(), i]));
  const fmt = v => (v === null || v === undefined) ? '—' : v.toFixed(4);
  // one escape for the page and the chart: Plotly renders tags in titles and decodes only &amp; &lt;
  // &gt; and numeric entities, so quotes become numeric ones (Python's side: figures.plotly_text)
  const esc = s => String(s).replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&#34;', "'": '&#39;'}[c]));
  const columns = %COLUMNS%;
  function show() {
    const typed = input.value.trim();
    if (!typed) { out.innerHTML = ''; return; }
    const exact = data.words.indexOf(typed);
    const index = exact >= 0 ? exact : lookup.get(typed.toLowerCase());
    if (index === undefined) {
      out.innerHTML = '<p class="missing">"' + esc(typed) + '" is not among the ' + data.words.length +
        ' most frequent analysed words.</p>';
      return;
    }
    const word = data.words[index];
    const m = data.metrics[word];
    let rows = '';
    data.layers.forEach((layer, i) => {
      rows += '<tr><td>' + layer + '</td>' + columns.map(c => '<td>' + fmt(m[c[0]] ? m[c[0]][i] : null) + '</td>').join('') + '</tr>';
    });
    let html = '<h3 id="explorer-word-title">' + esc(word) + '</h3><p class="note">' + m.count +
      ' occurrences in ' + m.contexts + ' sentences; layer 0 = embedding output</p>' +
      '<div class="wide"><table id="explorer-metrics"><thead><tr><th>layer</th>' +
      columns.map(c => '<th>' + esc(c[1]) + '</th>').join('') + '</tr></thead><tbody>' + rows + '</tbody></table></div>' +
      '<figure class="chart-box"><figcaption><span class="chart-title">"' + esc(word) + '" across layers</span>' +
      '<span class="chart-subtitle">' + esc(data.caption) + '</span></figcaption><div id="explorer-chart" class="chart"></div></figure>';
    const layer = layerSelect.value;
    const neighbours = (data.neighbours[layer] || [])[index];
    if (neighbours) {
      html += '<h4>Nearest neighbours at layer ' + esc(layer) + ' (cosine of first-principal-component vectors)</h4>' +
        '<table id="explorer-neighbours"><thead><tr><th>rank</th><th class="text">word</th><th>cosine</th></tr></thead><tbody>' +
        neighbours[0].map((n, r) => '<tr><td>' + (r + 1) + '</td><td class="text">' + esc(data.words[n]) + '</td><td>' +
          neighbours[1][r].toFixed(3) + '</td></tr>').join('') + '</tbody></table>';
    } else {
      html += '<p class="missing">' + esc(data.neighbours_note || ('no neighbours of this word at layer ' + layer)) + '</p>';
    }
    out.innerHTML = html;
    const labelOf = Object.fromEntries(columns);
    const traces = %CHART_COLUMNS%
      .filter(k => m[k]).map(k => ({x: data.layers, y: m[k], name: esc(labelOf[k]), mode: 'lines+markers', type: 'scatter'}));
    Plotly.newPlot('explorer-chart', traces, {
      template: 'plotly_white',
      xaxis: {title: {text: 'layer (layer 0 = embedding output)'}, dtick: 1}, yaxis: {title: {text: 'SelfSim (cosine) or MEV (share)'}},
      height: 400, margin: {t: 16, l: 70, r: 20, b: 50}}, {responsive: true, displaylogo: false});
  }
  input.addEventListener('input', show);
  input.addEventListener('change', show);
  layerSelect.addEventListener('change', show);
})();
"""


def explorer_section(data: dict[str, Any], caption: str) -> tuple[str, str]:
    """(section body, script) of the word explorer."""
    columns = [[c, label(c)] for c in WORD_COLUMNS]
    payload = {**data, "caption": caption}
    layers = data["layers"]
    options = "".join(
        f'<option value="{layer}"{" selected" if layer == layers[-1] else ""}>{layer}</option>' for layer in layers
    )
    datalist = "".join(f'<option value="{esc(w)}">' for w in data["words"])
    example = esc(data["words"][0]) if data["words"] else ""
    body = (
        f'<p class="note">The {len(data["words"]):,} most frequent analysed words: self-similarity and MEV by layer, and '
        "their nearest neighbours among the first-principal-component static vectors of a layer (precomputed; "
        f'cached in {EXPLORER.name}). Try "{example}".</p>'
        '<div id="explorer-controls"><label>word <input id="explorer-word" list="explorer-words" autocomplete="off"></label> '
        f'<label>neighbours at layer <select id="explorer-layer">{options}</select></label></div>'
        f'<datalist id="explorer-words">{datalist}</datalist><div id="explorer-result"></div>'
        f'<script type="application/json" id="explorer-data">{script_json(payload)}</script>'
    )
    return body, EXPLORER_SCRIPT.replace("%COLUMNS%", script_json(columns)).replace("%CHART_COLUMNS%", script_json(list(CHART_COLUMNS)))
