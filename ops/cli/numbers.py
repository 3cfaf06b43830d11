"""The argparse types of the commands' numeric flags: a value out of range is refused as argparse
refuses a bad choice (exit 2, the flag named, before anything connects). float() takes 'nan' and
'inf', which every `>= 0` check let through (nan compares false both ways): a timeout of nan
never ended, a sample of inf overflowed time.sleep."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def seconds(zero: bool = False, most: float | None = None) -> Callable[[str], float]:
    """A finite number of seconds above 0 (`zero`: or 0), at most `most`."""
    if most is None:
        bounds = ">= 0" if zero else "above 0"
    else:
        bounds = f"from 0 to {most:g}" if zero else f"above 0 and at most {most:g}"

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and (number >= 0 if zero else number > 0) and (most is None or number <= most)):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {bounds}, not {value!r}")
        return number

    return parse


def whole_number(most: int | None = None) -> Callable[[str], int]:
    """A count: a whole number from 1, at most `most`."""
    bounds = ">= 1" if most is None else f"from 1 to {most}"

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if not (number >= 1 and (most is None or number <= most)):
            kind = "a whole number" if most is None else "an integer"
            raise argparse.ArgumentTypeError(f"must be {kind} {bounds}, not {value!r}")
        return number

    return parse


positive_int = whole_number()
