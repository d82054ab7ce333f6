"""Text statistics in Python: a read-only toolguard tool on the toolguard_sdk
package, built with plain `componentize-py componentize` (no flags). Its
schema comes from the type hints; it sends nothing.
"""

import time
from typing import Annotated, TypedDict

from toolguard_sdk import Field, Tool, tool

__all__ = ["Tool"]  # the component's export


class Stats(TypedDict):
    words: int
    lines: int
    longest_word: str
    at_ms: int


@tool(effect="read-only")
def py_text_stats(text: Annotated[str, Field(max_length=65536, description="The text to analyse.")]) -> Stats:
    """Counts the words and lines of a text and finds its longest word. Read-only."""
    words = text.split()
    return {"words": len(words), "lines": len(text.splitlines()),
            "longest_word": max(words, key=len, default=""), "at_ms": int(time.time() * 1000)}
