"""The reference `gepa` library (gepa-ai) as an optimizer arm: `algorithm=gepa_ai`."""

from algorithms.gepa_ai.optimizer import GepaLibraryError, GepaLibraryOptimizer
from algorithms.gepa_ai.params import GepaLibraryParams

__all__ = ["GepaLibraryError", "GepaLibraryOptimizer", "GepaLibraryParams"]
