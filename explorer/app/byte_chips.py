"""Characters split over several byte-level tokens (an emoji is 4 UTF-8 bytes, often 2-4 tokens): each token alone
shows its bytes ("\\xf0\\x9f", ``render.token_piece``); where neighbouring tokens' bytes together decode, the lane
shows them as one chip holding the character."""

from __future__ import annotations

import re
from collections.abc import Sequence

HIGH_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")  # token_piece's escape of a byte >= 0x80 (part of a character)
MAX_TOKENS = 4  # a UTF-8 character has at most 4 bytes


def piece_bytes(piece: str) -> bytes | None:
    """The raw bytes of a piece that holds escaped high bytes; None for a piece of plain text."""
    if not HIGH_BYTE.search(piece):
        return None
    out, at = bytearray(), 0
    for match in HIGH_BYTE.finditer(piece):
        out += piece[at:match.start()].encode("utf-8")
        out.append(int(match.group(1), 16))
        at = match.end()
    return bytes(out + piece[at:].encode("utf-8"))


def merged(pieces: Sequence[str | None], block: int) -> dict[int, tuple[int, str]]:
    """start position -> (end position, text) for runs of neighbouring pieces (None: masked) whose bytes decode
    together and not alone; a run never crosses a block boundary."""
    runs, pos = {}, 0
    while pos < len(pieces):
        raw = piece_bytes(pieces[pos]) if pieces[pos] is not None else None
        end, text = pos + 1, None
        while raw is not None and text is None:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                nxt = pieces[end] if end < len(pieces) and end % block and end - pos < MAX_TOKENS else None
                raw = raw + piece_bytes(nxt) if nxt is not None and piece_bytes(nxt) is not None else None
                end += raw is not None
        if text is not None and end > pos + 1:
            runs[pos] = (end, text)
            pos = end
        else:
            pos += 1
    return runs
