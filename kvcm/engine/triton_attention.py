"""Triton kernels for the paged cache on CUDA: one launch writes a step's K/V into the pages, one launch attends.

The attention kernel reads a packed step the way the torch reference in ``attention.py`` does: sequence ``s``
owns query rows ``query_start[s] .. query_start[s + 1]`` at positions ``seq_lens[s] - q_len .. seq_lens[s] - 1``
and reads keys ``0 .. position`` (or the last ``window`` of them, or those of its ``chunk``) through its block-table
row. Decodes,
speculative verification (``1 + D`` queries) and prefill chunks are one launch; nothing is gathered or padded,
so a decode costs what its own KV costs, and the launch shape depends only on (tokens, rows): graph-safe.

Each program takes ``BLOCK_Q`` query tokens of one sequence and one KV head; the ``REP`` query heads of that
KV head are folded into the rows of the tile (GQA without repeating K/V), and keys stream in tiles of
``TILE_N`` positions with an online softmax. A key is read only if its position is in the query's causal
(and window or chunk) range and its block-table entry is a page (``>= 0``): released and foreign pages are never read,
and masked lanes load zeros, so garbage (even NaN) in a recycled page cannot reach the output. A row with no
key at all (padding rows of a graph with KV length 0) writes zeros.

``TRITON_INTERPRET=1`` runs both kernels on CPU tensors, which is how the CPU suites check them against the
torch reference.
"""
from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference path runs everywhere; these kernels only where Triton is
    triton = tl = None

