"""``argparse`` value types shared by every ``hardbatch`` command (built-in and plugins).

Each takes the option's text and returns the value, or raises ``argparse.ArgumentTypeError``
with a message saying what was expected (argparse then exits with code 2)::

    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--share", type=probability)            # [0, 1]
    parser.add_argument("--restart", type=restart_probability)  # [0, 1)
    parser.add_argument("--quantile", type=open_probability)    # (0, 1)
    parser.add_argument("--temperature", type=temperature)      # >= 1e-30, the losses' smallest

Sampler and loss names are plain strings on the parser and are parsed by the command with
:func:`hardbatch.registry.parse_names` (one error listing the valid names).
"""

from __future__ import annotations

import argparse
import math

from ._validation import MIN_TEMPERATURE

__all__ = ["nonnegative_int", "open_probability", "positive_float", "positive_int", "probability",
           "restart_probability", "temperature"]


def _integer_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1.

    Example:
        >>> import argparse
        >>> from hardbatch.cli_types import positive_int
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--epochs", type=positive_int)
        >>> parser.parse_args(["--epochs", "3"]).epochs
        3
        >>> positive_int("0")
        Traceback (most recent call last):
            ...
        argparse.ArgumentTypeError: expected a positive integer, got '0'
    """
    return _integer_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    """An integer >= 0.

    Example:
        >>> from hardbatch.cli_types import nonnegative_int
        >>> nonnegative_int("0"), nonnegative_int("12")
        (0, 12)
        >>> nonnegative_int("-1")
        Traceback (most recent call last):
            ...
        argparse.ArgumentTypeError: expected an integer >= 0, got '-1'
    """
    return _integer_at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0.

    Example:
        >>> from hardbatch.cli_types import positive_float
        >>> positive_float("1e-3")
        0.001
        >>> positive_float("inf")
        Traceback (most recent call last):
            ...
        argparse.ArgumentTypeError: expected a positive number, got 'inf'
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def temperature(text: str) -> float:
    """A finite temperature >= the losses' smallest (``hardbatch._validation.MIN_TEMPERATURE``).

    Example:
        >>> from hardbatch.cli_types import temperature
        >>> temperature("1e-40")
        Traceback (most recent call last):
            ...
        argparse.ArgumentTypeError: expected a temperature >= ... got '1e-40'
        >>> temperature("0.05")
        0.05
    """
    value = positive_float(text)
    if value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(
            f"expected a temperature >= {MIN_TEMPERATURE:.3g} (the losses overflow float32 "
            f"below it; typical values 0.05 - 1), got {text!r}")
    return value


def _unit_interval(text: str, open_low: bool, open_high: bool) -> float:
    interval = f"{'(' if open_low else '['}0, 1{')' if open_high else ']'}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}"
                                         ) from None
    inside = (0.0 < value if open_low else 0.0 <= value) and \
        (value < 1.0 if open_high else value <= 1.0)
    if not inside:  # NaN fails every comparison
        raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in ``[0, 1]`` (e.g. a restart probability).

    Example:
        >>> from hardbatch.cli_types import probability
        >>> [probability(text) for text in ("0", "0.2", "1")]
        [0.0, 0.2, 1.0]
        >>> probability("nan")
        Traceback (most recent call last):
            ...
        argparse.ArgumentTypeError: expected a number in [0, 1], got 'nan'
    """
    return _unit_interval(text, open_low=False, open_high=False)


def restart_probability(text: str) -> float:
    """A number in ``[0, 1)``: a random walk's restart probability (1 never leaves the start).

    Example:
        >>> import argparse
        >>> from hardbatch.cli_types import restart_probability
        >>> restart_probability("0")
        0.0
        >>> try:
        ...     restart_probability("1")
        ... except argparse.ArgumentTypeError as exc:
        ...     print(exc)
        expected a number in [0, 1), got '1'
    """
    return _unit_interval(text, open_low=False, open_high=True)


def open_probability(text: str) -> float:
    """A number in ``(0, 1)`` (e.g. a similarity quantile).

    Example:
        >>> import argparse
        >>> from hardbatch.cli_types import open_probability
        >>> open_probability("0.999")
        0.999
        >>> try:
        ...     open_probability("1")
        ... except argparse.ArgumentTypeError as exc:
        ...     print(exc)
        expected a number in (0, 1), got '1'
    """
    return _unit_interval(text, open_low=True, open_high=True)
