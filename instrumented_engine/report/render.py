"""The report's two files: `report.html` (one page, its charts inline as SVG, no script, nothing fetched) and
`report.md` (the same words and tables, each chart beside it as `figure-N.svg`).

    paths = write_report(sections, out_dir, title="kvobs report", header=["range: ...", ...])
"""

from __future__ import annotations

import html
import io
from pathlib import Path

import pandas as pd

from instrumented_engine.report.content import Figure, Section

PERCENT = ("hit rate", "achieved_rate", "available_rate", "recompute_tax")
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.sample { color: #666; font-size: 13px; } figure { margin: 0.5em 0; }
"""


def write_report(sections: list[Section], out_dir: Path, *, title: str, header: list[str]) -> list[Path]:
    """Write `report.html`, `report.md` and each chart's SVG into `out_dir`; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    svgs = [None if s.figure is None else chart_svg(s.figure) for s in sections]
    written = []
    for i, svg in enumerate(svgs):
        if svg is not None:
            path = out_dir / f"figure-{i + 1}.svg"
            path.write_text(svg, encoding="utf-8")
            written.append(path)
    page = out_dir / "report.html"
    page.write_text(_html(sections, svgs, title, header), encoding="utf-8")
    markdown = out_dir / "report.md"
    markdown.write_text(_markdown(sections, svgs, title, header), encoding="utf-8")
    return [page, markdown, *written]


def chart_svg(figure: Figure) -> str:
    """The chart as SVG text (matplotlib, drawn off screen)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    frame = figure.frame
    if figure.kind == "bar":
        bottom = pd.Series(0.0, index=frame.index)
        for column in figure.ys:
            values = frame[column].astype(float)
            ax.bar(frame[figure.x].astype(str), values, bottom=bottom, label=_label(column))
            bottom += values
        ax.legend(fontsize=8)
    else:
        for column in figure.ys:
            ax.plot(frame[figure.x].astype(float), frame[column].astype(float), marker="o", label=column)
        if figure.log_x:
            ax.set_xscale("log")
    for label, x in figure.marks.items():
        ax.axvline(x, color="#c44", linestyle="--", linewidth=1)
        ax.annotate(label, (x, ax.get_ylim()[1]), fontsize=8, color="#c44", ha="left", va="top")
    ax.set_xlabel(figure.x_label)
    ax.set_ylabel(figure.y_label)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # (the XML prolog and doctype left out: it goes inline in the page)


def _label(column: str) -> str:
    return column.removeprefix("recomputed_").removesuffix("_tokens").replace("_", " ")


def _header(column: str) -> str:
    """A tax cause's column by its cause ("pause"), any other as named."""
    cause = column.startswith("recomputed_") and column != "recomputed_tokens"
    return _label(column) if cause else column


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if column in PERCENT and isinstance(value, (int, float)):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() else f"{value:,.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _rows(table: pd.DataFrame) -> list[list[str]]:
    return [[_cell(c, v) for c, v in zip(table.columns, row)] for row in table.itertuples(index=False)]


def _html(sections: list[Section], svgs: list, title: str, header: list[str]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"]
    parts.append(f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>")
    parts += [f"<p class='sample'>{html.escape(line)}</p>" for line in header]
    for section, svg in zip(sections, svgs):
        parts.append(f"<section><h2>{html.escape(section.title)}</h2>")
        if section.sample:
            parts.append(f"<p class='sample'>Sample: {html.escape(section.sample)}</p>")
        parts += [f"<p>{html.escape(words)}</p>" for words in section.words]
        if svg is not None:
            parts.append(f"<figure>{svg}</figure>")
        if section.table is not None and not section.table.empty:
            head = "".join(f"<th>{html.escape(_header(str(c)))}</th>" for c in section.table.columns)
            body = "".join(
                "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                for row in _rows(section.table)
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _markdown(sections: list[Section], svgs: list, title: str, header: list[str]) -> str:
    lines = [f"# {title}", "", *header, ""]
    for i, (section, svg) in enumerate(zip(sections, svgs)):
        lines += [f"## {section.title}", ""]
        if section.sample:
            lines += [f"Sample: {section.sample}", ""]
        for words in section.words:
            lines += [words, ""]
        if svg is not None:
            lines += [f"![{section.title}](figure-{i + 1}.svg)", ""]
        if section.table is not None and not section.table.empty:
            columns = [_header(str(c)) for c in section.table.columns]
            lines.append("| " + " | ".join(columns) + " |")
            lines.append("|" + "---|" * len(columns))
            lines += ["| " + " | ".join(row) + " |" for row in _rows(section.table)]
            lines.append("")
    return "\n".join(lines)
