"""torch.cov and torch.corrcoef (their functions and Tensor methods) as rules (`call_rules`,
`method_rules`): captured as the arithmetic of ATen's composite, node by node. The composite
reads from a tensor whether its degrees of freedom are above 0, which the fakes cannot give;
without weights they are a Python number, observations - correction, known here (its warning
comes from size_warnings.py). Must read no tensor value: with fweights or aweights (the
composite checks their values and sum) the op is called as it is, and breaks the graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ember.capture import size_warnings
from ember.capture.calls import call_torch, method_rules, rule
from ember.capture.values import Const, TensorValue, Value

if TYPE_CHECKING:
    from ember.capture.session import Session

_WEIGHTS = ("fweights", "aweights")


@rule(torch.cov, torch.Tensor.cov)
def _cov(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
    correction = _correction(args, kwargs)
    if correction is None:  # (weights, or arguments the rule does not take: the op itself)
        return call_torch(session, torch.cov, list(args), kwargs)
    return _covariance(session, args[0], correction)


@rule(torch.corrcoef, torch.Tensor.corrcoef)
def _corrcoef(session: Session, *args: Value, frame: Any = None, **kwargs: Value) -> Value:
    """cov() normalized by the outer product of its standard deviations, each part (the real
    and imaginary one) clipped to [-1, 1]; a single variable's is c / c (nan for 0, inf and
    nan, else 1)."""
    if kwargs or _correction(args, {}) is None:
        return call_torch(session, torch.corrcoef, list(args), kwargs)
    covariance = _covariance(session, args[0], 1)
    if covariance.fake.dim() == 0:
        return _call(session, torch.div, covariance, covariance)
    diagonal = _call(session, torch.diagonal, covariance)
    if diagonal.fake.is_complex():
        diagonal = _call(session, torch.real, diagonal)
    deviation = _call(session, torch.sqrt, diagonal)
    for shape in ((-1, 1), (1, -1)):
        shaped = session.builder.call("call_method", "view", (deviation, *map(Const, shape)), {})
        covariance = _call(session, torch.div, covariance, shaped)
    if not covariance.fake.is_complex():
        return _call(session, torch.clip, covariance, Const(-1), Const(1))
    parts = [_call(session, torch.clip, _call(session, part, covariance), Const(-1), Const(1))
             for part in (torch.real, torch.imag)]
    return _call(session, torch.complex, *parts)


method_rules.update(cov=_cov, corrcoef=_corrcoef)


def _correction(args: tuple[Value, ...], kwargs: dict[str, Value]) -> int | None:
    """The correction of a call the rules capture (a tensor of at most two dimensions, not
    bool, no weights, a plain int correction), else None."""
    if len(args) != 1 or not isinstance(args[0], TensorValue) or \
            set(kwargs) - {"correction", *_WEIGHTS}:
        return None
    if any(not (isinstance(kwargs[name], Const) and kwargs[name].value is None)
           for name in _WEIGHTS if name in kwargs):
        return None
    correction = kwargs.get("correction", Const(1))
    fake = args[0].fake
    if not isinstance(correction, Const) or type(correction.value) is not int or \
            fake.dim() > 2 or fake.dtype is torch.bool:
        return None
    return correction.value


def _covariance(session: Session, input: TensorValue, correction: int) -> TensorValue:
    """Eager's arithmetic (variables in rows, observations in columns): the mean is the sum
    over the observations divided by their count; the centered rows' product with their
    conjugate transpose is divided by the degrees of freedom, or by 0 (inf and nan, as eager
    gives) where none are left — eager's warning then issued from the user's line."""
    builder = session.builder
    rows = input if input.fake.dim() == 2 else \
        builder.call("call_method", "view", (input, Const(1), Const(-1)), {})
    observations = rows.fake.shape[1]
    freedom = observations - correction
    # (a symbolic count is at least 2: only a correction above 1 makes this a guard, on the
    # relation, as a branch of the user's on the size would be)
    if not bool(freedom > 0):
        freedom = 0
        for warning in size_warnings.covariance_warnings(correction):
            builder.warn(warning)
    mean = _call(session, torch.div, _call(session, torch.sum, rows, Const(1)),
                 Const(observations))
    centered = _call(session, torch.sub, rows, _call(session, torch.unsqueeze, mean, Const(1)))
    other = _call(session, torch.t, centered)
    if other.fake.is_complex():
        # (conj_physical: eager's values without the lazy conj bit, which ember's kernels
        # do not read: torch.conj here made the product an eager island)
        other = _call(session, torch.conj_physical, other)
    product = _call(session, torch.mm, centered, other)
    scaled = _call(session, torch.div, product, Const(freedom))
    return _call(session, torch.squeeze, scaled)


def _call(session: Session, target: Any, *operands: Value) -> TensorValue:
    return session.builder.call("call_function", target, operands, {})
