"""JSON <-> dataclass conversion driven by the dataclasses' own type hints.

One generic codec instead of a hand-written ``from_json`` per model, so the model definitions
are the single statement of what the SDK reads and writes: the OpenAPI drift test reads the
same hints. JSON names are the camelCase of the attribute unless ``json_name`` says otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import sys
import typing
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, TypeVar, Union

from .errors import ProtocolError

T = TypeVar("T")


class Unset:
    """The type of :data:`UNSET`: "leave this field out of the request"."""

    _instance: Optional["Unset"] = None

    def __new__(cls) -> "Unset":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


#: A request field left at UNSET is not sent; ``None`` is sent as JSON ``null``.
UNSET = Unset()

_NONE_TYPE = type(None)


def json_name(name: str) -> Dict[str, Any]:
    """Field metadata naming the JSON key when camelCase of the attribute is not it."""
    return {"json": name}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def key_of(f: "dataclasses.Field[Any]") -> str:
    """The JSON key of a dataclass field."""
    return str(f.metadata.get("json") or _camel(f.name))


def wire_fields(cls: type) -> List["dataclasses.Field[Any]"]:
    """The fields that travel on the wire (not ``raw``, not fields marked ``local``)."""
    return [
        f
        for f in dataclasses.fields(cls)
        if f.name != "raw" and not f.metadata.get("local")
    ]


_HINTS: Dict[type, Dict[str, Any]] = {}


def hints(cls: type) -> Dict[str, Any]:
    """The evaluated type hints of a model (cached)."""
    h = _HINTS.get(cls)
    if h is None:
        module = sys.modules[cls.__module__]
        h = typing.get_type_hints(cls, vars(module))
        _HINTS[cls] = h
    return h


_FRACTION = re.compile(r"\.(\d+)")


def parse_datetime(value: str) -> _dt.datetime:
    """RFC 3339 as the server writes it (nanoseconds, ``Z``), on every Python >= 3.9."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    text = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    try:
        return _dt.datetime.fromisoformat(text)
    except ValueError as e:
        raise ProtocolError(f"not an RFC 3339 time: {value!r}") from e


def format_datetime(value: _dt.datetime) -> str:
    """RFC 3339 with an offset (a naive time is taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.isoformat().replace("+00:00", "Z")


def _convert(tp: Any, value: Any, where: str) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is Union:
        args = typing.get_args(tp)
        if value is None:
            if _NONE_TYPE in args:
                return None
            raise ProtocolError(f"{where}: null where a value is required")
        rest = [a for a in args if a is not _NONE_TYPE and a is not Unset]
        if len(rest) == 1:
            return _convert(rest[0], value, where)
        errors = []
        for a in rest:
            try:
                return _convert(a, value, where)
            except ProtocolError as e:
                errors.append(str(e))
        raise ProtocolError(f"{where}: no alternative matched ({'; '.join(errors)})")
    if origin is typing.Literal:
        # Enumerations are open on the wire (a newer server may add a status): pass through.
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {type(value).__name__}")
        return value
    if origin in (list, List):
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected an array, got {type(value).__name__}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        _, vt = typing.get_args(tp) or (str, Any)
        return {str(k): _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if value is None:
        raise ProtocolError(f"{where}: null where a value is required")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        return decode(tp, value, where)
    if tp is _dt.datetime:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a time string")
        return parse_datetime(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where}: expected a number, got {type(value).__name__}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer, got {type(value).__name__}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    return value


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) is Union and _NONE_TYPE in typing.get_args(tp)


def decode(
    cls: Type[T],
    data: Mapping[str, Any],
    where: str = "",
    local: Optional[Mapping[str, Any]] = None,
) -> T:
    """A model from a JSON object. Unknown keys are kept in ``raw``; an absent key is ``None``
    for an optional field and a :class:`ProtocolError` for a required one."""
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{where or cls.__name__}: expected an object")
    h = hints(cls)
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "raw":
            kwargs["raw"] = dict(data)
            continue
        if f.metadata.get("local"):
            kwargs[f.name] = (local or {})[f.name]
            continue
        key = key_of(f)
        path = f"{where}.{key}" if where else f"{cls.__name__}.{key}"
        if key in data:
            kwargs[f.name] = _convert(h[f.name], data[key], path)
        elif _optional(h[f.name]):
            kwargs[f.name] = None
        elif f.default is not dataclasses.MISSING:
            kwargs[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs[f.name] = f.default_factory()
        else:
            raise ProtocolError(f"{path}: missing from the server's answer")
    return cls(**kwargs)


def _encode_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode(value)
    if isinstance(value, _dt.datetime):
        return format_datetime(value)
    if isinstance(value, (list, tuple)):
        return [_encode_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode_value(v) for k, v in value.items()}
    return value


def encode(obj: Any) -> Dict[str, Any]:
    """A request body from a model: UNSET fields are left out, ``None`` is ``null`` (or left
    out too when the model says ``omit_none``)."""
    omit_none = bool(getattr(obj, "_omit_none", False))
    out: Dict[str, Any] = {}
    for f in wire_fields(type(obj)):
        value = getattr(obj, f.name)
        if value is UNSET or (value is None and omit_none):
            continue
        out[key_of(f)] = _encode_value(value)
    return out


def query(pairs: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """Query parameters without the unset ones; booleans and numbers as the API spells them;
    a list repeats its parameter once per item, in order."""
    out: List[Tuple[str, str]] = []
    for k, v in pairs.items():
        if v is None or v is UNSET:
            continue
        if isinstance(v, (list, tuple)):
            out.extend((k, str(item)) for item in v)
        elif isinstance(v, bool):
            out.append((k, "true" if v else "false"))
        elif isinstance(v, _dt.datetime):
            out.append((k, format_datetime(v)))
        else:
            out.append((k, str(v)))
    return out
