"""Command lines: the one-line-error parser every entry point uses, and the trainer's
flags and TOML files, both generated from the schema in gpt/core/config.py.

A bad flag, key or value stops with one line naming it (and a close match, if any)
rather than argparse's whole usage block. Nothing here imports torch, so `--help`
and a bad flag answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from gpt.core.config import PRESETS, SECTIONS, Config, ConfigError
from gpt.core.config_check import check_value, resolve
from gpt.core.config_io import field_index, field_type, flag, section_names
from gpt.core.text import one_line


try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10: the [toml] extra
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]


class OneLineParser(argparse.ArgumentParser):
    """The parser of every command line of the package: no abbreviated flags (a typo must
    not silently match a longer flag), and errors in one line naming the flag, with the
    closest real flag for an unknown one, then `hint` (the full usage block would bury it)."""

    hint = "(run with --help to list every flag)\n"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{self.hint}")

    def parse_args(self, args: typing.Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = self._glue_flag_values(list(sys.argv[1:] if args is None else args))
        flags = self._all_flags(argv)
        # An unknown flag first: a typo is usually why a required one then looks missing.
        for token in argv[: argv.index("--") if "--" in argv else len(argv)]:
            name = token.split("=")[0]
            if token.startswith("--") and name not in flags:
                self.error(f"unrecognized argument {token!r}{suggest(name, flags)}")
        parsed, unknown = self.parse_known_args(argv, namespace)
        if unknown:
            self.error(f"unrecognized argument {unknown[0]!r}")
        return parsed

    def _glue_flag_values(self, argv: list[str]) -> list[str]:
        """`--opt VALUE` as `--opt=VALUE` for the options marked by takes_flags(): argparse
        would take a VALUE such as "--no-compile" for a flag of its own."""
        marked = {o for a in self._every_action(argv) if getattr(a, "takes_flags", False)
                  for o in a.option_strings}
        out: list[str] = []
        tokens = iter(argv)
        for token in tokens:
            value = next(tokens, None) if token in marked else None
            out.append(token if value is None else f"{token}={value}")
        return out

    def _every_action(self, argv: list[str]) -> list[argparse.Action]:
        """This parser's actions, and those of the subcommand named in argv (of every
        subcommand, if none is named yet)."""
        actions = list(self._actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                named = next((a for a in argv if a in action.choices), None)
                subs = [action.choices[named]] if named else action.choices.values()
                for sub in subs:
                    actions += sub._actions
        return actions

    def _all_flags(self, argv: list[str]) -> list[str]:
        """Every option string: this parser's, and those of the subcommand named in argv
        (of every subcommand, if none is named yet)."""
        return [o for a in self._every_action(argv) for o in a.option_strings]


def takes_flags(action: argparse.Action) -> argparse.Action:
    """Mark an option whose value is itself a string of flags (e.g. '--no-compile'), so
    that `--opt '--no-compile'` parses as `--opt=--no-compile` does."""
    action.takes_flags = True  # type: ignore[attr-defined]
    return action


def check_at_least_one(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       names: typing.Iterable[str]) -> None:
    """parser.error for the first of these (optional) int flags that is below 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def finite_float(low: float | None = None, high: float | None = None,
                 above: bool = False) -> typing.Callable[[str], float]:
    """An argparse type for a float flag: a finite number in [low, high] ((low, high] if
    `above`), else argparse's one-line error naming the flag. Python's float() takes
    "nan" and "inf", and neither is ever a setting."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number")
        if low is not None and (value <= low if above else value < low):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {'>' if above else '>='} {low:g}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text!r}: must be at most {high:g}")
        return value

    parse.__name__ = "float"  # argparse's metavar and messages name the type
    return parse


def suggest(name: str, options: typing.Iterable[str]) -> str:
    """' (did you mean X?)' for the option it abbreviates, or else the closest one; or ''."""
    options = list(options)
    longer = [o for o in options if o.startswith(name) and o != name]
    close = longer if len(longer) == 1 else difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---- the trainer's flags

TRAINER = "train_gpt2.py"  # the command the trainer's flags belong to


def build_parser(prog: str = TRAINER) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Pre-train a GPT-2 model. Values: defaults <- --model preset <- "
        "--config TOML file <- flags.",
        argument_default=argparse.SUPPRESS,  # so we can tell which flags were given
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file of settings (see README)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the command and say what it would do (data, resume, "
                        "tokens per step, its time on this device, predicted peak memory "
                        "per device), then exit; nothing is written")
    parser.add_argument(
        "--model",
        "--preset",
        dest="preset",
        choices=list(PRESETS),
        metavar="PRESET",
        help=f"model size preset: {', '.join(PRESETS)} (default: gpt2); --n-layer etc. "
        "override its values",
    )
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} settings")
        for f in fields(cls):
            tp = field_type(f.name)
            help_text = f.metadata["help"]
            if "default" not in help_text:  # a help that explains its default says it once
                help_text += f" (default: {'off' if f.default is None else f.default})"
            spellings = f.metadata.get("spellings")
            if tp is bool:
                group.add_argument(
                    flag(f.name), action=argparse.BooleanOptionalAction, help=help_text
                )
            elif spellings:  # a switch that grew values: --flag [VALUE] and --no-flag
                group.add_argument(flag(f.name), nargs="?", const=spellings[True], type=tp,
                                   choices=f.metadata.get("choices"), help=help_text)
                group.add_argument("--no-" + flag(f.name)[2:], dest=f.name,
                                   action="store_const", const=spellings[False],
                                   help=f"the same as {flag(f.name)} {spellings[False]}")
            else:
                group.add_argument(
                    flag(f.name),
                    type=_or_words(tp, f.metadata.get("words", ())),
                    choices=f.metadata.get("choices"),
                    metavar=None if f.metadata.get("choices") else tp.__name__.upper(),
                    help=help_text,
                )
    if prog != TRAINER:  # another command that takes the trainer's flags
        parser.hint = f"(python {TRAINER} --help lists every trainer flag)\n"
    return parser


def _or_words(tp: type, words: tuple[str, ...]) -> typing.Callable[[str], Any]:
    """argparse's type for a field of type `tp` that also takes these words
    (--batch-size auto); `tp` itself where it takes none."""
    if not words:
        return tp

    def parse(text: str) -> Any:
        if text in words:
            return text
        try:
            return tp(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither {'an' if tp is int else 'a'} {tp.__name__} nor "
                f"{' or '.join(words)}") from None

    parse.__name__ = tp.__name__  # argparse's metavar and messages name the type
    return parse


def parse_args(argv: list[str] | None = None, prog: str = TRAINER) -> Config:
    """CLI -> Config. A bad flag or value exits with status 2 and a message naming it (and
    prog, the command that took the trainer's flags)."""
    return parse_command(argv, prog)[0]


def parse_command(argv: list[str] | None = None,
                  prog: str = TRAINER) -> tuple[Config, bool]:
    """CLI -> (Config, whether --dry-run was given)."""
    parser = build_parser(prog)
    cli = vars(parser.parse_args(argv))
    dry_run = bool(cli.pop("dry_run", False))
    try:
        values: dict[str, Any] = {}
        config_file = cli.pop("config", None)
        if config_file is not None:
            path = Path(config_file)
            for name, value in _flatten_toml(_load_toml(path), path).items():
                values[name] = _coerce(name, value, f"--config {path}")
            if "out_dir" not in cli and (note := _copied_run_note(path, values.get("out_dir"))):
                print(f"note: {note}", file=sys.stderr)
        values.update(cli)
        return resolve(values), dry_run
    except ConfigError as e:
        parser.error(str(e))
    raise AssertionError("unreachable")  # parser.error exits


def _copied_run_note(path: Path, out_dir: Any) -> str | None:
    """What a config.toml read from a run folder other than the one its out_dir names
    means (the folder was copied, its config was not edited): the run will train in
    out_dir's folder, not beside the file; None where the two agree."""
    folder = path.parent
    if not isinstance(out_dir, str) or not out_dir or not (folder / "metrics.jsonl").exists():
        return None  # not a run folder's own config
    try:
        if folder.resolve() == Path(out_dir).resolve():
            return None
    except OSError:
        return None
    here, there = one_line(str(folder), None), one_line(out_dir, None)
    return (f"--config {one_line(str(path), None)} is from the run folder {here}, but its "
            f"out_dir is {there}: this run trains in {there} (its checkpoints, log and "
            f"resume); to continue the copy in {here}, add --out-dir {here}")


# ---- TOML files


def _load_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise ConfigError(f"--config {path}: reading TOML on Python 3.10 needs `pip install tomli`")
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:  # TOML files are UTF-8
        raise ConfigError(f"--config {path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror or e})") from None


def _flatten_toml(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Accept section tables ([model], [data], ...) and/or top-level keys; return
    name -> value. A [train] table may still hold the fields that moved to [eval],
    [checkpoint] and [profile], as config files written before the split do."""
    index = field_index()
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key in SECTIONS and isinstance(value, dict):
            names = section_names(key)
            for sub, v in value.items():
                if sub not in names:
                    raise ConfigError(
                        f"--config {path}: unknown key {sub!r} in [{key}]{suggest(sub, names)}"
                    )
                flat[sub] = v
        elif key == "preset" or key in index:
            flat[key] = value
        elif key in SECTIONS:
            raise ConfigError(
                f"--config {path}: {key!r} must be a table ([{key}]); "
                + ("to pick a model size write preset = ..." if key == "model" else "")
            )
        else:
            raise ConfigError(
                f"--config {path}: unknown key {key!r}"
                f"{suggest(key, [*index, *SECTIONS, 'preset'])}"
            )
    return flat


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check a TOML value's type against the field (TOML has its own types; argparse did CLI)."""
    if name == "preset":
        if value not in PRESETS:
            raise ConfigError(f"{source}: preset {value!r} unknown; choose one of {', '.join(PRESETS)}")
        return value
    return check_value(name, value, source)


def to_toml(cfg: Config) -> str:
    """The resolved config as a TOML file that --config reads back (None = auto is omitted)."""
    lines = [f"preset = {json.dumps(cfg.preset)}"]
    for section in SECTIONS:
        lines.append(f"\n[{section}]")
        for name, value in dataclasses.asdict(getattr(cfg, section)).items():
            if value is None:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str):
                # JSON's escapes (\", \\, \n, \u00XX) are valid in TOML basic strings;
                # ensure_ascii=False keeps other characters literal, since JSON would
                # write non-BMP ones as surrogate pairs, which TOML rejects.
                text = json.dumps(value, ensure_ascii=False)
            else:
                text = repr(value)
            lines.append(f"{name} = {text}")
    return "\n".join(lines) + "\n"
