"""``subvec`` / ``python -m subvec`` command line.

Each sub-command lives in the module that owns its concept and registers itself through an
``add_cli_parser(subparsers)`` function; this file only wires them together.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from subvec import __version__

    parser = argparse.ArgumentParser(prog="subvec", description="subvec command line tools")
    parser.add_argument("--version", action="version", version=f"subvec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from subvec import _bench
    from subvec._process import shm as _shm
    from subvec._process import topology as _topology

    _topology.add_cli_parser(sub)
    _shm.add_cli_parser(sub)
    _bench.add_cli_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
