"""A config as data and as text: the flag of a field, the index of fields by name, a
config as a dict and back (checkpoints and config.toml, any earlier layout upgraded),
and the resolved config in words for a run's banner."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import fields
from typing import Any, get_args, get_origin

from gpt.core.config import SCHEMA_VERSION, SECTIONS, Config, ConfigError


# Before these sections were split off, all their fields lived under [train]: config
# files and checkpoints written then still name them there.
FORMERLY_TRAIN = ("train", "eval", "checkpoint", "profile")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """field name -> (section, field). Names are unique across sections, so flags are flat."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            assert f.name not in index, f"duplicate config field {f.name}"
            index[f.name] = (section, f)
    return index


@functools.cache
def field_type(name: str) -> type:
    """The scalar type of a field annotated e.g. 'bool | None' (annotations are strings here)."""
    section, _ = field_index()[name]
    tp = typing.get_type_hints(SECTIONS[section])[name]
    if get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in get_args(tp) if a is not type(None))
    return tp


def section_names(section: str) -> set[str]:
    """The field names a [section] table may hold (old [train] tables: every formerly-train one)."""
    owners = FORMERLY_TRAIN if section == "train" else (section,)
    return {f.name for s in owners for f in fields(SECTIONS[s])}


def spelled(name: str, value: Any) -> Any:
    """The value a field's old boolean spelling stands for (activation_checkpointing = true
    is "blocks"); any other value as it is."""
    spellings = field_index()[name][1].metadata.get("spellings")
    return spellings[value] if spellings and isinstance(value, bool) else value


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def upgrade_dict(d: dict[str, Any], schema: int | None = None) -> dict[str, Any]:
    """A saved config dict in today's sections: fields that an older layout kept under
    "train" move to their own section, and fields added since it was saved take their
    defaults (a new option's default is what the code did before it existed). Unknown
    sections or fields are an error, and so is a value outside its field's choices.

    `schema` is the SCHEMA_VERSION the config was written with (None: written before
    versions were, when nothing can tell a removed field from a newer one). A field that
    version always wrote, missing, is an error: the config would describe another model."""
    unknown = set(d) - {"preset", *SECTIONS}
    if unknown:
        raise ConfigError(f"unknown config sections: {', '.join(sorted(unknown))}")
    if schema is not None and (isinstance(schema, bool) or not isinstance(schema, int)
                               or not 1 <= schema <= SCHEMA_VERSION):
        raise ConfigError(f"config schema {schema!r}: this trainer reads versions 1 to "
                          f"{SCHEMA_VERSION} (a newer trainer wrote it?)")
    out: dict[str, Any] = {"preset": d.get("preset", Config.preset)}
    out.update({name: dataclasses.asdict(cls()) for name, cls in SECTIONS.items()})
    given: set[str] = set()
    for section in SECTIONS:
        values = d.get(section, {})
        extra = set(values) - section_names(section)
        if extra:
            raise ConfigError(f"unknown [{section}] config fields: {', '.join(sorted(extra))}")
        for name, value in values.items():
            value = spelled(name, value)
            choices = field_index()[name][1].metadata.get("choices")
            if choices and value not in choices:
                raise ConfigError(f"{name} = {value!r} is not one of {', '.join(choices)}")
            out[field_index()[name][0]][name] = value
            given.add(name)
    if schema is not None:
        lost = [name for name, (_, f) in field_index().items()
                if f.metadata["since"] <= schema and name not in given]
        if lost:
            raise ConfigError(
                f"its config lacks {', '.join(lost)}, which every config of schema {schema} "
                f"holds: the file was edited or damaged, and with the defaults it would be "
                f"read as another model")
    return out


def from_dict(d: dict[str, Any], schema: int | None = None) -> Config:
    """Inverse of to_dict (e.g. a checkpoint's saved config, in any earlier layout; see
    upgrade_dict for `schema`)."""
    d = upgrade_dict(d, schema)
    return Config(preset=d["preset"], **{name: cls(**d[name]) for name, cls in SECTIONS.items()})


def describe(cfg: Config, width: int = 100) -> str:
    """The resolved config for the start of a run: a section a paragraph, wrapped."""
    out = [f"preset: {cfg.preset}"]
    for section in SECTIONS:
        line = f"{section + ':':<12}"
        for k, v in dataclasses.asdict(getattr(cfg, section)).items():
            item = f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
            if len(line) + len(item) > width and line.strip() != section + ":":
                out.append(line.rstrip())  # a value never breaks across lines
                line = " " * 12
            line += item + " "
        out.append(line.rstrip())
    return "\n".join(out)
