"""Canonical JSON whose numbers keep their exact decimal value (for fingerprints).

The standard library parses JSON numbers into binary floats, so ``100.1`` and
``100.10000000000000001`` become the same float; a view that parses with ``Decimal``
tells them apart. Here every number is compared by its exact decimal value, and
numerically equal numbers are equal whatever their spelling (docs/protocol.md,
"Numbers in JSON bodies"): ``1e2``, ``100``, ``100.0`` and ``1.00E+2`` are one number, ``-0`` is
``0``. Each number becomes a value whose canonical text is a function of the number
alone:

* zero: ``0``;
* an integer with at most :data:`MAX_ZEROS` trailing zeros (and at most 4300 digits,
  Python's limit for ``int``): that ``int``, written as its digits;
* any other number whose value is exactly the shortest ``repr`` of a float
  (``19.99``, ``0.1``, ``1e-07``): that float, written as its ``repr`` (what
  ``json.dumps`` writes);
* any other number (more digits than a double holds, ``1e400``, ``1e-999999999``):
  its significant digits and exponent, ``10010000000000000001e-17``.

Each text stands for exactly the value it came from, so two different numbers never
share one. Nothing is ever expanded beyond :data:`MAX_ZEROS` extra digits:
``1e999999999`` costs what its nine-digit exponent costs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

#: Trailing zeros an integer may have and still be written as its digits.
MAX_ZEROS = 32
#: Digits of the largest integer written as its digits (Python's ``int`` string limit).
MAX_DIGITS = 4300
#: Integers strictly between ``-_INT_LIMIT`` and ``_INT_LIMIT`` are canonical as they are.
_INT_LIMIT = 10**MAX_ZEROS


class Exact:
    """A number no ``int`` or ``float`` stands for exactly; ``text`` is its canonical form."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Exact({self.text!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Exact:
        return self


def _decompose(text: str) -> tuple[bool, str, int]:
    """``(negative, significant digits, exponent)`` of a JSON number; ``""`` for zero."""
    mantissa, _, exponent = text.lower().partition("e")
    negative = mantissa.startswith("-")
    whole, _, fraction = mantissa.lstrip("-").partition(".")
    digits = (whole + fraction).lstrip("0")
    significant = digits.rstrip("0")
    shift = int(exponent) if exponent else 0
    return negative, significant, shift - len(fraction) + len(digits) - len(significant)


def number(text: str) -> int | float | Exact:
    """The canonical value of the JSON number ``text`` (see the module's docstring).

    Args:
        text: a number as the JSON grammar (RFC 8259) spells it; ``Decimal``'s
            ``str()`` (``1E+2``) is accepted too.

    Returns:
        An ``int``, a ``float`` or an :class:`Exact`, as described above.

    Raises:
        ValueError: an exponent longer than Python converts (more than 4300 digits).
    """
    negative, significant, exponent = _decompose(text)
    if not significant:
        return 0
    sign = "-" if negative else ""
    if exponent >= 0:
        if exponent <= MAX_ZEROS and len(significant) + exponent <= MAX_DIGITS:
            return int(sign + significant + "0" * exponent)
        return Exact(f"{sign}{significant}e{exponent}")
    value = float(text)
    exact = value and math.isfinite(value)
    if exact and _decompose(repr(value)) == (negative, significant, exponent):
        return value
    return Exact(f"{sign}{significant}e{exponent}")


def _parse_float(text: str) -> int | float | Exact:
    if len(text) <= 16 and "e" not in text and "E" not in text:
        # At most 15 significant digits and no exponent: the float's repr stands for
        # exactly this value (a double holds 15 decimal digits), and no overflow.
        value = float(text)
        return int(value) if value.is_integer() else value
    return number(text)


def _parse_int(text: str) -> int | Exact:
    if len(text) <= MAX_ZEROS:  # cannot have more trailing zeros than that
        return int(text)
    return number(text)  # type: ignore[return-value]  # an integer stays integral


#: Integers parsed by ``int`` itself (C speed); for text where no integer literal can
#: have more than ``MAX_ZEROS`` trailing zeros.
_FAST = json.JSONDecoder(parse_float=_parse_float)
_CHECKED = json.JSONDecoder(parse_float=_parse_float, parse_int=_parse_int)
_ZEROS = "0" * (MAX_ZEROS + 1)


def loads(text: str) -> Any:
    """Parse JSON ``text``, every number as its canonical value (see :func:`number`).

    Raises:
        ValueError: not valid JSON (``json.JSONDecodeError``), or a number Python
            cannot convert (an exponent of more than 4300 digits).
        RecursionError: nested too deeply for Python's ``json`` module.
    """
    if _ZEROS not in text:
        try:
            return _FAST.decode(text)
        except ValueError:
            pass  # malformed, or an integer beyond ``int``'s digit limit: check
    return _CHECKED.decode(text)


def canonical(value: Any) -> Any:
    """``value`` (already parsed by someone else) with its numbers made canonical.

    ``float`` numbers count as the decimal their ``repr`` writes (a float parsed from
    ``100.0`` is the integer ``100``, as :func:`loads` would make it); ``Decimal``
    numbers count exactly; ``bool`` stays ``bool``; infinities and NaN stay floats.
    Dicts, lists and tuples are copied (tuples as lists); anything else is returned
    as it is.
    """
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {key: canonical(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    if isinstance(value, float):
        return number(repr(float(value))) if math.isfinite(value) else value
    if isinstance(value, int):
        return int(value) if -_INT_LIMIT < value < _INT_LIMIT else number(str(int(value)))
    if isinstance(value, Decimal):
        return number(str(value)) if value.is_finite() else float(value)
    return value


class _HasExact(Exception):
    """An :class:`Exact` number is in the data: :func:`dumps` takes the slow path."""


def dumps(data: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """Canonical JSON bytes of ``data``: sorted keys, compact, non-ASCII kept, UTF-8.

    Args:
        data: parsed JSON whose numbers are canonical (from :func:`loads` or
            :func:`canonical`); :class:`Exact` numbers are written as their text.
        default: serialiser for values JSON does not know (see ``json.dumps``).
    """

    def fallback(value: Any) -> Any:
        if isinstance(value, Exact):
            raise _HasExact
        if default is None:
            raise TypeError(f"not JSON serialisable: {type(value).__name__}")
        return default(value)

    try:
        text = _dumps(data, fallback)
    except _HasExact:
        text = "".join(_encode(data, default))
    return text.encode("utf-8", "surrogatepass")


def _dumps(data: Any, default: Callable[[Any], Any] | None) -> str:
    return json.dumps(
        data,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=True,
        default=default,
    )


def _key(key: Any) -> str:
    """A dict key as ``json.dumps`` turns it into a string."""
    if isinstance(key, str):
        return key
    if isinstance(key, (bool, int, float)) or key is None:
        return _dumps(key, None)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _encode(value: Any, default: Callable[[Any], Any] | None) -> list[str]:
    """The same text as :func:`_dumps`, with :class:`Exact` numbers written as such."""
    if isinstance(value, Exact):
        return [value.text]
    if isinstance(value, dict):
        parts = ["{"]
        for index, (key, item) in enumerate(sorted(value.items())):
            parts.append(("," if index else "") + _dumps(_key(key), None) + ":")
            parts.extend(_encode(item, default))
        return [*parts, "}"]
    if isinstance(value, (list, tuple)):
        parts = ["["]
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            parts.extend(_encode(item, default))
        return [*parts, "]"]
    if default is not None and not isinstance(value, (str, int, float)) and value is not None:
        return _encode(default(value), default)
    return [_dumps(value, None)]
