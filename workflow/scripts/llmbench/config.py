"""Loading and validating YAML files against the JSON schemas in workflow/schemas/.

Every error is a ConfigError whose message names the file, the key path (e.g.
``pretrain[0].batch_sizes[1]``) and, where there is a closed set, the allowed values.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

#: The repository root (…/workflow/scripts/llmbench/config.py -> four levels up).
REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEMA_DIR = REPO_ROOT / "workflow" / "schemas"


class ConfigError(ValueError):
    """Bad user input: a malformed file, an unknown key or value, a contradiction."""


def key_path(parts: Any) -> str:
    """Render a jsonschema path deque as ``a.b[0].c``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


#: PyYAML's safe loader, in C where PyYAML was built with libyaml (about 8x faster: every
#: process that reads a config, a platform or a model file parses the 27 kB config schema)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(stream: Any) -> Any:
    """yaml.safe_load with SAFE_LOADER."""
    return yaml.load(stream, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader


def load_yaml(path: Path) -> Any:
    """Parse one YAML file; a syntax error becomes a ConfigError naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_yaml(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save it as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None


@functools.cache
def _schema(name: str) -> dict[str, Any]:
    """workflow/schemas/<name>.schema.yaml, parsed once per process (do not modify it)."""
    return load_yaml(SCHEMA_DIR / f"{name}.schema.yaml")


@functools.cache
def _validator(name: str):
    """The validator of workflow/schemas/<name>.schema.yaml, parsed once per process (the
    paper grid validates ~600 platform and model files against two schemas)."""
    return _Validator(_schema(name))


def schema_properties(pointer: str, schema: str = "config") -> dict[str, dict[str, Any]]:
    """The property entries of the object at ``pointer`` in a schema: a JSON pointer such
    as ``/$defs/load``, or ``""`` for the top level."""
    node = _schema(schema)
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node["properties"]


def schema_defaults(pointer: str, schema: str = "config") -> dict[str, Any]:
    """Key -> default of the properties at ``pointer`` that have one. The schema is the one
    place a default is written: the dataclasses built from these keys (Protocol, LoadSpec,
    BusyPolicy) take theirs from here, so a run through Snakemake (which fills the schema's
    defaults in) and a direct call get the same values."""
    return {k: copy.deepcopy(v["default"]) for k, v in schema_properties(pointer, schema).items() if "default" in v}


@functools.cache
def _bounds_validator(pointer: str, keys: tuple[str, ...], schema: str):
    props = schema_properties(pointer, schema)
    return jsonschema.Draft202012Validator({"$defs": _schema(schema).get("$defs", {}), "type": "object",
                                            "properties": {k: props[k] for k in keys}})


def check_schema(values: dict[str, Any], pointer: str, prefix: str, schema: str = "config") -> None:
    """Raise ValueError naming ``prefix`` + the key for the first of ``values`` the schema's
    entry at ``pointer`` rejects (type, enum, bounds): a dataclass made without the
    workflow's validation accepts exactly what a config may say."""
    keys = tuple(sorted(k for k in values if k in schema_properties(pointer, schema)))
    for err in _bounds_validator(pointer, keys, schema).iter_errors({k: values[k] for k in keys}):
        raise ValueError(prefix + _describe(err))


def _with_defaults(validator_cls):
    """A validator class that also fills in schema defaults (for objects that exist)."""
    validate_props = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _describe(err: jsonschema.ValidationError) -> str:
    """One readable line for a schema violation, naming the key."""
    where = key_path(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return f"{where}: unknown key(s) {', '.join(map(repr, extra))}; allowed keys: {', '.join(allowed)}"
    if err.validator == "enum":
        return f"{where}: {err.instance!r} is not allowed; allowed values: {', '.join(map(repr, err.validator_value))}"
    if err.validator == "const":  # a value another key rules out (if/then): the schema says why
        why = err.schema.get("description")
        return f"{where}: must be {err.validator_value!r} here" + (f": {why}" if why else "")
    if err.validator in ("oneOf", "anyOf") and err.context:
        # the branch of the right type, and within it the deepest error
        same_type = [e for e in err.context if e.validator != "type" or len(e.relative_path) > 0]
        best = max(same_type or err.context, key=lambda e: len(e.absolute_path))
        return _describe(best)
    return f"{where}: {err.message}"


def validate(instance: Any, schema_name: str, source: str) -> Any:
    """Validate (and fill defaults into) ``instance``; raise ConfigError listing every problem."""
    errors = sorted(_validator(schema_name).iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors)
        raise ConfigError(f"{source}: invalid {schema_name} config:\n  {lines}")
    return instance


def load_named(kind: str, name: str, root: Path = REPO_ROOT) -> dict:
    """Load config/<kind>s/<name>.yaml (kind: platform | model), validated."""
    folder = root / "config" / f"{kind}s"
    path = folder / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown {kind} {name!r}; allowed: {', '.join(available(kind, root))}")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping, got {type(data).__name__}")
    validate(data, kind, str(path))
    if data["name"] != name:
        raise ConfigError(f"{path}: name {data['name']!r} must equal the file name {name!r}")
    return data


def available(kind: str, root: Path = REPO_ROOT) -> list[str]:
    """Names of the platform or model files that exist."""
    return sorted(p.stem for p in (root / "config" / f"{kind}s").glob("*.yaml"))
