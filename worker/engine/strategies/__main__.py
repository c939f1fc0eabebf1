"""`python -m worker.engine.strategies [--check] [--also PACKAGE]... [--out PATH]`: write the
descriptors of every strategy class to `vocabulary/strategies.json` (what the torch-free side
reads), or with `--check` exit 1 when that file differs from the classes. `--also` imports the
strategy files of another package first (a strategy kept outside this one)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vocabulary.strategies import DESCRIPTORS
from worker.engine.strategies import descriptors, discover


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.engine.strategies", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when they differ")
    parser.add_argument("--also", action="append", default=[], metavar="PACKAGE",
                        help="import the strategy files of PACKAGE too")
    parser.add_argument("--out", type=Path, default=DESCRIPTORS, help="the file to write")
    args = parser.parse_args(argv)
    for package in args.also:
        discover(package)
    text = descriptors()
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'differs from the strategy classes'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
