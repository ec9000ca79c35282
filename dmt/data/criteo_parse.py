"""Strict, vectorized parsing of raw Criteo TSV text into numpy arrays.

A Criteo row is one line of 40 tab-separated fields: ``label`` (``0`` or ``1``), ``I1..I13``
(decimal integers, possibly negative, possibly empty) and ``C1..C26`` (hexadecimal category
hashes, 8 digits in the real data, possibly empty). Files are plain text or gzip.

Parsing works on whole blocks of bytes at once (no Python loop over rows or fields):

1. every tab/newline position is found with one ``np.flatnonzero`` over the block;
2. each field is loaded as the 8 bytes that end at its delimiter, read as one little-endian
   ``uint64`` through an unaligned, byte-strided view of the block (one gather per field);
3. the bytes before the field's start are replaced by ASCII ``'0'`` and the 8 characters are
   validated and converted with SWAR arithmetic (a few ``uint64`` operations per field).

Anything that is not exactly a valid row is reported: a :class:`CriteoFormatError` (a
``ValueError``) naming the file, the 1-based line and what was expected, or, with
``skip_bad_rows``, the row is dropped and counted. Decimal fields longer than 8 digits take a
(rare) exact Python path. Categorical fields longer than 8 hex digits are rejected: Criteo
categories are 32-bit hashes.
"""

from __future__ import annotations

import io
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
RAW_FIELD_NAMES: list[str] = [
    "label",
    *(f"I{i}" for i in range(1, NUM_DENSE + 1)),
    *(f"C{i}" for i in range(1, NUM_SPARSE + 1)),
]

#: Bytes of padding in front of every block handed to :func:`parse_block`; the 8-byte window
#: that ends at the first field's delimiter must stay inside the array.
PAD = 8
PAD_BYTES = b"0" * PAD
DEFAULT_BLOCK_BYTES = 16 << 20
#: How many bad-row messages the statistics keep (all bad rows are counted).
MAX_BAD_EXAMPLES = 20

_TAB, _NEWLINE = 9, 10
_ROW_EXPECTED = (
    f"expected {NUM_FIELDS} tab-separated fields "
    f"(label, {NUM_DENSE} integer features I1..I{NUM_DENSE}, "
    f"{NUM_SPARSE} hexadecimal categorical features C1..C{NUM_SPARSE})"
)
#: Said of a line that reads as a valid row without its label column (so a file of them, like
#: Criteo's Kaggle test.txt, is named as such).
NO_LABEL_COLUMN = "the label column is missing"
_KAGGLE_TEST = (
    "as in Criteo's Kaggle test.txt, whose labels Criteo never published (dmt trains and scores "
    "labelled rows only)"
)
# A tar header (POSIX or GNU) holds "ustar" at byte 257: the first line of a tar archive, such as
# the one Criteo ships the Kaggle data in (with train.txt, test.txt and readme.txt).
_TAR_MAGIC, _TAR_MAGIC_AT = b"ustar", 257
_TAR_HEADER = (
    "a tar archive's header: the file is a tar archive, like Criteo's Kaggle download (which "
    "holds train.txt, test.txt and readme.txt), not one TSV file; extract train.txt first "
    "(tar -xf <archive> train.txt) and give that file"
)

_ONES = np.uint64(0x0101010101010101)
_ZEROS_ASCII = np.uint64(0x3030303030303030)
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
# _KEEP[k]: keeps the last k characters of an 8-byte little-endian window (its high bytes);
# _FILL[k]: ASCII '0' in the other 8 - k bytes.
_KEEP = np.array(
    [0] + [(0xFFFFFFFFFFFFFFFF << (8 * (8 - k))) & 0xFFFFFFFFFFFFFFFF for k in range(1, 9)],
    dtype=np.uint64,
)
_FILL = _ZEROS_ASCII & ~_KEEP


def _hex_pair_table() -> np.ndarray:
    """``table[c0 | c1 << 8]`` = value of the two hex characters ``c0 c1``, else > 255."""
    digit = np.full(256, 256, np.uint16)
    for i, c in enumerate(b"0123456789abcdef"):
        digit[c] = i
    for i, c in enumerate(b"ABCDEF"):
        digit[c] = 10 + i
    codes = np.arange(1 << 16)
    hi, lo = digit[codes & 0xFF], digit[codes >> 8]
    return np.where((hi < 16) & (lo < 16), hi * 16 + lo, 256).astype(np.uint16)


