"""Diagnoses: turn traces into findings with verdicts (layer, severity, evidence, fix)."""

from rlparity.diagnose.findings import Finding, Layer, Report, Severity

__all__ = ["Finding", "Layer", "Report", "Severity"]
