"""Runs every ``bench/bench_*.py`` (each exposes ``run() -> list[Result]``), writes results.json.

Usage: ``python -m bench.run [NAME_SUBSTRING ...]`` to run only matching benchmark modules;
``python -m bench.run --markdown [RESULTS_JSON]`` prints the last results.json (or the file
given) as a Markdown table: the figures table of docs/figures.md, which ``make generate``
writes through ``tests/readme_tables.py`` (it runs this command, so the table has one renderer).
A filtered run replaces only the rows of the benchmarks it ran. Any other argument starting with
``-`` is refused before anything runs, so a mistyped option never rewrites results.json.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

from bench.common import Result

ROOT = Path(__file__).resolve().parent.parent


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def markdown(path: Path) -> str:
    """results.json as a Markdown table."""
    rows = json.loads(path.read_text())
    lines = ["| benchmark | value | unit | baseline (same run) | ratio | target | met |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        lines.append(f"| {r['name']} | {_fmt(r['value'])} | {r['unit']} | "
                     f"{_fmt(r['baseline'])} | {_fmt(r['ratio'])} | {_fmt(r['target'])} | {met} |")
    return "\n".join(lines)


USAGE = ("usage: python -m bench.run [NAME_SUBSTRING ...] | --markdown [RESULTS_JSON]\n\n"
         "Run the benchmarks whose module name contains a NAME_SUBSTRING (all without one) and "
         "write bench/results.json;\n--markdown prints the last results.json (or RESULTS_JSON) "
         "as the figures table of docs/figures.md and runs nothing.")


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; exit 1 if one crashed (a missed target is only reported),
    2 on an unknown option (nothing run or written)."""
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if argv[:1] == ["--markdown"] and len(argv) <= 2:
        print(markdown(Path(argv[1]) if len(argv) == 2 else ROOT / "bench" / "results.json"))
        return 0
    options = [a for a in argv if a.startswith("-")]
    if options:
        what = "--markdown takes one file at most, first" if "--markdown" in options else \
            f"unknown option {options[0]}"
        print(f"bench.run: {what} (see --help); nothing run", file=sys.stderr)
        return 2
    modules = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    if argv:
        modules = [m for m in modules if any(a in m for a in argv)]
        if not modules:
            print(f"bench.run: no benchmark module matches {' '.join(argv)} (see --help); "
                  "nothing run", file=sys.stderr)
            return 2
    results: list[tuple[str, Result]] = []
    failed = []
    for name in modules:
        print(f"== {name}", flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            results.extend((name, r) for r in module.run())
        except Exception:
            traceback.print_exc()
            failed.append(name)
    out = ROOT / "bench" / "results.json"
    rows = [{**r.as_dict(), "bench": module} for module, r in results]
    if argv and out.exists():
        # A filtered run replaces only the rows of the modules it ran; the others stay.
        kept = [r for r in json.loads(out.read_text()) if r.get("bench") not in modules]
        rows = sorted(kept + rows, key=lambda r: str(r.get("bench")))
    out.write_text(json.dumps(rows, indent=2) + "\n")
    header = (f"{'benchmark':58} {'value':>11} {'unit':8} {'baseline':>10} {'ratio':>8} "
              f"{'target':>8} met")
    print(header)
    print("-" * len(header))
    for _, r in results:
        d = r.as_dict()
        print(f"{r.name:58} {_fmt(r.value):>11} {r.unit:8} {_fmt(r.baseline):>10} "
              f"{_fmt(d['ratio']):>8} {_fmt(r.target):>8} {d['met']}")
    print(f"wrote {out.relative_to(ROOT)}")
    if failed:
        print(f"benchmarks that crashed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
