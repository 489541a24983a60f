"""Every flag has an environment variable: POSTTRAIN_ and its long name upper-cased, '.' and '-' as '_'
(--web.listen-address: POSTTRAIN_WEB_LISTEN_ADDRESS). A flag given on the command line wins; an empty variable
counts as unset."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from exporter.commands.base import UsageError

ENV_PREFIX = "POSTTRAIN_"
# report's output format keeps the variable it had when its flag was --format
_ENV_OVERRIDES = {("report", "--output.format"): "POSTTRAIN_REPORT_FORMAT"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
ENV_LIST_SEPARATOR = ","  # POSTTRAIN_LOG=/logs/train.log,/logs/trainer_state.json (a path with a comma: --log)


def env_name(command: str | None, option: str) -> str:
    return _ENV_OVERRIDES.get((command or "", option)) or ENV_PREFIX + re.sub(r"[.-]", "_", option[2:]).upper()


class EnvDefault(list):
    """The default of a flag whose variable is set, resolved after parsing (so the command line beats it). A list,
    so that argparse's `append` can copy it: a non-empty one means the flag was given."""

    def __init__(self, var: str, raw: str, action: argparse.Action) -> None:
        super().__init__()
        self.var, self.raw, self.action = var, raw, action

    def resolve(self) -> Any:
        if self:  # --log given: argparse appended to a copy of this default
            return list(self)
        action, raw = self.action, self.raw.strip()
        if action.nargs == 0:  # --no-gpu, --once: a boolean
            if raw.lower() in _TRUE:
                return action.const
            if raw.lower() in _FALSE:
                return not action.const
            self._fail("not a boolean: give true or false")
        if isinstance(action, argparse._AppendAction):
            return [self._convert(item.strip()) for item in raw.split(ENV_LIST_SEPARATOR) if item.strip()]
        return self._convert(raw)

    def _convert(self, raw: str) -> Any:
        try:
            value = (self.action.type or str)(raw)
        except argparse.ArgumentTypeError as e:
            self._fail(str(e))
        except (TypeError, ValueError):
            self._fail(f"not a valid value for {self.action.option_strings[0]}")
        if self.action.choices is not None and value not in self.action.choices:
            self._fail(f"choose from {', '.join(map(str, self.action.choices))}")
        return value

    def _fail(self, why: str):
        raise UsageError(f"environment variable {self.var}={self.raw!r}: {why} (fix or unset it; a flag on the "
                         "command line takes precedence)")


def bind_env(parser: argparse.ArgumentParser, command: str | None, environ: Mapping[str, str]) -> None:
    """Names each flag's variable in its help, and makes a set variable the flag's default."""
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version") or action.help == argparse.SUPPRESS:
            continue  # a hidden flag (an old name kept working) has no variable of its own
        var = env_name(command, longs[0])
        action.help = f"{action.help + ' ' if action.help else ''}[env {var}]"
        if action.default is not argparse.SUPPRESS and environ.get(var, "").strip():
            action.default = EnvDefault(var, environ[var], action)