_HEX_PAIRS = _hex_pair_table()
_LOG1P_TABLE = np.log1p(np.arange(1 << 16, dtype=np.float64)).astype(np.float32)


class CriteoFormatError(ValueError):
    """A raw Criteo file that does not have the expected format.

    Args:
        path (str): the file.
        line (int): 1-based line number of the offending row.
        problem (str): what is wrong and what was expected.
    """

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:  # picklable across processes
        return (type(self), (self.path, self.line, self.problem))


@dataclass
class ParsedRows:
    """Rows parsed from one block (``R`` rows).

    Attributes:
        labels: int8 ``(R,)``, 0 or 1.
        dense: float32 ``(R, 13)``, ``log(max(x, 0) + 1)``; an empty field is 0.
        keys: uint32 ``(R, 26)``, the categorical hex values (0 where empty).
        present: bool ``(R, 26)``, False where the categorical field is empty.
        num_bad: rows dropped because they were malformed (``skip_bad_rows`` only).
        bad_examples: messages for the first dropped rows.
    """

    labels: np.ndarray
    dense: np.ndarray
    keys: np.ndarray
    present: np.ndarray
    num_bad: int = 0
    bad_examples: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)


def empty_rows() -> ParsedRows:
    """Return a :class:`ParsedRows` with zero rows."""
    return ParsedRows(
        labels=np.empty(0, np.int8),
        dense=np.empty((0, NUM_DENSE), np.float32),
        keys=np.empty((0, NUM_SPARSE), np.uint32),
        present=np.empty((0, NUM_SPARSE), bool),
    )


def dense_transform(values: np.ndarray) -> np.ndarray:
    """``log(max(x, 0) + 1)`` as float32 (computed in float64, then rounded).

    Negative values are clamped to 0, as in the DLRM reference preprocessing.
    """
    clamped = np.maximum(values, 0)
    out = _LOG1P_TABLE[np.minimum(clamped, len(_LOG1P_TABLE) - 1)]
    big = clamped >= len(_LOG1P_TABLE)
    if big.any():
        out[big] = np.log1p(clamped[big].astype(np.float64)).astype(np.float32)
    return out


def parse_block(
    block: np.ndarray,
    *,
    path: str,
    first_line: int,
    skip_bad_rows: bool = False,
) -> ParsedRows:
    """Parse a block of complete Criteo TSV lines.

    Args:
        block (np.ndarray): uint8 ``(PAD + bytes,)``: :data:`PAD_BYTES`, then zero or more
            complete lines, each ending with ``b"\\n"``.
        path (str): file the block comes from (for error messages).
        first_line (int): 0-based line number of the block's first line in ``path``.
        skip_bad_rows (bool): drop malformed rows instead of raising.

    Returns:
        ParsedRows: the valid rows, in file order.

    Raises:
        CriteoFormatError: a malformed row, when ``skip_bad_rows`` is False.
    """
    assert block.dtype == np.uint8 and block.ndim == 1 and len(block) >= PAD
    if len(block) == PAD:
        return empty_rows()
    assert block[-1] == _NEWLINE and bytes(block[:PAD]) == PAD_BYTES
    # Tabs and newlines, plus any other control character (<= 10), which marks its row bad.
    delims = np.flatnonzero(block < 11)
    delim_chars = block[delims]
    line_ends = np.flatnonzero(delim_chars == _NEWLINE)
    num_lines = len(line_ends)
    fields_per_line = np.diff(line_ends, prepend=-1)
    line_ok = fields_per_line == NUM_FIELDS
    if np.count_nonzero(delim_chars < _TAB):
        line_of_delim = np.repeat(np.arange(num_lines), fields_per_line)
        line_ok &= np.bincount(line_of_delim[delim_chars < _TAB], minlength=num_lines) == 0
    line_starts = np.empty(num_lines, np.int64)
    line_starts[0] = PAD
    line_starts[1:] = delims[line_ends[:-1]] + 1

    if line_ok.all():
        ends = delims.reshape(num_lines, NUM_FIELDS)
        starts_col0 = line_starts
    else:
        ends = delims[np.repeat(line_ok, fields_per_line)].reshape(-1, NUM_FIELDS)
        starts_col0 = line_starts[line_ok]
    good_lines = np.flatnonzero(line_ok)  # index into this block's lines

    lengths = np.empty(ends.shape, np.int64)
    lengths[:, 0] = ends[:, 0] - starts_col0
    np.subtract(ends[:, 1:], ends[:, :-1] + 1, out=lengths[:, 1:])

    windows = _windows(block)
    label = block[ends[:, 0] - 1] - np.uint8(ord("0"))
    row_ok = (lengths[:, 0] == 1) & (label <= 1)

    dense_ends = ends[:, 1 : 1 + NUM_DENSE]
    dense_len = lengths[:, 1 : 1 + NUM_DENSE]
    dense, dense_ok = _parse_dense(block, windows, dense_ends, dense_len)
    row_ok &= dense_ok.all(axis=1)

    cat_ends = ends[:, 1 + NUM_DENSE :]
    cat_len = lengths[:, 1 + NUM_DENSE :]
    keys, cat_ok = _parse_hex(windows, cat_ends, cat_len)
    row_ok &= cat_ok.all(axis=1)

    num_bad = num_lines - len(good_lines)
    if not row_ok.all() or num_bad:
        bad_lines = np.sort(np.concatenate([np.flatnonzero(~line_ok), good_lines[~row_ok]]))
        messages = [
            _describe_bad_line(block, line_starts, delims[line_ends], i, path, first_line)
            for i in bad_lines[: 1 if not skip_bad_rows else MAX_BAD_EXAMPLES]
        ]
        if not skip_bad_rows:
            i = int(bad_lines[0])
            raise CriteoFormatError(path, first_line + i + 1, messages[0])
        num_bad = len(bad_lines)
        label, dense, keys, cat_len = (
            label[row_ok],
            dense[row_ok],
            keys[row_ok],
            cat_len[row_ok],
        )
        bad_examples = [
            f"{path}:{first_line + int(i) + 1}: {m}" for i, m in zip(bad_lines, messages)
        ]
    else:
        bad_examples = []

    return ParsedRows(
        labels=label.astype(np.int8),
        dense=dense,
        keys=keys,
        present=cat_len > 0,
        num_bad=num_bad,
        bad_examples=bad_examples,
    )


