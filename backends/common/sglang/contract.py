"""SGLang's HTTP API as the pinned wheel's source states it, and checks of our code against it.

SGLang cannot be installed here (CUDA wheels, hundreds of MB of dependencies), yet
our client (api.py) and our SGLang-shaped engine (backends/common/engine/) must speak its
API exactly: a misspelt field is not refused by SGLang, it is ignored (msgspec and
its dataclasses drop unknown keys) and the default applies, which only shows as a
wrong result on a GPU cluster. So the pinned wheel is downloaded (``ensure_wheel``)
and two files are read from it as text with ``ast``, never imported:

- ``http_server.py``: the routes (FastAPI decorators on each handler) with their
  methods and the request type the handler's body parameter is annotated with;
- ``io_struct.py``: each request type's fields (its own annotated fields and those of
  its bases in the same module) and whether each has a default.

The ``check_*`` functions answer a list of problems, one line each naming the route
and the field as our code spells it; an empty list is a pass.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from backends.common.sglang.api import (
    DRAFT_FIELDS,
    MILES_SENDS,
    OMIT,
    REQUESTS,
    TESTBED_PREFIX,
    SGLangRequest,
    fields_of,
    sent_by_default,
)

SGLANG_VERSION: Final = "0.5.23"
"""The SGLang release our client and engine are held to (pyproject's gpu extra runs it)."""

HTTP_SERVER: Final = "sglang/srt/entrypoints/http_server.py"
IO_STRUCT: Final = "sglang/srt/managers/io_struct.py"
SERVER_ARGS: Final = "sglang/srt/server_args.py"
SERVER_ARG_FIELDS: Final = "sglang/srt/arg_groups/fields/"

_VERBS: Final = frozenset({"get", "post", "put", "delete", "patch", "head", "options"})
_NOT_A_BODY: Final = frozenset(
    {"Request", "Response", "WebSocket", "BackgroundTasks", "str", "int", "float", "bool", "Any"}
)
"""Annotations of handler parameters that are not the parsed request body."""
_PARAM_SOURCES: Final = frozenset({"Query", "Path", "Header", "Cookie", "Depends", "File", "Form"})
"""FastAPI markers of a parameter read from somewhere other than the JSON body."""


@dataclass(frozen=True)
class Route:
    """One path SGLang serves: the methods it takes, and the type its body parses into
    (None when the handler reads no body)."""

    methods: frozenset[str]
    request_type: str | None


@dataclass(frozen=True)
class SGLangAPI:
    """``routes``: path -> Route; ``types``: request type -> {field: has a default}."""

    routes: Mapping[str, Route]
    types: Mapping[str, Mapping[str, bool]]


# -- reading the source ------------------------------------------------------------------


def _name(node: ast.expr | None) -> str | None:
    """The last name of ``X`` or ``mod.X``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _call_name(node: ast.expr | None) -> str | None:
    return _name(node.func) if isinstance(node, ast.Call) else None


def _literal_path(node: ast.expr | None) -> str | None:
    """A route's path: a string literal, or the default of ``os.environ.get(NAME, "/x")``
    (SGLang lets a few routes be renamed by environment; the default is what it serves)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if _call_name(node) in {"get", "getenv"} and isinstance(node, ast.Call) and len(node.args) > 1:
        return _literal_path(node.args[1])
    return None


def _body_type(annotation: ast.expr | None) -> str | None:
    """The type a parameter's annotation names: X from ``X``, ``"X"``, ``Optional[X]``,
    ``X | None``, ``Union[X, None]`` or ``Annotated[X, Body()]``; None for a query, path
    or header parameter (``Annotated[int, Query()]``) or anything unresolvable."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            return _body_type(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        parts = [annotation.left, annotation.right]
        kept = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        return _body_type(kept[0]) if len(kept) == 1 else None
    if isinstance(annotation, ast.Subscript):
        outer = _name(annotation.value)
        inner = annotation.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if outer == "Annotated":
            if any(_call_name(marker) in _PARAM_SOURCES for marker in items[1:]):
                return None
            return _body_type(items[0])
        if outer == "Optional":
            return _body_type(items[0])
        if outer == "Union":
            kept = [i for i in items if not (isinstance(i, ast.Constant) and i.value is None)]
            return _body_type(kept[0]) if len(kept) == 1 else None
        return None
    name = _name(annotation)
    return None if name is None or name in _NOT_A_BODY else name


def _request_type(handler: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The type of the handler's first parameter that FastAPI fills from the JSON body."""
    args = handler.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += args.defaults
    params = [
        *zip(positional, defaults, strict=True),
        *zip(args.kwonlyargs, args.kw_defaults, strict=True),
    ]
    for param, default in params:
        if _call_name(default) in _PARAM_SOURCES:
            continue
        found = _body_type(param.annotation)
        if found is not None:
            return found
    return None


def _route_decorators(
    handler: ast.FunctionDef | ast.AsyncFunctionDef,
) -> Iterator[tuple[str, frozenset[str]]]:
    """(path, methods) of each ``@app.<verb>(path)`` or ``@app.api_route(path, methods=...)``."""
    for decorator in handler.decorator_list:
        if not (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and _name(decorator.func.value) == "app"
        ):
            continue
        verb = decorator.func.attr
        keywords = {k.arg: k.value for k in decorator.keywords if k.arg is not None}
        path = _literal_path(decorator.args[0] if decorator.args else keywords.get("path"))
        if path is None:
            continue
        if verb in _VERBS:
            yield path, frozenset({verb.upper()})
        elif verb == "api_route":
            listed = keywords.get("methods")
            if isinstance(listed, ast.List | ast.Tuple | ast.Set):
                methods = frozenset(
                    str(e.value).upper() for e in listed.elts if isinstance(e, ast.Constant)
                )
            else:
                methods = frozenset({"GET"})  # FastAPI's default
            yield path, methods


def parse_routes(http_server_source: str) -> dict[str, Route]:
    """Every route ``app`` declares in http_server.py, conditional ones included (they are
    still SGLang's API). Several handlers on one path merge their methods."""
    routes: dict[str, Route] = {}
    for node in ast.walk(ast.parse(http_server_source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        request_type = None
        for path, methods in _route_decorators(node):
            request_type = request_type or _request_type(node)
            known = routes.get(path)
            if known is not None:
                methods = methods | known.methods
                request_type = known.request_type or request_type
            routes[path] = Route(methods, request_type)
    return routes


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking into ``if`` and ``try`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse):
                yield from _top_level(block)
        else:
            yield stmt


def _has_default(value: ast.expr | None) -> bool:
    """``x: T = v`` has one unless v is ``field(...)`` without default or default_factory."""
    if value is None:
        return False
    if _call_name(value) == "field" and isinstance(value, ast.Call):
        return any(k.arg in {"default", "default_factory"} for k in value.keywords)
    return True


def _own_fields(cls: ast.ClassDef) -> dict[str, bool]:
    fields: dict[str, bool] = {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = stmt.annotation
        outer = _name(annotation.value) if isinstance(annotation, ast.Subscript) else None
        if outer == "ClassVar" or _name(annotation) in {"ClassVar", "KW_ONLY"}:
            continue
        fields[stmt.target.id] = _has_default(stmt.value)
    return fields


def parse_types(io_struct_source: str) -> dict[str, dict[str, bool]]:
    """Each module-level class of io_struct.py (``@dataclass`` or msgspec ``Struct``) ->
    {field: has a default}, fields of its bases in the same module first; and the names a
    module-level ``A = B = Cls`` gives a class."""
    classes: dict[str, ast.ClassDef] = {}
    aliases: dict[str, str] = {}
    for stmt in _top_level(ast.parse(io_struct_source).body):
        if isinstance(stmt, ast.ClassDef):
            classes[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    aliases[target.id] = stmt.value.id

    resolved: dict[str, dict[str, bool]] = {}

    def fields(name: str, seen: frozenset[str]) -> dict[str, bool]:
        if name in resolved:
            return resolved[name]
        merged: dict[str, bool] = {}
        for base in classes[name].bases:
            base_name = _name(base)
            if base_name in classes and base_name not in seen:
                merged.update(fields(base_name, seen | {base_name}))
        merged.update(_own_fields(classes[name]))
        resolved[name] = merged
        return merged

    types = {name: fields(name, frozenset({name})) for name in classes}
    for alias, target in aliases.items():
        if target in types and alias not in types:
            types[alias] = types[target]
    return types


def api_from_sources(http_server_source: str, io_struct_source: str) -> SGLangAPI:
    return SGLangAPI(
        routes=MappingProxyType(parse_routes(http_server_source)),
        types=MappingProxyType(
            {k: MappingProxyType(v) for k, v in parse_types(io_struct_source).items()}
        ),
    )


def read_sglang_api(wheel: Path) -> SGLangAPI:
    """The API of the SGLang wheel at ``wheel``, read from its zip without extracting."""
    with zipfile.ZipFile(wheel) as archive:
        http_server = archive.read(HTTP_SERVER).decode()
        io_struct = archive.read(IO_STRUCT).decode()
    return api_from_sources(http_server, io_struct)


def parse_server_flags(*sources: str) -> frozenset[str]:
    """``launch_server``'s flags: one ``--field-name`` per annotated field of the classes
    its ServerArgs is assembled from (sglang/srt/arg_groups/fields/, from which SGLang
    derives its CLI), plus every ``"--..."`` string literal (flags added by hand)."""
    flags: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        flags.add("--" + item.target.id.replace("_", "-"))
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("--")
                and " " not in node.value
            ):
                flags.add(node.value)
    return frozenset(flags)


def read_server_flags(wheel: Path) -> frozenset[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(SERVER_ARG_FIELDS)]
        names = [n for n in names if n.endswith(".py")] + [SERVER_ARGS]
        return parse_server_flags(*(archive.read(n).decode() for n in names))


def check_launch(flags: frozenset[str], command: Iterable[str]) -> list[str]:
    """Each ``--flag`` of our launch command that ``launch_server`` does not take."""
    return [
        f"launch_server has no {arg}"
        for arg in command
        if arg.startswith("--") and arg not in flags
    ]


# -- getting the wheel ---------------------------------------------------------------------


class WheelUnavailable(RuntimeError):
    """The pinned wheel is neither cached nor downloadable: the contract is unchecked."""


def default_cache() -> Path:
    """``$MILES_TESTBED_CACHE/sglang``, else ``~/.cache/miles-testbed/sglang``."""
    root = os.environ.get("MILES_TESTBED_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "miles-testbed"
    return base / "sglang"


def _cached(cache: Path, version: str) -> Path | None:
    for wheel in sorted(cache.glob(f"sglang-{version}-*.whl")):
        if zipfile.is_zipfile(wheel):
            return wheel
        wheel.unlink()  # a download cut short: fetch it again
    return None


def ensure_wheel(cache: Path | None = None, version: str = SGLANG_VERSION) -> Path:
    """The pinned SGLang wheel, downloaded once into ``cache`` by pip (no dependencies,
    binary only) and reused after. Raises WheelUnavailable with pip's words if it fails:
    CI has network, so a missing wheel is a failure, never a reason to skip."""
    cache = cache if cache is not None else default_cache()
    wheel = _cached(cache, version) if cache.is_dir() else None
    if wheel is not None:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        f"sglang=={version}",
        "-d",
        str(cache),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise WheelUnavailable(f"could not run {' '.join(command)}: {error}") from error
    wheel = _cached(cache, version)
    if done.returncode != 0 or wheel is None:
        said = (done.stderr or done.stdout).strip()[-2000:]
        raise WheelUnavailable(
            f"pip could not download sglang=={version} into {cache} "
            f"(exit {done.returncode}); the SGLang contract needs it:\n{said}"
        )
    return wheel


# -- checks -----------------------------------------------------------------------------------


def _required(fields: Mapping[str, bool]) -> set[str]:
    return {name for name, has_default in fields.items() if not has_default}


def check_client(api: SGLangAPI, requests: Iterable[type[SGLangRequest]] = REQUESTS) -> list[str]:
    """Each way our requests differ from what SGLang parses: a route it does not serve, a
    method it does not take, a class named otherwise than the handler's request type, a
    field its type lacks (silently dropped there), a field it requires that we never send
    or may omit (a 422 there)."""
    problems: list[str] = []
    for request in requests:
        name, path, method = request.__name__, request.ROUTE, request.METHOD
        ours = fields_of(request) - DRAFT_FIELDS.get(path, frozenset())  # beyond the pin
        route = api.routes.get(path)
        if route is None:
            problems.append(f"{path}: SGLang serves no such route ({name})")
            continue
        if method not in route.methods:
            problems.append(f"{path}: SGLang takes {sorted(route.methods)}, {name} sends {method}")
        if route.request_type is None:
            if ours:
                problems.append(
                    f"{path}: SGLang's handler reads no body, {name} sends {sorted(ours)}"
                )
            continue
        if name != route.request_type:
            problems.append(f"{path}: {name} should be named {route.request_type}, as in SGLang")
        theirs = api.types.get(route.request_type)
        if theirs is None:
            problems.append(f"{path}: SGLang's {route.request_type} is not in io_struct.py")
            continue
        for field in sorted(ours - theirs.keys()):
            problems.append(f"{path}: {name}.{field}: SGLang's {route.request_type} has no {field}")
        for field in sorted(_required(theirs) - ours):
            problems.append(
                f"{path}: {name} never sends {field}, which SGLang's {route.request_type} requires"
            )
        omitted = {f.name for f in dataclasses.fields(request) if f.default is OMIT}
        for field in sorted(_required(theirs) & omitted):
            problems.append(
                f"{path}: {name}.{field} defaults to OMIT, "
                f"SGLang's {route.request_type} requires it"
            )
    return problems


def check_miles(
    api: SGLangAPI,
    requests: Iterable[type[SGLangRequest]] = REQUESTS,
    miles_sends: Mapping[str, Iterable[str]] = MILES_SENDS,
) -> list[str]:
    """Each field miles' own client sends on a route that our request for that route lacks,
    or that our request sends by default and miles does not (our client would behave
    differently from miles: a ``load_format`` miles leaves out changes how SGLang
    receives), and each that SGLang's type lacks (MILES_SENDS itself transcribed wrong)."""
    problems: list[str] = []
    by_route = {request.ROUTE: request for request in requests}
    for path, sent in sorted(miles_sends.items()):
        request = by_route.get(path)
        if request is None:
            problems.append(f"{path}: miles sends it, our client has no request for it")
            continue
        for field in sorted(set(sent) - fields_of(request)):
            problems.append(f"{path}: miles sends {field}, {request.__name__} has no {field}")
        for field in sorted(sent_by_default(request) - set(sent)):
            problems.append(f"{path}: {request.__name__} sends {field}, miles does not")
        route = api.routes.get(path)
        theirs = api.types.get(route.request_type or "") if route is not None else None
        if theirs is not None:
            for field in sorted(set(sent) - theirs.keys()):
                problems.append(f"{path}: MILES_SENDS lists {field}, which SGLang does not take")
    return problems


def check_engine_routes(api: SGLangAPI, routes: Iterable[tuple[str, str]]) -> list[str]:
    """Each (method, path) our engine serves that SGLang does not: a client written against
    the engine would break on SGLang. Paths under TESTBED_PREFIX are the testbed's own;
    method "*" (any) is taken to serve what SGLang serves; HEAD is what aiohttp adds for
    each GET, so it is skipped."""
    problems: list[str] = []
    for method, path in routes:
        method = method.upper()
        if method == "HEAD" or path.startswith(TESTBED_PREFIX):
            continue
        route = api.routes.get(path)
        if route is None:
            problems.append(f"{path}: the engine serves it, SGLang does not")
        elif method != "*" and method not in route.methods:
            problems.append(
                f"{path}: the engine serves {method}, SGLang takes {sorted(route.methods)}"
            )
    return problems


def check_engine_fields(api: SGLangAPI, schemas: Mapping[str, Iterable[str]]) -> list[str]:
    """Each body field an engine reads (route -> field names) that SGLang's request type
    for that route lacks: a real client never sends it, so the engine would act on a
    default SGLang does not have."""
    problems: list[str] = []
    for path, fields in sorted(schemas.items()):
        read = sorted(set(fields) - DRAFT_FIELDS.get(path, frozenset()))  # beyond the pin
        route = api.routes.get(path)
        if route is None:
            problems.append(f"{path}: the engine reads a body here, SGLang serves no such route")
            continue
        if route.request_type is None:
            if read:
                problems.append(f"{path}: the engine reads {read}, SGLang's handler reads no body")
            continue
        theirs = api.types.get(route.request_type, {})
        for field in read:
            if field not in theirs:
                problems.append(
                    f"{path}: the engine reads {field}, "
                    f"SGLang's {route.request_type} has no {field}"
                )
    return problems


__all__ = [
    "HTTP_SERVER",
    "IO_STRUCT",
    "SGLANG_VERSION",
    "Route",
    "SGLangAPI",
    "WheelUnavailable",
    "api_from_sources",
    "check_client",
    "check_engine_fields",
    "check_engine_routes",
    "check_miles",
    "default_cache",
    "ensure_wheel",
    "parse_routes",
    "parse_types",
    "read_sglang_api",
]
