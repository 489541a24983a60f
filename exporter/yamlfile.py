"""Reads a YAML settings file (the config, the web config) so that no file can cost more than a small one:
its size, its nesting and the size of what its aliases expand to are limited, long numbers are refused before
they are converted, and every failure is one short line (YamlFileError) instead of a traceback.

An alias (`*name`) is kept, since configs use it to share a block, but the document it builds is counted as
written out in full: a "billion laughs" file of a few hundred bytes is refused as soon as it is composed, before
anything is built from it or printed."""

from __future__ import annotations

from typing import Any

MAX_BYTES = 1 << 20  # a config is a few KiB; beyond this it is not one
MAX_DEPTH = 64  # mappings and lists within each other
MAX_NODES = 100_000  # scalars, lists and mappings in the document with every alias expanded
MAX_NUMBER_CHARS = 40  # digits of an integer (or a float) as written; range checks come later, in the parser
MAX_MESSAGE_CHARS = 300  # of a YAML error's description


class YamlFileError(ValueError):
    """One line that says what is wrong with the file and where."""


def read_yaml(path: str, what: str) -> Any:
    """The document in `path` (None when it is empty); `what` names the file in errors ("config", "web config")."""
    import yaml  # only to read a settings file: commands without one start sooner

    where = f"{what} {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise YamlFileError(f"cannot read {where}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise YamlFileError(f"{where} is larger than {MAX_BYTES >> 10} KiB; is it the right file?")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise YamlFileError(f"{where} is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}") from None
    loader = None
    try:
        loader = _loader_class()(text)  # it checks every character at once
        node = loader.get_single_node()
        if node is None:
            return None
        _count(node, {}, set())
        return loader.construct_document(node)
    except _Refused as e:
        raise YamlFileError(f"{where} is refused{_at(e.mark)}: {e}") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise YamlFileError(f"{where} is not valid YAML at line {line}: character #x{e.character:04x} is not "
                            f"allowed") from None
    except yaml.YAMLError as e:
        problem = str(getattr(e, "problem", None) or "syntax error")
        raise YamlFileError(f"{where} is not valid YAML{_at(getattr(e, 'problem_mark', None))}: "
                            f"{_short(problem)}") from None
    except RecursionError:  # a safety net: MAX_DEPTH stops nesting long before Python's own limit
        raise YamlFileError(f"{where} is refused: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


class _Refused(Exception):
    def __init__(self, message: str, mark: Any = None) -> None:
        super().__init__(message)
        self.mark = mark


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def _count(node: Any, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """The number of nodes under `node` with aliases expanded (each distinct node counted once, then reused)."""
    import yaml

    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise _Refused("an alias refers to a block that contains it", node.start_mark)
    total = 1
    if isinstance(node, yaml.SequenceNode | yaml.MappingNode):
        open_nodes.add(key)
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        for child in children:
            total += _count(child, sizes, open_nodes)
            if total > MAX_NODES:
                raise _Refused(f"its aliases expand to more than {MAX_NODES:,} values", node.start_mark)
        open_nodes.discard(key)
    sizes[key] = total
    return total


_LOADER: type | None = None


def _loader_class() -> type:
    """yaml.SafeLoader that refuses deep nesting and long numbers (built once, on first use)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_yaml_int(self, node: Any) -> int:
            _short_number(node)
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: Any) -> float:
            _short_number(node)
            return super().construct_yaml_float(node)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
    _LOADER = BoundedLoader
    return _LOADER


def _short_number(node: Any) -> None:
    if len(node.value) > MAX_NUMBER_CHARS:
        raise _Refused(f"a number of {len(node.value):,} characters (at most {MAX_NUMBER_CHARS})", node.start_mark)
