"""Errors a user can fix. The command line and the web page print their message (one sentence that says what to
do) without a traceback; anything else is a bug and keeps its traceback."""


class UserError(ValueError):
    """A config, data file, model, reward, run directory or input the user can fix; the message says how."""


class RunDirError(UserError):
    """A run directory that cannot be used as asked (busy, holding another run, nothing to resume)."""


class RewardError(UserError):
    """A reward spec or reward input a user can fix; the message says how."""


class ConfigError(UserError):
    """A configuration the user can fix; the message says how."""


class SandboxError(UserError):
    """Model-written code that cannot be run as safely as asked here; the message says what to install or allow."""


class NativeCrash(UserError):
    """Native code (llama.cpp) that died by a signal in the child process it ran in (engine.isolated): the command
    that asked goes on, or stops with this sentence; nothing of the user's is lost."""
