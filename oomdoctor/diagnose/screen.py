"""The first screen of ``oomdoctor diagnose``: the operator's four questions in at most 24 lines of 80 columns.

What failed (class, phase, engine), why (the one line of evidence and the arithmetic), and the ONE change to make,
written as the flag, keyword argument or environment variable their launcher takes, with its exact value.
Everything else (all levers, all numbers, the ledger) is behind ``--verbose`` and in the card.

Text is wrapped at spaces only: a number is never split across lines, and a number stays on the line of its
unit (``244.14 GiB``). A word wider than the screen (a URL in a log line) is cut with ``…``, never a number.
"""
from __future__ import annotations

import re
import textwrap
from typing import Any

from oomdoctor import contract

HEIGHT = 24
WIDTH = 80
NBSP = "\u00a0"
# a number and its unit travel together: "244.14 GiB", "4,000,000 tokens"
_UNIT_RE = re.compile(r"(\d) (?=(?:GiB|MiB|KiB|GB|MB|KB|B|tokens?|bytes|%)(?![A-Za-z]))")
_DIGITISH = set("0123456789.,_")

# lines per section at most; the sum stays within HEIGHT (header 2 + summary 3 + evidence 5 + why 5 + change 7 + footer 2)
CAPS = {"header": 2, "summary": 3, "evidence": 4, "why": 4, "cost": 3, "notes": 6}


def _cut_word(word: str, room: int) -> str:
    """A word longer than ``room``, cut with "…" where no number is split (never inside a run of digits)."""
    if len(word) <= room:
        return word
    cut = max(room - 1, 1)
    while cut > 1 and word[cut - 1] in _DIGITISH and word[cut] in _DIGITISH:
        cut -= 1
    return word[:cut] + "…"


def wrap(text: str, width: int, indent: str = "", first: str | None = None, max_lines: int | None = None) -> list[str]:
    """Wrap at spaces (never inside a word or a number); at most ``max_lines`` lines, the last one ending in "…"
    when text was left out."""
    first = indent if first is None else first
    room = width - max(len(first), len(indent))
    words = [_cut_word(w, room) for w in _UNIT_RE.sub(lambda m: m.group(1) + NBSP, " ".join(text.split())).split(" ")]
    lines = textwrap.wrap(" ".join(words), width=width, initial_indent=first, subsequent_indent=indent,
                          break_long_words=False, break_on_hyphens=False)
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        last = lines[-1]
        while len(last) + 2 > width and " " in last.strip():
            last = last[:last.rstrip().rindex(" ")]
        lines[-1] = last.rstrip() + " …"
    return [ln.replace(NBSP, " ") for ln in lines]


def _message(text: str) -> str:
    """The log line without its process prefix and logging header."""
    from oomdoctor.diagnose.parse import parse_line

    return parse_line(0, text).msg or text


def _root_evidence(card: dict) -> dict | None:
    ev = card.get("evidence") or []
    roots = [e for e in ev if e.get("role") == "root"]
    return (roots or ev or [None])[0]


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt_value(x) for x in v)
    return str(v)


def _fmt_change(k: str, v: Any) -> str:
    return str(v) if "pid" in k else _fmt_value(v)       # a process id is a name, not a quantity


def launcher_text(card: dict, lever: dict) -> list[str]:
    """The lines to paste (``levers.paste``): the user's whole command with the change when the card knows it, else
    the flag, keyword argument or variable in the engine's own words."""
    from oomdoctor.levers.paste import paste_text, whole_command

    wl = card.get("workload") or {}
    engine = (card.get("engine") or {}).get("name") or ""
    whole = whole_command(engine, wl, lever)
    if whole:
        return whole
    lines = paste_text(engine, wl.get("launcher"), wl.get("model"), lever)
    if wl.get("launcher_assumed"):        # the paste shows no launcher: `vllm serve` assumed, the offline form beside it
        offline = [t for t in paste_text(engine, "vllm-llm", wl.get("model"), lever) if t not in lines]
        lines += [f"{offline[0]}     # the offline API"] if offline else []
    return lines


_FLAG_START = re.compile(r"--?[A-Za-z]")          # a flag: -x or --x


