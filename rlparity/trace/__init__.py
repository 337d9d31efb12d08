"""The trace data model (schema, construction, validation) and its zarr storage."""

from rlparity.trace.io import add_arm, as_arms, load, open_arms, open_experiment, save
from rlparity.trace.schema import (
    ALL_VARS,
    SCHEMA_VERSION,
    TraceValidationError,
    annotate,
    concat_sequences,
    from_rollouts,
    has_trainer,
    latest_version,
    pad_rows,
    sequences,
    token_checksum,
    trace_versions,
    validate,
    with_trainer,
)

__all__ = [
    "ALL_VARS", "SCHEMA_VERSION", "TraceValidationError", "add_arm", "annotate", "as_arms", "concat_sequences",
    "from_rollouts", "has_trainer", "latest_version", "load", "open_arms", "open_experiment", "pad_rows", "save", "sequences",
    "token_checksum", "trace_versions", "validate", "with_trainer",
]
