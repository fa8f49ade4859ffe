"""Argument checks shared by the reference functions.

Every error names the argument and the offending value or position, and every check runs before
anything is computed, so a rejected call never yields a partly written result.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def require_array(name: str, value) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(value).__name__}")
    return value


def require_dtype(name: str, array: np.ndarray, allowed, why: str = "") -> None:
    allowed = tuple(np.dtype(d) for d in allowed)
    if array.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{name} has dtype {array.dtype}; expected one of: {names}{why}")


def require_float_input(name: str, array: np.ndarray) -> None:
    """float32, float16 or bfloat16; float64 is refused because numpy and ml_dtypes narrow it
    through float32, which rounds twice."""
    require_array(name, array)
    if array.dtype == np.float64:
        raise TypeError(
            f"{name} has dtype float64; pass float32 (converting float64 to fp8 silently "
            "double-rounds through float32)"
        )
    require_dtype(name, array, FLOAT_DTYPES)


def require_index(name: str, array: np.ndarray) -> None:
    """A 1-D int32 or int64 index array."""
    require_array(name, array)
    require_dtype(name, array, INDEX_DTYPES)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")


def require_shape(name: str, array: np.ndarray, expected: tuple, what: str = "") -> None:
    if tuple(array.shape) != tuple(expected):
        suffix = f" ({what})" if what else ""
        raise ValueError(f"{name} has shape {tuple(array.shape)}; expected {tuple(expected)}{suffix}")


def require_same_dtype(name: str, array: np.ndarray, other_name: str, other: np.ndarray) -> None:
    if array.dtype != other.dtype:
        raise TypeError(f"{name} has dtype {array.dtype} but {other_name} has dtype {other.dtype}")


def require_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {sorted(map(repr, choices))}")


def require_int(name: str, value, minimum: int) -> int:
    """A Python or numpy integer (not bool) >= minimum, returned as int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}={int(value)} must be >= {minimum}")
    return int(value)


def require_page_multiple(name: str, value: int, page_size: int) -> None:
    if value % page_size:
        raise ValueError(f"{name}={value} is not a multiple of page_size={page_size}")
