"""The wait predictor's figures before its fitted parts saw the calibration period as it stood at its
cut, parsed from a committed ``docs/results/waitpred.md`` (``git show COMMIT:PATH``) into the JSON
baseline the page's "What fitting at the cut changed" section compares against.

    python -m lab.pages.waitpred_before_cut --commit 1dbc3e0 --out docs/results/waitpred-before-cut.json

Every value is the page's as printed (a percentage as a fraction at the page's precision, "-" as
null): nothing is typed by hand. The baseline also names the oldest commit whose page carried the
same figures (the page's wording changed later without a new run), found by walking the page's
history back from ``--commit``."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from lab.pages.mirage_eval_page import ROOT, WP_COLS

PAGE = "docs/results/waitpred.md"
NOT_LOGS = ("Summary", "Limits", "Cost")
MONTH_COLS = ("n", "mae_h", "within_1h", "coverage", "bound_median_h")  # the old per-month table's columns
SUMMARY_COLS = ("pick", "mae_h", "mae_vs_zero", "within_1h", "within_10m_waited_over_1h", "spearman")

_MACHINE = re.compile(
    r"^Calibrated machine: (?P<nodes>\d+) nodes \(priority weights: age (?P<age>[-\d.e+]+), size "
    r"(?P<size>[-\d.e+]+)\); (?P<n_cal>\d+) calibration jobs, (?P<n_scored>\d+) scored"
)
_PICK = re.compile(r"^Guard pick: \*\*(?P<pick>[\w-]+)\*\* \(.*?zero wait's (?P<zero>[\d.]+)%")
_FIDELITY = re.compile(
    r"^Replay fidelity .*?: MAE (?P<mae>[\d.]+) h \(zero (?P<zero>[\d.]+)\), within 1 h (?P<w>[\d.]+)%"
)
_BUDGET = re.compile(r"(?P<log>[\w-]+) (?P<run>\d+) of (?P<trials>\d+) trials \(stopped by (?P<by>\w+)\)")
_BOTH = re.compile(r"^(?P<a>\S+) \((?P<b>\S+)\)$")  # "3.13 (4.08)": the pick's figure beside zero wait's


class PageError(ValueError):
    """The page does not read as the waitpred page this parser knows."""


def value(cell: str) -> float | int | str | None:
    """One printed figure: "66.9%" -> 0.669, "5.23" -> 5.23, "7936" -> 7936, "-" -> None; a name stays."""
    s = cell.strip()
    if s == "-":
        return None
    if s.endswith("%"):
        return round(float(s[:-1]) / 100, 6)
    if re.fullmatch(r"[-+]?\d+", s):
        return int(s)
    try:
        return float(s)
    except ValueError:
        return s


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(lines: list[str], start: int) -> tuple[list[str], list[list[str]]]:
    """The Markdown table whose header is ``lines[start]``: its header cells and its rows' cells."""
    head, rows = _cells(lines[start]), []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return head, rows


def _find(lines: list[str], prefix: str, where: str) -> int:
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            return i
    raise PageError(f"{where}: no line starting {prefix!r}")


def parse_log(name: str, lines: list[str], where: str) -> dict[str, Any]:
    """One log's section: calibrated machine, guard pick, the predictor table, the per-month table
    and the replay's fidelity."""
    where = f"{where}, section {name!r}"
    m = _MACHINE.match(lines[_find(lines, "Calibrated machine:", where)])
    if not m:
        raise PageError(f"{where}: the 'Calibrated machine:' line does not read as expected")
    p = _PICK.match(lines[_find(lines, "Guard pick:", where)])
    if not p:
        raise PageError(f"{where}: the 'Guard pick:' line does not read as expected")
    labels = {lab: key for key, _, lab in WP_COLS}
    head, rows = _table(lines, _find(lines, "| predictor |", where))
    unknown = [h for h in head[1:] if h not in labels]
    if unknown:
        raise PageError(f"{where}: predictor table column(s) {unknown} unknown (known: {list(labels)})")
    predictors = {}
    for r in rows:
        if len(r) != len(head):
            raise PageError(f"{where}: predictor row {r[0]!r} has {len(r)} cells, the header {len(head)}")
        predictors[r[0]] = {labels[h]: value(c) for h, c in zip(head[1:], r[1:], strict=True)}
    if "guarded" not in predictors or "zero" not in predictors:
        raise PageError(f"{where}: the predictor table lacks the guarded or the zero row")
    months = {}
    head, rows = _table(lines, _find(lines, "| month |", where))
    if tuple(h.replace(" ", "") for h in head[1:6]) != ("n", "MAEh", "within1h", "coverage", "boundmedianh"):
        raise PageError(f"{where}: the per-month table's header is {head}, not the guarded-beside-zero table")
    for r in rows:
        entry: dict[str, Any] = {"n": value(r[1])}
        for key, cell in (("mae_h", r[2]), ("within_1h", r[3])):
            both = _BOTH.match(cell)
            if not both:
                raise PageError(f"{where}: month {r[0]} {key} cell {cell!r} is not 'pick (zero)'")
            entry[key], entry[f"zero_{key}"] = value(both["a"]), value(both["b"])
        entry["coverage"], entry["bound_median_h"] = value(r[4]), value(r[5])
        months[r[0]] = entry
    out: dict[str, Any] = {
        "nodes": int(m["nodes"]),
        "weight_age": float(m["age"]),
        "weight_size": float(m["size"]),
        "n_calibration": int(m["n_cal"]),
        "n_scored": int(m["n_scored"]),
        "pick": p["pick"],
        "tail_zero_within_1h": value(p["zero"] + "%"),
        "predictors": predictors,
        "months": months,
    }
    if predictors["guarded"] != predictors.get(out["pick"], predictors["guarded"]):
        raise PageError(f"{where}: the guarded row differs from its pick {out['pick']!r}'s row")
    f = next((_FIDELITY.match(line) for line in lines if line.startswith("Replay fidelity")), None)
    if f:
        out["replay_fidelity"] = {
            "mae_h": float(f["mae"]),
            "zero_mae_h": float(f["zero"]),
            "within_1h": value(f["w"] + "%"),
        }
    return out


