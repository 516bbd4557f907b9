"""Errors a user can act on: each names the problem and the fix.

Every layer raises `ParityError` (or a subclass) for bad input; the service turns it into a stored
error run, the CLI into exit code 2 with the message on stderr, the app into a message in the page.
"""

from __future__ import annotations


class ParityError(Exception):
    """A problem with the user's input or environment, with a fix the user can apply."""

    code = "error"

    def __init__(self, message: str, fix: str = "", *, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        if code:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} Fix: {self.fix}" if self.fix else self.message


class ConfigError(ParityError):
    """An invalid canonical config value; `key` names the offending key (dotted for sections)."""

    code = "config"

    def __init__(self, key: str, message: str, fix: str = ""):
        super().__init__(f"config key '{key}': {message}", fix)
        self.key = key


class SideError(ConfigError):
    """A problem with one side of a run (its kind, an option, its model folder or environment)."""

    code = "side"

    def __init__(self, side: str, key: str, message: str, fix: str = ""):
        ParityError.__init__(self, f"side '{side}': {message}", fix)
        self.key = f"{side}.{key}" if key else side
        self.side = side


class ModelError(ParityError):
    code = "model"


class PromptError(ParityError):
    code = "prompt"


class EngineError(ParityError):
    """An engine worker failed: crashed, ran out of memory, timed out or raised."""

    code = "engine"


class CancelledError(ParityError):
    code = "cancelled"
