"""The project's own exceptions.

Every message says what was wrong, what was expected and, where there is one,
what to do. The CLIs print ``str(err)`` as one line and exit non-zero.
"""


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
