"""Why capture stops: a construct ember does not trace, located in the user's code.

`Unsupported` carries the user's file and line, the construct, and what to do about it. With
fullgraph=True it reaches the user as `CaptureError`; otherwise the frame runs eagerly and the
reason is logged and reported by `ember.explain`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class Location:
    filename: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.function}"


class Unsupported(Exception):
    """Capture met something it cannot put in a graph."""

    def __init__(self, reason: str, hint: str = "", location: Location | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint
        self.location = location
        self.depth = 0  # how many inlined calls deep the construct was
        # the user's stack down to the construct, outermost first: the compiled function's
        # line, each inlined call's, the construct's (the caller of a function compiled on
        # its own at a break comes first: api.CompiledFunction.record)
        self.user_stack: list[Location] = [location] if location is not None else []

    def at(self, location: Location, depth: int = 0) -> Unsupported:
        if self.location is None:
            self.location = location
            self.depth = depth
        if not self.user_stack or self.user_stack[0] != location:
            self.user_stack.insert(0, location)  # (each frame on the way out adds its line)
        return self

    def said_where(self) -> str:
        """`model.py:5 in helper, called from model.py:10 in forward: print() ...`"""
        callers = "".join(f", called from {place}" for place in reversed(self.user_stack[:-1]))
        return f"{self.location}{callers}: {self.reason}"

    def describe_stack(self) -> str:
        """The user stack as lines `model.py:10 in forward: b = helper(a)`, outermost
        first."""
        import linecache

        return "\n".join(f"{Path(place.filename).name}:{place.line} in {place.function}: "
                         f"{linecache.getline(place.filename, place.line).strip()}"
                         for place in self.user_stack)

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.reason}{hint}"


class Raised(Unsupported):
    """The captured code raises a Python exception that eager raises there too (a missing key,
    a `raise` of a known exception): a frame whose try block covers the place catches it in
    the capture, as eager's handler does (interpreter.Frame.catch); one that no frame catches
    is refused as any other Unsupported, and the code runs natively and raises it."""

    def __init__(self, exception: BaseException, hint: str = ""):
        super().__init__(f"{type(exception).__name__}: {exception}",
                         hint or f"eager raises {type(exception).__name__} here")
        self.exception = exception


class FailedOnFakes(Unsupported):
    """An op refused its arguments as the capture ran it on fake tensors (shapes that do not
    broadcast), and no handler of the captured code catches it. Eager may raise there too,
    or never get there: the capture answers torch.compiler.is_compiling() True, and libraries
    take other paths then (transformers builds a full attention mask under compilation that
    Nystromformer's landmark scores cannot take). Not a graph break, which would hand the
    compiled path's values to eager code: the call runs eagerly from the function's start,
    where eager's own path decides."""


class AssumptionFailed(Exception):
    """Raised by a runner whose graph assumed a check on a tensor's value passes (`if not
    ok: raise ...`, branches.assume_it_passes) when, this call, it does not: the function
    then runs eagerly from its start, and raises as eager raises (ember/api.py)."""


class GraphRaised(AssumptionFailed):
    """Raised by a runner whose graph raised at run time (a factorization that fails, an
    index out of range, inside the user's try statement or not), where the graph writes no
    input, or puts back the inputs it wrote (one whose ops a try statement of the captured
    code covers): the function runs eagerly from its start, so eager raises the error from
    the user's own line, or the user's handler catches it, as in eager."""

    def __init__(self, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class AssumptionsRefused(Exception):
    """A capture that assumed checks pass cannot keep them (its graph writes a tensor in
    place before the runner could test them): captured again, each such check a break."""


class ViewsRefused(Exception):
    """Gathers standing for eager's views (scalar_indices.py) that something could tell from
    the views: captured again, each subscript at `sites` a break."""

    def __init__(self, sites: set):
        super().__init__(f"{len(sites)} subscripts")
        self.sites = sites


class CaptureError(RuntimeError):
    """Raised to the user under fullgraph=True: names the file, line, construct and fix."""

    def __init__(self, error: Unsupported):
        location = error.location
        where = f'File "{location.filename}", line {location.line}, in {location.function}' \
            if location else "in the compiled function"
        hint = f"\n  What to do: {error.hint}" if error.hint else ""
        super().__init__(f"ember cannot capture this function as one graph (fullgraph=True):\n"
                         f"  {where}\n  {error.reason}{hint}")
        self.unsupported = error
