"""`python -m ember explain file.py:function ['ARGS']`: ember.explain from the command line.

Takes a file, the name of a function or nn.Module in it and a Python expression for the
arguments; loads the file as a module (its `if __name__ == "__main__":` block does not run),
calls the function once under ember.explain and prints the report. Errors in what the user
typed are one line naming what to change, not a traceback.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

USAGE = "usage: python -m ember explain file.py:function ['ARGS']"


class CommandError(Exception):
    """What the user typed cannot be run; the message says what to change."""


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n  ARGS: a Python expression for the arguments (torch is imported), "
              f"e.g. 'torch.randn(8, 16)'", file=sys.stderr if argv[:1] != ["-h"] and
              argv[:1] != ["--help"] else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        target, args, label = _load(argv[0], argv[1] if len(argv) == 2 else None)
    except CommandError as error:
        print(f"python -m ember explain: {error}", file=sys.stderr)
        return 2
    import ember

    print(f"ember.explain of {label}")
    print(ember.explain(target)(*args))
    return 0


def _load(spec: str, expression: str | None) -> tuple[Any, tuple, str]:
    location, colon, name = spec.rpartition(":")
    if not colon or not location.endswith(".py") or not name:
        raise CommandError(f"{spec!r} is not file.py:function\n{USAGE}")
    path = Path(location).resolve()
    if not path.is_file():
        raise CommandError(f"no such file: {location}")
    module = _module(path)
    target = getattr(module, name, None)
    if target is None:
        defined = sorted(key for key, value in vars(module).items() if not key.startswith("_")
                         and (_is_module(value) or inspect.isfunction(value)
                              and value.__module__ == module.__name__))
        raise CommandError(f"{location} has no {name!r} (its functions and modules: "
                           f"{', '.join(defined) or 'none'})")
    if inspect.isclass(target) or not callable(target):
        raise CommandError(f"{name} in {location} is a {type(target).__name__}: name a function "
                           f"or an nn.Module instance")
    if expression is None:
        required = _required_parameters(target)
        if required:
            raise CommandError(f"{name} takes {', '.join(required)}: give them as a Python "
                               f"expression, e.g. python -m ember explain {spec} "
                               f"'torch.randn(8, 16)'")
        args: tuple = ()
    else:
        import torch

        try:
            value = eval(expression, {**vars(module), "torch": torch})  # noqa: S307 (the user's)
        except Exception as error:  # noqa: BLE001 (said as the user's expression's error)
            raise CommandError(f"the arguments {expression!r} raised "
                               f"{type(error).__name__}: {error}") from None
        args = value if isinstance(value, tuple) else (value,)
    return target, args, f"{name} in {location}"


def _module(path: Path) -> Any:
    # (like running the file as a script, its folder importable; under another name than
    # __main__, so that the file's main block does not run)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"ember_explain_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001
        raise CommandError(f"importing {path.name} raised {type(error).__name__}: "
                           f"{error}") from None
    return module


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


def _required_parameters(target: Any) -> list[str]:
    function = target.forward if _is_module(target) else target
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.default is p.empty and
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
