"""A Triton launch compiled for an H100 (sm_90) on a machine without one: what the kernel tests read its PTX from.

Triton compiles for a target it does not run on, so the CPU lanes can check what the GPU would execute (a fused
multiply-add where torch rounds twice, a key loop that is or is not software-pipelined) without a device.
"""

from __future__ import annotations


def recording(monkeypatch, kernels: dict) -> list:
    """``(name, kernel, args, kwargs)`` of every launch of ``kernels`` while the test lives; nothing runs."""
    seen = []
    for name, kernel in kernels.items():
        def record(*args, grid, warmup=False, name=name, kernel=kernel, **kwargs):
            seen.append((name, kernel, args, kwargs))
        monkeypatch.setattr(kernel, "run", record)
    return seen


def ptx(kernel, args, kwargs) -> str:
    """The PTX Triton makes of one recorded launch for an H100 (sm_90), with the launch's own options."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    bound = dict(zip(kernel.arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k in kernel.arg_names})
    options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
    signature, constants = {}, {}
    for p in kernel.params:
        value = bound[p.name]
        if p.is_constexpr:
            signature[p.name], constants[p.name] = "constexpr", value
        else:
            signature[p.name] = mangle_type(value)
    return triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                          options=options).asm["ptx"]
