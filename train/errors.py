"""Training's own error: flags or data that cannot be trained on. The CLI prints it as one line."""

from ..formats.errors import SpecdecError


class TrainConfigError(SpecdecError):
    """A specdec-train flag, data file or output directory that does not fit."""
