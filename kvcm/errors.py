"""Errors a user of the managers can catch by name.

Config mistakes are ``ValueError`` subclasses so that ``except ValueError`` in an engine's argument parsing
keeps working; each message names the field, the value and the limit.
"""


class KvcmError(Exception):
    """Base of every kvcm error."""


class ConfigError(KvcmError, ValueError):
    """A configuration field is out of range."""

    def __init__(self, field: str, value, limit: str):
        self.field, self.value, self.limit = field, value, limit
        super().__init__(f"{field}={value!r} is invalid: {limit}")


class OutOfPagesError(KvcmError, RuntimeError):
    """A request needed more pages than the pool had free; the manager state is unchanged."""

    def __init__(self, request_id, group: int, needed: int, free: int, what: str = ""):
        self.request_id, self.group, self.needed, self.free = request_id, group, needed, free
        detail = f" ({what})" if what else ""
        super().__init__(
            f"request {request_id!r}{detail}: layer group {group} needs {needed} more block(s) "
            f"but only {free} are free; nothing was allocated"
        )


class BudgetExceededError(KvcmError, MemoryError):
    """The constraint floors alone cost more than the memory budget.

    Raised instead of silently sizing a pool past its budget (the historic out-of-memory at cache creation).
    ``trtllm`` (a ``kvcm.storage_quota.StoragePlan``, when the manager could compute it) is the pool
    TensorRT-LLM's storage manager would build instead, enlarged to the floors; its ``excess_bytes`` is the finding.
    """

    def __init__(self, constraint: str, needed_bytes: int, budget_bytes: int, detail: str = "", *, trtllm=None):
        self.constraint, self.needed_bytes, self.budget_bytes = constraint, needed_bytes, budget_bytes
        self.detail, self.trtllm = detail, trtllm
        extra = f"; {detail}" if detail else ""
        if trtllm is not None:
            extra += f"; {trtllm.finding()}"
        super().__init__(
            f"constraint {constraint!r} needs {needed_bytes} bytes of KV cache "
            f"({needed_bytes / 2**30:.3f} GiB) but the budget is {budget_bytes} bytes "
            f"({budget_bytes / 2**30:.3f} GiB){extra}"
        )


class UserCallbackError(KvcmError, RuntimeError):
    """Code the user handed in (a retention clock, an ``on_finish`` callback, an adapter's hook) raised, or returned
    what it must not. ``callback`` names it, ``problem`` says what it did (``__cause__`` is what it raised); the
    call that ran it was undone first, so the manager or engine is as it was before that call."""

    def __init__(self, callback: str, problem: str):
        self.callback, self.problem = callback, problem
        super().__init__(f"{callback} {problem}")


class UnknownRequestError(KvcmError, KeyError):
    """The manager holds no request with this id."""

    def __init__(self, request_id):
        self.request_id = request_id
        super().__init__(f"no request {request_id!r} in this manager")

    def __str__(self):
        return self.args[0]