def parse_page(text: str, where: str = PAGE) -> dict[str, Any]:
    """The whole page: per log its section's figures, its summary row's MAE vs zero wait and its
    calibration budget (the Limits' line). A log section without its figures is an error."""
    sections: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            cur = sections.setdefault(line[3:].strip(), [])
        elif cur is not None:
            cur.append(line)
    logs = {n: parse_log(n, ls, where) for n, ls in sections.items() if n not in NOT_LOGS}
    if not logs:
        raise PageError(f"{where}: no log section")
    summary = sections.get("Summary")
    if summary is None:
        raise PageError(f"{where}: no Summary section")
    _, rows = _table(summary, _find(summary, "| log |", f"{where}, Summary"))
    for r in rows:
        if r[0] not in logs:
            raise PageError(f"{where}: Summary row {r[0]!r} has no section")
        if r[1] != logs[r[0]]["pick"]:
            raise PageError(f"{where}: Summary gives {r[0]}'s pick as {r[1]!r}, its section {logs[r[0]]['pick']!r}")
        logs[r[0]]["mae_vs_zero"] = value(r[3])
    for line in sections.get("Limits", []):
        if "Calibration budgets:" in line:
            for b in _BUDGET.finditer(line):
                if b["log"] in logs:
                    logs[b["log"]]["calibration"] = {
                        "trials_run": int(b["run"]),
                        "trials": int(b["trials"]),
                        "stopped_by": b["by"],
                    }
    missing = [n for n, lg in logs.items() if "mae_vs_zero" not in lg or "calibration" not in lg]
    if missing:
        raise PageError(f"{where}: no Summary row or calibration budget for {missing}")
    return logs


def _git(*a: str) -> str:
    return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def show(commit: str, path: str = PAGE) -> str:
    try:
        return _git("show", f"{commit}:{path}")
    except subprocess.CalledProcessError as e:
        raise PageError(f"git show {commit}:{path} failed: {e.stderr.strip()}") from None


def figures_since(commit: str, logs: dict, path: str = PAGE) -> str:
    """The oldest commit, walking the page's history back from ``commit``, whose page parses to the
    same figures: where they were written (later commits only reworded the page)."""
    oldest = commit
    for c in _git("log", "--format=%H", commit, "--", path).split():
        try:
            if parse_page(show(c, path), f"{path} at {c[:7]}") != logs:
                break
        except PageError:
            break
        oldest = c
    return oldest


def _commit(c: str) -> dict[str, str]:
    sha, date, subject = _git("show", "-s", "--format=%H%n%cI%n%s", c).split("\n", 2)
    return {"commit": sha, "date": date, "subject": subject.strip()}


def baseline(commit: str, path: str = PAGE, out: str = "docs/results/waitpred-before-cut.json") -> dict[str, Any]:
    logs = parse_page(show(commit, path), f"{path} at {commit}")
    return {
        "source": {"path": path, **_commit(commit)},
        "figures_written": _commit(figures_since(commit, logs, path)),
        "extracted_by": f"python -m lab.pages.waitpred_before_cut --commit {commit} --path {path} --out {out}",
        "note": (
            "The wait predictor's figures before its fitted parts saw the calibration period as it stood at its "
            "cut: parsed from the page at source.commit, whose figures were written at figures_written.commit "
            "(the oldest commit whose page parses to the same figures). Values as printed: a percentage as a "
            "fraction, '-' as null. The guard then judged one held-back tail of the calibration period."
        ),
        "logs": logs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commit", required=True, help="the commit whose page holds the figures before the cut")
    p.add_argument("--path", default=PAGE, help=f"the page's path in the repository (default {PAGE})")
    p.add_argument("--out", required=True, help="the JSON baseline to write")
    args = p.parse_args(argv)
    try:
        doc = baseline(args.commit, args.path, args.out)
    except PageError as e:
        p.error(str(e))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out} ({', '.join(doc['logs'])}; figures written at {doc['figures_written']['commit'][:7]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
