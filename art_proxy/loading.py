"""Loading the user's code that a setting names: `module.path:NAME` or `path/to/file.py:NAME` (an
agent, a reward check), the way `python -m module` and `python file.py` find it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import uuid
from pathlib import Path

from art_proxy.errors import ConfigError, exception_text


def load_function(spec: str, what: str) -> object:
    """What `module.path:function` or `path/to/file.py:function` names; `ConfigError`, naming
    `what` (the agent, an option), when it cannot be loaded.

    As with `python -m module` and `python file.py`, the working directory (a module) or the
    file's directory (a file) is importable, so an agent's own helper modules are found.
    """
    where, _, name = spec.rpartition(":")
    if not where or not name.isidentifier():
        raise ConfigError(f"{what} {spec!r} is not MODULE:FUNCTION or FILE.py:FUNCTION")
    try:
        module = _load_file(Path(where), what) if where.endswith(".py") else _load_module(where)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"cannot load {what} {spec!r}: {exception_text(exc)}") from exc
    found = getattr(module, name, None)
    if found is None:
        raise ConfigError(f"{what} {spec!r}: {where} has no {name!r}")
    return found


def _load_module(name: str) -> object:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def _load_file(path: Path, what: str) -> object:
    if not path.is_file():
        raise ConfigError(f"{what} file {str(path)!r} does not exist")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    # A name of its own per file, so two agent files named agent.py do not collide.
    module_name = f"art_proxy_agent_{uuid.uuid5(uuid.NAMESPACE_URL, str(path.resolve())).hex}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{what} file {str(path)!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def is_async_callable(value: object) -> bool:
    return inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(
        getattr(value, "__call__", None)  # noqa: B004  # an object with an async __call__
    )
