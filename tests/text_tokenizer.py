"""A tiny stand-in tokenizer for the 128-token test models: every id decodes to a fixed piece
of text (some pieces several characters long, so stop strings can span tokens)."""

from __future__ import annotations

PIECES = [chr(ord("a") + i) for i in range(26)] + [" ", "\n", ".", ",", "</", "s>", "ab",
                                                    "END", "é", "->", "  "]
PIECES += [f"<{i}>" for i in range(128 - len(PIECES))]


class PieceTokenizer:
    stop_token_ids = (2,)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(PIECES[i] for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, at = [], 0
        while at < len(text):
            match = max((p for p in PIECES if text.startswith(p, at)), key=len)
            ids.append(PIECES.index(match))
            at += len(match)
        return ids
