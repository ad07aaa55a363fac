"""An OpenAPI v2 document as the protobuf kubectl asks for (`application/com.github.proto-openapi.spec.v2@v1.0
+protobuf`): gnostic's `openapi.v2.Document` (google/gnostic openapiv2/OpenAPIv2.proto), encoded by hand for the
parts the emulator's documents use. Values the proto keeps as YAML text (vendor extensions, enums, defaults) are
YAML, as gnostic writes them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import yaml

# ---------------------------------------------------------------- wire format
_VARINT, _I64, _LEN = 0, 1, 2


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num: int, wire: int) -> bytes:
    return _varint((num << 3) | wire)


def _bytes(num: int, data: bytes) -> bytes:
    return _key(num, _LEN) + _varint(len(data)) + data


def _str(num: int, s: str | None) -> bytes:
    return _bytes(num, s.encode()) if s else b""


def _bool(num: int, v: Any) -> bytes:
    return _key(num, _VARINT) + b"\x01" if v else b""


def _int(num: int, v: Any) -> bytes:
    return _key(num, _VARINT) + _varint(int(v)) if v is not None else b""


def _double(num: int, v: Any) -> bytes:
    return _key(num, _I64) + struct.pack("<d", float(v)) if v is not None else b""


def _msgs(num: int, parts: Iterable[bytes]) -> bytes:
    return b"".join(_bytes(num, p) for p in parts)


# ---------------------------------------------------------------- messages
def _any(value: Any) -> bytes:  # Any { yaml = 2 }
    return _str(2, yaml.safe_dump(value, default_flow_style=False, sort_keys=False).rstrip("\n").removesuffix("\n..."))


def _named_any(name: str, value: Any) -> bytes:
    return _str(1, name) + _bytes(2, _any(value))


def _extensions(num: int, d: dict) -> bytes:
    return b"".join(_bytes(num, _named_any(k, v)) for k, v in d.items() if k.startswith("x-"))


def schema(s: dict) -> bytes:
    out = [_str(1, s.get("$ref")), _str(2, s.get("format")), _str(3, s.get("title")), _str(4, s.get("description"))]
    if "default" in s:
        out.append(_bytes(5, _any(s["default"])))
    out += [
        _double(6, s.get("multipleOf")),
        _double(7, s.get("maximum")),
        _bool(8, s.get("exclusiveMaximum")),
        _double(9, s.get("minimum")),
        _bool(10, s.get("exclusiveMinimum")),
        _int(11, s.get("maxLength")),
        _int(12, s.get("minLength")),
        _str(13, s.get("pattern")),
        _int(14, s.get("maxItems")),
        _int(15, s.get("minItems")),
        _bool(16, s.get("uniqueItems")),
        _int(17, s.get("maxProperties")),
        _int(18, s.get("minProperties")),
    ]
    out += [_str(19, r) for r in s.get("required") or []]
    out += [_bytes(20, _any(e)) for e in s.get("enum") or []]
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        out.append(_bytes(21, _bytes(1, schema(extra))))
    elif isinstance(extra, bool):
        out.append(_bytes(21, _key(2, _VARINT) + (b"\x01" if extra else b"\x00")))
    if s.get("type"):
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        out.append(_bytes(22, b"".join(_str(1, t) for t in types)))
    if isinstance(s.get("items"), dict):
        out.append(_bytes(23, _bytes(1, schema(s["items"]))))
    out += [_bytes(24, schema(a)) for a in s.get("allOf") or []]
    if isinstance(s.get("properties"), dict):
        out.append(_bytes(25, _msgs(1, (_str(1, k) + _bytes(2, schema(v)) for k, v in s["properties"].items()))))
    out.append(_bool(27, s.get("readOnly")))
    out.append(_extensions(31, s))
    return b"".join(out)


def _parameter(p: dict) -> bytes:  # ParametersItem { Parameter parameter = 1 }
    if p.get("in") == "body":
        body = (
            _str(1, p.get("description"))
            + _str(2, p.get("name"))
            + _str(3, "body")
            + _bool(4, p.get("required"))
            + _bytes(5, schema(p.get("schema") or {}))
        )
        param = _bytes(1, body)
    else:
        common = (
            _bool(1, p.get("required")) + _str(2, p.get("in")) + _str(3, p.get("description")) + _str(4, p.get("name"))
        )
        if p.get("in") == "path":  # PathParameterSubSchema: type = 5, unique_items = 19
            sub = common + _str(5, p.get("type")) + _bool(19, p.get("uniqueItems"))
            param = _bytes(2, _bytes(4, sub))
        else:  # QueryParameterSubSchema: type = 6, unique_items = 20
            sub = common + _str(6, p.get("type")) + _bool(20, p.get("uniqueItems"))
            param = _bytes(2, _bytes(3, sub))
    return _bytes(1, param)


def _response(r: dict) -> bytes:  # ResponseValue { Response response = 1 }
    resp = _str(1, r.get("description"))
    if isinstance(r.get("schema"), dict):
        resp += _bytes(2, _bytes(1, schema(r["schema"])))
    return _bytes(1, resp)


def _operation(op: dict) -> bytes:
    out = [_str(1, t) for t in op.get("tags") or []]
    out += [_str(3, op.get("description")), _str(5, op.get("operationId"))]
    out += [_str(6, m) for m in op.get("produces") or []]
    out += [_str(7, m) for m in op.get("consumes") or []]
    out += [_bytes(8, _parameter(p)) for p in op.get("parameters") or []]
    codes = op.get("responses") or {}
    out.append(_bytes(9, _msgs(1, (_str(1, c) + _bytes(2, _response(r)) for c, r in codes.items()))))
    out += [_str(10, s) for s in op.get("schemes") or []]
    out.append(_extensions(13, op))
    return b"".join(out)


_VERBS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def _path_item(item: dict) -> bytes:
    out = [_bytes(n, _operation(item[v])) for v, n in _VERBS.items() if isinstance(item.get(v), dict)]
    out += [_bytes(9, _parameter(p)) for p in item.get("parameters") or []]
    out.append(_extensions(10, item))
    return b"".join(out)


def document(doc: dict) -> bytes:
    info = doc.get("info") or {}
    out = [_str(1, doc.get("swagger", "2.0")), _bytes(2, _str(1, info.get("title")) + _str(2, info.get("version")))]
    paths = doc.get("paths") or {}
    out.append(_bytes(8, _msgs(2, (_str(1, p) + _bytes(2, _path_item(i)) for p, i in paths.items()))))
    defs = doc.get("definitions") or {}
    out.append(_bytes(9, _msgs(1, (_str(1, n) + _bytes(2, schema(s)) for n, s in defs.items()))))
    return b"".join(out)
