"""A stage imports mlx-lm's model code without its tokenizer stack.

`import mlx_lm.<anything>` first runs mlx-lm's package `__init__`, which imports `generate`
and `convert` and through them `transformers` (and numpy, jinja2, ...): about 1 s of a
fresh stage's start here (0.2 s without it), and a stage never tokenizes — only the
coordinator does. A stage restarted after a fault pays that second on the recovery's
critical path, so the stage process registers the `mlx_lm` package without running its
`__init__` and gives `mlx_lm.utils` a tokenizer module whose loaders refuse. Should a future
mlx-lm need more from it, the lean import fails, is undone, and the ordinary import runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

PACKAGE = "mlx_lm"
TOKENIZER_MODULE = "mlx_lm.tokenizer_utils"


class NoTokenizer(RuntimeError):
    """A stage process asked for a tokenizer (only the coordinator has one)."""


def _refuse(*_: object, **__: object) -> None:
    raise NoTokenizer("a pipeline stage has no tokenizer (mlx-lm was imported without it)")


def _tokenizer_stand_in() -> types.ModuleType:
    """What `mlx_lm.utils` imports from `mlx_lm.tokenizer_utils`, minus `transformers`."""
    module = types.ModuleType(TOKENIZER_MODULE, "stand-in: a pipeline stage has no tokenizer")

    class TokenizerWrapper:  # only named in type hints and isinstance checks of mlx_lm.utils
        def __init__(self, *args: object, **kwargs: object) -> None:
            _refuse()

    module.TokenizerWrapper = TokenizerWrapper
    module.load = _refuse
    module.load_tokenizer = _refuse
    return module


def import_model_code_only() -> bool:
    """Import `mlx_lm.utils` (load_model) and `mlx_lm.models` without the tokenizer stack.

    Call it before anything imports mlx_lm, in a process that never tokenizes (a stage).
    Returns whether the lean import was taken; False (and nothing changed) when mlx_lm is
    already imported or its layout no longer allows it — the ordinary import then follows.
    """
    if PACKAGE in sys.modules:
        return False
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return False
    package = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    sys.modules[PACKAGE] = package
    sys.modules[TOKENIZER_MODULE] = _tokenizer_stand_in()
    try:
        package.__version__ = importlib.import_module(f"{PACKAGE}._version").__version__
        importlib.import_module(f"{PACKAGE}.utils")
        importlib.import_module(f"{PACKAGE}.models.cache")
    except (ImportError, AttributeError):
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        return False
    return True


__all__ = ["NoTokenizer", "import_model_code_only"]
