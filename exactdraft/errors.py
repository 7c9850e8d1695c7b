"""The exception classes of exactdraft, importable from `exactdraft` itself.

Invariant: every error a caller can cause with bad input (a checkpoint, a template, a recording,
an argument, an HTTP request) is raised as one of these, with the offending value, field or file
named in the message. Each also derives from the built-in class it refines (ValueError for bad
values, RuntimeError for conditions of the machine), so code written against those still works.
"""

from __future__ import annotations


class ExactdraftError(Exception):
    """Base class of every exactdraft error."""


class ParameterError(ExactdraftError, ValueError):
    """An argument has a value exactdraft cannot use; the message names the argument."""


class CheckpointError(ExactdraftError, ValueError):
    """A checkpoint file or folder cannot be used; the message names the file and the problem."""


class ConfigError(CheckpointError):
    """A checkpoint's configuration cannot be used; the message names the key and value."""


class WeightError(CheckpointError):
    """A tensor is missing, misshapen or in a format that cannot be used; the message names it."""


class GGUFError(CheckpointError):
    """A GGUF file cannot be read; the message names the file and the problem."""


class TokenizerError(ExactdraftError, ValueError):
    """A tokenizer cannot be built or used as asked; the message names the value at fault."""


class RecordingError(ExactdraftError, ValueError):
    """A recording file cannot be read or used; the message names the file and what is wrong."""


class BackendError(ExactdraftError, RuntimeError):
    """A backend cannot be created or cannot run an op; the message says which and why."""


class ExactnessError(ExactdraftError, RuntimeError):
    """Drafted output could not be guaranteed to equal serial output (raised in strict mode)."""


class ConstraintError(ParameterError):
    """A constraint (JSON schema, regex, grammar, choices) cannot be used, or a token it forbids
    was fed to it; the message names the constraint and what is wrong."""
