"""Old spellings that still work, with a ``DeprecationWarning`` naming the new one.

A concept has one name everywhere (the manager version is ``kvcm_version``, a draft model's
``draft_kvcm_version``); where users could have written an older name, these helpers accept it for a while
and say what to write instead, so renaming never breaks a caller silently.

When they go: every shim here is removed in the first release after 0.1 (0.2.0); the warnings say
"deprecated" from 0.1.0 on, so a caller has had one release to move. ``REMOVED_IN`` is that release, and every
warning names it.
"""

from __future__ import annotations

import functools
import warnings


REMOVED_IN = "0.2.0"


def _warn(old: str, new: str, where: str, stacklevel: int) -> None:
    warnings.warn(f"{where}: {old} is deprecated; use {new} (the old spelling goes in {REMOVED_IN})",
                  DeprecationWarning, stacklevel=stacklevel + 1)


def renamed_keywords(**old_to_new: str):
    """Decorator: a call passing an old keyword (``version=``) is passed on under the new one
    (``kvcm_version=``) with a warning; passing both is a ``TypeError``."""
    def wrap(fn):
        where = fn.__qualname__.removesuffix(".__init__")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where}() got both {old}= (deprecated) and {new}=; pass only {new}=")
                    _warn(f"{old}=", f"{new}=", where, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return call
    return wrap


class renamed_attribute:
    """Class attribute: reading ``obj.<old>`` returns ``obj.<new>`` with a warning (read-only)."""

    def __init__(self, new: str):
        self.new = new

    def __set_name__(self, owner, name: str) -> None:
        self.old, self.owner = name, owner.__name__

    def __get__(self, obj, objtype=None):
        _warn(f".{self.old}", f".{self.new}", self.owner, stacklevel=2)
        return getattr(obj if obj is not None else objtype, self.new)
