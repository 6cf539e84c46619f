"""The project's own exceptions.

Every message says what was wrong, what was expected and, where there is one,
what to do. The CLIs print ``str(err)`` as one line and exit non-zero.
"""

import math


def big_int(n: int) -> str:
    """An integer for a message: as it is up to 15 digits, else in e-notation. Not through float: a user's
    1e308-token prompt total or KV cache overflows it (OverflowError), and a 400-digit number is no message."""
    if n < 10**15:
        return str(n)
    exponent = int((n.bit_length() - 1) * math.log10(2))  # floor(log10(n)), or one less
    exponent += 10 ** (exponent + 1) <= n
    return f"{n:.1e}" if exponent < 300 else f"about 1e{exponent}"


class SpecdecError(Exception):
    """Base class of every error specdec raises on purpose."""


class CheckpointError(SpecdecError):
    """A Hugging Face checkpoint is missing, malformed or unsupported."""


class BuildConfigError(SpecdecError):
    """Build limits or flags that do not fit together."""


class EngineError(SpecdecError):
    """An engine directory is missing, corrupt, foreign or incompatible."""


class ConfigStringError(SpecdecError):
    """A TensorRT-LLM style config string could not be parsed."""


class RequestError(SpecdecError):
    """A generation request that the loaded engines cannot serve."""


class DeviceError(SpecdecError):
    """A device list that does not match the engine or the host."""