def _outside_quotes(t: str, at: str) -> list[int]:
    """The offsets of ``at`` in ``t`` that are outside '...' and "..." (a cut there never changes a quoted value)."""
    out, quote, i = [], "", 0
    while i < len(t):
        c = t[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif t.startswith(at, i):
            out.append(i)
        i += 1
    return out


def _pieces(t: str) -> tuple[list[str], str]:
    """A command cut where it may be continued, never inside a quoted value: before each ``--flag`` (a shell line,
    continued with `` \\``), or after each ``, `` of a Python call (continued inside its parentheses)."""
    if t.startswith("LLM("):
        cuts = [i + 1 for i in _outside_quotes(t, ", ")]
        return [t[a:b].strip() for a, b in zip([0] + cuts, cuts + [len(t)])], ""
    head, dots, rest = t.partition(" ... ")
    if dots:
        return [head + " ...", rest], " \\"
    cuts = [i for i in _outside_quotes(t, " -") if _FLAG_START.match(t, i + 1)]
    return [t[a:b].strip() for a, b in zip([0] + cuts, cuts + [len(t)])], " \\"


def paste_lines(texts: list[str], width: int, indent: str) -> list[str]:
    """Lines to paste, never wrapped inside a word: a command too wide for the screen is continued between its
    arguments, as a shell (`` \\``) or Python (inside the call's parentheses) accepts it."""
    out = []
    for t in texts:
        if len(indent) + len(t) <= width or t.startswith("#"):
            out.append(indent + t)
            continue
        pieces, cont = _pieces(t)
        lines = [pieces[0]]
        for p in pieces[1:]:
            pad = indent if len(lines) == 1 else indent + "  "
            if len(pad) + len(lines[-1]) + 1 + len(p) + len(cont) <= width:
                lines[-1] = f"{lines[-1]} {p}"
            else:
                lines.append(p)
        out += [(indent if i == 0 else indent + "  ") + ln + (cont if i < len(lines) - 1 else "")
                for i, ln in enumerate(lines)]
    return out


def _change_title(card: dict, lever: dict) -> str:
    """``Change ONE thing: max_model_len 4,000,000 → 1,998,848`` (the old value when the card knows it)."""
    if lever["id"] == "free_other_processes":
        pids = [str(p) for p in (lever.get("change") or {}).get("stop_pids") or []]
        return ("Change ONE thing: stop " + (f"process {', '.join(pids)}, which holds" if pids else "what holds")
                + " the GPU's memory")
    wl = card.get("workload") or {}
    known = {**(wl.get("resolved") or {}), **(wl.get("engine_args") or {})}
    parts = []
    for k, v in (lever.get("change") or {}).items():
        old = known.get(k)
        arrow = f"{_fmt_change(k, old)} → {_fmt_change(k, v)}" if old is not None else f"→ {_fmt_change(k, v)}"
        parts.append(f"{k} {arrow}" if k == lever["id"] else f"{k} {arrow}")
    if len(parts) == 1 and parts[0].startswith(lever["id"] + " "):
        return f"Change ONE thing: {parts[0]}"
    return f"Change ONE thing: {lever['id']}" + (f" ({'; '.join(parts)})" if parts else "")


def _header(card: dict, width: int) -> list[str]:
    """What failed and in which phase (how the phase was decided, when the diagnosis says), and the summary."""
    c = card["classification"]
    eng = card.get("engine") or {}
    how = ", ".join(x for x in (c.get("phase_basis"), f"confidence {c['confidence']}" if c.get("confidence") else "")
                    if x)
    head = (f"{c['class']} · phase {c['phase']}" + (f" ({how})" if how else "")
            + f" · {eng.get('name') or 'unknown engine'} {eng.get('version') or ''}").rstrip()
    lines = wrap(head, width, indent="  ", first="", max_lines=CAPS["header"])
    lines += wrap(card.get("summary") or "", width, max_lines=CAPS["summary"])
    if c.get("version_caveat") and c["version_caveat"] not in (card.get("summary") or ""):
        # a version outside the rules' range: read with the nearest rules
        lines += wrap(f"Caveat: {c['version_caveat']}", width, indent="  ", first="", max_lines=2)
    if c.get("root_cause_in"):       # cascade only: which process's output holds the cause
        # with no lever to show, the commands that fetch it are the answer: room for them
        lines += wrap(f"The root cause is not in this log. Fetch {c['root_cause_in']}", width, indent="  ", first="",
                      max_lines=2 if card.get("levers") else 4)
    return lines


def _evidence(card: dict, width: int) -> list[str]:
    e = _root_evidence(card)
    if not e:
        return ["Evidence: no line of the log matched a rule"]
    where = f"line {e['line']}" + (f", {e['process']}" if e.get("process") else "")
    return [f"Evidence ({where}):"] + wrap(_message(e["text"]), width, indent="  ", max_lines=CAPS["evidence"])


def _why(lever: dict, width: int) -> list[str]:
    steps = lever.get("arithmetic") or ([lever["basis"]] if lever.get("basis") else [])
    lines: list[str] = []
    for s in steps:
        lines += wrap(s, width, indent="    ", first="  · ")
    if not lines:
        return []
    if len(lines) > CAPS["why"]:
        lines = lines[:CAPS["why"] - 1] + ["  · … (the rest: --verbose)"]
    return ["Why:"] + lines


def _change(card: dict, lever: dict, width: int) -> list[str]:
    lines = wrap(_change_title(card, lever), width, indent="  ", first="", max_lines=2)
    lines += paste_lines(launcher_text(card, lever), width, "  ")
    predicted = lever.get("predicted") or {}
    pred = predicted.get("outcome")
    if pred in (None, "unknown") and (predicted.get("model") or {}).get("fits") is True:
        pred = "fits (the memory model)"        # diagnose --model: the model ran the start with this change
    tail = (f"Predicted: {pred}. " if pred else "") + f"Cost: {lever.get('cost') or '?'}"
    if lever.get("explicit_override"):
        tail = "Overrides a value you set. " + tail
    lines += wrap(tail, width, indent="  ", first="  ", max_lines=CAPS["cost"])
    if predicted.get("warning"):       # what the prediction leaves out (C2: a budget that cannot hold the weights)
        lines += wrap(f"But: {predicted['warning']}", width, indent="  ", first="  ", max_lines=CAPS["cost"])
    return lines


def first_screen(card: dict, card_path: str | None, width: int = WIDTH) -> list[str]:
    """The lines of the first screen (at most HEIGHT, none wider than ``width`` unless a pasteable line is)."""
    levers = card.get("levers") or []
    sections = {"header": _header(card, width), "evidence": _evidence(card, width)}
    if levers:
        sections["why"] = _why(levers[0], width)
        sections["change"] = _change(card, levers[0], width)
    else:
        fetch = card["classification"].get("root_cause_in")      # said once, in the header, with its commands
        notes = [n for n in card.get("notes", []) if n and n != card.get("summary")
                 and n != card["classification"].get("version_caveat") and not (fetch and fetch in n)]
        sections["notes"] = [ln for n in notes for ln in wrap(n, width, indent="  ", first="note: ", max_lines=3)]
    return _fit(sections, _footer(card, card_path, width))


def _footer(card: dict, card_path: str | None, width: int) -> list[str]:
    """What to run next (a path is never cut: too wide, it goes on its own line) and where the rest is."""
    levers = card.get("levers") or []
    if card_path and levers and card["classification"]["class"] not in contract.NO_MEMORY_FAILURE:
        head = "Next: oomdoctor retest"
    elif card_path:
        head = "card:"
    else:
        head, card_path = "no card written", ""
    out = [f"{head} {card_path}".rstrip()] if len(head) + 1 + len(card_path) <= width else [f"{head} \\", f"  {card_path}"]
    more = f"{len(levers)} levers, " if len(levers) > 1 else ""
    return out + [f"More ({more}numbers, ledger, device): --verbose"]


def _fit(sections: dict[str, list[str]], footer: list[str]) -> list[str]:
    """Within HEIGHT: the notes, the arithmetic, then the evidence give up lines (the last kept one then says where
    the rest is); what failed and the change to make keep theirs."""
    room = HEIGHT - len(footer)
    for name, minimum in (("notes", 0), ("why", 2), ("evidence", 2), ("header", 1)):
        over = sum(len(s) for s in sections.values()) - room
        lines = sections.get(name) or []
        keep = max(len(lines) - over, minimum)
        if over > 0 and keep < len(lines):
            sections[name] = lines[:keep - 1] + ["  … (the rest: --verbose)"] if keep else []
    return [ln for s in sections.values() for ln in s][:room] + footer
