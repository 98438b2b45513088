"""`python -m ember COMMAND`: the command-line entry points.

    python -m ember bench [--quick] [--out DIR] [--only NAME ...]   (see `bench --help`)
    python -m ember cache [--clear]                                 (the disk cache)
    python -m ember explain file.py:function ['ARGS']               (ember.explain of it)
    python -m ember --help                                          (commands and switches)
"""

from __future__ import annotations

import sys

from ember import config

USAGE = """usage: python -m ember COMMAND [options]

commands:
  bench     time the seed workloads (or file.py:builder) eagerly, under torch.compile and
            under ember; write a report (python -m ember bench --help)
  cache     show what the disk cache (EMBER_CACHE_DIR) holds; --clear empties it
  explain   file.py:function ['ARGS']: print ember.explain's report of one call of the
            function (or nn.Module) `function` in file.py: graphs, each break with the user's
            stack, guards, eager islands; ARGS is a Python expression for its arguments
            (torch is imported), e.g. 'torch.randn(8, 16)' or '(x, 3)'; without it the
            function is called with none

switches (environment variables):
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE + config.describe())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from ember.bench.cli import main as bench

        return bench(rest)
    if command == "cache":
        return _cache(rest)
    if command == "explain":
        from ember.explain_command import main as explain

        return explain(rest)
    print(f"python -m ember: unknown command {command!r}\n\n{USAGE}{config.describe()}",
          file=sys.stderr)
    return 2


def _cache(rest: list[str]) -> int:
    from ember.runtime import disk_cache

    if rest not in ([], ["--clear"]):
        print("usage: python -m ember cache [--clear]", file=sys.stderr)
        return 2
    print(disk_cache.describe_info(disk_cache.cache_info()))
    if rest == ["--clear"]:
        removed = disk_cache.clear()
        print(f"cleared: {removed / 2**20:.1f} MiB removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
