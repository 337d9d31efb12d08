"""The trace data model (schema, construction, validation) and its zarr storage."""

from rlparity.trace.factors import FACTORS_ATTR, arm_factors, by_factors, factors, stack_cells, with_factors
from rlparity.trace.storage.zarr_io import add_arm, as_arms, load, open_arms, open_experiment, save
from rlparity.trace.storage.lazy.arm import is_lazy
from rlparity.trace.storage.lazy.reading import blocks, load_sample
from rlparity.trace.record import ArmRecord, ArmRecordError, EngineRecord, FaultRecord, RLRecord, TrainerRecord, arm_name, arm_record
from rlparity.trace.build import RolloutColumns, concat_sequences, from_rollouts, with_trainer
from rlparity.trace.schema import (
    ALL_VARS,
    ROLLOUT_VARS,
    SCHEMA_VERSION,
    TRAINER_READINGS,
    TraceValidationError,
    annotate,
    has_trainer,
    latest_version,
    pad_rows,
    sequences,
    token_checksum,
    trace_versions,
)
from rlparity.trace.validation import validate
from rlparity.trace.storage import (
    ARM_NAME_PATTERN,
    StoreDamagedError,
    StoreError,
    check_arm_name,
    install_store,
    recover,
    store_lock,
    temp_store,
)

__all__ = [
    "ROLLOUT_VARS", "RolloutColumns",
    "ALL_VARS", "ARM_NAME_PATTERN", "ArmRecord", "ArmRecordError", "EngineRecord", "FaultRecord", "RLRecord", "TrainerRecord", "arm_name", "arm_record", "FACTORS_ATTR", "SCHEMA_VERSION", "TRAINER_READINGS", "StoreDamagedError", "StoreError",
    "TraceValidationError", "add_arm", "annotate", "arm_factors", "as_arms", "blocks", "by_factors", "check_arm_name", "concat_sequences",
    "factors", "from_rollouts", "has_trainer", "install_store", "is_lazy", "latest_version", "load", "load_sample", "open_arms", "open_experiment", "pad_rows",
    "recover", "save", "sequences", "stack_cells", "store_lock", "temp_store", "token_checksum", "trace_versions", "validate", "with_factors", "with_trainer",
]
