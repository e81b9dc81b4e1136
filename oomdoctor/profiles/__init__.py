"""Model-owned serving profiles, measured instead of estimated.

A model owner ships a few serving profiles (a context window plus the engine settings that go with it);
oomdoctor's vLLM plugin picks the widest one whose MEASURED start-up requirement fits the free memory of the
GPU(s) the engine will use, and fills only the settings the caller left at vLLM's defaults. Incident 1 is why
every rule exists: declared requirements were under the measured thresholds by about 1.5 GB, a utilization
clamp did nothing against a pinned KV arena, a profile without a utilization of its own failed vLLM's start-up
check, and a utilization below the clamp's safety factor made the budget stop tracking free memory.

- :mod:`.reader` — THE serving-profiles file reader (format ``oomdoctor.serving-profiles/v1``, docs/plugin.md),
  used by the gate, the plugin and the ladder; :mod:`.receipts` — the ladder receipts behind ``measured``.
- :mod:`.select` — :func:`select_profile` (pure); :mod:`.clamp` — the utilization clamp;
  :mod:`.selection` — the records it returns; :mod:`.report` — ``python -m oomdoctor.profiles`` dry runs.
"""
from __future__ import annotations

from oomdoctor.profiles.clamp import budget, floor3, saturation_range
from oomdoctor.profiles.reader import (DEFAULT_SAFETY_FACTOR, PIN_FIELD, SCHEMA_ID, UTIL_FIELD, WINDOW_FIELD, Profile,
                                       ProfileSet, load_profiles, parse_profiles)
from oomdoctor.profiles.receipts import read_ladder
from oomdoctor.profiles.report import main, report
from oomdoctor.profiles.select import select_profile
from oomdoctor.profiles.selection import Selection, Substitution

__all__ = ["DEFAULT_SAFETY_FACTOR", "PIN_FIELD", "SCHEMA_ID", "UTIL_FIELD", "WINDOW_FIELD", "Profile", "ProfileSet",
           "Selection", "Substitution", "budget", "floor3", "load_profiles", "main", "parse_profiles", "read_ladder",
           "report", "saturation_range", "select_profile"]
