"""Text for people: one-line errors, and text from hosts, servers and files made printable.

Text that a host, a server or a file sent (a command's output, a journal line, a holder file, a
state record, ``/version``) is data: printed as it came, an ESC sequence sets the terminal's
window title (OSC 0), clears the screen (``ESC [2J``), moves the cursor or hides the lines
before it, a carriage return overwrites a line, and a bidi control (U+202E) shows text in
another order than it has. :func:`printable` shows each such character as an escape
(``\\x1b``, ``\\u202e``), so the operator sees what was sent and the terminal interprets none
of it. :func:`markdown_inline` does the same for a value written into Markdown (the decision
record), so a value cannot open a table cell or row, a heading, a link or raw HTML.
"""

from __future__ import annotations

import re
import unicodedata

from vllm_provision.core.errors import ProvisionError

# Unicode bidi controls (Unicode Standard Annex #9, "Explicit Directional Formatting
# Characters"; the characters of CVE-2021-42574, "Trojan Source"): all are category Cf, so
# :func:`str.isprintable` already refuses them; named here so the rule is visible and tested.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                          "\u2066\u2067\u2068\u2069")

# Markdown punctuation that starts inline markup in CommonMark/GFM: emphasis (* _), code spans
# (`), links and images ([ ]), strikethrough (~), table cells (|), headings (#); CommonMark
# "Backslash escapes": any ASCII punctuation character may be backslash-escaped.
_MARKDOWN_PUNCT = frozenset("\\`*_[]#|~")
# HTML: a raw tag or an entity reference (CommonMark "Raw HTML", "Entity and numeric character
# references"); written as entities. Braces too: the record refuses a text holding one
# (evidence/record.py, check_complete: an open template slot).
_LINE_START = re.compile(r"^(\d*)[-+=.)]")
_MARKDOWN_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "{": "&#123;", "}": "&#125;"}


def one_line(error: ProvisionError) -> str:
    """``host: message`` of each problem of ``error``, on one line (``; `` between problems),
    without the fix: the reason a node is unreachable, as ``provision status`` shows it."""
    return "; ".join(f"{p.where}: {' '.join(p.message.split())}" for p in error.problems)


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object, *, newlines: bool = False, tabs: bool = True,
              limit: int | None = None) -> str:
    """``text`` safe to print on a terminal, in a log or in a line of a file: every character a
    terminal would interpret shown as an escape instead.

    Escaped: the C0 controls (U+0000-U+001F: ESC, so every ESC/CSI/OSC sequence is shown and
    not run, BEL, carriage return, backspace, form feed...), DEL (U+007F), the C1 controls
    (U+0080-U+009F, CSI U+009B and OSC U+009D among them), the bidi controls
    (:data:`BIDI_CONTROLS`), the other format characters (Unicode category Cf), line and
    paragraph separators (U+2028/U+2029), surrogates, private-use and unassigned code points:
    whatever :meth:`str.isprintable` refuses except spaces (category Zs). A character is
    written ``\\xNN`` (up to U+00FF), ``\\uNNNN`` or ``\\UNNNNNNNN``; a backslash is left as
    it is.

    Args:
        text: any value (``str()`` of it is used; ``None`` gives ``""``).
        newlines: keep ``\\n`` (a ``\\r\\n`` pair becomes ``\\n``) for text printed as several
            lines; otherwise a newline is shown as ``\\x0a``.
        tabs: keep ``\\t`` (it only moves the cursor right); otherwise ``\\x09``.
        limit: at most this many characters out, the last one ``…`` when cut; ``None``: all.

    Returns:
        The text, where every character is printable (or one of those kept).
    """
    out = "" if text is None else str(text)
    if newlines:
        out = out.replace("\r\n", "\n")
    keep = ("\n" if newlines else "") + ("\t" if tabs else "")
    if not out.isprintable() or any(c in BIDI_CONTROLS for c in out):
        out = "".join(c if (c.isprintable() and c not in BIDI_CONTROLS) or c in keep
                      or unicodedata.category(c) == "Zs" else _escape_char(c) for c in out)
    if limit is not None and len(out) > limit:
        out = out[:max(limit - 1, 0)] + "…"
    return out


def markdown_inline(text: object) -> str:
    """``text`` as one literal Markdown inline value (a table cell, a list item, a heading):
    :func:`printable` first (no control or bidi character), then every character that could
    start markup escaped, so the value renders as the text it is.

    ``\\ ` * _ [ ] # | ~`` get a backslash (CommonMark "Backslash escapes"; ``\\|`` inside a
    GFM table cell, GitHub Flavored Markdown "Tables"), ``< > &`` and ``{ }`` become HTML
    entities (no raw HTML, no entity the value did not spell). A newline, a tab and every other
    control character are shown escaped by :func:`printable` (``\\x0a``): a value never ends
    its table row, list item or line. Leading spaces become ``&#32;`` (no indented code block)
    and a ``-``, ``+``, ``=`` or the ``.`` or ``)`` after leading digits that follows them gets a
    backslash (no list item, no setext heading when the value starts a line).

    Args:
        text: any value (``str()`` of it; ``None`` gives ``""``).

    Returns:
        One line of Markdown.
    """
    out = []
    for ch in printable(text, tabs=False):
        if ch in _MARKDOWN_PUNCT:
            out.append("\\" + ch)
        else:
            out.append(_MARKDOWN_ENTITIES.get(ch, ch))
    text = "".join(out)
    # Leading spaces would indent: four open a code block, up to three still let the marker
    # below open a list item (CommonMark "Indented code blocks", "List items"): each becomes
    # the entity of a space, which renders as one and indents nothing.
    rest = text.lstrip(" ")
    # At the start of a line, "-", "+", "=" and "1." or "1)" would open a list item or
    # underline a heading (CommonMark "List items", "Setext headings"): escaped there.
    lead = _LINE_START.match(rest)
    if lead:
        rest = f"{lead.group(1)}\\{rest[lead.end(1):]}"
    return "&#32;" * (len(text) - len(text.lstrip(" "))) + rest
