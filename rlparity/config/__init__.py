"""The lowest layer: what to run and with which defaults, as plain validated data.

* :class:`EngineSettings`, :class:`SamplingSettings`: how an engine is configured and how it samples.
* profiles (:func:`load_profile`, ``rlparity/data/profiles/*.yaml``): named engine settings.
* :func:`compare` / :class:`AuditResult`: an effective configuration against a profile, with why
  each difference matters.
* :func:`defaults` / :func:`defaults_context`: every default of rlparity in one object.
"""

from rlparity.config.defaults import (
    CheckThresholds,
    Defaults,
    ObjectiveDefaults,
    RLDefaults,
    RecordDefaults,
    default_sampling,
    defaults,
    defaults_context,
    set_defaults,
)
from rlparity.config.env import scoped_env
from rlparity.config.profile_diff import WHY, AuditResult, Difference, compare
from rlparity.config.profiles import load_profile, profile_names, read_profile, save_profile
from rlparity.config.settings import EngineSettings, SamplingSettings

__all__ = ["WHY", "AuditResult", "CheckThresholds", "Defaults", "ObjectiveDefaults", "RLDefaults", "RecordDefaults", "Difference", "EngineSettings", "SamplingSettings",
           "compare", "default_sampling", "defaults", "defaults_context", "load_profile", "profile_names", "read_profile", "save_profile",
           "scoped_env", "set_defaults"]
