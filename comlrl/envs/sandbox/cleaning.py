"""Text from untrusted places (a candidate's exceptions, its code, an expert's reply) made fit for a prompt.

Whatever a sandboxed candidate raises, prints or names can reach the next turn's prompt (the
feedback of the code tasks) and the logs. ``clean_text`` removes, by Unicode category, what a
reader cannot see or what changes how the rest is shown:

- every control character (Cc: C0, DEL and C1, U+0085, U+0090 and U+009B included), line and
  paragraph separators (Zl, Zp): a single-line field gets a space for each line break and tab and
  loses the other controls; multi-line text keeps newlines and tabs (CR, VT, FF, U+0085, U+2028,
  U+2029 become newlines);
- every format character (Cf: bidirectional embeddings, overrides and isolates, marks, the BOM,
  invisible operators, tag characters that smuggle hidden text) except ZERO WIDTH NON-JOINER and
  ZERO WIDTH JOINER, which some scripts and emoji need;
- lone surrogates (Cs), which no UTF-8 consumer accepts;

and caps the result (characters kept, and at most four times as many examined, so a flood of
removed characters costs nothing). ``valid_unicode`` only replaces lone surrogates: for text shown
as it was written (an agent's own earlier response).
"""

from __future__ import annotations

import unicodedata

KEPT_FORMAT = frozenset("\u200c\u200d")
"""Format characters kept: ZERO WIDTH NON-JOINER and ZERO WIDTH JOINER."""
NEWLINES = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
REMOVED = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def _clean_char(char: str, multiline: bool) -> str:
    if char == "\t":
        return "\t" if multiline else " "
    if char in NEWLINES:
        if not multiline:
            return " "
        return "" if char == "\r" else "\n"
    category = unicodedata.category(char)
    if category in REMOVED and char not in KEPT_FORMAT:
        return ""
    return char


def clean_text(text: object, cap: int, *, multiline: bool = False) -> str:
    """``text`` without control, format and surrogate characters (see the module docstring), at most
    ``cap`` characters. ``multiline``: keep line breaks and tabs (else each becomes a space)."""
    if type(text) is not str:
        text = str.__str__(text) if isinstance(text, str) else repr(text)
    head = text[:cap]
    if head.isprintable():
        return head
    out = []
    kept = 0
    for char in text[:4 * cap]:
        if not char.isprintable():
            char = _clean_char(char, multiline)
            if not char:
                continue
        out.append(char)
        kept += 1
        if kept >= cap:
            break
    return "".join(out)


def valid_unicode(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (nothing else changes)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
