"""The `rise-nemo` subcommands (rise_nemo.cli dispatches to them), each a module with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors a command reports in one line with exit code 2 (never a traceback)."""
    from rise_nemo.config import ConfigError
    from rise_nemo.core.rubric import RubricError
    from rise_nemo.errors import UserError

    return (UserError, ConfigError, RubricError)