TILE_N = 32                      # key positions per inner step (>= 16 for tl.dot)
PIPELINE_STAGES = 3              # key tiles in flight with ``pipelined``: the compiler's software pipeline depth
MAX_BLOCK_M = 128                # query rows a program at most (its accumulator: rows x head dim in fp32)
NO_WINDOW = 1 << 30              # full attention: a window longer than any sequence


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def available(device_type: str) -> bool:
    """Kernels run on CUDA with Triton installed, or anywhere under ``TRITON_INTERPRET=1`` (for tests)."""
    if triton is None:
        return False
    return device_type == "cuda" or (interpreted() and device_type == "cpu")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tile_shape(num_heads: int, num_kv_heads: int, block_m: int | None = None) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_Q): rows of a program's query tile and the query tokens they cover (REP heads each).
    ``block_m`` None takes the least tile (16 rows, or the next power of two of REP); a larger one lets more of
    a prefill chunk's query tokens share each key tile a program reads."""
    rep = num_heads // num_kv_heads
    least = max(16, _next_pow2(rep))
    if block_m is None:
        block_m = least
    elif not least <= block_m <= MAX_BLOCK_M or block_m & (block_m - 1):
        raise ValueError(f"block_m={block_m} must be a power of two from {least} (16, and the {rep} query heads of "
                         f"a KV head) to {MAX_BLOCK_M}")
    return block_m, max(1, block_m // rep)


def num_programs(num_tokens: int, num_seqs: int, block_q: int) -> int:
    """Upper bound of the query blocks of a step: every sequence may leave one block partly empty."""
    return num_tokens // block_q + num_seqs


if triton is not None:

    @triton.jit
    def _store_kv_kernel(k_ptr, v_ptr, kv_ptr, blk_ptr, off_ptr,
                         s_kt, s_kh, s_vt, s_vh, s_pb, s_pf, s_pt, s_ph,
                         KVH: tl.constexpr, KVH_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr):
        t = tl.program_id(0)
        h = tl.arange(0, KVH_PAD)[:, None]
        d = tl.arange(0, D_PAD)[None, :]
        mask = (h < KVH) & (d < D)
        blk = tl.load(blk_ptr + t)
        off = tl.load(off_ptr + t)
        dst = kv_ptr + blk * s_pb + off * s_pt + h * s_ph + d
        k = tl.load(k_ptr + t * s_kt + h * s_kh + d, mask=mask)
        v = tl.load(v_ptr + t * s_vt + h * s_vh + d, mask=mask)
        tl.store(dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + s_pf, v.to(kv_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _find_seq(query_start_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
        """The sequence whose query blocks hold program ``pid`` (block start of s = qs[s] // BLOCK_Q + s)."""
        lo: tl.int32 = 0
        hi = num_seqs
        while lo < hi:
            mid = (lo + hi) // 2
            start = tl.load(query_start_ptr + mid) // BLOCK_Q + mid
            if start <= pid:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    @triton.jit
    def _query_block(query_start_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
        """Program ``pid``'s sequence, its first query row and query count, and which of its query blocks this is
        (past its last block when ``local * BLOCK_Q >= q_len``: a spare program of ``num_programs``)."""
        seq = _find_seq(query_start_ptr, pid, num_seqs, BLOCK_Q)
        q_first = tl.load(query_start_ptr + seq)
        q_len = tl.load(query_start_ptr + seq + 1) - q_first
        return seq, q_first, q_len, pid - (q_first // BLOCK_Q + seq)

    @triton.jit
    def _program_seq_kernel(query_start_ptr, seq_ptr, num_seqs, BLOCK_Q: tl.constexpr):
        """Each program's sequence, searched once a step for every layer's launch (-1: a spare program)."""
        pid = tl.program_id(0)
        seq, q_first, q_len, local = _query_block(query_start_ptr, pid, num_seqs, BLOCK_Q)
        tl.store(seq_ptr + pid, tl.where(local * BLOCK_Q < q_len, seq, -1))

    @triton.jit
    def _program_rows(query_start_ptr, seq_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr, UNIFORM_Q: tl.constexpr,
                      MAPPED: tl.constexpr):
        """``_query_block``, or with ``UNIFORM_Q`` (every sequence has that many queries, at most BLOCK_Q: a decode
        step's) program ``pid`` is sequence ``pid``'s one block, found without the search's dependent loads; with
        ``MAPPED`` it reads its sequence from ``program_seqs``' map (a spare program gets no query)."""
        if UNIFORM_Q > 0:
            return pid, pid * UNIFORM_Q, UNIFORM_Q, 0
        elif MAPPED:
            mapped = tl.load(seq_ptr + pid)
            seq = tl.maximum(mapped, 0)
            q_first = tl.load(query_start_ptr + seq)
            q_len = tl.where(mapped >= 0, tl.load(query_start_ptr + seq + 1) - q_first, 0)
            return seq, q_first, q_len, pid - (q_first // BLOCK_Q + seq)
        else:
            return _query_block(query_start_ptr, pid, num_seqs, BLOCK_Q)

    @triton.jit
    def _key_tile(q, kv_ptr, bt_row, start, hi, qpos, q_floor, row_ok, d, d_ok, kvh, scale, window,
                  s_pb, s_pf, s_pt, s_ph, m_i, l_i, acc,
                  TPB: tl.constexpr, TILE: tl.constexpr, PRECISION: tl.constexpr, CHUNKED: tl.constexpr):
        """One tile of TILE key positions from ``start``: its keys and values gathered through the block table,
        masked (causal, window, chunk), folded into the running softmax (``m_i``, ``l_i``, ``acc``)."""
        kpos = start + tl.arange(0, TILE)
        in_range = (kpos < hi) & (kpos >= 0)
        blk = tl.load(bt_row + kpos // TPB, mask=in_range, other=-1)
        k_ok = in_range & (blk >= 0)
        base = tl.where(k_ok, blk, 0) * s_pb + (kpos % TPB) * s_pt + kvh * s_ph
        kt = tl.load(kv_ptr + base[None, :] + d[:, None], mask=k_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(kv_ptr + s_pf + base[:, None] + d[None, :], mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        kt = kt.to(q.dtype)        # pages may be kept in another dtype than the model computes in
        v = v.to(q.dtype)
        s = tl.dot(q, kt, input_precision=PRECISION) * scale
        keep = row_ok[:, None] & k_ok[None, :] & (kpos[None, :] <= qpos[:, None])
        keep = keep & (kpos[None, :] > qpos[:, None] - window)
        if CHUNKED:
            keep = keep & (kpos[None, :] >= q_floor[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _paged_attention_kernel(q_ptr, kv_ptr, out_ptr, block_table_ptr, seq_lens_ptr, query_start_ptr, seq_ptr,
                                part_m_ptr, part_l_ptr, part_acc_ptr,
                                num_seqs, scale, window, chunk, split_len,
                                s_qt, s_qh, s_ot, s_oh, s_pb, s_pf, s_pt, s_ph, s_bt,
                                REP: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, TPB: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE: tl.constexpr,
                                SPLITS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                                CHUNKED: tl.constexpr, PIPELINED: tl.constexpr, STAGES: tl.constexpr,
                                UNIFORM_Q: tl.constexpr, MAPPED: tl.constexpr):
        pid = tl.program_id(0)
        kvh = tl.program_id(1)
        seq, q_first, q_len, local = _program_rows(query_start_ptr, seq_ptr, pid, num_seqs, BLOCK_Q, UNIFORM_Q,
                                                   MAPPED)
        if local * BLOCK_Q >= q_len:
            return
        kv_len = tl.load(seq_lens_ptr + seq)
        context = kv_len - q_len

        m = tl.arange(0, BLOCK_M)
        qi = local * BLOCK_Q + m // REP                    # query token of each row, within the sequence
        head = kvh * REP + m % REP
        row_ok = (m // REP < BLOCK_Q) & (qi < q_len)
        qpos = context + qi
        d = tl.arange(0, D_PAD)
        d_ok = d < D
        q = tl.load(q_ptr + (q_first + qi)[:, None] * s_qt + head[:, None] * s_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)

        hi = context + tl.minimum(q_len, (local + 1) * BLOCK_Q)     # keys below this position are read
        lo = tl.maximum(context + local * BLOCK_Q - window + 1, 0)
        if CHUNKED:         # a chunked-local layer: the block's first query reads from its chunk's start
            lo = tl.maximum(lo, (context + local * BLOCK_Q) // chunk * chunk)
            q_floor = qpos // chunk * chunk
        lo = lo // TILE * TILE
        if SPLITS > 1:      # this program's share of the keys: split_len of them (a multiple of TILE)
            first = tl.program_id(2) * split_len
            lo = tl.maximum(lo, first)
            hi = tl.minimum(hi, first + split_len)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        bt_row = block_table_ptr + seq * s_bt
        if not CHUNKED:
            q_floor = qpos       # read only by a chunked layer's mask
        if PIPELINED:       # compiled: a range, which the compiler software-pipelines (loads issued stages ahead)
            for start in tl.range(lo, hi, TILE, num_stages=STAGES):
                m_i, l_i, acc = _key_tile(q, kv_ptr, bt_row, start, hi, qpos, q_floor, row_ok, d, d_ok, kvh, scale,
                                          window, s_pb, s_pf, s_pt, s_ph, m_i, l_i, acc,
                                          TPB, TILE, PRECISION, CHUNKED)
        else:               # the interpreter cannot iterate a range by loaded bounds
            start = lo
            while start < hi:
                m_i, l_i, acc = _key_tile(q, kv_ptr, bt_row, start, hi, qpos, q_floor, row_ok, d, d_ok, kvh, scale,
                                          window, s_pb, s_pf, s_pt, s_ph, m_i, l_i, acc,
                                          TPB, TILE, PRECISION, CHUNKED)
                start += TILE
        if SPLITS > 1:      # the partial softmax of this share, for _combine_splits_kernel
            part = ((pid * tl.num_programs(1) + kvh) * SPLITS + tl.program_id(2)) * BLOCK_M + m
            tl.store(part_m_ptr + part, m_i)
            tl.store(part_l_ptr + part, l_i)
            tl.store(part_acc_ptr + part[:, None] * D_PAD + d[None, :], acc)
        else:
            out = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
            tl.store(out_ptr + (q_first + qi)[:, None] * s_ot + head[:, None] * s_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    @triton.jit
    def _combine_splits_kernel(part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, query_start_ptr, seq_ptr, num_seqs,
                               s_ot, s_oh,
                               REP: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_Q: tl.constexpr, SPLITS: tl.constexpr, UNIFORM_Q: tl.constexpr,
                               MAPPED: tl.constexpr):
        """One program per query block and KV head: the shares' softmaxes rescaled to their common maximum and
        summed (a share with no key has maximum -inf and weight 0)."""
        pid = tl.program_id(0)
        kvh = tl.program_id(1)
        seq, q_first, q_len, local = _program_rows(query_start_ptr, seq_ptr, pid, num_seqs, BLOCK_Q, UNIFORM_Q,
                                                   MAPPED)
        if local * BLOCK_Q >= q_len:
            return
        m = tl.arange(0, BLOCK_M)
        qi = local * BLOCK_Q + m // REP
        head = kvh * REP + m % REP
        row_ok = (m // REP < BLOCK_Q) & (qi < q_len)
        d = tl.arange(0, D_PAD)
        base = (pid * tl.num_programs(1) + kvh) * SPLITS * BLOCK_M + m
        top = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for i in tl.static_range(SPLITS):
            top = tl.maximum(top, tl.load(part_m_ptr + base + i * BLOCK_M))
        top = tl.where(top == float("-inf"), 0.0, top)
        l_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        for i in tl.static_range(SPLITS):
            w = tl.exp(tl.load(part_m_ptr + base + i * BLOCK_M) - top)
            l_sum += w * tl.load(part_l_ptr + base + i * BLOCK_M)
            acc += w[:, None] * tl.load(part_acc_ptr + (base + i * BLOCK_M)[:, None] * D_PAD + d[None, :])
        out = tl.where(l_sum[:, None] > 0, acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None], 0.0)
        tl.store(out_ptr + (q_first + qi)[:, None] * s_ot + head[:, None] * s_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (d < D)[None, :])


def store_kv(kv: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_block: torch.Tensor,
             slot_offset: torch.Tensor) -> None:
    """Write ``key``/``value`` ``[T, kv_heads, D]`` (any strides, last dim dense) into the pages ``kv``
    ``[num_blocks, 2, tpb, kv_heads, D]`` at (block, offset) per token."""
    t, kvh, d = key.shape
    if t == 0:
        return
    _store_kv_kernel[(t,)](key, value, kv, slot_block, slot_offset,
                           key.stride(0), key.stride(1), value.stride(0), value.stride(1),
                           kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
                           KVH=kvh, KVH_PAD=_next_pow2(kvh), D=d, D_PAD=max(16, _next_pow2(d)))


def num_splits(width: int, tpb: int, split_len: int) -> int:
    """How many shares of ``split_len`` keys cover a block table ``width`` pages wide (1: not split)."""
    return max(1, -(-(width * tpb) // split_len)) if split_len else 1


def program_seqs(query_start: torch.Tensor, num_seqs: int, block_q: int, programs: int) -> torch.Tensor:
    """``[programs]`` int32: the sequence each attention program of a step serves (-1: a spare program), searched
    over ``query_start`` once, one launch, where each layer's programs would otherwise search it again."""
    seqs = torch.empty(programs, dtype=torch.int32, device=query_start.device)
    _program_seq_kernel[(programs,)](query_start, seqs, num_seqs, BLOCK_Q=block_q, num_warps=1)
    return seqs


def paged_attention(q: torch.Tensor, kv: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    query_start: torch.Tensor, *, scale: float, window: int | None, tpb: int,
                    split_len: int = 0, block_m: int | None = None, chunk: int | None = None,
                    pipelined: bool = False, uniform_q_len: int = 0, program_maps: dict | None = None,
                    tile_n: int = TILE_N, num_warps: int = 4, stages: int = PIPELINE_STAGES) -> torch.Tensor:
    """``q`` ``[T, H, D]`` (last dim dense) -> ``[T, H, D]`` over the pages ``kv`` (layout as ``store_kv``).

    ``block_table`` ``[S, W]`` (-1 = no page), ``seq_lens`` ``[S]`` KV lengths after this step's tokens,
    ``query_start`` ``[S + 1]`` packed query offsets with ``query_start[S] == T`` (every row belongs to a
    sequence; padding rows belong to one whose KV length is 0, and come out 0).

    ``split_len`` (a multiple of ``TILE_N``; 0: off) splits each query block's keys into shares of that many
    positions, one program each, and a second launch combines their softmaxes (flash-decoding): a decode's one
    query block then reads a long KV in parallel rather than tile after tile in one program. The number of
    shares depends only on the table's width, so the launch shape stays graph-safe.

    ``chunk`` (a chunked-local layer, Llama 4's ``attention_chunk_size``; None: none): a query at ``p`` reads keys
    from ``p // chunk * chunk`` only, a compile-time branch, so other layers run the same code as before.

    ``block_m`` (``tile_shape``): the rows of a program's query tile. With SmolLM2's 3 query heads a KV head, the
    least tile (16 rows) covers 5 query tokens, so a prefill chunk reads each key tile once per 5 of its tokens.

    ``pipelined`` (compiled kernels only; the interpreter runs the plain loop): the key loop as a ``range`` the
    compiler software-pipelines, ``PIPELINE_STAGES`` tiles' loads in flight, where the plain loop (a ``while``, which
    the interpreter needs) waits for each tile's gather. Same tiles in the same order, so the same arithmetic.
    Compiled for sm_90 it issues its loads as ``cp.async`` (``suites/engine/test_kernel_pipelining.py``), the plain
    loop as none; yet on an H100 it made the decode step no faster and the mixed step slower (``docs/benchmarks.md``),
    so it is off by default.

    ``uniform_q_len`` (0: not promised): every sequence has exactly this many query rows, ``query_start[s] ==
    s * uniform_q_len`` (a decode step's rows, a graph's padding rows too). Where that fits one query block, each
    program takes its sequence by its index instead of a binary search over ``query_start`` (a chain of dependent
    loads ahead of every program's first key), and the launch has no spare programs. Any other step, given
    ``program_maps`` (a dict that lives for one forward of the model, so a CUDA graph captures its filling), searches
    once for every layer: the first launch adds one that writes each program's sequence there
    (``program_seqs``), and every layer's programs then read theirs with one load.

    ``tile_n`` (key positions a tile, a power of two from 16), ``num_warps`` and ``stages`` (tiles in flight when
    pipelined) are the launch's tuning, here so that ``benchmarks/decode_attention.py --variants`` can time them
    side by side on a GPU; the engine keeps the defaults.
    """
    t, heads, d = q.shape
    kvh = kv.shape[3]
    out = torch.empty_like(q)
    num_seqs = block_table.shape[0]
    if t == 0 or num_seqs == 0:
        return out
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise ValueError(f"tile_n={tile_n} must be a power of two from 16 (tl.dot's least width)")
    if split_len % tile_n or split_len < 0:
        raise ValueError(f"split_len={split_len} must be 0 or a positive multiple of {tile_n} (tile_n)")
    block_m, block_q = tile_shape(heads, kvh, block_m)
    d_pad = max(16, _next_pow2(d))
    if uniform_q_len < 0 or uniform_q_len and uniform_q_len * num_seqs != t:
        raise ValueError(f"uniform_q_len={uniform_q_len} must be 0 or the {t} query rows over the {num_seqs} "
                         f"sequences, one share each")
    uniform = uniform_q_len if 0 < uniform_q_len <= block_q else 0
    programs = num_seqs if uniform else num_programs(t, num_seqs, block_q)
    mapped = not uniform and program_maps is not None
    seq_map = query_start             # not read unless mapped
    if mapped:
        key = ("program_seqs", block_q, t, num_seqs)
        if key not in program_maps:
            program_maps[key] = program_seqs(query_start, num_seqs, block_q, programs)
        seq_map = program_maps[key]
    splits = num_splits(block_table.shape[1], tpb, split_len)
    if splits > 1:
        part_m = torch.empty(programs * kvh * splits * block_m, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(part_m.numel() * d_pad, dtype=torch.float32, device=q.device)
    else:
        part_m = part_l = part_acc = out          # not read: the kernel writes ``out`` itself
    # the interpreter's bf16 dot is wrong: there, half-precision tiles are multiplied in fp32 (loads and stores
    # keep the page dtype, so the CPU check still covers bf16 pages)
    upcast = interpreted() and q.dtype != torch.float32
    precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"
    _paged_attention_kernel[(programs, kvh, splits)](
        q, kv, out, block_table, seq_lens, query_start, seq_map, part_m, part_l, part_acc, num_seqs, float(scale),
        int(window or NO_WINDOW), int(chunk or NO_WINDOW), int(split_len),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), block_table.stride(0),
        REP=heads // kvh, D=d, D_PAD=d_pad, TPB=tpb, BLOCK_M=block_m, BLOCK_Q=block_q, TILE=tile_n,
        SPLITS=splits, PRECISION=precision, UPCAST=upcast, CHUNKED=chunk is not None,
        PIPELINED=pipelined and not interpreted(), STAGES=stages, UNIFORM_Q=uniform, MAPPED=mapped,
        num_warps=num_warps)
    if splits > 1:
        _combine_splits_kernel[(programs, kvh)](part_m, part_l, part_acc, out, query_start, seq_map, num_seqs,
                                                out.stride(0), out.stride(1), REP=heads // kvh, D=d, D_PAD=d_pad,
                                                BLOCK_M=block_m, BLOCK_Q=block_q, SPLITS=splits, UNIFORM_Q=uniform,
                                                MAPPED=mapped, num_warps=4)
    return out
