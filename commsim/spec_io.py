"""Spec files in: YAML read safely and validated as a spec, pydantic's errors turned into one
SpecError naming the file, the field and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from commsim.files import read_text
from commsim.spec_base import Spec
from commsim.specs import SpecError

UNION_TAGS = {"str", "int", "float", "bool"}  # pydantic names a union's branch in `loc`


def _field_path(loc: tuple[Any, ...]) -> str:
    """A dotted field path without the union branch names pydantic puts in it (`str`,
    `ClusterSpec`): field names are lower case."""
    parts = [str(p) for p in loc if not (str(p) in UNION_TAGS or str(p)[:1].isupper())]
    return ".".join(parts) or "(top level)"


def _main_errors(errors: list[Any]) -> list[Any]:
    """One error per field: of a union field (a name or an inline spec), the branch that got
    furthest into the input, e.g. the inline cluster's bad field, not "not a string"."""
    best: dict[Any, Any] = {}
    for err in errors:
        key = err["loc"][:1]
        if key not in best or len(err["loc"]) > len(best[key]["loc"]):
            best[key] = err
    return list(best.values())


def parse_spec(cls: type[Spec], data: Any, source: str, units: bool = True) -> Any:
    """Validate plain data as `cls`, turning pydantic's errors into one SpecError. With
    `units` (input a person wrote) a size, rate or time must say its unit; without (data
    already in SI, as Python code or a dumped spec gives it) a number is taken as SI."""
    if not isinstance(data, dict):
        raise SpecError(source, "", f"expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data, context={"units": units})
    except ValidationError as e:
        errors = _main_errors(e.errors())
        err = errors[0]
        msg = err["msg"].removeprefix("Value error, ")
        extra = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SpecError(source, _field_path(err["loc"]), msg + extra) from None


class _UniqueKeys(yaml.SafeLoader):
    """yaml.safe_load's loader that refuses a key given twice in one mapping (YAML 1.2
    requires keys to be unique; PyYAML keeps the last silently, so `tp: 2` above a
    forgotten `tp: 1` would not run). Keys a merge (`<<: *job`) brings may be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicated key {key!r} (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """Safely load a YAML file (the safe loader, duplicated keys refused); a missing file or
    bad YAML becomes a SpecError."""
    text = read_text(path)
    try:
        return yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: safe_load with unique keys
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise SpecError(str(path), where, f"invalid YAML: {getattr(e, 'problem', e)}") from None


def load_spec(cls: type[Spec], path: str | Path) -> Any:
    """Read and validate one YAML spec file; a GPU file a cluster file names (node.gpu) by a
    relative path is found beside the cluster file when it is there."""
    data = read_yaml(path)
    node = data.get("node") if isinstance(data, dict) else None
    gpu = node.get("gpu") if isinstance(node, dict) else None
    if (
        isinstance(gpu, str)
        and Path(gpu).suffix in (".yaml", ".yml")
        and not Path(gpu).is_absolute()
    ):
        beside = (Path(path).parent / gpu).resolve()
        if beside.exists():
            node["gpu"] = str(beside)
    return parse_spec(cls, data, str(path))
