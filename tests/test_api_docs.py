"""Every function, class and method on the generated API pages has a numpydoc docstring a reader
can use (issue 28, item 6): a ``Parameters`` entry with a description for each parameter, none
that does not exist, and a ``Returns`` section where it returns something.

The members are the generator's own (``rlparity.cli.book.api_modules`` and ``module_members``,
through ``test_docstrings.documented_objects``), never a hand-kept list; constants are left out.
One test per module, so a single module or subpackage runs alone, e.g.
``pytest tests/test_api_docs.py -k rlparity.trace``.
"""

import enum
import inspect

import pytest

numpydoc_validate = pytest.importorskip("numpydoc.validate")

from test_docstrings import documented_objects  # noqa: E402

# the checks that matter to a reader of the page (numpydoc's codes):
#   GL08 no docstring; PR01 a parameter not documented; PR02 a documented parameter that does not
#   exist; PR07 a parameter without a description; RT01 no Returns section where the function
#   returns something. Style checks (summary punctuation, PR09 "ends with a period", See Also,
#   Examples) are left to review.
CHECKS = ("GL08", "PR01", "PR02", "PR07", "RT01")


def api_module_names() -> list[str]:
    from rlparity.cli.book import api_modules

    return [name for modules in api_modules().values() for name in modules]


def docstring_problems(name) -> list[str]:
    """The :data:`CHECKS` codes numpydoc reports for the object importable as ``name`` (or for the
    function ``name``), each with its message."""
    result = numpydoc_validate.validate(name if isinstance(name, str) else numpydoc_validate.get_doc_object(name))
    return [f"{code} {message}" for code, message in result["errors"] if code in CHECKS]


def module_problems(module: str) -> dict[str, list[str]]:
    """``{member: [problem, ...]}`` for the documented members of ``module`` that fail a check."""
    bad = {}
    for name, obj in documented_objects([module]):
        if inspect.ismodule(obj) or getattr(obj, "__name__", "") == "<lambda>":
            continue  # a module's docstring is prose; a lambda is a dataclass field's default, not a method
        problems = docstring_problems(name)
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            # numpydoc reads an Enum's signature as the functional API's (value, names, module...):
            # its members are its documentation, so only a missing docstring counts
            problems = [p for p in problems if p.startswith("GL08")]
        if problems:
            bad[name] = problems
    return bad


def test_checks_catch_a_prose_docstring():
    """The checks fail on the docstring this issue replaces (prose, no sections) and pass on its
    numpydoc form."""

    def prose(x, y=1):
        """Add ``y`` to ``x`` and return the sum."""
        return x + y

    def numpydoc(x, y=1):
        """Add two numbers.

        Parameters
        ----------
        x : float
            The first number.
        y : float, default 1
            The number added to ``x``.

        Returns
        -------
        float
            ``x + y``.
        """
        return x + y

    codes = {p.split()[0] for p in docstring_problems(prose)}
    assert codes == {"PR01", "RT01"}, codes
    assert docstring_problems(numpydoc) == []


@pytest.mark.parametrize("module", api_module_names())
def test_api_docstrings_are_numpydoc(module):
    bad = module_problems(module)
    assert not bad, f"{len(bad)} members of {module} fail {', '.join(CHECKS)}:\n" + "\n".join(
        f"  {name}: {'; '.join(problems)}" for name, problems in bad.items())


def test_settings_fields_section_is_generated_from_the_descriptions():
    """``document_fields`` writes one numpydoc entry per pydantic field (type, default, the
    description as a sentence) and refuses a field without a description."""
    from typing import Literal

    from pydantic import BaseModel, Field

    from rlparity.config.docfields import document_fields, fields_section

    @document_fields
    class Example(BaseModel):
        """An example."""

        eps: float = Field(0.2, description="clip range of |d| (nats)")
        mode: Literal["a", "b"] | None = Field(None, description="vLLM's mode")
        seed: int | None = Field(0, description="base seed")

    doc = Example.__doc__
    assert doc.startswith("An example.\n\nParameters\n----------\n")
    assert "eps : float, default 0.2\n    Clip range of ``|d|`` (nats).\n" in doc
    assert 'mode : {"a", "b"}, optional\n    vLLM\'s mode.\n' in doc
    assert "seed : int or None, default 0\n    Base seed.\n" in doc
    assert docstring_problems(Example) == []

    class Undocumented(BaseModel):
        x: int = 0

    with pytest.raises(TypeError, match="Undocumented.x has no description"):
        fields_section(Undocumented)
