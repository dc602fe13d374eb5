"""The learner's file: loaded from its path, its functions called and judged.

A lab file (``labs/01_slots.py`` ...) defines a few functions; the shipped
stubs' bodies are ``raise NotImplementedError``. :class:`Learner` loads the
file as a module of its own (so two labs' files never collide), says which
functions are still stubs, and calls them through :meth:`Learner.call`,
which turns what can go wrong into a refusal that names the function:

- it raises ``NotImplementedError``: :class:`~.report.NotDoneYet`;
- it raises anything else: a :class:`~.report.LabFailure` with the error and
  the line of the learner's file it came from;
- it returns ``None`` where a value is due: "returned None", said as such (a
  body that forgot its ``return``), never taken for a stub.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import traceback
from pathlib import Path

from ..errors import InvalidArgument
from .report import LabFailure, NotDoneYet

_modules = itertools.count()


def is_stub(node: ast.FunctionDef) -> bool:
    """A function whose body (after its docstring) is only ``raise NotImplementedError``."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


class Learner:
    """The functions ``names`` of the file at ``path``, ready to be called and judged."""

    def __init__(self, path, names):
        self.path = Path(path)
        if not self.path.is_file():
            raise InvalidArgument(f"--solution: {self.path} is not a file")
        source = self.path.read_text()
        try:
            tree = ast.parse(source, filename=str(self.path))
        except SyntaxError as e:
            raise LabFailure(names[0], f"{self.path} does not parse: {e}") from None
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        missing = [n for n in names if n not in defs]
        if missing:
            raise LabFailure(missing[0], f"{self.path} defines no function {missing[0]}() "
                                         f"(a lab file defines {', '.join(names)})")
        #: The functions whose bodies are still the stub's, in the lab's order.
        self.stubs = [n for n in names if is_stub(defs[n])]
        spec = importlib.util.spec_from_file_location(f"_paged_np_lab_{next(_modules)}",
                                                      self.path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise LabFailure(names[0], [f"{self.path} raised while it was imported: "
                                        f"{type(e).__name__}: {e}", self._where(e)]) from None
        self.fns = {n: getattr(module, n) for n in names}

    def call(self, name: str, *args, returns: bool = True, case: str = ""):
        """``name(*args)``, judged (see the module docstring); ``case`` describes the
        arguments, for the refusal."""
        try:
            out = self.fns[name](*args)
        except NotImplementedError:
            raise NotDoneYet(name, str(self.path)) from None
        except LabFailure:
            raise                          # a seam it called (preempt, ...) refused it already
        except Exception as e:
            raise LabFailure(name, [f"raised {type(e).__name__}: {e}", self._where(e)],
                             case) from None
        if returns and out is None:
            raise LabFailure(name, "returned None (does the body end without a `return`?)",
                             case)
        return out

    def _where(self, exc: BaseException) -> str:
        """The deepest line of the learner's file in ``exc``'s traceback."""
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if Path(f.filename).resolve() == self.path.resolve()]
        if not frames:
            return f"(in code your {self.path.name} called)"
        f = frames[-1]
        return f"at {self.path.name} line {f.lineno}: {f.line}"
