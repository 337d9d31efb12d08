"""The ``Parameters`` section of a settings class, generated from its fields' descriptions.

A pydantic settings class says what each field means once, in ``Field(description=...)`` (which
the command line's help and the findings catalogue read too); :func:`document_fields` appends those
descriptions to the class docstring as a numpydoc ``Parameters`` section, so the API reference
shows them without a second copy to keep in step.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, TypeVar

_M = TypeVar("_M")
_LONG_DEFAULT = 40  # characters: a longer default (a mapping of thresholds) is left to the source


def type_name(annotation: Any) -> tuple[str, bool]:
    """A numpydoc type for an annotation, and whether ``None`` is among its values.

    Parameters
    ----------
    annotation : Any
        A field's annotation as pydantic resolved it (``float | None``, ``Literal["a", "b"]``...).

    Returns
    -------
    name : str
        ``float``, ``{"a", "b"}`` for a ``Literal``, ``int or {"hooks"}`` for a union.
    optional : bool
        Whether ``None`` is a valid value.
    """
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "{" + ", ".join(repr(a).replace("'", '"') for a in typing.get_args(annotation)) + "}", False
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        names = [type_name(a)[0] for a in args if a is not type(None)]
        return " or ".join(names), type(None) in args
    if annotation is type(None):
        return "None", True
    if origin is None and isinstance(annotation, type):
        return annotation.__name__, False
    return str(annotation).replace("typing.", "").replace("NoneType", "None"), False


def fields_section(model: type) -> str:
    """The numpydoc ``Parameters`` section of a pydantic model's fields.

    Parameters
    ----------
    model : type
        A pydantic ``BaseModel`` subclass whose every field has a ``description``.

    Returns
    -------
    str
        One entry per field: ``name : type, default value`` (``optional`` where the default is
        ``None``), then its description as a sentence.

    Raises
    ------
    TypeError
        A field has no description.
    """
    lines = ["Parameters", "----------"]
    for name, field in model.model_fields.items():
        if not field.description:
            raise TypeError(f"{model.__name__}.{name} has no description: give it Field(description=...)")
        kind, optional = type_name(field.annotation)
        default = field.get_default(call_default_factory=True)
        if default is None:
            kind += ", optional"
        elif optional:
            kind += " or None"
        if default is None or field.is_required():
            pass
        elif hasattr(type(default), "model_fields"):
            kind += f", default {type(default).__name__}()"
        elif len(repr(default)) <= _LONG_DEFAULT:
            kind += f", default {default!r}"
        # plain text (the CLI's help reads it too): an absolute value ``|d|`` is a literal here, not a
        # reStructuredText substitution
        text = re.sub(r"(?<!`)\|([^|`]+)\|(?!`)", r"``|\1|``", " ".join(field.description.split()))
        first = text.split(" ", 1)[0]
        if first.replace("'", "").replace("-", "").isalpha() and first.islower():  # not a name like vLLM or VLLM_...
            text = text[0].upper() + text[1:]
        lines += [f"{name} : {kind}", f"    {text}{'' if text.endswith('.') else '.'}"]
    return "\n".join(lines)


def document_fields(model: type[_M]) -> type[_M]:
    """Class decorator: append :func:`fields_section` to a pydantic model's docstring.

    Parameters
    ----------
    model : type
        A pydantic ``BaseModel`` subclass with a docstring and a description on every field.

    Returns
    -------
    type
        ``model`` itself, its ``__doc__`` extended.
    """
    import inspect

    model.__doc__ = inspect.cleandoc(model.__doc__ or "") + "\n\n" + fields_section(model) + "\n"
    return model
