"""A request's output text, grown token by token without decoding the whole output at every step.

    text = IncrementalText(tokenizer)
    text.extend(output_ids)          # after each new token: the text so far

Each step decodes only a short window: the tokens from `prefix` on, minus the text of those before `read` (decoded
with the same left context, so a token whose text depends on its neighbour, a leading space or a byte of a
multi-byte character, reads as in the whole). A token that ends inside a character (the decoder shows U+FFFD) waits
for the next. The text is always a prefix of decoding the whole output; `final` is that whole decoding.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""
        self._prefix = 0  # first token of the decoding window
        self._read = 0  # tokens whose text is in `text`

    def extend(self, output_ids: list[int]) -> str:
        """The text of `output_ids` (this request's output so far, one more token than last time or more)."""
        before = self.tokenizer.decode(output_ids[self._prefix : self._read])
        window = self.tokenizer.decode(output_ids[self._prefix :])
        if len(window) > len(before) and not window.endswith(REPLACEMENT):
            self.text += window[len(before) :]
            self._prefix, self._read = self._read, len(output_ids)
        return self.text

    def final(self, output_ids: list[int]) -> str:
        """The whole output decoded (once, when the request ends): equal to `text` but for a cut character."""
        self.text = self.tokenizer.decode(output_ids)
        return self.text
