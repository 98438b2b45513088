"""The whole OpInfo run as one table of counts, op by op (what notes/ records):

    python tests/opinfo/sweep.py [forward|backward] [--ops NAME,...] [--json FILE]

Each op ends as pass, skip (with the reason), xfail (a known error, with its reason), error
(ember raises where eager does not) or wrong (a value or metadata that differs from eager's).
The pytest module (tests/opinfo/test_opinfo.py) checks the same things op by op.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
import warnings

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]

from opinfo.expectations import expected_failure  # noqa: E402
from opinfo.harness import (  # noqa: E402
    SKIPS,
    Mismatch,
    backward_ops,
    check_backward,
    check_forward,
    forward_ops,
    op_name,
)


def outcome(op, direction: str) -> tuple[str, str]:
    name = op_name(op)
    if name in SKIPS:
        return "skip", SKIPS[name]
    known = expected_failure(name, direction)
    check = check_forward if direction == "forward" else check_backward
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compared = check(op)
    except Mismatch as error:
        return "wrong", str(error).splitlines()[0][:300]
    except Exception as error:  # noqa: BLE001  (each op's error is a row of the table)
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return ("xfail" if known else "error"), text[:300]
    if known:
        return "xpass", known
    return ("pass", "") if compared else ("skip", "eager rejects every sample")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("direction", nargs="?", default="forward",
                        choices=["forward", "backward"])
    parser.add_argument("--ops", default="")
    parser.add_argument("--json", default="")
    options = parser.parse_args()
    ops = forward_ops() if options.direction == "forward" else backward_ops()
    if options.ops:
        chosen = set(options.ops.split(","))
        ops = [op for op in ops if op_name(op) in chosen or op.name in chosen]
    results = {}
    start = time.time()
    for op in ops:
        begun = time.time()
        results[op_name(op)] = outcome(op, options.direction)
        status, reason = results[op_name(op)]
        if status != "pass":
            print(f"{op_name(op)}: {status} {reason}", flush=True)
        if time.time() - begun > 20:
            print(f"  ({op_name(op)} took {time.time() - begun:.0f} s)", flush=True)
    counts = collections.Counter(status for status, _ in results.values())
    print(f"{options.direction}: {len(results)} ops, {dict(counts)}, "
          f"{time.time() - start:.0f} s")
    if options.json:
        with open(options.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
