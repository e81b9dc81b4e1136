"""`oomdoctor ladder CARD | -- CMD ...` — measure, by bisection over the free memory a ballast leaves, the
smallest free memory at which the workload starts and serves its requests."""
from __future__ import annotations

import sys
from pathlib import Path

import click


class _LadderCommand(click.Command):
    """Everything after ``--`` is the command to measure (kept apart before click parses the options)."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS]", "CARD", "|", "[OPTIONS]", "[--out CARD]", "--", "CMD", "[ARGS]..."]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["ladder_argv"] = list(args[i + 1:])
            args = list(args[:i])
        return super().parse_args(ctx, args)


def _size(value: str, what: str) -> int:
    from oomdoctor.errors import BadInput
    from oomdoctor.units import parse_size

    n = parse_size(value)
    if n <= 0 and what == "--precision":
        raise BadInput(f"--precision must be positive (got {value})")
    if n < 0:
        raise BadInput(f"{what} must not be negative (got {value})")
    return n


def _opt_size(value: str | None, what: str) -> int | None:
    return None if value is None else _size(value, what)


def print_table(ladder: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from oomdoctor.units import human_bytes

    con = Console(file=file or sys.stdout)
    t = Table(title=f"Free-memory ladder ({ladder['starts']} start(s), precision {human_bytes(ladder['precision_bytes'])})",
              title_justify="left")
    for col in ("#", "target free", "free at start", "outcome", "class", "decisive line", "took"):
        t.add_column(col)
    for r in sorted(ladder["rungs"], key=lambda r: r["target_free_bytes"]):
        dec = r.get("decisive") or {}
        line = f"{dec['line']} {dec.get('rule') or ''}" if dec.get("line") else ""
        style = "green" if r["outcome"] == "pass" else "red"
        free = f"{r['free_bytes'] / (1 << 30):.3f} GiB" if r.get("free_bytes") is not None else "?"
        t.add_row(str(r["k"]) + ("" if r.get("role", "bisect") == "bisect" else " " + r["role"].replace("verify_", "end:")),
                  f"{r['target_free_bytes'] / (1 << 30):.3f} GiB", free, Text(r["outcome"], style=style),
                  r.get("class") or "", Text(line), f"{r.get('duration_s') or 0:.0f}s")
    con.print(t)
    res = ladder.get("result") or {}
    if res.get("message"):
        con.print(Text(res["message"], style="bold"))
    m = res.get("margin") or {}
    if m.get("message") or m.get("note"):
        con.print(Text("margin: " + str(m.get("message") or m.get("note"))))
    d = res.get("declared") or {}
    if d.get("message"):
        con.print(Text("declared: " + d["message"]))
    for n in (res.get("notes") or []) + ([res["inconsistent"]] if res.get("inconsistent") else []):
        con.print(Text("note: " + n))


@click.command("ladder", cls=_LadderCommand)
@click.argument("card", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--precision", default="64MiB", show_default=True, help="Stop when the passing and failing rungs are this close.")
@click.option("--low", default=None, help="Low end of the bracket (assumed to fail). Default: weights + pinned KV arena from the card, else --floor.")
@click.option("--high", default=None, help="High end of the bracket (assumed to start). Default: the GPU's free memory now.")
@click.option("--floor", "floor_", default="512MiB", show_default=True, help="Low end when the card has no weights figure.")
@click.option("--declared", default=None, help="A declared requirement (bytes or a size) to compare with the measured threshold.")
@click.option("--profile-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A serving-profile file (YAML/JSON) whose profile --profile has requires_free_bytes.")
@click.option("--profile", "profile_name", default=None, help="The profile name in --profile-file.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With -- CMD: the card to create (or resume) and write the ladder to.")
@click.option("--gpu", "gpu_index", type=int, default=0, show_default=True, help="GPU index to measure on.")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True, help="Seconds for one start and its requests.")
@click.option("--memory-timeout", "memory_timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds to wait for GPU memory to come back between rungs.")
@click.option("--max-starts", type=int, default=None, help="Stop after this many starts in this run (resume later).")
@click.option("--fresh", is_flag=True, help="Ignore the rungs recorded in the card and start afresh.")
@click.option("--no-ballast", is_flag=True,
              help="Hold no memory: each rung's target only reaches the command as env OOMDOCTOR_LADDER_FREE_BYTES "
                   "(tests, wrappers that read it); such rungs are not measurements of the device.")
@click.option("--prompt-tokens", type=int, default=8, show_default=True, help="With -- CMD: the requests to serve.")
@click.option("--max-tokens", type=int, default=16, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the ladder object as JSON on stdout.")
@click.option("--trust-card", is_flag=True,
              help="Run a CARD's workload even where oomdoctor did not derive it (a 'command' launcher: the card's own argv).")
@click.pass_context
def command(ctx: click.Context, card: Path | None, precision: str, low: str | None, high: str | None, floor_: str,
            declared: str | None, profile_file: Path | None, profile_name: str | None, out: Path | None, gpu_index: int,
            timeout_s: float, memory_timeout_s: float, max_starts: int | None, fresh: bool, no_ballast: bool,
            prompt_tokens: int, max_tokens: int, as_json: bool, trust_card: bool) -> int:
    """Measure the smallest free memory at which CARD's workload (or the command after --) starts AND serves.

    Bisection over the free memory a ballast leaves; each rung is written to the card as it is measured and a
    ladder resumes from them. Exit 0: threshold measured (and a declared requirement, if any, is not under it);
    1: not measured (does not start at the high end, starts at the low end, stopped early) or under-declared;
    2: bad input; 130: interrupted (run again to resume).
    """
    from oomdoctor.card import store as cardmod
    from oomdoctor.errors import BadInput
    from oomdoctor.analysis.ladder import card_for_command, exit_code, read_profile, run_ladder, to_json

    argv = ctx.meta.get("ladder_argv")
    if argv is not None and not argv:
        raise BadInput("nothing after --: give the command to measure")
    if argv and card is not None:
        raise BadInput("give either a CARD or a command after --, not both")
    if argv is None and card is None:
        raise BadInput("give a CARD (from `oomdoctor diagnose` or `record`) or a command after --")
    if out is not None and argv is None:
        raise BadInput("--out is for a command after --; a CARD is written in place")
    if (profile_file is None) != (profile_name is None):
        raise BadInput("--profile-file and --profile go together")
    if declared is not None and profile_file is not None:
        raise BadInput("give either --declared or --profile-file/--profile")
    prec = _size(precision, "--precision")
    dec = None
    if declared is not None:
        n = _size(declared, "--declared")
        if not n:
            raise BadInput("--declared must be positive")
        dec = {"bytes": n, "source": "--declared"}
    elif profile_file is not None and profile_name is not None:
        dec = read_profile(profile_file, profile_name)
    card_dict = None
    card_path = card
    if card is not None:                # a card is data: run only what oomdoctor derives itself, unless told
        from oomdoctor.retest.trust import require_trusted

        require_trusted(cardmod.load_dict(card).get("workload") or {}, trust_card)
    if argv is not None:
        fresh_card = card_for_command(argv, {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens})
        if out is not None:
            if out.exists():
                existing = cardmod.load_dict(out)
                if (existing.get("workload") or {}).get("argv") != fresh_card["workload"].get("argv"):
                    raise BadInput(f"--out {out} holds another workload; give a new path to measure this command")
            else:
                cardmod.save(fresh_card, out)
            card_path = out
        else:
            card_dict = fresh_card
    ladder = run_ladder(card_path, card=card_dict, low=_opt_size(low, "--low"), high=_opt_size(high, "--high"), precision=prec,
                        floor=_size(floor_, "--floor"), declared=dec, gpu_index=gpu_index, timeout_s=timeout_s,
                        memory_timeout_s=memory_timeout_s, ballast=not no_ballast, fresh=fresh, max_starts=max_starts)
    if as_json:
        sys.stdout.write(to_json(ladder, str(card_path) if card_path else None) + "\n")
        print_table(ladder, file=sys.stderr)
    else:
        print_table(ladder)
        if card_path:
            click.echo(f"card: {card_path}")
    return exit_code(ladder)
