"""Seeded arithmetic word problems in the GSM8K format, so the gate runs anywhere without GSM8K's text.

Half the problems are one step (small models must be able to score above zero, or the gate could not
fall), half are two or three steps of grade-school arithmetic, with GSM8K's answer layout: one line per step
with a calculator annotation ``<<a*b=c>>`` and a final ``#### <number>`` line. The committed files under
``data/`` are exactly what ``python -m pytest_kvcm.accuracy.arith`` writes (a test regenerates and compares),
so nobody has to trust a hand-edited answer.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from ..paths import output_problem, write_atomically

DATA_DIR = Path(__file__).with_name("data")
TEST_FILE, TRAIN_FILE = "arith_test.jsonl", "arith_train.jsonl"
TEST_SEED, TRAIN_SEED = 20240, 8047
NUM_TEST, NUM_TRAIN = 48, 16

_NAMES = [("Maya", "she", "her"), ("Omar", "he", "his"), ("Lena", "she", "her"), ("Tomas", "he", "his"),
          ("Priya", "she", "her"), ("Kofi", "he", "his"), ("Ines", "she", "her"), ("Yuki", "he", "his")]


def _apples(r: random.Random) -> tuple[str, list[str], int]:
    name, she, her = r.choice(_NAMES)
    a, b, c = r.randint(3, 30), r.randint(2, 9), r.randint(3, 12)
    x = b * c
    q = (f"{name} has {a} apples. {she.capitalize()} buys {b} bags of apples with {c} apples in each bag. "
         f"How many apples does {name} have now?")
    return q, [f"The bags hold {b} * {c} = <<{b}*{c}={x}>>{x} apples.",
               f"{name} has {a} + {x} = <<{a}+{x}={a + x}>>{a + x} apples now."], a + x


def _change(r: random.Random) -> tuple[str, list[str], int]:
    name, she, her = r.choice(_NAMES)
    p, n = r.randint(2, 9), r.randint(2, 8)
    cost = p * n
    bill = next(b for b in (20, 50, 100) if b >= cost)
    q = (f"A shop sells notebooks for ${p} each. {name} buys {n} notebooks and pays with a ${bill} bill. "
         f"How much change, in dollars, does {she} get?")
    return q, [f"The notebooks cost {n} * {p} = $<<{n}*{p}={cost}>>{cost}.",
               f"{name} gets {bill} - {cost} = $<<{bill}-{cost}={bill - cost}>>{bill - cost} in change."], bill - cost


def _pages(r: random.Random) -> tuple[str, list[str], int]:
    name, she, her = r.choice(_NAMES)
    a, d, b = r.randint(5, 40), r.randint(2, 7), r.randint(1, 30)
    x = a * d
    q = (f"{name} reads {a} pages every day for {d} days, and then {b} more pages on the next day. "
         f"How many pages does {she} read in total?")
    return q, [f"In {d} days {she} reads {a} * {d} = <<{a}*{d}={x}>>{x} pages.",
               f"In total {she} reads {x} + {b} = <<{x}+{b}={x + b}>>{x + b} pages."], x + b


def _cookies(r: random.Random) -> tuple[str, list[str], int]:
    kids, each = r.randint(2, 8), r.randint(4, 12)
    eat = r.randint(1, each - 1)
    total = kids * each
    left = kids * (each - eat)
    q = (f"A baker shares {total} cookies equally among {kids} children. Each child eats {eat} cookies. "
         f"How many cookies are left altogether?")
    return q, [f"Each child gets {total} / {kids} = <<{total}/{kids}={each}>>{each} cookies.",
               f"Each child has {each} - {eat} = <<{each}-{eat}={each - eat}>>{each - eat} left.",
               f"Altogether {kids} * {each - eat} = <<{kids}*{each - eat}={left}>>{left} cookies are left."], left


def _train(r: random.Random) -> tuple[str, list[str], int]:
    s1, h1, s2, h2 = r.randint(30, 90), r.randint(2, 5), r.randint(20, 60), r.randint(2, 4)
    d1, d2 = s1 * h1, s2 * h2
    q = (f"A train travels at {s1} miles per hour for {h1} hours, then at {s2} miles per hour for {h2} hours. "
         f"How many miles does it travel?")
    return q, [f"First it covers {s1} * {h1} = <<{s1}*{h1}={d1}>>{d1} miles.",
               f"Then it covers {s2} * {h2} = <<{s2}*{h2}={d2}>>{d2} miles.",
               f"It travels {d1} + {d2} = <<{d1}+{d2}={d1 + d2}>>{d1 + d2} miles."], d1 + d2


def _farm(r: random.Random) -> tuple[str, list[str], int]:
    a = r.randint(10, 40)
    b = r.randint(1, a - 1)
    k = r.randint(2, 4)
    left = a - b
    q = (f"A farmer has {a} sheep. He sells {b} of them, and then buys {k} times as many sheep as he has left. "
         f"How many sheep does he have now?")
    bought = k * left
    total = left + bought
    return q, [f"After selling he has {a} - {b} = <<{a}-{b}={left}>>{left} sheep.",
               f"He buys {k} * {left} = <<{k}*{left}={bought}>>{bought} sheep.",
               f"Now he has {left} + {bought} = <<{left}+{bought}={total}>>{total} sheep."], total


def _salary(r: random.Random) -> tuple[str, list[str], int]:
    name, she, her = r.choice(_NAMES)
    wage, hours, weeks = r.randint(12, 40), r.randint(10, 40), r.randint(2, 6)
    week = wage * hours
    total = week * weeks
    q = (f"{name} earns ${wage} an hour and works {hours} hours a week. How many dollars does {she} earn "
         f"in {weeks} weeks?")
    return q, [f"In a week {she} earns {wage} * {hours} = $<<{wage}*{hours}={week}>>{week}.",
               f"In {weeks} weeks {she} earns {week} * {weeks} = $<<{week}*{weeks}={total}>>{total}."], total


def _marbles(r: random.Random) -> tuple[str, list[str], int]:
    (n1, _, _), (n2, _, _) = r.sample(_NAMES, 2)
    a = r.randint(10, 60)
    more = r.randint(3, 25)
    b = a + more
    q = (f"{n1} has {a} marbles. {n2} has {more} more marbles than {n1}. "
         f"How many marbles do they have together?")
    return q, [f"{n2} has {a} + {more} = <<{a}+{more}={b}>>{b} marbles.",
               f"Together they have {a} + {b} = <<{a}+{b}={a + b}>>{a + b} marbles."], a + b


def _more(r: random.Random) -> tuple[str, list[str], int]:
    name, she, her = r.choice(_NAMES)
    thing = r.choice(["stickers", "pencils", "shells", "stamps", "coins"])
    a, b = r.randint(2, 15), r.randint(2, 15)
    q = f"{name} has {a} {thing}. {her.capitalize()} friend gives {her} {b} more {thing}. How many {thing} does {name} have now?"
    return q, [f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {thing} now."], a + b


def _fewer(r: random.Random) -> tuple[str, list[str], int]:
    name, she, her = r.choice(_NAMES)
    a = r.randint(8, 30)
    b = r.randint(1, a - 2)
    q = f"There are {a} birds on a tree. {b} of them fly away. How many birds are left on the tree?"
    return q, [f"{a} - {b} = <<{a}-{b}={a - b}>>{a - b} birds are left."], a - b


def _boxes(r: random.Random) -> tuple[str, list[str], int]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    q = f"A box holds {b} eggs. How many eggs are in {a} boxes?"
    return q, [f"{a} boxes hold {a} * {b} = <<{a}*{b}={a * b}>>{a * b} eggs."], a * b


def _legs(r: random.Random) -> tuple[str, list[str], int]:
    a = r.randint(2, 12)
    q = f"A dog has 4 legs. How many legs do {a} dogs have?"
    return q, [f"{a} dogs have {a} * 4 = <<{a}*4={a * 4}>>{a * 4} legs."], a * 4


EASY = (_more, _fewer, _boxes, _legs)
HARD = (_apples, _change, _pages, _cookies, _train, _farm, _salary, _marbles)
TEMPLATES = tuple(t for pair in zip(EASY + EASY, HARD) for t in pair)  # one-step and multi-step, alternating


def generate(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` problems as ``{"question", "answer"}`` dicts, GSM8K layout, reproducible from ``seed``."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        q, steps, result = TEMPLATES[i % len(TEMPLATES)](r)
        out.append({"question": q, "answer": "\n".join(steps) + f"\n#### {result}"})
    r.shuffle(out)
    return out


def render(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def expected_files() -> dict[str, str]:
    return {TEST_FILE: render(generate(NUM_TEST, TEST_SEED)), TRAIN_FILE: render(generate(NUM_TRAIN, TRAIN_SEED))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pytest_kvcm.accuracy.arith", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR, help="directory to write the jsonl files into")
    args = ap.parse_args(argv)
    files = expected_files()
    for name in files:  # every file checked before the first is written; only a problems file is replaced
        problem = output_problem(args.out / name, ours=_is_problems_file)
        if problem:
            print(f"{ap.prog}: --out {args.out}: {name} {problem}", file=sys.stderr)
            return 2
    for name, text in files.items():
        write_atomically(args.out / name, text)
        print(f"wrote {args.out / name} ({text.count(chr(10))} problems)")
    return 0


def _is_problems_file(path: Path) -> bool:
    with open(path, encoding="utf-8") as f:
        row = json.loads(f.readline())
    return isinstance(row, dict) and {"question", "answer"} <= set(row)


if __name__ == "__main__":
    raise SystemExit(main())
