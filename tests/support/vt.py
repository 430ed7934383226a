"""A tiny terminal for tests: what a screen and its scrollback show after a stream of text and the
escape sequences rich's live display uses (cursor up/down/column, erase line, colours ignored).

A torn live display leaves extra copies of its rows in the scrollback; `Screen.lines` is what a user
scrolling back would read.
"""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")
_OTHER_ESC = re.compile(r"\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1b\][^\x07]*\x07")


class Screen:
    """Lines of `width` cells, the cursor's row and column; the scrollback is every line above."""

    def __init__(self, width: int):
        self.width = width
        self.rows: list[list[str]] = [[]]
        self.row = self.col = 0

    def feed(self, data: str) -> Screen:
        data = _OTHER_ESC.sub("", data)
        pos = 0
        for m in _CSI.finditer(data):
            self._text(data[pos:m.start()])
            self._csi(m.group(1), m.group(2))
            pos = m.end()
        self._text(data[pos:])
        return self

    @property
    def lines(self) -> list[str]:
        """Every line written, scrollback included, trailing blanks cut."""
        text = ["".join(r).rstrip() for r in self.rows]
        while text and not text[-1]:
            text.pop()
        return text

    def _line(self) -> list[str]:
        while len(self.rows) <= self.row:
            self.rows.append([])
        return self.rows[self.row]

    def _text(self, text: str) -> None:
        for ch in text:
            if ch == "\n":
                self.row, self.col = self.row + 1, 0  # a pty turns LF into CR LF
                self._line()
            elif ch == "\r":
                self.col = 0
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch >= " ":
                if self.col >= self.width:  # auto-wrap
                    self.row, self.col = self.row + 1, 0
                line = self._line()
                line.extend(" " * (self.col + 1 - len(line)))
                line[self.col] = ch
                self.col += 1

    def _csi(self, params: str, cmd: str) -> None:
        if params.startswith("?") or cmd == "m":
            return  # cursor visibility, colours
        n = int(params.split(";")[0] or 1) if cmd in "ABCDG" else int(params or 0)
        if cmd == "A":
            self.row = max(0, self.row - n)
        elif cmd == "B":
            self.row += n
        elif cmd == "C":
            self.col += n
        elif cmd == "D":
            self.col = max(0, self.col - n)
        elif cmd == "G":
            self.col = n - 1
        elif cmd == "K":
            line = self._line()
            if n == 2:
                line.clear()
            elif n == 0:
                del line[self.col:]
            else:
                line[: self.col + 1] = [" "] * min(len(line), self.col + 1)
        elif cmd == "J" and n == 0:
            del self._line()[self.col:]
            del self.rows[self.row + 1:]
