"""Lanes (docs/semantics.md 9): ``--kvcm-lane=l0_cpu`` runs exactly the tests ``ci/l0_cpu.yml`` lists for this machine.

Three concepts, one module each: ``file_format`` (the YAML lane file and waives file: parsing, checks,
conditions, ``auto``), ``selection`` (the pytest hooks that apply a lane to a session, with xdist) and
``isolation`` (``ISOLATION`` entries in subprocesses of their own).
"""

from .file_format import Block, Entry, Lane, condition_mismatch, load_lane, load_waives, parse_entry, pick_auto

__all__ = ["Block", "Entry", "Lane", "condition_mismatch", "load_lane", "load_waives", "parse_entry", "pick_auto"]
