"""README's performance table, drawn from the recorded benchmark run.

    python benchmarks/figures.py --record   # run the full suite on 2 threads, record it in
                                            # benchmarks/results/cpu.json, redraw README
    python benchmarks/figures.py            # redraw README's table from the recorded file
    python benchmarks/figures.py --check    # exit 1 where README's table is not the file's

The recorded file is the one source of the figures: README's table (between the markers
below) and the documentation's benchmark page (docs/examples/plot_benchmark.py) are drawn
from it. A new workload in ``volsample.apps.bench.suite()`` appears in both after ``--record``.
"""
import argparse
import subprocess
import sys
from pathlib import Path

from volsample.apps import bench

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "results" / "cpu.json"
README = ROOT / "README.md"
BEGIN = "<!-- benchmark table: drawn by benchmarks/figures.py from benchmarks/results/cpu.json -->"
END = "<!-- end of benchmark table -->"


def drawn(readme: str, recorded: Path = RECORDED) -> str:
    """``readme`` with the text between the markers drawn from ``recorded``."""
    start, stop = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    table = bench.markdown_report(*bench.read_json(recorded))
    return readme[:start] + "\n\n" + table + "\n\n" + readme[stop:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true",
                        help="run the full suite first (2 threads; tens of minutes)")
    parser.add_argument("--check", action="store_true",
                        help="only check that README's table is the recorded file's")
    args = parser.parse_args()
    if args.record:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu.py"), "--threads", "2",
                        "--json", str(RECORDED.relative_to(ROOT))], check=True, cwd=ROOT)
    readme = README.read_text()
    if args.check:
        if drawn(readme) != readme:
            print("README's benchmark table differs from benchmarks/results/cpu.json: run "
                  "python benchmarks/figures.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(drawn(readme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
