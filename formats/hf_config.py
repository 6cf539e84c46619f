"""Typed reads of a Hugging Face config.json: each field the builder uses, checked as it is read.

config.json is JSON anyone can write: a field may be missing, null, a string, a list, NaN or a 400-digit
number. Every read here either returns a value of the promised type and range or raises one
CheckpointError that names the field, what it holds and what it should hold. (A schema library would
need a model of every Hugging Face config family; the builder reads about twenty fields, so it checks
those where it reads them.)
"""

from __future__ import annotations

import math
from typing import Any

from .config_strings import shown_value
from .errors import CheckpointError

INT32_MAX = 2**31 - 1  # a model dimension or a token id past this is not a model: and numpy / ONNX take C ints
_MISSING = object()


class ConfigFields:
    """The fields of one config dict; ``where`` names it in errors ("config.json", "config.json's rope_scaling")."""

    def __init__(self, cfg: Any, where: str = "config.json"):
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{where} holds {shown_value(cfg, 40)}; expected a JSON object.")
        self.cfg, self.where = cfg, where

    def __contains__(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def _fail(self, key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{self.where} field {key!r} is {shown_value(self.cfg.get(key), 40)}; expected {expected}.")

    def _get(self, key: str, default: Any) -> Any:
        value = self.cfg.get(key)
        if value is None:  # absent and null alike: Hugging Face writes null for "use the default"
            if default is _MISSING:
                raise CheckpointError(f"{self.where} lacks the field {key!r}, which the model needs.")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int = INT32_MAX) -> int:
        value = self._get(key, default)
        if isinstance(value, float) and value.is_integer():  # 4096.0: a number JSON wrote with a point
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self._fail(key, f"an integer from {minimum} to {maximum}")
        return value

    def optional_int(self, key: str, minimum: int = 0) -> int | None:
        return self.int(key, None, minimum) if key in self else None

    def number(self, key: str, default: Any = _MISSING, minimum: float = 0.0, above: bool = False) -> float:
        """A finite number >= minimum (> minimum with ``above``)."""
        value = self._get(key, default)
        if not _finite(value) or float(value) < minimum or (above and float(value) == minimum):
            raise self._fail(key, f"a finite number {'>' if above else '>='} {minimum:g}")
        return float(value)

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def section(self, key: str) -> ConfigFields | None:
        """A nested object (rope_scaling, quantization_config), or None when absent or null."""
        if key not in self:
            return None
        if not isinstance(self.cfg[key], dict):
            raise self._fail(key, "a JSON object")
        return ConfigFields(self.cfg[key], f"{self.where}'s {key}")

    def int_list(self, key: str, minimum: int = 0) -> list[int]:
        """An integer or a list of integers (eos_token_id), [] when absent."""
        value = self._get(key, [])
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= INT32_MAX for v in items):
            raise self._fail(key, f"an integer from {minimum} to {INT32_MAX}, or a list of them")
        return list(items)

    def number_list(self, key: str) -> list[float]:
        value = self._get(key, _MISSING)
        if not isinstance(value, list) or not all(_finite(v) for v in value):
            raise self._fail(key, "a list of finite numbers")
        return [float(v) for v in value]


def _finite(value: Any) -> bool:
    """A JSON number that is finite as a float (a 400-digit integer is not: float() overflows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def config_groups(qc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """compressed-tensors' config_groups: name -> group, each a JSON object whose "weights" is one too (or absent)."""
    groups = qc.get("config_groups") or {}
    bad = None if isinstance(groups, dict) else "config_groups"
    for name, group in groups.items() if bad is None else ():
        if not isinstance(group, dict):
            bad = f"config_groups.{name}"
        elif group.get("weights") is not None and not isinstance(group["weights"], dict):
            bad = f"config_groups.{name}.weights"
    if bad:
        raise CheckpointError(f"config.json's quantization_config.{bad} is {shown_value(value_at(qc, bad), 40)}; expected a JSON object "
                              "(compressed-tensors' layout).")
    return groups


def value_at(qc: dict[str, Any], dotted: str) -> Any:
    """qc's value at a dotted path of keys (for the error above)."""
    value: Any = qc
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value
