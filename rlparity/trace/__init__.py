"""The trace data model (schema, construction, validation) and its zarr storage."""

from rlparity.trace.io import add_arm, as_arms, load, open_arms, open_experiment, save
from rlparity.trace.schema import (
    ALL_VARS,
    SCHEMA_VERSION,
    TraceValidationError,
    concat_sequences,
    from_rollouts,
    has_trainer,
    sequences,
    token_checksum,
    validate,
)

__all__ = [
    "ALL_VARS", "SCHEMA_VERSION", "TraceValidationError", "add_arm", "as_arms", "concat_sequences",
    "from_rollouts", "has_trainer", "load", "open_arms", "open_experiment", "save", "sequences",
    "token_checksum", "validate",
]
