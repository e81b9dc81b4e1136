"""Expected failures. Each one becomes one line on stderr and an exit code, never a traceback."""


class OomdoctorError(Exception):
    """Base class: bad input or usage. Exit code 2 unless stated otherwise."""

    exit_code = 2


class BadInput(OomdoctorError):
    """The input (log, card, rule, config) cannot be used; the message says why."""


class RuleError(BadInput):
    """A rule file is malformed; the message names the file and the reason."""


class CardError(BadInput):
    """An incident card is malformed or from an incompatible schema; the message names the field."""


class MissingExtra(BadInput):
    """An optional extra (matplotlib for --plot, ...) is not installed. Commands whose main result does not need
    it print that result and this one line; alone (no main result) it is bad usage, exit 2."""