def _windows(block: np.ndarray) -> np.ndarray:
    """Unaligned ``uint64`` view: ``windows[i]`` holds bytes ``block[i:i + 8]`` (little-endian)."""
    return np.ndarray(shape=(len(block) - 7,), dtype="<u8", buffer=block, strides=(1,))


def _masked_windows(windows: np.ndarray, ends: np.ndarray, num_chars: np.ndarray) -> np.ndarray:
    """The last ``num_chars`` (<= 8) characters before each ``ends``, left-filled with '0'."""
    k = np.minimum(num_chars, 8)
    return (windows[ends - 8] & _KEEP[k]) | _FILL[k]


def _all_bytes_decimal(w: np.ndarray) -> np.ndarray:
    """True where all 8 bytes of ``w`` are ASCII digits."""
    high_ok = (w & _HIGH_NIBBLES) == _ZEROS_ASCII
    low_ok = (((w & _LOW_NIBBLES) + 6 * _ONES) & _HIGH_NIBBLES) == 0
    return high_ok & low_ok


def _decimal_value(w: np.ndarray) -> np.ndarray:
    """Value of 8 ASCII digits (first character most significant) packed in ``w``."""
    v = w & _LOW_NIBBLES
    v = (v * np.uint64(10) + (v >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    v = (v * np.uint64(100) + (v >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    v = (v * np.uint64(10000) + (v >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return v


def _parse_dense(
    block: np.ndarray, windows: np.ndarray, ends: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Parse optional-sign decimal fields into ``log(max(x, 0) + 1)`` (float32) and ok flags."""
    starts = ends - lengths
    negative = (lengths > 0) & (block[starts] == ord("-"))
    num_digits = lengths - negative
    w = _masked_windows(windows, ends, num_digits)
    ok = _all_bytes_decimal(w) & ((num_digits > 0) | ~negative)
    values = _decimal_value(w).astype(np.int64)
    values[negative] = 0
    dense = dense_transform(values)
    for r, c in zip(*np.nonzero((num_digits > 8) & ok)):  # rare: exact big-integer path
        text = bytes(block[starts[r, c] : ends[r, c]])
        digits = text[1:] if negative[r, c] else text
        if not digits.isdigit():  # bytes.isdigit is ASCII-only
            ok[r, c] = False
        elif not negative[r, c]:
            dense[r, c] = _log1p_of_digits(digits)
    return dense, ok


def _log1p_of_digits(digits: bytes) -> float:
    """``log(x + 1)`` of the decimal ``digits``, also of more digits than Python converts to an
    int (4300): beyond 300 significant digits from the first 300 (the float32 result cannot
    tell them apart)."""
    digits = digits.lstrip(b"0") or b"0"
    if len(digits) <= 300:
        return math.log(int(digits) + 1)
    return math.log(int(digits[:300])) + (len(digits) - 300) * math.log(10)


def _parse_hex(
    windows: np.ndarray, ends: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Parse hex fields of up to 8 digits (either case); return (uint32 values, ok)."""
    w = windows[ends - 8]
    short = lengths != 8  # empty fields, mostly
    if short.any():
        k = np.minimum(lengths[short], 8)
        w[short] = (w[short] & _KEEP[k]) | _FILL[k]
    # Two characters at a time: a 2-byte window is one uint16, looked up in a 64 Ki table.
    pairs = _HEX_PAIRS[w.view(np.uint16)]  # (R, 4 * F), value 0..255 or _INVALID_PAIR
    if pairs.max(initial=0) > 255 or (lengths > 8).any():
        ok = (pairs.reshape(*lengths.shape, 4) <= 255).all(axis=-1) & (lengths <= 8)
    else:
        ok = np.ones(lengths.shape, bool)
    values = pairs.astype(np.uint8).view(">u4").astype(np.uint32)
    return values, ok


def _describe_bad_line(
    block: np.ndarray,
    line_starts: np.ndarray,
    line_ends: np.ndarray,
    i: int,
    path: str,
    first_line: int,
) -> str:
    """Explain, in plain Python, why line ``i`` of the block is not a valid row."""
    raw = bytes(block[line_starts[i] : line_ends[i]])
    problem = describe_row_problem(raw)
    assert problem is not None, f"{path}:{first_line + i + 1}: flagged but valid: {raw!r}"
    return problem


def describe_row_problem(raw: bytes) -> str | None:
    """Return what is wrong with one raw line (without its newline), or None if it is valid.

    This is the slow, obviously-correct reference for :func:`parse_block`'s checks.
    """
    if raw[_TAR_MAGIC_AT : _TAR_MAGIC_AT + len(_TAR_MAGIC)] == _TAR_MAGIC:
        return _TAR_HEADER
    at = next((i for i, c in enumerate(raw) if c < 32 and c != _TAB), None)
    if at is not None:
        return _control_character_problem(raw, at)
    fields = raw.split(b"\t")
    if len(fields) != NUM_FIELDS:
        return f"found {len(fields)} tab-separated field(s); {_missing_label(raw)}{_ROW_EXPECTED}"
    if fields[0] not in (b"0", b"1"):
        return f"label is {_show(fields[0])}; {_expected('label')}"
    for name, value in zip(RAW_FIELD_NAMES[1 : 1 + NUM_DENSE], fields[1 : 1 + NUM_DENSE]):
        digits = value[1:] if value.startswith(b"-") else value
        if value and not (digits and digits.isdigit()):
            return f"{name} is {_show(value)}; {_expected(name)}"
    for name, value in zip(RAW_FIELD_NAMES[1 + NUM_DENSE :], fields[1 + NUM_DENSE :]):
        if len(value) > 8 or any(c not in b"0123456789abcdefABCDEF" for c in value):
            return f"{name} is {_show(value)}; {_expected(name)}"
    return None


def _missing_label(raw: bytes) -> str:
    """``"<why>; "`` for a line of 39 fields that reads as a valid row without its label: that
    the label column is missing (or, where it also reads as a labelled row short of its last
    field, that either is); else ``""``."""
    if raw.count(b"\t") != NUM_FIELDS - 2 or describe_row_problem(b"0\t" + raw) is not None:
        return ""
    if describe_row_problem(raw + b"\t") is not None:
        return f"{NO_LABEL_COLUMN}, {_KAGGLE_TEST}; "
    return f"one field is missing: the label column, {_KAGGLE_TEST}, or another; "


def _expected(name: str) -> str:
    """What the field ``name`` (``label``, ``I<i>`` or ``C<i>``) holds, as ``expected ...``."""
    if name == "label":
        return "expected 0 or 1"
    if name.startswith("I"):
        return "expected a decimal integer or an empty field"
    return "expected up to 8 hexadecimal digits or an empty field"


def _control_character_problem(raw: bytes, at: int) -> str:
    """What is wrong with a line whose first control character (not a tab) is ``raw[at]``: the
    field it is in and what that field holds (a carriage return that ends the line: a Windows
    line ending)."""
    char = raw[at : at + 1]
    index = raw.count(b"\t", 0, at)
    if index >= NUM_FIELDS:
        return f"field {index + 1} contains the control character {char!r}; {_ROW_EXPECTED}"
    name = RAW_FIELD_NAMES[index]
    if char == b"\r" and at == len(raw) - 1:
        return (
            f"{name} ends with the control character {char!r}, a Windows (CRLF) line ending; "
            "expected lines that end in b'\\n' alone: convert the file first (dos2unix, or "
            "sed -i 's/\\r$//')"
        )
    return f"{name} contains the control character {char!r}; {_expected(name)}"


def _show(value: bytes, limit: int = 40) -> str:
    text = repr(value[:limit].decode("utf-8", "replace"))
    return text + ("..." if len(value) > limit else "")


# ---------------------------------------------------------------------------------------------
# Reading files as blocks of complete lines
# ---------------------------------------------------------------------------------------------


def is_gzip(path: str | os.PathLike[str]) -> bool:
    """True if the file starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_raw(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a raw Criteo file for binary reading, decompressing gzip transparently."""
    if is_gzip(path):
        return GzipReader(path)  # type: ignore[return-value]
    return open(path, "rb")


class GzipReader(io.RawIOBase):
    """Streaming gzip decompression (all members) that hands out every decodable byte.

    Unlike :class:`gzip.GzipFile`, which drops the last decoded bytes when the stream is cut,
    this delivers everything the truncated stream encodes before raising ``EOFError``, so a
    truncated file yields all its complete lines. zlib checks each member's CRC and length.
    """

    _CHUNK = 1 << 20

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._raw = open(path, "rb")
        self._unzip = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._in = b""
        self._out = memoryview(b"")
        self._truncated = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._out:
            if self._truncated:
                raise EOFError("compressed file ended before the end-of-stream marker")
            if self._unzip.eof:
                self._in = self._unzip.unused_data or self._raw.read(self._CHUNK)
                # zero bytes after a member are padding (as gzip and Python's gzip read them)
                self._in = self._in.lstrip(b"\0")
                while not self._in:
                    more = self._raw.read(self._CHUNK)
                    if not more:
                        return 0
                    self._in = more.lstrip(b"\0")
                self._unzip = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # next member
            if not self._in:
                self._in = self._raw.read(self._CHUNK)
                if not self._in:  # input ends inside a member: hand out what it encodes
                    self._out = memoryview(self._unzip.flush())
                    self._truncated = True
                    continue
            self._out = memoryview(self._unzip.decompress(self._in, self._CHUNK))
            self._in = self._unzip.unconsumed_tail
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


@dataclass
class ReadInfo:
    """What a reader found besides the rows (filled while iterating)."""

    truncated: bool = False
    """The gzip stream ended early; the complete lines before the cut were read."""


def iter_line_blocks(
    path: str,
    *,
    byte_start: int = 0,
    byte_end: int | None = None,
    first_line: int = 0,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    allow_truncated: bool = False,
    info: ReadInfo | None = None,
) -> Iterator[tuple[np.ndarray, int, int]]:
    """Yield ``(block, first_line, num_lines)`` for blocks of complete lines (see :func:`parse_block`).

    Args:
        path (str): plain or gzip file.
        byte_start (int): where to start (plain files only; must be a line start).
        byte_end (int | None): where to stop (plain files only; a line start or the file size).
        first_line (int): 0-based line number of the line at ``byte_start``.
        block_bytes (int): bytes read per block.
        allow_truncated (bool): a truncated gzip stream ends the iteration (recorded in ``info``)
            instead of raising; the partial line at the cut is dropped.
        info (ReadInfo | None): receives the truncation flag.

    A last line without a newline is completed. The yielded array is reused by the next
    iteration: parse it before advancing.

    Raises:
        CriteoFormatError: a truncated or corrupt gzip stream.
    """
    info = info if info is not None else ReadInfo()
    line = first_line  # line number of the first line in the buffer
    with open_raw(path) as f:
        if byte_start or byte_end is not None:
            assert not isinstance(f, GzipReader), "byte ranges need an uncompressed file"
            f.seek(byte_start)
        left = None if byte_end is None else byte_end - byte_start
        # One spare byte completes a last line that lacks its newline. The buffer is never
        # resized in place: the consumer may still hold a view of it.
        buf = bytearray(PAD + block_bytes + 1)
        buf[:PAD] = PAD_BYTES
        carry = 0  # bytes of an incomplete line kept at buf[PAD:PAD + carry]
        eof = False
        while not eof:
            if PAD + carry + block_bytes + 1 > len(buf):  # a line longer than a block
                grown = bytearray(2 * len(buf))
                grown[: PAD + carry] = buf[: PAD + carry]
                buf = grown
            want = block_bytes if left is None else min(block_bytes, left)
            try:
                n, truncated = _read_into(f, memoryview(buf)[PAD + carry : PAD + carry + want])
            except _CorruptStream as e:  # the line the corrupt data is in
                line_no = line + buf.count(b"\n", PAD, PAD + carry + e.read) + 1
                raise CriteoFormatError(
                    path, line_no, f"cannot decompress ({e}); expected valid gzip data"
                ) from None
            end = PAD + carry + n
            if truncated:
                if not allow_truncated:
                    complete = line + buf.count(b"\n", PAD, end)
                    raise CriteoFormatError(
                        path,
                        complete + 1,
                        f"the gzip stream ends unexpectedly after {complete} complete lines "
                        "(truncated file); expected a complete gzip file (skip_bad_rows keeps "
                        "the complete lines before the cut)",
                    )
                info.truncated = True
                end = buf.rfind(b"\n", PAD, end) + 1 or PAD  # drop the partial line at the cut
            if left is not None:
                left -= n
            eof = truncated or n == 0 or left == 0
            if eof and end > PAD and buf[end - 1] != _NEWLINE:
                buf[end] = _NEWLINE
                end += 1
            cut = buf.rfind(b"\n", PAD, end) + 1
            if cut == 0:  # no complete line yet
                carry = end - PAD
                continue
            num_lines = buf.count(b"\n", PAD, cut)
            yield np.frombuffer(buf, np.uint8, count=cut), line, num_lines
            line += num_lines
            carry = end - cut
            buf[PAD : PAD + carry] = buf[cut:end]


class _CorruptStream(Exception):
    def __init__(self, message: str, read: int) -> None:
        super().__init__(message)
        self.read = read  # bytes decoded into the buffer before the corrupt data


def _read_into(f: BinaryIO, view: memoryview) -> tuple[int, bool]:
    """Fill ``view`` as far as the stream allows.

    Returns:
        tuple[int, bool]: bytes read, and whether a gzip stream turned out to be truncated.
    """
    total = 0
    try:
        while total < len(view):
            n = f.readinto(view[total:])  # type: ignore[attr-defined]
            if not n:
                break
            total += n
    except EOFError:
        return total, True
    except zlib.error as e:
        raise _CorruptStream(str(e), total) from None
    finally:
        view.release()
    return total, False


def slice_lines(block: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Lines ``start..stop-1`` of a block (as a new padded block)."""
    newlines = np.flatnonzero(block[PAD:] == _NEWLINE) + PAD
    begin = PAD if start == 0 else int(newlines[start - 1]) + 1
    end = begin if stop <= start else int(newlines[stop - 1]) + 1
    out = np.empty(PAD + end - begin, np.uint8)
    out[:PAD] = np.frombuffer(PAD_BYTES, np.uint8)
    out[PAD:] = block[begin:end]
    return out


def count_lines(
    path: str,
    *,
    byte_start: int = 0,
    byte_end: int | None = None,
    allow_truncated: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> tuple[int, bool]:
    """Count the lines of a file or byte range (a last line without newline counts).

    Returns:
        tuple[int, bool]: number of lines, and whether a gzip stream was truncated (only
        possible with ``allow_truncated``; the partial last line is then not counted).
    """
    info = ReadInfo()
    lines = 0
    for _, _, num_lines in iter_line_blocks(
        path,
        byte_start=byte_start,
        byte_end=byte_end,
        allow_truncated=allow_truncated,
        block_bytes=block_bytes,
        info=info,
    ):
        lines += num_lines
    return lines, info.truncated


def line_aligned_offsets(path: str, approx_bytes: int) -> list[int]:
    """Byte offsets that cut an uncompressed file into line-aligned ranges of about ``approx_bytes``.

    Returns ``[0, ..., size]`` (just ``[0, size]`` for a small file).
    """
    size = os.path.getsize(path)
    offsets = [0]
    with open(path, "rb") as f:
        target = approx_bytes
        while target < size:
            f.seek(target)
            tail = f.read(1 << 16)
            while tail and b"\n" not in tail:
                more = f.read(1 << 16)
                if not more:
                    break
                tail += more
            k = tail.find(b"\n")
            if k < 0:
                break
            cut = target + k + 1
            if cut >= size:
                break
            offsets.append(cut)
            target = cut + approx_bytes
    offsets.append(size)
    return offsets
