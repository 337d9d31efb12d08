"""The one options object every check of :func:`rlparity.diagnose.diagnose` receives.

Each field defaults to the project-wide default (:func:`rlparity.config.defaults`) at the moment
the options are made, so ``with defaults_context(tol=0.03): diagnose(trace)`` and
``diagnose(trace, tol=0.03)`` mean the same. An unknown option is an error that lists the valid
ones: an option is never silently dropped.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.docfields import document_fields


def _d(name: str):
    return Field(default_factory=lambda: getattr(defaults(), name),
                 description=type(defaults()).model_fields[name].description)


@document_fields
class DiagnoseOptions(BaseModel):
    """Options of :func:`rlparity.diagnose.diagnose` (every field reaches every check that uses it).

    Each field defaults to :func:`rlparity.config.defaults` at the moment the options are made.
    The object is frozen and refuses unknown fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reference: str | None = Field(None, description="arm the other arms are compared with (inference path); "
                                                    "default: the store's own reference arm")
    trainer: TrainerSide = _d("trainer")
    tol: float = _d("tol")
    semantic_tol: float = _d("semantic_tol")
    offset_z: float = _d("offset_z")
    tol_reference: float = _d("tol_reference")
    tol_trainer: float = _d("tol_trainer")
    eps: float = _d("eps")
    profile: str = _d("profile")
    stale_ratio: float = _d("stale_ratio")
    layer_floor_ratio: float = Field(default_factory=lambda: defaults().layer_floor_ratio, gt=1,
                                     description=type(defaults()).model_fields["layer_floor_ratio"].description)
    correction: str | None = Field(None, description="the off-policy corrections the RL run applies, comma "
                                                     "separated (e.g. 'token_tis, geometric_band'); with a backend "
                                                     "error they are reported as hiding the mismatch, and a mask "
                                                     "rule's masked fraction is judged")

    @classmethod
    def make(cls, options: DiagnoseOptions | None = None, **changes: Any) -> DiagnoseOptions:
        """``options`` with ``changes`` applied.

        Parameters
        ----------
        options : DiagnoseOptions, optional
            The options to start from; None: the defaults.
        **changes
            Field values that replace those of ``options``.

        Returns
        -------
        DiagnoseOptions
            The new options.

        Raises
        ------
        ValueError
            If a name is not a field (the message lists the valid ones) or a value is invalid.
        """
        base = options.model_dump() if options is not None else {}
        unknown = sorted(set(changes) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"unknown diagnose option(s) {unknown}; valid options: {sorted(cls.model_fields)}")
        try:
            return cls(**{**base, **changes})
        except ValidationError as err:
            first = err.errors()[0]
            raise ValueError(f"diagnose option {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


__all__ = ["DiagnoseOptions"]
