"""A self-contained HTML dashboard of a results store: gates, history charts, parity and warmup.

One file, no network: CSS, a few lines of JS and the SVG charts are inline, rendered server-side, so the page
opens from a CI artifact or an air-gapped machine. Everything that comes from the store (test ids, model
names, extra JSON) is escaped with ``html.escape``; the raw rows are also embedded as JSON in a
``<script type="application/json">`` block with ``<``, ``>`` and ``&`` escaped, so no test id can close the
block or run as markup.

``pytest-kvcm dashboard --results PATH --out FILE`` (or its alias ``kvcm dashboard``) calls :func:`main`.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from kvcm.versions import NAMES as VERSIONS

from .dashboard_chart import number_text, when_text, esc, history_svg
from .dashboard_rows import load_rows
from .paths import output_problem, write_atomically
from .results import DEFAULT_PATH, StoreError

# what every page this module writes holds (and no other file does): the mark that lets --out replace it
MARK = '<script type="application/json" id="kvcm-data">'


def _badge(passed: bool | None, extra=None) -> str:
    if passed is None:
        if isinstance(extra, dict) and extra.get("verdict") == "cannot decide":  # too few samples for any fail
            need = extra.get("min_samples")
            need = f"{need:,}" if isinstance(need, int) and not isinstance(need, bool) else esc(need) if need else ""
            return ('<span class="badge none">cannot decide</span>'
                    + (f' <span class="small muted">(fails from n={need})</span>' if need else ""))
        return '<span class="badge none">no verdict</span>'
    return '<span class="badge pass">pass</span>' if passed else '<span class="badge fail">FAIL</span>'


def _gate_key(r: dict) -> tuple:
    spec = r["extra"].get("spec") if isinstance(r["extra"], dict) else None
    return r["metric"], r["model"] or "", json.dumps(spec, sort_keys=True) if spec else ""


def _spec_text(spec_json: str) -> str:
    if not spec_json:
        return "default"
    spec = json.loads(spec_json)
    if not isinstance(spec, dict):  # a row another tool wrote: shown as it is
        return spec_json
    parts = [f"{k}={v}" for k, v in spec.items() if v is not None and not (k == "dtype" and v == "auto")]
    return ", ".join(parts) or "default"


# ----------------------------------------------------------------------------------------------- sections
def _gates_section(rows: list[dict]) -> str:
    gates: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["metric"].startswith("accuracy."):
            gates[_gate_key(r)].append(r)
    if not gates:
        return '<section id="gates"><h2>Accuracy gates</h2><p class="muted">no gate results</p></section>'
    # a column per manager version; "other" only when some row names none (or an unknown one)
    cols = (*VERSIONS, None) if any(r["kvcm_version"] not in VERSIONS for rs in gates.values() for r in rs) \
        else VERSIONS
    head = ("<tr><th>gate</th><th>model</th><th>spec</th>"
            + "".join(f'<th class="ver {v}">{v.upper()}</th>' if v else "<th>other</th>" for v in cols) + "</tr>")
    body, charts = [], []
    for i, (key, rs) in enumerate(sorted(gates.items())):
        metric, model, spec = key
        latest: dict[Any, dict] = {}
        for r in rs:
            latest[r["kvcm_version"] if r["kvcm_version"] in VERSIONS else None] = r
        cells = []
        for v in cols:
            r = latest.get(v)
            if r is None:
                cells.append('<td class="muted">–</td>')
                continue
            cells.append(
                f'<td class="cell">{_badge(r["passed"], r["extra"])} <span class="score">{number_text(r["value"])}</span>'
                f' <span class="muted">vs</span> {number_text(r["threshold"])}'
                f'<div class="small muted">n={number_text(r["n"])} · {esc(when_text(r["time"]))}</div>'
                f'<div class="small muted testid">{esc(r["test_id"])}</div></td>')
        failed = any(r["passed"] is False for r in latest.values())
        body.append(f'<tr class="gate{" failed" if failed else ""}" data-gate="g{i}"><td><a href="#g{i}">'
                    f'{esc(metric.removeprefix("accuracy."))}</a></td><td>{esc(model)}</td>'
                    f'<td>{esc(_spec_text(spec))}</td>{"".join(cells)}</tr>')
        charts.append(f'<div class="card" id="g{i}"><h3>{esc(metric.removeprefix("accuracy."))} · {esc(model)}'
                      f' <span class="muted">({esc(_spec_text(spec))})</span></h3>{history_svg(rs)}</div>')
    legend = ('<p class="legend"><span class="sw" style="background:#2563eb"></span>V1 '
              '<span class="sw" style="background:#ea580c"></span>V2 '
              '<span class="sw dash"></span>threshold · red ring: failed run</p>')
    return (f'<section id="gates"><h2>Accuracy gates</h2><table class="grid-table" id="gate-table">'
            f'<thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
            f'<h2>History</h2>{legend}<div class="charts">{"".join(charts)}</div></section>')


def _latest_by_test(rows: Iterable[dict]) -> list[dict]:
    latest: dict[tuple, dict] = {}
    for r in rows:
        latest[(r["test_id"], r["metric"], r["kvcm_version"])] = r
    return sorted(latest.values(), key=lambda r: (str(r["test_id"]), r["metric"], str(r["kvcm_version"])))


def _extra_text(extra: dict) -> str:
    if not extra:
        return ""
    return "; ".join(f"{k}={json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v}"
                     for k, v in extra.items())


def _table_section(sid: str, title: str, rows: list[dict]) -> str:
    if not rows:
        return f'<section id="{sid}"><h2>{esc(title)}</h2><p class="muted">no results</p></section>'
    body = "".join(
        f'<tr class="{"failed" if r["passed"] is False else ""}"><td>{_badge(r["passed"], r["extra"])}</td>'
        f'<td class="testid">{esc(r["test_id"])}</td><td>{esc(r["metric"])}</td>'
        f'<td>{esc(r["kvcm_version"] or "–")}</td><td class="num">{number_text(r["value"])}</td>'
        f'<td class="num">{number_text(r["threshold"])}</td><td class="small">{esc(_extra_text(r["extra"]))}</td>'
        f'<td class="small muted">{esc(when_text(r["time"]))}</td></tr>' for r in rows)
    return (f'<section id="{sid}"><h2>{esc(title)}</h2><table class="grid-table"><thead><tr><th></th>'
            f'<th>test</th><th>metric</th><th>manager</th><th>value</th><th>threshold</th><th>details</th>'
            f'<th>time</th></tr></thead><tbody>{body}</tbody></table></section>')


CSS = """
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#f9fafb;--pass:#15803d;--fail:#b91c1c}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:var(--fg);
background:var(--bg);margin:0;padding:24px 32px}h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 10px}
h3{font-size:14px;margin:0 0 6px}.muted{color:var(--muted)}.small{font-size:12px}
header{display:flex;justify-content:space-between;align-items:flex-end;gap:16px;flex-wrap:wrap}
.summary{display:flex;gap:12px}.tile{background:#fff;border:1px solid var(--line);border-radius:8px;padding:8px 14px}
.tile b{font-size:18px;display:block}.tile.bad b{color:var(--fail)}.tile.good b{color:var(--pass)}
table.grid-table{border-collapse:collapse;width:100%;background:#fff;border:1px solid var(--line);border-radius:8px}
th,td{padding:7px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f3f4f6;font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
th.ver.v1{color:#2563eb}th.ver.v2{color:#ea580c}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.failed td:first-child{box-shadow:inset 3px 0 0 var(--fail)}.score{font-weight:600;font-variant-numeric:tabular-nums}
.testid{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;word-break:break-all}
.badge{display:inline-block;border-radius:999px;padding:0 8px;font-size:11px;font-weight:700;color:#fff}
.badge.pass{background:var(--pass)}.badge.fail{background:var(--fail)}.badge.none{background:#9ca3af}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(580px,1fr));gap:14px}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:12px}
svg.chart{max-width:100%;height:auto}svg .grid{stroke:#eef0f3}svg .axis{font-size:10px;fill:#6b7280}
svg .threshold{fill:none;stroke:#dc2626;stroke-width:1.5;stroke-dasharray:5 4}
svg .pt.fail{stroke:#dc2626;stroke-width:2.5}
.legend .sw{display:inline-block;width:12px;height:12px;border-radius:3px;margin:0 4px 0 10px;vertical-align:-1px}
.legend .sw.dash{border-top:2px dashed #dc2626;height:0;width:18px;border-radius:0}
input#filter{padding:6px 10px;border:1px solid var(--line);border-radius:6px;min-width:260px}
nav a{margin-right:14px}
"""

JS = """
(function(){
  var box=document.getElementById('filter');
  box.addEventListener('input',function(){
    var q=box.value.toLowerCase();
    document.querySelectorAll('tbody tr').forEach(function(tr){
      tr.style.display=tr.textContent.toLowerCase().indexOf(q)>=0?'':'none';
    });
  });
  var data=JSON.parse(document.getElementById('kvcm-data').textContent);
  document.getElementById('row-count').textContent=String(data.rows.length);
})();
"""


def _json_script(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, default=str)
    text = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return f'<script type="application/json" id="kvcm-data">{text}</script>'


def _verdict_tile(label: str, latest: list[dict]) -> str:
    """What the store holds of one kind (the latest result of each test): passing of all, red when one fails,
    neutral when none has a verdict ("cannot decide" and measure mode are no pass: 0/0 in green once misled)."""
    passing = sum(1 for r in latest if r["passed"] is True)
    failing = sum(1 for r in latest if r["passed"] is False)
    undecided = len(latest) - passing - failing
    cls = " bad" if failing else " good" if passing else ""
    more = f" ({undecided} without a verdict)" if undecided else ""
    return f'<div class="tile{cls}"><b>{passing}/{len(latest)}</b>{label} passing{more}</div>'


def render_html(rows: list[dict], *, title: str = "kvcm results", source: str = "",
                skipped: list[str] = ()) -> str:
    gates_latest = {}
    for r in rows:
        if r["metric"].startswith("accuracy."):
            gates_latest[(_gate_key(r), r["kvcm_version"])] = r
    runs = sorted({r["run_id"] for r in rows})
    last = rows[-1] if rows else None
    parity = _latest_by_test(r for r in rows if "parity" in r["metric"])  # greedy_parity, parity.*
    warmup = _latest_by_test(r for r in rows if r["metric"].startswith("warmup"))
    other = _latest_by_test(r for r in rows if not (r["metric"].startswith(("accuracy.", "warmup"))
                                                    or "parity" in r["metric"]))
    recorded = [("gate results", list(gates_latest.values())), ("parity checks", parity),
                ("warmup reports", warmup), ("other results", other)]
    tiles = ("".join(_verdict_tile(label, latest) for label, latest in recorded if latest)
             or '<div class="tile"><b>0</b>results recorded</div>')
    tiles += (f'<div class="tile"><b>{len(runs)}</b>runs</div>'
              f'<div class="tile"><b id="row-count">{len(rows)}</b>rows</div>'
              + (f'<div class="tile bad" title="{esc(chr(10).join(skipped[:50]))}"><b>{len(skipped)}</b>'
                 f'rows skipped</div>' if skipped else ""))
    meta = (f"latest run {esc(last['run_id'])} · commit {esc((last['git_commit'] or '–')[:12])} · "
            f"lane {esc(last['lane'] or '–')} · {esc(last['machine'] or '')} · {esc(when_text(last['time']))}"
            if last else "empty store")
    payload = {"source": source, "rows": rows, "skipped": list(skipped)}
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="generator" content="kvcm dashboard"><title>{esc(title)}</title><style>{CSS}</style></head>
<body>
<header><div><h1>{esc(title)}</h1><div class="muted small">{meta}</div>
<div class="muted small">store: {esc(source)} · rendered {esc(when_text(time.time()))}</div></div>
<div class="summary">{tiles}</div></header>
<p><nav><a href="#gates">gates</a><a href="#parity">parity</a><a href="#warmup">warmup</a><a href="#other">other</a></nav>
<input id="filter" type="search" placeholder="filter rows (test id, model, metric)…" aria-label="filter"></p>
{_gates_section(rows)}
{_table_section("parity", "Greedy parity", parity)}
{_table_section("warmup", "CUDA-graph warmup", warmup)}
{_table_section("other", "Other results", other)}
{_json_script(payload)}
<script>{JS}</script>
</body></html>
"""


def is_dashboard(path: Path) -> bool:
    """Whether ``path`` is a page this module wrote (so ``--out`` may replace it)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(len("<!DOCTYPE html>")) == "<!DOCTYPE html>" and MARK in f.read()


def render_dashboard(store_path: str | Path, out_html: str | Path, *, title: str = "kvcm results",
                     skipped: list[str] | None = None) -> Path:
    """Render ``store_path`` to ``out_html``; returns the output path (``skipped``, when given, receives one
    reason per row left out).
    ``StoreError`` before any work for an output path that cannot be written, that is the store itself (or its
    WAL files) or an existing file that is not a dashboard, and for a store that cannot be read. The page is
    written to a temporary file and renamed, so a failure leaves the old page."""
    out = Path(out_html)
    inputs = [store_path, f"{store_path}-wal", f"{store_path}-shm", f"{store_path}-journal"]
    problem = output_problem(out_html, inputs=inputs, ours=is_dashboard)
    if problem:
        raise StoreError(f"--out {out_html}: {problem}")
    rows, left_out = load_rows(store_path)
    if skipped is not None:
        skipped.extend(left_out)
    text = render_html(rows, title=title, source=str(store_path), skipped=left_out)
    try:
        write_atomically(out, text)
    except OSError as e:  # a read-only file system, a full disk: found only by writing
        raise StoreError(f"--out {out_html}: cannot be written ({e.strerror or e})") from None
    return out


def main(argv: list[str] | None = None, prog: str = "pytest-kvcm dashboard") -> int:
    from .cli import OneLineParser

    ap = OneLineParser(prog=prog, description="Render a kvcm results store as one HTML file.")
    ap.add_argument("--results", default=DEFAULT_PATH, help=f"SQLite results store (default {DEFAULT_PATH})")
    ap.add_argument("--out", default="kvcm-dashboard.html", help="HTML file to write (default kvcm-dashboard.html)")
    ap.add_argument("--title", default="kvcm results", help="the page's title (default: kvcm results)")
    args = ap.parse_args(argv)
    try:
        skipped: list[str] = []
        out = render_dashboard(args.results, args.out, title=args.title, skipped=skipped)
    except StoreError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}" + (f" ({len(skipped)} row(s) skipped that hold no usable numbers; first: {skipped[0]})"
                            if skipped else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
