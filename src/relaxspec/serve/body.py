"""The request body before any schema: size, JSON, nesting, numbers and Unicode (docs/design.md
§7; docs/server.md "Limits").

:func:`decode_body` turns raw bytes into a JSON object or a 400 that names what is wrong, without
recursion and without converting huge integers; :func:`too_large` is the 413 for a body over the
server's cap.
"""

from __future__ import annotations

import json
from typing import Any

from relaxspec.serve.api_errors import APIError, bad_request

# Limits on what one request may ask for.
MAX_JSON_DEPTH = 32  # nesting of the JSON body (OpenAI bodies need about 5)
MAX_JSON_INT_DIGITS = 64  # digits of an integer in the body (more: 400 before any conversion)
LARGE_BODY_BYTES = 64 * 1024  # bodies above this are parsed LARGE_BODY_PARSES at a time
LARGE_BODY_PARSES = 2


def too_large(cap: int) -> APIError:
    return APIError(
        413, f"the request body exceeds this server's limit of {cap} bytes", code="request_too_large"
    )


class _NumberTooLarge(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > MAX_JSON_INT_DIGITS + 1:  # before int(): no quadratic conversion of 4,000 digits
        raise _NumberTooLarge
    return int(text)


def decode_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; a 400 for anything else: bad JSON, nesting deeper than
    :data:`MAX_JSON_DEPTH`, an integer of more than :data:`MAX_JSON_INT_DIGITS` digits, text (keys
    included) that is not valid Unicode (lone surrogates written as ``\\ud800``)."""
    try:
        body = json.loads(raw, parse_int=_parse_int)
    except _NumberTooLarge:
        raise bad_request(
            f"an integer in the request body has more than {MAX_JSON_INT_DIGITS} digits", code="invalid_value"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON: {err}", code="invalid_json") from None
    except ValueError:  # UnicodeDecodeError (not UTF-8/16/32) and other decoding failures
        raise bad_request("the request body is not valid JSON text", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    _check_tree(body)
    return body


def _too_deep() -> APIError:
    return bad_request(
        f"the request body is nested too deeply (at most {MAX_JSON_DEPTH} levels)", code="invalid_json"
    )


def _check_tree(body: dict[str, Any]) -> None:
    """Depth and Unicode of a decoded body, without recursion (``param``: the dotted path)."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(body, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            for key, value in node.items():
                if not _is_unicode(key):
                    raise _not_unicode(path, "a key in it is not")
                if isinstance(value, dict | list | str):
                    stack.append((value, depth + 1, (*path, key)))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                if isinstance(value, dict | list | str):
                    stack.append((value, depth + 1, (*path, i)))
        elif not _is_unicode(node):
            raise _not_unicode(path, "not")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_unicode(path: tuple[Any, ...], what: str) -> APIError:
    """400 naming the field (``path``, dotted) whose text, or one of whose keys, is not Unicode."""
    where = ".".join(str(p) for p in path) or None
    return bad_request(
        f"{where or 'the body'}: {what} valid Unicode text (a lone surrogate)", where, "invalid_value"
    )
