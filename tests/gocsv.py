"""Go's ``encoding/csv`` reader as dcgm-exporter configures it, so the counters file is checked
by the rules its real consumer applies (``internal/pkg/counters/counter_config.go``:
``csv.NewReader`` with ``Comment = '#'``, ``ReadAll``, then 3 fields per record after trimming
spaces). Python's ``csv`` module is laxer (bare quotes, ragged rows), hence this reader.

Rules implemented, from the Go documentation of ``encoding/csv``: ``\\r\\n`` is ``\\n``; empty
lines and lines starting with the comment rune are skipped; a field starting with ``"`` is quoted,
may hold commas, newlines and ``""`` for a quote, and its closing quote must be followed by a
comma or the end of the line; a ``"`` anywhere in an unquoted field is an error
(``LazyQuotes`` is off); every record must have as many fields as the first
(``FieldsPerRecord`` 0).
"""

from __future__ import annotations


class CsvError(ValueError):
    """A parse error, worded as Go reports it (``record on line N: ...``)."""


def _record(text: str, pos: int, line: int) -> tuple[list[str], int, int]:
    """One record starting at ``pos``; returns fields, the next position and line number."""
    fields: list[str] = []
    start_line = line
    while True:
        if pos < len(text) and text[pos] == '"':
            pos += 1
            value = []
            while True:
                if pos >= len(text):
                    raise CsvError(f"record on line {start_line}; parse error on line {line}: "
                                   'extraneous or missing " in quoted-field')
                ch = text[pos]
                if ch == '"':
                    if text[pos + 1:pos + 2] == '"':
                        value.append('"')
                        pos += 2
                        continue
                    pos += 1
                    if pos < len(text) and text[pos] not in ",\n":
                        raise CsvError(f"record on line {start_line}; parse error on line "
                                       f'{line}: extraneous or missing " in quoted-field')
                    break
                if ch == "\n":
                    line += 1
                value.append(ch)
                pos += 1
            fields.append("".join(value))
        else:
            end = pos
            while end < len(text) and text[end] not in ",\n":
                end += 1
            value_text = text[pos:end]
            if '"' in value_text:
                raise CsvError(f"record on line {start_line}; parse error on line {line}: "
                               'bare " in non-quoted-field')
            fields.append(value_text)
            pos = end
        if pos >= len(text) or text[pos] == "\n":
            return fields, pos + 1, line + 1
        pos += 1  # the comma


def read_all(text: str, comment: str = "#") -> list[list[str]]:
    """All records of ``text``; raises CsvError like Go's ``Reader.ReadAll``."""
    text = text.replace("\r\n", "\n")
    records: list[list[str]] = []
    pos, line = 0, 1
    while pos < len(text):
        if text[pos] == "\n":
            pos, line = pos + 1, line + 1
            continue
        if text[pos] == comment:
            end = text.find("\n", pos)
            pos, line = (len(text) if end < 0 else end + 1), line + 1
            continue
        first_line = line
        fields, pos, line = _record(text, pos, line)
        if records and len(fields) != len(records[0]):
            raise CsvError(f"record on line {first_line}: wrong number of fields")
        records.append(fields)
    return records


def dcgm_counters(text: str) -> list[tuple[str, str, str]]:
    """The (field, type, help) records dcgm-exporter takes from a counters file, or CsvError /
    ValueError where it would exit."""
    out = []
    for i, record in enumerate(read_all(text)):
        fields = [f.strip(" ") for f in record]
        if len(fields) != 3:
            raise ValueError(f"malformed CSV record {i}: expected 3 fields, got {len(fields)}")
        out.append((fields[0], fields[1], fields[2]))
    return out
