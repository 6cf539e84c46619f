"""Token ids -> the text a client sees: the runtime's incremental detokenizer and stop strings.

One implementation serves specdec-run and specdec-serve: ``runtime/text.py``
(the runtime side, so the CLI reuses it without importing FastAPI). The server
ends text before a stop string, as OpenAI does (``keep_stop=False``).
"""

from ..runtime.text import IncrementalDetokenizer, TextStream  # noqa: F401
