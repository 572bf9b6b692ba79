"""``subvec`` / ``python -m subvec`` command line: sub-commands dispatch to their own modules."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="subvec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from subvec import _topology_cli

    _topology_cli.add_parser(sub)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
