"""Plain built-in data on the wire between the sandboxed program and the trusted checker.

Standard library only, no relaxspec import: the sandboxed interpreter runs this file's source
(ahead of ``harness.py``) and cannot import the package. One value is one line of ASCII JSON,
with the Python types JSON lacks tagged so that a tuple stays a tuple and ``1`` stays an int::

    None, True, False, "str"      as themselves
    ["i", "0x2a"]                 int (hexadecimal: no limit on digits)
    ["f", "0x1.8p+1"]             float (float.hex: nan, inf and -0.0 survive)
    ["c", re, im]                 complex, both parts as float.hex
    ["b", "6869"]                 bytes, hexadecimal
    ["l", ...] ["t", ...] ["s", ...] ["F", ...]   list, tuple, set, frozenset
    ["d", [k, v], ...]            dict

Only these exact types are encoded (a subclass, whatever its ``__eq__`` says, is refused), and
decoding builds only these types, so whatever the sandboxed side sends, the checker compares
built-in values. :func:`codec` returns the pair with every builtin it needs captured in closure
cells, so a program that monkeypatches ``builtins`` cannot break an honest reply.
"""

MAX_LINE = 16 << 20  # bytes of one encoded value
MAX_ITEMS = 1_000_000  # scalars and containers in one value
MAX_DEPTH = 100  # nesting of containers


def codec():
    """``(encode, decode)``: ``encode(value) -> str`` (one line), ``decode(str) -> value``.

    Both raise ``TypeError`` (a type that is not plain data, or a malformed line) or
    ``ValueError`` (too large, too deep).
    """
    _type, _int, _float, _str, _bytes, _complex, _bool = type, int, float, str, bytes, complex, bool
    _list, _tuple, _set, _frozenset, _dict, _NoneType = list, tuple, set, frozenset, dict, type(None)
    _len, _int_hex, _hex, _fromhex = len, hex, float.hex, float.fromhex
    _bytes_hex, _bytes_fromhex = bytes.hex, bytes.fromhex
    _TypeError, _ValueError, _RecursionError, _dict_items = TypeError, ValueError, RecursionError, dict.items
    _max_line, _max_items, _max_depth = MAX_LINE, MAX_ITEMS, MAX_DEPTH
    import json

    try:  # the C scanner and encoder: unlike json.loads / dumps, no global lookups
        _scan = json.decoder.JSONDecoder().scan_once
        _chunks = json.encoder.c_make_encoder(
            None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
        )
    except (AttributeError, TypeError):
        _scan = _chunks = None
    _dumps, _loads, _join, _StopIteration = json.dumps, json.loads, str.join, StopIteration

    def dumps(tree):
        if _chunks is None:
            return _dumps(tree, ensure_ascii=True, separators=(",", ":"))
        return _join("", _chunks(tree, 0))

    def loads(line):
        if _scan is None:
            return _loads(line)
        try:
            node, end = _scan(line, 0)
        except _StopIteration:
            raise _ValueError("sandbox: a malformed value") from None
        if end != _len(line):
            raise _ValueError("sandbox: a malformed value")
        return node

    tags = {_list: "l", _tuple: "t", _set: "s", _frozenset: "F"}
    makers = {"l": _list, "t": _tuple, "s": _set, "F": _frozenset}

    def tree(value, depth, count):
        # the JSON-ready tree of ``value``; count[0] bounds the work on a huge or cyclic value
        count[0] += 1
        if depth > _max_depth or count[0] > _max_items:
            raise _ValueError("sandbox: the value is too large or too deep")
        t = _type(value)
        if t is _str or t is _bool or t is _NoneType:
            return value
        if t is _int:
            return ["i", _int_hex(value)]
        if t is _float:
            return ["f", _hex(value)]
        if t is _complex:
            return ["c", _hex(value.real), _hex(value.imag)]
        if t is _bytes:
            return ["b", _bytes_hex(value)]
        tag = tags.get(t)
        if tag is not None:
            return [tag, *[tree(x, depth + 1, count) for x in value]]
        if t is _dict:
            pairs = _dict_items(value)
            return ["d", *[[tree(k, depth + 1, count), tree(v, depth + 1, count)] for k, v in pairs]]
        raise _TypeError(
            "sandbox: not plain built-in data (int, float, str, bytes, list, tuple, dict, set, ...): "
            + _str(t.__name__)
        )

    def build(node, depth):
        t = _type(node)
        if t is _str or t is _bool or t is _NoneType:
            return node
        if t is not _list or not node or _type(node[0]) is not _str or depth > _max_depth:
            raise _TypeError("sandbox: a malformed value")
        tag, rest = node[0], node[1:]
        if tag == "i" and _len(rest) == 1 and _type(rest[0]) is _str:
            return _int(rest[0], 16)
        if tag == "f" and _len(rest) == 1 and _type(rest[0]) is _str:
            return _fromhex(rest[0])
        if tag == "c" and _len(rest) == 2 and _type(rest[0]) is _str and _type(rest[1]) is _str:
            return _complex(_fromhex(rest[0]), _fromhex(rest[1]))
        if tag == "b" and _len(rest) == 1 and _type(rest[0]) is _str:
            return _bytes_fromhex(rest[0])
        make = makers.get(tag)
        if make is not None:
            return make([build(x, depth + 1) for x in rest])
        if tag == "d":
            out = {}
            for pair in rest:
                if _type(pair) is not _list or _len(pair) != 2:
                    raise _TypeError("sandbox: a malformed value")
                out[build(pair[0], depth + 1)] = build(pair[1], depth + 1)
            return out
        raise _TypeError("sandbox: a malformed value")

    def encode(value):
        line = dumps(tree(value, 0, [0]))
        if _len(line) > _max_line:
            raise _ValueError("sandbox: the value is too large")
        return line

    def decode(line):
        if _type(line) is not _str or _len(line) > _max_line:
            raise _ValueError("sandbox: the value is too large")
        try:
            node = loads(line)
        except (_ValueError, _RecursionError) as err:
            raise _TypeError("sandbox: a malformed value") from err
        return build(node, 0)

    return encode, decode
