"""Render evaluate's matrix (tuned_at x run_at) and profile's curve as JSON, Markdown, PNG and HTML."""
from __future__ import annotations

import html
import json
import os

from ..errors import TunekitError


def _write_json(data, path: str) -> str:
    tmp = path + ".tmp"  # atomic, like report.json: a reader never sees half a file
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, default=str)
    os.replace(tmp, path)
    return path


def _prepare_dir(out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise TunekitError(f"cannot write to out dir {out_dir}: {exc.strerror or exc}") from None


def _pct(label: str) -> int:
    return int(label[3:])  # "cpu50" -> 50


def _ordered(labels) -> list[str]:
    return sorted(set(labels), key=_pct)


def best_per_column(rows: list[dict]) -> dict[str, str]:
    """run_at -> the tuned_at whose median latency is lowest when run there."""
    best: dict[str, dict] = {}
    for row in rows:
        current = best.get(row["run_at"])
        if current is None or row["median_ms"] < current["median_ms"]:
            best[row["run_at"]] = row
    return {run_at: row["tuned_at"] for run_at, row in best.items()}


def matrix_markdown(rows: list[dict]) -> str:
    tuned, run = _ordered(r["tuned_at"] for r in rows), _ordered(r["run_at"] for r in rows)
    cells = {(r["tuned_at"], r["run_at"]): r for r in rows}
    best = best_per_column(rows)
    lines = ["| tuned at \\ run at | " + " | ".join(run) + " |", "| --- |" + " --- |" * len(run)]
    for t in tuned:
        row_cells = []
        for r in run:
            cell = cells.get((t, r))
            if cell is None:
                row_cells.append("–")
                continue
            text = f"{cell['median_ms']:.4f} ± {cell['std_ms']:.4f} ms"
            if not cell.get("numerics_ok", True):
                text += " (numerics MISMATCH)"
            row_cells.append(f"**{text}**" if best.get(r) == t else text)
        lines.append(f"| {t} | " + " | ".join(row_cells) + " |")
    return "\n".join(lines) + "\n\nBold: the fastest tuned variant at that run share.\n"


def _plot(series: dict[str, list[tuple[int, float, float]]], path: str, *, title: str,
          knee: tuple[int, float] | None = None) -> str | None:
    try:
        import matplotlib
    except ImportError:  # a bare GPU box: the JSON/Markdown still come out; plot later from matrix.json
        import logging

        logging.getLogger("tunekit.reports").warning("matplotlib is not installed: no plot %s", path)
        return None

    matplotlib.use("Agg")  # no display on servers/CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in series.items():
        points = sorted(points)
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    capsize=3, label=name)
    if knee is not None:
        ax.axvline(knee[0], color="grey", linestyle="--", linewidth=1)
        ax.plot([knee[0]], [knee[1]], marker="*", markersize=14, color="red", linestyle="none", label="knee")
    ax.set_xlabel("share of the device (%)")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} th:first-child,td:first-child{{text-align:left}}</style>
</head><body>
<h1>{title}</h1>
<p>{subtitle}</p>
{table}
<p>Bold: the fastest tuned variant at that run share.</p>
<img src="{png}" alt="latency vs share">
</body></html>
"""


def _html_table(rows: list[dict]) -> str:
    tuned, run = _ordered(r["tuned_at"] for r in rows), _ordered(r["run_at"] for r in rows)
    cells = {(r["tuned_at"], r["run_at"]): r for r in rows}
    best = best_per_column(rows)
    out = ["<table>", "<tr><th>tuned at \\ run at</th>" + "".join(f"<th>{html.escape(r)}</th>" for r in run) + "</tr>"]
    for t in tuned:
        tds = []
        for r in run:
            cell = cells.get((t, r))
            text = "–" if cell is None else html.escape(f"{cell['median_ms']:.4f} ± {cell['std_ms']:.4f} ms")
            tds.append(f"<td><b>{text}</b></td>" if cell is not None and best.get(r) == t else f"<td>{text}</td>")
        out.append(f"<tr><th>{html.escape(t)}</th>" + "".join(tds) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def write_matrix(result: dict, out_dir: str) -> dict[str, str]:
    """evaluate's result -> matrix.json, matrix.md, latency_vs_share.png, report.html in out_dir."""
    rows = result["results"]
    if not rows:
        raise TunekitError("evaluate produced no rows: nothing to render")
    _prepare_dir(out_dir)
    paths = {}
    paths["json"] = _write_json({**result, "best_per_run_at": best_per_column(rows)},
                                os.path.join(out_dir, "matrix.json"))
    table = matrix_markdown(rows)
    paths["md"] = os.path.join(out_dir, "matrix.md")
    with open(paths["md"], "w") as fh:
        fh.write(table)
    series: dict[str, list] = {}
    for r in sorted(rows, key=lambda r: _pct(r["tuned_at"])):  # legend in share order
        series.setdefault(f"tuned at {r['tuned_at']}", []).append((_pct(r["run_at"]), r["median_ms"], r["std_ms"]))
    png = "latency_vs_share.png"
    paths["png"] = _plot(series, os.path.join(out_dir, png), title="latency vs run share, per tuned variant")
    paths["html"] = os.path.join(out_dir, "report.html")
    with open(paths["html"], "w") as fh:
        fh.write(_HTML.format(title="tunekit evaluate", subtitle=html.escape(result.get("model", "")),
                              table=_html_table(rows), png=png))  # relative: the dir can be moved or served
    return paths


def write_profile(profile: dict, out_dir: str) -> dict[str, str]:
    """profile's result -> profile.json and profile.png (knee marked) in out_dir."""
    _prepare_dir(out_dir)
    rows = profile["shares"]
    knee_row = next(r for r in rows if r["share"] == profile["knee"])
    paths = {"json": _write_json(profile, os.path.join(out_dir, "profile.json"))}
    paths["png"] = _plot({"untuned": [(r["pct"], r["median_ms"], r["std_ms"]) for r in rows]},
                         os.path.join(out_dir, "profile.png"),
                         title=f"untuned latency vs share (knee {profile['knee']}, tol {profile['tolerance']:.0%})",
                         knee=(knee_row["pct"], knee_row["median_ms"]))
    return paths
