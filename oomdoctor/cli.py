"""The command line: one click group; each verb lives in oomdoctor/commands/<verb>.py and is
imported only when it is called (the CLI must start fast: no torch, no vllm, no rich until needed).

Every expected failure (OomdoctorError) becomes one line on stderr and its exit code (2 for bad
input); an unexpected exception becomes one line too, with OOMDOCTOR_DEBUG=1 to see the traceback.
"""
from __future__ import annotations

import importlib
import importlib.util
import io
import os
import signal
import sys

import click

from oomdoctor import __version__

COMMANDS = {
    "diagnose": "Classify a failing engine log, write an incident card, propose levers.",
    "retest": "Apply ONE lever to the recorded workload, re-run the real engine, record the attempt.",
    "record": "Run an engine command, capture device state and its log, and diagnose it.",
    "gate": "CI gate: every changed serving config needs a passing retest for its exact fingerprint.",
    "plan": "Memory arithmetic before any failure: will this model start on this card, and with what.",
    "ladder": "Measure the smallest free memory at which a workload starts (bisection with a ballast).",
    "compare": "Line up the start-up ledgers of two logs and explain the difference.",
    "admit": "KV-aware admission: admit, queue or reject a request against a KV byte budget.",
    "snapshot": "Read a PyTorch memory snapshot (safely, without torch) and report fragmentation.",
    "rules": "List the rules, or run every rule's own test cases.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        try:
            mod = importlib.import_module(f"oomdoctor.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"oomdoctor.commands.{name}":
                return None
            raise
        return mod.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n]) for n in sorted(COMMANDS) if importlib.util.find_spec(f"oomdoctor.commands.{n}")]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from oomdoctor import contract

        with formatter.section("Exit codes (docs/contract.md)"):
            formatter.write_dl([(n, "; ".join(f"{c} {m}" for c, m in contract.EXIT_CODES[n].items()))
                                for n in sorted(contract.EXIT_CODES)]
                               + [("every command", "; ".join(f"{c} {m.split(':')[0]}"
                                                              for c, m in contract.COMMON_EXIT_CODES.items())
                                   + "; 0 when stdout's reader leaves early (| head)")])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="oomdoctor")
def cli() -> None:
    """oomdoctor — diagnose GPU out-of-memory incidents of LLM inference engines and prove each fix.

    Reproduce → Classify → Capture evidence → Identify the constraint → Change ONE lever →
    Retest the SAME workload → Recheck performance.
    """


def _stdout_id() -> tuple[int, int] | None:
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return st.st_dev, st.st_ino


def _reader_left() -> None:
    """stdout's reader went away (`oomdoctor ... | head`): that is not a failure. Point stdout at /dev/null so that
    the interpreter's last flush does not print a BrokenPipeError, and exit 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass
    sys.exit(0)


def _pipe_broke(before: tuple[int, int] | None) -> bool:
    """Did a library turn a closed stdout into exit 1? click wraps stdout in PacifyFlushWrapper on EPIPE; rich
    points stdout at /dev/null."""
    if type(sys.stdout).__name__.lstrip("_") == "PacifyFlushWrapper":     # click.utils.(_)PacifyFlushWrapper
        return True
    devnull = os.stat(os.devnull)
    null = (devnull.st_dev, devnull.st_ino)
    return before is not None and before != null and _stdout_id() == null


def _one_line(msg: object) -> str:
    """An error message as ONE line: control characters that came from the input (a key with a CR in a card, a
    newline in a path) are written escaped, never as line breaks; and redacted, as every output is (a message may
    quote a line of the input, an env file's `HF_TOKEN hf_...`, or a URL with user:password@)."""
    from oomdoctor.redact import redact_text

    return redact_text("".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(msg)))


class _Terminated(BaseException):
    """SIGTERM, raised where the process is: what it holds is let go on the way out (the stdin spool's folder, a
    lock), as on Ctrl-C; a retest's own handler ends its engine and ballast groups first (retest/procs.py)."""


def _on_term(signum: int, frame: object) -> None:
    raise _Terminated()


def main(argv: list[str] | None = None) -> None:
    from oomdoctor.errors import OomdoctorError

    before = _stdout_id()
    try:
        signal.signal(signal.SIGTERM, _on_term)
    except ValueError:          # not the main thread (an embedding caller): its own handling stays
        pass
    try:
        rc = cli.main(args=argv, prog_name="oomdoctor", standalone_mode=False)
    except _Terminated:
        click.echo("oomdoctor: terminated", err=True)
        sys.exit(143)
    except SystemExit as e:
        if e.code == 1 and _pipe_broke(before):
            _reader_left()
        raise
    except OomdoctorError as e:
        click.echo(f"oomdoctor: error: {_one_line(e)}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("oomdoctor: aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:        # usage is bad input too: one line, and where the help is
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:     # `oomdoctor`, `oomdoctor rules`
            click.echo(e.ctx.get_help())
            sys.exit(0)
        where = e.ctx.command_path if e.ctx is not None else "oomdoctor"
        said = "" if where == "oomdoctor" else f"{where}: "          # not "oomdoctor: error: oomdoctor: ..."
        click.echo(f"oomdoctor: error: {said}{_one_line(e.format_message().rstrip('.'))} (see {where} --help)", err=True)
        sys.exit(2)
    except click.ClickException as e:
        click.echo(f"oomdoctor: error: {_one_line(e.format_message())}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("oomdoctor: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        _reader_left()
    except Exception as e:  # noqa: BLE001 - one line, never a traceback, unless asked for
        if os.environ.get("OOMDOCTOR_DEBUG"):
            raise
        click.echo(f"oomdoctor: internal error: {type(e).__name__}: {_one_line(e)} (set OOMDOCTOR_DEBUG=1 for the "
                   f"traceback)", err=True)
        sys.exit(70)
    sys.exit(rc if isinstance(rc, int) else 0)
