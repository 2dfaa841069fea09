"""The claims table: print it, or (re)generate docs/claims.md from the code.

    python examples/claims.py                 # print the table (80 columns)
    python examples/claims.py --write         # regenerate docs/claims.md
    python examples/claims.py --check         # exit 1 if docs/claims.md is stale
"""
from __future__ import annotations

import argparse
from pathlib import Path

import _common  # noqa: F401  (puts the checkout on sys.path)

from attention_ref._atomic import write_atomic
from attention_ref.documents.claims import render_markdown, render_text

DEFAULT = Path(__file__).resolve().parent.parent / "docs" / "claims.md"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", nargs="?", const=DEFAULT, type=Path, metavar="PATH",
                       help=f"write the markdown table (default {DEFAULT.relative_to(DEFAULT.parent.parent)})")
    group.add_argument("--check", nargs="?", const=DEFAULT, type=Path, metavar="PATH",
                       help="exit with status 1 if PATH differs from the generated table")
    args = parser.parse_args(argv)
    if args.write:
        write_atomic(args.write, render_markdown())
        print(f"wrote {args.write}")
    elif args.check:
        if args.check.read_text(encoding="utf-8") != render_markdown():
            print(f"{args.check} is stale: run python examples/claims.py --write")
            return 1
        print(f"{args.check} is up to date")
    else:
        print(render_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
