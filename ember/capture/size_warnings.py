"""Warnings an op issues from its sizes as it runs, which its run on fakes does not issue:
`var()`, `std()`, `var_mean()` and `std_mean()` with no degree of freedom left (a reduction
over one element with the default correction — a batch of one, a 1-wide dimension), and
`cov()` (`corrcoef()`'s too) without weights over no more observations than its correction
(captured as its arithmetic: covariance_rules.py). Eager warns on every such call; the
capture issues the warning from the user's line after each run of the graph
(GraphBuilder.warn), whatever kernel computes the op.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ember import torch_internals

# the ops, by the name their Python functions and methods have, and what runs them for real
_DEGREES_OF_FREEDOM = {"var": torch.var, "std": torch.std, "var_mean": torch.var_mean,
                       "std_mean": torch.std_mean}
NAMES = frozenset(_DEGREES_OF_FREEDOM)


def size_warnings(name: str, fake_args: tuple, fake_kwargs: dict, example: Any
                  ) -> list[warnings.WarningMessage]:
    """The warnings eager would issue for this call from the sizes alone (the op's own
    message: the op runs for real on a tensor of the reduced size); none where the reduced
    size is symbolic (sizes 0 and 1 are specialized: what is left warns only for a
    correction above 1)."""
    op = _DEGREES_OF_FREEDOM[name]
    if not fake_args or not isinstance(fake_args[0], torch.Tensor):
        return []
    result = example[0] if isinstance(example, tuple) else example
    if not isinstance(result, torch.Tensor):
        return []
    correction = _correction(fake_args[1:], fake_kwargs)
    kept = result.numel()
    if correction is None or torch_internals.known_true(kept == 0):
        return []
    reduced = torch_internals.symbolic_expression(fake_args[0].numel() // kept)
    if not isinstance(reduced, int) or reduced - correction > 0:
        return []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        op(torch.zeros(reduced), correction=correction)
    return list(said)


def _correction(positional: tuple, keywords: dict) -> int | float | None:
    """The call's correction, as torch's overloads read it: `correction=` (None: 1),
    `unbiased=` or a bool among the positionals (`var(unbiased)`, `var(dim, unbiased,
    keepdim)`); None where it is not a plain number."""
    if "correction" in keywords:
        value = keywords["correction"]
        value = 1 if value is None else value
    elif "unbiased" in keywords:
        value = int(bool(keywords["unbiased"]))
    elif positional and isinstance(positional[0], bool):
        value = int(positional[0])
    elif len(positional) > 1 and isinstance(positional[1], bool):
        value = int(positional[1])
    else:
        value = 1
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def covariance_warnings(correction: int) -> list[warnings.WarningMessage]:
    """The warnings eager's cov() without weights issues where its observations leave no
    degree of freedom (observations - correction <= 0, so a correction of at least 0): its
    own message, which is the same for any such count, from a run on no observations."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        torch.cov(torch.zeros(1, 0), correction=correction)
    return list(said)
